"""An iteration-level simulator of a ShadowPrefill cluster.

**Cluster.**  Each model of a routed pair (or of N > 2 models) runs K
instances (default 4) of continuous batching with chunked prefill: every
iteration schedules, in priority order, all running decodes (one token each),
in-flight prefill chunks and admissions from the FIFO waiting queue, under a
token budget (2,048) and a sequence cap (256).  An admission reserves the
request's whole KV (prompt + output) and is *blocked* when that much cannot
be freed by evicting cache entries.  An iteration lasts
``t(n_decode, decode_context, prefill chunks [+ shadow chunk])`` from part 1's
latency model (roofline from ``config.json`` + GPU preset, or fitted).
The last prefill chunk of a request emits its first token; a request with O
output tokens then decodes O - 1 iterations.

**Prefix cache.**  Per instance, a finished request leaves its prompt and
output as an LRU cache entry: finished normal requests (never hit: normal
traffic shares no prefixes here, but it occupies memory) and session contexts.
A routed call reuses ``min(cached, history)`` tokens of its session's entry
on the instance (part 1's token model: a rewritten history truncates every
model's copy to its first ``history`` tokens), at least one prompt token is
always computed.  Eviction order (no regression by construction): entries
idle for more than the cold age (only while shadow KV exists), shadow copies, the
shadow *tails* of normal copies (tokens shadow work appended to a session's
cached copy; the copy itself keeps its class and LRU place), normal entries;
LRU within each.

**Host tier** (Host Tier, Harvest-SLO+Host, Oracle+Host): an evicted
*session* entry spills to the instance's host DRAM (``host_gb_per_gpu`` per
GPU, LRU); a call whose host copy covers more than its HBM copy reloads the
difference over PCIe (``kv_bytes_per_token / (tp * pcie_bytes_per_s)`` per
token, serialized per instance) before its first chunk.

**Routed sessions.**  Sessions start as a Poisson process; each call is
issued at its predecessor's completion plus its gap.  A session has a sticky
instance per model (at its start: the instance of that model with the fewest
sticky sessions).  The router sends a call to the instance of its model with
the lowest estimated prefill completion, ``(queued prefill tokens + P -
cached) * seconds_per_prefill_token (+ host reload)``, counting cached tokens
only on the sticky instance; choosing another instance moves the sticky
instance (the old copy can no longer be hit).

**Shadow jobs** (harvesting policies and Dedicated).  While a session's
current call runs on model A, every other model B has a shadow job on the
session's sticky instance of B: its *target* is the session's known token
sequence (the call's prompt at once, then its output as it streams), its
*coverage* the session's cached copy on that instance; pending work is
``target - coverage``.  An instance adds shadow chunks last in an iteration
(Algorithm 1: none while its waiting queue is non-empty or an admission was
blocked; beta * TPOT-capped shadow-only iterations when idle; on busy
iterations the SLO-slack bound, or the routed-step credit when a routed call
is in the batch, spent only by jobs whose predicted switch probability is at least
``credit_gate``; Harvest spends a fixed credit on every busy iteration),
taking tokens from pending jobs in decreasing order of the predicted
probability that the session's next call goes to this model.  A chunk
attends over the job's coverage.  Chunks under ``n_min`` tokens are deferred.
Shadow KV is its own class, capped at ``shadow_kv_cap`` of the pool; it may
use free memory or entries idle for more than ``cold_age_s`` (evicting them)
and is evicted first (only the shadow's own tokens: see the eviction order above).
Reclaim guard: for ``cold_age_s`` after an admission on an instance dropped
unused shadow KV (evicted it with no host copy kept), free memory there is not
idle either, and chunks take only cold entries; without it, where no entry idles
for the cold age, shadows went into free memory that the next admission took
back at once, and were recomputed over and over.  A shadow copy whose prefix
was spilled to host DRAM
pauses (the switch call reloads it).  Dedicated runs every shadow job on its
model's extra instance (no normal traffic, no routed calls, full token
budget) into a warm copy there; a switch call pulls the part its serving
instance lacks over the network (``kv_transfer_gb_per_s`` per GPU) before its
first chunk.  Eager queues shadow work as ordinary (FIFO, normal-priority)
prefill-only requests, one in flight per session and model.  Oracle makes a
switch call's whole history cached for free.

**Measurement.**  Runs last ``warmup_s`` (120 s) plus ``measure_s`` (600 s)
and drain until every measured item finishes (sessions starting in the
window and normal requests arriving in it), with normal traffic continuing;
``drain_s`` caps the drain.  Energy and throughput integrate over the window.

Everything numeric runs in :func:`shadow_prefill.cluster._kernels.simulate`.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

from shadow_prefill.cluster import _kernels as _k
from shadow_prefill.cluster.policies import SHADOW_MODES, Policy, get_policy
from shadow_prefill.cluster.power import PowerModel, power_preset
from shadow_prefill.cluster.workload import (DEFAULT_WINDOWS, SESSION_DRAWS, RequestSizes, SessionSchedule, next_model_prior,
                                             normal_arrivals, schedule_sessions, synthetic_request_sizes)
from shadow_prefill.errors import ShadowError
from shadow_prefill.latency import LatencyModel, build_roofline
from shadow_prefill.sessions import SessionSet

__all__ = ["ClusterConfig", "Scenario", "RunResult", "simulate_cluster", "calibrate_capacity",
           "build_latency_models", "DEFAULT_PAIR"]

DEFAULT_PAIR = ("qwen2.5-7b", "llama-3.1-70b")


@dataclass(frozen=True)
class ClusterConfig:
    """The deployment: models (built-in names, ``config.json`` paths or latency models), GPU, sizes, controller."""

    models: tuple = DEFAULT_PAIR
    gpu: str = "h100"
    instances: int = 4
    tp: tuple | None = None
    chunk_tokens: int = 2048
    max_seqs: int = 256
    kv_memory_utilization: float = 0.9
    kv_capacity_tokens: tuple | None = None     # override per model (tests, what-ifs)
    host_gb_per_gpu: float = 64.0
    pcie_bytes_per_s: float | None = None       # override the GPU preset's PCIe bandwidth
    kv_transfer_gb_per_s: float = 50.0          # Dedicated: warm KV pulled to the serving instance, per GPU
    slo_scale: float = 1.0
    beta: float = 0.5
    margin: float = 0.1
    n_min: int = 256
    cold_age_s: float = 5.0
    shadow_kv_cap: float = 0.25
    prices: tuple | None = None                 # per model (input, output) $ per M tokens; default 1, 1
    cached_price_fraction: float = 0.1
    cache_normal_requests: bool = False         # keep finished normal requests as never-hit cache entries
    shadow_extends_whole_copy: bool = False     # legacy rule: an extended copy turns evict-first whole
    cold_entries_first: bool = True             # admissions evict entries idle > cold_age_s before shadow KV
    reclaim_guard: bool = True                  # no shadow into free memory for cold_age_s after an admission
                                                # dropped unused shadow KV on that instance
    credit_gate: float = 0.25                   # Harvest-SLO's routed-step credit (C2) goes only to shadow jobs
                                                # whose P(next call -> their model) >= this (0: every job)
    power: PowerModel | None = None

    def check(self, n_models: int | None = None) -> None:
        if len(self.models) < 2:
            raise ShadowError(f"a routed cluster needs at least two models, got {len(self.models)}")
        if n_models is not None and n_models != len(self.models):
            raise ShadowError(f"the sessions route over {n_models} models but the cluster has {len(self.models)} "
                              f"(give one --model per session model, in order)")
        if not isinstance(self.instances, int) or self.instances < 1:
            raise ShadowError(f"instances per model must be an integer >= 1, got {self.instances!r}")
        if self.tp is not None and len(self.tp) != len(self.models):
            raise ShadowError("tp must give one tensor-parallel degree per model")
        if not (isinstance(self.chunk_tokens, int) and self.chunk_tokens >= 1):
            raise ShadowError(f"chunk_tokens must be an integer >= 1, got {self.chunk_tokens!r}")
        if not (isinstance(self.max_seqs, int) and self.max_seqs >= 1):
            raise ShadowError(f"max_seqs must be an integer >= 1, got {self.max_seqs!r}")
        if not (0 < self.kv_memory_utilization <= 1):
            raise ShadowError("kv_memory_utilization must be in (0, 1]")
        if self.kv_capacity_tokens is not None and (len(self.kv_capacity_tokens) != len(self.models)
                                                    or any(int(x) < 1 for x in self.kv_capacity_tokens)):
            raise ShadowError("kv_capacity_tokens must give one positive token count per model")
        if not (self.kv_transfer_gb_per_s > 0 and math.isfinite(self.kv_transfer_gb_per_s)):
            raise ShadowError(f"kv_transfer_gb_per_s must be > 0, got {self.kv_transfer_gb_per_s!r}")
        for k in ("host_gb_per_gpu", "cold_age_s"):
            v = getattr(self, k)
            if not (math.isfinite(v) and v >= 0):
                raise ShadowError(f"{k} must be >= 0, got {v!r}")
        if self.pcie_bytes_per_s is not None and not (self.pcie_bytes_per_s > 0):
            raise ShadowError("pcie_bytes_per_s must be > 0")
        if not (self.slo_scale > 0 and math.isfinite(self.slo_scale)):
            raise ShadowError(f"slo_scale must be > 0, got {self.slo_scale!r}")
        if not (self.beta > 0):
            raise ShadowError(f"beta must be > 0, got {self.beta!r}")
        if not (0 <= self.margin < 1):
            raise ShadowError(f"margin must be in [0, 1), got {self.margin!r}")
        if not (isinstance(self.n_min, int) and self.n_min >= 1):
            raise ShadowError(f"n_min must be an integer >= 1, got {self.n_min!r}")
        if not (0 <= self.credit_gate <= 1):
            raise ShadowError(f"credit_gate must be in [0, 1], got {self.credit_gate!r}")
        if not (0 <= self.shadow_kv_cap <= 1):
            raise ShadowError(f"shadow_kv_cap must be in [0, 1], got {self.shadow_kv_cap!r}")
        if self.prices is not None and len(self.prices) != len(self.models):
            raise ShadowError("prices must give one (input, output) pair per model")

    def describe(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("models", "power")}
        d["models"] = [m.name if isinstance(m, LatencyModel) else str(m) for m in self.models]
        d["power"] = asdict(self.power_model)
        return d

    @property
    def power_model(self) -> PowerModel:
        return self.power if self.power is not None else power_preset(self.gpu)


@dataclass(frozen=True)
class Scenario:
    """One run's load and timing: normal-traffic load rho (of calibrated capacity) times a window multiplier."""

    rho: float = 0.7
    window: str | float = "peak"
    warmup_s: float = 120.0
    measure_s: float = 600.0
    drain_s: float = 1800.0
    session_rate: float = 0.2
    seed: int = 0
    # which sessions of the pool a seed replays (workload.schedule_sessions): "shuffle" (a fresh random draw
    # per seed, the same for every approach of that seed) or "in-order" (the pool's first sessions, the earlier rule)
    session_draw: str = "shuffle"

    @property
    def multiplier(self) -> float:
        if isinstance(self.window, str):
            if self.window not in DEFAULT_WINDOWS:
                raise ShadowError(f"unknown window {self.window!r}; known: {', '.join(DEFAULT_WINDOWS)} "
                                  f"(or a load multiplier)")
            return DEFAULT_WINDOWS[self.window]
        return float(self.window)

    def check(self) -> None:
        if not (self.rho >= 0 and math.isfinite(self.rho)):
            raise ShadowError(f"load rho must be >= 0, got {self.rho!r}")
        if not (self.multiplier >= 0):
            raise ShadowError(f"window multiplier must be >= 0, got {self.window!r}")
        if not (self.warmup_s >= 0 and self.measure_s > 0 and self.drain_s >= 0):
            raise ShadowError("warmup_s >= 0, measure_s > 0 and drain_s >= 0 are required")
        if not (self.session_rate > 0):
            raise ShadowError(f"session rate must be > 0 sessions/s, got {self.session_rate!r}")
        if self.session_draw not in SESSION_DRAWS:
            raise ShadowError(f"session draw must be one of {', '.join(SESSION_DRAWS)}, got {self.session_draw!r}")


# ============================================================================ latency models

_LM_CACHE: dict = {}


def build_latency_models(config: ClusterConfig) -> list[LatencyModel]:
    """Part 1's latency model of every model of the cluster (roofline on ``config.gpu`` unless given)."""
    out = []
    for j, m in enumerate(config.models):
        if isinstance(m, LatencyModel):
            out.append(m)
            continue
        tp = None if config.tp is None else int(config.tp[j])
        key = (str(m), config.gpu, tp)
        if key not in _LM_CACHE:
            _LM_CACHE[key] = build_roofline(str(m), config.gpu, tp)
        out.append(_LM_CACHE[key])
    return out


def _instance_arrays(config: ClusterConfig, lms: Sequence[LatencyModel], dedicated: bool):
    caps, host_caps, pcie, tps, mdl, ded, xfer = [], [], [], [], [], [], []
    for j, lm in enumerate(lms):
        if config.kv_capacity_tokens is not None:
            cap = int(config.kv_capacity_tokens[j])
        else:
            cap = lm.kv_capacity_tokens(config.kv_memory_utilization)
            if cap < 1:
                raise ShadowError(f"model {lm.name!r}: its weights leave no KV memory on {config.gpu} x {lm.tp}")
        try:
            kvb = lm.kv_bytes_per_token
        except ShadowError:
            kvb = 0
        pcie_bw = config.pcie_bytes_per_s or (lm.gpu.pcie_bytes_per_s if lm.gpu is not None else 64e9)
        s_per_tok = kvb / (lm.tp * pcie_bw) if kvb > 0 else 0.0
        x_per_tok = kvb / (lm.tp * config.kv_transfer_gb_per_s * 1e9) if kvb > 0 else 0.0
        host = int(config.host_gb_per_gpu * 1e9 * lm.tp / kvb) if kvb > 0 else 0
        for k in range(config.instances + (1 if dedicated else 0)):
            caps.append(cap)
            host_caps.append(host)
            pcie.append(s_per_tok)
            tps.append(lm.tp)
            mdl.append(j)
            ded.append(k == config.instances)
            xfer.append(x_per_tok)
    return (np.asarray(mdl, np.int64), np.asarray([caps, host_caps], np.int64).T.copy(),
            np.asarray(pcie, np.float64), np.asarray(tps, np.float64), np.asarray(ded, np.bool_),
            np.asarray(xfer, np.float64))


def _params(config: ClusterConfig, policy: Policy, warm: float, meas_end: float, t_max: float) -> np.ndarray:
    par = np.zeros(_k.Q_SIZE, np.float64)
    pw = config.power_model
    par[_k.Q_BETA] = config.beta
    par[_k.Q_MARGIN] = config.margin
    par[_k.Q_DELTA] = policy.delta
    par[_k.Q_NMIN] = config.n_min
    par[_k.Q_GATE] = policy.gate
    par[_k.Q_COLD_AGE] = config.cold_age_s
    par[_k.Q_SHADOW_CAP] = config.shadow_kv_cap
    par[_k.Q_CHUNK] = config.chunk_tokens
    par[_k.Q_MAX_SEQS] = config.max_seqs
    par[_k.Q_WARM] = warm
    par[_k.Q_MEAS_END] = meas_end
    par[_k.Q_T_MAX] = t_max
    par[_k.Q_P_IDLE] = pw.idle_w
    par[_k.Q_P_MEM] = pw.mem_bound_w
    par[_k.Q_P_MAX] = pw.max_w
    par[_k.Q_POLL] = max(0.05, config.cold_age_s / 4.0) if config.cold_age_s > 0 else 0.05
    par[_k.Q_CACHE_NORMAL] = float(config.cache_normal_requests)
    par[_k.Q_WHOLE_COPY] = float(config.shadow_extends_whole_copy)
    par[_k.Q_COLD_FIRST] = float(config.cold_entries_first)
    par[_k.Q_RECLAIM_GUARD] = float(config.reclaim_guard)
    par[_k.Q_CREDIT_GATE] = float(config.credit_gate)
    return par


def _policy_vector(policy: Policy) -> np.ndarray:
    pol = np.zeros(_k.P_SIZE, np.int64)
    pol[_k.P_SHADOW] = SHADOW_MODES[policy.shadow]
    pol[_k.P_HOST] = int(policy.host)
    pol[_k.P_ORACLE] = int(policy.oracle)
    pol[_k.P_TOP1] = int(policy.top1)
    return pol


def _slo_arrays(lm: LatencyModel, prompt: np.ndarray, config: ClusterConfig):
    return _k.request_slos(lm.params, prompt.astype(np.int64), config.chunk_tokens, 1.0, 5.0, 0.025, 5.0,
                           config.slo_scale)


def _model_tpot(lm: LatencyModel, config: ClusterConfig) -> float:
    return config.slo_scale * max(0.025, 5.0 * float(_k.decode_time(lm.params, 1, 1.0)))


def _tok_time(lm: LatencyModel, config: ClusterConfig) -> float:
    q = config.chunk_tokens
    return float(_k.prefill_time(lm.params, q, 0, q)) / q


# ============================================================================ results

@dataclass(frozen=True, eq=False)
class RunResult:
    """One simulation: per-call and per-request outcomes and instance statistics (times in s)."""

    approach: str
    scenario: Scenario
    config: dict
    # calls (one row per call of every run session)
    call_session: np.ndarray
    call_model: np.ndarray
    call_prompt: np.ndarray
    call_output: np.ndarray
    call_hist: np.ndarray
    call_switch: np.ndarray
    call_measured: np.ndarray
    call_issue_s: np.ndarray
    call_first_token_s: np.ndarray
    call_finish_s: np.ndarray
    call_hit: np.ndarray
    call_shadow_hit: np.ndarray
    call_reload_tokens: np.ndarray
    call_instance: np.ndarray
    call_ttft_slo_s: np.ndarray
    call_tpot_slo_s: np.ndarray
    call_price_in: np.ndarray
    call_price_out: np.ndarray
    # normal requests
    normal_arrival_s: np.ndarray
    normal_first_token_s: np.ndarray
    normal_finish_s: np.ndarray
    normal_output: np.ndarray
    normal_ttft_slo_s: np.ndarray
    normal_tpot_slo_s: np.ndarray
    normal_instance: np.ndarray
    # instances and totals
    instance_model: np.ndarray
    instance_dedicated: np.ndarray
    instance_kv_tokens: np.ndarray
    instance_stats: np.ndarray
    totals: np.ndarray
    capacity_rps: tuple
    rates_rps: tuple
    wall_s: float
    cached_price_fraction: float = 0.1

    # ------------------------------------------------------------ derived
    @property
    def window_s(self) -> tuple[float, float]:
        return self.scenario.warmup_s, self.scenario.warmup_s + self.scenario.measure_s

    @property
    def call_done(self) -> np.ndarray:
        return self.call_finish_s >= 0

    @property
    def call_latency_s(self) -> np.ndarray:
        return np.where(self.call_done, self.call_finish_s - self.call_issue_s, np.nan)

    @property
    def call_ttft_s(self) -> np.ndarray:
        return np.where(self.call_done, self.call_first_token_s - self.call_issue_s, np.nan)

    @property
    def call_cost(self) -> np.ndarray:
        """Routed token cost of every call ($): cached input at ``cached_price_fraction`` of the input price."""
        unc = self.call_prompt - self.call_hit
        return (self.call_price_in * (unc + self.cached_price_fraction * self.call_hit)
                + self.call_price_out * self.call_output) / 1e6

    @staticmethod
    def _slo_met(first, finish, start, out, ttft_slo, tpot_slo):
        done = finish >= 0
        ttft = first - start
        tpot = np.where(out > 1, (finish - first) / np.maximum(out - 1, 1), 0.0)
        return done & (ttft <= ttft_slo) & (tpot <= tpot_slo)

    @property
    def normal_measured(self) -> np.ndarray:
        a, b = self.window_s
        return (self.normal_arrival_s >= a) & (self.normal_arrival_s < b)

    @property
    def normal_slo_met(self) -> np.ndarray:
        return self._slo_met(self.normal_first_token_s, self.normal_finish_s, self.normal_arrival_s,
                             self.normal_output, self.normal_ttft_slo_s, self.normal_tpot_slo_s)

    @property
    def call_slo_met(self) -> np.ndarray:
        return self._slo_met(self.call_first_token_s, self.call_finish_s, self.call_issue_s, self.call_output,
                             self.call_ttft_slo_s, self.call_tpot_slo_s)

    def summary(self) -> dict:
        """Absolute metrics of the run over its measured calls and requests."""
        cm = self.call_measured & self.call_done
        sw = cm & self.call_switch
        lat, ttft = self.call_latency_s, self.call_ttft_s
        nm = self.normal_measured
        W = self.scenario.measure_s
        st = self.instance_stats
        tot = self.totals
        good = int(self.normal_slo_met[nm].sum() + self.call_slo_met[self.call_measured].sum())
        energy = float(st[:, _k.S_ENERGY_J].sum())
        pf_shadow = float(st[:, _k.S_PF_SHADOW].sum())
        pf_other = float(st[:, _k.S_PF_NORMAL].sum() + st[:, _k.S_PF_ROUTED].sum())
        tasks = np.unique(self.call_session[cm])
        task_time = np.bincount(self.call_session[cm], weights=lat[cm], minlength=int(self.call_session.max(initial=0)) + 1)
        comp = float(tot[_k.G_SHADOW_COMPUTED])
        kv_pool = float(self.instance_kv_tokens.sum())

        def mean(x, mask):
            return float(np.mean(x[mask])) if mask.any() else float("nan")

        def wrate(num, den, mask):
            d = float(den[mask].sum())
            return float(num[mask].sum()) / d if d > 0 else float("nan")

        return {
            "approach": self.approach, "rho": self.scenario.rho, "window": self.scenario.window,
            "seed": self.scenario.seed, "calls": int(cm.sum()), "switch_calls": int(sw.sum()),
            "unfinished_calls": int((self.call_measured & ~self.call_done).sum()),
            "mean_call_latency_s": mean(lat, cm), "mean_switch_latency_s": mean(lat, sw),
            "mean_call_ttft_s": mean(ttft, cm), "mean_switch_ttft_s": mean(ttft, sw),
            "llm_time_per_task_s": float(task_time[tasks].mean()) if tasks.size else float("nan"),
            "hit_rate": wrate(self.call_hit, self.call_prompt, cm),
            "switch_hit_rate": wrate(self.call_hit, self.call_prompt, sw),
            "token_cost_usd": float(self.call_cost[cm].sum()),
            "normal_requests": int(nm.sum()),
            "normal_slo_attainment": float(self.normal_slo_met[nm].mean()) if nm.any() else float("nan"),
            "shadow_tokens": comp, "shadow_used_tokens": float(tot[_k.G_SHADOW_USED]),
            "shadow_unused_frac": (1.0 - float(tot[_k.G_SHADOW_USED]) / comp) if comp > 0 else float("nan"),
            "prefill_tok_s": (pf_shadow + pf_other) / W, "prefill_tok_s_excl_shadow": pf_other / W,
            "energy_j": energy, "good_requests": good,
            "energy_per_good_request_j": energy / good if good else float("nan"),
            "shadow_kv_mean_frac": float(st[:, _k.S_SHADOW_KV_INT].sum()) / (kv_pool * W) if kv_pool else 0.0,
            "host_reload_tokens": float(tot[_k.G_RELOAD_TOK]),
            "iterations": int(tot[_k.G_ITERS]), "sim_end_s": float(tot[_k.G_END_TIME]),
            "truncated": bool(tot[_k.G_TRUNCATED]), "wall_s": self.wall_s,
            "sim_s_per_wall_s": float(tot[_k.G_END_TIME]) / self.wall_s if self.wall_s > 0 else float("inf"),
        }


# ============================================================================ calibration

_CAP_CACHE: dict = {}


def _sizes_key(sizes: RequestSizes) -> str:
    h = hashlib.sha1()
    h.update(sizes.prompt.tobytes())
    h.update(sizes.output.tobytes())
    return h.hexdigest()


def _normal_only(lm: LatencyModel, config: ClusterConfig, kv_cap: int, rate: float, sizes: RequestSizes,
                 duration_s: float, warm_s: float, seed: int) -> float:
    """SLO attainment (both SLOs) of one instance under Poisson normal traffic at ``rate`` req/s."""
    rng = np.random.default_rng(seed)
    cap = np.array([kv_cap], np.int64)
    t, inst, p, o = normal_arrivals(np.array([rate]), duration_s, sizes, rng, clip_total=cap)
    ttft, tpot = _slo_arrays(lm, p, config)
    lms = lm.params[None, :].copy()
    pol = _policy_vector(Policy("No Shadow"))
    par = _params(config, Policy("No Shadow"), warm_s, duration_s, duration_s * 3 + 600)
    e = np.zeros(0, np.int64)
    ef = np.zeros(0, np.float64)
    cluster = _k.Cluster(lms, np.array([_model_tpot(lm, config)]), np.array([_tok_time(lm, config)]),
                         np.zeros(1, np.int64), np.array([[kv_cap, 0]], np.int64), np.zeros(1), np.ones(1),
                         np.zeros(1, np.bool_), np.zeros(1))
    calls = _k.Calls(ef, np.zeros(1, np.int64), np.zeros(0, np.bool_), e, e, e, e, e, ef, np.zeros(0, np.bool_),
                     ef, ef, np.zeros((0, 1)), e)
    out = _k.simulate(pol, par, cluster, _k.Normals(t, inst, p, o, ttft, tpot), calls)
    n_out = out[2]
    m = (t >= warm_s) & (t < duration_s)
    if not m.any():
        return 1.0
    met = RunResult._slo_met(n_out[:, 0], n_out[:, 1], t, o, ttft, tpot)
    return float(met[m].mean())


def calibrate_capacity(lm: LatencyModel, config: ClusterConfig, sizes: RequestSizes, *, target: float = 0.9,
                       duration_s: float = 300.0, warm_s: float = 60.0, seed: int = 12345, rel_tol: float = 0.03,
                       kv_capacity_tokens: int | None = None) -> float:
    """The highest Poisson rate (req/s) at which ``target`` of one instance's requests meet both SLOs.

    Found by the simulator itself (normal traffic only): doubling to bracket,
    then bisection to ``rel_tol``; memoized per model, sizes and settings.
    """
    if not (0 < target < 1):
        raise ShadowError(f"capacity target must be in (0, 1), got {target!r}")
    cap = kv_capacity_tokens if kv_capacity_tokens is not None else lm.kv_capacity_tokens(config.kv_memory_utilization)
    key = (lm.params.tobytes(), cap, config.chunk_tokens, config.max_seqs, config.slo_scale, _sizes_key(sizes),
           target, duration_s, warm_s, seed, rel_tol)
    if key in _CAP_CACHE:
        return _CAP_CACHE[key]
    lo, hi = 0.0, 1.0
    while _normal_only(lm, config, cap, hi, sizes, duration_s, warm_s, seed) >= target:
        lo, hi = hi, hi * 2.0
        if hi > 1e5:
            raise ShadowError(f"model {lm.name!r}: capacity above 1e5 req/s; check the latency model")
    if lo == 0.0:
        lo = hi / 2.0
        while lo > 1e-4 and _normal_only(lm, config, cap, lo, sizes, duration_s, warm_s, seed) < target:
            hi, lo = lo, lo / 2.0
    while (hi - lo) > rel_tol * lo:
        mid = 0.5 * (lo + hi)
        if _normal_only(lm, config, cap, mid, sizes, duration_s, warm_s, seed) >= target:
            lo = mid
        else:
            hi = mid
    _CAP_CACHE[key] = lo
    return lo


# ============================================================================ one run

def _expand_calls(ss: SessionSet, src: np.ndarray):
    lengths = ss.lengths[src]
    offsets = np.zeros(src.size + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    rows = np.concatenate([np.arange(ss.offsets[s], ss.offsets[s + 1]) for s in src]) if src.size else \
        np.zeros(0, np.int64)
    sess = np.repeat(np.arange(src.size, dtype=np.int64), lengths)
    return offsets, rows.astype(np.int64), sess


def simulate_cluster(sessions: SessionSet, config: ClusterConfig = ClusterConfig(),
                     policy: str | Policy = "No Shadow", scenario: Scenario = Scenario(),
                     sizes: RequestSizes | None = None, capacity: Sequence[float] | float | None = None,
                     prior: np.ndarray | None = None, session_starts: Sequence[float] | None = None) -> RunResult:
    """Simulate one approach on one scenario (same seed: same traffic and sessions for every approach).

    ``sizes``: normal-traffic request sizes (default: synthetic, Azure-conversation-like);
    ``capacity``: per-instance capacity (req/s) per model, calibrated when None;
    ``prior``: next-model probabilities per call of ``sessions`` (default :func:`next_model_prior`);
    ``session_starts``: explicit start times (s) of the sessions, in order, instead of Poisson starts
    (each session once; measured when it starts inside the window).
    """
    policy = get_policy(policy)
    config.check(sessions.n_models)
    scenario.check()
    if sessions.n_calls == 0:
        raise ShadowError("the session workload has no calls")
    lms = build_latency_models(config)
    M = len(lms)
    sizes = sizes if sizes is not None else synthetic_request_sizes()
    inst_model, inst_caps, inst_pcie, inst_tp, inst_ded, inst_xfer = _instance_arrays(config, lms, policy.dedicated)
    kv_by_model = np.array([inst_caps[np.flatnonzero(inst_model == j)[0], 0] for j in range(M)], np.int64)
    # capacity and rates
    if capacity is None:
        caps = [calibrate_capacity(lm, config, sizes.clipped(int(kv_by_model[j])),
                                   kv_capacity_tokens=int(kv_by_model[j])) for j, lm in enumerate(lms)]
    else:
        caps = [float(capacity)] * M if np.isscalar(capacity) else [float(c) for c in capacity]
        if len(caps) != M or any(not (c >= 0) for c in caps):
            raise ShadowError(f"capacity must give one rate >= 0 req/s per model ({M})")
    mult = scenario.multiplier
    rates = np.array([0.0 if inst_ded[i] else scenario.rho * mult * caps[inst_model[i]]
                      for i in range(inst_model.size)])
    warm = float(scenario.warmup_s)
    meas_end = warm + float(scenario.measure_s)
    t_max = meas_end + float(scenario.drain_s)
    rng_traffic = np.random.default_rng([scenario.seed, 1])
    rng_sess = np.random.default_rng([scenario.seed, 2])
    nt, ni, npr, no = normal_arrivals(rates, t_max, sizes, rng_traffic, clip_total=inst_caps[:, 0])
    n_ttft = np.zeros(nt.size)
    n_tpot = np.zeros(nt.size)
    for j, lm in enumerate(lms):
        sel = inst_model[ni] == j
        if sel.any():
            n_ttft[sel], n_tpot[sel] = _slo_arrays(lm, npr[sel], config)
    # sessions
    if session_starts is None:
        sched = schedule_sessions(sessions, scenario.session_rate, warm, scenario.measure_s, rng_sess,
                                  scenario.session_draw)
    else:
        st = np.asarray(session_starts, dtype=np.float64)
        if st.shape != (sessions.n_sessions,) or not np.all(np.isfinite(st)) or np.any(st < 0):
            raise ShadowError(f"session_starts must give one finite time >= 0 per session ({sessions.n_sessions})")
        order = np.argsort(st, kind="stable")
        sched = SessionSchedule(order.astype(np.int64), st[order], (st[order] >= warm) & (st[order] < meas_end),
                                {"sessions_started": int(st.size), "explicit": True})
    offsets, rows, csess = _expand_calls(sessions, sched.source)
    c_model = sessions.model[rows].astype(np.int64)
    c_prompt = sessions.prompt[rows].astype(np.int64)
    c_hist = sessions.history[rows].astype(np.int64)
    c_output = sessions.output[rows].astype(np.int64)
    c_gap = sessions.gap_s[rows].astype(np.float64)
    c_switch = sessions.is_switch[rows]
    too_big = c_prompt + c_output > kv_by_model[c_model]
    if too_big.any():
        k = int(np.flatnonzero(too_big)[0])
        s = int(sched.source[csess[k]])
        raise ShadowError(f"session {sessions.session_ids[s]!r}: a call of {c_prompt[k] + c_output[k]} tokens "
                          f"exceeds the KV capacity of {config.describe()['models'][c_model[k]]} "
                          f"({kv_by_model[c_model[k]]} tokens)")
    pri = next_model_prior(sessions) if prior is None else np.asarray(prior, np.float64)
    if pri.shape != (sessions.n_calls, M):
        raise ShadowError(f"prior must have shape (calls, models) = {(sessions.n_calls, M)}")
    c_pnext = pri[rows].copy()
    masked = c_pnext.copy()
    masked[np.arange(rows.size), c_model] = -1.0
    c_top = np.argmax(masked, axis=1).astype(np.int64) if rows.size else np.zeros(0, np.int64)
    c_ttft = np.zeros(rows.size)
    c_tpot = np.zeros(rows.size)
    for j, lm in enumerate(lms):
        sel = c_model == j
        if sel.any():
            c_ttft[sel], c_tpot[sel] = _slo_arrays(lm, c_prompt[sel], config)
    lm_mat = np.stack([lm.params for lm in lms]).astype(np.float64)
    model_tpot = np.array([_model_tpot(lm, config) for lm in lms])
    tok_time = np.array([_tok_time(lm, config) for lm in lms])
    pol = _policy_vector(policy)
    par = _params(config, policy, warm, meas_end, t_max)
    t0 = time.perf_counter()
    c_out, c_int, n_out, istats, gstats = _k.simulate(
        pol, par, _k.Cluster(lm_mat, model_tpot, tok_time, inst_model, inst_caps, inst_pcie, inst_tp, inst_ded,
                             inst_xfer),
        _k.Normals(nt, ni, npr, no, n_ttft, n_tpot),
        _k.Calls(sched.start_s, offsets, sched.measured, csess, c_model, c_prompt, c_hist, c_output, c_gap,
                 c_switch, c_ttft, c_tpot, c_pnext, c_top))
    wall = time.perf_counter() - t0
    prices = config.prices or tuple((1.0, 1.0) for _ in range(M))
    pin = np.array([float(p[0]) for p in prices])[c_model]
    pout = np.array([float(p[1]) for p in prices])[c_model]
    return RunResult(
        approach=policy.name, scenario=scenario, config=config.describe(),
        call_session=csess, call_model=c_model, call_prompt=c_prompt, call_output=c_output, call_hist=c_hist,
        call_switch=c_switch, call_measured=sched.measured[csess], call_issue_s=c_out[:, 0],
        call_first_token_s=c_out[:, 1], call_finish_s=c_out[:, 2], call_hit=c_int[:, 0].clip(0),
        call_shadow_hit=c_int[:, 1], call_reload_tokens=c_int[:, 3].clip(0), call_instance=c_int[:, 2],
        call_ttft_slo_s=c_ttft, call_tpot_slo_s=c_tpot, call_price_in=pin, call_price_out=pout,
        normal_arrival_s=nt, normal_first_token_s=n_out[:, 0], normal_finish_s=n_out[:, 1], normal_output=no,
        normal_ttft_slo_s=n_ttft, normal_tpot_slo_s=n_tpot, normal_instance=ni,
        instance_model=inst_model, instance_dedicated=inst_ded, instance_kv_tokens=inst_caps[:, 0].copy(),
        instance_stats=istats, totals=gstats, capacity_rps=tuple(caps), rates_rps=tuple(float(r) for r in rates),
        wall_s=wall, cached_price_fraction=config.cached_price_fraction)
