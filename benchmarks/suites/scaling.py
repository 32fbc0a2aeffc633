"""The default command at server-scale concurrency: what ``tr-optimize`` (``--search auto``) answers at one N,
in how long, with how much memory, and how well certified; or how it refuses; beside the same command of
the engine this work started from (commit ``08e4a2f``), in the same run.

Each row is one process, ``tr-optimize ... --N N --format json --no-cache`` (so nothing comes from the result
cache; the numba caches are warm: a first call compiles each tree's kernels before the rows), timed as a
whole.  ``peak_rss_mb`` is the largest single process's peak resident memory (``wait4``); ``peak_tree_mb`` the
peak of the command's process and its worker processes summed (sampled from /proc every 0.5 s), the figure a
memory budget is about.  A row that exits non-zero records the exit code and the first line of its
``error:`` message instead of a result.  The baseline rows run the commit's own tree, a ``git worktree``
imported first through ``PYTHONPATH`` with its own numba cache (:mod:`benchmarks.suites.engine` does the
same); each baseline row runs right before its current row, so a load change on the machine hits both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from . import _common

TITLE = "Server scale: the default tr-optimize at one N (seconds, peak memory, certificate), beside the engine it started from"
TOPIC = "search"
COMMAND = "python benchmarks/run.py scaling"
COLUMNS = ["system", "N", "engine", "exit", "B", "tok_s", "eager_tok_s", "certificate", "gap", "err_bound",
           "states", "evaluated", "seconds", "peak_rss_mb", "peak_tree_mb", "message"]
BASELINE = "08e4a2f"
NOTES = ("R2R: --p 0.35 --L 6.0 27.9; R2R co-run: the same with --corun-slowdown 2.8 1.05 --round; ME: --weights "
         "0.5 0.3 0.2 --L 6.0 15.0 27.9.  engine: 'now' is this checkout, 'start' the commit " + BASELINE +
         " (the default path before this work: every box over its state cap built again at each level below "
         "it, rivals of B* re-solved by GTH, the search at one N on one process), run in the same session right "
         "before it.  "
         "seconds: the whole process (parse, search, output); peak_rss_mb: the largest single process's peak "
         "resident memory; peak_tree_mb: the command and its worker processes summed, sampled every 0.5 s (a peak "
         "shorter than that may be missed: below peak_rss_mb on the shortest rows; the search at one N from N = "
         "128 holds a pool of one worker per core); certificate and gap as in the JSON "
         "(exhaustive, pruned-exact or certified); err_bound: the largest proven relative throughput error over "
         "the chains of that N (a solve whose pi bound leaves the throughput above 1e-6 brackets it by its "
         "relative values, iterated, or by one LU solve where the iteration is slow; rivals of B* still loose "
         "are re-solved); message: the first "
         "warning or error line.  Each run is limited to "
         "900 s; a row that hits it says so.")

R2R = ["--p", "0.35", "--L", "6.0", "27.9"]
SYSTEMS = {"R2R": R2R, "R2R co-run": R2R + ["--corun-slowdown", "2.8", "1.05", "--round"],
           "ME": ["--weights", "0.5", "0.3", "0.2", "--L", "6.0", "15.0", "27.9"]}
# (system, N, also the baseline)
QUICK_ROWS = [("R2R", n, False) for n in (8, 16, 32, 64)] + [("R2R co-run", 16, False), ("ME", 4, False)]
FULL_ROWS = ([("R2R", n, n in (128, 256)) for n in (8, 16, 32, 64, 128, 192, 256)]
             + [("R2R co-run", n, n == 128) for n in (8, 16, 32, 64, 128, 192, 256)] + [("ME", n, False) for n in (4, 8, 10, 11)])
MAX_SECONDS = 900
MAIN = "import sys; from tr_model.cli import main; sys.exit(main())"


def _argv(args: list) -> list:
    return [sys.executable, "-P", "-c", MAIN, *args]


def _engines(with_baseline: bool) -> dict:
    base = dict(os.environ)
    base.pop("PYTHONPATH", None)
    out = {"now": base}
    if with_baseline:
        tree = _common.worktree(BASELINE, "tr-scaling-baseline")
        out["start"] = dict(base, PYTHONPATH=tree, NUMBA_CACHE_DIR=tree.rstrip(os.sep) + "-numba-cache")
    return out


def _one(system: str, N: int, engine: str, env: dict) -> dict:
    args = [*SYSTEMS[system], "--N", str(N), "--format", "json", "--no-cache", "--quiet"]
    # a folder of its own as the working directory: nothing of this checkout shadows the baseline's tree
    with tempfile.TemporaryDirectory(prefix="tr-scaling-") as cwd:
        code, out, err, seconds, peak_mb, tree_mb = _common.run_process_tree(_argv(args), MAX_SECONDS, env=env,
                                                                             cwd=cwd)
    row = {"system": system, "N": N, "engine": engine, "exit": code, "seconds": seconds, "peak_rss_mb": peak_mb,
           "peak_tree_mb": tree_mb}
    if code != 0:
        if seconds >= MAX_SECONDS:
            row["message"] = f"not finished within {MAX_SECONDS} s (killed)"
            return row
        lines = [x for x in err.splitlines() if x.startswith("error:")] or err.splitlines()[-1:]
        row["message"] = lines[0][:160] if lines else ""
        return row
    r = json.loads(out)["results"][0]
    row.update(B=r.get("B"), tok_s=r.get("throughput_tok_s"), eager_tok_s=r.get("eager_throughput_tok_s"),
               certificate=r.get("certificate"), gap=r.get("gap"), states=r.get("states"),
               evaluated=r.get("evaluated"), err_bound=r.get("max_throughput_error_bound"))
    warn = [x for x in err.splitlines() if x.startswith("warning:")]
    if warn:
        row["message"] = warn[0][:160]
    return row


def run(quick: bool) -> list[dict]:
    rows_todo = QUICK_ROWS if quick else FULL_ROWS
    engines = _engines(any(b for _, _, b in rows_todo))
    for env in engines.values():   # compile each tree's kernels (exhaustive and pruned paths) before the rows
        for n in (2, 24):
            subprocess.run(_argv([*R2R, "--N", str(n), "--no-cache", "--quiet"]), capture_output=True, env=env,
                           cwd=tempfile.gettempdir())
    rows = []
    for system, N, baseline in rows_todo:
        for engine in (("start", "now") if baseline else ("now",)):
            rows.append(_one(system, N, engine, engines[engine]))
            print(f"#   {system} N = {N} ({engine}): exit {rows[-1]['exit']}, {rows[-1]['seconds']:.1f} s",
                  file=sys.stderr, flush=True)
    return rows
