"""ShadowPrefill cluster simulator: ``tr-shadow simulate`` / ``tr-shadow compare``.

* :mod:`shadow_prefill.cluster.sim`: :class:`ClusterConfig`, :class:`Scenario`, :func:`simulate_cluster` ->
  :class:`RunResult`, :func:`calibrate_capacity` (the model is documented there and in ``docs/shadow_cluster.md``);
* :mod:`shadow_prefill.cluster.policies`: the ten approaches of the paper's Table 2;
* :mod:`shadow_prefill.cluster.workload`: normal traffic (Azure trace format, synthetic sizes, windows), session
  scheduling and the next-model prior;
* :mod:`shadow_prefill.cluster.metrics`: every approach against No Shadow, mean +- 1 SE over seeds x windows;
* :mod:`shadow_prefill.cluster.sweep`: grids and sweeps on a process pool, any executor or a Dask client;
* :mod:`shadow_prefill.cluster.power`: the power model behind energy per request meeting its SLO;
* :mod:`shadow_prefill.cluster.experiments`: the findings of the paper, reproduced in direction (notebook 04).
"""

from shadow_prefill.cluster.metrics import compare_runs, reduction_by_context, summarize_comparison
from shadow_prefill.cluster.policies import APPROACH_NAMES, APPROACHES, Policy, get_policy
from shadow_prefill.cluster.power import PowerModel
from shadow_prefill.cluster.sim import ClusterConfig, RunResult, Scenario, calibrate_capacity, simulate_cluster
from shadow_prefill.cluster.sweep import run_grid, sweep, sweep_models_per_router
from shadow_prefill.cluster.workload import (RequestSizes, mixed_synthetic_sessions, read_azure_trace,
                                             synthetic_request_sizes)

__all__ = ["APPROACHES", "APPROACH_NAMES", "ClusterConfig", "Policy", "PowerModel", "RequestSizes", "RunResult",
           "Scenario", "calibrate_capacity", "compare_runs", "get_policy", "mixed_synthetic_sessions",
           "read_azure_trace", "reduction_by_context", "run_grid", "simulate_cluster", "summarize_comparison",
           "sweep", "sweep_models_per_router", "synthetic_request_sizes"]
