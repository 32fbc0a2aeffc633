"""tr-profile end to end (subprocess): every subcommand, the spec handed to tr-optimize, bad input -> error: + exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
        f"rc = main(['routing', '--trace', {str(trace)!r}, '--format', 'json'])\n"
        f"rc += main(['routing', '--trace', {str(trace)!r}, '--L', '6', '27.9', '--out', 'spec.json'])\n"
        "assert 'torch' not in sys.modules\n"
        "sys.exit(rc)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # only the first call printed: --out receives the second one's output
    assert doc["n_models"] == 2 and doc["routing_matrix"][1] == [1.0, 0.0]
    spec = load_spec(tmp_path / "spec.json")  # with latencies the JSON output is the spec
    assert spec.step_latency_ms == (6.0, 27.9)


def test_routing_cli_spec_feeds_tr_optimize(run_tool, run_main, tmp_path):
    trace = tmp_path / "t.jsonl"
    write_synthetic_trace(trace, [[0.7, 0.3], [1.0, 0.0]], [[1, 0], [1, 0]], n_requests=40, steps_per_request=50,
                          seed=4)
    r = run_tool("tr-profile", "routing", "--trace", trace, "--L", "6,27.9", "--out", "spec.json")
    assert r.returncode == 0, r.stderr
    assert "comma-separated" in r.stderr and r.stdout == ""
    r = run_main("routing", "--trace", trace, "--L", "6", "27.9", "--format", "csv")
    assert r.returncode == 0, r.stderr
    header = r.stdout.splitlines()[0].split(",")
    assert header[:4] == ["from", "to", "count", "p"] and len(r.stdout.splitlines()) == 5
    spec = load_spec(tmp_path / "spec.json")
    assert abs(spec.P[0, 1] - 0.3) < 0.05
    r = run_tool("tr-optimize", "--spec", "spec.json", "--N", "4", "--format", "json")
    assert r.returncode == 0, r.stderr
    r = run_main("routing", "--trace", trace)
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
    assert_error(run_main("routing", "--trace", ok, "--alpha", "2"), "--alpha")
    assert_error(run_main("routing", "--trace", ok, "--L", "1", "x", "--out", "s.json"), "--L")
    assert_error(run_main("routing", "--trace", ok, "--L", "1", "2", "--out", tmp_path), "--out", "folder")
    assert not os.path.exists("s.json")
    assert_error(run_main("routing", "--trace", ok, "--L", "1", "2", "--delta-ms", "nan"), "--delta-ms")
    assert_error(run_main("routing"), "--trace")
    assert_error(run_main("bogus"))


@pytest.mark.slow
def test_latency_cli_six_batch_sizes(run_tool, configs, tmp_path):
    r = run_tool("tr-profile", "latency", "--config", configs[0], "--batch-sizes", "1-2", "4", "8", "16", "32",
                 "--context", "32", "--steps", "5", "--threads", "1", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)  # the JSON output is the profile itself
    assert [b["batch_size"] for b in doc["batches"]] == [1, 2, 4, 8, 16, 32]
    assert doc["mode"] == "decode" and doc["dtype"] == "fp32" and doc["timing"] == "perf_counter"
    assert doc["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4 and doc["fit"] is not None
    assert doc["attention"] == "serving" and doc["roofline"] is None  # no bandwidth known for a CPU
    kept = [os.path.join("runs", "profile", d, "profile.json") for d in os.listdir(os.path.join("runs", "profile"))]
    assert len(kept) == 1 and json.load(open(kept[0])) == doc
    assert doc["arguments"]["batch_sizes"] == ["1-2", "4", "8", "16", "32"]
    from profiler.latency import load_latency_profile
    assert load_latency_profile(kept[0]).to_dict() == doc
    # --out receives the profile; no run folder; --bandwidth-gbs gives a roofline on any device
    r = run_tool("tr-profile", "latency", "--config", configs[0], "--batch-sizes", "1", "3", "--context", "8",
                 "--steps", "2", "--threads", "1", "--out", "p.json", "--bandwidth-gbs", "100", "--quiet",
                 "--attention", "transformers")
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stderr
    doc = json.load(open("p.json"))
    assert len(os.listdir(os.path.join("runs", "profile"))) == 1
    roof = doc["roofline"]
    assert roof["bandwidth_bytes_per_s"] == 100e9 and doc["attention"].startswith("transformers:")
    w_read = doc["weight_bytes"] - doc["input_embedding_bytes"]
    assert doc["input_embedding_bytes"] == 256 * 64 * 4  # untied llama: the input table is not read per step
    for row, b in zip(roof["batches"], doc["batches"]):
        nbytes = w_read + b["batch_size"] * (8 + 1) * doc["kv_bytes_per_token"]
        assert row["bytes_read"] == nbytes
        assert row["floor_ms"] == pytest.approx(nbytes / 100e9 * 1e3)
        assert row["measured_over_floor"] == pytest.approx(b["median_ms"] / row["floor_ms"])


def test_latency_cli_bad_input(run_tool, run_main, configs, tmp_path):
    assert_error(run_tool("tr-profile", "latency", "--config", configs[0], "--batch-sizes", "0", "2"),
                 "--batch-sizes")
    assert_error(run_main("latency", "--config", configs[0], "--batch-sizes", "1", "a"), "--batch-sizes")
    assert_error(run_main("latency", "--config", configs[0], "--batch-sizes", "1-100000"), "--batch-sizes", "at most")
    assert_error(run_main("latency", "--config", configs[0], "--warmup-steps", "-1"), "--warmup-steps")
    assert_error(run_main("latency", "--config", configs[0], "--attention", "flash"), "--attention")
    assert_error(run_main("latency", "--config", configs[0], "--cuda-graph", "--device", "cpu",
                          "--batch-sizes", "1"), "--cuda-graph")
    assert_error(run_main("latency", "--config", tmp_path / "missing.json"), "does not exist")
    assert_error(run_main("latency"), "--model", "--config")
    assert_error(run_main("latency", "--model", tmp_path), "config.json")
    assert_error(run_main("latency", "--config", configs[0], "--mode", "extend", "--extend-tokens", "0",
                          "--batch-sizes", "1"), "--extend-tokens")


@pytest.mark.slow
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
    r = run_tool("tr-profile", "system", "--model", configs[0], configs[1], "--trace", "rr.jsonl",
                 "--batch-sizes", "1", "2", "--context", "8", "--steps", "3", "--threads", "1", "--out", "sys.json",
                 "--delta-ms", "0.01", "--warmup-steps", "1")
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
                 "--policy", "ensemble", "--weights", "0.6", "0.4", "--max-new-tokens", "5", "--latency-profile", lp[0],
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
                          "--policy", "ensemble", "--weights", "0.5", "0.6"), "--weights")


def test_system_bad_input(run_tool, run_main, configs, tmp_path):
    assert_error(run_main("system", "--model", configs[0], "--model", configs[1]), "--trace")
    assert_error(run_main("system", "--model", configs[0], "--model", configs[1], "--trace",
                          tmp_path / "none.jsonl"), "does not exist")
    assert_error(run_tool("tr-profile", "system", "--model", configs[0], "--model", configs[1], "--trace", "x",
                          "--batch-sizes", "-1"), "--batch-sizes")


def _profile_doc(medians, *, mode="decode", cuda_graph=True, timing="cuda_events", model="m", std=0.01):
    from profiler.latency import AffineFit, BatchStats, LatencyProfile
    batches = tuple(BatchStats(b, 20, m * 0.99, m, m, m * 1.01, std) for b, m in medians.items())
    return LatencyProfile(model=model, config_sha256="0" * 64, device="NVIDIA H200", dtype="bf16", mode=mode,
                          context_tokens=512, extend_tokens=1 if mode == "decode" else 4, cuda_graph=cuda_graph,
                          warmup_steps=3, timed_steps=20, batches=batches, fit=AffineFit(1.0, 0.1, 0.9),
                          weight_bytes=10 ** 9, kv_bytes_per_token=1024, timing=timing).to_dict()


def test_system_refuses_mixed_profiles_unless_allowed(run_main, tmp_path):
    trace = tmp_path / "t.jsonl"
    write_synthetic_trace(trace, [[0.7, 0.3], [1.0, 0.0]], [[1, 0], [1, 0]], n_requests=20, steps_per_request=20)
    files = {}
    for name, doc in {"g0": _profile_doc({1: 5.0, 8: 6.0}, model="small"),
                      "g1": _profile_doc({1: 26.0, 8: 37.0}, model="big"),
                      "e1": _profile_doc({1: 49.0, 8: 49.5}, cuda_graph=False, model="big"),
                      "x1": _profile_doc({1: 28.0, 8: 40.0}, mode="extend", model="big"),
                      "c1": _profile_doc({1: 26.0, 8: 37.0}, cuda_graph=False, timing="perf_counter"),
                      "nm": _profile_doc({1: 26.0, 2: 20.0, 8: 37.0}, model="big", std=5.0)}.items():
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(doc))
    base = ["system", "--trace", trace, "--delta-ms", "0.5", "--latency-profile"]
    assert_error(run_main(*base, files["g0"], files["e1"]), "mix", "CUDA graph on GPU", "eager on GPU",
                 "--allow-mixed")
    assert_error(run_main(*base, files["g0"], files["x1"]), "model 1", "extend", "decode step", "--allow-mixed")
    assert_error(run_main(*base, files["g0"], files["c1"]), "mix", "on CPU")
    assert not os.path.exists(os.path.join("runs", "profile")) or not os.listdir(os.path.join("runs", "profile"))
    r = run_main(*base, files["g0"], files["e1"], "--allow-mixed", "--out", tmp_path / "mixed.json")
    assert r.returncode == 0, r.stderr
    assert "accepted: --allow-mixed" in r.stderr
    spec = load_spec(tmp_path / "mixed.json")
    assert any("--allow-mixed" in w for w in spec.provenance["latency_warnings"])
    # a consistent pair passes silently; a non-monotone, noisy curve passes with warnings
    r = run_main(*base, files["g0"], files["g1"], "--out", tmp_path / "ok.json")
    assert r.returncode == 0 and "note:" not in r.stderr, r.stderr
    r = run_main(*base, files["g0"], files["nm"], "--out", tmp_path / "nm-spec.json")
    assert r.returncode == 0, r.stderr
    assert "drops from 26 ms at b = 1 to 20 ms at b = 2" in r.stderr and "noisy samples at b = 2" in r.stderr
    r = run_main(*base, files["g0"], files["nm"], "--out", tmp_path / "nm-spec.json", "--quiet")
    assert r.returncode == 0 and r.stderr == ""
    # the measuring path refuses --mode extend the same way
    assert_error(run_main("system", "--model", "a.json", "b.json", "--trace", trace, "--mode", "extend"),
                 "--allow-mixed")


def test_delta_auto_and_version(run_main, tmp_path):
    trace = tmp_path / "t.jsonl"
    write_synthetic_trace(trace, [[0.7, 0.3], [1.0, 0.0]], [[1, 0], [1, 0]], n_requests=20, steps_per_request=20)
    r = run_main("routing", "--trace", trace, "--L", "6", "27.9", "--delta-ms", "auto", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    from tr_core.grid import coarsest_delta
    assert doc["delta_ms"] == pytest.approx(coarsest_delta([6.0, 27.9], rtol=0.01))
    r = run_main("--version")
    from tr_core.version import __version__
    assert r.returncode == 0 and r.stdout.strip() == f"tr-profile {__version__}"


def test_roofline_of_the_h200_profiles(run_main, tmp_path):
    shared = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "h200-profiles")
    if not os.path.isdir(shared):
        pytest.skip("needs ../shared/data/h200-profiles (reference profiles measured on an H200)")
    root = os.path.join(os.path.dirname(__file__), "..")
    cfg = os.path.join(root, "data", "models", "Qwen3-32B", "config.json")
    r = run_main("roofline", os.path.join(shared, "qwen3-32b_decode_graph.json"), "--config", cfg, "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["profiles"][0]["roofline"]["batches"]
    # by hand: 65,524,246,528 weight bytes less the untied 151,936 x 5,120 bf16 input table, plus 513 tokens of
    # 262,144 KV bytes per request, at the H200's 4.8 TB/s
    w = 65_524_246_528 - 151_936 * 5_120 * 2
    assert rows[0]["bytes_read"] == w + 513 * 262_144
    assert rows[0]["floor_ms"] == pytest.approx((w + 513 * 262_144) / 4.8e12 * 1e3)
    assert rows[0]["measured_over_floor"] == pytest.approx(26.32203197479248 / rows[0]["floor_ms"])
    assert 1.9 < rows[0]["measured_over_floor"] < 2.0
    r = run_main("roofline", os.path.join(shared, "qwen3-32b_decode_graph.json"), "--config", cfg)
    assert r.returncode == 0 and "measured_over_floor" in r.stdout and "4.8 TB/s" in r.stdout
    assert_error(run_main("roofline", tmp_path / "none.json"), "does not exist")
