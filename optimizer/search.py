r"""Exhaustive search of the best delayed-batching thresholds.

The feasible set is :math:`\{B \in \mathbb{Z}_{\ge1}^M : \sum_i (B_i-1) < N\}`
(larger thresholds can leave every model idle and waiting: deadlock).  For
M = 2 it has N(N+1)/2 members.  ``B* = argmax T(B)``; candidates within a
relative 1e-9 of the best throughput are ties and go to the lexicographically
smallest B, so the answer does not depend on solver noise or evaluation order.
The eager baseline is B = (1, ..., 1).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from optimizer.evaluate import Evaluation, evaluate_thresholds
from tr_core.errors import SpecError
from tr_core.spec import SystemSpec

TIE_RTOL = 1e-9


def feasible_thresholds(M: int, N: int) -> list[tuple[int, ...]]:
    """All B with B_i >= 1 and sum(B_i - 1) < N, in lexicographic order."""
    if N < 1:
        raise SpecError(f"N must be >= 1, got {N}")
    out = []
    for extra in itertools.product(range(N), repeat=M):
        if sum(extra) < N:
            out.append(tuple(e + 1 for e in extra))
    return out


def count_feasible(M: int, N: int) -> int:
    """|{B : sum(B_i - 1) < N}| = C(N - 1 + M, M)."""
    from math import comb
    return comb(N - 1 + M, M)


def pick_best(evals: Sequence[Evaluation]) -> Evaluation:
    """The argmax with the spec's tie rule (within 1e-9 relative: smallest B lexicographically)."""
    top = max(e.throughput_tok_s for e in evals)
    tied = [e for e in evals if e.throughput_tok_s >= top * (1.0 - TIE_RTOL)]
    return min(tied, key=lambda e: e.B)


@dataclass(frozen=True)
class Optimum:
    """The best thresholds at one N, the eager baseline, and every evaluated B."""

    N: int
    best_B: tuple[int, ...]
    throughput_tok_s: float
    eager_throughput_tok_s: float
    gain_vs_eager: float
    states: int
    transitions: int
    residual: float
    solver: str
    seconds: float
    evaluated: int
    best: Evaluation
    eager: Evaluation
    evaluations: tuple[Evaluation, ...] = field(repr=False, default=())

    @property
    def table(self):
        return evaluations_table(self.evaluations)

    def to_dict(self) -> dict:
        return {
            "N": self.N, "B": list(self.best_B), "throughput_tok_s": self.throughput_tok_s,
            "eager_throughput_tok_s": self.eager_throughput_tok_s, "gain_vs_eager": self.gain_vs_eager,
            "per_request_tok_s": self.best.per_request_tok_s,
            "mean_waiting": list(self.best.mean_waiting),
            "admission_latency_ms": self.best.to_dict()["admission_latency_ms"],
            "states": self.states, "transitions": self.transitions, "residual": self.residual,
            "max_residual": max(e.residual for e in self.evaluations) if self.evaluations else self.residual,
            "solver": self.solver, "evaluated": self.evaluated, "seconds": self.seconds,
        }


def evaluations_table(evals: Iterable[Evaluation]):
    """Every evaluated B as a pandas DataFrame (B, tokens/s, states, transitions, residual, solver, seconds)."""
    import pandas as pd  # imported here: the CLI's start-up time should not pay for it

    rows = [{"N": e.N, "B": e.B, "throughput_tok_s": e.throughput_tok_s, "states": e.states,
             "transitions": e.transitions, "residual": e.residual, "solver": e.solver, "seconds": e.seconds}
            for e in evals]
    return pd.DataFrame(rows, columns=["N", "B", "throughput_tok_s", "states", "transitions", "residual",
                                       "solver", "seconds"])


def _eval_task(args):
    spec, N, B, kw = args
    return evaluate_thresholds(spec, N, B, **kw)


def evaluate_many(spec: SystemSpec, tasks: Sequence[tuple[int, tuple[int, ...]]], *, workers: int = 1,
                  executor=None, progress: Callable[[int, int], None] | None = None,
                  **kw) -> list[Evaluation]:
    """Evaluate many (N, B) pairs; results come back in task order whatever the parallelism.

    ``executor``: any object with a ``concurrent.futures``-style ``submit``
    (a ``ProcessPoolExecutor``, a Dask ``Client``...).  Otherwise ``workers``
    > 1 starts a local process pool.
    """
    from tr_core.parallel import map_tasks

    payload = [(spec, int(N), tuple(B), kw) for N, B in tasks]
    # big chains first (large N, small thresholds) so the pool ends evenly loaded
    order = sorted(range(len(payload)), key=lambda i: (-payload[i][1], sum(payload[i][2]), i))
    return map_tasks(_eval_task, payload, workers=workers, executor=executor, progress=progress, order=order)


def optimize_thresholds(spec: SystemSpec, N: int, *, candidates: Sequence[Sequence[int]] | None = None,
                        workers: int = 1, executor=None, progress=None, **kw) -> Optimum:
    """B* at concurrency N by exhaustive search of the feasible set (or of ``candidates``)."""
    t0 = time.perf_counter()
    N = int(N)
    cands = feasible_thresholds(spec.M, N) if candidates is None else [tuple(c) for c in candidates]
    eager_B = (1,) * spec.M
    if eager_B not in cands:
        cands = [eager_B] + cands
    evals = evaluate_many(spec, [(N, B) for B in cands], workers=workers, executor=executor,
                          progress=progress, **kw)
    return _optimum(N, evals, time.perf_counter() - t0)


def _optimum(N: int, evals: Sequence[Evaluation], seconds: float) -> Optimum:
    best = pick_best(evals)
    eager = next(e for e in evals if all(b == 1 for b in e.B))
    return Optimum(N=N, best_B=best.B, throughput_tok_s=best.throughput_tok_s,
                   eager_throughput_tok_s=eager.throughput_tok_s,
                   gain_vs_eager=best.throughput_tok_s / eager.throughput_tok_s,
                   states=best.states, transitions=best.transitions, residual=best.residual,
                   solver=best.solver, seconds=seconds, evaluated=len(evals), best=best, eager=eager,
                   evaluations=tuple(evals))


def optimize_sweep(spec: SystemSpec, Ns: Sequence[int], *, workers: int = 1, executor=None, progress=None,
                   search: str = "exhaustive", **kw) -> list[Optimum]:
    """B* for every N in ``Ns``; all evaluations of the sweep share one pool.

    ``search='local'`` uses :func:`optimize_local` for each N in increasing
    order, started from the previous N's B* (a heuristic).
    """
    if search == "local":
        out, prev = [], None
        for N in sorted(int(n) for n in Ns):
            o = optimize_local(spec, N, start=prev, workers=workers, executor=executor, **kw)
            prev = o.best_B
            out.append(o)
            if progress:
                progress(len(out), len(Ns))
        by_n = {o.N: o for o in out}
        return [by_n[int(N)] for N in Ns]
    if search != "exhaustive":
        raise SpecError(f"--search must be 'exhaustive' or 'local', got {search!r}")
    t0 = time.perf_counter()
    tasks = []
    for N in Ns:
        cands = feasible_thresholds(spec.M, int(N))
        tasks.extend((int(N), B) for B in cands)
    evals = evaluate_many(spec, tasks, workers=workers, executor=executor, progress=progress, **kw)
    by_n: dict[int, list[Evaluation]] = {}
    for e in evals:
        by_n.setdefault(e.N, []).append(e)
    seconds = time.perf_counter() - t0
    del seconds
    return [_optimum(int(N), by_n[int(N)], sum(e.seconds for e in by_n[int(N)])) for N in Ns]


def optimize_local(spec: SystemSpec, N: int, *, start: Sequence[int] | None = None, workers: int = 1,
                   executor=None, progress=None, **kw) -> Optimum:
    """B* by steepest ascent over the +-1 neighbours of a start vector (a heuristic, off by default).

    Not guaranteed to find the global argmax: throughput need not be unimodal
    over the feasible set.  It evaluates far fewer chains (typically
    O(M * N) rather than O(N^M)); ``benchmarks/bench_dtmc.py local`` checks it
    against the exhaustive search.  The result's ``evaluated`` counts the
    chains it solved; ``table`` lists them.  Ties follow the same rule.
    """
    t0 = time.perf_counter()
    N = int(N)
    M = spec.M
    eager = (1,) * M
    cur = tuple(int(b) for b in start) if start is not None else eager
    if len(cur) != M or any(b < 1 for b in cur) or sum(b - 1 for b in cur) >= N:
        cur = eager
    seen: dict[tuple[int, ...], Evaluation] = {}

    def run(cands):
        todo = [c for c in dict.fromkeys(cands) if c not in seen]
        if todo:
            for e in evaluate_many(spec, [(N, c) for c in todo], workers=workers, executor=executor, **kw):
                seen[e.B] = e

    run([cur, eager])
    while True:
        nbrs = []
        for i in range(M):
            for step in (-1, 1):
                b = list(cur)
                b[i] += step
                if b[i] >= 1 and sum(x - 1 for x in b) < N:
                    nbrs.append(tuple(b))
        run(nbrs)
        best = pick_best([seen[c] for c in [cur] + nbrs])
        if progress:
            progress(len(seen), len(seen))
        if best.B == cur:
            break
        cur = best.B
    evals = sorted(seen.values(), key=lambda e: e.B)
    return _optimum(N, evals, time.perf_counter() - t0)
