"""The public API: evaluate one threshold vector, or find the best one."""

from __future__ import annotations

from typing import Sequence

from optimizer.evaluate import Evaluation, evaluate_thresholds
from optimizer.search import Optimum, optimize_sweep, optimize_thresholds
from tr_core.spec import SystemSpec


def evaluate(spec: SystemSpec, N: int, B: Sequence[int], *, solver: str = "auto", tol: float | None = None,
             max_states: int | None = None, round_to_grid: bool = False, cache=None) -> Evaluation:
    """Predicted throughput (tokens/s), queue metrics and accuracy for thresholds ``B`` at concurrency ``N``.

    ``cache``: folder (or ``optimizer.cache.ResultCache``) of cached results; ``None`` computes afresh.
    """
    return evaluate_thresholds(spec, N, B, solver=solver, tol=tol, max_states=max_states,
                               round_to_grid=round_to_grid, cache=cache)


def optimize(spec: SystemSpec, N: int, *, solver: str = "auto", tol: float | None = None,
             max_states: int | None = None, round_to_grid: bool = False, workers: int = 1,
             executor=None, candidates=None, progress=None, cache=None) -> Optimum:
    """B* at concurrency ``N`` by exhaustive search, with the eager baseline and the full table.

    ``workers`` > 1 evaluates in local processes; ``executor`` (a
    ``concurrent.futures`` executor or a ``dask.distributed.Client``) runs the
    evaluations wherever it runs tasks.  Results do not depend on either.
    """
    return optimize_thresholds(spec, N, solver=solver, tol=tol, max_states=max_states,
                               round_to_grid=round_to_grid, workers=workers, executor=executor,
                               candidates=candidates, progress=progress, cache=cache)


def optimize_many(spec: SystemSpec, Ns: Sequence[int], *, solver: str = "auto", tol: float | None = None,
                  max_states: int | None = None, round_to_grid: bool = False, workers: int = 1,
                  executor=None, progress=None, cache=None, search: str = "exhaustive") -> list[Optimum]:
    """B* for every N in ``Ns`` (one pool for the whole sweep).

    ``search``: ``'exhaustive'`` (the definition of B*, default) or
    ``'local'`` (steepest ascent from the previous N's B*: far fewer chains,
    a heuristic; see ``optimizer.search.optimize_local``).
    """
    return optimize_sweep(spec, Ns, solver=solver, tol=tol, max_states=max_states, round_to_grid=round_to_grid,
                          workers=workers, executor=executor, progress=progress, cache=cache, search=search)
