"""`OpenAIChatAgent`: any OpenAI-compatible chat-completions server as an agent (extra `openai`)."""

from __future__ import annotations

import contextlib
from typing import Any

import pydantic

from steerable.actors._tools.schema import openai_tool
from steerable.protocol import RunView, Usage

from .base import ModelAgent, ModelReply, ReplyToolCall, emitter, missing_extra, sdk_client
from .errors import ProviderError, classify_status, parse_retry_after, provider_error
from .mapping import ToolNames, to_openai_messages

__all__ = ["OpenAIChatAgent"]


class OpenAIChatAgent(ModelAgent):
    """A chat-completions model as an agent: OpenAI, vLLM, Ollama, LiteLLM, OpenRouter...

    Async: the request runs on the runtime's event loop, and `cancel()` or an interrupting
    `send()` closes it at once. The SDK's own retries are off (`max_retries=0`): the run's
    `RetryPolicy` retries `provider_error`s that are retryable, honouring `Retry-After`.

    Args:
        model: The model name the server knows.
        client: An `openai.AsyncOpenAI` to use (a copy with `max_retries=0` is made).
        base_url: The server's base URL (`.../v1`); default the SDK's (`OPENAI_BASE_URL`).
        api_key: The API key; default `OPENAI_API_KEY`, or a placeholder with `base_url`
            (local servers need none).
        instructions: The system message.
        output_type: A pydantic model for a structured final answer (see `ModelAgent`).
        stream: Stream the reply as live `model_delta` events.
        max_tokens: Upper bound of output tokens per call (None: the server's default).
        temperature: Sampling temperature (None: the server's default).
        strict_tools: Send tool schemas in strict mode where the schema allows it.
        ask_user: Offer an `ask_user(question)` tool.
        timeout: Seconds the SDK waits for one request (None: the SDK's default); the run's
            `model_timeout` bounds the call anyway.
        request_options: Extra keyword arguments for `chat.completions.create`.
        name: The agent's name in the capability snapshot.

    Raises:
        ImportError: The `openai` package is missing (install `steerable[openai]`).
    """

    provider = "openai"

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
        max_tokens: int | None = None,
        temperature: float | None = None,
        strict_tools: bool = True,
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
            import openai
        except ImportError:
            raise missing_extra("openai", "openai") from None
        self._sdk = openai
        self.client = sdk_client(
            openai.AsyncOpenAI,
            "OPENAI_API_KEY",
            client=client,
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
        )
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.strict_tools = strict_tools
        self.request_options = dict(request_options or {})

    def request(self, view: RunView, names: ToolNames) -> dict[str, Any]:
        """The keyword arguments of `chat.completions.create` for this view (no I/O)."""
        strict = self.strict_tools
        tools = [
            openai_tool(spec, name=names.provider("tool", spec.name), strict=strict)
            for spec in view.tools
        ]
        tools += [
            openai_tool(self.subagent_spec(a, names.provider("subagent", a)), strict=strict)
            for a in view.subagents
        ]
        tools += [openai_tool(spec, strict=strict) for spec in self.extra_tools()]
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": to_openai_messages(
                view,
                instructions=self.instructions,
                names=names,
                structured=self.output_type is not None,
            ),
        }
        if tools:
            kwargs["tools"] = tools
        if self.max_tokens is not None:
            kwargs["max_tokens"] = self.max_tokens
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.stream:
            kwargs["stream"] = True
            kwargs["stream_options"] = {"include_usage": True}
        kwargs.update(self.request_options)
        return kwargs

    async def complete(self, view: RunView, names: ToolNames) -> ModelReply:
        """One chat-completions request (streamed or not) as a `ModelReply`."""
        kwargs = self.request(view, names)
        try:
            if self.stream:
                return await self._streamed(kwargs, view)
            response = await self.client.chat.completions.create(**kwargs)
            return _reply(response)
        except ProviderError:
            raise
        except self._sdk.APIStatusError as exc:
            raise self._status_error(exc) from None
        except self._sdk.APITimeoutError as exc:
            raise provider_error(str(exc), reason="timeout", provider="openai") from None
        except self._sdk.APIConnectionError as exc:
            raise provider_error(str(exc), reason="connection", provider="openai") from None
        except (self._sdk.APIError, ValueError, TypeError, AttributeError) as exc:
            raise provider_error(
                f"{type(exc).__name__}: {exc}", reason="malformed_response", provider="openai"
            ) from None

    async def _streamed(self, kwargs: dict[str, Any], view: RunView) -> ModelReply:
        emit = emitter(view.call)
        stream = await self.client.chat.completions.create(**kwargs)
        text: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage = Usage()
        stop: str | None = None
        try:
            async for chunk in stream:
                raw_usage = getattr(chunk, "usage", None)
                if raw_usage is not None:
                    usage = _usage(raw_usage)
                for choice in getattr(chunk, "choices", None) or ():
                    stop = getattr(choice, "finish_reason", None) or stop
                    delta = choice.delta
                    piece = getattr(delta, "content", None)
                    if piece:
                        text.append(piece)
                        emit({"type": "text", "text": piece})
                    for tc in getattr(delta, "tool_calls", None) or ():
                        slot = calls.setdefault(tc.index, {"id": None, "name": "", "args": ""})
                        function = getattr(tc, "function", None)
                        name = getattr(function, "name", None) or ""
                        args = getattr(function, "arguments", None) or ""
                        slot["id"] = tc.id or slot["id"]
                        slot["name"] += name
                        slot["args"] += args
                        emit(
                            {
                                "type": "tool_call",
                                "index": tc.index,
                                "id": tc.id,
                                "name": name,
                                "arguments": args,
                            }
                        )
        finally:
            with contextlib.suppress(Exception):
                await stream.close()  # on cancel too: the connection is closed, not pooled
        return ModelReply(
            text="".join(text),
            tool_calls=[
                ReplyToolCall(c["id"], c["name"], c["args"]) for _, c in sorted(calls.items())
            ],
            usage=usage,
            stop_reason=stop,
        )

    def _status_error(self, exc: Any) -> ProviderError:
        status = int(getattr(exc, "status_code", 0) or 0)
        body = getattr(exc, "body", None)
        error = body.get("error", body) if isinstance(body, dict) else None
        code = None
        message = str(getattr(exc, "message", "") or exc)
        if isinstance(error, dict):
            code = error.get("code") or error.get("type")
            message = str(error.get("message") or message)
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
        return provider_error(
            message,
            reason=classify_status(status, None if code is None else str(code), message),
            status=status,
            provider_code=None if code is None else str(code),
            request_id=getattr(exc, "request_id", None),
            retry_after=parse_retry_after(headers),
            provider="openai",
        )


def _usage(raw: Any) -> Usage:
    return Usage(
        input_tokens=int(getattr(raw, "prompt_tokens", 0) or 0),
        output_tokens=int(getattr(raw, "completion_tokens", 0) or 0),
    )


def _reply(response: Any) -> ModelReply:
    choices = getattr(response, "choices", None)
    if not choices:
        raise ValueError(f"the response has no choices: {str(response)[:200]}")
    message = choices[0].message
    calls = [
        ReplyToolCall(tc.id, tc.function.name, tc.function.arguments or "")
        for tc in (getattr(message, "tool_calls", None) or ())
    ]
    usage = getattr(response, "usage", None)
    return ModelReply(
        text=getattr(message, "content", None) or "",
        tool_calls=calls,
        usage=Usage() if usage is None else _usage(usage),
        stop_reason=getattr(choices[0], "finish_reason", None),
    )
