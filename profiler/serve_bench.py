"""Closed-loop benchmark of a live OpenAI-compatible server (``tr-profile serve-bench``).

N clients, each with its own keep-alive connection, send a request, wait for
the answer and send the next at once (the paper's closed loop), so exactly N
requests are in flight.  Per N: a warm-up, a measured window of
``duration_s`` wall seconds, then the tail: clients keep the load at N until
every request that was in flight at the window's end has finished, then stop
and the server drains (so the next N starts on an idle server).

What is measured (wall seconds, multiplied by ``time_scale`` to give the
server's model time when it runs time-scaled):

* **throughput**: each request's ``usage.completion_tokens`` are spread
  evenly over its lifetime (send to answer) and integrated over the window;
  95 % interval by batch means over slices of the window, each slice at least
  two mean request lifetimes long (adjacent slices share requests, so shorter
  slices would understate the variance), never fewer than two slices, and no
  interval (nan) for a window shorter than two lifetimes;
* **per-request speed**: mean of tokens / lifetime over the requests sent and
  answered inside the window, with a Student-t 95 % interval;
* ``llm_ratio``: token-weighted mean of the server's ``llm_ratio`` (R2R's
  field; ``llm_percentage`` / 100 also read) when the server reports it;
* ``server_mean_in_flight``: against ``tr-autotune serve`` (whose ``/health``
  reports the integral of its in-flight count), the time-averaged number of
  requests inside the runtime over the window: N minus what the HTTP hand-offs
  between one request and the next cost;
* ``server_throughput_tok_s``: against ``tr-autotune serve`` (whose ``/health``
  reports ``committed_tokens``, every token its steps have committed, and its
  loop clock), the same throughput counted where the tokens are committed:
  ``/health`` is read at ``slices + 1`` evenly spaced instants of the window
  (on the client's clock), and the rate is the committed tokens between the
  first and last reading over the server-clock time between them; its 95 %
  interval is the ratio estimator's over the ``slices`` slices between
  readings.  A committed token is counted at the instant of its step, not
  spread over its request's lifetime, so slices need not span request
  lifetimes and short windows still get ``slices`` of them.

Failures: a connection error, a timeout, HTTP 408/429/5xx or a malformed
body is retried (up to ``max_retries`` times per request, counted and
reported); any other HTTP 4xx, or a request that still fails after its
retries, stops the benchmark with :class:`BenchError`.  Every network wait
has a timeout: ``connect_timeout_s`` for connecting, ``request_timeout_s``
for a whole request (a watchdog closes the socket of a request that runs
over, whatever the server sends meanwhile).

Standard library only (``http.client`` in one thread per client); imports
nothing of the face (``tr_model``).
"""

from __future__ import annotations

import http.client
import json
import math
import os
import random
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from tr_core.errors import SpecError, TRError

__all__ = ["BenchError", "LimitError", "Target", "PhaseResult", "parse_target", "load_predicted", "probe",
           "run_phase", "MAX_CLIENTS", "student_t95"]

MAX_CLIENTS = 1024
MAX_RESPONSE_BYTES = 64 * 2 ** 20
WORDS = ("time", "model", "token", "route", "batch", "large", "small", "queue", "system", "request", "serve",
         "graph", "cache", "delay", "state", "chain")


class BenchError(SpecError):
    """The benchmark cannot go on (unreachable server, refused request, malformed answers): exit 2."""


class LimitError(TRError):
    """A resource limit would be exceeded (too many clients): exit 3."""

    exit_code = 3


class _Retryable(Exception):
    """A failed attempt that may succeed when repeated."""


def student_t95(dof: int) -> float:
    """Two-sided 95 % Student-t quantile."""
    if dof < 1:
        return math.nan
    from scipy.stats import t
    return float(t.ppf(0.975, dof))


# ---------------------------------------------------------------------------------------------------- target


@dataclass(frozen=True)
class Target:
    """Where and what to send."""

    scheme: str
    host: str
    port: int
    base_path: str
    endpoint: str  # "chat" or "completions"
    model: str
    max_tokens: int
    ignore_eos: bool = True
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 300.0

    @property
    def url(self) -> str:
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{h}:{self.port}{self.base_path}"

    @property
    def path(self) -> str:
        return self.base_path + ("/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions")

    def body(self, prompt: str) -> bytes:
        doc: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "stream": False}
        if self.endpoint == "chat":
            doc["messages"] = [{"role": "user", "content": prompt}]
        else:
            doc["prompt"] = prompt
        if self.ignore_eos:
            doc["ignore_eos"] = True  # vLLM / SGLang: generate exactly max_tokens
        return json.dumps(doc).encode()


def parse_target(url: str) -> tuple[str, str, int, str]:
    """``http://host:port[/prefix]`` -> (scheme, host, port, base path without a trailing ``/v1``)."""
    try:
        u = urllib.parse.urlsplit(url)
        port = u.port
    except ValueError as e:
        raise BenchError(f"--url {url!r}: {e}") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise BenchError(f"--url {url!r}: give an http:// or https:// address with a host, e.g. "
                         "http://127.0.0.1:8000")
    if u.query or u.fragment:
        raise BenchError(f"--url {url!r}: no query or fragment, just the server's address")
    base = u.path.rstrip("/")
    if base.endswith("/v1"):
        base = base[:-3]
    return u.scheme, u.hostname, port or (443 if u.scheme == "https" else 80), base


class _Conn:
    """One keep-alive connection with a connect timeout, a per-read timeout and an abort from another thread."""

    def __init__(self, t: Target):
        self.t = t
        self.conn: http.client.HTTPConnection | None = None
        self.lock = threading.Lock()

    def _open(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.t.scheme == "https" else http.client.HTTPConnection
        c = cls(self.t.host, self.t.port, timeout=self.t.connect_timeout_s)
        c.connect()
        c.sock.settimeout(self.t.request_timeout_s)
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return c

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        """One HTTP exchange; OSError / http.client errors propagate (the caller decides on retries)."""
        with self.lock:
            if self.conn is None:
                self.conn = self._open()
            c = self.conn
        try:
            headers = {"Content-Type": "application/json", "Accept": "application/json"}
            c.request(method, path, body=body, headers=headers)
            r = c.getresponse()
            data = r.read(MAX_RESPONSE_BYTES + 1)
            if len(data) > MAX_RESPONSE_BYTES:
                raise _Retryable(f"answer over {MAX_RESPONSE_BYTES} bytes")
            if r.will_close:
                self.close()
            return r.status, data
        except BaseException:
            self.close()
            raise

    def abort(self) -> None:
        """Unblock a request in progress (from another thread): its socket is shut down."""
        with self.lock:
            c = self.conn
        if c is not None and c.sock is not None:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        with self.lock:
            c, self.conn = self.conn, None
        if c is not None:
            try:
                c.close()
            except OSError:
                pass


def _describe(e: BaseException) -> str:
    if isinstance(e, socket.timeout):
        return "timed out"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror.lower()
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _answer(status: int, data: bytes, what: str) -> dict:
    """The JSON object of a 2xx answer; _Retryable for a server-side failure, BenchError for a refusal."""
    if status in (408, 429) or status >= 500:
        raise _Retryable(f"HTTP {status}{_error_text(data)}")
    if not 200 <= status < 300:
        raise BenchError(f"the server refused {what} (HTTP {status}){_error_text(data)}")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise _Retryable(f"the answer to {what} is not JSON: {data[:60]!r}") from None
    if not isinstance(doc, dict):
        raise _Retryable(f"the answer to {what} is not a JSON object")
    return doc


def _error_text(data: bytes) -> str:
    try:
        doc = json.loads(data)
        msg = doc.get("error", doc.get("detail", doc)) if isinstance(doc, dict) else doc
        if isinstance(msg, dict):
            msg = msg.get("message", msg)
        text = str(msg)
    except (ValueError, UnicodeDecodeError):
        text = data[:120].decode("utf-8", "replace")
    text = " ".join(text.split())
    return f": {text[:160]}" if text else ""


def completion_fields(doc: dict) -> tuple[int, float | None]:
    """``usage.completion_tokens`` and the LLM share (``llm_ratio``, or ``llm_percentage`` / 100) of an answer."""
    usage = doc.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise _Retryable("the answer has no usage.completion_tokens (a non-negative integer)")
    ratio = None
    for where in (doc, usage):
        if isinstance(where.get("llm_ratio"), (int, float)) and not isinstance(where.get("llm_ratio"), bool):
            ratio = float(where["llm_ratio"])
            break
        if isinstance(where.get("llm_percentage"), (int, float)) and not isinstance(where.get("llm_percentage"), bool):
            ratio = float(where["llm_percentage"]) / 100.0
            break
    if ratio is not None and not (0.0 <= ratio <= 1.0):
        ratio = None
    return tokens, ratio


def get_json(t: Target, path: str, timeout_s: float) -> tuple[int, Any]:
    """GET ``path``; (status, parsed JSON or None).  Connection errors propagate as BenchError."""
    conn = _Conn(Target(**{**t.__dict__, "request_timeout_s": timeout_s}))
    try:
        status, data = conn.request("GET", t.base_path + path)
    except (OSError, http.client.HTTPException, _Retryable) as e:
        raise BenchError(f"cannot reach {t.url}: {_describe(e)}") from None
    finally:
        conn.close()
    try:
        return status, json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return status, None


def probe(t: Target, timeout_s: float) -> dict:
    """What the server says about itself: ``/health`` (time scale, status) and the first model of
    ``/v1/models``; neither is required."""
    info: dict[str, Any] = {}
    status, doc = get_json(t, "/health", timeout_s)
    if 200 <= status < 300 and isinstance(doc, dict):
        info["health"] = doc
        ts = doc.get("time_scale")
        if isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts) and ts > 0:
            info["time_scale"] = float(ts)
    try:
        status, doc = get_json(t, "/v1/models", timeout_s)
        data = doc.get("data") if isinstance(doc, dict) else None
        if 200 <= status < 300 and isinstance(data, list) and data and isinstance(data[0], dict) \
                and isinstance(data[0].get("id"), str):
            info["model"] = data[0]["id"]
    except BenchError:
        pass
    return info


# ----------------------------------------------------------------------------------------------- predictions


def load_predicted(path: str, Ns: Sequence[int]) -> dict[int, dict]:
    """Predicted throughput per N from a thresholds file (``tr-autotune run``) or a ``tr-optimize`` JSON.

    Returns ``{N: {"predicted_tok_s", "B", "source"}}``; a file that has no
    computed prediction for one of ``Ns`` (an extrapolated row, an N past its
    end, a missing value) is a :class:`BenchError` naming the N.
    """
    import stat as _stat
    try:
        st = os.stat(path)
        if not _stat.S_ISREG(st.st_mode):
            raise BenchError(f"--predicted {path!r} is not a regular file")
        if st.st_size > 64 * 2 ** 20:
            raise BenchError(f"--predicted {path!r} is over 64 MiB")
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except OSError as e:
        raise BenchError(f"--predicted {path!r}: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise BenchError(f"--predicted {path!r} is not JSON ({str(e)[:80]})") from None
    if not isinstance(doc, dict):
        raise BenchError(f"--predicted {path!r}: a JSON object is expected")

    def num(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0

    table: dict[int, dict] = {}
    if doc.get("format") == "tokenrouter-thresholds" or "entries" in doc:
        entries = doc.get("entries")
        if not isinstance(entries, list):
            raise BenchError(f"--predicted {path!r}: 'entries' must be a list")
        for k, e in enumerate(entries):
            if not isinstance(e, dict):
                raise BenchError(f"--predicted {path!r}: entries[{k}] must be an object")
            n, p = e.get("active_requests"), e.get("predicted_tok_s")
            if isinstance(n, int) and e.get("certificate") != "extrapolated" and num(p):
                table[n] = {"predicted_tok_s": float(p), "B": e.get("thresholds"), "source": "thresholds file"}
        kind = "thresholds file"
    elif isinstance(doc.get("results"), list):
        for k, r in enumerate(doc["results"]):
            if not isinstance(r, dict):
                raise BenchError(f"--predicted {path!r}: results[{k}] must be an object")
            n, p = r.get("N"), r.get("throughput_tok_s")
            if isinstance(n, int) and num(p):
                table[n] = {"predicted_tok_s": float(p), "B": r.get("B"), "source": "tr-optimize"}
        kind = "tr-optimize result"
    else:
        raise BenchError(f"--predicted {path!r} is neither a thresholds file (entries) nor a tr-optimize JSON "
                         "(results)")
    missing = [n for n in Ns if n not in table]
    if missing:
        have = sorted(table)
        span = f"N = {have[0]}..{have[-1]}" if have else "no N"
        raise BenchError(f"--predicted {path!r} ({kind}) has no computed prediction for N = "
                         f"{', '.join(map(str, missing[:8]))}{' ...' if len(missing) > 8 else ''} (it covers {span})")
    return {n: table[n] for n in Ns}


# ------------------------------------------------------------------------------------------------- the loop


@dataclass
class _Record:
    client: int
    send_t: float
    recv_t: float
    tokens: int
    llm_ratio: float | None


@dataclass
class _Worker:
    index: int
    conn: _Conn
    thread: threading.Thread | None = None
    outstanding_since: float | None = None  # send time of the request in progress (first attempt)
    attempt_since: float | None = None      # start of the attempt in progress (the watchdog's clock)
    timed_out: bool = False
    busy: list = field(default_factory=list)  # (start, end) of every attempt


@dataclass(frozen=True)
class PhaseResult:
    """One N's measurement (rates already multiplied by ``time_scale``)."""

    N: int
    window_s: float
    time_scale: float
    requests: int
    window_requests: int
    retries: int
    tokens: float
    throughput_tok_s: float
    throughput_ci95_tok_s: float
    slices: int
    per_request_tok_s: float
    per_request_ci95_tok_s: float
    mean_latency_s: float
    llm_ratio: float | None
    client_idle_fraction: float
    load_average: tuple
    server_mean_in_flight: float | None = None
    server_throughput_tok_s: float | None = None
    server_throughput_ci95_tok_s: float | None = None
    server_slices: int | None = None
    admission_limit: int | None = None       # the server's max_concurrency from /health, when it reports one
    over_admission_limit: bool = False       # N above it (measured only with allow_over_admission): N is not N

    def as_dict(self) -> dict:
        return dict(self.__dict__, load_average=list(self.load_average))


def _prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def admission_limit(health: Any) -> int | None:
    """The most requests the server runs at once, from its ``/health`` (tr-autotune serve: ``max_concurrency``,
    also under ``limits``); None when it does not say."""
    if not isinstance(health, dict):
        return None
    for doc in (health.get("limits"), health):
        v = doc.get("max_concurrency") if isinstance(doc, dict) else None
        if isinstance(v, int) and not isinstance(v, bool) and v >= 1:
            return v
    return None


def run_phase(t: Target, N: int, *, warmup_s: float, duration_s: float, max_retries: int = 3,
              slices: int = 10, time_scale: float = 1.0, prompt_words: int = 16, seed: int = 0,
              clock: Callable[[], float] = time.monotonic, on_progress: Callable[[str], None] | None = None,
              track_server: bool = True, allow_over_admission: bool = False) -> PhaseResult:
    """Keep N requests in flight for ``warmup_s + duration_s`` wall seconds (plus the tail) and measure.

    Before any traffic the server's ``/health`` is read: an N above the admission limit it reports would be
    measured at that limit (the rest wait), so it is refused (:class:`BenchError`), or with
    ``allow_over_admission`` measured and marked (``admission_limit``, ``over_admission_limit``)."""
    if N > MAX_CLIENTS:
        raise LimitError(f"--N {N}: at most {MAX_CLIENTS} concurrent clients (one thread each)")
    try:
        st, hdoc = get_json(t, "/health", min(5.0, t.request_timeout_s))
    except BenchError:
        st, hdoc = 0, None
    limit = admission_limit(hdoc) if 200 <= st < 300 else None
    if limit is not None and N > limit and not allow_over_admission:
        raise BenchError(f"--N {N} is above the server's admission limit of {limit} requests in flight (its /health "
                         f"max_concurrency): the row would measure N = {limit} with {N - limit} waiting; measure "
                         f"N <= {limit} or start the server with a larger --N")
    lock = threading.Lock()
    stop = threading.Event()      # no new requests (tail over, or a failure)
    abort = threading.Event()     # give up now (failure or Ctrl-C)
    records: list[_Record] = []
    state = {"retries": 0, "fatal": None}
    workers = [_Worker(i, _Conn(t)) for i in range(N)]
    load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    t0 = clock()
    t_start, t_end = t0 + warmup_s, t0 + warmup_s + duration_s

    def one_request(w: _Worker, body: bytes) -> tuple[float, int, float | None]:
        last = "no attempt"
        for attempt in range(max_retries + 1):
            if abort.is_set():
                raise _Stop()
            if attempt:
                with lock:
                    state["retries"] += 1
                if abort.wait(min(1.0, 0.05 * 2 ** attempt)):
                    raise _Stop()
            send = clock()
            w.attempt_since, w.timed_out = send, False
            try:
                status, data = w.conn.request("POST", t.path, body)
                doc = _answer(status, data, f"POST {t.path}")
                tokens, ratio = completion_fields(doc)
                w.busy.append((send, clock()))
                return send, tokens, ratio
            except BenchError:
                raise
            except (OSError, http.client.HTTPException, _Retryable) as e:
                w.busy.append((send, clock()))
                if abort.is_set():
                    raise _Stop() from None
                last = "timed out" if w.timed_out else _describe(e)
            finally:
                w.attempt_since = None
        raise BenchError(f"POST {t.url}{t.path[len(t.base_path):]} failed {max_retries + 1} times "
                         f"(last: {last}); see --max-retries, --request-timeout-s")

    def client(w: _Worker) -> None:
        rng = random.Random(f"{seed}:{N}:{w.index}")
        try:
            while not stop.is_set():
                body = t.body(_prompt(rng, prompt_words))
                w.outstanding_since = clock()
                send, tokens, ratio = one_request(w, body)
                recv = clock()
                with lock:
                    records.append(_Record(w.index, send, recv, tokens, ratio))
                    w.outstanding_since = None
                    if recv >= t_end and not any(o.outstanding_since is not None and o.outstanding_since <= t_end
                                                 for o in workers):
                        stop.set()  # every request in flight at the window's end is answered: drain
        except _Stop:
            pass
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            with lock:
                if state["fatal"] is None:
                    state["fatal"] = e
            stop.set()
            abort.set()
        finally:
            w.outstanding_since = None
            w.conn.close()

    for w in workers:
        w.thread = threading.Thread(target=client, args=(w,), name=f"serve-bench-{w.index}", daemon=True)
        w.thread.start()
    readings: list[dict] = []   # the server's /health counters at the window's slice boundaries
    due = [t_start + j * duration_s / max(1, slices) for j in range(max(1, slices))] + [t_end]

    def server_reading() -> None:
        """tr-autotune serve's /health counters (in-flight integral, committed tokens, loop clock), if any."""
        try:
            status, doc = get_json(t, "/health", min(2.0, t.request_timeout_s))
        except BenchError:
            return
        if status == 200 and isinstance(doc, dict):
            got = {k: float(doc[k]) for k in ("in_flight_request_s", "committed_tokens", "clock_s")
                   if _finite(doc.get(k))}
            if "clock_s" in got:
                readings.append(got)

    try:
        announced = False
        while any(w.thread.is_alive() for w in workers):
            now = clock()
            if track_server and due and now >= due[0]:
                while due and now >= due[0]:   # a late reading stands for the boundaries it missed
                    due.pop(0)
                server_reading()
                if not readings or len(readings[0]) < 2:
                    due.clear()   # the server reports no counters (not tr-autotune serve): no more readings
            for w in workers:  # the watchdog: a whole request may not take longer than its timeout
                since = w.attempt_since
                if since is not None and now - since > t.request_timeout_s:
                    w.timed_out = True
                    w.conn.abort()
            if on_progress and not announced and now >= t_end:
                on_progress(f"N = {N}: window over, waiting for the requests in flight")
                announced = True
            for w in workers:
                w.thread.join(0.05 / max(1, len(workers)))
    except BaseException:
        abort.set()
        stop.set()
        for w in workers:
            w.conn.abort()
        raise
    if state["fatal"] is not None:
        e = state["fatal"]
        raise e if isinstance(e, TRError) else BenchError(f"a client failed: {_describe(e)}")
    load1 = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    r = _summarize(N, records, workers, t_start, t_end, time_scale, slices, state["retries"], (load0, load1))
    from dataclasses import replace
    r = replace(r, admission_limit=limit, over_admission_limit=limit is not None and N > limit)
    return _with_server(r, readings, time_scale)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _with_server(r: PhaseResult, readings: Sequence[dict], time_scale: float) -> PhaseResult:
    """Add what the server's readings give: its mean in-flight count and its committed-token throughput."""
    from dataclasses import replace
    extra: dict[str, Any] = {}
    for key, name in (("in_flight_request_s", "in_flight"), ("committed_tokens", "committed")):
        pts = [(x["clock_s"], x[key]) for x in readings if key in x]
        pts = [p for k, p in enumerate(pts) if k == 0 or p[0] > pts[k - 1][0]]   # the clock must advance
        if len(pts) < 2:
            continue
        if name == "in_flight":
            extra["server_mean_in_flight"] = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
        else:
            thr, ci, k = server_rate(pts)
            extra.update(server_throughput_tok_s=thr * time_scale, server_throughput_ci95_tok_s=ci * time_scale,
                         server_slices=k)
    return replace(r, **extra) if extra else r


def server_rate(points: Sequence[tuple[float, float]]) -> tuple[float, float, int]:
    """Rate of a counter read at ``points`` = [(clock, count), ...] (clock increasing): (rate, 95 % half-width,
    slices).  The rate is the count's rise over the clock's; the interval is the ratio estimator's by batch
    means over the slices between readings (count rise d_j over duration h_j: variance of the mean rate
    sum_j (d_j - rate * h_j)^2 / ((k - 1) k mean(h)^2), Student-t with k - 1 degrees of freedom), so unequal
    slices (a late reading) are weighted by their length."""
    k = len(points) - 1
    if k < 1:
        return math.nan, math.nan, 0
    H = points[-1][0] - points[0][0]
    rate = (points[-1][1] - points[0][1]) / H
    if k < 2:
        return rate, math.nan, k
    d = [points[j + 1][1] - points[j][1] for j in range(k)]
    h = [points[j + 1][0] - points[j][0] for j in range(k)]
    var = sum((dj - rate * hj) ** 2 for dj, hj in zip(d, h)) / ((k - 1) * k * (H / k) ** 2)
    return rate, student_t95(k - 1) * math.sqrt(var), k


class _Stop(Exception):
    """The benchmark is being aborted."""


def _summarize(N, records, workers, t_start, t_end, time_scale, slices, retries, load) -> PhaseResult:
    W = t_end - t_start
    life = [r.recv_t - r.send_t for r in records if r.recv_t > r.send_t]
    mean_life = sum(life) / len(life) if life else math.nan
    k = slices if not math.isfinite(mean_life) else int(min(slices, max(2, W // (2 * mean_life))))
    k = max(k, 1)
    acc = [0.0] * k
    width = W / k
    for r in records:
        d = r.recv_t - r.send_t
        if d <= 0 or r.recv_t <= t_start or r.send_t >= t_end:
            continue
        for j in range(k):
            a, b = t_start + j * width, t_start + (j + 1) * width
            ov = min(b, r.recv_t) - max(a, r.send_t)
            if ov > 0:
                acc[j] += r.tokens * ov / d
    tokens = sum(acc)
    rates = [x / width * time_scale for x in acc]
    thr = tokens / W * time_scale
    if k >= 2 and not (W < 2 * mean_life):   # slices under one lifetime share most requests: no interval
        m = sum(rates) / k
        sd = math.sqrt(sum((x - m) ** 2 for x in rates) / (k - 1))
        ci = student_t95(k - 1) * sd / math.sqrt(k)
    else:
        ci = math.nan
    inside = [r for r in records if r.send_t >= t_start and r.recv_t <= t_end and r.recv_t > r.send_t]
    speeds = [r.tokens / (r.recv_t - r.send_t) * time_scale for r in inside]
    n = len(speeds)
    per = sum(speeds) / n if n else math.nan
    per_ci = (student_t95(n - 1) * math.sqrt(sum((s - per) ** 2 for s in speeds) / (n - 1)) / math.sqrt(n)
              if n >= 2 else math.nan)
    lat = sum(r.recv_t - r.send_t for r in inside) / n if n else math.nan
    rated = [r for r in inside if r.llm_ratio is not None]
    tok_rated = sum(r.tokens for r in rated)
    llm = sum(r.llm_ratio * r.tokens for r in rated) / tok_rated if rated and tok_rated > 0 else None
    busy = 0.0
    for w in workers:
        for a, b in w.busy:
            busy += max(0.0, min(b, t_end) - max(a, t_start))
    idle = 1.0 - busy / (W * len(workers)) if W > 0 and workers else math.nan
    return PhaseResult(N=N, window_s=W, time_scale=time_scale, requests=len(records), window_requests=n,
                       retries=retries, tokens=tokens, throughput_tok_s=thr, throughput_ci95_tok_s=ci, slices=k,
                       per_request_tok_s=per, per_request_ci95_tok_s=per_ci,
                       mean_latency_s=lat, llm_ratio=llm, client_idle_fraction=max(0.0, idle), load_average=load)
