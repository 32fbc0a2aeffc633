"""Two processes, one cache or one output: neither corrupts the other.

Real processes, started together: two ``tr-optimize`` runs on overlapping N ranges sharing one ``--cache-dir``,
and two ``tr-autotune run`` writing the same thresholds file.  Every folder is in the test's tmp_path; the
timeouts only guard against a hang (nothing here is timed).
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import tool

SYSTEM = ["--p", "0.35", "--L", "6", "27.9"]
VARYING = ("seconds", "cached")  # how long a row took, and whether it came from the cache


def _start(name, args, cwd):
    return subprocess.Popen(tool(name) + [str(a) for a in args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(proc, timeout=600):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("a process did not finish")
    assert proc.returncode == 0 and "Traceback" not in err, (proc.returncode, err)
    return out


def _temp_files(folder):
    return [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs
            if f.endswith(".tmp") or f.startswith(".tmp")]


def _rows(text):
    return {r["N"]: {k: v for k, v in r.items() if k not in VARYING} for r in json.loads(text)["results"]}


@pytest.mark.slow
def test_two_optimizations_share_one_cache(tmp_path):
    cache = tmp_path / "cache"
    opts = ["--workers", "1", "--format", "json", "--quiet"]
    a = _start("tr-optimize", [*SYSTEM, "--N", "1-9", "--cache-dir", cache, *opts], tmp_path)
    b = _start("tr-optimize", [*SYSTEM, "--N", "4-11", "--cache-dir", cache, *opts], tmp_path)
    ra, rb = _rows(_finish(a)), _rows(_finish(b))
    alone = _rows(_finish(_start("tr-optimize", [*SYSTEM, "--N", "1-11", "--no-cache", *opts], tmp_path)))
    assert ra == {n: alone[n] for n in range(1, 10)}
    assert rb == {n: alone[n] for n in range(4, 12)}
    entries = [os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs]
    assert entries and _temp_files(tmp_path) == []
    for path in entries:  # every entry whole
        with open(path) as f:
            assert json.load(f)["throughput_tok_s"] > 0


@pytest.mark.slow
def test_two_autotune_runs_write_one_thresholds_file(tmp_path):
    """Different inputs, one file: the last writer's complete table stays; each run prints its own table."""
    from tr_model.thresholds import ThresholdTable
    runs = [_start("tr-autotune", ["run", "--p", p, "--L", "6", "27.9", "--N", "14", "--thresholds", "th.json",
                                   "--format", "json", "--quiet"], tmp_path) for p in ("0.35", "0.3")]
    docs = [json.loads(_finish(proc)) for proc in runs]
    for doc, p in zip(docs, (0.35, 0.3)):  # each run's own, complete table
        assert doc["complete"] and doc["spec"]["routing_matrix"][0][1] == p
    with open(tmp_path / "th.json") as f:
        final = json.load(f)
    assert final in docs
    table = ThresholdTable.load(tmp_path / "th.json")
    assert table.complete and table.max_concurrency == 14
    assert sorted(os.listdir(tmp_path)) == ["th.json"]  # no temporary or lock file left
