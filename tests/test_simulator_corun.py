"""Event simulator under the co-running launch law: hand-computed cases, the factor-1 reduction, the
busy-time balance, argument checks, and the exact chain against the simulator on 24 configurations."""

from __future__ import annotations

import numpy as np
import pytest

from tr_core.errors import SpecError
from tr_core.spec import LatencyCurve, make_spec, preset
from simulator import simulate

ALTERNATE = dict(routing_matrix=[[0, 1], [1, 0]], committed_tokens=[[1, 1], [1, 1]])


def _alternation(corun=None):
    return make_spec([2.0, 3.0], max_batch_size=[1, 1], corun_latency=corun, **ALTERNATE)


def test_hand_computed_alternation():
    # strict alternation 0 -> 1 -> 0, caps 1, L = (2, 3) ms, Lco = (4, 6) ms, one token per step.
    # N = 1: one model busy at a time, never co-running: 2 tokens every 5 ms.
    one = simulate(_alternation([2.0, 2.0]), 1, (1, 1), steps=20_000)
    assert one.throughput_tok_s == pytest.approx(400.0, rel=1e-9)
    assert one.corun_launches == (0, 0) and one.corun_law == "launch"
    # N = 2: t = 0 model 0 starts alone (2 ms); at t = 2 both launch in the same pass, so both are
    # co-running (model 0 until 6, model 1 until 8); at t = 8 model 1's request returns and both launch
    # together again: period 6 ms, one step on each model per period, every launch co-running.
    two = simulate(_alternation([2.0, 2.0]), 2, (1, 1), steps=20_000)
    assert two.throughput_tok_s == pytest.approx(2000.0 / 6.0, rel=1e-9)
    assert two.corun_launches == two.launches
    assert two.method.endswith("+corun-launch")
    # solo reference: model 1 is the bottleneck, never idle: 2 steps every 3 ms
    solo = simulate(_alternation(), 2, (1, 1), steps=20_000)
    assert solo.throughput_tok_s == pytest.approx(2000.0 / 3.0, rel=1e-9)
    assert solo.corun_launches == (0, 0)


def test_hand_computed_launch_time_fixes_the_duration():
    # caps 1, N = 2, L = (2, 3), Lco = (4, 3): model 1 is never slowed.  t = 0: model 0 alone, 2 ms.
    # t = 2: both launch together -> model 0 co (4 ms, to 6), model 1 (3 ms, to 5).  t = 5: model 1's
    # request goes to model 0's queue (model 0 busy); model 1 idle (queue empty).  t = 6: model 0 finishes,
    # its request joins model 1, the waiting one launches on model 0: both launch together again
    # (co: 4 ms to 10; model 1 to 9).  Period 4 ms with one step per model: 500 tokens/s.
    r = simulate(_alternation([2.0, 1.0]), 2, (1, 1), steps=20_000)
    assert r.throughput_tok_s == pytest.approx(500.0, rel=1e-9)
    # N = 3, Lco = (4, 6): launches alone and co-running mix; each model's busy time is the sum over its
    # launches of the duration fixed at launch (a step keeps it when the other model stops or starts)
    spec = make_spec([2.0, 3.0], max_batch_size=[1, 1], corun_latency=[2.0, 2.0], **ALTERNATE)
    r3 = simulate(spec, 3, (1, 1), steps=40_000)
    for i, (L, Lco) in enumerate(((2.0, 4.0), (3.0, 6.0))):
        solo = r3.launches[i] - r3.corun_launches[i]
        busy = r3.utilization[i] * r3.simulated_ms
        assert busy == pytest.approx(solo * L + r3.corun_launches[i] * Lco, rel=2e-3)


def test_factor_one_is_the_plain_simulation_bit_for_bit():
    R2R = preset("r2r", [6.0, 27.9], p=0.35)
    co1 = make_spec([6.0, 27.9], R2R.P, R2R.C, corun_latency=[1.0, None])
    a = simulate(R2R, 5, (1, 3), steps=100_000, seed=3, jitter=0.2)
    b = simulate(co1, 5, (1, 3), steps=100_000, seed=3, jitter=0.2)
    assert a.throughput_tok_s == b.throughput_tok_s and a.batch_ms == b.batch_ms
    assert a.method == b.method and b.corun_law == "launch"
    # the rate-sharing law with identity factors is the plain simulation too
    c = simulate(R2R, 5, (1, 3), steps=100_000, seed=3, jitter=0.2, corun_slowdown=[[1, 1], [1, 1]])
    assert c.throughput_tok_s == a.throughput_tok_s and c.corun_law == "rate-sharing"


def test_busy_time_balance_with_batch_dependent_curves():
    # the duration of each launch is L_i(b) or Lco_i(b); with affine curves and a slowdown factor F_i
    # the busy time is sum over launches of (1 or F_i) (a_i + c_i b)
    curves = [LatencyCurve("affine", intercept_ms=4.0, per_request_ms=0.5),
              LatencyCurve("affine", intercept_ms=20.0, per_request_ms=2.0)]
    R2R = preset("r2r", [6.0, 27.9], p=0.35)
    F = (3.0, 1.5)
    spec = make_spec([4.5, 22.0], R2R.P, R2R.C, latency_curves=curves, corun_latency=list(F))
    r = simulate(spec, 6, (1, 2), steps=300_000, seed=2)
    plain = simulate(make_spec([4.5, 22.0], R2R.P, R2R.C, latency_curves=curves), 6, (1, 2), steps=300_000, seed=2)
    assert r.throughput_tok_s < plain.throughput_tok_s - 3 * (r.throughput_ci95_tok_s + plain.throughput_ci95_tok_s)
    for i in range(2):
        assert 0 < r.corun_launches[i] < r.launches[i]
        a, c = curves[i].intercept_ms, curves[i].per_request_ms
        busy = r.utilization[i] * r.simulated_ms
        # lower/upper bounds: every launch solo / every launch co-running, at the observed admissions
        lo = a * r.launches[i] + c * r.admission[i].count
        assert lo < busy < F[i] * lo


@pytest.mark.parametrize("kwargs,needle", [
    (dict(corun_law="both"), "corun_law must be one of launch, rate-sharing"),
    (dict(corun_law="launch", corun_slowdown=[[1, 2], [2, 1]]), "rate-sharing law"),
    (dict(corun_law="rate-sharing"), "needs corun_slowdown"),
    (dict(corun_slowdown=[[1, 2], [2, 1]]), "name the one"),
])
def test_corun_law_arguments_are_checked(kwargs, needle):
    spec = make_spec([6.0, 27.9], preset("r2r", [6.0, 27.9], p=0.35).P, preset("r2r", [6.0, 27.9], p=0.35).C,
                     corun_latency=[2.0, 1.1])
    with pytest.raises(SpecError) as e:
        simulate(spec, 4, (1, 1), steps=10_000, **kwargs)
    assert needle in str(e.value)


# ---- the exact chain against the simulator under the launch law --------------------------------------------

def _configs():
    """24 systems (12 with M = 2, 12 with M = 3): slowdown factors 1-4 or co-running tables, constant or
    affine L(b) (integer slopes), some batch caps; every latency and co-running latency on a 0.5 ms grid, so
    the chain needs no rounding and the simulator sees the same numbers."""
    rng = np.random.default_rng(2026)
    factors = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0)
    out = []
    for k in range(24):
        M = 2 if k < 12 else 3
        N = int(rng.integers(2, 6 if M == 2 else 5))
        if M == 2:
            p = float(rng.choice([0.2, 0.35, 0.5]))
            P = [[1 - p, p], [1.0, 0.0]]
            C = [[1, 0], [1, 0]]
        else:
            P = rng.dirichlet(np.ones(3), size=3)
            P = np.round(P, 2)
            P[:, 2] = 1.0 - P[:, 0] - P[:, 1]
            P = P.tolist()
            C = [[1, 1, 1], [1, 1, 1], [1, 1, 1]]
        L = [float(rng.integers(1, 5)) if i == 0 else float(rng.integers(3, 12)) for i in range(M)]
        curves = None
        if k % 3 == 1:
            curves = [LatencyCurve("affine", intercept_ms=L[i], per_request_ms=float(rng.choice([0.0, 1.0, 2.0])))
                      for i in range(M)]
        corun = []
        for i in range(M):
            if k % 4 == 3 and i == 0:
                # a measured-style table over every batch size, ratios 2.8..3.6 of the solo curve
                solo = [(curves[i].latency_ms(b) if curves else L[i]) for b in range(1, N + 1)]
                ratio = np.linspace(2.8, 3.6, N)
                corun.append({"batch_size": list(range(1, N + 1)),
                              "step_latency_ms": [round(2 * s * f) / 2 for s, f in zip(solo, ratio)]})
            else:
                corun.append(float(rng.choice(factors)))
        caps = None
        if k % 5 == 2:
            caps = [None] * M
            caps[M - 1] = max(1, N // 2)
        B = [1] * M
        if k % 2 == 1:
            B[M - 1] = int(rng.integers(2, N)) if N > 2 else 1   # below N: the model can co-run
        spec = make_spec(L, P, C, delta_ms=0.5, latency_curves=curves, max_batch_size=caps, corun_latency=corun)
        out.append(pytest.param(spec, N, tuple(B), id=f"c{k:02d}-M{M}-N{N}"))
    return out


CONFIGS = _configs()


def _chain(spec, N, B):
    from optimizer.evaluate import evaluate_thresholds
    return evaluate_thresholds(spec, N, B).throughput_tok_s


def _solo(spec):
    return make_spec(spec.step_latency_ms, spec.P, spec.C, delta_ms=spec.delta_ms,
                     latency_curves=spec.latency_curves, max_batch_size=spec.max_batch_size)


@pytest.mark.slow
def test_chain_equals_the_simulator_under_the_launch_law():
    assert len(CONFIGS) >= 20
    rows = []
    for par in CONFIGS:
        spec, N, B = par.values
        exact = _chain(spec, N, B)
        sim = simulate(spec, N, B, steps=300_000, seed=17)
        # a deterministic schedule has a zero-width interval: then the two must agree to rounding
        z = (exact - sim.throughput_tok_s) / max(sim.throughput_ci95_tok_s / 1.96, 1e-9 * exact)
        solo = _chain(_solo(spec), N, B)
        rows.append((par.id, exact, sim.throughput_tok_s, sim.throughput_ci95_tok_s, z, solo, sum(sim.corun_launches)))
    table = "\n".join(f"{r[0]}: chain {r[1]:.4f} sim {r[2]:.4f} +- {r[3]:.4f} z {r[4]:+.2f} solo {r[5]:.4f}"
                      for r in rows)
    outside = [r for r in rows if abs(r[1] - r[2]) > r[3] + 1e-9 * r[1]]
    # 24 independent 95% intervals: 1.2 expected outside; 4 or more has probability < 3% if all are right
    assert len(outside) <= 3, table
    assert all(abs(r[4]) < 4.0 for r in rows), table
    # the comparison has power: where co-running happens and costs something, the solo chain lies far outside
    costly = [r for r in rows if r[6] > 0 and abs(r[5] - r[1]) > 0.02 * r[1]]
    assert len(costly) >= 12, table
    assert all(abs(r[5] - r[2]) > 5 * r[3] for r in costly), table


def test_chain_equals_the_simulator_quick():
    # a fast subset for every run: one M = 2 and one M = 3 configuration with slowdown
    for par in (CONFIGS[2], CONFIGS[14]):
        spec, N, B = par.values
        exact = _chain(spec, N, B)
        sim = simulate(spec, N, B, steps=200_000, seed=5)
        assert abs(exact - sim.throughput_tok_s) <= 1.5 * sim.throughput_ci95_tok_s, (par.id, exact, sim.ci95)
        assert abs(_chain(_solo(spec), N, B) - sim.throughput_tok_s) > 5 * sim.throughput_ci95_tok_s


def test_launch_law_applies_to_trace_replay_and_jitter():
    from simulator import generate_trace
    R2R = preset("r2r", [6.0, 27.9], p=0.35)
    co = make_spec([6.0, 27.9], R2R.P, R2R.C, corun_latency=[3.0, 1.05])
    trace = generate_trace(R2R, 300, 30, seed=1)
    plain = simulate(R2R, 6, (1, 2), steps=100_000, seed=4, trace=trace, jitter=0.3)
    slow = simulate(co, 6, (1, 2), steps=100_000, seed=4, trace=trace, jitter=0.3)
    assert slow.method == "simulate:trace+corun-launch" and plain.corun_launches == (0, 0)
    assert all(c > 0 for c in slow.corun_launches)
    assert slow.throughput_tok_s < plain.throughput_tok_s - 3 * (slow.throughput_ci95_tok_s + plain.throughput_ci95_tok_s)
