"""Iteration latency of one model instance under continuous batching.

One iteration runs a batch of **decodes** (``n_decode`` requests, each
generating one token while attending over its context; ``decode_context`` is
the sum of those contexts) and **prefill chunks** (chunk j appends ``q_j``
tokens to ``c_j`` cached ones).  Every latency model here is a function of
six aggregate *features* of the batch, so that adding or removing work is
O(1) (the shadow budget searches over it):

==================  ================================================
``n_decode``        decode requests
``decode_context``  sum of their contexts (tokens each attends over)
``prefill_tokens``  ``sum_j q_j``
``prefill_pairs``   ``sum_j q_j * (c_j + (q_j + 1) / 2)``: query-key pairs of causal attention
``prefill_kv``      ``sum_j (c_j + q_j)``: KV tokens the chunks read
``n_chunks``        prefill chunks that emit a token (need logits)
==================  ================================================

**Roofline** (``kind = "roofline"``), from the model's ``config.json`` and a
GPU description, per GPU of a tensor-parallel (TP) group of ``tp``.  With
``T = n_decode + prefill_tokens``, effective FLOP/s ``F = bf16_flop_per_s *
flops_efficiency`` and bandwidth ``B = hbm_bytes_per_s * bandwidth_efficiency``,
one decoder layer takes::

    gemm     = max(2 * T * P_active_layer / tp / F,  P_total_layer * w_bytes / tp / B)
    prefill  = max(4 * H_q * d * prefill_pairs / tp / F,  kv_layer * prefill_kv / B)
    decode   = max(4 * H_q * d * decode_context / tp / F,  kv_layer * decode_context / B)
    allreduce = 2 * (latency + 2 (tp - 1) / tp * T * hidden * a_bytes / link_bytes_per_s)   (tp > 1)

(``P_*_layer``: the layer's weights - attention, MLP or the experts, router,
norms - MoE layers count the active experts for FLOPs and all experts for
weight reads; ``H_q`` query heads of dimension ``d``; ``kv_layer`` = ``2 *
kv_heads_per_gpu * d * kv_bytes``).  The iteration adds the LM head for the
``n_decode + n_chunks`` rows that need logits, ``max(2 * rows * hidden * vocab
/ tp / F, hidden * vocab * w_bytes / tp / B)``, a fixed per-iteration overhead
and ``decode_seq_overhead_s`` per decode::

    t = layers * layer + lm_head + iteration_overhead_s + n_decode * decode_seq_overhead_s

An empty batch takes 0 s.

**Linear** (``kind = "linear"``), fitted to measured profiles::

    t = c0 + c_decode * n_decode + c_ctx * decode_context + c_tok * prefill_tokens
          + c_pair * prefill_pairs            (t = 0 for an empty batch)

Derived quantities: the isolated prefill of p tokens (chunks of ``chunk``
tokens, 2,048 by default, one per iteration, nothing else in the batch), the
batch-1 decode step, the paper's SLOs ``TTFT <= max(1 s, 5 x isolated
prefill)`` and ``TPOT <= max(25 ms, 5 x batch-1 decode)``, KV bytes per token,
the KV capacity of an instance and the PCIe time to reload cached KV from host
memory.

Everything numeric lives in a float64 parameter vector (:attr:`LatencyModel.params`)
read by the compiled function :func:`lm_iteration_time`, which simulators and
:mod:`shadow_prefill.budget` call from compiled code.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from shadow_prefill import _kernels as _k
from shadow_prefill.errors import InputFileError, ShadowError
from shadow_prefill.presets import gpu_preset, model_config
from tr_core import model_config as MC
from tr_core import units
from tr_core.units import DTYPE_BYTES  # the project's one table of dtype sizes

__all__ = ["ModelArch", "GPUSpec", "LatencyModel", "build_roofline", "fit_linear_model", "read_profile_points",
           "load_model_arch", "load_gpu", "choose_tp", "lm_iteration_time", "lm_prefill_time", "lm_decode_time",
           "KIND_ROOFLINE", "KIND_LINEAR", "LM_SIZE", "DTYPE_BYTES"]

KIND_ROOFLINE = 0.0
KIND_LINEAR = 1.0
LM_SIZE = 16


# model types whose MLP has two matrices (up, down) instead of a gated three (gate, up, down)
_UNGATED = MC.UNGATED_MLP  # model types without a gated MLP (tr_core.model_config)


# ============================================================================ model architecture

def _cfg_int(cfg: Mapping, key: str, where: str, default: Any = None, minimum: int = 1, maximum: int = 2 ** 40) -> int:
    v = cfg.get(key, default)
    if v is None:
        raise ShadowError(f"{where}: missing field {key!r}")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)) \
            or v != int(v) or not minimum <= v <= maximum:
        from shadow_prefill.inputs import short_repr
        raise ShadowError(f"{where}: field {key!r} must be an integer in [{minimum}, {maximum}], got {short_repr(v)}")
    return int(v)


@dataclass(frozen=True)
class ModelArch(units.KVLayout):
    """The numbers of a decoder-only transformer the roofline needs (from ``config.json``)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = False
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_expert_intermediate: int = 0
    dense_layers: int = 0              # leading dense layers of a MoE model (DeepSeek's first_k_dense_replace)
    gated_mlp: bool = True
    attention_bias: bool = False
    qk_norm: bool = False
    dtype_bytes: int = 2
    kv_dtype_bytes: int = 2
    context_window: int = 0
    total_override: int | None = None  # num_parameters given in the config
    active_override: int | None = None

    # ------------------------------------------------------------- parameter counts
    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    # the counts' one home is tr_core.model_config (the KV plan and the runtime count with it too)
    @property
    def attention_params(self) -> int:
        return MC.attention_params(self.hidden, self.heads, self.kv_heads, self.head_dim, self.attention_bias)

    @property
    def norm_params(self) -> int:
        return MC.norm_params(self.hidden, self.head_dim, self.qk_norm)

    def _mlp(self, inter: int) -> int:
        return MC.mlp_params(self.hidden, inter, self.gated_mlp)

    @property
    def dense_layer_params(self) -> int:
        return self.attention_params + self._mlp(self.intermediate) + self.norm_params

    @property
    def moe_layer_params(self) -> tuple[int, int]:
        """(total, active) parameters of one MoE layer."""
        common = self.attention_params + self.norm_params + self.hidden * self.experts
        shared = self._mlp(self.shared_expert_intermediate) if self.shared_expert_intermediate else 0
        e = self._mlp(self.expert_intermediate)
        return common + shared + self.experts * e, common + shared + self.experts_per_token * e

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        """Parameters the LM head multiplies by (the embedding matrix again when tied)."""
        return self.vocab * self.hidden

    def _layer_sums(self) -> tuple[int, int]:
        if not self.is_moe:
            return self.layers * self.dense_layer_params, self.layers * self.dense_layer_params
        dense = min(self.dense_layers, self.layers)
        tot, act = self.moe_layer_params
        n = self.layers - dense
        return dense * self.dense_layer_params + n * tot, dense * self.dense_layer_params + n * act

    @property
    def total_params(self) -> int:
        if self.total_override is not None:
            return self.total_override
        tot, _ = self._layer_sums()
        return tot + MC.embedding_params(self.vocab, self.hidden, self.tied_embeddings)

    @property
    def active_params(self) -> int:
        if self.active_override is not None:
            return self.active_override
        if self.total_override is not None and not self.is_moe:
            return self.total_override
        _, act = self._layer_sums()
        return act + MC.embedding_params(self.vocab, self.hidden, self.tied_embeddings)

    def layer_params(self) -> tuple[float, float]:
        """(total, active) parameters of an average decoder layer (what one layer reads and multiplies by)."""
        emb = MC.embedding_params(self.vocab, self.hidden, self.tied_embeddings)
        return (self.total_params - emb) / self.layers, (self.active_params - emb) / self.layers

    @property
    def weight_bytes(self) -> int:
        return self.total_params * self.dtype_bytes

    # kv_bytes_per_token, kv_heads_per_gpu(tp), kv_bytes_per_token_per_gpu(tp): units.KVLayout, from these
    _KV_FIELDS = ("layers", "kv_heads", "head_dim", "kv_dtype_bytes")
    _KV_REFUSAL = (ShadowError, "model {name!r}: tensor-parallel degree {tp} neither divides nor is a multiple of "
                                "its {kv_heads} KV heads")

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], name: str | None = None, where: str = "config",
                    kv_dtype: str | None = None) -> "ModelArch":
        """Read a Hugging Face ``config.json`` dict (``text_config`` of a multimodal one is used)."""
        if not isinstance(cfg, Mapping):
            raise ShadowError(f"{where}: a config must be a JSON object")
        from tr_core.model_config import read_shape, text_config

        # the common fields are read where every reader of a config.json reads them (tr_core.model_config)
        shape = read_shape(cfg, where, error=ShadowError, require_intermediate=False, whole_floats=True)
        cfg = text_config(cfg)
        layers, hidden, heads, kv_heads = shape.layers, shape.hidden, shape.heads, shape.kv_heads
        head_dim, vocab = shape.head_dim, shape.vocab
        experts = 0
        for k in ("num_local_experts", "num_experts", "n_routed_experts"):
            if cfg.get(k):
                experts = _cfg_int(cfg, k, where)
                break
        model_type = shape.model_type
        if experts:
            per_tok = _cfg_int(cfg, "num_experts_per_tok", where,
                               default=cfg.get("experts_per_token", cfg.get("moe_topk")))
            if per_tok > experts:
                raise ShadowError(f"{where}: num_experts_per_tok = {per_tok} exceeds the {experts} experts")
            e_inter = _cfg_int(cfg, "moe_intermediate_size", where, default=shape.intermediate)
            inter = e_inter if shape.intermediate is None else shape.intermediate
            shared = 0
            if cfg.get("shared_expert_intermediate_size"):
                shared = _cfg_int(cfg, "shared_expert_intermediate_size", where)
            elif cfg.get("n_shared_experts"):
                shared = _cfg_int(cfg, "n_shared_experts", where) * e_inter
            dense_layers = _cfg_int(cfg, "first_k_dense_replace", where, default=0, minimum=0)
        else:
            per_tok = e_inter = shared = dense_layers = 0
            if shape.intermediate is None:  # a dense model needs it: the error names it
                read_shape(cfg, where, error=ShadowError, whole_floats=True)
            inter = shape.intermediate
        dt = cfg.get("torch_dtype", cfg.get("dtype", "bfloat16")) or "bfloat16"
        if not isinstance(dt, str):
            from shadow_prefill.inputs import short_repr
            raise ShadowError(f"{where}: field 'torch_dtype' must be a string like \"bfloat16\", got {short_repr(dt)}")
        dt = dt.replace("torch.", "").lower()
        if dt not in DTYPE_BYTES:
            raise ShadowError(f"{where}: unknown dtype {dt[:40]!r} (known: {', '.join(sorted(DTYPE_BYTES))})")
        kvd = DTYPE_BYTES[dt]
        if kv_dtype not in (None, "auto"):
            if kv_dtype.lower() not in DTYPE_BYTES:
                raise ShadowError(f"unknown KV-cache dtype {kv_dtype!r}")
            kvd = DTYPE_BYTES[kv_dtype.lower()]
        total = active = None
        if cfg.get("num_parameters") is not None:
            total = _cfg_int(cfg, "num_parameters", where, maximum=2 ** 50)
        if cfg.get("num_active_parameters") is not None:
            active = _cfg_int(cfg, "num_active_parameters", where, maximum=2 ** 50)
        window = cfg.get("max_position_embeddings") or 0
        if isinstance(window, bool) or not isinstance(window, (int, float)) or not 0 <= window <= 2 ** 40 \
                or window != window:
            window = 0  # optional and informative only: an unreadable value is ignored
        nm = name or str(cfg.get("_name_or_path") or cfg.get("name") or model_type or "model")
        return cls(name=nm, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                   intermediate=inter, vocab=vocab, tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                   experts=experts, experts_per_token=per_tok, expert_intermediate=e_inter,
                   shared_expert_intermediate=shared, dense_layers=dense_layers,
                   gated_mlp=shape.gated_mlp, attention_bias=shape.attention_bias,
                   qk_norm=shape.qk_norm, dtype_bytes=DTYPE_BYTES[dt], kv_dtype_bytes=kvd,
                   context_window=int(window) if isinstance(window, (int, float)) else 0,
                   total_override=total, active_override=active)

    def describe(self) -> dict:
        return {"name": self.name, "layers": self.layers, "hidden": self.hidden, "heads": self.heads,
                "kv_heads": self.kv_heads, "head_dim": self.head_dim, "experts": self.experts,
                "experts_per_token": self.experts_per_token, "total_params": self.total_params,
                "active_params": self.active_params, "weight_bytes": self.weight_bytes,
                "kv_bytes_per_token": self.kv_bytes_per_token, "context_window": self.context_window}


def _read_json(path: str) -> Any:
    """A JSON file's value; unreadable, malformed, too deep or non-regular files raise :class:`InputFileError`."""
    from shadow_prefill.inputs import parse_json_value, read_input_text
    return parse_json_value(read_input_text(path), path)


def load_model_arch(spec: str | os.PathLike | Mapping, name: str | None = None) -> ModelArch:
    """A :class:`ModelArch` from a built-in name, a ``config.json`` path (or its folder) or a dict."""
    if isinstance(spec, Mapping):
        return ModelArch.from_config(spec, name=name)
    s = os.fspath(spec)
    if os.path.isdir(s):
        s = os.path.join(s, "config.json")
    if os.path.exists(s) or s.endswith(".json"):
        cfg = _read_json(s)
        default = os.path.basename(os.path.dirname(os.path.abspath(s))) if os.path.basename(s) == "config.json" \
            else os.path.splitext(os.path.basename(s))[0]
        return ModelArch.from_config(cfg, name=name or default, where=s)
    return ModelArch.from_config(model_config(s), name=name or s.lower())


# ============================================================================ GPU

@dataclass(frozen=True)
class GPUSpec:
    """One GPU (figures per GPU; bandwidths in bytes/s)."""

    name: str
    bf16_flop_per_s: float
    hbm_bytes_per_s: float
    hbm_bytes: float
    link_bytes_per_s: float = 450e9
    allreduce_latency_s: float = 8e-6
    pcie_bytes_per_s: float = 64e9
    flops_efficiency: float = 0.6
    bandwidth_efficiency: float = 0.85
    iteration_overhead_s: float = 1e-3
    decode_seq_overhead_s: float = 5e-6

    def __post_init__(self):
        for k in ("bf16_flop_per_s", "hbm_bytes_per_s", "hbm_bytes", "link_bytes_per_s", "pcie_bytes_per_s"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ShadowError(f"GPU {self.name!r}: {k} must be > 0, got {v!r}")
        for k in ("flops_efficiency", "bandwidth_efficiency"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and 0 < v <= 1):
                raise ShadowError(f"GPU {self.name!r}: {k} must be in (0, 1], got {v!r}")
        for k in ("allreduce_latency_s", "iteration_overhead_s", "decode_seq_overhead_s"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ShadowError(f"GPU {self.name!r}: {k} must be >= 0, got {v!r}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "GPU") -> "GPUSpec":
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ShadowError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        missing = [k for k in ("bf16_flop_per_s", "hbm_bytes_per_s", "hbm_bytes") if k not in d]
        if missing:
            raise ShadowError(f"{where}: missing field(s) {', '.join(missing)}")
        from shadow_prefill.inputs import check_float, short_repr

        def fail(msg: str):
            raise ShadowError(f"{where}: {msg}")
        d = dict(d)
        for k, v in d.items():  # JSON numbers only (a string is refused, not converted), finite, below 1e30
            if k == "name":
                if not isinstance(v, str):
                    fail(f"field 'name' must be a string, got {short_repr(v)}")
            else:
                d[k] = check_float(v, k, fail, lo=-1e30, hi=1e30)
        try:
            return cls(**{"name": "gpu", **d})
        except ShadowError as e:  # the range checks of __post_init__: name the file too
            if where == "GPU":
                raise
            raise ShadowError(f"{where}: {e}") from None
        except TypeError as e:
            raise ShadowError(f"{where}: {e}") from None


def load_gpu(spec: str | os.PathLike | Mapping | GPUSpec) -> GPUSpec:
    """A :class:`GPUSpec` from a preset name (``h100``, ``h200``), a JSON file or a dict."""
    if isinstance(spec, GPUSpec):
        return spec
    if isinstance(spec, Mapping):
        return GPUSpec.from_dict(spec)
    s = os.fspath(spec)
    if os.path.exists(s) or s.endswith(".json"):
        d = _read_json(s)
        if not isinstance(d, dict):
            raise InputFileError(s, "a GPU description must be a JSON object")
        return GPUSpec.from_dict(d, where=s)
    return GPUSpec.from_dict(gpu_preset(s))


def choose_tp(arch: ModelArch, gpu: GPUSpec, choices: Sequence[int] = (1, 2, 4, 8)) -> int:
    """The smallest TP degree at which the weights take at most half of the GPUs' HBM (the paper's rule)."""
    for tp in choices:
        if arch.weight_bytes / tp <= 0.5 * gpu.hbm_bytes:
            try:
                arch.kv_heads_per_gpu(tp)
            except ShadowError:
                continue
            return tp
    raise ShadowError(f"model {arch.name!r} ({arch.weight_bytes / 1e9:.1f} GB of weights) needs more than "
                      f"{max(choices)} x {gpu.name} to keep its weights under half the HBM")


# ============================================================================ compiled evaluation

#: compiled callers (simulators, schedulers in numba) evaluate latency vectors with these
lm_iteration_time = _k.iteration_time
lm_prefill_time = _k.prefill_time
lm_decode_time = _k.decode_time


@dataclass(frozen=True, eq=False)
class LatencyModel:
    """An iteration-latency model; :attr:`params` is the vector compiled code reads (treat it as read-only)."""

    kind: str
    params: np.ndarray
    name: str = "model"
    arch: ModelArch | None = None
    gpu: GPUSpec | None = None
    tp: int = 1
    fit: dict = field(default_factory=dict)
    kv_bytes_per_token_override: int | None = None

    # ----------------------------------------------------------------- evaluation
    def iteration_time(self, n_decode: int = 0, decode_context: float = 0, chunks: Iterable[tuple[int, int]] = ()) -> float:
        """Seconds of one iteration: ``n_decode`` decodes over ``decode_context`` total context, and prefill
        ``chunks`` given as ``(new_tokens, cached_context)`` pairs."""
        pt = pp = pk = 0.0
        nc = 0
        for q, c in chunks:
            if q < 0 or c < 0:
                raise ShadowError(f"a prefill chunk needs tokens >= 0 and context >= 0, got ({q}, {c})")
            if q == 0:
                continue
            pt += q
            pp += q * (c + (q + 1) / 2)
            pk += c + q
            nc += 1
        if n_decode < 0 or decode_context < 0:
            raise ShadowError("n_decode and decode_context must be >= 0")
        return float(lm_iteration_time(self.params, float(n_decode), float(decode_context), pt, pp, pk, float(nc)))

    def prefill_time(self, tokens: int, cached: int = 0, chunk: int = 2048) -> float:
        """Isolated chunked prefill of ``tokens`` new tokens after ``cached`` cached ones."""
        if chunk < 1:
            raise ShadowError(f"chunk must be >= 1, got {chunk}")
        return float(lm_prefill_time(self.params, int(tokens), int(cached), int(chunk)))

    def decode_time(self, batch: int = 1, context: float = 1) -> float:
        """One decode iteration of ``batch`` requests, each over ``context`` tokens."""
        return float(lm_decode_time(self.params, int(batch), float(context)))

    def ttft_slo(self, prompt: int, floor_s: float = 1.0, mult: float = 5.0, chunk: int = 2048) -> float:
        """``max(1 s, 5 x isolated prefill of the prompt)``."""
        return max(floor_s, mult * self.prefill_time(prompt, 0, chunk))

    def tpot_slo(self, context: float = 1, floor_s: float = 0.025, mult: float = 5.0) -> float:
        """``max(25 ms, 5 x batch-1 decode)`` (decode over ``context`` tokens)."""
        return max(floor_s, mult * self.decode_time(1, context))

    # ---------------------------------------------------------------- memory
    @property
    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token for the whole instance (all GPUs)."""
        if self.kv_bytes_per_token_override is not None:
            return self.kv_bytes_per_token_override
        if self.arch is None:
            raise ShadowError(f"latency model {self.name!r} has no architecture: KV bytes per token unknown")
        return self.arch.kv_bytes_per_token_per_gpu(self.tp) * self.tp

    def kv_capacity_tokens(self, memory_utilization: float = 0.9) -> int:
        """Tokens of KV cache an instance holds: ``(util * HBM - weights / tp) / KV bytes per token per GPU``."""
        if self.arch is None or self.gpu is None:
            raise ShadowError(f"latency model {self.name!r} needs an architecture and a GPU for its KV capacity")
        free = memory_utilization * self.gpu.hbm_bytes - self.arch.weight_bytes / self.tp
        per = self.arch.kv_bytes_per_token_per_gpu(self.tp)
        return max(0, int(free // per))

    def host_reload_time(self, tokens: int) -> float:
        """Seconds to copy ``tokens`` of KV from host DRAM over PCIe (the GPUs of the TP group in parallel)."""
        if self.gpu is None:
            raise ShadowError(f"latency model {self.name!r} has no GPU: PCIe bandwidth unknown")
        return tokens * self.kv_bytes_per_token / (self.tp * self.gpu.pcie_bytes_per_s)

    # -------------------------------------------------------------- breakdown
    def layer_breakdown(self, n_decode: int = 0, decode_context: float = 0,
                        chunks: Iterable[tuple[int, int]] = ()) -> dict:
        """Seconds per term of one decoder layer (and the iteration's other terms) under the roofline."""
        if self.kind != "roofline":
            raise ShadowError("layer_breakdown needs a roofline model")
        lm = self.params
        chunks = [(q, c) for q, c in chunks if q > 0]
        pt = float(sum(q for q, _ in chunks))
        pp = float(sum(q * (c + (q + 1) / 2) for q, c in chunks))
        pk = float(sum(c + q for q, c in chunks))
        T = n_decode + pt
        F, B = lm[6], lm[7]
        out = {
            "gemm_compute_s": T * lm[2] / F, "gemm_weights_s": lm[3] / B,
            "prefill_attn_compute_s": pp * lm[4] / F, "prefill_attn_kv_s": pk * lm[5] / B,
            "decode_attn_compute_s": decode_context * lm[4] / F, "decode_attn_kv_s": decode_context * lm[5] / B,
            "allreduce_s": 2.0 * (lm[8] + T * lm[9]) if (lm[8] > 0 or lm[9] > 0) else 0.0,
        }
        out["layer_s"] = (max(out["gemm_compute_s"], out["gemm_weights_s"])
                          + (max(out["prefill_attn_compute_s"], out["prefill_attn_kv_s"]) if pt > 0 else 0.0)
                          + (max(out["decode_attn_compute_s"], out["decode_attn_kv_s"]) if n_decode > 0 else 0.0)
                          + out["allreduce_s"])
        rows = n_decode + len(chunks)
        out["lm_head_s"] = max(rows * lm[10] / F, lm[11] / B) if rows > 0 else 0.0
        out["layers"] = int(lm[1])
        out["overhead_s"] = float(lm[12] + n_decode * lm[13])
        out["iteration_s"] = out["layers"] * out["layer_s"] + out["lm_head_s"] + out["overhead_s"] if T > 0 else 0.0
        return out

    def describe(self, prompt: int = 2048, context: int = 1, chunk: int = 2048) -> dict:
        d: dict[str, Any] = {"name": self.name, "kind": self.kind, "tp": self.tp,
                             "isolated_prefill_s": self.prefill_time(prompt, 0, chunk), "prompt_tokens": prompt,
                             "decode_batch1_s": self.decode_time(1, context),
                             "ttft_slo_s": self.ttft_slo(prompt, chunk=chunk), "tpot_slo_s": self.tpot_slo(context)}
        if self.arch is not None:
            d["arch"] = self.arch.describe()
            d["kv_bytes_per_token"] = self.kv_bytes_per_token
        if self.gpu is not None:
            d["gpu"] = self.gpu.name
        if self.arch is not None and self.gpu is not None:
            d["kv_capacity_tokens"] = self.kv_capacity_tokens()
            d["weights_per_gpu_bytes"] = self.arch.weight_bytes / self.tp
            d["host_reload_s_per_1k_tokens"] = self.host_reload_time(1000)
        if self.fit:
            d["fit"] = self.fit
        return d

    def to_dict(self) -> dict:
        """JSON form (``{"schema_version": 1, "kind": "latency_model", "model_kind", "name", "tp", "params",
        ...}``) readable by :meth:`from_dict` (and by ``tr-shadow stats --model-config NAME=FILE``)."""
        d = {"schema_version": 1, "kind": "latency_model", "model_kind": self.kind, "name": self.name, "tp": self.tp,
             "params": [float(x) for x in self.params]}
        if self.fit:
            d["fit"] = self.fit
        if self.kv_bytes_per_token_override is not None:
            d["kv_bytes_per_token"] = self.kv_bytes_per_token_override
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "latency model") -> "LatencyModel":
        if not isinstance(d, Mapping) or d.get("kind") != "latency_model":
            raise ShadowError(f"{where}: not a saved latency model (expected \"kind\": \"latency_model\")")
        if d.get("schema_version") != 1:
            from shadow_prefill.inputs import short_repr
            raise ShadowError(f"{where}: unsupported schema_version {short_repr(d.get('schema_version'))} "
                              f"(this tool reads 1)")
        from shadow_prefill.inputs import check_float, check_int, short_repr

        def fail(msg: str):
            raise ShadowError(f"{where}: {msg}")
        raw = d.get("params")
        if not isinstance(raw, list) or len(raw) != LM_SIZE:
            fail(f"field 'params' must hold {LM_SIZE} finite params (a list of numbers), got {short_repr(raw)}")
        p = np.asarray([check_float(x, f"params[{i}]", fail, lo=-1e30, hi=1e30) for i, x in enumerate(raw)],
                       dtype=np.float64)
        if d.get("model_kind") not in ("roofline", "linear"):
            fail(f"field 'model_kind' must be 'roofline' or 'linear', got {short_repr(d.get('model_kind'))}")
        name = d.get("name", "model")
        if not isinstance(name, str):
            fail(f"field 'name' must be a string, got {short_repr(name)}")
        tp = check_int(d.get("tp", 1), "tp", fail, lo=1, hi=4096)
        fit = d.get("fit", {})
        if not isinstance(fit, dict):
            fail(f"field 'fit' must be an object, got {short_repr(fit)}")
        kv = d.get("kv_bytes_per_token")
        if kv is not None:
            kv = check_int(kv, "kv_bytes_per_token", fail, lo=1, hi=2 ** 40)
        return cls(kind=d["model_kind"], params=p, name=name, tp=tp, fit=dict(fit), kv_bytes_per_token_override=kv)


def build_roofline(arch: ModelArch | str | Mapping, gpu: GPUSpec | str | Mapping = "h100", tp: int | None = None) -> LatencyModel:
    """The analytic roofline of ``arch`` on ``tp`` GPUs (default: :func:`choose_tp`)."""
    if not isinstance(arch, ModelArch):
        arch = load_model_arch(arch)
    gpu = load_gpu(gpu)
    if tp is None:
        tp = choose_tp(arch, gpu)
    if not isinstance(tp, int) or tp < 1:
        raise ShadowError(f"tensor-parallel degree must be an integer >= 1, got {tp!r}")
    kv_layer = 2 * arch.kv_heads_per_gpu(tp) * arch.head_dim * arch.kv_dtype_bytes
    total_l, active_l = arch.layer_params()
    lm = np.zeros(LM_SIZE, dtype=np.float64)
    lm[0] = KIND_ROOFLINE
    lm[1] = arch.layers
    lm[2] = 2.0 * active_l / tp                       # GEMM FLOPs per token per layer per GPU
    lm[3] = total_l * arch.dtype_bytes / tp           # weight bytes per layer per GPU
    lm[4] = 4.0 * arch.heads * arch.head_dim / tp     # attention FLOPs per query-key pair per layer per GPU
    lm[5] = kv_layer                                  # KV bytes per token per layer per GPU
    lm[6] = gpu.bf16_flop_per_s * gpu.flops_efficiency
    lm[7] = gpu.hbm_bytes_per_s * gpu.bandwidth_efficiency
    if tp > 1:
        lm[8] = gpu.allreduce_latency_s
        lm[9] = 2.0 * (tp - 1) / tp * arch.hidden * arch.dtype_bytes / gpu.link_bytes_per_s
    lm[10] = 2.0 * arch.hidden * arch.vocab / tp      # LM-head FLOPs per logits row per GPU
    lm[11] = arch.hidden * arch.vocab * arch.dtype_bytes / tp
    lm[12] = gpu.iteration_overhead_s
    lm[13] = gpu.decode_seq_overhead_s
    return LatencyModel(kind="roofline", params=lm, name=arch.name, arch=arch, gpu=gpu, tp=tp)


# ============================================================================ fitted model

_FEATURES = ("n_decode", "decode_context", "prefill_tokens", "prefill_pairs")


def _nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0 by dropping the most negative coefficient until none is (small problems)."""
    active = list(range(A.shape[1]))
    x = np.zeros(A.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(A[:, active], y, rcond=None)
        if np.all(sol >= -1e-15):
            x[:] = 0.0
            x[active] = np.maximum(sol, 0.0)
            return x
        active.pop(int(np.argmin(sol)))
    return x


def fit_linear_model(points: Sequence[Mapping[str, float]], name: str = "fitted", tp: int = 1,
               kv_bytes_per_token: int | None = None) -> LatencyModel:
    """Fit ``t = c0 + c_decode n_decode + c_ctx decode_context + c_tok prefill_tokens + c_pair prefill_pairs``.

    ``points`` hold the features (missing ones are 0) and ``time_s``.
    Coefficients are non-negative (least squares with that constraint); the
    fit's R^2 and largest relative error are kept in ``fit``.
    """
    if len(points) < 2:
        raise ShadowError(f"a latency fit needs at least 2 measured points, got {len(points)}")
    X = np.array([[1.0] + [float(p.get(k, 0.0)) for k in _FEATURES] for p in points])
    y = np.array([float(p["time_s"]) for p in points])
    if np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise ShadowError("measured times must be > 0")
    # scale columns for conditioning
    scale = np.maximum(np.abs(X).max(axis=0), 1e-30)
    coef = _nnls(X / scale, y) / scale
    pred = X @ coef
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    lm = np.zeros(LM_SIZE, dtype=np.float64)
    lm[0] = KIND_LINEAR
    lm[1:6] = coef
    fit = {"points": len(points), "r2": (1.0 - ss_res / ss_tot) if ss_tot > 0 else 1.0,
           "max_rel_error": float(np.max(np.abs(pred - y) / y)),
           "coefficients": dict(zip(("c0_s",) + tuple(f"{k}_s" for k in _FEATURES), map(float, coef)))}
    return LatencyModel(kind="linear", params=lm, name=name, tp=tp, fit=fit,
                        kv_bytes_per_token_override=kv_bytes_per_token)


def _time_ms(ent: Mapping, where: str) -> float:
    v = ent.get("time_ms")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1e12 or v != v:
        from shadow_prefill.inputs import short_repr
        raise ShadowError(f"{where}: time_ms must be a number in (0, 1e12], got {short_repr(v)}")
    return float(v)


def read_profile_points(path: str | os.PathLike) -> tuple[list[dict], int | None]:
    """Measured iterations of a profile file as feature dicts with ``time_s``, and its KV bytes per token.

    Two layouts are read:

    * a latency profile written by ``tr-profile latency`` (``"kind":
      "latency_profile"``, read with :func:`profiler.latency.load_latency_profile`):
      per batch size b the median step time; ``decode`` mode is b decodes each
      attending over ``context_tokens + 1`` tokens, ``extend`` mode is b prefill
      chunks of ``extend_tokens`` tokens each over ``context_tokens`` cached ones;
    * explicit iterations: ``{"schema_version": 1, "kind": "iteration_points",
      "points": [{"n_decode": b, "decode_context": total, "prefill_tokens": q,
      "prefill_context": c, "time_ms": t}, ...]}`` (one prefill chunk of q
      tokens over c cached ones; absent fields are 0).
    """
    path = os.fspath(path)
    doc = _read_json(path)
    if not isinstance(doc, dict):
        raise InputFileError(path, "a profile must be a JSON object")
    kind = doc.get("kind")
    pts: list[dict] = []
    if kind == "latency_profile":
        from profiler.latency import load_latency_profile  # imports no torch
        prof = load_latency_profile(path)
        C, E = float(prof.context_tokens), float(prof.extend_tokens)
        for st in prof.batches:
            b = float(st.batch_size)
            if prof.mode == "decode":
                pts.append({"n_decode": b, "decode_context": b * (C + 1), "prefill_tokens": 0.0,
                            "prefill_pairs": 0.0, "time_s": st.median_ms / 1e3})
            else:
                pts.append({"n_decode": 0.0, "decode_context": 0.0, "prefill_tokens": b * E,
                            "prefill_pairs": b * E * (C + (E + 1) / 2), "time_s": st.median_ms / 1e3})
        return pts, prof.kv_bytes_per_token
    if kind != "iteration_points":
        from shadow_prefill.inputs import short_repr
        raise InputFileError(path, f"unknown profile kind {short_repr(kind)}: expected 'latency_profile' (tr-profile latency) "
                                   f"or 'iteration_points'")
    if doc.get("schema_version") != 1:
        from shadow_prefill.inputs import short_repr
        raise InputFileError(path, f"unsupported schema_version {short_repr(doc.get('schema_version'))} "
                                   f"(this tool reads 1)")
    if not isinstance(doc.get("points"), list) or not doc["points"]:
        raise InputFileError(path, "'points' must be a non-empty list")
    from shadow_prefill.inputs import check_float
    for k, p in enumerate(doc["points"]):
        where = f"{path}: points[{k}]"

        def fail(msg: str, _w=where):
            raise ShadowError(f"{_w}: {msg}")
        if not isinstance(p, dict):
            raise ShadowError(f"{where}: must be an object")
        vals = {}
        for key in ("n_decode", "decode_context", "prefill_tokens", "prefill_context"):
            vals[key] = check_float(p.get(key, 0), key, fail, lo=0.0, hi=1e15)
        q, c = vals["prefill_tokens"], vals["prefill_context"]
        pts.append({"n_decode": vals["n_decode"], "decode_context": vals["decode_context"], "prefill_tokens": q,
                    "prefill_pairs": q * (c + (q + 1) / 2) if q > 0 else 0.0, "time_s": _time_ms(p, where) / 1e3})
    kv = doc.get("kv_bytes_per_token")
    return pts, (int(kv) if isinstance(kv, int) and not isinstance(kv, bool) and kv > 0 else None)
