"""The ShadowPrefill paper's evaluation on the paper-calibrated workload: headline table and every sweep.

Each figure is printed beside the paper's number (Section 5 and Appendix C, Harvest-SLO+Host unless noted).
Reductions are against No Shadow on the same seed and window over the calls that complete under every
approach; +- is one standard error over seeds x windows.  Sizes are small on purpose (2 shared cores):
``--seeds`` / ``--windows`` / ``--measure-s`` trade time for tighter intervals.

Usage::

    PYTHONPATH=. .venv/bin/python experiments/shadow_paper_eval.py headline [--workload paper-coding]
    PYTHONPATH=. .venv/bin/python experiments/shadow_paper_eval.py sweep rho beta slo_scale ...
    PYTHONPATH=. .venv/bin/python experiments/shadow_paper_eval.py context | models | switch-rate | traffic | ablation

Results are appended as JSON lines to ``--jsonl FILE`` when given (figures for docs/shadow_cluster.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import replace

import numpy as np

from shadow_prefill.builder import generate_synthetic_sessions, workload_preset
from shadow_prefill.cluster.metrics import compare_runs, reduction_by_context, summarize_comparison
from shadow_prefill.cluster.policies import APPROACH_NAMES
from shadow_prefill.cluster.sim import ClusterConfig, Scenario
from shadow_prefill.cluster.sweep import calibrated_capacities, run_grid, sweep, sweep_models_per_router
from shadow_prefill.cluster.workload import read_azure_trace, synthetic_request_sizes

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data",
                    "azure-llm-inference-2023")

# the paper's deployments per workload: a benchmark pair and a GHCP-coding pair (Llama-3.1-8B's 128 KB/token
# KV holds a few 60K-token contexts per H100, so the host tier matters there; Gemma-7B's 458 KB/token pool of
# 120K tokens cannot hold the preset's 131K-token calls)
PAIRS = {"paper": ("qwen2.5-7b", "llama-3.1-70b"), "paper-onetask": ("qwen2.5-7b", "llama-3.1-70b"),
         "paper-coding": ("llama-3.1-8b", "llama-3.1-70b")}

# Section 5.2 (benchmarks / GHCP-coding), Harvest-SLO+Host vs No Shadow
PAPER_HEADLINE = {
    "paper": {"switch_latency_reduction_pct": 10.4, "call_latency_reduction_pct": 5.0,
              "switch_ttft_reduction_pct": 44.1, "task_time_reduction_pct": 4.9, "token_cost_reduction_pct": 28.5,
              "hit_rate_pct": 82.1, "hit_rate_base_pct": 75.0, "oracle_switch": 19.3, "oracle_call": 9.6,
              "share_of_oracle_pct": 54.0, "energy_per_good_request_change_pct": 0.4, "shadow_unused_pct": 63.0},
    "paper-onetask": None,  # the same figures as "paper" (filled below)
    "paper-coding": {"switch_latency_reduction_pct": 14.3, "call_latency_reduction_pct": 9.7,
                     "switch_ttft_reduction_pct": 47.0, "task_time_reduction_pct": 10.0,
                     "token_cost_reduction_pct": 32.0, "hit_rate_pct": 76.3, "hit_rate_base_pct": 55.4,
                     "oracle_switch": 27.4, "oracle_call": 13.8, "share_of_oracle_pct": 52.0,
                     "energy_per_good_request_change_pct": 0.4, "shadow_unused_pct": 63.0},
}

PAPER_HEADLINE["paper-onetask"] = PAPER_HEADLINE["paper"]
# the ablation of Section 5.2 (switch-call latency reduction, benchmarks)
PAPER_ABLATION = {"Host Tier": None, "Harvest": 6.9, "Harvest-SLO": 8.8, "Harvest-SLO+Host": 10.4, "Predictive": 3.2,
                  "Dedicated": 18.0, "Oracle+Host": 19.3}

# Figure 9d-g and Figures 15-16: LLM-call latency reduction (%) per value, Harvest-SLO+Host (HSH) and
# Harvest-SLO (HS) where the paper gives it
PAPER_SWEEPS = {
    "rho": ([0.2, 0.5, 0.9], {"Harvest-SLO": [4.4, None, 0.7], "Harvest-SLO+Host": [None, None, 15.2]}),
    "slo_scale": ([0.5, 1.0, 3.0], {"Harvest-SLO+Host": [2.7, 6.7, 8.7]}),
    "shadow_kv_cap": ([0.05, 0.25, 1.0], {"Harvest-SLO+Host": [4.6, 5.0, 5.0]}),
    "cold_age_s": ([0.0, 5.0, 120.0], {"Harvest-SLO+Host": [3.6, 5.0, 2.8]}),
    "beta": ([0.25, 0.5, 1.0], {"Harvest-SLO": [-0.2, 3.3, 4.2], "Harvest-SLO+Host": [1.6, 5.0, 6.0]}),
    "margin": ([0.0, 0.1, 0.4], {"Harvest-SLO+Host": [5.0, 5.0, 4.9]}),
    "delta": ([0.0, 0.025, 0.1], {"Harvest-SLO+Host": [5.4, 5.0, 4.0]}),
    "chunk_tokens": ([512, 2048, 8192], {"Harvest-SLO+Host": [5.9, 5.0, 5.0]}),
    "n_min": ([64, 256, 1024], {"Harvest-SLO+Host": [6.6, 5.0, 1.4]}),
    "host_gb_per_gpu": ([16.0, 64.0], {"Harvest-SLO+Host": [None, None]}),
}

COLS = ["switch_latency_reduction_pct", "call_latency_reduction_pct", "switch_ttft_reduction_pct",
        "task_time_reduction_pct", "token_cost_reduction_pct", "hit_rate_pct", "switch_hit_rate_pct",
        "normal_slo_delta_pp", "shadow_unused_pct", "energy_per_good_request_change_pct",
        "prefill_throughput_change_pct"]
SHORT = ["sw lat", "call lat", "sw TTFT", "task", "cost", "hit %", "sw hit %", "SLO pp", "unused %", "energy",
         "pf tput"]


def _fmt(v, e=None):
    if v is None or not np.isfinite(v):
        return "-"
    return f"{v:.1f}" if e is None else f"{v:.1f}+-{e:.1f}"


def setup(a):
    sp = workload_preset(a.workload, n_sessions=a.sessions, seed=a.workload_seed)
    ss = generate_synthetic_sessions(sp, name=a.workload)
    cfg = ClusterConfig(models=PAIRS[a.workload], cache_normal_requests=not a.free_normal, instances=a.instances)
    sizes = traffic_sizes(a.traffic)
    sc = Scenario(rho=a.rho, warmup_s=a.warmup_s, measure_s=a.measure_s, drain_s=a.drain_s,
                  session_rate=a.session_rate)
    t0 = time.perf_counter()
    cap = calibrated_capacities(cfg, sizes)
    if a.cold_age_s is not None:  # after calibration (normal traffic only: the cold age does not enter it)
        cfg = replace(cfg, cold_age_s=a.cold_age_s)
    print(f"# workload {a.workload} ({ss.n_sessions} sessions, {ss.n_calls} calls), pair {' / '.join(PAIRS[a.workload])}"
          f", traffic {sizes.name}, capacity {cap[0]:.2f} / {cap[1]:.2f} req/s per instance "
          f"({time.perf_counter() - t0:.0f} s), cached normal requests: {cfg.cache_normal_requests}", flush=True)
    return ss, cfg, sizes, sc, cap


def traffic_sizes(kind):
    if kind == "synthetic":
        return synthetic_request_sizes()
    path = os.path.join(DATA, f"AzureLLMInferenceTrace_{kind}.csv")
    if not os.path.exists(path):
        sys.exit(f"error: {path} not found (the public Azure trace; use --traffic synthetic)")
    return read_azure_trace(path, name=f"azure-{kind}")


def emit(a, kind, df, extra=None):
    if a.jsonl:
        with open(a.jsonl, "a") as f:
            f.write(json.dumps({"kind": kind, "workload": a.workload, "seeds": a.seeds, "windows": a.windows,
                                "measure_s": a.measure_s, "rows": json.loads(df.to_json(orient="records")),
                                **(extra or {})}) + "\n")


def pool(a, seed):
    """The session pool of one simulation seed: drawn afresh per seed (workload seed = --workload-seed + seed)
    unless --fixed-pool; within a seed every approach replays the same sessions (paired)."""
    ws = a.workload_seed + (0 if a.fixed_pool else int(seed))
    return generate_synthetic_sessions(workload_preset(a.workload, n_sessions=a.sessions, seed=ws), name=a.workload)


def grid(a, cfg, approaches, sc, sizes, cap, seeds=None):
    """run_grid over the seeds, each seed on its own session pool (:func:`pool`)."""
    runs = []
    for s in (a.seeds if seeds is None else seeds):
        runs += run_grid(pool(a, s), cfg, approaches, (s,), a.windows, sc, sizes, cap, workers=a.workers)
    return runs


def headline(a):
    ss, cfg, sizes, sc, cap = setup(a)
    t0 = time.perf_counter()
    runs = grid(a, cfg, APPROACH_NAMES, sc, sizes, cap)
    df = summarize_comparison(compare_runs(runs))
    print(f"# {len(runs)} runs in {time.perf_counter() - t0:.0f} s")
    print(f"{'approach':18s} " + " ".join(f"{c:>12s}" for c in SHORT))
    for _, row in df.iterrows():
        print(f"{row['approach']:18s} " + " ".join(f"{_fmt(row[c], row[c + '_se']):>12s}" for c in COLS))
    p = PAPER_HEADLINE[a.workload]
    hs = df[df.approach == "Harvest-SLO+Host"].iloc[0]
    ns = df[df.approach == "No Shadow"].iloc[0]
    oh = df[df.approach == "Oracle+Host"].iloc[0]
    share = 100 * hs["switch_latency_reduction_pct"] / oh["switch_latency_reduction_pct"] \
        if oh["switch_latency_reduction_pct"] > 0 else float("nan")
    ours = {"switch_latency_reduction_pct": hs["switch_latency_reduction_pct"],
            "call_latency_reduction_pct": hs["call_latency_reduction_pct"],
            "switch_ttft_reduction_pct": hs["switch_ttft_reduction_pct"],
            "task_time_reduction_pct": hs["task_time_reduction_pct"],
            "token_cost_reduction_pct": hs["token_cost_reduction_pct"], "hit_rate_pct": hs["hit_rate_pct"],
            "hit_rate_base_pct": ns["hit_rate_pct"], "oracle_switch": oh["switch_latency_reduction_pct"],
            "oracle_call": oh["call_latency_reduction_pct"], "share_of_oracle_pct": share,
            "energy_per_good_request_change_pct": hs["energy_per_good_request_change_pct"],
            "shadow_unused_pct": hs["shadow_unused_pct"]}
    print(f"\n{'Harvest-SLO+Host vs paper':36s} {'ours':>8s} {'paper':>8s} {'ratio':>7s}")
    for k, v in ours.items():
        r = v / p[k] if p[k] else float("nan")
        print(f"{k:36s} {_fmt(v):>8s} {_fmt(p[k]):>8s} {r:7.2f}")
    emit(a, "headline", df, {"paper": p, "ours": ours})


def do_sweep(a, params):
    ss, cfg, sizes, sc, cap = setup(a)
    for prm in params:
        vals, paper = PAPER_SWEEPS[prm]
        t0 = time.perf_counter()
        df = sweep(ss, prm, vals, cfg, ("Harvest-SLO", "Harvest-SLO+Host", "Oracle+Host"), a.seeds, a.windows, sc,
                   sizes, cap, workers=a.workers)
        print(f"\n## {prm}: LLM-call latency reduction % (switch-call in brackets), ours vs paper "
              f"({time.perf_counter() - t0:.0f} s)")
        for appr in ("Harvest-SLO", "Harvest-SLO+Host", "Oracle+Host"):
            d = df[df.approach == appr]
            cells = []
            for j, v in enumerate(vals):
                row = d[d.value == v].iloc[0]
                pv = paper.get(appr, [None] * len(vals))[j]
                cells.append(f"{v:g}: {_fmt(row['call_latency_reduction_pct'], row['call_latency_reduction_pct_se'])}"
                             f" [{_fmt(row['switch_latency_reduction_pct'])}] (paper {_fmt(pv)})")
            print(f"{appr:18s} " + "   ".join(cells))
        emit(a, f"sweep:{prm}", df, {"paper": paper, "values": vals})


def context(a):
    ss, cfg, sizes, sc, cap = setup(a)
    runs = run_grid(ss, cfg, ("No Shadow", "Harvest-SLO", "Harvest-SLO+Host", "Oracle+Host"), a.seeds, a.windows, sc,
                    sizes, cap, workers=a.workers)
    df = reduction_by_context(runs, (0, 2000, 8000, 32000, 64000, math.inf))
    print("\n## switch-call latency reduction % by the switch call's prompt (paper: HSH 0.7% < 2K ... 20.5% > 64K; "
          "Oracle+Host up to 43.7%; HS falls back above 32K)")
    for _, r in df.iterrows():
        if r["approach"] == "No Shadow":
            continue
        print(f"{r['approach']:18s} {int(r['bin_lo']):>6d}-{r['bin_hi']:<8g} "
              f"{_fmt(r['switch_latency_reduction_pct'], r['switch_latency_reduction_pct_se'])}")
    emit(a, "context", df)


def switch_rate(a):
    ss0, cfg, sizes, sc, cap = setup(a)
    print("\n## Markov router: switch probability p per step (paper: HSH -0.2 -> 5.8, Oracle+Host 4.1 -> 10.9 "
          "LLM-call reduction for 0.5 -> 5.0 switches per session)")
    for p in (0.05, 0.27, 0.5):
        sp = replace(workload_preset(a.workload, n_sessions=a.sessions, seed=a.workload_seed), switch_prob=p)
        ss = generate_synthetic_sessions(sp)
        sw = float(np.mean([ss.is_switch[ss.offsets[s]:ss.offsets[s + 1]].sum() for s in range(ss.n_sessions)]))
        runs = run_grid(ss, cfg, ("No Shadow", "Harvest-SLO+Host", "Oracle+Host"), a.seeds, a.windows, sc, sizes,
                        cap, workers=a.workers)
        df = summarize_comparison(compare_runs(runs))
        cells = [f"{r['approach']}: {_fmt(r['call_latency_reduction_pct'], r['call_latency_reduction_pct_se'])} "
                 f"[{_fmt(r['switch_latency_reduction_pct'])}]" for _, r in df.iterrows() if r["approach"] != "No Shadow"]
        print(f"p={p:<5g} switches/session {sw:4.2f}   " + "   ".join(cells))
        emit(a, "switch_rate", df, {"switch_prob": p, "switches_per_session": sw})


def traffic(a):
    print("\n## normal-traffic trace (paper: HS 3.3 / 5.1, HSH 5.0 / 5.9 for conversation / code)")
    for kind in ("conv", "code"):
        a.traffic = kind
        ss, cfg, sizes, sc, cap = setup(a)
        runs = run_grid(ss, cfg, ("No Shadow", "Harvest-SLO", "Harvest-SLO+Host", "Oracle+Host"), a.seeds, a.windows,
                        sc, sizes, cap, workers=a.workers)
        df = summarize_comparison(compare_runs(runs))
        cells = [f"{r['approach']}: {_fmt(r['call_latency_reduction_pct'], r['call_latency_reduction_pct_se'])}"
                 for _, r in df.iterrows() if r["approach"] != "No Shadow"]
        print(f"{kind:5s} " + "   ".join(cells))
        emit(a, f"traffic:{kind}", df)


def models(a):
    print("\n## models per router (paper: HSH all-targets 5.0 / 6.3 / 6.3 at N = 2 / 3 / 5, top-1 4.2 / 4.6 at "
          "3 / 5; Oracle+Host 10.0 -> 14.6; unused shadow 68.6% -> 89.0%)")
    sp = workload_preset(a.workload, n_sessions=a.sessions, seed=a.workload_seed)
    sc = Scenario(rho=a.rho, warmup_s=a.warmup_s, measure_s=a.measure_s, drain_s=a.drain_s,
                  session_rate=a.session_rate)
    df = sweep_models_per_router((2, 3), synthetic=sp, config=ClusterConfig(cache_normal_requests=not a.free_normal,
                                                                             instances=a.instances),
                                 seeds=a.seeds, windows=a.windows, scenario=sc, workers=a.workers)
    for _, r in df.iterrows():
        print(f"N={r['models_per_router']} {r['approach']:28s} {_fmt(r['call_latency_reduction_pct'], r['call_latency_reduction_pct_se'])}"
              f"  unused {_fmt(r['shadow_unused_pct'])}%")
    emit(a, "models_per_router", df)


def router(a):
    """Figure 15c: the LLMRouter matrix (dcrouter) re-routed by each policy over one pair, paper-like agent loop."""
    from shadow_prefill.builder import MatrixWorkload
    from shadow_prefill.matrix import load_matrix
    path = os.path.join(os.path.dirname(DATA), "llmrouter-dcrouter", "train.json")
    if not os.path.exists(path):
        sys.exit(f"error: {path} not found")
    m = load_matrix(path)
    pair = m.ordered_pair("mistral-7b-instruct-v0.3", "llama-3.1-8b-instruct")
    loop = workload_preset("paper").loop
    cfg = ClusterConfig(models=("mistral-7b-v0.3", "llama-3.1-8b"), cache_normal_requests=not a.free_normal,
                        instances=a.instances)
    sizes = traffic_sizes(a.traffic)
    cap = calibrated_capacities(cfg, sizes)
    sc = Scenario(rho=a.rho, warmup_s=a.warmup_s, measure_s=a.measure_s, drain_s=a.drain_s,
                  session_rate=a.session_rate)
    print(f"\n## router policy over {' / '.join(pair)} (paper: HSH 5.5 / 5.0 / 5.7 LLM-call reduction for "
          f"max-accuracy / accuracy-per-cost / random; random gives 4.9 switches per session)")
    for pol in ("max-accuracy", "accuracy-per-cost", "random"):
        w = MatrixWorkload(m, loop, seed=0, policy=pol)
        ss = w.sessions(pair)
        sw = float(ss.is_switch.sum()) / ss.n_sessions
        runs = run_grid(ss, cfg, ("No Shadow", "Harvest-SLO+Host", "Oracle+Host"), a.seeds, a.windows, sc, sizes,
                        cap, workers=a.workers)
        df = summarize_comparison(compare_runs(runs))
        cells = [f"{r['approach']}: {_fmt(r['call_latency_reduction_pct'], r['call_latency_reduction_pct_se'])}"
                 for _, r in df.iterrows() if r["approach"] != "No Shadow"]
        print(f"{pol:18s} accuracy {w.accuracy(pair)['routed']:.3f}  switches/session {sw:4.2f}   " + "   ".join(cells))
        emit(a, f"router:{pol}", df, {"switches_per_session": sw})


def ablation(a):
    """The no-regression mechanism (issue 16): the pre-fix rules against the fixed ones on one grid."""
    ss, cfg, sizes, sc, cap = setup(a)
    print(f"# cold-entry age {cfg.cold_age_s:g} s")
    for name, c in (("fixed (tail class, cold entries first, reclaim guard)", cfg),
                    ("whole copy evict-first", replace(cfg, shadow_extends_whole_copy=True, cold_entries_first=False,
                                                       reclaim_guard=False)),
                    ("tail class only", replace(cfg, cold_entries_first=False, reclaim_guard=False)),
                    ("tail class, cold entries first, no reclaim guard", replace(cfg, reclaim_guard=False))):
        runs = run_grid(ss, c, ("No Shadow", "Harvest", "Harvest-SLO", "Harvest-SLO+Host"), a.seeds, a.windows, sc,
                        sizes, cap, workers=a.workers)
        df = summarize_comparison(compare_runs(runs))
        print(f"\n## {name}")
        for _, r in df.iterrows():
            print(f"{r['approach']:18s} call {_fmt(r['call_latency_reduction_pct'], r['call_latency_reduction_pct_se'])}"
                  f"  switch {_fmt(r['switch_latency_reduction_pct'], r['switch_latency_reduction_pct_se'])}"
                  f"  sw TTFT {_fmt(r['switch_ttft_reduction_pct'])}  sw hit {_fmt(r['switch_hit_rate_pct'])}%"
                  f"  unused {_fmt(r['shadow_unused_pct'])}%")
        emit(a, f"ablation:{name}", df)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("part", choices=("headline", "sweep", "context", "switch-rate", "traffic", "models", "ablation",
                                     "router"))
    ap.add_argument("params", nargs="*", help="sweep: parameter names (default: all of PAPER_SWEEPS)")
    ap.add_argument("--workload", choices=tuple(PAIRS), default="paper")
    ap.add_argument("--sessions", type=int, default=400)
    ap.add_argument("--workload-seed", type=int, default=0)
    ap.add_argument("--fixed-pool", action="store_true",
                    help="every seed draws its sessions from one pool (--workload-seed) instead of a fresh pool per seed")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--windows", nargs="+", default=["peak"])
    ap.add_argument("--rho", type=float, default=0.7)
    ap.add_argument("--session-rate", type=float, default=0.2)
    ap.add_argument("--instances", type=int, default=4, help="instances per model (halve with --session-rate)")
    ap.add_argument("--warmup-s", type=float, default=60.0)
    ap.add_argument("--measure-s", type=float, default=300.0)
    ap.add_argument("--drain-s", type=float, default=1200.0)
    ap.add_argument("--traffic", choices=("synthetic", "conv", "code"), default="synthetic")
    ap.add_argument("--free-normal", action="store_true", help="finished normal requests free their KV")
    ap.add_argument("--cold-age-s", type=float, default=None, help="cold-entry age (default: the config's, 5 s)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--jsonl", default=None)
    a = ap.parse_args()
    if a.part == "headline":
        headline(a)
    elif a.part == "sweep":
        do_sweep(a, a.params or list(PAPER_SWEEPS))
    else:
        {"context": context, "switch-rate": switch_rate, "traffic": traffic, "models": models,
         "ablation": ablation, "router": router}[a.part](a)


if __name__ == "__main__":
    main()
