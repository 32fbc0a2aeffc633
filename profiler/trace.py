"""Routing traces in the profiler: the format's rules and writer come from :mod:`tr_core.routing_trace`.

This module adds the fast streaming reader that the routing estimator uses:
:func:`accumulate_trace` streams a file through the numba parser in
``profiler._kernels`` with fixed-size buffers; only the per-request table of
requests in flight grows (a request ending with ``next_model = -1`` frees its
slot).  The kernel applies the format's rules across lines (steps of a request
in order, ``model`` = previous ``next_model``; the same texts,
:data:`tr_core.routing_trace.RULE_TEXT`); lines outside its canonical fast path
are decoded with :func:`json.loads` and checked by
:func:`tr_core.routing_trace.validate_record`, with the file name and line
number in every message.  The recorder and the pure-Python reader are the
format module's (:class:`RoutingTraceRecorder`, :func:`read_trace_records`).
"""

from __future__ import annotations

import json
import os
import re
import zlib

import numpy as np

from tr_core.routing_trace import (FIELDS, RULE_TEXT, TRACE_SCHEMA_VERSION, RoutingTraceRecorder, TraceError,
                                   TraceRecord, decode_line, iter_records, mixed_id_text, open_trace, read_error,
                                   trace_schema_path, validate_record)

DEFAULT_MODEL_CAP = 64
DEFAULT_AGE_CAP = 2048
ESC_HIST_BINS = 1000

__all__ = ["TraceError", "TraceRecord", "RoutingTraceRecorder", "TraceAccumulator",
           "accumulate_trace", "read_trace_records", "trace_schema_path", "TRACE_SCHEMA_VERSION", "validate_record"]


def read_trace_records(path: str | os.PathLike):
    """Yield validated records one by one, in file order (pure Python; for small traces and tools)."""
    return iter_records(path)


# ----------------------------------------------------------------------------
# fast streaming accumulation

_ERR_TEXT = RULE_TEXT


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
        old = self.records()[0]
        self._alloc_table(new_cap)
        K.rehash(old, self.records()[0])
        self.out[6] = 0

    def records(self):
        """``(RequestTable, TraceStats)`` over this accumulator's arrays, as the kernels take them."""
        from profiler import _kernels as K
        return (K.RequestTable(self.tkeys, self.tstate, self.tstep, self.tnext, self.tage, self.tn0, self.tx0),
                K.TraceStats(self.counts, self.csum, self.csq, self.at_risk, self.events, self.runs,
                             self.esc_acc, self.esc_hist, self.final_acc, self.out))

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
                              *acc.records())
        if code >= 0:
            break
        acc.grow()
    if code != 0:
        raise TraceError(f"{where}: " + _ERR_TEXT[code].format(
            step=rec.step, rid=json.dumps(rec.request_id), model=rec.model, nxt=rec.next_model,
            mmax=acc.mcap - 1))
    acc.slow_lines += 1


_STRING_ID = re.compile(rb'"request_id"\s*:\s*"')
_INT_ID = re.compile(rb'"request_id"\s*:\s*[-0-9]')


class _IdTypes:
    """The rule the compiled reader does not see: request ids of one JSON type in a file (``1`` and ``"1"``
    would be two requests).  Checked on each block of complete lines at C speed (two regular expressions
    over the read buffer, no copy); a key given twice on a line is left to the kernel, which hands such a
    line to the duplicate-refusing decoder."""

    def __init__(self, path: str):
        self.path = path
        self.first: tuple[str, int] | None = None  # (kind, line)

    def check(self, buf: np.ndarray, n: int, base_line: int) -> None:
        if n <= 0:
            return
        view = memoryview(buf)[:n]
        hits = [(m.start(), kind) for kind, m in (("string", _STRING_ID.search(view)),
                                                  ("integer", _INT_ID.search(view))) if m is not None]
        if not hits:
            return
        if self.first is None:
            pos, kind = min(hits)
            self.first = (kind, base_line + int(np.count_nonzero(buf[:pos] == 10)) + 1)
        for pos, kind in hits:
            if kind != self.first[0]:
                line = base_line + int(np.count_nonzero(buf[:pos] == 10)) + 1
                tail = bytes(buf[pos:min(n, pos + 200)]).split(b"\n", 1)[0]
                shown = tail.split(b":", 1)[1].split(b",")[0].strip().decode("utf-8", "replace")[:60]
                raise TraceError(mixed_id_text(f"{self.path}:{line}", kind, shown, self.first[0],
                                               f"{self.path}:{self.first[1]}"))


def _complete(buf: np.ndarray, have: int) -> int:
    """The length of the complete lines at the start of ``buf[:have]`` (up to and with the last newline)."""
    step = 1 << 16
    hi = have
    while hi > 0:
        lo = max(0, hi - step)
        idx = np.flatnonzero(buf[lo:hi] == 10)
        if idx.size:
            return lo + int(idx[-1]) + 1
        hi = lo
        step *= 4
    return 0


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
    ids = _IdTypes(path)
    with open_trace(path) as f:
        while True:
            if not eof:
                try:
                    got = f.readinto(memoryview(buf)[have:])
                except (OSError, EOFError, zlib.error) as e:
                    raise read_error(path, e) from None
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
                except (ValueError, RecursionError):
                    complete = tail.strip() == b""
                if complete:
                    if have >= buf.shape[0]:
                        buf = np.concatenate([buf, np.zeros(1, dtype=np.uint8)])
                    buf[have] = 10
                    have += 1
                else:
                    acc.dropped_last_line = True
                    have = _last_nl(buf, have) + 1
            ids.check(buf, _complete(buf, have), base_line)
            pos = 0
            while True:
                K.consume_lines(buf[pos:have], have - pos, names, offs, acc.mcap, *acc.records())
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
                    rec = validate_record(decode_line(raw, where), where)
                    _apply_slow(acc, rec, where)  # raises with the precise message
                    raise TraceError(f"{where}: inconsistent line")  # pragma: no cover
                _apply_slow(acc, validate_record(decode_line(raw, where), where), where)
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
