"""Wall time of the compact-class search per N (what `tr-autotune run --policy` / `tr-optimize --policy` add to
B*'s search), with its parts: the all-policy decision process, the steepest ascent (chains under class tables).

    PYTHONPATH=. python experiments/policy_class_timing.py --N 16 32 48 64 --classes residual busy
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time


import tr_model  # noqa: E402
from optimizer.search import optimize_thresholds  # noqa: E402
from tr_model.launch_policy import class_policy  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--p", type=float, default=0.35)
    ap.add_argument("--L", type=float, nargs=2, default=[6.0, 27.9])
    ap.add_argument("--N", type=int, nargs="+", default=[16, 32, 48, 64])
    ap.add_argument("--classes", nargs="+", default=["residual", "busy"])
    ap.add_argument("--corun-slowdown", type=float, nargs=2)
    a = ap.parse_args()
    spec = tr_model.preset("r2r", a.L, p=a.p)
    if a.corun_slowdown:
        spec = spec.with_corun(list(a.corun_slowdown))
    print(f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; R2R p = {a.p}, L = {a.L} ms"
          + (f", co-running x{a.corun_slowdown}" if a.corun_slowdown else ""), flush=True)
    print("| N | B* | B* s | class | policy | gain over B* | process states | chains evaluated | class s | load |")
    print("|---" * 10 + "|", flush=True)
    for N in a.N:
        t0 = time.perf_counter()
        opt = optimize_thresholds(spec, N, round_to_grid=True)
        tb = time.perf_counter() - t0
        for cls in a.classes:
            r = class_policy(spec, N, cls, opt.best_B, round_to_grid=True)
            pol = " ".join("(" + ", ".join("never" if x is None else str(x) for x in row) + ")" for row in r.params)
            print(f"| {N} | {' '.join(map(str, opt.best_B))} | {tb:.0f} | {cls} | {pol} | {100 * r.gain:+.2f} % | "
                  f"{r.process_states:,} | {r.evaluated} | {r.seconds:.1f} | {os.getloadavg()[0]:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
