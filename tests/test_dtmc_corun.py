"""The co-running launch law in the exact chain (docs/model.md, "Co-running").

Checked against (a) today's chain (no co-running, and every factor 1: the same chain state for state),
(b) an independent plain-Python exact enumeration of the same law (tests/mc_reference.py,
``exact_reference``) and (c) an independent per-request Monte Carlo simulation (``simulate``), within
its interval.
"""

import numpy as np
import pytest

import dtmc
import tr_model
from mc_reference import exact_reference, simulate
from tr_core.spec import make_spec, preset


def _random_system(seed):
    rng = np.random.default_rng(7000 + seed)
    M = 2 if seed % 3 else 3
    P = rng.dirichlet(np.ones(M) * 0.9, size=M)
    P[:, -1] = 1.0 - P[:, :-1].sum(axis=1)
    P = np.clip(P, 0.0, 1.0)
    C = np.round(rng.uniform(0.0, 2.0, size=(M, M)), 2)
    N = int(rng.integers(2, 5 if M == 2 else 4))
    B = [1] * M
    budget = N - 1
    for i in rng.permutation(M):
        extra = int(rng.integers(0, budget + 1))
        B[i] += extra
        budget -= extra
    # durations: constant or batch-dependent (non-decreasing), co-running = a factor 1..4 of them, or a
    # table of its own that may even be faster than solo (the law does not care)
    d = np.zeros((M, N + 1), dtype=np.int64)
    dco = np.zeros((M, N + 1), dtype=np.int64)
    for i in range(M):
        base = int(rng.integers(1, 4))
        slope = int(rng.integers(0, 2)) if seed % 2 else 0
        d[i, 1:] = base + slope * np.arange(N)
        mode = rng.choice(3, p=[0.15, 0.45, 0.4])
        if mode == 0:
            dco[i, 1:] = d[i, 1:]
        elif mode == 1:
            dco[i, 1:] = np.round(d[i, 1:] * rng.choice([1.5, 2.0, 3.0, 4.0])).astype(np.int64)
        else:
            dco[i, 1:] = np.maximum(1, d[i, 1:] + rng.integers(-1, 4, size=N))
        d[i, 0], dco[i, 0] = d[i, 1], dco[i, 1]
    caps = None
    if seed % 4 == 3:
        caps = [int(rng.integers(1, N + 1)) for _ in range(M)]
    return P, C, d, dco, N, tuple(B), caps


@pytest.mark.parametrize("seed", range(24))
def test_chain_equals_independent_exact_enumeration(seed):
    P, C, d, dco, N, B, caps = _random_system(seed)
    sol = dtmc.solve_chain(P, C, d, N, B, caps=caps, dco=dco, solver="gth")
    ref, n = exact_reference(P, C, d, N, B, dco=dco, caps=caps)
    assert sol.states == n
    assert abs(sol.throughput_per_quantum - ref) <= 1e-10 * max(1.0, abs(ref)), (sol.throughput_per_quantum, ref)
    # and the law matters here: the solo chain differs whenever co-running durations differ and co-running occurs
    solo = dtmc.solve_chain(P, C, d, N, B, caps=caps, solver="gth")
    ref_solo, _ = exact_reference(P, C, d, N, B, caps=caps)
    assert abs(solo.throughput_per_quantum - ref_solo) <= 1e-10 * max(1.0, abs(ref_solo))


def test_the_law_changes_something():
    # a sanity check on the tests above: over the random systems the co-running law moves the throughput
    moved = 0
    for seed in range(24):
        P, C, d, dco, N, B, caps = _random_system(seed)
        a = dtmc.solve_chain(P, C, d, N, B, caps=caps, dco=dco).throughput_per_quantum
        b = dtmc.solve_chain(P, C, d, N, B, caps=caps).throughput_per_quantum
        moved += abs(a - b) > 1e-9 * abs(b)
    assert moved >= 12


@pytest.mark.parametrize("spec_kw, N, B", [
    (dict(), 4, (1, 1)),
    (dict(), 6, (1, 3)),
    (dict(latency_curves=[{"batch_size": [1, 8], "step_latency_ms": [6.0, 6.7]}, None]), 6, (1, 1)),
    (dict(max_batch_size=[None, 3]), 5, (1, 2)),
])
def test_factor_one_is_todays_chain_state_for_state(spec_kw, N, B):
    solo = preset("r2r", [6.0, 27.9], p=0.35, **spec_kw)
    one = preset("r2r", [6.0, 27.9], p=0.35, corun_latency=[1.0, {"slowdown": 1.0}], **spec_kw)
    assert one.has_corun and not solo.has_corun
    d, _ = solo.quanta_table(N)
    dco, _ = one.corun_quanta_table(N)
    a = dtmc.build_chain(solo.P, solo.C, d, N, B, caps=solo.caps(N))
    b = dtmc.build_chain(one.P, one.C, d, N, B, caps=one.caps(N), dco=dco)
    assert np.array_equal(a.keys, b.keys)
    assert np.array_equal(a.T.indptr, b.T.indptr) and np.array_equal(a.T.indices, b.T.indices)
    assert np.array_equal(a.T.data, b.T.data) and np.array_equal(a.tau, b.tau) and np.array_equal(a.g, b.g)
    ea, eb = tr_model.evaluate(solo, N, B), tr_model.evaluate(one, N, B)
    assert abs(ea.throughput_tok_s - eb.throughput_tok_s) <= 1e-12 * ea.throughput_tok_s
    assert ea.states == eb.states and ea.transitions == eb.transitions


def test_no_corun_field_is_todays_chain():
    # an explicit list of nulls is "no co-running": the solo path, the same evaluation
    s = preset("r2r", [6.0, 27.9], p=0.35)
    n = preset("r2r", [6.0, 27.9], p=0.35, corun_latency=[None, None])
    assert not n.has_corun
    assert tr_model.evaluate(s, 4, (1, 1)).throughput_tok_s == tr_model.evaluate(n, 4, (1, 1)).throughput_tok_s


def test_one_request_never_coruns():
    # N = 1: a single request is never on two models at once, so the closed form 1000 / (L0 + p L1) holds
    s = preset("r2r", [6.0, 27.9], p=0.35, corun_latency=[3.0, 2.0])
    ev = tr_model.evaluate(s, 1, (1, 1))
    assert abs(ev.throughput_tok_s - 1000.0 / (6.0 + 0.35 * 27.9)) < 1e-9


def test_tie_rule_launching_together_is_corunning():
    # M = 2, deterministic routing 0 -> 1 -> 0, N = 2, B = (1, 1): the two requests alternate; after the
    # first epoch both models complete together and launch together, so both get their co-running time.
    P = [[0.0, 1.0], [1.0, 0.0]]
    C = [[1.0, 0.0], [1.0, 0.0]]
    N = 2
    d = np.array([[2, 2, 2], [2, 2, 2]])
    dco = np.array([[5, 5, 5], [5, 5, 5]])
    # start: both at model 0, launches (2 requests) alone -> solo 2 quanta; then both move to model 1,
    # launch alone -> 2 quanta; back to 0 ... every launch is alone: 1 token per request per 2 quanta
    s1 = dtmc.solve_chain(P, C, d, N, (1, 1), dco=dco)
    assert abs(s1.throughput_per_quantum - 2 / 4) < 1e-12  # two steps of 2 quanta commit 2 tokens
    # with B = (1, 1) but a cap of 1 on model 0, one request is served at a time on model 0: the first
    # launch is solo (2), then model 0 (the second request) and model 1 (the first) launch together at
    # t = 2: co-running (5 each); they end together at t = 7 and launch together again, forever.
    s2 = dtmc.solve_chain(P, C, d, N, (1, 1), caps=[1, 2], dco=dco)
    assert s2.states == 2
    assert abs(s2.throughput_per_quantum - 1 / 5) < 1e-12  # one token (from model 0's step) per 5 quanta
    ref, n = exact_reference(P, C, d, N, (1, 1), dco=dco, caps=[1, 2])
    assert n == 2 and abs(ref - 1 / 5) < 1e-12


def test_duration_is_fixed_at_launch():
    # R2R-like, N = 3, d = (1, 3), dco = (2, 5): a batch of model 1 launched alone runs 3 quanta, and
    # model 0 may launch (co-running, 2 quanta) while it runs; the chain must then hold states in which
    # model 1's residual comes from its solo duration (3 - 1 = 2 after one quantum, or 3 itself) while
    # model 0 runs: a batch is not re-timed when another model joins it.
    P = [[0.5, 0.5], [1.0, 0.0]]
    C = [[1.0, 0.0], [1.0, 0.0]]
    N = 3
    d = np.array([[1] * (N + 1), [3] * (N + 1)])
    dco = np.array([[2] * (N + 1), [5] * (N + 1)])
    ch = dtmc.build_chain(P, C, d, N, (1, 1), dco=dco)
    both = (ch.batch[:, 0] > 0) & (ch.batch[:, 1] > 0)
    assert both.any()
    # residual 2 of model 1 with model 0 running: model 1 started solo (3), one quantum passed, then
    # model 0 launched (co-running: 2): only possible if model 1 kept its solo duration
    assert ((ch.residual[:, 1] == 2) & (ch.residual[:, 0] == 2) & both).any()
    ref, n = exact_reference(P, C, d, N, (1, 1), dco=dco)
    sol = dtmc.solve_chain(P, C, d, N, (1, 1), dco=dco)
    assert ch.n_states == n and abs(sol.throughput_per_quantum - ref) < 1e-12


MC_CASES = [
    ("r2r-N4-F2.8", lambda: preset("r2r", [6.0, 28.0], p=0.35, corun_latency=[2.8, None], delta_ms=0.4), 4, (1, 1)),
    ("r2r-N5-F3-1.25", lambda: preset("r2r", [2.0, 8.0], p=0.35, corun_latency=[3.0, 1.25], delta_ms=0.5), 5, (1, 2)),
    ("rstitch-table", lambda: preset("r-stitch", [2.0, 6.0], p=0.3, q=0.5, delta_ms=0.5, corun_latency=[
        {"batch_size": [1, 4], "step_latency_ms": [4.0, 5.5]}, {"slowdown": 1.5}]), 4, (2, 1)),
    ("me3-caps", lambda: make_spec([1.0, 2.0, 3.0], [[0.5, 0.3, 0.2]] * 3, [[1, 1, 1]] * 3, delta_ms=0.5,
                                   max_batch_size=[2, None, 2], corun_latency=[4.0, 2.0, 1.5]), 4, (1, 1, 1)),
]


@pytest.mark.parametrize("case", MC_CASES, ids=[c[0] for c in MC_CASES])
def test_chain_within_monte_carlo_interval(case):
    _, build, N, B = case
    spec = build()
    ev = tr_model.evaluate(spec, N, B)
    d, _ = spec.quanta_table(N)
    dco, _ = spec.corun_quanta_table(N)
    est, se = simulate(spec.P, spec.C, d, N, B, epochs=60_000, seed=11, dco=dco, caps=spec.caps(N))
    exact = ev.throughput_tok_s * spec.delta_ms / 1000.0
    assert se > 0
    assert abs(est - exact) <= 3.5 * se, (est, exact, se)
    # the interval is narrow enough to see the law: the solo chain is outside it
    solo = tr_model.evaluate(preset_without_corun(spec), N, B).throughput_tok_s * spec.delta_ms / 1000.0
    assert abs(est - solo) > 3.5 * se


def preset_without_corun(spec):
    from dataclasses import replace
    return replace(spec, corun_latency=None)
