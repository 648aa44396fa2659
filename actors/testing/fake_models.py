"""Loopback fake model servers speaking the real wire formats (OpenAI chat completions and
Anthropic messages), for testing model agents without a network or a key.

Each server listens on 127.0.0.1 only, answers from a script of `Reply`s (or a function of the
request), and records every request and when each connection was closed. Streams are real SSE;
`Reply.never_ending()` streams a little and then never ends, so a test can cancel the call and
see the server observe the close. Standard library only; every thread it starts is named
`steerable-fake-*` and joined on `close()`.
"""

from __future__ import annotations

import contextlib
import http.server
import itertools
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Self

__all__ = ["FakeAnthropicServer", "FakeOpenAIServer", "RecordedRequest", "Reply"]

_PIECE = 6  # characters per streamed text delta
_POLL = 0.002  # seconds between checks of a hanging stream's socket


@dataclass
class Reply:
    """One scripted answer of a fake server. Build one with the class methods.

    Attributes:
        text: The assistant's text.
        tool_calls: (name, arguments) of each tool call, in order.
        ids: The tool calls' ids (default: generated, unique per server).
        usage: (input tokens, output tokens).
        status: The HTTP status (200 for an answer).
        error: The error's (type or code, message), for a status >= 400.
        headers: Extra response headers (e.g. `Retry-After`).
        hang: Stream the text, then never end (until the client closes the connection).
        raw: A body sent as is (malformed replies).
    """

    text: str = ""
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    ids: list[str] | None = None
    usage: tuple[int, int] = (10, 5)
    status: int = 200
    error: tuple[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False
    raw: bytes | None = None

    @classmethod
    def say(cls, text: str, *, usage: tuple[int, int] = (10, 5)) -> Reply:
        """A plain text answer (the run finishes with it)."""
        return cls(text=text, usage=usage)

    @classmethod
    def call(
        cls,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        id: str | None = None,
        text: str = "",
        usage: tuple[int, int] = (10, 5),
    ) -> Reply:
        """One tool call."""
        return cls(
            text=text,
            tool_calls=[(name, dict(arguments or {}))],
            ids=None if id is None else [id],
            usage=usage,
        )

    @classmethod
    def calls(
        cls,
        *calls: tuple[str, dict[str, Any]],
        ids: list[str] | None = None,
        usage: tuple[int, int] = (10, 5),
    ) -> Reply:
        """Parallel tool calls in one answer."""
        return cls(tool_calls=list(calls), ids=ids, usage=usage)

    @classmethod
    def fail(
        cls,
        status: int,
        message: str = "error",
        *,
        code: str | None = None,
        retry_after: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """An HTTP error with the provider's error body (and `Retry-After` if given)."""
        extra = dict(headers or {})
        if retry_after is not None:
            extra["Retry-After"] = f"{retry_after:g}"
        return cls(status=status, error=(code or "", message), headers=extra)

    @classmethod
    def never_ending(cls, text: str = "thinking") -> Reply:
        """A stream that sends `text` and then nothing more, never ending by itself."""
        return cls(text=text, hang=True)

    @classmethod
    def garbage(cls, body: bytes = b'{"choices": [', *, status: int = 200) -> Reply:
        """A malformed body (truncated JSON by default) with a JSON content type."""
        return cls(raw=body, status=status)


@dataclass
class RecordedRequest:
    """One request the fake server received.

    Attributes:
        path: The request path.
        headers: Its headers (lower-case names).
        body: The parsed JSON body.
        at: `time.monotonic()` when it arrived.
        closed_at: `time.monotonic()` when the client closed a stream before its end (None
            otherwise).
        completed: Whether the whole reply was sent.
    """

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float
    closed_at: float | None = None
    completed: bool = False

    @property
    def stream(self) -> bool:
        """Whether the client asked for a stream."""
        return bool(self.body.get("stream"))


class _FakeServer:
    """The shared machinery; see `FakeOpenAIServer` and `FakeAnthropicServer`."""

    _suffix = ""
    _kind = "fake"

    def __init__(
        self,
        script: Iterable[Reply] | Callable[[RecordedRequest], Reply] = (),
        *,
        default: Reply | None = None,
    ) -> None:
        self._lock = threading.Condition()
        self._responder = script if callable(script) else None
        self._script: list[Reply] = [] if callable(script) else list(script)
        self._default = default
        self.requests: list[RecordedRequest] = []
        self._ids = itertools.count(1)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._httpd = _Server(("127.0.0.1", 0), self)
        self._serve = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"steerable-fake-{self._kind}",
        )
        self._serve.start()

    @property
    def port(self) -> int:
        """The loopback port it listens on."""
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """The base URL to give the SDK client."""
        return f"http://127.0.0.1:{self.port}{self._suffix}"

    def push(self, *replies: Reply) -> None:
        """Append replies to the script."""
        with self._lock:
            self._script.extend(replies)

    def wait_requests(self, n: int, timeout: float = 10.0) -> list[RecordedRequest]:
        """Block until at least `n` requests arrived; returns them all.

        Raises:
            TimeoutError: Fewer arrived within `timeout` seconds.
        """
        with self._lock:
            if not self._lock.wait_for(lambda: len(self.requests) >= n, timeout):
                raise TimeoutError(f"{len(self.requests)} requests within {timeout}s, wanted {n}")
            return list(self.requests)

    def wait_closed(self, index: int, timeout: float = 10.0) -> float:
        """Block until the client closed the stream of request `index`; returns when (monotonic).

        Raises:
            TimeoutError: It was not closed within `timeout` seconds.
        """
        with self._lock:
            ok = self._lock.wait_for(
                lambda: len(self.requests) > index and self.requests[index].closed_at is not None,
                timeout,
            )
            if not ok:
                raise TimeoutError(f"request {index} was not closed within {timeout}s")
            closed = self.requests[index].closed_at
            assert closed is not None
            return closed

    def close(self) -> None:
        """Stop serving, end hanging streams and join every thread."""
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._serve.join()
        for thread in list(self._threads):
            thread.join()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- serving ---------------------------------------------------------------------------

    def _next(self, request: RecordedRequest) -> Reply:
        if self._responder is not None:
            return self._responder(request)
        with self._lock:
            if self._script:
                return self._script.pop(0)
        if self._default is not None:
            return self._default
        return Reply.fail(500, "the fake server's script is empty", code="script_empty")

    def _record(self, request: RecordedRequest) -> int:
        with self._lock:
            self.requests.append(request)
            self._lock.notify_all()
            return len(self.requests) - 1

    def _closed(self, index: int, *, completed: bool) -> None:
        with self._lock:
            request = self.requests[index]
            if completed:
                request.completed = True
            else:
                request.closed_at = time.monotonic()
            self._lock.notify_all()

    def _call_ids(self, reply: Reply, prefix: str) -> list[str]:
        if reply.ids is not None:
            return list(reply.ids)
        return [f"{prefix}{next(self._ids)}" for _ in reply.tool_calls]

    def _handle(self, handler: _Handler) -> None:
        if not handler.path.endswith(self._endpoint()):
            handler.send_json(404, {"error": {"message": f"no route {handler.path}"}})
            return
        length = int(handler.headers.get("content-length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {"_unparsed": raw.decode("utf-8", "replace")}
        headers = {k.lower(): v for k, v in handler.headers.items()}
        request = RecordedRequest(handler.path, headers, body, time.monotonic())
        index = self._record(request)
        reply = self._next(request)
        if reply.raw is not None:
            handler.send_raw(reply.status, reply.raw, reply.headers)
        elif reply.status >= 400:
            handler.send_json(reply.status, self._error_body(reply), reply.headers)
        elif request.stream:
            handler.start_stream(reply.headers)
            try:
                for event in self._events(reply, body):
                    handler.write(event)
                if reply.hang:
                    self._hang(handler, index)
                    return
            except OSError:
                self._closed(index, completed=False)
                return
        else:
            handler.send_json(200, self._body(reply, body), reply.headers)
        self._closed(index, completed=True)

    def _hang(self, handler: _Handler, index: int) -> None:
        """Hold the stream open until the client closes it (or the server stops)."""
        sock = handler.connection
        while not self._stop.is_set():
            readable, _, _ = select.select([sock], [], [], _POLL)
            if readable:
                try:
                    data = sock.recv(1, socket.MSG_PEEK)
                except OSError:
                    data = b""
                if not data:
                    self._closed(index, completed=False)
                    return

    def _endpoint(self) -> str:
        raise NotImplementedError

    def _error_body(self, reply: Reply) -> dict[str, Any]:
        raise NotImplementedError

    def _body(self, reply: Reply, request: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def _events(self, reply: Reply, request: dict[str, Any]) -> Iterator[bytes]:
        raise NotImplementedError


class FakeOpenAIServer(_FakeServer):
    """A fake OpenAI-compatible server: `POST {base_url}/chat/completions`, JSON or SSE.

    Args:
        script: Replies in order, or a function of the request returning one.
        default: The reply once the script is used up (default: an HTTP 500).
    """

    _suffix = "/v1"
    _kind = "openai"

    def _endpoint(self) -> str:
        return "/chat/completions"

    def _error_body(self, reply: Reply) -> dict[str, Any]:
        code, message = reply.error or ("", "error")
        return {"error": {"message": message, "type": code or "api_error", "code": code or None}}

    def _tool_calls(self, reply: Reply) -> list[dict[str, Any]]:
        ids = self._call_ids(reply, "call_")
        return [
            {"id": cid, "type": "function",
             "function": {"name": name, "arguments": json.dumps(arguments)}}
            for cid, (name, arguments) in zip(ids, reply.tool_calls, strict=True)
        ]  # fmt: skip

    def _usage(self, reply: Reply) -> dict[str, int]:
        i, o = reply.usage
        return {"prompt_tokens": i, "completion_tokens": o, "total_tokens": i + o}

    def _body(self, reply: Reply, request: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
        if reply.tool_calls:
            message["tool_calls"] = self._tool_calls(reply)
        return {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion",
            "created": 0,
            "model": str(request.get("model", "fake")),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                }
            ],
            "usage": self._usage(reply),
        }

    def _events(self, reply: Reply, request: dict[str, Any]) -> Iterator[bytes]:
        base = {
            "id": f"chatcmpl-{next(self._ids)}",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": str(request.get("model", "fake")),
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return _sse(None, {**base, "choices": [choice]})

        yield chunk({"role": "assistant", "content": ""})
        for piece in _pieces(reply.text):
            yield chunk({"content": piece})
        if reply.hang:
            return
        for index, call in enumerate(self._tool_calls(reply)):
            function = call["function"]
            head = {"index": index, "id": call["id"], "type": "function",
                    "function": {"name": function["name"], "arguments": ""}}  # fmt: skip
            yield chunk({"tool_calls": [head]})
            for piece in _pieces(function["arguments"]):
                yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        yield chunk({}, "tool_calls" if reply.tool_calls else "stop")
        if (request.get("stream_options") or {}).get("include_usage"):
            yield _sse(None, {**base, "choices": [], "usage": self._usage(reply)})
        yield b"data: [DONE]\n\n"


class FakeAnthropicServer(_FakeServer):
    """A fake Anthropic Messages server: `POST {base_url}/v1/messages`, JSON or SSE events.

    Args:
        script: Replies in order, or a function of the request returning one.
        default: The reply once the script is used up (default: an HTTP 500).
    """

    _kind = "anthropic"

    def _endpoint(self) -> str:
        return "/v1/messages"

    def _error_body(self, reply: Reply) -> dict[str, Any]:
        code, message = reply.error or ("", "error")
        return {"type": "error", "error": {"type": code or "api_error", "message": message}}

    def _content(self, reply: Reply) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if reply.text:
            blocks.append({"type": "text", "text": reply.text})
        ids = self._call_ids(reply, "toolu_")
        blocks.extend(
            {"type": "tool_use", "id": cid, "name": name, "input": arguments}
            for cid, (name, arguments) in zip(ids, reply.tool_calls, strict=True)
        )
        return blocks

    def _message(self, reply: Reply, request: dict[str, Any], content: list[Any]) -> dict[str, Any]:
        return {
            "id": f"msg_{next(self._ids)}",
            "type": "message",
            "role": "assistant",
            "model": str(request.get("model", "fake")),
            "content": content,
            "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": reply.usage[0], "output_tokens": reply.usage[1]},
        }

    def _body(self, reply: Reply, request: dict[str, Any]) -> dict[str, Any]:
        return self._message(reply, request, self._content(reply))

    def _events(self, reply: Reply, request: dict[str, Any]) -> Iterator[bytes]:
        start = self._message(reply, request, [])
        start["stop_reason"] = None
        start["usage"] = {"input_tokens": reply.usage[0], "output_tokens": 1}
        yield _sse("message_start", {"type": "message_start", "message": start})
        yield _sse("ping", {"type": "ping"})
        blocks = self._content(reply) or [{"type": "text", "text": ""}]
        for index, block in enumerate(blocks):
            if block["type"] == "text":
                yield _sse("content_block_start", {"type": "content_block_start", "index": index,
                           "content_block": {"type": "text", "text": ""}})  # fmt: skip
                for piece in _pieces(block["text"]):
                    text = {"type": "text_delta", "text": piece}
                    yield _sse("content_block_delta", {"type": "content_block_delta",
                               "index": index, "delta": text})  # fmt: skip
                if reply.hang:
                    return
            else:
                head = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                yield _sse("content_block_start", {"type": "content_block_start", "index": index,
                           "content_block": head})  # fmt: skip
                for piece in _pieces(json.dumps(block["input"])):
                    delta = {"type": "input_json_delta", "partial_json": piece}
                    yield _sse("content_block_delta", {"type": "content_block_delta",
                               "index": index, "delta": delta})  # fmt: skip
            yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
        end: dict[str, Any] = {"stop_reason": "tool_use" if reply.tool_calls else "end_turn",
                               "stop_sequence": None}  # fmt: skip
        yield _sse("message_delta", {"type": "message_delta", "delta": end,
                   "usage": {"output_tokens": reply.usage[1]}})  # fmt: skip
        yield _sse("message_stop", {"type": "message_stop"})


def _pieces(text: str) -> Iterator[str]:
    for i in range(0, len(text), _PIECE):
        yield text[i : i + _PIECE]


def _sse(event: str | None, data: dict[str, Any]) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = False  # joined on close: a test leaves no thread behind
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], owner: _FakeServer) -> None:
        self.owner = owner
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name=f"steerable-fake-{self.owner._kind}-conn",
        )
        self.owner._threads = [t for t in self.owner._threads if t.is_alive()]
        self.owner._threads.append(thread)
        thread.start()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # one request per connection: a close is the stream's end
    server: _Server
    timeout = 10

    def do_POST(self) -> None:
        self.server.owner._handle(self)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args  # the library prints nothing

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self.send_raw(status, json.dumps(body).encode(), headers)

    def send_raw(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.send_header("x-request-id", "req_fake")
        self.send_header("request-id", "req_fake")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        with contextlib.suppress(OSError):
            self.wfile.write(data)

    def start_stream(self, headers: dict[str, str]) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("x-request-id", "req_fake")
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.flush()

    def write(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()
