"""Power model for energy per request meeting its SLO.

Each GPU draws ``idle_w`` while its instance runs no iteration.  During an
iteration of length ``t`` it draws::

    P = mem_bound_w + (max_w - mem_bound_w) * u,    u = min(1, t_compute / t)

where ``t_compute`` is the arithmetic part of the iteration under the latency
model (roofline: GEMM, attention and LM-head FLOPs divided by the effective
FLOP/s; fitted model: the prefill-token and attention-pair terms).  A
memory-bound decode iteration therefore draws about ``mem_bound_w`` and a
compute-bound prefill chunk about ``max_w``.  Energy over the measurement
window is summed over every GPU of every instance (a tensor-parallel instance
of ``tp`` GPUs counts ``tp`` times, dedicated shadow instances included)::

    E = sum_instances tp * (idle_w * W + sum_iterations overlap * (P - idle_w))

and divided by the number of requests (normal and routed calls arriving in the
window) that met both SLOs.  Defaults are round figures for an H100/H200 SXM
(700 W board limit; about 80-100 W idle; memory-bound serving around half the
limit); they are modelling assumptions, not measurements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shadow_prefill.errors import ShadowError

__all__ = ["PowerModel", "POWER_PRESETS", "power_preset"]


@dataclass(frozen=True)
class PowerModel:
    """Per-GPU power (W): idle, memory-bound iteration, compute-bound iteration."""

    idle_w: float = 90.0
    mem_bound_w: float = 380.0
    max_w: float = 700.0

    def __post_init__(self):
        for k in ("idle_w", "mem_bound_w", "max_w"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ShadowError(f"power model: {k} must be a number >= 0 W, got {v!r}")
        if not (self.idle_w <= self.mem_bound_w <= self.max_w):
            raise ShadowError("power model: need idle_w <= mem_bound_w <= max_w")


POWER_PRESETS = {"h100": PowerModel(90.0, 380.0, 700.0), "h200": PowerModel(100.0, 400.0, 700.0)}


def power_preset(gpu_name: str) -> PowerModel:
    key = gpu_name.lower()
    for k, v in POWER_PRESETS.items():
        if k in key:
            return v
    return PowerModel()
