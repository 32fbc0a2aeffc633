"""tr_model.sensitivity: checked against the N = 1 closed form and optimality facts."""

import pytest

import tr_model
from tr_core.errors import SpecError
from tr_model.sensitivity import (bstar_grid, compare_systems, grid_latency, perturbed_preset,
                                  profiling_sensitivity)


def test_grid_latency():
    assert grid_latency(29.295, 0.1) == pytest.approx(29.3)
    assert grid_latency(0.01, 0.1) == pytest.approx(0.1)  # at least one quantum


def test_perturbed_preset_moves_one_parameter():
    s = perturbed_preset("r2r", [6.0, 27.9], p=0.35, parameter="p", rel_error=0.2)
    assert s.routing_matrix[0] == pytest.approx((0.58, 0.42))
    s = perturbed_preset("r2r", [6.0, 27.9], p=0.35, parameter="L1", rel_error=-0.1)
    assert s.step_latency_ms == pytest.approx((6.0, 25.1))  # 25.11 on the 0.1 ms grid
    with pytest.raises(SpecError):
        perturbed_preset("r2r", [6.0, 27.9], p=0.35, parameter="L2", rel_error=0.1)


def test_n1_prediction_error_matches_closed_form():
    # N = 1: T = 1000 / (L0 + p L1) tok/s, whatever B; so regret is 0 and
    # predicted / achieved - 1 = (L0' + p' L1') / (L0 + p L1) - 1.
    p, L0, L1 = 0.3, 5.0, 20.0
    t = profiling_sensitivity("r2r", [L0, L1], 1, p=p, rel_errors=(-0.1, 0.2))
    assert len(t) == 6
    for _, r in t.iterrows():
        pp = p * (1 + r.rel_error) if r.parameter == "p" else p
        l0 = L0 * (1 + r.rel_error) if r.parameter == "L0" else L0
        l1 = L1 * (1 + r.rel_error) if r.parameter == "L1" else L1
        assert r.regret == pytest.approx(0.0, abs=1e-12)
        assert r.achieved_tok_s == pytest.approx(1000.0 / (l0 + pp * l1), rel=1e-9)
        assert r.prediction_error == pytest.approx((l0 + pp * l1) / (L0 + p * L1) - 1.0, rel=1e-7)


def test_regret_is_nonnegative_and_zero_when_bstar_unchanged():
    t = profiling_sensitivity("r2r", [6.0, 27.9], 4, p=0.35, parameters=["p", "L1"], rel_errors=(-0.2, 0.1))
    assert (t["regret"] >= -1e-12).all()
    assert (t["achieved_tok_s"] <= t["true_best_tok_s"] * (1 + 1e-12)).all()
    same = t[t["tuned_B"] == t["true_best_B"]]
    assert (same["regret"].abs() < 1e-12).all()
    with pytest.raises(SpecError):
        profiling_sensitivity("r2r", [6.0, 27.9], 4, p=0.35, parameters=["q"])


def test_bstar_grid_and_compare_systems_agree_with_optimize():
    g = bstar_grid("r2r", [0.35], [4.65], 4)
    assert g.loc[0, "L1_ms"] == pytest.approx(27.9)
    assert g.loc[0, "best_B"] == (1, 3)  # the model page's reference: B*(N = 4) = (1, 3)
    assert g.loc[0, "throughput_tok_s"] == pytest.approx(207.95, abs=0.01)
    spec = tr_model.preset("r-stitch", [6.0, 28.0], p=0.2, q=0.5)
    c = compare_systems({"rs": spec}, [1, 3])
    assert list(c["N"]) == [1, 3]
    o = tr_model.optimize(spec, 3)
    row = c[c["N"] == 3].iloc[0]
    assert row["best_B"] == o.best_B and row["gain_vs_eager"] == pytest.approx(o.gain_vs_eager)
    # N = 1, r-stitch: a request alternates runs with mean 1/p on model 0 and 1/q on model 1;
    # tokens per step = 1 - P(switch), so T = (pi0 (1-p) + pi1 (1-q)) / (pi0 L0 + pi1 L1)
    p, q = 0.2, 0.5
    pi0, pi1 = q / (p + q), p / (p + q)
    expect = 1000 * (pi0 * (1 - p) + pi1 * (1 - q)) / (pi0 * 6.0 + pi1 * 28.0)
    assert c[c["N"] == 1].iloc[0]["throughput_tok_s"] == pytest.approx(expect, rel=1e-9)
    with pytest.raises(SpecError):
        bstar_grid("me", [0.3], [2.0], 4)
