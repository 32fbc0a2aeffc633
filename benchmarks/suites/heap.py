"""The command lines' heap kept between chain solves (tr_core.heap) against glibc's defaults, side by side.

Each command runs as the console script does (``main()`` with no arguments), once with the heap kept (the
default) and once with ``TR_MODEL_KEEP_HEAP=0`` (glibc's defaults: every large block mapped afresh and handed
back when freed), in turn, ``REPEATS`` times; the medians are reported."""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile

from . import _common

TITLE = "Heap: the command lines keep freed memory for the next solve, against glibc's defaults (seconds, system time, peak)"
TOPIC = "chain speed"
COMMAND = "python benchmarks/run.py heap"
COLUMNS = ["command", "B", "tok_s", "default_s", "kept_s", "default_sys_s", "kept_sys_s", "default_peak_mb",
           "kept_peak_mb", "default_over_kept"]
NOTES = ("default_*: glibc's defaults (TR_MODEL_KEEP_HEAP=0); kept_*: the heap kept, as the commands run now.  "
         "*_s: the whole command's wall seconds; *_sys_s: system (kernel) seconds of the command and its workers "
         "(mostly first touches of freshly mapped pages); *_peak_mb: the largest single process's peak resident "
         "memory; medians of the runs, the two settings in turn; default_over_kept = default_s / kept_s.  B and "
         "tok_s: the answer, the same in both (checked).")

R2R = ["--p", "0.35", "--L", "6.0", "27.9"]
ME = ["--weights", "0.5", "0.3", "0.2", "--L", "6.0", "15.0", "27.9"]
FULL = [("R2R N=192", R2R + ["--N", "192"]), ("ME N=8", ME + ["--N", "8"]), ("ME N=10", ME + ["--N", "10"])]
QUICK = [("R2R N=64", R2R + ["--N", "64"]), ("ME N=6", ME + ["--N", "6"])]
REPEATS = 2
MAX_SECONDS = 900
MAIN = "import sys; from tr_model.cli import main; sys.exit(main())"


def _once(args: list, keep: bool) -> tuple[float, float, float, tuple]:
    env = dict(os.environ)
    env.pop("TR_MODEL_KEEP_HEAP", None)
    if not keep:
        env["TR_MODEL_KEEP_HEAP"] = "0"
    argv = [sys.executable, "-P", "-c", MAIN, *args, "--format", "json", "--no-cache", "--quiet"]
    with tempfile.TemporaryDirectory(prefix="tr-heap-") as cwd:
        code, out, err, seconds, usage = _common.run_process_usage(argv, MAX_SECONDS, env=env, cwd=cwd)
    if code != 0:
        raise RuntimeError(f"{' '.join(args)} exited {code}: {err.strip().splitlines()[-1:]}")
    r = json.loads(out)["results"][0]
    return seconds, usage.ru_stime, usage.ru_maxrss / 1024.0, (tuple(r["B"]), round(r["throughput_tok_s"], 6))


def run(quick: bool) -> list[dict]:
    for args in (R2R + ["--N", "2"], R2R + ["--N", "24"], ME + ["--N", "4"]):
        _once(args, True)      # every kernel compiled (or loaded from numba's cache) before the timed runs
    rows = []
    for label, args in (QUICK if quick else FULL):
        got = {True: [], False: []}
        for _ in range(1 if quick else REPEATS):
            for keep in (False, True):
                got[keep].append(_once(args, keep))
        answers = {a for runs in got.values() for *_, a in runs}
        if len(answers) != 1:
            raise RuntimeError(f"{label}: the two settings gave different answers {sorted(answers)}")
        (B, tok), = answers

        def med(keep, i):
            return statistics.median(x[i] for x in got[keep])
        rows.append({"command": label, "B": str(B), "tok_s": tok, "default_s": med(False, 0), "kept_s": med(True, 0),
                     "default_sys_s": med(False, 1), "kept_sys_s": med(True, 1), "default_peak_mb": med(False, 2),
                     "kept_peak_mb": med(True, 2), "default_over_kept": med(False, 0) / med(True, 0)})
        print(f"#   {label}: {rows[-1]['default_s']:.1f} s -> {rows[-1]['kept_s']:.1f} s", file=sys.stderr, flush=True)
    return rows
