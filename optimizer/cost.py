r"""How long a threshold sweep will take, estimated before any work, and the refusal of one that is too long.

The number of chains an exhaustive search solves is known in closed form (:mod:`tr_core.feasibility`), but
what a chain costs grows with N, and the bounded searches (pruned, certified, local) do not know their
count up front.  Every N the exact chain can represent is accepted by :func:`optimizer.evaluate.check_representable`
(2,047 for R2R at delta = 0.1 ms), so ``--search certified --N 1-2047`` would run for weeks without a word.
This module puts a number on a sweep from the growth measured on two cores
(experiments/LOG.md, "Round 3"), one core's seconds per N:

``exhaustive``
    the sum of chain seconds over every feasible vector: 99 s at N = 40, growing as N^5
    (2.4 / 12.7 / 31.9 / 99.0 s at N = 20 / 28 / 32 / 40);
``pruned``, ``certified``
    20 s at N = 128, growing as N^3.5: the default sweep (two workers, each N's box pass after its previous
    N's, the box kernels on borrowed arrays) measured 575 core-seconds for N = 1-128 (estimated 588) and 28 an
    N at N = 145-160 (estimated 37); one N alone 42-45 core-seconds at N = 160 in one process (estimated 44)
    and 147-167 s of two workers at N = 256 (estimated 226 core-seconds; benchmarks/RESULTS.md, "Box processes
    on borrowed arrays"); below N = 80 the model is under the measured times;
``local``
    a tenth of ``certified`` (a heuristic: a few chains near the previous B* per N, with the same growth);
``auto``
    exhaustive, pruned or certified per N, by :func:`tr_core.search_rule.resolve_auto`.

These are rates of one system (R2R, latencies 6.0 / 27.9 ms); chains of other latency ratios are larger
or smaller, so the figure is an *estimate*, rounded, and the refusal limit (:data:`DEFAULT_MAX_HOURS`, a
day of one core) is far from the sweeps people run: the default ``--N 1-64`` is estimated at about
a minute, ``--N 1-256`` at about 3.6 hours (accepted), ``--N 1-400`` at about 27 hours and ``--N 1-2047`` at
about 5 years (refused).  Every estimate is an underestimate at small N, so nothing affordable is refused.
"""

from __future__ import annotations

import math
from typing import Sequence

from tr_core import search_rule as S
from tr_core.errors import WorkTooLarge

__all__ = ["DEFAULT_MAX_HOURS", "sweep_seconds", "check_sweep_seconds", "describe_seconds"]

# refuse a sweep estimated above this many hours of one core (the one-day limit of a measurement too)
DEFAULT_MAX_HOURS = S.DEFAULT_MAX_HOURS

# one core's seconds for one N: ref_s * (N / ref_n) ** power (exhaustive: experiments/LOG.md, "Round 3"; bounded:
# the module docstring)
_EXHAUSTIVE = (99.0, 40, 5.0)
_BOUNDED = (20.0, 128, 3.5)
_LOCAL_SHARE = 0.1


def _span_sum(a: int, b: int, model) -> float:
    """sum_{N=a}^{b} ref_s * (N / ref_n) ** power, by the integral over [a - 1/2, b + 1/2] (the summand is
    convex, so the integral is at least the sum less its second-order terms: an estimate, never a loop)."""
    ref_s, ref_n, power = model
    lo, hi = max(a - 0.5, 0.0), b + 0.5
    return ref_s * (hi ** (power + 1) - lo ** (power + 1)) / ((power + 1) * ref_n ** power)


def sweep_seconds(M: int, spans: Sequence[tuple[int, int]], search: str) -> float:
    """Estimated one-core seconds of an exact sweep over ``spans`` (inclusive ranges of N) with ``search``.

    ``M`` models: the measured rates are those of two; more models have more states per chain, so for
    M > 2 this is a lower estimate.  ``search`` is one of :data:`tr_core.search_rule.SEARCHES`.
    """
    if search not in S.SEARCHES:
        raise ValueError(f"unknown search {search!r}")
    total = 0.0
    for a, b in spans:
        a, b = int(a), int(b)
        if a > b:
            continue
        if search == "exhaustive":
            total += _span_sum(a, b, _EXHAUSTIVE)
        elif search in ("pruned", "certified"):
            total += _span_sum(a, b, _BOUNDED)
        elif search == "local":
            total += _LOCAL_SHARE * _span_sum(a, b, _BOUNDED)
        else:  # auto: exhaustive while the feasible set is small, bounded above
            n_ex = S.auto_n_limits(M)[0]
            if a <= n_ex:
                total += _span_sum(a, min(b, n_ex), _EXHAUSTIVE)
            if b > n_ex:
                total += _span_sum(max(a, n_ex + 1), b, _BOUNDED)
    return total


def describe_seconds(seconds: float) -> str:
    """A rounded duration in the unit a person reads it in (``about 3.2 hours``)."""
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= 2 * size:
            return f"about {seconds / size:,.{0 if seconds >= 100 * size else 1}f} {unit}"
    return f"about {seconds:,.0f} seconds"


def check_sweep_seconds(M: int, spans: Sequence[tuple[int, int]], search: str, max_hours: float | None, *,
                        what: str, limit_name: str, advice: str) -> float:
    """The estimate of :func:`sweep_seconds`; :class:`WorkTooLarge` (exit code 3) when it is above
    ``max_hours`` hours (``None``: no limit).  The message: ``what`` (the work, named as the caller's user
    typed it), the estimate, the limit (``limit_name``) and ``advice`` (what to do instead)."""
    est = sweep_seconds(M, spans, search)
    if max_hours is not None and est > max_hours * 3600.0:
        raise WorkTooLarge(f"{what} ({search} search) is estimated at {describe_seconds(est)} of one core at the "
                           f"rates measured for two models, more than {limit_name} = {max_hours:g}; {advice}")
    return est
