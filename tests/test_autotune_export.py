"""tr-autotune export r2r: R2R's launch lists from a thresholds file, entry for entry, and its refusals."""

from __future__ import annotations

import json
import random
import subprocess

import pytest

from tr_model.autotune_cli import main
from tr_model.tuning.export import r2r_launch_args
from tr_model.thresholds import ThresholdTable, spec_sha256


def _r2r_parse(value: str):
    """R2R's launcher (script/inference/launch_r2r_server.py), restated: digits -> int, else a comma list."""
    return int(value) if value.isdigit() else [int(x) for x in value.split(",")]


def _doc(vectors, max_conc=None, certs=None, gaps=None, M=2, version=2, extrapolated_from=None, spec=None):
    spec = spec or {"schema_version": 1, "name": "r2r", "step_latency_ms": [6.0, 27.9][:M] + [40.0] * (M - 2),
                    "delta_ms": 0.1}
    n = len(vectors)
    max_conc = n if max_conc is None else max_conc
    certs = certs or ["exhaustive"] * n
    entries = []
    for k, v in enumerate(vectors):
        e = {"active_requests": k + 1, "thresholds": list(v)}
        if certs[k] != "extrapolated":
            e.update(predicted_tok_s=10.0 * (k + 1), eager_tok_s=9.0 * (k + 1))
        if version >= 2:
            e["certificate"] = certs[k]
            if certs[k] == "extrapolated":
                e["extrapolated_from"] = extrapolated_from
            else:
                e["gap"] = (gaps or {}).get(k + 1, 0.0)
        entries.append(e)
    complete = len(entries) == max_conc and "extrapolated" not in certs
    return {"schema_version": version, "format": "tokenrouter-thresholds", "num_models": M, "delta_ms": 0.1,
            "spec": spec, "spec_sha256": spec_sha256(spec), "max_concurrency": max_conc, "complete": complete,
            "fallback_thresholds": [1] * M, "entries": entries, "provenance": {"tool": "test"}}


def _random_vectors(rng, n_max):
    out = []
    for n in range(1, n_max + 1):
        b0 = rng.randint(1, max(1, n // 4))
        b1 = rng.randint(1, n - (b0 - 1))  # sum(B_i - 1) < N
        out.append((b0, b1))
    return out


def _write(tmp_path, doc, name="th.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return str(p)


def _run(capsys, argv):
    with pytest.raises(SystemExit) as ex:
        raise SystemExit(main(argv))
    out, err = capsys.readouterr()
    return ex.value.code, out, err


@pytest.mark.parametrize("seed", range(6))
def test_lists_parse_with_r2rs_rule_and_equal_the_table(tmp_path, capsys, seed):
    rng = random.Random(seed)
    n_max = rng.randint(2, 200)
    vectors = _random_vectors(rng, n_max)
    path = _write(tmp_path, _doc(vectors))
    N = rng.randint(2, n_max)
    code, out, err = _run(capsys, ["export", "r2r", "--thresholds", path, "--N", str(N)])
    assert code == 0, err
    argv = out.split()
    assert argv[0] == "--slm-min-batch-size" and argv[2] == "--llm-min-batch-size" and len(argv) == 4
    slm, llm = _r2r_parse(argv[1]), _r2r_parse(argv[3])
    assert isinstance(slm, list) and isinstance(llm, list)  # the list form: R2R's large model ignores an int
    table = ThresholdTable.load(path)
    assert len(slm) == len(llm) == N
    for n in range(1, N + 1):
        # R2R uses entry N-1 with N active requests; model 0 is its small model, model 1 its large one
        assert (slm[n - 1], llm[n - 1]) == table.lookup(n)
    assert err == ""  # every row exact: nothing to say


def test_default_covers_the_files_max_concurrency_and_json_env_agree(tmp_path, capsys):
    vectors = _random_vectors(random.Random(7), 40)
    path = _write(tmp_path, _doc(vectors))
    code, text, _ = _run(capsys, ["export", "r2r", "--thresholds", path])
    assert code == 0
    code, js, _ = _run(capsys, ["export", "r2r", "--thresholds", path, "--format", "json"])
    doc = json.loads(js)
    assert doc["max_concurrency"] == 40
    assert doc["slm_min_batch_size"] == [v[0] for v in vectors]
    assert doc["llm_min_batch_size"] == [v[1] for v in vectors]
    assert " ".join(doc["args"]) == text.strip()
    assert doc["exact"] == list(range(1, 41)) and doc["extrapolated"] == [] and doc["certified"] == []
    env = tmp_path / "r2r.env"
    code, _, _ = _run(capsys, ["export", "r2r", "--thresholds", path, "--format", "env", "--out", str(env)])
    assert code == 0
    sh = subprocess.run(["bash", "-c", f'. "{env}" && echo "$R2R_SLM_MIN_BATCH_SIZE" && '
                                       f'echo "$R2R_LLM_MIN_BATCH_SIZE" && echo "$R2R_MAX_CONCURRENCY" && '
                                       f'echo $R2R_MIN_BATCH_SIZE_ARGS'],
                        capture_output=True, text=True, timeout=30)
    lines = sh.stdout.splitlines()
    assert _r2r_parse(lines[0]) == doc["slm_min_batch_size"] and _r2r_parse(lines[1]) == doc["llm_min_batch_size"]
    assert lines[2] == "40" and lines[3] == text.strip()


def test_extrapolated_and_certified_rows_are_named(tmp_path, capsys):
    vectors = [(1, 1), (1, 2), (1, 2), (1, 3), (1, 3), (1, 3), (1, 3)]
    certs = ["exhaustive", "pruned-exact", "certified", "certified", "extrapolated", "extrapolated", "extrapolated"]
    path = _write(tmp_path, _doc(vectors, certs=certs, gaps={3: 0.001, 4: 0.004}, extrapolated_from=4))
    code, out, err = _run(capsys, ["export", "r2r", "--thresholds", path, "--N", "7"])
    assert code == 0
    assert out.split()[3] == "1,2,2,3,3,3,3"
    assert "rows N = 5-7 are extrapolated" in err and "the row of N = 4" in err
    assert "rows N = 3-4 are certified" in err and "0.4%" in err
    code, js, _ = _run(capsys, ["export", "r2r", "--thresholds", path, "--N", "7", "--format", "json", "--quiet"])
    doc = json.loads(js)
    assert doc["extrapolated"] == [5, 6, 7] and doc["certified"] == [3, 4] and doc["exact"] == [1, 2]
    assert [r["extrapolated_from"] for r in doc["rows"]] == [None] * 4 + [4] * 3
    assert [r["certificate"] for r in doc["rows"]] == certs
    assert any("extrapolated" in n for n in doc["notes"]) and any("certified" in n for n in doc["notes"])
    # rows inside the computed part only: nothing to report
    code, _, err = _run(capsys, ["export", "r2r", "--thresholds", path, "--N", "2"])
    assert code == 0 and err == ""


def test_schema_1_file_says_its_rows_are_not_known_exact(tmp_path, capsys):
    path = _write(tmp_path, _doc([(1, 1), (1, 2), (1, 2)], version=1))
    code, out, err = _run(capsys, ["export", "r2r", "--thresholds", path])
    assert code == 0 and out.split()[3] == "1,2,2"
    assert "no per-row certificates" in err


def test_one_entry_lists_and_the_int_reading_note(tmp_path, capsys):
    path = _write(tmp_path, _doc([(1, 1), (1, 2)]))
    code, out, err = _run(capsys, ["export", "r2r", "--thresholds", path, "--N", "1"])
    assert code == 0 and out.split() == ["--slm-min-batch-size", "1", "--llm-min-batch-size", "1"]
    assert "reads each flag as an int" in err


@pytest.mark.parametrize("case, needle", [
    ("beyond", "covers N = 1..5, but the server's maximum concurrency is 9"),
    ("three_models", "R2R runs two models"),
    ("short_partial", "rows for N = 1..3 only, not its max_concurrency 8"),
    ("bad_n", "--N must be >= 1"),
    ("missing", "does not exist"),
    ("corrupt", "not valid JSON"),
])
def test_refusals_are_one_error_line_exit_2(tmp_path, capsys, case, needle):
    argv = ["export", "r2r", "--thresholds"]
    if case == "beyond":
        argv += [_write(tmp_path, _doc(_random_vectors(random.Random(1), 5))), "--N", "9"]
    elif case == "three_models":
        argv += [_write(tmp_path, _doc([(1, 1, 1), (1, 2, 1)], M=3))]
    elif case == "short_partial":
        argv += [_write(tmp_path, _doc([(1, 1), (1, 2), (1, 2)], max_conc=8))]
    elif case == "bad_n":
        argv += [_write(tmp_path, _doc([(1, 1)])), "--N", "0"]
    elif case == "missing":
        argv += [str(tmp_path / "nope.json")]
    else:
        p = tmp_path / "bad.json"
        p.write_text('{"schema_version": 2, "entries": [')
        argv += [str(p)]
    code, out, err = _run(capsys, argv)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err


def test_the_old_spelling_max_concurrency_is_refused(tmp_path, capsys):
    path = _write(tmp_path, _doc(_random_vectors(random.Random(3), 6)))
    code, out, err = _run(capsys, ["export", "r2r", "--thresholds", path, "--N", "4"])
    assert code == 0 and len(_r2r_parse(out.split()[1])) == 4
    code, out, err = _run(capsys, ["export", "r2r", "--thresholds", path, "--max-concurrency", "4"])
    assert code == 2 and out == "" and err == "error: unrecognized arguments: --max-concurrency 4\n", err


def test_api_refuses_the_eager_fallback():
    from tr_core.errors import SpecError
    with pytest.raises(SpecError, match="fallback"):
        r2r_launch_args(ThresholdTable.eager(2, 4))


def test_export_needs_a_target(capsys):
    code, _, err = _run(capsys, ["export"])
    assert code == 2 and err.startswith("error:") and "r2r" in err


def test_a_spec_that_does_not_look_like_r2r_gets_a_note(tmp_path, capsys):
    spec = {"schema_version": 1, "name": "swapped", "step_latency_ms": [27.9, 6.0],
            "routing_matrix": [[0.1, 0.9], [0.3, 0.7]], "committed_tokens": [[1, 1], [1, 1]], "delta_ms": 0.1}
    path = _write(tmp_path, _doc([(1, 1), (1, 2)], spec=spec))
    code, out, err = _run(capsys, ["export", "r2r", "--thresholds", path])
    assert code == 0 and out.split()[3] == "1,2"
    assert "model 0 steps in 27.9 ms" in err and "p_10 is 0.3" in err
    spec.update(step_latency_ms=[6.0, 27.9], routing_matrix=[[0.65, 0.35], [1.0, 0.0]])
    code, _, err = _run(capsys, ["export", "r2r", "--thresholds", _write(tmp_path, _doc([(1, 1)], spec=spec))])
    assert code == 0 and "model 0 steps" not in err and "p_10" not in err
