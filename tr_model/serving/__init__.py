"""Serving: the reference runtime behind an OpenAI-compatible HTTP API.

- ``server``: the HTTP server (``tr-autotune serve``): Starlette on uvicorn in the runtime's own event loop, the
  request limits, graceful shutdown;
- ``runtime``: the runtime itself (one subserver per model, delayed batching, its executors: emulated steps, or
  torch on a GPU); it never imports the server.

May import: the standard library, ``tr_core``, ``tr_model.serving.runtime`` and the thresholds reader
``tr_model.thresholds`` (a server looks thresholds up, it never computes them); never the public API module, the
command lines or ``tr_model.tuning`` (``tests/test_api_rooms.py``).
"""
