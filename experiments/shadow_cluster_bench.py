"""Speed of the ShadowPrefill cluster simulator (issue targets) and the headline comparison.

1. One simulated hour of 4 + 4 instances (Qwen2.5-7B / Llama-3.1-70B on H100) at rho = 0.7 with a session
   workload, per approach, on one core: wall seconds and simulated seconds per wall second (median of repeats).
2. The paper's grid for one model pair: 3 seeds x 3 windows x 10 approaches (120 s warm-up + 600 s measured,
   drained), capacity calibration included, on ``--workers`` processes.

Usage:  PYTHONPATH=. .venv/bin/python experiments/shadow_cluster_bench.py [--workers 2] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from shadow_prefill import SyntheticParams, generate_synthetic_sessions
from shadow_prefill.cluster.metrics import compare_runs, summarize_comparison
from shadow_prefill.cluster.policies import APPROACH_NAMES
from shadow_prefill.cluster.sim import ClusterConfig, Scenario, simulate_cluster
from shadow_prefill.cluster.sweep import calibrated_capacities, run_grid
from shadow_prefill.cluster.workload import mixed_synthetic_sessions, synthetic_request_sizes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="short grid (100 s measured) for a smoke run")
    ap.add_argument("--session-rate", type=float, default=0.2)
    a = ap.parse_args()

    ss = mixed_synthetic_sessions((0.1, 0.45), n_sessions=2000, seed=11)  # two tasks: rarely and often switching
    cfg = ClusterConfig()
    sizes = synthetic_request_sizes()
    t0 = time.perf_counter()
    cap = calibrated_capacities(cfg, sizes)
    t_cal = time.perf_counter() - t0
    print(f"calibrated capacity (req/s per instance): {cap[0]:.2f} (qwen2.5-7b), {cap[1]:.2f} (llama-3.1-70b); "
          f"{t_cal:.1f} s incl. compilation")
    simulate_cluster(ss, cfg, "No Shadow", Scenario(measure_s=10, warmup_s=0), sizes, cap)  # warm the JIT

    print("\n1) one simulated hour, 4 + 4 instances, rho = 0.7, "
          f"{a.session_rate} sessions/s (median of {a.repeats})")
    print(f"{'approach':18s} {'wall s':>8s} {'sim s':>8s} {'sim s/wall s':>13s} {'iterations':>11s} {'calls':>7s}")
    hour = Scenario(rho=0.7, warmup_s=0.0, measure_s=3600.0, drain_s=900.0, session_rate=a.session_rate)
    for ap_name in APPROACH_NAMES:
        walls, last = [], None
        for _ in range(a.repeats):
            r = simulate_cluster(ss, cfg, ap_name, hour, sizes, cap)
            walls.append(r.wall_s)
            last = r
        s = last.summary()
        w = statistics.median(walls)
        print(f"{ap_name:18s} {w:8.2f} {s['sim_end_s']:8.0f} {s['sim_end_s'] / w:13.0f} {s['iterations']:11d} "
              f"{s['calls']:7d}")

    print(f"\n2) 3 seeds x 3 windows x {len(APPROACH_NAMES)} approaches, {a.workers} workers")
    sc = Scenario(rho=0.7, warmup_s=120.0, measure_s=100.0 if a.quick else 600.0, drain_s=1800.0,
                  session_rate=a.session_rate)
    t0 = time.perf_counter()
    cap2 = calibrated_capacities(cfg, sizes)
    runs = run_grid(ss, cfg, APPROACH_NAMES, (0, 1, 2), ("peak", "median", "trough"), sc, sizes, cap2,
                    workers=a.workers)
    wall = time.perf_counter() - t0
    print(f"{len(runs)} runs in {wall:.1f} s wall (sum of kernel time {sum(r.wall_s for r in runs):.1f} s)")
    df = summarize_comparison(compare_runs(runs))
    cols = ["switch_latency_reduction_pct", "call_latency_reduction_pct", "switch_ttft_reduction_pct",
            "task_time_reduction_pct", "hit_rate_pct", "token_cost_reduction_pct", "normal_slo_delta_pp",
            "shadow_unused_pct", "energy_per_good_request_change_pct", "prefill_throughput_change_pct"]
    short = ["sw lat", "call lat", "sw TTFT", "task", "hit %", "cost", "SLO pp", "unused %", "energy", "pf tput"]
    print(f"\n{'approach':18s} " + " ".join(f"{c:>15s}" for c in short))
    for _, row in df.iterrows():
        cells = []
        for c in cols:
            v, e = row[c], row[c + "_se"]
            cells.append(f"{v:7.1f} +-{e:5.1f}" if np.isfinite(v) else f"{'-':>15s}")
        print(f"{row['approach']:18s} " + " ".join(f"{x:>15s}" for x in cells))


if __name__ == "__main__":
    main()
