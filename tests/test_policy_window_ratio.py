"""Issue 27: the ``window`` and ``ratio`` launch-policy classes deployed like ``busy``/``residual``: written in
a schema-version-3 file, read by the vendorable reader (whose decisions equal ``optimizer.policy``'s rule
state for state) and executed by the runtime on the virtual clock."""

import copy
import dataclasses
import json
import os

import numpy as np
import pytest

from tr_core.spec import preset
from tr_model.thresholds import ThresholdFileError, ThresholdTable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _me():
    return preset("me", [0.3, 0.5, 0.7], weights=[0.5, 0.3, 0.2])


def _r2r_corun():
    return preset("r2r", [6.0, 27.9], p=0.35).with_corun([1.5, 1.0])


@pytest.fixture(scope="module", params=["window", "ratio"])
def me3(request, tmp_path_factory):
    """ME (three models) at N = 1..3 with the class searched at every N."""
    from tr_model.tuning.autotune import tune
    path = tmp_path_factory.mktemp(request.param) / "policy.json"
    table = tune(_me(), 3, path, policy=request.param)
    return request.param, path, table, json.loads(path.read_text())


def test_v3_round_trip(me3):
    cls, path, table, doc = me3
    assert doc["schema_version"] == 3 and table.policy_class == cls
    assert doc["policy"]["columns"] == ["threshold", "window_ms"]
    assert ("step_ms" in doc["policy"]) == (cls == "ratio")
    assert ThresholdTable.load(path) == table
    for n in (1, 2, 3):
        assert table.policy_predicted_tok_s[n - 1] >= table.predicted(n) * (1 - 1e-12)
    # N = 3: the search leaves a window (a B* policy would not gain)
    assert table.policy_predicted_tok_s[2] > table.predicted(3) * 1.001
    assert any(w > 0 for _b, w in table.policy_of(3))


def _sweep_params(M, N, steps):
    """Parameter sets: thresholds 1..N (sum(B - 1) < N), windows 0..the longest step in quanta."""
    rng = np.random.default_rng(7)
    out = []
    for _ in range(40):
        B = [int(rng.integers(1, N + 1)) for _ in range(M)]
        if sum(b - 1 for b in B) >= N:
            B = [1] * M
        W = [int(rng.integers(0, steps + 2)) for _ in range(M)]
        out.append([(b, w) for b, w in zip(B, W)])
    return out


@pytest.mark.parametrize("cls", ["window", "ratio"])
@pytest.mark.parametrize("case", ["me3", "r2r_corun6"])
def test_reader_decides_as_the_chain_state_for_state(cls, case, tmp_path):
    """For many parameter sets, the reader's decide() in every pre-decision configuration of the process equals
    the launch bits of the NumPy reference rule (tests/policy_reference.py) (a reader whose rule differs fails here)."""
    from optimizer import policy as POL
    from policy_reference import class_launch_reference
    from tr_model.tuning.autotune import tune
    spec, N = (_me(), 3) if case == "me3" else (_r2r_corun(), 6)
    table = tune(spec, N, tmp_path / "t.json", policy=cls, policy_max_n=1)
    proc = POL.build_process(spec, N)
    S = proc.configs
    delta = spec.delta_ms
    longest = int(max(proc.d.max(), (proc.dco if proc.dco is not None else proc.d).max()))
    checked = waits = 0
    for params in _sweep_params(spec.M, N, longest):
        ref = class_launch_reference(proc, cls, params)
        rows = list(table.policy_rows)
        rows[N - 1] = tuple((b, float(f"{w * delta:.12g}")) for b, w in params)
        t = dataclasses.replace(table, policy_rows=tuple(rows))
        for s, lm in zip(S, ref):
            got = t.decide(N, [int(x) for x in s[:, 0]], [float(x) * delta for x in s[:, 2]],
                           [int(x) for x in s[:, 1]])
            assert got == tuple(bool(x) for x in lm), (params, s.tolist())
            checked += 1
            waits += int(any(s[j, 2] == 0 and s[j, 0] >= params[j][0] and not lm[j] for j in range(spec.M)))
    assert checked > 1000 and waits > 50  # the windows make models wait in many states


def test_ratio_reader_counts_earlier_launches_as_running(me3):
    cls, _path, table, _doc = me3
    if cls != "ratio":
        pytest.skip("ratio only")
    t = dataclasses.replace(table, policy_rows=table.policy_rows[:2] + (((1, 0.0), (1, 0.0), (1, 1.0)),))
    d0 = t.policy_step_ms[0][1]   # model 0 (fastest) launches 2: a step of d_0(2)
    W2 = t.policy_rows[2][2][1]
    # all idle, queues (2, 0, 1): model 2 waits iff d_0(2) * 1 <= W_2 * 2 (the batch model 0 just launched)
    assert t.decide(3, [2, 0, 1], [0.0, 0.0, 0.0], [0, 0, 0]) == (True, False, not d0 <= W2 * 2)
    assert d0 <= W2 * 2 and t.launch_threshold(3, 2, [2, 0, 1], [0.0] * 3, [0, 0, 0]) is None
    with pytest.raises(ValueError, match="running_batch"):
        t.decide(3, [2, 0, 1], [0.0, 0.0, 0.0])


def _mutate(doc, path, value):
    d = copy.deepcopy(doc)
    o = d
    for k in path[:-1]:
        o = o[k]
    if value is KeyError:
        del o[path[-1]]
    else:
        o[path[-1]] = value
    return d


@pytest.mark.parametrize("path,value,needle", [
    (("entries", 2, "policy_thresholds", 0, 1), -0.1, r"entries\[2\].policy_thresholds\[0\]\[1\] \(window_ms\)"),
    (("entries", 2, "policy_thresholds", 0, 1), "1", r"policy_thresholds\[0\]\[1\] \(window_ms\)"),
    (("entries", 2, "policy_thresholds", 1, 0), 0, r"policy_thresholds\[1\]\[0\] \(threshold\)"),
    (("entries", 2, "policy_thresholds", 1), [1], r"policy_thresholds\[1\] must have 2 entries"),
    (("policy", "columns"), ["others_idle", "others_busy"], r"policy.columns"),
    (("delta_ms",), KeyError, r"delta_ms"),
])
def test_v3_window_fields_are_validated(me3, path, value, needle):
    _cls, _p, _t, doc = me3
    with pytest.raises(ThresholdFileError, match=needle):
        ThresholdTable.from_dict(_mutate(doc, path, value))


def test_ratio_needs_its_step_lengths(me3):
    cls, _p, _t, doc = me3
    if cls == "ratio":
        with pytest.raises(ThresholdFileError, match=r"policy.step_ms"):
            ThresholdTable.from_dict(_mutate(doc, ("policy", "step_ms"), KeyError))
    else:
        bad = _mutate(doc, ("policy", "step_ms"), [[1.0] * 3] * 3)
        with pytest.raises(ThresholdFileError, match=r"policy.step_ms' belongs to classes"):
            ThresholdTable.from_dict(bad)


def test_v3_window_matches_the_json_schema(me3):
    jsonschema = pytest.importorskip("jsonschema")
    _cls, _p, _t, doc = me3
    with open(os.path.join(ROOT, "data", "schemas", "thresholds.schema.json")) as f:
        schema = json.load(f)
    jsonschema.validate(doc, schema)


def test_runtime_runs_ratio_at_the_chain_value(me3):
    """ME at N = 3 under the ratio policy on the virtual clock: the measured throughput is within its 95 %
    interval of the chain's exact value under that policy."""
    from tr_model.serving.runtime import EmulatedExecutor, measure_closed_loop
    cls, _p, table, _doc = me3
    if cls != "ratio":
        pytest.skip("ratio only")
    spec = _me()
    r = measure_closed_loop(spec, 3, table, EmulatedExecutor(spec.latency_ms), duration_s=4.0, warmup_s=0.1,
                            clock="virtual", max_output_tokens=10 ** 9, slices=20)
    pred = table.policy_predicted_tok_s[2]
    assert r.throughput_ci95_tok_s < 0.01 * pred
    assert abs(r.throughput_tok_s - pred) <= r.throughput_ci95_tok_s


def test_cli_autotune_run_and_optimize_accept_window_and_ratio(tmp_path, capsys):
    from tr_model.autotune_cli import main as autotune
    from tr_model.cli import main as optimize
    out = tmp_path / "w.json"
    assert autotune(["run", "--p", "0.35", "--L", "6.0", "27.9", "--N", "5", "--thresholds", str(out),
                     "--policy", "window", "--policy-max-n", "4", "--quiet"]) == 0
    assert "policy (window: threshold, window_ms)" in capsys.readouterr().out
    t = ThresholdTable.load(out)
    assert t.policy_class == "window" and t.policy_certificates == ("local",) * 4 + ("thresholds",)
    assert t.policy_of(5) == tuple((b, 0.0) for b in t.lookup(5))
    out2 = tmp_path / "r.json"
    assert optimize(["--p", "0.35", "--L", "6.0", "27.9", "--N", "1-4", "--policy", "ratio", "--thresholds",
                     str(out2), "--format", "json", "--no-cache"]) == 0
    row = json.loads(capsys.readouterr().out)["results"][-1]
    r = ThresholdTable.load(out2)
    assert r.policy_class == "ratio" and row["policy"]["class"] == "ratio"
    assert [tuple(x) for x in row["policy"]["thresholds"]] == list(r.policy_of(4))
    assert r.policy_predicted_tok_s[3] == pytest.approx(row["policy"]["throughput_tok_s"], rel=1e-12)


def test_export_r2r_says_a_window_policy_is_lost_only_where_it_has_a_window(me3):
    from tr_model.autotune_cli import _policy_export_notes
    cls, _p, table, _doc = me3
    windowed = [n for n in (1, 2, 3) if any(w > 0 for _b, w in table.policy_of(n))]
    assert 1 not in windowed and 3 in windowed   # N = 1: the threshold rule, written as windows 0
    notes = _policy_export_notes(table, 3)
    assert f"state-dependent {cls} policy at {len(windowed)} of N = 1..3" in notes[0]


def test_runtime_fixed_thresholds_decide_after_the_instants_completions():
    """ME at N = 3 with fixed B = (1, 1, 1) on the virtual clock: steps of 0.3-0.7 ms often end together, and a
    launch taken before a coinciding completion has routed to the model starts a smaller batch than the
    chain's (1.5 % low).  The plain threshold path waits for the instant to settle, as the chain does."""
    import tr_model
    from tr_model.serving.runtime import EmulatedExecutor, FixedThresholds, measure_closed_loop
    spec = _me()
    exact = tr_model.evaluate(spec, 3, (1, 1, 1)).throughput_tok_s
    r = measure_closed_loop(spec, 3, FixedThresholds((1, 1, 1)), EmulatedExecutor(spec.latency_ms),
                            duration_s=4.0, warmup_s=0.1, clock="virtual", max_output_tokens=10 ** 9, slices=20)
    assert r.throughput_ci95_tok_s < 0.01 * exact
    assert abs(r.throughput_tok_s - exact) <= max(r.throughput_ci95_tok_s, 0.003 * exact)
