"""The default ``tr-optimize --p 0.35 --L 6.0 27.9 --N 1-64`` (``--search auto``) timed with a fresh result cache,
and its rows compared with the exhaustive search's for N = 1..--exhaustive-max (issue 25's target: identical
wherever exhaustive runs, <= 150 s on 2 cores).

    python experiments/bench_default.py [--N 1-64] [--exhaustive-max 20] [--fresh-numba]

``--fresh-numba`` also gives the run an empty NUMBA_CACHE_DIR (the kernels compile first, as on a first
install).  Prints one table: N, B* (default), B* (exhaustive), identical, tok/s, certificate, seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", default="1-64")
    ap.add_argument("--exhaustive-max", type=int, default=20, help="compare with exhaustive up to this N")
    ap.add_argument("--fresh-numba", action="store_true")
    a = ap.parse_args()
    from tr_core.cli import format_table

    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        if a.fresh_numba:
            env["NUMBA_CACHE_DIR"] = os.path.join(tmp, "numba")
        cmd = [sys.executable, "-m", "tr_model.cli", "--p", "0.35", "--L", "6.0", "27.9", "--N", a.N,
               "--cache-dir", os.path.join(tmp, "cache"), "--format", "json", "--quiet"]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            return 1
        rows = json.loads(r.stdout)["results"]
        import tr_model
        spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
        Ns = [x["N"] for x in rows if x["N"] <= a.exhaustive_max]
        ex = {o.N: o for o in tr_model.optimize_many(spec, Ns, search="exhaustive", workers=2,
                                                     cache=os.path.join(tmp, "ex-cache"))}
    table, same = [], 0
    for x in rows:
        o = ex.get(x["N"])
        ident = None if o is None else (tuple(x["B"]) == o.best_B and
                                         abs(x["throughput_tok_s"] - o.throughput_tok_s) <= 1e-9 * o.throughput_tok_s)
        same += bool(ident)
        table.append([x["N"], " ".join(map(str, x["B"])), "-" if o is None else " ".join(map(str, o.best_B)),
                      "-" if ident is None else ("yes" if ident else "NO"), f"{x['throughput_tok_s']:.2f}",
                      x.get("certificate", "-"), f"{x['seconds']:.2f}"])
    print(format_table(["N", "B* default", "B* exhaustive", "identical", "tok/s", "certificate", "seconds"], table))
    print(f"\ndefault run: {wall:.1f} s wall for N = {a.N} (fresh result cache"
          f"{', fresh numba cache' if a.fresh_numba else ''}); identical to exhaustive: {same} of {len(ex)} N")
    return 0


if __name__ == "__main__":
    sys.exit(main())
