"""Fuzz: the spec reader, tr-optimize and tr-autotune under random bytes, wrong-typed JSON and truncations.

The property (issue 14, item 10): either a valid result (exit 0) or exactly one ``error:`` line with
exit 2 (3 for a refused resource limit); never a traceback, a hang or a half-written file.  The CLIs are
called in-process (``main(argv)``) so that a hundred examples cost seconds, not minutes; the chains are
kept tiny (N <= 3, a small --max-states) so a valid input finishes at once.
"""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tr_core.errors import SpecError
from tr_core.spec import SystemSpec, load_spec

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                          HealthCheck.too_slow])

VALID = {"schema_version": 1, "name": "r2r", "step_latency_ms": [6.0, 27.9],
         "routing_matrix": [[0.65, 0.35], [1.0, 0.0]], "committed_tokens": [[1, 0], [1, 0]], "delta_ms": 0.1,
         "max_batch_size": [None, 4], "model_names": ["small", "large"]}
VALID_TEXT = json.dumps(VALID)

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10 ** 30, 10 ** 30),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                 st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=4)), max_leaves=12)


@st.composite
def spec_docs(draw):
    """A spec document of the right shape with some fields (or entries) replaced by random JSON values."""
    doc = json.loads(VALID_TEXT)
    for key in draw(st.lists(st.sampled_from(sorted(doc) + ["latency_curves", "provenance", "M"]), max_size=3)):
        target = doc.get(key)
        if key in ("routing_matrix", "committed_tokens") and isinstance(target, list) and len(target) == 2:
            target = target[draw(st.integers(0, 1))]
        if isinstance(target, list) and target and draw(st.booleans()):
            # keep the list, spoil one entry
            target[draw(st.integers(0, len(target) - 1))] = draw(json_values)
        else:
            doc[key] = draw(json_values)
    return doc


def _write(tmp_path, data: bytes, name="s.json"):
    f = tmp_path / name
    f.write_bytes(data)
    return f


def _reader_property(path):
    try:
        spec = load_spec(path)
    except SpecError as e:
        msg = str(e)
        assert msg and "\n" not in msg and str(path) in msg, msg
        return None
    assert isinstance(spec, SystemSpec)
    return spec


@FUZZ
@given(data=st.binary(max_size=300))
def test_spec_reader_random_bytes(tmp_path, data):
    _reader_property(_write(tmp_path, data))


@FUZZ
@given(doc=spec_docs())
def test_spec_reader_wrong_types_and_values(tmp_path, doc):
    try:
        text = json.dumps(doc)
    except (ValueError, RecursionError):
        return
    _reader_property(_write(tmp_path, text.encode()))


@FUZZ
@given(cut=st.integers(0, len(VALID_TEXT) - 1))
def test_spec_reader_truncations(tmp_path, cut):
    assert _reader_property(_write(tmp_path, VALID_TEXT[:cut].encode())) is None


def _run(main, argv):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def _contract(code, err, folder):
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if code == 0:
        assert not any(ln.startswith("error:") for ln in lines), err
    else:
        assert code in (2, 3), (code, err)
        errors = [ln for ln in lines if ln.startswith("error:")]
        assert len(errors) == 1 and lines[-1] == errors[0], err
        assert all(ln.startswith(("error:", "note:")) for ln in lines), err
    leftovers = [f for f in os.listdir(folder) if f.endswith(".tmp") or f.startswith(".")]
    assert not leftovers, leftovers


@FUZZ
@given(doc=spec_docs(), n=st.integers(1, 3))
def test_tr_optimize_with_fuzzed_specs(tmp_path, doc, n):
    from tr_model.cli import main
    try:
        text = json.dumps(doc)
    except (ValueError, RecursionError):
        return
    f = _write(tmp_path, text.encode())
    out = tmp_path / "r.json"
    if out.exists():                 # tmp_path is shared by the examples of one test
        out.unlink()
    code, stdout, err = _run(main, ["--spec", f, "--N", n, "--no-cache", "--max-states", 2000, "--out", out])
    _contract(code, err, tmp_path)
    if code == 0:
        assert json.loads(out.read_text())["results"][0]["N"] == n
    else:
        assert not out.exists()


FLAG_VALUES = {
    "--p": ["0.35", "1.5", "-0", "nan", "x", "1e400"], "--q": ["0.5", "2"], "--L": ["6", "27.9", "0", "-1", "inf"],
    "--N": ["1", "3", "0", "2-1", "1-2", "x", "1,2", "99999999999999999999"], "--B": ["1", "2", "0", "x"],
    "--algo": ["r2r", "me", "r-stitch", "bogus"], "--weights": ["0.5", "0.5", "1", "x"],
    "--delta-ms": ["0.1", "auto", "0", "-1", "nan", "x"], "--max-batch": ["2", "none", "0", "x"],
    "--max-states": ["1", "500", "0", "-5"], "--format": ["json", "csv", "table", "xml"],
    "--tol": ["1e-9", "0", "nan"], "--max-evaluations": ["5", "0"], "--workers": ["1", "0", "x"],
    "--method": ["exact", "bogus"], "--search": ["local", "exhaustive", "x"],
    "--corun-slowdown": ["1", "2.5", "0.5", "nan", "x"],
}
flag_lists = st.lists(st.sampled_from(sorted(FLAG_VALUES)), min_size=1, max_size=6).flatmap(
    lambda flags: st.tuples(*[st.tuples(st.just(f), st.lists(st.sampled_from(FLAG_VALUES[f]), min_size=0, max_size=2))
                              for f in flags]))


@FUZZ
@given(pairs=flag_lists)
def test_tr_optimize_with_fuzzed_flags(tmp_path, pairs):
    from tr_model.cli import main
    argv = ["--no-cache", "--workers", "1"]
    for flag, values in pairs:
        argv += [flag, *values]
    if "--N" not in argv:
        argv += ["--N", "2"]
    argv += ["--max-states", "2000", "--max-evaluations", "50"]  # last word: nothing big is ever solved
    code, _, err = _run(main, argv)
    _contract(code, err, tmp_path)


def _thresholds_file(tmp_path):
    from tr_model.tuning.autotune import tune
    from tr_core.spec import preset
    f = tmp_path / "good.json"
    if not f.exists():
        tune(preset("r2r", [6.0, 27.9], p=0.35), 3, f)
    return f


@FUZZ
@given(cut=st.integers(0, 4000), junk=st.binary(max_size=40), n=st.integers(-2, 9))
def test_tr_autotune_show_with_truncated_and_spoiled_files(tmp_path, cut, junk, n):
    from tr_model.autotune_cli import main
    good = _thresholds_file(tmp_path).read_bytes()
    f = _write(tmp_path, good[:cut] + junk, "th.json")
    code, _, err = _run(main, ["show", f, "--N", n])
    _contract(code, err, tmp_path)


@FUZZ
@given(doc=spec_docs(), n=st.integers(0, 3))
def test_tr_autotune_run_with_fuzzed_specs(tmp_path, doc, n):
    from tr_model.autotune_cli import main
    try:
        text = json.dumps(doc)
    except (ValueError, RecursionError):
        return
    f = _write(tmp_path, text.encode())
    th = tmp_path / "out" / "th.json"
    th.parent.mkdir(exist_ok=True)
    for old in th.parent.iterdir():
        old.unlink()
    code, _, err = _run(main, ["run", "--spec", f, "--N", n, "--thresholds", th, "--quiet", "--max-states", 2000])
    _contract(code, err, th.parent)
    if code != 0:
        assert os.listdir(th.parent) == []
