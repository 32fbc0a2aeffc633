"""Running many independent tasks serially, on a local process pool, or on any executor.

One helper for every sweep in the project (threshold searches, cluster-simulator grids).
``executor`` may be any object with a ``concurrent.futures``-style ``submit``: a
``ProcessPoolExecutor``, or a Dask ``distributed.Client`` for a cluster.  Results
always come back in task order, so they do not depend on the parallelism.
"""

from __future__ import annotations

from typing import Callable, Sequence


def as_completed(executor, futures):
    """Iterate over ``futures`` as they finish, for concurrent.futures or Dask futures."""
    try:
        from distributed import Client
        from distributed import as_completed as dask_as_completed
        if isinstance(executor, Client):
            return dask_as_completed(futures)
    except ImportError:
        pass
    import concurrent.futures as cf
    return cf.as_completed(futures)


def map_tasks(fn: Callable, payloads: Sequence, *, workers: int = 1, executor=None,
              progress: Callable[[int, int], None] | None = None,
              order: Sequence[int] | None = None) -> list:
    """``[fn(p) for p in payloads]``, serially, on ``executor``, or on a pool of ``workers`` spawned processes.

    ``order``: the submission order (e.g. biggest tasks first so a pool ends
    evenly loaded); the result list is in payload order regardless.
    ``progress(done, total)`` is called after each task.
    """
    total = len(payloads)
    out: list = [None] * total
    if executor is None and (workers <= 1 or total < 2):
        for k, p in enumerate(payloads):
            out[k] = fn(p)
            if progress:
                progress(k + 1, total)
        return out
    own = None
    if executor is None:
        import concurrent.futures as cf
        import multiprocessing as mp
        own = executor = cf.ProcessPoolExecutor(max_workers=min(workers, total), mp_context=mp.get_context("spawn"))
    try:
        seq = range(total) if order is None else order
        futs = {executor.submit(fn, payloads[k]): k for k in seq}
        done = 0
        for fut in as_completed(executor, list(futs)):
            out[futs[fut]] = fut.result()
            done += 1
            if progress:
                progress(done, total)
    finally:
        if own is not None:
            own.shutdown(wait=True, cancel_futures=True)
    return out
