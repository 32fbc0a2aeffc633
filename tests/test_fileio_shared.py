"""The shared IO helpers of tr_core that several packages call instead of keeping their own copies:
``fileio.decode_json`` (routing-trace lines, R2R records, prompts files), ``fileio.json_ready`` (the profiler's
and ShadowPrefill's result documents), ``fileio.read_text`` with ``max_bytes`` and ``units.positive_number``
(``tr-profile --delta-ms``, ``tr-shadow-cluster --capacity-rps``)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tr_core.errors import SpecError
from tr_core.fileio import MAX_JSON_BYTES, decode_json, json_ready, read_text
from tr_core.units import positive_number


class Err(ValueError):
    pass


@pytest.mark.parametrize("raw, needle", [
    (b'{"a": 1, "a": 2}', "f:3: the key 'a' appears twice in one object"),
    (b'\xff', "f:3: not valid UTF-8"),
    (b'{"a": ', "f:3: not valid JSON ("),
    (b'[' * 100_000 + b']' * 100_000, "f:3: JSON nested too deeply for a thing"),
    (b'1' * 5000, "f:3: not a valid thing ("),
])
def test_decode_json_names_where_and_what(raw, needle):
    with pytest.raises(Err) as e:
        decode_json(raw, "f:3", "thing", error=Err)
    assert str(e.value).startswith(needle) and "\n" not in str(e.value)


def test_decode_json_at_line_and_plain_loads():
    with pytest.raises(Err, match=r"^doc:2: not valid JSON \(.* at column 4\)"):
        decode_json('[1,\n 2 3]', "doc", "document", error=Err, at_line=True)
    assert decode_json('{"a": 1, "a": 2}', "p:1", "prompt", error=Err, loads=json.loads) == {"a": 2}
    assert decode_json(b'{"x": [1, 2.5, null]}', "w", "line") == {"x": [1, 2.5, None]}


def test_trace_line_r2r_record_and_prompt_use_it(tmp_path):
    from profiler.r2r import _json_rows
    from profiler.route_run import load_prompts
    from profiler.trace import TraceError
    from tr_core.routing_trace import decode_line
    with pytest.raises(TraceError, match="^t:7: the key 'step' appears twice in one object"):
        decode_line(b'{"step": 0, "step": 1}', "t:7")
    p = tmp_path / "r.jsonl"
    p.write_bytes(b'{"source_model": "quick", "position": 0}\n\n{"x": \n')
    with pytest.raises(TraceError, match=r"r\.jsonl:3: not valid JSON"):
        list(_json_rows(str(p)))
    q = tmp_path / "p.jsonl"
    q.write_text('[1, 2]\n\n{"input_ids": [3]}\n[1,\n')
    from profiler.latency import ProfileError
    with pytest.raises(ProfileError, match=r"p\.jsonl:4: not valid JSON"):
        load_prompts(str(q), None, 10)
    q.write_text('[1, 2]\r\n\r\n{"input_ids": [3]}\n')
    assert load_prompts(str(q), None, 10) == [[1, 2], [3]]


def test_read_text_max_bytes(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("abc\n")
    assert read_text(p, "text file", max_bytes=None) == "abc\n"
    with pytest.raises(SpecError, match="is 4 bytes, more than 3; not a text file"):
        read_text(p, "text file", max_bytes=3)
    assert MAX_JSON_BYTES > 4 and read_text(p, "text file") == "abc\n"
    p.write_bytes(b"\xff")
    with pytest.raises(Err, match="is not UTF-8 text"):
        read_text(p, "text file", error=Err)


def test_json_ready():
    doc = {1: np.array([1.5, np.nan]), "b": (np.int64(3), np.bool_(True), True, float("inf")), "c": "x",
           "d": [np.float32(0.5), None]}
    out = json_ready(doc)
    assert out == {"1": [1.5, None], "b": [3, True, True, None], "c": "x", "d": [0.5, None]}
    assert type(out["b"][0]) is int and type(out["b"][1]) is bool
    json.dumps(out, allow_nan=False)
    from profiler.routing import json_safe
    assert json_safe is json_ready


@pytest.mark.parametrize("text, ok", [("1", 1.0), ("0.25", 0.25), ("1e3", 1000.0)])
def test_positive_number_accepts(text, ok):
    assert positive_number(text, error=Err, not_a_number="--x: a number", not_positive="--x: > 0") == ok


@pytest.mark.parametrize("text, msg", [("abc", "--x: a number, got 'abc'"), ("0", "--x: > 0, got '0'"),
                                       ("-1", "--x: > 0, got '-1'"), ("nan", "--x: > 0, got 'nan'"),
                                       ("inf", "--x: > 0, got 'inf'")])
def test_positive_number_refuses(text, msg):
    with pytest.raises(Err) as e:
        positive_number(text, error=Err, not_a_number="--x: a number", not_positive="--x: > 0")
    assert str(e.value) == msg


def test_delta_ms_messages():
    from profiler.cli import _delta
    assert _delta(None) == 0.1 and _delta("auto") == "auto" and _delta("0.5") == 0.5
    with pytest.raises(SpecError, match=r"^--delta-ms must be a number of ms > 0 or 'auto', got 'x'$"):
        _delta("x")
    with pytest.raises(SpecError, match=r"^--delta-ms must be a finite number of ms > 0, got 'inf'$"):
        _delta("inf")
    assert math.isfinite(_delta("1e-3"))
