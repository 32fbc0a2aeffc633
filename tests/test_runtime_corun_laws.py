"""The emulated executor's two co-running laws, step by step on the virtual clock.

Launch law (``corun_latency_ms``): every step's duration is the one the compiled law gives
(``dtmc._kernels._launch_mask``, the chain's launch pass), over launch passes of every subset of two and three
models, with the second pass at, before and after the first pass's step ends (a step ending at a pass's
instant is over; models launching in the same pass run co-located), in both orders of the launches within an
instant.  Rate-sharing law (``corun_slowdown``): a hand-computed overlap.
"""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

from dtmc._kernels import _launch_mask
from tr_model.serving.runtime import EmulatedExecutor
from tr_model.serving.runtime.core import run_in_new_loop
from tr_model.serving.runtime.executors import rate_sharing_slowdown

N = 4


def _tables(M):
    """Durations in ms (= quanta of 1 ms), all distinct: solo d[j, b] = 10 (j + 1) + b, co-running
    dco[j, b] = 100 (j + 1) + 7 b."""
    b = np.arange(N + 1)
    d = np.array([10 * (j + 1) + b for j in range(M)], dtype=np.int64)
    dco = np.array([100 * (j + 1) + 7 * b for j in range(M)], dtype=np.int64)
    return d, dco


def _compiled(M, passes):
    """Each launch's duration (ms) under the compiled law: one launch pass per (instant, models), the residuals
    advanced between passes (a residual reaching 0 at an instant is a completion of that instant)."""
    d, dco = _tables(M)
    caps = np.full(M, N, dtype=np.int64)
    r = np.zeros(M, dtype=np.int64)
    now, out = 0, []
    for t, models in passes:
        r = np.maximum(r - (t - now), 0)
        now = t
        assert all(r[j] == 0 for j in models), "a pass may only launch idle models"
        k = np.zeros(M, dtype=np.int64)
        mask = 0
        for j in models:
            k[j] = j + 1                  # model j launches a batch of j + 1
            mask |= 1 << j
        b = np.zeros(M, dtype=np.int64)
        _launch_mask(k, b, r, np.int64(mask), caps, d, dco, True, M)
        out += [(t, j, float(r[j])) for j in models]
    return sorted(out)


def _executor(M, passes, order):
    """Each launch's duration (ms) measured on the executor (virtual clock)."""
    d, dco = _tables(M)
    ex = EmulatedExecutor(lambda i, b: float(d[i, b]), corun_latency_ms=lambda i, b: float(dco[i, b]))
    out = []

    async def launch(t, j):
        loop = asyncio.get_running_loop()
        await asyncio.sleep(t / 1000.0 - loop.time())
        start = loop.time()
        await ex.step(j, [None] * (j + 1))
        out.append((t, j, (loop.time() - start) * 1000.0))

    async def main():
        await asyncio.gather(*(launch(t, j) for t, models in passes for j in order(models)))

    run_in_new_loop(main(), clock="virtual")
    return sorted(out)


def _cases():
    for M in (2, 3):
        for first in itertools.chain.from_iterable(itertools.combinations(range(M), n) for n in range(1, M + 1)):
            d, dco = _tables(M)
            ends = _compiled(M, [(0, first)])
            # the second pass: before, at and after each end of the first pass's steps
            for T in sorted({int(e) + s for _, _, e in ends for s in (-3, 0, 1)}):
                r = {j: e for _, j, e in ends}
                idle = [j for j in range(M) if r.get(j, 0) <= T]
                for n in range(1, len(idle) + 1):
                    for second in itertools.combinations(idle, n):
                        yield M, [(0, first), (T, second)]


CASES = list(_cases())


def test_the_cases_cover_the_law():
    """Solo launches, launches beside a running step, a pass of several models, and a pass at the instant a
    step ends (idle then) all occur, with both answers of the rule."""
    kinds = set()
    for M, passes in CASES:
        d, dco = _tables(M)
        for t, j, ms in _compiled(M, passes):
            kinds.add("co" if ms in set(dco[j].tolist()) else "solo")
        (_, first), (T, second) = passes
        ends = {j: e for _, j, e in _compiled(M, passes[:1])}
        if any(ends[j] == T for j in first):
            kinds.add("pass at an end")
        if len(second) > 1:
            kinds.add("several launch")
    assert kinds == {"co", "solo", "pass at an end", "several launch"} and len(CASES) > 100


@pytest.mark.parametrize("order", [lambda ms: ms, lambda ms: tuple(reversed(ms))], ids=["in order", "reversed"])
def test_launch_law_durations_are_the_compiled_laws(order):
    bad = []
    for M, passes in CASES:
        want, got = _compiled(M, passes), _executor(M, passes, order)
        if [(t, j) for t, j, _ in want] != [(t, j) for t, j, _ in got] or any(
                abs(a[2] - b[2]) > 1e-6 for a, b in zip(want, got)):
            bad.append((M, passes, want, got))
    assert not bad, f"{len(bad)} of {len(CASES)} cases differ, e.g. {bad[0]}"


def test_rate_sharing_law_by_hand():
    """R2R-like steps of 6 and 27.9 ms launched together, f = [[1, 2], [1.2, 1]]: model 0 runs at half speed and
    ends at 12 ms; model 1 ran at rate 1 / 1.2 meanwhile (10 ms of its work), then alone: ends at 29.9 ms."""
    f = [[1.0, 2.0], [1.2, 1.0]]
    assert rate_sharing_slowdown(f, 0, {0, 1}) == 2.0 and rate_sharing_slowdown(f, 1, [0, 1]) == 1.2
    assert rate_sharing_slowdown(f, 1, [1]) == 1.0
    ex = EmulatedExecutor(lambda i, b: (6.0, 27.9)[i], corun_slowdown=f)
    ends = {}

    async def one(j):
        await ex.step(j, [None])
        ends[j] = asyncio.get_running_loop().time() * 1000.0

    async def main():
        await asyncio.gather(one(0), one(1))

    run_in_new_loop(main(), clock="virtual")
    assert ends[0] == pytest.approx(12.0, abs=1e-6) and ends[1] == pytest.approx(29.9, abs=1e-6)
