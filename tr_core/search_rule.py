"""The threshold searches' names, the ``auto`` rule and the default gap: one home for all of them.

:mod:`optimizer.search` runs the searches; the command lines (``tr-optimize``, ``tr-autotune``) and the
autotune hook take the names, the defaults and the ``--help`` text from here, so what ``--help`` says is
what :func:`resolve_auto` does (tests/test_search_rule.py checks both against each other).  This module
imports nothing heavy (no numba), so a ``--help`` stays fast.
"""

from __future__ import annotations

import math

SEARCHES = ("exhaustive", "pruned", "certified", "local", "auto")
CERTIFICATES = ("exhaustive", "pruned-exact", "certified", "local")
DEFAULT_SEARCH = "auto"
# the searches that take a gap (``max_gap``); any other search with a gap would drop it: refused
# (tr_core.search_options.SearchOptions)
GAP_SEARCHES = ("certified", "auto")
# the relative gap between B*'s throughput and the proven upper bound at which a certified search stops
DEFAULT_MAX_GAP = 0.001
# ``auto`` searches exhaustively up to this many feasible vectors (N = 20 for two models) ...
AUTO_EXHAUSTIVE_MAX = 210
# ... and, for two models, exactly with pruning up to this many (N = 128).  Above N = 64 the exact search
# costs what the certified one does at max_gap = 0.5 % (R2R: 12 / 22 / 66 s at N = 80 / 96 / 128 on one
# core, against 12 / 23 / 69 s certified; experiments/LOG.md "search", round 3); certified above
AUTO_PRUNED_MAX = 8256
AUTO_PRUNED_M = 2
# Three or more models: every chain is large from small N (ME, N = 8: 588,267 states at B*), so the exact
# pruned search pays from far fewer vectors: exhaustive up to this many (N = 6 for three models; there
# both take 8 s for ME), pruned (exact) up to AUTO_EXHAUSTIVE_MAX (N = 9: ME 48 s instead of 91 s at
# N = 8, 111 s instead of 204 s at N = 9, 2 cores), certified above
AUTO_EXHAUSTIVE_MAX_WIDE = 56
# a sweep estimated (optimizer.cost) above this many hours of one core is refused before any work (exit 3)
DEFAULT_MAX_HOURS = 24.0


def _count(N: int, M: int) -> int:
    return math.comb(N - 1 + M, M)


def largest_n(limit: int, M: int) -> int:
    """The largest N whose feasible set (C(N - 1 + M, M) vectors) has at most ``limit`` vectors."""
    n = 0
    while _count(n + 1, M) <= limit:
        n += 1
    return n


def auto_limits(M: int) -> tuple[int, int]:
    """The largest feasible-set sizes ``auto`` searches exhaustively and with exact pruning, for M models."""
    if M <= AUTO_PRUNED_M:
        return AUTO_EXHAUSTIVE_MAX, AUTO_PRUNED_MAX
    return AUTO_EXHAUSTIVE_MAX_WIDE, AUTO_EXHAUSTIVE_MAX


def auto_n_limits(M: int) -> tuple[int, int]:
    """:func:`auto_limits` as concurrencies: the largest N searched exhaustively and the largest pruned."""
    ex, pr = auto_limits(M)
    return largest_n(ex, M), largest_n(pr, M)


def resolve_auto(M: int, total: int, *, time_budget_s: float | None = None) -> str:
    """The search ``auto`` runs for ``total`` candidate vectors of an M-model system.

    Exhaustive while the set is small; pruned (exact) up to the second limit of :func:`auto_limits`;
    certified otherwise or whenever a time budget is given (co-running latencies included: the bounds
    apply the launch law, docs/model.md).
    """
    ex, pr = auto_limits(M)
    if time_budget_s is None and total <= ex:
        return "exhaustive"
    if time_budget_s is None and total <= pr:
        return "pruned"
    return "certified"


def auto_rule_text() -> str:
    """``auto`` in words, from the constants above (for ``--help`` and the docs)."""
    n_ex, n_pr = auto_n_limits(2)
    w_ex, w_pr = auto_n_limits(3)
    return (f"two models: exhaustive up to {AUTO_EXHAUSTIVE_MAX:,} feasible vectors (N <= {n_ex}), pruned "
            f"(exact) up to {AUTO_PRUNED_MAX:,} (N <= {n_pr}); three or more: exhaustive up to "
            f"{AUTO_EXHAUSTIVE_MAX_WIDE:,} (three models: to N = {w_ex}), pruned up to {AUTO_EXHAUSTIVE_MAX:,} "
            f"(to N = {w_pr}); certified within --max-gap above or with a time budget")


def search_help(default: str = DEFAULT_SEARCH) -> str:
    """The ``--search`` help text; every mode named in :data:`SEARCHES`."""
    parts = {
        "exhaustive": "every feasible B (the definition of B*)",
        "pruned": "the same B*, skipping vectors a proven bound shows worse",
        "certified": "stop within --max-gap of the proven upper bound",
        "local": "steepest ascent over +-1 neighbours from the previous N's B* (a heuristic, with a proven gap)",
        "auto": auto_rule_text(),
    }
    assert set(parts) == set(SEARCHES)
    return "; ".join(f"{k}: {parts[k]}" + (" (default)" if k == default else "") for k in SEARCHES)
