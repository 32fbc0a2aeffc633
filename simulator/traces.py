"""Recorded routing traces: reading, validating, writing and generating them.

A routing trace is JSON Lines, one line per decoding step::

    {"request_id": "r17", "step": 0, "model": 0, "next_model": 0, "committed_tokens": 1}

``step`` counts the request's decoding steps from 0 without gaps, ``model``
ran the step, ``next_model`` is where the router sent the request afterwards
(it must equal the ``model`` of the following step; on the last step it is
informative only, ``-1`` meaning the request finished there) and ``committed_tokens`` (>= 0) were committed by the step.
Lines may come in any order; they are grouped by ``request_id`` and sorted by
``step`` (an id that reappears with step 0 after a step with ``next_model = -1``
starts a new request).  This is the format of
``data/schemas/routing-trace.schema.json`` written by the profiler; ``.gz``
files are read transparently.  A trace is held as a :class:`RoutingTrace` of flat NumPy arrays
(the form the simulator kernel consumes).

:func:`generate_trace` writes synthetic traces from a spec: with
``run_length_pmf=None`` the route is the Markov chain of ``P`` (run lengths on
model i geometric with parameter ``1 - P[i][i]``); otherwise the number of
consecutive steps on model i is drawn from the given distribution and, when
the run ends, the next model is drawn from row i of P with the diagonal
removed (renormalised).  Tokens follow ``C[i][j]`` of each step's transition.
With ``end_at_entry=True`` a request ends at the first step at or after
``steps_per_request`` whose next model is the entry model 0 (and, for a model
with a prescribed run-length law, that ends its run), so that a replacement
entering at model 0 continues the same routing law (a replay of a geometric
trace is then the chain of P, up to the finite sample).
"""

from __future__ import annotations

import gzip
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from tr_core.errors import SpecError

__all__ = ["RoutingTrace", "read_trace", "trace_from_records", "write_trace", "generate_trace",
           "bimodal_run_length_pmf", "run_lengths"]


@dataclass(frozen=True, eq=False)
class RoutingTrace:
    """Recorded requests as flat arrays.

    Request ``r`` owns positions ``offsets[r]:offsets[r+1]`` of ``model``,
    ``next_model`` and ``committed_tokens``.
    """

    offsets: np.ndarray
    model: np.ndarray
    next_model: np.ndarray
    committed_tokens: np.ndarray
    request_ids: tuple = ()

    @property
    def n_requests(self) -> int:
        return int(self.offsets.shape[0] - 1)

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


def _check_int(v: Any, what: str, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or int(v) != v or v < 0:
        raise SpecError(f"{where}: {what!r} must be an integer >= 0, got {v!r}")
    return int(v)


def trace_from_records(records: Iterable[Mapping[str, Any]], where: str = "trace") -> RoutingTrace:
    """Validate step records (dicts of the JSONL format) and build a :class:`RoutingTrace`.

    A request's records are sorted by ``step``; a ``request_id`` that comes back
    with step 0 after a step with ``next_model = -1`` starts a new recorded request.
    """
    by_req: dict[Any, list[list[tuple[int, int, int, float]]]] = {}
    for n, rec in enumerate(records, start=1):
        w = f"{where} record {n}"
        if not isinstance(rec, Mapping):
            raise SpecError(f"{w}: a step record must be an object")
        for k in ("request_id", "step", "model", "next_model"):
            if k not in rec:
                raise SpecError(f"{w}: missing field {k!r}")
        rid = rec["request_id"]
        if isinstance(rid, bool) or not isinstance(rid, (str, int)):
            raise SpecError(f"{w}: 'request_id' must be a string or an integer, got {rid!r}")
        step = _check_int(rec["step"], "step", w)
        model = _check_int(rec["model"], "model", w)
        raw_next = rec["next_model"]
        nxt = -1 if raw_next == -1 and not isinstance(raw_next, bool) else _check_int(raw_next, "next_model", w)
        tok = rec.get("committed_tokens", 0)
        if isinstance(tok, bool) or not isinstance(tok, (int, float)) or not math.isfinite(tok) or tok < 0:
            raise SpecError(f"{w}: 'committed_tokens' must be a number >= 0, got {tok!r}")
        seqs = by_req.setdefault(rid, [[]])
        if step == 0 and seqs[-1] and any(x[2] == -1 for x in seqs[-1]):
            seqs.append([])
        seqs[-1].append((step, model, nxt, float(tok)))
    if not by_req:
        raise SpecError(f"{where}: the trace holds no steps")
    offsets = [0]
    model: list[int] = []
    nxt_l: list[int] = []
    tok_l: list[float] = []
    ids = []
    for rid, seqs in by_req.items():
        for steps in seqs:
            steps.sort()
            for k, (s_, m, x, t) in enumerate(steps):
                if s_ != k:
                    raise SpecError(f"{where}: request {rid!r} has steps {[st[0] for st in steps[:k + 1]]}...; "
                                    f"steps must run 0, 1, 2, ... without gaps or repeats")
                if k + 1 < len(steps):
                    if x == -1:
                        raise SpecError(f"{where}: request {rid!r} step {s_} has next_model -1 (finished) "
                                        f"but the request has a step {s_ + 1}")
                    if steps[k + 1][1] != x:
                        raise SpecError(f"{where}: request {rid!r} step {s_} has next_model {x} but step {s_ + 1} "
                                        f"ran on model {steps[k + 1][1]}")
                model.append(m)
                nxt_l.append(x)
                tok_l.append(t)
            offsets.append(len(model))
            ids.append(rid)
    return RoutingTrace(np.asarray(offsets, dtype=np.int64), np.asarray(model, dtype=np.int64),
                        np.asarray(nxt_l, dtype=np.int64), np.asarray(tok_l, dtype=np.float64), tuple(ids))


def read_trace(path: str | os.PathLike) -> RoutingTrace:
    """Read a routing-trace JSONL file (``.gz`` allowed); errors name the file and line.

    A last line without a newline that does not parse (a writer killed
    mid-write) is dropped, as the profiler's readers do.
    """
    p = os.fspath(path)
    try:
        f = gzip.open(p, "rt", encoding="utf-8") if p.endswith(".gz") else open(p, "r", encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"trace file {p!r} does not exist") from None
    except IsADirectoryError:
        raise SpecError(f"trace file {p!r} is a directory") from None
    except OSError as e:
        raise SpecError(f"cannot read trace file {p!r}: {e.strerror}") from None

    def records():
        with f:
            try:
                for n, line in enumerate(f, start=1):
                    if not line.strip():
                        continue
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as e:
                        if not line.endswith("\n"):
                            return
                        raise SpecError(f"trace file {p!r} line {n} is not valid JSON: {e.msg}") from None
            except (UnicodeDecodeError, OSError, EOFError) as e:
                raise SpecError(f"cannot read trace file {p!r}: {e}") from None

    return trace_from_records(records(), where=f"trace file {p!r}")


def write_trace(trace: RoutingTrace, path: str | os.PathLike) -> None:
    """Write a trace as JSONL, atomically (temp file then rename)."""
    from tr_core.fileio import atomic_write

    def dump(f):
        for r in range(trace.n_requests):
            rid = trace.request_ids[r] if trace.request_ids else r
            a, b = int(trace.offsets[r]), int(trace.offsets[r + 1])
            for k in range(a, b):
                tok = float(trace.committed_tokens[k])
                f.write(json.dumps({"request_id": rid, "step": k - a, "model": int(trace.model[k]),
                                    "next_model": int(trace.next_model[k]),
                                    "committed_tokens": int(tok) if tok.is_integer() else tok}) + "\n")

    atomic_write(path, dump)


def run_lengths(trace: RoutingTrace, model: int) -> np.ndarray:
    """Lengths of the maximal runs of consecutive steps on ``model`` (cut at request ends)."""
    out = []
    for r in range(trace.n_requests):
        a, b = int(trace.offsets[r]), int(trace.offsets[r + 1])
        n = 0
        for k in range(a, b):
            if trace.model[k] == model:
                n += 1
            elif n:
                out.append(n)
                n = 0
        if n:
            out.append(n)
    return np.asarray(out, dtype=np.int64)


def bimodal_run_length_pmf(mean: float, short: int = 1, long: int | None = None) -> np.ndarray:
    """A two-point run-length law on {short, long} with the given mean (a bursty, non-geometric law).

    ``long`` defaults to about 4x the mean.  Returns ``pmf`` with ``pmf[k-1] = Pr(length = k)``.
    """
    if long is None:
        long = max(short + 1, int(round(4 * mean)))
    if not (short < mean < long):
        raise SpecError(f"bimodal run lengths need short < mean < long, got {short}, {mean:g}, {long}")
    w = (mean - short) / (long - short)
    pmf = np.zeros(long)
    pmf[short - 1] = 1 - w
    pmf[long - 1] = w
    return pmf


def generate_trace(spec, n_requests: int, steps_per_request: int, *, run_length_pmf: Mapping[int, Sequence[float]] | None = None,
                   end_at_entry: bool = True, seed: int = 0) -> RoutingTrace:
    """Synthetic recorded requests from ``spec`` (see the module docstring)."""
    if int(n_requests) != n_requests or n_requests < 1:
        raise SpecError(f"n_requests must be an integer >= 1, got {n_requests!r}")
    if int(steps_per_request) != steps_per_request or steps_per_request < 1:
        raise SpecError(f"steps_per_request must be an integer >= 1, got {steps_per_request!r}")
    P, C, M = spec.P, spec.C, spec.M
    rng = np.random.default_rng(seed)
    pmfs: dict[int, np.ndarray] = {}
    off_diag = np.zeros_like(P)
    for i, pmf in (run_length_pmf or {}).items():
        if not 0 <= int(i) < M:
            raise SpecError(f"run_length_pmf: model {i} is out of range 0..{M - 1}")
        a = np.asarray(pmf, dtype=np.float64)
        if a.ndim != 1 or a.size == 0 or np.any(a < 0) or abs(a.sum() - 1) > 1e-9:
            raise SpecError(f"run_length_pmf[{i}] must be a probability vector over lengths 1..K")
        row = P[i].copy()
        row[i] = 0.0
        if row.sum() <= 0:
            raise SpecError(f"run_length_pmf[{i}]: model {i} never leaves (P[{i}][{i}] = 1), a run cannot end")
        off_diag[i] = row / row.sum()
        pmfs[int(i)] = a / a.sum()
    cum_p = np.cumsum(P, axis=1)
    cum_off = np.cumsum(off_diag, axis=1)
    cum_len = {i: np.cumsum(a) for i, a in pmfs.items()}
    buf = rng.random(4096)
    at = [0]

    def unit() -> float:
        nonlocal buf
        if at[0] == buf.size:
            buf = rng.random(4096)
            at[0] = 0
        at[0] += 1
        return float(buf[at[0] - 1])

    def pick(cum: np.ndarray) -> int:
        return min(int(np.searchsorted(cum, unit(), side="right")), cum.size - 1)

    offsets = [0]
    model: list[int] = []
    nxt: list[int] = []
    tok: list[float] = []
    cap = 100 * steps_per_request
    for _ in range(n_requests):
        i = 0
        left = pick(cum_len[0]) + 1 if 0 in pmfs else 0
        n = 0
        while True:
            if i in pmfs:
                left -= 1
                j = i if left > 0 else pick(cum_off[i])
            else:
                j = pick(cum_p[i])
            model.append(i)
            nxt.append(j)
            tok.append(float(C[i, j]))
            n += 1
            # never cut inside a run with a prescribed length law: the replacement starts a fresh run
            at_entry = j == 0 and not (i in pmfs and j == i)
            if n >= steps_per_request and (not end_at_entry or at_entry or n >= cap):
                break
            if j != i and j in pmfs:
                left = pick(cum_len[j]) + 1
            i = j
        offsets.append(len(model))
    return RoutingTrace(np.asarray(offsets, dtype=np.int64), np.asarray(model, dtype=np.int64),
                        np.asarray(nxt, dtype=np.int64), np.asarray(tok, dtype=np.float64),
                        tuple(range(n_requests)))
