"""A model's config.json is read in one place, :mod:`tr_core.model_config` (issue 25, item 4): the KV plan,
the ShadowPrefill roofline, the runtime's shapes and the profiler agree on KV bytes and parameter counts, and a
second reader of the architecture fields anywhere in the packages fails this test."""

from __future__ import annotations

import json
import os
import re

import pytest

from tr_core import model_config as MC
from tr_core.errors import SpecError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("tr_core", "dtmc", "optimizer", "simulator", "profiler", "shadow_prefill", "tr_model")
QWEN = {name: os.path.join(ROOT, "data", "models", name, "config.json") for name in ("Qwen3-0.6B", "Qwen3-32B")}
DENSE = [
    {"model_type": "qwen3", "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
     "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936,
     "tie_word_embeddings": True, "torch_dtype": "bfloat16"},
    {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
     "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936, "torch_dtype": "bfloat16"},
    {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
     "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16"},
    {"model_type": "gpt2", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
     "num_key_value_heads": 12, "intermediate_size": 3072, "vocab_size": 50257, "torch_dtype": "float32"},
]


@pytest.mark.parametrize("cfg", DENSE, ids=lambda c: c["model_type"])
def test_the_readers_agree(cfg):
    from shadow_prefill.latency import ModelArch
    from tr_model.tuning.kvplan import read_model_footprint

    shape = MC.read_shape(cfg, "config")
    dbytes = 4 if cfg["torch_dtype"] == "float32" else 2
    total, replicated = shape.dense_parameter_count()
    fp = read_model_footprint(config=cfg, name="m")
    arch = ModelArch.from_config(cfg, name="m")
    assert fp.num_parameters == arch.total_params == total
    assert fp.replicated_parameters == replicated
    assert fp.kv_bytes_per_token == arch.kv_bytes_per_token == shape.kv_bytes_per_token(dbytes)
    # the hand count of one layer, as the formulas read in the module docstring
    h, a, k, d, i = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.intermediate
    layer = h * (a + 2 * k) * d + a * d * h + ((a + 2 * k) * d if cfg["model_type"] == "qwen2" else 0) \
        + (2 if cfg["model_type"] == "gpt2" else 3) * h * i + 2 * h + (2 * d if cfg["model_type"] == "qwen3" else 0)
    emb = shape.vocab * h * (1 if cfg.get("tie_word_embeddings") else 2) + h
    assert total == shape.layers * layer + emb


@pytest.mark.parametrize("name", sorted(QWEN))
def test_the_runtime_and_the_profiler_agree_on_the_qwen3_configs(name):
    pytest.importorskip("torch")
    from profiler.latency import kv_bytes_per_token
    from shadow_prefill.latency import ModelArch
    from tr_model.tuning.kvplan import read_model_footprint
    from tr_model.serving.runtime.torch_executor import load_shape

    with open(QWEN[name]) as f:
        cfg = json.load(f)
    shape = load_shape(QWEN[name])
    arch = ModelArch.from_config(cfg)
    assert shape.weight_bytes(2) == arch.total_params * 2 == MC.read_shape(cfg, "c").dense_parameter_count()[0] * 2
    assert shape.kv_bytes_per_token(2) == arch.kv_bytes_per_token == kv_bytes_per_token(cfg, "bf16")
    assert read_model_footprint(QWEN[name]).kv_bytes_per_token == arch.kv_bytes_per_token


def test_fields_are_checked_once_with_the_callers_error():
    from shadow_prefill.errors import ShadowError
    bad = dict(DENSE[2], num_attention_heads=30)
    with pytest.raises(SpecError, match="num_attention_heads = 30 is not a multiple"):
        MC.read_shape(bad, "config")
    with pytest.raises(ShadowError, match="num_attention_heads = 30 is not a multiple"):
        MC.read_shape(bad, "config", error=ShadowError)
    no_kv = {k: v for k, v in DENSE[2].items() if k != "num_key_value_heads"}
    assert MC.read_shape(no_kv, "c").kv_heads == 32                       # transformers' default
    with pytest.raises(SpecError, match="missing field 'num_key_value_heads'"):
        MC.read_shape(no_kv, "c", require_kv_heads=True)                  # the KV plan requires it
    assert MC.read_shape({"text_config": DENSE[0]}, "c") == MC.read_shape(DENSE[0], "c")


# a reader of the architecture fields: cfg["num_hidden_layers"], cfg.get("num_key_value_heads"), getattr(c, "head_dim")
FIELDS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim",
          "intermediate_size", "vocab_size")
READ = re.compile(r"""(\bget\(\s*|\[\s*|getattr\(\s*(c|cfg|config|text|tc)\s*,\s*|\b_\w*int\w*\(\s*\w+\s*,\s*)"""
                  r"""["'](%s)["'](?!\s*\]\s*=[^=])""" % "|".join(FIELDS))


def readers_in(lines) -> list[int]:
    return [n for n, line in enumerate(lines, 1) if READ.search(line)]


def test_no_second_reader_of_the_fields():
    found = []
    for pkg in PACKAGES:
        for d, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                path = os.path.join(d, f)
                if not f.endswith(".py") or os.path.relpath(path, ROOT) == os.path.join("tr_core", "model_config.py"):
                    continue
                with open(path, encoding="utf-8") as fh:
                    lines = fh.read().splitlines()
                found += [f"{os.path.relpath(path, ROOT)}:{n}: {lines[n - 1].strip()}" for n in readers_in(lines)]
    assert not found, "config fields read outside tr_core/model_config.py:\n" + "\n".join(found)


def test_the_reader_detector_can_fail():
    # the readers this test replaced (tr_model/kvplan.py, shadow_prefill/latency.py, the runtime, the profiler)
    for text in ('layers = _int_field(cfg, "num_hidden_layers", where)',
                 'kv_heads = _cfg_int(cfg, "num_key_value_heads", where, default=heads)',
                 'heads = int(get("num_attention_heads"))', 'layers = getattr(c, "num_hidden_layers", None)',
                 "head_dim = cfg['head_dim']"):
        assert readers_in([text]) == [1], text
    assert readers_in(['d = {"num_hidden_layers": layers}']) == []  # writing a config is not reading one
