"""Box processes on borrowed arrays: the decision-process kernels of the pruned search (coarse-clock builds,
sub-box cut-outs, fine-clock builds) and the default searches they serve, this checkout beside the commit
before their arrays were borrowed (``dtmc._kernels._borrow``), side by side in one run.

The baseline is a ``git worktree`` of that commit, imported first through ``PYTHONPATH`` with its own numba
cache; every timing is one subprocess of this venv's Python (``-P``), and each engine's kernels are compiled
by one untimed run before the timed ones.  The timed subprocesses alternate baseline, now, baseline, now ...,
so a load change on the machine hits both alike.  ``build`` times the kernels inside the process (one call
each) and fingerprints every process they return (sha1 of its arrays up to their counts), so
``outputs_equal`` says the two engines built the very same processes; the searches compare B* and the
throughput."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from . import _common

TITLE = "Box processes on borrowed arrays: the pruned search's decision-process kernels and the searches they serve, beside the commit before"
TOPIC = "search"
COMMAND = "python benchmarks/run.py boxes"
COLUMNS = ["workload", "pairs", "before_s", "now_s", "ratio", "before_peak_mb", "now_peak_mb", "outputs_equal",
           "result", "load_1m"]
BASELINE = "12d8cbc"
MAX_SECONDS = 1200
R2R = ["--p", "0.35", "--L", "6.0", "27.9"]
NOTES = ("before: the commit " + BASELINE + " (every array a kernel's helpers take counted on each call); now: "
         "this checkout.  before_s / now_s: the median over the pairs of the workload's seconds (build: the sum of "
         "its kernel calls inside the process; searches: the whole process); ratio = now_s / before_s; peak_mb: "
         "the largest single process's peak resident memory (median), for the searches the command and its "
         "workers summed, sampled every 0.5 s.  build: R2R (p = 0.35, L = (6.0, 27.9) ms) at N = 160, "
         "coarse_mdp_build of the boxes [1, 40]^2 and [41, 80] x [1, 40] on slots of 30 quanta and [1, 40] x "
         "[41, 80] on slots of 12 (the far boxes of the first grid), mdp_restrict of [1, 20] x [41, 80] and "
         "[21, 40] x [41, 80] out of the last, and mdp_build of the all-policy box at N = 48 (fine clock, empty "
         "batches); outputs_equal: every process's arrays identical.  search: tr-optimize " + " ".join(R2R) +
         " --N N --no-cache --format json, one process (--workers 1) or the default workers; outputs_equal: the "
         "same B* and throughput within 1e-12 relative (at every N of the sweep: tr-optimize --N 145-152, default "
         "workers, each worker's searches sharing their box memory).  load_1m: the 1-minute load average at the first start "
         "(median).")

BUILD = r'''
import hashlib, json, sys, time
import numpy as np
import dtmc, optimizer, tr_model
from optimizer import _kernels as K
from optimizer.bounds import coarse_durations, lowered
files = [m.__file__ for m in (dtmc, optimizer, tr_model)]
spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)

def fingerprint(r, M):
    st, n = int(r[0]), int(r[1])
    out_ptr, opt_ptr = r[5], r[7]
    nu = int(out_ptr[n]); ne = int(opt_ptr[nu])
    parts = [r[2][:n], r[3][:n], r[4][:n], out_ptr[:n + 1], r[6][:nu], opt_ptr[:nu + 1], r[8][:ne]]
    if len(r) > 9 and not np.isscalar(r[9]):
        parts += [r[9][:ne * M], r[10][:ne * M]]
    h = hashlib.sha1()
    for a in parts:
        h.update(np.ascontiguousarray(a).tobytes())
    return [st, n, ne, h.hexdigest()[:16]]

def coarse(N, lo, hi, c):
    low = lowered(spec, N, False, None, None, empty=False)
    dlo, dhi = coarse_durations(low.d, c)
    tables = low.with_packing(max(1, int(dhi.max()).bit_length()))
    dur = np.ascontiguousarray(np.stack([dlo, dhi, dlo, dhi]))
    t0 = time.perf_counter()
    r = K.coarse_mdp_build(N, K.Box(np.array(lo), np.array(hi)), tables, dur, K.Limits(3_000_000, 300_000_000), True)
    return time.perf_counter() - t0, r

warm = coarse(8, (1, 1), (4, 4), 2)[1]
K.mdp_restrict(K.CoarseProcess(warm[1], *warm[3:]), K.Box(np.array([1, 1]), np.array([2, 2])))
K.mdp_build(4, K.Box(np.array([0, 0]), np.array([5, 5])), lowered(spec, 4, False, None, None, empty=True).tables,
            K.Limits(10 ** 6, 10 ** 8), True)
total, out = 0.0, []
for lo, hi, c in (((1, 1), (40, 40), 30), ((41, 1), (80, 40), 30), ((1, 41), (40, 80), 12)):
    dt, r = coarse(160, lo, hi, c)
    total += dt
    out.append([f"coarse {lo}-{hi} slot {c}", fingerprint(r, 2)])
proc = K.CoarseProcess(r[1], *r[3:])
for lo, hi in (((1, 41), (20, 80)), ((21, 41), (40, 80))):
    t0 = time.perf_counter()
    x = K.mdp_restrict(proc, K.Box(np.array(lo), np.array(hi)))
    total += time.perf_counter() - t0
    out.append([f"restrict {lo}-{hi}", fingerprint(x, 2)])
low = lowered(spec, 48, False, None, None, empty=True)
t0 = time.perf_counter()
x = K.mdp_build(48, K.Box(np.array([0, 0]), np.array([49, 49])), low.tables, K.Limits(3_000_000, 300_000_000), True)
total += time.perf_counter() - t0
out.append(["fine all-policy N=48", fingerprint(x, 2)])
sys.stdout.write("\n@@BOXES@@" + json.dumps({"files": files, "seconds": total, "values": out}) + "\n")
'''

MAIN = "import sys; from tr_model.cli import main; sys.exit(main())"


def _engines() -> dict:
    base = dict(os.environ)
    base.pop("PYTHONPATH", None)
    tree = _common.worktree(BASELINE, "tr-boxes-baseline")
    return {"before": (tree, dict(base, PYTHONPATH=tree, NUMBA_CACHE_DIR=tree.rstrip(os.sep) + "-numba-cache")),
            "now": (_common.ROOT, base)}


def _build(tree: str, env: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="tr-boxes-") as cwd:
        code, out, err, seconds, peak = _run([sys.executable, "-P", "-c", BUILD], env, cwd)
    if code != 0 or "@@BOXES@@" not in out:
        raise RuntimeError(f"build in {tree}: exit {code}\n" + "\n".join(err.strip().splitlines()[-5:]))
    doc = json.loads(out.rsplit("@@BOXES@@", 1)[1])
    wrong = [f for f in doc["files"] if not os.path.realpath(f).startswith(os.path.realpath(tree) + os.sep)]
    if wrong:
        raise RuntimeError(f"the build run imported modules outside {tree}: {wrong}")
    return {"seconds": doc["seconds"], "peak": peak, "values": doc["values"]}


def _run(argv, env, cwd):
    code, out, err, seconds, usage = _common.run_process_usage(argv, MAX_SECONDS, env=env, cwd=cwd)
    return code, out, err, seconds, usage.ru_maxrss / 1024.0


def _search(tree: str, env: dict, N, workers: list[str]) -> dict:
    args = [*R2R, "--N", str(N), *workers, "--format", "json", "--no-cache", "--quiet"]
    with tempfile.TemporaryDirectory(prefix="tr-boxes-") as cwd:
        code, out, err, seconds, _peak, tree_mb = _common.run_process_tree(
            [sys.executable, "-P", "-c", MAIN, *args], MAX_SECONDS, env=env, cwd=cwd)
    if code != 0:
        raise RuntimeError(f"tr-optimize {' '.join(args)} in {tree}: exit {code}\n" + err.strip()[-400:])
    res = json.loads(out)["results"]
    return {"seconds": seconds, "peak": tree_mb,
            "values": [[int(r["N"]), list(r["B"]), float(r["throughput_tok_s"]), r.get("certificate"), r.get("gap")]
                       for r in res]}


def _same(kind: str, a, b) -> bool:
    if kind == "build":
        return a == b
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        rel = abs(x[2] - y[2]) / max(abs(x[2]), abs(y[2]), 1e-300)
        if x[0] != y[0] or x[1] != y[1] or rel > 1e-12:
            return False
    return True


def workloads(quick: bool):
    # (label, kind, pairs, N, workers)
    if quick:
        return [("build: box processes R2R N=160", "build", 1, 0, []),
                ("search: R2R N=96, one process", "search", 1, 96, ["--workers", "1"])]
    return [("build: box processes R2R N=160", "build", 3, 0, []),
            ("search: R2R N=160, one process", "search", 2, 160, ["--workers", "1"]),
            ("search: R2R N=256, default workers", "search", 1, 256, []),
            ("sweep: R2R N=145-152, default workers", "search", 1, "145-152", [])]


def run(quick: bool) -> list[dict]:
    engines = _engines()
    for name, (tree, env) in engines.items():     # compile each engine's kernels, untimed
        _build(tree, env)
        _search(tree, env, 8, ["--workers", "1"])
    rows = []
    for label, kind, pairs, N, workers in workloads(quick):
        res = {"before": [], "now": []}
        load = []
        for i in range(pairs):
            for name, (tree, env) in engines.items():
                load.append(os.getloadavg()[0])
                res[name].append(_build(tree, env) if kind == "build" else _search(tree, env, N, workers))
            print(f"#   {label} pair {i + 1}/{pairs}: before {res['before'][-1]['seconds']:.1f} s, "
                  f"now {res['now'][-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
        ref = res["before"][0]["values"]
        equal = all(_same(kind, ref, r["values"]) for r in res["before"] + res["now"])
        b = statistics.median(r["seconds"] for r in res["before"])
        n = statistics.median(r["seconds"] for r in res["now"])
        last = res["now"][-1]["values"]
        if kind == "build":
            result = "; ".join(f"{v[0]}: {v[1][1]:,} states" for v in last[:3])
        elif len(last) == 1:
            _, B, tok, cert, gap = last[0]
            result = f"B* {tuple(B)}, {tok:,.2f} tok/s, {cert}" + (f" gap {float(gap):.3%}" if gap else "")
        else:
            gaps = [float(v[4] or 0.0) for v in last]
            result = (f"{len(last)} N, {sum(v[3] in ('exhaustive', 'pruned-exact') for v in last)} exact, "
                      f"largest gap {max(gaps):.3%}; {n / len(last):.1f} s an N now")
        rows.append({"workload": label, "pairs": pairs, "before_s": b, "now_s": n, "ratio": n / b,
                     "before_peak_mb": statistics.median(r["peak"] for r in res["before"]),
                     "now_peak_mb": statistics.median(r["peak"] for r in res["now"]),
                     "outputs_equal": "yes" if equal else "no", "result": result,
                     "load_1m": statistics.median(load)})
    return rows
