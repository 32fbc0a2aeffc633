"""The reference runtime on the virtual clock: exact throughput in a deterministic case, delayed-batching and
global-state invariants, agreement with the chain, trace replay.  No test here depends on wall-clock timing
(timer accuracy is a benchmark: experiments/runtime_vs_model.py --clock wall)."""

from __future__ import annotations

import pytest

import tr_model
from tr_model.serving.runtime import EmulatedExecutor, FixedThresholds, measure_closed_loop
from tr_model.thresholds import ThresholdTable


def _table(rows):
    return ThresholdTable.from_dict({
        "schema_version": 1, "num_models": 2, "max_concurrency": len(rows), "complete": True,
        "fallback_thresholds": [1, 1],
        "entries": [{"active_requests": n + 1, "thresholds": list(b)} for n, b in enumerate(rows)]})


def _model1_completions(t_lo_ms, t_hi_ms, cycle_ms):
    """Number of k >= 1 with t_lo <= k * cycle <= t_hi (completion times of model 1 in lock step)."""
    return sum(1 for k in range(1, int(t_hi_ms / cycle_ms) + 2) if t_lo_ms <= k * cycle_ms <= t_hi_ms)


def test_deterministic_routing_gives_the_exact_throughput():
    # p = 1: a request alternates 0 -> 1 -> 0, model 0 commits nothing, model 1 one token; all N requests move in
    # lock step, so model 1 completes a batch of 3 at every multiple of 6.0 + 27.9 ms.  On the virtual clock the
    # window [300, 4300] ms holds exactly those completions' tokens.
    spec = tr_model.preset("r2r", [6.0, 27.9], p=1.0)
    ex = EmulatedExecutor(spec.latency_ms, time_scale=3)
    r = measure_closed_loop(spec, 3, (1, 3), ex, duration_s=4.0 * 3, warmup_s=0.3 * 3, max_output_tokens=10 ** 6,
                            clock="virtual")
    assert r.tokens == 3 * _model1_completions(300.0, 4300.0, 6.0 + 27.9)
    assert r.throughput_tok_s == pytest.approx(r.tokens / 4.0, rel=1e-12)
    # steps launched in the window and completed before the run stopped: model 1's last launch, at
    # 126 * 33.9 + 6 = 4277.4 ms, would end after 4300 ms
    assert r.mean_batch_size == (3.0, 3.0) and r.steps == (118, 117)
    assert r.admission_latency_ms[1] == pytest.approx(0.0, abs=1e-9)
    assert r.relative_timer_noise == pytest.approx(0.0, abs=1e-12)


def test_virtual_clock_runs_are_repeatable_and_take_no_wall_time():
    import time
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    t0 = time.process_time()
    a = measure_closed_loop(spec, 4, (1, 2), EmulatedExecutor(spec.latency_ms), duration_s=20.0, warmup_s=1.0,
                            seed=5, clock="virtual")
    b = measure_closed_loop(spec, 4, (1, 2), EmulatedExecutor(spec.latency_ms), duration_s=20.0, warmup_s=1.0,
                            seed=5, clock="virtual")
    assert a == b                               # a pure function of the seed
    assert time.process_time() - t0 < 40 * 2   # 42 virtual seconds cost far less CPU (not a timing assertion:
    c = measure_closed_loop(spec, 4, (1, 2), EmulatedExecutor(spec.latency_ms), duration_s=20.0, warmup_s=1.0,
                            seed=6, clock="virtual")   # a bound no machine can miss short of a hang)
    assert c.tokens != a.tokens


@pytest.mark.slow
def test_runtime_agrees_with_the_chain_and_ranks_thresholds_like_it():
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    res = {}
    for B in [(1, 1), (1, 3)]:
        r = measure_closed_loop(spec, 4, B, EmulatedExecutor(spec.latency_ms), duration_s=100.0, warmup_s=2.0,
                                max_output_tokens=512, seed=3, slices=15, clock="virtual")
        ev = tr_model.evaluate(spec, 4, B)
        # the runtime is the chain's dynamics up to the order of simultaneous events: the difference must lie
        # within the run's own 95% batch-means interval (widened x1.5 for the 1 - 0.95 tail), and within 3%
        diff = abs(r.throughput_tok_s - ev.throughput_tok_s)
        assert diff <= 1.5 * r.throughput_ci95_tok_s and diff <= 0.03 * ev.throughput_tok_s, (B, r, ev)
        assert r.admission_latency_ms[1] == pytest.approx(ev.admission_latency_ms[1], rel=0.1)
        assert r.min_batch_size[1] >= B[1]                 # model 1 never launched below its threshold
        res[B] = r
    # the chain says (1,3) beats (1,1) by 11 %; the runtime must rank them the same way, beyond its intervals
    lo, hi = res[(1, 1)], res[(1, 3)]
    assert hi.throughput_tok_s - hi.throughput_ci95_tok_s > lo.throughput_tok_s + lo.throughput_ci95_tok_s


def test_live_lookup_uses_the_global_active_count():
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    table = _table([(1, 1), (1, 2), (1, 2), (1, 3)])
    # long requests: nobody finishes, every subserver's view stays at N = 4, so B = (1, 3) throughout
    ex = EmulatedExecutor(spec.latency_ms)
    r = measure_closed_loop(spec, 4, table, ex, duration_s=3.0, warmup_s=0.3, max_output_tokens=10 ** 6,
                            clock="virtual")
    assert r.active_view_range == ((4, 4), (4, 4))
    assert r.min_batch_size[1] >= 3
    # short requests: finishes and re-admissions travel as control messages; views stay within [1, N]
    ex = EmulatedExecutor(spec.latency_ms)
    r = measure_closed_loop(spec, 4, table, ex, duration_s=3.0, warmup_s=0.3, max_output_tokens=3, clock="virtual")
    assert r.finished_requests > 0 and r.per_request_tok_s > 0
    for lo, hi in r.active_view_range:
        assert 1 <= lo <= hi == 4
    lo, hi = r.active_view_range[1]
    assert r.min_batch_size[1] >= min(table.lookup(v)[1] for v in range(lo, hi + 1))


def test_trace_router_replays_recorded_requests():
    from simulator.traces import trace_from_records
    from tr_model.serving.runtime import TraceRouter
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    # one recorded request: 0 (commit 1) -> 0 (commit 0, escalate) -> 1 (commit 1) -> 0 (commit 1, end): 3 tokens
    # in 6 + 6 + 27.9 + 6 = 45.9 ms, and N = 1 replays it back to back
    recs = [{"request_id": "a", "step": k, "model": m, "next_model": nm, "committed_tokens": c}
            for k, (m, nm, c) in enumerate([(0, 0, 1), (0, 1, 0), (1, 0, 1), (0, -1, 1)])]
    r = measure_closed_loop(spec, 1, (1, 1), EmulatedExecutor(spec.latency_ms), duration_s=(45.9 * 20 + 3) / 1000,
                            warmup_s=0.0, max_output_tokens=10 ** 6, router=TraceRouter(trace_from_records(recs)),
                            clock="virtual")
    assert r.tokens == 60 and r.finished_requests == 20
    assert r.steps == (3 * 20, 20)     # the 21st request's first step starts inside the window but ends after it
    with pytest.raises(ValueError, match="model 0"):
        TraceRouter(trace_from_records([dict(recs[2], step=0, next_model=-1)]))


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
        measure_closed_loop(spec, 2, (1, 1), Broken(), duration_s=5.0, clock="virtual")
    with pytest.raises(ValueError, match="clock"):
        measure_closed_loop(spec, 2, (1, 1), ex, duration_s=0.1, clock="sundial")


def test_measure_cli(tmp_path):
    import json
    import subprocess
    import sys
    from tr_model.tuning.autotune import tune
    th = tmp_path / "th.json"
    tune(tr_model.preset("r2r", [6.0, 27.9], p=0.35), 4, th)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "tr_model.autotune_cli", "measure", *args], capture_output=True,
                              text=True, timeout=600)  # a hang guard, not a timing

    r = cli("--p", "0.35", "--L", "6.0", "27.9", "--N", "4", "--thresholds", str(th), "--duration-s", "2",
            "--warmup-s", "0.2", "--time-scale", "3", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["B"] == [1, 3]                                    # looked up for N = 4 in the file
    assert doc["predicted"]["throughput_tok_s"] == pytest.approx(207.95, abs=0.01)
    assert doc["measured"]["throughput_tok_s"] > 0
    for bad in (["--B", "1", "5"], ["--B", "1"], ["--B", "1", "1", "--time-scale", "0"]):
        r = cli("--p", "0.35", "--L", "6.0", "27.9", "--N", "4", "--duration-s", "1", *bad)
        assert r.returncode == 2 and r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) == 1
