r"""R2R's per-token records as a routing trace: read them, map them onto the chain, estimate P and C.

R2R (``thu-nics/R2R``) records one row per generated token (``GenerationRecorder.to_dataframe()`` in
``r2r/models/recorder.py``): ``token_id, token_str, source_model, position, param_size, batch_id`` and
optional uncertainty columns, ``source_model`` being ``"quick"`` (the small model's token) or
``"reference"`` (the large model's).  This module reads such records saved as CSV (``DataFrame.to_csv``,
with or without the index column), JSON lines (``to_json(orient="records", lines=True)``; a JSON array of
records is read too) or Parquet (``to_parquet``; needs ``pyarrow``), optionally ``.gz`` for the text forms.

**Requests.**  Rows of one file belong to requests told apart by the ``request_id`` column; without it,
by ``batch_id`` (R2R's index of the sequence in its batch); without either, the file is one request.  Rows
of different requests may interleave; the rows of one request come in ``position`` order, consecutive
(``p, p+1, p+2, ...``): a gap, a repeat or a step back is refused, never sorted.  Several files are several
sets of requests (a ``request_id`` shared by two files names two requests).

**Mapping onto the chain** (model 0 = the small "quick" model, model 1 = the large "reference" model).  In
R2R every token starts with a small-model step whose router then keeps or escalates it:

* a ``quick`` token is one step on model 0 that commits it (decision 0: stay);
* a ``reference`` token is one step on model 0 whose token is discarded (0 tokens, decision 1), then one
  step on model 1 that commits the large model's token (1 token, decision 0: back to the small model).

So ``p_01`` is the fraction of tokens escalated, ``p_10 = 1``, ``c_00 = c_10 = 1`` and ``c_01 = 0``; every
token's decision is observed, including the last token's (a request ends after its last committed token;
that end carries no routing decision, so no observation is lost and ``n_0`` = tokens).  A request whose
first position is not 0 was recorded from the middle: the age of its first run is unknown (the run-length
test leaves it out).  The estimates are those of :mod:`profiler.routing` (Wilson intervals, geometric-run
test, escalation spread) on the sufficient statistics of this mapping, computed by
``profiler._kernels.apply_token_sources``.

Errors: one :class:`TraceError` naming the file, the line (``gen.csv:12``; Parquet and JSON arrays: the
row or record number) and the column.
"""

from __future__ import annotations

import csv
import io
import math
import os
import time
import zlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from profiler.trace import TraceAccumulator, TraceError
from tr_core.fileio import decode_json
from tr_core.routing_trace import RequestOffsets, open_trace, read_error

SOURCES = {"quick": 0, "reference": 1}
REQUIRED = ("source_model", "position")
KEY_COLUMNS = ("request_id", "batch_id")
FORMATS = ("csv", "jsonl", "parquet")
MAX_POSITION = 2 ** 62

__all__ = ["SOURCES", "REQUIRED", "R2RRequests", "read_r2r", "r2r_accumulator", "estimate_r2r_routing",
           "detect_format", "r2r_routing_trace", "estimate_r2r_requests"]


@dataclass(frozen=True, eq=False)
class R2RRequests(RequestOffsets):
    """Requests of R2R records as flat arrays: request r owns tokens ``offsets[r]:offsets[r+1]``."""

    offsets: np.ndarray  # int64, n_requests + 1
    is_reference: np.ndarray  # bool, one per token
    first_positions: np.ndarray  # int64, one per request
    request_ids: tuple  # (file, id or None) per request
    rows: int
    files: tuple

    @property
    def n_tokens(self) -> int:
        return int(self.is_reference.shape[0])


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def detect_format(path: str) -> str:
    """``csv``, ``jsonl`` or ``parquet`` from the name (``.gz`` stripped), else from the first bytes."""
    name = path[:-3] if path.endswith(".gz") else path
    ext = os.path.splitext(name)[1].lower()
    if ext in (".csv", ".tsv"):
        return "csv"
    if ext in (".jsonl", ".ndjson", ".json"):
        return "jsonl"
    if ext in (".parquet", ".pq"):
        return "parquet"
    with open_trace(path) as f:
        head = f.read(4096)
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.lstrip()[:1] in (b"{", b"["):
        return "jsonl"
    return "csv"


def _check_regular(path: str) -> None:
    """The project's one regular-file rule (a FIFO is refused before it is opened), as a TraceError."""
    from tr_core.fileio import require_regular_file
    require_regular_file(path, "trace file", error=TraceError)


# ----------------------------------------------------------------------------------------------- row readers


def _csv_rows(path: str) -> Iterator[tuple[str, dict, tuple]]:
    """(where, row, header) per data row; ``where`` is ``file:line`` of the row's first line."""
    with open_trace(path) as fb:
        text = io.TextIOWrapper(fb, encoding="utf-8-sig", newline="")  # a BOM (Excel) is dropped
        delim = "\t" if path.replace(".gz", "").lower().endswith(".tsv") else ","
        reader = csv.reader(text, delimiter=delim, strict=True)
        try:
            header = next(reader, None)
            if header is None:
                raise TraceError(f"{path}: empty file (no header line)")
            header = tuple(h.strip() for h in header)
            for col in REQUIRED:
                if col not in header:
                    raise TraceError(f"{path}:1: column {col!r} is missing from the header "
                                     f"(R2R records need {', '.join(REQUIRED)})")
            start = reader.line_num + 1
            for row in reader:
                where = f"{path}:{start}"
                start = reader.line_num + 1
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) != len(header):
                    raise TraceError(f"{where}: {len(row)} fields, the header has {len(header)}")
                yield where, dict(zip(header, row)), header
        except UnicodeDecodeError:
            raise TraceError(f"{path}:{reader.line_num + 1}: not valid UTF-8") from None
        except csv.Error as e:
            raise TraceError(f"{path}:{reader.line_num}: not valid CSV ({e})") from None
        except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
            raise read_error(path, e) from None


def _json_rows(path: str) -> Iterator[tuple[str, dict, tuple]]:
    with open_trace(path) as f:
        try:
            data = f.read()
        except (OSError, EOFError, zlib.error) as e:
            raise read_error(path, e) from None
    if data.lstrip()[:1] == b"[":  # a JSON array of records (to_json(orient="records"))
        records = decode_json(data, path, "JSON array of records", error=TraceError, at_line=True)
        items = ((f"{path}: record {k}", obj) for k, obj in enumerate(records, start=1))
    else:  # JSON lines
        items = ((f"{path}:{k}", decode_json(raw, f"{path}:{k}", "record", error=TraceError))
                 for k, raw in enumerate(data.split(b"\n"), start=1) if raw.strip())
    for where, obj in items:
        if not isinstance(obj, dict):
            raise TraceError(f"{where}: a record must be a JSON object, got {_show(obj)}")
        yield where, obj, tuple(obj)


def _parquet_rows(path: str) -> Iterator[tuple[str, dict, tuple]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TraceError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow); or save the records "
                         f"with DataFrame.to_csv / to_json(orient='records', lines=True)") from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises its own types for a bad file
        raise TraceError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0][:120] if str(e) else ''})") \
            from None
    header = tuple(pf.schema_arrow.names)
    for col in REQUIRED:
        if col not in header:
            raise TraceError(f"{path}: column {col!r} is missing (R2R records need {', '.join(REQUIRED)})")
    wanted = [c for c in (*REQUIRED, *KEY_COLUMNS) if c in header]
    k = 0
    for batch in pf.iter_batches(columns=wanted):
        cols = {c: batch.column(c).to_pylist() for c in wanted}
        for i in range(batch.num_rows):
            k += 1
            yield f"{path}: row {k}", {c: cols[c][i] for c in wanted}, header


# ------------------------------------------------------------------------------------------------- values


def _position(v: Any, where: str, typed: bool = False) -> int:
    if isinstance(v, bool) or v is None:
        raise TraceError(f"{where}: column 'position' must be an integer >= 0, got {_show(v)}")
    if isinstance(v, str) and typed:
        raise TraceError(f"{where}: column 'position' must be an integer >= 0 written as a JSON number, got the string {_show(v)} (JSON "
                         f"lines and Parquet carry numbers as numbers; only CSV holds them as text)")
    if isinstance(v, str):
        t = v.strip()
        try:
            x = int(t)
        except ValueError:
            try:
                f = float(t)
            except ValueError:
                raise TraceError(f"{where}: column 'position' must be an integer >= 0, got {_show(v)}") from None
            if not (math.isfinite(f) and f == int(f)):
                raise TraceError(f"{where}: column 'position' must be an integer >= 0, got {_show(v)}")
            x = int(f)
    elif isinstance(v, (int, np.integer)):
        x = int(v)
    elif isinstance(v, (float, np.floating)) and math.isfinite(v) and float(v) == int(v):
        x = int(v)  # pandas writes integer columns holding NaN as floats
    else:
        raise TraceError(f"{where}: column 'position' must be an integer >= 0, got {_show(v)}")
    if not 0 <= x <= MAX_POSITION:
        raise TraceError(f"{where}: column 'position' must be in 0..2^62, got {x}")
    return x


def _source(v: Any, where: str) -> bool:
    if isinstance(v, str):
        s = v.strip()
        if s in SOURCES:
            return s == "reference"
    raise TraceError(f"{where}: column 'source_model' must be 'quick' or 'reference', got {_show(v)}")


def _key(v: Any, col: str, where: str):
    if isinstance(v, bool) or v is None or (isinstance(v, float) and not math.isfinite(v)):
        raise TraceError(f"{where}: column {col!r} must be a string or an integer, got {_show(v)}")
    if isinstance(v, str):
        if not v.strip():
            raise TraceError(f"{where}: column {col!r} is empty")
        return v.strip()
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)) and float(v) == int(v):
        return int(v)
    raise TraceError(f"{where}: column {col!r} must be a string or an integer, got {_show(v)}")


# ------------------------------------------------------------------------------------------------- reading


def _rows(path: str, fmt: str):
    if fmt == "csv":
        return _csv_rows(path)
    if fmt == "jsonl":
        return _json_rows(path)
    if fmt == "parquet":
        return _parquet_rows(path)
    raise TraceError(f"unknown R2R record format {fmt!r} (one of {', '.join(FORMATS)})")


def read_r2r(paths: Sequence[str | os.PathLike], *, fmt: str | None = None) -> R2RRequests:
    """Read R2R per-token records from one or more files (see the module docstring); raises TraceError."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files = tuple(os.fspath(p) for p in paths)
    if not files:
        raise TraceError("no R2R record file given")
    tokens: list[list[bool]] = []
    firsts: list[int] = []
    ids: list = []
    rows = 0
    for path in files:
        _check_regular(path)
        open_reqs: dict[Any, tuple[int, int]] = {}  # key -> (request index, last position)
        key_col: str | None = None
        first = True
        kind = fmt or detect_format(path)
        typed = kind != "csv"  # JSON lines and Parquet carry types: a number written as a string is refused
        key_type: tuple[type, str] | None = None  # the first key's type and where it was
        for where, row, header in _rows(path, kind):
            if first:
                key_col = next((c for c in KEY_COLUMNS if c in header), None)
                first = False
            for col in REQUIRED + ((key_col,) if key_col else ()):
                if col not in row:
                    raise TraceError(f"{where}: column {col!r} is missing")
            is_ref = _source(row["source_model"], where)
            pos = _position(row["position"], where, typed)
            key = _key(row[key_col], key_col, where) if key_col else None
            if key_col:
                if key_type is None:
                    key_type = (type(key), where)
                elif type(key) is not key_type[0]:
                    raise TraceError(f"{where}: column {key_col!r} is {_show(row[key_col])}, "
                                     f"{'a string' if isinstance(key, str) else 'a number'}, but the first row's "
                                     f"({key_type[1]}) is {'a string' if key_type[0] is str else 'a number'}; one file "
                                     f"uses one type for {key_col} (1 and \"1\" would be two requests)")
            prev = open_reqs.get(key)
            if prev is None:
                open_reqs[key] = (len(tokens), pos)
                tokens.append([is_ref])
                firsts.append(pos)
                ids.append((path, key))
            else:
                idx, last = prev
                if pos != last + 1:
                    who = f"request {_show(key)}" if key_col else "the file's request"
                    hint = "" if key_col else "; several requests in one file need a request_id column"
                    raise TraceError(f"{where}: column 'position': {pos} does not follow {last}, the previous "
                                     f"position of {who} (positions of one request must be consecutive, in file "
                                     f"order; out-of-order rows are refused, not sorted{hint})")
                tokens[idx].append(is_ref)
                open_reqs[key] = (idx, pos)
            rows += 1
        if first:
            raise TraceError(f"{path}: no records (an R2R record file has one row per generated token)")
    offsets = np.zeros(len(tokens) + 1, dtype=np.int64)
    np.cumsum([len(t) for t in tokens], out=offsets[1:])
    flat = np.fromiter((x for t in tokens for x in t), dtype=np.bool_, count=int(offsets[-1]))
    return R2RRequests(offsets, flat, np.asarray(firsts, dtype=np.int64), tuple(ids), rows, files)


def r2r_accumulator(req: R2RRequests, *, age_cap: int = 2048) -> TraceAccumulator:
    """The routing estimator's sufficient statistics of the chain steps R2R's records stand for."""
    from profiler import _kernels as K
    acc = TraceAccumulator(2, age_cap)
    first_steps = np.where(req.first_positions == 0, 0, 1).astype(np.int64)  # > 0: first run's age unknown
    start, n = 0, req.n_requests
    while start < n:
        got = int(K.apply_token_sources(req.offsets, first_steps, req.is_reference, start, acc.mcap,
                                        *acc.records()))
        if got < 0:  # pragma: no cover - the mapping builds valid step sequences
            raise TraceError(f"internal error folding R2R records (code {-got})")
        if got < n:
            acc.grow()
        start = got
    K.finish_all(acc.tstate, acc.tn0, acc.tx0, acc.esc_acc, acc.esc_hist)
    acc.lines = req.rows
    acc.max_requests_in_flight = 0  # R2R's records do not say which requests ran together
    return acc


def estimate_r2r_routing(paths: Sequence[str | os.PathLike] | str, *, alpha: float = 0.05, fmt: str | None = None,
                         age_cap: int = 2048):
    """Estimate P (95% Wilson intervals), C and the run-length fits from R2R per-token records."""
    if not (0 < alpha < 1):
        raise TraceError(f"--alpha must lie in (0, 1), got {alpha}")
    t0 = time.perf_counter()
    req = read_r2r(paths, fmt=fmt)
    return estimate_r2r_requests(req, alpha=alpha, age_cap=age_cap, started=t0)


def estimate_r2r_requests(req: R2RRequests, *, alpha: float = 0.05, age_cap: int = 2048,
                          started: float | None = None):
    """:func:`estimate_r2r_routing` on records already read (``started``: perf_counter at the start of reading)."""
    from profiler.routing import estimate_from_accumulator
    t0 = time.perf_counter() if started is None else started
    acc = r2r_accumulator(req, age_cap=age_cap)
    return estimate_from_accumulator(acc, n_models=2, alpha=alpha, source=", ".join(req.files),
                                     seconds=time.perf_counter() - t0)


def r2r_routing_trace(req: R2RRequests):
    """The same requests as a :class:`tr_core.routing_trace.RoutingTrace` (for the simulator's replay).

    The steps of the mapping above, with the format's end rule: the request's last step carries
    ``next_model = -1`` (so the replay runs exactly the recorded steps; an estimate from this trace loses
    each request's last decision, as a ``route-run`` trace does).  Request ids are 0, 1, ... in order of
    first appearance; a request recorded from position p > 0 starts at step p (steps >= positions).
    """
    from tr_core.routing_trace import RoutingTrace
    if req.n_tokens == 0:
        raise TraceError("no R2R records to convert")
    ref = req.is_reference.astype(np.int64)
    per_token = 1 + ref
    first = np.cumsum(per_token) - per_token  # index of each token's small-model step
    total = int(per_token.sum())
    model = np.zeros(total, dtype=np.int64)
    nxt = np.zeros(total, dtype=np.int64)
    tokens = np.zeros(total, dtype=np.float64)
    nxt[first] = ref
    tokens[first] = 1.0 - ref
    second = first[ref == 1] + 1
    model[second] = 1
    tokens[second] = 1.0
    last_token = req.offsets[1:] - 1
    nxt[first[last_token] + per_token[last_token] - 1] = -1
    offsets = np.append(first[req.offsets[:-1]], total).astype(np.int64)
    firsts = tuple(int(p) for p in req.first_positions) if np.any(req.first_positions) else ()
    return RoutingTrace(offsets, model, nxt, tokens, tuple(range(req.n_requests)), False, firsts)
