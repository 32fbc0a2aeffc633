r"""The feasibility rule of delayed-batching thresholds, and the feasible set.

A threshold vector ``B`` for ``M`` models at concurrency ``N`` is feasible when

* it has exactly ``M`` entries,
* every ``B_i`` is an integer ``>= 1``,
* :math:`\sum_i (B_i - 1) < N`.

Why the sum: if every model is idle, all N requests wait somewhere; if moreover
no model can launch, queue i holds at most ``B_i - 1`` requests, so
``N <= sum_i (B_i - 1)``.  The rule excludes exactly that, so no feasible vector
can stall (and the bound is tight: any vector violating it admits a stalled
placement of the N requests).

Counting.  With ``x_i = B_i - 1 >= 0`` the feasible set is
:math:`\{x \in \mathbb{Z}_{\ge 0}^M : \sum_i x_i \le N - 1\}`, whose size is the
number of weak compositions of ``N - 1`` into ``M + 1`` parts (one slack part):

.. math::  |F(N, M)| = \binom{N - 1 + M}{M}.

:func:`iter_feasible` walks that set directly in lexicographic order of ``B``
(never the ``N^M`` box), and :func:`check_count` refuses a set larger than a
limit *before* any vector is produced: the count is a closed form.

This module is part of the foundation: it imports only :mod:`tr_core.errors`.
(``dtmc/chain.py`` keeps its own copy of the arithmetic so that ``dtmc`` stays a
leaf; the vendorable ``tr_model/thresholds.py`` keeps its own on purpose.)
"""

from __future__ import annotations

import math
import numbers
from typing import Iterator, Sequence

from tr_core.errors import SpecError, StateSpaceTooLarge

__all__ = ["check_n", "check_thresholds", "is_feasible", "count_feasible", "iter_feasible",
           "count_feasible_with", "check_count", "TooManyEvaluations", "DEFAULT_MAX_EVALUATIONS"]

# Default refusal limit for a threshold search: about a day of chain solves at N = 64.
DEFAULT_MAX_EVALUATIONS = 1_000_000


class TooManyEvaluations(StateSpaceTooLarge):
    """A search would evaluate more threshold vectors than allowed (exit code 3)."""

    def __init__(self, message: str, count: int, limit: int):
        super().__init__(message)
        self.count = int(count)
        self.limit = int(limit)


def _as_int(x, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise SpecError(f"{what} must be an integer, got {x!r}")
    if isinstance(x, numbers.Integral):
        return int(x)
    xf = float(x)
    if not math.isfinite(xf) or xf != int(xf):
        raise SpecError(f"{what} must be an integer, got {x!r}")
    return int(xf)


def check_n(N, name: str = "N") -> int:
    """``N`` as an ``int``; it must be an integer >= 1."""
    n = _as_int(N, name)
    if n < 1:
        raise SpecError(f"{name} must be an integer >= 1, got {N!r}")
    return n


def check_thresholds(B, N, M, name: str = "B") -> tuple[int, ...]:
    """Validate a threshold vector; return it as a tuple of ints.

    Raises :class:`SpecError` naming the field (``name``, ``name[i]``) for a
    wrong length, a non-integer or ``< 1`` entry, or an infeasible sum.
    """
    N = check_n(N)
    M = _as_int(M, "M")
    if isinstance(B, (str, bytes)):
        raise SpecError(f"{name} must be a list of {M} integers, got {B!r}")
    try:
        items = list(B)
    except TypeError:
        raise SpecError(f"{name} must be a list of {M} integers, got {B!r}") from None
    if len(items) != M:
        raise SpecError(f"{name} has {len(items)} entries but the system has M = {M} models")
    out = []
    for i, b in enumerate(items):
        bi = _as_int(b, f"{name}[{i}]")
        if bi < 1:
            raise SpecError(f"{name}[{i}] must be an integer >= 1 (every threshold B_i >= 1), got {b!r}")
        out.append(bi)
    Bt = tuple(out)
    s = sum(b - 1 for b in Bt)
    if s >= N:
        raise SpecError(f"{name} = {Bt} is infeasible for N = {N}: sum(B_i - 1) = {s} must be < N "
                        f"(otherwise the system can deadlock)")
    return Bt


def is_feasible(B: Sequence[int], N: int) -> bool:
    """True when every ``B_i >= 1`` and ``sum(B_i - 1) < N`` (no type checks; for loops)."""
    return all(b >= 1 for b in B) and sum(b - 1 for b in B) < N


def count_feasible(N: int, M: int) -> int:
    """Number of feasible vectors, ``binom(N - 1 + M, M)`` (0 when ``N < 1``)."""
    N, M = int(N), int(M)
    if N < 1 or M < 0:
        return 0
    return math.comb(N - 1 + M, M)


def count_feasible_with(N: int, M: int, prefix: Sequence[int]) -> int:
    """Number of feasible vectors starting with ``prefix``: ``binom(left + r, r)``.

    ``left = N - 1 - sum(prefix_i - 1)`` is the slack still free and ``r`` the
    number of free coordinates (weak compositions of ``<= left`` into ``r`` parts).
    """
    left = int(N) - 1 - sum(int(b) - 1 for b in prefix)
    r = int(M) - len(prefix)
    if left < 0 or r < 0 or any(int(b) < 1 for b in prefix):
        return 0
    return math.comb(left + r, r)


def iter_feasible(N: int, M: int, *, max_count: int | None = None) -> Iterator[tuple[int, ...]]:
    """Every feasible ``B`` in lexicographic order, generated directly.

    Memory is O(M); work is O(M) per vector.  With ``max_count`` the count is
    checked first (closed form) and :class:`TooManyEvaluations` raised before
    anything is produced.
    """
    N, M = check_n(N), int(M)
    if M < 1:
        raise SpecError(f"M must be >= 1, got {M}")
    if max_count is not None:
        check_count(count_feasible(N, M), max_count, N=N, M=M)
    return _walk(N, M)


def _walk(N: int, M: int) -> Iterator[tuple[int, ...]]:
    x = [0] * M            # x_i = B_i - 1
    total = 0              # sum(x); invariant total <= N - 1
    cap = N - 1
    while True:
        yield tuple(v + 1 for v in x)
        # odometer step in lexicographic order: bump the last coordinate if the slack allows,
        # otherwise zero it and carry into the one before
        i = M - 1
        while i >= 0:
            if total < cap:
                x[i] += 1
                total += 1
                break
            total -= x[i]
            x[i] = 0
            i -= 1
        if i < 0:
            return


def check_count(count: int, limit: int | None, *, N: int | None = None, M: int | None = None,
                what: str = "threshold vectors") -> int:
    """Raise :class:`TooManyEvaluations` when ``count > limit`` (``limit=None``: no limit)."""
    if limit is not None and count > limit:
        where = f" at N = {N}" if N is not None else ""
        models = f" for M = {M} models" if M is not None else ""
        raise TooManyEvaluations(
            f"the search would evaluate {count:,} {what}{models}{where}, more than --max-evaluations = "
            f"{limit:,}; lower N, fix some thresholds with --B, use --search auto or local, "
            f"or raise --max-evaluations", count, limit)
    return count
