"""Built-in model architectures (``config.json``-like dicts) and GPU descriptions.

The model dicts carry the Hugging Face ``config.json`` fields the roofline
reads, with the public numbers of each architecture; the parameter counts
they imply (:class:`~shadow_prefill.latency.ModelArch`) match the published
sizes (tests check them).  Names are lower-case; :func:`model_config` also
accepts the aliases below (e.g. the model names of LLMRouter's matrices).

GPU figures are the vendors' dense bf16 tensor FLOP/s (no sparsity), HBM
bandwidth and capacity, NVLink bandwidth per direction and PCIe 5.0 x16
bandwidth per direction; the efficiencies and overheads are modelling
defaults, not datasheet values.
"""

from __future__ import annotations

import copy

from shadow_prefill.errors import ShadowError

__all__ = ["MODEL_CONFIGS", "MODEL_ALIASES", "GPU_PRESETS", "model_config", "gpu_preset"]


def _dense(model_type, hidden, layers, heads, kv_heads, inter, vocab, max_pos, tied=False, head_dim=None, **kw):
    d = {"model_type": model_type, "hidden_size": hidden, "num_hidden_layers": layers,
         "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": inter,
         "vocab_size": vocab, "max_position_embeddings": max_pos, "tie_word_embeddings": tied,
         "torch_dtype": "bfloat16"}
    if head_dim is not None:
        d["head_dim"] = head_dim
    d.update(kw)
    return d


MODEL_CONFIGS: dict[str, dict] = {
    # Qwen3 (dense: 40,960-token native window; q/k norms)
    "qwen3-0.6b": _dense("qwen3", 1024, 28, 16, 8, 3072, 151936, 40960, tied=True, head_dim=128),
    "qwen3-1.7b": _dense("qwen3", 2048, 28, 16, 8, 6144, 151936, 40960, tied=True, head_dim=128),
    "qwen3-4b": _dense("qwen3", 2560, 36, 32, 8, 9728, 151936, 40960, tied=True, head_dim=128),
    "qwen3-8b": _dense("qwen3", 4096, 36, 32, 8, 12288, 151936, 40960, head_dim=128),
    "qwen3-14b": _dense("qwen3", 5120, 40, 40, 8, 17408, 151936, 40960, head_dim=128),
    "qwen3-32b": _dense("qwen3", 5120, 64, 64, 8, 25600, 151936, 40960, head_dim=128),
    "qwen3-30b-a3b": _dense("qwen3_moe", 2048, 48, 32, 4, 6144, 151936, 40960, head_dim=128,
                            num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768),
    "qwen3-235b-a22b": _dense("qwen3_moe", 4096, 94, 64, 4, 12288, 151936, 40960, head_dim=128,
                              num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1536),
    # Qwen2.5 (q/k/v biases)
    "qwen2.5-7b": _dense("qwen2", 3584, 28, 28, 4, 18944, 152064, 32768),
    "qwen2.5-72b": _dense("qwen2", 8192, 80, 64, 8, 29568, 152064, 32768),
    # Llama 3 / 3.1 / 3.3
    "llama-3-8b": _dense("llama", 4096, 32, 32, 8, 14336, 128256, 8192),
    "llama-3-70b": _dense("llama", 8192, 80, 64, 8, 28672, 128256, 8192),
    "llama-3.1-8b": _dense("llama", 4096, 32, 32, 8, 14336, 128256, 131072),
    "llama-3.1-70b": _dense("llama", 8192, 80, 64, 8, 28672, 128256, 131072),
    # Mistral / Mixtral
    "mistral-7b-v0.3": _dense("mistral", 4096, 32, 32, 8, 14336, 32768, 32768),
    "mistral-nemo-12b": _dense("mistral", 5120, 40, 32, 8, 14336, 131072, 131072, head_dim=128),
    "mixtral-8x7b": _dense("mixtral", 4096, 32, 32, 8, 14336, 32000, 32768, num_local_experts=8,
                           num_experts_per_tok=2),
    "mixtral-8x22b": _dense("mixtral", 6144, 56, 48, 8, 16384, 32768, 65536, num_local_experts=8,
                            num_experts_per_tok=2),
    # Gemma (full multi-head attention in Gemma-7B: 458,752 bytes of KV per token)
    "gemma-7b": _dense("gemma", 3072, 28, 16, 16, 24576, 256000, 8192, tied=True, head_dim=256),
    "gemma-2-9b": _dense("gemma2", 3584, 42, 16, 8, 14336, 256000, 8192, tied=True, head_dim=256),
}

MODEL_ALIASES: dict[str, str] = {
    "qwen2.5-7b-instruct": "qwen2.5-7b", "qwen2.5-72b-instruct": "qwen2.5-72b",
    "llama-3.1-8b-instruct": "llama-3.1-8b", "llama-3.1-70b-instruct": "llama-3.1-70b",
    "llama-3.3-70b-instruct": "llama-3.1-70b", "llama-3.3-70b": "llama-3.1-70b",
    "llama3-8b-instruct": "llama-3-8b", "llama3-70b-instruct": "llama-3-70b",
    "llama3-chatqa-1.5-8b": "llama-3-8b", "llama3-chatqa-1.5-70b": "llama-3-70b",
    "mistral-7b-instruct-v0.3": "mistral-7b-v0.3", "mistral-nemo-12b-instruct": "mistral-nemo-12b",
    "mixtral-8x7b-instruct-v0.1": "mixtral-8x7b", "mixtral-8x22b-instruct-v0.1": "mixtral-8x22b",
    "codegemma-7b": "gemma-7b", "gemma-7b-it": "gemma-7b", "gemma-2-9b-it": "gemma-2-9b",
}

GPU_PRESETS: dict[str, dict] = {
    "h100": {"name": "H100-SXM5-80GB", "bf16_flop_per_s": 989.4e12, "hbm_bytes_per_s": 3.35e12, "hbm_bytes": 80e9,
             "link_bytes_per_s": 450e9, "allreduce_latency_s": 8e-6, "pcie_bytes_per_s": 64e9,
             "flops_efficiency": 0.6, "bandwidth_efficiency": 0.85, "iteration_overhead_s": 1e-3,
             "decode_seq_overhead_s": 5e-6},
    "h200": {"name": "H200-SXM-141GB", "bf16_flop_per_s": 989.4e12, "hbm_bytes_per_s": 4.8e12, "hbm_bytes": 141e9,
             "link_bytes_per_s": 450e9, "allreduce_latency_s": 8e-6, "pcie_bytes_per_s": 64e9,
             "flops_efficiency": 0.6, "bandwidth_efficiency": 0.85, "iteration_overhead_s": 1e-3,
             "decode_seq_overhead_s": 5e-6},
}
GPU_ALIASES = {"h100-sxm": "h100", "h100-80gb": "h100", "h100-sxm5": "h100", "h200-sxm": "h200",
               "h200-141gb": "h200"}


def model_config(name: str) -> dict:
    """A copy of a built-in ``config.json`` dict, by name or alias (case-insensitive)."""
    key = name.lower()
    key = MODEL_ALIASES.get(key, key)
    if key not in MODEL_CONFIGS:
        raise ShadowError(f"no built-in architecture {name!r}; built in: {', '.join(sorted(MODEL_CONFIGS))} "
                          f"(aliases: {', '.join(sorted(MODEL_ALIASES))}); or give a config.json path")
    d = copy.deepcopy(MODEL_CONFIGS[key])
    d.setdefault("_name_or_path", key)
    return d


def gpu_preset(name: str) -> dict:
    key = name.lower()
    key = GPU_ALIASES.get(key, key)
    if key not in GPU_PRESETS:
        raise ShadowError(f"no GPU preset {name!r}; presets: {', '.join(sorted(GPU_PRESETS))} (or a JSON file)")
    return dict(GPU_PRESETS[key])
