"""Per-request event simulator of delayed batching (see docs/simulator.md).

Independent of the exact chain (``dtmc``): it covers batch-size-dependent
latencies, batch caps, routing by P or by recorded traces (closed loop),
jitter, and reports throughput with a 95% batch-means interval, admission
latency distributions and per-request speed.
"""

from simulator.engine import (CI_BATCHES, DEFAULT_STEPS, LatencySummary, SimulationResult, simulate,
                              validate_thresholds)
from simulator.ranking import (Ranking, RankedCandidate, SimulatedOptimum, feasible_thresholds,
                               optimize_by_simulation, paired_difference, rank_candidates)
from simulator.traces import (RoutingTrace, bimodal_run_length_pmf, generate_trace, read_trace, run_lengths,
                              trace_from_records, write_trace)

__all__ = [
    "CI_BATCHES", "DEFAULT_STEPS", "LatencySummary", "SimulationResult", "simulate", "validate_thresholds",
    "RoutingTrace", "bimodal_run_length_pmf", "generate_trace", "read_trace", "run_lengths",
    "trace_from_records", "write_trace",
    "Ranking", "RankedCandidate", "SimulatedOptimum", "feasible_thresholds", "optimize_by_simulation",
    "paired_difference", "rank_candidates",
]
