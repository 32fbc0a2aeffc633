"""The iteration-latency models: roofline against hand arithmetic, presets, fitted profiles, SLOs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shadow_prefill.errors import InputFileError, ShadowError
from shadow_prefill.latency import (GPUSpec, LatencyModel, ModelArch, choose_tp, fit_linear_model, load_gpu,
                                    load_model_arch, read_profile_points, build_roofline)
from tr_core.errors import TRError
from shadow_prefill.presets import MODEL_CONFIGS

TINY = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000, "torch_dtype": "bfloat16",
        "max_position_embeddings": 4096}
# round numbers so the arithmetic is easy: 1 TFLOP/s, 1 GB/s, no efficiency loss, no overheads
GPU = {"name": "unit", "bf16_flop_per_s": 1e12, "hbm_bytes_per_s": 1e9, "hbm_bytes": 1e9, "link_bytes_per_s": 1e9,
       "allreduce_latency_s": 1e-5, "pcie_bytes_per_s": 1e8, "flops_efficiency": 1.0, "bandwidth_efficiency": 1.0,
       "iteration_overhead_s": 0.0, "decode_seq_overhead_s": 0.0}


def test_tiny_config_parameter_counts():
    a = ModelArch.from_config(TINY, name="tiny")
    assert a.head_dim == 16
    # attention: 64 x (4 + 2*2) x 16 (q, k, v) + 4 x 16 x 64 (o) = 8192 + 4096
    assert a.attention_params == 12288
    assert a.dense_layer_params == 12288 + 3 * 64 * 128 + 2 * 64  # + gated MLP + two norms
    assert a.total_params == 2 * 36992 + 2 * 1000 * 64 + 64     # layers + embedding + LM head + final norm
    assert a.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2              # K and V x layers x KV heads x head_dim x bf16
    assert a.context_window == 4096


def test_roofline_one_layer_by_hand():
    lm = build_roofline(ModelArch.from_config(TINY, name="tiny"), GPU, tp=1)
    # 3 decodes over 300 context tokens in total, one chunk of 10 new tokens over 20 cached
    bd = lm.layer_breakdown(n_decode=3, decode_context=300, chunks=[(10, 20)])
    T = 13
    assert bd["gemm_compute_s"] == pytest.approx(2 * 36992 * T / 1e12)       # 2 FLOPs per weight per token
    assert bd["gemm_weights_s"] == pytest.approx(36992 * 2 / 1e9)            # read every weight once (bf16)
    pairs = 10 * (20 + 11 / 2)                                                # causal query-key pairs: 255
    assert bd["prefill_attn_compute_s"] == pytest.approx(4 * 4 * 16 * pairs / 1e12)
    assert bd["prefill_attn_kv_s"] == pytest.approx((20 + 10) * 128 / 1e9)    # 128 B of KV per token per layer
    assert bd["decode_attn_kv_s"] == pytest.approx(300 * 128 / 1e9)
    layer = 36992 * 2 / 1e9 + 30 * 128 / 1e9 + 300 * 128 / 1e9               # every term memory-bound here
    assert bd["layer_s"] == pytest.approx(layer)
    head = 64 * 1000 * 2 / 1e9                                                # LM head weights, 4 logits rows
    assert bd["lm_head_s"] == pytest.approx(head)
    assert lm.iteration_time(3, 300, [(10, 20)]) == pytest.approx(2 * layer + head)
    assert bd["iteration_s"] == pytest.approx(2 * layer + head)
    # a 2,048-token prefill is compute-bound in the GEMMs
    bd = lm.layer_breakdown(chunks=[(2048, 0)])
    assert bd["gemm_compute_s"] > bd["gemm_weights_s"]
    assert bd["layer_s"] == pytest.approx(2 * 36992 * 2048 / 1e12 + max(4 * 4 * 16 * 2048 * 2049 / 2 / 1e12,
                                                                         2048 * 128 / 1e9))
    assert lm.iteration_time() == 0.0


def test_roofline_tensor_parallel_terms():
    a = ModelArch.from_config(TINY, name="tiny")
    lm1, lm2 = build_roofline(a, GPU, tp=1), build_roofline(a, GPU, tp=2)
    b1, b2 = lm1.layer_breakdown(1, 100), lm2.layer_breakdown(1, 100)
    assert b2["gemm_weights_s"] == pytest.approx(b1["gemm_weights_s"] / 2)
    assert b2["decode_attn_kv_s"] == pytest.approx(b1["decode_attn_kv_s"] / 2)  # 1 KV head per GPU
    # two all-reduces of T x hidden x 2 bytes, ring factor 2 (tp-1)/tp = 1
    assert b2["allreduce_s"] == pytest.approx(2 * (1e-5 + 1 * 64 * 2 / 1e9))
    assert b1["allreduce_s"] == 0.0
    assert lm2.kv_bytes_per_token == a.kv_bytes_per_token
    with pytest.raises(ShadowError, match="neither divides"):
        build_roofline(ModelArch.from_config({**TINY, "num_key_value_heads": 4, "num_attention_heads": 12}), GPU, tp=3)


def test_moe_active_and_total():
    cfg = {**TINY, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 32}
    a = ModelArch.from_config(cfg)
    tot, act = a.moe_layer_params
    common = 12288 + 128 + 64 * 4          # attention, norms, router
    assert tot == common + 4 * 3 * 64 * 32
    assert act == common + 2 * 3 * 64 * 32
    lm = build_roofline(a, GPU, tp=1)
    assert lm.params[2] == pytest.approx(2 * act)       # FLOPs: active experts
    assert lm.params[3] == pytest.approx(tot * 2)       # weight reads: all experts


# published totals (and actives) in billions of parameters
PUBLISHED = {"qwen3-0.6b": 0.6, "qwen3-1.7b": 1.7, "qwen3-4b": 4.0, "qwen3-8b": 8.2, "qwen3-14b": 14.8,
             "qwen3-32b": 32.8, "qwen3-30b-a3b": (30.5, 3.3), "qwen3-235b-a22b": (235.0, 22.0),
             "qwen2.5-7b": 7.6, "qwen2.5-72b": 72.7, "llama-3-8b": 8.0, "llama-3-70b": 70.6, "llama-3.1-8b": 8.0,
             "llama-3.1-70b": 70.6, "mistral-7b-v0.3": 7.2, "mistral-nemo-12b": 12.2,
             "mixtral-8x7b": (46.7, 12.9), "mixtral-8x22b": (140.6, 39.1), "gemma-7b": 8.5, "gemma-2-9b": 9.2}


@pytest.mark.parametrize("name", sorted(MODEL_CONFIGS))
def test_presets_match_published_sizes(name):
    a = load_model_arch(name)
    want = PUBLISHED[name]
    tot, act = (want, want) if isinstance(want, float) else want
    assert a.total_params / 1e9 == pytest.approx(tot, rel=0.02)
    assert a.active_params / 1e9 == pytest.approx(act, rel=0.03)


def test_paper_facts():
    # the paper: Gemma-7B stores 458 KB of KV per token (full multi-head attention)
    assert load_model_arch("gemma-7b").kv_bytes_per_token == 458752
    h100 = load_gpu("h100")
    # smallest TP with weights <= half of HBM: 8B on 1 GPU, 70B on 4, Mixtral-8x22B on 8
    assert choose_tp(load_model_arch("llama-3.1-8b"), h100) == 1
    assert choose_tp(load_model_arch("llama-3.1-70b"), h100) == 4
    assert choose_tp(load_model_arch("mixtral-8x22b"), h100) == 8
    assert load_model_arch("qwen2.5-7b-instruct").name == "qwen2.5-7b-instruct"  # alias keeps the given name


def test_prefill_decode_slos_and_memory():
    lm = build_roofline(ModelArch.from_config(TINY, name="tiny"), GPU, tp=1)
    # chunked prefill = the sum of its chunk iterations
    want = lm.iteration_time(0, 0, [(2048, 0)]) + lm.iteration_time(0, 0, [(952, 2048)])
    assert lm.prefill_time(3000, chunk=2048) == pytest.approx(want)
    assert lm.prefill_time(3000, cached=0, chunk=10_000) == pytest.approx(lm.iteration_time(0, 0, [(3000, 0)]))
    assert lm.prefill_time(0) == 0.0
    assert lm.decode_time(1, 100) == pytest.approx(lm.iteration_time(1, 100))
    # SLOs: max(1 s, 5 x isolated prefill), max(25 ms, 5 x batch-1 decode)
    assert lm.ttft_slo(100) == 1.0
    assert lm.tpot_slo() == pytest.approx(max(0.025, 5 * lm.decode_time(1, 1)))
    slow = build_roofline(ModelArch.from_config(TINY, name="tiny"), {**GPU, "bf16_flop_per_s": 1e9, "hbm_bytes_per_s": 1e6})
    assert slow.ttft_slo(3000) == pytest.approx(5 * slow.prefill_time(3000))
    assert slow.tpot_slo() == pytest.approx(5 * slow.decode_time(1, 1))
    # KV capacity: (0.9 x 1 GB - weights) / KV bytes per token; PCIe reload
    a = ModelArch.from_config(TINY)
    assert lm.kv_capacity_tokens() == int((0.9e9 - a.weight_bytes) // a.kv_bytes_per_token)
    assert lm.host_reload_time(1000) == pytest.approx(1000 * 256 / 1e8)


def test_h100_roofline_is_plausible():
    lm = build_roofline("llama-3.1-8b", "h100")
    assert 0.004 < lm.decode_time(1, 1) < 0.010          # weight-bound: 16 GB at ~3 TB/s
    assert 0.03 < lm.prefill_time(2048) < 0.10           # compute-bound: 33 TFLOP at ~600 TFLOP/s
    assert build_roofline("llama-3.1-8b", "h200").decode_time(1, 1) < lm.decode_time(1, 1)


def write_profile(path, mode, ctx, ext, medians_ms, kv=4096):
    """A profile in the profiler's own format (``tr-profile latency``), built with its dataclasses."""
    from profiler.latency import BatchStats, LatencyProfile
    batches = tuple(BatchStats(b, 5, t, t, t, t, 0.0) for b, t in medians_ms.items())
    prof = LatencyProfile(model="m", config_sha256="0" * 64, device="cpu", dtype="bf16", mode=mode,
                          context_tokens=ctx, extend_tokens=ext, cuda_graph=False, warmup_steps=1, timed_steps=5,
                          batches=batches, fit=None, weight_bytes=1, kv_bytes_per_token=kv)
    path.write_text(json.dumps(prof.to_dict()))
    return path


def test_fit_linear_recovers_coefficients(tmp_path):
    true = dict(c0=0.005, dec=1e-4, ctx=2e-8, tok=5e-5, pair=1e-9)

    def t(nd, dctx, q, pairs):
        return true["c0"] + true["dec"] * nd + true["ctx"] * dctx + true["tok"] * q + true["pair"] * pairs

    files = []
    for ctx in (1000, 8000):  # a decode attends over its context and itself
        med = {b: 1e3 * t(b, b * (ctx + 1), 0, 0) for b in (1, 2, 8, 32, 64)}
        files.append(write_profile(tmp_path / f"decode{ctx}.json", "decode", ctx, 1, med))
    E = 512
    for ctx in (0, 8000):
        med = {b: 1e3 * t(0, 0, b * E, b * E * (ctx + (E + 1) / 2)) for b in (1, 2, 4)}
        files.append(write_profile(tmp_path / f"extend{ctx}.json", "extend", ctx, E, med))
    pts = []
    for f in files:
        p, kv = read_profile_points(f)
        pts.extend(p)
        assert kv == 4096
    lm = fit_linear_model(pts, name="fit", kv_bytes_per_token=4096)
    assert lm.fit["r2"] == pytest.approx(1.0)
    assert lm.fit["max_rel_error"] < 1e-6
    assert lm.params[1:6] == pytest.approx([true["c0"], true["dec"], true["ctx"], true["tok"], true["pair"]],
                                           rel=1e-5)
    assert lm.iteration_time(4, 4000, [(100, 50)]) == pytest.approx(t(4, 4000, 100, 100 * (50 + 50.5)))
    assert lm.kv_bytes_per_token == 4096
    # the JSON form round-trips
    again = LatencyModel.from_dict(json.loads(json.dumps(lm.to_dict())))
    assert again.iteration_time(2, 10) == pytest.approx(lm.iteration_time(2, 10))
    assert again.kv_bytes_per_token == 4096
    # explicit iterations
    f = tmp_path / "points.json"
    f.write_text(json.dumps({"schema_version": 1, "kind": "iteration_points",
                             "points": [{"n_decode": 1, "decode_context": 10, "time_ms": 5.0},
                                        {"prefill_tokens": 100, "prefill_context": 50, "time_ms": 9.0}]}))
    pts, kv = read_profile_points(f)
    assert pts[1]["prefill_pairs"] == pytest.approx(100 * (50 + 50.5))
    assert pts[0]["time_s"] == pytest.approx(0.005) and kv is None
    with pytest.raises(ShadowError, match="at least 2"):
        fit_linear_model(pts[:1])


POINTS = {"schema_version": 1, "kind": "iteration_points"}


@pytest.mark.parametrize("doc, msg", [
    ({"mode": "decode", "batches": []}, "unknown profile kind"),
    ({"kind": "latency_profile", "schema_version": 99}, "schema_version"),
    ({**POINTS, "schema_version": 2, "points": [{"time_ms": 1}]}, "schema_version"),
    ({**POINTS, "points": []}, "non-empty"),
    ({**POINTS, "points": [{"n_decode": -1, "time_ms": 1}]}, "n_decode"),
    ({**POINTS, "points": [{"n_decode": 1}]}, "time_ms"),
    ({**POINTS, "points": [{"n_decode": 1, "time_ms": 0}]}, "time_ms"),
    ([1, 2], "JSON object"),
])
def test_bad_profiles(tmp_path, doc, msg):
    f = tmp_path / "p.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(TRError, match=msg):
        read_profile_points(f)
    f.write_text("{\n oops")
    with pytest.raises(InputFileError, match=r"p.json:2: invalid JSON"):
        read_profile_points(f)


def test_saved_model_checks():
    with pytest.raises(ShadowError, match="not a saved latency model"):
        LatencyModel.from_dict({"params": [0] * 16})
    with pytest.raises(ShadowError, match="16 finite params"):
        LatencyModel.from_dict({"schema_version": 1, "kind": "latency_model", "model_kind": "linear", "params": [0]})


def test_bad_configs_and_gpus(tmp_path):
    with pytest.raises(ShadowError, match="hidden_size"):
        ModelArch.from_config({k: v for k, v in TINY.items() if k != "hidden_size"})
    with pytest.raises(ShadowError, match="not a multiple"):
        ModelArch.from_config({**TINY, "num_key_value_heads": 3})
    with pytest.raises(ShadowError, match="dtype"):
        ModelArch.from_config({**TINY, "torch_dtype": "float13"})
    with pytest.raises(ShadowError, match="num_experts_per_tok"):
        ModelArch.from_config({**TINY, "num_local_experts": 4})
    f = tmp_path / "config.json"
    f.write_text('{"hidden_size": 64,\n oops}')
    with pytest.raises(InputFileError, match=r"config.json:2: invalid JSON"):
        load_model_arch(str(tmp_path))
    with pytest.raises(ShadowError, match="no built-in architecture"):
        load_model_arch("gpt-17")
    with pytest.raises(ShadowError, match="hbm_bytes_per_s"):
        load_gpu({"bf16_flop_per_s": 1e12, "hbm_bytes_per_s": 0, "hbm_bytes": 1e9})
    with pytest.raises(ShadowError, match="unknown field"):
        load_gpu({"bf16_flop_per_s": 1e12, "hbm_bytes_per_s": 1e9, "hbm_bytes": 1e9, "tflops": 3})
    with pytest.raises(ShadowError, match="no GPU preset"):
        load_gpu("a100-nope")
    g = tmp_path / "gpu.json"
    g.write_text(json.dumps(GPU))
    assert load_gpu(str(g)) == GPUSpec(**GPU)
    # a config's explicit parameter count wins
    a = ModelArch.from_config({**TINY, "num_parameters": 1_000_000})
    assert a.total_params == 1_000_000 and a.active_params == 1_000_000
    assert np.isfinite(build_roofline(a, GPU).decode_time())
