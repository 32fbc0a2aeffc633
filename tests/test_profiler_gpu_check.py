"""benchmarks/gpu_check.sh: on a machine without CUDA it says so, exits 0, and leaves at most 8 files; with a
stand-in interpreter that claims torch and CUDA (and records every call) every step's whole command reaches
it, and each finished step's log and files are in $OUT even when a later step hangs or the run is killed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
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
    names = [line.split()[0] for line in _plan_rows(r.stdout)]
    assert names[:2] == ["gpu_tests", "corun"] and "runtime_vs_model" in names and len(names) >= 6
    r = _run(tmp_path, "--budget-s", "eight")
    assert r.returncode == 2 and r.stderr.startswith("error:")
    r = _run(tmp_path, "--bogus")
    assert r.returncode == 2 and r.stderr.startswith("error:")

    r = _run(tmp_path, "--only", "gpu_tests,nonsense")
    assert r.returncode == 2 and r.stderr.startswith("error:") and "nonsense" in r.stderr
    r = _run(tmp_path, "--step-timeout-s", "0")
    assert r.returncode == 2 and r.stderr.startswith("error:")


# ----------------------------------------------------------------------------------------------------
# a stand-in interpreter: claims torch and CUDA, records every call, leaves a result file where told to

STANDIN = r"""#!{python}
import json, os, sys, time
argv = sys.argv[1:]
step_dir = os.environ.get("STEP_DIR", "")
with open(os.environ["STANDIN_LOG"], "a") as f:
    f.write(json.dumps({{"argv": argv, "step_dir": step_dir}}) + "\n")
if argv[:1] == ["-"]:                          # the environment probe reads its program from stdin
    sys.stdin.read()
    print("python 3.12.0 torch 2.11.0 cuda 13.0 available True")
    print("device 0: Stand-in H200, 139.8 GiB, 132 SMs")
    sys.exit(0)
if argv[:1] == ["-c"]:                         # import torch; torch.cuda.is_available()
    sys.exit(0)
if argv[:3] == ["-m", "pip", "install"]:
    sys.exit(0)
if argv[:4] == ["-m", "profiler.cli", "latency", "--help"]:
    print(os.environ.get("STANDIN_HELP", "usage: tr-profile latency [--config CONFIG] [--cuda-graph]"))
    sys.exit(0)
step = os.path.basename(step_dir)
print("stand-in ran", step, flush=True)
if step and step == os.environ.get("STANDIN_HANG"):
    open(os.environ["STANDIN_LOG"] + ".hanging", "w").close()
    stop = os.environ["STANDIN_LOG"] + ".stop"
    for _ in range(600):                       # at most 60 s; the test ends it sooner
        if os.path.exists(stop):
            break
        time.sleep(0.1)
    sys.exit(0)
for a in argv:                                 # pytest's report: every test passed, or (STANDIN_SKIP) two skipped
    if a.startswith("--junitxml="):
        with open(a.split("=", 1)[1], "w") as f:
            f.write('<testsuite><testcase name="a"><skipped message="needs CUDA"/></testcase>'
                    '<testcase name="b"><skipped/></testcase></testsuite>' if os.environ.get("STANDIN_SKIP")
                    else '<testsuite><testcase name="a"/></testsuite>')
for flag in ("--out-dir", "--out"):
    if flag in argv:
        path = argv[argv.index(flag) + 1]
        if flag == "--out-dir" or not path.endswith(".json"):
            os.makedirs(path, exist_ok=True)
            path = os.path.join(path, "standin_profile.json")
        with open(path, "w") as f:
            json.dump({{"stand_in": step}}, f)
sys.exit(3 if step == os.environ.get("STANDIN_FAIL") else 0)
"""

SMALL = "data/models/Qwen3-0.6B/config.json"
LARGE = "data/models/Qwen3-32B/config.json"
HELP_WITH_CORUN = ("usage: tr-profile latency [--config CONFIG] [--corun CONFIG] [--corun-batch-size B] "
                   "[--cuda-graph]\n  --corun CONFIG   the other model, decoding meanwhile\n")


def _plan_rows(stdout):
    """The step rows of --list's table (between the setup row and the 'planned:' line)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("(setup"))
    end = next(i for i, line in enumerate(lines) if line.startswith("planned:"))
    return lines[start + 1:end]


def _standin(tmp_path):
    exe = tmp_path / "standin-python"
    exe.write_text(STANDIN.format(python=sys.executable))
    exe.chmod(0o755)
    return exe


def _standin_env(tmp_path, **extra):
    log = tmp_path / "calls.jsonl"
    env = dict(os.environ, OUT=str(tmp_path / "out"), PYTHON=str(_standin(tmp_path)), TMPDIR=str(tmp_path),
               STANDIN_LOG=str(log))
    env.pop("GPU_CHECK_BUDGET_S", None)
    env.update(extra)
    return env, log


def _calls(log):
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def _step_calls(log):
    """{step: [argv, ...]} of the calls made inside steps (the ones with a STEP_DIR)."""
    out = {}
    for c in _calls(log):
        if c["step_dir"]:
            out.setdefault(os.path.basename(c["step_dir"]), []).append((c["argv"], c["step_dir"]))
    return out


def _gpu_test_files():
    files = sorted(f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py")
                   if re.search(r"^@pytest\.mark\.gpu\b", p.read_text(), re.M))
    assert "tests/test_runtime_torch.py" in files and "tests/test_profiler_latency.py" in files
    return files


def _expected(step, d, work, corun_flag=None):
    """The whole argv each step must hand the interpreter (d: the step's folder, work: the run's folder)."""
    bs = ["1", "2", "4", "8", "16"]
    if step == "gpu_tests":
        return [["-m", "pytest", "-q", "-m", "gpu", "-rA", "-p", "no:cacheprovider", f"--junitxml={d}/junit.xml",
                 *_gpu_test_files()]]
    if step == "corun" and corun_flag is None:
        return [["benchmarks/gpu_corun_probe.py", "--small-config", SMALL, "--large-config", LARGE,
                 "--batch-sizes", *bs, "--other-batch-sizes", "1", "4", "16", "--context", "512",
                 "--warmup-steps", "2", "--steps", "6", "--repeats", "3", "--out-dir", d]]
    if step == "corun":
        extra = [corun_flag, "4"] if corun_flag else []
        return [["-m", "profiler.cli", "latency", "--config", a, "--corun", b, *extra, "--cuda-graph",
                 "--context", "512", "--batch-sizes", *bs, "--warmup-steps", "2", "--steps", "6",
                 "--out", f"{d}/{name}_corun.json"]
                for a, b, name in ((SMALL, LARGE, "Qwen3-0.6B"), (LARGE, SMALL, "Qwen3-32B"))]
    if step == "runtime_vs_model":
        return [["benchmarks/gpu_runtime_check.py", "--N", "1,2,4,8,16", "--window-s", "3", "--warmup-s", "1",
                 "--repeats", "1", "--profile-steps", "12", "--sim-steps", "150000", "--budget-s", "<int>",
                 "--out", d]]
    if step == "profiles_qwen3_32b":
        return [["benchmarks/profiler_gpu_profiles.py", "--config", LARGE, "--context", "512", "--batch-sizes", *bs,
                 "--variants", "decode:serving", "extend4:serving", "--warmup-steps", "3", "--steps", "20",
                 "--out-dir", d]]
    if step == "profiles_qwen3_0p6b":
        return [["benchmarks/profiler_gpu_profiles.py", "--config", SMALL, "--context", "512", "--batch-sizes", *bs,
                 "--variants", "decode:serving", "--warmup-steps", "3", "--steps", "30", "--out-dir", d]]
    if step == "roofline":
        profiles = [f"{work}/profiles_qwen3_32b/standin_profile.json", f"{work}/profiles_qwen3_0p6b/standin_profile.json"]
        return [["-m", "profiler.cli", "roofline", *profiles, "--format", "table"],
                ["-m", "profiler.cli", "roofline", *profiles, "--quiet", "--out", f"{d}/roofline.json"]]
    if step == "attention_32b_transformers":
        return [["benchmarks/profiler_gpu_profiles.py", "--config", LARGE, "--context", "512", "--batch-sizes", *bs,
                 "--variants", "decode:transformers", "--warmup-steps", "3", "--steps", "20", "--out-dir", d]]
    if step == "attention_layer":
        return [["benchmarks/profiler_attention_bench.py", "--batch-sizes", "1", "4", "16", "--context", "512",
                 "--repeats", "50"]]
    if step == "timing_overhead":
        return [["benchmarks/profiler_overhead.py", "--batch-sizes", "1", "8", "32", "--context", "512", "--steps", "50",
                 "--repeats", "7", "--out", f"{d}/overhead.json"]]
    raise AssertionError(f"a step this test does not know: {step} (add its expected command here)")


def _check_whole_commands(log, steps=None, corun_flag=None):
    calls = _step_calls(log)
    for step in calls:           # first what arrived, whole (the old reader cut commands at their first newline)
        got = calls[step]
        d = got[0][1]
        work = os.path.dirname(d)
        assert os.path.basename(d) == step
        want = _expected(step, d, work, corun_flag)
        argvs = [a for a, _ in got]
        for a, w in zip(argvs, want):
            if "<int>" in w:  # the runtime check's own budget follows the time left
                k = w.index("<int>")
                assert a[k].isdigit() and int(a[k]) >= 30, a
                a = a[:k] + ["<int>"] + a[k + 1:]
            assert a == w, f"step {step}: the interpreter got\n{a}\nnot\n{w}"
        assert len(argvs) == len(want), f"step {step}: {len(argvs)} calls, expected {len(want)}"
    if steps is not None:
        assert sorted(calls) == sorted(steps), "every step ran, and nothing else"


def _listed_steps(env):
    r = subprocess.run(["bash", str(SCRIPT), "--list", "--budget-s", "100000"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return [line.split()[0] for line in _plan_rows(r.stdout)], r.stdout


def _plan(env, budget):
    r = subprocess.run(["bash", str(SCRIPT), "--list", "--budget-s", str(budget)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = {}
    for line in _plan_rows(r.stdout):
        name, est, timeout, cum, plan = line.split(None, 4)
        rows[name] = (int(est), int(timeout), None if cum == "-" else int(cum), plan)
    total = int(re.search(r"all listed steps: (\d+) s", r.stdout).group(1))
    return rows, total


def test_the_plan_sums_estimates_and_fits_the_budget(tmp_path):
    env, _ = _standin_env(tmp_path)
    rows, total = _plan(env, 420)
    setup = 20
    assert total == setup + sum(est for est, *_ in rows.values())
    planned = [n for n, r in rows.items() if r[2] is not None]
    assert planned == ["gpu_tests", "corun", "profiles_qwen3_32b", "profiles_qwen3_0p6b", "roofline",
                       "runtime_vs_model"]
    cums = [rows[n][2] for n in planned]
    assert cums == sorted(cums) and cums[-1] <= 420
    for n in planned:
        est, timeout, _, plan = rows[n]
        assert timeout == est * 3 // 2 + 20 and plan.startswith("run")
    # a smaller budget: the elastic runtime step is trimmed, then dropped; the fixed steps before it stay
    before = rows["roofline"][2]
    need = int(re.search(r"needs (\d+) s", rows["runtime_vs_model"][3]).group(1))
    assert need < rows["runtime_vs_model"][0]
    small, _ = _plan(env, before + need + 5)
    assert small["runtime_vs_model"][2] == before + need + 5 and "trimmed" in small["runtime_vs_model"][3]
    smaller, _ = _plan(env, before + need - 1)
    assert smaller["runtime_vs_model"][2] is None and smaller["roofline"][2] == before
    # everything, given the time
    big, _ = _plan(env, 100000)
    assert all(r[2] is not None for r in big.values()) and max(r[2] for r in big.values()) == total


def test_every_step_reaches_the_interpreter_whole(tmp_path):
    env, log = _standin_env(tmp_path)
    r = subprocess.run(["bash", str(SCRIPT), "--budget-s", "100000"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    log.rename(tmp_path / "run.jsonl")
    _check_whole_commands(tmp_path / "run.jsonl")
    steps, listing = _listed_steps(env)        # ... and every step of the plan ran
    assert "co-running step: probe" in listing
    log.unlink()
    _check_whole_commands(tmp_path / "run.jsonl", steps)
    summary = (tmp_path / "out" / "summary.txt").read_text()
    for step in steps:
        assert f"{step} rc=0 " in summary
    assert "Stand-in H200" in summary and "0 step(s) failed" in summary
    files = sorted(os.listdir(tmp_path / "out"))
    assert len(files) <= 8 and {"summary.txt", "env.txt", "all.tar.gz"} <= set(files)
    with tarfile.open(tmp_path / "out" / "all.tar.gz") as t:
        names = {n.lstrip("./") for n in t.getnames()}
    for step in steps:
        assert f"{step}.txt" in names
    assert "profiles_qwen3_32b/standin_profile.json" in names and "corun/standin_profile.json" in names
    assert sorted(os.listdir(tmp_path)) == ["out", "run.jsonl", "standin-python"]   # the work folder is gone


@pytest.mark.parametrize("help_text,flag", [(HELP_WITH_CORUN, "--corun-batch-size"),
                                            (HELP_WITH_CORUN.replace(" [--corun-batch-size B]", ""), "")])
def test_corun_step_uses_tr_profile_corun_once_it_exists(tmp_path, help_text, flag):
    env, log = _standin_env(tmp_path, STANDIN_HELP=help_text)
    steps, listing = _listed_steps(env)
    assert "co-running step: tr-profile" in listing
    log.unlink()
    r = subprocess.run(["bash", str(SCRIPT), "--only", "corun"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    _check_whole_commands(log, ["corun"], corun_flag=flag)


def test_a_hung_step_times_out_and_the_others_still_land(tmp_path):
    env, log = _standin_env(tmp_path, STANDIN_HANG="profiles_qwen3_32b", STANDIN_FAIL="corun")
    only = "gpu_tests,corun,profiles_qwen3_32b,profiles_qwen3_0p6b"
    r = subprocess.run(["bash", str(SCRIPT), "--only", only, "--step-timeout-s", "3"], capture_output=True,
                       text=True, env=env, timeout=300)
    (tmp_path / "calls.jsonl.stop").touch()
    assert r.returncode == 1, r.stdout + r.stderr             # a step failed: the run says so
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "gpu_tests rc=0 " in summary and "corun rc=3 " in summary
    assert "profiles_qwen3_32b rc=124 " in summary and "timed out after 3s" in summary
    assert "profiles_qwen3_0p6b rc=0 " in summary and "2 step(s) failed" in summary
    with tarfile.open(tmp_path / "out" / "all.tar.gz") as t:
        names = {n.lstrip("./") for n in t.getnames()}
    assert {"gpu_tests.txt", "corun.txt", "profiles_qwen3_32b.txt", "profiles_qwen3_0p6b.txt",
            "profiles_qwen3_0p6b/standin_profile.json", "corun/standin_profile.json"} <= names
    assert len(os.listdir(tmp_path / "out")) <= 8


def test_gpu_tests_that_skip_on_a_cuda_machine_fail_the_step(tmp_path):
    env, _ = _standin_env(tmp_path, STANDIN_SKIP="1")
    r = subprocess.run(["bash", str(SCRIPT), "--only", "gpu_tests"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 1 and "gpu_tests rc=5 " in r.stdout
    log = (tmp_path / "out" / "gpu_tests.txt").read_text()
    assert "error: 2 gpu test(s) skipped on a CUDA machine" in log


def _start_until_hanging(tmp_path, env):
    p = subprocess.Popen(["bash", str(SCRIPT), "--only", "gpu_tests,corun,profiles_qwen3_32b"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    marker = tmp_path / "calls.jsonl.hanging"
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert p.poll() is None and time.monotonic() < deadline, "the hanging step never started"
        time.sleep(0.05)
    return p


def _finished_steps_are_in_out(tmp_path):
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "gpu_tests rc=0 " in summary and "corun rc=0 " in summary and "profiles_qwen3_32b rc=" not in summary
    with tarfile.open(tmp_path / "out" / "all.tar.gz") as t:
        names = {n.lstrip("./") for n in t.getnames()}
    assert {"gpu_tests.txt", "corun.txt", "corun/standin_profile.json", "summary.txt", "env.txt"} <= names
    assert "stand-in ran corun" in (tmp_path / "out" / "corun.txt").read_text()
    assert len(os.listdir(tmp_path / "out")) <= 8
    return summary, names


def test_a_killed_run_keeps_the_finished_steps(tmp_path):
    env, _ = _standin_env(tmp_path, STANDIN_HANG="profiles_qwen3_32b")
    p = _start_until_hanging(tmp_path, env)
    try:
        os.killpg(p.pid, signal.SIGKILL)          # no trap runs: only what was already published survives
        p.wait(timeout=30)
    finally:
        (tmp_path / "calls.jsonl.stop").touch()   # lets the orphaned stand-in go
    _finished_steps_are_in_out(tmp_path)


def test_a_terminated_run_says_so_and_keeps_the_interrupted_steps_log(tmp_path):
    env, _ = _standin_env(tmp_path, STANDIN_HANG="profiles_qwen3_32b")
    p = _start_until_hanging(tmp_path, env)
    try:
        os.kill(p.pid, signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
    finally:
        (tmp_path / "calls.jsonl.stop").touch()
    assert p.returncode == 143, out
    summary, names = _finished_steps_are_in_out(tmp_path)
    assert "profiles_qwen3_32b interrupted by SIGTERM" in summary
    assert "profiles_qwen3_32b.txt" in names
    assert not [n for n in os.listdir(tmp_path) if n.startswith("gpu_check.")]   # the work folder is gone
