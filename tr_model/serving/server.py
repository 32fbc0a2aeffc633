"""``tr-autotune serve``: the reference runtime behind an OpenAI-compatible HTTP API.

The runtime (:mod:`tr_model.serving.runtime`: one subserver per model, delayed batching
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
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from tr_core.errors import SpecError
from tr_model.serving.runtime.core import MatrixRouter, Request, TokenRouterRuntime, new_event_loop

__all__ = ["RuntimeService", "ServeLimits", "build_app", "bind_socket", "serve", "MAX_BODY_BYTES",
           "require_http_stack"]

MAX_BODY_BYTES = 2 ** 20   # the default of ServeLimits.max_body_bytes


@dataclass(frozen=True)
class ServeLimits:
    """What one request may ask of the server (each a ``tr-autotune serve`` flag, reported in ``/health``).

    ``max_tokens``: output tokens per request (422 above); ``max_prompt_tokens`` (413 above);
    ``max_body_bytes`` (413 above); ``max_json_depth``: nesting of the body's arrays and objects (422 above);
    ``max_waiting``: requests waiting for admission beyond the in-flight limit (429 beyond; None: 4 x the
    in-flight limit); ``request_deadline_s``: a request's whole life from its arrival (504 past it, the
    runtime request cancelled); ``body_timeout_s``: time to receive the body (408 past it)."""

    max_tokens: int = 4096
    max_prompt_tokens: int = 8192
    max_body_bytes: int = MAX_BODY_BYTES
    max_json_depth: int = 32
    max_waiting: int | None = None
    request_deadline_s: float = 600.0
    body_timeout_s: float = 30.0

    def __post_init__(self):
        for name in ("max_tokens", "max_prompt_tokens", "max_body_bytes", "max_json_depth"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 2 ** 40:
                flag = "--max-tokens-limit" if name == "max_tokens" else f"--{name.replace('_', '-')}"
                raise SpecError(f"{flag} must be an integer in 1..2^40, got {v!r}")
        if self.max_waiting is not None and (isinstance(self.max_waiting, bool) or not isinstance(
                self.max_waiting, int) or not 0 <= self.max_waiting <= 2 ** 31):
            raise SpecError(f"--max-waiting must be an integer in 0..2^31, got {self.max_waiting!r}")
        for name in ("request_deadline_s", "body_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v <= 1e7):
                raise SpecError(f"--{name.replace('_', '-')} must be a number in (0, 1e7] seconds, got {v!r}")
SERVE_EXTRA = "pip install 'tokenrouter-model[serve]' (starlette and uvicorn)"


class RequestError(ValueError):
    """A request the server refuses: HTTP status and an OpenAI-style error body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.kind, self.code = status, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param,
                          "code": self.code or str(self.status)}}


class ClientGone(Exception):
    """The client disconnected before its answer (nothing can be sent to it)."""


class RuntimeService:
    """The runtime as a service: admission up to ``max_concurrency`` requests, one runtime request each.

    ``thresholds``: anything with ``lookup(active_requests)`` (a
    :class:`~tr_model.thresholds.WatchedThresholds`, a table, or
    :class:`~tr_model.serving.runtime.FixedThresholds` of ones for the eager baseline).
    Requests beyond ``max_concurrency`` wait for admission (they are not
    active: the thresholds row is looked up with the admitted count).  Each
    request routes with its own random stream seeded by ``(seed, request
    number)``.  ``max_total_tokens``: prompt + output limit of a request (the
    torch executor's cache length), None for none.
    """

    def __init__(self, spec: Any, thresholds: Any, executor: Any, *, max_concurrency: int, seed: int = 0,
                 model_name: str = "tokenrouter", executor_name: str = "emulated", vocab_size: int | None = None,
                 max_total_tokens: int | None = None, default_max_tokens: int = 256, thresholds_label: str = "",
                 limits: ServeLimits | None = None):
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise SpecError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
        self.limits = limits or ServeLimits()
        self.max_waiting = (4 * max_concurrency if self.limits.max_waiting is None else self.limits.max_waiting)
        self.draining = False          # shutting down: new requests get 503
        self.errors_by_status: Counter = Counter()
        self.disconnected = 0          # requests whose client went away before the answer (cancelled)
        self.deadline_exceeded = 0
        self.shutdown_cancelled = 0
        self.spec, self.thresholds, self.executor = spec, thresholds, executor
        self.max_concurrency = max_concurrency
        self.seed = int(seed)
        self.model_name = model_name
        self.executor_name = executor_name
        self.vocab_size = int(vocab_size or getattr(executor, "vocab_size", None) or 256)
        self.max_total_tokens = max_total_tokens
        self.default_max_tokens = int(default_max_tokens)
        if self.default_max_tokens > self.limits.max_tokens:
            raise SpecError(f"--default-max-tokens {self.default_max_tokens} is above --max-tokens-limit "
                            f"{self.limits.max_tokens}")
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
        if len(ids) > self.limits.max_prompt_tokens:
            raise RequestError(f"{param}: {len(ids)} prompt tokens, more than the server's limit of "
                               f"{self.limits.max_prompt_tokens} (--max-prompt-tokens)", status=413, param=param,
                               code="prompt_too_long")
        return ids or [0]

    def max_tokens(self, body: dict, prompt_len: int) -> int:
        name = "max_tokens" if "max_tokens" in body or "max_completion_tokens" not in body else \
            "max_completion_tokens"
        v = body.get(name)
        if v is None:
            v = self.default_max_tokens
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise RequestError(f"{name} must be an integer >= 1, got {_short_json(v)}", param=name)
        if v > self.limits.max_tokens:
            raise RequestError(f"{name} = {v} is above the server's limit of {self.limits.max_tokens} output "
                               f"tokens per request (--max-tokens-limit)", status=422, param=name,
                               code="max_tokens_too_large")
        if self.max_total_tokens is not None and prompt_len + v > self.max_total_tokens:
            raise RequestError(f"prompt ({prompt_len} tokens) + {name} ({v}) exceeds the server's context of "
                               f"{self.max_total_tokens} tokens", param=name)
        return v

    async def generate(self, prompt_ids: Sequence[int], max_tokens: int) -> dict:
        """Serve one request through the runtime; returns token counts, ids and the per-model split."""
        if self.failure is not None:
            raise RequestError(f"the runtime stopped: {self.failure}", status=503, kind="server_error")
        assert self._sem is not None, "start() the service first"
        if self.draining:
            raise RequestError("the server is shutting down", status=503, kind="server_error", code="shutting_down")
        if self._sem.locked() and self.waiting_admission >= self.max_waiting:
            raise RequestError(f"{self.waiting_admission} requests already wait for admission (the server's limit, "
                               f"--max-waiting {self.max_waiting}); retry later", status=429,
                               kind="rate_limit_error", code="too_many_waiting")
        self.waiting_admission += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting_admission -= 1
        handed_off = False
        try:
            if self.draining:
                raise RequestError("the server is shutting down", status=503, kind="server_error",
                                   code="shutting_down")
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
            except asyncio.CancelledError:
                # the client is gone (or its deadline passed): the runtime drops the request at its next step;
                # its admission slot is held until then, so the runtime never holds more than max_concurrency
                if req.state != "finished":
                    req.future = asyncio.get_running_loop().create_future()
                    self.rt.cancel(req)
                    if req.state != "finished" or not req.future.done():
                        handed_off = True
                        req.future.add_done_callback(lambda f, r=req: self._release(r))
                raise
            except RuntimeError as e:
                raise RequestError(str(e), status=503, kind="server_error") from None
            finally:
                if not handed_off:
                    self._tick()
                    self.in_flight.discard(req)
        except BaseException:
            if not handed_off:
                self._sem.release()
            raise
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

    def _release(self, req) -> None:
        """A cancelled request has left the runtime: its admission slot is free."""
        self._tick()
        self.in_flight.discard(req)
        self._sem.release()

    def cancel_all(self, message: str = "the server is shutting down") -> int:
        """Fail every request in the runtime with a 503 now (shutdown); their slots are freed at their next step.
        Returns how many were cancelled."""
        self.draining = True
        n = 0
        for r in list(self.in_flight):
            if r.future is not None and not r.future.done():
                r.future.set_exception(RequestError(message, status=503, kind="server_error", code="shutting_down"))
            self.rt.cancel(r)
            n += 1
        self.shutdown_cancelled += n
        return n

    def count_error(self, status: int) -> None:
        self.errors_by_status[int(status)] += 1

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
               "admission_free": (self._sem._value if self._sem is not None else self.max_concurrency),
               "limits": {**asdict(self.limits), "max_waiting": self.max_waiting,
                          "max_concurrency": self.max_concurrency},
               "cancelled_requests": self.rt.cancelled_total, "disconnected_requests": self.disconnected,
               "deadline_exceeded_requests": self.deadline_exceeded,
               "shutdown_cancelled_requests": self.shutdown_cancelled, "draining": self.draining,
               "errors_by_status": {str(k): v for k, v in sorted(self.errors_by_status.items())},
               "thresholds_reloads": getattr(self.thresholds, "reloads", None),
               "thresholds_refused_reloads": getattr(self.thresholds, "refused_reloads", None),
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


def _short_json(v: Any) -> str:
    try:
        return json.dumps(v)[:40]
    except (ValueError, TypeError, RecursionError, OverflowError):
        return f"<{type(v).__name__}>"


def _depth(doc: Any, limit: int) -> bool:
    """Whether ``doc``'s arrays and objects nest deeper than ``limit`` (iterative: no recursion)."""
    stack = [(doc, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (dict, list)):
            if d > limit:
                return True
            stack.extend((v, d + 1) for v in (x.values() if isinstance(x, dict) else x))
    return False


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
    """The Starlette application serving ``service`` (imports starlette).

    Every answer is JSON, errors OpenAI-style (``{"error": {"message", "type", "param", "code"}}``), and every
    error is one line on stderr (:func:`log_line`): bad requests, limits, a client gone mid-body or
    mid-request (its runtime request cancelled, its slot freed), a deadline, shutdown, and anything
    unexpected (500, no traceback)."""
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    lim = service.limits

    def error(e: RequestError, request=None) -> JSONResponse:
        service.count_error(e.status)
        where = f"{request.method} {request.url.path}" if request is not None else "request"
        log_line(f"serve: {e.status} {where}: {_one_line(str(e))}")
        return JSONResponse(e.body(), status_code=e.status)

    async def read_body(request) -> bytes:
        size = request.headers.get("content-length")
        if size is not None and size.strip().isdigit() and int(size) > lim.max_body_bytes:
            raise RequestError(f"request body of {int(size)} bytes, over the server's limit of {lim.max_body_bytes} "
                               f"(--max-body-bytes)", status=413, code="body_too_large")
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > lim.max_body_bytes:
                raise RequestError(f"request body over the server's limit of {lim.max_body_bytes} bytes "
                                   f"(--max-body-bytes)", status=413, code="body_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    async def read_json(request) -> dict:
        try:
            data = await asyncio.wait_for(read_body(request), lim.body_timeout_s)
        except asyncio.TimeoutError:
            raise RequestError(f"the request body did not arrive within {lim.body_timeout_s:g} s "
                               f"(--body-timeout-s)", status=408, code="body_timeout") from None
        except ClientDisconnect:
            raise ClientGone("the client disconnected while sending its body") from None
        try:
            body = json.loads(data)
        except RecursionError:
            raise RequestError(f"the request body nests deeper than the server's limit of {lim.max_json_depth} "
                               f"(--max-json-depth)", status=422, code="too_deep") from None
        except (ValueError, UnicodeDecodeError):
            raise RequestError("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        if _depth(body, lim.max_json_depth):
            raise RequestError(f"the request body nests deeper than the server's limit of {lim.max_json_depth} "
                               f"(--max-json-depth)", status=422, code="too_deep")
        return body

    async def wait_disconnect(request) -> None:
        while True:
            msg = await request.receive()
            if msg.get("type") == "http.disconnect":
                return

    async def run(request, ids: list, T: int, t_arrival: float) -> dict:
        """generate(), cancelled when the client disconnects or the deadline passes."""
        loop = asyncio.get_running_loop()
        gen = asyncio.ensure_future(service.generate(ids, T))
        watch = asyncio.ensure_future(wait_disconnect(request))
        try:
            left = max(0.0, t_arrival + lim.request_deadline_s - loop.time())
            done, _ = await asyncio.wait({gen, watch}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            if gen in done:
                return gen.result()
            if watch in done:
                service.disconnected += 1
                raise ClientGone("the client disconnected before its answer; its request is cancelled")
            service.deadline_exceeded += 1
            raise RequestError(f"the request ran past the server's deadline of {lim.request_deadline_s:g} s "
                               f"(--request-deadline-s); it is cancelled", status=504, kind="timeout_error",
                               code="deadline_exceeded")
        finally:
            for t in (gen, watch):
                if not t.done():
                    t.cancel()
            await asyncio.gather(gen, watch, return_exceptions=True)

    def guarded(handler):
        async def endpoint(request):
            t0 = asyncio.get_running_loop().time()
            try:
                return await handler(request, t0)
            except RequestError as e:
                return error(e, request)
            except ClientGone as e:
                service.count_error(499)
                log_line(f"serve: 499 {request.method} {request.url.path}: {e}")
                return JSONResponse(RequestError(str(e), status=499, code="client_gone").body(), status_code=499)
            except asyncio.CancelledError:   # uvicorn ends the request (shutdown past its grace): answer 503
                return error(RequestError("the server is shutting down", status=503, kind="server_error",
                                          code="shutting_down"), request)
            except RecursionError:
                return error(RequestError("the request nests too deeply", status=422, code="too_deep"), request)
            except Exception as e:  # noqa: BLE001 - one line and a JSON 500, never a traceback
                return error(RequestError(f"internal error: {type(e).__name__}: {e}", status=500,
                                          kind="server_error"), request)
        return endpoint

    def text_of(ids: list[int]) -> str:
        return " ".join(map(str, ids))

    def usage(prompt_len: int, out: dict) -> dict:
        return {"prompt_tokens": prompt_len, "completion_tokens": out["completion_tokens"],
                "total_tokens": prompt_len + out["completion_tokens"]}

    def model_of(body: dict) -> str:
        m = body.get("model")
        return m if isinstance(m, str) and m and len(m) <= 256 else service.model_name

    async def completions(request, t0):
        body = await read_json(request)
        _common_checks(body)
        if "prompt" not in body:
            raise RequestError("prompt is required", param="prompt")
        ids = service.prompt_ids(body["prompt"])
        T = service.max_tokens(body, len(ids))
        out = await run(request, ids, T, t0)
        return JSONResponse({
            "id": f"cmpl-{uuid.uuid4().hex[:16]}", "object": "text_completion", "created": int(time.time()),
            "model": model_of(body),
            "choices": [{"index": 0, "text": text_of(out["output_ids"]), "logprobs": None, "finish_reason": "length"}],
            "usage": usage(len(ids), out), "llm_ratio": out["llm_ratio"], "tokens_by_model": out["tokens_by_model"]})

    async def chat(request, t0):
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
        out = await run(request, ids, T, t0)
        return JSONResponse({
            "id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
            "model": model_of(body),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text_of(out["output_ids"])},
                         "finish_reason": "length"}],
            "usage": usage(len(ids), out), "llm_ratio": out["llm_ratio"], "tokens_by_model": out["tokens_by_model"]})

    async def health(request, t0):
        doc = service.health()
        return JSONResponse(doc, status_code=200 if service.failure is None else 503)

    async def models(request, t0):
        return JSONResponse({"object": "list", "data": [{"id": service.model_name, "object": "model",
                                                         "created": int(service.started_at),
                                                         "owned_by": "tokenrouter-model"}]})

    async def not_found(request, exc):
        status = getattr(exc, "status_code", 404)
        return error(RequestError(f"{request.method} {request.url.path}: not found" if status == 404 else
                                  f"{request.method} {request.url.path}: {getattr(exc, 'detail', '')}",
                                  status=status), request)

    async def internal(request, exc):
        return error(RequestError(f"internal error: {type(exc).__name__}: {exc}", status=500, kind="server_error"),
                     request)

    routes = [Route("/v1/completions", guarded(completions), methods=["POST"]),
              Route("/v1/chat/completions", guarded(chat), methods=["POST"]),
              Route("/health", guarded(health), methods=["GET"]),
              Route("/v1/models", guarded(models), methods=["GET"])]
    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found, Exception: internal})

    async def outer(scope, receive, send):
        """The last guard: whatever escapes is one line (Starlette's error middleware has already answered)."""
        try:
            await app(scope, receive, send)
        except asyncio.CancelledError:
            log_line(f"serve: request {scope.get('path', '')} ended by the shutdown")
        except Exception as e:  # noqa: BLE001
            log_line(f"serve: 500 {scope.get('path', '')}: {type(e).__name__}: {_one_line(str(e))}")

    return outer


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:300]


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
    and uvicorn in one ``select()`` event loop (:func:`tr_model.serving.runtime.new_event_loop`,
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
                            timeout_graceful_shutdown=max(0, int(math.ceil(shutdown_timeout_s))) + 5)
    server = uvicorn.Server(config)
    caught: list[int] = []

    def on_signal(sig, frame):  # before uvicorn takes over, and again when it re-raises what it caught
        caught.append(sig)
        server.should_exit = True

    async def drain() -> None:
        """On a signal: refuse new requests (503), let those in the runtime finish for up to the shutdown
        timeout, then fail the rest with a JSON 503 (uvicorn's own grace period is 5 s longer, so it never has
        to cancel a request itself)."""
        loop = asyncio.get_running_loop()
        while not server.should_exit:
            await asyncio.sleep(0.02)
        service.draining = True
        end = loop.time() + shutdown_timeout_s
        while (service.in_flight or service.waiting_admission) and loop.time() < end:
            await asyncio.sleep(0.02)
        n = service.cancel_all()
        if n:
            log_line(f"serve: shutdown: {n} request(s) still running after {shutdown_timeout_s:g} s answered 503")

    async def main() -> None:
        service.start()
        drainer = asyncio.ensure_future(drain())
        try:
            serving = asyncio.ensure_future(server.serve(sockets=[sock]))
            while not server.started and not serving.done():
                await asyncio.sleep(0.01)
            if server.started and announce is not None:
                announce(url)
            await serving
        finally:
            drainer.cancel()
            await asyncio.gather(drainer, return_exceptions=True)
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
