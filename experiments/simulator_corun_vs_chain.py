"""The exact chain against the event simulator under the co-running launch law, and the simulator's speed.

Usage::

    .venv/bin/python experiments/simulator_corun_vs_chain.py [--steps 2000000] [--format table|json]

Systems: R2R (p = 0.35, L = 6.0 / 27.9 ms, delta 0.1 ms) with the co-running factors of the H200 probe
(``../shared/data/h200-profiles/corun-probe.md``: the small model x2.8 at b = 1 rising to x3.6 at b = 16,
entered as a table on the grid; the large model 29.3 ms = x1.05 on the grid), and a three-model ME system with factors 2 / 1.5 /
1.1 (30.7 ms), at a few N and thresholds.  For each: the chain's throughput (``optimizer.evaluate_thresholds``), the
simulator's estimate with its 95% interval, z = (chain - sim) / (half-width / 1.96), the solo chain (no
co-running) for scale, and the share of launches that ran co-located.  Then the simulator's speed on the
same point with and without co-running latencies (median of ``--repeats`` runs, request-steps per second).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


from optimizer.evaluate import evaluate_thresholds  # noqa: E402
from simulator import simulate  # noqa: E402
from tr_core.spec import make_spec, preset  # noqa: E402


def _small_table(L0: float, bmax: int) -> dict:
    # x2.8 at b = 1 to x3.6 at b = 16 (linear in b, flat beyond), rounded to the 0.1 ms grid
    sizes = list(range(1, bmax + 1))
    f = [2.8 + 0.8 * (min(b, 16) - 1) / 15 for b in sizes]
    return {"batch_size": sizes, "step_latency_ms": [round(L0 * x, 1) for x in f]}


def systems():
    r2r = preset("r2r", [6.0, 27.9], p=0.35)
    me = preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2])
    out = []
    for N, B in ((2, (1, 1)), (4, (1, 1)), (4, (1, 3)), (8, (1, 1)), (8, (1, 4))):
        spec = make_spec([6.0, 27.9], r2r.P, r2r.C, name="r2r-corun",
                         corun_latency=[_small_table(6.0, N),
                                        {"batch_size": [1], "step_latency_ms": [29.3]}])
        out.append(("R2R probe factors", spec, r2r, N, B))
    me_co = make_spec([6.0, 15.0, 27.9], me.P, me.C, name="me-corun",
                      corun_latency=[2.0, 1.5, {"batch_size": [1], "step_latency_ms": [30.7]}])
    for N, B in ((3, (1, 1, 1)), (6, (1, 2, 3))):
        out.append(("ME factors 2/1.5/1.1", me_co, me, N, B))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2_000_000, help="measured request-steps per simulation")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per point for the speed columns")
    ap.add_argument("--format", choices=("table", "json"), default="table")
    a = ap.parse_args(argv)
    rows = []
    for name, spec, solo_spec, N, B in systems():
        simulate(spec, N, B, steps=10_000)  # compile / load the kernel
        t0 = time.perf_counter()
        exact = evaluate_thresholds(spec, N, B)
        chain_s = time.perf_counter() - t0
        solo = evaluate_thresholds(solo_spec, N, B).throughput_tok_s
        sim = simulate(spec, N, B, steps=a.steps, seed=1)
        half = sim.throughput_ci95_tok_s
        z = (exact.throughput_tok_s - sim.throughput_tok_s) / (half / 1.96) if half > 0 else float("nan")
        co_share = sum(sim.corun_launches) / sum(sim.launches)
        speed_co = statistics.median(simulate(spec, N, B, steps=a.steps, seed=k).request_steps_per_s
                                     for k in range(a.repeats))
        speed_solo = statistics.median(simulate(solo_spec, N, B, steps=a.steps, seed=k).request_steps_per_s
                                       for k in range(a.repeats))
        rows.append({"system": name, "N": N, "B": list(B), "chain_tok_s": exact.throughput_tok_s,
                     "chain_states": exact.states, "chain_s": chain_s, "sim_tok_s": sim.throughput_tok_s,
                     "sim_ci95_tok_s": half, "z": z, "inside": abs(exact.throughput_tok_s - sim.throughput_tok_s)
                     <= half, "solo_chain_tok_s": solo, "corun_launch_share": co_share,
                     "sim_msteps_s_corun": speed_co / 1e6, "sim_msteps_s_solo": speed_solo / 1e6})
    if a.format == "json":
        print(json.dumps({"schema_version": 1, "steps": a.steps, "rows": rows}, indent=2))
        return 0
    print(f"{'system':<22} {'N':>2} {'B':<10} {'chain':>9} {'sim +- 95%':>18} {'z':>6} {'solo':>9} {'co %':>5} "
          f"{'states':>7} {'Msteps/s co':>11} {'solo':>6}")
    for r in rows:
        print(f"{r['system']:<22} {r['N']:>2} {str(tuple(r['B'])):<10} {r['chain_tok_s']:>9.3f} "
              f"{r['sim_tok_s']:>9.3f} +- {r['sim_ci95_tok_s']:<5.3f} {r['z']:>+6.2f} {r['solo_chain_tok_s']:>9.3f} "
              f"{100 * r['corun_launch_share']:>5.1f} {r['chain_states']:>7} {r['sim_msteps_s_corun']:>11.1f} "
              f"{r['sim_msteps_s_solo']:>6.1f}")
    inside = sum(r["inside"] for r in rows)
    print(f"chain inside the simulator's 95% interval: {inside} of {len(rows)}; max |z| = "
          f"{max(abs(r['z']) for r in rows):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
