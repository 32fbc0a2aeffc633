"""Comparison metrics: every approach against No Shadow on the same seed and window.

Runs are grouped by scenario (seed, window, load, timing) and deployment;
within a group every approach is compared with the baseline run **over the
calls that complete under every approach of the group** (measured calls:
those of sessions starting inside the measurement window).  Per group:

=================================  =========================================================
``switch_latency_reduction_pct``   ``100 (1 - mean latency_a / mean latency_base)`` over switch calls
``call_latency_reduction_pct``     the same over all calls (latency = issue to last token)
``switch_ttft_reduction_pct``      TTFT (issue to first token) of switch calls
``call_ttft_reduction_pct``        TTFT of all calls
``task_time_reduction_pct``        LLM time per task, as the paper defines it: per task (a
                                   session, whose calls all count), ``100 (1 - T_a / T_base)``
                                   with T the sum of its call latencies; then the mean over tasks
``task_time_pooled_reduction_pct`` the same from the pooled sums (mean T_a / mean T_base): equal
                                   to the all-call figure when every measured session counts
``hit_rate_pct``                   token-weighted prefix hit rate of all calls (absolute)
``switch_hit_rate_pct``            the same over switch calls (absolute)
``token_cost_reduction_pct``       routed token cost, cached input billed at a fraction
``normal_slo_pct``                 normal-traffic SLO attainment (both SLOs, absolute)
``normal_slo_delta_pp``            its change against the baseline (percentage points)
``shadow_tokens``                  shadow tokens computed (whole run)
``shadow_unused_pct``              share of them never hit by a call
``prefill_throughput_change_pct``  total prefill tokens/s in the window, shadow included
``energy_per_good_request_change_pct``  energy per request meeting its SLO (normal + routed)
=================================  =========================================================

Aggregation: mean over groups and +-1 standard error ``std(ddof=1) /
sqrt(n)`` over seeds x windows (0 for a single group).
"""

from __future__ import annotations

import json
import math
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from shadow_prefill.cluster.sim import RunResult
from shadow_prefill.errors import ShadowError

__all__ = ["RELATIVE_METRICS", "compare_runs", "summarize_comparison", "reduction_by_context", "group_key"]

RELATIVE_METRICS = (
    "switch_latency_reduction_pct", "call_latency_reduction_pct", "switch_ttft_reduction_pct",
    "call_ttft_reduction_pct", "task_time_reduction_pct", "task_time_pooled_reduction_pct", "hit_rate_pct", "switch_hit_rate_pct",
    "token_cost_reduction_pct", "normal_slo_pct", "normal_slo_delta_pp", "shadow_tokens", "shadow_unused_pct",
    "prefill_throughput_change_pct", "energy_per_good_request_change_pct",
)


def group_key(run: RunResult) -> tuple:
    """Runs with the same key differ only in their approach."""
    sc = run.scenario
    return (sc.rho, str(sc.window), sc.warmup_s, sc.measure_s, sc.drain_s, sc.session_rate, sc.seed, sc.session_draw,
            json.dumps(run.config, sort_keys=True, default=str))


def _red(a: float, b: float) -> float:
    return 100.0 * (1.0 - a / b) if b > 0 and math.isfinite(a) and math.isfinite(b) else float("nan")


def _chg(a: float, b: float) -> float:
    return 100.0 * (a / b - 1.0) if b > 0 and math.isfinite(a) and math.isfinite(b) else float("nan")


def _per_task_reduction(t_a: np.ndarray, t_b: np.ndarray) -> float:
    """Mean over tasks of ``100 (1 - T_a / T_base)`` (tasks with T_base > 0)."""
    ok = t_b > 0
    return float(np.mean(100.0 * (1.0 - t_a[ok] / t_b[ok]))) if ok.any() else float("nan")


def _mean(x: np.ndarray, m: np.ndarray) -> float:
    return float(x[m].mean()) if m.any() else float("nan")


def _compare_group(runs: Sequence[RunResult], baseline: str) -> list[dict]:
    base = [r for r in runs if r.approach == baseline]
    if not base:
        raise ShadowError(f"no {baseline!r} run to compare against in a group ({runs[0].scenario})")
    b = base[0]
    n = b.call_prompt.size
    for r in runs:
        if r.call_prompt.size != n or not np.array_equal(r.call_prompt, b.call_prompt):
            raise ShadowError("runs of one group must replay the same calls (same sessions, seed and window)")
    common = b.call_measured.copy()
    for r in runs:
        common &= r.call_done
    sw = common & b.call_switch
    sess = b.call_session
    ns = int(sess.max(initial=-1)) + 1
    bad = np.bincount(sess[b.call_measured & ~common], minlength=ns) > 0
    has = np.bincount(sess[common], minlength=ns) > 0
    full = has & ~bad

    def per(r: RunResult) -> dict:
        lat, ttft = r.call_latency_s, r.call_ttft_s
        tt = np.bincount(sess[common], weights=lat[common], minlength=ns)
        s = r.summary()
        return {"sw_lat": _mean(lat, sw), "lat": _mean(lat, common), "sw_ttft": _mean(ttft, sw),
                "ttft": _mean(ttft, common), "task": float(tt[full].mean()) if full.any() else float("nan"),
                "tt": tt[full],
                "hit": float(r.call_hit[common].sum() / max(1, r.call_prompt[common].sum())),
                "sw_hit": float(r.call_hit[sw].sum() / max(1, r.call_prompt[sw].sum())),
                "cost": float(r.call_cost[common].sum()), "slo": s["normal_slo_attainment"],
                "pf": s["prefill_tok_s"], "epg": s["energy_per_good_request_j"], "sh": s["shadow_tokens"],
                "unused": s["shadow_unused_frac"]}

    pb = per(b)
    rows = []
    for r in runs:
        p = per(r)
        sc = r.scenario
        rows.append({
            "approach": r.approach, "seed": sc.seed, "window": str(sc.window), "rho": sc.rho,
            "calls": int(common.sum()), "switch_calls": int(sw.sum()),
            # an overloaded run leaves measured calls unfinished: the reductions cover only `calls` of these
            "measured_calls": int(b.call_measured.sum()),
            "unfinished_calls": int((r.call_measured & ~r.call_done).sum()),
            "switch_latency_reduction_pct": _red(p["sw_lat"], pb["sw_lat"]),
            "call_latency_reduction_pct": _red(p["lat"], pb["lat"]),
            "switch_ttft_reduction_pct": _red(p["sw_ttft"], pb["sw_ttft"]),
            "call_ttft_reduction_pct": _red(p["ttft"], pb["ttft"]),
            "task_time_reduction_pct": _per_task_reduction(p["tt"], pb["tt"]),
            "task_time_pooled_reduction_pct": _red(p["task"], pb["task"]),
            "hit_rate_pct": 100.0 * p["hit"], "switch_hit_rate_pct": 100.0 * p["sw_hit"],
            "token_cost_reduction_pct": _red(p["cost"], pb["cost"]),
            "normal_slo_pct": 100.0 * p["slo"], "normal_slo_delta_pp": 100.0 * (p["slo"] - pb["slo"]),
            "shadow_tokens": p["sh"], "shadow_unused_pct": 100.0 * p["unused"] if p["sh"] > 0 else float("nan"),
            "prefill_throughput_change_pct": _chg(p["pf"], pb["pf"]),
            "energy_per_good_request_change_pct": _chg(p["epg"], pb["epg"]),
            "mean_switch_latency_s": p["sw_lat"], "mean_call_latency_s": p["lat"],
            "mean_switch_ttft_s": p["sw_ttft"],
        })
    return rows


def compare_runs(runs: Iterable[RunResult], baseline: str = "No Shadow") -> pd.DataFrame:
    """One row per run: its metrics against the baseline of its group (module doc)."""
    groups: dict[tuple, list[RunResult]] = {}
    for r in runs:
        groups.setdefault(group_key(r), []).append(r)
    if not groups:
        raise ShadowError("no runs to compare")
    rows: list[dict] = []
    for g in groups.values():
        rows.extend(_compare_group(g, baseline))
    return pd.DataFrame(rows)


def summarize_comparison(per_run: pd.DataFrame, metrics: Sequence[str] = RELATIVE_METRICS,
                         by: Sequence[str] = ("approach",)) -> pd.DataFrame:
    """Mean and +-1 standard error over seeds x windows: columns ``<metric>`` and ``<metric>_se``, and ``runs``."""
    out = []
    order = list(dict.fromkeys(per_run["approach"])) if "approach" in by else None
    for key, g in per_run.groupby(list(by), sort=False):
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        row["runs"] = len(g)
        for c in ("calls", "measured_calls", "unfinished_calls"):  # totals over the runs (coverage of the means)
            if c in g:
                row[c] = int(g[c].sum())
        for m in metrics:
            x = g[m].to_numpy(dtype=float)
            x = x[np.isfinite(x)]
            row[m] = float(x.mean()) if x.size else float("nan")
            row[m + "_se"] = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else 0.0
        out.append(row)
    df = pd.DataFrame(out)
    if order is not None and len(by) == 1:
        df["approach"] = pd.Categorical(df["approach"], order, ordered=True)
        df = df.sort_values("approach").reset_index(drop=True)
        df["approach"] = df["approach"].astype(str)
    return df


def reduction_by_context(runs: Iterable[RunResult], bins: Sequence[float] = (0, 2000, 8000, 32000, 64000, math.inf),
                         baseline: str = "No Shadow") -> pd.DataFrame:
    """Switch-call latency reduction per bin of the switch call's prompt length (mean +- SE over groups)."""
    groups: dict[tuple, list[RunResult]] = {}
    for r in runs:
        groups.setdefault(group_key(r), []).append(r)
    edges = np.asarray(bins, dtype=float)
    rows = []
    for g in groups.values():
        b = next((r for r in g if r.approach == baseline), None)
        if b is None:
            raise ShadowError(f"no {baseline!r} run in a group")
        common = b.call_measured.copy()
        for r in g:
            common &= r.call_done
        sw = common & b.call_switch
        k = np.digitize(b.call_prompt, edges) - 1
        for r in g:
            for j in range(len(edges) - 1):
                m = sw & (k == j)
                rows.append({"approach": r.approach, "bin_lo": edges[j], "bin_hi": edges[j + 1],
                             "switch_calls": int(m.sum()),
                             "switch_latency_reduction_pct": _red(_mean(r.call_latency_s, m),
                                                                  _mean(b.call_latency_s, m)) if m.any() else np.nan})
    df = pd.DataFrame(rows)
    return summarize_comparison(df, ("switch_latency_reduction_pct",), by=("approach", "bin_lo", "bin_hi"))
