"""The old path of :mod:`tr_model.tuning.launch_policy` (same module object), kept for scripts outside the package that still
import ``tr_model.launch_policy`` (experiments/, earlier docs); new code imports ``tr_model.tuning.launch_policy``."""

import importlib as _importlib
import sys as _sys

_sys.modules[__name__] = _importlib.import_module("tr_model.tuning.launch_policy")
