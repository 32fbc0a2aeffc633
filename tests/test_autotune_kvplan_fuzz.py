"""Placements and config.json files: every field checked for type, finiteness and range; fuzzed.

The property, for any file: ``load_placement`` + ``plan_kv_cache`` either give a plan or raise one
``SpecError`` whose single line names the file and, for a bad field, the field, never another exception.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tr_core.errors import SpecError
from tr_model.tuning.kvplan import load_placement, make_placement, plan_kv_cache, read_model_footprint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "data", "models")
SMALL_CFG = json.load(open(os.path.join(MODELS, "Qwen3-0.6B", "config.json")))
LARGE_CFG = json.load(open(os.path.join(MODELS, "Qwen3-32B", "config.json")))
PLACEMENT = {"schema_version": 1, "name": "two", "gpu_memory_gib": 80, "memory_budget_fraction": 0.9,
             "reserved_gib_per_model_gpu": 0, "page_size_tokens": 1,
             "models": [{"name": "small", "config": "small.json", "gpus": [0], "tensor_parallel": 1},
                        {"name": "large", "config": "large.json", "gpus": [0, 1], "tensor_parallel": 2}]}
FUZZ = settings(max_examples=120, deadline=None, database=None,  # no .hypothesis folder in the tree
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _setup(tmp_path, placement=None, small=None, large=None):
    (tmp_path / "small.json").write_text(json.dumps(SMALL_CFG if small is None else small))
    (tmp_path / "large.json").write_text(json.dumps(LARGE_CFG if large is None else large))
    p = tmp_path / "placement.json"
    p.write_text(json.dumps(PLACEMENT if placement is None else placement))
    return p


def _plan_or_error(path):
    try:
        return plan_kv_cache(load_placement(path))
    except SpecError as e:
        msg = str(e)
        assert "\n" not in msg and len(msg) < 700, msg
        assert "placement file" in msg or "config.json" in msg or "placement cannot" in msg \
            or "placement leaves" in msg, msg
        return None


def test_the_reference_placement_plans(tmp_path):
    plan = _plan_or_error(_setup(tmp_path))
    assert plan is not None and plan.kv_token_capacity == 176_409      # the paper's layout (test_autotune_kvplan)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(gpu_memory_gib="80"), "gpu_memory_gib must be a finite number"),
    (lambda d: d.update(gpu_memory_gib=True), "gpu_memory_gib must be a finite number"),
    (lambda d: d.update(gpu_memory_gib=10 ** 400), "gpu_memory_gib must be a finite number"),
    (lambda d: d.update(gpu_memory_gib=[80, "80"]), r"gpu_memory_gib\[1\] must be"),
    (lambda d: d.update(gpu_memory_gib=[]), "gpu_memory_gib must list"),
    (lambda d: d.update(memory_budget_fraction="0.9"), "memory_budget_fraction must be"),
    (lambda d: d.update(memory_budget_fraction=0), "memory_budget_fraction must be"),
    (lambda d: d.update(reserved_gib_per_model_gpu=-1), "reserved_gib_per_model_gpu must be"),
    (lambda d: d.update(page_size_tokens=1.0), "page_size_tokens must be an integer"),
    (lambda d: d.update(page_size_tokens=2 ** 70), "page_size_tokens must be an integer"),
    (lambda d: d.update(schema_version=True), "schema_version"),
    (lambda d: d.update(name=["x"]), "name must be a non-empty string"),
    (lambda d: d.update(modles=[]), "unknown field 'modles'"),
    (lambda d: d.update(models="small"), "'models' must be a non-empty list"),
    (lambda d: d["models"][0].update(gpus="0"), r"models\[0\].gpus must be a non-empty list"),
    (lambda d: d["models"][1].update(gpus=[0, "1"]), r"models\[1\].gpus\[1\] must be an integer"),
    (lambda d: d["models"][1].update(gpus=[0, 1.0]), r"models\[1\].gpus\[1\] must be an integer"),
    (lambda d: d["models"][1].update(gpus=[0, 2 ** 64]), r"models\[1\].gpus\[1\] must be an integer"),
    (lambda d: d["models"][1].update(tensor_parallel="2"), r"models\[1\].tensor_parallel must be"),
    (lambda d: d["models"][0].update(config=7), r"models\[0\].config must be a non-empty string"),
    (lambda d: d["models"][0].update(config="a\0b"), r"models\[0\].config must be a non-empty string"),
    (lambda d: d["models"][0].update(kv_cache_dtype=8), r"models\[0\].kv_cache_dtype must be"),
    (lambda d: d["models"][0].update(kv_cache_dtype="fp7"), r"models\[0\].kv_cache_dtype: unknown dtype"),
    (lambda d: d["models"][0].update(num_parameters="6e8"), r"models\[0\].num_parameters must be an integer"),
    (lambda d: d["models"][0].update(tensorparallel=1), r"models\[0\] has an unknown field 'tensorparallel'"),
    (lambda d: d["models"][1].update(tensor_parallel=3), "placement file .*gpus has 2 entries but tensor_parallel"),
])
def test_bad_placement_fields_are_named(tmp_path, mutate, field):
    d = copy.deepcopy(PLACEMENT)
    mutate(d)
    with pytest.raises(SpecError, match=field) as info:
        plan_kv_cache(load_placement(_setup(tmp_path, d)))
    assert "placement file" in str(info.value) and "placement.json" in str(info.value)


@pytest.mark.parametrize("key, value, match", [
    ("num_hidden_layers", "28", "field 'num_hidden_layers' must be an integer"),
    ("num_hidden_layers", 28.0, "field 'num_hidden_layers' must be an integer"),
    ("hidden_size", 10 ** 30, "field 'hidden_size' must be an integer"),
    ("torch_dtype", 16, "dtype must be a string"),
    ("torch_dtype", "float13", "unknown dtype"),
    ("tie_word_embeddings", "yes", "field 'tie_word_embeddings' must be a boolean"),
    ("num_parameters", 1e9, "num_parameters' must be an integer"),
    ("head_dim", None, None),
])
def test_bad_config_fields_are_named(tmp_path, key, value, match):
    cfg = dict(SMALL_CFG, **{key: value})
    if match is None:                      # head_dim null: derived from hidden / heads, still plans
        assert _plan_or_error(_setup(tmp_path, small=cfg)) is not None
        return
    with pytest.raises(SpecError, match=match) as info:
        load_placement(_setup(tmp_path, small=cfg))
    assert "small.json" in str(info.value)


def test_degenerate_config_is_refused_not_divided_by_zero(tmp_path):
    cfg = dict(SMALL_CFG, hidden_size=8, num_attention_heads=16, num_key_value_heads=8)
    cfg.pop("head_dim", None)
    with pytest.raises(SpecError, match="smaller than num_attention_heads"):
        load_placement(_setup(tmp_path, small=cfg))


@pytest.mark.parametrize("content, match", [
    (b"", "not valid JSON"),
    (b"[" * 100_000, "nested too deeply|not valid JSON"),
    (b'{"gpu_memory_gib": NaN}', "invalid number"),
    (b'{"gpu_memory_gib": 1e400}', "invalid number"),
    (b'{"gpu_memory_gib": ' + b"9" * 5000 + b"}", "invalid number"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_hostile_placement_files(tmp_path, content, match):
    p = _setup(tmp_path)
    p.write_bytes(content)
    with pytest.raises(SpecError, match=match):
        load_placement(p)
    with pytest.raises(SpecError, match="is a folder"):
        load_placement(tmp_path)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="not a regular file"):
        load_placement(fifo)                                   # would block if opened


def test_api_refuses_strings_where_numbers_belong():
    small = read_model_footprint(config=SMALL_CFG, name="small")
    with pytest.raises(SpecError, match="gpu_memory_gib must be a finite number"):
        make_placement([(small, [0], 1)], "80")
    with pytest.raises(SpecError, match="memory_budget_fraction must be"):
        make_placement([(small, [0], 1)], 80.0, "0.9")
    with pytest.raises(SpecError, match=r"gpus\[0\] must be an integer"):
        make_placement([(small, ["0"], 1)], 80.0)


_LEAF = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 20), max_value=10 ** 20),
                  st.sampled_from([0, 1, 2, -1, 10 ** 400, 2 ** 64, 0.5, 1e308, 80, 0.9]),
                  st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=6))
_JSON = st.recursive(_LEAF, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                     max_leaves=8)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _mutated(doc, replacements):
    d = copy.deepcopy(doc)
    for path, value, delete in replacements:
        node = d
        try:
            for key in path[:-1]:
                node = node[key]
            if delete and isinstance(node, dict):
                node.pop(path[-1], None)
            else:
                node[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            pass
    return d


_P_PATHS = [p for p in _paths(PLACEMENT) if p and p[-1] != "config"]
_C_KEYS = sorted(k for k, v in SMALL_CFG.items() if not isinstance(v, (dict, list)))


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(_P_PATHS), _JSON, st.booleans()), min_size=1, max_size=3))
def test_fuzz_placement_fields(tmp_path, replacements):
    _plan_or_error(_setup(tmp_path, _mutated(PLACEMENT, replacements)))


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(_C_KEYS), _JSON, st.booleans()), min_size=1, max_size=3))
def test_fuzz_config_fields(tmp_path, replacements):
    cfg = _mutated(SMALL_CFG, [((k,), v, dlt) for k, v, dlt in replacements])
    _plan_or_error(_setup(tmp_path, small=cfg))


@FUZZ
@given(st.binary(max_size=300), st.booleans())
def test_fuzz_random_bytes(tmp_path, data, as_config):
    p = _setup(tmp_path)
    (tmp_path / "small.json" if as_config else p).write_bytes(data)
    _plan_or_error(p)


@FUZZ
@given(st.integers(min_value=0, max_value=10 ** 6))
def test_fuzz_truncated_placement(tmp_path, cut):
    p = _setup(tmp_path)
    text = p.read_bytes()
    p.write_bytes(text[:cut % len(text)])
    with pytest.raises(SpecError):
        load_placement(p)


def test_cli_bad_placements_one_error_line(tmp_path):
    for mutate in (lambda d: d.update(gpu_memory_gib="80"), lambda d: d["models"][1].update(gpus=[0, "1"])):
        d = copy.deepcopy(PLACEMENT)
        mutate(d)
        p = _setup(tmp_path, d)
        r = subprocess.run([sys.executable, "-m", "tr_model.autotune_cli", "kv-plan", "--placement", str(p)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.startswith("error: placement file")
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    (tmp_path / "placement.json").write_bytes(b"[" * 100_000)
    r = subprocess.run([sys.executable, "-m", "tr_model.autotune_cli", "kv-plan", "--placement",
                        str(tmp_path / "placement.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
