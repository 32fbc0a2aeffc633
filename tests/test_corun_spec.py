"""The co-running latency in the spec: validation, JSON round trips, quanta tables, schema and cache key."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from optimizer.cache import evaluation_key
from tr_core.errors import SpecError
from tr_core.grid import spec_latencies
from tr_core.spec import CorunLatency, make_spec, preset, spec_from_dict, spec_to_dict

ROOT = Path(__file__).resolve().parents[1]
R2R = dict(p=0.35)
TABLE = {"batch_size": [1, 4, 16], "step_latency_ms": [16.8, 18.0, 21.6]}


def r2r(corun=None, **kw):
    return preset("r2r", [6.0, 27.9], corun_latency=corun, **R2R, **kw)


def test_absent_means_solo():
    s = r2r()
    assert not s.has_corun and s.corun_latency is None
    assert s.corun_latency_ms(0, 5) == s.latency_ms(0, 5)
    d, rd = s.quanta_table(6)
    dc, rc = s.corun_quanta_table(6)
    assert (d == dc).all() and rd == rc == []
    assert "corun_latency" not in spec_to_dict(s)


def test_slowdown_and_table_values():
    s = r2r([{"slowdown": 2.8}, None])
    assert s.has_corun
    assert math.isclose(s.corun_latency_ms(0, 3), 16.8) and s.corun_latency_ms(1, 3) == 27.9
    dc, _ = s.corun_quanta_table(4)
    assert dc.dtype == np.int64 and (dc[0] == 168).all() and (dc[1] == 279).all()
    t = r2r([TABLE, {"slowdown": 1.0}])
    assert t.has_corun  # a factor of 1 is still "given": the chain takes the co-running law (same numbers)
    dc, _ = t.corun_quanta_table(16)
    assert dc[0, 1] == 168 and dc[0, 4] == 180 and dc[0, 16] == 216 and dc[0, 0] == dc[0, 1]
    assert dc[0, 10] == 198  # linear between 4 and 16: 18.0 + 6 * 0.3
    assert (dc[1] == 279).all()
    # a slowdown on a batch-dependent solo curve follows it
    c = r2r([None, {"slowdown": 2.0}], latency_curves=[None, {"batch_size": [1, 8], "step_latency_ms": [28.0, 35.0]}])
    assert math.isclose(c.corun_latency_ms(1, 8), 70.0) and math.isclose(c.corun_latency_ms(1, 1), 56.0)
    dc, _ = c.corun_quanta_table(8)
    assert dc[1, 8] == 700 and dc[1, 1] == 560 and dc[1, 3] == 600 and (dc[0] == 60).all()


def test_make_spec_accepts_numbers_and_objects():
    a = r2r([2.5, None])
    b = r2r([CorunLatency.factor(2.5), None])
    c = r2r([{"slowdown": 2.5}, None])
    assert a == b == c
    assert r2r([CorunLatency.table([1, 4, 16], [16.8, 18.0, 21.6]), None]) == r2r([TABLE, None])


@pytest.mark.parametrize("corun", [
    [{"slowdown": 2.8}, None],
    [TABLE, {"slowdown": 1.04}],
    [None, None],
])
def test_json_round_trip(corun, tmp_path):
    from tr_core.spec import load_spec, save_spec
    s = r2r(corun, model_names=["small", "large"])
    d = json.loads(json.dumps(spec_to_dict(s)))
    assert d["corun_latency"] == [None if c is None else c for c in corun]
    assert spec_from_dict(d) == s
    save_spec(s, tmp_path / "s.json")
    assert load_spec(tmp_path / "s.json") == s


@pytest.mark.parametrize("bad, msg", [
    ([0.5, None], r"corun_latency\[0\].*>= 1"),
    ([float("nan"), None], r"corun_latency\[0\].*finite"),
    ([None], r"corun_latency must have M = 2"),
    ([None, None, None], r"corun_latency must have M = 2"),
    ([None, {"slowdown": "x"}], r"corun_latency\[1\]\.slowdown must be a number"),
    ([None, {"slowdown": 0.99}], r"corun_latency\[1\]\.slowdown must be >= 1"),
    ([None, {"slowdown": float("inf")}], r"corun_latency\[1\]\.slowdown must be finite"),
    ([None, {"slowdown": 2, "x": 1}], r"corun_latency\[1\]: unknown field"),
    ([{"batch_size": [1, 2], "step_latency_ms": [3.0]}, None], r"corun_latency\[0\]: .*equal length"),
    ([{"batch_size": [2, 1], "step_latency_ms": [3.0, 4.0]}, None], r"corun_latency\[0\]: .*increasing"),
    ([{"batch_size": [1], "step_latency_ms": [-3.0]}, None], r"corun_latency\[0\]"),
    ([{"batch_size": [1]}, None], r"corun_latency\[0\] is missing field 'step_latency_ms'"),
    ([{"foo": 1}, None], r"corun_latency\[0\] needs either 'slowdown'"),
    ([{"intercept_ms": 3.0}, None], r"corun_latency\[0\] needs either 'slowdown'"),
    ("ab", r"corun_latency must be a list"),
])
def test_bad_values_name_the_field(bad, msg):
    with pytest.raises(SpecError, match=msg):
        r2r(bad)


@pytest.mark.parametrize("bad, msg", [
    ([2.0, None], r"f\.json: corun_latency\[0\] must be null"),
    ({"a": 1}, r"f\.json: corun_latency must be a list"),
    ([True, None], r"f\.json: corun_latency\[0\] must be null"),
    ([{"slowdown": True}, None], r"f\.json: corun_latency\[0\]\.slowdown must be a number"),
    ([{"batch_size": [1, 2], "step_latency_ms": ["1", 2]}, None], r"corun_latency\[0\]\.step_latency_ms\[0\]"),
])
def test_bad_json_names_file_and_field(bad, msg):
    d = spec_to_dict(r2r())
    d["corun_latency"] = bad
    with pytest.raises(SpecError, match=msg):
        spec_from_dict(d, "f.json")


def test_off_grid_refused_or_rounded():
    s = r2r([1.23, None])  # 7.38 ms is not on the 0.1 ms grid
    s.quanta_table(3)  # the solo table is fine
    with pytest.raises(SpecError, match=r"corun_latency\[0\] = 7\.38 ms .*--round"):
        s.corun_quanta_table(3)
    dc, rnd = s.corun_quanta_table(3, round_to_grid=True)
    assert (dc[0] == 74).all() and len(rnd) == 1 and rnd[0]["corun"] and rnd[0]["model"] == 0
    assert math.isclose(rnd[0]["relative_error"], (7.4 - 7.38) / 7.38)
    t = r2r([{"batch_size": [1, 4], "step_latency_ms": [16.8, 17.0]}, None])
    with pytest.raises(SpecError, match=r"corun_latency\[0\] at batch size 2"):
        t.corun_quanta_table(4)


def test_below_solo_is_a_warning_not_an_error():
    s = r2r([{"batch_size": [1, 16], "step_latency_ms": [5.0, 21.6]}, None])
    w = s.corun_warnings()
    assert len(w) == 1 and "corun_latency[0]" in w[0] and "batch size(s) 1" in w[0]
    assert r2r([TABLE, {"slowdown": 1.0}]).corun_warnings() == []
    # against a batch-dependent solo curve, checked at its breakpoints too
    c = r2r([None, {"batch_size": [1, 16], "step_latency_ms": [30.0, 30.0]}],
            latency_curves=[None, {"batch_size": [1, 8], "step_latency_ms": [27.9, 35.0]}])
    w = c.corun_warnings()
    assert len(w) == 1 and "8" in w[0] and "corun_latency[1]" in w[0]


def test_delta_auto_sees_corun_latencies():
    s = r2r([1.23, None])
    assert any(math.isclose(x, 7.38) for x in spec_latencies(s, 4))


def test_cache_key_depends_on_corun():
    keys = {evaluation_key(r2r(c), 4, (1, 2), "auto", 1e-13, 10 ** 6, False)
            for c in (None, [None, None], [2.0, None], [2.5, None], [TABLE, None])}
    assert len(keys) == 5


def test_hash_and_equality():
    assert hash(r2r([2.0, None])) == hash(r2r([2.0, None]))
    assert r2r([2.0, None]) != r2r([2.0, 1.0])


def test_schema_accepts_and_rejects():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "data" / "schemas" / "spec.schema.json").read_text())
    v = jsonschema.Draft202012Validator(schema)
    good = spec_to_dict(r2r([TABLE, {"slowdown": 1.5}]))
    assert not list(v.iter_errors(good))
    for bad in ([{"slowdown": 0.5}, None], [{"slowdown": 2, "x": 1}, None], [2.0, None],
                [{"intercept_ms": 3.0}, None]):
        doc = dict(good, corun_latency=bad)
        assert list(v.iter_errors(doc)), bad
        with pytest.raises(SpecError):
            spec_from_dict(doc)


def test_general_spec_corun():
    s = make_spec([4.0, 9.0, 20.0], [[0.5, 0.3, 0.2]] * 3, [[1, 1, 1]] * 3,
                  corun_latency=[None, {"slowdown": 3.0}, {"batch_size": [1, 2], "step_latency_ms": [21.0, 22.0]}])
    dc, _ = s.corun_quanta_table(3)
    assert list(dc[:, 3]) == [40, 270, 220] and list(dc[:, 1]) == [40, 270, 210]
