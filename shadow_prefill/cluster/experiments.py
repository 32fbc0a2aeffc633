"""Ready-made experiments reproducing the direction of ShadowPrefill's simulation findings, and their plots.

Each ``*_experiment`` function builds its workload, runs the grid and
returns a tidy :class:`pandas.DataFrame` (mean and ``_se`` columns, see
:mod:`shadow_prefill.cluster.metrics`); ``fast=True`` shrinks every size so a
notebook runs in seconds (``TR_NOTEBOOK_FAST=1``).  The findings checked:

* the approaches against No Shadow, Oracle bounding every warming scheme
  (:func:`approaches_experiment`);
* the switch-call gain grows with the context length before the switch
  (:func:`context_length_experiment`);
* as normal load grows, Harvest-SLO's gain falls while the host tier's share
  grows (:func:`load_experiment`, long-context sessions that pressure KV);
* shadow waste grows with more models per router, less so for top-1
  (:func:`models_per_router_experiment`);
* the headline figures on the paper-calibrated workload, beside the paper's
  (:func:`paper_headline_experiment`, ``benchmarks/shadow_paper_eval.py`` for every sweep).
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Sequence

import numpy as np
import pandas as pd

from shadow_prefill.builder import AgentLoopParams, LogNormal, SyntheticParams
from shadow_prefill.cluster.metrics import compare_runs, reduction_by_context, summarize_comparison
from shadow_prefill.cluster.policies import APPROACH_NAMES
from shadow_prefill.cluster.sim import ClusterConfig, Scenario
from shadow_prefill.cluster.sweep import run_grid, sweep, sweep_models_per_router
from shadow_prefill.cluster.workload import mixed_synthetic_sessions

__all__ = ["fast_mode", "experiment_scenario", "approaches_experiment", "paper_headline_experiment", "PAPER_HEADLINE", "context_length_experiment",
           "load_experiment", "models_per_router_experiment", "long_context_params", "plot_metric_bars",
           "plot_sweep", "plot_context"]

CAP_DEFAULT = (17.0, 5.5)  # calibrated per-instance capacity of the default pair on H100 (synthetic sizes)


def fast_mode() -> bool:
    """True when ``TR_NOTEBOOK_FAST=1`` asks for tiny sizes."""
    return os.environ.get("TR_NOTEBOOK_FAST", "") not in ("", "0")


def experiment_scenario(fast: bool, **kw) -> tuple[Scenario, tuple[int, ...], tuple[str, ...]]:
    """The paper's timing (120 s warm-up, 600 s measured, 3 seeds x 3 windows), or a tiny one."""
    if fast:
        return Scenario(warmup_s=20.0, measure_s=60.0, drain_s=900.0, **kw), (0,), ("peak",)
    return Scenario(warmup_s=120.0, measure_s=600.0, drain_s=1800.0, **kw), (0, 1, 2), ("peak", "median", "trough")


def long_context_params(n_sessions: int = 300) -> SyntheticParams:
    """Coding-agent-like sessions: a large first prompt (median 24K tokens) and a 128K-token window."""
    loop = AgentLoopParams(tool_tokens=LogNormal(2000.0, 1.0), context_window=131072)
    return SyntheticParams(n_sessions=n_sessions, first_input=LogNormal(24000.0, 0.6), loop=loop)


def approaches_experiment(fast: bool | None = None, approaches: Sequence[str] = APPROACH_NAMES, workers: int = 1,
                          executor=None, capacity=CAP_DEFAULT) -> pd.DataFrame:
    """Every approach against No Shadow on a two-task synthetic workload (mean +- SE)."""
    fast = fast_mode() if fast is None else fast
    sc, seeds, wins = experiment_scenario(fast)
    ss = mixed_synthetic_sessions((0.1, 0.45), n_sessions=80 if fast else 1500, seed=1)
    runs = run_grid(ss, ClusterConfig(), approaches, seeds, wins, sc, capacity=capacity, workers=workers,
                    executor=executor)
    return summarize_comparison(compare_runs(runs))


# Section 5.2 of the paper, routing benchmarks: Harvest-SLO+Host (and the Oracle+Host bound) against No Shadow
PAPER_HEADLINE = {"switch_latency_reduction_pct": 10.4, "call_latency_reduction_pct": 5.0,
                  "switch_ttft_reduction_pct": 44.1, "task_time_reduction_pct": 4.9, "token_cost_reduction_pct": 28.5,
                  "hit_rate_pct": 82.1}
PAPER_ORACLE = {"switch_latency_reduction_pct": 19.3, "call_latency_reduction_pct": 9.6}


def paper_headline_experiment(fast: bool | None = None, workers: int = 1, executor=None,
                              capacity=CAP_DEFAULT) -> pd.DataFrame:
    """Harvest-SLO+Host, Harvest-SLO and Oracle+Host on the ``paper`` preset (cached normal requests), with the
    paper's figure beside each metric (columns ``metric``, ``approach``, ``ours``, ``se``, ``paper``)."""
    from shadow_prefill.builder import generate_synthetic_sessions, workload_preset
    fast = fast_mode() if fast is None else fast
    sc, seeds, wins = experiment_scenario(fast)
    if not fast:
        sc, seeds, wins = replace(sc, warmup_s=60.0, measure_s=300.0), (0, 1), ("peak",)
    ss = generate_synthetic_sessions(workload_preset("paper", n_sessions=60 if fast else 400), name="paper")
    runs = run_grid(ss, ClusterConfig(cache_normal_requests=True),
                    ("No Shadow", "Harvest-SLO", "Harvest-SLO+Host", "Oracle+Host"), seeds, wins, sc,
                    capacity=capacity, workers=workers, executor=executor)
    df = summarize_comparison(compare_runs(runs)).set_index("approach")
    rows = []
    for m in PAPER_HEADLINE:
        for a in ("Harvest-SLO", "Harvest-SLO+Host", "Oracle+Host"):
            paper = PAPER_HEADLINE[m] if a == "Harvest-SLO+Host" else PAPER_ORACLE.get(m) if a == "Oracle+Host" \
                else None
            rows.append({"metric": m, "approach": a, "ours": float(df.loc[a, m]), "se": float(df.loc[a, m + "_se"]),
                         "paper": paper})
    return pd.DataFrame(rows)


def context_length_experiment(fast: bool | None = None, bins: Sequence[float] = (0, 4000, 16000, 32000, 64000),
                              workers: int = 1, executor=None, capacity=CAP_DEFAULT) -> pd.DataFrame:
    """Switch-call latency reduction per prompt-length bin (Harvest-SLO+Host, Oracle+Host)."""
    fast = fast_mode() if fast is None else fast
    sc, seeds, wins = experiment_scenario(fast, session_rate=0.1)
    p = long_context_params(60 if fast else 800)
    p = replace(p, first_input=LogNormal(6000.0, 1.2))  # a wide spread of contexts
    from shadow_prefill.builder import generate_synthetic_sessions
    ss = generate_synthetic_sessions(replace(p, seed=2))
    runs = run_grid(ss, ClusterConfig(), ("No Shadow", "Harvest-SLO+Host", "Oracle+Host"), seeds, wins, sc,
                    capacity=capacity, workers=workers, executor=executor)
    return reduction_by_context(runs, tuple(bins) + (math.inf,))


def load_experiment(fast: bool | None = None, rhos: Sequence[float] = (0.2, 0.5, 0.9, 1.0),
                    workers: int = 1, executor=None, capacity=CAP_DEFAULT) -> pd.DataFrame:
    """LLM-call latency reduction of Harvest-SLO, Harvest-SLO+Host and Oracle+Host versus normal load rho
    (``fast``: the lowest and the highest load only)."""
    fast = fast_mode() if fast is None else fast
    if fast:
        rhos = tuple(sorted({min(rhos), max(rhos)}))
    sc, seeds, wins = experiment_scenario(fast, session_rate=0.05)
    from shadow_prefill.builder import generate_synthetic_sessions
    ss = generate_synthetic_sessions(replace(long_context_params(60 if fast else 800), seed=3))
    return sweep(ss, "rho", list(rhos), ClusterConfig(), ("Harvest-SLO", "Harvest-SLO+Host", "Oracle+Host"), seeds,
                 wins, sc, capacity=capacity, workers=workers, executor=executor)


def models_per_router_experiment(fast: bool | None = None, n_models: Sequence[int] = (2, 3, 4), workers: int = 1,
                                 executor=None) -> pd.DataFrame:
    """Harvest-SLO+Host (all targets, top-1) and Oracle+Host with N models per router (``fast``: the two
    smallest counts only, where the next model of a switch first becomes uncertain)."""
    fast = fast_mode() if fast is None else fast
    if fast:
        n_models = tuple(sorted(set(n_models)))[:2]
    sc, seeds, wins = experiment_scenario(fast)
    syn = SyntheticParams(n_sessions=60 if fast else 800, switch_prob=0.3, seed=4)
    return sweep_models_per_router(n_models, synthetic=syn, seeds=seeds, windows=wins, scenario=sc,
                                   workers=workers, executor=executor)


# ============================================================================ plots

def _bar_errors(ax, x, y, e, labels, color=None):
    ax.bar(x, y, yerr=e, capsize=3, color=color)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=35, ha="right")
    ax.axhline(0.0, color="black", lw=0.6)


def plot_metric_bars(df: pd.DataFrame, metrics: Sequence[str] = ("switch_ttft_reduction_pct",
                                                                 "switch_latency_reduction_pct",
                                                                 "call_latency_reduction_pct",
                                                                 "token_cost_reduction_pct"),
                     skip: Sequence[str] = ("No Shadow",)):
    """One bar panel per metric, approaches on the x axis, +-1 SE error bars."""
    import matplotlib.pyplot as plt
    d = df[~df["approach"].isin(skip)]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.6), squeeze=False)
    x = np.arange(len(d))
    for ax, m in zip(axes[0], metrics):
        _bar_errors(ax, x, d[m].to_numpy(), d[m + "_se"].to_numpy(), list(d["approach"]))
        ax.set_title(m.replace("_", " "), fontsize=9)
    fig.tight_layout()
    return fig


def plot_sweep(df: pd.DataFrame, metric: str = "call_latency_reduction_pct", x: str = "value",
               skip: Sequence[str] = ("No Shadow",), xlabel: str | None = None):
    """``metric`` (+-1 SE) against the swept value, one line per approach."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.0, 3.6))
    for name, g in df[~df["approach"].isin(skip)].groupby("approach", sort=False):
        ax.errorbar(g[x], g[metric], yerr=g[metric + "_se"], marker="o", capsize=3, label=name)
    ax.set_xlabel(xlabel or (df["param"].iloc[0] if "param" in df else x))
    ax.set_ylabel(metric.replace("_", " "))
    ax.axhline(0.0, color="black", lw=0.6)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_context(df: pd.DataFrame, skip: Sequence[str] = ("No Shadow",)):
    """Switch-call latency reduction per context bin, one line per approach."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5.0, 3.6))
    for name, g in df[~df["approach"].isin(skip)].groupby("approach", sort=False):
        labels = [f"{int(a / 1000)}K-" + ("" if not np.isfinite(b) else f"{int(b / 1000)}K")
                  for a, b in zip(g["bin_lo"], g["bin_hi"])]
        ax.errorbar(np.arange(len(g)), g["switch_latency_reduction_pct"], yerr=g["switch_latency_reduction_pct_se"],
                    marker="o", capsize=3, label=name)
        ax.set_xticks(np.arange(len(g)))
        ax.set_xticklabels(labels)
    ax.set_xlabel("prompt tokens of the switch call")
    ax.set_ylabel("switch-call latency reduction (%)")
    ax.axhline(0.0, color="black", lw=0.6)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
