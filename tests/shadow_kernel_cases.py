"""Fixed-seed cases of the cluster kernel whose outputs are pinned in ``fixtures/shadow_cluster_kernel_outputs.json``.

The fixture was written from the kernel *before* it was split into event
helpers (issue 15, item 4); ``test_shadow_cluster_split.py`` replays every case
and requires bit-identical outputs (SHA-256 of each output array).  Cases cover
every approach, the host tier under KV pressure (spills, reloads, host LRU),
cached normal requests, three models with the top-1 variant, Dedicated and Eager.

Regenerate (only when a behaviour change is intended and documented)::

    .venv/bin/python tests/shadow_kernel_cases.py --write
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "shadow_cluster_kernel_outputs.json")

ARRAYS = ("call_issue_s", "call_first_token_s", "call_finish_s", "call_hit", "call_shadow_hit",
          "call_reload_tokens", "call_instance", "normal_first_token_s", "normal_finish_s", "instance_stats",
          "totals")


def cases():
    """(name, sessions, config, approach, scenario, capacity) of every pinned run."""
    from dataclasses import replace

    from shadow_prefill import SyntheticParams, generate_synthetic_sessions
    from shadow_prefill.builder import AgentLoopParams, LogNormal
    from shadow_prefill.cluster.policies import APPROACH_NAMES, get_policy
    from shadow_prefill.cluster.sim import ClusterConfig, Scenario

    ss = generate_synthetic_sessions(SyntheticParams(n_sessions=40, switch_prob=0.35, seed=7))
    # the fixture predates issue 26's random session draw per seed: replay the pool's first sessions
    sc = Scenario(rho=0.7, warmup_s=20.0, measure_s=80.0, drain_s=600.0, session_rate=0.3, seed=3,
                  session_draw="in-order")
    out = []
    base = ClusterConfig(instances=2)
    for a in APPROACH_NAMES:
        out.append((f"default/{a}", ss, base, a, sc, (17.0, 5.5)))
    # KV pressure: long contexts, small pools, a small host tier, cached normal requests
    loop = AgentLoopParams(tool_tokens=LogNormal(2000.0, 1.0), context_window=65536)
    ls = generate_synthetic_sessions(SyntheticParams(n_sessions=30, switch_prob=0.3, first_input=LogNormal(12000.0, 0.6),
                                                     loop=loop, seed=8))
    tight = ClusterConfig(instances=2, kv_capacity_tokens=(90000, 70000), host_gb_per_gpu=4.0,
                          cache_normal_requests=True, cold_age_s=2.0)
    for a in APPROACH_NAMES:
        out.append((f"tight/{a}", ls, tight, a, replace(sc, seed=4), (17.0, 5.5)))
    # three models, all targets vs top-1
    s3 = generate_synthetic_sessions(SyntheticParams(n_sessions=30, switch_prob=0.4, seed=9,
                                                     models=("qwen2.5-7b", "llama-3.1-70b", "llama-3.1-8b")))
    c3 = ClusterConfig(models=("qwen2.5-7b", "llama-3.1-70b", "llama-3.1-8b"), instances=1)
    hs = get_policy("Harvest-SLO+Host")
    for p in (get_policy("No Shadow"), hs, hs.with_top1(), get_policy("Dedicated"), get_policy("Eager")):
        out.append((f"three/{p.name}", s3, c3, p, replace(sc, seed=5), (17.0, 5.5, 15.0)))
    return out


def digest(run) -> dict:
    d = {}
    for k in ARRAYS:
        a = getattr(run, k)
        if k == "totals":
            a = a[:13]  # the columns that existed when the fixture was written (new ones may follow)
        elif k == "instance_stats":
            a = a[:, :9]
        a = np.ascontiguousarray(a)
        d[k] = hashlib.sha256(a.tobytes()).hexdigest()
    s = run.summary()
    d["mean_call_latency_s"] = s["mean_call_latency_s"]
    d["shadow_tokens"] = s["shadow_tokens"]
    d["invariant_errors"] = float(run.totals[12])
    return d


def legacy(cfg):
    """The fixture predates issue 16's rules (shadow-tail class, cold entries first, reclaim guard) and issue 26's
    credit gate: replay it with the rules it had."""
    from dataclasses import replace
    return replace(cfg, shadow_extends_whole_copy=True, cold_entries_first=False, reclaim_guard=False,
                   credit_gate=0.0)


def compute_all() -> dict:
    from shadow_prefill.cluster.sim import simulate_cluster
    res = {}
    for name, ss, cfg, a, sc, cap in cases():
        res[name] = digest(simulate_cluster(ss, legacy(cfg), a, sc, capacity=cap))
    return res


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    res = compute_all()
    if "--write" in sys.argv:
        with open(FIXTURE + ".tmp", "w") as f:
            json.dump({"schema_version": 1, "kind": "shadow_cluster_kernel_outputs", "cases": res}, f, indent=1,
                      sort_keys=True)
        os.replace(FIXTURE + ".tmp", FIXTURE)
    for k, v in res.items():
        print(f"{k:40s} {v['mean_call_latency_s']:.6f} {v['shadow_tokens']:.0f} {v['invariant_errors']:.0f}")
