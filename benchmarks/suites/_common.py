"""Helpers the suites share (loaded as a sibling module: ``from . import _common``)."""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import threading
import time


def median_s(fn, repeats: int):
    """The median wall seconds of ``repeats`` calls of ``fn()`` and the last call's result."""
    ts, out = [], None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), out


def interleaved(fns: dict, repeats: int) -> dict:
    """Median seconds of each function, run in turn ``repeats`` times (a load change hits them alike)."""
    ts = {k: [] for k in fns}
    for _ in range(max(1, repeats)):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            ts[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in ts.items()}


def run_process(argv: list, timeout_s: float):
    """Run ``argv`` to its end: ``(exit code, stdout, stderr, wall seconds, peak RSS in MB)``.  The peak is this
    child's own (``wait4``), not the high-water mark of every child so far; past ``timeout_s`` it is killed
    (exit code -9)."""
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=fo, stderr=fe, text=True)
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - t0
        fo.seek(0)
        fe.seek(0)
        return proc.returncode, fo.read(), fe.read(), seconds, usage.ru_maxrss / 1024.0
