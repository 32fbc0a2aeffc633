"""Cluster simulator workloads and metrics: the Azure trace reader, windows, the next-model prior, Poisson
streams, comparison metrics and standard errors checked by hand, executors, capacity calibration."""

from __future__ import annotations

import concurrent.futures as cf
import math
import os

import numpy as np
import pandas as pd
import pytest

from shadow_prefill import SessionSet, SyntheticParams, generate_synthetic_sessions
from shadow_prefill.cluster.metrics import compare_runs, reduction_by_context, summarize_comparison
from shadow_prefill.cluster.sim import ClusterConfig, RunResult, Scenario, calibrate_capacity, simulate_cluster
from shadow_prefill.cluster.sweep import map_tasks, run_grid, sweep
from shadow_prefill.cluster.workload import (RequestSizes, next_model_prior, normal_arrivals, read_azure_trace,
                                             schedule_sessions, synthetic_request_sizes, window_multipliers)
from shadow_prefill.errors import InputFileError, ShadowError

from conftest import SHARED

CAP = (17.0, 5.5)


# ----------------------------------------------------------------------------- Azure trace format

def test_read_azure_trace(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:15:50.9951690,396,109\n"
                 "2023-11-16 19:15:51.2224670,879,55\n")
    s = read_azure_trace(p)
    assert list(s.prompt) == [374, 396, 879] and list(s.output) == [44, 109, 55]
    assert s.times_s[1] == pytest.approx(4.314579, abs=1e-6)
    w = window_multipliers(s, bucket_s=1800.0)
    assert w["peak"] == 1.0 and w["trough"] == 0.5  # 2 arrivals in the first half hour, 1 in the second


@pytest.mark.parametrize("body,where", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,12,x\n", ":2:"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,12,3\n2023-11-16 18:15:47.1,0,3\n", ":3:"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.1,12\n", ":2:"),
    ("TIMESTAMP,Tokens\n1,2\n", ":1:"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,12,3\n", ":2:"),
])
def test_azure_reader_names_bad_lines(tmp_path, body, where):
    p = tmp_path / "bad.csv"
    p.write_text(body)
    with pytest.raises(InputFileError) as e:
        read_azure_trace(p)
    assert where in str(e.value)


def test_real_azure_trace_when_present():
    path = os.path.join(SHARED, "data", "azure-llm-inference-2023", "AzureLLMInferenceTrace_conv.csv")
    if not os.path.exists(path):
        pytest.skip(f"shared data not present: {path}")
    s = read_azure_trace(path)
    ref = pd.read_csv(path)
    assert s.n == len(ref) and s.prompt.sum() == ref.ContextTokens.sum() and s.output.sum() == ref.GeneratedTokens.sum()
    w = window_multipliers(s, bucket_s=300.0)
    assert 0 < w["trough"] <= w["median"] <= 1.0


# ----------------------------------------------------------------------------- streams and prior

def test_normal_arrivals_poisson_rate_and_sizes():
    sizes = RequestSizes(np.array([10, 20, 30]), np.array([1, 2, 3]))
    rng = np.random.default_rng(0)
    t, inst, p, o = normal_arrivals(np.array([5.0, 0.0, 2.0]), 2000.0, sizes, rng)
    assert np.all(np.diff(t) >= 0) and t.max() < 2000.0
    assert set(np.unique(inst)) == {0, 2}
    for i, lam in ((0, 5.0), (2, 2.0)):
        n = (inst == i).sum()
        assert abs(n - lam * 2000) < 4 * math.sqrt(lam * 2000)
    # sizes drawn jointly: output = prompt / 10
    assert np.array_equal(o, p // 10)


def test_next_model_prior_leave_one_session_out_by_hand():
    # task 0 sessions: A A B | A B | A A ; transitions from A: s0: A->A, A->B; s1: A->B; s2: A->A
    ss = SessionSet.from_arrays(model_names=("A", "B"), lengths=[3, 2, 2], model=[0, 0, 1, 0, 1, 0, 0],
                                prompt=[10, 20, 30, 10, 20, 10, 20], new_input=[10, 5, 5, 10, 5, 10, 5],
                                output=[5] * 7, task=[0, 0, 0])
    P = next_model_prior(ss, smoothing=0.5)
    # call 0 of session 0 (model A): others' A-transitions: A->B (s1), A->A (s2) -> (1.5, 1.5) / 3
    assert P[0] == pytest.approx([0.5, 0.5])
    # call 3 (session 1, A): others: A->A twice? s0 has A->A and A->B, s2 A->A -> A: 2 + .5, B: 1 + .5
    assert P[3] == pytest.approx([2.5 / 4, 1.5 / 4])
    # call 2 (session 0, model B): no B transitions anywhere -> uniform
    assert P[2] == pytest.approx([0.5, 0.5])
    assert np.allclose(P.sum(axis=1), 1.0)


def test_schedule_sessions_window_and_resampling():
    ss = generate_synthetic_sessions(SyntheticParams(n_sessions=5, seed=0))
    sch = schedule_sessions(ss, 1.0, 10.0, 50.0, np.random.default_rng(0))
    assert np.all(sch.start_s < 60.0) and np.all(np.diff(sch.start_s) > 0)
    assert np.array_equal(sch.measured, sch.start_s >= 10.0)
    assert sch.source.max() < 5 and sch.meta["resampled"] == sch.source.size - 5
    with pytest.raises(ShadowError):
        schedule_sessions(ss, 0.0, 10.0, 50.0, np.random.default_rng(0))


# ----------------------------------------------------------------------------- calibration

def test_calibrated_capacity_brackets_the_90_percent_point():
    from shadow_prefill.cluster.sim import _normal_only, build_latency_models
    cfg = ClusterConfig()
    lm = build_latency_models(cfg)[0]
    sizes = synthetic_request_sizes(2000, seed=1)
    cap = calibrate_capacity(lm, cfg, sizes, duration_s=120.0, warm_s=20.0, rel_tol=0.05)
    kv = lm.kv_capacity_tokens()
    assert _normal_only(lm, cfg, kv, cap, sizes, 120.0, 20.0, 12345) >= 0.9
    assert _normal_only(lm, cfg, kv, cap * 1.3, sizes, 120.0, 20.0, 12345) < 0.9
    assert calibrate_capacity(lm, cfg, sizes, duration_s=120.0, warm_s=20.0, rel_tol=0.05) == cap  # memoized


# ----------------------------------------------------------------------------- metrics

@pytest.fixture(scope="module")
def grid():
    ss = generate_synthetic_sessions(SyntheticParams(n_sessions=60, seed=2))
    sc = Scenario(warmup_s=20.0, measure_s=100.0, drain_s=900.0, session_rate=0.3)
    runs = run_grid(ss, ClusterConfig(), ["No Shadow", "Harvest-SLO+Host", "Oracle"], seeds=(0, 1),
                    windows=("peak", "trough"), scenario=sc, capacity=CAP)
    return ss, sc, runs


def test_compare_runs_by_hand(grid):
    _, _, runs = grid
    assert len(runs) == 12
    per = compare_runs(runs)
    assert len(per) == 12
    b, a = runs[0], runs[1]
    assert (b.approach, a.approach) == ("No Shadow", "Harvest-SLO+Host")
    grp = runs[:3]
    common = b.call_measured.copy()
    for r in grp:
        common &= r.call_finish_s >= 0
    sw = common & b.call_switch
    lat_a = (a.call_finish_s - a.call_issue_s)[sw].mean()
    lat_b = (b.call_finish_s - b.call_issue_s)[sw].mean()
    row = per[(per.approach == "Harvest-SLO+Host") & (per.seed == 0) & (per.window == "peak")].iloc[0]
    assert row.switch_latency_reduction_pct == pytest.approx(100 * (1 - lat_a / lat_b))
    ttft_a = (a.call_first_token_s - a.call_issue_s)[common].mean()
    ttft_b = (b.call_first_token_s - b.call_issue_s)[common].mean()
    assert row.call_ttft_reduction_pct == pytest.approx(100 * (1 - ttft_a / ttft_b))
    cost = lambda r: ((r.call_prompt - r.call_hit + 0.1 * r.call_hit) + r.call_output)[common].sum()
    assert row.token_cost_reduction_pct == pytest.approx(100 * (1 - cost(a) / cost(b)))
    base_row = per[(per.approach == "No Shadow") & (per.seed == 0) & (per.window == "peak")].iloc[0]
    assert base_row.call_latency_reduction_pct == 0.0 and base_row.normal_slo_delta_pp == 0.0
    # +-1 SE over seeds x windows
    summ = summarize_comparison(per)
    x = per[per.approach == "Oracle"].switch_ttft_reduction_pct.to_numpy()
    o = summ[summ.approach == "Oracle"].iloc[0]
    assert o.runs == 4
    assert o.switch_ttft_reduction_pct == pytest.approx(x.mean())
    assert o.switch_ttft_reduction_pct_se == pytest.approx(x.std(ddof=1) / 2)
    assert o.switch_ttft_reduction_pct > 0


def test_reduction_by_context_bins(grid):
    _, _, runs = grid
    df = reduction_by_context(runs, (0, 8000, math.inf))
    assert set(df.approach) == {"No Shadow", "Harvest-SLO+Host", "Oracle"}
    assert (df[df.approach == "No Shadow"].switch_latency_reduction_pct.fillna(0) == 0).all()


def test_executor_gives_same_results_as_serial(grid):
    ss, sc, runs = grid
    with cf.ThreadPoolExecutor(2) as ex:
        par = run_grid(ss, ClusterConfig(), ["No Shadow", "Harvest-SLO+Host", "Oracle"], seeds=(0, 1),
                       windows=("peak", "trough"), scenario=sc, capacity=CAP, executor=ex)
    for a, b in zip(runs, par):
        assert a.approach == b.approach
        assert np.array_equal(a.call_finish_s, b.call_finish_s)


def test_dask_client_executor(grid):
    distributed = pytest.importorskip("distributed", reason="dask.distributed is an optional extra")
    ss, sc, runs = grid
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as client:
        par = run_grid(ss, ClusterConfig(), ["No Shadow", "Harvest-SLO+Host", "Oracle"], seeds=(0,),
                       windows=("peak",), scenario=sc, capacity=CAP, executor=client)
    for a, b in zip(runs[:3], par):
        assert a.approach == b.approach and np.array_equal(a.call_finish_s, b.call_finish_s)


def test_map_tasks_process_pool():
    assert map_tasks(abs, [-1, -2, 3], workers=2) == [1, 2, 3]
    with pytest.raises(ShadowError):
        map_tasks(abs, [1], workers=0)


def test_sweep_load(grid):
    ss, sc, _ = grid
    df = sweep(ss, "rho", [0.3, 0.9], approaches=("Harvest-SLO",), seeds=(0,), windows=("peak",), scenario=sc,
               capacity=CAP)
    assert list(df.value.unique()) == [0.3, 0.9]
    assert set(df.approach) == {"No Shadow", "Harvest-SLO"}
    with pytest.raises(ShadowError, match="cannot sweep"):
        sweep(ss, "colour", [1], capacity=CAP)
