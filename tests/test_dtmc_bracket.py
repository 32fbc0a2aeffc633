"""The relative-value bracket of a chain's throughput (bound 2 of docs/model.md) as the solve applies it."""

import numpy as np
import pytest

import dtmc
import dtmc.solve
from dtmc.chain import build_chain
from optimizer.evaluate import evaluate_thresholds
from tr_model import preset


def _chain(spec, N, B):
    low = dtmc.lower_system(spec, N)
    return build_chain(low.P, low.C, low.d, low.N, B, caps=low.caps, dco=low.dco)


def _gth_throughput(ch):
    st = dtmc.stationary_distribution(ch.T, solver="gth")
    return float(st.pi @ ch.g) / float(st.pi @ ch.tau)


@pytest.mark.parametrize("seed", range(12))
def test_bracket_holds_the_exact_throughput_from_any_pi(seed):
    """Random two-model systems: the bracket from the exact pi is within rounding of GTH's throughput, and the
    bracket from a badly perturbed pi still holds it (it is valid for any h)."""
    rng = np.random.default_rng(seed)
    p = float(rng.uniform(0.05, 0.95))
    L = sorted(round(float(x), 1) for x in rng.uniform(0.3, 3.0, size=2))
    spec = preset("r2r", L, p=p)
    N = int(rng.integers(2, 9))
    B = (int(rng.integers(1, N + 1)), int(rng.integers(1, 3)))
    if not sum(b - 1 for b in B) < N:
        B = (1, 1)
    ch = _chain(spec, N, B)
    exact = _gth_throughput(ch)
    st = dtmc.stationary_distribution(ch.T, solver="gth")
    lo, hi = dtmc.throughput_bracket(ch.T, ch.g, ch.tau, st.pi)
    assert lo <= exact <= hi
    assert (hi - lo) / exact <= 1e-9
    bad = st.pi * rng.uniform(0.2, 5.0, size=st.pi.size)
    bad /= bad.sum()
    lo2, hi2 = dtmc.throughput_bracket(ch.T, ch.g, ch.tau, bad)
    assert lo2 <= exact * (1 + 1e-12) and exact <= hi2 * (1 + 1e-12)
    assert dtmc.bracket_error((lo, hi), exact) <= 1e-9


def test_loose_iterate_gets_a_bracket_that_holds_the_truth(monkeypatch):
    """A nearly decomposable chain (p = 0.999) whose Anderson iterate is percent-level wrong, with GTH not
    allowed: the result's throughput bound is the bracket's, finite, and covers the distance to GTH's value."""
    spec = preset("r2r", [6.0, 27.9], p=0.999)
    exact = evaluate_thresholds(spec, 16, (1, 8), solver="gth")
    monkeypatch.setattr(dtmc.solve, "GTH_MAX_WORK", 0.0)
    monkeypatch.setattr(dtmc.solve, "GTH_CHEAP_WORK", 0.0)
    ev = evaluate_thresholds(spec, 16, (1, 8))
    assert ev.bound_method == "relative-value bracket (throughput)"
    assert np.isfinite(ev.throughput_error_bound) and not ev.accuracy_ok
    err = abs(ev.throughput_tok_s / exact.throughput_tok_s - 1.0)
    assert err > 1e-6      # the iterate really is off, so the check below has teeth
    assert err <= ev.throughput_error_bound


def test_bracket_off_leaves_the_pi_bound(monkeypatch):
    """With the bracket disabled the same chain reports the pi bound's method."""
    monkeypatch.setattr(dtmc.solve, "GTH_MAX_WORK", 0.0)
    monkeypatch.setattr(dtmc.solve, "GTH_CHEAP_WORK", 0.0)
    monkeypatch.setattr(dtmc.solve, "_bracket_if_loose", lambda *a: None)
    ev = evaluate_thresholds(preset("r2r", [6.0, 27.9], p=0.999), 16, (1, 8))
    assert ev.bound_method != "relative-value bracket (throughput)" and not ev.accuracy_ok


def test_server_scale_chain_is_proven_within_the_target():
    """R2R at N = 256 near B*: the tree bound of the converged iterate is about 1e-3 (improbable states not
    converged relatively); the bracket proves the throughput within ACCURACY_TARGET, and the value lies in
    the independent value-iteration bracket of the one-vector box (which starts from h = 0)."""
    from optimizer.bounds import box_bound

    spec = preset("r2r", [6.0, 27.9], p=0.35)
    ev = evaluate_thresholds(spec, 256, (25, 142))
    assert ev.pi_error_bound > 1e-6        # the pi bound alone would flag it
    assert ev.bound_method == "relative-value bracket (throughput)"
    assert ev.throughput_error_bound <= dtmc.ACCURACY_TARGET and ev.accuracy_ok
    r = box_bound(spec, 256, (25, 142), (25, 142), rtol=2e-7, max_sweeps=20_000, max_step=64)
    assert r.status == "ok"
    assert r.lower_tok_s * (1 - 1e-12) <= ev.throughput_tok_s <= r.upper_tok_s * (1 + 1e-12)
    assert (r.upper_tok_s - r.lower_tok_s) / ev.throughput_tok_s <= 1e-6


def test_solve_without_rewards_has_no_bracket():
    """stationary_distribution alone (no rewards) never computes a bracket."""
    ch = _chain(preset("r2r", [6.0, 27.9], p=0.35), 8, (1, 2))
    st = dtmc.stationary_distribution(ch.T)
    assert st.throughput_bracket is None


def test_one_rule_for_the_bracket():
    """optimizer.bounds re-exports the solve's bracket (one rule, in dtmc.solve)."""
    from optimizer.bounds import chain_bracket, relative_values
    assert chain_bracket is dtmc.chain_bracket and relative_values is dtmc.relative_values


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("memory", [0, 4])
def test_iterated_relative_values_give_a_bracket_that_holds_the_truth(seed, memory, monkeypatch):
    """Random two-model systems, plain and Anderson-mixed relative value iteration: the bracket of the
    iterated h holds GTH's throughput at every sweep count (one sweep: wide, still valid), and a converged
    iteration is as tight as the LU solve's."""
    monkeypatch.setattr(dtmc.solve, "BRACKET_GS_MEMORY", memory)
    rng = np.random.default_rng(100 + seed)
    p = float(rng.uniform(0.05, 0.95))
    L = sorted(round(float(x), 1) for x in rng.uniform(0.3, 3.0, size=2))
    spec = preset("r2r", L, p=p)
    N = int(rng.integers(2, 10))
    B = (int(rng.integers(1, N + 1)), 1)
    ch = _chain(spec, N, B)
    exact = _gth_throughput(ch)
    pi = dtmc.stationary_distribution(ch.T, solver="gth").pi
    for sweeps in (1, 3, 600):
        h = dtmc.relative_values(ch.T, ch.g, ch.tau, pi, method="gauss-seidel", max_sweeps=sweeps)
        lo, hi = dtmc.chain_bracket(ch.T, ch.g, ch.tau, h)
        assert lo <= exact * (1 + 1e-12) and exact <= hi * (1 + 1e-12)
    lu = dtmc.chain_bracket(ch.T, ch.g, ch.tau, dtmc.relative_values(ch.T, ch.g, ch.tau, pi))
    assert (hi - lo) / exact <= max(1e-9, 10 * (lu[1] - lu[0]) / exact)


def test_slow_iteration_falls_back_to_the_lu_and_intersects(monkeypatch):
    """With the iteration allowed one sweep, the bracket is the LU's (intersected with the wide iterated
    one): as tight as the LU alone, and holding the exact value."""
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    ch = _chain(spec, 24, (2, 12))
    pi = dtmc.stationary_distribution(ch.T, solver="gth").pi
    exact = _gth_throughput(ch)
    monkeypatch.setattr(dtmc.solve, "BRACKET_GS_SWEEPS", 1)
    lo, hi = dtmc.throughput_bracket(ch.T, ch.g, ch.tau, pi)
    wide = dtmc.chain_bracket(ch.T, ch.g, ch.tau, dtmc.relative_values(ch.T, ch.g, ch.tau, pi, method="gauss-seidel",
                                                                       max_sweeps=1))
    assert dtmc.bracket_error(wide, exact) > 1e-6          # one sweep alone would not do
    assert lo <= exact <= hi and dtmc.bracket_error((lo, hi), exact) <= 1e-9


def test_relative_values_refuses_an_unknown_method():
    ch = _chain(preset("r2r", [6.0, 27.9], p=0.35), 4, (1, 2))
    with pytest.raises(ValueError, match="method"):
        dtmc.relative_values(ch.T, ch.g, ch.tau, np.full(ch.T.shape[0], 1.0 / ch.T.shape[0]), method="cg")


def test_chain_over_the_lu_cap_keeps_the_iterated_bracket(monkeypatch):
    """A chain above the LU's state cap still gets the iterated bracket (never the LU): tight where the
    iteration converges, wide but valid where it is cut short."""
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    ch = _chain(spec, 24, (2, 12))
    pi = dtmc.stationary_distribution(ch.T, solver="gth").pi
    exact = _gth_throughput(ch)
    real = dtmc.solve.relative_values

    def no_lu(*a, method="direct", **k):
        assert method != "direct", "the LU ran above its cap"
        return real(*a, method=method, **k)

    monkeypatch.setattr(dtmc.solve, "relative_values", no_lu)
    lo, hi = dtmc.throughput_bracket(ch.T, ch.g, ch.tau, pi, direct=False)
    assert lo <= exact <= hi and dtmc.bracket_error((lo, hi), exact) <= 1e-9
    monkeypatch.setattr(dtmc.solve, "BRACKET_GS_SWEEPS", 1)
    lo, hi = dtmc.throughput_bracket(ch.T, ch.g, ch.tau, pi, direct=False)
    assert lo <= exact * (1 + 1e-12) and exact <= hi * (1 + 1e-12) and dtmc.bracket_error((lo, hi), exact) > 1e-6
    # the whole evaluation: the server-scale chain over a cap of 0 states is still proven by the iteration
    monkeypatch.setattr(dtmc.solve, "BRACKET_GS_SWEEPS", 600)
    monkeypatch.setattr(dtmc.solve, "BRACKET_MAX_STATES", 0)
    ev = evaluate_thresholds(spec, 256, (25, 142))
    assert ev.bound_method == "relative-value bracket (throughput)"
    assert ev.throughput_error_bound <= dtmc.ACCURACY_TARGET and ev.accuracy_ok


def test_relative_values_converge_in_a_few_sweeps_where_the_clock_runs_against_a_forward_sweep():
    """R2R at N = 16, eager: the deterministic countdown of each residual runs against the enumeration's
    order, which a forward Gauss-Seidel sweep moves one tick at a time (it had stalled at a bracket of 4e-4
    after 400 sweeps); the backward sweep tried first brings the bracket within 1e-9 in 40 sweeps."""
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    ch = _chain(spec, 16, (1, 1))
    exact = _gth_throughput(ch)
    pi = dtmc.stationary_distribution(ch.T, solver="gth").pi
    h = dtmc.relative_values(ch.T, ch.g, ch.tau, pi, method="gauss-seidel", max_sweeps=40)
    lo, hi = dtmc.chain_bracket(ch.T, ch.g, ch.tau, h)
    assert lo <= exact * (1 + 1e-12) and exact <= hi * (1 + 1e-12)
    assert (hi - lo) / exact <= 1e-9
