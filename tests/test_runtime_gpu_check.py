"""benchmarks/gpu_runtime_check.py end to end on the CPU with tiny models (--tiny): the GPU run differs only in
the model configs and the device.  Checks the pipeline and its output, not the timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "gpu_runtime_check.py")


@pytest.mark.slow
def test_tiny_pipeline_profiles_predicts_measures_and_reports(tmp_path):
    r = subprocess.run([sys.executable, SCRIPT, "--tiny", "--N", "1,3", "--window-s", "0.5", "--warmup-s", "0.1",
                        "--repeats", "1", "--slices", "2", "--sim-steps", "3000", "--profile-steps", "2",
                        "--output-tokens", "12", "--prompt-tokens", "4", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((tmp_path / "gpu_runtime_check.json").read_text())
    md = (tmp_path / "gpu_runtime_check.md").read_text()
    assert doc["tiny"] and doc["kind"] == "gpu_runtime_check" and not doc["cuda"]
    assert [row["N"] for row in doc["results"]] == [1, 3]
    prof = doc["profile"]
    assert sorted(int(b) for b in prof["decode"][1]) == [1, 2, 3] and len(prof["corun"]) == 2
    assert all(v > 0 for d in prof["decode"] for v in d.values())
    assert doc["model"]["overhead_ms"] >= 0 and len(doc["model"]["latency_curves"]) == 2
    for row in doc["results"]:
        vecs = {tuple(v["B"]): v for v in row["vectors"]}
        assert (1, 1) in vecs and tuple(row["predicted_B_costs"]) in vecs
        for B, v in vecs.items():
            assert sum(b - 1 for b in B) < row["N"]
            assert v["predicted_lb_tok_s"] > 0 and v["predicted_costs_tok_s"] > 0
            assert v["measured_tok_s"] > 0
            assert v["min_batch"][0] >= B[0] and v["min_batch"][1] >= B[1]   # thresholds obeyed on the executor
        n = len(vecs)
        assert 1 <= row["rank_costs"] <= n and row["measured_gain"] > 0
    assert "| N | predicted B*" in md and "rank of B*" in md


def test_without_cuda_and_without_tiny_it_says_so(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    r = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


PROBE = os.path.join(ROOT, "benchmarks", "gpu_corun_probe.py")


def test_corun_probe_tiny_writes_each_model_alone_and_beside_the_other(tmp_path):
    out = tmp_path / "probe"
    r = subprocess.run([sys.executable, PROBE, "--tiny", "--batch-sizes", "1", "3", "--other-batch-sizes", "2",
                        "--context", "16", "--steps", "2", "--warmup-steps", "1", "--repeats", "2",
                        "--out-dir", str(out)], capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((out / "corun_probe.json").read_text())
    assert doc["schema_version"] == 1 and doc["kind"] == "corun_probe" and doc["tiny"] and not doc["cuda"]
    assert [(row["model"], row["batch_size"], row["other_batch_size"]) for row in doc["rows"]] == [
        ("small", 1, 2), ("small", 3, 2), ("large", 1, 2), ("large", 3, 2)]
    for row in doc["rows"]:
        for key in ("alone_step_ms", "corun_step_ms", "slowdown"):
            s = row[key]
            assert 0 < s["min"] <= s["median"] <= s["max"]
    assert "| timed model | b | other model's b |" in (out / "corun_probe.md").read_text()
    assert sorted(os.listdir(out)) == ["corun_probe.json", "corun_probe.md"]


def test_corun_probe_refuses_bad_input_and_a_machine_without_cuda(tmp_path):
    r = subprocess.run([sys.executable, PROBE, "--out-dir", str(tmp_path / "p"), "--batch-sizes", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error:") and "--batch-sizes" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    import torch
    if torch.cuda.is_available():
        return
    r = subprocess.run([sys.executable, PROBE, "--out-dir", str(tmp_path / "p")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "p").exists()
