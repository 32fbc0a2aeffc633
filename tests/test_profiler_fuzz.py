"""Hardening of the profiler's inputs: latency profiles and routing traces, and tr-profile on bad files.

Hand-written cases name the field in the message; hypothesis fuzzes each reader (random bytes, the right
shape with wrong types and values, truncations) and tr-profile in-process.  The property: a valid result or
one error (for the CLI: one ``error:`` line on stderr and exit 2), never a traceback or a hang.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import io
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiler.latency import LatencyProfile, ProfileError, load_latency_profile
from profiler.trace import TraceError, accumulate_trace
from tr_core.routing_trace import iter_records, read_trace

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])

VALID = {
    "schema_version": 1, "kind": "latency_profile", "model": "m", "config_sha256": "0" * 64,
    "device": "NVIDIA H200", "dtype": "bf16", "mode": "decode", "context_tokens": 512, "extend_tokens": 1,
    "cuda_graph": True, "warmup_steps": 3, "timed_steps": 20,
    "batches": [{"batch_size": 1, "count": 20, "min_ms": 26.3, "median_ms": 26.32, "mean_ms": 26.33,
                 "p90_ms": 26.34, "std_ms": 0.01, "peak_allocated_bytes": 65838632960},
                {"batch_size": 8, "count": 20, "min_ms": 37.1, "median_ms": 37.15, "mean_ms": 37.15,
                 "p90_ms": 37.18, "std_ms": 0.02, "peak_allocated_bytes": None}],
    "fit": {"intercept_ms": 25.2, "per_request_ms": 1.46, "r_squared": 0.999},
    "weight_bytes": 65524246528, "kv_bytes_per_token": 262144, "measured_kv_bytes_per_token": 406822.4,
    "timing": "cuda_events", "timing_overhead": None, "tool_version": "0.1.0", "torch_version": "2.11",
    "transformers_version": "5.17.0", "arguments": {"config": "x.json"}, "created_utc": "2026-11-30T23:14:06Z",
}


def _write(tmp_path, text, name="p.json"):
    p = tmp_path / name
    p.write_text(text) if isinstance(text, str) else p.write_bytes(text)
    return p


def test_valid_profile_loads_and_round_trips(tmp_path):
    prof = load_latency_profile(_write(tmp_path, json.dumps(VALID)))
    assert isinstance(prof, LatencyProfile) and prof.median_ms() == {1: 26.32, 8: 37.15}
    assert prof.to_dict() == {**VALID, "attention": "", "input_embedding_bytes": None, "roofline": None}


@pytest.mark.parametrize("path, value, needle", [
    (("batches", 0, "median_ms"), "26.3", "'batches[0].median_ms' must be a finite number > 0, got \"26.3\""),
    (("batches", 1, "batch_size"), True, "'batches[1].batch_size' must be an integer"),
    (("batches", 1, "batch_size"), 1, "batch size 1 appears twice"),
    (("batches", 0, "count"), 2 ** 70, "'batches[0].count' must be an integer in 1..2^63-1"),
    (("weight_bytes",), -1, "'weight_bytes'"),
    (("weight_bytes",), 1.5e10, "'weight_bytes' must be an integer"),
    (("kv_bytes_per_token",), "262144", "'kv_bytes_per_token'"),
    (("context_tokens",), None, "'context_tokens'"),
    (("cuda_graph",), "yes", "'cuda_graph' must be true or false"),
    (("mode",), "prefill", "'mode' must be one of decode, extend"),
    (("dtype",), 2, "'dtype'"),
    (("fit", "r_squared"), "high", "'fit.r_squared'"),
    (("fit",), [1, 2], "'fit' must be an object or null"),
    (("batches",), "1,2", "'batches' must be a non-empty list"),
    (("batches",), [], "'batches' must be a non-empty list"),
    (("arguments",), "x", "'arguments' must be an object"),
    (("schema_version",), "1", "unsupported schema_version"),
    (("schema_version",), True, "unsupported schema_version"),
])
def test_wrong_types_and_values_name_the_field(tmp_path, path, value, needle):
    doc = copy.deepcopy(VALID)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    p = _write(tmp_path, json.dumps(doc))
    with pytest.raises(ProfileError) as e:
        load_latency_profile(p)
    assert str(p) in str(e.value) and needle in str(e.value), str(e.value)


@pytest.mark.parametrize("text, needle", [
    (json.dumps(VALID).replace("26.32,", "NaN,"), "'batches[0].median_ms'"),
    (json.dumps(VALID).replace("26.32,", "1e999,"), "'batches[0].median_ms'"),
    (json.dumps(VALID).replace('"median_ms": 26.32,', ""), "missing field 'batches[0].median_ms'"),
    (json.dumps({**VALID, "extra_field": 1}), "unknown field 'extra_field'"),
    (json.dumps({**VALID, "arguments": {"a": "[" * 20 + "1" + "]" * 20}}).replace('"[', "[").replace(']"', "]"),
     "nested more than"),
    ("[" * 200_000 + "]" * 200_000, "nested too deeply"),
    (json.dumps(VALID).replace("65524246528", "9" * 5000), "holds a number that cannot be read"),
    (json.dumps(VALID)[:100], "not valid JSON"),
    ('{"kind": "something"}', "not a latency profile"),
])
def test_malformed_documents(tmp_path, text, needle):
    with pytest.raises(ProfileError, match=None) as e:
        load_latency_profile(_write(tmp_path, text))
    assert needle in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def _json_values():
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=True),
                        st.text(max_size=8))
    return st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c,
                                                                                      max_size=3), max_leaves=6)


def _paths(doc, prefix=()):
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.extend(_paths(v, prefix + (k,)))
    elif isinstance(doc, list):
        for k, v in enumerate(doc):
            out.extend(_paths(v, prefix + (k,)))
    return out


PATHS = _paths(VALID)


def _load_or_error(p) -> None:
    try:
        prof = load_latency_profile(p)
    except ProfileError as e:
        assert str(e) and "\n" not in str(e)
        return
    for s in prof.batches:  # what was accepted is usable
        assert isinstance(s.batch_size, int) and s.median_ms > 0


@FUZZ
@given(data=st.binary(max_size=300))
def test_fuzz_profile_random_bytes(tmp_path, data):
    _load_or_error(_write(tmp_path, data))


@FUZZ
@given(where=st.sampled_from(PATHS), value=_json_values())
def test_fuzz_profile_wrong_types(tmp_path, where, value):
    doc = copy.deepcopy(VALID)
    node = doc
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    _load_or_error(_write(tmp_path, json.dumps(doc)))


@FUZZ
@given(cut=st.integers(0, len(json.dumps(VALID))))
def test_fuzz_profile_truncated(tmp_path, cut):
    _load_or_error(_write(tmp_path, json.dumps(VALID)[:cut]))


# ----------------------------------------------------------------------------
# routing traces: the simulator's and the profiler's readers, by the same rules

def _trace_text(recs) -> str:
    return "".join(json.dumps(r) + "\n" for r in recs)


def _field_values():
    return st.one_of(st.integers(-3, 3), st.integers(-2 ** 65, 2 ** 65), st.sampled_from([0.5, 1.0, -0.0, 1e13]),
                     st.booleans(), st.none(), st.sampled_from(["0", "a", ""]), st.just([0]))


@st.composite
def _traces(draw):
    n = draw(st.integers(1, 12))
    recs, state = [], {}
    for _ in range(n):
        rid = draw(st.sampled_from([1, 2, "r"]))
        step, model = state.get(rid, (0, 0))
        nxt = draw(st.sampled_from([0, 1, -1]))
        rec = {"request_id": rid, "step": step, "model": model, "next_model": nxt, "committed_tokens": 1}
        if draw(st.integers(0, 4)) == 0:  # one field of the right shape and a wrong type or value
            rec[draw(st.sampled_from(sorted(rec)))] = draw(_field_values())
        if draw(st.integers(0, 9)) == 0:
            rec.pop(draw(st.sampled_from(sorted(rec))))
        recs.append(rec)
        state[rid] = (0, 0) if nxt == -1 else (step + 1, nxt)
    return recs


def _outcome(fn, path):
    try:
        fn(path)
    except TraceError as e:
        assert str(e) and "\n" not in str(e)
        return "refused"
    return "accepted"


@FUZZ
@given(recs=_traces())
def test_fuzz_trace_readers_agree(tmp_path, recs):
    p = _write(tmp_path, _trace_text(recs), "t.jsonl")
    a = _outcome(read_trace, p)
    b = _outcome(accumulate_trace, p)
    c = _outcome(lambda q: list(iter_records(q)), p)
    assert a == b == c, (a, b, c, recs)


@FUZZ
@given(data=st.binary(max_size=300), gz=st.booleans())
def test_fuzz_trace_random_bytes(tmp_path, data, gz):
    p = _write(tmp_path, data, "t.jsonl.gz" if gz else "t.jsonl")
    for fn in (read_trace, accumulate_trace, lambda q: list(iter_records(q))):
        _outcome(fn, p)


@FUZZ
@given(cut=st.integers(1, 2000))
def test_fuzz_trace_truncated_gzip(tmp_path, cut):
    recs = [{"request_id": k % 7, "step": k // 7, "model": 0, "next_model": 0, "committed_tokens": 1}
            for k in range(140)]
    blob = gzip.compress(_trace_text(recs).encode())
    p = _write(tmp_path, blob[:min(cut, len(blob))], "t.jsonl.gz")
    for fn in (read_trace, accumulate_trace, lambda q: list(iter_records(q))):
        outcome = _outcome(fn, p)
        if cut < len(blob):
            assert outcome == "refused"


# ----------------------------------------------------------------------------
# tr-profile in-process

def _cli(*args):
    from profiler.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in args])
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


def _assert_contract(rc, err):
    if rc == 0:
        return
    assert rc == 2, (rc, err)
    lines = [line for line in err.splitlines() if not line.startswith("note:")]
    assert len(lines) == 1 and lines[0].startswith("error:"), err


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@FUZZ
@given(data=st.binary(max_size=200))
def test_fuzz_cli_routing_and_roofline_random_files(in_tmp, data):
    p = _write(in_tmp, data, "f.jsonl")
    rc, _, err = _cli("routing", "--trace", p)
    _assert_contract(rc, err)
    rc, _, err = _cli("roofline", p)
    _assert_contract(rc, err)
    assert not [f for f in os.listdir(in_tmp) if f.startswith(".")]  # no temporary file left behind


@FUZZ
@given(recs=_traces(), where=st.sampled_from(PATHS), value=_json_values())
def test_fuzz_cli_system_wrong_types(in_tmp, recs, where, value):
    trace = _write(in_tmp, _trace_text(recs), "t.jsonl")
    doc = copy.deepcopy(VALID)
    node = doc
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    prof = _write(in_tmp, json.dumps(doc), "p.json")
    good = _write(in_tmp, json.dumps(VALID), "g.json")
    out = in_tmp / "spec.json"
    rc, _, err = _cli("system", "--trace", trace, "--latency-profile", good, prof, "--out", out, "--quiet")
    _assert_contract(rc, err)
    if rc != 0:
        assert not out.exists()
    else:
        from tr_core.spec import load_spec
        load_spec(out)
        out.unlink()


TINY_CONFIG = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64, "max_position_embeddings": 64}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(key=st.sampled_from(sorted(TINY_CONFIG)),
       value=st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.5, 7, 64, "2", "llama", ""]),
                       st.just([2]), st.just({"a": 1})))
def test_fuzz_cli_latency_config_wrong_types(in_tmp, key, value):
    pytest.importorskip("torch")
    cfg = _write(in_tmp, json.dumps({**TINY_CONFIG, key: value}), "c.json")
    rc, out, err = _cli("latency", "--config", cfg, "--batch-sizes", "1", "2", "--context", "2", "--steps", "1",
                        "--warmup-steps", "0", "--threads", "1", "--out", in_tmp / "p.json", "--quiet")
    _assert_contract(rc, err)
    if rc == 0:
        assert load_latency_profile(in_tmp / "p.json").batches
        (in_tmp / "p.json").unlink()
    else:
        assert not (in_tmp / "p.json").exists()


@FUZZ
@given(lines=st.lists(st.one_of(_json_values().map(json.dumps), st.binary(max_size=20).map(
    lambda b: b.decode("latin-1"))), min_size=0, max_size=4), raw=st.binary(max_size=40))
def test_fuzz_prompts_reader(tmp_path, lines, raw):
    from profiler.route_run import load_prompts
    for content in ("\n".join(lines).encode("utf-8", "surrogatepass"), raw, b"[" * 100_000):
        p = _write(tmp_path, content, "prompts.jsonl")
        try:
            out = load_prompts(str(p), None, 256)
        except ProfileError as e:
            assert str(e) and "\n" not in str(e)
            continue
        assert out and all(ids and all(0 <= v < 256 for v in ids) for ids in out)
