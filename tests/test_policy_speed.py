"""The fast optimal-policy solver (issue 27, target 3) against the solver it replaced.

The reference is the value iteration of ``optimizer.policy`` before the change (forward Gauss-Seidel sweeps in
blocks of up to 64, ``lam`` moved only at a bracket, ``rtol = 1e-10``), restated here from the kernels it used
(``mdp_sweeps``, ``mdp_bracket``); the new solver must return the same policy value and a valid proven gap."""

import math

import numpy as np
import pytest

from optimizer import _kernels as K
from optimizer import policy as POL
from tr_core.spec import preset


def _old_value_iteration(proc, rtol=1e-10, omega=0.7, max_sweeps=200_000):
    n = proc.n
    per_state = proc.opt_ptr[proc.out_ptr[1:n + 1]] - proc.opt_ptr[proc.out_ptr[:n]]
    terms = int(per_state.max()) + 8
    h = np.zeros(n)
    lam = float(np.sum(proc.g) / np.sum(proc.tau))
    lo_b, hi_b = -math.inf, math.inf
    sweeps, step = 0, 8
    while True:
        K.mdp_sweeps(n, proc.out_ptr, proc.out_prob, proc.opt_ptr, proc.opt_idx, proc.g, proc.tau, h, lam, step, omega)
        sweeps += step
        a, b, mag = K.mdp_bracket(n, proc.out_ptr, proc.out_prob, proc.opt_ptr, proc.opt_idx, proc.g, proc.tau, h)
        err = mag * 4 * terms * np.finfo(np.float64).eps
        lo_b, hi_b = max(lo_b, a - err), min(hi_b, b + err)
        lam = 0.5 * (lo_b + hi_b)
        if hi_b - lo_b <= rtol * abs(hi_b) or sweeps >= max_sweeps:
            return h, lo_b, hi_b, sweeps
        step = min(2 * step, 64)


def _old_optimum(spec, N, proc):
    """The old path's greedy policy: (exact tok/s, its proven relative error, all-policy bound tok/s)."""
    h, _lo, hi, _sw = _old_value_iteration(proc)
    choice, init = POL.greedy(proc, h)
    sol = POL.evaluate_table(spec, N, POL.table_of(proc, choice, init), d=proc.d, dco=proc.dco)
    scale = 1000.0 / spec.delta_ms
    return sol.throughput_per_quantum * scale, sol.throughput_error_bound, hi * scale


def _r2r():
    return preset("r2r", [6.0, 27.9], p=0.35)


CASES = [("r2r-4", _r2r(), 4, False), ("r2r-8", _r2r(), 8, False),
         ("r2r-corun-1.5-4", _r2r().with_corun([1.5, 1.05]), 4, True)]


@pytest.mark.parametrize("name,spec,N,rnd", CASES, ids=[c[0] for c in CASES])
def test_fast_solver_matches_the_old_one(name, spec, N, rnd):
    proc = POL.build_process(spec, N, round_to_grid=rnd)
    T_old, err_old, U_old = _old_optimum(spec, N, proc)
    r = POL.optimal_policy(spec, N, proc=proc, round_to_grid=rnd)
    # the same optimum: the policy's exact chain value, to the chains' proven errors (1e-12 or better here)
    assert r.throughput_tok_s == pytest.approx(T_old, rel=1e-11, abs=0)
    assert r.throughput_error_bound <= 1e-11 and err_old <= 1e-11
    # a valid proven gap: the bound is at least the policy's value, and both bounds agree within the gaps
    assert r.gap <= 1e-6
    assert r.upper_bound_tok_s >= r.throughput_tok_s * (1 - r.throughput_error_bound)
    assert r.upper_bound_tok_s == pytest.approx(U_old, rel=2e-6)
    assert r.lower_bound_tok_s <= r.throughput_tok_s * (1 + 1e-12)
    # the new loop needs far fewer sweeps than the old one's 2,000 or so
    assert r.sweeps < 600


def test_corun_optimum_uses_empty_batches_and_beats_every_class():
    """R2R with co-running 1.5 / 1.05 at N = 4: the fast solver's optimum starts empty batches where it goes and
    beats every compact class member tried (B* as each class, and each class's ascent from B*), by more than
    its proven gap: it is not a class member that a shortcut could have certified."""
    spec, N = _r2r().with_corun([1.5, 1.05]), 4
    proc = POL.build_process(spec, N, round_to_grid=True)
    r = POL.optimal_policy(spec, N, proc=proc, round_to_grid=True)
    assert r.empty_batches and r.gap <= 1e-6
    for cls in ("busy", "residual", "ratio"):
        _p, v, _n = POL.search_class(spec, N, proc, cls, POL.class_start(cls, (2, 3)))
        assert v < r.throughput_tok_s * (1 - 1e-3)


def test_the_bracket_is_a_bound_at_every_stop():
    """Stopped early (a loose rtol or a sweep cap), the bracket still holds the optimum: lower <= optimum <= upper."""
    spec, N = _r2r(), 6
    proc = POL.build_process(spec, N)
    opt = POL.optimal_policy(spec, N, proc=proc).throughput_tok_s / 1e4
    for kw in ({"rtol": 0.3}, {"rtol": 1e-3}, {"max_sweeps": 4}, {"max_sweeps": 12, "every": 3}):
        _h, lo, hi, sw = POL.value_iteration(proc, **kw)
        assert lo <= opt * (1 + 1e-12) and hi >= opt * (1 - 1e-12)
        if "rtol" in kw:
            assert hi - lo <= kw["rtol"] * hi
        else:
            assert sw >= kw["max_sweeps"]
