"""The default sweep at server scale: ``tr-optimize --N a-b`` (``--search auto``, two workers, each searching
every other N in increasing order), this checkout beside the commit before a sweep's searches shared what
their box passes found (``optimizer.branch.BoxMemory``), in the same run.

Each row is one process, ``tr-optimize ... --N a-b --format json --no-cache`` (nothing from the result cache;
the numba caches are warm: a first call compiles each tree's kernels before the rows), timed as a whole; the
baseline runs the commit's own tree (a ``git worktree`` imported first through ``PYTHONPATH``, with its own
numba cache) right before the current one, so a load change on the machine hits both.  ``same_B`` counts the
N whose B* the two engines agree on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from . import _common

TITLE = "Sweep at server scale: the default tr-optimize over a range of N, with and without the box pass's memory of the previous N"
TOPIC = "search"
COMMAND = "python benchmarks/run.py sweep"
COLUMNS = ["system", "Ns", "engine", "exit", "seconds", "seconds_per_N", "peak_tree_mb", "exact", "certified",
           "max_gap", "max_err_bound", "evaluated", "same_B", "warnings", "message"]
BASELINE = "e84263b"
NOTES = ("R2R: --p 0.35 --L 6.0 27.9; R2R co-run: the same with --corun-slowdown 2.8 1.05 --round.  engine: 'now' "
         "is this checkout, 'before' the commit " + BASELINE + " (every N's box pass from scratch), run right "
         "before it.  seconds: the whole process; seconds_per_N = seconds / number of N; peak_tree_mb: the command "
         "and its workers summed, sampled every 0.5 s; exact / certified: how many N have each certificate "
         "(exhaustive or pruned-exact / certified); max_gap: the largest certified gap; max_err_bound: the largest "
         "proven relative throughput error over every kept chain; evaluated: chains solved over all N; same_B: "
         "N whose B* equals the other engine's; warnings: 'warning:' lines on stderr.  The memory acts from N = 64 "
         "(optimizer.branch.MEMORY_FROM_N).  Single runs (each pair takes minutes); each run is limited to "
         "1800 s (MAX_SECONDS).")

R2R = ["--p", "0.35", "--L", "6.0", "27.9"]
SYSTEMS = {"R2R": R2R, "R2R co-run": R2R + ["--corun-slowdown", "2.8", "1.05", "--round"]}
QUICK_ROWS = [("R2R", 65, 72)]
FULL_ROWS = [("R2R", 1, 128), ("R2R", 145, 160), ("R2R co-run", 145, 160)]
MAX_SECONDS = 1800
MAIN = "import sys; from tr_model.cli import main; sys.exit(main())"


def _argv(args: list) -> list:
    return [sys.executable, "-P", "-c", MAIN, *args]


def _engines() -> dict:
    base = dict(os.environ)
    base.pop("PYTHONPATH", None)
    tree = _common.worktree(BASELINE, "tr-sweep-baseline")
    return {"before": dict(base, PYTHONPATH=tree, NUMBA_CACHE_DIR=tree.rstrip(os.sep) + "-numba-cache"),
            "now": base}


def _one(system: str, a: int, b: int, engine: str, env: dict) -> tuple[dict, dict]:
    args = [*SYSTEMS[system], "--N", f"{a}-{b}", "--workers", "2", "--format", "json", "--no-cache", "--quiet"]
    with tempfile.TemporaryDirectory(prefix="tr-sweep-") as cwd:
        code, out, err, seconds, _peak, tree_mb = _common.run_process_tree(_argv(args), MAX_SECONDS, env=env,
                                                                            cwd=cwd)
    n = b - a + 1
    row = {"system": system, "Ns": f"{a}-{b}", "engine": engine, "exit": code, "seconds": seconds,
           "seconds_per_N": seconds / n, "peak_tree_mb": tree_mb}
    warn = [x for x in err.splitlines() if x.startswith("warning:")]
    row["warnings"] = len(warn)
    if code != 0:
        lines = [x for x in err.splitlines() if x.startswith("error:")] or err.splitlines()[-1:]
        row["message"] = (f"not finished within {MAX_SECONDS} s (killed)" if seconds >= MAX_SECONDS
                          else (lines[0][:160] if lines else ""))
        return row, {}
    res = json.loads(out)["results"]
    exact = sum(1 for r in res if r.get("certificate") in ("exhaustive", "pruned-exact"))
    row.update(exact=exact, certified=len(res) - exact,
               max_gap=max(float(r.get("gap") or 0.0) for r in res),
               max_err_bound=max(float(r.get("max_throughput_error_bound") or 0.0) for r in res),
               evaluated=sum(int(r.get("evaluated") or 0) for r in res))
    if warn:
        row["message"] = warn[0][:160]
    return row, {int(r["N"]): tuple(r["B"]) for r in res}


def run(quick: bool) -> list[dict]:
    engines = _engines()
    for env in engines.values():   # compile each tree's kernels (exhaustive and pruned paths) before the rows
        for n in (2, 24):
            subprocess.run(_argv([*R2R, "--N", str(n), "--no-cache", "--quiet"]), capture_output=True, env=env,
                           cwd=tempfile.gettempdir())
    rows = []
    for system, a, b in (QUICK_ROWS if quick else FULL_ROWS):
        answers = {}
        pair = []
        for engine in ("before", "now"):
            row, answers[engine] = _one(system, a, b, engine, engines[engine])
            pair.append(row)
            print(f"#   {system} N = {a}-{b} ({engine}): exit {row['exit']}, {row['seconds']:.1f} s",
                  file=sys.stderr, flush=True)
        same = sum(1 for N, B in answers["now"].items() if answers["before"].get(N) == B)
        for row in pair:
            row["same_B"] = same
        rows.extend(pair)
    return rows
