"""Best fixed thresholds B*, the best 'busy' class, the optimal launch policy and the all-policy bound, side by side.

    PYTHONPATH=. python benchmarks/policy_table.py --N 4 8 12 16 24 32 [--corun-slowdown 2.8 1.05] [--algo me]

R2R (p = 0.35, L = 6.0 / 27.9 ms, delta = 0.1 ms).  B*: the exact search (optimizer.optimize_thresholds,
default search).  busy: one threshold per model and per "another model is busy", steepest ascent from
(B*, B*) (exact values, heuristic search).  optimum: the greedy policy of relative value iteration on the
all-policy process, evaluated exactly in the chain under its table; gap = proven (bound - optimum) / bound.
Monotone: rows of the optimal table (configurations the policy meets) where the launch decision is not
monotone in the model's own queue.
"""

from __future__ import annotations

import argparse
import json
import time

from optimizer.policy import build_process, class_start, monotonicity, optimal_policy, reached_configs, search_class, greedy
from optimizer.policy import value_iteration  # noqa: F401
from optimizer.search import optimize_thresholds
from tr_core.spec import preset


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--N", type=int, nargs="+", default=[4, 8, 12, 16])
    ap.add_argument("--corun-slowdown", type=float, nargs=2, default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--algo", choices=("r2r", "me"), default="r2r",
                    help="r2r: p = 0.35, L = 6.0 / 27.9 ms; me: w = (0.5, 0.3, 0.2), L = 6.0 / 15.0 / 27.9 ms")
    a = ap.parse_args()
    spec = (preset("r2r", [6.0, 27.9], p=0.35) if a.algo == "r2r"
            else preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2]))
    rnd = False
    if a.corun_slowdown:
        spec = spec.with_corun(list(a.corun_slowdown) + [1.0] * (spec.M - len(a.corun_slowdown)))
        rnd = True
    rows = []
    print("| N | B* | B* tok/s | busy class (B_idle, B_busy) per model | busy tok/s | residual class (B_idle, B_long, B_short) per model | residual tok/s | optimum tok/s | bound tok/s "
          "| proven gap | optimum / B* | busy / B* | residual / B* | residual short of optimum | non-monotone groups (met) | empty batches | process states "
          "| policy chain states | s |")
    print("|---" * 19 + "|")
    for N in a.N:
        t0 = time.perf_counter()
        opt = optimize_thresholds(spec, N, round_to_grid=rnd, search="pruned")
        proc = build_process(spec, N, round_to_grid=rnd)
        r = optimal_policy(spec, N, proc=proc, round_to_grid=rnd)
        B = tuple(opt.best_B)
        cls, v, nev = search_class(spec, N, proc, "busy", class_start("busy", B))
        rcls, rv, rnev = search_class(spec, N, proc, "residual", class_start("residual", B))
        # monotonicity on the configurations the optimal policy meets
        import numpy as np
        from optimizer.policy import _packed
        from optimizer import _kernels as K  # noqa: F401
        h, *_ = value_iteration(proc, rtol=1e-10)
        choice, init = greedy(proc, h)
        met = np.isin(_packed(proc, r.table), reached_configs(proc, choice, init))
        mono = monotonicity(r.table, only=met)
        nonmono = sum(m["violations"] for m in mono.values())
        bt = opt.throughput_tok_s
        row = dict(N=N, B_star=list(B), B_star_tok_s=bt, busy=[[cls[2 * j], cls[2 * j + 1]] for j in range(spec.M)],
                   busy_tok_s=v, busy_evaluated=nev,
                   residual=[list(rcls[3 * j:3 * j + 3]) for j in range(spec.M)], residual_tok_s=rv,
                   residual_evaluated=rnev, optimum_tok_s=r.throughput_tok_s,
                   optimum_error_bound=r.throughput_error_bound, bound_tok_s=r.upper_bound_tok_s, gap=r.gap,
                   nonmonotone=nonmono, monotone_detail={str(k): {kk: vv for kk, vv in m.items() if kk != "example"}
                                                         for k, m in mono.items()},
                   example={str(k): m["example"] for k, m in mono.items()},
                   empty_batches=r.empty_batches, process_states=r.process_states, chain_states=r.chain_states,
                   seconds=time.perf_counter() - t0)
        rows.append(row)
        bs = ", ".join(f"({cls[2 * j]}, {cls[2 * j + 1]})" for j in range(spec.M))
        rs = ", ".join("(" + ", ".join(str(x) for x in rcls[3 * j:3 * j + 3]) + ")" for j in range(spec.M))
        print(f"| {N} | {B} | {bt:.2f} | {bs} | {v:.2f} | {rs} | {rv:.2f} | {r.throughput_tok_s:.4f} | {r.upper_bound_tok_s:.4f} "
              f"| {r.gap:.1e} | {100 * (r.throughput_tok_s / bt - 1):+.2f} % | {100 * (v / bt - 1):+.2f} % "
              f"| {100 * (rv / bt - 1):+.2f} % | {100 * (1 - rv / r.throughput_tok_s):.2f} % "
              f"| {nonmono} | {'yes' if r.empty_batches else 'no'} | {r.process_states:,} | {r.chain_states:,} "
              f"| {row['seconds']:.0f} |", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main()
