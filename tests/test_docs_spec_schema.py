"""data/schemas/spec.schema.json accepts what the spec writer and the examples produce, and rejects what the reader rejects."""

import copy
import json
import re
from pathlib import Path

import pytest

import tr_model
from tr_core.errors import SpecError

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is a test extra")

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "data" / "schemas" / "spec.schema.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
EXAMPLES = sorted((ROOT / "data" / "examples").glob("spec-*.json"))


def _valid(doc) -> bool:
    return not list(VALIDATOR.iter_errors(doc))


def test_schema_is_valid_draft_2020_12():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("spec", [
    tr_model.preset("r2r", [6.0, 27.9], p=0.35),
    tr_model.preset("citer", [6.0, 27.9], p=0.2),
    tr_model.preset("co-llm", [6.0, 27.9], p=0.1),
    tr_model.preset("r-stitch", [6.0, 28.0], p=0.2, q=0.5),
    tr_model.preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2]),
    tr_model.make_spec([5.0, 20.0], [[0.9, 0.1], [0.5, 0.5]], [[1, 0.5], [1, 1]], delta_ms=0.5,
                       model_names=["a", "b"], latency_curves=[{"intercept_ms": 4.0, "per_request_ms": 1.0}, None],
                       max_batch_size=[None, 8], provenance={"x": [1, 2]}),
], ids=["r2r", "citer", "co-llm", "r-stitch", "me", "curves-caps"])
def test_writer_output_validates(spec):
    doc = json.loads(json.dumps(tr_model.spec_to_dict(spec)))
    VALIDATOR.validate(doc)


def test_profiler_built_spec_validates():
    from profiler.latency import load_latency_profile
    from profiler.routing import estimate_routing
    from profiler.system import build_system_spec

    ex = ROOT / "data" / "examples"
    est = estimate_routing(ex / "routing-trace.jsonl")
    spec = build_system_spec(est, profiles=[load_latency_profile(ex / "latency-small.json"),
                                            load_latency_profile(ex / "latency-large.json")])
    VALIDATOR.validate(json.loads(json.dumps(tr_model.spec_to_dict(spec))))


def test_example_files_validate_load_and_round_trip():
    assert len(EXAMPLES) >= 2
    for path in EXAMPLES:
        doc = json.loads(path.read_text())
        VALIDATOR.validate(doc)
        assert tr_model.spec_to_dict(tr_model.load_spec(path)) == doc


def _doc_examples():
    text = (ROOT / "docs" / "formats.md").read_text()
    return [json.loads(m) for m in re.findall(r"<!-- example: spec -->\s*```json\n(.*?)```", text, re.S)]


def test_examples_in_formats_md_validate_and_match_the_files():
    docs = _doc_examples()
    assert len(docs) >= 2
    files = [json.loads(p.read_text()) for p in EXAMPLES]
    for d in docs:
        VALIDATOR.validate(d)
        tr_model.spec_from_dict(d)
        assert d in files, "an example in docs/formats.md differs from its file in data/examples/"


BASE = {"schema_version": 1, "name": "x", "step_latency_ms": [6.0, 27.9],
        "routing_matrix": [[0.65, 0.35], [1.0, 0.0]], "committed_tokens": [[1.0, 0.0], [1.0, 0.0]],
        "delta_ms": 0.1}


def _edit(path, value):
    d = copy.deepcopy(BASE)
    node = d
    for k in path[:-1]:
        node = node[k]
    if value is KeyError:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return d


@pytest.mark.parametrize("doc", [
    _edit(["colour"], "red"),                              # unknown field
    _edit(["step_latency_ms"], KeyError),                  # missing field
    _edit(["step_latency_ms", 0], -1.0),                   # L <= 0
    _edit(["step_latency_ms", 0], 0.0),
    _edit(["routing_matrix", 0, 1], 1.5),                  # probability > 1
    _edit(["routing_matrix", 0, 0], -0.1),                 # probability < 0
    _edit(["committed_tokens", 1, 0], -1.0),               # negative C
    _edit(["delta_ms"], 0.0),
    _edit(["schema_version"], 2),
    _edit(["max_batch_size"], [None, 0]),                  # cap < 1
    _edit(["latency_curves"], [None, {"kind": "cubic"}]),  # neither table nor affine
    _edit(["latency_curves"], [None, {"batch_size": [1, 2], "step_latency_ms": [27.9, -1.0]}]),
    _edit(["step_latency_ms"], [6.0]),                     # M < 2
], ids=lambda d: json.dumps(d)[:60])
def test_reader_and_schema_both_reject(doc):
    # where the reader rejects a document the schema must too (the schema is documentation users validate with)
    with pytest.raises(SpecError):
        tr_model.spec_from_dict(doc)
    assert not _valid(doc)


def test_base_document_is_accepted_by_both():
    assert _valid(BASE)
    tr_model.spec_from_dict(BASE)
