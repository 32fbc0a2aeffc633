"""Ranking with common random numbers, tie detection, B* search; simulator vs the exact chain."""

from __future__ import annotations

import math

import pytest

from tr_core.errors import SpecError
from tr_core.spec import LatencyCurve, make_spec, preset
from simulator import feasible_thresholds, optimize_by_simulation, rank_candidates, simulate

tr_model = pytest.importorskip("tr_model")
R2R = preset("r2r", [6.0, 27.9], p=0.35)


def _exact(spec, N, B):
    return tr_model.evaluate(spec, N, B)


@pytest.mark.parametrize("M,N", [(2, 1), (2, 7), (3, 5), (4, 3)])
def test_feasible_set_is_complete(M, N):
    got = feasible_thresholds(N, M)
    # x_i = B_i - 1 >= 0 with sum x_i <= N - 1: C(N - 1 + M, M) vectors
    assert len(got) == math.comb(N - 1 + M, M)
    assert len(set(got)) == len(got) and got == sorted(got)
    assert all(sum(b - 1 for b in B) < N and min(B) >= 1 for B in got)


def test_ranking_agrees_with_the_exact_chain():
    N = 8
    cands = [(1, 1), (1, 3), (1, 5), (2, 4), (3, 1)]
    rk = rank_candidates(R2R, N, cands, steps=800_000, seed=5)
    exact = {B: _exact(R2R, N, B).throughput_tok_s for B in cands}
    assert rk.best_B == max(exact, key=exact.get)
    best = rk.entries[0]
    for e in rk.entries[1:]:
        if not e.tied_with_best:
            assert exact[e.B] < exact[best.B]
        # common random numbers: the paired interval beats the independent one
        assert e.diff_ci95_tok_s < math.hypot(e.ci95_tok_s, best.ci95_tok_s)
    assert [r["B"] for r in rk.to_rows()] == [list(e.B) for e in rk.entries]


def test_symmetric_candidates_are_flagged_as_tied():
    # two identical models fed by the same row: B = (1, 2) and (2, 1) have the same throughput
    spec = make_spec([10.0, 10.0], [[0.5, 0.5], [0.5, 0.5]], [[1, 1], [1, 1]])
    e12, e21, e22 = (_exact(spec, 4, B).throughput_tok_s for B in [(1, 2), (2, 1), (2, 2)])
    assert e12 == pytest.approx(e21, rel=1e-9) and e22 < e12
    rk = rank_candidates(spec, 4, [(2, 2), (1, 2), (2, 1)], steps=400_000, seed=1)
    assert set(rk.tie_set) == {(1, 2), (2, 1)}
    assert rk.entries[-1].B == (2, 2) and not rk.entries[-1].tied_with_best


def test_optimize_by_simulation_finds_the_exact_optimum():
    N = 8
    opt = tr_model.optimize(R2R, N)
    got = optimize_by_simulation(R2R, N, budget_s=4.0, seed=0)
    exact_of_best = _exact(R2R, N, got.best_B).throughput_tok_s
    assert opt.best_B in got.tie_set or got.best_B == opt.best_B
    assert exact_of_best >= opt.throughput_tok_s * 0.995
    assert abs(got.throughput_tok_s - opt.throughput_tok_s) <= 3 * got.ci95_tok_s + 0.01 * opt.throughput_tok_s
    assert got.evaluated == len(feasible_thresholds(N, 2))
    assert got.gain_vs_eager == pytest.approx(got.throughput_tok_s / got.eager_throughput_tok_s - 1, rel=1e-9)
    assert got.seconds < 30


def test_rank_candidates_validates():
    with pytest.raises(SpecError, match="repeat"):
        rank_candidates(R2R, 4, [(1, 2), (1, 2)], steps=1000)
    with pytest.raises(SpecError, match="at least one"):
        rank_candidates(R2R, 4, [], steps=1000)
    with pytest.raises(SpecError, match="infeasible"):
        rank_candidates(R2R, 4, [(1, 9)], steps=1000)


TABLE = LatencyCurve("table", batch_size=(1, 4, 16), step_latency_ms=(6.0, 6.6, 9.0))
AFFINE = LatencyCurve("affine", intercept_ms=27.5, per_request_ms=0.4)


@pytest.mark.parametrize("spec,N,B", [
    (make_spec([6.0, 27.9], R2R.P, R2R.C, latency_curves=[TABLE, AFFINE]), 6, (1, 2)),
    (make_spec([6.0, 27.9], R2R.P, R2R.C, latency_curves=[TABLE, AFFINE], max_batch_size=[None, 2]), 6, (1, 1)),
    (make_spec([6.0, 15.0, 27.9], [[0.5, 0.3, 0.2]] * 3, [[1] * 3] * 3, max_batch_size=[3, None, 2]), 5, (1, 2, 1)),
    (preset("r-stitch", [5.0, 30.0], p=0.25, q=0.5), 5, (2, 3)),
])
def test_simulation_agrees_with_the_exact_chain(spec, N, B):
    ex = _exact(spec, N, B)
    r = simulate(spec, N, B, steps=1_000_000, seed=17)
    # 1.5 half-widths: the report (benchmarks/validate_simulator.py) measures the 95% coverage itself
    assert abs(r.throughput_tok_s - ex.throughput_tok_s) <= 1.5 * r.throughput_ci95_tok_s
    for i in range(spec.M):
        assert r.mean_waiting[i] == pytest.approx(ex.mean_waiting[i], rel=0.03, abs=0.005)


def test_optimum_and_ranking_serialise_to_json():
    import json
    got = optimize_by_simulation(R2R, 3, budget_s=0.5, seed=1)
    d = json.loads(json.dumps(got.to_dict()))
    assert d["schema_version"] == 1 and d["best_B"] == list(got.best_B)
    assert d["evaluated"] == len(feasible_thresholds(3, 2)) == len(got.table)
    assert all(list(b) in [r["B"] for r in d["finalists"]] for b in got.tie_set)
    rk = rank_candidates(R2R, 3, [(1, 1), (1, 2)], steps=20_000)
    assert json.loads(json.dumps(rk.to_dict()))["best_B"] == list(rk.best_B)
