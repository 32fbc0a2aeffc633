"""Reference runtime: asyncio subservers with TokenRouter's three loops and delayed batching.

See :mod:`tr_model.serving.runtime.core` for the design and the measurement rules and
:mod:`tr_model.serving.runtime.executors` for the step executors (emulated, torch).

    from tr_model.serving.runtime import EmulatedExecutor, measure_closed_loop
    ex = EmulatedExecutor(spec.latency_ms)
    res = measure_closed_loop(spec, 8, (1, 5), ex, duration_s=300, warmup_s=3, clock="virtual")
    res.throughput_tok_s        # tokens/s in the spec's time units (exact: virtual clock)
"""

from tr_model.serving.runtime.core import (FixedThresholds, MatrixRouter, Request, RuntimeResult, Subserver,
                                   TokenRouterRuntime, TraceRouter, VirtualTimeLoop, measure_closed_loop,
                                   new_event_loop, run_closed_loop, run_in_new_loop)
from tr_model.serving.runtime.executors import EmulatedExecutor, StepExecutor, torch_executor

__all__ = ["FixedThresholds", "MatrixRouter", "Request", "RuntimeResult", "Subserver", "TokenRouterRuntime",
           "TraceRouter", "VirtualTimeLoop",
           "measure_closed_loop", "run_closed_loop", "new_event_loop", "run_in_new_loop", "EmulatedExecutor",
           "StepExecutor", "torch_executor"]
