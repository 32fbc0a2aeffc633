"""Coarsest-grid choice, L(b) tables, batch caps and the delta check, via API and CLI."""

import json

import numpy as np
import pytest

from tr_core.errors import SpecError
from tr_core.grid import coarsest_delta, grid_errors, load_latency_table


@pytest.mark.parametrize("lat,rtol", [([6.0, 27.9], 0.01), ([6.137, 27.9], 0.01), ([10, 10.5], 0.03),
                                      ([1.3, 2.9, 7.7], 0.005), ([6.137, 27.9], 0.001)])
def test_coarsest_delta_is_feasible_and_maximal(lat, rtol):
    L = np.array(lat, dtype=float)
    d = coarsest_delta(lat, rtol)
    assert np.abs(grid_errors(L, d)).max() <= rtol * (1 + 1e-9)
    # brute force: no coarser grid on a fine scan passes
    scan = np.linspace(d * 1.0005, L.min() * (1 + rtol), 20000)
    ok = [x for x in scan if np.abs(grid_errors(L, x)).max() <= rtol]
    assert not ok, f"coarser grid {ok[-1]} also passes"


def test_coarsest_delta_hand_case():
    # 10 and 10.5 within 3%: the best single quantum is 10.3 (10 -> +3 %, 10.5 -> -1.9 %)
    assert coarsest_delta([10, 10.5], 0.03) == pytest.approx(10.3)


def test_bad_rtol():
    with pytest.raises(SpecError, match="delta-rtol"):
        coarsest_delta([1.0], 0.0)


def test_latency_table_formats(tmp_path):
    c = tmp_path / "t.csv"
    c.write_text("model,batch_size,step_latency_ms\n0,1,6.0\n0,4,7.0\n1,1,27.9\n")
    curves = load_latency_table(c, 2)
    assert curves[0].latency_ms(2) == pytest.approx(6 + 1 / 3)
    assert curves[1].latency_ms(9) == pytest.approx(27.9)
    j = tmp_path / "t.json"
    j.write_text(json.dumps({"latency_curves": [{"intercept_ms": 5.0, "per_request_ms": 0.5}, None]}))
    curves = load_latency_table(j, 2)
    assert curves[0].latency_ms(4) == pytest.approx(7.0) and curves[1] is None
    bad = tmp_path / "b.csv"
    bad.write_text("model,batch_size,step_latency_ms\n0,x,6\n")
    with pytest.raises(SpecError, match="line 2"):
        load_latency_table(bad, 2)
    with pytest.raises(SpecError, match="M = 3"):
        load_latency_table(j, 3)


def test_cli_delta_auto_and_check(run_tool):
    r = run_tool("tr-optimize", "--p", "0.35", "--L", "6.137", "27.9", "--delta-ms", "auto", "--N", "4",
                 "--check-delta", "--format", "json", "--no-cache")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    delta = doc["delta_auto"]["delta_ms"]
    assert delta == pytest.approx(coarsest_delta([6.137, 27.9], 0.01))
    chk = doc["delta_check"][0]
    assert chk["half_delta_ms"] == pytest.approx(delta / 2)
    assert chk["half_delta_throughput_tok_s"] is not None and chk["B_moved"] in (True, False)


def test_cli_l_table_caps_and_admission(run_tool, tmp_path):
    t = tmp_path / "lt.json"
    t.write_text(json.dumps([{"batch_size": [1, 8], "step_latency_ms": [6.0, 6.7]}, None]))
    r = run_tool("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--L-table", t, "--N", "8", "--B", "1", "1",
                 "--format", "json", "--no-cache")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)["results"][0]
    r0 = run_tool("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--N", "8", "--B", "1", "1",
                  "--format", "json", "--no-cache")
    base = json.loads(r0.stdout)["results"][0]
    assert res["throughput_tok_s"] < base["throughput_tok_s"]
    assert res["per_request_tok_s"] == pytest.approx(res["throughput_tok_s"] / 8)
    assert len(res["admission_latency_ms"]) == 2 and all(x >= 0 for x in res["admission_latency_ms"])
    rc = run_tool("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--N", "8", "--B", "1", "1", "--max-batch",
                  "3", "none", "--format", "json", "--no-cache")
    capped = json.loads(rc.stdout)["results"][0]
    assert capped["throughput_tok_s"] < base["throughput_tok_s"]
    bad = run_tool("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--max-batch", "0", "none")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --max-batch")
    bad = run_tool("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--delta-ms", "fine")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --delta-ms")


@pytest.mark.slow
def test_cli_method_simulate_and_auto(run_tool):
    r = run_tool("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--N", "4", "--B", "1", "3", "--method",
                 "simulate", "--sim-steps", "400000", "--format", "json", "--no-cache")
    assert r.returncode == 0, r.stderr
    sim = json.loads(r.stdout)["results"][0]
    assert sim["method"] == "simulate" and sim["ci95_tok_s"] > 0
    # the reference value 207.95 tok/s lies within a few half-widths
    assert abs(sim["throughput_tok_s"] - 207.95) <= 3 * sim["ci95_tok_s"]
    r = run_tool("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--N", "3", "--method", "auto",
                 "--format", "json", "--no-cache")
    exact = json.loads(r.stdout)["results"][0]
    assert exact["method"] == "exact" and exact["B"] == [1, 2]
    # too big for the exact cap: auto falls back to the simulator
    r = run_tool("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--N", "6", "--method", "auto",
                 "--max-states", "30", "--sim-budget-s", "3", "--format", "json", "--no-cache")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)["results"][0]
    assert res["method"] == "simulate" and res["tie_set"] and [1, 1] != res["B"]
    bad = run_tool("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--trace", "x.jsonl")
    assert bad.returncode == 2 and "--method" in bad.stderr
