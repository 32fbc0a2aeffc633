"""A Hugging Face ``config.json`` read once: the architecture fields and the parameter counts.

The KV plan (:mod:`tr_model.kvplan`), the ShadowPrefill roofline (:mod:`shadow_prefill.latency`), the runtime's
Qwen3 shapes (:mod:`tr_model.serving.runtime.torch_executor`) and the profiler's KV bytes (:mod:`profiler.latency`)
read the same fields and count the same parameters; this module is where the fields are read and the
formulas live, and tests/test_model_config.py checks that the callers agree and that no second reader of
the fields appears.  Each caller keeps its own error type (``error=``) and decides what it requires (the
KV plan refuses a config without ``num_key_value_heads``; the roofline defaults it to the attention heads,
as transformers does).

Counts, per decoder layer: attention ``hidden * (heads + 2 kv_heads) * head_dim + heads * head_dim * hidden``
(+ ``(heads + 2 kv_heads) * head_dim`` biases where the architecture has them: qwen2), norms ``2 hidden``
(+ ``2 head_dim`` for qwen3's q/k norms), MLP ``3 hidden * intermediate`` (gated) or ``2`` (gpt2-like);
embeddings ``vocab * hidden`` (twice when the LM head is not tied) and the final norm ``hidden``.

This module imports only the foundation's errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from tr_core.errors import SpecError, short_repr

__all__ = ["ModelShape", "text_config", "config_int", "read_shape", "UNGATED_MLP", "attention_params",
           "norm_params", "mlp_params", "embedding_params"]

# model types whose MLP has two matrices, not three (no gate)
UNGATED_MLP = frozenset({"gpt2", "gpt_bigcode", "gpt_neox", "falcon", "phi", "starcoder2", "bloom", "opt", "gptj"})
MAX_CONFIG_INT = 10 ** 12  # layers, heads, sizes: far above any model, far below float overflow


def text_config(cfg: Any) -> Any:
    """The language model's part of a config: ``text_config`` of a multimodal one (a dict or a transformers
    config object), the config itself otherwise."""
    if isinstance(cfg, Mapping):
        inner = cfg.get("text_config")
        return inner if isinstance(inner, Mapping) else cfg
    get = getattr(cfg, "get_text_config", None)
    return get() if callable(get) else cfg


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    return cfg.get(key, default) if isinstance(cfg, Mapping) else getattr(cfg, key, default)


def config_int(cfg: Any, key: str, where: str, *, default: Any = None, minimum: int = 1,
               maximum: int = MAX_CONFIG_INT, error: type[Exception] = SpecError, whole_floats: bool = False) -> int:
    """An integer field; missing, out of range or a float: ``error`` (``whole_floats``: ``28.0`` is read as 28,
    for the readers that take hand-written configs)."""
    v = _get(cfg, key, None)
    if v is None:
        v = default
    if v is None:
        raise error(f"{where}: missing field {key!r}")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)) \
            or (isinstance(v, float) and not whole_floats) or v != int(v) or not minimum <= v <= maximum:
        raise error(f"{where}: field {key!r} must be an integer in {minimum}..{maximum}, got {short_repr(v)}")
    return int(v)


def attention_params(hidden: int, heads: int, kv_heads: int, head_dim: int, bias: bool) -> int:
    """Q, K, V and O projections of one layer (and their biases)."""
    p = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    return p + ((heads + 2 * kv_heads) * head_dim if bias else 0)


def norm_params(hidden: int, head_dim: int, qk_norm: bool) -> int:
    """The two RMS norms of one layer (and qwen3's q/k norms)."""
    return 2 * hidden + (2 * head_dim if qk_norm else 0)


def mlp_params(hidden: int, intermediate: int, gated: bool) -> int:
    return (3 if gated else 2) * hidden * intermediate


def embedding_params(vocab: int, hidden: int, tied: bool) -> int:
    """Input embeddings, the LM head unless tied, and the final norm."""
    return vocab * hidden * (1 if tied else 2) + hidden


@dataclass(frozen=True)
class ModelShape:
    """The architecture fields every reader of a ``config.json`` needs."""

    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int | None             # None only where the caller did not require it
    intermediate: int | None      # None for a mixture of experts that gives only the experts' size
    tied_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    gated_mlp: bool

    def kv_bytes_per_token(self, dtype_bytes: int, kv_heads: int | None = None) -> int:
        """K and V of every layer for one token (``kv_heads``: those one GPU keeps, default all)."""
        from tr_core.units import kv_bytes_per_token
        return kv_bytes_per_token(self.layers, self.kv_heads if kv_heads is None else kv_heads, self.head_dim,
                                  dtype_bytes)

    @property
    def attention_params(self) -> int:
        return attention_params(self.hidden, self.heads, self.kv_heads, self.head_dim, self.attention_bias)

    @property
    def norm_params(self) -> int:
        return norm_params(self.hidden, self.head_dim, self.qk_norm)

    def mlp_params(self, intermediate: int) -> int:
        return mlp_params(self.hidden, intermediate, self.gated_mlp)

    @property
    def embedding_params(self) -> int:
        return embedding_params(self.vocab, self.hidden, self.tied_embeddings)

    def dense_parameter_count(self) -> tuple[int, int]:
        """``(total, replicated)`` parameters of a dense model (replicated: what tensor parallelism does not
        shard: the norms)."""
        if self.intermediate is None or self.vocab is None:
            raise ValueError("a dense count needs intermediate_size and vocab_size")
        layer = self.attention_params + self.mlp_params(self.intermediate) + self.norm_params
        return self.layers * layer + self.embedding_params, self.layers * self.norm_params + self.hidden


def read_shape(config: Any, where: str, *, error: type[Exception] = SpecError, require_kv_heads: bool = False,
               require_intermediate: bool = True, require_vocab: bool = True,
               whole_floats: bool = False) -> ModelShape:
    """The :class:`ModelShape` of a config (a dict from ``config.json`` or a transformers config object).

    ``num_key_value_heads`` defaults to the attention heads unless ``require_kv_heads``; ``head_dim`` to
    ``hidden_size // num_attention_heads``; ``intermediate_size`` is required unless
    ``require_intermediate`` is false (a mixture of experts), ``vocab_size`` unless ``require_vocab`` is false
    (then None when absent).  Every error names ``where`` and the field.
    """
    cfg = text_config(config)
    if not isinstance(cfg, Mapping) and not hasattr(cfg, "num_hidden_layers"):
        raise error(f"{where}: a config must be a JSON object, got {short_repr(cfg)}")
    for key, kind in (("model_type", str), ("attention_bias", bool), ("tie_word_embeddings", bool)):
        v = _get(cfg, key, None)
        if v is not None and not isinstance(v, kind):
            raise error(f"{where}: field {key!r} must be a {'string' if kind is str else 'boolean'}, "
                        f"got {short_repr(v)}")
    layers = config_int(cfg, "num_hidden_layers", where, error=error, whole_floats=whole_floats)
    hidden = config_int(cfg, "hidden_size", where, error=error, whole_floats=whole_floats)
    heads = config_int(cfg, "num_attention_heads", where, error=error, whole_floats=whole_floats)
    kv_heads = config_int(cfg, "num_key_value_heads", where, error=error, whole_floats=whole_floats,
                          default=None if require_kv_heads else heads)
    if heads % kv_heads:
        raise error(f"{where}: num_attention_heads = {heads} is not a multiple of num_key_value_heads = {kv_heads}")
    if _get(cfg, "head_dim", None) is not None:
        head_dim = config_int(cfg, "head_dim", where, error=error, whole_floats=whole_floats)
    else:
        head_dim = hidden // heads
        if head_dim < 1:
            raise error(f"{where}: hidden_size = {hidden} is smaller than num_attention_heads = {heads} and no "
                        f"'head_dim' is given")
    ints = dict(error=error, whole_floats=whole_floats)
    present = (lambda key: _get(cfg, key, None) is not None)
    vocab = config_int(cfg, "vocab_size", where, **ints) if require_vocab or present("vocab_size") else None
    inter = config_int(cfg, "intermediate_size", where, **ints) \
        if require_intermediate or present("intermediate_size") else None
    model_type = str(_get(cfg, "model_type", "") or "")
    bias = _get(cfg, "attention_bias", None)
    return ModelShape(model_type=model_type, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                      head_dim=head_dim, vocab=vocab, intermediate=inter,
                      tied_embeddings=bool(_get(cfg, "tie_word_embeddings", False)),
                      attention_bias=bool(model_type in ("qwen2", "qwen2_moe") if bias is None else bias),
                      qk_norm=model_type.startswith("qwen3"), gated_mlp=model_type not in UNGATED_MLP)
