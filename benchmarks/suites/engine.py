"""Engine speed: the refactored engine (records, one launch law, the lowering step) next to the engine before
it (commit ``3d0c14f``), the same workloads timed side by side in one run.

The old engine is a ``git worktree`` of that commit (made under the temporary folder, or reused when it is
already there and clean; a stale one is removed and made again).  Every timing is one subprocess of this
venv's Python, run with ``-P`` (nothing prepended to ``sys.path``) and, for the old engine,
``PYTHONPATH=<worktree>`` first, so its packages win over the editable install; each subprocess reports the
``__file__`` of ``tr_model``, ``optimizer`` and ``dtmc`` and the suite refuses a run that imported the wrong
tree.  Each engine has its own numba cache (the old one a folder beside the worktree, the new one whatever
``NUMBA_CACHE_DIR`` says), warmed by one untimed run of each workload.  The timed subprocesses alternate old,
new, old, new ... so a load change on the machine hits both alike.  A process's CPU time is its resource
usage (``wait4``: user + system) from start to end, imports and numba cache loads included; wall is the
whole process; ``work_cpu`` is the CPU time of the workload calls inside it (``getrusage`` of the process
and its reaped children: the search's worker pool), their median over the in-process repeats (the first
repeat also loads the compiled kernels from the numba cache)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from . import _common

TITLE = "Engine: the refactored engine next to the engine before the refactor (commit 3d0c14f), side by side"
TOPIC = "chain speed"
COMMAND = "python benchmarks/run.py engine"
COLUMNS = ["workload", "pairs", "repeats", "old_cpu_s", "new_cpu_s", "cpu_ratio", "old_wall_s", "new_wall_s",
           "wall_ratio", "old_work_cpu_s", "new_work_cpu_s", "work_cpu_ratio", "load_1m", "outputs_equal",
           "max_rel_diff", "target_met"]
NOTES = ("Old: commit 3d0c14f (before the refactor) in a git worktree, imported first through PYTHONPATH (the "
         "imported files are checked to be the worktree's); new: this checkout.  Each pair is one old and one new "
         "subprocess, run in turn; *_cpu_s: median over the pairs of the process's user + system CPU seconds "
         "(wait4), imports and numba cache loads included; *_wall_s: median of the process's wall seconds; "
         "*_work_cpu_s: median over the pairs of the in-process median CPU seconds (getrusage: the process and "
         "its reaped children, the search's worker pool) of one repeat (every call of the workload once); "
         "ratios are new / old of those medians; target_met: cpu_ratio and wall_ratio both <= 1.05.  load_1m: "
         "the 1-minute load average at the processes' starts (median; the machine has the cores the header says, "
         "shared with other work).  outputs_equal: every throughput of "
         "old and new within 1e-12 relative and the same B* (or bound status) everywhere; max_rel_diff: the "
         "largest relative throughput difference.  chain: tr_model.evaluate of R2R (p = 0.35, L = (6.0, 27.9) "
         "ms) at N = 40, B = (1, 1) and N = 64, B = (6, 40), and ME (weights (0.5, 0.3, 0.2), L = (6.0, 15.0, "
         "27.9) ms) at N = 6, B = (1, 2, 2).  search: tr-optimize --p 0.35 --L 6.0 27.9 --N 1-64 --no-cache "
         "--quiet --format json (its main() in the process; the default search: exhaustive at small N, pruned "
         "above; the default --workers auto: a pool of one process per core); a quick run sweeps N = 32-48.  "
         "policy: optimizer.bounds.policy_bound (the all-policy bound) of R2R at N = 10 and 32 and ME at N = 3, "
         "and optimizer.policy.optimal_policy (the optimal launch policy) of R2R at N = 24 and ME at N = 3.")

OLD_COMMIT = "3d0c14f"
TARGET = 1.05
REL_TOL = 1e-12
MAX_SECONDS = 900          # one subprocess
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The workloads, run inside the subprocess (APIs present in both engines: tr_model.preset/evaluate,
# tr_model.cli.main, optimizer.bounds.policy_bound, optimizer.policy.optimal_policy).
WORKER = r'''
import contextlib, io, json, os, resource, sys, time
kind, repeats, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
import tr_model, optimizer, dtmc
files = {m.__name__: os.path.realpath(m.__file__) for m in (tr_model, optimizer, dtmc)}
r2r = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
me = tr_model.preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2])

def chain():
    out = []
    for name, spec, N, B in (("R2R", r2r, 40, (1, 1)), ("R2R", r2r, 64, (6, 40)), ("ME", me, 6, (1, 2, 2))):
        ev = tr_model.evaluate(spec, N, B)
        out.append([f"{name} N={N} B={list(B)}", list(B), float(ev.throughput_tok_s)])
    return out

def search():
    from tr_model import cli
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = cli.main(["--p", "0.35", "--L", "6.0", "27.9", "--N", extra[0], "--no-cache", "--quiet",
                         "--format", "json"])
    if code not in (0, None):
        raise SystemExit(f"tr-optimize exited {code}")
    return [[f"N={r['N']}", list(r["B"]), float(r["throughput_tok_s"])] for r in json.loads(buf.getvalue())["results"]]

def policy():
    from optimizer.bounds import policy_bound
    from optimizer.policy import optimal_policy
    out = []
    for name, spec, N in (("R2R", r2r, 10), ("R2R", r2r, 32), ("ME", me, 3)):
        b = policy_bound(spec, N)
        out.append([f"policy_bound {name} N={N}", b.status, float(b.upper_tok_s)])
    for name, spec, N in (("R2R", r2r, 24), ("ME", me, 3)):
        p = optimal_policy(spec, N)
        out.append([f"optimal_policy {name} N={N}", None, float(p.throughput_tok_s)])
        out.append([f"optimal_policy {name} N={N} bound", None, float(p.upper_bound_tok_s)])
    return out

def cpu_s():   # this process and its reaped children (the search's worker pool)
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))

fn = {"chain": chain, "search": search, "policy": policy}[kind]
times, values = [], None
for _ in range(max(1, repeats)):
    t0 = cpu_s()
    values = fn()
    times.append(cpu_s() - t0)
sys.stdout.write("\n@@ENGINE@@" + json.dumps({"files": files, "times": times, "values": values}) + "\n")
'''


def old_worktree() -> str:
    """The worktree of the old engine: reused when it is a clean checkout of OLD_COMMIT, else made again."""
    return _common.worktree(OLD_COMMIT, "tr-engine-baseline")


def _run(argv, env, cwd) -> tuple[int, str, str, float, float]:
    """Run to the end: (exit code, stdout, stderr, wall seconds, user + system CPU seconds of the process)."""
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=fo, stderr=fe, text=True, env=env, cwd=cwd)
        timer = threading.Timer(MAX_SECONDS, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - t0
        fo.seek(0)
        fe.seek(0)
        return os.waitstatus_to_exitcode(status), fo.read(), fe.read(), wall, usage.ru_utime + usage.ru_stime


class Engine:
    def __init__(self, name: str, tree: str, env: dict):
        self.name, self.tree, self.env = name, os.path.realpath(tree), env

    def run(self, kind: str, repeats: int, extra: list[str]) -> dict:
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(prefix="tr-engine-run-") as cwd:
            code, out, err, wall, cpu = _run([sys.executable, "-P", "-c", WORKER, kind, str(repeats), *extra],
                                             self.env, cwd)
        if code != 0 or "@@ENGINE@@" not in out:
            tail = "\n".join(err.strip().splitlines()[-5:])
            raise RuntimeError(f"{self.name} engine, {kind}: exit {code}\n{tail}")
        doc = json.loads(out.rsplit("@@ENGINE@@", 1)[1])
        wrong = {m: f for m, f in doc["files"].items() if not f.startswith(self.tree + os.sep)}
        if wrong:
            raise RuntimeError(f"{self.name} engine imported modules outside {self.tree}: {wrong}")
        doc.update(cpu=cpu, wall=wall, load=load)
        return doc


def engines() -> tuple[Engine, Engine]:
    tree = old_worktree()
    base = dict(os.environ)
    base.pop("PYTHONPATH", None)
    old_env = dict(base, PYTHONPATH=tree, NUMBA_CACHE_DIR=tree.rstrip(os.sep) + "-numba-cache")
    return Engine("old", tree, old_env), Engine("new", ROOT, base)


def compare(a: list, b: list) -> tuple[bool, float]:
    """Whether two workloads' outputs agree (same labels and B*/status, throughputs within REL_TOL)."""
    if len(a) != len(b):
        return False, float("inf")
    ok, worst = True, 0.0
    for (la, ka, ta), (lb, kb, tb) in zip(a, b):
        rel = abs(ta - tb) / max(abs(ta), abs(tb), 1e-300) if ta != tb else 0.0
        worst = max(worst, rel)
        ok = ok and la == lb and ka == kb and rel <= REL_TOL
    return ok, worst


def workloads(quick: bool):
    # (name shown, kind, in-process repeats, pairs, extra argv)
    if quick:
        return [("chain: evaluate R2R N=40, N=64, ME N=6", "chain", 2, 2, []),
                ("search: tr-optimize R2R N=32-48", "search", 1, 1, ["32-48"]),
                ("policy: policy_bound + optimal_policy", "policy", 1, 2, [])]
    return [("chain: evaluate R2R N=40, N=64, ME N=6", "chain", 5, 5, []),
            ("search: tr-optimize R2R N=1-64", "search", 1, 3, ["1-64"]),
            ("policy: policy_bound + optimal_policy", "policy", 2, 5, [])]


def run(quick: bool) -> list[dict]:
    old, new = engines()
    rows = []
    for label, kind, repeats, pairs, extra in workloads(quick):
        for eng in (old, new):   # warm: each engine's numba cache compiled and loaded once, untimed
            eng.run(kind, 1, extra)
        res = {"old": [], "new": []}
        for i in range(pairs):
            for eng in (old, new):
                res[eng.name].append(eng.run(kind, repeats, extra))
            print(f"#   {kind} pair {i + 1}/{pairs}: old {res['old'][-1]['cpu']:.2f} s CPU, "
                  f"new {res['new'][-1]['cpu']:.2f} s CPU", file=sys.stderr, flush=True)
        equal, worst = True, 0.0
        for r in res["old"] + res["new"]:
            e, w = compare(res["old"][0]["values"], r["values"])
            equal, worst = equal and e, max(worst, w)
        med = {k: {m: statistics.median(r[m] for r in v) for m in ("cpu", "wall")} for k, v in res.items()}
        for k, v in res.items():
            med[k]["work_cpu"] = statistics.median(statistics.median(r["times"]) for r in v)
        ratio = {m: med["new"][m] / med["old"][m] for m in ("cpu", "wall", "work_cpu")}
        rows.append({"workload": label, "pairs": pairs, "repeats": repeats,
                     "old_cpu_s": med["old"]["cpu"], "new_cpu_s": med["new"]["cpu"], "cpu_ratio": ratio["cpu"],
                     "old_wall_s": med["old"]["wall"], "new_wall_s": med["new"]["wall"],
                     "wall_ratio": ratio["wall"], "old_work_cpu_s": med["old"]["work_cpu"],
                     "new_work_cpu_s": med["new"]["work_cpu"], "work_cpu_ratio": ratio["work_cpu"],
                     "load_1m": statistics.median(r["load"] for v in res.values() for r in v),
                     "outputs_equal": equal, "max_rel_diff": worst,
                     "target_met": ratio["cpu"] <= TARGET and ratio["wall"] <= TARGET})
    return rows
