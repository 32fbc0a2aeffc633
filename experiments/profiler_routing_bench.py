"""Routing-estimator throughput and memory on generated traces (target: 10M lines in < 60 s, flat memory).

Usage:  .venv/bin/python experiments/profiler_routing_bench.py [--lines 10000000] [--repeats 3] [--dir /tmp]

For each trace size (1/100, 1/10 and all of --lines) it writes a synthetic
trace (R2R-like P, 16 requests in flight, 1000 steps per request, end markers),
then runs ``estimate_routing`` ``--repeats`` times, each in a fresh subprocess
so that the peak resident memory (VmHWM) of the estimator alone is
measured; reports the median wall time, lines/s, MB/s and the peak RSS.  A
pure-Python ``json.loads`` loop over the smallest trace gives the baseline
the numba fast path replaces.  The first subprocess run compiles the numba
kernels if the cache is cold; the median hides that.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

P = [[0.8, 0.2], [1.0, 0.0]]
C = [[1, 0], [1, 0]]

CHILD = r"""
import json, sys, time
from profiler.routing import estimate_routing
t0 = time.perf_counter()
est = estimate_routing(sys.argv[1])
dt = time.perf_counter() - t0
# VmHWM (peak RSS of this address space): ru_maxrss would carry the parent's peak across exec
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"seconds": dt, "lines": est.lines, "rss_mb": int(hwm) / 1024,
                  "p01": float(est.P[0, 1]), "geometric": est.geometric[0].verdict}))
"""

BASELINE = r"""
import json, sys, time
t0 = time.perf_counter()
n = {}
for line in open(sys.argv[1], "rb"):
    o = json.loads(line)
    k = (o["model"], o["next_model"])
    n[k] = n.get(k, 0) + o["committed_tokens"]
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lines", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    a = ap.parse_args()
    from profiler.synth import write_synthetic_trace

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows = []
    sizes = [a.lines // 100, a.lines // 10, a.lines]
    paths = []
    for n in sizes:
        steps = 1000
        path = os.path.join(a.dir, f"tr_bench_{n}.jsonl")
        t0 = time.perf_counter()
        written = write_synthetic_trace(path, P, C, n_requests=max(1, n // steps), steps_per_request=steps, seed=1,
                                        concurrency=16)
        gen = time.perf_counter() - t0
        paths.append(path)
        mb = os.path.getsize(path) / 1e6
        runs = []
        for _ in range(a.repeats):
            out = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True, text=True, env=env,
                                 check=True)
            runs.append(json.loads(out.stdout))
        secs = [r["seconds"] for r in runs]
        med = statistics.median(secs)
        rows.append({"lines": written, "file_mb": mb, "generate_s": gen, "median_s": med, "min_s": min(secs),
                     "max_s": max(secs), "mlines_per_s": written / med / 1e6, "mb_per_s": mb / med,
                     "peak_rss_mb": max(r["rss_mb"] for r in runs), "p01_hat": runs[0]["p01"]})
    base = subprocess.run([sys.executable, "-c", BASELINE, paths[0]], capture_output=True, text=True, env=env,
                          check=True)
    base_s = json.loads(base.stdout)["seconds"]
    cols = ["lines", "file_mb", "generate_s", "median_s", "min_s", "max_s", "mlines_per_s", "mb_per_s",
            "peak_rss_mb", "p01_hat"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols))
    print(f"json.loads baseline over {sizes[0]} lines: {base_s:.2f} s = {sizes[0] / base_s / 1e6:.3f} M lines/s "
          f"(the fast path on the largest trace: {rows[-1]['mlines_per_s'] / (sizes[0] / base_s / 1e6):.1f}x faster per line, "
          f"its median includes ~1 s of kernel loading)")
    for p in paths:
        os.unlink(p)


if __name__ == "__main__":
    main()
