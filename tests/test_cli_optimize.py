"""tr-optimize end to end: the main outputs and one refusal per exit code through a subprocess (the console
script as a user runs it), the other bad inputs in-process through the same ``main(argv)`` (``run_inproc``)."""

import json
import os

import pytest


def test_main_job_table(run_tool):
    r = run_tool("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--N", "1", "2", "4")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("system: r2r")
    row4 = [ln for ln in lines if ln.split() and ln.split()[0] == "4"][0].split()
    assert float(row4[3]) >= 207.94 and float(row4[4]) == pytest.approx(187.19, abs=0.01)
    assert r.stderr == ""


def test_table_shows_the_error_bound_and_cache_hits(run_tool):
    args = ("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--N", "3", "--B", "1", "2")
    first, second = run_tool(*args), run_tool(*args)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    header = first.stdout.splitlines()[1].split()
    assert header[-2:] == ["err_bound", "seconds"]
    row = first.stdout.splitlines()[-1].replace("(cache)", "").split()
    bound = float(row[-2])  # err_bound is the last column before seconds
    assert 0 <= bound < 1e-9
    # the suite's result cache is shared by the two runs: the second one's seconds are a lookup and say so
    assert second.stdout.splitlines()[-1].endswith("(cache)")


def test_json_and_out(run_tool, tmp_path):
    out = tmp_path / "res.json"
    r = run_tool("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--N", "1-3", "--format", "json", "--all")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # --out writes what would go to stdout to the file instead; the format follows the extension
    r = run_tool("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--N", "1-3", "--all", "--out", out)
    assert r.returncode == 0 and r.stdout == "", r.stderr

    def timeless(x):  # the second run may come from the cache: only timings differ
        if isinstance(x, dict):
            return {k: timeless(v) for k, v in x.items() if k not in ("seconds", "cached", "computed_seconds")}
        return [timeless(v) for v in x] if isinstance(x, list) else x

    assert timeless(doc) == timeless(json.loads(out.read_text()))
    assert [x["N"] for x in doc["results"]] == [1, 2, 3]
    assert doc["results"][1]["B"] == [1, 2]
    assert doc["results"][1]["throughput_tok_s"] == pytest.approx(110.32, abs=0.005)
    for k in ("eager_throughput_tok_s", "gain_vs_eager", "states", "transitions"):
        assert k in doc["results"][0]
    assert len(doc["table"]) == 1 + 3 + 6
    assert doc["spec"]["routing_matrix"] == [[0.65, 0.35], [1.0, 0.0]]
    assert not [f for f in os.listdir(tmp_path) if f != "res.json"]


def test_evaluate_vector_csv(run_tool):
    r = run_tool("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--N", "4", "--B", "1", "3", "--format", "csv")
    assert r.returncode == 0, r.stderr
    header, row = r.stdout.strip().splitlines()
    rec = dict(zip(header.split(","), row.split(",")))
    assert float(rec["throughput_tok_s"]) == pytest.approx(207.95, abs=0.005)
    assert rec["states"] == "14" and rec["transitions"] == "28"


def test_spec_file_and_presets(run_inproc, tmp_path):
    spec = {"schema_version": 1, "step_latency_ms": [2.0, 3.0, 4.0],
            "routing_matrix": [[0.5, 0.25, 0.25]] * 3, "committed_tokens": [[1, 1, 1]] * 3}
    f = tmp_path / "s.json"
    f.write_text(json.dumps(spec))
    r = run_inproc("tr-optimize", "--spec", f, "--N", "2", "--format", "json")
    assert r.returncode == 0, r.stderr
    a = json.loads(r.stdout)["results"][0]
    r2 = run_inproc("tr-optimize", "--weights", "0.5", "0.25", "0.25", "--L", "2", "3", "4", "--N", "2",
                  "--format", "json")
    assert json.loads(r2.stdout)["results"][0]["throughput_tok_s"] == pytest.approx(a["throughput_tok_s"])
    for algo, extra in (("citer", ["--p", "0.2"]), ("co-llm", ["--p", "0.2"]),
                        ("r-stitch", ["--p", "0.2", "--q", "0.4"])):
        r = run_inproc("tr-optimize", "--algo", algo, *extra, "--L", "6", "28", "--N", "2")
        assert r.returncode == 0, r.stderr


def _bad(run, *args, code=2, match=None):
    r = run("tr-optimize", *args)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert "Traceback" not in r.stderr
    if match:
        assert match in lines[0], lines[0]
    return lines[0]


def _write(tmp_path, doc, name="s.json"):
    f = tmp_path / name
    f.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return f


BASE = {"schema_version": 1, "step_latency_ms": [6.0, 27.9], "routing_matrix": [[0.65, 0.35], [1.0, 0.0]],
        "committed_tokens": [[1, 0], [1, 0]]}


def test_bad_probability(run_tool, run_inproc):
    _bad(run_tool, "--p", "1.2", "--L", "6", "27.9", match="--p")  # exit 2 as the shell sees it
    _bad(run_inproc, "--p", "-0.1", "--L", "6", "27.9", match="--p")


def test_bad_rows(run_inproc, tmp_path):
    _bad(run_inproc, "--spec", _write(tmp_path, dict(BASE, routing_matrix=[[0.6, 0.35], [1, 0]])),
         match="row 0 sums")
    _bad(run_inproc, "--spec", _write(tmp_path, dict(BASE, routing_matrix=[[1.2, -0.2], [1, 0]])),
         match="routing_matrix[0][0]")


def test_bad_committed_tokens(run_inproc, tmp_path):
    _bad(run_inproc, "--spec", _write(tmp_path, dict(BASE, committed_tokens=[[1, -1], [1, 0]])),
         match="committed_tokens[0][1]")


def test_bad_latency(run_inproc):
    _bad(run_inproc, "--p", "0.3", "--L", "0", "27.9", match="--L")
    _bad(run_inproc, "--p", "0.3", "--L", "-6", "27.9", match="--L")
    _bad(run_inproc, "--p", "0.3", "--L", "6", "27.9", "1", match="--L needs 2")


def test_off_grid_latency_and_round(run_inproc):
    msg = _bad(run_inproc, "--p", "0.3", "--L", "6.137", "27.9", match="not a multiple of delta")
    assert "6.1 ms" in msg and "--round" in msg
    r = run_inproc("tr-optimize", "--p", "0.3", "--L", "6.137", "27.9", "--round", "--N", "2")
    assert r.returncode == 0
    assert "rounded to 6.1 ms" in r.stderr and "relative error" in r.stderr


def test_bad_n_and_b(run_inproc):
    _bad(run_inproc, "--p", "0.3", "--L", "6", "27.9", "--N", "0", match="--N")
    _bad(run_inproc, "--p", "0.3", "--L", "6", "27.9", "--N", "x", match="--N")
    _bad(run_inproc, "--p", "0.3", "--L", "6", "27.9", "--N", "3", "--B", "2", "3", match="infeasible")
    _bad(run_inproc, "--p", "0.3", "--L", "6", "27.9", "--N", "3", "--B", "1", match="M = 2")
    _bad(run_inproc, "--p", "0.3", "--L", "6", "27.9", "--N", "3", "--B", "0", "1", match=">= 1")


def test_bad_spec_files(run_inproc, tmp_path):
    _bad(run_inproc, "--spec", tmp_path / "missing.json", match="does not exist")
    _bad(run_inproc, "--spec", _write(tmp_path, "{not json"), match="not valid JSON")
    _bad(run_inproc, "--spec", _write(tmp_path, {"step_latency_ms": [1, 2]}), match="missing field")
    _bad(run_inproc, "--spec", _write(tmp_path, dict(BASE, schema_version=9)), match="schema_version")
    _bad(run_inproc, "--spec", _write(tmp_path, dict(BASE, step_latency_ms=[6.0])), match="at least 2 models")
    _bad(run_inproc, "--spec", _write(tmp_path, dict(BASE, routing_matrix=[[1.0]])), match="rows")
    d = tmp_path / "dir.json"
    d.mkdir()
    _bad(run_inproc, "--spec", d, match="is a folder, not a file")


def test_no_system_and_unknown_flag(run_inproc):
    _bad(run_inproc, "--L", "6", "27.9", match="define the system")
    _bad(run_inproc, "--p", "0.3", "--L", "6", "27.9", "--bogus", match="unrecognized")


def test_state_space_too_large_exit_3(run_tool):
    msg = _bad(run_tool, "--p", "0.35", "--L", "6", "27.9", "--N", "12", "--B", "1", "1", "--max-states", "50",
               code=3)
    assert "max_states = 50" in msg and "--max-states" in msg


def test_unwritable_out_leaves_nothing(run_inproc, tmp_path):
    _bad(run_inproc, "--p", "0.35", "--L", "6", "27.9", "--N", "2", "--out", tmp_path / "nope" / "x.json",
         match="does not exist")
    assert os.listdir(tmp_path) == []


def test_plot_flag(run_tool, run_inproc, tmp_path):
    png = tmp_path / "b.png"
    r = run_tool("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--N", "3", "4", "--plot", png, "--no-cache")
    assert r.returncode == 0, r.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _bad(run_inproc, "--p", "0.35", "--L", "6.0", "27.9", "--N", "3", "--plot", tmp_path / "b.gif", match="extension")
    assert not (tmp_path / "b.gif").exists()


def test_table_states_each_certificate_and_warns_when_the_gap_is_above_max_gap(run_inproc):
    base = ("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--no-cache")
    r = run_inproc(*base, "--N", "4", "24")
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    assert r.stdout.splitlines()[1].split()[-4:] == ["certificate", "residual", "err_bound", "seconds"]
    rows = {ln.split()[0]: ln.split() for ln in r.stdout.splitlines()[3:]}
    assert rows["4"][-4] == "exhaustive" and rows["24"][-4] == "exact"
    # a state budget too small for the chains near B*: they are left to their bounds, the answer is proven
    # only within a gap above --max-gap, and the table and a warning line both say so
    r = run_inproc(*base, "--N", "24", "--search", "certified", "--max-states", "300", "--format", "json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)["results"][0]
    assert res["certificate"] == "certified" and res["gap"] > 0.001 and res["unresolved"] > 0
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and "above --max-gap 0.1 %" in warn[0] and f"{100 * res['gap']:.3g} %" in warn[0]
    r = run_inproc(*base, "--N", "24", "--search", "certified", "--max-states", "300")
    line = r.stdout.splitlines()[-1]
    assert f"gap {100 * res['gap']:.3g} %" in line
