"""The thresholds reader's stated ranges: every numeric field driven to its extremes, decide() never raises on
what the reader accepts; unknown keys, duplicate keys, type mixes and model-count disagreements are one error
naming the file and the key."""

from __future__ import annotations

import itertools
import json

import pytest

from tr_model import thresholds as T
from tr_model.thresholds import ThresholdFileError, ThresholdTable

TINY = 5e-324   # the smallest positive double


def _v3(cls, *, delta=0.1, step=6.0, window=0.0, cap=None, row=None):
    cols = list(T.POLICY_COLUMNS[cls])
    pol = {"class": cls, "columns": cols, "max_batch_size": [cap, cap]}
    if cls in T.STEP_CLASSES:
        pol["step_ms"] = [[step, step], [step, step]]
        pol["step_ms_beside_running"] = [[step, step], [step, step]]
    if row is None:
        row = [[1, window], [1, window]] if cls in T.WINDOW_CLASSES else [[1] + [None] * (len(cols) - 1)] * 2
    entries = [{"active_requests": n, "thresholds": [1, 1], "certificate": "local", "predicted_tok_s": 1.0,
                "policy_thresholds": row, "policy_certificate": "local", "policy_predicted_tok_s": 1.0}
               for n in (1, 2)]
    return {"schema_version": 3, "format": "tokenrouter-thresholds", "num_models": 2, "delta_ms": delta,
            "max_concurrency": 2, "complete": True, "fallback_thresholds": [1, 1], "entries": entries,
            "provenance": {}, "policy": pol}


STATES_W = [0, 1, 2, 10 ** 30]
STATES_R = [0.0, TINY, 0.05, 1.0, 1e12, 1e300, 1.7976931348623157e308]


@pytest.mark.parametrize("cls", sorted(T.POLICY_COLUMNS))
@pytest.mark.parametrize("delta", [T.DELTA_MS_RANGE[0], 0.1, T.DELTA_MS_RANGE[1]])
@pytest.mark.parametrize("step,window,cap", [(TINY, 0.0, 1), (T.MAX_STEP_MS, T.MAX_WINDOW_MS, None),
                                             (6.0, T.MAX_WINDOW_MS, T.MAX_CONCURRENCY_LIMIT)])
def test_decide_never_raises_at_the_extremes(cls, delta, step, window, cap):
    table = ThresholdTable.from_dict(_v3(cls, delta=delta, step=step, window=window, cap=cap))
    for w0, w1, r0, r1 in itertools.product(STATES_W, STATES_W[:2], STATES_R, STATES_R[::3]):
        for n in (0, 1, 2, 10 ** 40):
            out = table.decide(n, [w0, w1], [r0, r1], [w1, 10 ** 30])
            assert len(out) == 2 and all(isinstance(x, bool) for x in out)
            # an idle model with nothing waiting never launches; a busy one never does
            assert not out[0] or (w0 >= 1 and r0 <= delta / 2)
            thr = table.launch_threshold(n, 1, [w0, w1], [r0, r1], [w1, 0])
            assert thr is None or T._is_int(thr)


def test_decide_refuses_what_it_does_not_accept():
    table = ThresholdTable.from_dict(_v3("residual"))
    for waiting, residual in (([-1, 0], [0, 0]), ([0, 0], [float("inf"), 0]), ([0, 0], [float("nan"), 0]),
                              ([True, 0], [0, 0]), ([0], [0, 0]), ([0, 0], [-1.0, 0])):
        with pytest.raises(ValueError):
            table.decide(1, waiting, residual, [0, 0])


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d.update(delta_ms=T.DELTA_MS_RANGE[1] * 10), "'delta_ms'"),
    (lambda d: d.update(delta_ms=T.DELTA_MS_RANGE[0] / 10), "'delta_ms'"),
    (lambda d: d["policy"]["step_ms"][0].__setitem__(0, T.MAX_STEP_MS * 10), "policy.step_ms[0][0]"),
    (lambda d: d["policy"]["step_ms_beside_running"][1].__setitem__(1, 0.0), "policy.step_ms_beside_running[1][1]"),
    (lambda d: d["policy"]["max_batch_size"].__setitem__(0, 2 ** 40), "policy.max_batch_size"),
    (lambda d: d["entries"][0].update(predicted_tok_s=T.MAX_TOK_S * 10), "entries[0].predicted_tok_s"),
    (lambda d: d["entries"][1].update(policy_predicted_tok_s=1e300), "entries[1].policy_predicted_tok_s"),
    (lambda d: d.update(num_models=T.MAX_MODELS + 1), "'num_models'"),
    (lambda d: d.update(surprise=1), "unknown field 'surprise'"),
    (lambda d: d["entries"][1].update(thresholdz=[1, 1]), "entries[1] has unknown field 'thresholdz'"),
    (lambda d: d["entries"][0].update(states=1.5), "entries[0].states"),
    (lambda d: d["entries"][0].update(solver=3), "entries[0].solver"),
    (lambda d: d["entries"][1].update(seconds="1"), "entries[1].seconds"),
    (lambda d: d["entries"][0].update(residual=True), "entries[0].residual"),
    (lambda d: d["policy"].update(extra=0), "unknown field"),
])
def test_out_of_range_unknown_and_mistyped_fields_name_the_file_and_key(tmp_path, mutate, needle):
    doc = _v3("residual")
    mutate(doc)
    p = tmp_path / "th.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ThresholdFileError) as e:
        ThresholdTable.load(p)
    msg = str(e.value)
    assert str(p) in msg and needle in msg and "\n" not in msg, msg


def test_window_extreme_is_refused_above_its_range(tmp_path):
    p = tmp_path / "th.json"
    p.write_text(json.dumps(_v3("window", window=T.MAX_WINDOW_MS * 2)))
    with pytest.raises(ThresholdFileError, match=r"policy_thresholds\[0\]\[1\]"):
        ThresholdTable.load(p)


def test_duplicate_keys_are_refused_naming_the_key(tmp_path):
    text = json.dumps(_v3("busy"))
    for dup in (text.replace('"num_models": 2,', '"num_models": 2, "num_models": 3,'),
                text.replace('"active_requests": 2,', '"active_requests": 2, "active_requests": 2,')):
        p = tmp_path / "dup.json"
        p.write_text(dup)
        with pytest.raises(ThresholdFileError) as e:
            ThresholdTable.load(p)
        assert str(p) in str(e.value) and "appears twice" in str(e.value)
        assert ("'num_models'" if "num_models\": 3" in dup else "'active_requests'") in str(e.value)


def test_a_spec_for_another_number_of_models_is_refused(tmp_path):
    doc = _v3("busy")
    spec = {"step_latency_ms": [6.0, 27.9], "model_names": ["a", "b", "c"]}
    doc["spec"], doc["spec_sha256"] = spec, T.spec_sha256(spec)
    p = tmp_path / "th.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ThresholdFileError, match="'model_names' has 3 models"):
        ThresholdTable.load(p)


def test_watched_table_refuses_a_reload_its_accept_check_refuses(tmp_path):
    p = tmp_path / "th.json"
    p.write_text(json.dumps(_v3("busy")))
    seen = []
    w = T.WatchedThresholds(p, check_interval_s=0.0, accept=lambda t: None if t.num_models == 2 else "3 models",
                            on_error=seen.append)
    three = {"schema_version": 1, "num_models": 3, "max_concurrency": 1, "complete": True,
             "fallback_thresholds": [1, 1, 1], "entries": [{"active_requests": 1, "thresholds": [1, 1, 1]}]}
    p.write_text(json.dumps(three))
    assert w.lookup(1) == (1, 1) and w.refused_reloads == 1 and "3 models" in w.last_error and len(seen) == 1
    with pytest.raises(ThresholdFileError, match="3 models"):
        T.WatchedThresholds(p, accept=lambda t: None if t.num_models == 2 else "3 models")
