"""The threshold chain's build time in two source trees, side by side (issue 27: the policy-table refactor
must not slow the threshold chain).

    python experiments/chain_build_ab.py --before /path/to/old/tree --after . --N 32 64 --rounds 5

Each round starts one fresh process per tree, alternating (before, after, before, ...), so both see the
same machine load; a process loads its tree's kernels (own numba cache, warmed before timing) and times
``dtmc.build_chain`` (enumeration + CSR assembly) for R2R (p = 0.35, L = 6.0 / 27.9 ms, delta = 0.1 ms)
at each N, for B = (1, 1) (the largest chain) and B = B*-like thresholds, ``--repeat`` times; the round's
figure is the median.  The table gives the median over rounds per tree and the median of the per-round
ratios after / before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, statistics, sys, time
import dtmc
from tr_core.spec import preset
spec = preset("r2r", [6.0, 27.9], p=0.35)
out = {}
for N, B in json.loads(sys.argv[1]):
    d, _ = spec.quanta_table(N)
    dtmc.build_chain(spec.P, spec.C, d, N, B)          # kernels loaded (compiled into this tree's cache)
    ts = []
    for _ in range(int(sys.argv[2])):
        t0 = time.perf_counter()
        ch = dtmc.build_chain(spec.P, spec.C, d, N, B)
        ts.append(time.perf_counter() - t0)
    out[f"{N} {tuple(B)}"] = [statistics.median(ts), len(ch.keys)]
print(json.dumps(out))
"""


def run(tree, cases, repeat):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree),
               NUMBA_CACHE_DIR=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                            "numba-ab-" + os.path.abspath(tree).replace("/", "_")))
    res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cases), str(repeat)], env=env, check=True,
                         capture_output=True, text=True, cwd=os.path.abspath(tree))
    return json.loads(res.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="source tree of the baseline")
    ap.add_argument("--after", default=".", help="source tree under test (default: this one)")
    ap.add_argument("--N", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    bstar = {32: (3, 20), 64: (6, 40)}
    cases = [(N, B) for N in a.N for B in ((1, 1), bstar.get(N, (max(1, N // 10), max(1, (5 * N) // 8))))]
    per = {"before": [], "after": []}
    for _ in range(a.rounds):
        per["before"].append(run(a.before, cases, a.repeat))
        per["after"].append(run(a.after, cases, a.repeat))
    print(f"rounds {a.rounds} x repeat {a.repeat}; load average {os.getloadavg()[0]:.1f} at the end")
    print("| N | B | states | before s (median) | after s (median) | after / before (median of rounds) |")
    print("|---|---|---|---|---|---|")
    for key in per["before"][0]:
        bt = [r[key][0] for r in per["before"]]
        at = [r[key][0] for r in per["after"]]
        ratio = statistics.median(x / y for x, y in zip(at, bt))
        N, B = key.split(" ", 1)
        print(f"| {N} | {B} | {per['after'][0][key][1]:,} | {statistics.median(bt):.4f} | {statistics.median(at):.4f} "
              f"| {ratio:.3f} |")


if __name__ == "__main__":
    main()
