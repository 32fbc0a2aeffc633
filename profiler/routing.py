r"""Estimating the routing matrix P, the commit matrix C and checking the geometric-run assumption.

Let ``n_ij`` be the number of trace steps on model i whose routing decision is
j (steps with ``next_model = -1`` end a request and carry no decision) and
``n_i = sum_j n_ij``.

**P.**  Given the decisions are independent draws from row i of P (the
model's Markov assumption), ``(n_i0, ..., n_i,M-1)`` is multinomial and the
maximum-likelihood estimate is ``p_ij = n_ij / n_i``.  Each entry gets a 95%
Wilson score interval, from the binomial marginal ``n_ij ~ Bin(n_i, p_ij)``:

    center = (p + z^2/(2n)) / (1 + z^2/n)
    half   = z / (1 + z^2/n) * sqrt(p (1-p) / n + z^2 / (4 n^2)),   z = 1.959964

(per-entry intervals, not simultaneous ones; Wilson keeps close to nominal
coverage near 0 and 1, where the Wald interval collapses.)

**C.**  ``c_ij`` = mean committed tokens over the ``n_ij`` steps, with its
sample standard deviation and standard error.

**Geometric runs.**  A run on model i is a maximal stretch of consecutive
steps of one request on i.  Under the model, every step on i ends the run with
the same probability ``q_i = 1 - p_ii`` whatever the run's age, so run lengths
are geometric.  The test compares that constant discrete hazard with an
age-dependent one.  For run age a (1-based; ages >= the age cap are pooled)
let ``r_a`` be the steps taken at age a (at risk) and ``e_a`` those that ended
the run.  Runs cut by the end of a request or of the trace are right-censored
and contribute only the ages they reached, so censoring needs no special case;
runs of requests first seen after their step 0 have unknown age and are left
out.  Ages are grouped left to right into bins holding at least 5 expected
ends and 5 expected continuations (the remainder joins the last bin, at most
``max_bins`` bins).  With ``q = sum e / sum r`` and ``h_g = e_g / r_g`` per bin,
the likelihood-ratio statistic

    G = 2 sum_g [ e_g ln(h_g / q) + (r_g - e_g) ln((1 - h_g) / (1 - q)) ]

is asymptotically chi-square with (bins - 1) degrees of freedom under the
geometric law (the step-level likelihood factorises into one Bernoulli trial
per step at risk).  Verdict: ``reject`` when the p-value < alpha (run lengths
are not geometric: the routing decision depends on how long the request has
been on the model, or requests differ, which makes the hazard fall with age),
``consistent`` otherwise, ``insufficient data`` with fewer than 2 bins.

**Spread across requests.**  For each request with ``n_r >= 1`` steps on the
entry model 0, the escalation rate is ``x_r / n_r`` with ``x_r`` the steps on 0
that routed elsewhere.  Reported: mean, standard deviation and quantiles
(1/1000 resolution) of the per-request rates, the pooled rate
``x = sum x_r / sum n_r``, and the binomial dispersion statistic

    D = sum_r (x_r - n_r x)^2 / (n_r x (1 - x))
      = (sum_r x_r^2/n_r - 2 x sum_r x_r + x^2 sum_r n_r) / (x (1 - x))

referred to chi-square with R - 1 degrees of freedom (approximate for short
requests); a small p-value says requests escalate at different rates.

Everything is computed from the streamed sufficient statistics of
:func:`profiler.trace.accumulate_trace`; nothing here holds the trace.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from profiler.trace import TraceAccumulator, TraceError, accumulate_trace
from tr_core.errors import SpecError
from tr_core.fileio import json_ready as json_safe  # plain-JSON copies of the documents (re-exported)

Z95 = 1.959963984540054

__all__ = ["RoutingEstimate", "GeometricTest", "EscalationSpread", "estimate_routing", "estimate_from_accumulator",
           "wilson_interval", "geometric_hazard_test", "routing_provenance", "json_safe"]


def wilson_interval(k, n, z: float = Z95):
    """Wilson score interval for k successes out of n (arrays allowed); (nan, nan) where n = 0."""
    k = np.asarray(k, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = k / n
        z2 = z * z
        den = 1.0 + z2 / n
        center = (p + z2 / (2 * n)) / den
        half = z / den * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
        lo = np.where(k <= 0, 0.0, np.clip(center - half, 0.0, 1.0))
        hi = np.where(k >= n, 1.0, np.clip(center + half, 0.0, 1.0))
    lo = np.where(n > 0, lo, np.nan)
    hi = np.where(n > 0, hi, np.nan)
    return lo, hi


@dataclass(frozen=True)
class GeometricTest:
    model: int
    steps_at_risk: int
    runs_ended: int
    leave_probability: float  # q = 1 - p_ii (hazard MLE)
    mean_completed_run: float | None  # observed, runs of known length that ended by a switch
    expected_mean_run: float | None  # 1 / q
    statistic: float | None
    dof: int
    p_value: float | None
    verdict: str
    bins: tuple[dict, ...]
    # completed runs (ended by a switch, known start) of length 1..len, the last entry counting longer ones
    run_length_counts: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["bins"] = list(self.bins)
        d["run_length_counts"] = list(self.run_length_counts)
        return d


def geometric_hazard_test(at_risk: np.ndarray, events: np.ndarray, model: int = 0, alpha: float = 0.05,
                          min_expected: float = 5.0, max_bins: int = 40,
                          runs: np.ndarray | None = None) -> GeometricTest:
    """Constant-hazard likelihood-ratio test of geometric run lengths (see module docstring)."""
    from scipy.stats import chi2

    r = np.asarray(at_risk, dtype=np.float64)[1:]
    e = np.asarray(events, dtype=np.float64)[1:]
    R, E = float(r.sum()), float(e.sum())
    mean_run = None
    if runs is not None:
        rr = np.asarray(runs, dtype=np.float64)[1:]
        if rr.sum() > 0:
            mean_run = float((rr * np.arange(1, rr.size + 1)).sum() / rr.sum())
    if R == 0:
        return GeometricTest(model, 0, 0, float("nan"), mean_run, None, None, 0, None,
                             "insufficient data (no steps of known run age)", ())
    q = E / R
    exp_mean = 1.0 / q if q > 0 else None
    if q == 0.0 or q == 1.0:
        what = "no run ever ended" if q == 0 else "every run lasted exactly one step"
        return GeometricTest(model, int(R), int(E), q, mean_run, exp_mean, None, 0, None,
                             f"degenerate ({what}); nothing to test", ())
    thr = max(min_expected, min(R * q, R * (1 - q)) / max_bins)
    edges = []  # (first_age, last_age)
    lo = 0
    acc_r = 0.0
    nz = np.flatnonzero(r)
    last = int(nz[-1]) if nz.size else -1
    for a in range(last + 1):
        acc_r += r[a]
        if acc_r * q >= thr and acc_r * (1 - q) >= thr:
            edges.append((lo, a))
            lo = a + 1
            acc_r = 0.0
    if lo <= last:
        if edges:
            edges[-1] = (edges[-1][0], last)
        else:
            edges.append((lo, last))
    bins = []
    G = 0.0
    for a0, a1 in edges:
        rg = float(r[a0:a1 + 1].sum())
        eg = float(e[a0:a1 + 1].sum())
        h = eg / rg if rg > 0 else 0.0
        if eg > 0:
            G += eg * math.log(h / q)
        if rg - eg > 0:
            G += (rg - eg) * math.log((1 - h) / (1 - q))
        top = a1 + 1
        bins.append({"age_from": a0 + 1, "age_to": top if top < r.size else None, "at_risk": int(rg),
                     "ended": int(eg), "hazard": h})
    G = max(0.0, 2.0 * G)
    dof = len(bins) - 1
    if dof < 1:
        return GeometricTest(model, int(R), int(E), q, mean_run, exp_mean, None, 0, None,
                             "insufficient data (fewer than 2 age bins)", tuple(bins))
    pv = float(chi2.sf(G, dof))
    verdict = (f"reject: run lengths are not geometric (p = {pv:.3g} < {alpha:g})" if pv < alpha
               else f"consistent with geometric run lengths (p = {pv:.3g} >= {alpha:g})")
    return GeometricTest(model, int(R), int(E), q, mean_run, exp_mean, float(G), dof, pv, verdict, tuple(bins))


@dataclass(frozen=True)
class EscalationSpread:
    requests: int
    pooled_rate: float | None
    mean_rate: float | None
    std_rate: float | None
    quantiles: dict
    dispersion_statistic: float | None
    dof: int
    p_value: float | None
    verdict: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _escalation_spread(esc_acc: np.ndarray, esc_hist: np.ndarray, alpha: float) -> EscalationSpread:
    from scipy.stats import chi2

    R, S1, X, Nn, s_rate, s_rate2 = (float(v) for v in esc_acc)
    if R == 0:
        return EscalationSpread(0, None, None, None, {}, None, 0, None, "no request ran on model 0")
    x = X / Nn
    mean = s_rate / R
    var = max(0.0, (s_rate2 - R * mean * mean) / (R - 1)) if R > 1 else 0.0
    cum = np.cumsum(esc_hist)
    nb = esc_hist.size
    qs = {}
    for name, q in (("p10", 0.1), ("p25", 0.25), ("p50", 0.5), ("p75", 0.75), ("p90", 0.9)):
        b = int(np.searchsorted(cum, q * cum[-1], side="left"))
        qs[name] = (b + 0.5) / nb
    if R < 2 or x <= 0 or x >= 1:
        return EscalationSpread(int(R), x, mean, math.sqrt(var), qs, None, 0, None,
                                "no spread test (fewer than 2 requests or a degenerate rate)")
    D = max(0.0, (S1 - 2 * x * X + x * x * Nn) / (x * (1 - x)))
    dof = int(R) - 1
    pv = float(chi2.sf(D, dof))
    verdict = (f"requests differ in escalation rate (overdispersed, p = {pv:.3g})" if pv < alpha
               else f"consistent with one shared escalation rate (p = {pv:.3g})")
    return EscalationSpread(int(R), x, mean, math.sqrt(var), qs, D, dof, pv, verdict)


@dataclass(frozen=True)
class RoutingEstimate:
    n_models: int
    lines: int
    decisions: int
    counts: np.ndarray  # n_ij
    P: np.ndarray
    P_low: np.ndarray
    P_high: np.ndarray
    C: np.ndarray
    C_std: np.ndarray
    C_sem: np.ndarray
    geometric: tuple[GeometricTest, ...]
    escalation: EscalationSpread
    final_steps: int
    final_step_tokens_mean: float | None
    max_requests_in_flight: int
    slow_lines: int
    dropped_last_line: bool
    seconds: float
    source: str = ""

    def unobserved_models(self) -> list[int]:
        return [i for i in range(self.n_models) if self.counts[i].sum() == 0]


def _with_histogram(g: GeometricTest, runs: np.ndarray, width: int = 32) -> GeometricTest:
    from dataclasses import replace
    r = np.asarray(runs[1:], dtype=np.int64)
    head = r[:width].tolist()
    head += [0] * (width - len(head))
    return replace(g, run_length_counts=tuple(head + [int(r[width:].sum())]))


def estimate_from_accumulator(acc: TraceAccumulator, *, n_models: int | None = None, alpha: float = 0.05,
                              source: str = "", seconds: float = 0.0) -> RoutingEstimate:
    M = acc.n_models if n_models is None else int(n_models)
    if M < 1:
        raise TraceError(f"{source or 'trace'}: the trace has no decoding steps")
    if n_models is not None and acc.n_models > n_models:
        raise TraceError(f"{source}: the trace uses model {acc.n_models - 1} but --models is {n_models}")
    n = acc.counts[:M, :M].astype(np.int64)
    ni = n.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        P = np.where(ni[:, None] > 0, n / np.maximum(ni, 1)[:, None], np.nan)
        nf = n.astype(np.float64)
        C = np.where(n > 0, acc.csum[:M, :M] / np.maximum(nf, 1), np.nan)
        var = np.where(n > 1, (acc.csq[:M, :M] - nf * C * C) / np.maximum(nf - 1, 1), np.where(n == 1, 0.0, np.nan))
        C_std = np.sqrt(np.maximum(var, 0.0))
        C_sem = np.where(n > 0, C_std / np.sqrt(np.maximum(nf, 1)), np.nan)
    lo, hi = wilson_interval(n, np.broadcast_to(ni[:, None], n.shape))
    geo = tuple(_with_histogram(geometric_hazard_test(acc.at_risk[i], acc.events[i], model=i, alpha=alpha,
                                                      runs=acc.runs[i]), acc.runs[i])
                for i in range(M))
    esc = _escalation_spread(acc.esc_acc, acc.esc_hist, alpha)
    nfin = int(acc.final_acc[0])
    return RoutingEstimate(
        n_models=M, lines=int(acc.lines), decisions=int(n.sum()), counts=n, P=P, P_low=lo, P_high=hi, C=C,
        C_std=C_std, C_sem=C_sem, geometric=geo, escalation=esc, final_steps=nfin,
        final_step_tokens_mean=float(acc.final_acc[1] / nfin) if nfin else None,
        max_requests_in_flight=int(acc.max_requests_in_flight), slow_lines=int(acc.slow_lines),
        dropped_last_line=bool(acc.dropped_last_line), seconds=float(seconds), source=source)


def estimate_routing(trace_path: str | os.PathLike, *, n_models: int | None = None, alpha: float = 0.05,
                     age_cap: int = 2048, buffer_bytes: int = 1 << 24) -> RoutingEstimate:
    """Stream a routing trace and estimate P (with 95% intervals), C, run-length fits and request spread."""
    if n_models is not None and n_models < 2:
        raise TraceError(f"--models must be >= 2, got {n_models}")
    if not (0 < alpha < 1):
        raise TraceError(f"--alpha must lie in (0, 1), got {alpha}")
    t0 = time.perf_counter()
    cap = n_models if n_models is not None else 64
    acc = accumulate_trace(trace_path, model_cap=cap, age_cap=age_cap, buffer_bytes=buffer_bytes)
    return estimate_from_accumulator(acc, n_models=n_models, alpha=alpha, source=os.fspath(trace_path),
                                     seconds=time.perf_counter() - t0)


def _nan_to_none(a: np.ndarray) -> list:
    return [[None if not np.isfinite(v) else float(v) for v in row] for row in np.asarray(a, dtype=np.float64)]


def routing_provenance(est: RoutingEstimate) -> dict:
    """The estimate's intervals and fit quality as plain JSON for a spec's ``provenance``."""
    return json_safe({
        "trace": est.source,
        "lines": est.lines,
        "decisions": est.decisions,
        "transition_counts": est.counts.tolist(),
        "routing_matrix_interval": {"method": "wilson", "level": 0.95, "low": _nan_to_none(est.P_low),
                                    "high": _nan_to_none(est.P_high)},
        "committed_tokens_std": _nan_to_none(est.C_std),
        "committed_tokens_sem": _nan_to_none(est.C_sem),
        "final_steps": est.final_steps,
        "final_step_tokens_mean": est.final_step_tokens_mean,
        "geometric_run_test": [g.to_dict() for g in est.geometric],
        "escalation_rate_spread": est.escalation.to_dict(),
        "max_requests_in_flight": est.max_requests_in_flight,
        "estimator_seconds": est.seconds,
    })


def check_estimable(est: RoutingEstimate) -> None:
    """Raise when a row of P cannot be estimated (a model with no decisions in the trace)."""
    missing = est.unobserved_models()
    if missing:
        raise SpecError(f"{est.source}: model(s) {', '.join(map(str, missing))} never take a routing decision in "
                        f"the trace, so their rows of P cannot be estimated")


def spec_matrices(est: RoutingEstimate) -> tuple[list[list[float]], list[list[float]]]:
    """P and C as lists for :func:`tr_core.spec.make_spec` (unobserved c_ij -> 0, rows renormalised)."""
    check_estimable(est)
    P = est.P.copy()
    P = P / P.sum(axis=1, keepdims=True)
    C = np.where(np.isfinite(est.C), est.C, 0.0)
    return P.tolist(), C.tolist()


def table_rows(est: RoutingEstimate) -> list[dict[str, Any]]:
    """One row per (i, j) for table/CSV output."""
    rows = []
    for i in range(est.n_models):
        for j in range(est.n_models):
            rows.append({"from": i, "to": j, "count": int(est.counts[i, j]),
                         "p": _f(est.P[i, j]), "p_low": _f(est.P_low[i, j]), "p_high": _f(est.P_high[i, j]),
                         "c_mean": _f(est.C[i, j]), "c_std": _f(est.C_std[i, j])})
    return rows


def _f(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None

