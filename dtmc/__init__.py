"""Exact delayed-batching Markov chain: reachable states, transitions, stationary solve, rewards.

This package imports nothing else of the project; it works on plain NumPy
arrays (routing matrix ``P``, committed tokens ``C``, durations ``d`` in quanta,
thresholds ``B``).  See :mod:`dtmc.chain` for the semantics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from dtmc.chain import (BYTES_PER_STATE, BYTES_PER_TRANSITION, DEFAULT_MAX_STATES, DEFAULT_MAX_TRANSITIONS,
                        Chain, DTMCError,
                        StateLimitExceeded, build_chain, build_policy_chain, policy_configs, policy_keys, state_bound, KEY_BITS,
                        key_bits, max_packed_n)
from dtmc.lowering import LoweredSystem, lower_arrays, lower_system, outcome_table
from dtmc.reward import arrival_rate_per_quantum, mean_waiting, throughput_per_quantum
from dtmc.solve import (ACCURACY_TARGET, ACCURACY_TOL, DEFAULT_TOL, SOLVERS, SolveFailed, StationaryResult,
                        bound_error, bracket_error, chain_bracket, closed_classes, gth, relative_values, residual,
                        solver_help, stationary_distribution, throughput_bound, throughput_bracket)

__all__ = ["KEY_BITS", "key_bits", "max_packed_n", "LoweredSystem", "lower_system", "lower_arrays", "outcome_table",
    "Chain", "DTMCError", "StateLimitExceeded", "SolveFailed", "StationaryResult", "ChainSolution",
    "build_chain", "build_policy_chain", "solve_policy_chain", "policy_configs", "policy_keys", "state_bound",
    "stationary_distribution", "closed_classes", "residual",
    "throughput_per_quantum", "mean_waiting", "arrival_rate_per_quantum", "solve_chain", "proven_ok",
    "bound_error", "throughput_bound", "throughput_bracket", "chain_bracket", "relative_values", "bracket_error",
    "gth", "solver_help", "ACCURACY_TARGET", "ACCURACY_TOL",
    "SOLVERS", "DEFAULT_TOL", "DEFAULT_MAX_STATES", "DEFAULT_MAX_TRANSITIONS", "BYTES_PER_STATE", "BYTES_PER_TRANSITION",
]


@dataclass(frozen=True)
class ChainSolution:
    """Everything one evaluation of a chain yields (times in quanta)."""

    N: int
    B: tuple[int, ...]
    throughput_per_quantum: float
    mean_waiting: np.ndarray
    arrival_rate_per_quantum: np.ndarray
    states: int
    transitions: int
    recurrent_states: int
    residual: float
    solver: str
    iterations: int
    build_seconds: float
    assembly_seconds: float
    solve_seconds: float
    bytes_used: int
    pi: np.ndarray | None = None
    # bounds on the relative error of every recurrent pi component and of the throughput (and of the
    # other ratios: mean waiting, arrival rates, admission latencies); inf when none could be established
    pi_error_bound: float = float("inf")
    throughput_error_bound: float = float("inf")
    bound_method: str = ""

    @property
    def accuracy_ok(self) -> bool:
        """Whether the throughput is *proven* within ``ACCURACY_TOL`` (1e-6) relative (an estimate never is)."""
        return proven_ok(self.throughput_error_bound, self.bound_method)

    @property
    def seconds(self) -> float:
        return self.build_seconds + self.assembly_seconds + self.solve_seconds


def proven_ok(throughput_error_bound: float, bound_method: str) -> bool:
    """``accuracy_ok``: a proven bound (not an ``estimate: ...``) of at most ``ACCURACY_TOL``."""
    return bool(throughput_error_bound <= ACCURACY_TOL and not str(bound_method).startswith("estimate"))


def _ratio_bound(pi, err, log_bound, g, tau, n) -> float:
    """Relative error bound of ``sum(pi g) / sum(pi tau)`` when ``|pi - y| <= err`` and ``y`` is within
    ``exp(+-log_bound)`` of the exact vector componentwise (GTH's rounding analysis)."""
    if not np.isfinite(log_bound):
        return float("inf")
    e1 = float(err.sum())
    dg = (float(np.sum(err * g)) / max(float(np.sum(pi * g)), 1e-300) + e1) * (1 + 1e-12)
    dt = (float(np.sum(err * tau)) / float(np.sum(pi * tau)) + e1) * (1 + 1e-12)
    if dt >= 1.0:
        return float("inf")
    back = (dg + dt) / (1.0 - dt)
    gam = n * 2.0 ** -53 / (1.0 - n * 2.0 ** -53)
    return float((1.0 + back) * np.exp(2.0 * log_bound + 4.0 * gam) - 1.0)


def solve_chain(P, C, d, N, B, caps=None, *, solver: str = "auto", tol: float = DEFAULT_TOL,
                max_states: int = DEFAULT_MAX_STATES, keep_pi: bool = False, x0=None,
                max_transitions: int = DEFAULT_MAX_TRANSITIONS, dco=None, tighten: bool = False) -> ChainSolution:
    """Build the chain for (P, C, d, N, B, caps), solve it and compute its rewards.

    ``dco``: co-running durations (see :func:`build_chain`); ``None`` for the solo chain.  ``tighten``:
    more effort on the error bound (see :func:`dtmc.solve.stationary_distribution`)."""
    chain = build_chain(P, C, d, N, B, caps=caps, max_states=max_states, max_transitions=max_transitions,
                        dco=dco)
    return _solve_built(chain, solver, tol, keep_pi, x0, tighten=tighten)


def solve_policy_chain(P, C, d, N, states, launch, caps=None, *, solver: str = "auto", tol: float = DEFAULT_TOL,
                       max_states: int = DEFAULT_MAX_STATES, keep_pi: bool = False, x0=None,
                       max_transitions: int = DEFAULT_MAX_TRANSITIONS, dco=None) -> ChainSolution:
    """:func:`solve_chain` for the chain under a launch-policy table (see :func:`build_policy_chain`);
    the result's ``B`` is ``()``."""
    chain = build_policy_chain(P, C, d, N, states, launch, caps=caps, max_states=max_states,
                               max_transitions=max_transitions, dco=dco)
    return _solve_built(chain, solver, tol, keep_pi, x0)


def _solve_built(chain: Chain, solver: str, tol: float, keep_pi: bool, x0, tighten: bool = False) -> ChainSolution:
    t0 = time.perf_counter()
    st = stationary_distribution(chain.T, solver=solver, tol=tol, x0=x0, tighten=tighten,
                                 rewards=(chain.g, chain.tau))
    pi = st.pi
    thr = throughput_per_quantum(pi, chain.g, chain.tau)
    mw = mean_waiting(pi, chain.tau, chain.waiting)
    lam = arrival_rate_per_quantum(pi, chain.tau, chain.arrivals)
    if st.pi_alt is not None:
        # no proven bound: ten times the difference of two independent GTH solves (an estimate)
        alt = throughput_per_quantum(st.pi_alt, chain.g, chain.tau)
        # (and never below the pi estimate: two vectors far apart that happen to agree on one ratio
        # prove nothing about it)
        thr_bound = max(float(10.0 * abs(thr - alt) / max(abs(thr), 1e-300) + 1e-15), st.error_bound)
    elif st.abs_error is not None:
        thr_bound = _ratio_bound(pi, st.abs_error, st.log_bound, chain.g, chain.tau, st.n_recurrent)
    else:
        thr_bound = throughput_bound(st.error_bound, st.n_recurrent)
    how = st.bound_method
    if st.throughput_bracket is not None:
        # the relative-value bracket bounds the throughput alone (pi_error_bound keeps the pi bound); it is
        # proven, so it also replaces an estimate from two GTH orders
        b = bracket_error(st.throughput_bracket, thr)
        if b < thr_bound or (st.pi_alt is not None and np.isfinite(b)):
            thr_bound, how = b, "relative-value bracket (throughput)"
    t1 = time.perf_counter()
    return ChainSolution(N=chain.N, B=chain.B, throughput_per_quantum=thr, mean_waiting=mw,
                         arrival_rate_per_quantum=lam, states=chain.n_states, transitions=chain.n_transitions,
                         recurrent_states=st.n_recurrent, residual=st.residual, solver=st.solver,
                         iterations=st.iterations, build_seconds=chain.build_seconds,
                         assembly_seconds=chain.assembly_seconds, solve_seconds=t1 - t0,
                         bytes_used=chain.bytes_used, pi=pi if keep_pi else None,
                         pi_error_bound=st.error_bound,
                         throughput_error_bound=thr_bound,
                         bound_method=how)
