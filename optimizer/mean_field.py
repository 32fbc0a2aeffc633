r"""Mean-field guide: the delayed-batching dynamics with every routing split replaced by its mean.

**The model** (derived in ``docs/model.md``, "Mean-field guide").  Keep the
chain's clock, launch rule and batch durations, but let the ``b`` requests a
batch of model ``i`` releases split *deterministically*: ``b P[i][j]``
requests (a real number) join queue ``j``.  The state is then one point
``(q_j, x_j, end_j)`` (queue mass, running batch mass, end time in quanta)
that moves deterministically; an idle model launches when its queue holds more
than ``B_j - 1`` requests (the chain's ``k_j >= B_j`` for integer ``k``) and
takes ``min(q_j, cap_j)``.  Its long-run throughput is the time average of
``sum_i x_i cbar_i`` over completions, ``cbar_i = sum_j C[i][j] P[i][j]``.

With constant latencies it is scale-free: ``q, x`` and ``B - 1`` all scale
with ``N``, so the per-request throughput of ``B - 1 = beta N`` does not
depend on ``N``.  Over a fixed number of epochs the chain follows it ever more
closely as N grows, but its long-run average need not: the deterministic orbit
locks the models' phases, which any noise keeps moving.  It is **not a bound**
and not exact at any finite ``N`` with random routing (exact when routing is
deterministic): on the R2R preset it is 0.3-1.2 % above the chain at N =
16-256 and 2.9 % below B* at N = 8 (``experiments/LOG.md``, "Mean-field
guide").  It costs a fraction of a millisecond per vector at any ``N``, and
the exact chain at its best vector is within 0-1.8 % of B*: it is the start of
the threshold searches (it orders their work and never prunes).

Co-running latencies (``corun_latency``): the launch pass applies the chain's launch law (a launch
gets ``dco`` when another model is busy or launches in the same pass), so the guide's effective step
latency is ``L`` or ``Lco`` exactly where the chain's is.

Accuracy reported with every value: ``drift``, the relative difference
between the averages over the whole window and over its second half (the
dynamics settle on a periodic or quasi-periodic orbit; the time average
converges like ``1 / window``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tr_core import feasibility as F
from tr_core.errors import SpecError
from tr_core.spec import SystemSpec

WARM_EVENTS = 2_000
EVENTS = 20_000
# the search ranks many vectors: a shorter window is enough to order them
SEARCH_WARM_EVENTS = 500
SEARCH_EVENTS = 4_000


@dataclass(frozen=True)
class MeanField:
    """The mean-field throughput of one (spec, N, B); from :func:`mean_field_thresholds`, the best vector
    at N (a guide for the exact search, not B*), with how many vectors it ranked and its time."""

    N: int
    B: tuple[int, ...]
    throughput_tok_s: float
    per_request_tok_s: float
    drift: float          # relative difference of the whole-window and second-half averages
    events: int
    evaluated: int = 1
    seconds: float = 0.0


def _arrays(spec: SystemSpec, N: int, round_to_grid: bool):
    # co-running: the chain's launch law (dco when another model is busy or launches in the same pass)
    from optimizer.bounds import lowered

    return lowered(spec, N, round_to_grid)


def _run(spec, N, B, low, warm: int, events: int) -> tuple[float, float]:
    from optimizer import _kernels as K

    st, tok, quanta, tok2, quanta2 = K.mean_field_run(int(N), np.asarray(B, dtype=np.int64), low.launch_tables, low.P,
                                                      int(warm), int(events), 1e-9 * max(1, int(N)))
    if st != 0 or quanta <= 0:
        return -math.inf, math.inf
    scale = 1000.0 / spec.delta_ms
    v = tok / quanta * scale
    v2 = tok2 / quanta2 * scale if quanta2 > 0 else v
    drift = abs(v - v2) / v if v > 0 else 0.0
    return v, drift


def mean_field_throughput(spec: SystemSpec, N: int, B: Sequence[int], *, round_to_grid: bool = False,
                          events: int = EVENTS) -> MeanField:
    """The mean-field throughput (tokens/s) of thresholds ``B`` at concurrency ``N`` (see the module docstring)."""
    N = F.check_n(N)
    B = F.check_thresholds(B, N, spec.M)
    if int(events) < 100:
        raise SpecError(f"events must be at least 100, got {events!r}")
    v, drift = _run(spec, N, B, _arrays(spec, N, round_to_grid), WARM_EVENTS, int(events))
    if not math.isfinite(v):
        raise SpecError(f"the mean-field dynamics of B = {B} at N = {N} stop (no model can launch)")
    return MeanField(N, B, v, v / N, drift, int(events))


def _scaled_start(B, n0: int, N: int) -> tuple[int, ...]:
    """``1 + round((B - 1) N / n0)``, pulled back into the feasible set at N."""
    out = [1 + int(round((b - 1) * N / n0)) for b in B]
    while sum(b - 1 for b in out) > N - 1:
        j = max(range(len(out)), key=lambda i: out[i])
        out[j] -= 1
    return tuple(out)


def mean_field_thresholds(spec: SystemSpec, N: int, *, round_to_grid: bool = False,
                          max_scan: int = 600) -> MeanField:
    """The thresholds with the best mean-field throughput at ``N`` (a fast guide, not B*).

    Every feasible vector is ranked when there are at most ``max_scan`` of
    them; otherwise the best vector of the largest system that can be ranked
    whole is scaled to N and polished by a pattern search.
    """
    import time

    t0 = time.perf_counter()
    N = F.check_n(N)
    M = spec.M
    arrays = _arrays(spec, N, round_to_grid)
    seen: dict[tuple[int, ...], float] = {}

    def value(B: tuple[int, ...]) -> float:
        v = seen.get(B)
        if v is None:
            v = seen[B] = _run(spec, N, B, arrays, SEARCH_WARM_EVENTS, SEARCH_EVENTS)[0]
        return v

    if F.count_feasible(N, M) <= max_scan:
        for B in F.iter_feasible(N, M):
            value(tuple(B))
    else:
        # The mean-field model is scale-free (constant latencies, no caps): the best ``(B - 1) / N`` of
        # a smaller system that can be ranked whole is the best here up to rounding, so scale it up and
        # polish it with a pattern search (steps of N / n0 halving to 1).  The landscape has small
        # bumps (quasi-periodic orbits), which a climb from afar would stop on.
        n0 = N
        while n0 > 1 and F.count_feasible(n0, M) > max_scan:
            n0 -= 1
        small = mean_field_thresholds(spec, n0, round_to_grid=round_to_grid, max_scan=max_scan)
        cur = _scaled_start(small.B, n0, N)
        value(cur)
        step = max(1, -(-N // n0))
        while True:
            best = cur
            for i in range(M):
                for s in (-step, step):
                    b = list(cur)
                    b[i] += s
                    b = tuple(b)
                    if F.is_feasible(b, N) and value(b) > value(best):
                        best = b
            if best != cur:
                cur = best
            elif step > 1:
                step //= 2
            else:
                break
    # ties (exact in the scale-free model) go to the lexicographically smallest vector, as for B*
    top = max(seen.values())
    B = min(b for b, v in seen.items() if v >= top * (1.0 - 1e-12))
    v, drift = _run(spec, N, B, arrays, WARM_EVENTS, EVENTS)
    return MeanField(N, B, v, v / N, drift, EVENTS, len(seen), time.perf_counter() - t0)
