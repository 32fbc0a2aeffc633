"""Grids of simulations (approaches x seeds x windows x one swept parameter), serially or in parallel.

Parallelism follows the project's executor convention: ``executor=`` takes
any object with a ``concurrent.futures``-style ``submit`` (a
``ProcessPoolExecutor``, a ``dask.distributed.Client``...); otherwise
``workers > 1`` starts a local spawn-based process pool.  Results come back
in task order whatever the parallelism.  Capacities are calibrated once in
the caller and shipped with every task, so workers only simulate.

Swept parameters (:data:`SWEEP_PARAMS`): ``rho`` (normal-traffic load),
``slo_scale`` (SLO strictness, provisioning fixed at the default SLOs as in
the paper), ``shadow_kv_cap``, ``cold_age_s``, ``session_rate``,
``host_gb_per_gpu``, ``beta``, ``delta`` (the approaches' credit rate),
``chunk_tokens``, ``n_min``, ``margin``, ``credit_gate`` (Harvest-SLO's gate on the routed-step credit);
models per router is
:func:`sweep_models_per_router` (it changes the workload and the cluster);
context length is a breakdown of one grid
(:func:`shadow_prefill.cluster.metrics.reduction_by_context`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

import pandas as pd

from shadow_prefill.builder import SyntheticParams, generate_synthetic_sessions
from shadow_prefill.cluster.metrics import compare_runs, summarize_comparison
from shadow_prefill.cluster.policies import APPROACH_NAMES, Policy, get_policy
from shadow_prefill.cluster.sim import (ClusterConfig, RunResult, Scenario, build_latency_models,
                                        calibrate_capacity, simulate_cluster)
from shadow_prefill.cluster.workload import RequestSizes, synthetic_request_sizes
from shadow_prefill.errors import ShadowError
from shadow_prefill.sessions import SessionSet

__all__ = ["run_grid", "sweep", "sweep_models_per_router", "calibrated_capacities", "map_tasks", "SWEEP_PARAMS",
           "DEFAULT_WINDOW_NAMES"]

DEFAULT_WINDOW_NAMES = ("peak", "median", "trough")
_SCENARIO_PARAMS = ("rho", "session_rate")
_CONFIG_PARAMS = ("slo_scale", "shadow_kv_cap", "cold_age_s", "host_gb_per_gpu", "beta", "chunk_tokens", "n_min",
                  "margin", "credit_gate")
SWEEP_PARAMS = _SCENARIO_PARAMS + _CONFIG_PARAMS + ("delta",)


def _run_task(payload) -> RunResult:
    sessions, config, policy, scenario, sizes, capacity = payload
    return simulate_cluster(sessions, config, policy, scenario, sizes, capacity)


def map_tasks(fn: Callable, payloads: Sequence, *, workers: int = 1, executor=None,
              progress: Callable[[int, int], None] | None = None) -> list:
    """``[fn(p) for p in payloads]`` serially, on ``executor`` or on a local pool of ``workers`` processes."""
    from tr_core.parallel import map_tasks as _map_tasks

    if not isinstance(workers, int) or workers < 1:
        raise ShadowError(f"workers must be an integer >= 1, got {workers!r}")
    return _map_tasks(fn, payloads, workers=workers, executor=executor, progress=progress)


def calibrated_capacities(config: ClusterConfig, sizes: RequestSizes) -> tuple[float, ...]:
    """Per-instance capacity (req/s) of every model of the cluster (see :func:`calibrate_capacity`)."""
    from shadow_prefill.cluster.sim import _instance_arrays
    lms = build_latency_models(config)
    caps = _instance_arrays(config, lms, False)[1]
    out = []
    for j, lm in enumerate(lms):
        kv = int(caps[j * config.instances, 0])
        out.append(calibrate_capacity(lm, config, sizes.clipped(kv), kv_capacity_tokens=kv))
    return tuple(out)


def run_grid(sessions: SessionSet, config: ClusterConfig = ClusterConfig(),
             approaches: Sequence[str | Policy] = APPROACH_NAMES, seeds: Sequence[int] = (0, 1, 2),
             windows: Sequence[str | float] = DEFAULT_WINDOW_NAMES, scenario: Scenario = Scenario(),
             sizes: RequestSizes | None = None, capacity: Sequence[float] | None = None, *, workers: int = 1,
             executor=None, progress: Callable[[int, int], None] | None = None) -> list[RunResult]:
    """Every approach on every (seed, window) of ``scenario``; No Shadow is added when missing."""
    pols = [get_policy(a) for a in approaches]
    if not any(p.name == "No Shadow" for p in pols):
        pols.insert(0, get_policy("No Shadow"))
    if not seeds or not windows:
        raise ShadowError("need at least one seed and one window")
    config.check(sessions.n_models)
    sizes = sizes if sizes is not None else synthetic_request_sizes()
    if capacity is None:
        capacity = calibrated_capacities(config, sizes)
    payloads = [(sessions, config, p, replace(scenario, seed=int(s), window=w), sizes, tuple(capacity))
                for s in seeds for w in windows for p in pols]
    return map_tasks(_run_task, payloads, workers=workers, executor=executor, progress=progress)


def sweep(sessions: SessionSet, param: str, values: Sequence, config: ClusterConfig = ClusterConfig(),
          approaches: Sequence[str | Policy] = ("Harvest-SLO", "Harvest-SLO+Host", "Oracle+Host"),
          seeds: Sequence[int] = (0, 1, 2), windows: Sequence[str | float] = DEFAULT_WINDOW_NAMES,
          scenario: Scenario = Scenario(), sizes: RequestSizes | None = None,
          capacity: Sequence[float] | None = None, *, workers: int = 1, executor=None,
          progress=None) -> pd.DataFrame:
    """Comparison metrics (mean, SE) per approach and value of one parameter (:data:`SWEEP_PARAMS`).

    Capacity stays calibrated at ``config`` (provisioning fixed) for every value.
    """
    if param not in SWEEP_PARAMS:
        raise ShadowError(f"cannot sweep {param!r}; sweepable: {', '.join(SWEEP_PARAMS)}")
    if not values:
        raise ShadowError("a sweep needs at least one value")
    sizes = sizes if sizes is not None else synthetic_request_sizes()
    config.check(sessions.n_models)
    if capacity is None:
        capacity = calibrated_capacities(config, sizes)
    pols = [get_policy(a) for a in approaches]
    if not any(p.name == "No Shadow" for p in pols):
        pols.insert(0, get_policy("No Shadow"))
    payloads, tags = [], []
    for v in values:
        cfg, sc, ps = config, scenario, pols
        if param in _SCENARIO_PARAMS:
            sc = replace(scenario, **{param: float(v)})
        elif param in _CONFIG_PARAMS:
            vv = int(v) if param in ("chunk_tokens", "n_min") else float(v)
            cfg = replace(config, **{param: vv})
            cfg.check(sessions.n_models)
        else:  # delta: the shadow approaches' credit rate
            ps = [p if p.shadow == "none" else replace(p, delta=float(v)) for p in pols]
        for s in seeds:
            for w in windows:
                for p in ps:
                    payloads.append((sessions, cfg, p, replace(sc, seed=int(s), window=w), sizes, tuple(capacity)))
                    tags.append(v)
    runs = map_tasks(_run_task, payloads, workers=workers, executor=executor, progress=progress)
    frames = []
    for v in values:
        sub = [r for r, t in zip(runs, tags) if t == v]
        df = summarize_comparison(compare_runs(sub))
        df.insert(0, "value", v)
        df.insert(0, "param", param)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def sweep_models_per_router(n_models: Sequence[int] = (2, 3, 4, 5),
                            candidates: Sequence[str] = ("qwen2.5-7b", "llama-3.1-70b", "llama-3.1-8b",
                                                         "mistral-nemo-12b", "mixtral-8x7b"),
                            synthetic: SyntheticParams = SyntheticParams(n_sessions=300),
                            config: ClusterConfig = ClusterConfig(), seeds: Sequence[int] = (0, 1, 2),
                            windows: Sequence[str | float] = DEFAULT_WINDOW_NAMES, scenario: Scenario = Scenario(),
                            sizes: RequestSizes | None = None, *, workers: int = 1, executor=None,
                            progress=None) -> pd.DataFrame:
    """Harvest-SLO+Host shadowing all other models vs the top-1 next model, and Oracle+Host, for N models.

    The synthetic workload routes over the first N ``candidates`` (switching
    to a uniformly drawn other model with ``synthetic.switch_prob``); each N is
    compared with its own No Shadow.
    """
    sizes = sizes if sizes is not None else synthetic_request_sizes()
    hs = get_policy("Harvest-SLO+Host")
    frames = []
    for n in n_models:
        if n < 2 or n > len(candidates):
            raise ShadowError(f"models per router must be in [2, {len(candidates)}], got {n}")
        models = tuple(candidates[:n])
        ss = generate_synthetic_sessions(replace(synthetic, models=models))
        cfg = replace(config, models=models, tp=None, kv_capacity_tokens=None, prices=None)
        pols = [get_policy("No Shadow"), hs, hs.with_top1(), get_policy("Oracle+Host")]
        runs = run_grid(ss, cfg, pols, seeds, windows, scenario, sizes, workers=workers, executor=executor,
                        progress=progress)
        df = summarize_comparison(compare_runs(runs))
        df.insert(0, "models_per_router", n)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)
