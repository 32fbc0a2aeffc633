"""Profiler: measure step latencies L_i(b) and routing matrices P, C of a routed LLM system.

``import profiler`` loads neither torch nor transformers nor numba: the
submodules that need them import them on first use.
"""

from __future__ import annotations

from tr_core.version import __version__

__all__ = ["__version__"]
