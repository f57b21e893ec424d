"""A small OpenAI-API client for the gates (httpx): plain and streamed chat, SSE parsing, usage blocks.

Token counts always come from the usage block (the final chunk of a stream asked with
`stream_options.include_usage`): DSpark packs several tokens into one chunk, so counting chunks
undercounts. The API key is sent as a bearer token and never appears in what this module returns.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

DEFAULT = object()  # "use the client's own key" (None means: send no key)
EXCERPT = 300  # characters of a response body kept in an error


class RequestFailed(Exception):
    """A request that did not give a usable answer: transport error, HTTP error, or a malformed body."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def clip(text: str, limit: int = 240) -> str:
    """Head and tail of a long text, so evidence stays short but shows both ends."""
    text = text if isinstance(text, str) else str(text)
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head - 5
    return f"{text[:head]} […{len(text) - head - tail} chars…] {text[-tail:]}"


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text as the API carries it

    def args(self) -> dict | None:
        """The arguments as a dict, or None when they are not a JSON object."""
        try:
            value = json.loads(self.arguments or "{}")
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def show(self) -> str:
        return f"{self.name}({self.arguments})"


@dataclass
class Reply:
    """One chat completion, plain or streamed, reduced to what the gates judge."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict | None = None  # prompt_tokens / completion_tokens / total_tokens, when sent
    timings: dict | None = None  # the server's own per-request counts and times, when it sends them (llama.cpp)
    elapsed_s: float = 0.0
    ttft_s: float | None = None  # streamed: first chunk carrying text, reasoning or a tool call
    last_s: float | None = None  # streamed: last chunk carrying output
    chunks: int = 0  # streamed: chunks carrying output
    streamed: bool = False

    @property
    def completion_tokens(self) -> int | None:
        value = (self.usage or {}).get("completion_tokens")
        return value if isinstance(value, int) else None

    @property
    def prompt_tokens(self) -> int | None:
        value = (self.usage or {}).get("prompt_tokens")
        return value if isinstance(value, int) else None

    def show(self) -> str:
        """What came back, short: the text, the tool calls, the finish reason."""
        parts = []
        if self.reasoning:
            parts.append(f"reasoning {clip(self.reasoning, 80)!r}")
        if self.content or not self.tool_calls:
            parts.append(repr(clip(self.content)))
        if self.tool_calls:
            parts.append("tool_calls " + "; ".join(clip(c.show(), 120) for c in self.tool_calls))
        parts.append(f"finish_reason {self.finish_reason}")
        return ", ".join(parts)


def _error_text(resp: httpx.Response) -> str:
    try:
        body = resp.json()
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(body, dict) and body.get("detail"):
            return str(body["detail"])
    except ValueError:
        pass
    return clip(" ".join(resp.text.split()), EXCERPT)


def _reasoning_of(d: dict) -> str:
    # vLLM has used both names: `reasoning_content` (most versions) and `reasoning` (newer ones)
    value = d.get("reasoning_content")
    if not value:
        value = d.get("reasoning")
    return value if isinstance(value, str) else ""


class ApiClient:
    """One endpoint, one key. Cheap to `clone()` for another thread."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout_s: float = 600.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.transport = transport
        self.http = httpx.Client(base_url=self.base_url, transport=transport,
                                 timeout=httpx.Timeout(timeout_s, connect=10.0),
                                 limits=httpx.Limits(max_connections=64, max_keepalive_connections=16))

    def clone(self) -> ApiClient:
        return ApiClient(self.base_url, self.api_key, timeout_s=self.timeout_s, transport=self.transport)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _timeout(timeout_s: float | None) -> Any:
        # httpx reads timeout=None as "no timeout at all"; the client's own default is a sentinel
        return httpx.Timeout(timeout_s, connect=10.0) if timeout_s else httpx.USE_CLIENT_DEFAULT

    def _headers(self, key: Any) -> dict[str, str]:
        key = self.api_key if key is DEFAULT else key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def request(self, method: str, path: str, *, body: dict | None = None, key: Any = DEFAULT,
                timeout_s: float | None = None) -> httpx.Response:
        """A raw request (any status); transport errors become RequestFailed."""
        try:
            return self.http.request(method, path, json=body, headers=self._headers(key),
                                     timeout=self._timeout(timeout_s))
        except httpx.HTTPError as exc:
            raise RequestFailed(f"{method} {path}: {type(exc).__name__}: {exc}") from None

    def get_json(self, path: str) -> Any:
        resp = self.request("GET", path)
        if resp.status_code != 200:
            raise RequestFailed(f"GET {path}: HTTP {resp.status_code}: {_error_text(resp)}", resp.status_code)
        try:
            return resp.json()
        except ValueError:
            raise RequestFailed(f"GET {path}: not JSON: {clip(resp.text, 120)!r}", resp.status_code) from None

    def models(self) -> list[dict]:
        data = self.get_json("/v1/models")
        items = data.get("data") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise RequestFailed("GET /v1/models: no 'data' list in the answer")
        return [m for m in items if isinstance(m, dict)]

    def chat(self, body: dict, *, timeout_s: float | None = None) -> Reply:
        """A non-streamed chat completion."""
        body = {**body, "stream": False}
        t0 = time.monotonic()
        resp = self.request("POST", "/v1/chat/completions", body=body, timeout_s=timeout_s)
        elapsed = time.monotonic() - t0
        if resp.status_code != 200:
            raise RequestFailed(f"HTTP {resp.status_code}: {_error_text(resp)}", resp.status_code)
        try:
            data = resp.json()
            choice = data["choices"][0]
            msg = choice.get("message") or {}
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise RequestFailed(f"malformed completion: {clip(resp.text, 160)!r}", resp.status_code) from None
        calls = []
        for i, c in enumerate(msg.get("tool_calls") or []):
            fn = (c or {}).get("function") or {}
            calls.append(ToolCall(str(c.get("id") or f"call_{i}"), str(fn.get("name") or ""),
                                  fn.get("arguments") if isinstance(fn.get("arguments"), str)
                                  else json.dumps(fn.get("arguments") or {})))
        return Reply(content=msg.get("content") or "", reasoning=_reasoning_of(msg), tool_calls=calls,
                     finish_reason=choice.get("finish_reason"), usage=data.get("usage"), elapsed_s=elapsed)

    def stream(self, body: dict, *, timeout_s: float | None = None) -> Reply:
        """A streamed chat completion asking for the usage block; the chunks reassembled."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        parser = StreamParser()
        t0 = time.monotonic()
        try:
            with self.http.stream("POST", "/v1/chat/completions", json=body, headers=self._headers(DEFAULT),
                                  timeout=self._timeout(timeout_s)) as resp:
                if resp.status_code != 200:
                    resp.read()
                    raise RequestFailed(f"HTTP {resp.status_code}: {_error_text(resp)}", resp.status_code)
                for line in resp.iter_lines():
                    if parser.feed_line(line, time.monotonic() - t0):
                        break
        except httpx.HTTPError as exc:
            raise RequestFailed(f"stream: {type(exc).__name__}: {exc}") from None
        return parser.finish(time.monotonic() - t0)


class StreamParser:
    """The SSE lines of one streamed chat completion, reassembled into a Reply.

    The one way streams are read: the gates' client above and the bench's async client
    (sparkfleet/bench/aclient.py) both feed their lines here, with the time each line arrived."""

    def __init__(self) -> None:
        self.reply = Reply(streamed=True)
        self.calls: dict[int, dict] = {}
        self.done = False

    def feed_line(self, line: str, now: float) -> bool:
        """One line (without its newline) read at `now` seconds; True once `data: [DONE]` has come."""
        if not line.startswith("data:"):
            return self.done  # SSE comments, event names and blank separators
        payload = line[5:].strip()
        if payload == "[DONE]":
            self.done = True
            return True
        try:
            chunk = json.loads(payload)
        except ValueError:
            raise RequestFailed(f"stream: a chunk is not JSON: {clip(payload, 120)!r}") from None
        if not isinstance(chunk, dict):
            raise RequestFailed(f"stream: a chunk is not a JSON object: {clip(payload, 120)!r}")
        if chunk.get("error"):
            err = chunk["error"]
            raise RequestFailed("stream: error chunk: " + str(err.get("message") if isinstance(err, dict) else err))
        self.feed_chunk(chunk, now)
        return False

    def finish(self, elapsed_s: float) -> Reply:
        """The reply, once the stream has ended; a stream cut before `data: [DONE]` is an error."""
        if not self.done:
            raise RequestFailed("stream ended without 'data: [DONE]'")
        reply = self.reply
        reply.elapsed_s = elapsed_s
        reply.tool_calls = [ToolCall(c["id"] or f"call_{i}", c["name"], c["arguments"])
                            for i, c in sorted(self.calls.items())]
        return reply

    def feed_chunk(self, chunk: dict, now: float) -> None:
        reply, calls = self.reply, self.calls
        if chunk.get("usage"):
            reply.usage = chunk["usage"]
        if isinstance(chunk.get("timings"), dict):
            reply.timings = chunk["timings"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            carried = False
            text = delta.get("content")
            if isinstance(text, str) and text:
                reply.content += text
                carried = True
            reasoning = _reasoning_of(delta)
            if reasoning:
                reply.reasoning += reasoning
                carried = True
            for tc in delta.get("tool_calls") or []:
                index = tc.get("index", len(calls))
                slot = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
                carried = True
            if choice.get("finish_reason"):
                reply.finish_reason = choice["finish_reason"]
            if carried:
                reply.chunks += 1
                if reply.ttft_s is None:
                    reply.ttft_s = now
                reply.last_s = now
