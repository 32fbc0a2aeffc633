"""Proven bounds: each is >= the exact throughput of every vector of its family, on many random systems."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import dtmc
from optimizer.bounds import Bounder, chain_bracket, gap, no_wait_bound, relative_values
from optimizer.evaluate import evaluate_thresholds
from tr_core import feasibility as F
from tr_core.errors import SpecError
from tr_core.spec import LatencyCurve, make_spec, preset


@st.composite
def systems(draw, max_m=3, min_ms=1, max_ms=4):
    """Small random systems on a 1 ms grid: positive routing rows, random tokens, optional caps and curves."""
    M = draw(st.integers(2, max_m))
    rows = []
    for _ in range(M):
        w = [draw(st.integers(0, 5)) for _ in range(M)]
        if sum(w) == 0:
            w[draw(st.integers(0, M - 1))] = 1
        rows.append([x / sum(w) for x in w])
    C = [[draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])) for _ in range(M)] for _ in range(M)]
    L = [float(draw(st.integers(min_ms, max_ms))) for _ in range(M)]
    caps = None
    if draw(st.booleans()):
        caps = [draw(st.sampled_from([None, 1, 2, 3])) for _ in range(M)]
    curves = None
    if draw(st.booleans()):
        curves = [None if draw(st.booleans()) else LatencyCurve("affine", intercept_ms=L[i], per_request_ms=1.0)
                  for i in range(M)]
    return make_spec(L, rows, C, delta_ms=1.0, latency_curves=curves, max_batch_size=caps)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(systems(), st.integers(1, 3))
def test_no_wait_bound_holds_for_every_feasible_vector(spec, N):
    bound = no_wait_bound(spec, N).value_tok_s
    bounder = Bounder(spec, N)
    for B in F.iter_feasible(N, spec.M):
        try:
            ev = evaluate_thresholds(spec, N, B)
        except SpecError:  # e.g. several closed classes: refused by the chain, so nothing to bound
            continue
        assert ev.throughput_tok_s <= bound * (1 + 1e-9) + 1e-9
        assert ev.throughput_tok_s <= bounder.vector_bound(B).value_tok_s * (1 + 1e-9) + 1e-9


def test_no_wait_bound_is_exact_for_one_request():
    """N = 1: a lone request never waits; T = 1000 / (L0 + p L1) for R2R."""
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    assert no_wait_bound(spec, 1).value_tok_s == pytest.approx(1000 / (6.0 + 0.35 * 27.9), rel=1e-8)
    assert evaluate_thresholds(spec, 1, (1, 1)).throughput_tok_s == pytest.approx(
        no_wait_bound(spec, 1).value_tok_s, rel=1e-8)
    # above N = 1 requests wait: the bound is strict
    assert evaluate_thresholds(spec, 4, (1, 3)).throughput_tok_s < no_wait_bound(spec, 4).value_tok_s * 0.9


def _chain(spec, N, B):
    d, _ = spec.quanta_table(N)
    ch = dtmc.build_chain(spec.P, spec.C, d, N, B, caps=spec.caps(N))
    pi = dtmc.stationary_distribution(ch.T, solver="direct").pi
    return ch, pi


@pytest.mark.parametrize("N,B", [(3, (1, 1)), (4, (1, 3)), (5, (2, 2))])
def test_chain_bracket_contains_the_throughput(N, B):
    spec = preset("r2r", [6.0, 27.9], p=0.35).with_delta(0.1)
    ch, pi = _chain(spec, N, B)
    T = float(pi @ ch.g) / float(pi @ ch.tau)
    h = relative_values(ch.T, ch.g, ch.tau, pi)
    lo, hi = chain_bracket(ch.T, ch.g, ch.tau, h)
    assert lo <= T <= hi and hi - lo <= 1e-9 * T        # tight with the chain's own relative values
    rng = np.random.default_rng(N)
    for _ in range(5):                                   # valid (if loose) whatever h is
        lo, hi = chain_bracket(ch.T, ch.g, ch.tau, h + rng.normal(0, 50, size=h.shape))
        assert lo <= T <= hi


def test_gap_definition():
    assert gap(100.0, 100.0) == 0.0
    assert gap(100.0, 99.5) == pytest.approx(0.005)


# ---------------------------------------------------------------- decision-process (family) bounds

from optimizer.bounds import PolicyBounds, box_bound, policy_bound, scaling_valid  # noqa: E402


def _all_throughputs(spec, N):
    out = {}
    for B in F.iter_feasible(N, spec.M):
        try:
            out[B] = evaluate_thresholds(spec, N, B).throughput_tok_s
        except SpecError:  # e.g. several closed classes: refused by the chain, nothing to bound
            pass
    return out


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(systems(max_m=3), st.integers(1, 4), st.data())
def test_box_bound_holds_for_every_vector_in_the_box(spec, N, data):
    M = spec.M
    lo = tuple(data.draw(st.integers(1, N)) for _ in range(M))
    hi = tuple(data.draw(st.integers(a, N)) for a in lo)
    r = box_bound(spec, N, lo, hi, max_sweeps=400)
    inside = {B: v for B, v in _all_throughputs(spec, N).items() if all(a <= b <= c for a, b, c in zip(lo, B, hi))}
    if F.is_feasible(lo, N):   # then launching wherever allowed always keeps a model running
        assert r.status == "ok"
    if r.status == "ok":
        for B, v in inside.items():
            assert v <= r.upper_tok_s * (1 + 1e-9) + 1e-9, (B, v, r)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(systems(max_m=2), st.integers(1, 3))
def test_policy_bound_holds_for_every_vector_and_scales(spec, n):
    r = policy_bound(spec, n, max_sweeps=600)
    assert r.status == "ok"
    for v in _all_throughputs(spec, n).values():
        assert v <= r.upper_tok_s * (1 + 1e-9) + 1e-9
    table = PolicyBounds(spec)
    table.values[n] = r
    N = n + 2
    b = table.bound(N)
    if scaling_valid(spec, N):
        assert b is not None and b.value_tok_s == pytest.approx(r.upper_tok_s * N / n)
        for v in _all_throughputs(spec, N).values():
            assert v <= b.value_tok_s * (1 + 1e-9) + 1e-9
    else:
        assert b is None


def test_policy_bound_is_tight_where_thresholds_are_optimal():
    """R2R: N = 1 and 2 have no better launch policy than the best thresholds; at N = 8 it is within 2 %."""
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    assert policy_bound(spec, 1).upper_tok_s == pytest.approx(63.4317, abs=1e-3)
    assert policy_bound(spec, 2).upper_tok_s == pytest.approx(110.3227, abs=1e-3)
    best8 = max(_all_throughputs(spec, 8).values())
    up8 = policy_bound(spec, 8).upper_tok_s
    assert best8 <= up8 <= best8 * 1.02
    # the box of one vector is that vector's chain: the bound brackets its throughput tightly
    r = box_bound(spec, 6, (1, 4), (1, 4))
    assert r.upper_tok_s == pytest.approx(evaluate_thresholds(spec, 6, (1, 4)).throughput_tok_s, rel=1e-5)


# ---------------------------------------------------------------- the coarse clock (bound 5)

from optimizer.bounds import coarse_durations  # noqa: E402
from optimizer.branch import auto_coarse  # noqa: E402


def fine_systems(max_m=3):
    """Random systems whose steps span 3-7 quanta, so a slot of 2 or 3 quanta is a real coarsening."""
    return systems(max_m=max_m, min_ms=3, max_ms=7)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fine_systems(), st.integers(1, 4), st.sampled_from([2, 3]), st.data())
def test_coarse_clock_bound_holds_for_every_vector_in_the_box(spec, N, c, data):
    M = spec.M
    lo = tuple(data.draw(st.integers(1, N)) for _ in range(M))
    hi = tuple(data.draw(st.integers(a, N)) for a in lo)
    r = box_bound(spec, N, lo, hi, coarse=c, max_sweeps=400)
    inside = {B: v for B, v in _all_throughputs(spec, N).items() if all(a <= b <= c_ for a, b, c_ in zip(lo, B, hi))}
    if F.is_feasible(lo, N):
        assert r.status == "ok"
    if r.status == "ok":
        for B, v in inside.items():
            assert v <= r.upper_tok_s * (1 + 1e-9) + 1e-9, (B, v, r)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fine_systems(), st.integers(2, 5), st.sampled_from([2, 3]), st.data())
def test_sub_box_cut_from_a_parent_is_the_sub_box_process(spec, N, c, data):
    """A sub-box's process cut out of its parent's (bound 5 reused by the bisection) has the states and the
    converged bound of the sub-box's own enumeration, deadlocks included."""
    M = spec.M
    lo = tuple(data.draw(st.integers(1, N)) for _ in range(M))
    hi = tuple(data.draw(st.integers(a, N)) for a in lo)
    parent = box_bound(spec, N, lo, hi, coarse=c, max_sweeps=50, keep=True)
    if parent.status != "ok":
        return
    assert parent.process is not None and parent.process.holds(N, lo, hi, c)
    sub_lo = tuple(data.draw(st.integers(a, b)) for a, b in zip(lo, hi))
    sub_hi = tuple(data.draw(st.integers(a, b)) for a, b in zip(sub_lo, hi))
    own = box_bound(spec, N, sub_lo, sub_hi, coarse=c, rtol=1e-10, max_sweeps=4000)
    cut = box_bound(spec, N, sub_lo, sub_hi, coarse=c, rtol=1e-10, max_sweeps=4000, parent=parent.process)
    assert cut.status == own.status
    if own.status == "ok":
        assert cut.states == own.states
        assert cut.upper_tok_s == pytest.approx(own.upper_tok_s, rel=1e-8, abs=1e-9)
        inside = {B: v for B, v in _all_throughputs(spec, N).items()
                  if all(a <= b <= c_ for a, b, c_ in zip(sub_lo, B, sub_hi))}
        for B, v in inside.items():
            assert v <= cut.upper_tok_s * (1 + 1e-9) + 1e-9, (B, v, cut)
    # a box that is not inside the parent is enumerated, not cut
    wider = tuple(max(1, a - 1) for a in lo), tuple(b + 1 for b in hi)
    if wider != (lo, hi):
        assert not parent.process.holds(N, *wider, c)


def test_coarse_clock_on_r2r_is_valid_and_close():
    """R2R (steps of 60 and 279 quanta): slots of 12 and 30 quanta bound every vector of the box, a little
    above the fine bound, with fewer states; a slot longer than a step is refused."""
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    N, lo, hi = 6, (1, 1), (6, 6)
    best = max(v for B, v in _all_throughputs(spec, N).items())
    fine = box_bound(spec, N, lo, hi)
    c12 = box_bound(spec, N, lo, hi, coarse=12)
    c30 = box_bound(spec, N, lo, hi, coarse=30)
    assert best <= fine.upper_tok_s * (1 + 1e-9)
    # every fine policy is a policy of the coarse process, so its optimum is at least the fine one
    assert fine.upper_tok_s <= c12.upper_tok_s * (1 + 1e-6) and fine.upper_tok_s <= c30.upper_tok_s * (1 + 1e-6)
    assert c30.upper_tok_s <= best * 1.06
    assert c12.states * 2 < fine.states and c30.states < c12.states
    with pytest.raises(ValueError, match="longer than the shortest step"):
        box_bound(spec, N, lo, hi, coarse=61)


def test_coarse_durations_and_auto_slot():
    d = np.array([[0, 60, 60], [0, 279, 279]])
    lo, hi = coarse_durations(d, 12)
    assert lo[:, 1].tolist() == [5, 23] and hi[:, 1].tolist() == [5, 24]
    # every start phase t in [0, c) gives floor((t + d) / c) - floor(t / c) in {floor(d / c), ceil(d / c)}
    for c in (7, 12, 30):
        for t in range(c):
            span = (t + 279) // c - t // c
            assert 279 // c <= span <= -(-279 // c)
    assert auto_coarse(d, 0.015) == 12 and auto_coarse(d, 0.04) == 30
    assert auto_coarse(np.array([[0, 1], [0, 3]]), 0.015) == 1


def _coarse_flow_bound(spec, N) -> float:
    """The flow bound in M variables (Little's law with each model's shortest step, capacity max b / d(b)),
    written here independently: the batch-resolved program must never be above it."""
    from scipy.optimize import linprog

    d, _ = spec.quanta_table(N)
    caps = spec.caps(N)
    M = spec.M
    dmin = [min(float(d[j, b]) for b in range(1, int(caps[j]) + 1)) for j in range(M)]
    kappa = [max(b / float(d[j, b]) for b in range(1, int(caps[j]) + 1)) for j in range(M)]
    cbar = (spec.C * spec.P).sum(axis=1)
    r = linprog(-cbar, A_ub=[dmin], b_ub=[N], A_eq=(np.eye(M) - spec.P).T, b_eq=np.zeros(M),
                bounds=[(0, k) for k in kappa], method="highs")
    return -r.fun * 1000.0 / spec.delta_ms


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(systems(), st.integers(1, 12))
def test_no_wait_bound_is_never_above_the_coarse_flow_bound(spec, N):
    assert no_wait_bound(spec, N).value_tok_s <= _coarse_flow_bound(spec, N) * (1 + 1e-7) + 1e-9


def test_no_wait_bound_resolved_by_batch_size_is_tighter_under_l_of_b():
    """Constant latencies: the two programs agree.  A step that grows with the batch: a batch large enough to
    serve at capacity also holds its requests longer, which the batch-resolved program sees (R2R with the
    H200 graph-mode medians at N = 256: 10,655 tok/s against 15,114, B* 8,115)."""
    r2r = preset("r2r", [6.0, 27.9], p=0.35)
    assert no_wait_bound(r2r, 64).value_tok_s == pytest.approx(_coarse_flow_bound(r2r, 64), rel=1e-7)
    curves = [LatencyCurve("affine", intercept_ms=5.0, per_request_ms=0.2),
              LatencyCurve("affine", intercept_ms=26.0, per_request_ms=1.5)]
    lb = preset("r2r", [5.0, 26.0], p=0.35, latency_curves=curves)
    for N in (8, 32):
        assert no_wait_bound(lb, N).value_tok_s < 0.95 * _coarse_flow_bound(lb, N)
    # and it still holds: the exact B* at N = 8 is below it
    best = max(evaluate_thresholds(lb, 8, B).throughput_tok_s for B in F.iter_feasible(8, 2))
    assert best <= no_wait_bound(lb, 8).value_tok_s
