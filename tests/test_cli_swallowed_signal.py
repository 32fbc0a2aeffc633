"""A SIGTERM that lands while Python code runs inside a C callback (as llvmlite's object-cache callback does
while numba compiles a kernel) raises in the callback, where Python can only report it as unraisable; the
command must still end as terminated (exit 143, one ``error: terminated`` line), not run on and exit 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = textwrap.dedent("""
    import ctypes, os, sys, time
    from tr_core.cli import run_cli

    CALLBACK = ctypes.CFUNCTYPE(None)

    def inside_c():
        open(sys.argv[1], "w").close()          # tell the test we are inside the callback
        end = time.monotonic() + 5.0
        while time.monotonic() < end and not os.path.exists(sys.argv[1] + ".sent"):
            time.sleep(0.01)
        time.sleep(0.2)                          # the signal arrives while we are still in here

    def main(argv):
        cb = CALLBACK(inside_c)
        ctypes.CFUNCTYPE(None, CALLBACK)(lambda f: f())(cb)   # Python -> C -> Python
        for _ in range(300):                     # after the callback: plain work the signal must stop
            time.sleep(0.01)
        print("finished")
        return 0

    sys.exit(run_cli(main))
""")


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or os.name != "posix", reason="POSIX signals")
def test_sigterm_swallowed_in_a_c_callback_still_terminates(tmp_path):
    script = tmp_path / "cmd.py"
    script.write_text(SCRIPT)
    flag = tmp_path / "inside"
    proc = subprocess.Popen([sys.executable, str(script), str(flag)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not flag.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    (tmp_path / "inside.sent").touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, (proc.returncode, out, err)
    assert "finished" not in out
    assert err.strip().splitlines()[-1] == "error: terminated", err
