"""Issue 26: a `paper` workload where prediction matters, the paper's task metric, sessions drawn per seed.

* The `paper` preset mixes three task types calibrated to Table 1's routing benchmarks; their routers switch
  with different probabilities from each model, so the next-model prior (per task and current model) carries
  information: Predictive's gate and the shadow ordering act, and Predictive differs from Harvest.  The
  single-task preset of issue 16 (`paper-onetask`) is kept as the contrast: there the prior never crosses the
  gate and Predictive equals Harvest bit for bit (so the difference test can fail).
* LLM time per task is the paper's: per task (a session), ``1 - T_a / T_base``, then averaged; it differs from
  the all-call figure, which equals the pooled task figure when every measured session counts.
* Every seed replays its own random draw of sessions from the pool; every approach of one seed the same.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from shadow_prefill import SyntheticParams, generate_synthetic_sessions
from shadow_prefill.builder import WORKLOAD_PRESETS, LogNormal, TaskType, workload_preset
from shadow_prefill.cluster import _kernels as K
from shadow_prefill.cluster.metrics import _per_task_reduction, compare_runs
from shadow_prefill.cluster.sim import ClusterConfig, Scenario, simulate_cluster
from shadow_prefill.cluster.workload import next_model_prior, schedule_sessions
from shadow_prefill.errors import ShadowError
from shadow_prefill.stats import compute_switch_tax

CAP = (17.0, 5.5)

# Table 1 of the paper, routing benchmarks: switch share, switches per session, mean / p99 switch prompt
TABLE1 = {"xroutebench": (0.19, 2.3, 19e3, 113e3), "fusionbench": (0.26, 3.1, 13e3, 58e3),
          "router-r1": (0.33, 4.1, 10e3, 45e3)}


@pytest.fixture(scope="module")
def paper_pool():
    return generate_synthetic_sessions(workload_preset("paper", n_sessions=1500, seed=3), name="paper")


def test_paper_preset_statistics_in_table1_ranges(paper_pool):
    ss = paper_pool
    st = compute_switch_tax(ss)
    assert 0.19 <= st["switch_share"] <= 0.33
    assert 2.0 <= st["switches_per_session_mean"] <= 4.1
    assert 10e3 <= st["prompt_switch_mean_tokens"] <= 19e3
    assert 45e3 <= st["prompt_switch_p99_tokens"] <= 113e3
    assert 0.44 <= st["hit_switch"] <= 0.65
    assert list(ss.task_names) == list(TABLE1)
    sw = ss.is_switch
    sess = ss.session_of_call
    for t, name in enumerate(ss.task_names):
        share, per_sess, mean_p, _ = TABLE1[name]
        m = ss.task[sess] == t
        n_sess = int((ss.task == t).sum())
        assert n_sess > 300
        # each type near its benchmark: share within 3 points, switches per session within 20%, mean switch
        # prompt within 25% (the types differ from each other in the paper's order)
        assert abs(sw[m].mean() - share) < 0.03, name
        assert abs(sw[m].sum() / n_sess / per_sess - 1) < 0.2, name
        assert abs(ss.prompt[m & sw].mean() / mean_p - 1) < 0.25, name


def test_paper_prior_straddles_the_gate(paper_pool):
    ss = paper_pool
    P = next_model_prior(ss)
    p_other = P[np.arange(ss.n_calls), 1 - ss.model.astype(int)]
    below = p_other < 0.25
    # a good share of calls on each side of Predictive's gate; the prior tracks each type's router
    assert 0.2 < below.mean() < 0.8
    sess = ss.session_of_call
    for t, tt in enumerate(WORKLOAD_PRESETS["paper"].task_types):
        for m in (0, 1):
            sel = (ss.task[sess] == t) & (ss.model == m)
            assert abs(float(np.median(p_other[sel])) - tt.switch_from[m]) < 0.04
    # the single-task preset: every prior above the gate (issue 16: Predictive could not act)
    one = generate_synthetic_sessions(workload_preset("paper-onetask", n_sessions=400, seed=0))
    P1 = next_model_prior(one)
    assert np.all(P1[np.arange(one.n_calls), 1 - one.model.astype(int)] > 0.25)


def _small(name, n=160, seed=0):
    return generate_synthetic_sessions(workload_preset(name, n_sessions=n, seed=seed), name=name)


def _pair_runs(ss, approaches, seed=0, instances=1, rho=0.7):
    cfg = ClusterConfig(instances=instances, cache_normal_requests=True)
    sc = Scenario(rho=rho, warmup_s=20.0, measure_s=150.0, drain_s=900.0, session_rate=0.1, seed=seed)
    runs = [simulate_cluster(ss, cfg, a, sc, capacity=CAP) for a in approaches]
    for r in runs:
        assert r.totals[K.G_INVARIANT_ERRORS] == 0
    return runs


def test_predictive_differs_from_harvest_on_paper_but_not_on_one_task():
    runs = _pair_runs(_small("paper"), ("Harvest", "Predictive"))
    h, p = runs
    # the gate skips sessions whose next call is predicted to stay: fewer shadow tokens, other latencies
    assert p.totals[K.G_SHADOW_COMPUTED] < 0.9 * h.totals[K.G_SHADOW_COMPUTED]
    assert not np.array_equal(h.call_finish_s, p.call_finish_s)
    # the contrast: one memoryless task switching 27% of the time, the prior never falls below the gate
    h1, p1 = _pair_runs(_small("paper-onetask", n=400), ("Harvest", "Predictive"))
    assert h1.totals[K.G_SHADOW_COMPUTED] == p1.totals[K.G_SHADOW_COMPUTED]
    assert np.array_equal(h1.call_finish_s, p1.call_finish_s)


def test_task_time_is_per_task_then_averaged():
    ss = _small("paper")
    runs = _pair_runs(ss, ("No Shadow", "Harvest-SLO+Host", "Oracle+Host"))
    df = compare_runs(runs).set_index("approach")
    base = runs[0]
    for r in runs[1:]:
        row = df.loc[r.approach]
        # every measured session finished: the pooled task figure is the all-call figure
        assert row["unfinished_calls"] == 0
        assert row["task_time_pooled_reduction_pct"] == pytest.approx(row["call_latency_reduction_pct"], abs=1e-9)
        # the paper's figure weights every task alike, and tasks gain unequally
        common = base.call_measured & base.call_done & r.call_done
        tb = np.bincount(base.call_session[common], weights=base.call_latency_s[common])
        ta = np.bincount(r.call_session[common], weights=r.call_latency_s[common])
        ok = tb > 0
        per = 100 * (1 - ta[ok] / tb[ok])
        assert row["task_time_reduction_pct"] == pytest.approx(per.mean(), rel=1e-12)
        assert per.std() > 1.0
        assert abs(row["task_time_reduction_pct"] - row["call_latency_reduction_pct"]) > 0.01


def test_per_task_reduction_function():
    tb = np.array([10.0, 20.0, 40.0])
    # equal ratios: per-task = pooled = 50%
    assert _per_task_reduction(tb / 2, tb) == pytest.approx(50.0)
    # a short task that gains a lot and a long one that gains nothing: per-task mean 45%, pooled 12.5%
    ta = np.array([1.0, 20.0, 40.0]) * np.array([1.0, 1.0, 1.0])
    assert _per_task_reduction(ta, tb) == pytest.approx(100 * (0.9 + 0 + 0) / 3)
    assert np.isnan(_per_task_reduction(np.zeros(0), np.zeros(0)))


def test_sessions_drawn_per_seed_and_paired_within_a_seed():
    ss = _small("paper", n=300)
    a = schedule_sessions(ss, 0.2, 20.0, 150.0, np.random.default_rng([0, 2]))
    b = schedule_sessions(ss, 0.2, 20.0, 150.0, np.random.default_rng([1, 2]))
    assert np.unique(a.source).size == a.source.size  # without replacement within the pool
    assert not np.array_equal(a.source[:10], b.source[:10])
    assert a.source.max() > a.source.size  # not the pool's first sessions
    old = schedule_sessions(ss, 0.2, 20.0, 150.0, np.random.default_rng([0, 2]), draw="in-order")
    assert np.array_equal(old.source, np.arange(old.source.size))
    with pytest.raises(ShadowError):
        schedule_sessions(ss, 0.2, 20.0, 150.0, np.random.default_rng(0), draw="sorted")
    # simulated: one seed replays the same calls under every approach, another seed other calls
    cfg = ClusterConfig(instances=1)
    sc0 = Scenario(rho=0.3, warmup_s=10.0, measure_s=60.0, drain_s=600.0, session_rate=0.1, seed=0)
    r0 = simulate_cluster(ss, cfg, "No Shadow", sc0, capacity=CAP)
    r0h = simulate_cluster(ss, cfg, "Harvest-SLO", sc0, capacity=CAP)
    r1 = simulate_cluster(ss, cfg, "No Shadow", replace(sc0, seed=1), capacity=CAP)
    assert np.array_equal(r0.call_prompt, r0h.call_prompt)
    assert not (r0.call_prompt.size == r1.call_prompt.size and np.array_equal(r0.call_prompt, r1.call_prompt))
    with pytest.raises(ShadowError):
        Scenario(session_draw="bogus").check()


def test_task_types_validation_and_defaults():
    base = SyntheticParams(n_sessions=50, seed=4)
    mix = SyntheticParams(n_sessions=50, seed=4, task_types=(TaskType("a", 1.0, switch_prob=0.0),
                                                             TaskType("b", 3.0, switch_from=(1.0, 1.0))))
    ss = generate_synthetic_sessions(mix)
    assert ss.task_names == ("a", "b")
    sw = ss.is_switch
    sess = ss.session_of_call
    first = ss.is_first
    assert not sw[ss.task[sess] == 0].any()  # never switches
    assert sw[(ss.task[sess] == 1) & ~first].all()  # always switches
    assert (ss.task == 1).sum() > (ss.task == 0).sum()
    # reproducible; without task types the single-router draw is unchanged by the new fields
    assert np.array_equal(generate_synthetic_sessions(mix).prompt, ss.prompt)
    one = generate_synthetic_sessions(base)
    assert one.task_names == ("t0",)
    for bad in (TaskType("x", 0.0), TaskType("x", switch_prob=1.5), TaskType("x", switch_from=(0.5,)),
                TaskType("", 1.0)):
        with pytest.raises(ShadowError):
            generate_synthetic_sessions(SyntheticParams(n_sessions=5, task_types=(bad,)))
    with pytest.raises(ShadowError):
        generate_synthetic_sessions(SyntheticParams(n_sessions=5, task_types=(TaskType("x"), TaskType("x"))))
    with pytest.raises(ShadowError):
        generate_synthetic_sessions(SyntheticParams(n_sessions=5, switch_from=(0.0, 0.5)))
    # an asymmetric router starts at its stationary distribution and leaves the small model less often
    asym = generate_synthetic_sessions(SyntheticParams(n_sessions=2000, seed=1, switch_from=(0.1, 0.5),
                                                       first_input=LogNormal(100.0, 0.1)))
    assert 0.12 < (asym.model[asym.is_first] == 1).mean() < 0.22  # 0.1 / 0.6 = 0.167
