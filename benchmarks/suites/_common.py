"""Helpers the suites share (loaded as a sibling module: ``from . import _common``)."""

from __future__ import annotations

import statistics
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
