"""The old path of :mod:`tr_model.tuning.autotune` (same module object), kept for scripts outside the package that still
import ``tr_model.autotune`` (experiments/, earlier docs); new code imports ``tr_model.tuning.autotune``."""

import importlib as _importlib
import sys as _sys

_sys.modules[__name__] = _importlib.import_module("tr_model.tuning.autotune")
