"""The bench's async OpenAI-API client (httpx.AsyncClient): many streams on one event loop.

Streams are read by the gates' StreamParser (sparkfleet/gates/client.py), so the bench and the gates
read SSE lines, usage blocks and first/last output times one way. This module only adds what a
benchmark needs on top: async requests, a send time per stream, and counts of what it sent (to tell
our own traffic from other traffic in the engine's /metrics).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from sparkfleet.gates.client import Reply, RequestFailed, StreamParser, _error_text, clip


@dataclass
class Timed:
    """One streamed reply and when it happened, on the perf_counter clock."""

    reply: Reply  # ttft_s / last_s / elapsed_s are seconds after `sent`
    sent: float  # just before the request was handed to httpx
    ended: float  # when `data: [DONE]` had been read


class AsyncApiClient:
    """One endpoint, one key, a pool big enough for every stream of a cell at once."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout_s: float = 600.0,
                 max_streams: int = 64, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Keep-alive for every stream: a cell must not pay TCP connects that the warm-up already paid.
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=headers, transport=transport,
                                      timeout=httpx.Timeout(timeout_s, connect=10.0),
                                      limits=httpx.Limits(max_connections=max_streams,
                                                          max_keepalive_connections=max_streams))
        self.requests_sent = 0  # chat requests the server accepted (HTTP 200): the engine counts them
        self.tokens_seen = 0  # completion tokens of those, from usage blocks
        self.usage_missing = 0  # accepted requests whose stream had no usage block

    async def aclose(self) -> None:
        await self.http.aclose()

    async def get_text(self, path: str) -> tuple[int, str, httpx.Headers]:
        """A GET: status, body text and headers; transport errors become RequestFailed."""
        try:
            resp = await self.http.get(path)
        except httpx.HTTPError as exc:
            raise RequestFailed(f"GET {path}: {type(exc).__name__}: {exc}") from None
        return resp.status_code, resp.text, resp.headers

    async def post_json(self, path: str, body: dict) -> tuple[int, object]:
        """A POST with a JSON answer: status and the decoded body (None when it is not JSON)."""
        try:
            resp = await self.http.post(path, json=body)
        except httpx.HTTPError as exc:
            raise RequestFailed(f"POST {path}: {type(exc).__name__}: {exc}") from None
        try:
            return resp.status_code, resp.json()
        except ValueError:
            return resp.status_code, None

    async def stream(self, body: dict) -> Timed:
        """A streamed chat completion asking for the usage block (any error raises RequestFailed)."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        parser = StreamParser()
        clock = time.perf_counter
        sent = clock()
        try:
            async with self.http.stream("POST", "/v1/chat/completions", json=body) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    raise RequestFailed(f"HTTP {resp.status_code}: {_error_text(resp)}", resp.status_code)
                self.requests_sent += 1
                ended = None
                async for line in resp.aiter_lines():
                    # Read on past `data: [DONE]` to the body's end: a response left unread closes its
                    # connection, and the next cell would pay a TCP connect inside its TTFT.
                    if not parser.done and parser.feed_line(line, clock() - sent):
                        ended = clock()
        except httpx.HTTPError as exc:
            raise RequestFailed(f"stream: {type(exc).__name__}: {exc}") from None
        ended = ended or clock()
        reply = parser.finish(ended - sent)
        tokens = reply.completion_tokens
        if tokens is None:
            self.usage_missing += 1
        else:
            self.tokens_seen += tokens
        return Timed(reply, sent, ended)


def describe(exc: BaseException) -> str:
    """One line for a failed request."""
    if isinstance(exc, RequestFailed):
        return str(exc)
    return clip(f"{type(exc).__name__}: {exc}", 200)
