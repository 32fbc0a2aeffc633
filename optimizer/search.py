r"""Search of the best delayed-batching thresholds B* = argmax T(B), with a certificate.

The feasible set is :math:`\{B \in \mathbb{Z}_{\ge1}^M : \sum_i (B_i-1) < N\}`
(:mod:`tr_core.feasibility`: the rule, the closed-form count
``binom(N - 1 + M, M)`` and the direct enumeration).  Candidates within a
relative 1e-9 of the best throughput are ties and go to the lexicographically
smallest B, so the answer does not depend on solver noise or evaluation order.
The eager baseline is B = (1, ..., 1).

Search modes (``search=``), each result saying how it was obtained
(:attr:`Optimum.certificate`):

``exhaustive``
    every feasible vector is evaluated (certificate ``"exhaustive"``).
``pruned``
    exact: vectors are evaluated in an order guided by observed structure
    (nearest to a start vector first), and a vector is skipped only when a
    *proven* upper bound on its throughput (:mod:`optimizer.bounds`) is below
    the best throughput found so far by more than the tie tolerance, so the
    answer equals the exhaustive one (certificate ``"pruned-exact"``).
``certified``
    like ``pruned`` but a vector is also skipped when its bound is within
    ``max_gap`` of the best found, and the search may stop at ``time_budget_s``;
    the result carries the largest bound over every vector not evaluated,
    so ``gap = (upper_bound - throughput) / upper_bound`` is a number
    (certificate ``"certified"``; ``"pruned-exact"`` when nothing was left).
``local``
    steepest ascent over the +-1 neighbours (a heuristic); its
    ``upper_bound_tok_s`` is still a proven bound, so its gap is honest
    (certificate ``"local"``).
``auto``
    :func:`tr_core.search_rule.resolve_auto`: ``exhaustive`` while the feasible
    set is small (210 vectors for two models, 56 for more), ``pruned`` up to
    8,256 vectors for two models (N = 128) and 210 for more, otherwise
    ``certified`` with ``max_gap`` (``"pruned-exact"`` when the bounds close the
    gap); a time budget always means ``certified``.

Every search refuses, before any enumeration, to evaluate more than
``max_evaluations`` vectors (counted in closed form), with
:class:`tr_core.feasibility.TooManyEvaluations` (exit code 3).
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from optimizer.evaluate import Evaluation  # noqa: F401  (re-exported for callers of this module)
from optimizer.optimum import (TIE_RTOL, Optimum, _optimum, evaluate_many, evaluations_table,  # noqa: F401
                               pick_best, tighten_rivals)
from tr_core import feasibility as F
from tr_core.errors import SpecError
# the names, the auto rule and the default gap have one home (also read by the command lines' --help)
from tr_core.search_rule import (AUTO_EXHAUSTIVE_MAX, AUTO_PRUNED_MAX, CERTIFICATES, DEFAULT_MAX_GAP,  # noqa: F401
                                 SEARCHES, resolve_auto)
from tr_core.spec import SystemSpec


def feasible_thresholds(N: int, M: int, max_count: int | None = None) -> list[tuple[int, ...]]:
    """All B with B_i >= 1 and sum(B_i - 1) < N, in lexicographic order (generated directly).  Arguments in
    the order of :mod:`tr_core.feasibility` and of every other call (N, then M)."""
    return list(F.iter_feasible(N, M, max_count=max_count))


def count_feasible(N: int, M: int) -> int:
    """|{B : sum(B_i - 1) < N}| = C(N - 1 + M, M) (N, then M, as in :mod:`tr_core.feasibility`)."""
    return F.count_feasible(N, M)


def optimize_thresholds(spec: SystemSpec, N: int, *, candidates: Sequence[Sequence[int]] | None = None,
                        search: str = "exhaustive", max_gap: float = DEFAULT_MAX_GAP,
                        time_budget_s: float | None = None, max_evaluations: int | None = None,
                        start: Sequence[int] | None = None, eager: bool = True, policies=None,
                        boxes: bool = True, prove: bool = True,
                        workers: int = 1, executor=None, progress=None, box_memory=None, **kw) -> Optimum:
    """B* at concurrency N (see the module docstring for ``search``).

    ``candidates`` restricts the search to the given vectors (the bounds then
    hold over those).  ``start``: a vector to begin near (e.g. B*(N-1)); it
    only orders the work.  ``eager=False`` skips the eager baseline in the
    pruned/certified modes (its chain is the largest; the eager fields are NaN).
    ``policies``: an :class:`optimizer.bounds.PolicyBounds` table whose
    all-policy bounds tighten ``upper_bound_tok_s`` (and so the gap).
    ``boxes``: in the pruned/certified modes, set large chains aside and
    prune them a box at a time (:func:`optimizer.bounds.box_bound`).
    ``prove``: re-solve, with more effort on the error bound, every evaluated
    but rejected chain whose bound is too loose to exclude it from B*
    (:func:`optimizer.optimum.tighten_rivals`); False leaves them as found.
    ``box_memory``: an :class:`optimizer.branch.BoxMemory` shared by the searches of a sweep's consecutive N
    in one process (it only saves box bounds that would fail again; the answer does not depend on it).
    """
    from optimizer.branch import BoxMemory, search_pool

    if box_memory is not None and not isinstance(box_memory, BoxMemory):
        raise SpecError(f"box_memory must be an optimizer.branch.BoxMemory or None, got {type(box_memory).__name__}")
    # a search at server scale holds one pool of local workers for the search and the re-solve of B*'s rivals
    with search_pool(N, workers, executor, time_budget_s) as pool:
        ex = executor if pool is None else pool
        opt = _optimize_thresholds(spec, N, candidates=candidates, search=search, max_gap=max_gap,
                                   time_budget_s=time_budget_s, max_evaluations=max_evaluations, start=start,
                                   eager=eager, policies=policies, boxes=boxes, workers=workers, executor=ex,
                                   progress=progress, box_memory=box_memory, **kw)
        return tighten_rivals(spec, opt, executor=ex, **kw) if prove else opt


def _optimize_thresholds(spec: SystemSpec, N: int, *, candidates, search, max_gap, time_budget_s, max_evaluations,
                         start, eager, policies, boxes, workers, executor, progress, box_memory=None,
                         **kw) -> Optimum:
    N = F.check_n(N)
    search = _check_search(search)
    if not (0.0 <= max_gap < 1.0):
        raise SpecError(f"max_gap must be in [0, 1), got {max_gap!r}")
    total = (F.count_feasible(N, spec.M) if candidates is None else len(candidates))
    if search == "auto":
        search = resolve_auto(spec.M, total, time_budget_s=time_budget_s)
    if search == "local":
        return optimize_local(spec, N, start=start, workers=workers, executor=executor, progress=progress,
                              policies=policies, **kw)
    if search == "exhaustive":
        F.check_count(total, max_evaluations, N=N, M=spec.M)
        t0 = time.perf_counter()
        cands = (feasible_thresholds(N, spec.M) if candidates is None
                 else [F.check_thresholds(c, N, spec.M) for c in candidates])
        eager_B = (1,) * spec.M
        if eager_B not in cands:
            cands = [eager_B] + cands
        evals = evaluate_many(spec, [(N, B) for B in cands], workers=workers, executor=executor,
                              progress=progress, **kw)
        return _optimum(N, evals, time.perf_counter() - t0)
    from optimizer.bounds import Bounder
    from optimizer.branch import branch_and_bound
    bounder = Bounder(spec, N, round_to_grid=kw.get("round_to_grid", False), policies=policies)
    return branch_and_bound(spec, N, candidates=candidates, max_gap=0.0 if search == "pruned" else max_gap,
                            bounder=bounder, boxes=boxes,
                            time_budget_s=time_budget_s, max_evaluations=max_evaluations, start=start,
                            eager=eager, workers=workers, executor=executor, progress=progress,
                            box_memory=box_memory, **kw)


def _check_search(search: str) -> str:
    if search not in SEARCHES:
        raise SpecError(f"--search must be one of {', '.join(SEARCHES)}, got {search!r}")
    return search


def optimize_sweep(spec: SystemSpec, Ns: Sequence[int], *, workers: int = 1, executor=None, progress=None,
                   search: str = "exhaustive", max_gap: float = DEFAULT_MAX_GAP,
                   time_budget_s: float | None = None, max_evaluations: int | None = None,
                   policy_bound_n: int | None = None, on_result=None, prove: bool = True,
                   **kw) -> list[Optimum]:
    """B* for every N in ``Ns``.

    ``exhaustive``: all evaluations of the sweep share one pool.  Other modes
    run N in increasing order, each started near the previous N's B*
    (``time_budget_s`` is per N).  ``max_evaluations`` caps the whole sweep's
    vectors for ``exhaustive`` (closed form, checked first) and each N's for
    the other modes.  ``policy_bound_n``: solve the all-policy bound at this
    concurrency once and scale it to every larger N of the sweep (a tighter
    certificate; default ``min(max(Ns), 12)`` for the certified and local
    modes, and :data:`SERVER_POLICY_N` beside it for a two-model sweep past
    :data:`SERVER_POLICY_FROM_N`; 0 to skip).  ``on_result(optimum)``: called once per N as soon as
    its result is final (from a helper thread when a local pool runs the
    sweep; for an exhaustive sweep on a pool, or on a Dask cluster, when the
    pool's part that holds it returns).  ``prove``: as in
    :func:`optimize_thresholds` (rivals of B* re-solved with more effort).
    """
    search = _check_search(search)
    Ns = [F.check_n(n) for n in Ns]
    if search == "exhaustive":
        total = sum(F.count_feasible(n, spec.M) for n in Ns)
        F.check_count(total, max_evaluations, M=spec.M)
    if Ns:  # an N the chain cannot hold fails before the smaller ones are computed, not after
        from optimizer.evaluate import check_representable
        check_representable(spec, max(Ns), name="max(Ns)")
    if search == "exhaustive":
        if on_result is not None and executor is None and workers <= 1 and len(Ns) > 1:
            # one N at a time, so each row is reported when it is done (nothing to share out)
            res = []
            for k, N in enumerate(Ns):
                evals = evaluate_many(spec, [(int(N), B) for B in F.iter_feasible(N, spec.M)], **kw)
                res.append(_proved(spec, _optimum(int(N), evals, sum(e.seconds for e in evals)), prove, kw))
                on_result(res[-1])
                if progress:
                    progress(k + 1, len(Ns))
            return res
        tasks = []
        for N in Ns:
            tasks.extend((int(N), B) for B in F.iter_feasible(N, spec.M))
        evals = evaluate_many(spec, tasks, workers=workers, executor=executor, progress=progress, **kw)
        by_n: dict[int, list[Evaluation]] = {}
        for e in evals:
            by_n.setdefault(e.N, []).append(e)
        res = [_proved(spec, _optimum(int(N), by_n[int(N)], sum(e.seconds for e in by_n[int(N)])), prove, kw)
               for N in Ns]
        for o in res if on_result is not None else ():
            on_result(o)
        return res
    out: dict[int, Optimum] = {}
    prev = None
    order = sorted(set(Ns))
    policies = None
    if policy_bound_n is None:
        needs = search in ("certified", "local") or (
            search == "auto" and resolve_auto(spec.M, F.count_feasible(max(order), spec.M),
                                              time_budget_s=time_budget_s) != "exhaustive")
        policy_bound_n = min(max(order), 12) if needs else 0
    policy_ns = (_policy_levels(spec, policy_bound_n, max(order), max_gap=max_gap, time_budget_s=time_budget_s)
                 if policy_bound_n and policy_bound_n > 0 else ())
    # a local pool's workers solve the all-policy bound themselves (the same table in each: the result does
    # not depend on who solved it), so that its kernels compile beside the chain's, not before the pool
    local_pool = executor is None and workers > 1 and len(order) > 1
    if policy_ns and not local_pool:
        policies = _policy_table(spec, policy_ns, kw.get("round_to_grid", False))
    common = dict(search=search, max_gap=max_gap, time_budget_s=time_budget_s, max_evaluations=max_evaluations,
                  policies=policies, prove=prove, **kw)
    if (executor is not None or workers > 1) and len(order) > 1:
        # one chain of N per worker (every workers-th N, each started near its own previous B*): the
        # per-N searches are sequential inside, so whole N values are what a pool shares out well
        from tr_core.parallel import map_tasks

        w = len(order) if executor is not None else min(int(workers), len(order))
        lazy = policy_ns if local_pool else ()
        with _Relay(on_result if executor is None else None) as relay:
            parts = [(spec, order[i::w], common, relay.queue is not None, i, lazy) for i in range(w)]
            for res in map_tasks(_sweep_chain, parts, workers=w, executor=executor, progress=progress,
                                 initializer=_set_relay, initargs=(relay.queue,)):
                for o in res:
                    out[o.N] = o
                    if on_result is not None and executor is not None:
                        on_result(o)
        return [out[N] for N in Ns]
    from optimizer.branch import BoxMemory

    memory = BoxMemory()
    for k, N in enumerate(order):
        o = optimize_thresholds(spec, N, start=prev, workers=workers, executor=executor, box_memory=memory,
                                **common)
        prev = o.best_B
        out[N] = o
        if on_result is not None:
            on_result(o)
        if progress:
            progress(k + 1, len(order))
    return [out[N] for N in Ns]


def _proved(spec: SystemSpec, opt: Optimum, prove: bool, kw: dict) -> Optimum:
    """:func:`optimizer.optimum.tighten_rivals` on an exhaustive sweep's result (in this process: the
    rivals are few, usually none)."""
    return tighten_rivals(spec, opt, **kw) if prove else opt


# above this N (two models) the scaled bound of n = 12 leaves about 2 % at N = 256, and a second level of
# the all-policy table is solved: n = 64 leaves 0.8 % (476,385 states, about 8 s on one core; n = 96 would
# leave 0.7 % for 22 s).  Measured on R2R (p = 0.35, L = 6.0 / 27.9 ms), experiments/LOG.md "search".
# A bound that leaves 0.8 % prunes nothing in a search asked for a smaller gap, and the box pass certifies
# such a search without it: the level is solved only from SERVER_POLICY_GAP up, or for a search with a time
# budget (which may stop with vectors left to the table's bound).
SERVER_POLICY_FROM_N = 128
SERVER_POLICY_N = 64
SERVER_POLICY_GAP = 0.005


def _policy_levels(spec: SystemSpec, n: int, largest: int, *, max_gap: float = SERVER_POLICY_GAP,
                   time_budget_s: float | None = None) -> tuple[int, ...]:
    """The concurrencies at which the all-policy table is solved for a sweep up to ``largest``: ``n``,
    and :data:`SERVER_POLICY_N` for a two-model sweep past :data:`SERVER_POLICY_FROM_N` whose bound scales,
    asked for a gap of at least :data:`SERVER_POLICY_GAP` or with a time budget."""
    from optimizer.bounds import scaling_valid

    ns = [int(n)]
    if (spec.M == 2 and int(largest) > SERVER_POLICY_FROM_N and SERVER_POLICY_N > n
            and (max_gap >= SERVER_POLICY_GAP or time_budget_s is not None)
            and scaling_valid(spec, int(largest))):
        ns.append(SERVER_POLICY_N)
    return tuple(ns)


def _policy_table(spec: SystemSpec, ns, round_to_grid: bool):
    from optimizer.bounds import PolicyBounds
    ns = (int(ns),) if isinstance(ns, (int, np.integer)) else tuple(ns)
    # the server level's process has about 480,000 states (R2R, n = 64): more than the default limit
    return PolicyBounds(spec, round_to_grid=round_to_grid).compute(ns, max_states=1_000_000 if len(ns) > 1 else 400_000)


def _uses_policies(spec: SystemSpec, N: int, common: dict) -> bool:
    """Whether the search at N reads the all-policy table (every search but an exhaustive one)."""
    search = common["search"]
    if search == "auto":
        search = resolve_auto(spec.M, F.count_feasible(N, spec.M), time_budget_s=common.get("time_budget_s"))
    return search != "exhaustive"


def _sweep_chain(payload) -> list[Optimum]:
    """Worker task of :func:`optimize_sweep`: the given N in increasing order, each started near the
    previous one's B* scaled to it (which only orders the work).

    ``policy_n`` (concurrencies, empty for none): this worker solves the all-policy table at them itself, before the first
    N that reads it.  On a first run every kernel compiles, in each worker that calls it first, so the
    workers share that out (the first run of the default sweep): worker 0 starts with the chain's
    kernels (its first N), worker 1 with the all-policy table's and the box bound's
    (:func:`optimizer.branch.warm_box_kernels`), and each then loads the other's from numba's cache.
    """
    spec, Ns, common, relayed, role, policy_n = payload
    queue = _WORKER_RELAY if relayed else None
    rtg = common.get("round_to_grid", False)
    if policy_n and role == 1:
        common = dict(common, policies=_policy_table(spec, policy_n, rtg))
        from optimizer.branch import warm_box_kernels
        from optimizer.mean_field import mean_field_thresholds
        warm_box_kernels(spec, rtg)
        try:
            mean_field_thresholds(spec, 4, round_to_grid=rtg)  # the bounded searches' guide: its kernel too
        except SpecError:
            pass  # a system the guide cannot model: the searches start elsewhere, nothing to compile
    res: list[Optimum] = []
    prev = None
    last = None
    from optimizer.branch import BoxMemory

    memory = BoxMemory()
    for N in Ns:
        if policy_n and common.get("policies") is None and _uses_policies(spec, N, common):
            common = dict(common, policies=_policy_table(spec, policy_n, rtg))
        start = None if prev is None else tuple(max(1, round(b * N / last)) for b in prev)
        o = optimize_thresholds(spec, N, start=start, workers=1, box_memory=memory, **common)
        prev, last = o.best_B, N
        res.append(o)
        if queue is not None:
            queue.put(o)
    return res


_WORKER_RELAY = None  # in a sweep's worker process: the queue its finished N go on (set by _set_relay)


def _set_relay(queue) -> None:
    """Pool initializer of a sweep's workers: the relay queue, handed over at the process's start."""
    global _WORKER_RELAY
    _WORKER_RELAY = queue


class _Relay:
    """A queue the sweep's worker processes put each finished N on, and a thread that hands every one to
    ``on_result`` in this process (nothing when ``on_result`` is None)."""

    def __init__(self, on_result):
        self.on_result = on_result
        self.queue = None
        self._thread = None

    def __enter__(self):
        if self.on_result is None:
            return self
        import multiprocessing as mp
        import threading

        # a plain queue handed to the workers at their start (no manager process: one more child that a
        # Ctrl-C could reach while it imports)
        self.queue = mp.get_context("spawn").Queue()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()
        return self

    def _drain(self):
        while True:
            try:
                o = self.queue.get()
            except (EOFError, OSError):
                return
            if o is None:
                break
            self.on_result(o)
        # a worker's put goes through its feeder thread and may trail the task's result by a moment
        import queue as _q
        while True:
            try:
                o = self.queue.get(timeout=0.2)
            except (_q.Empty, EOFError, OSError):
                return
            if o is not None:
                self.on_result(o)

    def __exit__(self, *exc):
        if self.queue is None:
            return False
        try:
            self.queue.put(None)
            self._thread.join(timeout=30)
        except Exception:  # an interrupt broke the queue: the sweep's own error stands
            pass
        finally:
            self.queue.close()
            self.queue.cancel_join_thread()  # never wait on a feeder an interrupt left behind
        return False


def optimize_local(spec: SystemSpec, N: int, *, start: Sequence[int] | None = None, workers: int = 1,
                   executor=None, progress=None, policies=None, **kw) -> Optimum:
    """B* by steepest ascent over the +-1 neighbours of a start vector (a heuristic, off by default).

    Not guaranteed to find the global argmax: throughput need not be unimodal
    over the feasible set.  It evaluates far fewer chains (typically
    O(M * N) rather than O(N^M)); ``benchmarks/bench_dtmc.py local`` checks it
    against the exhaustive search.  The result's ``evaluated`` counts the
    chains it solved; ``table`` lists them; ``upper_bound_tok_s`` is the
    proven no-wait bound, so ``gap`` says how far from certain it is.
    """
    from optimizer.bounds import Bounder, gap as rel_gap

    t0 = time.perf_counter()
    N = int(N)
    M = spec.M
    eager = (1,) * M
    cur = tuple(int(b) for b in start) if start is not None else eager
    if len(cur) != M or not F.is_feasible(cur, N):
        cur = eager
    seen: dict[tuple[int, ...], Evaluation] = {}

    def run(cands):
        todo = [c for c in dict.fromkeys(cands) if c not in seen]
        if todo:
            for e in evaluate_many(spec, [(N, c) for c in todo], workers=workers, executor=executor, **kw):
                seen[e.B] = e

    run([cur, eager])
    while True:
        nbrs = []
        for i in range(M):
            for step in (-1, 1):
                b = list(cur)
                b[i] += step
                if F.is_feasible(b, N):
                    nbrs.append(tuple(b))
        run(nbrs)
        best = pick_best([seen[c] for c in [cur] + nbrs])
        if progress:
            progress(len(seen), len(seen))
        if best.B == cur:
            break
        cur = best.B
    evals = sorted(seen.values(), key=lambda e: e.B)
    top = pick_best(evals).throughput_tok_s
    bound = Bounder(spec, N, round_to_grid=kw.get("round_to_grid", False), policies=policies).global_bound
    ub = max(top, bound.value_tok_s)
    return _optimum(N, evals, time.perf_counter() - t0, certificate="local", upper_bound_tok_s=ub,
                    gap=rel_gap(ub, top), unresolved=F.count_feasible(N, M) - len(evals))
