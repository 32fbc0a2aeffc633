"""Deployment planner for a routed model pair: which GPUs each model gets, at which tensor-parallel size,
co-located or not, ranked by the exact chain's throughput at each N (docs/plan.md).

Steps (each rule lives where it is named):

1. **Candidates.** Every placement of the two models on ``gpus`` GPUs of one kind: *separate* (small on
   ``t_s`` GPUs, large on ``t_l`` others, ``t_s + t_l <= G``) or *co-located* (the smaller GPU set nested in
   the larger one, ``t_s, t_l <= G``). A model's tensor-parallel size ``t`` must divide its attention heads
   and suit its KV heads (:meth:`tr_model.tuning.kvplan.ModelFootprint.kv_heads_per_gpu`).
2. **Memory.** The KV plan (:func:`tr_model.tuning.kvplan.plan_kv_cache`) gives the common KV-token capacity
   ``T``; a candidate fits at N when ``T >= N * context_tokens``. The headroom is ``T - N * context_tokens``.
3. **Latencies.** ``L_i(b)``: a measured profile (``latency_profiles``) where given, moved to the candidate's
   tensor-parallel size by the roofline's own difference; else the roofline below. Co-running ``Lco_i(b)``:
   given factors or tables where given, else the bandwidth-sharing contention model below.
4. **Chain.** B*(N) by the optimizer's exhaustive search (:func:`tr_model.api.optimize`), the throughput,
   per-request tok/s and admission latency of B*; results are cached across candidates whose latency inputs
   are identical.
5. **Ranking.** Per N, best first; a plan is *dominated* when another is at least as good in throughput
   and per-request tok/s on no more GPUs (and better in one).

Roofline of one step of model i at batch b on tensor-parallel size t (GPU table ``data/gpus/*.json``)::

    mem_ms     = (W_read / t + b (c + 1) kv_t) / BW                    (profiler.roofline.step_bytes)
    compute_ms = 2 (W_read / dtype_bytes / t) b / FLOPS                 (dense matmuls; attention ignored)
    allreduce  = 2 layers (a + 2 (t - 1) / t  b hidden dtype_bytes / IC)   when t > 1 (two per layer, ring)
    overhead   = layers x launch_overhead_ms_per_layer
    L(b)       = max(mem_ms, compute_ms) + allreduce + overhead

Contention model (co-located, no measured table): while both run, two weight streams share the memory
system equally; model j streams a fraction ``u_j = mem_j(1) / L_j(1)`` of its step, so model i's memory time
is doubled for that fraction: ``Lco_i(b) = L_i(b) + u_j mem_i(b)``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from tr_core.errors import SpecError, short_repr

__all__ = ["GPUKind", "ModelPlacement", "Candidate", "LatencyEstimate", "Plan", "Dropped", "PlanResult",
           "load_gpu", "GPU_KINDS", "roofline_latency_ms", "candidates", "plan", "plan_to_dict",
           "PLAN_SCHEMA_VERSION"]

PLAN_SCHEMA_VERSION = 1
GPU_KINDS = ("a100", "h100", "h200")
_GPU_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "gpus")
_GPU_NUMBERS = ("memory_gib", "memory_bandwidth_bytes_per_s", "bf16_flop_per_s", "interconnect_bytes_per_s",
                "allreduce_latency_us", "launch_overhead_ms_per_layer")
_GPU_KEYS = ("schema_version", "kind", "name", *_GPU_NUMBERS, "sources", "$schema", "comment")
MAX_GPUS = 64


@dataclass(frozen=True)
class GPUKind:
    """One GPU kind: memory, bandwidths, FLOP/s and the fixed per-step costs, each with its source."""

    name: str
    memory_gib: float
    memory_bandwidth_bytes_per_s: float
    bf16_flop_per_s: float
    interconnect_bytes_per_s: float
    allreduce_latency_us: float
    launch_overhead_ms_per_layer: float
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)
    path: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, **{k: getattr(self, k) for k in _GPU_NUMBERS}, "sources": dict(self.sources),
                "path": self.path}


def load_gpu(kind: str) -> GPUKind:
    """A built-in kind (``a100``, ``h100``, ``h200``) or a JSON file with the same fields."""
    if not isinstance(kind, str) or not kind:
        raise SpecError(f"--gpu must be one of {', '.join(GPU_KINDS)} or a JSON file, got {short_repr(kind)}")
    if kind.lower() in GPU_KINDS:
        path = os.path.join(_GPU_DIR, f"{kind.lower()}.json")
    elif kind.endswith(".json") or os.path.sep in kind:
        path = kind
    else:
        raise SpecError(f"--gpu: unknown GPU kind {kind!r} (known: {', '.join(GPU_KINDS)}, or a JSON file)")
    from tr_model.tuning.kvplan import _number, _read_json_file
    doc = _read_json_file(path, "GPU file")
    where = f"GPU file {path!r}"
    if not isinstance(doc, dict):
        raise SpecError(f"{where}: must be a JSON object, got {short_repr(doc)}")
    unknown = sorted(k for k in doc if k not in _GPU_KEYS)
    if unknown:  # a misspelt field would otherwise be ignored (and a required one then reported missing)
        raise SpecError(f"{where}: unknown field {short_repr(unknown[0])} (known: {', '.join(_GPU_KEYS[:-2])})")
    ver = doc.get("schema_version", 1)
    if isinstance(ver, bool) or ver != 1:
        raise SpecError(f"{where}: unsupported schema_version {short_repr(ver)} (this tool reads 1)")
    if doc.get("kind", "gpu") != "gpu":
        raise SpecError(f"{where}: 'kind' must be \"gpu\", got {short_repr(doc['kind'])} (not a GPU file?)")
    if not isinstance(doc.get("name", ""), str):
        raise SpecError(f"{where}: 'name' must be a string, got {short_repr(doc['name'])}")
    for key in _GPU_NUMBERS:
        if key not in doc:
            raise SpecError(f"{where}: missing field {key!r}")
    vals = {k: _number(doc[k], where, k, minimum=0.0, strict=k not in ("allreduce_latency_us",
                                                                      "launch_overhead_ms_per_layer"), maximum=1e18)
            for k in _GPU_NUMBERS}
    sources = doc.get("sources", {})
    if not isinstance(sources, dict):
        raise SpecError(f"{where}: sources must be an object")
    return GPUKind(name=str(doc.get("name", os.path.basename(path))), sources=dict(sources), path=path, **vals)


@dataclass(frozen=True)
class ModelPlacement:
    model: str
    gpus: tuple[int, ...]
    tensor_parallel: int


@dataclass(frozen=True)
class Candidate:
    placement: tuple[ModelPlacement, ...]
    colocated: bool

    @property
    def gpus_used(self) -> int:
        return len({g for m in self.placement for g in m.gpus})

    @property
    def label(self) -> str:
        s, l = self.placement
        return (f"{'coloc' if self.colocated else 'separate'} {s.model}:TP{s.tensor_parallel}"
                f"[{','.join(map(str, s.gpus))}] {l.model}:TP{l.tensor_parallel}[{','.join(map(str, l.gpus))}]")

    def placement_dict(self) -> list[dict]:
        return [{"model": m.model, "gpus": list(m.gpus), "tensor_parallel": m.tensor_parallel}
                for m in self.placement]


@dataclass(frozen=True)
class LatencyEstimate:
    """``L(b)`` (solo) and ``Lco(b)`` (co-running, None when not co-located) of one model in one candidate: the
    model and its tensor-parallel degree are those of its placement."""

    placement: ModelPlacement
    batch_size: tuple[int, ...]
    solo_ms: tuple[float, ...]
    corun_ms: tuple[float, ...] | None
    source: Mapping[str, Any] = field(compare=False, hash=False, default_factory=dict)

    @property
    def model(self) -> str:
        return self.placement.model

    @property
    def tensor_parallel(self) -> int:
        return self.placement.tensor_parallel


@dataclass(frozen=True)
class Plan:
    candidate: Candidate
    N: int
    B: tuple[int, ...]
    throughput_tok_s: float
    per_request_tok_s: float
    admission_latency_ms: tuple[float, ...]
    eager_throughput_tok_s: float
    latencies: tuple[LatencyEstimate, ...]
    kv_token_capacity: int
    kv_headroom_tokens: int
    residual: float
    states: int
    roundings: tuple = ()
    ratio_to_best: float = 1.0


@dataclass(frozen=True)
class Dropped:
    candidate: Candidate
    N: int | None
    reason: str          # "does not fit", "dominated", "below --min-per-request-tok-s"
    detail: str


@dataclass(frozen=True)
class PlanResult:
    gpu: GPUKind
    gpus: int
    models: tuple[str, ...]
    Ns: tuple[int, ...]
    plans: Mapping[int, tuple[Plan, ...]]
    dropped: tuple[Dropped, ...]
    settings: Mapping[str, Any]
    candidates: int
    chains_solved: int


# --- latency estimates -------------------------------------------------------------------------------------

def _valid_tp(fp, heads: int, t: int) -> bool:
    if heads % t:
        return False
    try:
        fp.kv_heads_per_gpu(t)
    except SpecError:
        return False
    return True


def _roofline_terms(fp, shape, gpu: GPUKind, t: int, b: int, context_tokens: int) -> dict:
    """The roofline's terms for one step (ms); see the module docstring."""
    from profiler.roofline import input_embedding_bytes_from_config, step_bytes
    embed = shape["embed_bytes"]
    w_read = fp.weight_bytes_per_gpu(t) - (-(-embed // t))
    nbytes = step_bytes(w_read, fp.kv_bytes_per_token_per_gpu(t), b, context_tokens, 1)
    mem = nbytes / gpu.memory_bandwidth_bytes_per_s * 1e3
    compute = 2.0 * (w_read / fp.dtype_bytes) * b / gpu.bf16_flop_per_s * 1e3
    ar = 0.0
    if t > 1:
        msg = b * shape["hidden"] * fp.dtype_bytes
        ar = 2 * fp.num_layers * (gpu.allreduce_latency_us * 1e-3
                                  + 2.0 * (t - 1) / t * msg / gpu.interconnect_bytes_per_s * 1e3)
    over = fp.num_layers * gpu.launch_overhead_ms_per_layer
    return {"bytes_read": nbytes, "memory_ms": mem, "compute_ms": compute, "allreduce_ms": ar,
            "overhead_ms": over, "total_ms": max(mem, compute) + ar + over}


def roofline_latency_ms(fp, config: Mapping[str, Any], gpu: GPUKind, tensor_parallel: int, batch_size: int,
                        context_tokens: int) -> dict:
    """The roofline estimate of one step (the terms and ``total_ms``) of a model from its footprint and config."""
    return _roofline_terms(fp, _shape_info(fp, config), gpu, tensor_parallel, batch_size, context_tokens)


def _shape_info(fp, config) -> dict:
    from profiler.roofline import input_embedding_bytes_from_config
    from tr_core.model_config import read_shape
    shape = read_shape(config, fp.name, require_intermediate=False, require_vocab=False)
    return {"embed_bytes": input_embedding_bytes_from_config(config, fp.dtype_bytes), "hidden": shape.hidden,
            "heads": shape.heads}


# --- candidates --------------------------------------------------------------------------------------------

def candidates(names: Sequence[str], tps: Sequence[Sequence[int]], G: int) -> list[Candidate]:
    """Every placement of two models on G GPUs (module docstring, step 1); ``tps``: valid sizes per model."""
    out = []
    for ts in tps[0]:
        for tl in tps[1]:
            if ts + tl <= G:
                out.append(Candidate((ModelPlacement(names[0], tuple(range(ts)), ts),
                                      ModelPlacement(names[1], tuple(range(ts, ts + tl)), tl)), False))
    for ts in tps[0]:
        for tl in tps[1]:
            if max(ts, tl) <= G:
                out.append(Candidate((ModelPlacement(names[0], tuple(range(ts)), ts),
                                      ModelPlacement(names[1], tuple(range(tl)), tl)), True))
    return out


# --- the planner -------------------------------------------------------------------------------------------

def _as_int(v: Any, name: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise SpecError(f"{name} must be an integer in {lo}..{hi}, got {short_repr(v)}")
    return v


def plan(models: Sequence[str | os.PathLike], gpu: str | GPUKind, gpus: int, N: Sequence[int] | int = (1, 4, 8, 16),
         *, p: float | None = None, spec=None, latency_profiles: Sequence[str | os.PathLike] = (),
         corun_slowdown: Sequence[float] | None = None, corun_tables: Sequence | None = None,
         context_tokens: int = 2048, memory_budget_fraction: float = 0.9, delta_ms: float = 0.25,
         min_per_request_tok_s: float | None = None, progress=None) -> PlanResult:
    """Rank the placements of a routed model pair (small first) on ``gpus`` GPUs of kind ``gpu``.

    ``p``: R2R escalation probability (P = [[1-p, p], [1, 0]]; default 0.35), or ``spec`` (not both): a
    :class:`tr_core.spec.SystemSpec` whose routing and committed tokens are used. ``latency_profiles``: ``tr-profile latency`` files, matched to
    the models by name. ``corun_slowdown`` (one factor per model) or ``corun_tables`` (a
    :class:`tr_core.spec.CorunLatency` per model) replace the contention model for co-located candidates.
    """
    import tr_model
    from tr_core.spec import CorunLatency, LatencyCurve
    from tr_model.tuning.kvplan import _read_json_file, make_placement, plan_kv_cache, read_model_footprint

    if len(models) != 2:
        raise SpecError(f"--model: give exactly 2 models (small first), got {len(models)}")
    gk = gpu if isinstance(gpu, GPUKind) else load_gpu(gpu)
    G = _as_int(gpus, "--gpus", 1, MAX_GPUS)
    Ns = sorted({_as_int(n, "--N", 1, 64) for n in ([N] if isinstance(N, int) else list(N))})
    if not Ns:
        raise SpecError("--N: give at least one concurrency")
    ctx = _as_int(context_tokens, "--context-tokens", 1, 10 ** 8)
    if min_per_request_tok_s is not None and not (min_per_request_tok_s >= 0 and math.isfinite(min_per_request_tok_s)):
        raise SpecError(f"--min-per-request-tok-s must be a finite number >= 0, got {min_per_request_tok_s!r}")
    if corun_slowdown is not None and corun_tables is not None:
        raise SpecError("give --corun-slowdown or --corun-L-table, not both")
    if corun_slowdown is not None and len(corun_slowdown) != 2:
        raise SpecError(f"--corun-slowdown needs 2 factors (one per model), got {len(corun_slowdown)}")
    corun_given = None
    if corun_slowdown is not None:
        corun_given = [CorunLatency.factor(f) for f in corun_slowdown]
    elif corun_tables is not None:
        if len(corun_tables) != 2:
            raise SpecError(f"--corun-L-table needs 2 entries (one per model), got {len(corun_tables)}")
        corun_given = list(corun_tables)

    # routing
    if spec is not None and p is not None:
        raise SpecError("p and spec both give the routing: give one of them (spec's routing matrix, or the R2R "
                        "preset with p)")
    if spec is None and p is None:
        p = 0.35
    if spec is not None:
        if spec.M != 2:
            raise SpecError(f"--spec has M = {spec.M} models; the planner places 2")
        P, C, delta_src = spec.routing_matrix, spec.committed_tokens, "spec"
    else:
        base = tr_model.preset("r2r", [1.0, 1.0], p=p)
        P, C, delta_src = base.routing_matrix, base.committed_tokens, f"r2r p = {p:g}"

    fps, cfgs, shapes = [], [], []
    for path in models:
        fp = read_model_footprint(path)
        cfg = _read_json_file(os.fspath(path), "config.json")
        fps.append(fp)
        cfgs.append(cfg)
        shapes.append(_shape_info(fp, cfg))
    names = [fp.name for fp in fps]
    if names[0] == names[1]:
        names = [names[0] + "#0", names[1] + "#1"]

    # measured profiles, matched by model name
    from profiler.latency import load_latency_profile
    measured: dict[int, Any] = {}
    for path in latency_profiles:
        prof = load_latency_profile(path)
        hit = [k for k, fp in enumerate(fps) if fp.name.lower() == prof.model.lower()]
        if not hit:
            raise SpecError(f"--latency-profile {os.fspath(path)!r} is for model {prof.model!r}, which is not "
                            f"given (--model: {', '.join(fp.name for fp in fps)})")
        if prof.is_corun:
            raise SpecError(f"--latency-profile {os.fspath(path)!r} is a co-running profile; give solo profiles "
                            f"(co-running latencies: --corun-L-table)")
        if hit[0] in measured:
            raise SpecError(f"--latency-profile: two profiles for model {prof.model!r}")
        measured[hit[0]] = (os.fspath(path), prof)

    tps = [[t for t in range(1, G + 1) if _valid_tp(fps[k], shapes[k]["heads"], t)] for k in range(2)]
    cands = candidates(names, tps, G)
    nmax = max(Ns)
    bgrid = tuple(range(1, nmax + 1))

    solo_cache: dict[tuple[int, int], tuple[tuple[float, ...], tuple[float, ...], dict]] = {}

    def solo(k: int, t: int):
        key = (k, t)
        if key not in solo_cache:
            terms = [_roofline_terms(fps[k], shapes[k], gk, t, b, ctx) for b in bgrid]
            mem = tuple(x["memory_ms"] for x in terms)
            if k in measured:
                path, prof = measured[k]
                med = prof.median_ms()
                bs = sorted(med)
                base1 = [_roofline_terms(fps[k], shapes[k], gk, 1, b, prof.context_tokens)["total_ms"] for b in bs]
                baset = [_roofline_terms(fps[k], shapes[k], gk, t, b, prof.context_tokens)["total_ms"] for b in bs]
                vals = [max(med[b] + bt - b1, 1e-3) for b, b1, bt in zip(bs, base1, baset)]
                curve = LatencyCurve("table", batch_size=tuple(bs), step_latency_ms=tuple(vals))
                L = tuple(curve.latency_ms(b) for b in bgrid)
                src = {"kind": "measured", "profile": path, "device": prof.device, "context_tokens":
                       prof.context_tokens, "cuda_graph": prof.cuda_graph,
                       "measured_median_ms": {str(b): med[b] for b in bs},
                       "tensor_parallel_correction": ("none (profile at TP 1)" if t == 1 else
                                                      "plus roofline(TP t) - roofline(TP 1) at each batch size")}
            else:
                L = tuple(x["total_ms"] for x in terms)
                b1 = terms[0]
                src = {"kind": "roofline", "gpu": gk.name, "context_tokens": ctx,
                       "memory_bandwidth_bytes_per_s": gk.memory_bandwidth_bytes_per_s,
                       "bf16_flop_per_s": gk.bf16_flop_per_s, "interconnect_bytes_per_s": gk.interconnect_bytes_per_s,
                       "terms_ms_at_b1": {k2: b1[k2] for k2 in ("memory_ms", "compute_ms", "allreduce_ms",
                                                                 "overhead_ms", "total_ms")},
                       "bytes_read_at_b1": b1["bytes_read"]}
            solo_cache[key] = (L, mem, src)
        return solo_cache[key]

    def estimates(c: Candidate) -> tuple[LatencyEstimate, ...]:
        sol = [solo(k, c.placement[k].tensor_parallel) for k in range(2)]
        out = []
        for k in range(2):
            L, mem, src = sol[k]
            co = None
            src = dict(src)
            if c.colocated:
                if corun_given is not None:
                    cl = corun_given[k]
                    co = tuple(cl.latency_ms(L[b - 1], b) if cl is not None else L[b - 1] for b in bgrid)
                    src["corun"] = {"kind": "given", "value": (cl.slowdown if cl is not None and cl.kind == "slowdown"
                                                               else "table")}
                else:
                    Lj, memj, _ = sol[1 - k]
                    u = memj[0] / Lj[0]
                    co = tuple(L[i] + u * mem[i] for i in range(len(bgrid)))
                    src["corun"] = {"kind": "contention model (equal bandwidth share while both stream)",
                                    "other_streaming_fraction": u}
            out.append(LatencyEstimate(c.placement[k], bgrid, L, co, src))
        return tuple(out)

    chain_cache: dict[tuple, Any] = {}
    kept: dict[int, list[Plan]] = {n: [] for n in Ns}
    dropped: list[Dropped] = []
    total = len(cands) * len(Ns)
    done = 0
    for c in cands:
        triples = [(fps[k], list(c.placement[k].gpus), c.placement[k].tensor_parallel) for k in range(2)]
        try:
            kv = plan_kv_cache(make_placement(triples, gk.memory_gib, memory_budget_fraction))
        except SpecError as e:
            dropped.append(Dropped(c, None, "does not fit", str(e)))
            done += len(Ns)
            continue
        ests = estimates(c)
        for n in Ns:
            done += 1
            need = n * ctx
            if kv.kv_token_capacity < need:
                dropped.append(Dropped(c, n, "does not fit", f"KV capacity {kv.kv_token_capacity} tokens < N x "
                                       f"context = {n} x {ctx} = {need}"))
                continue
            curves = tuple(e.solo_ms[:n] for e in ests)
            corun = tuple(e.corun_ms[:n] if e.corun_ms is not None else None for e in ests)
            key = (curves, corun, n)
            if key not in chain_cache:
                sp = tr_model.make_spec([x[0] for x in curves], P, C, delta_ms=delta_ms, name="plan",
                                        model_names=names,
                                        latency_curves=[LatencyCurve("table", batch_size=bgrid[:n],
                                                                     step_latency_ms=x) for x in curves],
                                        corun_latency=None if not c.colocated else
                                        [CorunLatency.table(bgrid[:n], x) for x in corun])
                chain_cache[key] = tr_model.optimize(sp, n, round_to_grid=True)
            o = chain_cache[key]
            kept[n].append(Plan(c, n, tuple(o.best_B), o.throughput_tok_s, o.best.per_request_tok_s,
                                tuple(o.best.admission_latency_ms), o.eager_throughput_tok_s, ests,
                                kv.kv_token_capacity, kv.kv_token_capacity - need, o.best.residual, o.states,
                                tuple(o.best.roundings)))
            if progress is not None:
                progress(done, total)
    if progress is not None:
        progress(total, total)
    if not any(kept.values()):
        first = next((d for d in dropped if d.reason == "does not fit"), None)
        raise SpecError(f"no placement of {', '.join(names)} fits on {G} x {gk.name} "
                        f"({gk.memory_gib:g} GiB each, budget {memory_budget_fraction:g}, context {ctx} tokens, "
                        f"N = {', '.join(map(str, Ns))})" + (f": e.g. {first.detail}" if first else ""))

    ranked: dict[int, tuple[Plan, ...]] = {}
    from dataclasses import replace
    for n in Ns:
        rows = sorted(kept[n], key=lambda r: (-r.throughput_tok_s, r.candidate.gpus_used, r.candidate.label))
        survivors = []
        for r in rows:
            if min_per_request_tok_s is not None and r.per_request_tok_s < min_per_request_tok_s:
                dropped.append(Dropped(r.candidate, n, "below --min-per-request-tok-s",
                                       f"{r.per_request_tok_s:.2f} < {min_per_request_tok_s:g} tok/s per request"))
                continue
            dom = next((o for o in rows if o is not r and _dominates(o, r)), None)
            if dom is not None:
                dropped.append(Dropped(r.candidate, n, "dominated",
                                       f"{dom.candidate.label}: {dom.throughput_tok_s:.1f} tok/s, "
                                       f"{dom.per_request_tok_s:.2f} tok/s per request on {dom.candidate.gpus_used} GPUs"))
                continue
            survivors.append(r)
        best = survivors[0].throughput_tok_s if survivors else float("nan")
        ranked[n] = tuple(replace(r, ratio_to_best=r.throughput_tok_s / best) for r in survivors)
    settings = {"context_tokens": ctx, "memory_budget_fraction": memory_budget_fraction, "delta_ms": delta_ms,
                "routing": delta_src, "min_per_request_tok_s": min_per_request_tok_s,
                "corun": "given" if corun_given is not None else "contention model",
                "search": "exhaustive B* (tr_model.optimize)"}
    return PlanResult(gk, G, tuple(names), tuple(Ns), ranked, tuple(dropped), settings, len(cands), len(chain_cache))


def _dominates(a: Plan, b: Plan) -> bool:
    """``a`` is at least as good as ``b`` in throughput, per-request speed and GPUs, and better in one."""
    tol = 1e-9
    ge = (a.throughput_tok_s >= b.throughput_tok_s * (1 - tol) and a.per_request_tok_s >= b.per_request_tok_s * (1 - tol)
          and a.candidate.gpus_used <= b.candidate.gpus_used)
    gt = (a.throughput_tok_s > b.throughput_tok_s * (1 + tol) or a.per_request_tok_s > b.per_request_tok_s * (1 + tol)
          or a.candidate.gpus_used < b.candidate.gpus_used)
    return ge and gt


def _plan_dict(r: Plan) -> dict:
    lat = {}
    for e in r.latencies:
        lat[e.model] = {"solo_ms": e.solo_ms[0], "corun_ms": e.corun_ms[0] if e.corun_ms is not None else None}
    return {"N": r.N, "placement": r.candidate.placement_dict(), "colocated": r.candidate.colocated,
            "gpus_used": r.candidate.gpus_used, "label": r.candidate.label, "B": list(r.B),
            "throughput_tok_s": r.throughput_tok_s, "ratio_to_best": r.ratio_to_best,
            "per_request_tok_s": r.per_request_tok_s, "eager_throughput_tok_s": r.eager_throughput_tok_s,
            "admission_latency_ms": [x if math.isfinite(x) else None for x in r.admission_latency_ms],
            "latency_ms": lat, "kv_token_capacity": r.kv_token_capacity, "kv_headroom_tokens": r.kv_headroom_tokens,
            "residual": r.residual, "states": r.states,
            "roundings": [list(x) if isinstance(x, (list, tuple)) else x for x in r.roundings],
            "latency_inputs": {e.model: {"tensor_parallel": e.tensor_parallel, **e.source,
                                         "solo_ms": {str(b): v for b, v in zip(e.batch_size[:r.N], e.solo_ms)},
                                         "corun_ms": None if e.corun_ms is None else
                                         {str(b): v for b, v in zip(e.batch_size[:r.N], e.corun_ms)}}
                               for e in r.latencies}}


def plan_to_dict(res: PlanResult) -> dict:
    """The JSON document: ``plans`` (every N, sorted by ``throughput_tok_s`` descending) and ``dropped``."""
    plans = [_plan_dict(r) for n in res.Ns for r in res.plans[n]]
    plans.sort(key=lambda d: -d["throughput_tok_s"])
    return {"schema_version": PLAN_SCHEMA_VERSION, "gpu": res.gpu.to_dict(), "gpus": res.gpus,
            "models": list(res.models), "N": list(res.Ns), "settings": dict(res.settings),
            "candidates": res.candidates, "chains_solved": res.chains_solved, "plans": plans,
            "best": {str(n): (_plan_dict(res.plans[n][0])["label"] if res.plans[n] else None) for n in res.Ns},
            "dropped": [{"N": d.N, "placement": d.candidate.placement_dict(), "colocated": d.candidate.colocated,
                         "label": d.candidate.label, "reason": d.reason, "detail": d.detail} for d in res.dropped]}


class _CallableModule(type(os)):
    """``tr_model.plan(...)`` calls :func:`plan`: the submodule and the function share the name, so the
    module (what ``tr_model.plan`` names once imported) forwards a call to the function."""

    def __call__(self, *args, **kwargs):
        return plan(*args, **kwargs)


import sys as _sys  # noqa: E402

_sys.modules[__name__].__class__ = _CallableModule
