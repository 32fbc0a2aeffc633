"""Serving: the reference runtime behind an OpenAI-compatible HTTP API.

- ``server``: the HTTP server (``tr-autotune serve``): Starlette on uvicorn in the runtime's own event loop, the
  request limits, graceful shutdown;
- the runtime itself (one subserver per model, delayed batching, its executors) is ``tr_model.runtime``, part of
  this room (it moves under ``tr_model/serving/`` once its executors module is free to move).

May import: the standard library, ``tr_core``, ``tr_model.runtime`` and the thresholds reader
``tr_model.thresholds`` (a server looks thresholds up, it never computes them); never the public API module, the
command lines or ``tr_model.tuning`` (``tests/test_api_rooms.py``).
"""
