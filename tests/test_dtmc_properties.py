"""Hypothesis property checks over random valid systems."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tr_model
from tr_core.spec import make_spec


@st.composite
def systems(draw):
    M = draw(st.integers(2, 3))
    N = draw(st.integers(1, 4 if M == 2 else 3))
    raw = [[draw(st.integers(1, 4)) for _ in range(M)] for _ in range(M)]
    P = [[x / sum(row) for x in row] for row in raw]
    C = [[draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])) for _ in range(M)] for _ in range(M)]
    L = [draw(st.integers(1, 12)) * 0.5 for _ in range(M)]
    B = [1] * M
    budget = N - 1
    for i in range(M):
        extra = draw(st.integers(0, budget))
        B[i] += extra
        budget -= extra
    return make_spec(L, P, C, delta_ms=0.5), N, tuple(B)


SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(systems())
def test_throughput_finite_and_bounded(sys_):
    spec, N, B = sys_
    ev = tr_model.evaluate(spec, N, B)
    cbar = (spec.P * spec.C).sum(axis=1)
    # no request steps faster than the fastest model nor earns more than the best row
    bound = N * cbar.max() * 1000.0 / min(spec.step_latency_ms)
    assert np.isfinite(ev.throughput_tok_s)
    assert 0.0 <= ev.throughput_tok_s <= bound * (1 + 1e-9)
    assert ev.residual <= 1e-10
    if (spec.C > 0).all():
        assert ev.throughput_tok_s > 0


@SETTINGS
@given(systems(), st.integers(2, 4))
def test_time_scaling(sys_, k):
    """Multiplying every latency by k divides the throughput by k (same chain, slower clock)."""
    spec, N, B = sys_
    slow = make_spec([L * k for L in spec.step_latency_ms], spec.P, spec.C, delta_ms=spec.delta_ms)
    a = tr_model.evaluate(spec, N, B).throughput_tok_s
    b = tr_model.evaluate(slow, N, B).throughput_tok_s
    assert b == pytest.approx(a / k, rel=1e-8, abs=1e-12)


@SETTINGS
@given(systems(), st.sampled_from([0.5, 2.0, 3.0]))
def test_token_scaling(sys_, c):
    spec, N, B = sys_
    scaled = make_spec(spec.step_latency_ms, spec.P, spec.C * c, delta_ms=spec.delta_ms)
    a = tr_model.evaluate(spec, N, B).throughput_tok_s
    b = tr_model.evaluate(scaled, N, B).throughput_tok_s
    assert b == pytest.approx(a * c, rel=1e-8, abs=1e-12)


@SETTINGS
@given(systems())
def test_delta_refinement_is_exact(sys_):
    """Halving delta on latencies already on the grid changes nothing but the clock."""
    spec, N, B = sys_
    fine = spec.with_delta(spec.delta_ms / 2)
    a = tr_model.evaluate(spec, N, B)
    b = tr_model.evaluate(fine, N, B)
    assert b.throughput_tok_s == pytest.approx(a.throughput_tok_s, rel=1e-8)
    assert b.states == a.states


def test_absorbing_routing_with_threshold_has_two_closed_classes():
    """P = [[.5,.5],[0,1]], N=2, B=(2,1): a request stranded below B_0 or both at model 1.

    Both are closed classes; the tool must refuse to average over them.
    """
    spec = make_spec([0.5, 0.5], [[0.5, 0.5], [0.0, 1.0]], [[1, 1], [1, 1]], delta_ms=0.5)
    with pytest.raises(tr_model.SpecError, match="2 closed classes"):
        tr_model.evaluate(spec, 2, (2, 1))
    # with eager thresholds the stranded state cannot exist: one closed class
    assert tr_model.evaluate(spec, 2, (1, 1)).throughput_tok_s == pytest.approx(2 * 1000 / 0.5)
