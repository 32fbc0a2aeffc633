"""The public API: evaluate one threshold vector, or find the best one.

Each function is the optimizer's own, re-exported under the public name (``functools.wraps``): its
signature and keywords are the optimizer's (``inspect.signature(tr_model.optimize)`` shows them), so a
keyword added there is available here without restating it.

- ``evaluate(spec, N, B, *, solver, tol, max_states, round_to_grid, cache)`` -> ``Evaluation``:
  predicted throughput (tokens/s), queue metrics and accuracy of thresholds ``B`` at concurrency ``N``
  (``optimizer.evaluate.evaluate_thresholds``).
- ``optimize(spec, N, *, ..., workers, executor, candidates, progress, cache)`` -> ``Optimum``: B* at
  concurrency ``N`` with the eager baseline and the full table (``optimizer.search.optimize_thresholds``).
- ``optimize_many(spec, Ns, *, ..., search)`` -> ``list[Optimum]``: B* for every N of a sweep, one pool for
  the whole sweep (``optimizer.search.optimize_sweep``).

``cache`` is a folder (or ``optimizer.cache.ResultCache``) of cached results; ``workers`` > 1 evaluates in
local processes and ``executor`` (a ``concurrent.futures`` executor or a ``dask.distributed.Client``) runs
the evaluations wherever it runs tasks; results do not depend on either.
"""

from __future__ import annotations

import functools

from optimizer.evaluate import Evaluation, evaluate_thresholds
from optimizer.search import Optimum, optimize_sweep, optimize_thresholds

__all__ = ["evaluate", "optimize", "optimize_many", "Evaluation", "Optimum"]


def _public(target, name: str, summary: str):
    """``target`` under a public name: same signature (``__wrapped__``), a one-line summary first."""

    @functools.wraps(target)
    def forward(*args, **kwargs):
        return target(*args, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    forward.__module__ = __name__
    forward.__doc__ = f"{summary}\n\nSame arguments as :func:`{target.__module__}.{target.__name__}`:\n\n" \
                      f"{target.__doc__ or ''}"
    return forward


evaluate = _public(evaluate_thresholds, "evaluate", "Predicted throughput, queue metrics and accuracy of "
                   "thresholds ``B`` at concurrency ``N``.")
optimize = _public(optimize_thresholds, "optimize", "B* at concurrency ``N`` by search, with the eager baseline "
                   "and the full table.")
optimize_many = _public(optimize_sweep, "optimize_many", "B* for every N in ``Ns`` (one pool for the whole sweep).")
