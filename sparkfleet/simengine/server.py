"""The head's OpenAI-compatible HTTP API (stdlib ThreadingHTTPServer): health, models, completions, metrics.

Every response carries `x-sparkfleet-sim: 1`; `/v1/models` says `owned_by: sparkfleet-sim`.
Streams are Server-Sent Events over chunked HTTP/1.1, several tokens per event (one engine step),
with a final usage chunk when `stream_options.include_usage` is set.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from sparkfleet.simengine import answers, png, tokens
from sparkfleet.simengine.answers import Answer, ApiError, Options
from sparkfleet.simengine.config import Config
from sparkfleet.simengine.engine import Engine, EngineDead, Job, Piece, block_hashes
from sparkfleet.simengine.log import Log
from sparkfleet.simengine.metrics import Metrics

SIM_VERSION = "0.0.0+sparkfleet.sim"
OWNER = "sparkfleet-sim"
SIM_HEADER = "x-sparkfleet-sim"
MAX_BODY = 256 * 1024 * 1024  # a 500K-token needle prompt is a few MB; leave room
ROUTES = (("/health", "GET"), ("/metrics", "GET"), ("/version", "GET"), ("/tokenize", "POST"), ("/v1/models", "GET"),
          ("/v1/chat/completions", "POST"), ("/v1/completions", "POST"))
# What launcher.py:38-46 prints at startup (0.13.0): FastAPI's docs routes (GET and HEAD: a set, printed in
# set order), then the OpenAI server's routers in the order build_app includes them (openai/api_server.py,
# pooling/*/api_router.py, serve/*/api_router.py; routes behind flags left out). /metrics is a mount: unlisted.
PRINTED_ROUTES = (
    ("/openapi.json", "GET, HEAD"), ("/docs", "GET, HEAD"), ("/docs/oauth2-redirect", "GET, HEAD"),
    ("/redoc", "GET, HEAD"), ("/load", "GET"), ("/v1/models", "GET"), ("/version", "GET"),
    ("/v1/responses", "POST"), ("/v1/responses/{response_id}", "GET"), ("/v1/responses/{response_id}/cancel", "POST"),
    ("/v1/messages", "POST"), ("/v1/chat/completions", "POST"), ("/v1/completions", "POST"),
    ("/v1/audio/transcriptions", "POST"), ("/v1/audio/translations", "POST"), ("/classify", "POST"),
    ("/v1/embeddings", "POST"), ("/pooling", "POST"), ("/score", "POST"), ("/v1/score", "POST"), ("/rerank", "POST"),
    ("/v1/rerank", "POST"), ("/v2/rerank", "POST"), ("/inference/v1/generate", "POST"), ("/scale_elastic_ep", "POST"),
    ("/is_scaling_elastic_ep", "POST"), ("/health", "GET"), ("/tokenize", "POST"), ("/detokenize", "POST"),
)
IMAGE_PATCH = 28  # one prompt token per 28x28 patch of an image


class App:
    """State shared by request threads: config, engine, metrics, serving state, the key, the leak."""

    def __init__(self, cfg: Config, log: Log) -> None:
        self.cfg, self.log = cfg, log
        self.metrics = Metrics(cfg.served_names[0], cfg.max_model_len, cfg.num_speculative_tokens)
        self.engine: Engine | None = None
        self.state = "booting"  # booting | serving | dead
        self.opts = Options(frozenset(cfg.faults), cfg.vision, cfg.tools, cfg.thinking_default)
        self.key = (os.environ.get(cfg.api_key_env) or None) if cfg.api_key_env else None
        self.created = int(time.time())
        self.leak_lock = threading.Lock()
        self.leaked_kb = 0
        self.proc = "APIServer"
        self.hung = threading.Event()  # rank-hang: requests are taken but no token is ever produced
        self.released = threading.Event()  # set at shutdown, so hung request threads end
        self.inflight = 0  # requests being handled (the head waits for them to be answered before it exits)
        self.inflight_cond = threading.Condition()

    def request(self, delta: int) -> None:
        with self.inflight_cond:
            self.inflight += delta
            self.inflight_cond.notify_all()

    def drained(self, timeout: float) -> bool:
        """Wait (at most `timeout` s) until no request is being handled."""
        deadline = time.monotonic() + timeout
        with self.inflight_cond:
            while self.inflight > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.inflight_cond.wait(left)
            return True

    def start_serving(self, kv_tokens: int, gate: Callable[[], bool] | None = None) -> None:
        self.engine = Engine(kv_tokens, self.cfg.max_num_seqs, self.cfg.num_speculative_tokens,
                             self.cfg.step_ms / 1000, self.cfg.prefill_tokens_per_s, self.metrics,
                             garbage=self.cfg.has("garbage-tokens"), token_rate=self.cfg.decode_tokens_per_s,
                             gate=gate, bimodal=self.cfg.has("bimodal"))
        if self.cfg.has("memory-leak"):
            self._write_leak()
        self.state = "serving"

    def engine_died(self) -> None:
        self.state = "dead"
        if self.engine:
            self.engine.kill()

    def leak(self) -> None:
        """memory-leak fault: each served request keeps --leak-mb-per-request more memory."""
        if not self.cfg.has("memory-leak"):
            return
        with self.leak_lock:
            self.leaked_kb += int(self.cfg.leak_mb_per_request * 1024)
            self._write_leak()

    def _write_leak(self) -> None:
        path = Path(str(self.cfg.leak_file))
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(f"{self.leaked_kb}\n")
        os.replace(tmp, path)  # readers never see a half-written number


# ---------------------------------------------------------------------------------------------- prompts


def _image_tokens(url: str) -> list[str]:
    size = png.size_of_data_url(url)
    n = 1 if size is None else max(1, math.ceil(size[0] / IMAGE_PATCH) * math.ceil(size[1] / IMAGE_PATCH))
    tag = hashlib.sha1(url.encode()).hexdigest()[:12]
    return [f"<img:{tag}:{i}>" for i in range(n)]


def chat_prompt(body: dict) -> list[str]:
    """The prompt as tokens: tool schemas, then each message with a role marker, images as patch tokens."""
    out: list[str] = []
    if body.get("tools"):
        out += tokens.tokenize(json.dumps(body["tools"], sort_keys=True))
    for m in body.get("messages") or []:
        if not isinstance(m, dict):
            continue
        out.append(f"<|{m.get('role', 'user')}|>")
        content = m.get("content")
        out += tokens.tokenize(answers.text_of(content))
        for url in answers.image_urls(content):
            out += _image_tokens(url)
        if m.get("tool_calls"):
            out += tokens.tokenize(json.dumps(m["tool_calls"], sort_keys=True))
    out.append("<|Assistant|>")
    return out


def _apply_stop(text: str, stop: Any) -> str:
    stops = [stop] if isinstance(stop, str) else [s for s in (stop or []) if isinstance(s, str) and s]
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]


def build_pieces(answer: Answer, limit: int, body: dict, seed: str) -> tuple[list[Piece], str]:
    """Output tokens for an answer, cut at `limit`; and the finish reason the API will report."""
    content = _apply_stop(answer.content, body.get("stop"))
    pieces = [Piece("reasoning", t) for t in tokens.tokenize(answer.reasoning)]
    pieces += [Piece("content", t) for t in tokens.tokenize(content)]
    for i, call in enumerate(answer.tool_calls):
        pieces.append(Piece("tool_name", call.name, i))
        pieces += [Piece("tool_args", t, i) for t in tokens.tokenize(call.arguments)]
    if body.get("ignore_eos") and not answer.tool_calls and len(pieces) < limit:
        # Benchmarks ask for exact output lengths: keep generating seeded words up to max_tokens.
        filler = answers.generic_answer("", random.Random(seed))[0]
        while len(pieces) < limit:
            pieces += [Piece("content", t) for t in tokens.tokenize(" " + filler)]
    if len(pieces) > limit:
        return pieces[:limit], "length"
    return pieces, answer.finish_reason


# ---------------------------------------------------------------------------------------------- handler


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as uvicorn (asyncio) serves vLLM: with Nagle on, a small stream chunk waits for the
    # client's delayed ACK (up to 40 ms on Linux), which shows up as TTFT and inter-token stalls.
    disable_nagle_algorithm = True
    server_version = "uvicorn"
    sys_version = ""
    app: App  # set on the subclass make_server() builds
    responded = False  # a status line went out for the current request

    # -------------------------------------------------------------------------------- plumbing

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        pass  # access lines are written by _access(), in uvicorn's layout

    def _access(self, status: int) -> None:
        phrase = self.responses.get(status, ("",))[0]
        host, port = self.client_address[:2]
        # uvicorn's access line: '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s'
        # (uvicorn/config.py:94, status and phrase logging.py:87, uvicorn 0.54.0), through the APIServer's stream
        self.app.log.line(self.app.proc, f'INFO:     {host}:{port} - "{self.command} {self.path} HTTP/1.1" '
                          f"{status} {phrase}")

    def _send(self, status: int, body: bytes, ctype: str | None) -> None:
        self.responded = True
        self.send_response(status)
        if ctype is not None:  # a bare Response(status_code=...) has no content-type
            self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.send_header(SIM_HEADER, "1")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self._access(status)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj, ensure_ascii=False).encode(), "application/json")

    def _error(self, err: ApiError) -> None:
        self._json(err.status, err.body())

    def _read_body(self) -> dict:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            data = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                data += self.rfile.read(size)
                self.rfile.readline()
                if len(data) > MAX_BODY:
                    raise ApiError(413, "request body too large")
        else:
            length = int(self.headers.get("content-length") or 0)
            if length > MAX_BODY:
                raise ApiError(413, "request body too large")
            data = bytearray(self.rfile.read(length))
        try:
            body = json.loads(data or b"{}")
        except ValueError as exc:
            raise ApiError(400, f"request body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "request body must be a JSON object")
        return body

    def _authorized(self) -> bool:
        key = self.app.key
        if key is None or self.app.cfg.has("auth-open"):
            return True
        given = self.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {key}".encode())

    # -------------------------------------------------------------------------------- routing

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's naming
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    def _route(self, method: str) -> None:
        self.app.request(+1)
        try:
            self._route_counted(method)
        finally:
            self.app.request(-1)

    def _engine_dead(self) -> None:
        """What a request gets once the engine core is dead: the launcher's handler for EngineDeadError
        answers a bare 500, no body (entrypoints/launcher.py:167-176 runtime_exception_handler, 0.13.0; the
        same in 0.11.0-0.20.0), and tells uvicorn to exit unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH."""
        self._send(500, b"", None)

    def _route_counted(self, method: str) -> None:
        self.responded = False  # once a status line went out, errors can only close the connection
        path = self.path.split("?", 1)[0]
        app = self.app
        try:
            known = {p: m for p, m in ROUTES}
            if path not in known:
                self._json(404, {"detail": "Not Found"})
                return
            if known[path] != method:
                if method == "POST":
                    self._read_body()  # drain it, so the kept-alive connection stays in step
                self._json(405, {"detail": "Method Not Allowed"})
                return
            body = self._read_body() if method == "POST" else {}
            if path == "/health":
                # entrypoints/serve/instrumentator/health.py:22-29 (0.13.0; openai/api_server.py:345 in 0.11.0):
                # 200 unless check_health() raises EngineDeadError, and AsyncLLM.check_health (v1/engine/
                # async_llm.py:719) only asks whether the engine core has errored. It never asks the workers:
                # with a remote worker gone the head answers 200 until a step needs that worker and times out.
                self._send(200 if app.state == "serving" else 503, b"", None)
                return
            if app.state == "booting":
                # The engine is still loading: nothing but /health answers (503) until it is ready.
                self._json(503, {"error": {"message": "the engine is starting", "type": "ServiceUnavailable",
                                           "param": None, "code": 503}})
                return
            if path.startswith("/v1/") and not self._authorized():
                self._json(401, {"error": "Unauthorized"})
                return
            if path == "/metrics":
                running, waiting, usage = app.engine.snapshot() if app.engine else (0, 0, 0.0)
                text = app.metrics.render(running, waiting, usage)
                self._send(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/version":
                self._json(200, {"version": SIM_VERSION})
            elif path == "/tokenize":
                self._tokenize(body)
            elif path == "/v1/models":
                self._json(200, {"object": "list", "data": [self._model_card(n) for n in app.cfg.served_names]})
            elif app.state == "dead" or app.engine is None:
                self._engine_dead()  # AsyncLLM.generate raises EngineDeadError when errored (async_llm.py)
            elif path == "/v1/chat/completions":
                self._completion(body, chat=True)
            else:
                self._completion(body, chat=False)
        except ApiError as err:
            if self.responded:
                self.close_connection = True
            else:
                self._error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug must not print a Traceback, which log scanners read as fatal
            app.log.error(app.proc, "serving_chat.py:1", f"request failed: {type(exc).__name__}: {exc}")
            self.close_connection = True
            if not self.responded:
                self._json(500, {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "InternalServerError",
                                           "param": None, "code": 500}})

    def _model_card(self, name: str) -> dict:
        cfg = self.app.cfg
        return {"id": name, "object": "model", "created": self.app.created, "owned_by": OWNER,
                "root": cfg.model, "parent": None, "max_model_len": cfg.max_model_len, "permission": []}

    # -------------------------------------------------------------------------------- completions

    def _tokenize(self, body: dict) -> None:
        """vLLM's /tokenize: the prompt's tokens as the engine counts them (chat template applied)."""
        if body.get("model") not in (None, *self.app.cfg.served_names):
            raise ApiError(404, f"The model `{body['model']}` does not exist.", "NotFoundError", "model")
        if "messages" in body:
            pieces = chat_prompt(body)
        elif isinstance(body.get("prompt"), str):
            pieces = tokens.tokenize(body["prompt"])
        else:
            raise ApiError(400, "give 'prompt' (a string) or 'messages'", param="prompt")
        ids = [int.from_bytes(hashlib.blake2b(t.encode(), digest_size=3).digest(), "big") for t in pieces]
        self._json(200, {"count": len(ids), "max_model_len": self.app.cfg.max_model_len, "tokens": ids,
                         "token_strs": None})

    def _completion(self, body: dict, chat: bool) -> None:
        app, cfg = self.app, self.app.cfg
        model = body.get("model") or cfg.served_names[0]
        if model not in cfg.served_names:
            raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        if body.get("n", 1) not in (1, None):
            raise ApiError(400, "the sim engine returns one choice per request (n must be 1)", param="n")
        if chat:
            prompt_tokens = chat_prompt(body)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
                prompt = prompt[0]
            if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                prompt_tokens, prompt = [str(t) for t in prompt], ""
            elif isinstance(prompt, str):
                prompt_tokens = tokens.tokenize(prompt)
            else:
                raise ApiError(400, "prompt must be a string or a list of token ids (one prompt per request)",
                               param="prompt")
        n_prompt = len(prompt_tokens)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise ApiError(400, "max_tokens must be a positive integer", param="max_tokens")
        if n_prompt > cfg.max_model_len or (max_tokens and n_prompt + max_tokens > cfg.max_model_len):
            raise ApiError(400, f"This model's maximum context length is {cfg.max_model_len} tokens. However, you "
                           f"requested {n_prompt + (max_tokens or 0)} tokens ({n_prompt} in the messages, "
                           f"{max_tokens or 0} in the completion). Please reduce the length of the messages or "
                           "completion.", param="messages" if chat else "prompt")
        limit = max_tokens or (cfg.max_model_len - n_prompt)
        answer = answers.chat(body, app.opts, limit) if chat else answers.completion(body, prompt, app.opts, limit)
        seed = answers.digest({k: v for k, v in body.items() if k not in ("stream", "stream_options", "model")})
        pieces, api_finish = build_pieces(answer, limit, body, seed)
        job = Job(n_prompt, block_hashes(prompt_tokens), pieces, seed, max_tokens,
                  finish="length" if api_finish == "length" else "stop")
        outcome: dict[str, str] = {}
        assert app.engine is not None
        if app.hung.is_set():  # rank-hang: the request waits for a step that never comes
            app.released.wait()
            raise ApiError(503, "the engine is shutting down", "ServiceUnavailableError")
        leaked = False
        try:
            steps = app.engine.run(job, on_finish=lambda r: outcome.__setitem__("reason", r))
            if body.get("stream"):
                self._stream(body, chat, model, answer, steps, n_prompt, outcome, api_finish)
            else:
                emitted = [p for step in steps for p in step]
                finish = "length" if outcome.get("reason") == "length" else api_finish
                if outcome.get("reason") not in (None, "abort"):
                    app.leak()  # before the answer leaves: a client reading the leak after its answer sees it
                    leaked = True
                self._json(200, self._whole(chat, model, answer, emitted, n_prompt, finish))
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        except EngineDead:
            if app.state != "dead":  # the server is stopping (SIGTERM): the request is dropped, not answered
                self.close_connection = True
                return
            # v1/engine/async_llm.py:456 (0.13.0), as generate() meets EngineDeadError; the request id is vLLM's
            # chatcmpl-/cmpl- form
            app.log.info(app.proc, "async_llm.py:456", f"Request {'chatcmpl' if chat else 'cmpl'}-"
                         f"{uuid.uuid4().hex} failed (engine dead).")
            self._engine_dead()
            return
        if not leaked and outcome.get("reason") not in (None, "abort"):
            app.leak()

    def _whole(self, chat: bool, model: str, answer: Answer, emitted: list[Piece], n_prompt: int,
               finish: str) -> dict:
        usage = {"prompt_tokens": n_prompt, "total_tokens": n_prompt + len(emitted),
                 "completion_tokens": len(emitted), "prompt_tokens_details": None}
        content = "".join(p.text for p in emitted if p.kind == "content")
        if not chat:
            return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                    "model": model, "choices": [{"index": 0, "text": content, "logprobs": None,
                                                 "finish_reason": finish, "stop_reason": None}],
                    "usage": usage}
        reasoning = "".join(p.text for p in emitted if p.kind == "reasoning")
        calls = []
        for i, call in enumerate(answer.tool_calls):
            mine = [p for p in emitted if p.call == i]
            if mine:
                args = "".join(p.text for p in mine if p.kind == "tool_args")
                calls.append({"id": call.id, "type": "function", "function": {"name": call.name, "arguments": args}})
        message = {"role": "assistant", "content": content if (content or not calls) else None,
                   "reasoning_content": reasoning or None, "tool_calls": calls}
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": [{"index": 0, "message": message, "logprobs": None,
                                             "finish_reason": finish, "stop_reason": None}],
                "usage": usage}

    def _stream(self, body: dict, chat: bool, model: str, answer: Answer, steps: Any, n_prompt: int,
                outcome: dict[str, str], api_finish: str) -> None:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        if self.app.cfg.has("stream-usage-missing"):
            include_usage = False
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"

        def event(choices: list[dict], usage: dict | None = None) -> None:
            chunk: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model,
                                     "choices": choices}
            if usage is not None:
                chunk["usage"] = usage
            self._chunk(f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode())

        def choice(delta: dict | str, finish: str | None = None) -> dict:
            if chat:
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}

        self.responded = True
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("cache-control", "no-cache")
        self.send_header(SIM_HEADER, "1")
        self.end_headers()
        count = 0
        try:
            if chat:
                event([choice({"role": "assistant", "content": ""})])
            for step in steps:
                count += len(step)
                for delta in _deltas(step, answer, chat):
                    event([choice(delta)])
            finish = "length" if outcome.get("reason") == "length" else api_finish
            event([choice({} if chat else "", finish)])
            if include_usage:
                event([], {"prompt_tokens": n_prompt, "total_tokens": n_prompt + count, "completion_tokens": count})
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except (BrokenPipeError, ConnectionResetError):
            steps.close()  # the client left: abort the request and free its KV
            self.close_connection = True
        except EngineDead:
            # Headers are out: report in the stream, as vLLM does for errors after the first chunk.
            event_error = {"error": {"message": "EngineCore encountered an issue.", "type": "EngineDeadError",
                                     "code": 500}}
            self._chunk(f"data: {json.dumps(event_error)}\n\n".encode())
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        self._access(200)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _deltas(step: list[Piece], answer: Answer, chat: bool) -> list[Any]:
    """One engine step as stream deltas: runs of one kind merged; a tool call opens with id and name."""
    if not chat:
        return ["".join(p.text for p in step if p.kind == "content")]
    out: list[dict] = []
    for p in step:
        if p.kind == "tool_name":
            call = answer.tool_calls[p.call]
            out.append({"tool_calls": [{"index": p.call, "id": call.id, "type": "function",
                                        "function": {"name": call.name, "arguments": ""}}]})
            continue
        if p.kind == "tool_args":
            last = out[-1] if out else None
            calls = last.get("tool_calls") if last else None
            if calls and calls[0]["index"] == p.call and "id" not in calls[0]:
                calls[0]["function"]["arguments"] += p.text
            else:
                out.append({"tool_calls": [{"index": p.call, "function": {"arguments": p.text}}]})
            continue
        field = "reasoning_content" if p.kind == "reasoning" else "content"
        if out and set(out[-1]) == {field}:
            out[-1][field] += p.text
        else:
            out.append({field: p.text})
    return out


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    app: App

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One ERROR line instead of the stdlib's traceback (a 'Traceback' line reads as fatal to log scanners)."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            return  # a client that went away
        self.app.log.error(self.app.proc, "launcher.py:1", f"connection from {client_address[0]} failed: "
                           f"{type(exc).__name__}: {exc}")


def make_server(app: App, host: str, port: int) -> Server:
    """Bind the API port (raises OSError when it is taken); it listens from server_activate() on."""
    handler = type("SimHandler", (Handler,), {"app": app})
    server = Server((host, port), handler, bind_and_activate=False)
    server.app = app
    try:
        server.server_bind()  # bound, not listening: the caller's server_activate() starts listening
    except OSError:
        server.server_close()
        raise
    return server
