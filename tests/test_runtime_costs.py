"""The simulator's serving costs beyond L_i(b): catch-up extends and co-running slowdown (simulator._kernels).

Checked against closed forms at N = 1 (R2R: the large model's step feeds k + 1 tokens, k ~ Geometric(p) small-model
tokens in between; one request never has two models running) and against the plain kernel when the costs are off.
"""

from __future__ import annotations

import pytest

import tr_model
from simulator import simulate
from tr_core.errors import SpecError

R2R = tr_model.preset("r2r", [6.0, 27.9], p=0.35)


def test_costs_off_reproduce_the_plain_simulation_exactly():
    a = simulate(R2R, 4, (1, 3), steps=60_000, seed=4)
    b = simulate(R2R, 4, (1, 3), steps=60_000, seed=4, extend_ms_per_token=[None, 0.0],
                 corun_slowdown=[[1, 1], [1, 1]])
    assert a.throughput_tok_s == b.throughput_tok_s and a.admission_latency_ms == b.admission_latency_ms


def test_catch_up_extend_matches_the_closed_form_at_N_1():
    p, e = 0.35, 1.5
    r = simulate(R2R, 1, (1, 1), steps=300_000, seed=2, extend_ms_per_token=[0.0, lambda b: e])
    # per committed token: 6.0 + p (27.9 + e E[k]), E[k] = (1 - p) / p
    exact = 1000.0 / (6.0 + p * (27.9 + e * (1 - p) / p))
    assert abs(r.throughput_tok_s - exact) <= max(2 * r.throughput_ci95_tok_s, 1e-6 * exact)
    assert r.method.endswith("+serving-costs")
    # CUDA-graph padding: T = k + 1 is rounded up to a captured length (beyond the last one it stays)
    buckets = (1, 2, 4, 8)

    def padded(t):
        return next((x for x in buckets if x >= t), t)

    e_pad = sum((1 - p) ** k * p * (padded(k + 1) - 1) for k in range(400))
    rb = simulate(R2R, 1, (1, 1), steps=300_000, seed=2, extend_ms_per_token=[0.0, e], extend_buckets=buckets)
    exact_b = 1000.0 / (6.0 + p * (27.9 + e * e_pad))
    assert abs(rb.throughput_tok_s - exact_b) <= max(2 * rb.throughput_ci95_tok_s, 1e-6 * exact_b)
    assert rb.throughput_tok_s < r.throughput_tok_s
    # a prompt is fed once per request (and per model): 20 tokens of prompt at 1.5 ms each on model 1 only
    short = simulate(R2R, 1, (1, 1), steps=300_000, seed=2, request_tokens=50, prompt_tokens=20,
                     extend_ms_per_token=[0.0, e])
    assert short.throughput_tok_s < r.throughput_tok_s


def test_co_running_slowdown():
    # N = 1: never two models at once, so no effect at all
    one = simulate(R2R, 1, (1, 1), steps=50_000, seed=1, corun_slowdown=[[1, 3.0], [2.0, 1]])
    assert one.throughput_tok_s == pytest.approx(1000.0 / (6.0 + 0.35 * 27.9), rel=0.01)
    base = simulate(R2R, 6, (1, 1), steps=200_000, seed=1)
    slow0 = simulate(R2R, 6, (1, 1), steps=200_000, seed=1, corun_slowdown=[[1, 2.0], [1, 1]])
    # only model 0 slows: model 1's steps keep their length, model 0's lie between L0 and 2 L0
    for r in (base, slow0):
        assert r.utilization[1] * r.simulated_ms / r.launches[1] == pytest.approx(27.9, rel=1e-3)  # window edges
    step0 = slow0.utilization[0] * slow0.simulated_ms / slow0.launches[0]
    assert 6.0 * 1.05 < step0 < 12.0
    assert slow0.throughput_tok_s < base.throughput_tok_s
    # delayed batching leaves model 1 idle more often, so it suffers less from the slowdown than eager does
    d_base = simulate(R2R, 6, (1, 4), steps=200_000, seed=1)
    d_slow = simulate(R2R, 6, (1, 4), steps=200_000, seed=1, corun_slowdown=[[1, 2.0], [1, 1]])
    assert d_slow.throughput_tok_s / slow0.throughput_tok_s > d_base.throughput_tok_s / base.throughput_tok_s


def test_bad_cost_arguments():
    for kw in ({"extend_ms_per_token": [0.0]}, {"extend_ms_per_token": [0.0, -1.0]},
               {"extend_ms_per_token": [0.0, "x"]}, {"corun_slowdown": [[1, 0], [1, 1]]},
               {"corun_slowdown": [1, 2]}, {"prompt_tokens": -1}, {"extend_buckets": [0, 2]},
               {"extend_buckets": ["a"]}):
        with pytest.raises(SpecError):
            simulate(R2R, 2, (1, 1), steps=2_000, **kw)


def test_the_runtime_with_catch_up_costs_agrees_with_the_simulator():
    # an independent implementation of the same law: the runtime's emulated executor tracks what each model has
    # seen per request object, the simulator per slot in its kernel; short requests make first visits (a whole
    # history to catch up) frequent
    from tr_model.serving.runtime import EmulatedExecutor, measure_closed_loop
    e = 2.0
    ex = EmulatedExecutor(R2R.latency_ms, extend_ms_per_token=lambda m, b: e if m == 1 else 0.0)
    r = measure_closed_loop(R2R, 4, (1, 3), ex, duration_s=200.0, warmup_s=2.0, max_output_tokens=24, prompt_len=0,
                            seed=1, slices=16, clock="virtual")
    s = simulate(R2R, 4, (1, 3), steps=400_000, seed=3, request_tokens=24, extend_ms_per_token=[0.0, e])
    plain = simulate(R2R, 4, (1, 3), steps=400_000, seed=3, request_tokens=24)
    assert plain.throughput_tok_s - s.throughput_tok_s > 10 * (s.throughput_ci95_tok_s + plain.throughput_ci95_tok_s)
    assert abs(r.throughput_tok_s - s.throughput_tok_s) <= 1.5 * (r.throughput_ci95_tok_s + s.throughput_ci95_tok_s)


def test_the_runtime_with_co_running_slowdown_agrees_with_the_simulator():
    from tr_model.serving.runtime import EmulatedExecutor, measure_closed_loop
    f = [[1.0, 2.0], [1.2, 1.0]]
    for B in [(1, 1), (1, 4)]:
        ex = EmulatedExecutor(R2R.latency_ms, corun_slowdown=f)
        r = measure_closed_loop(R2R, 6, B, ex, duration_s=150.0, warmup_s=2.0, max_output_tokens=10 ** 6, seed=2,
                                slices=16, clock="virtual")
        s = simulate(R2R, 6, B, steps=400_000, seed=5, corun_slowdown=f)
        plain = simulate(R2R, 6, B, steps=400_000, seed=5)
        assert plain.throughput_tok_s - s.throughput_tok_s > 10 * (s.throughput_ci95_tok_s + plain.throughput_ci95_tok_s)
        assert abs(r.throughput_tok_s - s.throughput_tok_s) <= 1.5 * (r.throughput_ci95_tok_s + s.throughput_ci95_tok_s), (
            B, r.throughput_tok_s, s.throughput_tok_s)
