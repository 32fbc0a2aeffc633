"""Running many independent tasks serially, on a local process pool, or on any executor.

One helper for every sweep in the project (threshold searches, cluster-simulator grids).
``executor`` may be any object with a ``concurrent.futures``-style ``submit``: a
``ProcessPoolExecutor``, or a Dask ``distributed.Client`` for a cluster.  Results
always come back in task order, so they do not depend on the parallelism.
"""

from __future__ import annotations

import concurrent.futures as cf
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
    return cf.as_completed(futures)


def map_tasks(fn: Callable, payloads: Sequence, *, workers: int = 1, executor=None,
              progress: Callable[[int, int], None] | None = None,
              order: Sequence[int] | None = None, initializer: Callable | None = None,
              initargs: tuple = ()) -> list:
    """``[fn(p) for p in payloads]``, serially, on ``executor``, or on a pool of ``workers`` spawned processes.

    ``order``: the submission order (e.g. biggest tasks first so a pool ends
    evenly loaded); the result list is in payload order regardless.
    ``progress(done, total)`` is called after each task.  ``initializer(*initargs)`` runs once in each
    spawned worker (only for the pool made here; e.g. to hand it a ``multiprocessing`` queue, which may
    be passed at a process's start but not with a task).
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
        import multiprocessing as mp
        own = executor = cf.ProcessPoolExecutor(max_workers=min(workers, total), mp_context=mp.get_context("spawn"),
                                          initializer=initializer, initargs=initargs)
    finished = False
    try:
        seq = range(total) if order is None else order
        futs = {}
        spawns = own is not None or isinstance(executor, _LocalPool)
        for k in seq:
            with _workers_ignore_sigint(spawns and _may_spawn(executor)):
                futs[executor.submit(fn, payloads[k])] = k
        done = 0
        for fut in as_completed(executor, list(futs)):
            out[futs[fut]] = fut.result()
            done += 1
            if progress:
                progress(done, total)
        finished = True
    finally:
        if own is not None:
            if finished:
                own.shutdown(wait=True, cancel_futures=True)
            else:
                _stop(own)
    return out


class _LocalPool(cf.ProcessPoolExecutor):
    """A process pool made by :class:`local_pool` (its spawns, like :func:`map_tasks`' own, hide SIGINT)."""


class local_pool:
    """``with local_pool(workers) as pool``: a pool of ``workers`` spawned processes held for a block, for
    :func:`map_tasks` calls (``executor=pool``) that follow one another without starting processes and loading
    kernels each time.  Its workers never see SIGINT (as :func:`map_tasks`' own pools); a block left by an
    exception or an interrupt stops them at once (:func:`_stop`), a block that ends normally waits for them.
    """

    def __init__(self, workers: int):
        self.workers = int(workers)
        self.pool = None

    def __enter__(self):
        import multiprocessing as mp
        self.pool = _LocalPool(max_workers=self.workers, mp_context=mp.get_context("spawn"))
        return self.pool

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        else:
            _stop(self.pool)
        return False


def _may_spawn(executor) -> bool:
    """A submit may start a worker process (the pool is not full yet)."""
    procs = getattr(executor, "_processes", None)
    limit = getattr(executor, "_max_workers", None)
    return procs is None or limit is None or len(procs) < limit


class _workers_ignore_sigint:
    """Spawn pool workers that never see SIGINT, without losing a Ctrl-C meant for the parent.

    Ctrl-C on a terminal reaches the whole process group: a worker still importing the package would print
    a KeyboardInterrupt traceback.  The parent alone reads the interrupt and stops the workers
    (:func:`_stop`).  Where the platform can, SIGINT is *blocked* in the spawning thread for the spawn: the
    mask survives fork and exec, so the worker starts with it blocked (as CPython's own resource tracker
    does), while in the parent a Ctrl-C that lands inside the spawn stays pending and is raised the moment
    the mask is restored (setting SIG_IGN instead would discard it, and the run would go on).  Elsewhere
    SIG_IGN is the fallback (an ignored signal survives exec; a handled one does not); only the main thread
    can set a handler.
    """

    def __init__(self, active: bool):
        import signal
        import threading
        self.mask = active and hasattr(signal, "pthread_sigmask")
        self.active = active and not self.mask and threading.current_thread() is threading.main_thread()
        self.old = None

    def __enter__(self):
        import signal
        if self.mask:
            # the first spawn starts multiprocessing's resource tracker, which unblocks SIGINT in this thread
            # after its own spawn: start it before the mask is set
            from multiprocessing import resource_tracker
            resource_tracker.ensure_running()
            self.old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        elif self.active:
            self.old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        return self

    def __exit__(self, *exc):
        import signal
        if self.mask:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.old)  # a pending Ctrl-C is raised here
        elif self.active:
            signal.signal(signal.SIGINT, self.old)
        return False


def _stop(executor) -> None:
    """An interrupted or failed sweep: cancel what has not started, end the workers now (their results are
    not wanted), without waiting for the running tasks to finish."""
    procs = list((getattr(executor, "_processes", None) or {}).values())  # concurrent.futures keeps no public list
    executor.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        try:
            proc.terminate()
        except (OSError, ValueError, AttributeError):
            pass
    for proc in procs:
        try:
            proc.join(2)
            if proc.is_alive():
                proc.kill()
                proc.join(2)
        except (OSError, ValueError, AttributeError, AssertionError):
            pass
