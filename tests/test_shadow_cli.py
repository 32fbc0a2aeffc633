"""``tr-shadow`` end to end: every subcommand, every output format, and bad input (``error:``, exit 2)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys

import pytest

from shadow_prefill.cli import main

MODELS = {"tiny": {"size": "1B", "input_price": 0.1, "output_price": 0.2},
          "mid": {"size": "8B", "input_price": 0.3, "output_price": 0.6},
          "big": {"size": "70B", "input_price": 1.0, "output_price": 2.0}}


@pytest.fixture
def matrix(tmp_path):
    qs = []
    for i in range(60):
        qs.append({"question": "word " * (5 + i % 7), "cluster_id": i // 20,
                   "scores": {"tiny": float(i % 2), "mid": float(i % 3 == 0), "big": float(i % 5 != 0)}})
    q = tmp_path / "queries.json"
    q.write_text(json.dumps(qs, indent=1))
    (tmp_path / "models.json").write_text(json.dumps(MODELS, indent=1))
    return q


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_stats_matrix_all_pairs_formats(capsys, matrix, tmp_path):
    rc, out, err = run(capsys, "stats", "--matrix", str(matrix), "--session-length", "fixed:6", "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["tool"] == "tr-shadow stats"
    assert [r["models"] for r in doc["results"]] == [["tiny", "mid"], ["tiny", "big"], ["mid", "big"]]
    r = doc["results"][0]
    assert r["calls"] == 60 and r["sessions"] == 10
    for k in ("switch_share", "hit_all", "hit_switch", "hit_all_cap", "prompt_switch_p99_tokens"):
        assert k in r
    assert r["cost"]["routed_usd"] > 0 and set(r["accuracy"]) == {"routed", "only:tiny", "only:mid"}
    assert [w["source"] for w in doc["workloads"]] == ["matrix"]
    rc, out, _ = run(capsys, "stats", "--matrix", str(matrix), "--format", "csv", "--pair", "big", "tiny")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 1 and rows[0]["models"] == "tiny/big" and "cost.routed_usd" in rows[0]
    rc, out, _ = run(capsys, "stats", "--matrix", str(matrix))
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["workload", "models", "calls"] and len(lines) == 2 + 3
    # --out writes the file and prints nothing
    dest = tmp_path / "stats.json"
    rc, out, _ = run(capsys, "stats", "--matrix", str(matrix), "--format", "json", "--out", str(dest))
    assert rc == 0 and out == "" and len(json.loads(dest.read_text())["results"]) == 3


def test_sessions_then_stats_on_the_trace(capsys, matrix, tmp_path):
    trace = tmp_path / "t.jsonl"
    rc, out, err = run(capsys, "sessions", "--matrix", str(matrix), "--pair", "tiny", "big", "--out", str(trace),
                       "--seed", "3")
    assert rc == 0 and err.startswith("note: wrote 60 calls in ") and err.endswith(f" sessions to {trace}\n"), err
    assert len(trace.read_text().splitlines()) == 60
    rc, out, err = run(capsys, "stats", "--trace", str(trace), "--prices", str(tmp_path / "models.json"),
                       "--format", "json", "--seed", "3", "--cache-capacity", "5000", "--cache-capacity", "big=2000")
    assert rc == 0, err
    r = json.loads(out)["results"][0]
    assert r["models"] == ["tiny", "big"] or r["models"] == ["big", "tiny"]
    assert r["cache_capacity_tokens"] == {"tiny": 5000, "big": 2000}
    assert r["accuracy"]["routed"] >= 0
    # the same numbers as routing the matrix directly
    rc, out2, _ = run(capsys, "stats", "--matrix", str(matrix), "--pair", "tiny", "big", "--seed", "3",
                      "--format", "json", "--cache-capacity", "5000", "--cache-capacity", "big=2000")
    r2 = json.loads(out2)["results"][0]
    for k in ("calls", "switch_share", "hit_all", "hit_switch", "hit_all_cap", "prompt_switch_p99_tokens"):
        assert r[k] == r2[k]
    assert r["cost"]["routed_usd"] == pytest.approx(r2["cost"]["routed_usd"])


def test_several_workloads_in_one_table(capsys, matrix, tmp_path):
    t1, t2 = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    assert run(capsys, "sessions", "--synthetic", "--sessions", "4", "--out", str(t1))[0] == 0
    assert run(capsys, "sessions", "--synthetic", "--sessions", "6", "--seed", "1", "--out", str(t2))[0] == 0
    rc, out, err = run(capsys, "stats", "--trace", str(t1), "--trace", str(t2), "--matrix", str(matrix),
                       "--pair", "tiny", "mid", "--synthetic", "--sessions", "5", "--format", "json")
    assert rc == 0, err
    doc = json.loads(out)
    assert [r["workload"] for r in doc["results"]] == ["queries", "one", "two", "synthetic"]
    assert [r["sessions"] for r in doc["results"]][1:] == [4, 6, 5]
    assert len(doc["workloads"]) == 4
    assert "single workload" in bad(capsys, "stats", "--trace", str(t1), "--synthetic", "--name", "x")
    assert "give a workload" in bad(capsys, "stats", "--format", "json")


def test_synthetic_with_latency(capsys, tmp_path):
    rc, out, err = run(capsys, "stats", "--synthetic", "--sessions", "30", "--switch-prob", "0.4", "--latency",
                       "--model-config", "small=qwen3-0.6b", "--model-config", "large=qwen3-8b", "--gpu", "h200",
                       "--format", "json")
    assert rc == 0, err
    r = json.loads(out)["results"][0]
    assert r["latency"]["switch_slowdown"] > 1.0
    assert 0.3 < r["switch_share"] < 0.5
    rc, out, _ = run(capsys, "stats", "--synthetic", "--sessions", "30", "--latency", "--model-config",
                     "small=qwen3-0.6b", "--model-config", "large=qwen3-8b")
    assert "sw-slow" in out.splitlines()[0]
    # a mapping for a model of the first pair only stays valid across all pairs of a matrix
    m = tmp_path / "q.json"
    m.write_text(json.dumps([{"question": "x " * 9, "scores": {"qwen3-0.6b": i % 2, "tiny": 1, "qwen3-8b": i % 3}}
                             for i in range(12)]))
    (tmp_path / "models.json").write_text(json.dumps({"qwen3-0.6b": {"input_price": 0.1, "output_price": 0.1},
                                                      "tiny": {"input_price": 0.05, "output_price": 0.05},
                                                      "qwen3-8b": {"input_price": 0.3, "output_price": 0.3}}))
    rc, out, err = run(capsys, "stats", "--matrix", str(m), "--latency", "--model-config", "tiny=qwen3-1.7b",
                       "--format", "json")
    assert rc == 0, err
    assert len(json.loads(out)["results"]) == 3


def test_latency_command(capsys, tmp_path):
    rc, out, _ = run(capsys, "latency", "--model", "llama-3.1-70b", "--format", "json", "--prompt", "4096")
    d = json.loads(out)
    assert rc == 0 and d["tp"] == 4 and d["ttft_slo_s"] >= 1.0 and d["kv_bytes_per_token"] == 327680
    rc, out, _ = run(capsys, "latency", "--model", "qwen3-8b", "--gpu", "h200", "--tp", "2")
    assert "TPOT SLO" in out and "tensor parallel" in out
    cfg = tmp_path / "tiny"
    cfg.mkdir()
    (cfg / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                                 "intermediate_size": 128, "vocab_size": 100}))
    rc, out, _ = run(capsys, "latency", "--model", str(cfg), "--format", "json")
    assert rc == 0 and json.loads(out)["name"] == "tiny"
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps({"schema_version": 1, "kind": "iteration_points",
                                "points": [{"n_decode": b, "decode_context": 100 * b, "time_ms": 5 + 0.1 * b}
                                           for b in (1, 2, 4, 8)]}))
    saved = tmp_path / "lm.json"
    rc, out, _ = run(capsys, "latency", "--profile", str(prof), "--save-model", str(saved))
    assert rc == 0 and "fit R^2" in out
    # a saved latency model plugs into stats --latency
    rc, out, err = run(capsys, "stats", "--synthetic", "--sessions", "5", "--latency", "--model-config",
                       f"small={saved}", "--model-config", "large=qwen3-8b", "--format", "json")
    assert rc == 0, err
    assert json.loads(out)["results"][0]["latency"]["ttft_all_s"] > 0


def bad(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_bad_inputs(capsys, matrix, tmp_path):
    tr = tmp_path / "bad.jsonl"
    tr.write_text(json.dumps({"session": "a", "step": 0, "model": "m", "prompt_tokens": 5, "new_input_tokens": 5,
                              "output_tokens": 1, "gap_s": 0, "append_only": True}) + "\n{broken\n")
    assert f"{tr}:2: invalid JSON" in bad(capsys, "stats", "--trace", str(tr))
    assert "no such file" in bad(capsys, "stats", "--trace", str(tmp_path / "nope.jsonl"))
    assert "--pair applies to --matrix only" in bad(capsys, "stats", "--synthetic", "--pair", "a", "b")
    assert "not in the matrix" in bad(capsys, "stats", "--matrix", str(matrix), "--pair", "tiny", "huge")
    assert "session length" in bad(capsys, "stats", "--synthetic", "--session-length", "often")
    assert "lognormal" in bad(capsys, "stats", "--synthetic", "--tool-tokens", "lots")
    assert "not in the workload" in bad(capsys, "stats", "--synthetic", "--cache-capacity", "x=5")
    assert "integer" in bad(capsys, "stats", "--synthetic", "--cache-capacity", "many")
    assert "context window" in bad(capsys, "stats", "--synthetic", "--context-window", "100")
    assert "--model-config" in bad(capsys, "stats", "--synthetic", "--sessions", "3", "--latency")
    assert "no built-in architecture" in bad(capsys, "latency", "--model", "gpt-17")
    assert "neither divides" in bad(capsys, "latency", "--model", "qwen3-8b", "--tp", "3")
    assert "--matrix needs --pair" in bad(capsys, "sessions", "--matrix", str(matrix), "--out", str(tmp_path / "o"))
    prices = tmp_path / "p.json"
    prices.write_text(json.dumps({"small": {"input_price": 1, "output_price": 1}}))
    assert "no price" in bad(capsys, "stats", "--synthetic", "--sessions", "3", "--prices", str(prices))
    assert "--tokenizer applies to --matrix only" in bad(capsys, "stats", "--synthetic", "--tokenizer", "x")
    # nothing half-written: a failed sessions run leaves no file
    out = tmp_path / "never.jsonl"
    bad(capsys, "sessions", "--trace", str(tr), "--out", str(out))
    assert not out.exists()


@pytest.mark.parametrize("argv", [["sessions", "--out", "x"], ["stats", "--synthetic", "--cached-fraction", "2"],
                                  ["sessions", "--synthetic", "--trace", "t", "--out", "x"],
                                  ["stats", "--synthetic", "--format", "xml"], ["nope"],
                                  ["stats", "--synthetic", "--session-rate", "0"],
                                  ["stats", "--synthetic", "--sessions", "0"],
                                  ["stats", "--synthetic", "--sessions", "1e3"],
                                  ["stats", "--synthetic", "--sessions"],
                                  ["latency", "--model", "x", "--profile", "p.json"],
                                  ["latency", "--prompt", "-5", "--model", "qwen3-8b"],
                                  ["stats"], ["stats", "--synthetic", "--replay-tpot-s", "inf"]])
def test_usage_errors_exit_2(capsys, argv):
    # argparse's own errors follow the contract: one error: line, exit 2, no usage block, no exception
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err


def test_output_targets_and_formats(capsys, tmp_path):
    # --out writes what would go to stdout, the extension chooses the format; a folder or a device is refused
    rc, out, err = run(capsys, "stats", "--synthetic", "--sessions", "5", "--out", str(tmp_path / "s.json"))
    assert rc == 0 and out == "" and json.loads((tmp_path / "s.json").read_text())["kind"] == "switch_tax_stats"
    rc, out, err = run(capsys, "stats", "--synthetic", "--sessions", "5", "--out", str(tmp_path / "s.csv"))
    assert rc == 0 and (tmp_path / "s.csv").read_text().startswith("workload,models,")
    assert "folder" in bad(capsys, "stats", "--synthetic", "--sessions", "5", "--out", str(tmp_path))
    assert "regular file" in bad(capsys, "stats", "--synthetic", "--sessions", "5", "--out", os.devnull)
    assert "regular file" in bad(capsys, "sessions", "--synthetic", "--sessions", "5", "--out", os.devnull)
    link = tmp_path / "null"
    link.symlink_to(os.devnull)
    assert "regular file" in bad(capsys, "latency", "--model", "qwen3-8b", "--out", str(link))
    assert link.is_symlink() and os.readlink(link) == os.devnull
    # sessions without --out writes the trace to stdout; the same lines as the file
    rc, out, _ = run(capsys, "sessions", "--synthetic", "--sessions", "4", "--seed", "2")
    assert rc == 0
    run(capsys, "sessions", "--synthetic", "--sessions", "4", "--seed", "2", "--out", str(tmp_path / "t.jsonl"))
    assert out == (tmp_path / "t.jsonl").read_text() and len(out.splitlines()) > 4
    # latency has csv too, and a ratio prints as 1.111x in tables
    rc, out, _ = run(capsys, "latency", "--model", "qwen3-8b", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rc == 0 and len(rows) == 1 and float(rows[0]["ttft_slo_s"]) >= 1.0
    rc, out, _ = run(capsys, "stats", "--synthetic", "--sessions", "30", "--latency", "--model-config",
                     "small=qwen3-0.6b", "--model-config", "large=qwen3-8b")
    head, _, row = out.splitlines()
    assert head.split()[-1] == "sw-slow" and re.fullmatch(r"\d+\.\d{3}x", row.split()[-1])


@pytest.mark.parametrize("old", [["--models", "models.json"], ["--gap", "3,0.5"], ["--replay-tpot", "0.05"]])
def test_old_spellings_are_refused(capsys, matrix, tmp_path, old):
    rc, out_new, err = run(capsys, "stats", "--matrix", str(matrix), "--pair", "tiny", "big", "--prices",
                           str(tmp_path / "models.json"), "--gap-s", "3,0.5", "--replay-tpot-s", "0.05",
                           "--format", "json")
    assert rc == 0 and err == "" and out_new
    rc, out, err = run(capsys, "stats", "--matrix", str(matrix), "--pair", "tiny", "big", *old)
    assert rc == 2 and out == ""
    assert err.startswith(f"error: unrecognized arguments: {old[0]}") and err.count("\n") == 1, err


def test_sessions_says_what_it_wrote_in_a_note(capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    rc, out, err = run(capsys, "sessions", "--synthetic", "--sessions", "4", "--seed", "2", "--out", str(trace))
    n = len(trace.read_text().splitlines())
    assert rc == 0 and out == "" and err == f"note: wrote {n} calls in 4 sessions to {trace}\n"
    rc, out, err = run(capsys, "sessions", "--synthetic", "--sessions", "4", "--seed", "2", "--out", str(trace),
                       "--quiet")
    assert rc == 0 and out == "" and err == "" and len(trace.read_text().splitlines()) == n
    rc, out, err = run(capsys, "sessions", "--synthetic", "--sessions", "4", "--seed", "2")  # stdout: no note
    assert rc == 0 and len(out.splitlines()) == n and err == ""


def test_missing_matrix_is_reported_missing(capsys, tmp_path):
    # before: "no price file: .../models.json does not exist" for a matrix path with a typo
    gone = tmp_path / "nope" / "queries.json"
    err = bad(capsys, "stats", "--matrix", str(gone))
    assert f"{gone}: no such file" in err and "price" not in err
    q = tmp_path / "q.json"
    q.write_text(json.dumps([{"question": "x", "scores": {"a": 1, "b": 0}}]))
    err = bad(capsys, "stats", "--matrix", str(q))
    assert "no price file" in err and "--prices" in err


def test_subprocess_entry_point(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    r = subprocess.run([sys.executable, "-m", "shadow_prefill.cli", "stats", "--synthetic", "--sessions", "5",
                        "--format", "csv"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("workload,models,sessions,calls")
    tr = tmp_path / "bad.jsonl"
    tr.write_text('{"session": "a"}\n')
    r = subprocess.run([sys.executable, "-m", "shadow_prefill.cli", "stats", "--trace", str(tr)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2
    assert r.stderr == f"error: {tr}:1: missing field 'step'\n"


@pytest.mark.parametrize("wrapped", [False, True])
def test_interrupt_is_one_line_and_writes_nothing(capsys, monkeypatch, tmp_path, wrapped):
    # Ctrl-C inside a compiled kernel surfaces as numba's SystemError whose context is the KeyboardInterrupt;
    # before, that was a 50-line traceback and exit 1
    import shadow_prefill.cli as cli

    def interrupted(*a, **k):
        if not wrapped:
            raise KeyboardInterrupt
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise SystemError("CPUDispatcher(<function issue_times>) returned a result with an exception set")

    monkeypatch.setattr(cli, "compute_switch_tax", interrupted)
    out = tmp_path / "stats.json"
    rc = main(["stats", "--synthetic", "--sessions", "3", "--out", str(out)])
    o, err = capsys.readouterr()
    assert rc == 130 and err == "error: interrupted\n" and o == ""
    assert os.listdir(tmp_path) == []
