"""The old path of :mod:`tr_model.serving.server` (same module object), kept for scripts outside the package that still
import ``tr_model.serve`` (experiments/, earlier docs); new code imports ``tr_model.serving.server``."""

import importlib as _importlib
import sys as _sys

_sys.modules[__name__] = _importlib.import_module("tr_model.serving.server")
