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


def _doc(n_entries=3, max_conc=3, complete=None, version=2):
    spec = {"schema_version": 1, "name": "r2r", "step_latency_ms": [6.0, 27.9],
            "routing_matrix": [[0.65, 0.35], [1.0, 0.0]], "committed_tokens": [[1.0, 0.0], [1.0, 0.0]],
            "delta_ms": 0.1, "provenance": {"note": "ignored by the hash"}}
    ths = [[1, 1], [1, 2], [1, 2], [1, 3]]
    doc = {
        "schema_version": version, "format": "tokenrouter-thresholds", "num_models": 2, "model_names": None,
        "delta_ms": 0.1, "spec": spec, "spec_sha256": spec_sha256(spec), "max_concurrency": max_conc,
        "complete": (n_entries == max_conc) if complete is None else complete,
        "fallback_thresholds": [1, 1],
        "entries": [{"active_requests": n + 1, "thresholds": ths[n], "predicted_tok_s": 10.0 * (n + 1),
                     "eager_tok_s": 9.0 * (n + 1)} for n in range(n_entries)],
        "provenance": {"tool": "tr-autotune", "tool_version": "0", "inputs_sha256": "0" * 64},
    }
    if version >= 2:
        for e in doc["entries"]:
            e.update(certificate="exhaustive", upper_bound_tok_s=e["predicted_tok_s"], gap=0.0)
    return doc


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
    (lambda d: d.update(schema_version=3), "schema_version"),
    (lambda d: d.update(schema_version=True), "schema_version"),
    (lambda d: d["entries"][1].pop("certificate"), r"entries\[1\] is missing field 'certificate'"),
    (lambda d: d["entries"][1].update(certificate="guess"), r"entries\[1\].certificate must be one of"),
    (lambda d: d["entries"][1].update(certificate="certified", gap=None), r"entries\[1\] is certified but"),
    (lambda d: d["entries"][1].update(gap="0.1"), r"entries\[1\].gap must be a finite number"),
    (lambda d: d["entries"][1].update(upper_bound_tok_s=1.0), r"entries\[1\].upper_bound_tok_s = 1 is below"),
    (lambda d: d["entries"][1].update(certificate="extrapolated", extrapolated_from=1),
     r"entries\[1\].thresholds = \[1, 2\] is not the vector"),
    (lambda d: d["entries"][1].update(certificate="extrapolated", thresholds=[1, 1]),
     r"entries\[2\] is computed but follows the extrapolated row entries\[1\]"),
    (lambda d: d["entries"][2].update(certificate="extrapolated", extrapolated_from=3),
     r"entries\[2\].extrapolated_from must be"),
    (lambda d: d["entries"][0].update(predicted_tok_s="10"), r"entries\[0\].predicted_tok_s must be"),
    (lambda d: d["entries"][0].update(predicted_tok_s=10 ** 400), r"entries\[0\].predicted_tok_s must be"),
    (lambda d: d.update(delta_ms=10 ** 400), "'delta_ms' must be"),
    (lambda d: d.update(max_concurrency=2 ** 31), "'max_concurrency' must be"),
    (lambda d: d["entries"][2].update(thresholds=[1, 10 ** 300]), r"entries\[2\].thresholds = \[1, 10+\.\.\.0+\] is "
     "infeasible"),
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
    with pytest.raises(ThresholdFileError, match=field) as info:
        ThresholdTable.load(_write(tmp_path, d))
    assert len(str(info.value)) < 400 and "unexpected" not in str(info.value)


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
    from tr_model.tuning.autotune import tune
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
    bad["schema_version"] = 3
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    bad = copy.deepcopy(doc)
    bad["entries"][1].update(certificate="certified", gap=None)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    # a partial table: computed rows, then extrapolated ones; both the schema and the reader accept it
    from tr_model.tuning.autotune import inputs_sha256, thresholds_document
    part = thresholds_document(spec, 6, doc["entries"][:2], inputs_hash=inputs_sha256(spec, 6))
    jsonschema.validate(part, schema)
    assert [e["certificate"] for e in part["entries"]] == ["exhaustive"] * 2 + ["extrapolated"] * 4
    t = ThresholdTable.from_dict(part)
    assert t.covered_concurrency == 2 and t.lookup(6) == t.lookup(2) and not t.complete


# ---- the reader's contract: ThresholdFileError and nothing else, whatever the file holds ----

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

FUZZ = settings(max_examples=150, deadline=None, database=None,  # no .hypothesis folder in the tree
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _load_or_error(path):
    """Load; the only exception allowed is ThresholdFileError, never from the reader's safety net."""
    try:
        t = ThresholdTable.load(path)
    except ThresholdFileError as e:
        msg = str(e)
        assert "unexpected" not in msg, msg          # a case the validation does not handle by name
        assert len(msg) < 600 and "\n" not in msg
        return None
    for n in range(0, t.max_concurrency + 2 if t.max_concurrency < 50 else 50):
        b = t.lookup(n)
        assert len(b) == t.num_models and all(isinstance(x, int) and x >= 1 for x in b)
        assert sum(x - 1 for x in b) < max(n, 1)
    return t


def test_v1_files_are_still_read(tmp_path):
    t = ThresholdTable.load(_write(tmp_path, _doc(3, 5, complete=False, version=1)))
    assert t.schema_version == 1 and t.covered_concurrency == 3 and t.certificates == ()
    assert t.lookup(4) == (1, 2) and t.certificate(2) is None


def test_extrapolated_rows_serve_but_do_not_count_as_computed(tmp_path):
    d = _doc(3, 5, complete=False)
    for n in (4, 5):
        d["entries"].append({"active_requests": n, "thresholds": [1, 2], "certificate": "extrapolated",
                             "extrapolated_from": 3})
    d["entries"][1].update(certificate="certified", upper_bound_tok_s=20.1, gap=0.005)
    t = ThresholdTable.load(_write(tmp_path, d))
    assert t.covered_concurrency == 3 and t.lookup(5) == (1, 2) and t.certificate(5) == "extrapolated"
    assert t.certificate(2) == "certified" and t.gaps[:3] == (0.0, 0.005, 0.0) and t.predicted(3) == 30.0
    with pytest.raises(ThresholdFileError, match="covers N = 1..3 but N = 1..4"):
        ThresholdTable.load(_write(tmp_path, d), require_concurrency=4)
    d["complete"] = True
    with pytest.raises(ThresholdFileError, match="'complete' is true but the computed rows cover N = 1..3"):
        ThresholdTable.load(_write(tmp_path, d))


@pytest.mark.parametrize("content, match", [
    (b"", "is empty"),
    (b"  \n", "is empty"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"a": ' * 50_000 + b"1" + b"}" * 50_000, "nested too deeply"),
    (b'{"schema_version": NaN}', "not a valid number"),
    (b'{"schema_version": -Infinity}', "not a valid number"),
    (b'{"schema_version": 1e400}', "out of range"),
    (b'{"schema_version": ' + b"9" * 5000 + b"}", "not a valid number"),
    (b"\xef\xbb\xbf{}", "not valid JSON"),
    (b"\x80\x81\x82", "not UTF-8"),
    (b'"just a string"', "JSON object"),
    (b"null", "JSON object"),
])
def test_hostile_contents_raise_threshold_file_error(tmp_path, content, match):
    p = tmp_path / "t.json"
    p.write_bytes(content)
    with pytest.raises(ThresholdFileError, match=match):
        ThresholdTable.load(p)


def test_hostile_paths_raise_threshold_file_error(tmp_path):
    with pytest.raises(ThresholdFileError, match="is a directory"):
        ThresholdTable.load(tmp_path)
    with pytest.raises(ThresholdFileError, match="not a regular file"):
        ThresholdTable.load("/dev/zero")                  # would never end if read
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ThresholdFileError, match="not a regular file"):
        ThresholdTable.load(fifo)                         # would block forever if opened for reading
    with pytest.raises(ThresholdFileError):
        ThresholdTable.load(str(tmp_path / "a\0b.json"))
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(65 * 2 ** 20)                          # sparse: no disk used
    with pytest.raises(ThresholdFileError, match="more than"):
        ThresholdTable.load(big)


@FUZZ
@given(st.binary(max_size=400))
def test_fuzz_random_bytes(tmp_path, data):
    p = tmp_path / "t.json"
    p.write_bytes(data)
    _load_or_error(p)


_JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
                       st.sampled_from([0, 1, -1, 2, 10 ** 400, -(10 ** 300), 2 ** 63, 2 ** 31]),
                       st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0.5, 1.0, 1e308, -0.0]),
                       st.text(max_size=8))
_JSON = st.recursive(_JSON_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                          st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                     max_leaves=12)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


_VALID = _doc(3, 4, complete=False)
_VALID_PATHS = [p for p in _paths(_VALID) if p]


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(_VALID_PATHS), _JSON), min_size=1, max_size=3),
       st.booleans())
def test_fuzz_right_shape_wrong_types(tmp_path, replacements, delete):
    d = copy.deepcopy(_VALID)
    for path, value in replacements:
        node = d
        try:
            for key in path[:-1]:
                node = node[key]
            if delete and isinstance(node, dict):
                node.pop(path[-1], None)
            else:
                node[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    p = tmp_path / "t.json"
    p.write_text(json.dumps(d))
    _load_or_error(p)


@FUZZ
@given(st.integers(min_value=0, max_value=10 ** 6), st.sampled_from([1, 2]))
def test_fuzz_truncations(tmp_path, cut, version):
    text = json.dumps(_doc(3, 3, version=version)).encode()
    cut = cut % len(text)
    p = tmp_path / "t.json"
    p.write_bytes(text[:cut])
    with pytest.raises(ThresholdFileError):
        ThresholdTable.load(p)


@FUZZ
@given(st.one_of(st.binary(max_size=200), _JSON.map(lambda v: json.dumps(v).encode()),
                 st.sampled_from([b"[" * 50_000, b'{"schema_version": 1e999}', b""])))
def test_fuzz_watched_table_keeps_the_last_good_one(tmp_path, bad):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(_doc(4, 4)))
    w = WatchedThresholds(path, check_interval_s=0.0)
    good = w.lookup(4)
    tmp = tmp_path / "w.tmp"
    tmp.write_bytes(bad)
    os.replace(tmp, path)                       # a new inode: the watcher sees the change
    assert w.lookup(4) == good and w.lookup(1) == (1, 1)
    assert w.last_error and w.complete and w.covered_concurrency == 4
    path.unlink()
    assert w.lookup(4) == good                  # the file disappearing does not hurt either
    os.mkdir(path)                              # nor a directory in its place
    assert w.lookup(4) == good and "directory" in w.last_error
    os.rmdir(path)


def test_a_huge_nested_value_is_quoted_short(tmp_path):
    """reprlib bounds each level, not the sum: nested long keys once made a 600-character message."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    value = {("k" * 30 + str(i)): {("v" * 30 + str(j)): [10 ** 300, "s" * 100] for j in range(6)} for i in range(6)}
    p = deep / "t.json"
    p.write_text(json.dumps({"schema_version": value, "entries": []}))
    with pytest.raises(ThresholdFileError) as e:
        ThresholdTable.load(p)
    msg = str(e.value)
    assert "schema_version" in msg and "\n" not in msg
    assert len(msg) < len(str(p)) + 300
