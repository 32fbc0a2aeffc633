"""Evaluate one threshold vector B for a system spec: the chain's throughput and queue metrics.

Throughput in tokens/s is ``T(B) * 1000 / delta_ms`` (see :mod:`dtmc.reward`);
per-request speed is throughput / N; the mean admission latency of model i
(Little's law) is ``mean_waiting_i / arrival_rate_i``, converted to ms.

Every evaluation carries ``throughput_error_bound`` (relative; it also bounds
the mean waiting and arrival rates, each a ratio of the same kind, and so the
admission latencies to about twice it), ``pi_error_bound`` and
``accuracy_ok`` (bound <= 1e-6); see :mod:`dtmc.solve`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

import dtmc
from tr_core.errors import SolverFailed, SpecError, StateSpaceTooLarge
from tr_core.spec import SystemSpec


@dataclass(frozen=True)
class Evaluation:
    """The chain's prediction for one (spec, N, B)."""

    N: int
    B: tuple[int, ...]
    throughput_tok_s: float
    states: int
    transitions: int
    residual: float
    solver: str
    seconds: float
    mean_waiting: tuple[float, ...]
    admission_latency_ms: tuple[float, ...]
    per_request_tok_s: float
    iterations: int = 0
    recurrent_states: int = 0
    bytes_used: int = 0
    build_seconds: float = 0.0
    assembly_seconds: float = 0.0
    solve_seconds: float = 0.0
    delta_ms: float = 0.1
    roundings: tuple = field(default=(), compare=False)
    cached: bool = field(default=False, compare=False)
    # accuracy: bounds on the l1 error of pi and on the relative error of the throughput (and of
    # the other ratios: waiting, latencies), how they were obtained; inf/"" when unknown (old cache entries)
    pi_error_bound: float = float("inf")
    throughput_error_bound: float = float("inf")
    bound_method: str = ""

    @property
    def accuracy_ok(self) -> bool:
        """Whether the throughput is *proven* within ``dtmc.ACCURACY_TOL`` (1e-6) relative (an estimate never is)."""
        return dtmc.proven_ok(self.throughput_error_bound, self.bound_method)

    def to_dict(self) -> dict:
        return {
            "N": self.N, "B": list(self.B), "throughput_tok_s": self.throughput_tok_s,
            "per_request_tok_s": self.per_request_tok_s,
            "mean_waiting": list(self.mean_waiting),
            "admission_latency_ms": [None if not np.isfinite(x) else x for x in self.admission_latency_ms],
            "states": self.states, "transitions": self.transitions, "recurrent_states": self.recurrent_states,
            "residual": self.residual, "solver": self.solver, "iterations": self.iterations,
            "seconds": self.seconds, "bytes_used": self.bytes_used, "cached": self.cached,
            "pi_error_bound": _finite_or_none(self.pi_error_bound),
            "throughput_error_bound": _finite_or_none(self.throughput_error_bound),
            "bound_method": self.bound_method, "accuracy_ok": self.accuracy_ok,
        }


def _finite_or_none(x: float):
    """JSON has no infinity: an unknown bound is written as null."""
    return float(x) if np.isfinite(x) else None


def check_thresholds(spec: SystemSpec, N: int, B) -> tuple[int, ...]:
    """Validate a threshold vector for ``spec`` at concurrency ``N`` (the rule of :mod:`tr_core.feasibility`)."""
    from tr_core.feasibility import check_thresholds as check
    return check(B, N, spec.M)


def check_representable(spec: SystemSpec, N: int, name: str = "N") -> None:
    """Refuse (exit code 3), before any work, a concurrency whose chain states cannot be represented (packed
    keys of ``dtmc.KEY_BITS`` bits): a sweep or table up to such an N would work for hours and then fail."""
    # rounded here whatever the caller rounds: an off-grid latency is reported by the N that meets it (with
    # the rows before it kept); only the size of the longest duration matters for the key.  The table is
    # built only up to 10^6 (its size grows with N): above, batch size 1's durations bound it from below.
    N = int(N)
    d, _ = spec.quanta_table(N if spec.batch_dependent and N <= 10 ** 6 else 1, round_to_grid=True)
    dmax = int(d.max())
    need = dtmc.key_bits(spec.M, N, dmax)
    if need > dtmc.KEY_BITS:
        top = dtmc.max_packed_n(spec.M, dmax)
        raise StateSpaceTooLarge(f"{name} = {int(N):,} is beyond what the exact chain can hold: a state of this "
                                 f"system needs {need} bits, more than {dtmc.KEY_BITS}; the largest N it can be "
                                 f"solved at is {top:,} with delta = {spec.delta_ms:g} ms (a coarser delta allows "
                                 f"more)")


def cache_entry(cache, spec: SystemSpec, N: int, B, *, solver: str = "auto", tol: float | None = None,
                max_states: int | None = None, round_to_grid: bool = False, **_):
    """``(cache, key)``: the result cache (a folder path or :class:`optimizer.cache.ResultCache`) and the key
    under which :func:`evaluate_thresholds` keeps the evaluation of ``(spec, N, B)`` with these options (the
    defaults filled in as it fills them).  Other evaluation options (``cache`` itself) are ignored."""
    from optimizer.cache import ResultCache, evaluation_key

    if not isinstance(cache, ResultCache):
        cache = ResultCache(cache)
    tol = dtmc.DEFAULT_TOL if tol is None else float(tol)
    max_states = dtmc.DEFAULT_MAX_STATES if max_states is None else int(max_states)
    return cache, evaluation_key(spec, N, tuple(B), solver, tol, max_states, round_to_grid)


def evaluate_thresholds(spec: SystemSpec, N: int, B, *, solver: str = "auto", tol: float | None = None,
                        max_states: int | None = None, round_to_grid: bool = False,
                        cache=None, tighten: bool = False) -> Evaluation:
    """Throughput and queue metrics of delayed batching with thresholds ``B`` at concurrency ``N``.

    ``cache``: a folder path or :class:`optimizer.cache.ResultCache`; results
    are looked up and stored there (keyed by everything that affects them).
    ``tighten``: more effort on the error bound (a search's rival of B*, see
    :func:`optimizer.optimum.tighten_rivals`): a cached result is used only when
    its accuracy is proven, and the new result replaces the cached one under the
    same key when its bound is at least as tight (the next run then reads the
    tightened result).
    """
    Bt = check_thresholds(spec, N, B)
    if solver not in dtmc.SOLVERS:
        raise SpecError(f"--solver must be one of {', '.join(dtmc.SOLVERS)}, got {solver!r}")
    tol = dtmc.DEFAULT_TOL if tol is None else float(tol)
    max_states = dtmc.DEFAULT_MAX_STATES if max_states is None else int(max_states)
    try:
        low = dtmc.lower_system(spec, int(N), round_to_grid=round_to_grid)
    except dtmc.DTMCError as e:
        raise SpecError(str(e)) from None
    key = None
    if cache is not None:
        cache, key = cache_entry(cache, spec, N, Bt, solver=solver, tol=tol, max_states=max_states,
                                 round_to_grid=round_to_grid)
        hit = cache.get(key, Evaluation, expect=(int(N), Bt))
        if hit is not None and (not tighten or hit.accuracy_ok):
            return hit
    t0 = time.perf_counter()
    try:
        # the chain's public entry takes arrays: it is handed the lowered ones and only checks them again
        # (no table is rebuilt; the outcome table is cached per N and P)
        sol = dtmc.solve_chain(low.P, low.C, low.d, low.N, Bt, caps=low.caps, solver=solver,
                               tol=tol, max_states=max_states, dco=low.dco, tighten=bool(tighten))
    except dtmc.StateLimitExceeded as e:
        if e.transitions:
            raise StateSpaceTooLarge(
                f"N = {N}, B = {Bt}: the chain has more than {e.max_transitions:,} transitions (about "
                f"{e.max_transitions * 40 / 2**30:.0f} GiB at the peak); lower N, use a coarser --delta-ms, "
                f"or use the simulator (--method simulate)") from None
        # The enumeration stopped at the limit, so only "more than max_states" is known; the a-priori
        # count (every residual combination) is a valid but often very loose ceiling: say which is which.
        raise StateSpaceTooLarge(
            f"N = {N}, B = {Bt}: the chain has more than max_states = {e.max_states:,} reachable states "
            f"(the enumeration stopped there; the a-priori ceiling {e.estimate:,} counts every residual "
            f"combination and is usually far above the reachable count); "
            f"lower N, use a coarser --delta-ms, raise --max-states, or use the simulator") from None
    except dtmc.SolveFailed as e:
        # a valid chain the solver could not finish (not bad input): exit code 3, with what to do
        raise SolverFailed(f"N = {N}, B = {Bt}: {e}") from None
    except dtmc.DTMCError as e:
        raise SpecError(str(e)) from None
    seconds = time.perf_counter() - t0
    q_per_ms = 1.0 / spec.delta_ms
    thr = sol.throughput_per_quantum * 1000.0 * q_per_ms
    lam = sol.arrival_rate_per_quantum
    with np.errstate(divide="ignore", invalid="ignore"):
        wait_q = np.where(lam > 0, sol.mean_waiting / np.where(lam > 0, lam, 1.0), np.nan)
    adm = tuple(float(x) * spec.delta_ms for x in wait_q)
    ev = Evaluation(
        N=int(N), B=Bt, throughput_tok_s=float(thr), states=sol.states, transitions=sol.transitions,
        residual=float(sol.residual), solver=sol.solver, seconds=seconds,
        mean_waiting=tuple(float(x) for x in sol.mean_waiting), admission_latency_ms=adm,
        per_request_tok_s=float(thr) / int(N), iterations=sol.iterations,
        recurrent_states=sol.recurrent_states, bytes_used=sol.bytes_used,
        build_seconds=sol.build_seconds, assembly_seconds=sol.assembly_seconds,
        solve_seconds=sol.solve_seconds, delta_ms=spec.delta_ms, roundings=low.roundings,
        pi_error_bound=float(sol.pi_error_bound), throughput_error_bound=float(sol.throughput_error_bound),
        bound_method=sol.bound_method)
    if cache is not None and key is not None:
        old = hit if tighten else None
        if old is None or not (old.throughput_error_bound < ev.throughput_error_bound):
            cache.put(key, ev)
    return ev
