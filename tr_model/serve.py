"""``tr-autotune serve``: the reference runtime behind an OpenAI-compatible HTTP API.

The runtime (:mod:`tr_model.runtime`: one subserver per model, delayed batching
with the thresholds row of the live number of active requests) runs in the
same event loop as the HTTP server, so every in-flight HTTP request is one
active request of the runtime: with N closed-loop clients the runtime sees N
active requests and applies ``B*(N)``.

Endpoints::

    POST /v1/completions        {"prompt": str | [str] | [int], "max_tokens": T, ...}
    POST /v1/chat/completions   {"messages": [{"role": ..., "content": ...}], "max_tokens": T, ...}
    GET  /health                status, in-flight count, current thresholds, timer overshoot of the emulator
    GET  /v1/models             the one model name

Responses carry ``usage.completion_tokens`` (tokens committed for the request,
at most ``max_tokens``) and ``llm_ratio``, the fraction of those tokens
committed by steps of the last (largest) model, like R2R's server.  Unknown
request fields (``temperature``, ``ignore_eos``, ``stop`` ...) are accepted and
ignored; ``stream: true`` and ``n > 1`` are refused with HTTP 400.  Prompts are
turned into token ids byte by byte (UTF-8, modulo the vocabulary): there is no
tokenizer, the emulated executor only needs a length and the torch executor
any valid ids.

The HTTP layer is Starlette on uvicorn, imported only when a server is built
(``pip install tokenrouter-model[serve]``); :class:`RuntimeService` (admission,
requests, health) does not need them.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import math
import random
import signal
import socket
import sys
import time
import uuid
from typing import Any, Sequence

from tr_core.errors import SpecError
from tr_model.runtime.core import MatrixRouter, Request, TokenRouterRuntime, new_event_loop

__all__ = ["RuntimeService", "build_app", "bind_socket", "serve", "MAX_BODY_BYTES", "require_http_stack"]

MAX_BODY_BYTES = 4 * 2 ** 20
SERVE_EXTRA = "pip install 'tokenrouter-model[serve]' (starlette and uvicorn)"


class RequestError(ValueError):
    """A request the server refuses: HTTP status and an OpenAI-style error body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.status}}


class RuntimeService:
    """The runtime as a service: admission up to ``max_concurrency`` requests, one runtime request each.

    ``thresholds``: anything with ``lookup(active_requests)`` (a
    :class:`~tr_model.thresholds.WatchedThresholds`, a table, or
    :class:`~tr_model.runtime.FixedThresholds` of ones for the eager baseline).
    Requests beyond ``max_concurrency`` wait for admission (they are not
    active: the thresholds row is looked up with the admitted count).  Each
    request routes with its own random stream seeded by ``(seed, request
    number)``.  ``max_total_tokens``: prompt + output limit of a request (the
    torch executor's cache length), None for none.
    """

    def __init__(self, spec: Any, thresholds: Any, executor: Any, *, max_concurrency: int, seed: int = 0,
                 model_name: str = "tokenrouter", executor_name: str = "emulated", vocab_size: int | None = None,
                 max_total_tokens: int | None = None, default_max_tokens: int = 256, thresholds_label: str = ""):
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise SpecError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
        self.spec, self.thresholds, self.executor = spec, thresholds, executor
        self.max_concurrency = max_concurrency
        self.seed = int(seed)
        self.model_name = model_name
        self.executor_name = executor_name
        self.vocab_size = int(vocab_size or getattr(executor, "vocab_size", None) or 256)
        self.max_total_tokens = max_total_tokens
        self.default_max_tokens = int(default_max_tokens)
        self.thresholds_label = thresholds_label
        self.rt = TokenRouterRuntime(spec.M, thresholds, executor,
                                     MatrixRouter(spec.routing_matrix, spec.committed_tokens), spec.max_batch_size)
        self._ids = itertools.count()
        self._sem: asyncio.Semaphore | None = None
        self.in_flight: set[Request] = set()
        self.waiting_admission = 0
        self.completed = 0
        self.tokens_total = 0.0
        self.failure: str | None = None
        self.started_at = time.time()
        self.in_flight_s = 0.0      # integral of the in-flight count over loop time (request-seconds)
        self._tick_t: float | None = None

    def _tick(self) -> None:
        now = asyncio.get_running_loop().time()
        if self._tick_t is not None:
            self.in_flight_s += len(self.in_flight) * (now - self._tick_t)
        self._tick_t = now

    # ---- life cycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the subservers' loops in the running event loop."""
        self._sem = asyncio.Semaphore(self.max_concurrency)
        self.rt.start()
        for t in self.rt.tasks:
            t.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        if task.cancelled() or self.failure is not None:
            return
        exc = task.exception()
        self.failure = (f"{type(exc).__name__}: {exc}" if exc is not None else "a runtime loop ended")
        err = RuntimeError(f"the runtime stopped: {self.failure}")
        for r in list(self.in_flight):  # nothing will finish them now: fail them instead of hanging
            if r.future is not None and not r.future.done():
                r.future.set_exception(err)

    async def stop(self) -> None:
        """Cancel the runtime's loops and release the executor."""
        for t in self.rt.tasks:
            t.cancel()
        await asyncio.gather(*self.rt.tasks, return_exceptions=True)
        close = getattr(self.executor, "close", None)
        if close is not None:
            await asyncio.get_running_loop().run_in_executor(None, close)

    # ---- requests -------------------------------------------------------------------------------------------
    def prompt_ids(self, prompt: Any, param: str = "prompt") -> list[int]:
        """Token ids of a prompt: a string (UTF-8 bytes modulo the vocabulary) or a list of ids."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = [b % self.vocab_size for b in prompt.encode("utf-8")]
        elif isinstance(prompt, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            bad = [x for x in prompt if not 0 <= x < self.vocab_size]
            if bad:
                raise RequestError(f"{param}: token id {bad[0]} is outside the vocabulary 0..{self.vocab_size - 1}",
                                   param=param)
            ids = list(prompt)
        elif isinstance(prompt, list):
            raise RequestError(f"{param}: one prompt per request (a string or a list of token ids); batched "
                               "prompts are not supported", param=param)
        else:
            raise RequestError(f"{param} must be a string or a list of token ids", param=param)
        return ids or [0]

    def max_tokens(self, body: dict, prompt_len: int) -> int:
        name = "max_tokens" if "max_tokens" in body or "max_completion_tokens" not in body else \
            "max_completion_tokens"
        v = body.get(name)
        if v is None:
            v = self.default_max_tokens
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise RequestError(f"{name} must be an integer >= 1, got {json.dumps(v)[:40]}", param=name)
        if self.max_total_tokens is not None and prompt_len + v > self.max_total_tokens:
            raise RequestError(f"prompt ({prompt_len} tokens) + {name} ({v}) exceeds the server's context of "
                               f"{self.max_total_tokens} tokens", param=name)
        return v

    async def generate(self, prompt_ids: Sequence[int], max_tokens: int) -> dict:
        """Serve one request through the runtime; returns token counts, ids and the per-model split."""
        if self.failure is not None:
            raise RequestError(f"the runtime stopped: {self.failure}", status=503, kind="server_error")
        assert self._sem is not None, "start() the service first"
        self.waiting_admission += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting_admission -= 1
        try:
            rid = next(self._ids)
            req = Request(rid=rid, client=0, max_output_tokens=int(max_tokens),
                          rng=random.Random(f"{self.seed}:{rid}"), token_ids=list(prompt_ids),
                          prompt_len=len(prompt_ids))
            self._tick()
            self.in_flight.add(req)
            try:
                if self.failure is not None:
                    raise RequestError(f"the runtime stopped: {self.failure}", status=503, kind="server_error")
                await self.rt.submit(req)
            except RuntimeError as e:
                raise RequestError(str(e), status=503, kind="server_error") from None
            finally:
                self._tick()
                self.in_flight.discard(req)
        finally:
            self._sem.release()
        committed = req.committed
        last = self.spec.M - 1
        llm = req.committed_by_model.get(last, 0.0) if self.spec.M > 1 else 0.0
        self.completed += 1
        self.tokens_total += committed
        return {"completion_tokens": min(int(max_tokens), int(round(committed))),
                "llm_ratio": (llm / committed) if committed > 0 else 0.0,
                "tokens_by_model": [req.committed_by_model.get(i, 0.0) for i in range(self.spec.M)],
                "output_ids": list(req.token_ids[req.prompt_len:])}

    def _timer_by_model(self) -> list | None:
        over = getattr(self.executor, "overshoot_s_by_model", None)
        steps = getattr(self.executor, "steps_by_model", None)
        if over is None or steps is None:
            return None
        return [{"steps": int(steps.get(i, 0)), "overshoot_s": float(over.get(i, 0.0))} for i in range(self.spec.M)]

    def health(self) -> dict:
        """What ``GET /health`` answers; ``in_flight_request_s`` / ``clock_s`` differences over a window give the
        time-averaged number of requests inside the runtime, and ``committed_tokens`` / ``clock_s`` differences
        the tokens committed by the runtime's steps per loop second, counted when each step commits them
        (serve-bench reports both)."""
        active = len(self.in_flight)
        try:
            self._tick()
            clock = asyncio.get_running_loop().time()
        except RuntimeError:  # no running loop (called from outside the server)
            clock = None
        try:
            current = list(self.thresholds.lookup(active))
        except Exception:  # noqa: BLE001 - health must answer
            current = None
        policy = None
        try:
            if getattr(self.thresholds, "policy_class", None) is not None:  # a schema-version-3 file: its rule
                policy = {"class": self.thresholds.policy_class, "columns": list(self.thresholds.policy_columns),
                          "current": [list(x) for x in self.thresholds.policy_of(active)]}
        except Exception:  # noqa: BLE001 - health must answer
            policy = None
        doc = {"status": "ok" if self.failure is None else "error", "model": self.model_name,
               "executor": self.executor_name, "num_models": self.spec.M,
               "time_scale": float(getattr(self.executor, "time_scale", 1.0)),
               "in_flight": active, "waiting_admission": self.waiting_admission,
               "max_concurrency": self.max_concurrency, "completed_requests": self.completed,
               "completed_tokens": self.tokens_total, "uptime_s": time.time() - self.started_at,
               "in_flight_request_s": self.in_flight_s, "clock_s": clock,
               "committed_tokens": self.rt.committed_total,
               "thresholds": {"source": self.thresholds_label, "current": current,
                              "last_error": getattr(self.thresholds, "last_error", None), "policy": policy},
               "relative_timer_noise": getattr(self.executor, "relative_timer_noise", None),
               "timer_overshoot_s": getattr(self.executor, "overshoot_s_total", None),
               "timer_nominal_s": getattr(self.executor, "nominal_s_total", None),
               "timer_by_model": self._timer_by_model()}
        if self.failure is not None:
            doc["error"] = self.failure
        return doc


# ------------------------------------------------------------------------------------------------ HTTP layer


def require_http_stack() -> None:
    """Raise SpecError unless starlette and uvicorn can be imported."""
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise SpecError(f"tr-autotune serve needs the HTTP stack ({e.name} is missing): {SERVE_EXTRA}") from None


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("text", ""), str):
                raise RequestError(f"{where}[{k}] must be an object with a string 'text'", param=where)
            parts.append(part.get("text", ""))
        return "".join(parts)
    raise RequestError(f"{where} must be a string or a list of text parts", param=where)


def _common_checks(body: dict) -> None:
    if body.get("stream"):
        raise RequestError("stream: streaming responses are not supported; send stream: false", param="stream")
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise RequestError("n: only one choice per request is supported", param="n")


def build_app(service: RuntimeService):
    """The Starlette application serving ``service`` (imports starlette)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    def error(e: RequestError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    async def read_json(request) -> dict:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > MAX_BODY_BYTES:
            raise RequestError(f"request body over {MAX_BODY_BYTES} bytes", status=413)
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > MAX_BODY_BYTES:
                raise RequestError(f"request body over {MAX_BODY_BYTES} bytes", status=413)
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks))
        except (ValueError, UnicodeDecodeError):
            raise RequestError("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        return body

    def text_of(ids: list[int]) -> str:
        return " ".join(map(str, ids))

    def usage(prompt_len: int, out: dict) -> dict:
        return {"prompt_tokens": prompt_len, "completion_tokens": out["completion_tokens"],
                "total_tokens": prompt_len + out["completion_tokens"]}

    async def completions(request):
        try:
            body = await read_json(request)
            _common_checks(body)
            if "prompt" not in body:
                raise RequestError("prompt is required", param="prompt")
            ids = service.prompt_ids(body["prompt"])
            T = service.max_tokens(body, len(ids))
            out = await service.generate(ids, T)
        except RequestError as e:
            return error(e)
        return JSONResponse({
            "id": f"cmpl-{uuid.uuid4().hex[:16]}", "object": "text_completion", "created": int(time.time()),
            "model": body.get("model") or service.model_name,
            "choices": [{"index": 0, "text": text_of(out["output_ids"]), "logprobs": None, "finish_reason": "length"}],
            "usage": usage(len(ids), out), "llm_ratio": out["llm_ratio"], "tokens_by_model": out["tokens_by_model"]})

    async def chat(request):
        try:
            body = await read_json(request)
            _common_checks(body)
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                raise RequestError("messages must be a non-empty list of {role, content} objects", param="messages")
            lines = []
            for k, m in enumerate(msgs):
                if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                    raise RequestError(f"messages[{k}] must be an object with a string role", param="messages")
                lines.append(f"{m['role']}: {_text_of(m.get('content'), f'messages[{k}].content')}\n")
            ids = service.prompt_ids("".join(lines) + "assistant: ", param="messages")
            T = service.max_tokens(body, len(ids))
            out = await service.generate(ids, T)
        except RequestError as e:
            return error(e)
        return JSONResponse({
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model") or service.model_name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text_of(out["output_ids"])},
                         "finish_reason": "length"}],
            "usage": usage(len(ids), out), "llm_ratio": out["llm_ratio"], "tokens_by_model": out["tokens_by_model"]})

    async def health(request):
        doc = service.health()
        return JSONResponse(doc, status_code=200 if service.failure is None else 503)

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": service.model_name, "object": "model",
                                                         "created": int(service.started_at),
                                                         "owned_by": "tokenrouter-model"}]})

    async def not_found(request, exc):
        status = getattr(exc, "status_code", 404)
        return JSONResponse(RequestError(f"{request.method} {request.url.path}: not found" if status == 404 else
                                         f"{request.method} {request.url.path}: {getattr(exc, 'detail', '')}",
                                         status=status).body(), status_code=status)

    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/health", health, methods=["GET"]),
              Route("/v1/models", models, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})


def bind_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket for ``host:port`` (port 0: a free port); SpecError (exit 2) when it cannot be had."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise SpecError(f"--port must be an integer in 0..65535, got {port!r}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise SpecError(f"--host {host!r}: cannot resolve it ({e})") from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT leftover, never a live listener
        sock.bind(addr)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise SpecError(f"--port {port}: the address {host}:{port} is already in use") from None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise SpecError(f"--port {port}: permission denied (ports below 1024 need privileges)") from None
        raise SpecError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.setblocking(False)
    return sock


def serve(service: RuntimeService, host: str = "127.0.0.1", port: int = 8000, *, shutdown_timeout_s: float = 10.0,
          access_log: bool = False, announce=None) -> str | None:
    """Serve until SIGTERM or Ctrl-C; returns the name of the signal that stopped it (None otherwise).

    Binds first (a port in use is a :class:`SpecError`), then runs the runtime
    and uvicorn in one ``select()`` event loop (:func:`tr_model.runtime.new_event_loop`,
    whose timers are precise to well under a millisecond).  On a signal the
    server stops accepting connections, lets in-flight requests finish for up
    to ``shutdown_timeout_s`` seconds, stops the runtime and returns.
    ``announce(url)`` is called once the socket listens.
    """
    require_http_stack()
    import uvicorn

    sock = bind_socket(host, port)
    bound = sock.getsockname()
    url_host = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    url = f"http://{url_host}:{bound[1]}"
    config = uvicorn.Config(build_app(service), lifespan="off", log_level="warning", access_log=access_log,
                            timeout_graceful_shutdown=max(0, int(math.ceil(shutdown_timeout_s))))
    server = uvicorn.Server(config)
    caught: list[int] = []

    def on_signal(sig, frame):  # before uvicorn takes over, and again when it re-raises what it caught
        caught.append(sig)
        server.should_exit = True

    async def main() -> None:
        service.start()
        try:
            serving = asyncio.ensure_future(server.serve(sockets=[sock]))
            while not server.started and not serving.done():
                await asyncio.sleep(0.01)
            if server.started and announce is not None:
                announce(url)
            await serving
        finally:
            await service.stop()

    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for s in old:
            signal.signal(s, on_signal)
        loop = new_event_loop("wall")
        try:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(main())
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        sock.close()
    return signal.Signals(caught[0]).name if caught else None


def log_line(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
