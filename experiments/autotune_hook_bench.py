"""Server-start hook: time to return under a budget (cold and warm numba cache), and how the table fills.

For each case, ``on_server_start(spec, N, out, time_budget_s=B, background=True)`` is called in this
process with the worker's numba cache either empty (cold: every kernel compiles in the worker) or the
usual one (warm).  Printed: the wall time until the call returned, the rows computed by then, and, while
the background worker keeps going for ``--follow-s`` seconds, when each row appeared in the file with
its certificate, gap and search time.  The worker is killed at the end (``stop_worker``).

    .venv/bin/python experiments/autotune_hook_bench.py --N 256 --budgets 1 5 --follow-s 120
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import tr_model
from tr_model import autotune
from tr_model.thresholds import ThresholdTable


def run_case(spec, N, budget, cold, follow_s, root):
    out = os.path.join(root, f"th-{'cold' if cold else 'warm'}-{budget:g}.json")
    old = os.environ.get("NUMBA_CACHE_DIR")
    if cold:
        os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="numba-cold-", dir=root)
    try:
        t0 = time.monotonic()
        table = autotune.on_server_start(spec, N, out, time_budget_s=budget, background=True)
        returned = time.monotonic() - t0
    finally:
        if cold:
            if old is None:
                os.environ.pop("NUMBA_CACHE_DIR", None)
            else:
                os.environ["NUMBA_CACHE_DIR"] = old
    at_return = table.covered_concurrency
    seen = {}
    deadline = t0 + follow_s
    while time.monotonic() < deadline:
        try:
            doc = json.load(open(out))
        except (OSError, ValueError):
            doc = None
        if doc:
            for e in doc["entries"]:
                if e["certificate"] != "extrapolated" and e["active_requests"] not in seen:
                    seen[e["active_requests"]] = (time.monotonic() - t0, e)
            if doc["complete"]:
                break
        time.sleep(0.2)
    autotune.stop_worker(out)
    ThresholdTable.load(out)   # whatever the worker left is a valid file
    return returned, at_return, seen


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", type=int, default=256)
    ap.add_argument("--budgets", type=float, nargs="+", default=[1.0, 5.0])
    ap.add_argument("--follow-s", type=float, default=60.0)
    ap.add_argument("--cases", nargs="+", default=["cold", "warm"], choices=["cold", "warm"])
    a = ap.parse_args()
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    print(f"R2R p = 0.35, L = (6.0, 27.9) ms, delta = 0.1 ms, N = 1..{a.N}, search auto, max_gap 0.005")
    print("| numba cache | budget s | returned after s | rows computed at return | rows after follow | "
          "last row at s |")
    print("|---|---|---|---|---|---|")
    details = []
    with tempfile.TemporaryDirectory(prefix="hook-bench-") as root:
        for case in a.cases:
            for b in a.budgets:
                ret, k, seen = run_case(spec, a.N, b, case == "cold", a.follow_s, root)
                last = max(seen) if seen else 0
                print(f"| {case} | {b:g} | {ret:.2f} | {k} | {len(seen)} | "
                      f"{seen[last][0]:.1f} |" if seen else f"| {case} | {b:g} | {ret:.2f} | {k} | 0 | - |",
                      flush=True)
                details.append((case, b, seen))
    case, b, seen = details[-1]
    print(f"\nrows of the last case ({case} cache, budget {b:g} s): N, appeared at s, certificate, gap, "
          f"evaluated, pruned, search s")
    print("| N | at s | certificate | gap | evaluated | pruned | search s |")
    print("|---|---|---|---|---|---|---|")
    for n in sorted(seen):
        t, e = seen[n]
        print(f"| {n} | {t:.1f} | {e['certificate']} | {e['gap']:.2g} | {e['evaluated']} | {e['pruned']} | "
              f"{e['seconds']:.2f} |")


if __name__ == "__main__":
    main()
