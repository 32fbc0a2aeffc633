"""Ctrl-C is clean: ``error: interrupted``, exit 130, no traceback, caches and output files intact.

A real SIGINT is sent to a subprocess in the middle of a long computation (one worker, so the interrupt
lands in the process that runs the compiled kernels; numba reports it as ``SystemError: CPUDispatcher(...)
returned a result with an exception set``, which the CLI must still read as an interrupt).  The signal is
sent once the computation has visibly started (a cache entry or the thresholds file exists), never after
a fixed sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import tool


def _wait_for(predicate, proc, limit_s=240.0):
    t0 = time.monotonic()
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"the command ended before it could be interrupted: {proc.communicate()}")
        if time.monotonic() - t0 > limit_s:
            proc.kill()
            pytest.fail("the computation did not start")
        time.sleep(0.05)


def _interrupt(proc):
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the command did not stop after Ctrl-C")
    return proc.returncode, out, err


def _sigint_default():
    # a suite started as a background job (``cmd &`` in a script) inherits SIGINT ignored, and Python
    # then installs no KeyboardInterrupt handler in the child: give the child the terminal's default
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _temp_files(folder):
    return [os.path.join(d, f) for d, _, files in os.walk(folder) for f in files if f.endswith(".tmp")]


@pytest.mark.slow
def test_tr_optimize_one_worker(tmp_path):
    cache = tmp_path / "cache"
    out = tmp_path / "r.json"
    proc = subprocess.Popen(tool("tr-optimize") + ["--p", "0.35", "--L", "6", "27.9", "--N", "60", "--workers", "1",
                                                   "--cache-dir", str(cache), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    _wait_for(lambda: cache.exists() and any(f.endswith(".json") for _, _, fs in os.walk(cache) for f in fs), proc)
    time.sleep(0.5)                                   # deeper into the sweep
    code, stdout, err = _interrupt(proc)
    assert code == 130 and err == "error: interrupted\n" and stdout == "", (code, err)
    assert not out.exists() and _temp_files(tmp_path) == []
    for d, _, files in os.walk(cache):                # every cache entry is whole
        for f in files:
            json.load(open(os.path.join(d, f)))


def test_tr_autotune_run(tmp_path):
    from tr_model.thresholds import ThresholdTable
    th = tmp_path / "th.json"
    proc = subprocess.Popen([sys.executable, "-m", "tr_model.autotune_cli", "run", "--p", "0.35", "--L", "6", "27.9",
                             "--N", "60", "--thresholds", str(th)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    _wait_for(th.exists, proc)
    time.sleep(0.5)
    code, stdout, err = _interrupt(proc)
    assert code == 130 and err.splitlines()[-1] == "error: interrupted" and stdout == "", (code, err)
    assert "Traceback" not in err and len([ln for ln in err.splitlines() if ln.startswith("error:")]) == 1
    assert _temp_files(tmp_path) == []
    t = ThresholdTable.load(th)                       # the rows written so far, readable
    assert 1 <= t.covered_concurrency < 60
