"""Attention as a serving engine runs it, for the profiler's timing loop.

Why.  transformers' ``sdpa`` path gives a static KV cache an explicit mask over
the whole preallocated cache.  With a mask, PyTorch's SDPA on CUDA cannot use
its flash kernel and does not take grouped-query attention natively, so on
transformers 5.x up to about 5.2x it first expands K and V from ``H_kv`` to
``H_q`` heads (``repeat_kv``: a copy of ``H_q / H_kv`` times the cache per
layer and step) and then runs the masked (memory-efficient or math) kernel on
the copy.  That traffic grows with the batch size b and the context, not with the
weights.  On an H200 the Qwen3-32B config at context 512 (transformers 5.17)
gained 1.46 ms per request per decode step in graph mode (26.3 ms at b = 1,
48.5 ms at b = 16), while reading one request's K and V once (513 tokens x
256 KiB) takes 0.03 ms at 4.8 TB/s; the ``repeat_kv`` copy alone moves about
2.3 GB per request and step (0.5 ms), and the masked kernel on the expanded
heads the rest (the exact split is for the GPU run to measure).  Serving
engines (vLLM, SGLang, TensorRT-LLM) run flash-decoding kernels that read each
request's K and V once in their ``H_kv`` heads.

What.  :func:`serving_attention` computes the same attention without a mask and
without copying K or V.  The query heads that share one KV head are folded into
the query-length axis: with ``g = H_q / H_kv`` and T new tokens,

    q[b, h, t, :]  (h = j g + r)   ->   q'[b, j, r T + t, :],

so one SDPA call over ``H_kv`` heads with ``g T`` query rows reads every K/V
row once.  Row ``r T + t`` is token t of the step; with a cache of S slots that
all hold valid tokens (the profiler's caches are exactly ``context + T`` long
and every request has the same context) token t may attend to keys
``0 .. S - T + t``: for decode (T = 1) that is every key and no mask is needed
(PyTorch picks its flash kernel), for extend it is the lower-right causal mask
of ``g T`` rows, a boolean ``(g T, S)`` tensor.  The output is unfolded the same
way.  The result equals transformers' own attention up to floating-point
rounding (checked on CPU by ``tests/test_profiler_latency.py``).

Validity.  Only for caches whose every slot is valid for every request (equal
contexts, cache length = context + T).  That holds in the profiler's stepper,
never in general, so the function is registered under its own name and only
the profiler selects it, for the duration of one profile.

Needs transformers >= 4.48 (``AttentionInterface``); older versions keep their
own attention (:func:`select_attention` says so).
"""

from __future__ import annotations

import weakref
from contextlib import contextmanager
from typing import Any

NAME = "tr_serving_attention"
ATTENTION_CHOICES = ("serving", "transformers")

__all__ = ["NAME", "ATTENTION_CHOICES", "serving_attention", "register", "select_attention", "own_attention"]

_BEFORE: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()  # model -> its own implementation


def serving_attention(module: Any, query, key, value, attention_mask=None, dropout: float = 0.0,
                      scaling: float | None = None, is_causal: bool | None = None, **kwargs):
    """transformers attention-function signature; returns ``(output (b, T, H_q, d_v), None)``."""
    import torch
    import torch.nn.functional as F

    b, hq, t, d = query.shape
    hkv, s = key.shape[1], key.shape[2]
    if hq % hkv:
        raise ValueError(f"query heads {hq} are not a multiple of key/value heads {hkv}")
    g = hq // hkv
    q = query.reshape(b, hkv, g * t, d)  # rows r*T + t of kv head j <- query head j*g + r, token t
    mask = None
    if t > 1:
        tok = torch.arange(g * t, device=query.device) % t
        mask = torch.arange(s, device=query.device)[None, :] <= (s - t + tok)[:, None]
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, dropout_p=0.0, scale=scaling)
    dv = value.shape[-1]
    out = out.reshape(b, hkv, g, t, dv).reshape(b, hq, t, dv).transpose(1, 2).contiguous()
    return out, None


def register() -> bool:
    """Register :func:`serving_attention` with transformers; False where the version has no AttentionInterface."""
    try:
        from transformers import AttentionInterface
    except ImportError:
        return False
    AttentionInterface.register(NAME, serving_attention)
    return True


def _current(model) -> str | None:
    return getattr(model.config, "_attn_implementation", None)


def _set(model, name: str) -> None:
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        setter(name)
    else:
        model.config._attn_implementation = name
    if _current(model) != name:
        raise RuntimeError(f"could not switch the attention implementation to {name!r}")


@contextmanager
def select_attention(model, choice: str):
    """Run the body with ``choice`` ('serving' or 'transformers'); yields the label recorded in the profile.

    'serving' falls back to the model's own attention (label says why) where
    transformers cannot register one, or where the config uses sliding windows
    (their caches do not hold every slot).
    """
    if choice not in ATTENTION_CHOICES:
        raise ValueError(f"--attention must be one of {', '.join(ATTENTION_CHOICES)}, got {choice!r}")
    before = _current(model)
    label = f"transformers:{before}"
    if choice == "transformers":
        yield label
        return
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    sliding = getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True)
    if sliding or "sliding_attention" in (getattr(text, "layer_types", None) or ()):
        yield f"{label} (serving attention skipped: the config uses sliding windows)"
        return
    if not register():
        yield f"{label} (serving attention needs transformers >= 4.48)"
        return
    try:
        _set(model, NAME)
    except (ValueError, RuntimeError, AttributeError) as e:
        yield f"{label} (serving attention not accepted: {str(e).splitlines()[0] if str(e) else type(e).__name__})"
        return
    _BEFORE[model] = before
    try:
        yield "serving"
    finally:
        _BEFORE.pop(model, None)
        _set(model, before)


@contextmanager
def own_attention(model):
    """Run the body with the model's own attention (a prefill fills only part of the cache)."""
    before = _BEFORE.get(model)
    if before is None or _current(model) != NAME:
        yield
        return
    _set(model, before)
    try:
        yield
    finally:
        _set(model, NAME)
