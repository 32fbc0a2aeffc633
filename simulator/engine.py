"""Per-request event simulation of delayed batching, with batch-means confidence intervals.

The simulated system is the one of ``docs/simulator.md`` (and of the exact
chain where both apply): ``N`` requests circulate among ``M`` models; model i
launches a batch when it is idle and at least ``B_i`` requests wait, taking
``min(k_i, cap_i)`` of them in FIFO order; a batch of b lasts ``L_i(b)`` ms
(``spec.latency_ms(i, b)``, real valued, no grid), optionally times a
mean-one log-normal jitter factor with coefficient of variation ``jitter``;
with a spec that has ``corun_latency`` a batch launched while another model
is busy (running, or launching in the same pass) lasts ``Lco_i(b)`` instead
(the chain's launch law; ``corun_law="rate-sharing"`` selects the older
rate-sharing law of ``corun_slowdown``).
After a step a request moves by row i of ``P`` and commits ``C[i][j]`` tokens,
or, when a routing trace is given, replays the next step of the recorded
request it was assigned (closed loop: when the recorded request ends, a new
one, sampled uniformly from the trace, takes its place at its entry model).

Throughput ``T = sum tokens / elapsed time`` after a warm-up.  Its 95%
interval uses batch means for a ratio estimator: the measured run is cut into
``K = 32`` consecutive batches (equal numbers of request-steps, or equal
simulated time with ``horizon_ms``); with ``y_k`` tokens and ``t_k`` ms in
batch k, ``e_k = (y_k - T t_k) / mean(t)`` and the half-width is
``t_{0.975, K-1} * sd(e) / sqrt(K)``.  32 batches keep the Student quantile
close to the normal one (2.04 vs 1.96) while each batch still spans about
3% of the run, hence thousands of batch cycles of every model in the default
run length; the lag-1 autocorrelation of the batch throughputs is reported
as a check that the batches are long enough (it should be near 0).

Admission latency (launch time minus the time the request joined the queue)
is recorded per model: exact count and mean, quantiles from a log-spaced
histogram with bins 0.2% wide (quantiles are bin centres, within +-0.1%),
exact zeros counted apart.  ``mean_waiting[i]`` is the time average of the
queue length; Little's law ties it to the admission rate times the mean
admission latency.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np
from scipy import stats

from dtmc.lowering import DTMCError, lower_routing
from tr_core.errors import SpecError, short_repr
from simulator._kernels import SimRequests, SimRun, SimSystem, simulate_kernel
from simulator.traces import RoutingTrace, read_trace, trace_from_records

__all__ = ["LatencySummary", "SimulationResult", "simulate", "validate_thresholds", "CI_BATCHES",
           "CORUN_LAWS", "DEFAULT_STEPS"]

CI_BATCHES = 32
FINE_BINS = 32 * CI_BATCHES
DEFAULT_STEPS = 2_000_000
MIN_STEPS = 1_000
HIST_MIN_MS = 1e-4
HIST_RATIO = 1.002
HIST_BINS = 14_000          # covers 1e-4 ms .. ~1.4e8 ms
TIE_REL = 1e-9


@dataclass(frozen=True)
class LatencySummary:
    """Distribution summary of one model's admission latency (ms)."""

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float


@dataclass(frozen=True)
class SimulationResult:
    """Outcome of :func:`simulate`.  Times in ms, rates in tokens/s."""

    N: int
    B: tuple
    method: str
    throughput_tok_s: float
    throughput_ci95_tok_s: float
    per_request_tok_s: float
    per_request_ci95_tok_s: float
    ci_batches: int
    batch_lag1_autocorr: float
    admission_latency_ms: tuple
    admission: tuple
    mean_waiting: tuple
    mean_in_service: tuple
    mean_batch_size: tuple
    max_batch_size: tuple
    launches: tuple
    utilization: tuple
    completed_requests: int
    mean_request_time_ms: float
    request_steps: int
    warmup_steps: int
    simulated_ms: float
    wall_s: float
    seed: int
    jitter: float
    caps: tuple
    batch_tokens: tuple = field(default=(), repr=False)
    batch_ms: tuple = field(default=(), repr=False)
    corun_law: str = "launch"
    corun_launches: tuple = ()

    @property
    def ci95(self) -> tuple[float, float]:
        return (self.throughput_tok_s - self.throughput_ci95_tok_s, self.throughput_tok_s + self.throughput_ci95_tok_s)

    @property
    def request_steps_per_s(self) -> float:
        return (self.request_steps + self.warmup_steps) / self.wall_s if self.wall_s > 0 else float("nan")

    def contains(self, value: float) -> bool:
        """Whether ``value`` (tokens/s) lies in the 95% interval."""
        return abs(value - self.throughput_tok_s) <= self.throughput_ci95_tok_s

    def to_dict(self) -> dict:
        d = asdict(self)
        d["B"] = list(self.B)
        d["admission"] = [asdict(a) for a in self.admission]
        for k in ("admission_latency_ms", "mean_waiting", "mean_in_service", "mean_batch_size", "max_batch_size",
                  "launches", "utilization", "caps",
                  "batch_tokens", "batch_ms", "corun_launches"):
            d[k] = list(d[k])
        d["schema_version"] = 1
        return d


def validate_thresholds(B: Any, M: int, N: int) -> tuple[int, ...]:
    """Check a threshold vector: M integers >= 1 with sum(B_i - 1) < N (the rule of :mod:`tr_core.feasibility`)."""
    from tr_core.feasibility import check_thresholds
    return check_thresholds(B, N, M)


def _positive_int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer, float)) or int(v) != v or v < 1:
        raise SpecError(f"{name} must be an integer >= 1, got {v!r}")
    return int(v)


def _as_trace(trace: Any, M: int) -> RoutingTrace:
    if isinstance(trace, RoutingTrace):
        tr = trace
    elif isinstance(trace, (str, os.PathLike)):
        tr = read_trace(trace)
    else:
        tr = trace_from_records(trace)
    if tr.models_used > M:
        raise SpecError(f"trace uses model {tr.models_used - 1} but the spec has M = {M} models")
    return tr


def _quantile_from_hist(zero: int, hist: np.ndarray, count: int, q: float) -> float:
    if count == 0:
        return float("nan")
    target = max(1, math.ceil(q * count))
    if zero >= target:
        return 0.0
    cum = np.cumsum(hist) + zero
    idx = int(np.searchsorted(cum, target, side="left"))
    return HIST_MIN_MS * HIST_RATIO ** (idx + 0.5)


def batch_means_halfwidth(tokens: np.ndarray, ms: np.ndarray, confidence: float = 0.95) -> tuple[float, float, np.ndarray]:
    """Ratio-estimator batch-means half-width (tokens/ms units) and lag-1 autocorrelation.

    Returns ``(half_width, lag1, e)`` where ``e`` are the per-batch influence
    values ``(y_k - T t_k) / mean(t)`` (used for paired comparisons).
    """
    keep = ms > 0
    y, t = tokens[keep], ms[keep]
    K = y.size
    if K < 2:
        return float("nan"), float("nan"), np.zeros(K)
    T = y.sum() / t.sum()
    e = (y - T * t) / t.mean()
    s = math.sqrt(float(np.sum(e * e)) / (K - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, K - 1)) * s / math.sqrt(K)
    rk = y / t
    d = rk - rk.mean()
    den = float(np.sum(d * d))
    lag1 = float(np.sum(d[1:] * d[:-1]) / den) if den > 0 else 0.0
    return half, lag1, e


def _extend_table(extend_ms_per_token: Any, M: int, N: int) -> np.ndarray:
    """``ext[i, b]``: extra ms per fed token beyond the first, for a batch of b on model i (see _kernels)."""
    ext = np.zeros((M, N + 1), dtype=np.float64)
    if extend_ms_per_token is None:
        return ext
    try:
        per_model = list(extend_ms_per_token)
    except TypeError:
        raise SpecError("extend_ms_per_token must be a list with one entry per model") from None
    if len(per_model) != M:
        raise SpecError(f"extend_ms_per_token must have M = {M} entries, got {len(per_model)}")
    for i, e in enumerate(per_model):
        for b in range(1, N + 1):
            if e is None:
                v = 0.0
            elif callable(e):
                v = e(b)
            elif isinstance(e, (int, float, np.integer, np.floating)) and not isinstance(e, bool):
                v = e
            else:
                raise SpecError(f"extend_ms_per_token[{i}] must be null, a number or a function of the batch size")
            v = float(v)
            if not math.isfinite(v) or v < 0:
                raise SpecError(f"extend_ms_per_token[{i}] at batch size {b} must be >= 0 ms, got {v!r}")
            ext[i, b] = v
        ext[i, 0] = ext[i, 1]
    return ext


def _corun_matrix(corun_slowdown: Any, M: int) -> np.ndarray:
    f = np.ones((M, M), dtype=np.float64)
    if corun_slowdown is None:
        return f
    try:
        a = np.array(corun_slowdown, dtype=np.float64)
    except (TypeError, ValueError):
        raise SpecError("corun_slowdown must be an M x M matrix of numbers") from None
    if a.shape != (M, M):
        raise SpecError(f"corun_slowdown must be {M} x {M}, got shape {a.shape}")
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise SpecError("corun_slowdown entries must be finite and > 0 (1 = no slowdown)")
    f[:] = a
    np.fill_diagonal(f, 1.0)
    return f


CORUN_LAWS = ("launch", "rate-sharing")


def _corun_latency_table(spec, M: int, N: int, lat: np.ndarray) -> np.ndarray:
    """``lat_co[i, b]``: the launch law's co-running step latency (``lat`` itself where the spec has none)."""
    co = lat.copy()
    if not getattr(spec, "has_corun", False):
        return co
    for i in range(M):
        for b in range(1, N + 1):
            v = float(spec.corun_latency_ms(i, b))
            if not math.isfinite(v) or v <= 0:
                raise SpecError(f"co-running latency of model {i} at batch size {b} must be > 0 ms, got {v!r}")
            co[i, b] = v
        co[i, 0] = co[i, 1]
    return co


def _resolve_corun_law(corun_law: Any, corun_slowdown: Any, spec) -> str:
    spec_corun = bool(getattr(spec, "has_corun", False))
    if corun_law is None:
        if corun_slowdown is not None and spec_corun:
            raise SpecError("the spec has corun_latency (launch law) and corun_slowdown was given (rate-sharing "
                            "law): name the one to simulate with corun_law='launch' or 'rate-sharing'")
        return "rate-sharing" if corun_slowdown is not None else "launch"
    if corun_law not in CORUN_LAWS:
        raise SpecError(f"corun_law must be one of {', '.join(CORUN_LAWS)}, got {short_repr(corun_law)}")
    if corun_law == "launch" and corun_slowdown is not None:
        raise SpecError("corun_slowdown belongs to the rate-sharing law; the launch law reads the spec's "
                        "corun_latency (give corun_law='rate-sharing' or drop corun_slowdown)")
    if corun_law == "rate-sharing" and corun_slowdown is None and spec_corun:
        raise SpecError("the rate-sharing law needs corun_slowdown (M x M factors); the spec's corun_latency "
                        "is the launch law's input")
    return corun_law


def simulate(spec, N: int, B: Sequence[int], *, horizon_ms: float | None = None, steps: int | None = None,
             warmup: float = 0.1, seed: int = 0, jitter: float = 0.0, trace: Any = None,
             request_tokens: float | None = None, expected_tokens: bool = True,
             extend_ms_per_token: Any = None, prompt_tokens: float = 0.0,
             corun_slowdown: Any = None, extend_buckets: Sequence[int] | None = None,
             corun_law: str | None = None) -> SimulationResult:
    """Simulate the routed system and return throughput with its 95% interval and latency statistics.

    ``steps``: request-steps to measure after the warm-up (default 2,000,000),
    or ``horizon_ms``: simulated ms to measure (give at most one of them).
    ``warmup``: fraction of that length simulated first and discarded.
    ``seed``: the run is a pure function of it (and of the other arguments).
    ``jitter``: coefficient of variation of a mean-one log-normal factor on
    every step latency (0 = none).  ``trace``: a :class:`RoutingTrace`, a
    routing-trace JSONL path or a list of step records; requests then replay
    recorded requests (closed loop) instead of routing by P.
    ``request_tokens``: with P routing, a request finishes after committing
    that many tokens and a new one enters at the entry model (default: never).
    ``expected_tokens``: with P routing, credit each completed step with its
    expected tokens ``sum_j P[i][j] C[i][j]`` rather than the drawn ones
    (conditional Monte Carlo, as the chain's reward; unbiased, narrower
    interval).  Trace-driven runs always use the recorded tokens.

    Serving costs beyond ``L_i(b)`` (see :mod:`simulator._kernels`):
    ``extend_ms_per_token``: per model, ``None``, a number or a function of
    the batch size b: a step whose rows must catch up on up to T tokens
    (committed elsewhere since the request last ran there) costs
    ``L_i(b) + e_i(b) (T - 1)``; ``prompt_tokens``: tokens a new request
    brings (its first step on each model feeds them);
    ``extend_buckets``: the captured step lengths (e.g. 1, 2, 4, 8, 16): T is
    padded up to the first one >= T, as a CUDA-graph runtime pads its batch.

    Co-running (models sharing a device), ``corun_law``:
    ``"launch"`` (the exact chain's law, default unless ``corun_slowdown`` is
    given): a batch of b on model i lasts the spec's co-running latency
    ``spec.corun_latency_ms(i, b)`` when at least one other model is busy at
    its launch (running, or launching in the same pass), ``L_i(b)``
    otherwise, fixed for the whole step; without ``corun_latency`` in the
    spec it is the plain simulation.  ``"rate-sharing"``: ``corun_slowdown``,
    ``M x M`` factors, model i runs ``corun[i][k]`` times slower while model
    k runs (a product over the running models, re-evaluated at every epoch;
    1 = independent GPUs); the spec's ``corun_latency`` is not used.
    """
    if not all(hasattr(spec, a) for a in ("M", "P", "C", "latency_ms", "caps")):
        raise SpecError(f"spec must be a SystemSpec (tr_model.make_spec / preset / load_spec), got {type(spec).__name__}")
    M = spec.M
    N = _positive_int(N, "N")
    Bt = validate_thresholds(B, M, N)
    if steps is not None and horizon_ms is not None:
        raise SpecError("give either steps or horizon_ms, not both")
    if horizon_ms is not None:
        horizon_ms = float(horizon_ms)
        if not math.isfinite(horizon_ms) or horizon_ms <= 0:
            raise SpecError(f"horizon_ms must be > 0, got {horizon_ms!r}")
        meas_steps, meas_ms = 0, horizon_ms
    else:
        meas_steps, meas_ms = (_positive_int(steps, "steps") if steps is not None else DEFAULT_STEPS), 0.0
        if meas_steps < MIN_STEPS:
            raise SpecError(f"steps must be >= {MIN_STEPS} (the interval needs {CI_BATCHES} batches), got {meas_steps}")
    warmup = float(warmup)
    if not (0.0 <= warmup < 1.0) or math.isnan(warmup):
        raise SpecError(f"warmup must be a fraction in [0, 1), got {warmup!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0 or seed >= 2**64:
        raise SpecError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    jitter = float(jitter)
    if not math.isfinite(jitter) or jitter < 0:
        raise SpecError(f"jitter must be >= 0 (coefficient of variation), got {jitter!r}")
    sigma = math.sqrt(math.log1p(jitter * jitter))

    # The step latencies stay in ms, read from the spec: the simulation runs in continuous time.  The one
    # lowering step (dtmc.lowering) turns latencies into whole quanta on the spec's grid (rounded onto it,
    # or refused off it), which would change every simulated time, so only its grid-free part is taken
    # from there (lower_routing below: P, C, their expected commits and the caps).
    lat = np.empty((M, N + 1), dtype=np.float64)
    for i in range(M):
        for b in range(1, N + 1):
            v = float(spec.latency_ms(i, b))
            if not math.isfinite(v) or v <= 0:
                raise SpecError(f"latency of model {i} at batch size {b} must be > 0 ms, got {v!r}")
            lat[i, b] = v
        lat[i, 0] = lat[i, 1]
    try:
        routing = lower_routing(spec.P, spec.C, N, spec.caps(N))
    except DTMCError as e:
        raise SpecError(str(e)) from None
    P, C, caps = routing.P, routing.C, routing.caps
    pcum = np.cumsum(P, axis=1)
    for i in range(M):
        # the last reachable destination absorbs u close to 1 (row sums may be 1 - 1e-16)
        pcum[i, int(np.flatnonzero(P[i] > 0)[-1]):] = 2.0
    tie_ms = TIE_REL * float(lat[:, 1:].min())

    if trace is not None:
        tr = _as_trace(trace, M)
        mode = 1
        tr_off, tr_model, tr_tok, tr_last = tr.offsets, tr.model, tr.committed_tokens, tr.last_step_flags()
        req_tok = 0.0
        if request_tokens is not None:
            raise SpecError("request_tokens applies to P routing only; a trace ends requests where they were recorded to end")
        method = "simulate:trace"
    else:
        mode = 0
        tr_off = np.zeros(2, dtype=np.int64)
        tr_model = np.zeros(1, dtype=np.int64)
        tr_tok = np.zeros(1, dtype=np.float64)
        tr_last = np.ones(1, dtype=np.bool_)
        req_tok = 0.0
        if request_tokens is not None:
            req_tok = float(request_tokens)
            if not math.isfinite(req_tok) or req_tok <= 0:
                raise SpecError(f"request_tokens must be > 0, got {request_tokens!r}")
        method = "simulate:routing-matrix"

    warm_steps = int(math.ceil(warmup * meas_steps)) if meas_steps else 0
    warm_ms = warmup * meas_ms if not meas_steps else 0.0
    t_start = time.perf_counter()
    if mode == 0 and expected_tokens:
        exp_tok = routing.cbar
    else:
        exp_tok = np.full(M, -1.0)
    ext = _extend_table(extend_ms_per_token, M, N)
    prompt_tokens = float(prompt_tokens)
    if not math.isfinite(prompt_tokens) or prompt_tokens < 0:
        raise SpecError(f"prompt_tokens must be >= 0, got {prompt_tokens!r}")
    law = _resolve_corun_law(corun_law, corun_slowdown, spec)
    corun = _corun_matrix(corun_slowdown, M)
    lat_co = _corun_latency_table(spec, M, N, lat) if law == "launch" else lat.copy()
    try:
        tb = np.array(sorted(float(t) for t in (extend_buckets or ())), dtype=np.float64)
    except (TypeError, ValueError):
        raise SpecError("extend_buckets must be a list of token counts") from None
    if tb.size and (not np.all(np.isfinite(tb)) or tb[0] < 1):
        raise SpecError("extend_buckets must be token counts >= 1")
    if ext.any() or (corun != 1.0).any():
        method += "+serving-costs"
    if (lat_co != lat).any():
        method += "+corun-launch"
    out = simulate_kernel(SimSystem(pcum, C, exp_tok, lat, lat_co, caps, ext, prompt_tokens, tb, corun),
                          np.asarray(Bt, dtype=np.int64), N,
                          SimRequests(mode, req_tok, tr_off, tr_model, tr_tok, tr_last),
                          SimRun(np.uint64(seed), sigma, tie_ms, warm_steps, warm_ms, meas_steps, meas_ms,
                                 FINE_BINS, HIST_MIN_MS, 1.0 / math.log(HIST_RATIO), HIST_BINS))
    wall = time.perf_counter() - t_start
    (status, bin_tok, bin_ms, bin_steps, wait_area, busy_area, serv_area, adm_cnt, adm_sum, adm_zero, hist,
     launches, launched, max_batch, completions, sojourn_sum, total_steps, co_launches) = out
    if status != 0:
        raise SpecError(f"the simulation deadlocked with B = {Bt} (no model could launch)")
    ms_total = float(bin_ms.sum())
    tok_total = float(bin_tok.sum())
    steps_meas = int(bin_steps.sum())
    bt = bin_tok.reshape(CI_BATCHES, -1).sum(axis=1)
    bm = bin_ms.reshape(CI_BATCHES, -1).sum(axis=1)
    T = tok_total / ms_total * 1000.0
    half, lag1, _ = batch_means_halfwidth(bt, bm)
    half *= 1000.0
    adm = []
    for i in range(M):
        c = int(adm_cnt[i])
        adm.append(LatencySummary(
            count=c, mean_ms=float(adm_sum[i] / c) if c else float("nan"),
            p50_ms=_quantile_from_hist(int(adm_zero[i]), hist[i], c, 0.50),
            p90_ms=_quantile_from_hist(int(adm_zero[i]), hist[i], c, 0.90),
            p99_ms=_quantile_from_hist(int(adm_zero[i]), hist[i], c, 0.99)))
    return SimulationResult(
        N=N, B=Bt, method=method,
        throughput_tok_s=T, throughput_ci95_tok_s=half,
        per_request_tok_s=T / N, per_request_ci95_tok_s=half / N,
        ci_batches=int(np.count_nonzero(bm > 0)), batch_lag1_autocorr=lag1,
        admission_latency_ms=tuple(a.mean_ms for a in adm), admission=tuple(adm),
        mean_waiting=tuple(float(w / ms_total) for w in wait_area),
        mean_in_service=tuple(float(x / ms_total) for x in serv_area),
        mean_batch_size=tuple(float(launched[i] / launches[i]) if launches[i] else float("nan") for i in range(M)),
        max_batch_size=tuple(int(x) for x in max_batch),
        launches=tuple(int(x) for x in launches),
        utilization=tuple(float(b / ms_total) for b in busy_area),
        completed_requests=int(completions),
        mean_request_time_ms=float(sojourn_sum / completions) if completions else float("nan"),
        request_steps=steps_meas, warmup_steps=int(total_steps) - steps_meas,
        simulated_ms=ms_total, wall_s=wall, seed=int(seed), jitter=jitter,
        caps=tuple(int(c) for c in caps),
        batch_tokens=tuple(float(x) for x in bt), batch_ms=tuple(float(x) for x in bm),
        corun_law=law, corun_launches=tuple(int(x) for x in co_launches))
