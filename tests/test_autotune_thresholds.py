"""The vendorable thresholds reader: validation rules, lookup semantics, JSON Schema, stdlib-only."""

from __future__ import annotations

import ast
import copy
import json
import os
import shutil
import subprocess
import sys

import pytest

from tr_model.thresholds import ThresholdFileError, ThresholdTable, WatchedThresholds, canonical_sha256, spec_sha256

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
READER = os.path.join(ROOT, "tr_model", "thresholds.py")


def _doc(n_entries=3, max_conc=3, complete=None):
    spec = {"schema_version": 1, "name": "r2r", "step_latency_ms": [6.0, 27.9],
            "routing_matrix": [[0.65, 0.35], [1.0, 0.0]], "committed_tokens": [[1.0, 0.0], [1.0, 0.0]],
            "delta_ms": 0.1, "provenance": {"note": "ignored by the hash"}}
    ths = [[1, 1], [1, 2], [1, 2], [1, 3]]
    return {
        "schema_version": 1, "format": "tokenrouter-thresholds", "num_models": 2, "model_names": None,
        "delta_ms": 0.1, "spec": spec, "spec_sha256": spec_sha256(spec), "max_concurrency": max_conc,
        "complete": (n_entries == max_conc) if complete is None else complete,
        "fallback_thresholds": [1, 1],
        "entries": [{"active_requests": n + 1, "thresholds": ths[n], "predicted_tok_s": 10.0 * (n + 1),
                     "eager_tok_s": 9.0 * (n + 1)} for n in range(n_entries)],
        "provenance": {"tool": "tr-autotune", "tool_version": "0", "inputs_sha256": "0" * 64},
    }


def _write(tmp_path, doc, name="t.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return str(p)


def test_lookup_clamps_and_returns_the_row_for_n(tmp_path):
    t = ThresholdTable.load(_write(tmp_path, _doc(3, 8, complete=False)))
    assert t.lookup(1) == (1, 1)
    assert t.lookup(2) == (1, 2)
    assert t.lookup(3) == (1, 2)
    assert t.lookup(0) == (1, 1)           # empty system: the N = 1 row
    assert t.lookup(7) == (1, 2)           # beyond the computed part: the largest computed N
    assert t.lookup(10 ** 6) == (1, 2)
    assert t.covered_concurrency == 3 and not t.complete
    assert t.predicted(2) == 20.0 and t.predicted(99) == 30.0
    with pytest.raises(ValueError, match="active_requests"):
        t.lookup(-1)
    with pytest.raises(ValueError, match="integer"):
        t.lookup(2.0)
    with pytest.raises(ValueError, match="integer"):
        t.lookup(True)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(schema_version=2), "schema_version"),
    (lambda d: d.pop("schema_version"), "schema_version"),
    (lambda d: d["entries"][1].update(thresholds=[1, 0]), r"entries\[1\].thresholds\[1\]"),
    (lambda d: d["entries"][1].update(thresholds=[1, 2.0]), r"entries\[1\].thresholds\[1\]"),
    (lambda d: d["entries"][2].update(thresholds=[1, 2, 1]), r"entries\[2\].thresholds has 3"),
    (lambda d: d["entries"][2].update(active_requests=4), r"entries\[2\].active_requests must be 3"),
    (lambda d: d["entries"][0].update(thresholds=[2, 1]), "infeasible for N = 1"),
    (lambda d: d["entries"].clear(), "'entries' is empty"),
    (lambda d: d.update(max_concurrency=5), "'complete' is true but"),
    (lambda d: d.update(max_concurrency=2), "max_concurrency is 2"),
    (lambda d: d.update(fallback_thresholds=[1]), "'fallback_thresholds' has 1"),
    (lambda d: d["spec"].update(step_latency_ms=[6.0, 28.0]), "spec_sha256"),
    (lambda d: d.update(num_models=0), "num_models"),
    (lambda d: d.update(complete="yes"), "'complete'"),
    (lambda d: d["entries"][0].update(predicted_tok_s=-1), r"entries\[0\].predicted_tok_s"),
    (lambda d: d.pop("entries"), "missing field 'entries'"),
])
def test_invalid_files_raise_naming_the_field(tmp_path, mutate, field):
    d = _doc()
    mutate(d)
    with pytest.raises(ThresholdFileError, match=field):
        ThresholdTable.load(_write(tmp_path, d))


def test_spec_provenance_does_not_change_the_hash():
    d = _doc()["spec"]
    e = copy.deepcopy(d)
    e["provenance"] = {"other": 1}
    assert spec_sha256(d) == spec_sha256(e)
    e["delta_ms"] = 0.05
    assert spec_sha256(d) != spec_sha256(e)
    # canonical form: key order and whitespace do not matter
    assert canonical_sha256({"a": 1, "b": [1, 2]}) == canonical_sha256({"b": [1, 2], "a": 1})


def test_missing_and_corrupt_files_are_clear_errors(tmp_path):
    with pytest.raises(ThresholdFileError, match="does not exist"):
        ThresholdTable.load(str(tmp_path / "nope.json"))
    good = json.dumps(_doc())
    p = tmp_path / "trunc.json"
    p.write_text(good[: len(good) // 2])
    with pytest.raises(ThresholdFileError, match="not valid JSON"):
        ThresholdTable.load(str(p))
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ThresholdFileError):
        ThresholdTable.load(str(p))
    p.write_text("[1, 2]")
    with pytest.raises(ThresholdFileError, match="JSON object"):
        ThresholdTable.load(str(p))


def test_require_concurrency_rejects_a_short_table(tmp_path):
    path = _write(tmp_path, _doc(2, 4, complete=False))
    assert ThresholdTable.load(path, require_concurrency=2).covered_concurrency == 2
    with pytest.raises(ThresholdFileError, match="covers N = 1..2 but N = 1..3 was required"):
        ThresholdTable.load(path, require_concurrency=3)


def test_watched_file_reloads_and_survives_a_bad_replacement(tmp_path):
    path = _write(tmp_path, _doc(2, 4, complete=False))
    w = WatchedThresholds(path, check_interval_s=0.0)
    assert w.lookup(4) == (1, 2)
    os.replace(_write(tmp_path, _doc(4, 4), "new.json"), path)
    assert w.lookup(4) == (1, 3) and w.table.complete
    with open(path, "w") as f:
        f.write("{ truncated")
    os.utime(path, ns=(1, 1))
    assert w.lookup(4) == (1, 3) and "not valid JSON" in w.last_error
    with pytest.raises(ThresholdFileError):
        WatchedThresholds(path)


def test_eager_fallback_is_explicit():
    t = ThresholdTable.eager(3, 5)
    assert t.source == "fallback" and t.lookup(4) == (1, 1, 1) and t.lookup(100) == (1, 1, 1)


def test_reader_uses_only_the_standard_library():
    tree = ast.parse(open(READER, encoding="utf-8").read())
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            mods.add(node.module.split(".")[0])
    assert mods <= set(sys.stdlib_module_names), mods - set(sys.stdlib_module_names)


def test_reader_works_when_vendored_alone(tmp_path):
    """Copy the file into an empty folder and use it with -I (no site-packages, no project)."""
    vend = tmp_path / "vendor"
    vend.mkdir()
    shutil.copy(READER, vend / "tr_thresholds.py")
    path = _write(tmp_path, _doc(3, 3))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import tr_thresholds as t; "
            "tab = t.ThresholdTable.load(sys.argv[2]); print(tab.lookup(2), tab.lookup(50), "
            "'numpy' in sys.modules, 'tr_model' in sys.modules)")
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(vend), path], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["(1,", "2)", "(1,", "2)", "False", "False"]


def test_written_file_matches_the_json_schema(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    import tr_model
    from tr_model.autotune import tune
    schema = json.load(open(os.path.join(ROOT, "data", "schemas", "thresholds.schema.json")))
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    out = tmp_path / "th.json"
    tune(spec, 3, out)
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, schema)
    bad = copy.deepcopy(doc)
    bad["entries"][0]["thresholds"] = [0, 1]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    bad = copy.deepcopy(doc)
    bad["schema_version"] = 2
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
