"""tr-plan: the command's dialect (formats, --out, --version, --quiet) and its bad-input contract."""

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMALL = str(ROOT / "data/models/Qwen3-0.6B/config.json")
LARGE = str(ROOT / "data/models/Qwen3-32B/config.json")
BASE = ["--model", SMALL, "--model", LARGE, "--gpu", "h200", "--context-tokens", "512", "--quiet"]


def _one_error(r):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert r.stdout == ""
    return lines[0]


def test_json_document(run_inproc):
    r = run_inproc("tr-plan", *BASE, "--gpus", "2", "--N", "1", "2", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 1 and doc["N"] == [1, 2] and doc["gpus"] == 2
    thr = [p["throughput_tok_s"] for p in doc["plans"]]
    assert thr and thr == sorted(thr, reverse=True)
    for p in doc["plans"]:
        assert {m["model"] for m in p["placement"]} == {"Qwen3-0.6B", "Qwen3-32B"}
        for m in p["placement"]:
            assert len(m["gpus"]) == m["tensor_parallel"] and max(m["gpus"]) < 2
        assert set(p["latency_ms"]) == {"Qwen3-0.6B", "Qwen3-32B"}
        for name, lat in p["latency_ms"].items():
            assert (lat["corun_ms"] is None) == (not p["colocated"])
            inp = p["latency_inputs"][name]
            assert inp["kind"] == "roofline" and lat["solo_ms"] == inp["solo_ms"]["1"]
            t = inp["terms_ms_at_b1"]
            assert t["total_ms"] == pytest.approx(max(t["memory_ms"], t["compute_ms"]) + t["allreduce_ms"]
                                                  + t["overhead_ms"])
        assert len(p["B"]) == 2 and p["per_request_tok_s"] * p["N"] == pytest.approx(p["throughput_tok_s"], rel=1e-6)
    assert all(d["reason"] in ("does not fit", "dominated", "below --min-per-request-tok-s") for d in doc["dropped"])
    best = {n: max(p["throughput_tok_s"] for p in doc["plans"] if p["N"] == n) for n in (1, 2)}
    for p in doc["plans"]:
        assert p["ratio_to_best"] == pytest.approx(p["throughput_tok_s"] / best[p["N"]])


def test_table_csv_and_out(run_inproc, tmp_path):
    t = run_inproc("tr-plan", *BASE, "--gpus", "1", "--N", "2", "--show-dropped")
    assert t.returncode == 0 and "throughput_tok_s" in t.stdout and "1.000x" in t.stdout
    c = run_inproc("tr-plan", *BASE, "--gpus", "1", "--N", "2", "--format", "csv")
    assert c.returncode == 0 and c.stdout.splitlines()[0].startswith("N,rank,placement")
    out = tmp_path / "plan.json"
    o = run_inproc("tr-plan", *BASE, "--gpus", "1", "--N", "2", "--out", str(out))
    assert o.returncode == 0 and o.stdout == "" and json.loads(out.read_text())["N"] == [2]
    assert sorted(os.listdir(tmp_path)) == ["plan.json"]  # no temporary left
    v = run_inproc("tr-plan", "--version")
    assert v.returncode == 0 and v.stdout.strip()


def test_min_per_request_filter(run_inproc):
    r = run_inproc("tr-plan", *BASE, "--gpus", "2", "--N", "2", "--format", "json", "--min-per-request-tok-s", "60")
    doc = json.loads(r.stdout)
    assert all(p["per_request_tok_s"] >= 60 for p in doc["plans"])
    assert any(d["reason"] == "below --min-per-request-tok-s" for d in doc["dropped"])


@pytest.mark.parametrize("args,needle", [
    (["--gpu", "v100", "--gpus", "2"], "unknown GPU kind"),
    (["--gpu", "h200", "--gpus", "2.5"], "--gpus must be an integer"),
    (["--gpu", "h200", "--gpus", "two"], "--gpus must be an integer"),
    (["--gpu", "h200", "--gpus", "2", "--latency-profile", str(ROOT / "data/examples/latency-small.json")],
     "not given"),
])
def test_bad_input_one_error_line(run_inproc, args, needle):
    r = run_inproc("tr-plan", "--model", SMALL, "--model", LARGE, *args, "--N", "1")
    assert needle in _one_error(r)


def test_config_that_fits_no_gpu_count(run_inproc, tmp_path):
    cfg = json.loads(Path(LARGE).read_text())
    cfg["num_parameters"] = 2 * 10 ** 12  # 4 TB of bf16 weights: more than 8 H200s hold
    big = tmp_path / "huge" / "config.json"
    big.parent.mkdir()
    big.write_text(json.dumps(cfg))
    r = run_inproc("tr-plan", "--model", SMALL, "--model", str(big), "--gpu", "h200", "--gpus", "8", "--N", "1")
    assert "no placement" in _one_error(r)
