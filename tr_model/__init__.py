"""tr_model: predict and optimize the throughput of token-level routed LLM serving.

Quick start::

    import tr_model
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    best = tr_model.optimize(spec, N=8)          # B*, tokens/s, gain over eager
    ev = tr_model.evaluate(spec, N=8, B=(1, 5))  # one threshold vector

This package is the face of the project (the top layer: nothing below imports it).  Its rooms, by role:

- the public API and the command lines (this folder): ``api`` (``evaluate``, ``optimize``, ``optimize_many``:
  the optimizer's own, re-exported with their signatures; the search options checked once by
  ``tr_core.search_options.SearchOptions``), ``cli`` (``tr-optimize``), ``autotune_cli`` (``tr-autotune``),
  ``plan`` and ``plan_cli`` (the deployment planner, ``tr-plan``), ``plots`` and ``sensitivity`` (figures and
  parameter sweeps).  They may import every room below;
- ``tuning``: the thresholds a server runs with: ``autotune`` (the server-start hook, the table computation and
  the one writer of thresholds files), ``launch_policy``, ``export`` (R2R launch arguments), ``kvplan``; the
  thresholds format's reader is ``thresholds``, kept at this stable path because runtimes vendor the file
  (standard library only, no project imports, on purpose);
- ``serving``: the HTTP server (``serving.server``) around the reference asyncio runtime ``serving.runtime`` (delayed
  batching and its executors).  It looks thresholds up with the reader and never imports tuning, the API or the
  command lines.

``tests/test_api_rooms.py`` keeps the rooms' imports pointing down.
Below it: the features (``dtmc``, ``optimizer``, ``simulator``, ``profiler``, ``shadow_prefill``) and the
foundation ``tr_core`` (specs, errors, file IO, the task runner, the feasibility rule, CLI plumbing, the
version); ``tests/test_import_layers.py`` keeps every import pointing down.
"""

from tr_core.errors import SpecError, StateSpaceTooLarge, TRError
from tr_core.spec import (PRESETS, CorunLatency, LatencyCurve, SystemSpec, load_spec, make_spec, preset,
                           save_spec, spec_from_dict, spec_to_dict)

from tr_core.version import __version__

__all__ = ["SystemSpec", "LatencyCurve", "CorunLatency", "make_spec", "preset", "PRESETS", "load_spec", "save_spec",
           "spec_from_dict", "spec_to_dict", "evaluate", "optimize", "optimize_many", "TRError", "SpecError",
           "StateSpaceTooLarge", "__version__", "plan"]


def __getattr__(name):
    # loaded lazily: optimizer/ imports tr_core.spec, so an eager import here would be circular
    if name in ("evaluate", "optimize", "optimize_many"):
        from tr_model import api
        return getattr(api, name)
    if name == "plan":  # the deployment planner: the module tr_model.plan, callable as tr_model.plan.plan
        import importlib
        return importlib.import_module("tr_model.plan")
    raise AttributeError(f"module 'tr_model' has no attribute {name!r}")
