"""What Eager's shadow prefills cost in the cluster simulator, and where it turns slower than No Shadow.

Eager (Table 2: shadow work as normal-priority requests, FIFO with normal traffic, one in flight per session and
model) warms a session's copy on every other model while its call runs.  The paper reports it 7.0% *slower*
than No Shadow on the benchmarks; the simulator's headline grid has it 3.1% *faster* on all calls.  This script
splits Eager's effect against No Shadow, paired per seed (same normal traffic, sessions and starts), into:

* the calls: all, switch and same-model (latency, and for same-model calls its TTFT and decode parts and its
  token-weighted prefix hit rate): the gain is on switch calls, the cost lands on same-model calls;
* the work: prefill tokens in the measured window, per class (normal, routed, eager), against No Shadow's total.
  An eager token that a switch call later hits replaces a cold prefill token the switch call would have
  computed anyway (moved off its critical path, not added); only the unused ones and the re-warming of
  evicted copies are extra work.  ``net extra`` = (eager + routed tokens under Eager - routed tokens under No
  Shadow) / No Shadow's total prefill tokens;
* normal traffic: SLO attainment (points) and mean TTFT.

Settings vary what the extra work costs: normal-traffic load (rho), the routed share of the work (session rate
at a fixed normal load) and context length (``paper`` vs the longer ``paper-onetask``).

Usage::

    PYTHONPATH=. .venv/bin/python experiments/shadow_eager_cost.py [--seeds 0 1 2 3]
        [--settings paper:0.7:0.2 paper:0.9:0.2 paper:0.7:0.4 paper-onetask:0.7:0.2] [--jsonl FILE]

A setting is ``WORKLOAD:RHO:SESSION_RATE``; every seed draws its own session pool (workload seed = seed).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np

from shadow_prefill.builder import generate_synthetic_sessions, workload_preset
from shadow_prefill.cluster import _kernels as K
from shadow_prefill.cluster.sim import ClusterConfig, Scenario, simulate_cluster
from shadow_prefill.cluster.sweep import calibrated_capacities
from shadow_prefill.cluster.workload import synthetic_request_sizes

PAIR = ("qwen2.5-7b", "llama-3.1-70b")


def paired_stats(base, run):
    """Per-seed figures of ``run`` against ``base`` (No Shadow) on the same seed; latencies as % slower."""
    common = base.call_measured & base.call_done & run.call_done
    sw = common & base.call_switch
    same = common & ~base.call_switch

    def d(x_run, x_base, m):
        return 100.0 * (x_run[m].mean() / x_base[m].mean() - 1.0) if m.any() else float("nan")

    lat_b, lat_r = base.call_latency_s, run.call_latency_s
    ttft_b, ttft_r = base.call_ttft_s, run.call_ttft_s
    out = {"calls": int(common.sum()), "switch_calls": int(sw.sum()),
           "all_pct": d(lat_r, lat_b, common), "switch_pct": d(lat_r, lat_b, sw), "same_pct": d(lat_r, lat_b, same),
           "same_ttft_pct": d(ttft_r, ttft_b, same), "same_decode_pct": d(lat_r - ttft_r, lat_b - ttft_b, same)}

    def hit(r, m):
        return 100.0 * r.call_hit[m].sum() / max(1, r.call_prompt[m].sum())
    out["same_hit_pp"] = hit(run, same) - hit(base, same)
    out["switch_hit_pp"] = hit(run, sw) - hit(base, sw)
    # switch calls that hit less than under No Shadow: mostly calls issued while the session's eager request to
    # their model was in flight (it holds the session's copy until it finishes, so the call runs cold)
    out["switch_hit_below_pct"] = 100.0 * (run.call_hit[sw] < base.call_hit[sw]).mean() if sw.any() else float("nan")
    sb, sr = base.instance_stats, run.instance_stats
    total_b = sb[:, K.S_PF_NORMAL].sum() + sb[:, K.S_PF_ROUTED].sum()
    out["eager_tok_pct"] = 100.0 * sr[:, K.S_PF_SHADOW].sum() / total_b
    out["routed_saved_pct"] = 100.0 * (sb[:, K.S_PF_ROUTED].sum() - sr[:, K.S_PF_ROUTED].sum()) / total_b
    out["net_extra_pct"] = out["eager_tok_pct"] - out["routed_saved_pct"]
    out["routed_share_pct"] = 100.0 * sb[:, K.S_PF_ROUTED].sum() / total_b
    comp = float(run.totals[K.G_SHADOW_COMPUTED])
    out["unused_pct"] = 100.0 * (1.0 - float(run.totals[K.G_SHADOW_USED]) / comp) if comp > 0 else float("nan")
    nb, nr = base.summary(), run.summary()
    out["base_normal_slo_pct"] = 100.0 * nb["normal_slo_attainment"]
    out["base_unfinished_calls"] = nb["unfinished_calls"]
    out["normal_slo_pp"] = 100.0 * (nr["normal_slo_attainment"] - nb["normal_slo_attainment"])
    nm = base.normal_first_token_s >= 0
    nm &= run.normal_first_token_s >= 0
    tb = (base.normal_first_token_s - base.normal_arrival_s)[nm]
    tr = (run.normal_first_token_s - run.normal_arrival_s)[nm]
    out["normal_ttft_pct"] = 100.0 * (tr.mean() / tb.mean() - 1.0) if nm.any() else float("nan")
    return out


def mse(xs):
    x = np.asarray([v for v in xs if math.isfinite(v)], float)
    if x.size == 0:
        return float("nan"), float("nan")
    return float(x.mean()), (float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else float("nan"))


COLS = [("all_pct", "all"), ("switch_pct", "switch"), ("same_pct", "same"), ("same_ttft_pct", "same TTFT"),
        ("same_decode_pct", "same dec"), ("same_hit_pp", "same hit pp"), ("eager_tok_pct", "shadow tok"),
        ("routed_saved_pct", "cold saved"), ("net_extra_pct", "net extra"), ("unused_pct", "unused"),
        ("switch_hit_pp", "sw hit pp"), ("switch_hit_below_pct", "sw hit < NS"),
        ("normal_slo_pp", "SLO pp"), ("normal_ttft_pct", "norm TTFT"), ("base_normal_slo_pct", "NS SLO %")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--settings", nargs="+",
                    default=["paper:0.7:0.2", "paper:0.9:0.2", "paper:0.7:0.4", "paper-onetask:0.7:0.2"])
    ap.add_argument("--approaches", nargs="+", default=["Eager", "Harvest-SLO+Host"])
    ap.add_argument("--sessions", type=int, default=400)
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--warmup-s", type=float, default=60.0)
    ap.add_argument("--measure-s", type=float, default=300.0)
    ap.add_argument("--drain-s", type=float, default=1200.0)
    ap.add_argument("--jsonl", default=None)
    a = ap.parse_args()
    sizes = synthetic_request_sizes()
    cfg = ClusterConfig(models=PAIR, instances=a.instances, cache_normal_requests=True)
    cap = calibrated_capacities(cfg, sizes)
    print(f"# {' / '.join(PAIR)}, {a.instances} + {a.instances} instances, capacity {cap[0]:.2f} / {cap[1]:.2f} "
          f"req/s, cached normal requests, {a.warmup_s:g} s warm-up + {a.measure_s:g} s measured, peak, seeds "
          f"{a.seeds}; latencies: % slower than No Shadow (paired per seed; mean +- SE); token columns: % of No "
          f"Shadow's prefill tokens in the window; hit and SLO in points")
    print(f"{'setting':26s} {'approach':17s} " + " ".join(f"{lab:>12s}" for _, lab in COLS))
    t0 = time.perf_counter()
    for setting in a.settings:
        wl, rho, rate = setting.split(":")
        rho, rate = float(rho), float(rate)
        sc0 = Scenario(rho=rho, warmup_s=a.warmup_s, measure_s=a.measure_s, drain_s=a.drain_s, session_rate=rate)
        per = {ap_: [] for ap_ in a.approaches}
        share = []
        for s in a.seeds:
            ss = generate_synthetic_sessions(workload_preset(wl, n_sessions=a.sessions, seed=s), name=wl)
            sc = Scenario(**{**vars(sc0), "seed": s})
            base = simulate_cluster(ss, cfg, "No Shadow", sc, sizes, cap)
            for ap_ in a.approaches:
                r = simulate_cluster(ss, cfg, ap_, sc, sizes, cap)
                assert r.totals[K.G_INVARIANT_ERRORS] == 0
                st = paired_stats(base, r)
                per[ap_].append(st)
                share.append(st["routed_share_pct"])
        for ap_ in a.approaches:
            cells = []
            rec = {"setting": setting, "workload": wl, "rho": rho, "session_rate": rate, "approach": ap_,
                   "seeds": a.seeds, "per_seed": per[ap_]}
            for k, _ in COLS:
                m, e = mse([x[k] for x in per[ap_]])
                rec[k] = {"mean": m, "se": e}
                cells.append(f"{m:+.1f}+-{e:.1f}" if math.isfinite(e) else f"{m:+.1f}")
            print(f"{setting + f' (routed {np.mean(share):.0f}%)':26s} {ap_:17s} " +
                  " ".join(f"{c:>12s}" for c in cells), flush=True)
            if a.jsonl:
                with open(a.jsonl, "a") as f:
                    f.write(json.dumps(rec) + "\n")
    print(f"# {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
