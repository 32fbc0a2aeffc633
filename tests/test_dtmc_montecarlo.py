"""The exact chain against an independently written per-request Monte Carlo simulation."""

import numpy as np
import pytest

import tr_model
from mc_reference import simulate
from tr_core.spec import make_spec, preset

CASES = [
    # id, spec builder, N, B
    ("r2r-N4-B11", lambda: preset("r2r", [6.0, 27.9], p=0.35), 4, (1, 1)),
    ("r2r-N6-B24", lambda: preset("r2r", [6.0, 27.9], p=0.35), 6, (2, 4)),
    ("rstitch-N5-B32", lambda: preset("r-stitch", [2.0, 7.0], p=0.3, q=0.6), 5, (3, 2)),
    ("me3-N3-B111", lambda: preset("me", [1.0, 2.0, 3.0], weights=[0.5, 0.3, 0.2]), 3, (1, 1, 1)),
    ("me3-N4-B121", lambda: preset("me", [0.5, 1.5, 2.5], weights=[0.2, 0.5, 0.3]), 4, (1, 2, 1)),
]


def _random_case(seed):
    rng = np.random.default_rng(100 + seed)
    M = 2 if seed % 2 == 0 else 3
    P = rng.dirichlet(np.ones(M) * 0.8, size=M)
    P[:, -1] = 1.0 - P[:, :-1].sum(axis=1)
    P = np.clip(P, 0, 1)
    C = np.round(rng.uniform(0, 2, size=(M, M)), 2)
    L = rng.integers(2, 30, size=M) * 0.5
    N = int(rng.integers(2, 6 if M == 2 else 4))
    B = [1] * M
    budget = N - 1
    for i in range(M):
        extra = int(rng.integers(0, budget + 1))
        B[i] += extra
        budget -= extra
    return make_spec(L, P, C, delta_ms=0.5), N, tuple(B)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_chain_matches_simulation_presets(case):
    _, build, N, B = case
    spec = build()
    _check(spec, N, B, seed=1)


@pytest.mark.parametrize("seed", range(4))
def test_chain_matches_simulation_random(seed):
    spec, N, B = _random_case(seed)
    _check(spec, N, B, seed=seed)


def _check(spec, N, B, seed):
    ev = tr_model.evaluate(spec, N, B)
    d = [int(round(L / spec.delta_ms)) for L in spec.step_latency_ms]
    est, se = simulate(spec.P, spec.C, d, N, B, epochs=60_000, seed=seed)
    exact_per_quantum = ev.throughput_tok_s * spec.delta_ms / 1000.0
    assert se > 0
    assert abs(est - exact_per_quantum) <= 3.5 * se, (est, exact_per_quantum, se)
