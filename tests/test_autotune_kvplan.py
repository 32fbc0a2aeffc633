"""KV-cache plan: the paper's layout checked by hand, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tr_core.errors import SpecError
from tr_model.tuning.kvplan import load_placement, make_placement, plan_kv_cache, plan_to_dict, read_model_footprint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "data", "models")
PAPER = os.path.join(MODELS, "paper-placement.json")
GIB = 2 ** 30


def test_qwen3_footprints_by_hand():
    small = read_model_footprint(os.path.join(MODELS, "Qwen3-0.6B", "config.json"))
    large = read_model_footprint(os.path.join(MODELS, "Qwen3-32B", "config.json"))
    # Qwen3-0.6B: hidden 1024, 28 layers, 16 q heads, 8 kv heads, head_dim 128, ffn 3072, vocab 151936, tied.
    per_layer = (1024 * 16 * 128 + 2 * 1024 * 8 * 128 + 16 * 128 * 1024   # q, k, v, o
                 + 3 * 1024 * 3072                                          # gate, up, down
                 + 2 * 1024 + 2 * 128)                                      # two RMSNorms, q/k norms
    assert small.num_parameters == 151936 * 1024 + 28 * per_layer + 1024 == 596_049_920
    assert small.weight_bytes == 2 * 596_049_920
    assert small.kv_bytes_per_token == 2 * 28 * 8 * 128 * 2 == 114_688
    # Qwen3-32B: hidden 5120, 64 layers, 64 q heads, 8 kv heads, head_dim 128, ffn 25600, untied lm_head.
    per_layer = (5120 * 64 * 128 + 2 * 5120 * 8 * 128 + 64 * 128 * 5120 + 3 * 5120 * 25600 + 2 * 5120 + 2 * 128)
    assert large.num_parameters == 2 * 151936 * 5120 + 64 * per_layer + 5120 == 32_762_123_264
    assert large.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2 == 262_144
    # published sizes: "0.6B" (0.44B without embeddings) and "32.8B" (31.2B without embeddings)
    assert abs(small.num_parameters - 151936 * 1024 - 0.44e9) < 0.01e9
    assert abs(large.num_parameters - 2 * 151936 * 5120 - 31.2e9) < 0.05e9
    # TP = 2: 4 kv heads per GPU; sharded weights halve, norms are replicated
    assert large.kv_bytes_per_token_per_gpu(2) == 131_072
    replicated = 64 * (2 * 5120 + 2 * 128) + 5120
    assert large.weight_bytes_per_gpu(2) == 2 * ((32_762_123_264 - replicated) // 2 + replicated)


def test_paper_layout_by_hand():
    plan = plan_kv_cache(load_placement(PAPER))
    budget = int(0.9 * 80 * GIB)                      # 77,309,411,328 bytes per A100-80G
    w_small = 2 * 596_049_920
    replicated = 64 * (2 * 5120 + 2 * 128) + 5120
    w_large_gpu = 2 * ((32_762_123_264 - replicated) // 2 + replicated)
    gpu0 = (budget - w_small - w_large_gpu) // (114_688 + 131_072)   # shared GPU: both models' KV per token
    gpu1 = (budget - w_large_gpu) // 131_072
    assert gpu0 == 176_409 and gpu1 == 339_863          # shared GPU 0 binds
    assert plan.kv_token_capacity == gpu0 and plan.binding_gpu == 0
    s, l = plan.subservers
    assert s["kv_cache_bytes_per_gpu"] == gpu0 * 114_688
    assert l["kv_cache_bytes_per_gpu"] == gpu0 * 131_072
    frac_small = (w_small + gpu0 * 114_688) / (80 * GIB)
    frac_large = (w_large_gpu + gpu0 * 131_072) / (80 * GIB)
    assert 0 <= frac_small - s["memory_fraction"] < 1e-4 and 0 <= frac_large - l["memory_fraction"] < 1e-4
    assert s["memory_fraction"] + l["memory_fraction"] <= 0.9       # shared GPU never over-committed
    assert "--max-total-tokens" in s["launch_args"]["sglang"] and str(gpu0) in s["launch_args"]["sglang"]
    assert l["launch_args"]["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    d = plan_to_dict(plan, 16)
    assert d["tokens_per_request"] == gpu0 // 16
    g0 = d["gpus"][0]
    assert g0["shared"] and g0["used_bytes"] <= g0["budget_bytes"]
    assert g0["budget_bytes"] - g0["used_bytes"] < 114_688 + 131_072   # no room for one more token


def test_page_size_and_reserve():
    small = read_model_footprint(os.path.join(MODELS, "Qwen3-0.6B", "config.json"))
    pl = make_placement([(small, [0], 1)], 8.0, 0.5, reserved_gib_per_model_gpu=1.0, page_size_tokens=16)
    plan = plan_kv_cache(pl)
    raw = (4 * GIB - GIB - 2 * 596_049_920) // 114_688
    assert plan.kv_token_capacity == raw - raw % 16


def test_safetensors_index_and_num_parameters(tmp_path):
    cfg = json.load(open(os.path.join(MODELS, "Qwen3-0.6B", "config.json")))
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1_500_000_000},
                                                                 "weight_map": {}}))
    fp = read_model_footprint(str(d / "config.json"))
    assert fp.weight_bytes == 1_500_000_000 and fp.weight_source == "safetensors index"
    fp = read_model_footprint(config={**cfg, "num_parameters": 1000}, name="x")
    assert fp.weight_bytes == 2000


@pytest.mark.parametrize("field", ["num_hidden_layers", "num_key_value_heads", "torch_dtype", "vocab_size",
                                   "hidden_size"])
def test_missing_config_field_is_named(tmp_path, field):
    cfg = json.load(open(os.path.join(MODELS, "Qwen3-0.6B", "config.json")))
    del cfg[field]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match=f"missing field '{field}'"):
        read_model_footprint(str(p))


def test_bad_placements():
    small = read_model_footprint(os.path.join(MODELS, "Qwen3-0.6B", "config.json"))
    large = read_model_footprint(os.path.join(MODELS, "Qwen3-32B", "config.json"))
    with pytest.raises(SpecError, match="cannot fit the weights: GPU 0"):
        plan_kv_cache(make_placement([(large, [0], 1)], 64.0, 0.9))   # 61.0 GiB of weights > 57.6 GiB
    with pytest.raises(SpecError, match="gpus has 1 entries but tensor_parallel is 2"):
        make_placement([(small, [0], 2)], 80.0)
    with pytest.raises(SpecError, match="neither divides"):
        make_placement([(large, [0, 1, 2], 3)], 80.0)
    with pytest.raises(SpecError, match="memory_budget_fraction"):
        make_placement([(small, [0], 1)], 80.0, 1.5)


def test_placement_schema_accepts_the_example():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.load(open(os.path.join(ROOT, "data", "schemas", "placement.schema.json")))
    doc = json.load(open(PAPER))
    jsonschema.validate(doc, schema)
    doc["models"][0]["gpus"] = [0, 0]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tr_model.autotune_cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_kv_plan_cli(tmp_path):
    out = tmp_path / "plan.json"
    r = _cli("kv-plan", "--placement", PAPER, "--N", "16")
    assert r.returncode == 0, r.stderr
    assert "176409" in r.stdout
    r = _cli("kv-plan", "--placement", PAPER, "--N", "16", "--out", str(out))   # the JSON instead of stdout
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert json.loads(out.read_text())["kv_token_capacity"] == 176_409
    r = _cli("kv-plan", "--placement", PAPER, "--format", "csv")
    assert r.returncode == 0 and r.stdout.splitlines()[0].startswith("model,gpus,tp")
    # bad input: one error line, exit 2
    r = _cli("kv-plan", "--placement", PAPER, "--gpu-memory-gib", "30")
    assert r.returncode == 2 and r.stderr.startswith("error: placement cannot fit the weights")
    assert len(r.stderr.strip().splitlines()) == 1
    cfg = json.load(open(os.path.join(MODELS, "Qwen3-0.6B", "config.json")))
    del cfg["num_key_value_heads"]
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    (tmp_path / "p.json").write_text(json.dumps({"gpu_memory_gib": 80, "models": [
        {"config": "c.json", "gpus": [0]}]}))
    r = _cli("kv-plan", "--placement", str(tmp_path / "p.json"))
    assert r.returncode == 2 and "missing field 'num_key_value_heads'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
