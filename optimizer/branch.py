"""Pruned (exact) and certified threshold search: evaluate in a good order, skip what is proven worse.

The loop keeps the best throughput found so far, ``best``.  A vector ``B`` is
skipped (pruned) only when a proven upper bound ``U(B) >= T(B)``
(:class:`optimizer.bounds.Bounder`) satisfies

* exact mode: ``U(B) < best * (1 - TIE_RTOL)``: then ``T(B)`` is below the
  tie band of the final optimum, so neither B* nor the tie rule can change;
* certified mode (``max_gap > 0``): ``U(B) <= best / (1 - max_gap)``: then
  whatever ``T(B)`` is, the final relative gap stays within ``max_gap``.

The order only decides how early a strong ``best`` is found (nearest to a
start vector first, e.g. B*(N-1)); it never decides what is skipped.  When a
time budget or an evaluation limit stops the loop, every vector not reached
keeps its own bound, and the reported ``upper_bound_tok_s`` is the largest
bound over all vectors not evaluated (and at least the best throughput), so
the certificate covers the whole feasible set.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

from optimizer.bounds import Bounder, gap as rel_gap
from optimizer.evaluate import Evaluation
from optimizer.search import TIE_RTOL, _optimum, evaluate_many, pick_best
from tr_core import feasibility as F
from tr_core.errors import SpecError
from tr_core.spec import SystemSpec

# largest candidate list held in memory (about 1 GiB of tuples for M = 3)
MAX_CANDIDATES = 5_000_000


def _default_start(N: int, M: int) -> tuple[int, ...]:
    # the centre of the feasible simplex; only orders the work
    x = (N - 1) // (M + 1)
    return (1 + x,) * M


def _ascend(spec, N, cur, evals, seen, allowed, workers, executor, kw, t0, budget, limit) -> tuple[int, ...]:
    """Steepest ascent over +-1 neighbours from ``cur``; appends to ``evals``/``seen``; returns the top."""
    M = spec.M
    by = {e.B: e for e in evals}

    def ok(B):
        return F.is_feasible(B, N) and (allowed is None or B in allowed)

    if not ok(cur):
        return cur
    while True:
        nbrs = [cur]
        for i in range(M):
            for step in (-1, 1):
                b = list(cur)
                b[i] += step
                if ok(b):
                    nbrs.append(tuple(b))
        todo = [B for B in nbrs if B not in seen]
        if limit is not None and len(evals) + len(todo) > limit:
            return cur
        if budget is not None and evals and time.perf_counter() - t0 > budget:
            return cur
        for e in evaluate_many(spec, [(N, B) for B in todo], workers=workers, executor=executor, **kw):
            seen.add(e.B)
            evals.append(e)
            by[e.B] = e
        top = pick_best([by[B] for B in nbrs])
        if top.B == cur:
            return cur
        cur = top.B


def branch_and_bound(spec: SystemSpec, N: int, *, candidates: Sequence[Sequence[int]] | None = None,
                     max_gap: float = 0.0, time_budget_s: float | None = None,
                     max_evaluations: int | None = None, start: Sequence[int] | None = None,
                     eager: bool = True, workers: int = 1, executor=None, progress=None,
                     batch: int | None = None, bounder: Bounder | None = None, **kw) -> "object":
    """Exact (``max_gap = 0``, no budget) or certified search of B* at one N; returns an :class:`Optimum`."""
    t0 = time.perf_counter()
    N = F.check_n(N)
    M = spec.M
    if candidates is None:
        total = F.count_feasible(N, M)
        F.check_count(total, MAX_CANDIDATES, N=N, M=M, what="candidate threshold vectors (memory limit)")
        cands = list(F.iter_feasible(N, M))
    else:
        cands = list(dict.fromkeys(F.check_thresholds(c, N, M) for c in candidates))
        if not cands:
            raise SpecError("candidates: no threshold vector given")
    if bounder is None:
        bounder = Bounder(spec, N, round_to_grid=kw.get("round_to_grid", False))
    st = tuple(int(b) for b in start) if start is not None else _default_start(N, M)
    if len(st) != M or not F.is_feasible(st, N):
        st = _default_start(N, M)
    batch = batch or max(1, int(workers)) * 2

    evals: list[Evaluation] = []
    seen: set = set()
    eager_B = (1,) * M
    if eager:
        evals.extend(evaluate_many(spec, [(N, eager_B)], workers=1, executor=executor, **kw))
        seen.add(eager_B)
    # Observed structure orders the work (never prunes it): a steepest ascent from the start finds a
    # strong incumbent with few chains, then the rest is visited nearest-first from where it ended,
    # cheaper chains (larger B) first among equals.
    allowed = set(cands) if candidates is not None else None
    st = _ascend(spec, N, st, evals, seen, allowed, workers, executor, kw, t0, time_budget_s, max_evaluations)
    cands.sort(key=lambda B: (sum(abs(a - b) for a, b in zip(B, st)), -sum(B), B))
    best = max((e.throughput_tok_s for e in evals), default=-math.inf)
    pruned: list[tuple[tuple[int, ...], str, float]] = []
    unresolved: list[tuple[tuple[int, ...], str, float]] = []
    limit = max_evaluations
    stop_reason = None

    def prunable(v: float) -> bool:
        if best == -math.inf:
            return False
        if max_gap > 0:
            return v <= best / (1.0 - max_gap)
        return v < best * (1.0 - TIE_RTOL)

    i = 0
    n = len(cands)
    while i < n:
        todo = []
        while i < n and len(todo) < batch:
            B = cands[i]
            i += 1
            if B in seen:
                continue
            b = bounder.vector_bound(B)
            if prunable(b.value_tok_s):
                pruned.append((B, b.name, b.value_tok_s))
                continue
            todo.append(B)
        if not todo:
            continue
        if time_budget_s is not None and evals and time.perf_counter() - t0 > time_budget_s:
            stop_reason = "time budget"
        if limit is not None and len(evals) + len(todo) > limit:
            stop_reason = stop_reason or "max_evaluations"
        if stop_reason:
            rest = todo + [B for B in cands[i:] if B not in seen]
            for B in rest:
                b = bounder.vector_bound(B)
                if prunable(b.value_tok_s):
                    pruned.append((B, b.name, b.value_tok_s))
                else:
                    unresolved.append((B, b.name, b.value_tok_s))
            break
        new = evaluate_many(spec, [(N, B) for B in todo], workers=workers, executor=executor, **kw)
        for e in new:
            seen.add(e.B)
            evals.append(e)
            best = max(best, e.throughput_tok_s)
        if progress:
            progress(min(i, n), n)
    if not evals:
        raise SpecError("no threshold vector was evaluated")
    if unresolved and max_gap == 0 and stop_reason == "max_evaluations" and time_budget_s is None:
        raise F.TooManyEvaluations(
            f"the exact pruned search at N = {N} needs more than --max-evaluations = {limit:,} chains "
            f"({len(unresolved):,} vectors still unresolved); raise --max-evaluations or use --search certified",
            len(evals) + len(unresolved), limit or 0)
    top = pick_best(evals).throughput_tok_s
    leftovers = pruned + unresolved
    ub = max([top] + [v for _, _, v in leftovers if v > top * (1.0 - TIE_RTOL)])
    g = rel_gap(ub, top)
    exact = not unresolved and (max_gap == 0 or all(v < top * (1.0 - TIE_RTOL) for _, _, v in pruned))
    by: dict[str, int] = {}
    for _, name, _ in pruned:
        by[name] = by.get(name, 0) + 1
    return _optimum(N, evals, time.perf_counter() - t0,
                    certificate="pruned-exact" if exact else "certified",
                    upper_bound_tok_s=top if exact else ub, gap=0.0 if exact else g,
                    pruned=len(pruned), pruned_by=by, unresolved=len(unresolved),
                    pruned_vectors=tuple(pruned))
