"""A compact class's search with and without the all-policy process, side by side (issue 27 item 4).

    PYTHONPATH=. python experiments/policy_chain_table.py [--repeat 3] [--cases r2r8 r2r16 r2r8-corun me2 me3]

"with process": what ``tr-optimize --policy CLASS`` / ``tr-autotune run --policy`` did before
(``optimizer.policy.build_process``, then the steepest ascent with each member's table over every
configuration of the process, ``class_table``); "without": the same ascent with each member's table over
the configurations its own chain meets (``class_chain_table``, no process).  Both start from B* (given
below, from experiments/LOG.md) and must end at the same member with the same exact value (checked).
Wall seconds, median of ``--repeat`` runs after one warm-up (numba compiled); process build time shown apart.
"""

from __future__ import annotations

import argparse
import statistics
import time

from optimizer import policy as POL
from tr_core.spec import preset

R2R = preset("r2r", [6.0, 27.9], p=0.35)
ME = preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2])
# name: (spec, N, round_to_grid, class, B*)
CASES = {
    "r2r8": (R2R, 8, False, "residual", (1, 5)),
    "r2r16": (R2R, 16, False, "residual", (2, 10)),
    "r2r8-corun": (R2R.with_corun([1.5, 1.05]), 8, True, "residual", (2, 6)),
    "me2": (ME, 2, False, "ratio", (1, 1, 1)),
    "me3": (ME, 3, False, "ratio", (1, 1, 1)),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print("| case | class | N | process states | process build s | with process s | without s | ratio "
          "| member | tok/s | evaluated |")
    print("|---" * 11 + "|")
    for name in a.cases:
        spec, N, rnd, cls, B = CASES[name]
        start = POL.class_start(cls, B)
        POL.search_class(spec, N, None, cls, start, round_to_grid=rnd, max_evals=2)   # warm-up (compile)
        with_s, without_s, build_s = [], [], []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            proc = POL.build_process(spec, N, round_to_grid=rnd, max_states=4_000_000)
            t1 = time.perf_counter()
            pa = POL.search_class(spec, N, proc, cls, start)
            t2 = time.perf_counter()
            del proc
            t3 = time.perf_counter()
            pb = POL.search_class(spec, N, None, cls, start, round_to_grid=rnd)
            t4 = time.perf_counter()
            if pa[0] != pb[0] or abs(pa[1] / pb[1] - 1) > 1e-12:
                raise SystemExit(f"error: {name}: the two paths disagree: {pa} vs {pb}")
            build_s.append(t1 - t0)
            with_s.append(t2 - t0)
            without_s.append(t4 - t3)
        n = POL.build_process(spec, N, round_to_grid=rnd, max_states=4_000_000).n
        w, wo = statistics.median(with_s), statistics.median(without_s)
        print(f"| {name} | {cls} | {N} | {n:,} | {statistics.median(build_s):.2f} | {w:.2f} | {wo:.2f} "
              f"| {w / wo:.1f}x | {pb[0]} | {pb[1]:.4f} | {pb[2]} |", flush=True)


if __name__ == "__main__":
    main()
