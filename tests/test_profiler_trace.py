"""Routing-trace format: recorder, fast numba reader vs a json.loads reference, errors with line numbers."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from profiler.synth import write_synthetic_trace
from profiler.trace import (RoutingTraceRecorder, TraceError, accumulate_trace, read_trace_records,
                            trace_schema_path)


def reference_stats(path, M, kcap=2048):
    """Independent pure-Python statistics from json.loads, for cross-checks."""
    counts = np.zeros((M, M), dtype=np.int64)
    csum = np.zeros((M, M))
    at_risk = np.zeros((M, kcap + 1), dtype=np.int64)
    events = np.zeros((M, kcap + 1), dtype=np.int64)
    state = {}
    finals = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            o = json.loads(line)
            rid = (type(o["request_id"]).__name__, o["request_id"])
            m, n = o["model"], o["next_model"]
            if rid not in state:
                age = 1 if o["step"] == 0 else -1
            else:
                age = state[rid]
            if n == -1:
                finals += 1
                state.pop(rid, None)
                continue
            counts[m, n] += 1
            csum[m, n] += o["committed_tokens"]
            if age >= 1:
                a = min(age, kcap)
                at_risk[m, a] += 1
                if n != m:
                    events[m, a] += 1
            state[rid] = (age + 1 if age >= 1 else -1) if n == m else 1
    return counts, csum, at_risk, events, finals


def test_recorder_roundtrip_schema_and_reader(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    path = tmp_path / "t.jsonl"
    # one type of request id per trace (all strings here; a mix is refused: tests/test_input_contract_round4.py)
    rows = [("a\"b", 0, 0, 1, 0), ("7", 0, 0, 0, 1), ("a\"b", 1, 1, 0, 1.5), ("7", 1, 0, -1, 2), ("a\"b", 2, 0, -1, 1)]
    with RoutingTraceRecorder(path, flush_lines=2) as rec:
        for r in rows[:3]:
            rec.record(*r)
        rec.record_batch(["7", "a\"b"], np.array([1, 2]), [0, 0], [-1, -1], [2, 1])
    schema = json.load(open(trace_schema_path()))
    lines = path.read_text().splitlines()
    assert len(lines) == 5
    for line in lines:
        jsonschema.validate(json.loads(line), schema)
    got = [(r.request_id, r.step, r.model, r.next_model, r.committed_tokens) for r in read_trace_records(path)]
    assert got == [(a, b, c, d, float(e)) for a, b, c, d, e in rows]
    acc = accumulate_trace(path)
    assert acc.counts[0, 1] == 1 and acc.counts[0, 0] == 1 and acc.counts[1, 0] == 1
    assert acc.final_acc[0] == 2 and acc.final_acc[1] == 3.0
    assert acc.slow_lines >= 1  # escaped quote in the request id goes through json.loads


def test_recorder_rejects_bad_values(tmp_path):
    with RoutingTraceRecorder(tmp_path / "t.jsonl") as rec:
        with pytest.raises(TraceError, match="next_model"):
            rec.record(1, 0, 0, -2, 1)
        with pytest.raises(TraceError, match="committed_tokens"):
            rec.record(1, 0, 0, 1, float("nan"))
        with pytest.raises(TraceError, match="request_id"):
            rec.record(1.5, 0, 0, 1, 1)


def test_fast_reader_matches_reference_on_synthetic_trace(tmp_path):
    P = [[0.7, 0.2, 0.1], [0.5, 0.3, 0.2], [0.6, 0.1, 0.3]]
    C = [[1, 0, 0], [1, 2, 0], [1, 0, 3]]
    path = tmp_path / "s.jsonl"
    n = write_synthetic_trace(path, P, C, n_requests=60, steps_per_request=50, seed=5, concurrency=7)
    acc = accumulate_trace(path, buffer_bytes=4096)  # many buffer refills and carried partial lines
    counts, csum, at_risk, events, finals = reference_stats(path, 3)
    assert acc.lines == n
    np.testing.assert_array_equal(acc.counts[:3, :3], counts)
    np.testing.assert_allclose(acc.csum[:3, :3], csum)
    np.testing.assert_array_equal(acc.at_risk[:3], at_risk)
    np.testing.assert_array_equal(acc.events[:3], events)
    assert acc.final_acc[0] == finals == 60
    assert acc.max_requests_in_flight <= 7
    assert acc.slow_lines == 0


def test_layout_variants_take_fast_and_slow_paths_consistently(tmp_path):
    lines = [
        '{"request_id": "r1", "step": 0, "model": 0, "next_model": 1, "committed_tokens": 0}',
        '{ "committed_tokens" : 1.25 ,"next_model":1,"model":1, "step":1,"request_id":"r1", "extra": "x"}',
        '',
        '{"request_id": "5", "step": 0, "model": 0, "next_model": 0, "committed_tokens": 1e0, "t": null}\r',
        '{"request_id": "r1", "step": 2, "model": 1, "next_model": 0, "committed_tokens": 2}',
        '{"request_id": "r\\u0031", "step": 3, "model": 0, "next_model": -1, "committed_tokens": 1}',
        '{"request_id": "5", "step": 1, "model": 0, "next_model": 1, "committed_tokens": 0, "meta": true}',
    ]
    path = tmp_path / "v.jsonl"
    path.write_text("\n".join(lines))  # no final newline: the last line still counts
    acc = accumulate_trace(path)
    counts, csum, *_ = reference_stats(path, 2)
    np.testing.assert_array_equal(acc.counts[:2, :2], counts)
    np.testing.assert_allclose(acc.csum[:2, :2], csum)
    assert acc.final_acc[0] == 1  # "r\u0031" is "r1": the slow path hashes the decoded id like the fast path
    assert acc.slow_lines == 1
    # gzip gives the same figures
    gz = tmp_path / "v.jsonl.gz"
    with gzip.open(gz, "wb") as f:
        f.write(path.read_bytes())
    acc2 = accumulate_trace(gz)
    np.testing.assert_array_equal(acc2.counts, acc.counts)


def test_truncated_last_line_is_dropped(tmp_path):
    path = tmp_path / "k.jsonl"
    path.write_text('{"request_id": 1, "step": 0, "model": 0, "next_model": 1, "committed_tokens": 1}\n'
                    '{"request_id": 1, "step": 1, "model": 1, "next_mo')
    acc = accumulate_trace(path)
    assert acc.dropped_last_line and acc.lines == 1 and acc.counts[0, 1] == 1
    assert [r.step for r in read_trace_records(path)] == [0]


@pytest.mark.parametrize("bad, msg", [
    ('{"request_id": 1, "step": 0, "model": 0, "next_model": 1, "committed_tokens": 1', "not valid JSON"),
    ('{"request_id": 1, "step": 0, "model": 0, "committed_tokens": 1}', "missing field.*next_model"),
    ('{"request_id": 1, "step": 0, "model": "0", "next_model": 1, "committed_tokens": 1}', "'model' must be an int"),
    ('{"request_id": 1, "step": 0, "model": 0, "next_model": 1, "committed_tokens": -1}', "committed_tokens"),
    ('{"request_id": 1.5, "step": 0, "model": 0, "next_model": 1, "committed_tokens": 1}', "request_id"),
    ('{"request_id": 9, "step": 5, "model": 0, "next_model": 1, "committed_tokens": 1}', "does not follow"),
    ('{"request_id": 9, "step": 1, "model": 0, "next_model": 1, "committed_tokens": 1}', "routed it to another"),
    ('{"request_id": 2, "step": 0, "model": 0, "next_model": -3, "committed_tokens": 1}', "next_model"),
    ('[1, 2, 3]', "JSON object"),
])
def test_malformed_lines_name_the_line(tmp_path, bad, msg):
    good = ['{"request_id": 9, "step": 0, "model": 1, "next_model": 1, "committed_tokens": 1}',
            '{"request_id": 3, "step": 0, "model": 0, "next_model": 0, "committed_tokens": 1}']
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(good + [bad, good[1].replace('"step": 0', '"step": 1')]) + "\n")
    with pytest.raises(TraceError, match=msg) as ei:
        accumulate_trace(path)
    assert f"{path}:3:" in str(ei.value)


def test_model_index_beyond_cap_is_an_error(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"request_id": 1, "step": 0, "model": 0, "next_model": 3, "committed_tokens": 1}\n')
    with pytest.raises(TraceError, match=r":1: .*outside the allowed range"):
        accumulate_trace(path, model_cap=2)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(TraceError, match="does not exist"):
        accumulate_trace(tmp_path / "nope.jsonl")
    with pytest.raises(TraceError, match="is a folder, not a file"):
        accumulate_trace(tmp_path)


def test_request_table_grows_and_recycles(tmp_path):
    # 6000 interleaved requests in flight (beyond the initial 4096-slot table), then all finish
    path = tmp_path / "g.jsonl"
    R = 6000
    with open(path, "w") as f:
        for step in range(3):
            for r in range(R):
                nxt = -1 if step == 2 else (1 if (r + step) % 3 == 0 else 0)
                model = 0 if step == 0 else (1 if (r + step - 1) % 3 == 0 else 0)
                f.write(json.dumps({"request_id": f"req-{r}", "step": step, "model": model, "next_model": nxt,
                                    "committed_tokens": 1}) + "\n")
    acc = accumulate_trace(path)
    counts, *_ = reference_stats(path, 2)
    np.testing.assert_array_equal(acc.counts[:2, :2], counts)
    assert acc.max_requests_in_flight == R
    assert acc.out[5] == 0  # every request finished and left the table
    assert acc.tkeys.shape[0] >= 2 * R


def test_memory_bounded_by_requests_in_flight(tmp_path):
    # many requests that finish: the table must not grow with their number
    path = tmp_path / "b.jsonl"
    write_synthetic_trace(path, [[0.9, 0.1], [0.5, 0.5]], [[1, 0], [1, 1]], n_requests=20000,
                          steps_per_request=3, seed=1, concurrency=8)
    acc = accumulate_trace(path)
    assert acc.max_requests_in_flight <= 8
    assert acc.tkeys.shape[0] == 1 << 12
    assert acc.final_acc[0] == 20000
