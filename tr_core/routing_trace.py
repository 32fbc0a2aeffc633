"""The routing-trace format: one set of rules, one reader, one writer.

A routing trace is JSON Lines (``schema_version`` 1, JSON Schema in
``data/schemas/routing-trace.schema.json``), one line per decoding step of one
request::

    {"request_id": 17, "step": 0, "model": 0, "next_model": 1, "committed_tokens": 1}

Rules of one line (:func:`validate_record`):

* ``request_id``: a string (at most 1024 characters) or an integer in
  ``-(2^63-1) .. 2^63-1``;
* ``step``: an integer in ``0 .. 2^62``, the request's step counter;
* ``model``: an integer in ``0 .. 63``, the model that ran the step;
* ``next_model``: an integer in ``-1 .. 63``, the routing decision after the
  step (``-1``: the request finished with this step);
* ``committed_tokens``: a finite number ``>= 0`` (at most 1e12), the output
  tokens committed by the step (the ``c_ij`` of the model); required;
* extra keys are allowed when their values are scalars, and ignored (recorders add timestamps, token text,
  scores: a documented exception to "a file says only what the reader checks");
* a key appears once per line (``{"model": 0, "model": 1}`` is refused: JSON would keep the last silently).

Every field is checked for its JSON type: a string where a number belongs is
refused, not converted; ``true`` is not an integer; ``1.0`` is not an integer.

Rules across lines (:class:`Sequencer`), in file order:

* lines of different requests may interleave freely;
* ``request_id`` has one JSON type in a file: all strings or all integers (``1`` and ``"1"`` would be two
  requests to the reader and one to a person);
* **the lines of one request come in step order** ``k, k+1, k+2, ...``
  without gaps or repeats; ``k`` is 0 for a request recorded from its start
  and may be larger when the trace began while the request was running (its
  first lines were not recorded; the profiler treats its first run as
  censored, the simulator replays it from its first recorded step).
  Out-of-order steps are refused, never sorted: the
  streaming reader of the profiler keeps only the requests in flight (memory
  bounded by concurrency, not by the trace), a recorder writes steps in order,
  and a trace whose steps are out of order was merged or edited wrongly;
* a line's ``model`` equals the ``next_model`` of the request's previous line;
* a request ends with ``next_model = -1`` and is forgotten (memory stays
  bounded by the requests in flight): a later line with the same
  ``request_id`` starts a new request.  A request still open at the end of
  the file is kept (its last decision is informative only).

Reading: ``.gz`` files are read transparently; blank lines are skipped; a last
line without a newline that does not parse (a writer killed mid-write) is
dropped and reported (``dropped_last_line``); a compressed file cut short, bad
UTF-8, bad JSON and JSON nested too deeply are errors.  Every message names the
file and the line (``trace.jsonl:12: ...``) and, for a field, the field.

Writing: :func:`format_record` makes one line (used by the streaming
:class:`RoutingTraceRecorder` and by :func:`write_trace`, which writes a whole
:class:`RoutingTrace` atomically).
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from tr_core.errors import SpecError

TRACE_SCHEMA_VERSION = 1
FIELDS = ("request_id", "step", "model", "next_model", "committed_tokens")
MAX_MODELS = 64
MAX_STEP = 2 ** 62
MAX_ID = 2 ** 63 - 1
MAX_ID_CHARS = 1024
MAX_TOKENS = 1e12

# cross-line rule texts, shared with the profiler's compiled reader (profiler._kernels error codes 1-3)
RULE_TEXT = {
    1: "step {step} of request {rid} does not follow its previous step (the steps of one request must come in "
       "order k, k+1, k+2, ... without gaps or repeats; out-of-order steps are refused, not sorted)",
    2: "request {rid} runs on model {model} but its previous line routed it to another model (next_model)",
    3: "model {model} / next_model {nxt} outside the allowed range (model in 0..{mmax}, next_model in -1..{mmax})",
}

__all__ = ["TRACE_SCHEMA_VERSION", "FIELDS", "MAX_MODELS", "RULE_TEXT", "TraceError", "TraceRecord",
           "RequestOffsets", "RoutingTrace", "validate_record", "Sequencer", "open_trace", "iter_records", "read_trace",
           "trace_from_records", "format_record", "write_trace", "RoutingTraceRecorder", "trace_schema_path"]


class TraceError(SpecError):
    """A routing trace is missing, unreadable or breaks a rule; the message names the file, line and field."""


@dataclass(frozen=True)
class TraceRecord:
    request_id: str | int
    step: int
    model: int
    next_model: int
    committed_tokens: float


class RequestOffsets:
    """Requests stored as flat arrays: request ``r`` owns positions ``offsets[r]:offsets[r+1]`` (the base of
    :class:`RoutingTrace` and the profiler's R2R requests)."""

    __slots__ = ()

    @property
    def n_requests(self) -> int:
        return int(self.offsets.shape[0] - 1)


@dataclass(frozen=True, eq=False)
class RoutingTrace(RequestOffsets):
    """Recorded requests as flat arrays (the form the simulator's kernels consume).

    Request ``r`` owns positions ``offsets[r]:offsets[r+1]`` of ``model``,
    ``next_model`` and ``committed_tokens``, in step order.
    """

    offsets: np.ndarray
    model: np.ndarray
    next_model: np.ndarray
    committed_tokens: np.ndarray
    request_ids: tuple = ()
    dropped_last_line: bool = False
    first_steps: tuple = ()  # the step number of each request's first line (empty: all 0)

    @property
    def n_steps(self) -> int:
        return int(self.model.shape[0])

    @property
    def models_used(self) -> int:
        """1 + the largest model index appearing (as ``model`` or ``next_model``)."""
        return int(max(self.model.max(), self.next_model.max())) + 1

    def last_step_flags(self) -> np.ndarray:
        last = np.zeros(self.n_steps, dtype=np.bool_)
        last[self.offsets[1:] - 1] = True
        return last

    def mean_tokens_per_request(self) -> float:
        return float(self.committed_tokens.sum() / self.n_requests)


def trace_schema_path() -> str:
    """Path of the JSON Schema of the format (in the source tree's ``data/schemas``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(here), "data", "schemas", "routing-trace.schema.json")


# ----------------------------------------------------------------------------
# rules of one line

def _show(v: Any) -> str:
    try:
        text = json.dumps(v)
    except (TypeError, ValueError, RecursionError):
        text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _int_field(obj: Mapping, key: str, lo: int, hi: int, where: str) -> int:
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TraceError(f"{where}: field {key!r} must be an integer, got {_show(v)}")
    if not lo <= v <= hi:
        raise TraceError(f"{where}: field {key!r} must be in {lo}..{hi}, got {_show(int(v))}")
    return int(v)


def validate_record(obj: Any, where: str) -> TraceRecord:
    """Check one decoded line (or an in-memory record) against the rules of one line."""
    if not isinstance(obj, Mapping):
        raise TraceError(f"{where}: a trace line must be a JSON object, got {_show(obj)}")
    missing = [k for k in FIELDS if k not in obj]
    if missing:
        raise TraceError(f"{where}: missing field(s) {', '.join(repr(k) for k in missing)}")
    rid = obj["request_id"]
    if isinstance(rid, bool) or not isinstance(rid, (str, int, np.integer)):
        raise TraceError(f"{where}: field 'request_id' must be a string or an integer, got {_show(rid)}")
    if isinstance(rid, str):
        if len(rid) > MAX_ID_CHARS:
            raise TraceError(f"{where}: field 'request_id' is longer than {MAX_ID_CHARS} characters")
    else:
        rid = int(rid)
        if abs(rid) > MAX_ID:
            raise TraceError(f"{where}: field 'request_id' must be within +-(2^63-1), got {_show(rid)}")
    step = _int_field(obj, "step", 0, MAX_STEP, where)
    model = _int_field(obj, "model", 0, MAX_MODELS - 1, where)
    nxt = _int_field(obj, "next_model", -1, MAX_MODELS - 1, where)
    c = obj["committed_tokens"]
    if (isinstance(c, bool) or not isinstance(c, (int, float, np.integer, np.floating))
            or not (0 <= c <= MAX_TOKENS)):  # NaN fails the comparison too
        raise TraceError(f"{where}: field 'committed_tokens' must be a finite number in 0..1e12, got {_show(c)}")
    for k, v in obj.items():
        if k not in FIELDS and isinstance(v, (dict, list)):
            raise TraceError(f"{where}: extra field {str(k)[:60]!r} must have a scalar value")
    return TraceRecord(rid, step, model, nxt, float(c))


# ----------------------------------------------------------------------------
# rules across lines

def mixed_id_text(where: str, kind: str, shown: str, first_kind: str, first_where: str) -> str:
    """The one message for a file whose request ids mix strings and integers."""
    return (f"{where}: request_id {shown} is {'a string' if kind == 'string' else 'an integer'} but the "
            f"request ids before it are {first_kind}s (the first at {first_where}); "
            f"a trace uses one type for request_id (1 and \"1\" are different requests to the reader)")


class Sequencer:
    """Applies the rules across lines in file order; keeps only the requests in flight."""

    def __init__(self):
        self._open: dict[Any, tuple[int, int, int]] = {}  # key -> (last step, its next_model, request index)
        self.n_requests = 0
        self.first_steps: list[int] = []
        self.id_type: tuple[str, str] | None = None  # ("string" | "integer", where it was first seen)

    @staticmethod
    def _key(rid: str | int) -> tuple[str, str | int]:
        return ("s", rid) if isinstance(rid, str) else ("i", rid)

    def add(self, rec: TraceRecord, where: str) -> int:
        """Check ``rec`` against its request's previous line; return the index of its request (0, 1, ...)."""
        key = self._key(rec.request_id)
        kind = "string" if key[0] == "s" else "integer"
        if self.id_type is None:
            self.id_type = (kind, where)
        elif self.id_type[0] != kind:
            raise TraceError(mixed_id_text(where, kind, _show(rec.request_id), self.id_type[0], self.id_type[1]))
        prev = self._open.get(key)
        if prev is None:  # a new request: recorded from step 0, or from step k when the trace began mid-request
            idx = self.n_requests
            self.first_steps.append(rec.step)
            self.n_requests += 1
        else:
            last_step, last_next, idx = prev
            if rec.step != last_step + 1:
                raise TraceError(f"{where}: " + RULE_TEXT[1].format(step=rec.step, rid=_show(rec.request_id)))
            if rec.model != last_next:
                raise TraceError(f"{where}: " + RULE_TEXT[2].format(rid=_show(rec.request_id), model=rec.model))
        if rec.next_model == -1:
            self._open.pop(key, None)
        else:
            self._open[key] = (rec.step, rec.next_model, idx)
        return idx

    @property
    def in_flight(self) -> int:
        return len(self._open)


# ----------------------------------------------------------------------------
# reader

def open_trace(path: str):
    """Open a trace for binary reading (``.gz`` transparently); errors name the file.

    Only a regular file is opened (a FIFO or a device would block or never end)."""
    from tr_core.fileio import require_regular_file
    require_regular_file(path, "trace file", error=TraceError)
    try:
        if path.endswith(".gz"):
            f = gzip.open(path, "rb")
            f.peek(1)  # a file that is not gzip at all fails here, with a clear message below
            return f
        return open(path, "rb")
    except FileNotFoundError:
        raise TraceError(f"trace file {path!r} does not exist") from None
    except IsADirectoryError:
        raise TraceError(f"trace file {path!r} is a directory") from None
    except (gzip.BadGzipFile, zlib.error, EOFError):
        raise TraceError(f"trace file {path!r} is not a valid gzip file (or is cut short)") from None
    except OSError as e:
        raise TraceError(f"cannot read trace file {path!r}: {e.strerror or e}") from None


def read_error(path: str, e: BaseException) -> TraceError:
    """The one-line error for a failure while reading the bytes of ``path``."""
    if isinstance(e, EOFError):
        return TraceError(f"trace file {path!r} is a compressed file cut short (the gzip stream ends early)")
    if isinstance(e, (gzip.BadGzipFile, zlib.error)):
        return TraceError(f"trace file {path!r} is a corrupt gzip file ({str(e).splitlines()[0] if str(e) else ''})")
    return TraceError(f"cannot read trace file {path!r}: {getattr(e, 'strerror', None) or e}")


def decode_line(raw: bytes, where: str) -> Any:
    """JSON of one line; errors name ``where``; a key given twice on the line is refused."""
    from tr_core.fileio import decode_json
    return decode_json(raw, where, "trace line", error=TraceError)


class _Lines:
    """Raw lines of a trace with the killed-writer rule; ``dropped_last_line`` is set at the end."""

    def __init__(self, path: str):
        self.path = path
        self.dropped_last_line = False

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        with open_trace(self.path) as f:
            lineno = 0
            try:
                for raw in f:
                    lineno += 1
                    if not raw.strip():
                        continue
                    if not raw.endswith(b"\n"):
                        try:
                            json.loads(raw)
                        except (ValueError, RecursionError):
                            self.dropped_last_line = True  # a writer killed mid-line
                            return
                    yield lineno, raw
            except (OSError, EOFError, zlib.error) as e:
                raise read_error(self.path, e) from None


def iter_records(path: str | os.PathLike, *, sequence: bool = True) -> Iterator[TraceRecord]:
    """Yield the validated records of a trace file in file order (cross-line rules too unless ``sequence=False``)."""
    p = os.fspath(path)
    seq = Sequencer() if sequence else None
    for lineno, raw in _Lines(p):
        where = f"{p}:{lineno}"
        rec = validate_record(decode_line(raw, where), where)
        if seq is not None:
            seq.add(rec, where)
        yield rec


def trace_from_records(records: Iterable[Any], where: str = "trace") -> RoutingTrace:
    """Validate records (dicts of the line format, in order) and build a :class:`RoutingTrace`."""
    seq = Sequencer()
    rows: list[list[tuple[int, int, float]]] = []
    ids: list = []
    for n, obj in enumerate(records, start=1):
        w = f"{where} record {n}"
        rec = validate_record(obj, w)
        idx = seq.add(rec, w)
        if idx == len(rows):
            rows.append([])
            ids.append(rec.request_id)
        rows[idx].append((rec.model, rec.next_model, rec.committed_tokens))
    return _from_rows(rows, ids, where, first_steps=seq.first_steps)


def _from_rows(rows, ids, where: str, dropped: bool = False, first_steps=()) -> RoutingTrace:
    if not rows:
        raise TraceError(f"{where}: the trace holds no steps")
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=offsets[1:])
    flat = [x for r in rows for x in r]
    arr = np.asarray(flat, dtype=np.float64).reshape(-1, 3)
    firsts = tuple(int(k) for k in first_steps) if any(first_steps) else ()
    return RoutingTrace(offsets, arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64), arr[:, 2].copy(),
                        tuple(ids), dropped, firsts)


def read_trace(path: str | os.PathLike) -> RoutingTrace:
    """Read a whole trace file into a :class:`RoutingTrace` (requests in order of their first line)."""
    p = os.fspath(path)
    lines = _Lines(p)
    seq = Sequencer()
    rows: list[list[tuple[int, int, float]]] = []
    ids: list = []
    for lineno, raw in lines:
        where = f"{p}:{lineno}"
        rec = validate_record(decode_line(raw, where), where)
        idx = seq.add(rec, where)
        if idx == len(rows):
            rows.append([])
            ids.append(rec.request_id)
        rows[idx].append((rec.model, rec.next_model, rec.committed_tokens))
    return _from_rows(rows, ids, f"trace file {p!r}", lines.dropped_last_line, seq.first_steps)


# ----------------------------------------------------------------------------
# writer

def _json_id(rid: Any) -> str:
    if hasattr(rid, "item") and not isinstance(rid, (str, bytes)):  # numpy / torch scalar
        rid = rid.item()
    if isinstance(rid, bool) or not isinstance(rid, (int, str)):
        raise TraceError(f"request_id must be a string or an integer, got {_show(rid)}")
    if isinstance(rid, int):
        if abs(rid) > MAX_ID:
            raise TraceError(f"request_id must be within +-(2^63-1), got {rid}")
        return str(rid)
    if len(rid) > MAX_ID_CHARS:
        raise TraceError(f"request_id is longer than {MAX_ID_CHARS} characters")
    return json.dumps(rid, ensure_ascii=False)


def _json_tokens(c: Any) -> str:
    if hasattr(c, "item"):
        c = c.item()
    if isinstance(c, bool):
        c = int(c)
    if isinstance(c, int):
        if not 0 <= c <= MAX_TOKENS:
            raise TraceError(f"committed_tokens must be in 0..1e12, got {c}")
        return str(c)
    try:
        v = float(c)
    except (TypeError, ValueError):
        raise TraceError(f"committed_tokens must be a number, got {_show(c)}") from None
    if not (0 <= v <= MAX_TOKENS):
        raise TraceError(f"committed_tokens must be a finite number in 0..1e12, got {c!r}")
    return repr(v) if v != int(v) else str(int(v))


def format_record(request_id: Any, step: int, model: int, next_model: int, committed_tokens: float = 1) -> str:
    """One trace line (with its newline), checked against the rules of one line."""
    try:
        s, m, n = int(step), int(model), int(next_model)
    except (TypeError, ValueError):
        raise TraceError(f"step, model and next_model must be integers, got {step!r}, {model!r}, {next_model!r}") \
            from None
    if not (0 <= s <= MAX_STEP and 0 <= m < MAX_MODELS and -1 <= n < MAX_MODELS):
        raise TraceError(f"step must be in 0..2^62, model in 0..{MAX_MODELS - 1} and next_model in "
                         f"-1..{MAX_MODELS - 1}, got step={s}, model={m}, next_model={n}")
    return (f'{{"request_id": {_json_id(request_id)}, "step": {s}, "model": {m}, '
            f'"next_model": {n}, "committed_tokens": {_json_tokens(committed_tokens)}}}\n')


def write_trace(trace: RoutingTrace, path: str | os.PathLike) -> None:
    """Write a :class:`RoutingTrace` as JSONL, atomically (temp file then rename)."""
    from tr_core.fileio import atomic_write

    def dump(f):
        for r in range(trace.n_requests):
            rid = trace.request_ids[r] if trace.request_ids else r
            a, b = int(trace.offsets[r]), int(trace.offsets[r + 1])
            s0 = int(trace.first_steps[r]) if trace.first_steps else 0
            for k in range(a, b):
                f.write(format_record(rid, s0 + k - a, int(trace.model[k]), int(trace.next_model[k]),
                                      float(trace.committed_tokens[k])))

    atomic_write(path, dump, error=TraceError, what="trace")


class RoutingTraceRecorder:
    """Append routing decisions to a JSONL trace with buffered writes (the streaming writer).

    ``record()`` formats one line into an in-memory list (a few microseconds);
    every ``flush_lines`` lines or ``flush_seconds`` seconds the buffer is
    written with one ``os.write`` on an ``O_APPEND`` descriptor, so a killed
    process leaves at worst a truncated last line (the readers drop it).  Use as
    a context manager or call :meth:`close`; ``close`` is idempotent and also
    runs from ``__del__``.  Thread-safe.  Steps must be recorded in order per
    request (the readers refuse out-of-order steps).
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
        self._id_kind: str | None = None  # the readers refuse a trace whose request ids mix strings and integers
        self._flush_lines = int(flush_lines)
        self._flush_seconds = float(flush_seconds)
        self._last_flush = time.monotonic()
        self._lock = threading.Lock()
        self.lines_written = 0

    def record(self, request_id: Any, step: int, model: int, next_model: int, committed_tokens: float = 1) -> None:
        """Append one decoding step (``next_model = -1`` when the request finished)."""
        line = format_record(request_id, step, model, next_model, committed_tokens)
        kind = "string" if isinstance(request_id, str) else "integer"
        with self._lock:
            if self._id_kind is None:
                self._id_kind = kind
            elif kind != self._id_kind:
                raise TraceError(f"request_id {_show(request_id)} is {'a string' if kind == 'string' else 'an integer'}"
                                 f" but this trace's request ids are {self._id_kind}s (one type per trace)")
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
