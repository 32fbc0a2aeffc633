"""The input contract, by kind (issue 25, item 2): each kind is exercised across the commands and the API.

Kinds: every input file is a regular file (a FIFO is refused, never opened); conflicting flags and keywords
are refused, never silently dropped; thresholds files whose values cannot occur are refused naming the
field; the result cache is validated on read; interrupts and SIGTERM are one line and clean up; unbounded
work is refused up front with its size; a measurement dominated by timer noise is refused; messages name
the flag the user typed and a library field is mapped to its flag; ``--out`` is checked before any work
and an error leaves no output.  The clean property (``_clean``): the exit code, exactly one ``error:`` line
(the last line; only ``note:`` lines besides), no traceback, nothing written.

Commands run in-process (seconds for dozens of cases) under an alarm, so that a hang fails the test instead
of blocking the suite; signals are tested on subprocesses (tests/test_cli_interrupt.py's harness).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, tool

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

MODULES = {"tr-optimize": "tr_model.cli", "tr-autotune": "tr_model.autotune_cli", "tr-profile": "profiler.cli",
           "tr-shadow": "shadow_prefill.cli"}
EXAMPLES = os.path.join(ROOT, "data", "examples")
SPEC = os.path.join(EXAMPLES, "spec-r2r.json")
TRACE = os.path.join(EXAMPLES, "routing-trace.jsonl")
SMALL_CONFIG = os.path.join(EXAMPLES, "small-config.json")
LARGE_CONFIG = os.path.join(EXAMPLES, "large-config.json")
SYSTEM = ["--p", "0.35", "--L", "6", "27.9"]
OPT = ["tr-optimize", *SYSTEM, "--N", "2", "--no-cache"]


class Hang(BaseException):
    """A command did not return within its alarm (a FIFO opened, a loop without end)."""


@contextlib.contextmanager
def alarm(seconds: int):
    def ring(signum, frame):
        raise Hang(f"no answer within {seconds} s")
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run(argv, seconds: int = 120):
    """``(exit code, stdout, stderr)`` of a command run in-process (``argv[0]`` names the command)."""
    main = importlib.import_module(MODULES[argv[0]]).main
    out, err = io.StringIO(), io.StringIO()
    with alarm(seconds), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv[1:]])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def listing(folder) -> set:
    return {os.path.relpath(os.path.join(d, f), folder) for d, dirs, files in os.walk(folder) for f in files + dirs}


def clean(code, err, expect: int = 2, *, before=None, folder=None, needle: str | None = None) -> str:
    """The contract of a refused input; returns the error line."""
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert code == expect, (code, err)
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert all(ln.startswith(("error:", "note:", "warning:")) for ln in lines), err
    if folder is not None:
        assert listing(folder) == before, (listing(folder) - before, err)
    if needle is not None:
        assert needle in errors[0], errors[0]
    return errors[0]


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A working folder: the commands run in it (run folders land here), a FIFO and a prompts file inside."""
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "prompts.jsonl").write_text('{"input_ids": [1, 2, 3]}\n')
    return tmp_path


def check_refused(here, argv, needle, expect=2, seconds=120):
    before = listing(here)
    code, _, err = run(argv, seconds)
    return clean(code, err, expect, before=before, folder=here, needle=needle)


# ------------------------------------------------------------------------------ every input is a regular file


FIFO_CASES = {
    "profile routing --trace": ["tr-profile", "routing", "--trace", "fifo"],
    "optimize simulate --trace": OPT + ["--method", "simulate", "--trace", "fifo", "--sim-budget-s", "1"],
    "optimize --spec": ["tr-optimize", "--spec", "fifo", "--N", "2"],
    "optimize --L-table": ["tr-optimize", "--p", "0.35", "--L-table", "fifo", "--N", "2"],
    "autotune show": ["tr-autotune", "show", "fifo"],
    "autotune kv-plan --placement": ["tr-autotune", "kv-plan", "--placement", "fifo"],
    "autotune measure --thresholds": ["tr-autotune", "measure", *SYSTEM, "--N", "2", "--thresholds", "fifo"],
    "shadow stats --trace": ["tr-shadow", "stats", "--trace", "fifo"],
    "profile system --latency-profile": ["tr-profile", "system", "--latency-profile", "fifo", "--trace", TRACE],
    "profile route-run --prompts": ["tr-profile", "route-run", "--config", SMALL_CONFIG, LARGE_CONFIG,
                                    "--prompts", "fifo", "--policy", "confidence", "--tau", "0.5"],
}


@pytest.mark.parametrize("case", sorted(FIFO_CASES))
def test_a_fifo_input_is_refused_not_opened(here, case):
    line = check_refused(here, FIFO_CASES[case], "fifo", seconds=60)
    assert "regular file" in line


def test_the_readers_refuse_a_fifo_in_the_api(here):
    from profiler.latency import ProfileError, load_latency_profile
    from tr_core.errors import SpecError
    from tr_core.routing_trace import TraceError, iter_records, read_trace
    from tr_core.spec import load_spec
    from tr_model.thresholds import ThresholdFileError, ThresholdTable
    for call, error in ((read_trace, TraceError), (lambda p: list(iter_records(p)), TraceError),
                        (load_spec, SpecError), (ThresholdTable.load, ThresholdFileError),
                        (load_latency_profile, ProfileError)):
        with alarm(20), pytest.raises(error, match="regular file"):
            call(str(here / "fifo"))


def test_the_shared_rule(tmp_path):
    from tr_core.errors import SpecError
    from tr_core.fileio import require_regular_file
    os.mkfifo(tmp_path / "f")
    (tmp_path / "ok").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "ok")
    assert require_regular_file(tmp_path / "link", "x").st_size == 1
    for path, msg in ((tmp_path / "f", "not a regular file"), (tmp_path, "is a folder"), ("/dev/zero", "not a regular"),
                      (tmp_path / "none", "does not exist"), ("a\0b", "cannot read")):
        with pytest.raises(SpecError, match=msg):
            require_regular_file(path, "input")


# ------------------------------------------------------------------------------------- conflicting flags


CONFLICTS = {
    "optimize --no-cache --cache-dir": (OPT + ["--cache-dir", "c"], "--cache-dir has no effect with --no-cache"),
    "optimize --B --search": (OPT + ["--B", "1", "2", "--search", "pruned"], "--search applies to a search"),
    "optimize --B --all": (OPT + ["--B", "1", "2", "--all"], "--all applies to a search"),
    "optimize exact --jitter": (OPT + ["--jitter", "0.2"], "--jitter applies to the simulator"),
    "optimize exact --sim-budget-s": (OPT + ["--sim-budget-s", "3"], "--sim-budget-s applies to the simulator"),
    "optimize exhaustive --max-gap": (OPT + ["--search", "exhaustive", "--max-gap", "0.01"],
                                      "--max-gap applies to --search certified or auto"),
    "optimize simulate --solver": (OPT + ["--method", "simulate", "--solver", "gth"], "--solver applies to the exact"),
    "optimize --dask --workers": (OPT + ["--workers", "2", "--dask", "tcp://127.0.0.1:1"], "--workers has no effect"),
    "optimize --delta-rtol without auto": (OPT + ["--delta-rtol", "0.05"], "--delta-rtol applies to --delta-ms auto"),
    "autotune run --delta-rtol without auto": (["tr-autotune", "run", *SYSTEM, "--N", "2", "--thresholds", "t.json",
                                                "--delta-rtol", "0.05"], "--delta-rtol applies"),
    "shadow --workload --tool-tokens": (["tr-shadow", "stats", "--workload", "paper", "--sessions", "3",
                                         "--tool-tokens", "100"], "--tool-tokens has no effect with --workload"),
    "shadow --trace --sessions": (["tr-shadow", "stats", "--trace", TRACE, "--sessions", "3"],
                                  "--sessions applies to --synthetic"),
    "shadow --synthetic --respect-tasks": (["tr-shadow", "stats", "--synthetic", "--sessions", "3",
                                            "--respect-tasks"], "--respect-tasks applies to --matrix"),
}


@pytest.mark.parametrize("case", sorted(CONFLICTS))
def test_conflicting_flags_are_refused(here, case):
    argv, needle = CONFLICTS[case]
    check_refused(here, argv, needle)


def test_given_knows_the_flags_typed_not_the_defaults():
    from tr_core import cli
    p = cli.Parser(prog="t")
    p.add_argument("--max-gap", type=float, default=0.005)
    p.add_argument("--quiet", action="store_true")
    sub = p.add_subparsers(dest="cmd")
    s = sub.add_parser("run")
    s.add_argument("--seed", type=int, default=0)
    a = p.parse_args([])
    assert cli.given(a, "max_gap") is None and a.max_gap == 0.005
    assert cli.given(p.parse_args(["--max-gap", "0.005"]), "max_gap") == "--max-gap"   # typed, even at its default
    assert cli.given(p.parse_args(["--max-gap=0.1"]), "max_gap") == "--max-gap"
    with pytest.raises(SystemExit):  # an abbreviation is not the flag
        p.parse_args(["--max-g", "0.1"])
    a = p.parse_args(["--quiet", "run", "--seed", "3"])
    assert cli.given(a, "quiet") == "--quiet" and cli.given(a, "seed") == "--seed"
    with pytest.raises(cli.SpecError, match="--seed costs"):
        cli.refuse_given(a, ["max_gap", "seed"], "costs")


def test_conflicting_keywords_are_refused_in_the_api():
    from concurrent.futures import ThreadPoolExecutor

    import tr_model
    from tr_core.errors import SpecError
    from tr_core.spec import preset
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    for call, needle in (
            (lambda: tr_model.optimize(spec, 3, max_gap=0.01), "max_gap applies to search = 'certified' or 'auto'"),
            (lambda: tr_model.optimize(spec, 3, search="pruned", max_gap=0.01), "not 'pruned'"),
            (lambda: tr_model.optimize_many(spec, [2, 3], search="exhaustive", time_budget_s=5), "time_budget_s"),
            (lambda: tr_model.optimize(spec, 3, search="local", candidates=[(1, 1)]), "candidates"),
            (lambda: tr_model.optimize(spec, 3, search="exhaustive", boxes=False), "boxes"),
            (lambda: tr_model.optimize(spec, 3, workers=2, executor=ThreadPoolExecutor(1)), "workers or executor")):
        with pytest.raises(SpecError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            call()
    assert tr_model.optimize(spec, 3, search="certified", max_gap=0.01).best_B == tr_model.optimize(spec, 3).best_B


# ------------------------------------------------------------------- thresholds files with impossible values


@pytest.fixture(scope="module")
def table_doc(tmp_path_factory):
    from tr_core.spec import preset
    from tr_model.tuning.autotune import tune
    path = tmp_path_factory.mktemp("th") / "th.json"
    tune(preset("r2r", [6.0, 27.9], p=0.35), 4, path)
    return json.loads(path.read_text())


def _resign(doc):
    from tr_model.thresholds import spec_sha256
    doc["spec_sha256"] = spec_sha256(doc["spec"])
    return doc


def _gap(doc):
    doc["entries"][2]["gap"] = 1.5
    return doc


def _negative_gap(doc):
    doc["entries"][1]["gap"] = -0.25
    return doc


def _fallback(doc):
    doc["fallback_thresholds"] = [2, 1]
    return doc


def _models(doc):
    doc["spec"]["step_latency_ms"] = doc["spec"]["step_latency_ms"] + [40.0]
    return _resign(doc)


def _names(doc):
    doc["model_names"] = ["a", "b"]
    doc["spec"]["model_names"] = ["small", "large"]
    return _resign(doc)


def _delta(doc):
    doc["delta_ms"] = 0.5
    return doc


def _below_eager(doc):
    e = doc["entries"][3]
    e["predicted_tok_s"] = e["eager_tok_s"] * 0.5
    e["upper_bound_tok_s"] = None
    return doc


IMPOSSIBLE = [(_gap, "entries[2].gap must be in [0, 1]"), (_negative_gap, "entries[1].gap"),
              (_fallback, "'fallback_thresholds' = [2, 1] is infeasible"),
              (_models, "'num_models' = 2 disagrees with the embedded spec"),
              (_names, "'model_names'"), (_delta, "'delta_ms' = 0.5 disagrees"),
              (_below_eager, "entries[3].predicted_tok_s")]


@pytest.mark.parametrize("spoil, needle", IMPOSSIBLE, ids=[f.__name__ for f, _ in IMPOSSIBLE])
def test_a_thresholds_file_with_impossible_values_is_refused(here, table_doc, spoil, needle):
    from tr_model.thresholds import ThresholdFileError, ThresholdTable
    ThresholdTable.from_dict(copy.deepcopy(table_doc))  # the unspoilt document is valid
    doc = spoil(copy.deepcopy(table_doc))
    with pytest.raises(ThresholdFileError) as e:
        ThresholdTable.from_dict(doc)
    assert needle in str(e.value), str(e.value)
    (here / "bad.json").write_text(json.dumps(doc))
    check_refused(here, ["tr-autotune", "show", "bad.json", "--out", "shown.txt"], needle)


# ------------------------------------------------------------------------------ the result cache, validated


def _entry(cache) -> str:
    files = [os.path.join(d, f) for d, _, fs in os.walk(cache) for f in fs if f.endswith(".json")]
    assert len(files) == 1, files
    return files[0]


def _text(path, text):
    os.unlink(path)
    with open(path, "w") as f:
        f.write(text)


def _edit(**fields):
    def spoil(path):
        with open(path) as f:
            d = json.load(f)
        d.update(fields)
        _text(path, json.dumps(d))
    return spoil


def _folder(path):
    os.unlink(path)
    os.mkdir(path)


def _fifo(path):
    os.unlink(path)
    os.mkfifo(path)


CACHE_SPOILS = {
    "truncated": lambda p: _text(p, open(p).read()[:40]), "empty": lambda p: _text(p, ""),
    "not an object": lambda p: _text(p, "[1, 2]"), "string number": _edit(throughput_tok_s="63.4"),
    "NaN": lambda p: _text(p, open(p).read().replace('"residual": ', '"residual": NaN, "x": ')),
    "infinite": _edit(per_request_tok_s=1e400), "negative": _edit(throughput_tok_s=-1.0),
    "float count": _edit(states=2.5), "bool count": _edit(transitions=True), "missing field": _edit(B=None),
    "another N": _edit(N=7), "another B": _edit(B=[2, 1]), "wrong length": _edit(mean_waiting=[0.0]),
    "a folder": _folder, "a fifo": _fifo,
}


@pytest.mark.parametrize("case", sorted(CACHE_SPOILS))
def test_a_spoilt_cache_entry_is_recomputed_and_reported(tmp_path, capsys, case):
    from tr_core.spec import preset
    from tr_model import evaluate
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    cache = tmp_path / "cache"
    fresh = evaluate(spec, 3, (1, 2), cache=str(cache))
    assert evaluate(spec, 3, (1, 2), cache=str(cache)).cached
    path = _entry(cache)
    CACHE_SPOILS[case](path)
    capsys.readouterr()
    with alarm(60):
        again = evaluate(spec, 3, (1, 2), cache=str(cache))
    err = capsys.readouterr().err
    assert not again.cached and again.throughput_tok_s == fresh.throughput_tok_s
    assert err.count("warning: result cache entry") == 1 and path in err and "recomputed" in err, err
    if case != "a folder":                           # the recomputed result replaced the spoilt entry
        hit = evaluate(spec, 3, (1, 2), cache=str(cache))
        assert hit.cached and hit.throughput_tok_s == fresh.throughput_tok_s


def test_tr_optimize_reports_a_spoilt_cache_entry_and_recomputes(tmp_path):
    cache = tmp_path / "cache"
    argv = ["tr-optimize", *SYSTEM, "--N", "2", "--B", "1", "2", "--cache-dir", cache, "--format", "json"]
    code, out, err = run(argv)
    assert code == 0
    good = json.loads(out)["results"][0]["throughput_tok_s"]
    _edit(throughput_tok_s=1e9)(_entry(cache))
    code, out, err = run(argv)
    assert code == 0 and "warning: result cache entry" not in err          # 1e9 is a valid number: trusted
    _edit(throughput_tok_s="fast")(_entry(cache))
    code, out, err = run(argv)
    assert code == 0 and "Traceback" not in err and err.count("warning: result cache entry") == 1, err
    assert json.loads(out)["results"][0]["throughput_tok_s"] == good


# ----------------------------------------------------------------------------- interrupts and SIGTERM


def _sigint_default():
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.setpgrp()  # its own process group: the test signals the whole group, as a terminal's Ctrl-C does


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


def _wait_for(predicate, proc, limit_s=240.0):
    t0 = time.monotonic()
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"the command ended before the signal: {proc.communicate()}")
        if time.monotonic() - t0 > limit_s:
            proc.kill()
            pytest.fail("the command never reached the point to signal")
        time.sleep(0.02)


def _signalled(proc, sig, group=True):
    (os.killpg(proc.pid, sig) if group else proc.send_signal(sig))
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the command did not stop after the signal")
    return proc.returncode, out, err


def _temp_files(folder):
    return [os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs if f.endswith(".tmp") or ".tmp-" in f]


def _ours(err: str) -> str:
    """stderr less CPython's resource-tracker process's own shutdown warnings.  That separate process shares
    the stream; when the group's Ctrl-C lands inside a worker's spawn it can report a pool semaphore as leaked
    and then fail to unlink it because the parent already had ("No such file or directory"): a lost
    unregistration in its bookkeeping, nothing left behind (seen once in CI at 593 s).  Every other line
    is the command's own and must be the one error line."""
    lines = err.splitlines(keepends=True)
    out, skip = [], False
    for line in lines:
        if "multiprocessing/resource_tracker.py" in line and "UserWarning: resource_tracker:" in line:
            skip = True
            continue
        if skip and line.startswith("  warnings.warn("):
            continue
        skip = False
        out.append(line)
    return "".join(out)


@pytest.mark.slow
def test_ctrl_c_while_the_workers_start(tmp_path):
    """Ctrl-C reaches the whole group while the spawned workers still import: one line, 130, workers gone."""
    out = tmp_path / "r.json"
    proc = subprocess.Popen(tool("tr-optimize") + [*SYSTEM, "--N", "1-30", "--workers", "2", "--no-cache",
                                                   "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    _wait_for(lambda: len(_children(proc.pid)) >= 2, proc)
    kids = _children(proc.pid)
    code, stdout, err = _signalled(proc, signal.SIGINT)
    assert code == 130 and _ours(err) == "error: interrupted\n" and stdout == "", (code, err)
    assert not out.exists() and _temp_files(tmp_path) == []
    time.sleep(0.5)
    assert [k for k in kids if os.path.exists(f"/proc/{k}") and "spawn" in open(f"/proc/{k}/cmdline").read()] == []


@pytest.mark.slow
def test_sigterm_cleans_up_as_ctrl_c_does(tmp_path):
    cache, out = tmp_path / "cache", tmp_path / "r.json"
    proc = subprocess.Popen(tool("tr-optimize") + [*SYSTEM, "--N", "60", "--workers", "1", "--cache-dir", str(cache),
                                                   "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    _wait_for(lambda: cache.exists() and any(f.endswith(".json") for _, _, fs in os.walk(cache) for f in fs), proc)
    code, stdout, err = _signalled(proc, signal.SIGTERM, group=False)
    assert code == 143 and err == "error: terminated\n" and stdout == "", (code, err)
    assert not out.exists() and _temp_files(tmp_path) == []
    for d, _, files in os.walk(cache):
        for f in files:
            json.load(open(os.path.join(d, f)))


@pytest.mark.slow
def test_ctrl_c_during_kernel_compilation(tmp_path):
    """A fresh numba cache: the kernels compile first; Ctrl-C once the first one is written lands in the
    compilation of the others."""
    numba_cache = tmp_path / "numba"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(numba_cache))
    proc = subprocess.Popen(tool("tr-optimize") + [*SYSTEM, "--N", "3", "--no-cache"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    _wait_for(lambda: numba_cache.exists() and any(f.endswith(".nbi") for _, _, fs in os.walk(numba_cache)
                                                   for f in fs), proc)
    code, stdout, err = _signalled(proc, signal.SIGINT)
    if code == 0:
        pytest.skip("the compilation ended before the signal arrived")
    assert code == 130 and err == "error: interrupted\n", (code, err)


def test_run_cli_maps_sigterm_and_memory(capsys):
    from tr_core import cli

    def term(argv):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        return 0

    with pytest.raises(SystemExit) as e:
        cli.run_cli(term, [])
    assert e.value.code == 143 and capsys.readouterr().err == "error: terminated\n"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL        # restored

    def wrapped(argv):
        try:
            raise MemoryError()
        except MemoryError as m:
            raise RuntimeError("a worker failed") from m               # a pool's wrapping

    with pytest.raises(SystemExit) as e:
        cli.run_cli(wrapped, [])
    assert e.value.code == 3 and capsys.readouterr().err.startswith("error: out of memory")


@pytest.mark.slow
def test_memory_exhaustion_is_exit_3(tmp_path):
    """Under an address-space limit, a chain that does not fit is a resource limit (exit 3), one line."""
    import resource

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2 ** 30, 3 * 2 ** 30))
    r = subprocess.run(tool("tr-optimize") + ["--p", "0.35", "--L", "6", "27.9", "--N", "400", "--B", "1", "1",
                                              "--max-states", "1000000000", "--no-cache", "--out",
                                              str(tmp_path / "r.json")],
                       capture_output=True, text=True, preexec_fn=limited, timeout=600)
    clean(r.returncode, r.stderr, 3, before=set(), folder=tmp_path)


# -------------------------------------------------------------------------------- unbounded work, noise


def test_unbounded_work_is_refused_up_front_with_its_size(here):
    line = check_refused(here, ["tr-profile", "route-run", "--config", SMALL_CONFIG, LARGE_CONFIG, "--prompts",
                                "prompts.jsonl", "--policy", "confidence", "--tau", "0.5", "--max-new-tokens",
                                "100000"], "--max-new-tokens 100000", seconds=240)
    assert "max_position_embeddings = 1,024" in line and "<= 1021" in line
    check_refused(here, ["tr-optimize", *SYSTEM, "--N", "1-100000", "--no-cache"], "the largest N", expect=3)
    check_refused(here, ["tr-optimize", *SYSTEM, "--N", "1-3000", "--search", "exhaustive", "--no-cache"],
                  "--max-evaluations", expect=3)
    check_refused(here, ["tr-optimize", *SYSTEM, "--N", "40-60", "--method", "simulate", "--no-cache",
                         "--max-evaluations", "100"], "simulations", expect=3)
    check_refused(here, ["tr-shadow", "stats", "--synthetic", "--sessions", "1000000000"], "--sessions")
    check_refused(here, ["tr-shadow", "simulate", "--synthetic", "--sessions", "5", "--measure-s", "1e9"],
                  "--measure-s")
    check_refused(here, ["tr-autotune", "run", *SYSTEM, "--N", "100000000", "--thresholds", "t.json"], "--N")


def test_a_measurement_dominated_by_timer_noise_is_refused(here):
    line = check_refused(here, ["tr-autotune", "measure", *SYSTEM, "--N", "2", "--B", "1", "2", "--no-predict",
                                "--time-scale", "0.00001", "--duration-s", "1"], "--time-scale 1e-05")
    assert "timer" in line


# ------------------------------------------------------------------------------ messages name the flag


NAMES = {
    "typed --delta-ms": (OPT + ["--delta-ms", "0"], "error: --delta-ms must be > 0 ms"),
    "library field mapped": (["tr-autotune", "run", *SYSTEM, "--N", "2", "--thresholds", "t.json", "--max-gap", "2"],
                             "error: --max-gap must be"),
    "--N of run": (["tr-autotune", "run", *SYSTEM, "--N", "0", "--thresholds", "t.json"], "error: --N must be >= 1"),
    "a flag's value, not the file": (["tr-optimize", "--spec", SPEC, "--N", "2", "--delta-ms", "0.07", "--no-cache"],
                                     "--delta-ms"),
}


@pytest.mark.parametrize("case", sorted(NAMES))
def test_messages_name_the_flag_typed(here, case):
    argv, needle = NAMES[case]
    line = check_refused(here, argv, needle)
    if case == "a flag's value, not the file":
        assert "spec-r2r.json" not in line, line
    assert "max_gap" not in line and "max_concurrency" not in line


def test_fields_as_flags_rewrites_only_a_leading_field():
    from tr_core import cli
    from tr_core.errors import SpecError, StateSpaceTooLarge
    a = cli.Parser(prog="t")
    a.add_argument("--max-gap", type=float)
    ns = a.parse_args(["--max-gap", "2"])
    for exc, want in ((SpecError("max_gap must be < 1"), "--max-gap must be < 1"),
                      (SpecError("max_gapx must be"), "max_gapx must be"),
                      (StateSpaceTooLarge("max_gap[0] too big"), "--max-gap[0] too big")):
        with pytest.raises(type(exc)) as e:
            with cli.fields_as_flags(ns, {"max_gap": "max_gap"}):
                raise exc
        assert str(e.value) == want


# ---------------------------------------------------------------- --out first, and no output on an error


OUT_FIRST = {
    "tr-optimize": ["tr-optimize", "--spec", "fifo", "--N", "2"],
    "tr-autotune show": ["tr-autotune", "show", "fifo"],
    "tr-autotune kv-plan": ["tr-autotune", "kv-plan", "--placement", "fifo"],
    "tr-autotune measure": ["tr-autotune", "measure", *SYSTEM, "--N", "2", "--B", "1", "9"],
    "tr-profile routing": ["tr-profile", "routing", "--trace", "fifo"],
    "tr-profile system": ["tr-profile", "system", "--latency-profile", "fifo", "--trace", TRACE],
    "tr-shadow stats": ["tr-shadow", "stats", "--trace", "fifo"],
}


@pytest.mark.parametrize("case", sorted(OUT_FIRST))
@pytest.mark.parametrize("target", ["nodir/r.json", "/dev/null"])
def test_out_is_checked_before_any_work(here, case, target):
    """With a bad --out and a bad input, the --out is named: it was checked first."""
    check_refused(here, OUT_FIRST[case] + ["--out", target], "--out")


def test_an_error_leaves_no_run_folder(here):
    check_refused(here, ["tr-profile", "route-run", "--config", SMALL_CONFIG, LARGE_CONFIG, "--prompts",
                         "prompts.jsonl"], "--policy is required")
    check_refused(here, ["tr-profile", "route-run", "--config", SMALL_CONFIG, LARGE_CONFIG, "--prompts",
                         "prompts.jsonl", "--policy", "confidence", "--tau", "0.5", "--run-dir", "deep/er/runs",
                         "--max-new-tokens", "5000"], "--max-new-tokens", seconds=240)
    assert not (here / "deep").exists() and not (here / "runs").exists()
