"""The reference runtime: exact throughput in a deterministic case, delayed-batching and global-state
invariants, agreement with the chain, and the torch executor."""

from __future__ import annotations

import asyncio

import pytest

import tr_model
from tr_model.runtime import (EmulatedExecutor, FixedThresholds, measure_closed_loop, run_closed_loop,
                              run_in_new_loop)
from tr_model.thresholds import ThresholdTable


def _table(rows):
    return ThresholdTable.from_dict({
        "schema_version": 1, "num_models": 2, "max_concurrency": len(rows), "complete": True,
        "fallback_thresholds": [1, 1],
        "entries": [{"active_requests": n + 1, "thresholds": list(b)} for n, b in enumerate(rows)]})


def test_deterministic_routing_gives_the_exact_throughput():
    # p = 1: every token costs one step on each model, all N requests move in lock step:
    # N tokens per (6.0 + 27.9) ms, whatever the thresholds
    spec = tr_model.preset("r2r", [6.0, 27.9], p=1.0)
    ex = EmulatedExecutor(spec.latency_ms, time_scale=3)
    r = measure_closed_loop(spec, 3, (1, 3), ex, duration_s=4.0, warmup_s=0.3, max_output_tokens=10 ** 6)
    exact = 3 * 1000 / (6.0 + 27.9)
    # the window cuts at most one batch of 3 tokens at each end; every step lasts (1 + overshoot) x nominal,
    # and the measured overshoot says how much (a loaded machine wakes timers late)
    slack = 2 * 3 / r.window_s
    noise = r.relative_timer_noise
    assert exact / (1 + noise) * 0.995 - slack <= r.throughput_tok_s <= exact + slack
    assert r.mean_batch_size == (3.0, 3.0)
    assert r.admission_latency_ms[1] < 0.5 and noise < 0.05


def test_runtime_agrees_with_the_chain_and_ranks_thresholds_like_it():
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    cfgs = [(1, 1), (1, 3)]

    async def both():
        exs = [EmulatedExecutor(spec.latency_ms, time_scale=3) for _ in cfgs]
        return await asyncio.gather(*(run_closed_loop(spec, 4, B, ex, duration_s=12.0, warmup_s=0.5,
                                                      max_output_tokens=512, seed=3) for B, ex in zip(cfgs, exs)))

    res = run_in_new_loop(both())
    for B, r in zip(cfgs, res):
        ev = tr_model.evaluate(spec, 4, B)
        assert r.throughput_tok_s == pytest.approx(ev.throughput_tok_s, rel=0.08), (B, r.throughput_tok_s)
        assert r.admission_latency_ms[1] == pytest.approx(ev.admission_latency_ms[1], rel=0.3)
        assert r.min_batch_size[1] >= B[1]                 # model 1 never launched below its threshold
        assert r.relative_timer_noise < 0.05
    # the chain says (1,3) beats (1,1) by 11 %; the runtime must rank them the same way
    assert res[1].throughput_tok_s > res[0].throughput_tok_s


def test_live_lookup_uses_the_global_active_count():
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    table = _table([(1, 1), (1, 2), (1, 2), (1, 3)])
    # long requests: nobody finishes, every subserver's view stays at N = 4, so B = (1, 3) throughout
    ex = EmulatedExecutor(spec.latency_ms, time_scale=2)
    r = measure_closed_loop(spec, 4, table, ex, duration_s=3.0, warmup_s=0.3, max_output_tokens=10 ** 6)
    assert r.active_view_range == ((4, 4), (4, 4))
    assert r.min_batch_size[1] >= 3
    # short requests: finishes and re-admissions travel as control messages; views stay within [1, N]
    ex = EmulatedExecutor(spec.latency_ms, time_scale=2)
    r = measure_closed_loop(spec, 4, table, ex, duration_s=3.0, warmup_s=0.3, max_output_tokens=3)
    assert r.finished_requests > 0 and r.per_request_tok_s > 0
    for lo, hi in r.active_view_range:
        assert 1 <= lo <= hi == 4
    lo, hi = r.active_view_range[1]
    assert r.min_batch_size[1] >= min(table.lookup(v)[1] for v in range(lo, hi + 1))


def test_bad_runtime_input_and_executor_failures():
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    ex = EmulatedExecutor(spec.latency_ms)
    with pytest.raises(ValueError, match="infeasible"):
        measure_closed_loop(spec, 2, (1, 3), ex, duration_s=0.1)
    with pytest.raises(ValueError, match="entries"):
        measure_closed_loop(spec, 2, (1, 1, 1), ex, duration_s=0.1)
    with pytest.raises(ValueError, match="n_clients"):
        measure_closed_loop(spec, 0, (1, 1), ex, duration_s=0.1)
    with pytest.raises(ValueError):
        FixedThresholds((0, 1))

    class Broken:
        time_scale = 1.0

        async def step(self, model, batch):
            raise RuntimeError("device lost")

    with pytest.raises(RuntimeError, match="device lost"):
        measure_closed_loop(spec, 2, (1, 1), Broken(), duration_s=5.0)


def test_torch_executor_runs_real_steps():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from profiler.runtime_executor import tiny_qwen3_models
    from tr_model.runtime import torch_executor
    models = tiny_qwen3_models(((32, 1), (64, 1)), vocab_size=128, seed=1)
    ex = torch_executor(models, max_context=16)
    # left padding and the attention mask must not change a row's next token
    a, b = [5, 17, 3], [9, 1, 4, 4, 8, 100, 2]
    alone = ex._forward(1, [a])
    assert ex._forward(1, [b, a])[1] == alone[0]
    with torch.inference_mode():
        logits = models[1](input_ids=torch.tensor([a])).logits
    assert alone[0] == int(logits[0, -1].argmax())
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    r = measure_closed_loop(spec, 2, (1, 1), ex, duration_s=1.5, warmup_s=0.2, max_output_tokens=6)
    assert r.tokens > 0 and r.throughput_tok_s > 0 and r.steps[0] > 0
    lat = ex.latency_table()
    assert lat[0] and all(ms > 0 for ms in lat[0].values())


@pytest.mark.gpu
def test_torch_executor_on_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from profiler.runtime_executor import tiny_qwen3_models
    from tr_model.runtime import torch_executor
    ex = torch_executor(tiny_qwen3_models(device="cuda"), device="cuda")
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    r = measure_closed_loop(spec, 4, (1, 2), ex, duration_s=2.0, warmup_s=0.5, max_output_tokens=8)
    assert r.tokens > 0


def test_measure_cli(tmp_path):
    import json
    import subprocess
    import sys
    from tr_model.autotune import tune
    th = tmp_path / "th.json"
    tune(tr_model.preset("r2r", [6.0, 27.9], p=0.35), 4, th)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "tr_model.autotune_cli", "measure", *args], capture_output=True,
                              text=True, timeout=120)

    r = cli("--p", "0.35", "--L", "6.0", "27.9", "--clients", "4", "--thresholds", str(th), "--duration-s", "2",
            "--warmup-s", "0.2", "--time-scale", "3", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["B"] == [1, 3]                                    # looked up for N = 4 in the file
    assert doc["predicted"]["throughput_tok_s"] == pytest.approx(207.95, abs=0.01)
    assert doc["measured"]["throughput_tok_s"] > 0
    for bad in (["--B", "1", "5"], ["--B", "1"], ["--B", "1", "1", "--time-scale", "0"]):
        r = cli("--p", "0.35", "--L", "6.0", "27.9", "--clients", "4", "--duration-s", "1", *bad)
        assert r.returncode == 2 and r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) == 1
