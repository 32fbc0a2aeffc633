"""Routing estimator: P, C, Wilson intervals (coverage), geometric-run test (size and power), request spread."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
from scipy.stats import chi2

from profiler.routing import (estimate_routing, geometric_hazard_test, routing_provenance, spec_matrices,
                              wilson_interval)
from profiler.synth import write_synthetic_trace
from profiler.system import build_system_spec
from profiler.trace import TraceError, read_trace_records
from tr_core.errors import SpecError
from tr_core.spec import load_spec, save_spec

P2 = [[0.75, 0.25], [0.6, 0.4]]
C2 = [[1, 0], [1, 1]]


def test_wilson_interval_hand_values():
    lo, hi = wilson_interval(3, 10)
    assert abs(float(lo) - 0.10779) < 1e-4 and abs(float(hi) - 0.60322) < 1e-4
    lo, hi = wilson_interval([0, 10], [10, 10])
    assert lo[0] == 0.0 and hi[1] == 1.0
    assert abs(hi[0] - 0.27753) < 1e-4 and abs(lo[1] - 0.72247) < 1e-4
    lo, hi = wilson_interval(0, 0)
    assert math.isnan(float(lo)) and math.isnan(float(hi))


def test_hazard_test_matches_hand_computation():
    at_risk = np.array([0, 100, 50])
    events = np.array([0, 50, 10])
    g = geometric_hazard_test(at_risk, events, min_expected=5)
    q = 60 / 150
    G = 2 * (50 * math.log(0.5 / q) + 50 * math.log(0.5 / (1 - q)) + 10 * math.log(0.2 / q)
             + 40 * math.log(0.8 / (1 - q)))
    assert g.leave_probability == pytest.approx(q)
    assert g.dof == 1
    assert g.statistic == pytest.approx(G, rel=1e-12)
    assert g.p_value == pytest.approx(chi2.sf(G, 1), rel=1e-9)
    assert g.verdict.startswith("reject")
    flat = geometric_hazard_test(np.array([0, 100, 60]), np.array([0, 40, 24]), min_expected=5)
    assert flat.statistic == pytest.approx(0.0, abs=1e-9) and flat.p_value == pytest.approx(1.0)
    assert flat.verdict.startswith("consistent")
    assert "degenerate" in geometric_hazard_test(np.array([0, 10]), np.array([0, 10])).verdict
    assert "insufficient" in geometric_hazard_test(np.array([0, 0]), np.array([0, 0])).verdict


def test_estimate_matches_reference_counts_and_means(tmp_path):
    path = tmp_path / "t.jsonl"
    write_synthetic_trace(path, [[0.5, 0.3, 0.2], [0.4, 0.4, 0.2], [0.3, 0.3, 0.4]],
                          [[1, 0, 0], [1, 2, 0], [3, 0, 1]], n_requests=40, steps_per_request=40, seed=2)
    est = estimate_routing(path)
    n = np.zeros((3, 3))
    toks = defaultdict(list)
    per_req = defaultdict(lambda: [0, 0])
    for r in read_trace_records(path):
        if r.next_model < 0:
            continue
        n[r.model, r.next_model] += 1
        toks[r.model, r.next_model].append(r.committed_tokens)
        if r.model == 0:
            per_req[r.request_id][0] += 1
            per_req[r.request_id][1] += r.next_model != 0
    np.testing.assert_array_equal(est.counts, n)
    np.testing.assert_allclose(est.P, n / n.sum(axis=1, keepdims=True))
    for (i, j), v in toks.items():
        assert est.C[i, j] == pytest.approx(np.mean(v))
        assert est.C_std[i, j] == pytest.approx(np.std(v, ddof=1) if len(v) > 1 else 0.0, abs=1e-9)
    # escalation spread against a direct computation
    nr = np.array([v[0] for v in per_req.values()], dtype=float)
    xr = np.array([v[1] for v in per_req.values()], dtype=float)
    x = xr.sum() / nr.sum()
    D = np.sum((xr - nr * x) ** 2 / (nr * x * (1 - x)))
    assert est.escalation.requests == len(nr)
    assert est.escalation.pooled_rate == pytest.approx(x)
    assert est.escalation.mean_rate == pytest.approx(np.mean(xr / nr))
    assert est.escalation.std_rate == pytest.approx(np.std(xr / nr, ddof=1))
    assert est.escalation.dispersion_statistic == pytest.approx(D, rel=1e-9)
    assert abs(est.escalation.quantiles["p50"] - np.median(xr / nr)) < 0.02


def test_intervals_cover_true_P_at_nominal_rate(tmp_path):
    P = np.array([[0.85, 0.1, 0.05], [0.5, 0.3, 0.2], [0.2, 0.2, 0.6]])
    C = [[1, 0, 0], [1, 1, 0], [1, 0, 1]]
    covered = total = 0
    for seed in range(80):
        path = tmp_path / f"c{seed}.jsonl"
        write_synthetic_trace(path, P, C, n_requests=6, steps_per_request=60, seed=seed)
        est = estimate_routing(path, n_models=3)
        inside = (est.P_low <= P) & (P <= est.P_high)
        covered += int(inside.sum())
        total += inside.size
        path.unlink()
    rate = covered / total
    # 720 entry-intervals at nominal 95%: a correct interval lands well inside [0.91, 0.99]
    assert 0.91 <= rate <= 0.99, rate


def test_geometric_test_size_under_geometric_runs_with_censoring(tmp_path):
    # short requests and sticky models: most runs are cut by the request's end (right-censored)
    P = [[0.9, 0.1], [0.3, 0.7]]
    rejections = 0
    for seed in range(30):
        path = tmp_path / f"g{seed}.jsonl"
        write_synthetic_trace(path, P, C2, n_requests=60, steps_per_request=25, seed=100 + seed)
        est = estimate_routing(path)
        rejections += sum(g.p_value is not None and g.p_value < 0.05 for g in est.geometric)
        path.unlink()
    # 60 tests at level 0.05: expect 3; P(Bin(60, 0.05) >= 9) < 0.01
    assert rejections <= 8, rejections


@pytest.mark.parametrize("law", ["fixed:3", "negbin:3", "mixture:0.97"])
def test_geometric_test_rejects_non_geometric_runs(tmp_path, law):
    path = tmp_path / "ng.jsonl"
    write_synthetic_trace(path, [[0.8, 0.2], [0.5, 0.5]], C2, n_requests=60, steps_per_request=100, seed=7,
                          run_law=law)
    est = estimate_routing(path)
    g0 = est.geometric[0]
    assert g0.p_value is not None and g0.p_value < 1e-3, g0
    assert g0.verdict.startswith("reject")
    if law.startswith("mixture"):
        assert est.escalation.p_value < 1e-3  # requests differ: overdispersed escalation rates


def test_geometric_trace_accepted_and_homogeneous(tmp_path):
    path = tmp_path / "ok.jsonl"
    write_synthetic_trace(path, P2, C2, n_requests=100, steps_per_request=100, seed=11)
    est = estimate_routing(path)
    assert all(g.verdict.startswith("consistent") for g in est.geometric), [g.verdict for g in est.geometric]
    assert est.escalation.p_value > 0.01
    for i in range(2):
        g = est.geometric[i]
        assert g.leave_probability == pytest.approx(1 - est.P[i, i])
        assert g.expected_mean_run == pytest.approx(1 / (1 - P2[i][i]), rel=0.1)


def test_spec_from_estimate_round_trips_with_provenance(tmp_path):
    path = tmp_path / "s.jsonl"
    write_synthetic_trace(path, P2, C2, n_requests=30, steps_per_request=50, seed=3)
    est = estimate_routing(path)
    spec = build_system_spec(est, step_latency_ms=[6.0, 27.9], name="t")
    out = tmp_path / "spec.json"
    save_spec(spec, out)
    back = load_spec(out)
    np.testing.assert_allclose(back.P, est.P)
    np.testing.assert_allclose(back.C, C2)
    iv = back.provenance["routing"]["routing_matrix_interval"]
    assert np.all(np.array(iv["low"]) <= back.P + 1e-12) and np.all(back.P <= np.array(iv["high"]) + 1e-12)
    assert len(back.provenance["routing"]["geometric_run_test"]) == 2
    assert routing_provenance(est)["transition_counts"] == est.counts.tolist()


def test_unobserved_row_and_model_count_errors(tmp_path):
    path = tmp_path / "u.jsonl"
    path.write_text('{"request_id": 1, "step": 0, "model": 0, "next_model": 0, "committed_tokens": 1}\n'
                    '{"request_id": 1, "step": 1, "model": 0, "next_model": 0, "committed_tokens": 1}\n')
    est = estimate_routing(path, n_models=2)
    with pytest.raises(SpecError, match="model.*1.*never"):
        spec_matrices(est)
    path.write_text('{"request_id": 1, "step": 0, "model": 0, "next_model": 2, "committed_tokens": 1}\n')
    with pytest.raises(TraceError, match="outside"):
        estimate_routing(path, n_models=2)
    with pytest.raises(TraceError, match="--models"):
        estimate_routing(path, n_models=1)


def test_provenance_is_strict_json_even_with_unobserved_entries(tmp_path):
    import json
    path = tmp_path / "n.jsonl"
    # model 1 never stays on itself and model 0 never leaves on the first request: NaN-prone entries
    path.write_text('{"request_id": 1, "step": 0, "model": 0, "next_model": 1, "committed_tokens": 0}\n'
                    '{"request_id": 1, "step": 1, "model": 1, "next_model": 0, "committed_tokens": 1}\n'
                    '{"request_id": 1, "step": 2, "model": 0, "next_model": -1, "committed_tokens": 1}\n')
    est = estimate_routing(path)
    text = json.dumps(routing_provenance(est), allow_nan=False)  # raises on NaN/inf
    doc = json.loads(text)
    assert doc["committed_tokens_std"][1][1] is None and doc["routing_matrix_interval"]["low"][0][0] == 0.0
    spec = build_system_spec(est, step_latency_ms=[1.0, 2.0])
    json.dumps(spec.provenance, allow_nan=False)


def test_run_length_histogram_matches_reference(tmp_path):
    path = tmp_path / "h.jsonl"
    write_synthetic_trace(path, [[0.6, 0.4], [0.3, 0.7]], C2, n_requests=30, steps_per_request=40, seed=9)
    est = estimate_routing(path)
    # reference: completed runs (ended by a switch) of requests observed from step 0
    hist = [defaultdict(int), defaultdict(int)]
    cur = {}
    for r in read_trace_records(path):
        run = cur.get(r.request_id, 0) + 1
        if r.next_model == -1:
            cur.pop(r.request_id, None)
        elif r.next_model != r.model:
            hist[r.model][min(run, 33)] += 1
            cur[r.request_id] = 0
        else:
            cur[r.request_id] = run
    for i in range(2):
        got = est.geometric[i].run_length_counts
        assert len(got) == 33
        assert list(got) == [hist[i][k] for k in range(1, 34)]
