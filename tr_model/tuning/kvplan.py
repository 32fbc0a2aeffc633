"""Joint KV-cache budgeting of co-located subservers (TokenRouter, Appendix B).

Token-level routing keeps every active request resident in *every* model it
visits, so all subservers need the same KV-token capacity ``T``; when models
share a GPU (CUDA MPS) their reservations must be planned jointly.

Per model m (from its ``config.json``):

* KV bytes per token, whole model: ``kv_m = 2 * layers * kv_heads * head_dim * kv_dtype_bytes``
  (K and V, every layer).  Under tensor parallelism t the KV heads are split:
  a GPU holds ``kv_heads / t`` heads (``1`` when ``t`` is a multiple of
  ``kv_heads``: heads are then replicated), so ``kv_{m,g} = 2 * layers *
  heads_per_gpu * head_dim * kv_dtype_bytes``.
* Weight bytes: from ``model.safetensors.index.json`` next to the config
  (``metadata.total_size``, bytes), else a ``num_parameters`` field, else the
  parameter count of a dense decoder (Llama/Qwen family)::

      embed  = vocab * hidden                       (+ the same again for lm_head unless tied)
      layer  = hidden * (heads + 2 * kv_heads) * head_dim       (q, k, v projections)
             + heads * head_dim * hidden                         (o projection)
             + 3 * hidden * intermediate                         (gate, up, down)
             + 2 * hidden  [+ 2 * head_dim for Qwen3's q/k norms]  (replicated)
             [+ (heads + 2 * kv_heads) * head_dim with attention bias]
      total  = embed + layers * layer + hidden (final norm, replicated)

  times the dtype's bytes.  Under TP t a GPU holds ``sharded / t + replicated``
  (vocab-parallel embeddings; vocab padding to a multiple of t is ignored).

Given a placement (GPUs per model, TP degree; a GPU listed by two models is
shared), the per-GPU memory ``G_g`` and a budget fraction ``f`` (the shared
budget TokenRouter makes configurable), with an optional reserve ``R`` per
(model, GPU) for activations and CUDA graphs, the largest common capacity is::

      T = min_g floor( (f * G_g - sum_{m on g} (W_{m,g} + R)) / sum_{m on g} kv_{m,g} )

rounded down to the page size.  Subserver m then reserves on each of its GPUs
``W_{m,g} + R + T * kv_{m,g}`` bytes, i.e. the memory fraction
``(W_{m,g} + R + T * kv_{m,g}) / G_g`` (floored to 1e-4 so that rounding never
over-commits); the launch arguments carry both the fraction and ``T`` as an
explicit token cap (SGLang ``--mem-fraction-static`` / ``--max-total-tokens``,
vLLM ``--gpu-memory-utilization`` / ``--kv-cache-memory-bytes``).

A placement whose weights (plus reserves) exceed a GPU's budget, or that leaves
less than one page of KV cache, is rejected naming the GPU.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from tr_core.errors import SpecError, short_repr
from tr_core import units
from tr_core.units import DTYPE_BYTES, GIB

PLACEMENT_SCHEMA_VERSION = 1
MAX_JSON_BYTES = 16 * 2 ** 20          # a placement or config.json is a few kB
MAX_CONFIG_INT = 10 ** 12             # layers, heads, sizes: far above any model, far below float overflow
MAX_PARAMETERS = 10 ** 16             # parameters or bytes of weights
MAX_GPUS = 1 << 16
PLACEMENT_KEYS = ("schema_version", "name", "gpu_memory_gib", "memory_budget_fraction",
                  "reserved_gib_per_model_gpu", "page_size_tokens", "models", "$schema", "comment")
MODEL_KEYS = ("name", "config", "gpus", "tensor_parallel", "kv_cache_dtype", "num_parameters", "comment")

__all__ = ["ModelFootprint", "PlacedModel", "Placement", "KVPlan", "read_model_footprint", "load_placement",
           "make_placement", "plan_kv_cache", "plan_to_dict", "DTYPE_BYTES", "GIB"]


def _short(x: Any) -> str:
    return short_repr(x, maxlevel=2, maxlist=6)


def _read_json_file(path: str, what: str) -> Any:
    """Parse a small JSON file; every failure is one SpecError line naming the file (no NaN, no 1e400)."""

    def bad_number(text):
        raise ValueError(f"{text} is not a finite JSON number")

    def parse_float(text):
        x = float(text)
        if not math.isfinite(x):
            bad_number(text[:40])
        return x

    from tr_core.fileio import require_regular_file
    st = require_regular_file(path, what)
    if st.st_size > MAX_JSON_BYTES:
        raise SpecError(f"{what} {path!r} has {st.st_size} bytes, more than {MAX_JSON_BYTES} (not a {what}?)")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise SpecError(f"{what} {path!r} does not exist") from None
    except OSError as e:
        raise SpecError(f"cannot read {what} {path!r}: {e.strerror or e}") from None
    except ValueError as e:  # an embedded NUL in the path
        raise SpecError(f"cannot read {what} {path!r}: {e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{what} {path!r} is not UTF-8 text") from None
    from tr_core.fileio import DuplicateKey, duplicate_key_message, loads_strict
    try:
        return loads_strict(text, parse_float=parse_float, parse_constant=bad_number)
    except DuplicateKey as e:  # JSON would keep the last value without a word
        raise SpecError(duplicate_key_message(f"{what} {path!r}", e)) from None
    except json.JSONDecodeError as e:
        raise SpecError(f"{what} {path!r} is not valid JSON: {e}") from None
    except RecursionError:
        raise SpecError(f"{what} {path!r} is nested too deeply") from None
    except ValueError as e:  # NaN, Infinity, 1e400, an integer of more than 4300 digits
        msg = str(e).split(":")[0]
        raise SpecError(f"{what} {path!r} holds an invalid number: {msg}") from None


def _int(v: Any, where: str, name: str, minimum: int = 1, maximum: int = MAX_CONFIG_INT) -> int:
    """A JSON integer in [minimum, maximum] (a string, float or boolean is refused, not converted)."""
    if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= maximum:
        raise SpecError(f"{where}: {name} must be an integer in {minimum}..{maximum}, got {_short(v)}")
    return v


def _number(v: Any, where: str, name: str, *, minimum: float, strict: bool, maximum: float | None = None) -> float:
    """A finite JSON number (> minimum when strict, else >=), at most ``maximum``; never converted from text."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    if ok:
        try:
            x = float(v)
        except OverflowError:
            ok = False
        else:
            ok = math.isfinite(x) and (x > minimum if strict else x >= minimum) and (maximum is None or x <= maximum)
    if not ok:
        rng = f"{'>' if strict else '>='} {minimum:g}" + (f" and <= {maximum:g}" if maximum is not None else "")
        raise SpecError(f"{where}: {name} must be a finite number {rng}, got {_short(v)}")
    return x


def _str(v: Any, where: str, name: str) -> str:
    if not isinstance(v, str) or not v or "\0" in v:
        raise SpecError(f"{where}: {name} must be a non-empty string, got {_short(v)}")
    return v


def _dtype_bytes(name: Any, where: str) -> int:
    if not isinstance(name, str):
        raise SpecError(f"{where}: dtype must be a string, got {_short(name)}")
    key = name.lower().replace("torch.", "")
    if key not in DTYPE_BYTES:
        raise SpecError(f"{where}: unknown dtype {name!r} (known: {', '.join(sorted(DTYPE_BYTES))})")
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class ModelFootprint(units.KVLayout):
    """Memory footprint of one model, derived from its ``config.json``."""

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    dtype_bytes: int
    kv_dtype_bytes: int
    num_parameters: int | None
    replicated_parameters: int
    weight_bytes: int
    weight_source: str
    config_path: str | None = None

    # kv_bytes_per_token, kv_heads_per_gpu(tp), kv_bytes_per_token_per_gpu(tp): units.KVLayout, from these
    _KV_FIELDS = ("num_layers", "num_kv_heads", "head_dim", "kv_dtype_bytes")
    _KV_REFUSAL = (SpecError, "model {name!r}: tensor_parallel = {tp} neither divides nor is a multiple of "
                              "num_key_value_heads = {kv_heads}")

    def weight_bytes_per_gpu(self, tp: int) -> int:
        rep = self.replicated_parameters * self.dtype_bytes
        return -(-(self.weight_bytes - rep) // tp) + rep


def _dense_parameter_count(shape, cfg: Mapping[str, Any], where: str) -> tuple[int, int]:
    from tr_core.model_config import read_shape
    for moe_key in ("num_experts", "num_local_experts", "n_routed_experts"):
        if cfg.get(moe_key):
            raise SpecError(f"{where}: mixture-of-experts config ({moe_key!r}); give 'num_parameters' or a "
                            f"model.safetensors.index.json next to it")
    # needed only for a count from the architecture (a given count or an index needs neither)
    shape = read_shape(cfg, where, require_kv_heads=True)  # with vocab_size and intermediate_size now
    return shape.dense_parameter_count()  # tr_core.model_config: the one home of the counts


def read_model_footprint(config_path: str | os.PathLike | None = None, *, config: Mapping[str, Any] | None = None,
                         name: str | None = None, kv_cache_dtype: str | None = None,
                         num_parameters: int | None = None) -> ModelFootprint:
    """Footprint of a model from its HF-style ``config.json`` (path or already-parsed dict)."""
    path = os.fspath(config_path) if config_path is not None else None
    where = f"config.json {path!r}" if path else "config"
    if config is None:
        if path is None:
            raise SpecError("read_model_footprint needs a config path or a config dict")
        config = _read_json_file(path, "config.json")
    if not isinstance(config, Mapping):
        raise SpecError(f"{where}: must be a JSON object, got {_short(config)}")
    if name is not None:
        _str(name, where, "name")
    from tr_core.model_config import read_shape, text_config

    # the fields are read where every reader of a config.json reads them; the plan needs the KV heads given
    cfg = text_config(config)
    shape = read_shape(config, where, require_kv_heads=True, require_intermediate=False, require_vocab=False)
    layers, heads, kv_heads, head_dim = shape.layers, shape.heads, shape.kv_heads, shape.head_dim
    dtype_key = "torch_dtype" if "torch_dtype" in cfg else ("dtype" if "dtype" in cfg else None)
    if dtype_key is None:
        raise SpecError(f"{where}: missing field 'torch_dtype'")
    dbytes = _dtype_bytes(cfg[dtype_key], f"{where}: field {dtype_key!r}")
    dtype = cfg[dtype_key].replace("torch.", "")
    kv_bytes = dbytes if kv_cache_dtype in (None, "auto") else _dtype_bytes(kv_cache_dtype, f"{where}: kv_cache_dtype")
    nm = name or (os.path.basename(os.path.dirname(os.path.abspath(path))) if path else "model")

    index = os.path.join(os.path.dirname(os.path.abspath(path)), "model.safetensors.index.json") if path else None
    if num_parameters is None and "num_parameters" in cfg:
        num_parameters = _int(cfg["num_parameters"], where, "field 'num_parameters'", 1, MAX_PARAMETERS)
    if index and os.path.exists(index) and num_parameters is None:
        idx = _read_json_file(index, "safetensors index")
        meta = idx.get("metadata") if isinstance(idx, dict) else None
        if not isinstance(meta, dict) or "total_size" not in meta:
            raise SpecError(f"safetensors index {index!r}: missing field metadata.total_size")
        total = _int(meta["total_size"], f"safetensors index {index!r}", "metadata.total_size", 1, MAX_PARAMETERS)
        return ModelFootprint(nm, layers, heads, kv_heads, head_dim, dtype, dbytes, kv_bytes, None, 0, total,
                              "safetensors index", path)
    if num_parameters is not None:
        _int(num_parameters, where, "num_parameters", 1, MAX_PARAMETERS)
        return ModelFootprint(nm, layers, heads, kv_heads, head_dim, dtype, dbytes, kv_bytes, num_parameters, 0,
                              num_parameters * dbytes, "num_parameters", path)
    params, replicated = _dense_parameter_count(shape, cfg, where)
    return ModelFootprint(nm, layers, heads, kv_heads, head_dim, dtype, dbytes, kv_bytes, params, replicated,
                          params * dbytes, "architecture", path)


@dataclass(frozen=True)
class PlacedModel:
    footprint: ModelFootprint
    gpus: tuple[int, ...]
    tensor_parallel: int


@dataclass(frozen=True)
class Placement:
    """Models on GPUs, the per-GPU memory and the budget fraction: made (validated) by :func:`make_placement`,
    which holds the defaults."""

    models: tuple[PlacedModel, ...]
    gpu_memory_bytes: tuple[int, ...]
    memory_budget_fraction: float
    reserved_bytes_per_model_gpu: int
    page_size_tokens: int
    name: str

    @property
    def num_gpus(self) -> int:
        return len(self.gpu_memory_bytes)

    def models_on(self, g: int) -> list[int]:
        return [k for k, m in enumerate(self.models) if g in m.gpus]


def make_placement(models: Sequence[tuple[ModelFootprint, Sequence[int], int]], gpu_memory_gib: float | Sequence[float],
                   memory_budget_fraction: float = 0.9, reserved_gib_per_model_gpu: float = 0.0,
                   page_size_tokens: int = 1, name: str = "placement") -> Placement:
    """Validate a placement: ``models`` is a list of (footprint, GPU indices, TP degree)."""
    where = "placement"
    if not models:
        raise SpecError("placement: 'models' is empty")
    placed = []
    top = -1
    for k, (fp, gpus, tp) in enumerate(models):
        w = f"placement: models[{k}] ({fp.name})"
        _int(tp, w, "tensor_parallel", 1, MAX_GPUS)
        if not isinstance(gpus, (list, tuple)) or not gpus:
            raise SpecError(f"{w}: gpus must be a non-empty list of GPU indices >= 0, got {_short(gpus)}")
        g = tuple(_int(x, w, f"gpus[{j}]", 0, MAX_GPUS - 1) for j, x in enumerate(gpus))
        if len(set(g)) != len(g):
            raise SpecError(f"{w}: gpus lists a GPU twice: {list(g)}")
        if len(g) != tp:
            raise SpecError(f"{w}: gpus has {len(g)} entries but tensor_parallel is {tp} (one rank per GPU)")
        fp.kv_heads_per_gpu(tp)
        top = max(top, max(g))
        placed.append(PlacedModel(fp, g, tp))
    if isinstance(gpu_memory_gib, (list, tuple)):
        if not gpu_memory_gib or len(gpu_memory_gib) > MAX_GPUS:
            raise SpecError(f"{where}: gpu_memory_gib must list 1..{MAX_GPUS} GPUs, got {len(gpu_memory_gib)}")
        mem = [_number(x, where, f"gpu_memory_gib[{g}]", minimum=0.0, strict=True, maximum=1e9)
               for g, x in enumerate(gpu_memory_gib)]
        if len(mem) <= top:
            raise SpecError(f"{where}: gpu_memory_gib lists {len(mem)} GPUs but GPU {top} is used")
    else:
        mem = [_number(gpu_memory_gib, where, "gpu_memory_gib", minimum=0.0, strict=True, maximum=1e9)] * (top + 1)
    f = _number(memory_budget_fraction, where, "memory_budget_fraction", minimum=0.0, strict=True, maximum=1.0)
    r = _number(reserved_gib_per_model_gpu, where, "reserved_gib_per_model_gpu", minimum=0.0, strict=False,
                maximum=1e9)
    _int(page_size_tokens, where, "page_size_tokens", 1, 2 ** 31 - 1)
    return Placement(tuple(placed), tuple(int(round(x * GIB)) for x in mem), f, int(round(r * GIB)),
                     page_size_tokens, _str(name, where, "name"))


def load_placement(path: str | os.PathLike, *, gpu_memory_gib: float | None = None,
                   memory_budget_fraction: float | None = None) -> Placement:
    """Read a placement JSON file; config paths inside it are relative to the file.

    Every field is checked for its JSON type (a string where a number belongs
    is refused, not converted), finiteness and range; errors name the file and
    the field (``models[0].gpus[1]``).  Unknown keys are refused (a misspelt
    key would otherwise be ignored silently).
    """
    p = os.fspath(path)
    where = f"placement file {p!r}"
    doc = _read_json_file(p, "placement file")
    if not isinstance(doc, dict):
        raise SpecError(f"{where}: must be a JSON object, got {_short(doc)}")
    unknown = sorted(k for k in doc if k not in PLACEMENT_KEYS)
    if unknown:
        raise SpecError(f"{where}: unknown field {_short(unknown[0])} (known: {', '.join(PLACEMENT_KEYS[:7])})")
    ver = doc.get("schema_version", PLACEMENT_SCHEMA_VERSION)
    if isinstance(ver, bool) or ver != PLACEMENT_SCHEMA_VERSION:
        raise SpecError(f"{where}: unsupported schema_version {_short(ver)} (this tool reads 1)")
    base = os.path.dirname(os.path.abspath(p))
    models = doc.get("models")
    if not isinstance(models, list) or not models:
        raise SpecError(f"{where}: 'models' must be a non-empty list, got {_short(models)}")
    triples = []
    for k, m in enumerate(models):
        mw = f"models[{k}]"
        if not isinstance(m, dict):
            raise SpecError(f"{where}: {mw} must be an object, got {_short(m)}")
        unknown = sorted(key for key in m if key not in MODEL_KEYS)
        if unknown:
            raise SpecError(f"{where}: {mw} has an unknown field {_short(unknown[0])} "
                            f"(known: {', '.join(MODEL_KEYS[:6])})")
        for key in ("config", "gpus"):
            if key not in m:
                raise SpecError(f"{where}: {mw} is missing field {key!r}")
        cfg = _str(m["config"], where, f"{mw}.config")
        name = _str(m["name"], where, f"{mw}.name") if m.get("name") is not None else None
        kv = m.get("kv_cache_dtype")
        if kv is not None:
            _str(kv, where, f"{mw}.kv_cache_dtype")
            if kv != "auto":
                _dtype_bytes(kv, f"{where}: {mw}.kv_cache_dtype")
        nparams = m.get("num_parameters")
        if nparams is not None:
            _int(nparams, where, f"{mw}.num_parameters", 1, MAX_PARAMETERS)
        gpus = m["gpus"]
        if not isinstance(gpus, list) or not gpus:
            raise SpecError(f"{where}: {mw}.gpus must be a non-empty list of GPU indices, got {_short(gpus)}")
        for j, g in enumerate(gpus):
            _int(g, where, f"{mw}.gpus[{j}]", 0, MAX_GPUS - 1)
        tp = _int(m.get("tensor_parallel", len(gpus)), where, f"{mw}.tensor_parallel", 1, MAX_GPUS)
        cfg_path = cfg if os.path.isabs(cfg) else os.path.join(base, cfg)
        fp = read_model_footprint(cfg_path, name=name, kv_cache_dtype=kv, num_parameters=nparams)
        triples.append((fp, gpus, tp))
    mem = gpu_memory_gib if gpu_memory_gib is not None else doc.get("gpu_memory_gib")
    if mem is None:
        raise SpecError(f"{where}: missing field 'gpu_memory_gib' (or pass --gpu-memory-gib)")
    if gpu_memory_gib is None:
        if isinstance(mem, list):
            if not mem or len(mem) > MAX_GPUS:
                raise SpecError(f"{where}: gpu_memory_gib must list 1..{MAX_GPUS} GPUs, got {len(mem)}")
            for g, x in enumerate(mem):
                _number(x, where, f"gpu_memory_gib[{g}]", minimum=0.0, strict=True, maximum=1e9)
        else:
            _number(mem, where, "gpu_memory_gib", minimum=0.0, strict=True, maximum=1e9)
    frac = memory_budget_fraction if memory_budget_fraction is not None else doc.get("memory_budget_fraction", 0.9)
    if memory_budget_fraction is None:
        _number(frac, where, "memory_budget_fraction", minimum=0.0, strict=True, maximum=1.0)
    reserved = _number(doc.get("reserved_gib_per_model_gpu", 0.0), where, "reserved_gib_per_model_gpu",
                       minimum=0.0, strict=False, maximum=1e9)
    page = _int(doc.get("page_size_tokens", 1), where, "page_size_tokens", 1, 2 ** 31 - 1)
    name = _str(doc["name"], where, "name") if doc.get("name") is not None else os.path.basename(p)
    try:
        return make_placement(triples, mem, frac, reserved, page, name)
    except SpecError as e:  # the rules across fields (gpus vs tensor_parallel, ...): name the file too
        msg = str(e)
        raise SpecError(f"{where}: {msg[len('placement: '):] if msg.startswith('placement: ') else msg}") from None


@dataclass(frozen=True)
class KVPlan:
    """The common KV-token capacity and what each GPU and subserver gets."""

    kv_token_capacity: int
    binding_gpu: int
    gpus: tuple[dict, ...]
    subservers: tuple[dict, ...]
    placement: Placement = field(compare=False)

    def tokens_per_request(self, max_concurrency: int) -> int:
        """Context tokens each of ``max_concurrency`` requests can keep in every model."""
        return self.kv_token_capacity // max_concurrency


def plan_kv_cache(placement: Placement) -> KVPlan:
    """Largest common KV-token capacity ``T`` (see the module docstring) and the per-subserver shares."""
    pl = placement
    best, binding = None, -1
    per_gpu = []
    for g in range(pl.num_gpus):
        ks = pl.models_on(g)
        if not ks:
            continue
        budget = int(math.floor(pl.memory_budget_fraction * pl.gpu_memory_bytes[g]))
        weights = sum(pl.models[k].footprint.weight_bytes_per_gpu(pl.models[k].tensor_parallel) for k in ks)
        reserved = pl.reserved_bytes_per_model_gpu * len(ks)
        kv = sum(pl.models[k].footprint.kv_bytes_per_token_per_gpu(pl.models[k].tensor_parallel) for k in ks)
        free = budget - weights - reserved
        names = ", ".join(pl.models[k].footprint.name for k in ks)
        if free <= 0:
            raise SpecError(f"placement cannot fit the weights: GPU {g} ({names}) needs "
                            f"{(weights + reserved) / GIB:.2f} GiB for weights and reserves but its budget is {budget / GIB:.2f} GiB "
                            f"({pl.memory_budget_fraction:g} x {pl.gpu_memory_bytes[g] / GIB:g} GiB)")
        cap = free // kv
        cap -= cap % pl.page_size_tokens
        if cap < pl.page_size_tokens:
            raise SpecError(f"placement leaves no KV cache on GPU {g} ({names}): {free} bytes free, "
                            f"{kv} bytes per token, page of {pl.page_size_tokens} tokens")
        per_gpu.append({"gpu": g, "models": [pl.models[k].footprint.name for k in ks], "shared": len(ks) > 1,
                        "memory_bytes": pl.gpu_memory_bytes[g], "budget_bytes": budget, "weight_bytes": weights,
                        "reserved_bytes": reserved, "kv_bytes_per_token": kv, "capacity_tokens": cap})
        if best is None or cap < best:
            best, binding = cap, g
    assert best is not None
    for row in per_gpu:
        row["kv_bytes"] = best * row["kv_bytes_per_token"]
        row["used_bytes"] = row["weight_bytes"] + row["reserved_bytes"] + row["kv_bytes"]
        row["unused_budget_bytes"] = row["budget_bytes"] - row["used_bytes"]
    subs = []
    for k, m in enumerate(pl.models):
        fp, tp = m.footprint, m.tensor_parallel
        w = fp.weight_bytes_per_gpu(tp)
        kv = fp.kv_bytes_per_token_per_gpu(tp)
        static = w + pl.reserved_bytes_per_model_gpu + best * kv
        gmem = min(pl.gpu_memory_bytes[g] for g in m.gpus)
        frac = math.floor(static / gmem * 1e4) / 1e4
        devices = ",".join(str(g) for g in m.gpus)
        subs.append({
            "model": fp.name, "gpus": list(m.gpus), "tensor_parallel": tp,
            "weight_source": fp.weight_source, "num_parameters": fp.num_parameters,
            "weight_bytes": fp.weight_bytes, "weight_bytes_per_gpu": w,
            "kv_bytes_per_token": fp.kv_bytes_per_token, "kv_bytes_per_token_per_gpu": kv,
            "kv_cache_bytes_per_gpu": best * kv, "static_bytes_per_gpu": static,
            "memory_fraction": frac,
            "launch_args": {
                "sglang": ["--tp-size", str(tp), "--mem-fraction-static", f"{frac:.4f}",
                           "--max-total-tokens", str(best)],
                "vllm": ["--tensor-parallel-size", str(tp), "--gpu-memory-utilization", f"{frac:.4f}",
                         "--kv-cache-memory-bytes", str(best * kv)],
                "env": {"CUDA_VISIBLE_DEVICES": devices},
            },
        })
    return KVPlan(best, binding, tuple(per_gpu), tuple(subs), pl)


def plan_to_dict(plan: KVPlan, max_concurrency: int | None = None) -> dict:
    """JSON form of a plan (``schema_version`` 1, byte counts in ``*_bytes`` keys)."""
    pl = plan.placement
    d = {"schema_version": 1, "name": pl.name, "kv_token_capacity": plan.kv_token_capacity,
         "binding_gpu": plan.binding_gpu, "memory_budget_fraction": pl.memory_budget_fraction,
         "page_size_tokens": pl.page_size_tokens, "reserved_bytes_per_model_gpu": pl.reserved_bytes_per_model_gpu,
         "gpus": [dict(r) for r in plan.gpus], "subservers": [dict(s) for s in plan.subservers]}
    if max_concurrency is not None:
        d["max_concurrency"] = max_concurrency
        d["tokens_per_request"] = plan.tokens_per_request(max_concurrency)
    return d
