"""Per-call routing of agent sessions (ShadowPrefill, seed 002): sessions, the model-switch tax, an iteration
latency model and the shadow-token budget.

* :mod:`shadow_prefill.sessions`, :mod:`shadow_prefill.trace_io`: sessions of LLM calls and the session-trace
  JSONL format (``data/schemas/session-trace.schema.json``);
* :mod:`shadow_prefill.matrix`, :mod:`shadow_prefill.builder`: routing-benchmark matrices, the accuracy-per-cost
  policy, the agent-loop session builder and a synthetic generator;
* :mod:`shadow_prefill.stats`: the switch-tax statistics (``tr-shadow stats``);
* :mod:`shadow_prefill.latency`, :mod:`shadow_prefill.presets`: per-instance iteration latency (roofline from a
  ``config.json`` and a GPU, or fitted to profiles), SLOs, KV sizes;
* :mod:`shadow_prefill.budget`: Algorithm 1 (shadow tokens per iteration) and its credit rule.

See ``docs/shadow_prefill.md``.
"""

from shadow_prefill.budget import (HARVEST, HARVEST_SLO, BudgetDecision, BudgetParams, CreditAccount, Decode,
                                   PrefillChunk, credit_update, decide_shadow_tokens, shadow_budget)
from shadow_prefill.builder import (AgentLoopParams, LengthDist, LogNormal, MatrixWorkload, SyntheticParams,
                                    build_matrix_sessions, generate_synthetic_sessions)
from shadow_prefill.errors import InputFileError, ShadowError
from shadow_prefill.latency import (GPUSpec, LatencyModel, ModelArch, build_roofline, choose_tp, fit_linear_model,
                                    load_gpu, load_model_arch, read_profile_points)
from shadow_prefill.matrix import RoutingMatrix, load_matrix, load_prices, route_accuracy_per_cost
from shadow_prefill.sessions import Call, SessionSet
from shadow_prefill.stats import ReplayParams, compute_issue_times, compute_prefix_hits, compute_switch_tax
from shadow_prefill.trace_io import iter_session_trace, read_session_trace, write_session_trace

__all__ = [
    "AgentLoopParams", "BudgetDecision", "BudgetParams", "Call", "CreditAccount", "Decode", "GPUSpec", "HARVEST",
    "HARVEST_SLO", "InputFileError", "LatencyModel", "LengthDist", "LogNormal", "MatrixWorkload", "ModelArch",
    "PrefillChunk", "ReplayParams", "RoutingMatrix", "SessionSet", "ShadowError", "SyntheticParams",
    "build_matrix_sessions", "build_roofline", "choose_tp", "compute_issue_times", "compute_prefix_hits",
    "compute_switch_tax", "credit_update", "decide_shadow_tokens", "fit_linear_model", "generate_synthetic_sessions",
    "iter_session_trace", "load_gpu", "load_matrix", "load_model_arch", "load_prices", "read_profile_points",
    "read_session_trace", "route_accuracy_per_cost", "shadow_budget", "write_session_trace",
]
