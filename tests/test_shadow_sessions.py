"""Sessions, the session-trace format and prefix-cache hits, checked by hand on small sessions."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

from shadow_prefill.errors import InputFileError, ShadowError
from shadow_prefill.sessions import Call, SessionSet, check_call_chain
from shadow_prefill.stats import compute_issue_times, compute_prefix_hits, ReplayParams, compute_switch_tax
from shadow_prefill.trace_io import iter_session_trace, read_session_trace, write_session_trace

SCHEMA = os.path.join(os.path.dirname(__file__), "..", "data", "schemas", "session-trace.schema.json")


def hand_session() -> SessionSet:
    """Six calls of one session over models S and L (see test_hits_by_hand for the arithmetic)."""
    c = [Call("A", 0, "S", 100, 100, 10),
         Call("A", 1, "S", 160, 50, 20),          # history 110 = 100 + 10
         Call("A", 2, "L", 220, 40, 5),           # switch; history 180
         Call("A", 3, "S", 250, 25, 10),          # switch; history 225
         Call("A", 4, "S", 300, 280, 10, append_only=False),  # rewritten: keeps 20 tokens
         Call("A", 5, "L", 340, 30, 5)]           # switch; history 310 = 300 + 10
    return SessionSet.from_calls(c)


def test_hits_by_hand():
    ss = hand_session()
    assert ss.model_names == ("S", "L")
    assert list(ss.is_switch) == [False, False, True, True, False, True]
    hits = compute_prefix_hits(ss)
    # 0: first call; 1: S holds 110; 2: L holds nothing; 3: S holds 180 (prompt 160 + output 20);
    # 4: history rewritten to 20 tokens, S held 260 -> 20; 5: L held 225, cut to 20 by the rewrite at step 4
    assert list(hits) == [0, 110, 0, 180, 20, 20]
    st = compute_switch_tax(ss, cache_capacity=None)
    assert st["hit_all"] == pytest.approx(330 / 1370)
    assert st["hit_switch"] == pytest.approx(200 / 810)
    assert st["hit_same"] == pytest.approx(130 / 460)
    assert st["switch_calls"] == 3 and st["switch_share"] == pytest.approx(0.5)
    assert st["switches_per_session_mean"] == 3
    assert st["prompt_switch_mean_tokens"] == pytest.approx(810 / 3)
    assert st["prompt_switch_p50_tokens"] == 250
    assert st["prompt_switch_p99_tokens"] == pytest.approx(250 + 0.98 * 90)  # linear interpolation 250 -> 340
    assert st["hit_all_cap"] is None


def two_sessions_one_model() -> SessionSet:
    return SessionSet.from_calls([
        Call("X", 0, "M", 100, 100, 50), Call("X", 1, "M", 200, 50, 10),
        Call("Y", 0, "M", 200, 200, 0), Call("Y", 1, "M", 300, 100, 0)])


def test_lru_capacity_by_hand():
    ss = two_sessions_one_model()
    # calls in the order X0, Y0, X1, Y1 (indices: X0=0, X1=1, Y0=2, Y1=3)
    order = [0, 2, 1, 3]
    assert list(compute_prefix_hits(ss)) == [0, 150, 0, 200]
    # capacity 300: Y0 (200) evicts X (150); X1 misses, its 210 evicts Y; Y1 misses
    assert list(compute_prefix_hits(ss, 300, order=order)) == [0, 0, 0, 0]
    # capacity 400: X0 150 + Y0 200 fit; X1 hits 150, X grows to 210 -> total 410 evicts Y (least recent)
    assert list(compute_prefix_hits(ss, 400, order=order)) == [0, 150, 0, 0]
    # capacity 10_000: everything fits
    assert list(compute_prefix_hits(ss, 10_000, order=order)) == [0, 150, 0, 200]
    # capacity 120: an entry keeps its first 120 tokens; X1's history is 150 -> hit 120 when X runs alone
    assert list(compute_prefix_hits(ss, 120, order=[0, 1, 2, 3])) == [0, 120, 0, 120]
    # capacity 0: no cache at all
    assert list(compute_prefix_hits(ss, 0, order=order)) == [0, 0, 0, 0]
    # per-model capacity as a mapping
    assert list(compute_prefix_hits(ss, {"M": 400}, order=order)) == [0, 150, 0, 0]
    with pytest.raises(ShadowError):
        compute_prefix_hits(ss, {"nope": 5})
    with pytest.raises(ShadowError, match="step order"):
        compute_prefix_hits(ss, 300, order=[1, 0, 2, 3])


def test_lru_two_models_independent_pools():
    ss = SessionSet.from_calls([
        Call("X", 0, "A", 100, 100, 0), Call("X", 1, "B", 150, 50, 0), Call("X", 2, "A", 200, 50, 0)])
    # model A's entry (100) is untouched by B's pool: X2 on A hits 100 even with capacity 100 per model
    assert list(compute_prefix_hits(ss, 100, order=[0, 1, 2])) == [0, 0, 100]


def test_issue_times_follow_gaps_and_outputs():
    ss = SessionSet.from_calls([Call("X", 0, "M", 10, 10, 4, gap_s=1.0), Call("X", 1, "M", 24, 10, 0, gap_s=2.0)])
    t = compute_issue_times(ss, ReplayParams(session_rate=1.0, replay_tpot_s=0.5, seed=3))
    start = np.random.default_rng(3).exponential(1.0)
    assert t[0] == pytest.approx(start + 1.0)
    assert t[1] == pytest.approx(start + 1.0 + 4 * 0.5 + 2.0)


def test_check_call_chain_rules():
    assert check_call_chain(None, None, 10, 10, True) is None
    assert "first call" in check_call_chain(None, None, 10, 5, True)
    assert check_call_chain(10, 5, 20, 5, True) is None
    assert "append_only" in check_call_chain(10, 5, 20, 6, True)
    assert check_call_chain(10, 5, 20, 6, False) is None
    assert "previous call left only 15" in check_call_chain(10, 5, 30, 10, False)
    assert "exceeds" in check_call_chain(10, 5, 5, 6, False)


def test_sessionset_validate_names_the_call():
    with pytest.raises(ShadowError, match=r"session 'A' step 1: .*append_only"):
        SessionSet.from_calls([Call("A", 0, "S", 10, 10, 1), Call("A", 1, "S", 20, 10, 1)])
    with pytest.raises(ShadowError, match="steps must increase by 1"):
        SessionSet.from_calls([Call("A", 0, "S", 10, 10, 1), Call("A", 2, "S", 16, 5, 1)])
    with pytest.raises(ShadowError, match="prompt_tokens must be >= 1"):
        SessionSet.from_arrays(model_names=["S"], lengths=[1], model=[0], prompt=[0], new_input=[0], output=[0])


def test_trace_round_trip_and_schema(tmp_path):
    ss = hand_session()
    ss2 = SessionSet.from_calls([Call("B", 0, "L", 50, 50, 5, gap_s=1.5, task="t1", score=1.0),
                                 Call("B", 1, "S", 80, 25, 5, gap_s=0.25, task="t1", score=0.0)])
    p = tmp_path / "t.jsonl"
    calls = list(ss.calls()) + list(ss2.calls())
    merged = SessionSet.from_calls(calls)
    assert write_session_trace(merged, p) == 8
    back = read_session_trace(p)
    assert back.n_sessions == 2 and back.n_calls == 8
    assert list(back.calls()) == list(merged.calls())
    assert back.task_names[int(back.task[1])] == "t1"
    assert list(compute_prefix_hits(back)[:6]) == [0, 110, 0, 180, 20, 20]
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.load(open(SCHEMA))
    jsonschema.Draft202012Validator.check_schema(schema)
    v = jsonschema.Draft202012Validator(schema)
    for line in p.read_text().splitlines():
        v.validate(json.loads(line))
    with pytest.raises(jsonschema.ValidationError):
        v.validate({"session": "x", "step": 0, "model": "m", "prompt_tokens": 0, "new_input_tokens": 0,
                    "output_tokens": 0, "gap_s": 0, "append_only": True})


def test_trace_interleaved_sessions(tmp_path):
    lines = [
        {"session": 1, "step": 0, "model": "a", "prompt_tokens": 10, "new_input_tokens": 10, "output_tokens": 2,
         "gap_s": 0, "append_only": True},
        {"session": "2", "step": 0, "model": "b", "prompt_tokens": 5, "new_input_tokens": 5, "output_tokens": 1,
         "gap_s": 0, "append_only": True},
        {"session": 1, "step": 1, "model": "b", "prompt_tokens": 15, "new_input_tokens": 3, "output_tokens": 2,
         "gap_s": 0.5, "append_only": True, "extra": "ignored"},
    ]
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    ss = read_session_trace(p)
    assert ss.session_ids == ("1", "2")
    assert list(ss.prompt) == [10, 15, 5]
    assert list(ss.is_switch) == [False, True, False]
    recs = list(iter_session_trace(p))
    assert [r["line"] for r in recs] == [1, 2, 3]


BASE = {"session": "s", "step": 0, "model": "m", "prompt_tokens": 10, "new_input_tokens": 10, "output_tokens": 2,
        "gap_s": 0.0, "append_only": True}


@pytest.mark.parametrize("bad, message", [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "JSON object"),
    ({k: v for k, v in BASE.items() if k != "model"}, "missing field 'model'"),
    ({**BASE, "step": 1}, "expected step 1"),  # on line 3, after step 0 on line 2... see below
    ({**BASE, "prompt_tokens": 0}, "'prompt_tokens' must be >= 1"),
    ({**BASE, "prompt_tokens": 1.5}, "must be an integer"),
    ({**BASE, "prompt_tokens": True}, "must be an integer"),
    ({**BASE, "gap_s": -1}, "gap_s"),
    ({**BASE, "gap_s": "1"}, "gap_s"),
    ({**BASE, "append_only": 1}, "append_only"),
    ({**BASE, "session": ""}, "session"),
    ({**BASE, "score": "high"}, "score"),
    ({**BASE, "task": [1]}, "task"),
])
def test_trace_bad_lines_name_their_line(tmp_path, bad, message):
    good0 = {**BASE, "session": "ok"}
    good1 = {**BASE, "session": "ok", "step": 1, "prompt_tokens": 20, "new_input_tokens": 8}
    text = json.dumps(good0) + "\n" + json.dumps(good1) + "\n"
    if isinstance(bad, dict) and bad.get("step") == 1:
        bad = {**BASE, "session": "ok", "step": 3, "prompt_tokens": 40, "new_input_tokens": 8}
        message = "expected step 2"
    text += (bad if isinstance(bad, str) else json.dumps(bad)) + "\n"
    p = tmp_path / "bad.jsonl"
    p.write_text(text)
    with pytest.raises(InputFileError, match=message) as ei:
        read_session_trace(p)
    assert ei.value.line == 3
    assert str(ei.value).startswith(f"{p}:3: ")


def test_trace_chain_errors(tmp_path):
    a = {**BASE}
    b = {**BASE, "step": 1, "prompt_tokens": 20, "new_input_tokens": 9}  # history 11 != 12
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps(a) + "\n" + json.dumps(b) + "\n")
    with pytest.raises(InputFileError, match=r":2: session 's' step 1: append_only") as ei:
        read_session_trace(p)
    assert ei.value.line == 2
    c = {**BASE, "new_input_tokens": 4}
    p.write_text(json.dumps(c) + "\n")
    with pytest.raises(InputFileError, match=":1: .*first call"):
        read_session_trace(p)
    d = {**BASE, "step": 1, "task": "other", "prompt_tokens": 20, "new_input_tokens": 8}
    p.write_text(json.dumps({**BASE, "task": "t"}) + "\n" + json.dumps(d) + "\n")
    with pytest.raises(InputFileError, match=":2: .*task"):
        read_session_trace(p)


def test_trace_missing_empty_and_binary(tmp_path):
    with pytest.raises(InputFileError, match="no such file"):
        read_session_trace(tmp_path / "none.jsonl")
    e = tmp_path / "empty.jsonl"
    e.write_text("\n")
    with pytest.raises(InputFileError, match="no calls"):
        read_session_trace(e)
    b = tmp_path / "bin.jsonl"
    b.write_bytes(json.dumps(BASE).encode() + b"\n\xff\xfe\n")
    with pytest.raises(InputFileError, match="UTF-8"):
        read_session_trace(b)


def test_write_is_atomic_on_error(tmp_path):
    p = tmp_path / "keep.jsonl"
    p.write_text("old\n")
    ss = dataclasses.replace(hand_session(), model_names=())  # breaks the writer at its first line (index error)
    with pytest.raises(IndexError):
        write_session_trace(ss, p)
    assert p.read_text() == "old\n"
    assert [x.name for x in tmp_path.iterdir()] == ["keep.jsonl"]
