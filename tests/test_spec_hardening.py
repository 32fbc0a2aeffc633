"""The spec reader refuses wrong JSON types, non-finite and overflowing numbers, deep nesting and non-files
with one message naming the file and the field; a degenerate but valid system gets a clear answer."""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest

from tr_core.errors import SpecError
from tr_core.spec import load_spec, spec_from_dict

BASE = {"schema_version": 1, "step_latency_ms": [6.0, 27.9], "routing_matrix": [[0.65, 0.35], [1.0, 0.0]],
        "committed_tokens": [[1, 0], [1, 0]]}


def _with(**kw):
    d = json.loads(json.dumps(BASE))
    d.update(kw)
    return d


# (document, text the one-line message must contain); every case was accepted, converted or crashed before
WRONG_TYPES = [
    (_with(step_latency_ms=["6.0", 27.9]), "step_latency_ms[0] must be a number, got the string '6.0'"),
    (_with(step_latency_ms="6.0 27.9"), "step_latency_ms must be a list"),
    (_with(step_latency_ms=[True, 27.9]), "step_latency_ms[0] must be a number, got true"),
    (_with(routing_matrix=[["0.65", 0.35], [1.0, 0.0]]), "routing_matrix[0][0] must be a number"),
    (_with(routing_matrix=[[0.65, 0.35], "10"]), "routing_matrix[1] must be a list"),
    (_with(committed_tokens=[[1, 0], [1, None]]), "committed_tokens[1][1] must be a number, got null"),
    (_with(committed_tokens={"a": 1}), "committed_tokens must be a list, got an object"),
    (_with(delta_ms="0.1"), "delta_ms must be a number"),
    (_with(max_batch_size=["64", None]), "max_batch_size[0] must be a number"),
    (_with(max_batch_size=[1.5, None]), "max_batch_size[0] must be an integer"),
    (_with(max_batch_size=[4]), "max_batch_size must have M = 2 entries"),
    (_with(model_names=["a", 3]), "model_names[1] must be a string"),
    (_with(name=7), "name must be a string"),
    (_with(provenance=[1]), "provenance must be an object"),
    (_with(latency_curves=[None, {"batch_size": ["1", 8], "step_latency_ms": [27.9, 29.0]}]),
     "latency_curves[1].batch_size[0] must be a number"),
    (_with(latency_curves=[None, {"batch_size": [1, 8], "step_latency_ms": "fast"}]),
     "latency_curves[1].step_latency_ms must be a list"),
    (_with(latency_curves=[None, {"intercept_ms": "1", "per_request_ms": 0.1}]),
     "latency_curves[1].intercept_ms must be a number"),
    (_with(latency_curves=[None, {"batch_size": [1], "step_latency_ms": [2.0], "extra": 1}]),
     "unknown field(s) extra"),
    (_with(latency_curves="none"), "latency_curves must be a list"),
    (_with(schema_version=True), "unsupported schema_version True"),
    (_with(M="2"), "M must be a number"),
]

VALUES = [
    (_with(step_latency_ms=[10 ** 400, 27.9]), "step_latency_ms[0] = 1000"),      # int beyond float
    (_with(step_latency_ms=[6e8, 27.9]), None),                                   # quanta overflow, see below
    (_with(step_latency_ms=[2e9, 27.9]), "step_latency_ms[0] = 2e+09 ms is outside"),
    (_with(step_latency_ms=[1e-9, 27.9]), "is outside"),
    (_with(delta_ms=1e-12), "delta_ms = 1e-12 ms is below"),
    (_with(committed_tokens=[[1e300, 0], [1, 0]]), "committed_tokens[0][0] = 1e+300 is more than"),
    (_with(committed_tokens=[[-1, 0], [1, 0]]), "committed_tokens[0][0] = -1 must be >= 0"),
    (_with(routing_matrix=[[0.5, 0.35], [1.0, 0.0]]), "row 0 sums"),
]


def _load(tmp_path, doc, name="s.json"):
    f = tmp_path / name
    f.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return load_spec(f), f


@pytest.mark.parametrize("doc,msg", WRONG_TYPES + [v for v in VALUES if v[1]])
def test_wrong_types_and_values_name_the_file_and_field(tmp_path, doc, msg):
    with pytest.raises(SpecError) as e:
        _load(tmp_path, doc)
    text = str(e.value)
    assert "\n" not in text
    assert text.startswith(str(tmp_path / "s.json") + ": "), text
    assert msg in text, text


@pytest.mark.parametrize("text,msg", [
    ('{"schema_version": 1, "step_latency_ms": [NaN, 27.9], "routing_matrix": [[0.65, 0.35], [1.0, 0.0]], '
     '"committed_tokens": [[1, 0], [1, 0]]}', "step_latency_ms[0] must be finite"),
    ('{"schema_version": 1, "step_latency_ms": [6.0, Infinity], "routing_matrix": [[0.65, 0.35], [1.0, 0.0]], '
     '"committed_tokens": [[1, 0], [1, 0]]}', "step_latency_ms[1] must be finite"),
    ('{"schema_version": 1, "step_latency_ms": [1e400, 27.9], "routing_matrix": [[0.65, 0.35], [1.0, 0.0]], '
     '"committed_tokens": [[1, 0], [1, 0]]}', "step_latency_ms[0] must be finite"),
    ("[" * 50_000 + "]" * 50_000, "nested too deeply"),
    ('{"step_latency_ms": [' + "9" * 5000 + ", 1]}", "holds a number that cannot be read"),
    ('{"provenance": ' + '{"a": ' * 40 + "1" + "}" * 40 + "}", "nested more than 32 levels"),
    ('{"schema_version": 1, "step_latency_ms": [6.0, 27', "not valid JSON"),
    ("\xff\xfe garbage", "not valid JSON"),
])
def test_raw_text_cases(tmp_path, text, msg):
    f = tmp_path / "s.json"
    f.write_bytes(text.encode("latin-1") if text.startswith("\xff") else text.encode())
    with pytest.raises(SpecError) as e:
        load_spec(f)
    assert msg in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)


def test_overflowing_quanta_are_refused_not_wrapped():
    spec = spec_from_dict(_with(step_latency_ms=[6e8, 27.9]))
    with pytest.raises(SpecError, match="quanta of delta = 0.1 ms, more than 2,147,483,648"):
        spec.quanta_table(2)


def test_non_regular_files_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)                     # opening it would block forever
    for path, msg in (("/dev/zero", "not a regular file"), (fifo, "not a regular file"),
                      (tmp_path, "is a folder"), (tmp_path / "missing.json", "does not exist")):
        with pytest.raises(SpecError, match=msg):
            load_spec(path)


def test_a_valid_document_still_loads_exactly(tmp_path):
    spec, _ = _load(tmp_path, _with(max_batch_size=[64, None], model_names=["s", "l"],
                                    latency_curves=[None, {"batch_size": [1, 8], "step_latency_ms": [27.9, 29.0]}]))
    assert spec.step_latency_ms == (6.0, 27.9) and spec.max_batch_size == (64, None)
    assert spec.latency_curves[1].batch_size == (1, 8)


def test_quanta_are_converted_once_per_spec_and_N():
    from tr_core import spec as S
    s = S.preset("r2r", [6.0, 27.9], p=0.35, delta_ms=0.05)
    S._quanta_table.cache_clear()
    d1, _ = s.quanta_table(7)
    d1[0, 0] = -1                                # callers get copies
    d2, _ = s.quanta_table(7)
    assert d2[0, 0] == 120 and S._quanta_table.cache_info().misses == 1


def _run(main, argv):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def test_a_system_that_never_commits_a_token_gets_a_clear_answer(tmp_path):
    from tr_model.cli import main
    f = tmp_path / "c0.json"
    f.write_text(json.dumps(_with(committed_tokens=[[0, 0], [0, 0]])))
    code, out, err = _run(main, ["--spec", str(f), "--N", "2", "--no-cache"])
    assert code == 0 and "Traceback" not in err
    assert "no step of this system commits a token" in err and "every B ties" in err
    code, out, _ = _run(main, ["--spec", str(f), "--N", "2", "--no-cache", "--format", "json"])
    r = json.loads(out)["results"][0]
    assert r["throughput_tok_s"] == 0.0 and r["gain_vs_eager"] is None
