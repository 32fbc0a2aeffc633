"""Workloads of the cluster simulator: normal traffic and routed agent sessions.

**Normal traffic.**  Each (non-dedicated) instance receives its own Poisson
stream at ``rho * window * capacity`` requests per second, where ``capacity``
is the instance's calibrated capacity (the highest rate at which 90% of
requests meet both SLOs, :func:`shadow_prefill.cluster.sim.calibrate_capacity`)
and ``window`` the relative load of a trace window (peak 1.0 by definition).
Request sizes (prompt, output tokens) are drawn jointly, with replacement,
from a request-size table: the Azure LLM inference trace format
(``TIMESTAMP,ContextTokens,GeneratedTokens``, :func:`read_azure_trace`, read
from a user-supplied path) or a synthetic lognormal table
(:func:`synthetic_request_sizes`).  Windows default to
:data:`DEFAULT_WINDOWS` (peak 1.0, median 0.5, trough 0.25: a 4x daily swing,
inside the 3-10x the paper reports); :func:`window_multipliers` derives them
from a trace's own timestamps (bucketed arrival counts relative to the busiest
bucket) for traces that span a day.

**Routed sessions.**  Part 1's :class:`~shadow_prefill.sessions.SessionSet`
supplies sessions; they start as a Poisson process at ``session_rate`` per
second (sessions are drawn in order, and resampled with replacement when the
run needs more than the set holds).  Each call is issued when its predecessor
finishes plus its ``gap_s``.

**Next-model prior** (:func:`next_model_prior`): the probability that the call
after call i goes to model m, estimated per task and current model from the
*other* sessions of the workload (leave-one-session-out transition counts with
add-1/2 smoothing).  It orders shadow jobs, gates Predictive and picks the
top-1 target with more than two models.
"""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:  # only for an annotation: the sessions module is imported lazily
    from shadow_prefill.builder import SyntheticParams

from shadow_prefill.errors import InputFileError, ShadowError
from shadow_prefill.sessions import SessionSet

__all__ = ["mixed_synthetic_sessions", "RequestSizes", "read_azure_trace", "synthetic_request_sizes", "DEFAULT_WINDOWS", "window_multipliers",
           "next_model_prior", "SessionSchedule", "schedule_sessions", "SESSION_DRAWS", "normal_arrivals"]

DEFAULT_WINDOWS: dict[str, float] = {"peak": 1.0, "median": 0.5, "trough": 0.25}


@dataclass(frozen=True, eq=False)
class RequestSizes:
    """A table of normal-traffic request sizes (tokens) and, from a trace, arrival offsets (s)."""

    prompt: np.ndarray
    output: np.ndarray
    name: str = "sizes"
    times_s: np.ndarray | None = None

    def __post_init__(self):
        if self.prompt.shape != self.output.shape or self.prompt.ndim != 1 or self.prompt.size == 0:
            raise ShadowError("request sizes need equal-length, non-empty prompt and output arrays")
        if np.any(self.prompt < 1) or np.any(self.output < 0):
            raise ShadowError("request sizes: prompts must be >= 1 token and outputs >= 0")

    @property
    def n(self) -> int:
        return int(self.prompt.size)

    def describe(self) -> dict:
        return {"name": self.name, "requests": self.n, "mean_prompt_tokens": float(self.prompt.mean()),
                "mean_output_tokens": float(self.output.mean()),
                "p99_prompt_tokens": float(np.percentile(self.prompt, 99))}

    def clipped(self, max_total: int) -> "RequestSizes":
        """Sizes whose prompt + output fit ``max_total`` tokens (prompts shortened, outputs kept)."""
        p = np.minimum(self.prompt, np.maximum(1, max_total - self.output))
        o = np.minimum(self.output, max_total - p)
        return RequestSizes(p.astype(np.int64), o.astype(np.int64), self.name, self.times_s)


def _parse_time(s: str) -> float:
    # 'YYYY-MM-DD HH:MM:SS.fffffff' (7 fractional digits in the public trace): seconds since the epoch
    import datetime as _dt
    s = s.strip()
    if "." in s:
        head, frac = s.split(".", 1)
        frac = "0." + frac
    else:
        head, frac = s, "0"
    t = _dt.datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=_dt.timezone.utc)
    return t.timestamp() + float(frac)


def read_azure_trace(path: str | os.PathLike, name: str | None = None) -> RequestSizes:
    """Read an Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Malformed rows raise :class:`InputFileError` naming the file and line.
    """
    from shadow_prefill.inputs import MAX_TOKENS, STREAM_ERRORS, short_repr, stream_error, open_input
    path = os.fspath(path)
    prompts: list[int] = []
    outputs: list[int] = []
    times: list[float] = []
    ln = 0  # the last line read (errors while reading name the next one)
    f = open_input(path)  # a regular file only (a device could block); .gz read decompressed
    try:
        with f:
            rd = csv.reader(f)
            header = next(rd, None)
            if header is None:
                raise InputFileError(path, "empty file", 1)
            cols = [h.strip() for h in header]
            need = ("ContextTokens", "GeneratedTokens")
            missing = [c for c in need if c not in cols]
            if missing:
                raise InputFileError(path, f"missing column(s) {', '.join(missing)} (expected TIMESTAMP,"
                                           f"ContextTokens,GeneratedTokens)", 1)
            ic, ig = cols.index("ContextTokens"), cols.index("GeneratedTokens")
            it = cols.index("TIMESTAMP") if "TIMESTAMP" in cols else -1
            for ln, row in enumerate(rd, start=2):
                if not row or all(not x.strip() for x in row):
                    continue
                if len(row) != len(cols):
                    raise InputFileError(path, f"expected {len(cols)} fields, got {len(row)}", ln)
                try:
                    p = int(row[ic])
                    g = int(row[ig])
                except ValueError:
                    raise InputFileError(path, f"ContextTokens and GeneratedTokens must be integers, got "
                                               f"{short_repr(row[ic])}, {short_repr(row[ig])}", ln) from None
                if p < 1 or g < 0 or p > MAX_TOKENS or g > MAX_TOKENS:
                    raise InputFileError(path, f"ContextTokens must be in [1, {MAX_TOKENS}] and GeneratedTokens in "
                                               f"[0, {MAX_TOKENS}], got {short_repr(p)}, {short_repr(g)}", ln)
                if it >= 0:
                    try:
                        t = _parse_time(row[it])
                    except (ValueError, OverflowError):
                        t = math.nan
                    if not math.isfinite(t):
                        raise InputFileError(path, f"unreadable TIMESTAMP {short_repr(row[it])} (expected YYYY-MM-DD "
                                                   f"HH:MM:SS[.fraction])", ln) from None
                    times.append(t)
                prompts.append(p)
                outputs.append(g)
    except csv.Error as e:  # a NUL byte, an overlong field, an unclosed quote
        raise InputFileError(path, f"not a readable CSV file ({e})", ln + 1) from None
    except (OSError, UnicodeDecodeError, MemoryError, *STREAM_ERRORS) as e:
        raise stream_error(path, e, ln + 1) from None
    if not prompts:
        raise InputFileError(path, "no requests")
    t = None
    if times:
        t = np.asarray(times, dtype=np.float64)
        t -= t.min()
    return RequestSizes(np.asarray(prompts, np.int64), np.asarray(outputs, np.int64),
                        name or os.path.splitext(os.path.basename(path))[0], t)


def synthetic_request_sizes(n: int = 20000, prompt_median: float = 1020.0, prompt_sigma: float = 0.9,
                            output_median: float = 129.0, output_sigma: float = 0.8, max_prompt: int = 14000,
                            max_output: int = 1000, seed: int = 0) -> RequestSizes:
    """Lognormal request sizes (defaults shaped like the Azure conversation trace: medians 1,020 and 129)."""
    if n < 1:
        raise ShadowError(f"n must be >= 1, got {n}")
    rng = np.random.default_rng(seed)
    p = np.clip(np.rint(prompt_median * np.exp(prompt_sigma * rng.standard_normal(n))), 1, max_prompt)
    o = np.clip(np.rint(output_median * np.exp(output_sigma * rng.standard_normal(n))), 1, max_output)
    return RequestSizes(p.astype(np.int64), o.astype(np.int64), "synthetic")


def window_multipliers(sizes: RequestSizes, bucket_s: float = 3600.0) -> dict[str, float]:
    """Relative load of the peak, median and trough bucket of a trace's arrivals (peak = 1)."""
    if sizes.times_s is None:
        raise ShadowError(f"{sizes.name}: no timestamps to derive windows from")
    if not (bucket_s > 0):
        raise ShadowError("bucket_s must be > 0")
    span = float(sizes.times_s.max())
    nb = max(1, int(math.floor(span / bucket_s)))  # whole buckets only
    counts = np.bincount(np.minimum((sizes.times_s // bucket_s).astype(np.int64), nb - 1), minlength=nb)[:nb]
    peak = counts.max()
    return {"peak": 1.0, "median": float(np.median(counts) / peak), "trough": float(counts.min() / peak)}


def normal_arrivals(rates: np.ndarray, t_end: float, sizes: RequestSizes, rng: np.random.Generator,
                    clip_total: np.ndarray | None = None):
    """Poisson arrivals per instance (``rates[i]`` req/s; 0 = none) until ``t_end``, merged in time order.

    Returns ``(time, instance, prompt, output)``; sizes are drawn jointly with replacement.
    """
    ts, ins = [], []
    for i, lam in enumerate(rates):
        if lam <= 0:
            continue
        n = rng.poisson(lam * t_end * 1.05 + 10)
        t = np.cumsum(rng.exponential(1.0 / lam, size=n))
        while t.size and t[-1] < t_end:  # rare: extend
            t = np.concatenate([t, t[-1] + np.cumsum(rng.exponential(1.0 / lam, size=n // 4 + 10))])
        t = t[t < t_end]
        ts.append(t)
        ins.append(np.full(t.size, i, np.int64))
    if not ts:
        e = np.zeros(0)
        return e, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
    t = np.concatenate(ts)
    inst = np.concatenate(ins)
    order = np.argsort(t, kind="stable")
    t, inst = t[order], inst[order]
    k = rng.integers(0, sizes.n, size=t.size)
    p = sizes.prompt[k].copy()
    o = np.maximum(sizes.output[k], 1)
    if clip_total is not None:
        cap = clip_total[inst]
        p = np.minimum(p, np.maximum(1, cap - o))
        o = np.minimum(o, cap - p)
    return t, inst, p.astype(np.int64), o.astype(np.int64)


def next_model_prior(ss: SessionSet, smoothing: float = 0.5) -> np.ndarray:
    """``P[i, m]``: probability that the call after call i goes to model m (leave-one-session-out)."""
    M = ss.n_models
    n = ss.n_calls
    sess = ss.session_of_call
    task = ss.task[sess]
    T = int(task.max(initial=0)) + 1
    has_next = np.ones(n, dtype=bool)
    has_next[ss.offsets[1:] - 1] = False
    idx = np.flatnonzero(has_next)
    frm = ss.model[idx].astype(np.int64)
    to = ss.model[idx + 1].astype(np.int64)
    counts = np.zeros((T, M, M))
    np.add.at(counts, (task[idx], frm, to), 1.0)
    own = np.zeros((ss.n_sessions, M, M))
    np.add.at(own, (sess[idx], frm, to), 1.0)
    mi = ss.model.astype(np.int64)
    num = counts[task, mi, :] - own[sess, mi, :] + smoothing
    return num / num.sum(axis=1, keepdims=True)


@dataclass(frozen=True, eq=False)
class SessionSchedule:
    """The sessions of one run: which source session each run session replays, and when it starts."""

    source: np.ndarray
    start_s: np.ndarray
    measured: np.ndarray
    meta: dict = field(default_factory=dict)


SESSION_DRAWS = ("shuffle", "in-order")


def schedule_sessions(ss: SessionSet, session_rate: float, warmup_s: float, measure_s: float,
                      rng: np.random.Generator, draw: str = "shuffle") -> SessionSchedule:
    """Poisson session starts in ``[0, warmup + measure)``; sessions starting after the warmup are measured.

    Which sessions of ``ss`` (the pool) the run replays: ``draw="shuffle"`` (default) a random draw without
    replacement from the pool, from ``rng`` after the start times, so every seed replays other sessions while
    every approach of one seed replays the same ones (a paired design that still samples the session draw;
    beyond the pool's size, further sessions are drawn with replacement); ``"in-order"`` the pool's first
    sessions in order (the earlier rule: every seed replayed the same sessions).
    """
    if not (session_rate > 0 and math.isfinite(session_rate)):
        raise ShadowError(f"session rate must be > 0 sessions/s, got {session_rate!r}")
    if draw not in SESSION_DRAWS:
        raise ShadowError(f"session draw must be one of {', '.join(SESSION_DRAWS)}, got {draw!r}")
    end = warmup_s + measure_s
    n = rng.poisson(session_rate * end * 1.1 + 10)
    t = np.cumsum(rng.exponential(1.0 / session_rate, size=n))
    while t.size and t[-1] < end:
        t = np.concatenate([t, t[-1] + np.cumsum(rng.exponential(1.0 / session_rate, size=n // 4 + 10))])
    t = t[t < end]
    k = t.size
    first = np.arange(ss.n_sessions, dtype=np.int64) if draw == "in-order" else rng.permutation(ss.n_sessions)
    if k <= ss.n_sessions:
        src = first[:k]
    else:
        src = np.concatenate([first, rng.integers(0, ss.n_sessions, size=k - ss.n_sessions)])
    return SessionSchedule(src.astype(np.int64), t, t >= warmup_s,
                           {"sessions_started": int(k), "resampled": int(max(0, k - ss.n_sessions)),
                            "session_draw": draw})


def mixed_synthetic_sessions(switch_probs: Sequence[float] = (0.1, 0.45), n_sessions: int = 300,
                             base: "SyntheticParams | None" = None, seed: int = 0,
                             name: str = "mixed") -> SessionSet:
    """Part 1's synthetic sessions, one task per switch probability (sessions split evenly, interleaved).

    Tasks differ in how often they switch model, which is what the next-model
    prior (and so Predictive's gate and the shadow ordering) can learn.
    """
    from dataclasses import replace as _replace

    from shadow_prefill.builder import SyntheticParams, generate_synthetic_sessions
    if not switch_probs:
        raise ShadowError("need at least one switch probability")
    base = base or SyntheticParams()
    k = len(switch_probs)
    parts = []
    for t, p in enumerate(switch_probs):
        n = n_sessions // k + (1 if t < n_sessions % k else 0)
        if n == 0:
            continue
        parts.append((t, generate_synthetic_sessions(_replace(base, n_sessions=n, switch_prob=float(p),
                                                              seed=seed * 1000 + t, n_tasks=1))))
    # interleave sessions of the tasks so every task spreads over the run
    order = []
    m = max(ss.n_sessions for _, ss in parts)
    for j in range(m):
        for t, ss in parts:
            if j < ss.n_sessions:
                order.append((t, ss, j))
    cols = {k2: [] for k2 in ("model", "prompt", "new_input", "output", "gap_s", "append_only", "score")}
    lengths, task, sids = [], [], []
    for t, ss, j in order:
        a, b = int(ss.offsets[j]), int(ss.offsets[j + 1])
        for k2 in cols:
            cols[k2].append(getattr(ss, k2)[a:b])
        lengths.append(b - a)
        task.append(t)
        sids.append(f"{name}-t{t}-{j}")
    return SessionSet.from_arrays(model_names=parts[0][1].model_names, lengths=lengths, session_ids=sids,
                                  task=task, task_names=[f"switch{p:g}" for p in switch_probs], name=name,
                                  meta={"source": "mixed synthetic", "switch_probs": list(map(float, switch_probs)),
                                        "seed": seed},
                                  **{k2: np.concatenate(v) for k2, v in cols.items()})
