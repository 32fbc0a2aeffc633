"""Event simulator: reference values, closed forms, conservation laws, caps, determinism, validation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tr_core.errors import SpecError
from tr_core.spec import LatencyCurve, make_spec, preset
from simulator import simulate

R2R = preset("r2r", [6.0, 27.9], p=0.35)


@pytest.mark.parametrize("N,B,ref", [(1, (1, 1), 63.43), (2, (1, 2), 110.32), (4, (1, 1), 187.19),
                                     (4, (1, 3), 207.95)])
def test_spec_reference_values_lie_in_the_interval(N, B, ref):
    # reference table of docs/spec (rounded to 0.01): allow that rounding on top of the interval
    r = simulate(R2R, N, B, steps=1_500_000, seed=11)
    assert abs(r.throughput_tok_s - ref) <= r.throughput_ci95_tok_s + 0.005
    assert r.throughput_ci95_tok_s < 0.004 * ref     # the interval is informative, not huge
    assert r.per_request_tok_s == pytest.approx(r.throughput_tok_s / N)


def _n1_closed_form(spec) -> float:
    # one request alone: renewal reward over the stationary law pi of P
    P, C = spec.P, spec.C
    w, v = np.linalg.eig(P.T)
    pi = np.real(v[:, np.argmin(np.abs(w - 1))])
    pi = pi / pi.sum()
    tokens = float(pi @ (P * C).sum(axis=1))
    ms = float(sum(pi[i] * spec.latency_ms(i, 1) for i in range(spec.M)))
    return 1000.0 * tokens / ms


@pytest.mark.parametrize("spec", [
    R2R,
    preset("r-stitch", [5.3, 31.7], p=0.2, q=0.45),
    preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2]),
    make_spec([4.0, 9.0, 20.0], [[0.6, 0.3, 0.1], [0.5, 0.2, 0.3], [0.9, 0.0, 0.1]],
              [[1, 0, 2], [1, 1, 0], [0.5, 0, 1]]),
])
@pytest.mark.parametrize("jitter", [0.0, 0.4])
def test_single_request_matches_closed_form(spec, jitter):
    exact = _n1_closed_form(spec)
    if spec.name == "r2r":
        assert exact == pytest.approx(1000.0 / (6.0 + 0.35 * 27.9), rel=1e-12)
    r = simulate(spec, 1, (1,) * spec.M, steps=600_000, seed=5, jitter=jitter)
    # the mean-one jitter factor leaves the N = 1 throughput unchanged
    assert abs(r.throughput_tok_s - exact) <= 1.3 * r.throughput_ci95_tok_s
    assert all(a.mean_ms == 0.0 for a in r.admission if a.count)   # nobody ever waits


def test_conservation_and_littles_law():
    spec = preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2])
    N = 7
    r = simulate(spec, N, (1, 2, 3), steps=800_000, seed=2)
    # requests are conserved: time-average of waiting + in service is exactly N
    assert sum(r.mean_waiting) + sum(r.mean_in_service) == pytest.approx(N, rel=1e-9)
    for i in range(3):
        a = r.admission[i]
        rate = a.count / r.simulated_ms
        # Little's law: queue-length time average (area) = admission rate x mean wait (per request)
        assert r.mean_waiting[i] == pytest.approx(rate * a.mean_ms, rel=5e-3, abs=1e-4)
        # admissions equal launched requests
        assert a.count == pytest.approx(r.mean_batch_size[i] * r.launches[i], rel=1e-12)
        # constant latency: busy time = launches x L_i
        assert r.utilization[i] * r.simulated_ms == pytest.approx(r.launches[i] * spec.latency_ms(i), rel=1e-4)
        assert a.p50_ms <= a.p90_ms <= a.p99_ms
    # tokens: every step of ME commits one token, so throughput = steps / time
    assert r.throughput_tok_s == pytest.approx(r.request_steps / r.simulated_ms * 1000.0, rel=1e-12)


def test_determinism_per_seed():
    a = simulate(R2R, 6, (1, 3), steps=200_000, seed=123, jitter=0.2)
    b = simulate(R2R, 6, (1, 3), steps=200_000, seed=123, jitter=0.2)
    c = simulate(R2R, 6, (1, 3), steps=200_000, seed=124, jitter=0.2)
    assert a.throughput_tok_s == b.throughput_tok_s
    assert a.batch_tokens == b.batch_tokens and a.admission == b.admission
    assert c.throughput_tok_s != a.throughput_tok_s


def test_caps_hand_computed_deterministic_systems():
    # strict alternation 0 -> 1 -> 0 ..., L = (2, 3) ms, one token per step, N = 3
    P, C = [[0, 1], [1, 0]], [[1, 1], [1, 1]]
    uncapped = simulate(make_spec([2.0, 3.0], P, C), 3, (1, 1), steps=60_000)
    # all three move together: 6 tokens every 5 ms
    assert uncapped.throughput_tok_s == pytest.approx(1200.0, rel=1e-3)
    one = simulate(make_spec([2.0, 3.0], P, C, max_batch_size=[1, 1]), 3, (1, 1), steps=60_000)
    # model 1 serves one at a time and is never idle: 2 steps (one per model) every 3 ms
    assert one.throughput_tok_s == pytest.approx(2000.0 / 3.0, rel=1e-3)
    assert one.max_batch_size == (1, 1)
    two = simulate(make_spec([2.0, 3.0], P, C, max_batch_size=[2, 2]), 3, (1, 1), steps=60_000)
    # period 6 ms after the transient: model 1 alternates batches of 1 and 2, model 0 the reverse
    assert two.throughput_tok_s == pytest.approx(1000.0, rel=1e-3)
    assert two.max_batch_size == (2, 2)


def test_caps_are_respected_under_load():
    spec = make_spec([6.0, 27.9], R2R.P, R2R.C, max_batch_size=[None, 3])
    r = simulate(spec, 12, (1, 2), steps=300_000, seed=1)
    assert r.max_batch_size[1] == 3 and r.max_batch_size[0] <= 12
    assert r.caps == (12, 3)
    assert r.mean_batch_size[1] <= 3.0


def test_batch_dependent_latency_is_used_per_launch():
    # affine L_1(b) = 20 + 2 b: busy time must equal sum over launches of L_1(b)
    curve = LatencyCurve("affine", intercept_ms=20.0, per_request_ms=2.0)
    spec = make_spec([6.0, 22.0], R2R.P, R2R.C, latency_curves=[None, curve])
    r = simulate(spec, 1, (1, 1), steps=200_000, seed=3)
    assert abs(r.throughput_tok_s - 1000.0 / (6.0 + 0.35 * 22.0)) <= 1.3 * r.throughput_ci95_tok_s
    r4 = simulate(spec, 8, (1, 1), steps=400_000, seed=3)
    # batches of b on model 1 last 20 + 2b, so busy = 20 * launches + 2 * admissions
    busy = r4.utilization[1] * r4.simulated_ms
    assert busy == pytest.approx(20.0 * r4.launches[1] + 2.0 * r4.admission[1].count, rel=1e-3)


def test_request_completion_closed_loop_littles_law():
    N, K = 5, 40
    r = simulate(R2R, N, (1, 2), steps=600_000, seed=9, request_tokens=K)
    # R2R commits one token per step on model 0 and none otherwise: each request commits exactly K
    rate_per_ms = r.completed_requests / r.simulated_ms
    assert rate_per_ms * K * 1000.0 == pytest.approx(r.throughput_tok_s, rel=0.01)
    # Little's law for the whole closed system: N = completion rate x mean request time
    assert rate_per_ms * r.mean_request_time_ms == pytest.approx(N, rel=0.02)


def test_horizon_mode_and_warmup():
    r = simulate(R2R, 4, (1, 3), horizon_ms=3.0e6, warmup=0.2, seed=4)
    assert r.simulated_ms == pytest.approx(3.0e6, rel=1e-3)
    assert abs(r.throughput_tok_s - 207.95) <= r.throughput_ci95_tok_s + 0.005
    assert r.ci_batches == 32


@pytest.mark.parametrize("kwargs,needle", [
    (dict(N=4, B=(1, 5)), "infeasible"),
    (dict(N=4, B=(1,)), "M = 2"),
    (dict(N=4, B=(0, 1)), "B[0]"),
    (dict(N=0, B=(1, 1)), "N must"),
    (dict(N=4, B=(1, 1), steps=10, horizon_ms=5.0), "either steps or horizon_ms"),
    (dict(N=4, B=(1, 1), warmup=1.0), "warmup"),
    (dict(N=4, B=(1, 1), jitter=-0.1), "jitter"),
    (dict(N=4, B=(1, 1), seed=-1), "seed"),
    (dict(N=4, B=(1, 1), request_tokens=0), "request_tokens"),
    (dict(N=4, B=(1, 1), steps=500), "steps must be >= 1000"),
    (dict(N=4, B=(1, 1), horizon_ms=-1.0), "horizon_ms"),
])
def test_bad_arguments_name_the_field(kwargs, needle):
    with pytest.raises(SpecError, match=None) as e:
        simulate(R2R, **kwargs)
    assert needle in str(e.value)


def test_spec_type_is_checked():
    with pytest.raises(SpecError, match="SystemSpec"):
        simulate({"step_latency_ms": [1, 2]}, 2, (1, 1))


def test_result_serialises():
    import json
    r = simulate(R2R, 3, (1, 2), steps=50_000)
    d = json.loads(json.dumps(r.to_dict()))
    assert d["schema_version"] == 1 and d["B"] == [1, 2] and len(d["admission"]) == 2
    assert math.isfinite(d["throughput_ci95_tok_s"])


def test_expected_token_credit_is_unbiased_and_tighter():
    drawn = simulate(R2R, 4, (1, 1), steps=1_000_000, seed=8, expected_tokens=False)
    expected = simulate(R2R, 4, (1, 1), steps=1_000_000, seed=8, expected_tokens=True)
    for r in (drawn, expected):
        assert abs(r.throughput_tok_s - 187.19) <= r.throughput_ci95_tok_s + 0.005
    # same route realisation (same seed), the conditional expectation removes the token-draw noise
    assert expected.throughput_ci95_tok_s < 0.8 * drawn.throughput_ci95_tok_s


def test_admission_latency_quantiles_hand_computed():
    # strict alternation, caps 1, L = (2, 3) ms, N = 3: model 1 serves one request every 3 ms, so each request
    # comes back to it every 9 ms; 2 ms at model 0 (never waits: arrivals 3 ms apart), 3 ms in service at
    # model 1, hence exactly 9 - 2 - 3 = 4 ms waiting at model 1 on every admission
    spec = make_spec([2.0, 3.0], [[0, 1], [1, 0]], [[1, 1], [1, 1]], max_batch_size=[1, 1])
    r = simulate(spec, 3, (1, 1), steps=30_000)
    a0, a1 = r.admission
    assert a0.mean_ms == pytest.approx(0.0, abs=1e-9) and a0.p99_ms == 0.0
    assert a1.mean_ms == pytest.approx(4.0, rel=1e-3)
    for q in (a1.p50_ms, a1.p90_ms, a1.p99_ms):
        assert q == pytest.approx(4.0, rel=1.5e-3)      # histogram bins are 0.2% wide
    assert r.mean_waiting[1] == pytest.approx(4.0 / 3.0, rel=1e-3)   # Little: 1/3 admissions per ms x 4 ms


def test_jitter_keeps_mean_step_latency():
    spec = preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2])
    r = simulate(spec, 6, (1, 1, 1), steps=600_000, seed=4, jitter=0.5)
    for i in range(3):
        mean_step = r.utilization[i] * r.simulated_ms / r.launches[i]
        # the log-normal factor has mean 1 and CV 0.5: the mean over ~10^5 launches is within ~1%
        assert mean_step == pytest.approx(spec.latency_ms(i), rel=0.01)
    plain = simulate(spec, 6, (1, 1, 1), steps=600_000, seed=4)
    assert plain.throughput_tok_s != r.throughput_tok_s
