"""Routing traces: the JSONL format, a cheap recorder, and readers.

Format (``schema_version`` 1, JSON Schema in ``data/schemas/routing-trace.schema.json``):
one JSON object per line, one line per decoding step of one request::

    {"request_id": 17, "step": 0, "model": 0, "next_model": 0, "committed_tokens": 1}

* ``request_id`` -- string or integer naming the request;
* ``step`` -- integer >= 0, the request's decoding-step counter; consecutive
  lines of one request have consecutive steps (lines of different requests may
  interleave freely);
* ``model`` -- integer >= 0, the model that ran this step; it equals the
  ``next_model`` of the request's previous line;
* ``next_model`` -- integer >= -1, the routing decision taken after the step
  (``-1``: the request finished with this step, no routing decision);
* ``committed_tokens`` -- number >= 0 of output tokens committed by this step
  when it routes to ``next_model`` (the ``c_ij`` of the model).

Extra keys with scalar values are allowed and ignored.  Blank lines are
skipped.  A final line without a newline that does not parse (a writer killed
mid-write) is dropped and reported, not an error.

:func:`accumulate_trace` streams a file through the numba parser in
``profiler._kernels`` with fixed-size buffers; only the per-request table of
requests in flight grows (a request ending with ``next_model = -1`` frees its
slot).  Lines outside the canonical fast path are parsed with
:func:`json.loads` and validated here, with the file name and line number in
every message.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from tr_core.errors import TRError

TRACE_SCHEMA_VERSION = 1
FIELDS = ("request_id", "step", "model", "next_model", "committed_tokens")
DEFAULT_MODEL_CAP = 64
DEFAULT_AGE_CAP = 2048
ESC_HIST_BINS = 1000

__all__ = ["TraceError", "TraceRecord", "RoutingTraceRecorder", "TraceAccumulator",
           "accumulate_trace", "read_trace_records", "trace_schema_path", "TRACE_SCHEMA_VERSION"]


class TraceError(TRError, ValueError):
    """A routing trace is missing, unreadable or malformed; the message names file and line."""


@dataclass(frozen=True)
class TraceRecord:
    request_id: str | int
    step: int
    model: int
    next_model: int
    committed_tokens: float


def trace_schema_path() -> str:
    """Path of the JSON Schema of the trace format (in the source tree's ``data/schemas``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(here), "data", "schemas", "routing-trace.schema.json")


# ----------------------------------------------------------------------------
# recorder

def _json_id(rid: Any) -> str:
    if isinstance(rid, bool):
        raise TraceError(f"request_id must be a string or an integer, got {rid!r}")
    if isinstance(rid, int):
        return str(rid)
    if isinstance(rid, str):
        return json.dumps(rid, ensure_ascii=False)
    if hasattr(rid, "item"):  # numpy / torch scalar
        return _json_id(rid.item())
    raise TraceError(f"request_id must be a string or an integer, got {type(rid).__name__}")


def _json_tokens(c: Any) -> str:
    if hasattr(c, "item"):
        c = c.item()
    if isinstance(c, bool):
        c = int(c)
    if isinstance(c, int):
        if c < 0:
            raise TraceError(f"committed_tokens must be >= 0, got {c}")
        return str(c)
    v = float(c)
    if not math.isfinite(v) or v < 0:
        raise TraceError(f"committed_tokens must be a finite number >= 0, got {c!r}")
    return repr(v) if v != int(v) else str(int(v))


class RoutingTraceRecorder:
    """Append routing decisions to a JSONL trace with buffered writes.

    ``record()`` formats one line into an in-memory list (~3 us per call on a 2-core EPYC VM);
    every ``flush_lines`` lines or ``flush_seconds`` seconds the buffer is
    written with one ``os.write`` on an ``O_APPEND`` descriptor, so a killed
    process leaves at worst a truncated last line (the readers drop it).  Use as
    a context manager or call :meth:`close`; ``close`` is idempotent and also
    runs from ``__del__``.  Thread-safe.
    """

    def __init__(self, path: str | os.PathLike, *, flush_lines: int = 4096, flush_seconds: float = 1.0,
                 append: bool = False):
        if flush_lines < 1:
            raise TraceError(f"flush_lines must be >= 1, got {flush_lines}")
        self.path = os.fspath(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
        try:
            self._fd = os.open(self.path, flags, 0o644)
        except OSError as e:
            raise TraceError(f"cannot open trace {self.path!r} for writing: {e.strerror}") from None
        self._buf: list[str] = []
        self._flush_lines = int(flush_lines)
        self._flush_seconds = float(flush_seconds)
        self._last_flush = time.monotonic()
        self._lock = threading.Lock()
        self.lines_written = 0

    def record(self, request_id: Any, step: int, model: int, next_model: int, committed_tokens: float = 1) -> None:
        """Append one decoding step (``next_model = -1`` when the request finished)."""
        s, m, n = int(step), int(model), int(next_model)
        if s < 0 or m < 0 or n < -1:
            raise TraceError(f"step and model must be >= 0 and next_model >= -1, got step={s}, model={m}, "
                             f"next_model={n}")
        line = (f'{{"request_id": {_json_id(request_id)}, "step": {s}, "model": {m}, '
                f'"next_model": {n}, "committed_tokens": {_json_tokens(committed_tokens)}}}\n')
        with self._lock:
            if self._fd < 0:
                raise TraceError(f"trace recorder for {self.path!r} is closed")
            self._buf.append(line)
            if len(self._buf) >= self._flush_lines or time.monotonic() - self._last_flush > self._flush_seconds:
                self._flush_locked()

    def record_batch(self, request_ids, steps, models, next_models, committed_tokens) -> None:
        """Record one step of a whole batch (sequences or tensors of equal length)."""
        cols = [c.tolist() if hasattr(c, "tolist") else list(c)
                for c in (request_ids, steps, models, next_models, committed_tokens)]
        n = len(cols[0])
        if any(len(c) != n for c in cols):
            raise TraceError("record_batch: all columns must have the same length")
        for r in zip(*cols):
            self.record(*r)

    def _flush_locked(self) -> None:
        if self._buf and self._fd >= 0:
            data = "".join(self._buf).encode("utf-8")
            view = memoryview(data)
            while view:
                k = os.write(self._fd, view)
                view = view[k:]
            self.lines_written += len(self._buf)
            self._buf.clear()
        self._last_flush = time.monotonic()

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                try:
                    self._flush_locked()
                finally:
                    os.close(self._fd)
                    self._fd = -1

    def __enter__(self) -> "RoutingTraceRecorder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


# ----------------------------------------------------------------------------
# slow path: validation of one decoded line

def _check_int(obj: dict, key: str, lo: int, where: str) -> int:
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceError(f"{where}: field {key!r} must be an integer, got {json.dumps(v)}")
    if v < lo:
        raise TraceError(f"{where}: field {key!r} must be >= {lo}, got {v}")
    return v


def validate_record(obj: Any, where: str) -> TraceRecord:
    """Check one decoded trace line; errors name ``where`` (``file:line``) and the field."""
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: a trace line must be a JSON object")
    missing = [k for k in FIELDS if k not in obj]
    if missing:
        raise TraceError(f"{where}: missing field(s) {', '.join(repr(k) for k in missing)}")
    rid = obj["request_id"]
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise TraceError(f"{where}: field 'request_id' must be a string or an integer, got {json.dumps(rid)}")
    step = _check_int(obj, "step", 0, where)
    model = _check_int(obj, "model", 0, where)
    nxt = _check_int(obj, "next_model", -1, where)
    c = obj["committed_tokens"]
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or c < 0:
        raise TraceError(f"{where}: field 'committed_tokens' must be a finite number >= 0, got {json.dumps(c)}")
    for k, v in obj.items():
        if k not in FIELDS and isinstance(v, (dict, list)):
            raise TraceError(f"{where}: extra field {k!r} must have a scalar value")
    return TraceRecord(rid, step, model, nxt, float(c))


def _open_binary(path: str):
    try:
        if path.endswith(".gz"):
            return gzip.open(path, "rb")
        return open(path, "rb", buffering=0)
    except FileNotFoundError:
        raise TraceError(f"trace file {path!r} does not exist") from None
    except IsADirectoryError:
        raise TraceError(f"trace file {path!r} is a directory") from None
    except OSError as e:
        raise TraceError(f"cannot read trace file {path!r}: {e.strerror}") from None


def read_trace_records(path: str | os.PathLike) -> Iterator[TraceRecord]:
    """Yield validated records one by one (pure Python; for small traces and tools)."""
    path = os.fspath(path)
    with _open_binary(path) as raw:
        f = io.TextIOWrapper(io.BufferedReader(raw) if not isinstance(raw, gzip.GzipFile) else raw,
                             encoding="utf-8", errors="strict")
        lineno = 0
        prev = None
        for line in f:
            lineno += 1
            if prev is not None:
                yield prev
                prev = None
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                if not line.endswith("\n"):
                    return  # truncated last line of a killed writer
                raise TraceError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            prev = validate_record(obj, where)
        if prev is not None:
            yield prev


# ----------------------------------------------------------------------------
# fast streaming accumulation

_ERR_TEXT = {
    1: "step {step} of request {rid} does not follow its previous step (steps of one request must be consecutive)",
    2: "request {rid} runs on model {model} but its previous line routed it to another model (next_model)",
    3: "model {model} / next_model {nxt} outside the allowed range (model in 0..{mmax}, next_model in -1..{mmax})",
}


class TraceAccumulator:
    """Sufficient statistics of a routing trace (see ``profiler._kernels``)."""

    def __init__(self, model_cap: int = DEFAULT_MODEL_CAP, age_cap: int = DEFAULT_AGE_CAP,
                 table_capacity: int = 1 << 12):
        if model_cap < 1:
            raise TraceError(f"model cap must be >= 1, got {model_cap}")
        self.mcap = int(model_cap)
        K = int(age_cap)
        self.counts = np.zeros((self.mcap, self.mcap), dtype=np.int64)
        self.csum = np.zeros((self.mcap, self.mcap))
        self.csq = np.zeros((self.mcap, self.mcap))
        self.at_risk = np.zeros((self.mcap, K + 1), dtype=np.int64)
        self.events = np.zeros((self.mcap, K + 1), dtype=np.int64)
        self.runs = np.zeros((self.mcap, K + 1), dtype=np.int64)
        self.esc_acc = np.zeros(6)
        self.esc_hist = np.zeros(ESC_HIST_BINS, dtype=np.int64)
        self.final_acc = np.zeros(2)
        self.out = np.zeros(9, dtype=np.int64)
        self.out[7] = -1
        self._alloc_table(table_capacity)
        self.lines = 0
        self.slow_lines = 0
        self.dropped_last_line = False
        self.max_requests_in_flight = 0  # set from out[8] at the end

    def _alloc_table(self, cap: int) -> None:
        self.tkeys = np.zeros(cap, dtype=np.int64)
        self.tstate = np.zeros(cap, dtype=np.int8)
        self.tstep = np.zeros(cap, dtype=np.int64)
        self.tnext = np.zeros(cap, dtype=np.int64)
        self.tage = np.zeros(cap, dtype=np.int64)
        self.tn0 = np.zeros(cap, dtype=np.int64)
        self.tx0 = np.zeros(cap, dtype=np.int64)

    def grow(self) -> None:
        from profiler import _kernels as K
        live = int(self.out[5])
        cap = self.tkeys.shape[0]
        new_cap = cap * 2 if (live + 1) * 4 > cap else cap  # only tombstones: same size, cleaned
        old = (self.tkeys, self.tstate, self.tstep, self.tnext, self.tage, self.tn0, self.tx0)
        self._alloc_table(new_cap)
        K.rehash(*old, self.tkeys, self.tstate, self.tstep, self.tnext, self.tage, self.tn0, self.tx0)
        self.out[6] = 0

    def table_args(self):
        return (self.tkeys, self.tstate, self.tstep, self.tnext, self.tage, self.tn0, self.tx0,
                self.counts, self.csum, self.csq, self.at_risk, self.events, self.runs,
                self.esc_acc, self.esc_hist, self.final_acc, self.out)

    @property
    def n_models(self) -> int:
        return int(self.out[7]) + 1


def _key_of(rid: str | int) -> int:
    from profiler import _kernels as K
    if isinstance(rid, int):
        b, tag = str(rid).encode(), 105
    else:
        b, tag = rid.encode("utf-8"), 115
    arr = np.frombuffer(b, dtype=np.uint8) if b else np.zeros(0, dtype=np.uint8)
    return int(K.hash_bytes(arr, 0, arr.shape[0], tag))


def _apply_slow(acc: TraceAccumulator, rec: TraceRecord, where: str) -> None:
    from profiler import _kernels as K
    key = _key_of(rec.request_id)
    while True:
        code = K.apply_record(key, rec.step, rec.model, rec.next_model, rec.committed_tokens, acc.mcap,
                              *acc.table_args())
        if code >= 0:
            break
        acc.grow()
    if code != 0:
        raise TraceError(f"{where}: " + _ERR_TEXT[code].format(
            step=rec.step, rid=json.dumps(rec.request_id), model=rec.model, nxt=rec.next_model,
            mmax=acc.mcap - 1))
    acc.slow_lines += 1


def accumulate_trace(path: str | os.PathLike, *, model_cap: int = DEFAULT_MODEL_CAP,
                     age_cap: int = DEFAULT_AGE_CAP, buffer_bytes: int = 1 << 24) -> TraceAccumulator:
    """Stream a JSONL trace (optionally ``.gz``) into a :class:`TraceAccumulator`.

    Memory: one ``buffer_bytes`` read buffer, fixed-size statistics, and a table
    of the requests in flight.  Raises :class:`TraceError` naming the line.
    """
    from profiler import _kernels as K
    path = os.fspath(path)
    if age_cap < 2:
        raise TraceError(f"age cap must be >= 2, got {age_cap}")
    acc = TraceAccumulator(model_cap, age_cap)
    names = np.frombuffer("".join(FIELDS).encode(), dtype=np.uint8).copy()
    offs = np.cumsum([0] + [len(f) for f in FIELDS]).astype(np.int64)
    buf = np.empty(max(1 << 12, int(buffer_bytes)), dtype=np.uint8)
    have = 0
    eof = False
    base_line = 0
    with _open_binary(path) as f:
        while True:
            if not eof:
                try:
                    got = f.readinto(memoryview(buf)[have:])
                except OSError as e:
                    raise TraceError(f"cannot read trace file {path!r}: {e}") from None
                if not got:
                    eof = True
                else:
                    have += got
            if eof and have > 0 and buf[have - 1] != 10:
                # unterminated last line: parse it if it is complete JSON, else drop it
                tail = bytes(buf[_last_nl(buf, have) + 1:have])
                try:
                    json.loads(tail)
                    complete = True
                except (json.JSONDecodeError, UnicodeDecodeError):
                    complete = tail.strip() == b""
                if complete:
                    if have >= buf.shape[0]:
                        buf = np.concatenate([buf, np.zeros(1, dtype=np.uint8)])
                    buf[have] = 10
                    have += 1
                else:
                    acc.dropped_last_line = True
                    have = _last_nl(buf, have) + 1
            pos = 0
            while True:
                K.consume_lines(buf[pos:have], have - pos, names, offs, acc.mcap, *acc.table_args())
                st = int(acc.out[0])
                base_line += int(acc.out[2])
                start = pos + int(acc.out[1])
                if st == K.STATUS_DONE:
                    pos = start
                    break
                where = f"{path}:{base_line + 1}"
                end = pos + int(acc.out[4])
                if st == K.STATUS_TABLE_FULL:
                    acc.grow()
                    pos = start
                    continue
                raw = bytes(buf[start:end])
                if st == K.STATUS_ERROR:
                    rec = validate_record(json.loads(raw), where)
                    _apply_slow(acc, rec, where)  # raises with the precise message
                    raise TraceError(f"{where}: inconsistent line")  # pragma: no cover
                try:
                    obj = json.loads(raw)
                except UnicodeDecodeError:
                    raise TraceError(f"{where}: not valid UTF-8") from None
                except json.JSONDecodeError as e:
                    raise TraceError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
                _apply_slow(acc, validate_record(obj, where), where)
                base_line += 1
                pos = end + 1
            rest = have - pos
            if rest and pos:
                buf[:rest] = buf[pos:have]
            have = rest
            if eof:
                break
            if have == buf.shape[0]:  # one line longer than the buffer
                buf = np.concatenate([buf, np.empty(buf.shape[0], dtype=np.uint8)])
    K.finish_all(acc.tstate, acc.tn0, acc.tx0, acc.esc_acc, acc.esc_hist)
    acc.lines = base_line
    acc.max_requests_in_flight = int(acc.out[8])
    return acc


def _last_nl(buf: np.ndarray, have: int) -> int:
    idx = np.flatnonzero(buf[:have] == 10)
    return int(idx[-1]) if idx.size else -1
