"""Serving: the reference runtime behind an OpenAI-compatible HTTP API.

- ``server``: the HTTP server (``tr-autotune serve``): Starlette on uvicorn in the runtime's own event loop, the
  request limits, graceful shutdown;
- ``runtime``: the runtime itself (one subserver per model, delayed batching, its executors: emulated steps, or
  torch on a GPU); it never imports the server.

May import: the standard library, ``tr_core``, ``tr_model.serving.runtime`` and the thresholds reader
``tr_model.thresholds`` (a server looks thresholds up, it never computes them), and lazily, only when the
object that needs them is made, two pieces of the features: the emulated executor made with
``corun_latency_ms`` imports ``dtmc._kernels.corun_at_launch`` (the launch law's tie rule, its Python body), so an
executor without that law never imports ``dtmc`` or numba, and the trace router reads its routing trace with
``simulator.traces``; never the public API module, the command lines or ``tr_model.tuning``
(``tests/test_api_rooms.py``).
"""
