"""Switch-tax statistics of a routed session workload (the paper's Table 1 and Figure 2).

For one workload routed over a set of models (normally a pair):

* **calls**, **sessions**, **switch share** (switch calls / all calls; a
  session's first call is never a switch), **switches per session** (mean and
  quantiles), the **prompt at switch calls** (mean, median, p99; quantiles
  interpolate linearly);
* the **token-weighted prefix hit rate** ``sum(hit) / sum(prompt)`` over all
  calls, over switch calls and over same-model calls (later calls that stay on
  their predecessor's model), each with an **unbounded** cache and with a
  **per-model cache capacity**;
* the **routed token cost**: every call pays its uncached input at the input
  price, its cached input at ``cached_fraction`` (default 0.1) of it and its
  output at the output price (prices in dollars per million tokens); also the
  cost without any prefix caching, the cost of sending every call to each
  model alone (unbounded cache), and the **switch tax**: what switch calls pay
  for the input their target model no longer held, ``sum over switch calls of
  (H - hit) * input_price * (1 - cached_fraction)``;
* optionally (when latency models are given), **isolated call latencies**
  (Figure 2d): a call's time to first token is the chunked prefill of its
  uncached tokens after its cached ones, alone on its instance; its latency
  adds ``output - 1`` batch-1 decode steps at the mid-output context; means
  over same-model and switch calls, and the switch slowdown (their ratio).

**Cache model** (see :mod:`shadow_prefill.sessions`): per session and model,
the cache holds a prefix of the session's token sequence; a call reuses
``min(cached, H)`` tokens and leaves ``P + O`` cached on its model.  With a
capacity of C tokens per model, each model's entries form an LRU list in the
order calls are issued: a call's entry becomes most recent and the least
recent entries of that model are dropped whole until the model holds at most C
tokens (an entry larger than C keeps its first C tokens).  Tokens that a
rewritten history makes stale are dropped at once.

**Replay order** (only the capacity matters for it): sessions start at Poisson
arrivals of rate ``session_rate`` per second (seeded), and a call is issued
``gap_s`` after its predecessor completes, a call lasting ``output *
replay_tpot_s`` seconds.  Calls are processed in issue order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from shadow_prefill import _kernels as _k
from shadow_prefill.errors import ShadowError
from shadow_prefill.latency import LatencyModel
from shadow_prefill.matrix import ModelPrice
from shadow_prefill.sessions import SessionSet

__all__ = ["ReplayParams", "compute_prefix_hits", "compute_issue_times", "compute_switch_tax", "DEFAULT_CACHE_CAPACITY",
           "STATS_COLUMNS", "flatten_stats"]

DEFAULT_CACHE_CAPACITY = 262144  # tokens of session context per model


@dataclass(frozen=True)
class ReplayParams:
    """The clock that orders calls across sessions for the capacity-limited cache."""

    session_rate: float = 0.05   # sessions per second (Poisson)
    replay_tpot_s: float = 0.025  # seconds per output token
    seed: int = 0

    def check(self) -> None:
        if not (math.isfinite(self.session_rate) and self.session_rate > 0):
            raise ShadowError(f"session rate must be > 0 per second, got {self.session_rate!r}")
        if not (math.isfinite(self.replay_tpot_s) and self.replay_tpot_s >= 0):
            raise ShadowError(f"replay TPOT must be >= 0 s, got {self.replay_tpot_s!r}")


def compute_issue_times(ss: SessionSet, replay: ReplayParams = ReplayParams()) -> np.ndarray:
    """Issue time (s) of every call under the replay clock (module doc)."""
    replay.check()
    rng = np.random.default_rng(replay.seed)
    starts = np.cumsum(rng.exponential(1.0 / replay.session_rate, size=ss.n_sessions))
    return _k.issue_times(ss.offsets, starts, ss.gap_s, ss.output.astype(np.float64), float(replay.replay_tpot_s))


def _capacity_array(ss: SessionSet, capacity: int | Mapping[str, int] | None) -> np.ndarray | None:
    if capacity is None:
        return None
    if isinstance(capacity, Mapping):
        unknown = sorted(set(capacity) - set(ss.model_names) - {"*"})
        if unknown:
            raise ShadowError(f"cache capacity given for unknown model(s) {', '.join(unknown)} "
                              f"(models: {', '.join(ss.model_names)})")
        default = capacity.get("*", DEFAULT_CACHE_CAPACITY)
        vals = [capacity.get(m, default) for m in ss.model_names]
    else:
        vals = [capacity] * ss.n_models
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ShadowError(f"cache capacity must be an integer >= 0 (tokens), got {v!r}")
    return np.asarray(vals, dtype=np.int64)


def compute_prefix_hits(ss: SessionSet, capacity: int | Mapping[str, int] | None = None,
                replay: ReplayParams = ReplayParams(), order: np.ndarray | None = None) -> np.ndarray:
    """Cached prompt tokens of every call (module doc); ``capacity=None`` is an unbounded cache.

    ``order`` (call indices) replaces the replay clock's issue order; each
    session's calls must appear in step order.
    """
    hist = ss.history
    cap = _capacity_array(ss, capacity)
    if cap is None:
        return _k.prefix_hits_unbounded(ss.offsets, ss.model, ss.prompt, hist, ss.output, ss.n_models)
    if order is None:
        t = compute_issue_times(ss, replay)
        order = np.lexsort((ss.step, t)).astype(np.int64)
    else:
        order = np.asarray(order, dtype=np.int64)
        if order.shape != (ss.n_calls,) or not np.array_equal(np.sort(order), np.arange(ss.n_calls)):
            raise ShadowError("order must be a permutation of the call indices")
        pos = np.empty(ss.n_calls, dtype=np.int64)
        pos[order] = np.arange(ss.n_calls)
        if np.any(np.diff(pos)[~ss.is_first[1:]] < 0):
            raise ShadowError("order must keep each session's calls in step order")
    return _k.prefix_hits_lru(order, ss.session_of_call, ss.n_sessions, ss.model, ss.prompt, hist, ss.output, ss.n_models,
                     cap)


def _rate(num: np.ndarray, den: np.ndarray, mask: np.ndarray) -> float | None:
    d = int(den[mask].sum())
    return float(num[mask].sum() / d) if d > 0 else None


def _q(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if x.size else None


def compute_switch_tax(ss: SessionSet, prices: Mapping[str, ModelPrice] | None = None, cached_fraction: float = 0.1,
                     cache_capacity: int | Mapping[str, int] | None = DEFAULT_CACHE_CAPACITY,
                     replay: ReplayParams = ReplayParams(), latency: Mapping[str, LatencyModel] | None = None,
                     chunk: int = 2048, accuracy: Mapping[str, float] | None = None) -> dict:
    """The switch-tax figures of ``ss`` as one flat-ish dict (see the module doc for each)."""
    if not (0.0 <= cached_fraction <= 1.0):
        raise ShadowError(f"cached fraction must be in [0, 1], got {cached_fraction!r}")
    n = ss.n_calls
    sw = ss.is_switch
    first = ss.is_first
    same = ~sw & ~first
    prompt = ss.prompt
    hist = ss.history
    hits = compute_prefix_hits(ss, None)
    cap = _capacity_array(ss, cache_capacity)
    hits_cap = compute_prefix_hits(ss, cache_capacity, replay) if cap is not None else None
    sw_per_sess = np.add.reduceat(sw.astype(np.int64), ss.offsets[:-1]) if n else np.zeros(0, np.int64)
    p_sw = prompt[sw]
    allm = np.ones(n, dtype=bool)
    r: dict[str, Any] = {
        "workload": ss.name,
        "models": list(ss.model_names),
        "sessions": ss.n_sessions,
        "calls": n,
        "calls_per_model": {m: int(np.sum(ss.model == i)) for i, m in enumerate(ss.model_names)},
        "switch_calls": int(sw.sum()),
        "switch_share": float(sw.mean()) if n else 0.0,
        "switches_per_session_mean": float(sw_per_sess.mean()) if ss.n_sessions else 0.0,
        "switches_per_session_p50": _q(sw_per_sess, 50),
        "switches_per_session_p90": _q(sw_per_sess, 90),
        "switches_per_session_max": int(sw_per_sess.max()) if sw_per_sess.size else 0,
        "sessions_with_switch_share": float(np.mean(sw_per_sess > 0)) if sw_per_sess.size else 0.0,
        "prompt_mean_tokens": float(prompt.mean()) if n else None,
        "prompt_switch_mean_tokens": float(p_sw.mean()) if p_sw.size else None,
        "prompt_switch_p50_tokens": _q(p_sw, 50),
        "prompt_switch_p99_tokens": _q(p_sw, 99),
        "hit_all": _rate(hits, prompt, allm),
        "hit_switch": _rate(hits, prompt, sw),
        "hit_same": _rate(hits, prompt, same),
        "cache_capacity_tokens": None if cap is None else {m: int(c) for m, c in zip(ss.model_names, cap)},
        "hit_all_cap": None if hits_cap is None else _rate(hits_cap, prompt, allm),
        "hit_switch_cap": None if hits_cap is None else _rate(hits_cap, prompt, sw),
        "hit_same_cap": None if hits_cap is None else _rate(hits_cap, prompt, same),
    }
    # ---- cost
    f = float(cached_fraction)
    billed_in = (prompt - hits) + f * hits
    cost: dict[str, Any] = {"cached_fraction": f, "billed_input_tokens": float(billed_in.sum()),
                            "output_tokens": int(ss.output.sum()),
                            "input_tokens": int(prompt.sum()), "cached_input_tokens": int(hits.sum())}
    if prices is not None:
        missing = [m for m in ss.model_names if m not in prices]
        if missing:
            raise ShadowError(f"no price for model(s) {', '.join(missing)}")
        pin = np.array([prices[m].input_price for m in ss.model_names]) / 1e6
        pout = np.array([prices[m].output_price for m in ss.model_names]) / 1e6
        ci, co = pin[ss.model], pout[ss.model]
        out_usd = float(np.sum(co * ss.output))
        cost["routed_usd"] = float(np.sum(ci * billed_in)) + out_usd
        if hits_cap is not None:
            cost["routed_usd_cap"] = float(np.sum(ci * ((prompt - hits_cap) + f * hits_cap))) + out_usd
        cost["no_cache_usd"] = float(np.sum(ci * prompt)) + out_usd
        cost["switch_tax_usd"] = float(np.sum((ci * (hist - hits) * (1 - f))[sw]))
        only = {}
        for i, m in enumerate(ss.model_names):
            # every call on model i: each call (after the first) finds its whole history cached
            only[m] = float(pin[i] * np.sum((prompt - hist) + f * hist) + pout[i] * np.sum(ss.output))
        cost["only_usd"] = only
    r["cost"] = cost
    # ---- accuracy
    acc = dict(accuracy) if accuracy else {}
    if np.any(~np.isnan(ss.score)) and "routed" not in acc:
        acc["routed"] = float(np.nanmean(ss.score))
    r["accuracy"] = acc or None
    # ---- isolated latencies
    if latency is not None:
        missing = [m for m in ss.model_names if m not in latency]
        if missing:
            raise ShadowError(f"no latency model for model(s) {', '.join(missing)}")
        lms = np.stack([latency[m].params for m in ss.model_names])
        ttft, lat = _k.call_latencies(lms, ss.model, prompt, hits, ss.output, int(chunk))

        def mean(x, mask):
            return float(x[mask].mean()) if mask.any() else None

        lt = {"chunk_tokens": int(chunk),
              "latency_all_s": mean(lat, allm), "ttft_all_s": mean(ttft, allm),
              "latency_same_s": mean(lat, same), "ttft_same_s": mean(ttft, same),
              "latency_switch_s": mean(lat, sw), "ttft_switch_s": mean(ttft, sw)}
        lt["switch_slowdown"] = (lt["latency_switch_s"] / lt["latency_same_s"]
                                 if lt["latency_switch_s"] and lt["latency_same_s"] else None)
        r["latency"] = lt
    return r


# ------------------------------------------------------------------------------- flat views

STATS_COLUMNS = [
    ("workload", "workload", "{}"),
    ("models", "models", "{}"),
    ("calls", "calls", "{:d}"),
    ("switch_share", "switch", "{:.1%}"),
    ("switches_per_session_mean", "sw/sess", "{:.2f}"),
    ("prompt_switch_mean_tokens", "P@sw", "{:,.0f}"),
    ("prompt_switch_p99_tokens", "P99@sw", "{:,.0f}"),
    ("hit_all", "hit", "{:.1%}"),
    ("hit_switch", "hit@sw", "{:.1%}"),
    ("hit_same", "hit@same", "{:.1%}"),
    ("hit_all_cap", "hit(cap)", "{:.1%}"),
    ("hit_switch_cap", "hit@sw(cap)", "{:.1%}"),
    ("cost.routed_usd", "$routed", "{:.4f}"),
    ("cost.switch_tax_usd", "$sw-tax", "{:.4f}"),
    ("latency.switch_slowdown", "sw-slow", "{:.2f}x"),
]


def flatten_stats(r: Mapping[str, Any], prefix: str = "") -> dict:
    """Nested dicts to ``a.b`` keys; lists joined with ``/``."""
    out: dict[str, Any] = {}
    for k, v in r.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten_stats(v, key + "."))
        elif isinstance(v, (list, tuple)):
            out[key] = "/".join(str(x) for x in v)
        else:
            out[key] = v
    return out
