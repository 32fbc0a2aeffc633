"""``tr-shadow simulate`` / ``tr-shadow compare`` end to end (subprocess), and their bad-input handling (one refusal
through a subprocess, the others in-process through the same ``main(argv)``)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, SHARED

BASE = ["--synthetic", "--sessions", "40", "--warmup-s", "10", "--measure-s", "80", "--drain-s", "900",
        "--capacity-rps", "small=17", "--capacity-rps", "large=5.5"]


def tr_shadow(*args, timeout=300):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "shadow_prefill.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=timeout)


def test_simulate_json(tmp_path):
    out = tmp_path / "run.json"
    r = tr_shadow("simulate", *BASE, "--approach", "harvest-slo-host", "--format", "json", "--out", out)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["kind"] == "shadow_cluster_run" and doc["schema_version"] == 1
    s = doc["summary"]
    assert s["approach"] == "Harvest-SLO+Host" and s["calls"] > 0 and s["unfinished_calls"] == 0
    assert doc["capacity_rps"] == [17.0, 5.5]
    assert doc["config"]["models"] == ["qwen2.5-7b", "llama-3.1-70b"]


def test_simulate_table_and_csv():
    r = tr_shadow("simulate", *BASE, "--approach", "Oracle")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("approach") and "Oracle" in r.stdout
    r = tr_shadow("simulate", *BASE, "--approach", "No Shadow", "--format", "csv", "--window", "0.5")
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert len(rows) == 1 and rows[0]["approach"] == "No Shadow" and rows[0]["window"] == "0.5"


@pytest.mark.slow
def test_compare_csv_and_sweep():
    r = tr_shadow("compare", *BASE, "--approaches", "Harvest-SLO", "Oracle", "--sim-seeds", "0", "1", "--windows",
                  "peak", "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [x["approach"] for x in rows] == ["No Shadow", "Harvest-SLO", "Oracle"]
    assert all(x["runs"] == "2" for x in rows)
    # not overloaded: every measured call finished, so the reductions cover all of them
    assert all(x["unfinished_calls"] == "0" and x["calls"] == x["measured_calls"] for x in rows)
    assert "warning" not in r.stderr
    assert float(rows[0]["call_latency_reduction_pct"]) == 0.0
    assert float(rows[2]["switch_ttft_reduction_pct"]) > 0
    r = tr_shadow("compare", *BASE, "--sweep", "load", "0.3", "0.8", "--sim-seeds", "0", "--windows", "peak",
                  "--approaches", "Harvest-SLO", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["sweep"] == {"param": "load", "values": [0.3, 0.8]} and len(doc["results"]) == 4
    assert {x["param"] for x in doc["results"]} == {"load"} and [x["value"] for x in doc["results"]] == [0.3] * 2 + [0.8] * 2


@pytest.mark.slow
def test_compare_models_per_router_sweep():
    r = tr_shadow("compare", "--synthetic", "--sessions", "30", "--warmup-s", "10", "--measure-s", "60",
                  "--sweep", "models-per-router", "2", "3", "--sim-seeds", "0", "--windows", "peak", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = doc["results"]
    assert [x["value"] for x in rows] == [2] * 4 + [3] * 4
    assert {x["approach"] for x in rows} == {"No Shadow", "Harvest-SLO+Host", "Harvest-SLO+Host, top-1",
                                              "Oracle+Host"}
    # with two models top-1 is the only other model: identical to shadowing all targets
    two = {x["approach"]: x for x in rows if x["value"] == 2}
    assert two["Harvest-SLO+Host"]["shadow_tokens"] == two["Harvest-SLO+Host, top-1"]["shadow_tokens"]
    three = {x["approach"]: x for x in rows if x["value"] == 3}
    assert three["Harvest-SLO+Host, top-1"]["shadow_tokens"] < three["Harvest-SLO+Host"]["shadow_tokens"]


@pytest.mark.parametrize("args,msg", [
    (["simulate", *BASE, "--approach", "Warm-All"], "unknown approach"),
    (["simulate", *BASE, "--traffic", "/nonexistent/trace.csv"], "/nonexistent/trace.csv"),
    (["simulate", *BASE, "--window", "noon"], "window"),
    (["simulate", *BASE, "--capacity-rps", "tiny=3"], "--capacity-rps"),
    (["simulate", "--synthetic", "--synthetic-models", "alpha", "beta", "--capacity-rps", "1"], "alpha"),
    (["compare", *BASE, "--sweep", "colour", "1", "2"], "cannot sweep"),
    (["compare", *BASE, "--sim-seeds", "a", "b"], "--sim-seeds"),
    (["compare", "--trace", "/nonexistent/s.jsonl", "--sweep", "models-per-router", "2", "3"], "/nonexistent/s.jsonl"),
    (["compare", *BASE, "--sweep", "models-per-router", "1.5"], "models-per-router"),
    (["compare", *BASE, "--workers", "0"], "--workers"),
])
def test_bad_input_one_error_line(capsys, args, msg):
    # in-process (the same main as the console script; test_bad_flag_value_is_argparse_error is the subprocess)
    rc, out, err = _main(capsys, *args)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], err


def test_models_per_router_sweep_needs_synthetic(capsys, tmp_path):
    from shadow_prefill import SyntheticParams, generate_synthetic_sessions, write_session_trace
    ss = generate_synthetic_sessions(SyntheticParams(n_sessions=5, models=("qwen2.5-7b", "llama-3.1-70b")))
    path = tmp_path / "s.jsonl"
    write_session_trace(ss, path)
    rc, out, err = _main(capsys, "compare", "--trace", path, "--capacity-rps", "5", "--sweep", "models-per-router",
                         "2", "3")
    assert rc == 2 and err.startswith("error:") and "needs --synthetic" in err


def test_bad_flag_value_is_argparse_error():
    r = tr_shadow("simulate", *BASE, "--load", "-1")  # a real process: exit 2 and one line as the shell sees them
    assert r.returncode == 2 and "must be >= 0" in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in r.stderr


def test_azure_traffic_when_present():
    path = os.path.join(SHARED, "data", "azure-llm-inference-2023", "AzureLLMInferenceTrace_conv.csv")
    if not os.path.exists(path):
        pytest.skip(f"shared data not present: {path}")
    r = tr_shadow("simulate", *BASE, "--traffic", path, "--approach", "No Shadow", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["traffic"]["requests"] > 19000 and doc["summary"]["normal_requests"] > 0


# ---------------------------------------------------------------------------------------------- in-process checks

def _main(capsys, *argv):
    from shadow_prefill.cli import main
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_overloaded_run_is_flagged(capsys, tmp_path):
    # no drain: sessions that start late in the window cannot finish; the run must say so, not report a mean
    # over the calls that happened to finish as if it were the whole window
    short = [x if x != "900" else "0" for x in BASE]
    rc, out, err = _main(capsys, "simulate", *short, "--approach", "No Shadow", "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    s = doc["summary"]
    assert s["unfinished_calls"] > 0 and s["measured_calls"] == s["calls"] + s["unfinished_calls"]
    assert doc["overloaded"] is True and s["overloaded"] is True
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: overloaded:") and "--drain-s" in lines[0]
    assert f"{s['unfinished_calls']} of {s['measured_calls']} measured calls" in lines[0]
    # the table shows the unfinished calls too
    rc, out, err = _main(capsys, "simulate", *short, "--approach", "No Shadow")
    assert rc == 0 and "unfinished" in out.splitlines()[0] and "warning: overloaded" in err
    # compare: the reductions cover `calls` of `measured_calls`, and it says so
    rc, out, err = _main(capsys, "compare", *short, "--approaches", "Oracle", "--sim-seeds", "0", "--windows",
                         "peak", "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["overloaded"] is True and "warning: overloaded" in err
    for r in doc["results"]:
        assert r["unfinished_calls"] > 0 and r["calls"] < r["measured_calls"]
    # a drained run is not flagged
    rc, out, err = _main(capsys, "simulate", *BASE, "--approach", "No Shadow", "--format", "json")
    assert rc == 0 and json.loads(out)["overloaded"] is False and "warning" not in err


def test_old_spellings_are_refused_and_the_old_list_syntax_still_read(capsys):
    from shadow_prefill.cli import build_parser
    a = build_parser().parse_args(["compare", "--synthetic", "--warmup-s", "10", "--measure-s", "80", "--drain-s",
                                   "900", "--cold-age-s", "3", "--capacity-rps", "small=17", "--prices", "m.json",
                                   "--gap-s", "1.0,0.5"])
    assert (a.warmup, a.measure, a.drain, a.cold_age, a.capacity) == (10.0, 80.0, 900.0, 3.0, ["small=17"])
    assert capsys.readouterr().err == ""  # the current spellings print nothing
    for old, value in (("--warmup", "10"), ("--measure", "80"), ("--drain", "900"), ("--cold-age", "3"),
                       ("--capacity", "small=17"), ("--models", "m.json"), ("--gap", "1.0,0.5")):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(["compare", "--synthetic", old, value])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err == f"error: unrecognized arguments: {old} {value}\n", err
    # old list and sweep syntax: same values, one note each
    from shadow_prefill.cluster.cli import _split, _sweep_spec
    assert _sweep_spec(["rho=0.3,0.8"]) == ("load", "rho", [0.3, 0.8])
    assert _sweep_spec(["cold_age_s=1,5"]) == ("cold-age-s", "cold_age_s", [1.0, 5.0])
    assert _sweep_spec(["load", "0.3", "0.8"]) == ("load", "rho", [0.3, 0.8])
    assert _sweep_spec(["cold-age-s", "1"]) == ("cold-age-s", "cold_age_s", [1.0])
    err = capsys.readouterr().err
    assert err.count("note: --sweep PARAM=V1,V2 is deprecated; use --sweep load 0.3 0.8") == 1
    assert _split(["peak,median"], "--windows") == ["peak", "median"] and "deprecated" in capsys.readouterr().err
    assert _split(["peak", "median"], "--windows") == ["peak", "median"] and capsys.readouterr().err == ""


@pytest.mark.parametrize("argv,msg", [
    (["simulate", "--synthetic", "--instances", "0"], "--instances"),       # a 25-line usage block before
    (["simulate", "--synthetic", "--load", "-1"], "--load"),
    (["simulate", "--synthetic", "--load", "nan"], "--load"),
    (["simulate", "--synthetic", "--tp", "1e9"], "--tp"),
    (["simulate", "--synthetic", "--format", "xml"], "--format"),
    (["simulate", "--synthetic", "--no-such-flag"], "--no-such-flag"),
    (["simulate", "--synthetic", "--trace", "t.jsonl"], "not allowed with"),
    (["simulate"], "required"),
    (["compare", "--synthetic", "--sim-seeds"], "--sim-seeds"),
    (["compare", "--synthetic", "--sim-seeds", "3-1"], "empty"),
    (["compare", "--synthetic", "--sweep", "load"], "at least one value"),
    (["compare", "--synthetic", "--sweep", "load", "x"], "not a number"),
    (["compare", "--synthetic", "--sweep", "load", "inf"], "finite"),
    (["compare", "--synthetic", "--context-bins", "100", "50"], "increasing"),
    (["compare", "--synthetic", "--approaches", "Warm-All"], "unknown approach"),
    (["compare", "--synthetic", "--windows", "noon"], "window"),
    (["compare", "--synthetic", "--workers", "99999"], "--workers"),
    (["compare", "--synthetic", "--out", "/"], "folder"),
    (["simulate", "--synthetic", "--credit-gate", "1.5"], "--credit-gate"),
    (["simulate", "--synthetic", "--credit-gate", "-0.1"], "--credit-gate"),
    (["compare", "--synthetic", "--credit-gate", "often"], "--credit-gate"),
    (["simulate", "--synthetic", "--session-draw", "random"], "--session-draw"),
    (["compare", "--synthetic", "--session-draw"], "--session-draw"),
    (["nope"], "invalid choice"),
    ([], "required"),
])
def test_every_error_is_one_line(capsys, argv, msg):
    rc, out, err = _main(capsys, *argv)
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], err
    assert out == ""


def test_version_and_help(capsys):
    from tr_core.version import __version__
    rc, out, _ = _main(capsys, "--version")
    assert rc == 0 and out.strip() == f"tr-shadow {__version__}"
    rc, out, _ = _main(capsys, "compare", "--help")
    assert rc == 0 and "--warmup-s" in out and "--sim-seeds SEED [SEED ...]" in out
    assert "--warmup " not in out and "--cold-age " not in out  # no old spellings


@pytest.mark.parametrize("cmd,extra", [("simulate", ["--load", "1000"]), ("simulate", ["--measure-s", "1e6"]),
                                       ("compare", ["--sweep", "load", "0.5", "900"]),
                                       ("simulate", ["--max-requests", "1000"])])
def test_oversized_run_refused_before_it_starts(capsys, cmd, extra):
    # before: the run simply started, growing memory for hours (10^8 Poisson arrivals and more)
    rc, out, err = _main(capsys, cmd, *BASE, *extra)
    assert rc == 3 and out == "", err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: one run would simulate about") and "--max-requests" in lines[0]


# ------------------------------------------------------------------ --credit-gate and --session-draw (issue 26)

def _sim_json(capsys, *extra):
    rc, out, err = _main(capsys, "simulate", *BASE, "--approach", "Harvest-SLO", "--format", "json", *extra)
    assert rc == 0, err
    return json.loads(out)


_SAME = ("calls", "switch_calls", "mean_call_latency_s", "mean_switch_latency_s", "shadow_tokens", "hit_rate")


def test_credit_gate_and_session_draw_reach_the_simulator(capsys):
    from dataclasses import replace

    from shadow_prefill.cli import build_parser
    from shadow_prefill.cluster.cli import _setup
    from shadow_prefill.cluster.sim import Scenario, simulate_cluster
    default = _sim_json(capsys)
    assert default["config"]["credit_gate"] == 0.25 and default["scenario"]["session_draw"] == "shuffle"
    explicit = _sim_json(capsys, "--credit-gate", "0.25", "--session-draw", "shuffle")
    assert {k: explicit["summary"][k] for k in _SAME} == {k: default["summary"][k] for k in _SAME}
    # every routed-step credit (gate 0) vs none (gate 1): the same sessions, different shadow work and latencies
    g0 = _sim_json(capsys, "--credit-gate", "0")
    g1 = _sim_json(capsys, "--credit-gate", "1")
    assert g0["config"]["credit_gate"] == 0.0 and g1["config"]["credit_gate"] == 1.0
    assert g0["summary"]["calls"] == g1["summary"]["calls"]
    assert g0["summary"]["mean_call_latency_s"] != g1["summary"]["mean_call_latency_s"]
    # in-order replays the pool's first sessions: a different draw from the default shuffle
    io_ = _sim_json(capsys, "--session-draw", "in-order", "--credit-gate", "0")
    assert io_["scenario"]["session_draw"] == "in-order"
    assert io_["summary"]["calls"] != g0["summary"]["calls"]
    # the CLI run is the Python API's run with the same fields
    args = build_parser().parse_args(["simulate", *BASE, "--credit-gate", "0", "--session-draw", "in-order"])
    ss, config, sizes, cap = _setup(args)
    assert config.credit_gate == 0.0
    sc = Scenario(rho=0.7, warmup_s=10.0, measure_s=80.0, drain_s=900.0, session_draw="in-order")
    api = simulate_cluster(ss, config, "Harvest-SLO", sc, sizes, cap).summary()
    assert api["mean_call_latency_s"] == io_["summary"]["mean_call_latency_s"]
    assert api["calls"] == io_["summary"]["calls"]
    api_shuffle = simulate_cluster(ss, config, "Harvest-SLO", replace(sc, session_draw="shuffle"), sizes, cap)
    assert api_shuffle.summary()["mean_call_latency_s"] == g0["summary"]["mean_call_latency_s"]


def test_credit_gate_sweep(capsys):
    rc, out, err = _main(capsys, "compare", *BASE, "--sweep", "credit-gate", "0", "1", "--sim-seeds", "0",
                         "--windows", "peak", "--approaches", "Harvest-SLO", "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["sweep"] == {"param": "credit-gate", "values": [0.0, 1.0]}
    hs = {x["value"]: x for x in doc["results"] if x["approach"] == "Harvest-SLO"}
    assert hs[0.0]["shadow_tokens"] != hs[1.0]["shadow_tokens"]
    rc, out, err = _main(capsys, "compare", *BASE, "--sweep", "credit-gate", "0.5", "2", "--sim-seeds", "0",
                         "--windows", "peak", "--approaches", "Harvest-SLO")
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error:") and "credit_gate" in lines[0], err
