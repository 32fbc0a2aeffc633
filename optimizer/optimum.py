"""The result of a threshold search (:class:`Optimum`), the tie rule and the evaluation of many vectors.

Shared by the search modes (:mod:`optimizer.search`, :mod:`optimizer.branch`); see
:mod:`optimizer.search` for what the fields mean.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Sequence

from optimizer.evaluate import Evaluation, cache_entry, evaluate_thresholds
from tr_core.spec import SystemSpec

TIE_RTOL = 1e-9


def pick_best(evals: Sequence[Evaluation]) -> Evaluation:
    """The argmax with the spec's tie rule (within 1e-9 relative: smallest B lexicographically)."""
    top = max(e.throughput_tok_s for e in evals)
    tied = [e for e in evals if e.throughput_tok_s >= top * (1.0 - TIE_RTOL)]
    return min(tied, key=lambda e: e.B)


@dataclass(frozen=True)
class Optimum:
    """The best thresholds at one N, the eager baseline, every evaluated B, and how B* was certified.

    ``certificate``: ``"exhaustive"``, ``"pruned-exact"`` (exact: every vector
    not evaluated was proven worse), ``"certified"`` (best found, with a proven
    ``upper_bound_tok_s`` over every feasible vector and the relative ``gap``)
    or ``"local"`` (heuristic; the bound and gap are still proven).
    ``pruned_by``: bound name -> number of vectors it excluded;
    ``unresolved``: vectors neither evaluated nor pruned (time budget, or a
    chain over the state budget), covered only by their bounds in ``upper_bound_tok_s``.
    ``eager_method``: how the eager baseline was obtained: ``"exact"`` (its chain,
    solved by the search), ``"simulated"`` (a search that never needed the eager
    chain, the largest of all: the caller's estimate, with ``eager_ci95_tok_s``,
    see :func:`with_eager_estimate`) or ``"none"`` (not known: NaN).
    """

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
    eager: Evaluation | None
    evaluations: tuple[Evaluation, ...] = field(repr=False, default=())
    certificate: str = "exhaustive"
    upper_bound_tok_s: float = float("nan")
    gap: float = 0.0
    pruned: int = 0
    pruned_by: Mapping[str, int] = field(default_factory=dict)
    unresolved: int = 0
    pruned_vectors: tuple = field(repr=False, default=(), compare=False)   # (B, bound name, bound tok/s)
    eager_ci95_tok_s: float = 0.0
    eager_method: str = "exact"

    def __post_init__(self):
        if math.isnan(self.upper_bound_tok_s):
            object.__setattr__(self, "upper_bound_tok_s", float(self.throughput_tok_s))

    @property
    def table(self):
        return evaluations_table(self.evaluations)

    @property
    def exact(self) -> bool:
        return self.certificate in ("exhaustive", "pruned-exact")

    def to_dict(self) -> dict:
        return {
            "N": self.N, "B": list(self.best_B), "throughput_tok_s": self.throughput_tok_s,
            "eager_throughput_tok_s": _num(self.eager_throughput_tok_s), "gain_vs_eager": _num(self.gain_vs_eager),
            "eager_ci95_tok_s": self.eager_ci95_tok_s, "eager_method": self.eager_method,
            "per_request_tok_s": self.best.per_request_tok_s,
            "mean_waiting": list(self.best.mean_waiting),
            "admission_latency_ms": self.best.to_dict()["admission_latency_ms"],
            "states": self.states, "transitions": self.transitions, "residual": self.residual,
            "max_residual": max(e.residual for e in self.evaluations) if self.evaluations else self.residual,
            "solver": self.solver, "evaluated": self.evaluated, "seconds": self.seconds,
            "certificate": self.certificate, "upper_bound_tok_s": self.upper_bound_tok_s, "gap": self.gap,
            "pruned": self.pruned, "pruned_by": dict(self.pruned_by), "unresolved": self.unresolved,
            "cached": sum(1 for e in self.evaluations if e.cached),
        }


def with_eager_estimate(opt: Optimum, throughput_tok_s: float, ci95_tok_s: float, method: str) -> Optimum:
    """``opt`` with an eager baseline obtained elsewhere (the search never solved the eager chain).

    Only the reported baseline and gain change; B*, the certificate and every bound are the search's.
    An exact baseline is never replaced.
    """
    if opt.eager is not None:
        return opt
    thr = float(throughput_tok_s)
    return dataclasses.replace(opt, eager_throughput_tok_s=thr, eager_ci95_tok_s=float(ci95_tok_s),
                               eager_method=method,
                               gain_vs_eager=opt.throughput_tok_s / thr if thr > 0 else float("nan"))


def _num(x: float):
    return None if x is None or not math.isfinite(x) else x


def evaluations_table(evals: Iterable[Evaluation]):
    """Every evaluated B as a pandas DataFrame (B, tokens/s, its error bound, states, transitions, residual,
    solver, seconds)."""
    import pandas as pd  # imported here: the CLI's start-up time should not pay for it

    rows = [{"N": e.N, "B": e.B, "throughput_tok_s": e.throughput_tok_s,
             "throughput_error_bound": e.throughput_error_bound, "states": e.states,
             "transitions": e.transitions, "residual": e.residual, "solver": e.solver, "seconds": e.seconds}
            for e in evals]
    return pd.DataFrame(rows, columns=["N", "B", "throughput_tok_s", "throughput_error_bound", "states",
                                       "transitions", "residual", "solver", "seconds"])


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


def is_proven(e: Evaluation) -> bool:
    """Whether ``e``'s throughput error bound is a proven, finite bound (not an estimate)."""
    return math.isfinite(e.throughput_error_bound) and not str(e.bound_method).startswith("estimate")


def b_star_rivals(evals: Iterable[Evaluation], best: Evaluation) -> list[Evaluation]:
    """The evaluated-but-rejected chains whose accuracy is not proven within ``dtmc.ACCURACY_TOL`` and whose
    throughput, raised by its bound, reaches B*'s lowered by its own: they could be the true best, so B* is
    not proven among them (every one of them, when B*'s own bound is not proven)."""
    floor = best.throughput_tok_s * (1.0 - best.throughput_error_bound) if is_proven(best) else math.inf
    return [e for e in evals if tuple(e.B) != tuple(best.B) and not e.accuracy_ok
            and not (is_proven(e) and e.throughput_tok_s * (1.0 + e.throughput_error_bound) < floor)]


_EVALUATION_OPTIONS = frozenset(inspect.signature(evaluate_thresholds).parameters) - {"spec", "N", "B", "tighten"}
# solvers whose bound more effort can tighten (polishing sweeps; GTH up to a larger size for auto)
TIGHTENABLE = ("auto", "anderson", "gauss-seidel")


# the bracket of :func:`bracket_throughput` is iterated until its width is this (relative), well inside
# dtmc.ACCURACY_TOL, or for at most this many sweeps of the chain
BRACKET_RTOL = 2e-7
BRACKET_SWEEPS = 20_000
# rivals with at least this many states get the bracket first; smaller ones go straight to the GTH re-solve,
# which is cheap there and bounds the whole distribution (the waiting times too), not the throughput alone
BRACKET_MIN_STATES = 10_000


def bracket_throughput(spec: SystemSpec, e: Evaluation, *, round_to_grid: bool = False) -> Evaluation | None:
    """``e`` with a proven bound on the relative error of its throughput from the chain's own certificate, or
    None when that bound is not tighter than ``e``'s.

    For any vector ``h`` on the chain's states, ``min_s D(s) <= T(B) <= max_s D(s)`` with ``D = (g + T h - h) /
    tau`` (docs/model.md, bound 2); :func:`optimizer.bounds.box_bound` on the box holding ``B`` alone is that
    chain (no decisions are left to a box of one vector) and iterates ``h`` by damped relative value
    iteration until the bracket ``[lo, hi]`` is :data:`BRACKET_RTOL` wide, adding the rounding of its sums.
    Then ``|T_e - T(B)| <= max(T_e - lo, hi - T_e)`` whatever solver gave ``T_e``.  This bounds the throughput
    only: ``pi_error_bound`` (and with it the error of the waiting times) stays as it was.  Where the
    stationary solve's own bound is loose (large, slowly mixing chains: R2R at N = 256 near B*, 1e-4 to 1e-3)
    this costs about one second against about five for the GTH re-solve (``tighten=True``).
    """
    from optimizer.bounds import box_bound

    T = float(e.throughput_tok_s)
    if not (T > 0) or not math.isfinite(T):
        return None
    r = box_bound(spec, e.N, e.B, e.B, rtol=BRACKET_RTOL, max_sweeps=BRACKET_SWEEPS, max_step=64,
                  round_to_grid=round_to_grid, max_states=max(1_000, 2 * int(e.states)))
    if r.status != "ok" or not (math.isfinite(r.lower_tok_s) and math.isfinite(r.upper_tok_s)):
        return None
    err = max(T - r.lower_tok_s, r.upper_tok_s - T, 0.0) / T
    if not err < e.throughput_error_bound:
        return None
    return dataclasses.replace(e, throughput_error_bound=err, bound_method="value-iteration bracket (throughput)")


def _tighten_one(args) -> Evaluation:
    """One chain re-solved with more effort on its error bound (a task of :func:`tighten_rivals`)."""
    spec, N, e, kw = args
    b = None
    if e.states >= BRACKET_MIN_STATES:
        b = bracket_throughput(spec, e, round_to_grid=kw.get("round_to_grid", False))
    if b is None or not b.accuracy_ok:
        return evaluate_thresholds(spec, N, e.B, tighten=True, **kw)
    if kw.get("cache") is not None:
        # kept as evaluate_thresholds keeps a tightened result: the next run reads it proven
        cache, key = cache_entry(kw["cache"], spec, N, e.B, **{k: v for k, v in kw.items() if k != "cache"})
        cache.put(key, b)
    return b


def tighten_rivals(spec: SystemSpec, opt: Optimum, *, max_rounds: int = 4, executor=None, **kw) -> Optimum:
    """``opt`` with B* (when its own bound is not within ``dtmc.ACCURACY_TOL``) and then every rival of B*
    (:func:`b_star_rivals`) re-solved with more effort on its error bound (:func:`bracket_throughput` for a
    large chain, else ``evaluate_thresholds(..., tighten=True)``), until none is left, nothing more can be
    done, or ``max_rounds`` rounds (a re-solved rival may become B*, which makes others rivals).

    Then every other chain whose bound is still above the tolerance is re-solved once the same way (it cannot
    be B*, but its reported bound should be within the tolerance).  A round's chains go to ``executor`` when
    given (one task a chain), else are re-solved one at a time here.  The search's
    other fields stand: pruning compared proven bounds with the best throughput found, which only rises here;
    a certified result's upper bound is kept, or raised to the new best.  ``kw``: the evaluation options
    (solver, tol, cache, ...); a ``solver`` more effort cannot help (``gth``, ``direct``, ``power``)
    returns ``opt`` unchanged.
    """
    from tr_core.parallel import map_tasks

    if kw.get("solver", "auto") not in TIGHTENABLE or not opt.evaluations:
        return opt
    # the evaluation's own options only (a search's options, e.g. the pruned search's stats=, pass through kw)
    kw = {k: v for k, v in kw.items() if k in _EVALUATION_OPTIONS}
    t0 = time.perf_counter()
    evals = list(opt.evaluations)
    best = opt.best
    tried: set = set()
    for _ in range(max_rounds):
        if not best.accuracy_ok and tuple(best.B) not in tried:
            # B*'s own loose bound lowers the floor every rival is held to: B* first, then its rivals
            todo = [best]
        else:
            todo = [e for e in b_star_rivals(evals, best) if tuple(e.B) not in tried]
        if not todo:
            break
        tried.update(tuple(e.B) for e in todo)
        done = map_tasks(_tighten_one, [(spec, opt.N, e, kw) for e in todo], executor=executor)
        new = {tuple(e.B): e for e in done}
        evals = [new.get(tuple(e.B), e) for e in evals]
        best = pick_best(evals)
    # the rest of the loose chains, once: rejected by their bounds already, but every reported error bound is
    # to be within the tolerance (a 1.9 M-state ME chain at N = 11 stopped at 1.1e-6); one pass, since
    # a chain below B* by its bound stays below it after a re-solve inside that bound
    rest = [e for e in evals if not e.accuracy_ok and tuple(e.B) not in tried]
    if rest:
        tried.update(tuple(e.B) for e in rest)
        new = {tuple(e.B): e for e in map_tasks(_tighten_one, [(spec, opt.N, e, kw) for e in rest],
                                                 executor=executor)}
        evals = [new.get(tuple(e.B), e) for e in evals]
        best = pick_best(evals)
    if not tried:
        return opt
    top = best.throughput_tok_s
    upper = top if opt.exact else max(opt.upper_bound_tok_s, top)
    gap = 0.0 if opt.exact else (max(0.0, (upper - top) / upper) if upper > 0 else opt.gap)
    return _optimum(opt.N, evals, opt.seconds + (time.perf_counter() - t0), certificate=opt.certificate,
                    upper_bound_tok_s=upper, gap=gap, pruned=opt.pruned, pruned_by=dict(opt.pruned_by),
                    unresolved=opt.unresolved, pruned_vectors=opt.pruned_vectors)


def _optimum(N: int, evals: Sequence[Evaluation], seconds: float, **extra) -> Optimum:
    best = pick_best(evals)
    eager = next((e for e in evals if all(b == 1 for b in e.B)), None)
    eager_thr = eager.throughput_tok_s if eager is not None else float("nan")
    return Optimum(N=N, best_B=best.B, throughput_tok_s=best.throughput_tok_s,
                   eager_throughput_tok_s=eager_thr,
                   # no gain is defined when eager commits nothing (e.g. C = 0): NaN, reported as null
                   gain_vs_eager=best.throughput_tok_s / eager_thr if eager_thr > 0 else float("nan"),
                   states=best.states, transitions=best.transitions, residual=best.residual,
                   solver=best.solver, seconds=seconds, evaluated=len(evals), best=best, eager=eager,
                   evaluations=tuple(evals), eager_method="exact" if eager is not None else "none", **extra)


