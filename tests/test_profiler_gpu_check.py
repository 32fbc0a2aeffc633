"""benchmarks/gpu_check.sh on a machine without CUDA: it says so, exits 0, and leaves at most 8 files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def _run(tmp_path, *args, python=sys.executable):
    env = dict(os.environ, OUT=str(tmp_path / "out"), PYTHON=python, TMPDIR=str(tmp_path))
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


def test_without_cuda_says_so_and_exits_0(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the script would run the real GPU check")
    r = _run(tmp_path)
    assert r.returncode == 0, r.stderr
    assert "no CUDA device" in r.stdout and "exit 0" in r.stdout
    files = sorted(os.listdir(tmp_path / "out"))
    assert "summary.txt" in files and len(files) <= 8
    assert "no CUDA device" in (tmp_path / "out" / "summary.txt").read_text()
    # the work folder is removed; nothing else is left in TMPDIR
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_without_torch_says_so_and_exits_0(tmp_path):
    r = _run(tmp_path, python="/bin/false")
    assert r.returncode == 0 and "no python with torch" in r.stdout


def test_lists_steps_and_refuses_bad_arguments(tmp_path):
    pytest.importorskip("torch")
    r = _run(tmp_path, "--list")
    assert r.returncode == 0
    names = [line.split()[0] for line in r.stdout.splitlines()]
    assert names[:2] == ["gpu_tests", "profiles_qwen3_32b"] and len(names) >= 3
    r = _run(tmp_path, "--budget-s", "eight")
    assert r.returncode == 2 and r.stderr.startswith("error:")
    r = _run(tmp_path, "--bogus")
    assert r.returncode == 2 and r.stderr.startswith("error:")
