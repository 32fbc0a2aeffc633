"""The default command at server-scale concurrency: what ``tr-optimize`` (``--search auto``) answers at one N,
in how long, with how much memory, and how well certified; or how it refuses.

Each row is one process, ``tr-optimize ... --N N --format json --no-cache`` (so nothing comes from the result
cache; the numba cache is warm: a first call compiles the kernels before the rows), timed as a whole, its peak
resident memory read from the kernel (``wait4``'s ``ru_maxrss``).  A row that exits non-zero records the exit
code and the first line of its ``error:`` message instead of a result, so the table shows where the default
path stops today: the baseline the server-scale search is measured against."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from . import _common

TITLE = "Server scale: the default tr-optimize at one N (seconds, peak memory, certificate), or its refusal"
TOPIC = "search"
COMMAND = "python benchmarks/run.py scaling"
COLUMNS = ["system", "N", "exit", "B", "tok_s", "eager_tok_s", "certificate", "gap", "err_bound", "states",
           "evaluated", "seconds", "peak_rss_mb", "message"]
NOTES = ("R2R: --p 0.35 --L 6.0 27.9; R2R co-run: the same with --corun-slowdown 2.8 1.05 --round; ME: --weights "
         "0.5 0.3 0.2 --L 6.0 15.0 27.9.  seconds: the whole process (parse, search, output); peak_rss_mb: its "
         "peak resident memory; certificate and gap as in the JSON (exhaustive, pruned-exact or certified); "
         "err_bound: the largest proven relative throughput error over the chains of that N; message: the first "
         "line of stderr when the command did not answer (exit 3: refused for size).  Each run is limited to "
         "300 s; a row that hits it says so.")

R2R = ["--p", "0.35", "--L", "6.0", "27.9"]
SYSTEMS = {"R2R": R2R, "R2R co-run": R2R + ["--corun-slowdown", "2.8", "1.05", "--round"],
           "ME": ["--weights", "0.5", "0.3", "0.2", "--L", "6.0", "15.0", "27.9"]}
QUICK_ROWS = [("R2R", n) for n in (8, 16, 32, 64)] + [("R2R co-run", 16), ("ME", 4)]
FULL_ROWS = ([("R2R", n) for n in (8, 16, 32, 64, 128, 256)] + [("R2R co-run", n) for n in (8, 16, 32, 64)]
             + [("ME", n) for n in (4, 8)])
MAX_SECONDS = 300


def _tool() -> str:
    exe = os.path.join(os.path.dirname(sys.executable), "tr-optimize")
    return exe if os.path.exists(exe) else "tr-optimize"


def _one(system: str, N: int) -> dict:
    argv = [_tool(), *SYSTEMS[system], "--N", str(N), "--format", "json", "--no-cache", "--quiet"]
    code, out, err, seconds, peak_mb = _common.run_process(argv, MAX_SECONDS)
    row = {"system": system, "N": N, "exit": code, "seconds": seconds, "peak_rss_mb": peak_mb}
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
    for n in (2, 24):   # compile the exhaustive and the pruned paths' kernels before the timed rows
        subprocess.run([_tool(), *R2R, "--N", str(n), "--no-cache", "--quiet"], capture_output=True)
    rows = []
    for system, N in (QUICK_ROWS if quick else FULL_ROWS):
        rows.append(_one(system, N))
        print(f"#   {system} N = {N}: exit {rows[-1]['exit']}, {rows[-1]['seconds']:.1f} s", file=sys.stderr,
              flush=True)
    return rows
