"""Nothing half-written: every output flag of every command, on an error and on SIGTERM.

Each command validates all its inputs before it opens an output, and writes each output under a temporary
name that is renamed at the end.  So:

(i)  an invalid input (a bad value of another flag, validated as late as the command allows) with the
     output absent: exit 2, one ``error:`` line, no output file and no temporary file left anywhere;
(ii) the same with an existing output holding sentinel bytes: the file is untouched (same bytes);
(iii) SIGTERM while the command works (a real process, signalled once its SIGTERM handler is installed and
     its work has visibly started): exit 143, one ``error: terminated`` line, every existing output file
     untouched, no temporary file.

(i) and (ii) run in-process (``run_inproc``); (iii) starts the console scripts of this environment, except
for the commands whose work runs torch models or a live server (tr-profile latency, route-run, system,
serve-bench): there a stand-in for that work sends a real SIGTERM to the test's own process.  ``tr-autotune
run`` resumes by design: SIGTERM leaves its thresholds file either as it was or replaced, whole, by the rows
computed so far.  Every output, run folder and cache points into the test's tmp_path (the commands run with it
as the working folder).  Commands whose work takes no time (reading one small file: show, kv-plan, export,
roofline, tr-shadow latency) have no (iii): there is no "during".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import ROOT, tool

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

EX = os.path.join(ROOT, "data", "examples")
SPEC = os.path.join(EX, "spec-r2r.json")
TRACE = os.path.join(EX, "routing-trace.jsonl")
SMALL_CONFIG = os.path.join(EX, "small-config.json")
LARGE_CONFIG = os.path.join(EX, "large-config.json")
LAT_SMALL = os.path.join(EX, "latency-small.json")
LAT_LARGE = os.path.join(EX, "latency-large.json")
QWEN_SMALL = os.path.join(ROOT, "data", "models", "Qwen3-0.6B", "config.json")
QWEN_LARGE = os.path.join(ROOT, "data", "models", "Qwen3-32B", "config.json")
PLACEMENT = os.path.join(ROOT, "data", "models", "paper-placement.json")
SYSTEM = ["--p", "0.35", "--L", "6", "27.9"]
SHADOW = ["--synthetic", "--sessions", "20", "--warmup-s", "10", "--measure-s", "60", "--drain-s", "600",
          "--capacity-rps", "small=17", "--capacity-rps", "large=5.5"]
ROUTE_RUN = ["tr-profile", "route-run", "--config", SMALL_CONFIG, LARGE_CONFIG, "--prompts", "prompts.jsonl", "--policy",
             "confidence"]
SENTINEL = b"sentinel: not written by any command \x00\xff\n"

# The outputs, one case per (command, output flag): the command line with OUT where the output goes, and a
# bad input in another flag.  A "/" ending the file name marks a folder output (a run folder).
OUT = "@OUT@"
CASES = {
    ("tr-optimize", "--out"): (["tr-optimize", *SYSTEM, "--N", "1-3", "--no-cache", "--out", OUT, "--max-gap", "2"],
                               "r.json"),
    ("tr-optimize", "--plot"): (["tr-optimize", *SYSTEM, "--N", "1-3", "--no-cache", "--plot", OUT, "--max-gap",
                                 "2"], "p.png"),
    ("tr-optimize", "--thresholds"): (["tr-optimize", *SYSTEM, "--N", "2-3", "--no-cache", "--thresholds", OUT],
                                      "th.json"),
    ("tr-optimize", "--cache-dir"): (["tr-optimize", *SYSTEM, "--N", "1-3", "--cache-dir", OUT, "--max-gap", "2"],
                                     "cache/"),
    ("tr-autotune run", "--thresholds"): (["tr-autotune", "run", *SYSTEM, "--N", "3", "--thresholds", OUT,
                                           "--max-gap", "2"], "th.json"),
    ("tr-autotune run", "--cache-dir"): (["tr-autotune", "run", *SYSTEM, "--N", "3", "--thresholds", "th.json",
                                          "--cache-dir", OUT, "--max-gap", "2"], "tables/"),
    ("tr-autotune show", "--out"): (["tr-autotune", "show", SPEC, "--out", OUT], "show.json"),
    ("tr-autotune kv-plan", "--out"): (["tr-autotune", "kv-plan", "--placement", PLACEMENT,
                                        "--memory-budget-fraction", "2", "--out", OUT], "kv.json"),
    ("tr-autotune measure", "--out"): (["tr-autotune", "measure", *SYSTEM, "--N", "2", "--B", "1", "2",
                                        "--no-predict", "--time-scale", "0.00001", "--duration-s", "1", "--out", OUT],
                                       "m.json"),
    ("tr-autotune export r2r", "--out"): (["tr-autotune", "export", "r2r", "--thresholds", SPEC, "--out", OUT],
                                          "launch.txt"),
    ("tr-plan", "--out"): (["tr-plan", "--model", QWEN_SMALL, "--model", QWEN_LARGE, "--gpu", "nosuch-gpu",
                            "--gpus", "1", "--N", "2", "--quiet", "--out", OUT], "plan.json"),
    ("tr-profile latency", "--out"): (["tr-profile", "latency", "--config", SMALL_CONFIG, "--corun-batch-size", "2",
                                       "--out", OUT], "lat.json"),
    ("tr-profile latency", "--run-dir"): (["tr-profile", "latency", "--config", SMALL_CONFIG, "--corun-batch-size",
                                           "2", "--run-dir", OUT], "runs/"),
    ("tr-profile roofline", "--out"): (["tr-profile", "roofline", LAT_SMALL, "--config", SMALL_CONFIG, LARGE_CONFIG,
                                        "--out", OUT], "roof.json"),
    ("tr-profile routing", "--out"): (["tr-profile", "routing", "--trace", SPEC, "--out", OUT], "routing.json"),
    ("tr-profile routing", "--trace-out"): (["tr-profile", "routing", "--trace-format", "r2r", "--trace", "bad.csv",
                                             "--trace-out", OUT], "trace.jsonl"),
    ("tr-profile route-run", "--out"): ([*ROUTE_RUN, "--tau", "2", "--out", OUT], "rr.json"),
    ("tr-profile route-run", "--trace-out"): ([*ROUTE_RUN, "--tau", "2", "--trace-out", OUT], "rr.jsonl"),
    ("tr-profile route-run", "--run-dir"): ([*ROUTE_RUN, "--tau", "2", "--run-dir", OUT], "runs/"),
    ("tr-profile system", "--out"): (["tr-profile", "system", "--latency-profile", LAT_SMALL, LAT_LARGE, "--trace",
                                      TRACE, "--latency-curve", "constant", "--latency-batch-size", "999", "--out",
                                      OUT], "spec.json"),
    ("tr-profile system", "--run-dir"): (["tr-profile", "system", "--latency-profile", LAT_SMALL, LAT_LARGE,
                                          "--trace", TRACE, "--latency-curve", "constant", "--latency-batch-size",
                                          "999", "--run-dir", OUT], "runs/"),
    ("tr-profile serve-bench", "--out"): (["tr-profile", "serve-bench", "--url", "http://127.0.0.1:9", "--N", "1",
                                           "--predicted", SPEC, "--out", OUT], "bench.json"),
    ("tr-shadow stats", "--out"): (["tr-shadow", "stats", "--synthetic", "--sessions", "3", "--cache-capacity",
                                    "nosuch=5", "--out", OUT], "stats.json"),
    ("tr-shadow sessions", "--out"): (["tr-shadow", "sessions", "--trace", SPEC, "--out", OUT], "sessions.jsonl"),
    ("tr-shadow latency", "--out"): (["tr-shadow", "latency", "--model", "qwen3-8b", "--gpu", "nosuch-gpu",
                                      "--out", OUT], "lat.json"),
    ("tr-shadow latency", "--save-model"): (["tr-shadow", "latency", "--model", "qwen3-8b", "--gpu", "nosuch-gpu",
                                             "--save-model", OUT], "model.json"),
    ("tr-shadow simulate", "--out"): (["tr-shadow", "simulate", *SHADOW, "--approach", "Warm-All", "--out", OUT],
                                      "sim.json"),
    ("tr-shadow compare", "--out"): (["tr-shadow", "compare", *SHADOW, "--windows", "noon", "--out", OUT],
                                     "cmp.json"),
}


def _listing(folder) -> dict:
    """Every file under ``folder`` with its bytes, and every folder (as None)."""
    out = {}
    for d, dirs, files in os.walk(folder):
        for name in dirs:
            out[os.path.relpath(os.path.join(d, name), folder)] = None
        for name in files:
            with open(os.path.join(d, name), "rb") as f:
                out[os.path.relpath(os.path.join(d, name), folder)] = f.read()
    return out


def _temp_files(folder) -> list:
    """Temporary names the project's writers use: ``.NAME.XXXX.tmp`` (atomic_write), ``.tmp-XXXX`` (cache)."""
    return [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs
            if f.endswith(".tmp") or f.startswith(".tmp")]


def _one_error(code, err, expect=2) -> str:
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert code == expect, (code, err)
    assert len(errors) == 1 and lines[-1] == errors[0], err
    return errors[0]


@pytest.fixture
def work(tmp_path, monkeypatch):
    """The working folder: inputs the cases name by relative path, and the place a default run folder lands."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TR_MODEL_CACHE_DIR", str(tmp_path / "default-cache"))
    (tmp_path / "prompts.jsonl").write_text('{"input_ids": [1, 2, 3]}\n')
    (tmp_path / "bad.csv").write_text("source_model,position\nquick,0\nquick,1\nreference,3\n")
    return tmp_path


def _argv(case, target):
    argv, _ = CASES[case]
    return [target if a == OUT else a for a in argv]


@pytest.mark.parametrize("case", sorted(CASES), ids=lambda c: f"{c[0]} {c[1]}".replace(" ", "_"))
def test_an_error_writes_nothing(work, run_inproc, case):
    name = CASES[case][1]
    folder_output = name.endswith("/")
    target = str(work / "out" / name.rstrip("/"))
    os.makedirs(work / "out")
    argv = _argv(case, target)

    # (i) the output absent: not created, nothing else either
    before = _listing(work)
    r = run_inproc(*argv)
    _one_error(r.returncode, r.stderr)
    assert _listing(work) == before, (set(_listing(work)) - set(before), r.stderr)

    # (ii) an existing output: untouched
    if folder_output:
        os.makedirs(target)
        with open(os.path.join(target, "keep"), "wb") as f:
            f.write(SENTINEL)
    else:
        with open(target, "wb") as f:
            f.write(SENTINEL)
    before = _listing(work)
    r = run_inproc(*argv)
    _one_error(r.returncode, r.stderr)
    assert _listing(work) == before, (set(_listing(work)) ^ set(before), r.stderr)
    assert _temp_files(work) == []


def test_an_output_naming_a_folder_is_refused_before_the_others_are_written(work, run_inproc):
    """``--plot`` naming a folder is found before any work, not after ``--thresholds`` was replaced."""
    (work / "p.png").mkdir()
    (work / "th.json").write_bytes(SENTINEL)
    before = _listing(work)
    r = run_inproc("tr-optimize", *SYSTEM, "--N", "1-2", "--no-cache", "--thresholds", "th.json", "--plot", "p.png")
    assert "p.png" in _one_error(r.returncode, r.stderr)
    assert _listing(work) == before


# ------------------------------------------------------------------------------------------- (iii) SIGTERM


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has its own SIGTERM handler: run_cli installs it, so the command is under way."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except OSError:
        pass
    return False


def _start(argv, cwd):
    return subprocess.Popen(tool(argv[0]) + [str(a) for a in argv[1:]], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _terminate(proc, started=lambda: True, settle_s=0.3, limit_s=300.0):
    """SIGTERM once the command has installed its handler and ``started()`` (work visibly under way); returns
    ``(exit code, stdout, stderr)``.  The limits only guard against a hang; nothing here is timed."""
    t0 = time.monotonic()
    while not (_catches_sigterm(proc.pid) and started()):
        if proc.poll() is not None:
            pytest.fail(f"the command ended before it could be signalled: {proc.returncode} {proc.communicate()}")
        if time.monotonic() - t0 > limit_s:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("the command never got under way")
        time.sleep(0.05)
    time.sleep(settle_s)  # deeper into the work
    proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the command did not stop after SIGTERM")
    return proc.returncode, out, err


def _terminated(code, err):
    if code == 0:
        pytest.fail(f"the command finished before the signal reached it (make its work longer): {err}")
    assert "Traceback" not in err, err
    assert _one_error(code, err, 143) == "error: terminated", err


def _prepare_outputs(folder, names) -> None:
    """Existing outputs with sentinel bytes (a folder output: a folder holding a sentinel file)."""
    for name in names:
        path = os.path.join(folder, name.rstrip("/"))
        if name.endswith("/"):
            os.makedirs(path)
            path = os.path.join(path, "keep")
        with open(path, "wb") as f:
            f.write(SENTINEL)


def _r2r_records(folder, rows=500_000):
    """One long R2R request (a parse of seconds)."""
    with open(os.path.join(folder, "long.csv"), "w") as f:
        f.write("source_model,position\n")
        f.write("".join(("reference" if p % 7 == 3 else "quick") + f",{p}\n" for p in range(rows)))


# (command, output flags): the command line (outputs named by @NAME, relative to the working folder), what to
# prepare in the working folder, and when the work has visibly started (None: once the SIGTERM handler is in).
# Each runs until SIGTERM (minutes of work otherwise).
TERM_CASES = {
    "tr-autotune measure --out": (["tr-autotune", "measure", *SYSTEM, "--N", "4", "--B", "1", "1", "--duration-s",
                                   "600", "--warmup-s", "0", "--no-predict", "--out", "@m.json"], None, None),
    "tr-plan --out": (["tr-plan", "--model", QWEN_SMALL, "--model", QWEN_LARGE, "--gpu", "h200", "--gpus", "8", "--N",
                       "1-64", "--quiet", "--out", "@plan.json"], None, None),
    "tr-shadow stats --out": (["tr-shadow", "stats", "--synthetic", "--sessions", "1000000", "--out", "@stats.json"],
                              None, None),
    "tr-shadow sessions --out": (["tr-shadow", "sessions", "--synthetic", "--sessions", "1000000", "--out",
                                  "@sessions.jsonl"], None, None),
    "tr-shadow simulate --out": (["tr-shadow", "simulate", "--synthetic", "--sessions", "20000", "--warmup-s", "10",
                                  "--measure-s", "100000", "--drain-s", "600", "--capacity-rps", "small=17",
                                  "--capacity-rps", "large=5.5", "--out", "@sim.json"], None, None),
    "tr-shadow compare --out": (["tr-shadow", "compare", "--synthetic", "--sessions", "20000", "--warmup-s", "10",
                                 "--measure-s", "100000", "--drain-s", "600", "--capacity-rps", "small=17",
                                 "--capacity-rps", "large=5.5", "--sim-seeds", "0", "1", "--workers", "1", "--out",
                                 "@cmp.csv"], None, None),
    "tr-profile routing --out --trace-out": (["tr-profile", "routing", "--trace-format", "r2r", "--trace", "long.csv",
                                              "--trace-out", "@t.jsonl", "--out", "@routing.json"], _r2r_records, None),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(TERM_CASES))
def test_sigterm_leaves_every_output_as_it_was(tmp_path, case):
    argv, prepare, started = TERM_CASES[case]
    if prepare is not None:
        prepare(tmp_path)
    outputs = [a[1:] for a in argv if a.startswith("@")]
    _prepare_outputs(tmp_path, outputs)
    before = _listing(tmp_path)
    proc = _start([a[1:].rstrip("/") if a.startswith("@") else a for a in argv], tmp_path)
    code, stdout, err = _terminate(proc, (lambda: started(tmp_path, proc.pid)) if started else (lambda: True))
    _terminated(code, err)
    assert _listing(tmp_path) == before, (set(_listing(tmp_path)) ^ set(before), err)
    assert _temp_files(tmp_path) == []


@pytest.mark.slow
def test_sigterm_during_an_optimization_leaves_out_plot_thresholds_and_cache_whole(tmp_path):
    _prepare_outputs(tmp_path, ["r.json", "p.png", "th.json"])
    cache = tmp_path / "cache"
    before = _listing(tmp_path)
    proc = _start(["tr-optimize", *SYSTEM, "--N", "1-60", "--workers", "1", "--cache-dir", cache, "--quiet",
                   "--out", "r.json", "--plot", "p.png", "--thresholds", "th.json"], tmp_path)
    code, stdout, err = _terminate(proc, lambda: cache.exists() and any(
        f.endswith(".json") for _, _, fs in os.walk(cache) for f in fs))
    _terminated(code, err)
    after = _listing(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("cache")} == before
    assert _temp_files(tmp_path) == []
    for d, _, files in os.walk(cache):  # every cache entry is whole
        for f in files:
            with open(os.path.join(d, f)) as fh:
                json.load(fh)


@pytest.mark.slow
def test_sigterm_during_autotune_run_leaves_a_whole_thresholds_file(tmp_path):
    """tr-autotune run resumes: it replaces its file, whole, with the rows computed so far (the first row at
    once), so SIGTERM leaves either the old bytes or a complete partial table, never a half-written file;
    --cache-dir keeps complete tables only."""
    from tr_model.thresholds import ThresholdTable
    _prepare_outputs(tmp_path, ["th.json", "tables/"])
    th = tmp_path / "th.json"
    proc = _start(["tr-autotune", "run", *SYSTEM, "--N", "60", "--thresholds", "th.json", "--cache-dir", "tables",
                   "--quiet"], tmp_path)
    code, stdout, err = _terminate(proc, lambda: th.read_bytes() != SENTINEL)
    assert code == 143 and "Traceback" not in err, err
    assert err.splitlines()[-1] == "error: terminated", err
    assert _temp_files(tmp_path) == []
    t = ThresholdTable.load(th)
    assert not t.complete and 1 <= t.covered_concurrency < 60
    assert sorted(os.listdir(tmp_path / "tables")) == ["keep"]


# ----------------------------------------------- (iii) SIGTERM in the commands whose work runs models (torch)
#
# Loading torch and transformers costs tens of seconds of CPU per process, so these run in-process with the
# model work replaced by stand-ins that deliver a real SIGTERM to this process in the middle of it (after
# trace lines were recorded and flushed): the command's own handler turns it into exit 143.


class _Model:
    device = "cpu"


def _sigterm_here():
    from tr_core import cli
    if signal.getsignal(signal.SIGTERM) is cli._on_sigterm:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # the handler raises within this sleep
        pytest.fail("SIGTERM did not stop the command")
    raise cli.Terminated()  # another handler is installed (a test runner's own): raise what the handler would


@pytest.fixture
def models_stopped_by_sigterm(monkeypatch):
    import profiler.latency as L
    import profiler.route_run as R
    import profiler.serve_bench as SB

    def run_policy(models, prompts, *, recorder, **kw):
        for step in range(5000):  # past the recorder's flush: lines are on disk
            recorder.record(0, step, 0, 0)
        _sigterm_here()

    monkeypatch.setattr(L, "resolve_device", lambda device: "cpu")
    monkeypatch.setattr(L, "load_model", lambda *a, **k: (_Model(), "tiny"))
    monkeypatch.setattr(L, "profile_latency", lambda *a, **k: _sigterm_here())
    monkeypatch.setattr(R, "shared_vocab_size", lambda models, common: 512)
    monkeypatch.setattr(R, "load_prompts", lambda path, tok, vocab: [[1, 2, 3]] * 4)
    monkeypatch.setattr(R, "run_routing_policy", run_policy)
    monkeypatch.setattr(SB, "probe", lambda t, timeout_s: {})
    monkeypatch.setattr(SB, "run_phase", lambda *a, **k: _sigterm_here())


ROUTE = ["--config", SMALL_CONFIG, LARGE_CONFIG, "--prompts", "prompts.jsonl", "--policy", "confidence", "--tau",
         "0.5", "--device", "cpu"]
INPROC_TERM_CASES = {
    "tr-profile latency --out --run-dir": ["tr-profile", "latency", "--config", SMALL_CONFIG, "--device", "cpu",
                                           "--out", "@lat.csv", "--run-dir", "@runs/"],
    "tr-profile route-run --out --trace-out": ["tr-profile", "route-run", *ROUTE, "--trace-out", "@rr.jsonl",
                                               "--out", "@rr.csv"],
    "tr-profile route-run --run-dir": ["tr-profile", "route-run", *ROUTE, "--run-dir", "@runs/"],
    "tr-profile system --out --run-dir": ["tr-profile", "system", *ROUTE, "--run-dir", "@runs/", "--out",
                                          "@sys.csv"],
    "tr-profile serve-bench --out": ["tr-profile", "serve-bench", "--url", "http://127.0.0.1:9", "--N", "1",
                                     "--out", "@bench.json"],
}


@pytest.mark.parametrize("case", sorted(INPROC_TERM_CASES))
def test_sigterm_in_model_work_leaves_every_output_as_it_was(work, run_inproc, models_stopped_by_sigterm, case):
    argv = INPROC_TERM_CASES[case]
    _prepare_outputs(work, [a[1:] for a in argv if a.startswith("@")])
    before = _listing(work)
    r = run_inproc(*[a[1:].rstrip("/") if a.startswith("@") else a for a in argv])
    _terminated(r.returncode, r.stderr)
    assert _listing(work) == before, (set(_listing(work)) ^ set(before), r.stderr)
    assert _temp_files(work) == []
