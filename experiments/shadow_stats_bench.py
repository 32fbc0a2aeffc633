"""Time ``tr-shadow stats`` over a whole routing matrix, all model pairs.

Target (issue 8): the full ``../shared/data/llmrouter-dcrouter/train.json``
(5,608 queries, 9 models, 36 pairs) in under 30 s.  Measures the CLI end to
end in fresh processes (the first run may compile the numba kernels into the
on-disk cache; later runs load them), then the stages in-process.

    python experiments/shadow_stats_bench.py [--matrix PATH] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEFAULT = os.path.join(ROOT, "..", "shared", "data", "llmrouter-dcrouter", "train.json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", default=DEFAULT)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if not os.path.exists(args.matrix):
        sys.exit(f"no matrix at {args.matrix}: pass --matrix PATH")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "shadow_prefill.cli", "stats", "--matrix", args.matrix, "--format", "json",
           "--out", os.devnull]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}")
    print(f"command: tr-shadow stats --matrix {os.path.relpath(args.matrix, ROOT)} --format json\n")
    import tempfile
    with tempfile.TemporaryDirectory() as cold:
        t0 = time.perf_counter()
        r = subprocess.run(cmd, env={**env, "NUMBA_CACHE_DIR": cold}, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(r.stderr)
        print(f"CLI run with an empty numba cache (compiles every kernel): {time.perf_counter() - t0:.2f} s")
    walls = []
    for k in range(args.runs):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        if r.returncode != 0:
            sys.exit(r.stderr)
        print(f"CLI run {k + 1} (fresh process): {walls[-1]:.2f} s")

    # stages, in process (kernels already compiled by the runs above)
    from shadow_prefill.builder import MatrixWorkload
    from shadow_prefill.matrix import load_matrix
    from shadow_prefill.stats import compute_prefix_hits, compute_switch_tax
    t = {}
    t0 = time.perf_counter()
    m = load_matrix(args.matrix)
    t["load matrix + prices"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    w = MatrixWorkload(m, seed=0)
    t["token counts + draws"] = time.perf_counter() - t0
    pairs = m.all_pairs()
    t0 = time.perf_counter()
    sets = [w.sessions(p) for p in pairs]
    t["route + grow contexts (all pairs)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for ss in sets:
        compute_prefix_hits(ss)
    t["hits, unbounded (all pairs)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for ss in sets:
        compute_prefix_hits(ss, 262144)
    t["hits, LRU capacity (all pairs)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    for ss, p in zip(sets, pairs):
        compute_switch_tax(ss, prices=m.prices, accuracy=w.accuracy(p))
    t["full statistics (all pairs)"] = time.perf_counter() - t0
    print(f"\n{m.n_queries:,} queries, {len(m.model_names)} models, {len(pairs)} pairs, "
          f"{sum(s.n_calls for s in sets):,} calls in all\n")
    print("| stage | seconds |\n|---|---:|")
    for k, v in t.items():
        print(f"| {k} | {v:.3f} |")
    best = min(walls)
    print(f"\nend to end (best of {len(walls)} fresh processes): {best:.2f} s (target < 30 s): "
          f"{'PASS' if max(walls[1:] or walls) < 30 else 'FAIL'}")


if __name__ == "__main__":
    main()
