"""tr_model: predict and optimize the throughput of token-level routed LLM serving.

Quick start::

    import tr_model
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    best = tr_model.optimize(spec, N=8)          # B*, tokens/s, gain over eager
    ev = tr_model.evaluate(spec, N=8, B=(1, 5))  # one threshold vector
"""

from tr_core.errors import SpecError, StateSpaceTooLarge, TRError
from tr_core.spec import (PRESETS, LatencyCurve, SystemSpec, load_spec, make_spec, preset, save_spec,
                           spec_from_dict, spec_to_dict)

from tr_core.version import __version__

__all__ = ["SystemSpec", "LatencyCurve", "make_spec", "preset", "PRESETS", "load_spec", "save_spec",
           "spec_from_dict", "spec_to_dict", "evaluate", "optimize", "optimize_many", "TRError", "SpecError",
           "StateSpaceTooLarge", "__version__"]


def __getattr__(name):
    # loaded lazily: optimizer/ imports tr_core.spec, so an eager import here would be circular
    if name in ("evaluate", "optimize", "optimize_many"):
        from tr_model import api
        return getattr(api, name)
    raise AttributeError(f"module 'tr_model' has no attribute {name!r}")
