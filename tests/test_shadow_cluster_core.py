"""Cluster simulator (ShadowPrefill part 2): hand-checked timelines, conservation, cache hits against part 1,
policy properties (Oracle bound, machinery off = No Shadow, normal-traffic SLO), determinism."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from shadow_prefill import SessionSet, SyntheticParams, generate_synthetic_sessions
from shadow_prefill.cluster import _kernels as K
from shadow_prefill.cluster.policies import APPROACH_NAMES, APPROACHES, HARVESTING, Policy, get_policy
from shadow_prefill.cluster.sim import ClusterConfig, Scenario, build_latency_models, simulate_cluster
from shadow_prefill.errors import ShadowError
from shadow_prefill.stats import compute_prefix_hits

CAP = (17.0, 5.5)  # per-instance capacity (req/s) of the default pair, so tests skip calibration


@pytest.fixture(scope="module")
def sessions():
    return generate_synthetic_sessions(SyntheticParams(n_sessions=80, seed=3))


@pytest.fixture(scope="module")
def scenario():
    return Scenario(rho=0.7, warmup_s=30.0, measure_s=150.0, drain_s=900.0, session_rate=0.3, seed=1)


@pytest.fixture(scope="module")
def runs(sessions, scenario):
    cfg = ClusterConfig()
    return {a: simulate_cluster(sessions, cfg, a, scenario, capacity=CAP) for a in APPROACH_NAMES}


def _one_call_sessions(prompts, outputs, models, hist=None, names=("a", "b")):
    n = len(prompts)
    hist = hist or [0] * n
    return SessionSet.from_arrays(model_names=names, lengths=[n], model=models, prompt=prompts,
                                  new_input=[p - h for p, h in zip(prompts, hist)], output=outputs,
                                  gap_s=[0.5] * n, append_only=[True] * n)


# ----------------------------------------------------------------------------- hand-checked timelines

def test_single_call_timeline_matches_hand_sum():
    P, O = 3000, 5
    ss = _one_call_sessions([P], [O], [0])
    cfg = ClusterConfig(instances=1)
    sc = Scenario(rho=0.0, warmup_s=0.0, measure_s=10.0, drain_s=100.0)
    r = simulate_cluster(ss, cfg, "No Shadow", sc, capacity=(1.0, 1.0), session_starts=[1.0])
    lm = build_latency_models(cfg)[0]
    # two chunks (2048 then 952 over 2048 cached), then O - 1 decodes over growing contexts
    t1 = lm.iteration_time(chunks=[(2048, 0)])
    t2 = lm.iteration_time(chunks=[(P - 2048, 2048)])
    dec = sum(lm.iteration_time(n_decode=1, decode_context=P + g) for g in range(1, O))
    assert r.call_issue_s[0] == pytest.approx(1.5)
    assert r.call_first_token_s[0] - r.call_issue_s[0] == pytest.approx(t1 + t2, rel=1e-12)
    assert r.call_finish_s[0] - r.call_issue_s[0] == pytest.approx(t1 + t2 + dec, rel=1e-12)
    assert r.call_hit[0] == 0


def test_same_model_second_call_reuses_context():
    # call 0: P=1000, O=50 -> context 1050; call 1 appends 300 new tokens on the same model
    ss = _one_call_sessions([1000, 1350], [50, 20], [0, 0], hist=[0, 1050])
    cfg = ClusterConfig(instances=1)
    sc = Scenario(rho=0.0, warmup_s=0.0, measure_s=10.0, drain_s=100.0)
    r = simulate_cluster(ss, cfg, "No Shadow", sc, capacity=(1.0, 1.0), session_starts=[0.0])
    lm = build_latency_models(cfg)[0]
    assert list(r.call_hit) == [0, 1050]
    assert r.call_issue_s[1] == pytest.approx(r.call_finish_s[0] + 0.5)
    ttft1 = r.call_first_token_s[1] - r.call_issue_s[1]
    assert ttft1 == pytest.approx(lm.iteration_time(chunks=[(300, 1050)]), rel=1e-12)


def test_switch_call_is_cold_without_shadow_and_free_under_oracle():
    ss = _one_call_sessions([1000, 1350], [50, 20], [0, 1], hist=[0, 1050])
    cfg = ClusterConfig(instances=1)
    sc = Scenario(rho=0.0, warmup_s=0.0, measure_s=10.0, drain_s=100.0)
    ns = simulate_cluster(ss, cfg, "No Shadow", sc, capacity=(1.0, 1.0), session_starts=[0.0])
    orc = simulate_cluster(ss, cfg, "Oracle", sc, capacity=(1.0, 1.0), session_starts=[0.0])
    assert ns.call_hit[1] == 0 and orc.call_hit[1] == 1050
    # an idle large-model instance harvests the whole history before the switch arrives
    # (chunks under n_min = 256 tokens are deferred, so the shadow may trail the last output tokens)
    hv = simulate_cluster(ss, cfg, "Harvest-SLO", sc, capacity=(1.0, 1.0), session_starts=[0.0])
    assert 1050 - 256 < hv.call_hit[1] <= 1050
    assert hv.call_shadow_hit[1] == hv.call_hit[1]
    # after the switch the small model warms call 1's 300 new input tokens (never used: the session ends)
    assert hv.summary()["shadow_tokens"] == hv.call_hit[1] + 300
    assert hv.summary()["shadow_used_tokens"] == hv.call_hit[1]
    hv1 = simulate_cluster(ss, replace(cfg, n_min=1), "Harvest-SLO", sc, capacity=(1.0, 1.0), session_starts=[0.0])
    assert hv1.call_hit[1] == 1050
    # with 1-token chunks the small model also follows call 1's streamed output, except the last token,
    # produced in the iteration that ends the session
    assert hv1.summary()["shadow_tokens"] == 1050 + 300 + 19
    assert hv1.summary()["shadow_unused_frac"] == pytest.approx(319 / 1369)


# ----------------------------------------------------------------------------- cache hits vs part 1

def test_no_shadow_hits_equal_part1_unbounded_cache():
    ss = generate_synthetic_sessions(SyntheticParams(n_sessions=30, seed=7))
    cfg = ClusterConfig(instances=1, kv_capacity_tokens=(50_000_000, 50_000_000))
    sc = Scenario(rho=0.0, warmup_s=0.0, measure_s=60.0, drain_s=5000.0)
    starts = np.arange(ss.n_sessions) * 2.0
    r = simulate_cluster(ss, cfg, "No Shadow", sc, capacity=(1.0, 1.0), session_starts=starts)
    ref = compute_prefix_hits(ss)  # part 1, unbounded cache
    ref = np.minimum(ref, ss.prompt - 1)  # at least one prompt token is computed
    assert np.array_equal(r.call_hit, ref)
    orc = simulate_cluster(ss, cfg, "Oracle", sc, capacity=(1.0, 1.0), session_starts=starts)
    sw = ss.is_switch
    assert np.array_equal(orc.call_hit[sw], np.minimum(ss.history, ss.prompt - 1)[sw])
    assert np.array_equal(orc.call_hit[~sw], ref[~sw])


# ----------------------------------------------------------------------------- conservation

@pytest.mark.parametrize("approach", APPROACH_NAMES)
def test_conservation(runs, approach):
    r = runs[approach]
    s = r.summary()
    assert not s["truncated"]
    # every call completes exactly once, in order, and the next call waits for it plus its gap
    assert np.all(r.call_finish_s >= r.call_first_token_s) and np.all(r.call_first_token_s > r.call_issue_s)
    assert np.all(r.call_finish_s > 0)
    nxt = np.ones(r.call_session.size, bool)
    nxt[-1] = False
    nxt[:-1] = r.call_session[1:] == r.call_session[:-1]
    idx = np.flatnonzero(nxt)
    gaps = r.call_issue_s[idx + 1] - r.call_finish_s[idx]
    assert np.all(gaps >= -1e-9)
    # tokens prefilled for routed calls = tokens needed minus cache hits (whole run)
    assert r.totals[K.G_PF_ROUTED_ALL] == pytest.approx(float((r.call_prompt - r.call_hit).sum()), abs=0.5)
    assert np.all(r.call_hit <= np.minimum(r.call_hist, r.call_prompt - 1))
    assert np.all(r.call_shadow_hit <= r.call_hit)
    # normal requests: every finished one was fully prefilled; unfinished ones at most partly
    fin = r.normal_finish_s >= 0
    pf = r.totals[K.G_PF_NORMAL_ALL]
    assert r.normal_measured.sum() > 0 and fin[r.normal_measured].all()
    assert pf >= 0
    # the KV bookkeeping adds up at the end (list sums = counters, reservations, session maps, free entries)
    assert r.totals[K.G_INVARIANT_ERRORS] == 0
    # shadow used never exceeds shadow computed
    assert r.totals[K.G_SHADOW_USED] <= r.totals[K.G_SHADOW_COMPUTED] + 0.5
    if APPROACHES[approach].shadow == "none":
        assert r.totals[K.G_SHADOW_COMPUTED] == 0


def test_same_calls_and_traffic_under_every_approach(runs):
    b = runs["No Shadow"]
    for a, r in runs.items():
        assert np.array_equal(r.call_prompt, b.call_prompt)
        assert np.array_equal(r.normal_arrival_s, b.normal_arrival_s)


# ----------------------------------------------------------------------------- policy properties

def test_oracle_bounds_every_policy_on_switch_ttft(runs):
    sw = runs["No Shadow"].call_switch & runs["No Shadow"].call_measured
    base = np.nanmean(runs["No Shadow"].call_ttft_s[sw])
    orc = np.nanmean(runs["Oracle+Host"].call_ttft_s[sw])
    assert orc < base
    for a in ("Host Tier", "Harvest", "Harvest-SLO", "Harvest-SLO+Host", "Predictive", "Eager", "Dedicated"):
        assert np.nanmean(runs[a].call_ttft_s[sw]) >= orc * 0.98, a
    # and the oracle hits at least as much on every switch call as any warming scheme can
    for a in HARVESTING:
        assert runs["Oracle"].call_hit[sw].sum() >= runs[a].call_hit[sw].sum()


def test_harvesting_warms_switch_calls(runs):
    sw = runs["No Shadow"].call_switch & runs["No Shadow"].call_measured
    base = runs["No Shadow"].call_hit[sw].sum()
    for a in ("Harvest", "Harvest-SLO", "Harvest-SLO+Host"):
        assert runs[a].call_hit[sw].sum() > base, a
        assert runs[a].call_shadow_hit[sw].sum() > 0, a


def test_machinery_off_is_no_shadow(sessions, scenario):
    cfg = ClusterConfig()
    base = simulate_cluster(sessions, cfg, "No Shadow", scenario, capacity=CAP)
    off = [
        (cfg, Policy("harvest, n_min unreachable", shadow="harvest-slo")),  # with n_min below
        (replace(cfg, shadow_kv_cap=0.0), get_policy("Harvest-SLO")),
        (replace(cfg, shadow_kv_cap=0.0), get_policy("Harvest")),
        (replace(cfg, host_gb_per_gpu=0.0), get_policy("Host Tier")),
    ]
    off[0] = (replace(cfg, n_min=10**9), off[0][1])
    for c, p in off:
        r = simulate_cluster(sessions, c, p, scenario, capacity=CAP)
        assert r.totals[K.G_SHADOW_COMPUTED] == 0
        assert np.array_equal(r.call_finish_s, base.call_finish_s), p.name
        assert np.array_equal(r.normal_finish_s, base.normal_finish_s), p.name
        assert np.array_equal(r.call_hit, base.call_hit), p.name


@pytest.mark.parametrize("seed", [1, 2])
def test_normal_slo_not_worse_beyond_noise(sessions, seed):
    sc = Scenario(rho=0.8, warmup_s=30.0, measure_s=200.0, drain_s=900.0, session_rate=0.3, seed=seed)
    cfg = ClusterConfig()
    base = simulate_cluster(sessions, cfg, "No Shadow", sc, capacity=CAP)
    m = base.normal_measured
    p0 = base.normal_slo_met[m].mean()
    n = m.sum()
    noise = 3.0 * np.sqrt(max(p0 * (1 - p0), 1e-4) / n)  # 3 binomial standard errors
    for a in ("Harvest-SLO", "Harvest-SLO+Host"):
        r = simulate_cluster(sessions, cfg, a, sc, capacity=CAP)
        assert r.normal_slo_met[m].mean() >= p0 - noise, (a, p0, r.normal_slo_met[m].mean())


def test_dedicated_adds_an_instance_per_model_and_energy(runs):
    d = runs["Dedicated"]
    assert d.instance_dedicated.sum() == 2 and d.instance_model.size == 10
    assert runs["No Shadow"].instance_model.size == 8
    # dedicated instances serve nothing: no normal traffic, no routed call; switch calls pull their warm copies
    ded = np.flatnonzero(d.instance_dedicated)
    assert not np.isin(d.normal_instance, ded).any() and not np.isin(d.call_instance, ded).any()
    sw = d.call_switch & d.call_measured
    assert d.call_shadow_hit[sw].sum() > 0 and d.call_reload_tokens[sw].sum() > 0
    assert d.call_hit[sw].sum() > runs["No Shadow"].call_hit[sw].sum()
    assert d.instance_stats[ded, K.S_PF_SHADOW].sum() > 0
    assert d.summary()["energy_j"] > runs["No Shadow"].summary()["energy_j"]


def test_host_tier_reloads_evicted_session_context():
    ss = generate_synthetic_sessions(SyntheticParams(n_sessions=60, seed=5))
    cfg = ClusterConfig(kv_capacity_tokens=(120_000, 120_000), instances=2)
    sc = Scenario(rho=0.5, warmup_s=30.0, measure_s=150.0, drain_s=1200.0, session_rate=0.3, seed=0)
    a = simulate_cluster(ss, cfg, "No Shadow", sc, capacity=CAP)
    b = simulate_cluster(ss, cfg, "Host Tier", sc, capacity=CAP)
    assert b.call_reload_tokens.sum() > 0 and a.call_reload_tokens.sum() == 0
    assert b.call_hit.sum() > a.call_hit.sum()
    assert b.totals[K.G_PF_ROUTED_ALL] < a.totals[K.G_PF_ROUTED_ALL]


@pytest.mark.parametrize("approach", APPROACH_NAMES)
def test_kv_bookkeeping_under_pressure(approach):
    # small pools, a small host tier and high load: constant eviction, spills, reloads and blocked admissions
    from shadow_prefill.cluster.workload import mixed_synthetic_sessions
    ss = mixed_synthetic_sessions(n_sessions=60, seed=2)
    cfg = ClusterConfig(kv_capacity_tokens=(150_000, 150_000), host_gb_per_gpu=2.0, instances=2)
    sc = Scenario(rho=0.9, warmup_s=20.0, measure_s=80.0, drain_s=600.0, session_rate=0.3, seed=4)
    r = simulate_cluster(ss, cfg, approach, sc, capacity=CAP)
    assert r.totals[K.G_INVARIANT_ERRORS] == 0
    assert r.totals[K.G_EVICT_HBM] > 0
    assert r.totals[K.G_PF_ROUTED_ALL] == pytest.approx(float((r.call_prompt - r.call_hit)[r.call_done].sum()),
                                                        abs=float((r.call_prompt)[~r.call_done].sum()) + 0.5)


# ----------------------------------------------------------------------------- determinism

def test_deterministic_per_seed(sessions, scenario):
    cfg = ClusterConfig()
    a = simulate_cluster(sessions, cfg, "Harvest-SLO+Host", scenario, capacity=CAP)
    b = simulate_cluster(sessions, cfg, "Harvest-SLO+Host", scenario, capacity=CAP)
    for f in ("call_issue_s", "call_finish_s", "call_hit", "normal_finish_s", "instance_stats", "totals"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    c = simulate_cluster(sessions, cfg, "Harvest-SLO+Host", replace(scenario, seed=scenario.seed + 1), capacity=CAP)
    assert not np.array_equal(a.normal_arrival_s[:50], c.normal_arrival_s[:50])


# ----------------------------------------------------------------------------- validation

def test_bad_inputs_are_named():
    ss = _one_call_sessions([1000], [10], [0])
    with pytest.raises(ShadowError, match="two models|models"):
        simulate_cluster(ss, ClusterConfig(models=("qwen2.5-7b",)), "No Shadow", Scenario(), capacity=(1.0,))
    with pytest.raises(ShadowError, match="unknown approach"):
        simulate_cluster(ss, ClusterConfig(), "Warm Everything", Scenario(), capacity=CAP)
    with pytest.raises(ShadowError, match="exceeds the KV capacity"):
        simulate_cluster(ss, ClusterConfig(kv_capacity_tokens=(500, 500)), "No Shadow", Scenario(), capacity=CAP)
    with pytest.raises(ShadowError, match="session_starts"):
        simulate_cluster(ss, ClusterConfig(), "No Shadow", Scenario(), capacity=CAP, session_starts=[-1.0])
    with pytest.raises(ShadowError, match="window"):
        simulate_cluster(ss, ClusterConfig(), "No Shadow", Scenario(window="noon"), capacity=CAP)
