"""Recorded routing traces in the simulator: replay forms and synthetic traces.

The format itself -- its rules, its reader and its writer -- is
:mod:`tr_core.routing_trace` (one line per decoding step; the steps of a
request in order, out-of-order steps refused; ``.gz`` read transparently); this
module re-exports :class:`RoutingTrace`, :func:`read_trace`,
:func:`trace_from_records` and :func:`write_trace` from there.  A trace is held
as a :class:`RoutingTrace` of flat NumPy arrays (the form the simulator kernel
consumes).

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

from typing import Mapping, Sequence

import numpy as np

from tr_core.errors import SpecError
from tr_core.routing_trace import RoutingTrace, read_trace, trace_from_records, write_trace

__all__ = ["RoutingTrace", "read_trace", "trace_from_records", "write_trace", "generate_trace",
           "bimodal_run_length_pmf", "run_lengths"]


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
