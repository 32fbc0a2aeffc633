"""Pruned (exact) and certified threshold search: evaluate in a good order, skip what is proven worse.

The loop keeps the best throughput found so far, ``best``.  A vector ``B`` is
skipped (pruned) only when a proven upper bound ``U(B) >= T(B)``
(:class:`optimizer.bounds.Bounder`) satisfies

* exact mode: ``U(B) < best * (1 - TIE_RTOL)``: then ``T(B)`` is below the
  tie band of the final optimum, so neither B* nor the tie rule can change;
* certified mode (``max_gap > 0``): ``U(B) <= best / (1 - max_gap)``: then
  whatever ``T(B)`` is, the final relative gap stays within ``max_gap``.

The order only decides how early a strong ``best`` is found (nearest to a
start vector first, e.g. B*(N-1)); it never decides what is skipped.  When a
time budget or an evaluation limit stops the loop, every vector not reached
keeps its own bound, and the reported ``upper_bound_tok_s`` is the largest
bound over all vectors not evaluated (and at least the best throughput), so
the certificate covers the whole feasible set.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Sequence

import numpy as np

from optimizer.bounds import Bound, Bounder, gap as rel_gap
from optimizer.evaluate import Evaluation
from optimizer.optimum import TIE_RTOL, _optimum, evaluate_many, pick_best
from tr_core import feasibility as F
from tr_core.errors import SpecError, StateSpaceTooLarge
from tr_core.spec import SystemSpec

# largest candidate list held in memory (about 1 GiB of tuples for M = 3)
MAX_CANDIDATES = 5_000_000
# the eager chain is solved before the search only up to this many states (R2R: N <= 48); above, its
# enumeration stops there at once and it waits its turn among the rivals
EAGER_FIRST_STATES = 300_000
# the state cap of a box of the first grid on the first (coarsest) clock.  These few boxes cover the whole
# feasible set; at server scale the ones at small thresholds have the largest processes of the search (R2R,
# N = 256: 627,774 states for [1, 64]^2 on slots of 30 quanta, 47 s, 3.3 GB peak) and are the only bound
# that reaches them below B* (12,493 tok/s against 12,504): left unbuilt, their 8,192 vectors keep only
# the all-policy bound, 0.8 % above.  Their sub-boxes and the finer clocks keep ``max_box_states``
FIRST_BOX_STATES = 1_000_000
# a box's process on the second coarse clock has up to about this many times its states on the first (R2R,
# N = 256, slots of 30 then 12 quanta: 1.0-2.0x, and the builds that stopped at the cap came from 232,000-310,000
# states): a box is not built on the second clock when the first's states times this exceed the cap (cost
# only: the box is split and its parts are tried again)
FINER_SLOT_GROWTH = 1.75
# entries (routing outcomes x decisions) per state allowed to a box process: 60 at R2R's slots of 30 quanta
BOX_ENTRIES_PER_STATE = 120
# the caps of a first-grid box on the screen slot (:func:`screen_slot`, co-running only).  R2R with the probe's
# factors 2.8 / 1.05 at N = 256: [1, 64]^2 has 1,269,687 states on slots of 30 quanta (7.7 GB peak, bounded by
# 9,003 tok/s against B*'s 11,628) and [65, 128] x [1, 64] 869,431, with more than 120 entries a state under the
# co-running law; under these caps every first-grid box is bounded and the answer is certified within 0.1 %
# instead of the scaled all-policy bound's 3.1 %
SCREEN_BOX_STATES = 1_400_000
SCREEN_ENTRIES_PER_STATE = 250
# the share of a time budget the first steepest ascent may use (the rest is left to the box pass that bounds
# what the search does not reach).  ME at N = 16, chains of 5-9 million states, one to two minutes each: with
# the whole budget (120 s) the ascent ran 5 chains and no box was built; with half of 300 s the box pass then
# pruned 360 of the 816 vectors (three far boxes), though the vectors near B* still kept only the flow bound
# (gap 23.9 %, 24.0 % before)
ASCENT_BUDGET_SHARE = 0.5


def _below_any(B, tops) -> bool:
    """Whether ``B <= T`` componentwise for some ``T`` in ``tops``."""
    return any(all(b <= t for b, t in zip(B, T)) for T in tops)


def _in_boxes(B, boxes) -> bool:
    """Whether ``lo <= B <= hi`` componentwise for some ``(lo, hi)`` in ``boxes``."""
    return any(all(a <= b <= c for a, b, c in zip(lo, B, hi)) for lo, hi in boxes)


def _default_start(N: int, M: int) -> tuple[int, ...]:
    # the centre of the feasible simplex; only orders the work
    x = (N - 1) // (M + 1)
    return (1 + x,) * M


def _guided_start(spec: SystemSpec, N: int, kw) -> tuple[int, ...]:
    """The mean-field model's best vector (:mod:`optimizer.mean_field`); it only orders the work."""
    from optimizer.mean_field import mean_field_thresholds

    try:
        return mean_field_thresholds(spec, N, round_to_grid=kw.get("round_to_grid", False)).B
    except SpecError:
        return _default_start(N, M=spec.M)


def _eval_or_none(args):
    """One vector's :class:`Evaluation`, or None when its chain is over ``kw``'s ``max_states`` (a task)."""
    spec, N, B, kw = args
    try:
        return evaluate_many(spec, [(N, B)], **kw)[0]
    except StateSpaceTooLarge:
        return None


def _evaluate_each(spec, N, todo, executor, kw) -> list:
    """Each vector's :class:`Evaluation` or None (over the state budget), in order; on ``executor`` (one task
    a vector) when given, else here."""
    from tr_core.parallel import map_tasks

    return map_tasks(_eval_or_none, [(spec, N, B, kw) for B in todo], executor=executor)


def _evaluate_fitting(spec, N, todo, workers, executor, kw, skipped=None) -> list:
    """``evaluate_many`` over ``todo``, leaving out (into ``skipped``, a list) the chains over the state budget."""
    if executor is None and workers > 1:
        try:
            return evaluate_many(spec, [(N, B) for B in todo], workers=workers, **kw)
        except StateSpaceTooLarge:
            pass
    out = []
    for B, e in zip(todo, _evaluate_each(spec, N, todo, executor, kw)):
        if e is not None:
            out.append(e)
        elif skipped is not None:
            skipped.append(B)
    return out


def _ascend(spec, N, cur, evals, seen, allowed, workers, executor, kw, t0, budget, limit) -> tuple[int, ...]:
    """Steepest ascent over +-1 neighbours from ``cur``; appends to ``evals``/``seen``; returns the top.

    A neighbour whose chain is over the state budget is not a step of the ascent (the search's later passes
    bound it)."""
    M = spec.M
    by = {e.B: e for e in evals}
    too_large: set = set()

    def ok(B):
        return F.is_feasible(B, N) and (allowed is None or B in allowed) and tuple(B) not in too_large

    if not ok(cur):
        return cur
    while True:
        nbrs = [cur]
        for i in range(M):
            for step in (-1, 1):
                b = list(cur)
                b[i] += step
                if ok(b):
                    nbrs.append(tuple(b))
        todo = [B for B in nbrs if B not in seen]
        skipped: list = []
        if limit is not None and len(evals) + len(todo) > limit:
            return cur
        # under a budget the neighbours go a round of the workers at a time, the budget checked before each
        # (three models at N = 16: six neighbours of a minute or more each would overrun it by minutes)
        chunk = max(1, len(todo) if budget is None else int(workers))
        stopped = False
        for i in range(0, len(todo), chunk):
            if budget is not None and evals and time.perf_counter() - t0 > budget:
                stopped = True
                break
            for e in _evaluate_fitting(spec, N, todo[i:i + chunk], workers, executor, kw, skipped):
                seen.add(e.B)
                evals.append(e)
                by[e.B] = e
        too_large.update(skipped)    # what did not fit is left to the search's later passes (bounded there)
        fit = [by[B] for B in nbrs if B in by]
        if not fit:
            return cur
        top = pick_best(fit)
        if stopped or top.B == cur:
            return top.B
        cur = top.B


def auto_coarse(d, max_inflation: float = 0.015, dco=None, co_inflation: float | None = None) -> int:
    """The slot length (quanta) of the coarse-clock bound: the largest ``c`` whose floor rounding makes
    no step more than ``max_inflation`` faster (``d / (c floor(d / c)) - 1``) and leaves every step at
    least two slots; 1 (the fine clock) when none does.  Only decides cost and tightness, never validity.

    ``dco``: the co-running steps, held to ``co_inflation`` instead (default ``max_inflation``; they
    too must span at least two slots).
    """
    def distinct(a):
        s = np.unique(np.asarray(a, dtype=np.int64)[:, 1:])
        return s[s > 0]

    groups = [(distinct(d), float(max_inflation))]
    if dco is not None:
        groups.append((distinct(dco), float(max_inflation if co_inflation is None else co_inflation)))
    shortest = min(int(s.min()) for s, _ in groups)
    best = 1
    for c in range(2, shortest // 2 + 1):
        ok = True
        for steps, tol in groups:
            fl = steps // c
            if fl.min() < 2 or float(np.max(steps / (c * fl))) - 1.0 > tol:
                ok = False
                break
        if ok:
            best = c
    return best


# the first (cheapest) slot under co-running: the solo steps within 4 %, the co-running ones within this
CORUN_FIRST_INFLATION = 0.10


def coarse_levels(d, dco=None) -> tuple[int, ...]:
    """The slots (quanta, longest first) the box pass tries before the fine clock.

    Solo: the longest slot within 4 % on every step, then within 1.5 %.  With co-running steps
    ``dco`` a slot that suits both tables is often far shorter than one that suits either (R2R
    with the small model x2.15: steps 60, 279 and 129 quanta allow 30 for the solo ones but only 6
    for all three), and a box process grows about as fast as the slot shrinks.  The first slot is
    therefore chosen for the solo steps (4 %) while the co-running ones may be up to
    ``CORUN_FIRST_INFLATION`` faster (a looser but cheap screen: far boxes prune on it); the next
    is the longest within 4 % on every step (1.5 % when that is the same slot).  Only cost and
    tightness depend on this, never validity (every slot here leaves each step at least two slots).
    """
    if dco is None:
        return tuple(sorted({auto_coarse(d, 0.04), auto_coarse(d, 0.015)} - {1}, reverse=True))
    both = np.concatenate([np.asarray(d), np.asarray(dco)])
    first = auto_coarse(d, 0.04, dco=dco, co_inflation=CORUN_FIRST_INFLATION)
    tight = auto_coarse(both, 0.04)
    if tight == first:
        tight = auto_coarse(both, 0.015)
    return tuple(sorted({first, tight} - {1}, reverse=True))


def screen_slot(d, dco=None) -> int | None:
    """A slot longer than the first of :func:`coarse_levels`, for the first grid's boxes only, or None.

    The longest slot that still leaves every step, solo and co-running, at least two slots, whatever its
    rounding gains (R2R with co-running factors 2.8 / 1.05: 30 quanta, where the co-running step of 168
    quanta spans 5 slots, 11 % faster, against the first slot's 15).  Its bound is the loosest, but its
    processes are about half the first slot's, and the boxes at the smallest thresholds sit far enough below
    B* (R2R co-running at N = 256: [1, 64] x [65, 128] is bounded by 11,375 tok/s on 495,294 states against
    B*'s 11,628; on 15 quanta it is over the first grid's cap of 1,000,000 states) that a loose bound prunes
    them.  None when no such slot is longer than the first (solo R2R: 30 already).  Cost and tightness only,
    never validity (bound 5 holds on any slot of at least two slots per step).
    """
    steps = np.asarray(d) if dco is None else np.concatenate([np.asarray(d), np.asarray(dco)])
    c = auto_coarse(steps, math.inf)
    levels = coarse_levels(d, dco)
    return c if levels and c > levels[0] else None


def warm_box_kernels(spec: SystemSpec, round_to_grid: bool = False, N: int = 4) -> bool:
    """Compile (or load from numba's cache) the kernels of the coarse-clock box bound on a tiny box, so that
    a sweep's worker can do it while another compiles the chain's (:func:`optimizer.search.optimize_sweep`).

    Only a matter of time: the result is thrown away.  False when this system's steps are too short for a
    coarse clock (its searches never use one) or the tiny box cannot be built.
    """
    from optimizer.bounds import _corun_quanta, _quanta, box_bound

    d = _quanta(spec, N, round_to_grid)
    dco = _corun_quanta(spec, N, round_to_grid)
    c = auto_coarse(d if dco is None else np.concatenate([d, dco]), 0.04)
    if c <= 1:
        return False
    lo, hi = (1,) * spec.M, (N,) * spec.M
    r = box_bound(spec, N, lo, hi, round_to_grid=round_to_grid, coarse=c, keep=True, max_states=200_000)
    if r.process is None:
        return False
    box_bound(spec, N, lo, (N // 2,) * spec.M, round_to_grid=round_to_grid, coarse=c, parent=r.process,
              max_states=200_000)
    return True


def _clip(N: int, lo, hi):
    """The box's top corner cut to the feasible set (``B_j - 1 <= N - 1 - sum_{i != j} (lo_i - 1)``), or None
    when even its bottom corner is infeasible."""
    slack = N - 1 - sum(x - 1 for x in lo)
    if slack < 0:
        return None
    return tuple(min(h, a + slack) for a, h in zip(lo, hi))


def first_grid_boxes(N: int, M: int, split: int, side: int | None = None) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The boxes the whole-set pass starts from: a grid of side about ``N / split`` (or ``side``) over the
    thresholds, the boxes with a feasible lower corner.  The whole set is never prunable (it holds B*), and a
    box's cost is its process's build, so trying the few top levels of a bisection only wastes it."""
    side = max(1, int(side) if side else -(-N // max(1, int(split))))
    out = []
    for corner in itertools.product(*[range(1, N + 1, side)] * M):
        if F.is_feasible(corner, N):
            out.append((tuple(corner), tuple(min(N, c + side - 1) for c in corner)))
    return out


# a sweep's box pass at N skips a clock for a box that failed on it at the previous N of the sweep by more than
# this (relative, beyond the pruning limit): the bound moves little between neighbouring N, so such a try would
# fail again.  R2R (p = 0.35, L = 6.0 / 27.9 ms) at N = 160, one process: 34 s of its 65 s of box bounds were
# tries that failed, 29 s of them by more than 0.5 %
MEMORY_SKIP_MARGIN = 0.005
# ... from this N on (below, the box pass takes seconds)
MEMORY_FROM_N = 64
# a skipped try's record is carried to the next N of the sweep at most this many times before the box is tried
# again (the incumbent moves with N: a box far from it at one N may be pruned a few N later)
MEMORY_MAX_AGE = 3


class BoxMemory:
    """What the whole-set box pass found at the previous N of a sweep, to skip the tries that would fail again.

    One instance is handed to the searches of consecutive N (increasing) in one process.  :meth:`begin` fixes
    the first grid's side for N: the previous N's, while it still gives ``split`` or ``split + 1`` boxes
    a side, so that the boxes of the bisection have the same corners at both N (away from the feasibility
    boundary, where clipping moves them); otherwise a new side and nothing remembered.  The pass records, for
    every box it tries, the ratio of its bound to the incumbent on each clock (:meth:`note`), and skips a clock
    where the previous N's ratio was above the pruning limit by more than :data:`MEMORY_SKIP_MARGIN`
    (:meth:`skip`); a box whose every clock is skipped is split without a build.  Only the work depends on it:
    a box is pruned only by a bound computed at this N.
    """

    def __init__(self):
        self.side: int | None = None
        self.prev: dict = {}
        self.now: dict = {}
        self.skipped = 0

    def begin(self, N: int, split: int) -> int | None:
        """The first grid's side at ``N`` (None: the default), after rotating the records."""
        split = max(1, int(split))
        if int(N) < MEMORY_FROM_N:
            self.side, self.prev, self.now = None, {}, {}
            return None
        if self.side is not None and (split - 1) * self.side < N <= (split + 1) * self.side:
            self.prev, self.now = self.now, {}
        else:
            self.side, self.prev, self.now = -(-int(N) // split), {}, {}
        return self.side

    def note(self, box, c: int, ratio: float) -> None:
        self.now.setdefault(box, {})[int(c)] = (float(ratio), 0)

    def skip(self, box, c: int, limit: float) -> bool:
        r = self.prev.get(box, {}).get(int(c))
        if r is None or r[0] <= limit * (1.0 + MEMORY_SKIP_MARGIN) or r[1] >= MEMORY_MAX_AGE:
            return False
        # carried to the next N unmeasured, so that a box is tried afresh at least every MEMORY_MAX_AGE + 1 N
        self.now.setdefault(box, {})[int(c)] = (r[0], r[1] + 1)
        self.skipped += 1
        return True


# the whole-set pass shares its first-grid boxes out to the search's local worker processes from this N on
# (each box and its bisection depend only on the incumbent, fixed during the pass); below, the pass takes
# seconds, less than starting the workers and loading their kernels
PARALLEL_BOX_N = 128


def _box_part(payload):
    """Worker task of :func:`_box_pass_parallel`: the pass over some first-grid boxes, with its own records."""
    spec, N, best, by_B, cands, kw, grid, opts = payload
    pruned_set: set = set()
    pruned: list = []
    known: dict = {}
    failed: list = []
    stats: dict = {}
    _box_pass(spec, N, best, by_B, cands, pruned_set, pruned, kw, known=known, failed=failed, stats=stats,
              grid=grid, deadline=None, **opts)
    return pruned, known, failed, stats


def _box_pass_parallel(spec, N, best, by_B, cands, pruned_set, pruned, kw, *, executor, stats: dict,
                       known: dict, failed: list, split: int, **opts) -> None:
    """:func:`_box_pass` with its first-grid boxes shared out to ``executor``'s workers (one task a box,
    the smallest thresholds, whose processes are the largest, first), merged as the one pass would have
    recorded them: what is pruned, and by what, depends only on each box and the incumbent ``best``."""
    from tr_core.parallel import map_tasks

    grid = first_grid_boxes(N, spec.M, split)
    payloads = [(spec, N, best, by_B, cands, kw, [box], dict(opts, split=split)) for box in grid]
    order = sorted(range(len(grid)), key=lambda i: (sum(grid[i][0]), i))
    for part_pruned, part_known, part_failed, part_stats in map_tasks(_box_part, payloads, executor=executor,
                                                                      order=order):
        for B, name, v in part_pruned:
            if B not in pruned_set:
                pruned_set.add(B)
                pruned.append((B, name, v))
        for B, (v, name) in part_known.items():
            if B not in known or v < known[B][0]:
                known[B] = (v, name)
        failed.extend(part_failed)
        for k, v in part_stats.items():
            stats[k] = stats.get(k, 0) + v


def _box_pass(spec, N, best, by_B, cands, pruned_set, pruned, kw, *, min_box: int, max_box_states: int,
              deadline: float | None, stats: dict, coarse: int = 1, fine_states: int | None = None,
              max_sweeps: int = 3000, split: int = 1, max_gap: float = 0.0, root_states: int = 0,
              known: dict | None = None, failed: list | None = None, first_states: int | None = None,
              grid: list | None = None, screen: int | None = None, memory: BoxMemory | None = None,
              side: int | None = None) -> None:
    """Prune whole boxes of thresholds with :func:`optimizer.bounds.box_bound` (recursive bisection).

    A box holding an evaluated vector at least as good as ``best`` cannot be pruned and is split
    at once; a box the bound cannot prune (or too large to build) is split; boxes with at most
    ``min_box`` unresolved vectors are left to individual evaluation; with ``max_gap > 0`` (certified
    search) a box whose bound is within ``max_gap`` of ``best`` is pruned too.  With ``coarse > 1`` each box
    is tried first on the coarse clock (bound 5, cheap), then, if its process has at most
    ``fine_states`` states, on the fine one (bound 3, tighter).  ``known``: B -> (bound tok/s, name), the
    smallest bound of a box tried but not pruned, for each of its open vectors (still a proven bound on each:
    it certifies what the search leaves unresolved).  ``failed``: a list that receives ``(lo, hi)`` of each
    box over the state cap on the first clock, or not built because it lies below one that was.
    ``first_states``: the state cap of the boxes of the first grid on the first clock (default
    ``max_box_states``); their sub-boxes and the finer clocks keep ``max_box_states``.  ``grid``: the boxes
    to start from (default :func:`first_grid_boxes`; a part of it when the pass is shared out,
    :func:`_box_pass_parallel`).  ``screen``: a slot longer than the first clock (:func:`screen_slot`) on
    which each box of the first grid is tried before the others, with the first grid's cap: the far boxes,
    whose processes are the largest, prune on it; a box over the cap on it is over the cap on every clock.
    ``memory``: a sweep's :class:`BoxMemory` (skips the clocks where a box failed widely at the previous N;
    records this N's); ``side``: the first grid's side (default about ``N / split``).
    """
    from optimizer.bounds import box_bound

    M = spec.M
    rtg = kw.get("round_to_grid", False)
    todo = list(first_grid_boxes(N, M, split, side) if grid is None else grid)
    todo.reverse()
    # the first grid's boxes as the loop sees them (clipped to the feasible set)
    first_grid = {(lo, _clip(N, lo, hi)) for lo, hi in todo}
    # per clock, the processes of the boxes on the current path of the bisection: a box's process is
    # cut out of the innermost one holding it (optimizer.bounds.box_bound, parent=), not enumerated again
    kept: dict[int, list] = {}
    levels0 = coarse if isinstance(coarse, tuple) else ((coarse,) if coarse > 1 else ())
    # the top corners of the boxes whose process was over the state cap on the first clock.  Smaller
    # thresholds launch smaller batches more often and reach more states (observed, not proven: at N = 256
    # every box below (64, 64) is over 400,000 states, down to (1..4) x (1..4)), and finding that out costs
    # a build up to the cap (10-20 s each).  A box whose top corner is below a failed one's is therefore not
    # built: its vectors are left to the later passes (evaluated, deferred or bounded one by one).  Only
    # cost depends on this; a box not tried is never pruned.
    failed_tops: list = []
    # on each finer clock, the boxes over the cap there: a sub-box that shares such a box's bottom corner
    # holds its smallest thresholds, and is not built on that clock (nor on the finer ones, whose processes
    # are larger still).  At N = 256 each such build costs 9-12 s before it stops at the cap, and those
    # sub-boxes were over it too (cost only, as above; a sub-box lies in its first-grid box, so a pass shared
    # out a first-grid box per task skips the same ones)
    finer_failed: dict = {}
    if root_states and levels0 and todo:
        # one process of the whole feasible box on the first (coarsest) clock: every box is cut out of it
        # (mdp_restrict) instead of enumerated on its own; at large N a box's process is nearly as large as
        # the whole set's, so this replaces dozens of builds by one
        c0 = levels0[0]
        r0 = box_bound(spec, N, (1,) * M, (N,) * M, max_states=root_states, max_entries=40 * root_states,
                       round_to_grid=rtg, coarse=c0, keep=True, solve=False)
        stats["root_seconds"] = r0.seconds
        stats["root_states"] = r0.states
        if r0.process is not None:
            kept[c0] = [r0.process]
    while todo:
        if deadline is not None and time.perf_counter() > deadline:
            return
        lo, hi = todo.pop()
        hi = _clip(N, lo, hi)
        if hi is None:
            continue
        for stack in kept.values():
            while stack and not stack[-1].holds(N, lo, hi, stack[-1].coarse):
                stack.pop()
        inside = [B for B in cands if all(a <= b <= c for a, b, c in zip(lo, B, hi))]
        open_ = [B for B in inside if B not in by_B and B not in pruned_set]
        if len(open_) <= min_box:
            continue
        holds_best = any(e.throughput_tok_s >= best * (1.0 - TIE_RTOL) and all(a <= b <= c for a, b, c in zip(lo, B, hi))
                         for B, e in by_B.items())
        hit = None
        r = None
        tried: list = []
        if not holds_best:
            levels = list(coarse) + [1] if isinstance(coarse, tuple) else ([coarse, 1] if coarse > 1 else [1])
            first_c = levels[0]
            if screen and (lo, hi) in first_grid and screen > first_c:
                levels.insert(0, screen)
            if _below_any(hi, failed_tops):
                stats["boxes_skipped"] = stats.get("boxes_skipped", 0) + 1
                if failed is not None:
                    failed.append((lo, hi))
                continue
            for c in levels:
                cap = max_box_states if (c > 1 or fine_states is None) else fine_states
                if first_states is not None and c in (levels[0], first_c) and (lo, hi) in first_grid:
                    cap = max(cap, int(first_states))
                    if c == screen:
                        cap = max(cap, SCREEN_BOX_STATES)
                if deadline is not None:
                    # a build costs about 30 us a state: never start one that cannot end in time
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        return
                    cap = min(cap, max(2_000, int(30_000 * left)))
                if c == 1 and r is not None and r.states * 3 > cap:
                    break      # the fine process has several times the coarse one's states: too large
                if c > 1 and r is not None and r.states * FINER_SLOT_GROWTH > cap:
                    stats["finer_skipped"] = stats.get("finer_skipped", 0) + 1
                    break      # the next coarse clock's process would be over the cap: not built
                if c != levels[0] and any(lo == flo and all(h <= fh for h, fh in zip(hi, fhi))
                                          for flo, fhi in finer_failed.get(c, ())):
                    stats["finer_skipped"] = stats.get("finer_skipped", 0) + 1
                    break
                target = best / (1.0 - max_gap) if max_gap > 0 else best
                if memory is not None and memory.skip((lo, hi), c, target / best):
                    stats["memory_skipped"] = stats.get("memory_skipped", 0) + 1
                    continue
                stats["boxes_tried"] = stats.get("boxes_tried", 0) + 1
                stack = kept.setdefault(c, [])
                r = box_bound(spec, N, lo, hi, target_tok_s=target, max_states=cap, round_to_grid=rtg,
                              max_entries=max(60_000_000, (SCREEN_ENTRIES_PER_STATE if c == screen
                                                           else BOX_ENTRIES_PER_STATE) * cap),
                              coarse=c, max_sweeps=max_sweeps, parent=stack[-1] if stack else None, keep=c > 1)
                stats["box_seconds"] = stats.get("box_seconds", 0.0) + r.seconds
                tried.append((c, r))
                if memory is not None and r.status == "ok":
                    memory.note((lo, hi), c, r.upper_tok_s / best)
                if r.status == "too large":
                    stats["boxes_too_large"] = stats.get("boxes_too_large", 0) + 1
                    if memory is not None and c == 1:
                        memory.note((lo, hi), c, math.inf)      # over the fine clock's cap: not again
                    if c in (levels[0], first_c):
                        failed_tops.append(hi)
                        if failed is not None:
                            failed.append((lo, hi))
                    else:
                        finer_failed.setdefault(c, []).append((lo, hi))
                    break      # the finer clocks' processes are larger still
                if r.status == "ok" and (r.upper_tok_s < best * (1.0 - TIE_RTOL)
                                         or (max_gap > 0 and r.upper_tok_s <= best / (1.0 - max_gap))):
                    hit = (r, c)
                    break
        if hit is None:
            # the box is split: its processes serve its sub-boxes
            for c, res in tried:
                if res.process is not None:
                    kept.setdefault(c, []).append(res.process)
            if known is not None:
                ok = [(res.upper_tok_s, c) for c, res in tried if res.status == "ok" and math.isfinite(res.upper_tok_s)]
                if ok:
                    v, c = min(ok)
                    name = f"box{lo}-{hi}" + (f" slot={c}" if c > 1 else "")
                    for B in open_:
                        if B not in known or v < known[B][0]:
                            known[B] = (v, name)
        if hit is not None:
            r, c = hit
            stats["boxes_pruned"] = stats.get("boxes_pruned", 0) + 1
            if screen and c == screen:
                stats["screen_pruned"] = stats.get("screen_pruned", 0) + 1
            name = f"box{lo}-{hi}" + (f" slot={c}" if c > 1 else "")
            for B in open_:
                pruned_set.add(B)
                pruned.append((B, name, r.upper_tok_s))
            continue
        j = max(range(M), key=lambda i: hi[i] - lo[i])
        if hi[j] == lo[j]:
            continue
        mid = (lo[j] + hi[j]) // 2
        a_hi = tuple(mid if i == j else hi[i] for i in range(M))
        b_lo = tuple(mid + 1 if i == j else lo[i] for i in range(M))
        todo.append((b_lo, hi))
        todo.append((lo, a_hi))


def branch_and_bound(spec: SystemSpec, N: int, *, workers: int = 1, executor=None,
                     time_budget_s: float | None = None, **kw) -> "object":
    """Exact (``max_gap = 0``, no budget) or certified search of B* at one N; returns an :class:`Optimum`.

    With ``workers > 1`` and no ``executor``, a search from :data:`PARALLEL_BOX_N` on holds one pool of
    ``workers`` local processes for its whole length (the whole-set box pass shares its first-grid boxes out
    to it, and the chains are evaluated on it a batch at a time); below, only batches of chains go to a pool
    of their own.  The answer does not depend on it.
    """
    with search_pool(N, workers, executor, time_budget_s) as pool:
        return _branch_and_bound(spec, N, workers=workers, executor=executor if pool is None else pool,
                                 time_budget_s=time_budget_s, **kw)


def search_pool(N: int, workers: int, executor, time_budget_s: float | None):
    """``with search_pool(...) as pool``: one pool of ``workers`` local processes (:func:`tr_core.parallel.
    local_pool`) held by a search at one N that has workers but no executor, from :data:`PARALLEL_BOX_N` on or
    under a time budget (whose search evaluates its chains a round of the workers at a time, the budget checked
    between rounds: a pool started for each round would cost more than small chains); ``pool`` is None
    otherwise (nothing is started)."""
    import contextlib

    if executor is None and int(workers) > 1 and (time_budget_s is not None or int(N) >= PARALLEL_BOX_N):
        from tr_core.parallel import local_pool

        return local_pool(int(workers))
    return contextlib.nullcontext(None)


def _branch_and_bound(spec: SystemSpec, N: int, *, candidates: Sequence[Sequence[int]] | None = None,
                     max_gap: float = 0.0, time_budget_s: float | None = None,
                     max_evaluations: int | None = None, start: Sequence[int] | None = None,
                     eager: bool = True, workers: int = 1, executor=None, progress=None,
                     batch: int | None = None, bounder: Bounder | None = None, boxes: bool = False,
                     min_box: int = 8, max_box_states: int = 400_000, cheap_states: int = 5_000, cheap_factor: int = 8,
                     stats: dict | None = None, coarse: int | None = None, fine_states: int = 30_000,
                     box_sweeps: int = 200, box_split: int | None = None, whole_pass: bool = True,
                     first_box_states: int | None = FIRST_BOX_STATES, box_memory: BoxMemory | None = None,
                     **kw) -> "object":
    t0 = time.perf_counter()
    N = F.check_n(N)
    M = spec.M
    if candidates is None:
        total = F.count_feasible(N, M)
        F.check_count(total, MAX_CANDIDATES, N=N, M=M, what="candidate threshold vectors (memory limit)")
        cands = list(F.iter_feasible(N, M))
    else:
        cands = list(dict.fromkeys(F.check_thresholds(c, N, M) for c in candidates))
        if not cands:
            raise SpecError("candidates: no threshold vector given")
    if bounder is None:
        bounder = Bounder(spec, N, round_to_grid=kw.get("round_to_grid", False))
    st = tuple(int(b) for b in start) if start is not None else _guided_start(spec, N, kw)
    if len(st) != M or not F.is_feasible(st, N):
        st = _guided_start(spec, N, kw)
    # a batch of chains runs to its end before the budget is checked again: one round of the workers under a
    # budget, two otherwise (so a pool never waits on the last chain of a batch)
    batch = batch or max(1, int(workers)) * (1 if time_budget_s is not None else 2)

    evals: list[Evaluation] = []
    seen: set = set()
    eager_B = (1,) * M
    if eager:
        # the eager chain is the largest of all: solved first only while it is cheap; otherwise it is a
        # rival like any other, rejected by a bound or solved where the bounds cannot reject it
        cap_kw = {**kw, "max_states": min(EAGER_FIRST_STATES, int(kw.get("max_states") or EAGER_FIRST_STATES))}
        try:
            evals.extend(evaluate_many(spec, [(N, eager_B)], workers=1, executor=executor, **cap_kw))
            seen.add(eager_B)
        except StateSpaceTooLarge:
            pass
    # Observed structure orders the work (never prunes it): a steepest ascent from the start finds a
    # strong incumbent with few chains, then the rest is visited nearest-first from where it ended,
    # cheaper chains (larger B) first among equals.
    allowed = set(cands) if candidates is not None else None
    # with a time budget the ascent may take half of it: the bounds that certify what the search leaves (the
    # box pass) need the rest, or every vector not reached keeps only the loose global bound
    ascent_s = None if time_budget_s is None else ASCENT_BUDGET_SHARE * time_budget_s
    st = _ascend(spec, N, st, evals, seen, allowed, workers, executor, kw, t0, ascent_s, max_evaluations)
    cands.sort(key=lambda B: (sum(abs(a - b) for a, b in zip(B, st)), -sum(B), B))
    best = max((e.throughput_tok_s for e in evals), default=-math.inf)
    pruned: list[tuple[tuple[int, ...], str, float]] = []
    pruned_set: set = set()
    stats = {} if stats is None else stats
    unresolved: list[tuple[tuple[int, ...], str, float]] = []
    limit = max_evaluations
    stop_reason = None
    deferred: list[tuple[int, ...]] = []
    too_large: list[tuple[tuple[int, ...], str, float]] = []    # chains over the state budget, not pruned

    known: dict = {}     # B -> (bound tok/s, name) from boxes the box pass tried but could not prune
    # vectors whose chain was over the deferral cap / the whole state budget.  Smaller thresholds launch
    # smaller batches more often and reach more states (observed, not proven), so a vector below one of
    # these is treated as over it too: that decides only what is tried, never what is pruned
    over_cap: list = []
    over_budget: list = []
    failed_boxes: list = []     # (lo, hi) of the boxes the first box pass found over its state cap

    def vbound(B):
        bd = bounder.vector_bound(B)
        k = known.get(B)
        return Bound(k[0], k[1]) if k is not None and k[0] < bd.value_tok_s else bd

    def prunable(v: float) -> bool:
        if best == -math.inf:
            return False
        if max_gap > 0:
            return v <= best / (1.0 - max_gap)
        return v < best * (1.0 - TIE_RTOL)

    def run(order, ekw, defer: bool) -> None:
        """Evaluate ``order`` in batches, skipping what the bounds prune; with ``defer``, chains
        larger than ``ekw['max_states']`` are set aside (their enumeration stops early, cheaply)."""
        nonlocal best, stop_reason
        i, n = 0, len(order)
        while i < n and stop_reason is None:
            todo = []
            while i < n and len(todo) < batch:
                B = order[i]
                i += 1
                if B in seen or B in pruned_set:
                    continue
                bd = vbound(B)
                if prunable(bd.value_tok_s):
                    pruned.append((B, bd.name, bd.value_tok_s))
                    pruned_set.add(B)
                    continue
                todo.append(B)
            if not todo:
                continue
            if time_budget_s is not None and evals and time.perf_counter() - t0 > time_budget_s:
                stop_reason = "time budget"
            if limit is not None and len(evals) + len(todo) > limit:
                stop_reason = stop_reason or "max_evaluations"
            if stop_reason:
                break
            if defer:
                new = []
                pending = []
                for B in todo:
                    if max_gap > 0 and _in_boxes(B, failed_boxes):
                        # certified: the box pass found this vector's box over the state cap, so its chain is
                        # larger still; it is left to its proven bound without an enumeration
                        bd = vbound(B)
                        too_large.append((B, bd.name, bd.value_tok_s))
                        pruned_set.add(B)
                        stats["left_to_bound"] = stats.get("left_to_bound", 0) + 1
                        continue
                    if _below_any(B, over_cap):
                        deferred.append(B)      # deferral only postpones: it is evaluated or bounded later
                        continue
                    pending.append(B)
                for B, e in zip(pending, _evaluate_each(spec, N, pending, executor, ekw)):
                    if e is not None:
                        new.append(e)
                    else:
                        deferred.append(B)
                        over_cap.append(B)
            else:
                # a chain over the state budget is bounded, never a refusal: it stays unresolved with its
                # proven bound, and the answer is certified with the gap that bound leaves
                skipped: list = []
                if max_gap > 0:
                    # certified: a vector below one whose chain was over the whole budget is left to its bound
                    # without an enumeration to the budget (minutes and gigabytes at N = 256); the exact
                    # search tries every chain, so its answer never depends on this guess
                    skipped = [B for B in todo if _below_any(B, over_budget)]
                    todo = [B for B in todo if B not in skipped]
                    stats["skipped_as_too_large"] = stats.get("skipped_as_too_large", 0) + len(skipped)
                n_skip = len(skipped)
                new = _evaluate_fitting(spec, N, todo, workers, executor, ekw, skipped)
                over_budget.extend(skipped[n_skip:])
                for B in skipped:
                    bd = vbound(B)
                    too_large.append((B, bd.name, bd.value_tok_s))
                    pruned_set.add(B)
            for e in new:
                seen.add(e.B)
                evals.append(e)
                best = max(best, e.throughput_tok_s)
            if progress:
                progress(min(i, n), n)

    if boxes:
        # 1. whole boxes of the feasible set, each first on the coarse clock (cheap), then on the fine one
        if box_split is None:
            box_split = 4 if M <= 2 else 2      # a first grid of boxes with a few dozen vectors each
        screen = None
        if coarse is None:
            # a cheap, looser clock first (far boxes prune on it), then a tighter one, then the fine one
            coarse = coarse_levels(bounder.d, bounder.dco)
            screen = screen_slot(bounder.d, bounder.dco)
        parallel = executor is not None and time_budget_s is None and N >= PARALLEL_BOX_N
        # a sweep's memory of the previous N serves the pass in this process only (the shared-out pass is
        # the single-N command's)
        memory = box_memory if (box_memory is not None and not parallel and candidates is None) else None
        side = memory.begin(N, box_split) if memory is not None else None
        if memory is not None and side is None:
            memory = None
        if best > -math.inf and whole_pass:
            opts = dict(min_box=min_box, max_box_states=max_box_states, coarse=coarse, fine_states=fine_states,
                        max_sweeps=box_sweeps, max_gap=max_gap, first_states=first_box_states, screen=screen)
            if parallel:
                _box_pass_parallel(spec, N, best, {e.B: e for e in evals}, cands, pruned_set, pruned, kw,
                                   executor=executor, stats=stats, known=known, failed=failed_boxes,
                                   split=box_split, **opts)
            else:
                _box_pass(spec, N, best, {e.B: e for e in evals}, cands, pruned_set, pruned, kw,
                          deadline=None if time_budget_s is None else t0 + time_budget_s, stats=stats,
                          split=box_split, known=known, failed=failed_boxes, memory=memory, side=side, **opts)
        # 2. cheap chains, exactly; the large ones are deferred, then pruned a box at a time
        # "large" is relative to the incumbent's chain: near B* chains are small, the costly ones are far
        top_states = pick_best(evals).states if evals else 0
        cap = max(cheap_states, cheap_factor * top_states)
        run(cands, {**kw, "max_states": min(cap, int(kw.get("max_states") or cap))}, True)
        stats["deferred"] = len(deferred)
        if deferred and stop_reason is None:
            deadline = None if time_budget_s is None else t0 + time_budget_s
            _box_pass(spec, N, best, {e.B: e for e in evals}, deferred, pruned_set, pruned, kw, min_box=min_box,
                      max_box_states=max_box_states, deadline=deadline, stats=stats, known=known)
        # cheaper chains (larger thresholds) first, so that the vectors below one over the budget follow it
        run(sorted(deferred, key=lambda B: (-sum(B), B)), kw, False)
    else:
        run(cands, kw, False)
    if stop_reason:
        for B in cands:
            if B in seen or B in pruned_set:
                continue
            bd = vbound(B)
            if prunable(bd.value_tok_s):
                pruned.append((B, bd.name, bd.value_tok_s))
            else:
                unresolved.append((B, bd.name, bd.value_tok_s))
    # pruned_set holds the too-large ones only so that no pass tries them again: they are unresolved
    unresolved.extend(too_large)
    stats["too_large"] = len(too_large)
    if not evals and too_large:
        raise StateSpaceTooLarge(f"N = {N}: no threshold vector's chain fits in max_states = "
                                 f"{int(kw.get('max_states') or 0):,} states ({len(too_large):,} tried); raise "
                                 f"--max-states, use a coarser --delta-ms, or use the simulator")
    if not evals:
        raise SpecError("no threshold vector was evaluated")
    if unresolved and max_gap == 0 and stop_reason == "max_evaluations" and time_budget_s is None:
        raise F.TooManyEvaluations(
            f"the exact pruned search at N = {N} needs more than --max-evaluations = {limit:,} chains "
            f"({len(unresolved):,} vectors still unresolved); raise --max-evaluations or use --search certified",
            len(evals) + len(unresolved), limit or 0)
    top = pick_best(evals).throughput_tok_s
    leftovers = pruned + unresolved
    ub = max([top] + [v for _, _, v in leftovers if v > top * (1.0 - TIE_RTOL)])
    g = rel_gap(ub, top)
    exact = not unresolved and (max_gap == 0 or all(v < top * (1.0 - TIE_RTOL) for _, _, v in pruned))
    by: dict[str, int] = {}
    for _, name, _ in pruned:
        by[name] = by.get(name, 0) + 1
    return _optimum(N, evals, time.perf_counter() - t0,
                    certificate="pruned-exact" if exact else "certified",
                    upper_bound_tok_s=top if exact else ub, gap=0.0 if exact else g,
                    pruned=len(pruned), pruned_by=by, unresolved=len(unresolved),
                    pruned_vectors=tuple(pruned))
