"""`AnthropicAgent`: an Anthropic Messages model as an agent (extra `anthropic`)."""

from __future__ import annotations

import contextlib
from typing import Any

import pydantic

from steerable.actors._tools.schema import anthropic_tool
from steerable.protocol import RunView, Usage

from .base import ModelAgent, ModelReply, ReplyToolCall, emitter, missing_extra, sdk_client
from .errors import ProviderError, classify_status, parse_retry_after, provider_error
from .mapping import ToolNames, to_anthropic_messages

__all__ = ["AnthropicAgent"]


class AnthropicAgent(ModelAgent):
    """An Anthropic Messages model as an agent; the same keywords as `OpenAIChatAgent`.

    Args:
        model: The model name.
        client: An `anthropic.AsyncAnthropic` to use (a copy with `max_retries=0` is made).
        base_url: The API's base URL; default the SDK's (`ANTHROPIC_BASE_URL`).
        api_key: The API key; default `ANTHROPIC_API_KEY`, or a placeholder with `base_url`.
        instructions: The system prompt.
        output_type: A pydantic model for a structured final answer (see `ModelAgent`).
        stream: Stream the reply as live `model_delta` events.
        max_tokens: Upper bound of output tokens per call (the API requires one). Default 4096.
        temperature: Sampling temperature (None: the API's default).
        ask_user: Offer an `ask_user(question)` tool.
        timeout: Seconds the SDK waits for one request (None: the SDK's default).
        request_options: Extra keyword arguments for `messages.create`.
        name: The agent's name in the capability snapshot.

    Raises:
        ImportError: The `anthropic` package is missing (install `steerable[anthropic]`).
    """

    provider = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        client: Any = None,
        base_url: str | None = None,
        api_key: str | None = None,
        instructions: str | None = None,
        output_type: type[pydantic.BaseModel] | None = None,
        stream: bool = False,
        max_tokens: int = 4096,
        temperature: float | None = None,
        ask_user: bool = False,
        timeout: float | None = None,
        request_options: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(
            model,
            instructions=instructions,
            output_type=output_type,
            stream=stream,
            ask_user=ask_user,
            name=name,
        )
        try:
            import anthropic
        except ImportError:
            raise missing_extra("anthropic", "anthropic") from None
        self._sdk = anthropic
        self.client = sdk_client(
            anthropic.AsyncAnthropic,
            "ANTHROPIC_API_KEY",
            client=client,
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
        )
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.request_options = dict(request_options or {})

    def request(self, view: RunView, names: ToolNames) -> dict[str, Any]:
        """The keyword arguments of `messages.create` for this view (no I/O)."""
        tools = [
            anthropic_tool(spec, name=names.provider("tool", spec.name)) for spec in view.tools
        ]
        tools += [
            anthropic_tool(self.subagent_spec(a, names.provider("subagent", a)))
            for a in view.subagents
        ]
        tools += [anthropic_tool(spec) for spec in self.extra_tools()]
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": to_anthropic_messages(
                view, names=names, structured=self.output_type is not None
            ),
        }
        if self.instructions:
            kwargs["system"] = self.instructions
        if tools:
            kwargs["tools"] = tools
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.stream:
            kwargs["stream"] = True
        kwargs.update(self.request_options)
        return kwargs

    async def complete(self, view: RunView, names: ToolNames) -> ModelReply:
        """One Messages request (streamed or not) as a `ModelReply`."""
        kwargs = self.request(view, names)
        try:
            if self.stream:
                return await self._streamed(kwargs, view)
            return _reply(await self.client.messages.create(**kwargs))
        except ProviderError:
            raise
        except self._sdk.APIStatusError as exc:
            raise self._status_error(exc) from None
        except self._sdk.APITimeoutError as exc:
            raise provider_error(str(exc), reason="timeout", provider="anthropic") from None
        except self._sdk.APIConnectionError as exc:
            raise provider_error(str(exc), reason="connection", provider="anthropic") from None
        except (self._sdk.APIError, ValueError, TypeError, AttributeError, KeyError) as exc:
            raise provider_error(
                f"{type(exc).__name__}: {exc}", reason="malformed_response", provider="anthropic"
            ) from None

    async def _streamed(self, kwargs: dict[str, Any], view: RunView) -> ModelReply:
        emit = emitter(view.call)
        stream = await self.client.messages.create(**kwargs)
        text: list[str] = []
        blocks: dict[int, dict[str, Any]] = {}
        input_tokens = output_tokens = 0
        stop: str | None = None
        try:
            async for event in stream:
                kind = getattr(event, "type", None)
                if kind == "message_start":
                    input_tokens = _input_tokens(getattr(event.message, "usage", None))
                    output_tokens = int(getattr(event.message.usage, "output_tokens", 0) or 0)
                elif kind == "content_block_start":
                    block = event.content_block
                    blocks[event.index] = {
                        "type": block.type,
                        "id": getattr(block, "id", None),
                        "name": getattr(block, "name", ""),
                        "json": "",
                    }
                    if block.type == "tool_use":
                        emit({"type": "tool_call", "index": event.index, "id": block.id,
                              "name": block.name, "arguments": ""})  # fmt: skip
                elif kind == "content_block_delta":
                    delta = event.delta
                    if delta.type == "text_delta":
                        text.append(delta.text)
                        emit({"type": "text", "text": delta.text})
                    elif delta.type == "input_json_delta":
                        blocks[event.index]["json"] += delta.partial_json
                        emit({"type": "tool_call", "index": event.index, "id": None,
                              "name": "", "arguments": delta.partial_json})  # fmt: skip
                elif kind == "message_delta":
                    stop = getattr(event.delta, "stop_reason", None) or stop
                    usage = getattr(event, "usage", None)
                    if usage is not None:
                        output_tokens = int(getattr(usage, "output_tokens", 0) or output_tokens)
                elif kind == "error":
                    raise _stream_error(getattr(event, "error", None))
        finally:
            with contextlib.suppress(Exception):
                await stream.close()
        calls = [
            ReplyToolCall(b["id"], b["name"], b["json"] or "{}")
            for _, b in sorted(blocks.items())
            if b["type"] == "tool_use"
        ]
        return ModelReply(
            text="".join(text),
            tool_calls=calls,
            usage=Usage(input_tokens=input_tokens, output_tokens=output_tokens),
            stop_reason=stop,
        )

    def _status_error(self, exc: Any) -> ProviderError:
        status = int(getattr(exc, "status_code", 0) or 0)
        body = getattr(exc, "body", None)
        error = body.get("error", body) if isinstance(body, dict) else None
        code = None
        message = str(getattr(exc, "message", "") or exc)
        if isinstance(error, dict):
            code = error.get("type") or error.get("code")
            message = str(error.get("message") or message)
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
        request_id = getattr(exc, "request_id", None)
        if request_id is None and headers is not None:
            request_id = headers.get("request-id")
        return provider_error(
            message,
            reason=classify_status(status, None if code is None else str(code), message),
            status=status,
            provider_code=None if code is None else str(code),
            request_id=request_id,
            retry_after=parse_retry_after(headers),
            provider="anthropic",
        )


def _stream_error(error: Any) -> ProviderError:
    if isinstance(error, dict):
        kind, message = str(error.get("type") or ""), str(error.get("message") or "")
    else:
        kind, message = str(getattr(error, "type", "") or ""), str(getattr(error, "message", ""))
    message = message or "the stream reported an error"
    reason = "overloaded" if "overloaded" in kind else classify_status(500, kind, message)
    return provider_error(message, reason=reason, provider_code=kind or None, provider="anthropic")


def _input_tokens(usage: Any) -> int:
    if usage is None:
        return 0
    return sum(
        int(getattr(usage, key, 0) or 0)
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )


def _reply(response: Any) -> ModelReply:
    content = getattr(response, "content", None)
    if content is None:
        raise ValueError(f"the response has no content: {str(response)[:200]}")
    text: list[str] = []
    calls: list[ReplyToolCall] = []
    for block in content:
        if block.type == "text":
            text.append(block.text)
        elif block.type == "tool_use":
            calls.append(ReplyToolCall(block.id, block.name, dict(block.input or {})))
    usage = getattr(response, "usage", None)
    return ModelReply(
        text="".join(text),
        tool_calls=calls,
        usage=Usage(
            input_tokens=_input_tokens(usage),
            output_tokens=int(getattr(usage, "output_tokens", 0) or 0),
        ),
        stop_reason=getattr(response, "stop_reason", None),
    )
