"""No regression of the SLO-guarded approaches (issue 26, item 6): a paired test over a grid of configurations.

Grid: normal-traffic load 0.5 / 0.7 / 0.9, cold-entry age 0 / 5 / 120 s, router switch probability 0.05 / 0.45
(every task type of the ``paper`` preset re-routed by a two-state Markov router with that probability), two
model pairs.  Per configuration and seed, each approach runs against No Shadow with common random numbers (the
same normal traffic, session starts and sessions; a fresh session pool per seed, so the draw is sampled), and
the paired relative difference ``d_s = mean latency_a / mean latency_NoShadow - 1`` (all calls; switch calls)
is taken.  Over n seeds: mean, SE and the one-sided 1% bound ``t_{0.99, n-1} SE``; an approach *regresses
significantly* where the mean is above that bound.

Usage::

    PYTHONPATH=. .venv/bin/python experiments/shadow_no_regression.py [--seeds 0 1 2 3 4 5] [--loads 0.5 0.7 0.9]
        [--cold-ages 0 5 120] [--switch-probs 0.05 0.45] [--pairs qwen2.5-7b,llama-3.1-70b ...] [--jsonl FILE]
    PYTHONPATH=. .venv/bin/python experiments/shadow_no_regression.py --summarize FILE.jsonl [FILE.jsonl ...]

``--summarize`` reads the ``--jsonl`` records of several runs (for a configuration run more than once, the
record with the most seeds, then the last one), prints which corners of the grid (load x cold age x switch
probability x pair) are covered, and per approach the largest paired t = mean / SE against two one-sided 1%
thresholds: per configuration ``t(0.99, n-1)`` (what the table flags with '!') and Bonferroni-corrected over the
k configurations, ``t(1 - 0.01/k, n-1)`` (a family-wise 1% level; it only raises the threshold).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from dataclasses import replace

import numpy as np
from scipy import stats as sps

from shadow_prefill.builder import generate_synthetic_sessions, workload_preset
from shadow_prefill.cluster.sim import ClusterConfig, Scenario, simulate_cluster
from shadow_prefill.cluster.sweep import calibrated_capacities
from shadow_prefill.cluster.workload import synthetic_request_sizes

APPROACHES = ("Harvest", "Harvest-SLO", "Harvest-SLO+Host")
PAIRS = ("qwen2.5-7b,llama-3.1-70b", "mistral-7b-v0.3,llama-3.1-8b")


def markov_pool(p: float, n_sessions: int, seed: int):
    """The ``paper`` preset's task types and sizes, each re-routed by a symmetric Markov router (probability p)."""
    sp = workload_preset("paper", n_sessions=n_sessions, seed=seed)
    types = tuple(replace(t, switch_prob=float(p), switch_from=None) for t in sp.task_types)
    return generate_synthetic_sessions(replace(sp, task_types=types), name=f"markov{p:g}")


def paired(base, run, switch_only):
    common = base.call_measured & base.call_done & run.call_done
    if switch_only:
        common &= base.call_switch
    if not common.any():
        return float("nan")
    return float(run.call_latency_s[common].mean() / base.call_latency_s[common].mean() - 1.0)


def bound(x):
    """(mean, SE, one-sided 1% bound) of the paired differences."""
    x = np.asarray([v for v in x if math.isfinite(v)])
    if x.size < 2:
        return float("nan"), float("nan"), float("nan")
    se = float(x.std(ddof=1) / math.sqrt(x.size))
    return float(x.mean()), se, float(sps.t.ppf(0.99, x.size - 1)) * se


def run_config(pair, rho, cold, p, seeds, a, cap):
    cfg = ClusterConfig(models=pair, instances=a.instances, cache_normal_requests=True, cold_age_s=cold,
                        credit_gate=a.credit_gate)
    d = {(ap, sw): [] for ap in a.approaches for sw in (False, True)}
    for s in seeds:
        ss = markov_pool(p, a.sessions, s)
        sc = Scenario(rho=rho, warmup_s=a.warmup_s, measure_s=a.measure_s, drain_s=a.drain_s,
                      session_rate=a.session_rate, seed=s)
        base = simulate_cluster(ss, cfg, "No Shadow", sc, capacity=cap)
        for ap in a.approaches:
            r = simulate_cluster(ss, cfg, ap, sc, capacity=cap)
            for sw in (False, True):
                d[(ap, sw)].append(paired(base, r, sw))
    return d


def summarize(paths, a):
    recs = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                key = (tuple(r["pair"]), float(r["rho"]), float(r["cold_age_s"]), float(r["switch_prob"]),
                       r.get("credit_gate"))
                if key not in recs or len(r["seeds"]) >= len(recs[key]["seeds"]):
                    recs[key] = r
    keys = sorted(recs)
    want = [(tuple(pr.split(",")), float(r), float(c), float(p)) for pr, r, c, p in
            itertools.product(a.pairs, a.loads, a.cold_ages, a.switch_probs)]
    missing = [w for w in want if not any(k[:4] == w for k in keys)]
    print(f"# {len(keys)} configurations from {len(paths)} file(s); of the {len(want)} of --pairs x --loads x "
          f"--cold-ages x --switch-probs, missing {len(missing)}" +
          (": " + "; ".join(f"{'/'.join(c[0])} load {c[1]:g} cold {c[2]:g} s p {c[3]:g}" for c in missing)
           if missing else ""))
    approaches = sorted({k.split("|")[0] for r in recs.values() for k in r if "|" in k})
    for apn in approaches:
        for what in ("all", "switch"):
            rows = []
            for key in keys:
                v = recs[key].get(f"{apn}|{what}")
                if v is None or not math.isfinite(v["se_pct"]) or v["se_pct"] <= 0:
                    continue
                n = len(recs[key]["seeds"])
                rows.append((v["mean_pct"] / v["se_pct"], n, key, v))
            if not rows:
                continue
            k = len(rows)
            sig = [r for r in rows if r[0] > sps.t.ppf(0.99, r[1] - 1)]
            sig_b = [r for r in rows if r[0] > sps.t.ppf(1 - 0.01 / k, r[1] - 1)]
            t, n, key, v = max(rows, key=lambda r: r[0])
            print(f"{apn:17s} {what:6s} k={k:2d}  largest t = {t:+5.2f} ({'/'.join(key[0])} load {key[1]:g} cold "
                  f"{key[2]:g} s p {key[3]:g}: {v['mean_pct']:+.2f} +- {v['se_pct']:.2f}%, n = {n}; t(0.99) = "
                  f"{sps.t.ppf(0.99, n - 1):.2f}, Bonferroni t(1-0.01/{k}) = {sps.t.ppf(1 - 0.01 / k, n - 1):.2f}); "
                  f"significant: {len(sig)} per configuration, {len(sig_b)} family-wise" +
                  ("".join(f"\n    ! {'/'.join(r[2][0])} load {r[2][1]:g} cold {r[2][2]:g} s p {r[2][3]:g}: "
                           f"{r[3]['mean_pct']:+.2f} +- {r[3]['se_pct']:.2f}% (t = {r[0]:.2f}, n = {r[1]})"
                           for r in sig)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--summarize", nargs="+", metavar="JSONL", help="summarize the --jsonl records of earlier runs")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    ap.add_argument("--loads", type=float, nargs="+", default=[0.5, 0.7, 0.9])
    ap.add_argument("--cold-ages", type=float, nargs="+", default=[0.0, 5.0, 120.0])
    ap.add_argument("--switch-probs", type=float, nargs="+", default=[0.05, 0.45])
    ap.add_argument("--pairs", nargs="+", default=list(PAIRS))
    ap.add_argument("--approaches", nargs="+", default=list(APPROACHES))
    ap.add_argument("--credit-gate", type=float, default=ClusterConfig().credit_gate,
                    help="Harvest-SLO's routed-step credit only for jobs with P(next -> model) >= this (0: all)")
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=300)
    ap.add_argument("--session-rate", type=float, default=0.1)
    ap.add_argument("--warmup-s", type=float, default=30.0)
    ap.add_argument("--measure-s", type=float, default=240.0)
    ap.add_argument("--drain-s", type=float, default=900.0)
    ap.add_argument("--jsonl", default=None)
    a = ap.parse_args()
    if a.summarize:
        summarize(a.summarize, a)
        return
    sizes = synthetic_request_sizes()
    print(f"# {len(a.seeds)} seeds; {a.instances} + {a.instances} instances, {a.session_rate} sessions/s, "
          f"{a.warmup_s:g} s warm-up + {a.measure_s:g} s measured; paired d = mean_a / mean_NoShadow - 1 (%), "
          f"bound = t(0.99, n-1) SE; '!' = significantly slower (1%)")
    print(f"{'pair':32s} {'load':>4s} {'cold':>5s} {'p':>5s}  " +
          "  ".join(f"{x:>30s}" for x in a.approaches) + "   (all calls | switch calls: mean+-SE [bound])")
    worst = {}
    t0 = time.perf_counter()
    for pair_s in a.pairs:
        pair = tuple(pair_s.split(","))
        cap = calibrated_capacities(ClusterConfig(models=pair, instances=a.instances, cache_normal_requests=True),
                                    sizes)
        for rho, cold, p in itertools.product(a.loads, a.cold_ages, a.switch_probs):
            d = run_config(pair, rho, cold, p, a.seeds, a, cap)
            cells = []
            rec = {"pair": pair, "rho": rho, "cold_age_s": cold, "switch_prob": p, "seeds": a.seeds,
                   "credit_gate": a.credit_gate}
            for apn in a.approaches:
                parts = []
                for sw in (False, True):
                    m, se, b = bound(d[(apn, sw)])
                    flag = "!" if m > b else " "
                    parts.append(f"{100 * m:+5.1f}+-{100 * se:3.1f}[{100 * b:3.1f}]{flag}")
                    rec[f"{apn}|{'switch' if sw else 'all'}"] = {"mean_pct": 100 * m, "se_pct": 100 * se,
                                                                  "bound_pct": 100 * b, "significant": bool(m > b),
                                                                  "d_pct": [100 * v for v in d[(apn, sw)]]}
                    key = (apn, sw)
                    worst[key] = max(worst.get(key, -1e9), m - b)
                cells.append(" | ".join(parts))
            print(f"{'/'.join(pair):32s} {rho:4.2f} {cold:5.0f} {p:5.2f}  " + "  ".join(f"{c:>30s}" for c in cells),
                  flush=True)
            if a.jsonl:
                with open(a.jsonl, "a") as f:
                    f.write(json.dumps(rec) + "\n")
    print(f"# {time.perf_counter() - t0:.0f} s; largest (mean - bound) per approach, percentage points "
          f"(> 0: significantly slower somewhere): " +
          ", ".join(f"{k[0]} {'switch' if k[1] else 'all'} {100 * v:+.2f}" for k, v in worst.items()))


if __name__ == "__main__":
    main()
