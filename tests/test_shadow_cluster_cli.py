"""``tr-shadow simulate`` / ``tr-shadow compare`` end to end (subprocess), and their bad-input handling."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, SHARED

BASE = ["--synthetic", "--sessions", "40", "--warmup", "10", "--measure", "80", "--drain", "900",
        "--capacity", "small=17", "--capacity", "large=5.5"]


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


def test_compare_csv_and_sweep():
    r = tr_shadow("compare", *BASE, "--approaches", "Harvest-SLO,Oracle", "--sim-seeds", "0,1", "--windows", "peak",
                  "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [x["approach"] for x in rows] == ["No Shadow", "Harvest-SLO", "Oracle"]
    assert all(x["runs"] == "2" for x in rows)
    assert float(rows[0]["call_latency_reduction_pct"]) == 0.0
    assert float(rows[2]["switch_ttft_reduction_pct"]) > 0
    r = tr_shadow("compare", *BASE, "--sweep", "rho=0.3,0.8", "--sim-seeds", "0", "--windows", "peak",
                  "--approaches", "Harvest-SLO", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["sweep"]["param"] == "rho" and len(doc["results"]) == 4


def test_compare_models_per_router_sweep():
    r = tr_shadow("compare", "--synthetic", "--sessions", "30", "--warmup", "10", "--measure", "60",
                  "--sweep", "models_per_router=2,3", "--sim-seeds", "0", "--windows", "peak", "--format", "json")
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
    (["simulate", *BASE, "--capacity", "tiny=3"], "--capacity"),
    (["simulate", "--synthetic", "--synthetic-models", "alpha", "beta", "--capacity", "1"], "alpha"),
    (["compare", *BASE, "--sweep", "colour=1,2"], "cannot sweep"),
    (["compare", *BASE, "--sim-seeds", "a,b"], "--sim-seeds"),
    (["compare", "--trace", "/nonexistent/s.jsonl", "--sweep", "models_per_router=2,3"], "/nonexistent/s.jsonl"),
    (["compare", *BASE, "--sweep", "models_per_router=1.5"], "models_per_router"),
    (["compare", *BASE, "--workers", "0"], "--workers"),
])
def test_bad_input_one_error_line(args, msg):
    r = tr_shadow(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], r.stderr


def test_models_per_router_sweep_needs_synthetic(tmp_path):
    from shadow_prefill import SyntheticParams, generate_synthetic_sessions, write_session_trace
    ss = generate_synthetic_sessions(SyntheticParams(n_sessions=5, models=("qwen2.5-7b", "llama-3.1-70b")))
    path = tmp_path / "s.jsonl"
    write_session_trace(ss, path)
    r = tr_shadow("compare", "--trace", path, "--capacity", "5", "--sweep", "models_per_router=2,3")
    assert r.returncode == 2 and r.stderr.startswith("error:") and "needs --synthetic" in r.stderr


def test_bad_flag_value_is_argparse_error():
    r = tr_shadow("simulate", *BASE, "--load", "-1")
    assert r.returncode == 2 and "must be >= 0" in r.stderr


def test_azure_traffic_when_present():
    path = os.path.join(SHARED, "data", "azure-llm-inference-2023", "AzureLLMInferenceTrace_conv.csv")
    if not os.path.exists(path):
        pytest.skip(f"shared data not present: {path}")
    r = tr_shadow("simulate", *BASE, "--traffic", path, "--approach", "No Shadow", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["traffic"]["requests"] > 19000 and doc["summary"]["normal_requests"] > 0
