"""Files say only what their reader checks: a fresh set of bad or odd input files, one per case.

Every file kind the tools read (system spec, ``--L-table`` / ``--corun-L-table``, latency profile, thresholds
file versions 1-3, placement, a model's ``config.json`` and a GPU file for ``tr-plan``, routing trace, R2R
per-token records) gets files with the defects a reader could let through without a word: an unknown key, a
key given twice, a value of the wrong JSON type (a number written as a string, ``true`` for a number), a model
count that disagrees between fields, and rows that cannot be right (a routing row not summing to 1, a
negative count).  Each is refused by its command with exit 2 and exactly one ``error:`` line (the last line
on stderr, only ``note:`` / ``warning:`` lines besides) naming the file or flag and the key or line, and no
traceback.  Odd but valid inputs (a degenerate system: a model no request reaches, a model that keeps every
request, zero commits, a comment key) get exit 0 and a ``note:`` saying what the answer means; in JSON output
the same words stand in ``notes``, so a ``null`` is never left unexplained.

The cases differ from tests/test_input_contract.py, tests/test_input_contract_heldout.py and
tests/test_spec_hardening.py (other keys, other fields, other file kinds).  The commands run in-process, in a
temporary working folder holding only the files the case writes.
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import pytest

from conftest import ROOT
from test_input_contract import alarm

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

EXAMPLES = os.path.join(ROOT, "data", "examples")
QWEN_SMALL = os.path.join(ROOT, "data", "models", "Qwen3-0.6B", "config.json")
GPU_H200 = os.path.join(ROOT, "data", "gpus", "h200.json")

SPEC = {"schema_version": 1, "step_latency_ms": [6.0, 27.9], "routing_matrix": [[0.65, 0.35], [1.0, 0.0]],
        "committed_tokens": [[1, 0], [1, 0]]}
OPT = ["tr-optimize", "--N", "2", "--no-cache"]
SYS = ["--p", "0.35", "--L", "6", "27.9"]


def _spec(**kw):
    d = copy.deepcopy(SPEC)
    for k, v in kw.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    return json.dumps(d)


def _jsonl(*rows) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def _trace(n_requests: int = 6, route=(0, 1, 0, 0)) -> list[dict]:
    """A valid routing trace: every request walks ``route`` (model per step), the last step ends it."""
    rows = []
    for r in range(n_requests):
        for s, m in enumerate(route):
            nxt = route[s + 1] if s + 1 < len(route) else -1
            rows.append({"request_id": r, "step": s, "model": m, "next_model": nxt,
                         "committed_tokens": 1 if m == 0 else 0})
    return rows


def _trace_with(i: int, **kw) -> str:
    rows = _trace()
    rows[i] = {**rows[i], **kw}
    return _jsonl(*rows)


def _r2r_rows(n_requests: int = 3, sources=("quick", "quick", "reference", "quick", "quick")) -> list[dict]:
    out = []
    for r in range(n_requests):
        for pos, src in enumerate(sources):
            out.append({"token_id": 100 + pos, "token_str": f" t{pos}", "source_model": src, "position": pos,
                        "param_size": 0.6 if src == "quick" else 32.0, "batch_id": 0, "request_id": f"req-{r}"})
    return out


def _r2r_with(i: int, **kw) -> str:
    rows = _r2r_rows()
    rows[i] = {**rows[i], **kw}
    return _jsonl(*rows)


def _r2r_csv(rows) -> str:
    cols = ["token_id", "token_str", "source_model", "position", "param_size", "batch_id", "request_id"]
    lines = ["," + ",".join(cols)]
    for k, r in enumerate(rows):
        lines.append(f"{k}," + ",".join(str(r[c]) for c in cols))
    return "\n".join(lines) + "\n"


def _profile(name: str, edit=None) -> str:
    with open(os.path.join(EXAMPLES, f"latency-{name}.json")) as f:
        d = json.load(f)
    if edit is not None:
        edit(d)
    return json.dumps(d)


def _placement(edit=None, model_edit=None) -> str:
    d = {"schema_version": 1, "name": "one model", "gpu_memory_gib": 80, "memory_budget_fraction": 0.9,
         "models": [{"name": "small", "config": "config.json", "gpus": [0], "tensor_parallel": 1}]}
    if model_edit is not None:
        model_edit(d["models"][0])
    if edit is not None:
        edit(d)
    return json.dumps(d)


def _gpu(edit=None) -> str:
    with open(GPU_H200) as f:
        d = json.load(f)
    if edit is not None:
        edit(d)
    return json.dumps(d)


def _config(edit=None) -> str:
    with open(QWEN_SMALL) as f:
        d = json.load(f)
    if edit is not None:
        edit(d)
    return json.dumps(d)


def _set(**kw):
    return lambda d: d.update(kw)


def _set_batch(i, **kw):
    return lambda d: d["batches"][i].update(kw)


TRACE_OK = _jsonl(*_trace())
SYSTEM_PROFILE = ["tr-profile", "system", "--latency-profile", "small.json", "large.json", "--trace", "t.jsonl"]
PLAN = ["tr-plan", "--model", "config.json", "--model", "config.json", "--gpus", "2", "--N", "1", "2", "--p", "0.35"]
KV = ["tr-autotune", "kv-plan", "--placement", "placement.json"]


# id -> (files {name: text, or a function of the thresholds fixture}, argv, needles the error line must hold)
REFUSED = {
    # ---- system spec (tr-optimize --spec)
    "spec: misspelt top-level key": ({"s.json": _spec(routing_matrx=[[1.0, 0.0], [1.0, 0.0]])},
                                     OPT + ["--spec", "s.json"], ["s.json", "routing_matrx"]),
    "spec: delta_ms given twice": ({"s.json": _spec()[:-1] + ', "delta_ms": 0.1, "delta_ms": 0.05}'},
                                   OPT + ["--spec", "s.json"], ["s.json", "delta_ms"]),
    "spec: duplicate key inside a latency curve": (
        {"s.json": _spec()[:-1] + ', "latency_curves": [null, {"intercept_ms": 27.0, "per_request_ms": 0.1, '
                                  '"per_request_ms": 0.2}]}'}, OPT + ["--spec", "s.json"], ["s.json", "per_request_ms"]),
    "spec: M says 3, the lists hold 2": ({"s.json": _spec(M=3)}, OPT + ["--spec", "s.json"], ["s.json", "M"]),
    "spec: three latencies, a 2x2 matrix": ({"s.json": _spec(step_latency_ms=[6.0, 27.9, 10.0])},
                                            OPT + ["--spec", "s.json"], ["s.json", "routing_matrix"]),
    "spec: model_names for three models": ({"s.json": _spec(model_names=["a", "b", "c"])},
                                           OPT + ["--spec", "s.json"], ["s.json", "model_names"]),
    "spec: a ragged routing row": ({"s.json": _spec(routing_matrix=[[0.65, 0.35], [1.0]])},
                                   OPT + ["--spec", "s.json"], ["s.json", "routing_matrix[1]"]),
    "spec: a negative probability that sums to 1": ({"s.json": _spec(routing_matrix=[[1.2, -0.2], [1.0, 0.0]])},
                                                    OPT + ["--spec", "s.json"], ["s.json", "routing_matrix[0][0] = 1.2"]),
    "spec: a routing row short of 1 by 1e-6": ({"s.json": _spec(routing_matrix=[[0.65, 0.35], [0.999999, 0.0]])},
                                               OPT + ["--spec", "s.json"], ["s.json", "row 1"]),
    "spec: committed tokens a boolean": ({"s.json": _spec(committed_tokens=[[1, 0], [True, 0]])},
                                         OPT + ["--spec", "s.json"], ["s.json", "committed_tokens[1][0]"]),
    "spec: schema_version a string": ({"s.json": _spec(schema_version="1")}, OPT + ["--spec", "s.json"],
                                      ["s.json", "schema_version"]),
    "spec: max_batch_size zero": ({"s.json": _spec(max_batch_size=[0, None])}, OPT + ["--spec", "s.json"],
                                  ["s.json", "max_batch_size[0]"]),
    "spec: a single model": ({"s.json": _spec(step_latency_ms=[6.0], routing_matrix=[[1.0]],
                                              committed_tokens=[[1]])}, OPT + ["--spec", "s.json"],
                             ["s.json", "at least 2 models"]),
    "spec: a comment key (free text goes in provenance)": ({"s.json": _spec(comment="from the paper")},
                                                           OPT + ["--spec", "s.json"], ["s.json", "comment", "provenance"]),
    "spec: a model other than the entry keeps every request": (
        {"s.json": _spec(routing_matrix=[[0.5, 0.5], [0.0, 1.0]], committed_tokens=[[1, 0], [1, 1]])},
        OPT + ["--spec", "s.json"], ["closed classes"]),
    "spec: routing_matrix missing": ({"s.json": _spec(routing_matrix=None)}, OPT + ["--spec", "s.json"],
                                     ["s.json", "routing_matrix"]),
    # ---- --L-table and --corun-L-table
    "L-table: three curves for two models": ({"L.json": json.dumps([None, None, None])},
                                             ["tr-optimize", "--p", "0.35", "--L-table", "L.json", "--N", "2"],
                                             ["L.json", "M = 2"]),
    "L-table: a key given twice": ({"L.json": '[null, {"intercept_ms": 27.9, "intercept_ms": 20.0, '
                                              '"per_request_ms": 0.1}]'},
                                   ["tr-optimize", "--p", "0.35", "--L-table", "L.json", "--N", "2"],
                                   ["L.json", "intercept_ms"]),
    "L-table CSV: NaN latency": ({"L.csv": "model,batch_size,step_latency_ms\n0,1,6.0\n1,1,nan\n"},
                                ["tr-optimize", "--p", "0.35", "--L-table", "L.csv", "--N", "2"],
                                ["L.csv", "line 3"]),
    "L-table CSV: model 1.5": ({"L.csv": "model,batch_size,step_latency_ms\n0,1,6.0\n1.5,1,27.9\n"},
                               ["tr-optimize", "--p", "0.35", "--L-table", "L.csv", "--N", "2"],
                               ["L.csv", "line 3"]),
    "L-table CSV: an unknown column": ({"L.csv": "model,batch_size,step_latency_ms,ms_p90\n0,1,6.0,7\n1,1,27.9,30\n"},
                                       ["tr-optimize", "--p", "0.35", "--L-table", "L.csv", "--N", "2"],
                                       ["L.csv", "ms_p90"]),
    "L-table CSV: the same batch size twice": (
        {"L.csv": "model,batch_size,step_latency_ms\n0,1,6.0\n1,1,27.9\n1,1,28.1\n"},
        ["tr-optimize", "--p", "0.35", "--L-table", "L.csv", "--N", "2"], ["L.csv", "batch"]),
    "L-table CSV: a column twice": ({"L.csv": "model,batch_size,step_latency_ms,step_latency_ms\n0,1,6.0,6.0\n"
                                              "1,1,27.9,28.0\n"},
                                    ["tr-optimize", "--p", "0.35", "--L-table", "L.csv", "--N", "2"],
                                    ["L.csv", "step_latency_ms", "twice"]),
    "corun-L-table CSV: a row with an extra field": ({"co.csv": "model,batch_size,step_latency_ms\n1,1,55.8,9\n"},
                                                     OPT + SYS + ["--corun-L-table", "co.csv"], ["co.csv", "line 2"]),
    "corun-L-table: slowdown a string": ({"co.json": json.dumps([None, {"slowdown": "1.3"}])},
                                         OPT + SYS + ["--corun-L-table", "co.json"], ["co.json", "slowdown"]),
    "corun-L-table: unknown key in an entry": ({"co.json": json.dumps([None, {"slowdown": 2.0, "scale": 2}])},
                                               OPT + SYS + ["--corun-L-table", "co.json"], ["co.json", "scale"]),
    # ---- latency profile (tr-profile system --latency-profile)
    "profile: median_ms a string": ({"small.json": _profile("small", _set_batch(1, median_ms="0.82")),
                                     "large.json": _profile("large"), "t.jsonl": TRACE_OK}, SYSTEM_PROFILE,
                                    ["small.json", "median_ms"]),
    "profile: batch_size true": ({"small.json": _profile("small"),
                                  "large.json": _profile("large", _set_batch(0, batch_size=True)),
                                  "t.jsonl": TRACE_OK}, SYSTEM_PROFILE, ["large.json", "batch_size"]),
    "profile: a negative count": ({"small.json": _profile("small", _set_batch(2, count=-30)),
                                   "large.json": _profile("large"), "t.jsonl": TRACE_OK}, SYSTEM_PROFILE,
                                  ["small.json", "count"]),
    "profile: an unknown top-level key": ({"small.json": _profile("small", _set(median_scale=2.0)),
                                           "large.json": _profile("large"), "t.jsonl": TRACE_OK}, SYSTEM_PROFILE,
                                          ["small.json", "median_scale"]),
    "profile: kind names another document": ({"small.json": _profile("small", _set(kind="gpu")),
                                              "large.json": _profile("large"), "t.jsonl": TRACE_OK}, SYSTEM_PROFILE,
                                             ["small.json", "kind"]),
    "profile: a key given twice": ({"small.json": _profile("small")[:-1] + ', "timed_steps": 31}',
                                    "large.json": _profile("large"), "t.jsonl": TRACE_OK}, SYSTEM_PROFILE,
                                   ["small.json", "timed_steps"]),
    "profile: batch sizes repeated": ({"small.json": _profile("small", _set_batch(1, batch_size=1)),
                                       "large.json": _profile("large"), "t.jsonl": TRACE_OK}, SYSTEM_PROFILE,
                                      ["small.json", "batch"]),
    "profile: three profiles, two models in the trace": (
        {"small.json": _profile("small"), "large.json": _profile("large"), "t.jsonl": TRACE_OK,
         "x.json": _profile("large")}, SYSTEM_PROFILE[:4] + ["x.json"] + SYSTEM_PROFILE[4:], ["t.jsonl", "model(s) 2"]),
    # ---- thresholds file (tr-autotune show), versions 1-3
    "thresholds v2: max_concurrency given twice": (
        {"th.json": lambda T: json.dumps(T["v2"])[:-1] + ', "max_concurrency": 9}'}, ["tr-autotune", "show", "th.json"],
        ["th.json", "max_concurrency"]),
    "thresholds v2: an unknown top-level key": (
        {"th.json": lambda T: json.dumps({**T["v2"], "max_concurency": 3})}, ["tr-autotune", "show", "th.json"],
        ["th.json", "max_concurency"]),
    "thresholds v2: a threshold written as a string": (
        {"th.json": lambda T: _edit_th(T["v2"], lambda d: d["entries"][1].update(thresholds=[1, "2"]))},
        ["tr-autotune", "show", "th.json"], ["th.json", "entries[1]"]),
    "thresholds v2: active_requests true": (
        {"th.json": lambda T: _edit_th(T["v2"], lambda d: d["entries"][0].update(active_requests=True))},
        ["tr-autotune", "show", "th.json"], ["th.json", "active_requests"]),
    "thresholds v2: num_models 3, rows of 2": (
        {"th.json": lambda T: _edit_th(T["v2"], lambda d: d.update(num_models=3))},
        ["tr-autotune", "show", "th.json"], ["th.json", "num_models"]),
    "thresholds v2: a fallback for three models": (
        {"th.json": lambda T: _edit_th(T["v2"], lambda d: d.update(fallback_thresholds=[1, 1, 1]))},
        ["tr-autotune", "show", "th.json"], ["th.json", "fallback_thresholds"]),
    "thresholds v1: a negative threshold": (
        {"th.json": lambda T: _edit_th(T["v1"], lambda d: d["entries"][2].update(thresholds=[1, -1]))},
        ["tr-autotune", "show", "th.json"], ["th.json", "entries[2]"]),
    "thresholds v1: an unknown key in a row": (
        {"th.json": lambda T: _edit_th(T["v1"], lambda d: d["entries"][0].update(tresholds=[1, 1]))},
        ["tr-autotune", "show", "th.json"], ["th.json", "tresholds"]),
    "thresholds v3: policy thresholds for one model": (
        {"th.json": lambda T: _edit_th(T["v3"], lambda d: d["entries"][0].update(
            policy_thresholds=d["entries"][0]["policy_thresholds"][:1]))},
        ["tr-autotune", "show", "th.json"], ["th.json", "policy_thresholds"]),
    "thresholds v3: an unknown policy key": (
        {"th.json": lambda T: _edit_th(T["v3"], lambda d: d["policy"].update(colums=["x"]))},
        ["tr-autotune", "show", "th.json"], ["th.json", "colums"]),
    # ---- placement (tr-autotune kv-plan --placement)
    "placement: a key given twice": ({"config.json": _config(),
                                      "placement.json": _placement()[:-1] + ', "gpu_memory_gib": 40}'},
                                     KV, ["placement.json", "gpu_memory_gib"]),
    "placement: GPU index a string": ({"config.json": _config(),
                                       "placement.json": _placement(model_edit=_set(gpus=["0"]))},
                                      KV, ["placement.json", "models[0].gpus[0]"]),
    "placement: tensor_parallel true": ({"config.json": _config(),
                                         "placement.json": _placement(model_edit=_set(tensor_parallel=True))},
                                        KV, ["placement.json", "tensor_parallel"]),
    "placement: tensor_parallel 2 on one GPU": ({"config.json": _config(),
                                                 "placement.json": _placement(model_edit=_set(tensor_parallel=2))},
                                                KV, ["placement.json", "tensor_parallel"]),
    "placement: an unknown key in a model": ({"config.json": _config(),
                                              "placement.json": _placement(model_edit=_set(gpu=[0]))},
                                             KV, ["placement.json", "gpu"]),
    "placement: one GPU's memory listed, two GPUs used": (
        {"config.json": _config(), "placement.json": _placement(_set(gpu_memory_gib=[80]),
                                                                _set(gpus=[0, 1], tensor_parallel=2))},
        KV, ["placement.json", "gpu_memory_gib"]),
    "placement: budget fraction 1.5": ({"config.json": _config(),
                                        "placement.json": _placement(_set(memory_budget_fraction=1.5))},
                                       KV, ["placement.json", "memory_budget_fraction"]),
    "placement: a config.json with a key given twice": (
        {"config.json": _config()[:-1] + ', "num_hidden_layers": 2}', "placement.json": _placement()},
        KV, ["config.json", "num_hidden_layers"]),
    # ---- tr-plan's GPU file and config.json
    "plan --gpu: a key given twice": ({"config.json": _config(), "gpu.json": _gpu()[:-1] + ', "memory_gib": 80.0}'},
                                      PLAN + ["--gpu", "gpu.json"], ["gpu.json", "memory_gib"]),
    "plan --gpu: an unknown key": ({"config.json": _config(), "gpu.json": _gpu(_set(memory_gb=141))},
                                   PLAN + ["--gpu", "gpu.json"], ["gpu.json", "memory_gb"]),
    "plan --gpu: bandwidth a string": ({"config.json": _config(),
                                        "gpu.json": _gpu(_set(memory_bandwidth_bytes_per_s="4.8e12"))},
                                       PLAN + ["--gpu", "gpu.json"], ["gpu.json", "memory_bandwidth_bytes_per_s"]),
    "plan --gpu: kind is not gpu": ({"config.json": _config(), "gpu.json": _gpu(_set(kind="latency_profile"))},
                                    PLAN + ["--gpu", "gpu.json"], ["gpu.json", "kind"]),
    "plan --model: layers true": ({"config.json": _config(_set(num_hidden_layers=True))},
                                  PLAN + ["--gpu", "h200"], ["config.json", "num_hidden_layers"]),
    # ---- routing trace (tr-profile routing --trace)
    "trace: committed_tokens given twice": (
        {"t.jsonl": _jsonl(*_trace()[:3], '{"request_id": 0, "step": 3, "model": 0, "next_model": -1, '
                                          '"committed_tokens": 1, "committed_tokens": 2}', *_trace()[4:])},
        ["tr-profile", "routing", "--trace", "t.jsonl"], ["t.jsonl:4", "committed_tokens", "twice"]),
    "trace: a negative count": ({"t.jsonl": _trace_with(5, committed_tokens=-1)},
                                ["tr-profile", "routing", "--trace", "t.jsonl"], ["t.jsonl:6", "committed_tokens", "-1"]),
    "trace: step a string": ({"t.jsonl": _trace_with(2, step="2")}, ["tr-profile", "routing", "--trace", "t.jsonl"],
                             ["t.jsonl:3", "'step'", "integer"]),
    "trace: next_model true": ({"t.jsonl": _trace_with(0, next_model=True)},
                               ["tr-profile", "routing", "--trace", "t.jsonl"], ["t.jsonl:1", "'next_model'", "integer"]),
    "trace: a model beyond --models": ({"t.jsonl": _jsonl(*_trace(route=(0, 2, 0)))},
                                       ["tr-profile", "routing", "--trace", "t.jsonl", "--models", "2"],
                                       ["t.jsonl:1", "next_model 2"]),
    "trace: a step on a model it was not routed to": ({"t.jsonl": _trace_with(1, model=0)},
                                                      ["tr-profile", "routing", "--trace", "t.jsonl"],
                                                      ["t.jsonl:2", "next_model"]),
    "trace: a nested extra key": ({"t.jsonl": _trace_with(3, meta={"score": 0.5})},
                                  ["tr-profile", "routing", "--trace", "t.jsonl"], ["t.jsonl:4", "meta", "scalar"]),
    "trace: request ids of two types": ({"t.jsonl": _jsonl(*_trace(2), *[{**r, "request_id": "x"} for r in _trace(1)])},
                                        ["tr-profile", "routing", "--trace", "t.jsonl"], ["t.jsonl", "request_id"]),
    # ---- R2R per-token records (tr-profile routing --trace-format r2r)
    "r2r: position a string": ({"r.jsonl": _r2r_with(2, position="2")},
                               ["tr-profile", "routing", "--trace-format", "r2r", "--trace", "r.jsonl"],
                               ["r.jsonl", "position"]),
    "r2r: an unknown source model": ({"r.jsonl": _r2r_with(3, source_model="medium")},
                                     ["tr-profile", "routing", "--trace-format", "r2r", "--trace", "r.jsonl"],
                                     ["r.jsonl", "medium"]),
    "r2r: source_model given twice": (
        {"r.jsonl": _jsonl(*_r2r_rows()[:1], '{"source_model": "quick", "position": 1, "request_id": "req-0", '
                                             '"source_model": "reference"}', *_r2r_rows()[2:])},
        ["tr-profile", "routing", "--trace-format", "r2r", "--trace", "r.jsonl"], ["r.jsonl", "source_model"]),
    "r2r: a position skipped": ({"r.jsonl": _r2r_with(4, position=7)},
                                ["tr-profile", "routing", "--trace-format", "r2r", "--trace", "r.jsonl"],
                                ["r.jsonl", "position"]),
    "r2r: request ids of two types": ({"r.jsonl": _r2r_with(5, request_id=1)},
                                      ["tr-profile", "routing", "--trace-format", "r2r", "--trace", "r.jsonl"],
                                      ["r.jsonl", "request_id"]),
    "r2r CSV: no source_model column": (
        {"r.csv": _r2r_csv(_r2r_rows()).replace("source_model", "source")},
        ["tr-profile", "routing", "--trace-format", "r2r", "--trace", "r.csv"], ["r.csv", "source_model"]),
    "r2r CSV: a negative position": ({"r.csv": _r2r_csv([{**r, "position": -1} if k == 0 else r
                                                         for k, r in enumerate(_r2r_rows())])},
                                     ["tr-profile", "routing", "--trace-format", "r2r", "--trace", "r.csv"],
                                     ["r.csv", "position"]),
}


def _edit_th(doc, edit) -> str:
    d = copy.deepcopy(doc)
    edit(d)
    return json.dumps(d)


# Odd but valid: exit 0 and the note that makes the answer meaningful.
# id -> (files, argv, words the stderr's note: lines must hold, JSON output? (then "notes" must hold them too))
ANSWERED = {
    "spec: a model no request reaches (3 models)": (
        {"s.json": _spec(step_latency_ms=[6.0, 27.9, 10.0],
                         routing_matrix=[[0.65, 0.35, 0.0], [1.0, 0.0, 0.0], [0.5, 0.0, 0.5]],
                         committed_tokens=[[1, 0, 0], [1, 0, 0], [1, 0, 1]])},
        OPT + ["--spec", "s.json", "--format", "json"], ["model 2 is never reached"], True),
    "spec: the entry model keeps every request": (
        {"s.json": _spec(routing_matrix=[[1.0, 0.0], [0.5, 0.5]])}, OPT + ["--spec", "s.json"],
        ["routes every step to itself"], False),
    "spec: zero commits, three models, JSON": (
        {"s.json": _spec(step_latency_ms=[6.0, 27.9, 10.0],
                         routing_matrix=[[0.5, 0.25, 0.25], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]],
                         committed_tokens=[[0, 0, 0], [0, 0, 0], [0, 0, 0]])},
        OPT + ["--spec", "s.json", "--format", "json"], ["no step of this system commits a token"], True),
    "thresholds v2: a table whose system has a model no request reaches": (
        {"th.json": lambda T: json.dumps(T["unreached"])}, ["tr-autotune", "show", "th.json"],
        ["model 2 is never reached", "its threshold has no effect"], False),
    "trace: an extra scalar key (documented: recorders add columns)": (
        {"t.jsonl": _jsonl(*[{**r, "t_ms": 1.5 * k} for k, r in enumerate(_trace())])},
        ["tr-profile", "routing", "--trace", "t.jsonl"], [], False),
    "placement: a comment key (documented)": ({"config.json": _config(),
                                               "placement.json": _placement(_set(comment="lab layout, 2026"))},
                                              KV, [], False),
    "trace: a model never visited": ({"t.jsonl": _jsonl(*_trace(route=(0, 0, 0)))},
                                     ["tr-profile", "routing", "--trace", "t.jsonl", "--models", "2", "--format",
                                      "json"], ["model(s) 1"], True),
    "r2r: every token from the quick model": (
        {"r.jsonl": _jsonl(*_r2r_rows(sources=("quick",) * 5))},
        ["tr-profile", "routing", "--trace-format", "r2r", "--trace", "r.jsonl", "--format", "json"], ["model(s) 1"],
        True),
}


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """Thresholds documents of versions 1, 2 and 3 (small: N = 1..3), valid as written."""
    from tr_core.spec import preset, spec_from_dict
    from tr_model.tuning.autotune import tune
    d = tmp_path_factory.mktemp("th")
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    tune(spec, 3, d / "v2.json")
    tune(spec, 3, d / "v3.json", policy="busy")
    three = spec_from_dict({**SPEC, "step_latency_ms": [6.0, 27.9, 10.0],
                            "routing_matrix": [[0.65, 0.35, 0.0], [1.0, 0.0, 0.0], [0.5, 0.5, 0.0]],
                            "committed_tokens": [[1, 0, 0], [1, 0, 0], [1, 0, 0]]})
    tune(three, 2, d / "unreached.json")
    v2 = json.loads((d / "v2.json").read_text())
    v3 = json.loads((d / "v3.json").read_text())
    v1 = {"schema_version": 1, "format": "tokenrouter-thresholds", "num_models": 2, "max_concurrency": 3,
          "complete": True, "fallback_thresholds": [1, 1],
          "entries": [{"active_requests": n, "thresholds": e["thresholds"]} for n, e in enumerate(v2["entries"], 1)]}
    return {"v1": v1, "v2": v2, "v3": v3, "unreached": json.loads((d / "unreached.json").read_text())}


def _write(folder, files, tables):
    for name, text in files.items():
        (folder / name).write_text(text(tables) if callable(text) else text)


def _run(argv, seconds=120):
    from conftest import call_inproc
    with alarm(seconds):
        r = call_inproc(*argv)
    return r.returncode, r.stdout, r.stderr


def test_the_valid_bases_are_accepted(tmp_path, monkeypatch, tables):
    """The unspoilt files each case starts from are read without an error (so each refusal is the defect's)."""
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, {"s.json": _spec(), "t.jsonl": TRACE_OK, "small.json": _profile("small"),
                      "large.json": _profile("large"), "r.jsonl": _jsonl(*_r2r_rows()),
                      "r.csv": _r2r_csv(_r2r_rows()), "config.json": _config(), "placement.json": _placement(),
                      "gpu.json": _gpu(), "L.csv": "model,batch_size,step_latency_ms\n0,1,6.0\n1,1,27.9\n1,2,28.1\n",
                      "co.json": json.dumps([None, {"slowdown": 2.0}])}, tables)
    for v in ("v1", "v2", "v3"):
        (tmp_path / f"{v}.json").write_text(json.dumps(tables[v]))
    for argv in (OPT + ["--spec", "s.json"], ["tr-profile", "routing", "--trace", "t.jsonl"], SYSTEM_PROFILE,
                 ["tr-profile", "routing", "--trace-format", "r2r", "--trace", "r.jsonl"],
                 ["tr-profile", "routing", "--trace-format", "r2r", "--trace", "r.csv"], KV,
                 PLAN + ["--gpu", "gpu.json"], ["tr-optimize", "--p", "0.35", "--L-table", "L.csv", "--N", "2"],
                 OPT + SYS + ["--corun-L-table", "co.json"],
                 *[["tr-autotune", "show", f"{v}.json"] for v in ("v1", "v2", "v3")]):
        code, out, err = _run(argv)
        assert code == 0 and "error:" not in err, (argv, err)


def _check_refused(err, code, needles, expect=(2,)):
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert code in expect, (code, err)
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert all(ln.startswith(("error:", "note:", "warning:")) for ln in lines), err
    for n in needles:
        assert n in errors[0], (n, errors[0])
    return errors[0]


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_bad_file_is_refused_in_one_line(tmp_path, monkeypatch, tables, case):
    files, argv, needles = REFUSED[case]
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, files, tables)
    code, out, err = _run(argv)
    _check_refused(err, code, needles)
    assert out == "", out


@pytest.mark.parametrize("case", sorted(ANSWERED))
def test_an_odd_file_is_answered_with_what_it_means(tmp_path, monkeypatch, tables, case):
    files, argv, words, as_json = ANSWERED[case]
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, files, tables)
    code, out, err = _run(argv)
    assert code == 0 and "Traceback" not in err and "error:" not in err, (code, err)
    if as_json:  # the words stand in the document's notes (stderr may repeat them)
        doc = json.loads(out)
        assert isinstance(doc.get("notes"), list), doc.keys()
        for w in words:
            assert any(w in n for n in doc["notes"]), (w, doc["notes"])
    else:  # a note: line on stderr (tr-profile's summary lines, notes included, follow its table on stdout)
        notes = [ln for ln in (err + out).splitlines() if ln.startswith(("note:", "warning:"))]
        for w in words:
            assert any(w in ln for ln in notes), (w, err, out)


def test_the_set_is_large_and_covers_every_kind():
    kinds = {c.split(":")[0].split(" ")[0] for c in list(REFUSED) + list(ANSWERED)}
    assert {"spec", "L-table", "corun-L-table", "profile", "thresholds", "placement", "plan", "trace",
            "r2r"} <= kinds, kinds
    assert len(REFUSED) + len(ANSWERED) >= 45
