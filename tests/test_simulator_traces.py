"""Trace-driven simulation: JSONL reading/validation, renewal closed form, geometric trace = P routing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tr_core.errors import SpecError
from tr_core.spec import preset
from simulator import (bimodal_run_length_pmf, generate_trace, read_trace, run_lengths, simulate,
                       trace_from_records, write_trace)

R2R = preset("r2r", [6.0, 27.9], p=0.35)


def _renewal_throughput(spec, tr) -> float:
    # N = 1 replaying uniformly sampled recorded requests: E[tokens per request] / E[time per request]
    ms = sum(spec.latency_ms(int(m), 1) for m in tr.model)
    return 1000.0 * float(tr.committed_tokens.sum()) / ms


def test_jsonl_round_trip_and_grouping(tmp_path):
    # interleaved requests, each in step order
    recs = [
        {"request_id": "a", "step": 0, "model": 0, "next_model": 0, "committed_tokens": 1},
        {"request_id": "b", "step": 0, "model": 0, "next_model": 1, "committed_tokens": 0},
        {"request_id": "b", "step": 1, "model": 1, "next_model": 0, "committed_tokens": 0},
        {"request_id": "a", "step": 1, "model": 0, "next_model": 1, "committed_tokens": 1.5},
    ]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n\n")
    tr = read_trace(p)
    assert tr.n_requests == 2 and tr.n_steps == 4
    assert list(tr.offsets) == [0, 2, 4]
    by_id = {rid: k for k, rid in enumerate(tr.request_ids)}
    a, b = by_id["a"], by_id["b"]
    assert list(tr.model[tr.offsets[b]:tr.offsets[b + 1]]) == [0, 1]
    assert list(tr.next_model[tr.offsets[a]:tr.offsets[a + 1]]) == [0, 1]
    assert list(tr.committed_tokens[tr.offsets[a]:tr.offsets[a + 1]]) == [1.0, 1.5]
    out = tmp_path / "back.jsonl"
    write_trace(tr, out)
    tr2 = read_trace(out)
    assert np.array_equal(tr.model, tr2.model) and np.array_equal(tr.committed_tokens, tr2.committed_tokens)


C = ', "committed_tokens": 1}'


@pytest.mark.parametrize("lines,needle", [
    (['{"request_id": 1, "step": 0, "model": 0, "next_model": 1' + C, "{not json"], "bad.jsonl:2: not valid JSON"),
    (['{"request_id": 1, "step": 0, "model": 0, "next_model": 0' + C,
      '{"request_id": 1, "step": 2, "model": 0, "next_model": 0' + C], "without gaps"),
    (['{"request_id": 1, "step": 0, "model": 0, "next_model": 1' + C,
      '{"request_id": 1, "step": 1, "model": 0, "next_model": 0' + C], "routed it to another model"),
    (['{"request_id": 1, "step": 0, "model": -1, "next_model": 0' + C], "'model'"),
    (['{"request_id": 1, "step": 0, "model": 0' + C], "next_model"),
    (['{"request_id": 1, "step": 0, "model": 0, "next_model": 0, "committed_tokens": -2}'], "committed_tokens"),
    (['{"request_id": 1, "step": 0, "model": 0, "next_model": 0}'], "committed_tokens"),  # required
    (['{"request_id": 1, "step": 0, "model": "0", "next_model": 0' + C], "'model' must be an integer"),
    (['{"request_id": 1, "step": 0, "model": 0, "next_model": 1' + C,
      '{"request_id": 2, "step": 0, "model": 0, "next_model": 1' + C,
      '{"request_id": 1, "step": 2, "model": 1, "next_model": 1' + C,
      '{"request_id": 1, "step": 1, "model": 1, "next_model": 1' + C], "bad.jsonl:3: step 2 of request 1"),
])
def test_bad_traces_are_rejected_with_a_reason(tmp_path, lines, needle):
    p = tmp_path / "bad.jsonl"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(SpecError) as e:
        read_trace(p)
    assert needle in str(e.value)


def test_trace_model_out_of_range_for_spec():
    tr = trace_from_records([{"request_id": 0, "step": 0, "model": 2, "next_model": 0, "committed_tokens": 1}])
    with pytest.raises(SpecError, match="M = 2"):
        simulate(R2R, 2, (1, 1), trace=tr, steps=1000)


@pytest.mark.parametrize("bursty", [False, True])
def test_single_request_trace_matches_renewal_formula(bursty):
    pmf = {0: bimodal_run_length_pmf(1 / 0.35, short=1, long=10)} if bursty else None
    tr = generate_trace(R2R, 400, 30, run_length_pmf=pmf, seed=3)
    exact = _renewal_throughput(R2R, tr)
    r = simulate(R2R, 1, (1, 1), trace=tr, steps=500_000, seed=1)
    assert abs(r.throughput_tok_s - exact) <= 1.3 * r.throughput_ci95_tok_s
    assert r.completed_requests > 0
    assert r.method == "simulate:trace"


def test_generated_run_lengths_follow_the_requested_law():
    pmf = bimodal_run_length_pmf(1 / 0.35, short=1, long=10)
    assert pmf.sum() == pytest.approx(1.0) and (np.arange(1, 11) * pmf).sum() == pytest.approx(1 / 0.35)
    tr = generate_trace(R2R, 3000, 40, run_length_pmf={0: pmf}, end_at_entry=False, seed=0)
    lens = run_lengths(tr, 0)
    # runs cut by the end of a request can be shorter; the others take only the values 1 and 10
    full = lens[lens != 0]
    share_1_or_10 = np.isin(full, [1, 10]).mean()
    assert share_1_or_10 > 0.85
    # the LLM's runs stay of length 1 (P[1][1] = 0)
    assert set(run_lengths(tr, 1).tolist()) == {1}


def test_geometric_trace_reproduces_p_routing():
    # a trace drawn from P and cut only when the next model is the entry model replays the chain of P;
    # compare with P routing at the trace's own escalation frequency so the finite sample does not count
    tr = generate_trace(R2R, 5000, 50, seed=7)
    on0 = tr.model == 0
    p_hat = float((tr.next_model[on0] == 1).mean())
    assert abs(p_hat - 0.35) < 0.01
    spec_hat = preset("r2r", [6.0, 27.9], p=p_hat)
    N, B = 4, (1, 2)
    a = simulate(R2R, N, B, trace=tr, steps=1_500_000, seed=1)
    b = simulate(spec_hat, N, B, steps=1_500_000, seed=2, expected_tokens=False)
    # independent runs: the difference has half-width sqrt(h_a^2 + h_b^2)
    tol = float(np.hypot(a.throughput_ci95_tok_s, b.throughput_ci95_tok_s))
    assert abs(a.throughput_tok_s - b.throughput_tok_s) <= tol
    for i in range(2):
        assert a.mean_waiting[i] == pytest.approx(b.mean_waiting[i], rel=0.05, abs=0.01)


def test_request_tokens_is_refused_with_a_trace():
    tr = generate_trace(R2R, 10, 5, seed=0)
    with pytest.raises(SpecError, match="request_tokens"):
        simulate(R2R, 2, (1, 1), trace=tr, request_tokens=10)


def test_finished_marker_reused_ids_and_gzip(tmp_path):
    import gzip
    lines = [
        {"request_id": "x", "step": 0, "model": 0, "next_model": 1, "committed_tokens": 0},
        {"request_id": "x", "step": 1, "model": 1, "next_model": -1, "committed_tokens": 1},
        {"request_id": "x", "step": 0, "model": 0, "next_model": -1, "committed_tokens": 1, "note": "reused id"},
    ]
    p = tmp_path / "t.jsonl.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        for r in lines:
            f.write(json.dumps(r) + "\n")
        f.write('{"request_id": "y", "st')          # a writer killed mid-line: dropped
    tr = read_trace(p)
    assert tr.n_requests == 2 and list(tr.offsets) == [0, 2, 3]
    assert list(tr.next_model) == [1, -1, -1] and tr.models_used == 2
    r = simulate(R2R, 1, (1, 1), trace=tr, steps=30_000)
    # alternating replays of the two recorded requests: 2 tokens per 6 + 27.9 + 6 ms on average
    assert abs(r.throughput_tok_s - 1000.0 * 2 / (6.0 + 27.9 + 6.0)) <= 1.3 * r.throughput_ci95_tok_s + 0.5


def test_a_finished_request_is_forgotten():
    # after next_model = -1 the id is free: a later line of that id is a new request (here one recorded from
    # step 1), by the same rule as the profiler's streaming reader, whose memory holds only requests in flight
    recs = [{"request_id": 1, "step": 0, "model": 0, "next_model": -1, "committed_tokens": 1},
            {"request_id": 1, "step": 1, "model": 0, "next_model": 0, "committed_tokens": 1}]
    tr = trace_from_records(recs)
    assert tr.n_requests == 2 and tr.first_steps == (0, 1)
    recs[1]["step"] = 0
    recs.append({"request_id": 1, "step": 0, "model": 0, "next_model": 0, "committed_tokens": 1})
    with pytest.raises(SpecError, match="record 3: step 0 of request 1 does not follow"):
        trace_from_records(recs)


def test_trace_that_began_mid_request_round_trips(tmp_path):
    # the recorder started while request 7 was at its step 5: its first recorded line is step 5
    recs = [{"request_id": 7, "step": 5, "model": 1, "next_model": 0, "committed_tokens": 1},
            {"request_id": 8, "step": 0, "model": 0, "next_model": -1, "committed_tokens": 1},
            {"request_id": 7, "step": 6, "model": 0, "next_model": -1, "committed_tokens": 2}]
    tr = trace_from_records(recs)
    assert tr.first_steps == (5, 0) and list(tr.offsets) == [0, 2, 3]
    p = tmp_path / "w.jsonl"
    write_trace(tr, p)
    assert [json.loads(line)["step"] for line in p.read_text().splitlines()] == [5, 6, 0]
    assert read_trace(p).first_steps == (5, 0)


def test_simulator_and_profiler_read_traces_by_the_same_rules(tmp_path):
    """One format: the simulator's reader and the profiler's streaming reader accept and refuse the same files."""
    from profiler.trace import TraceError, accumulate_trace
    rng = np.random.default_rng(5)
    good = generate_trace(R2R, 30, 12, seed=2)
    p = tmp_path / "g.jsonl"
    write_trace(good, p)
    lines = p.read_text().splitlines()
    # interleave the requests' lines at random while keeping each request's steps in order
    by_req: dict = {}
    for line in lines:
        by_req.setdefault(json.loads(line)["request_id"], []).append(line)
    queues = list(by_req.values())
    mixed = []
    while queues:
        k = int(rng.integers(len(queues)))
        mixed.append(queues[k].pop(0))
        if not queues[k]:
            queues.pop(k)
    p.write_text("\n".join(mixed) + "\n")
    tr = read_trace(p)
    acc = accumulate_trace(p)
    assert tr.n_steps == acc.lines == good.n_steps
    assert acc.counts.sum() + acc.final_acc[0] == tr.n_steps
    # swapping two steps of one request: both readers refuse, naming the same line
    first = next(i for i, line in enumerate(mixed) if json.loads(line)["step"] == 1)
    rid = json.loads(mixed[first])["request_id"]
    second = next(i for i, line in enumerate(mixed) if i > first and json.loads(line)["request_id"] == rid)
    bad = list(mixed)
    bad[first], bad[second] = bad[second], bad[first]
    p.write_text("\n".join(bad) + "\n")
    with pytest.raises(SpecError) as e1:
        read_trace(p)
    with pytest.raises(TraceError) as e2:
        accumulate_trace(p)
    assert f"{p}:{first + 1}:" in str(e1.value) and f"{p}:{first + 1}:" in str(e2.value)
    assert "out-of-order steps are refused" in str(e1.value) and "out-of-order steps are refused" in str(e2.value)


def test_truncated_gzip_trace_is_one_clear_error(tmp_path):
    import gzip
    p = tmp_path / "t.jsonl.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        for k in range(2000):
            f.write(json.dumps({"request_id": k, "step": 0, "model": 0, "next_model": -1,
                                "committed_tokens": 1}) + "\n")
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(SpecError, match="cut short"):
        read_trace(p)
    from profiler.trace import accumulate_trace
    with pytest.raises(SpecError, match="cut short"):
        accumulate_trace(p)
