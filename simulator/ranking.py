"""Ranking threshold vectors by simulation, with statistical ties, and a simulation-based B* search.

Common random numbers: every candidate is simulated with the same seed, and
the simulator's routing draws are indexed by (request slot, draw number), so
request r takes the same route under every B; only the timing differs.  The
throughput estimates of two candidates are then positively correlated and
their difference is estimated much more precisely than either one.

Tie test.  With ``K`` batch-means batches aligned across candidates (the
k-th batch covers the same request-step range), let ``e^A_k`` and ``e^B_k`` be
the ratio-estimator influence values of candidates A and B (see
``simulator.engine``).  The difference ``T_A - T_B`` has the paired
half-width ``t_{1-a/2, K-1} * sd(e^A - e^B) / sqrt(K)``; a candidate is
*statistically tied* with the best when that two-sided interval (a = 5%)
contains 0.  Each candidate is tested against the best alone (no multiplicity
correction), so with many near-optimal candidates a few true ties can be
missed by chance and a few non-ties flagged; the tie set is a statement at the
95% level per pair, not jointly.

Search (:func:`optimize_by_simulation`): successive halving over the
feasible set ``{B in {1..N}^M : sum(B_i - 1) < N}`` (or given candidates).
Round r simulates every survivor with the same number of request-steps (the
round's share of the time budget divided by the survivors, at least
``min_steps``), then keeps the better half; when at most ``finalists`` remain,
they and the eager vector ``(1, ..., 1)`` are ranked with the rest of the
budget.  Ties are judged among the finalists only.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy import stats

from tr_core.errors import SpecError
from simulator.engine import SimulationResult, batch_means_halfwidth, simulate, validate_thresholds

__all__ = ["RankedCandidate", "Ranking", "SimulatedOptimum", "feasible_thresholds", "rank_candidates",
           "optimize_by_simulation", "paired_difference"]


@dataclass(frozen=True)
class RankedCandidate:
    B: tuple
    throughput_tok_s: float
    ci95_tok_s: float
    diff_to_best_tok_s: float
    diff_ci95_tok_s: float
    tied_with_best: bool
    result: SimulationResult = field(repr=False)


@dataclass(frozen=True)
class Ranking:
    """Candidates sorted by simulated throughput (best first)."""

    entries: tuple
    best_B: tuple
    tie_set: tuple
    confidence: float
    seed: int

    def to_rows(self) -> list[dict]:
        return [{"B": list(e.B), "throughput_tok_s": e.throughput_tok_s, "ci95_tok_s": e.ci95_tok_s,
                 "diff_to_best_tok_s": e.diff_to_best_tok_s, "diff_ci95_tok_s": e.diff_ci95_tok_s,
                 "tied_with_best": e.tied_with_best, "request_steps": e.result.request_steps}
                for e in self.entries]

    def to_dict(self) -> dict:
        return {"schema_version": 1, "best_B": list(self.best_B), "tie_set": [list(b) for b in self.tie_set],
                "confidence": self.confidence, "seed": self.seed, "candidates": self.to_rows()}


@dataclass(frozen=True)
class SimulatedOptimum:
    """Outcome of :func:`optimize_by_simulation`."""

    N: int
    best_B: tuple
    throughput_tok_s: float
    ci95_tok_s: float
    tie_set: tuple
    eager_throughput_tok_s: float
    eager_ci95_tok_s: float
    gain_vs_eager: float
    gain_ci95: float
    ranking: Ranking = field(repr=False)
    rounds: tuple = ()
    evaluated: int = 0
    simulations: int = 0
    request_steps: int = 0
    seconds: float = 0.0
    method: str = "simulate"
    table: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        """JSON form (``schema_version`` 1); the table is left out (see ``ranking`` and ``table``)."""
        return {"schema_version": 1, "method": self.method, "N": self.N, "best_B": list(self.best_B),
                "throughput_tok_s": self.throughput_tok_s, "ci95_tok_s": self.ci95_tok_s,
                "tie_set": [list(b) for b in self.tie_set],
                "eager_throughput_tok_s": self.eager_throughput_tok_s, "eager_ci95_tok_s": self.eager_ci95_tok_s,
                "gain_vs_eager": self.gain_vs_eager, "gain_ci95": self.gain_ci95,
                "rounds": [{"candidates": c, "request_steps_each": st} for c, st in self.rounds],
                "evaluated": self.evaluated, "simulations": self.simulations,
                "request_steps": self.request_steps, "seconds": self.seconds,
                "finalists": self.ranking.to_rows()}


def feasible_thresholds(N: int, M: int) -> list[tuple[int, ...]]:
    """All B in {1..N}^M with sum(B_i - 1) < N, in lexicographic order (:mod:`tr_core.feasibility`; N, then M)."""
    if M < 1 or N < 1:
        raise SpecError(f"need M >= 1 and N >= 1, got M = {M}, N = {N}")
    from tr_core.feasibility import iter_feasible
    return list(iter_feasible(N, M))


def paired_difference(a: SimulationResult, b: SimulationResult, confidence: float = 0.95) -> tuple[float, float]:
    """``T_a - T_b`` (tokens/s) and its paired batch-means half-width (see the module docstring)."""
    ya, ta = np.asarray(a.batch_tokens), np.asarray(a.batch_ms)
    yb, tb = np.asarray(b.batch_tokens), np.asarray(b.batch_ms)
    if ya.size != yb.size or np.any(ta <= 0) or np.any(tb <= 0):
        # unaligned batches: fall back to independent intervals
        z = float(stats.t.ppf(0.5 + confidence / 2, 30)) / float(stats.t.ppf(0.975, 30))
        return a.throughput_tok_s - b.throughput_tok_s, z * math.hypot(a.throughput_ci95_tok_s, b.throughput_ci95_tok_s)
    _, _, ea = batch_means_halfwidth(ya, ta)
    _, _, eb = batch_means_halfwidth(yb, tb)
    d = ea - eb
    K = d.size
    s = math.sqrt(float(np.sum((d - d.mean()) ** 2)) / (K - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, K - 1)) * s / math.sqrt(K) * 1000.0
    return a.throughput_tok_s - b.throughput_tok_s, half


def rank_candidates(spec, N: int, candidates: Sequence[Sequence[int]], *, steps: int | None = None,
                    horizon_ms: float | None = None, warmup: float = 0.1, seed: int = 0, jitter: float = 0.0,
                    trace: Any = None, request_tokens: float | None = None,
                    confidence: float = 0.95) -> Ranking:
    """Simulate every candidate B with common random numbers; rank them and flag ties with the best."""
    if not (0.0 < confidence < 1.0):
        raise SpecError(f"confidence must be in (0, 1), got {confidence!r}")
    cands = [validate_thresholds(B, spec.M, N) for B in candidates]
    if not cands:
        raise SpecError("candidates must hold at least one threshold vector")
    if len(set(cands)) != len(cands):
        raise SpecError("candidates must not repeat a threshold vector")
    if trace is not None and not hasattr(trace, "offsets"):
        from simulator.engine import _as_trace
        trace = _as_trace(trace, spec.M)
    results = [simulate(spec, N, B, steps=steps, horizon_ms=horizon_ms, warmup=warmup, seed=seed, jitter=jitter,
                        trace=trace, request_tokens=request_tokens) for B in cands]
    order = sorted(range(len(cands)), key=lambda k: (-results[k].throughput_tok_s, cands[k]))
    best = results[order[0]]
    entries = []
    ties = []
    for k in order:
        r = results[k]
        if k == order[0]:
            diff, half, tied = 0.0, 0.0, True
        else:
            diff, half = paired_difference(r, best, confidence)
            tied = abs(diff) <= half
        if tied:
            ties.append(cands[k])
        entries.append(RankedCandidate(cands[k], r.throughput_tok_s, r.throughput_ci95_tok_s, diff, half, tied, r))
    return Ranking(tuple(entries), cands[order[0]], tuple(ties), confidence, int(seed))


MAX_SIMULATED_CANDIDATES = 1_000_000  # every candidate is simulated at least once in the first round


def optimize_by_simulation(spec, N: int, *, candidates: Sequence[Sequence[int]] | None = None,
                           budget_s: float = 60.0, seed: int = 0, jitter: float = 0.0, trace: Any = None,
                           request_tokens: float | None = None, finalists: int = 4, min_steps: int = 20_000,
                           max_steps: int = 50_000_000) -> SimulatedOptimum:
    """Search B* by successive halving under a wall-clock budget (seconds); see the module docstring.

    ``min_steps`` per candidate and round takes precedence over ``budget_s``
    (a tiny budget over a large feasible set overruns it).
    """
    t_start = time.perf_counter()
    M = spec.M
    if isinstance(N, bool) or int(N) != N or N < 1:
        raise SpecError(f"N must be an integer >= 1, got {N!r}")
    N = int(N)
    if not (budget_s > 0 and math.isfinite(budget_s)):
        raise SpecError(f"budget_s must be > 0 seconds, got {budget_s!r}")
    if int(finalists) != finalists or finalists < 1:
        raise SpecError(f"finalists must be an integer >= 1, got {finalists!r}")
    if candidates is None:
        from tr_core.feasibility import count_feasible
        count = count_feasible(N, M)
        if count > MAX_SIMULATED_CANDIDATES:
            from tr_core.errors import WorkTooLarge
            raise WorkTooLarge(f"N = {N:,}: the simulator's search would simulate every one of the {count:,} "
                               f"feasible threshold vectors at least once (more than {MAX_SIMULATED_CANDIDATES:,}); "
                               f"lower N, or pass candidates")
    cands = feasible_thresholds(N, M) if candidates is None else [validate_thresholds(B, M, N) for B in candidates]
    if not cands:
        raise SpecError("candidates must hold at least one threshold vector")
    cands = list(dict.fromkeys(cands))
    if trace is not None and not hasattr(trace, "offsets"):
        from simulator.engine import _as_trace
        trace = _as_trace(trace, M)
    eager = tuple([1] * M)
    kw = dict(jitter=jitter, trace=trace, request_tokens=request_tokens)

    # calibrate the simulator's speed on this system (also compiles the kernel)
    simulate(spec, N, eager, steps=2_000, seed=seed, **kw)     # compiles or loads the kernel, untimed
    probe = simulate(spec, N, eager, steps=max(min_steps, 50_000), seed=seed, **kw)
    rate = (probe.request_steps + probe.warmup_steps) / max(probe.wall_s, 1e-6)
    n_rounds = 1 + max(0, math.ceil(math.log2(max(1, len(cands)) / finalists)))
    survivors = list(cands)
    history: dict[tuple, dict] = {}
    rounds = []
    sims = 1
    total_steps = probe.request_steps + probe.warmup_steps
    rnd = 0
    while len(survivors) > finalists:
        spent = time.perf_counter() - t_start
        share = max(budget_s - spent, 0.0) / max(1, n_rounds - rnd)
        steps = int(min(max_steps, max(min_steps, rate * share / 1.1 / len(survivors))))
        t_round = time.perf_counter()
        rk = rank_candidates(spec, N, survivors, steps=steps, seed=seed + 1 + rnd, **kw)
        done = sum(e.result.request_steps + e.result.warmup_steps for e in rk.entries)
        # re-estimate the speed with everything the round cost (Python overhead, machine load)
        rate = done / max(time.perf_counter() - t_round, 1e-6)
        for pos, e in enumerate(rk.entries):
            history[e.B] = {"B": e.B, "throughput_tok_s": e.throughput_tok_s, "ci95_tok_s": e.ci95_tok_s,
                            "request_steps": steps, "round": rnd, "finalist": False, "tied_with_best": False}
        sims += len(survivors)
        total_steps += done
        rounds.append((len(survivors), steps))
        keep = max(finalists, math.ceil(len(survivors) / 2))
        survivors = [e.B for e in rk.entries[:keep]]
        rnd += 1
    final = list(survivors)
    if eager not in final:
        final.append(eager)
    spent = time.perf_counter() - t_start
    steps = int(min(max_steps, max(min_steps, rate * max(budget_s - spent, 0.0) / 1.1 / len(final))))
    rk = rank_candidates(spec, N, final, steps=steps, seed=seed + 1 + rnd, **kw)
    sims += len(final)
    total_steps += sum(e.result.request_steps + e.result.warmup_steps for e in rk.entries)
    rounds.append((len(final), steps))
    # the eager vector is a reference, not a finalist, unless it earned its place
    entries = [e for e in rk.entries if e.B in survivors]
    best = entries[0]
    ties = tuple(e.B for e in entries if e.tied_with_best)
    eager_e = next(e for e in rk.entries if e.B == eager)
    if best.B == eager:
        gain, gain_half = 0.0, 0.0
    else:
        d, h = paired_difference(best.result, eager_e.result)
        gain, gain_half = d / eager_e.throughput_tok_s, h / eager_e.throughput_tok_s
    ranking = Ranking(tuple(entries), best.B, ties, rk.confidence, rk.seed)
    for e in rk.entries:
        history[e.B] = {"B": e.B, "throughput_tok_s": e.throughput_tok_s, "ci95_tok_s": e.ci95_tok_s,
                        "request_steps": steps, "round": rnd, "finalist": e.B in survivors,
                        "tied_with_best": e.B in ties}
    try:
        import pandas as pd
        table = pd.DataFrame(sorted(history.values(), key=lambda r: (-r["round"], -r["throughput_tok_s"])))
    except ImportError:   # pandas is a dependency; keep the search usable without it
        table = sorted(history.values(), key=lambda r: (-r["round"], -r["throughput_tok_s"]))
    return SimulatedOptimum(
        N=N, best_B=best.B, throughput_tok_s=best.throughput_tok_s, ci95_tok_s=best.ci95_tok_s, tie_set=ties,
        eager_throughput_tok_s=eager_e.throughput_tok_s, eager_ci95_tok_s=eager_e.ci95_tok_s,
        gain_vs_eager=gain, gain_ci95=gain_half, ranking=ranking, rounds=tuple(rounds),
        evaluated=len(history), simulations=sims, request_steps=int(total_steps),
        seconds=time.perf_counter() - t_start,
        method="simulate:trace" if trace is not None else "simulate:routing-matrix", table=table)
