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
from tr_core.errors import TRError

__all__ = ["evaluate", "optimize", "optimize_many", "Evaluation", "Optimum"]


def _default(fn, name: str):
    import inspect
    p = inspect.signature(fn).parameters.get(name)
    return None if p is None or p.default is inspect.Parameter.empty else p.default


# keyword -> the searches that use it (any other search would drop it silently: refused instead)
# (max_gap's rule is SearchOptions': tr_core.search_options)
_SEARCH_ONLY = {"time_budget_s": ("pruned", "certified", "auto"),
                "candidates": ("exhaustive", "pruned", "certified", "auto"), "boxes": ("pruned", "certified", "auto"),
                "policies": ("pruned", "certified", "local", "auto"), "policy_bound_n": ("pruned", "certified", "local", "auto")}


def _refuse_conflicts(name: str, kwargs: dict, default_search) -> None:
    """The search options among the keywords are checked once, by :class:`tr_core.search_options.SearchOptions`
    (``max_gap`` with a search that takes none refused); other keywords the call would silently drop are refused,
    naming the keyword (the CLI refuses its flags)."""
    from tr_core.errors import SpecError
    from tr_core.search_options import SEARCH_FIELDS, SearchOptions
    given = {k: kwargs[k] for k in SEARCH_FIELDS if k in kwargs and k != "search"}
    if default_search is not None:
        given["search"] = kwargs.get("search", default_search)
    if given:
        SearchOptions(**given)
    if default_search is not None:
        search = kwargs.get("search", default_search)
        for key, searches in _SEARCH_ONLY.items():
            if key in kwargs and isinstance(search, str) and search not in searches:
                raise SpecError(f"{name}(): {key} applies to search = {' or '.join(map(repr, searches))}, "
                                f"not {search!r}; drop it or change search")
    if kwargs.get("executor") is not None and kwargs.get("workers", 1) not in (None, 1):
        raise SpecError(f"{name}(): give workers or executor, not both (the executor runs every evaluation)")


def _public(target, name: str, summary: str):
    """``target`` under a public name: same signature (``__wrapped__``), a one-line summary first."""

    default_search = _default(target, "search")

    @functools.wraps(target)
    def forward(*args, **kwargs):
        _refuse_conflicts(name, kwargs, default_search)
        return target(*args, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    forward.__module__ = __name__
    forward.__doc__ = f"{summary}\n\nSame arguments as :func:`{target.__module__}.{target.__name__}`:\n\n" \
                      f"{target.__doc__ or ''}"
    return forward


evaluate = _public(evaluate_thresholds, "evaluate", "Predicted throughput, queue metrics and accuracy of "
                   "thresholds ``B`` at concurrency ``N``.")
# the eager baseline of a search that never solved the eager chain (at large N the largest chain of all, and
# rejected by a bound): a simulation of it, reported as such with its 95 % interval.  2,000,000 request-steps
# take about 0.3 s at N = 256 and give an interval of about 0.1 %.
EAGER_SIMULATION_STEPS = 2_000_000


def eager_estimate(spec, N: int) -> tuple[float, float]:
    """The eager baseline ``(tokens/s, 95 % half-width)`` at N by simulation (seeded: reproducible)."""
    import simulator

    r = simulator.simulate(spec, int(N), (1,) * spec.M, steps=EAGER_SIMULATION_STEPS, seed=0)
    return float(r.throughput_tok_s), float(r.throughput_ci95_tok_s)


def _with_eager(spec, opt):
    from optimizer.optimum import with_eager_estimate

    if opt.eager is not None or opt.eager_method != "none":
        return opt
    try:
        thr, ci = eager_estimate(spec, opt.N)
    except TRError:
        return opt       # a system the simulator does not model: the baseline stays unknown (null)
    return with_eager_estimate(opt, thr, ci, "simulated")


def _search_public(target, name: str, summary: str, many: bool):
    """:func:`_public` for the searches: an eager baseline the search did not solve is simulated."""
    inner = _public(target, name, summary)

    @functools.wraps(inner)
    def forward(spec, *args, **kwargs):
        if kwargs.get("eager", True) is False:
            return inner(spec, *args, **kwargs)
        if not many:
            return _with_eager(spec, inner(spec, *args, **kwargs))
        done: dict = {}     # N -> the filled result: a sweep's row is reported once and returned once

        def fill(o):
            if o.N not in done:
                done[o.N] = _with_eager(spec, o)
            return done[o.N]

        cb = kwargs.get("on_result")
        if cb is not None:
            kwargs["on_result"] = lambda o: cb(fill(o))
        return [fill(o) for o in inner(spec, *args, **kwargs)]

    return forward


optimize = _search_public(optimize_thresholds, "optimize", "B* at concurrency ``N`` by search, with the eager "
                          "baseline and the full table.", many=False)
optimize_many = _search_public(optimize_sweep, "optimize_many", "B* for every N in ``Ns`` (one pool for the whole "
                               "sweep).", many=True)
