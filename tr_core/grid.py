r"""Choosing the time quantum ``delta`` and reading batch-size-dependent latency tables.

Coarsest grid
-------------
Given the latencies the chain will use, :math:`\{L\}` (every ``L_i``, or
every ``L_i(b)`` for the batch sizes that can occur), we want the largest
:math:`\delta` such that each latency rounds to a whole number of quanta
within a relative error ``rtol``:

.. math:: \max_L \frac{|\,\max(1,\operatorname{round}(L/\delta))\,\delta - L\,|}{L} \le \mathrm{rtol}.

The chain's size grows like :math:`1/\delta` per running model, so the
coarsest admissible grid is the cheapest faithful one.  Latency L admits
:math:`\delta \in \bigcup_q [L(1-\mathrm{rtol})/q,\ L(1+\mathrm{rtol})/q]`;
the feasible set is the intersection over all L, so its supremum is one of
the right ends :math:`L(1+\mathrm{rtol})/m`.  We test those candidates (and
the exact hits :math:`L/m`) from the largest down and return the first that
passes; a fine enough grid always passes.
"""

from __future__ import annotations

import csv
import math
import os
from typing import Sequence

import numpy as np

from tr_core.errors import SpecError
from tr_core.quanta import grid_errors, quanta_array  # noqa: F401  (the grid rule's one home; re-exported)
from tr_core.spec import CorunLatency, LatencyCurve, SystemSpec


def coarsest_delta(latencies: Sequence[float], rtol: float = 0.01, min_delta: float = 1e-4) -> float:
    """The largest quantum representing every latency within relative error ``rtol``."""
    if not (0 < rtol < 0.5):
        raise SpecError(f"--delta-rtol must be in (0, 0.5), got {rtol:g}")
    L = np.unique(np.asarray(latencies, dtype=np.float64))
    if L.size == 0 or (L <= 0).any():
        raise SpecError("latencies must be > 0 to choose a grid")
    cands = []
    lmin = float(L.min())
    for Lv in L:
        mmax = int(math.ceil(Lv / max(min_delta, 2 * rtol * lmin * 0.5))) + 1
        m = np.arange(1, min(mmax, 200_000) + 1)
        cands.append(Lv / m)
        cands.append(Lv * (1 + rtol) / m)
    c = np.unique(np.concatenate(cands))[::-1]
    c = c[c <= lmin * (1 + rtol)]
    for start in range(0, c.size, 4096):
        block = c[start:start + 4096]
        q = quanta_array(L[None, :], block[:, None])
        err = np.abs(q * block[:, None] - L[None, :]) / L[None, :]
        ok = np.flatnonzero(err.max(axis=1) <= rtol * (1 + 1e-12))
        if ok.size:
            return float(block[ok[0]])
    raise SpecError(f"no grid of at least {min_delta:g} ms represents every latency within {rtol:g}")


def spec_latencies(spec: SystemSpec, N_max: int) -> list[float]:
    """Every latency the chain can use up to concurrency ``N_max`` (co-running ones included)."""
    out = []
    varies = spec._corun_batch_dependent()
    for i in range(spec.M):
        sizes = range(1, N_max + 1) if varies else (1,)
        cap = spec.caps(N_max)[i]
        out.extend(spec.latency_ms(i, b) for b in sizes if b <= cap)
        if spec.has_corun and spec.corun_latency[i] is not None:
            out.extend(spec.corun_latency_ms(i, b) for b in sizes if b <= cap)
    return out


def load_latency_table(path: str | os.PathLike, M: int) -> list[LatencyCurve | None]:
    """Read per-model L_i(b) from JSON or CSV.

    JSON: a list of M entries (``null``, ``{"batch_size": [...],
    "step_latency_ms": [...]}`` or ``{"intercept_ms": a, "per_request_ms": c}``),
    or an object with that list under ``latency_curves``, or a profiler
    profile/spec document carrying ``latency_curves``.  CSV: header
    ``model,batch_size,step_latency_ms``, one row per measured point.
    """
    from tr_core.fileio import parse_json_text, read_text

    path = os.fspath(path)
    text = read_text(path, "--L-table file")
    if path.lower().endswith(".csv"):
        return _from_csv(text, f"--L-table {path!r}", M, lambda b, v: LatencyCurve("table", batch_size=tuple(b),
                                                                                    step_latency_ms=tuple(v)))
    doc = parse_json_text(text, f"--L-table {path!r}")
    if isinstance(doc, dict):
        doc = doc.get("latency_curves", doc)
    if not isinstance(doc, list):
        raise SpecError(f"--L-table {path!r}: expected a list of {M} latency curves or 'latency_curves'")
    if len(doc) != M:
        raise SpecError(f"--L-table {path!r} has {len(doc)} curves but the system has M = {M} models")
    return [None if c is None else LatencyCurve.from_dict(c, f"--L-table[{i}]") for i, c in enumerate(doc)]


_CSV_COLUMNS = ("model", "batch_size", "step_latency_ms")


def _check_csv_header(reader: csv.DictReader, label: str) -> None:
    """A latency-table CSV has exactly the columns model,batch_size,step_latency_ms (any order): a missing,
    repeated or unknown column is refused (csv would keep the last of two equal names without a word)."""
    names = reader.fieldnames
    if names is None or not set(_CSV_COLUMNS) <= set(names):
        raise SpecError(f"{label}: CSV header must have columns {','.join(_CSV_COLUMNS)}, got "
                        f"{','.join(names or []) or 'none'}")
    for k, name in enumerate(names):
        if name in names[:k]:
            raise SpecError(f"{label}: CSV column {name!r} appears twice in the header (each column once)")
        if name not in _CSV_COLUMNS:
            raise SpecError(f"{label}: unknown CSV column {name!r} (the columns are {','.join(_CSV_COLUMNS)})")


def _check_csv_row(row: dict, label: str) -> None:
    if None in row:  # more fields than the header has columns
        raise SpecError(f"{label}: {len(_CSV_COLUMNS) + len(row[None])} fields, the header has {len(_CSV_COLUMNS)}")


def _from_csv(text: str, label: str, M: int, make) -> list:
    """The CSV form of both latency tables (``--L-table``, ``--corun-L-table``): per model, ``make(batch sizes,
    latencies)`` of its rows sorted by batch size, or None for a model without rows; errors start with ``label``."""
    rows: dict[int, list[tuple[int, float]]] = {}
    reader = csv.DictReader(text.splitlines())
    _check_csv_header(reader, label)
    for n, row in enumerate(reader, start=2):
        _check_csv_row(row, f"{label} line {n}")
        try:
            i, b, v = int(row["model"]), int(row["batch_size"]), float(row["step_latency_ms"])
        except (TypeError, ValueError):
            raise SpecError(f"{label} line {n}: model and batch_size must be integers, "
                            f"step_latency_ms a number") from None
        if not 0 <= i < M:
            raise SpecError(f"{label} line {n}: model {i} is not in 0..{M - 1}")
        if not math.isfinite(v):
            raise SpecError(f"{label} line {n}: step_latency_ms must be finite, got {row['step_latency_ms']!r}")
        rows.setdefault(i, []).append((b, v))
    out: list = []
    for i in range(M):
        pts = sorted(rows.get(i, []))
        if not pts:
            out.append(None)
            continue
        try:
            out.append(make([p[0] for p in pts], [p[1] for p in pts]))
        except SpecError as e:
            raise SpecError(f"{label}, model {i}: {e}") from None
    return out


def load_corun_table(path: str | os.PathLike, M: int) -> list[CorunLatency | None]:
    """Read per-model co-running latencies ``Lco_i(b)`` (``--corun-L-table``) from JSON or CSV.

    JSON: a list of M entries (``null``, ``{"slowdown": F}`` or ``{"batch_size": [...],
    "step_latency_ms": [...]}``), or an object (e.g. a spec or a profile) carrying that list under
    ``corun_latency``.  CSV: header ``model,batch_size,step_latency_ms`` as for ``--L-table``; a model
    without rows gets ``null`` (no slowdown).  Errors name the flag and the file.
    """
    from tr_core.fileio import parse_json_text, read_text

    path = os.fspath(path)
    flag = f"--corun-L-table {path!r}"
    text = read_text(path, "--corun-L-table file")
    if path.lower().endswith(".csv"):
        return _from_csv(text, flag, M, CorunLatency.table)
    doc = parse_json_text(text, flag)
    if isinstance(doc, dict):
        if "corun_latency" not in doc:
            raise SpecError(f"{flag}: expected a list of {M} co-running entries, or an object with 'corun_latency'")
        doc = doc["corun_latency"]
    if not isinstance(doc, list):
        raise SpecError(f"{flag}: expected a list of {M} co-running entries (null, {{\"slowdown\": F}} or "
                        f"a table), got {type(doc).__name__}")
    if len(doc) != M:
        raise SpecError(f"{flag} has {len(doc)} entries but the system has M = {M} models")
    out = []
    for i, c in enumerate(doc):
        if c is None:
            out.append(None)
        elif not isinstance(c, dict):
            raise SpecError(f"{flag}: entry {i} must be null, {{\"slowdown\": F}} or a table, got {c!r:.40}")
        else:
            try:
                out.append(CorunLatency.from_dict(c, f"corun_latency[{i}]"))
            except SpecError as e:
                raise SpecError(f"{flag}: {e}") from None
    return out
