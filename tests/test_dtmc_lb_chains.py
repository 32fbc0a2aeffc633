"""Chains under a batch-size-dependent step latency L(b), where every batch size has its own duration.

Such chains mix slowly (R2R under the H200 graph-mode profiles, eager, N = 32: 173,897 states): after
Anderson the tree bound falls by less than twofold per Gauss-Seidel sweep, and a sparse LU of the
Poisson equation fills in beyond any budget.  Checked here: the polish keeps going while the bound falls
(the throughput is proven within 1e-6 by the tree bound alone), and the bracket skips an LU whose
elimination work is prohibitive, still returning a valid bracket.
"""

import numpy as np
import pytest

import dtmc
from dtmc import solve as S
from tr_core.grid import coarsest_delta, spec_latencies
from tr_core.spec import preset

# median step latencies (ms) of Qwen3-0.6B and Qwen3-32B, CUDA graphs, one H200 (shared/data/h200-profiles)
SMALL = {"batch_size": [1, 2, 4, 8, 16], "step_latency_ms": [4.64, 4.91, 5.41, 5.87, 7.27]}
LARGE = {"batch_size": [1, 2, 4, 8, 16], "step_latency_ms": [26.32, 28.22, 31.20, 37.15, 48.45]}


@pytest.fixture(scope="module")
def chain():
    N = 32
    spec = preset("r2r", [4.64, 26.32], p=0.35, latency_curves=[SMALL, LARGE])
    # the quantum --delta-ms auto picks (0.13518 ms): on it the old polish stopped after two sweeps
    spec = spec.with_delta(coarsest_delta(spec_latencies(spec, N)))
    d, _ = spec.quanta_table(N, round_to_grid=True)
    assert len(set(d[1, 1:17].tolist())) >= 12       # (nearly) every batch size its own duration
    return dtmc.build_chain(spec.P, spec.C, d, N, (1, 1), caps=spec.caps(N))


@pytest.mark.slow
def test_polish_proves_a_slowly_mixing_chain(chain):
    st = S.stationary_distribution(chain.T)
    assert st.solver.startswith("anderson")
    tb = S.throughput_bound(st.error_bound, st.n_recurrent)
    # the tree bound alone proves the throughput within the accuracy tolerance (no bracket asked for)
    assert tb <= dtmc.ACCURACY_TOL, (st.solver, tb)
    # and the bound is honest: an independent, longer iteration agrees within it
    x, _, _ = S._anderson(chain.T.T.tocsr(), 1e-15, 20000, st.pi)
    v0 = float(st.pi @ chain.g) / float(st.pi @ chain.tau)
    v1 = float(x @ chain.g) / float(x @ chain.tau)
    assert abs(v1 - v0) <= 2 * tb * v1


def _record_methods(monkeypatch) -> list:
    calls = []
    real = S.relative_values

    def spy(*a, **k):
        calls.append(k.get("method", "direct"))
        return real(*a, **k)

    monkeypatch.setattr(S, "relative_values", spy)
    return calls


@pytest.mark.slow
def test_bracket_skips_a_prohibitive_lu(chain, monkeypatch):
    assert S.lu_work(chain.T) > S.BRACKET_LU_MAX_WORK
    calls = _record_methods(monkeypatch)
    st = S.stationary_distribution(chain.T)
    value = float(st.pi @ chain.g) / float(st.pi @ chain.tau)
    # a deliberately poor iterate: the iterated relative values cannot bracket it tightly, and the LU
    # that would (hours of fill-in on this chain) is not attempted
    rough = np.full(chain.T.shape[0], 1.0 / chain.T.shape[0])
    lo, hi = S.throughput_bracket(chain.T, chain.g, chain.tau, rough, direct=True)
    assert calls == ["gauss-seidel"]
    assert lo <= value * (1 + 1e-9) and value <= hi * (1 + 1e-9)


def test_lu_work_allows_the_chains_whose_lu_is_cheap(monkeypatch):
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    d, _ = spec.quanta_table(16)
    ch = dtmc.build_chain(spec.P, spec.C, d, 16, (1, 1), caps=spec.caps(16))
    assert S.lu_work(ch.T) < S.BRACKET_LU_MAX_WORK
    st = S.stationary_distribution(ch.T)
    calls = _record_methods(monkeypatch)
    rough = np.full(ch.T.shape[0], 1.0 / ch.T.shape[0])
    lo, hi = S.throughput_bracket(ch.T, ch.g, ch.tau, rough, direct=True)
    value = float(st.pi @ ch.g) / float(st.pi @ ch.tau)
    # the iterated bracket of a poor iterate is loose, so the LU runs (the two brackets, both valid, meet)
    assert calls == ["gauss-seidel", "direct"]
    assert lo <= value * (1 + 1e-9) and value <= hi * (1 + 1e-9)
