"""tr-profile end to end (subprocess): every subcommand, the spec handed to tr-optimize, bad input -> error: + exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from profiler.synth import write_synthetic_trace
from tr_core.spec import load_spec

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512}


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # default run folders land in the test's tmp dir


@pytest.fixture
def configs(tmp_path):
    out = []
    for mt, extra in (("llama", {}), ("qwen2", {}), ("llama", {"vocab_size": 300})):
        p = tmp_path / f"{mt}-{extra.get('vocab_size', 256)}.json"
        p.write_text(json.dumps({"model_type": mt, **TINY, **extra}))
        out.append(str(p))
    return out


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "prompts.jsonl"
    rng = np.random.default_rng(0)
    p.write_text("".join(json.dumps({"input_ids": rng.integers(0, 256, 6).tolist()}) + "\n" for _ in range(3))
                 + json.dumps(rng.integers(0, 256, 4).tolist()) + "\n")
    return str(p)


class _Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run_main(capsys):
    """In-process ``tr-profile`` (same code path as the console script, without a fresh torch import)."""
    from profiler.cli import main

    def run(*args):
        capsys.readouterr()
        try:
            rc = main([str(a) for a in args])
        except SystemExit as e:
            rc = e.code
        out, err = capsys.readouterr()
        return _Result(rc, out, err)
    return run


def assert_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_import_profiler_and_routing_cli_without_torch(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_synthetic_trace(trace, [[0.7, 0.3], [1.0, 0.0]], [[1, 0], [1, 0]], n_requests=20, steps_per_request=30,
                          seed=0)
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'transformers'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import profiler\n"
        "from profiler.cli import main\n"
        f"rc = main(['routing', '--trace', {str(trace)!r}, '--step-latency-ms', '6,27.9', '--out', 'spec.json',"
        " '--format', 'json'])\n"
        "assert 'torch' not in sys.modules\n"
        "sys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["n_models"] == 2 and doc["routing_matrix"][1] == [1.0, 0.0]
    spec = load_spec(tmp_path / "spec.json")
    assert spec.step_latency_ms == (6.0, 27.9)


def test_routing_cli_spec_feeds_tr_optimize(run_tool, tmp_path):
    trace = tmp_path / "t.jsonl"
    write_synthetic_trace(trace, [[0.7, 0.3], [1.0, 0.0]], [[1, 0], [1, 0]], n_requests=40, steps_per_request=50,
                          seed=4)
    r = run_tool("tr-profile", "routing", "--trace", trace, "--step-latency-ms", "6,27.9", "--out", "spec.json",
                 "--format", "csv")
    assert r.returncode == 0, r.stderr
    header = r.stdout.splitlines()[0].split(",")
    assert header[:4] == ["from", "to", "count", "p"] and len(r.stdout.splitlines()) == 5
    spec = load_spec(tmp_path / "spec.json")
    assert abs(spec.P[0, 1] - 0.3) < 0.05
    r = run_tool("tr-optimize", "--spec", "spec.json", "--N", "4", "--format", "json")
    assert r.returncode == 0, r.stderr
    r = run_tool("tr-profile", "routing", "--trace", trace)
    assert r.returncode == 0 and "geometric" in r.stdout


def test_routing_cli_bad_input(run_tool, run_main, tmp_path):
    assert_error(run_tool("tr-profile", "routing", "--trace", tmp_path / "none.jsonl"), "does not exist")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"request_id": 1, "step": 0, "model": 0, "next_model": 1, "committed_tokens": 1}\n'
                   '{"request_id": 1, "step": 1, "model": 1, "next_model": 0}\n')
    assert_error(run_tool("tr-profile", "routing", "--trace", bad), "bad.jsonl:2:", "committed_tokens")
    bad.write_text('{"request_id": 1, "step": 0, "model": 0, "next_model": 1, "committed_tokens": 1}\n'
                   'not json at all\n')
    assert_error(run_main("routing", "--trace", bad), "bad.jsonl:2:", "not valid JSON")
    ok = tmp_path / "ok.jsonl"
    write_synthetic_trace(ok, [[0.5, 0.5], [0.5, 0.5]], [[1, 1], [1, 1]], n_requests=3, steps_per_request=5)
    assert_error(run_main("routing", "--trace", ok, "--out", "s.json"), "--step-latency-ms")
    assert_error(run_main("routing", "--trace", ok, "--alpha", "2"), "--alpha")
    assert_error(run_main("routing", "--trace", ok, "--step-latency-ms", "1,x", "--out", "s.json"),
                 "--step-latency-ms")
    assert_error(run_main("routing"), "--trace")
    assert_error(run_main("bogus"))


def test_latency_cli_six_batch_sizes_under_30s(run_tool, configs, tmp_path):
    t0 = time.perf_counter()
    r = run_tool("tr-profile", "latency", "--config", configs[0], "--batch-sizes", "1,2,4,8,16,32", "--context",
                 "32", "--threads", "1", "--format", "json")
    wall = time.perf_counter() - t0
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert wall < 30, wall
    assert [b["batch_size"] for b in doc["batches"]] == [1, 2, 4, 8, 16, 32]
    assert doc["mode"] == "decode" and doc["dtype"] == "fp32" and doc["timing"] == "perf_counter"
    assert doc["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4 and doc["fit"] is not None
    assert os.path.exists(doc["path"]) and doc["path"].startswith(os.path.join("runs", "profile"))
    assert doc["arguments"]["batch_sizes"] == "1,2,4,8,16,32"


def test_latency_cli_bad_input(run_tool, run_main, configs, tmp_path):
    assert_error(run_tool("tr-profile", "latency", "--config", configs[0], "--batch-sizes", "0,2"), "--batch-sizes")
    assert_error(run_main("latency", "--config", configs[0], "--batch-sizes", "1,a"), "--batch-sizes")
    assert_error(run_main("latency", "--config", tmp_path / "missing.json"), "does not exist")
    assert_error(run_main("latency"), "--model", "--config")
    assert_error(run_main("latency", "--model", tmp_path), "config.json")
    assert_error(run_main("latency", "--config", configs[0], "--mode", "extend", "--extend-tokens", "0",
                          "--batch-sizes", "1"), "--extend-tokens")


def test_route_run_and_system_cli(run_tool, run_main, configs, prompts, tmp_path):
    r = run_tool("tr-profile", "route-run", "--model", configs[0], "--config", configs[1], "--prompts", prompts,
                 "--policy", "confidence", "--tau", "0.02", "--max-new-tokens", "6", "--trace-out", "rr.jsonl",
                 "--threads", "1", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["requests"] == 4 and doc["committed_tokens"] == 24
    recs = [json.loads(line) for line in open("rr.jsonl")]
    assert len(recs) == doc["steps"]
    # CITER semantics: model 1 always hands back after one committed token; escalations commit nothing
    for rec in recs:
        if rec["model"] == 1:
            assert rec["next_model"] in (0, -1) and rec["committed_tokens"] == 1
        elif rec["next_model"] == 1:
            assert rec["committed_tokens"] == 0
    assert sum(rec["next_model"] == -1 for rec in recs) == 4
    # system from the recorded trace + latency measured now (2 batch sizes)
    r = run_tool("tr-profile", "system", "--model", configs[0], "--model", configs[1], "--trace", "rr.jsonl",
                 "--batch-sizes", "1,2", "--context", "8", "--steps", "3", "--threads", "1", "--out", "sys.json",
                 "--delta-ms", "0.01")
    assert r.returncode == 0, r.stderr
    spec = load_spec("sys.json")
    assert spec.M == 2 and spec.batch_dependent
    for i in range(2):
        for v in spec.latency_curves[i].step_latency_ms:
            assert abs(v / 0.01 - round(v / 0.01)) < 1e-6  # on the delta grid
    lat = spec.provenance["latency"]
    assert lat[0]["batch_size"] == [1, 2] and lat[1]["mode"] == "decode"
    assert spec.provenance["routing"]["lines"] == len(recs)
    # system with a route-run and reused latency profiles: no model loading for latency
    prof = sorted(p for p in os.listdir(os.path.join("runs", "profile")) if p.endswith("-system"))[0]
    lp = [os.path.join("runs", "profile", prof, f"latency-{k}.json") for k in range(2)]
    r = run_main("system", "--model", configs[0], "--model", configs[1], "--prompts", prompts,
                 "--policy", "ensemble", "--weights", "0.6,0.4", "--max-new-tokens", "5", "--latency-profile", lp[0],
                 "--latency-profile", lp[1], "--latency-curve", "constant", "--out", "sys2.json", "--threads", "1")
    assert r.returncode == 0, r.stderr
    spec2 = load_spec("sys2.json")
    assert spec2.latency_curves is None and spec2.provenance["route_run"]["policy"] == "ensemble"
    assert np.allclose(spec2.C, 1.0)


def test_route_run_bad_input(run_tool, run_main, configs, prompts, tmp_path):
    assert_error(run_tool("tr-profile", "route-run", "--model", configs[0], "--model", configs[2], "--prompts",
                          prompts, "--policy", "ensemble"), "different vocabularies")
    assert_error(run_main("route-run", "--model", configs[0], "--prompts", prompts, "--policy", "ensemble"),
                 "two --model")
    assert_error(run_main("route-run", "--model", configs[0], "--model", configs[1], "--prompts",
                          tmp_path / "none.jsonl", "--policy", "entropy", "--tau", "0.5"), "does not exist")
    badp = tmp_path / "bp.jsonl"
    badp.write_text('[1, 2, 999]\n')
    assert_error(run_main("route-run", "--model", configs[0], "--model", configs[1], "--prompts", badp, "--policy",
                          "entropy", "--tau", "0.5"), "bp.jsonl:1:", "999")
    assert_error(run_main("route-run", "--model", configs[0], "--model", configs[1], "--prompts", prompts,
                          "--policy", "entropy"), "--tau")
    assert_error(run_main("route-run", "--model", configs[0], "--model", configs[1], "--prompts", prompts,
                          "--policy", "ensemble", "--weights", "0.5,0.6"), "--weights")


def test_system_bad_input(run_tool, run_main, configs, tmp_path):
    assert_error(run_main("system", "--model", configs[0], "--model", configs[1]), "--trace")
    assert_error(run_main("system", "--model", configs[0], "--model", configs[1], "--trace",
                          tmp_path / "none.jsonl"), "does not exist")
    assert_error(run_tool("tr-profile", "system", "--model", configs[0], "--model", configs[1], "--trace", "x",
                          "--batch-sizes", "-1"), "--batch-sizes")
