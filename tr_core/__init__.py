"""tr_core: the foundation every other package stands on; it imports no feature package.

Layers (every import points down):

- foundation, ``tr_core``: system specs (``spec``), errors, atomic file IO (``fileio``), the task runner
  (``parallel``), the time grid and latency tables (``grid``), unit tables (``units``), the routing-trace
  format (``routing_trace``), shared CLI plumbing (``cli``) and the version (``version``);
- features: ``dtmc`` (a leaf: imports nothing of the project), ``optimizer``, ``simulator``, ``profiler``,
  ``shadow_prefill``;
- face, ``tr_model``: the public API, ``tr-optimize``, auto-tuning, the thresholds file, the runtime, plots.
"""

from tr_core.version import __version__

__all__ = ["__version__"]
