"""tr-profile latency --corun (co-running step latency, CPU thread path) and tr-profile system --corun-profile."""

from __future__ import annotations

import json
import os

import pytest

from profiler.synth import write_synthetic_trace
from tr_core.spec import load_spec

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512}


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def configs(tmp_path):
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"model_type": "llama", **TINY}))
    large = tmp_path / "large.json"
    large.write_text(json.dumps({"model_type": "qwen2", **TINY, "hidden_size": 128, "intermediate_size": 256,
                                 "num_hidden_layers": 3}))
    return str(small), str(large)


class _Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run_main(capsys):
    from profiler.cli import main

    def run(*args):
        capsys.readouterr()
        try:
            rc = main([str(x) for x in args])
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


def test_latency_corun_on_cpu_threads(run_main, configs, tmp_path):
    small, large = configs
    r = run_main("latency", "--config", small, "--corun", large, "--corun-batch-size", "2", "--batch-sizes", "1", "3",
                 "--context", "8", "--steps", "3", "--warmup-steps", "1", "--threads", "1", "--format", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    # the same profile document as a solo one, marked co-running
    assert doc["kind"] == "latency_profile" and [b["batch_size"] for b in doc["batches"]] == [1, 3]
    c = doc["corun"]
    assert c["model"] == "large" and c["batch_size"] == 2 and c["context_tokens"] == 8
    assert c["runner"] == "second thread (CPU)" and c["cuda_graph"] is False
    # the other model ran at least one full step before each batch size's first timed step
    assert c["steps"] >= 2 and c["mean_step_ms"] > 0
    from profiler.latency import load_latency_profile
    kept = [os.path.join("runs", "profile", d, "profile.json") for d in os.listdir(os.path.join("runs", "profile"))]
    assert len(kept) == 1 and kept[0].split(os.sep)[-2].endswith("-latency-small-corun")
    prof = load_latency_profile(kept[0])
    assert prof.is_corun and prof.to_dict() == doc
    # a solo profile of the same model: no corun block, same architecture hash
    r = run_main("latency", "--config", small, "--batch-sizes", "1", "3", "--context", "8", "--steps", "2",
                 "--threads", "1", "--out", tmp_path / "solo.json", "--quiet")
    assert r.returncode == 0, r.stderr
    solo = load_latency_profile(tmp_path / "solo.json")
    assert not solo.is_corun and solo.config_sha256 == prof.config_sha256
    # measured profiles assemble into one spec (model 1 here is the same architecture, profiled solo only)
    trace = tmp_path / "t.jsonl"
    write_synthetic_trace(trace, [[0.7, 0.3], [1.0, 0.0]], [[1, 0], [1, 0]], n_requests=10, steps_per_request=10)
    r = run_main("system", "--trace", trace, "--latency-profile", tmp_path / "solo.json", tmp_path / "solo.json",
                 "--corun-profile", kept[0], "none", "--delta-ms", "auto", "--out", tmp_path / "spec.json", "--quiet")
    assert r.returncode == 0, r.stderr
    spec = load_spec(tmp_path / "spec.json")
    assert spec.has_corun and spec.provenance["corun_latency"][0]["corun"]["model"] == "large"
    co = spec.provenance["corun_latency"][0]
    assert co["median_ms"] == [b["median_ms"] for b in doc["batches"]]
    assert spec.corun_latency_ms(1, 3) == spec.latency_ms(1, 3)
    # the table output says what ran beside the model
    r = run_main("latency", "--config", small, "--corun", large, "--batch-sizes", "2", "--context", "8",
                 "--steps", "2", "--threads", "1")
    assert r.returncode == 0, r.stderr
    assert "co-running: timed while large decoded batches of 1 beside it" in r.stdout


def test_latency_corun_bad_input(run_main, configs, tmp_path):
    small, large = configs
    base = ["latency", "--config", small, "--batch-sizes", "1", "--context", "4", "--steps", "1"]
    assert_error(run_main(*base, "--corun", tmp_path / "missing.json"), "--corun", "does not exist")
    assert_error(run_main(*base, "--corun", large, "--corun-batch-size", "0"), "--corun-batch-size")
    assert_error(run_main(*base, "--corun-batch-size", "2"), "--corun-batch-size", "needs --corun")
    assert_error(run_main(*base, "--corun", large, "--measure-overhead"), "--measure-overhead", "--corun")
    assert_error(run_main(*base, "--corun", large, "--corun-batch-size", "x"), "--corun-batch-size")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hidden_size": 8}))
    assert_error(run_main(*base, "--corun", bad), "--corun", "model_type")
    (tmp_path / "empty").mkdir()
    assert_error(run_main(*base, "--corun", tmp_path / "empty"), "--corun", "without config.json")
    assert not os.path.exists(os.path.join("runs", "profile")) or not os.listdir(os.path.join("runs", "profile"))


def _profile_doc(medians, *, model="m", sha="0", corun=None, cuda_graph=True, timing="cuda_events"):
    from profiler.latency import AffineFit, BatchStats, LatencyProfile
    batches = tuple(BatchStats(b, 20, m * 0.99, m, m, m * 1.01, 0.01) for b, m in medians.items())
    return LatencyProfile(model=model, config_sha256=sha * 64, device="NVIDIA H200", dtype="bf16", mode="decode",
                          context_tokens=512, extend_tokens=1, cuda_graph=cuda_graph, warmup_steps=3,
                          timed_steps=20, batches=batches, fit=AffineFit(1.0, 0.1, 0.9), weight_bytes=10 ** 9,
                          kv_bytes_per_token=1024, timing=timing, corun=corun).to_dict()


def test_profile_corun_block_is_validated(tmp_path):
    from profiler.latency import ProfileError, load_latency_profile
    doc = _profile_doc({1: 2.0}, corun={"model": "big", "batch_size": 0})
    p = tmp_path / "p.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match="corun.batch_size"):
        load_latency_profile(p)
    doc["corun"] = {"batch_size": 2}
    p.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match="corun.model"):
        load_latency_profile(p)
    doc["corun"] = [1]
    p.write_text(json.dumps(doc))
    with pytest.raises(ProfileError, match="'corun'"):
        load_latency_profile(p)


@pytest.fixture
def profile_files(tmp_path):
    big_corun = {"model": "big", "batch_size": 4, "steps": 100, "mean_step_ms": 27.0}
    small_corun = {"model": "small", "batch_size": 1, "steps": 900, "mean_step_ms": 2.0}
    docs = {"s0": _profile_doc({1: 2.0, 4: 2.2, 16: 2.6}, model="small", sha="a"),
            "s1": _profile_doc({1: 26.0, 4: 27.0, 16: 30.0}, model="big", sha="b"),
            "c0": _profile_doc({1: 5.6, 4: 6.6, 16: 9.4}, model="small", sha="a", corun=big_corun),
            "c1": _profile_doc({1: 27.0, 16: 31.5}, model="big", sha="b", corun=small_corun),
            "c0eager": _profile_doc({1: 9.0}, model="small", sha="a", corun=big_corun, cuda_graph=False),
            "c0low": _profile_doc({1: 1.5, 4: 6.6}, model="small", sha="a", corun=big_corun)}
    out = {}
    for name, doc in docs.items():
        out[name] = tmp_path / f"{name}.json"
        out[name].write_text(json.dumps(doc))
    trace = tmp_path / "t.jsonl"
    write_synthetic_trace(trace, [[0.7, 0.3], [1.0, 0.0]], [[1, 0], [1, 0]], n_requests=20, steps_per_request=20)
    out["trace"] = trace
    return out


def test_system_assembles_solo_and_corun_curves(run_main, profile_files, tmp_path):
    f = profile_files
    base = ["system", "--trace", f["trace"], "--delta-ms", "0.1", "--latency-profile", f["s0"], f["s1"]]
    r = run_main(*base, "--corun-profile", f["c0"], f["c1"], "--out", tmp_path / "spec.json")
    assert r.returncode == 0, r.stderr
    raw = json.load(open(tmp_path / "spec.json"))
    assert raw["corun_latency"][0] == {"batch_size": [1, 4, 16], "step_latency_ms": [5.6, 6.6, 9.4]}
    assert raw["corun_latency"][1] == {"batch_size": [1, 16], "step_latency_ms": [27.0, 31.5]}
    spec = load_spec(tmp_path / "spec.json")
    assert spec.has_corun
    assert spec.corun_latency_ms(0, 4) == pytest.approx(6.6) and spec.corun_latency_ms(0, 10) == pytest.approx(8.0)
    assert spec.latency_ms(0, 4) == pytest.approx(2.2)
    prov = spec.provenance["corun_latency"]
    assert prov[0]["corun"]["model"] == "big" and prov[0]["ratio_to_solo"]["1"] == pytest.approx(2.8)
    assert prov[1]["ratio_to_solo"] == {"1": pytest.approx(27 / 26), "16": pytest.approx(31.5 / 30)}
    # 'none': that model keeps its solo latency when co-running
    r = run_main(*base, "--corun-profile", f["c0"], "none", "--out", tmp_path / "spec1.json")
    assert r.returncode == 0, r.stderr
    spec1 = load_spec(tmp_path / "spec1.json")
    assert spec1.corun_latency_ms(1, 4) == spec1.latency_ms(1, 4)
    assert json.load(open(tmp_path / "spec1.json"))["corun_latency"][1] is None
    # without the flag the spec has no co-running field at all
    r = run_main(*base, "--out", tmp_path / "spec0.json")
    assert r.returncode == 0 and "corun_latency" not in json.load(open(tmp_path / "spec0.json"))
    # a co-running median below the solo one is a warning, not an error
    r = run_main(*base, "--corun-profile", f["c0low"], "none", "--out", tmp_path / "low.json")
    assert r.returncode == 0, r.stderr
    assert "co-running median is below the solo one at b = 1" in r.stderr


def test_routing_adds_corun_tables_to_given_latencies(run_main, profile_files, tmp_path):
    f = profile_files
    r = run_main("routing", "--trace", f["trace"], "--L", "2", "26", "--corun-profile", "none", f["c1"],
                 "--out", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    spec = load_spec(tmp_path / "r.json")
    assert spec.corun_latency_ms(0, 3) == spec.latency_ms(0, 3) == 2.0
    assert spec.corun_latency_ms(1, 1) == pytest.approx(27.0) and spec.corun_latency_ms(1, 16) == pytest.approx(31.5)
    assert_error(run_main("routing", "--trace", f["trace"], "--corun-profile", f["c0"], "none"),
                 "--corun-profile", "--L or --latency-profile")


def test_system_corun_bad_input(run_main, profile_files, tmp_path):
    f = profile_files
    base = ["system", "--trace", f["trace"], "--delta-ms", "0.1", "--latency-profile", f["s0"], f["s1"]]
    assert_error(run_main(*base, "--corun-profile", f["c0"]), "--corun-profile", "one per model")
    assert_error(run_main(*base, "--corun-profile", f["s0"], "none"), "--corun-profile", "solo profile")
    assert_error(run_main(*base, "--corun-profile", f["c1"], f["c0"]), "--corun-profile", "config_sha256")
    assert_error(run_main(*base, "--corun-profile", "none", "none"), "--corun-profile", "'none'")
    assert_error(run_main(*base, "--corun-profile", tmp_path / "nope.json", "none"), "--corun-profile",
                 "does not exist")
    assert_error(run_main(*base, "--corun-profile", f["c0eager"], "none"), "mix", "model 0 co-running",
                 "--allow-mixed")
    assert_error(run_main("system", "--trace", f["trace"], "--latency-profile", f["c0"], f["s1"]),
                 "--latency-profile", "co-running")
    junk = tmp_path / "junk.json"
    junk.write_text("{")
    assert_error(run_main(*base, "--corun-profile", junk, "none"), "--corun-profile")
    assert not os.path.exists(os.path.join("runs", "profile")) or not os.listdir(os.path.join("runs", "profile"))


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True])
def test_gpu_corun_profile_in_two_streams(tmp_path, configs, graph):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from profiler.latency import load_model, profile_latency
    small, large = configs
    model, name = load_model(config_path=small, dtype="bf16", device="cuda")
    other, other_name = load_model(config_path=large, dtype="bf16", device="cuda", seed=1)
    prof = profile_latency(model, name=name, batch_sizes=[1, 4], context=32, device="cuda", dtype="bf16",
                           cuda_graph=graph, warmup=2, steps=10, corun_model=other, corun_name=other_name,
                           corun_batch=2)
    assert prof.timing == "cuda_events" and prof.cuda_graph is graph
    assert prof.corun["runner"] == "own CUDA stream, second thread" and prof.corun["cuda_graph"] is graph
    assert prof.corun["steps"] >= 2 and prof.corun["mean_step_ms"] > 0
    assert all(s.median_ms > 0 and s.count == 10 for s in prof.batches)
    # the device is idle afterwards: the other model's thread has stopped and its stream drained
    torch.cuda.synchronize()
    solo = profile_latency(model, name=name, batch_sizes=[1], context=32, device="cuda", dtype="bf16",
                           cuda_graph=graph, warmup=2, steps=5)
    assert solo.corun is None


def test_system_measures_corun_curves_of_two_models(run_main, configs, profile_files, tmp_path):
    small, large = configs
    trace = profile_files["trace"]
    r = run_main("system", "--model", small, large, "--trace", trace, "--batch-sizes", "1", "2", "--context", "8",
                 "--steps", "2", "--warmup-steps", "1", "--threads", "1", "--corun-batch-size", "2",
                 "--delta-ms", "auto", "--out", tmp_path / "spec.json", "--quiet")
    assert r.returncode == 0, r.stderr
    spec = load_spec(tmp_path / "spec.json")
    assert spec.has_corun and spec.batch_dependent
    prov = spec.provenance["corun_latency"]
    assert [p["corun"]["model"] for p in prov] == ["large", "small"]
    assert all(p["corun"]["batch_size"] == 2 and p["batch_size"] == [1, 2] for p in prov)
    run = [d for d in os.listdir(os.path.join("runs", "profile")) if d.endswith("-system")]
    assert len(run) == 1
    files = sorted(os.listdir(os.path.join("runs", "profile", run[0])))
    assert files == ["latency-0.json", "latency-1.json", "latency-corun-0.json", "latency-corun-1.json"]
    # bad input: one error line naming the flag, nothing measured
    base = ["system", "--trace", trace, "--batch-sizes", "1", "--context", "4", "--steps", "1"]
    assert_error(run_main(*base, "--model", small, large, "--corun-batch-size", "0"), "--corun-batch-size")
    assert_error(run_main(*base, "--model", small, large, small, "--corun-batch-size", "2"), "--corun-batch-size",
                 "3 models")
    # (the measurement flags of base are refused with --latency-profile too: nothing is measured then)
    assert_error(run_main("system", "--trace", trace, "--latency-profile", profile_files["s0"], profile_files["s1"],
                          "--corun-batch-size", "2"), "--corun-batch-size", "--corun-profile")
    assert_error(run_main(*base, "--latency-profile", profile_files["s0"], profile_files["s1"]), "--batch-sizes",
                 "--latency-profile")
