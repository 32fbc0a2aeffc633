"""A held-out set of bad inputs (issue 25, target: at least 95 % clean).

Written after the kinds of tests/test_input_contract.py were fixed and not used to guide those fixes:
50 new bad inputs of the same kinds (input files that are not regular files, flags or keywords that would be
dropped, thresholds files and cache entries with impossible values, unbounded work, timer noise, flag
names, ``--out`` and run folders) and some others.  Clean means: the right exit code (2 bad input, 3 a
resource limit; for refused unbounded work either), exactly one ``error:`` line (the last line on stderr,
only ``note:`` / ``warning:`` lines besides), no traceback, nothing written in the working folder, and an
answer within the alarm (no hang).  For the Python API: one exception of the project's error types with a
one-line message, nothing written.

First run (before any fix for them): 46 of 52 clean (88.5 %); recorded with the six failures in
experiments/LOG.md ("input contract, held-out set").  Those six were then fixed by kind (an N the exact
chain cannot hold, the simulator's candidate count, a profile's step count, ``max_gap`` with a search that
ignores it in ``tune`` and ``tr-autotune run``) and pass here.
"""

from __future__ import annotations

import json
import os

import pytest

from test_input_contract import LARGE_CONFIG, SMALL_CONFIG, SYSTEM, TRACE, Hang, alarm, clean, listing, run

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.slow]

OPT = ["tr-optimize", *SYSTEM, "--N", "2", "--no-cache"]
RUN = ["tr-autotune", "run", *SYSTEM, "--N", "3", "--thresholds", "t.json"]

# id -> (argv, expected exit codes, a word the error line must contain)
CASES = {
    # input files that are not regular files
    "optimize simulate --trace /dev/zero": (OPT + ["--method", "simulate", "--trace", "/dev/zero"], {2}, "/dev/zero"),
    "profile routing --trace a folder": (["tr-profile", "routing", "--trace", "adir"], {2}, "adir"),
    "measure --thresholds /dev/zero": (["tr-autotune", "measure", *SYSTEM, "--N", "2", "--thresholds", "/dev/zero"],
                                       {2}, "/dev/zero"),
    "shadow stats --matrix fifo": (["tr-shadow", "stats", "--matrix", "fifo"], {2}, "fifo"),
    "shadow simulate --traffic folder": (["tr-shadow", "simulate", "--synthetic", "--sessions", "3", "--traffic",
                                          "adir"], {2}, "adir"),
    "profile roofline fifo": (["tr-profile", "roofline", "fifo"], {2}, "fifo"),
    "optimize --L-table /dev/zero": (["tr-optimize", "--p", "0.35", "--L-table", "/dev/zero", "--N", "2"], {2},
                                     "/dev/zero"),
    "shadow latency --gpu fifo": (["tr-shadow", "latency", "--model", "qwen3-0.6b", "--gpu", "fifo.json"], {2},
                                  "fifo.json"),
    "autotune run --spec /dev/zero": (["tr-autotune", "run", "--spec", "/dev/zero", "--N", "2", "--thresholds",
                                       "t.json"], {2}, "/dev/zero"),
    "profile latency --model folder without config": (["tr-profile", "latency", "--model", "adir"], {2}, "adir"),
    # flags that would be dropped
    "optimize simulate --tol": (OPT + ["--method", "simulate", "--tol", "1e-9"], {2}, "--tol"),
    "optimize simulate --max-states": (OPT + ["--method", "simulate", "--max-states", "100"], {2}, "--max-states"),
    "optimize local --max-gap": (OPT + ["--search", "local", "--max-gap", "0.1"], {2}, "--max-gap"),
    "optimize simulate search --sim-steps": (OPT + ["--method", "simulate", "--sim-steps", "5000"], {2},
                                             "--sim-steps"),
    "autotune run exhaustive --max-gap": (RUN + ["--search", "exhaustive", "--max-gap", "0.01"], {2}, "--max-gap"),
    "profile latency --cuda-graph on cpu": (["tr-profile", "latency", "--config", SMALL_CONFIG, "--device", "cpu",
                                             "--cuda-graph", "--batch-sizes", "1", "--steps", "1"], {2},
                                            "--cuda-graph"),
    "shadow simulate --workload --first-input": (["tr-shadow", "simulate", "--workload", "paper", "--sessions", "3",
                                                  "--first-input", "100,0.5"], {2}, "--first-input"),
    "shadow stats --trace --gap-s": (["tr-shadow", "stats", "--trace", "t.jsonl", "--gap-s", "1,1"], {2}, "--gap-s"),
    "autotune show --N with --format csv and --require-N 0": (["tr-autotune", "show", "th.json", "--require-N", "0"],
                                                              {2}, "--require-N"),
    # thresholds files whose values cannot occur
    "show: gap 2 in a certified row": (["tr-autotune", "show", "gap2.json"], {2}, "gap"),
    "show: fallback [1, 3]": (["tr-autotune", "show", "fallback13.json"], {2}, "fallback_thresholds"),
    "show: delta 0.2 vs the spec's 0.1": (["tr-autotune", "show", "delta.json"], {2}, "delta_ms"),
    "show: upper bound below prediction": (["tr-autotune", "show", "upper.json"], {2}, "upper_bound_tok_s"),
    "show: three model names for two models": (["tr-autotune", "show", "names3.json"], {2}, "model_names"),
    "measure: a table for 3 models, a system of 2": (["tr-autotune", "measure", *SYSTEM, "--N", "2", "--thresholds",
                                                      "three.json"], {2}, "3"),
    # unbounded work
    "optimize certified --N 1-100000": (["tr-optimize", *SYSTEM, "--N", "1-100000", "--search", "certified",
                                         "--no-cache"], {2, 3}, "N"),
    "optimize simulate --N 10000000": (OPT[:-3] + ["--N", "10000000", "--method", "simulate", "--no-cache"], {2, 3},
                                       "N"),
    "autotune run --N 1000000": (["tr-autotune", "run", *SYSTEM, "--N", "1000000", "--thresholds", "t.json"], {2, 3},
                                 "N"),
    "profile latency --steps 10^9": (["tr-profile", "latency", "--config", SMALL_CONFIG, "--device", "cpu",
                                      "--batch-sizes", "1", "--steps", "1000000000"], {2, 3}, "--steps"),
    "profile latency --batch-sizes 1-100000": (["tr-profile", "latency", "--config", SMALL_CONFIG, "--device", "cpu",
                                                "--batch-sizes", "1-100000"], {2, 3}, "--batch-sizes"),
    "shadow compare 10^6 sim seeds": (["tr-shadow", "compare", "--synthetic", "--sessions", "3", "--sim-seeds",
                                       "0-999999"], {2, 3}, "--sim-seeds"),
    # timer noise
    "measure --time-scale 0.02": (["tr-autotune", "measure", *SYSTEM, "--N", "2", "--B", "1", "2", "--no-predict",
                                   "--time-scale", "0.02", "--duration-s", "1"], {2}, "--time-scale"),
    # messages name the flag typed
    "show --N -1": (["tr-autotune", "show", "th.json", "--N", "-1"], {2}, "--N"),
    "measure --N 0": (["tr-autotune", "measure", *SYSTEM, "--N", "0", "--B", "1", "1"], {2}, "--N"),
    "optimize --sim-budget-s 0": (OPT + ["--method", "simulate", "--sim-budget-s", "0"], {2}, "--sim-budget-s"),
    "shadow stats --replay-tpot-s -1": (["tr-shadow", "stats", "--synthetic", "--sessions", "3", "--replay-tpot-s",
                                         "-1"], {2}, "--replay-tpot-s"),
    "kv-plan --N 0": (["tr-autotune", "kv-plan", "--placement", "fifo", "--N", "0"], {2}, "--N"),
    "autotune run --time-budget-s inf": (RUN + ["--time-budget-s", "inf"], {2}, "--time-budget-s"),
    # --out first, nothing written
    "shadow sessions --out missing folder": (["tr-shadow", "sessions", "--synthetic", "--sessions", "3", "--out",
                                              "nodir/x.jsonl"], {2}, "--out"),
    "shadow latency --save-model /dev/null": (["tr-shadow", "latency", "--model", "qwen3-0.6b", "--save-model",
                                               "/dev/null"], {2}, "--save-model"),
    "profile system --out folder/": (["tr-profile", "system", "--latency-profile", "fifo", "--trace", TRACE, "--out",
                                      "adir/"], {2}, "--out"),
    "autotune run --thresholds a folder": (["tr-autotune", "run", *SYSTEM, "--N", "3", "--thresholds", "adir"], {2},
                                           "--thresholds"),
    "optimize --plot .gif with --out": (OPT + ["--plot", "p.gif", "--out", "r.json"], {2}, "p.gif"),
    "route-run --trace-out /dev/null": (["tr-profile", "route-run", "--config", SMALL_CONFIG, LARGE_CONFIG,
                                         "--prompts", "prompts.jsonl", "--policy", "confidence", "--tau", "0.5",
                                         "--trace-out", "/dev/null"], {2}, "--trace-out"),
    "optimize --out a symlink to a fifo": (OPT + ["--out", "link-to-fifo"], {2}, "--out"),
    # others
    "optimize --weights that do not sum to 1 and --p": (["tr-optimize", "--weights", "0.5", "0.6", "--L", "6", "28",
                                                         "--N", "2"], {2}, "--weights"),
    "optimize --N with a space-range typo": (OPT[:-3] + ["--N", "1--4"], {2}, "--N"),
}


def _table(tmp, name, spoil):
    doc = json.loads((tmp / "th.json").read_text())
    spoil(doc)
    (tmp / name).write_text(json.dumps(doc))


def _resign(doc):
    from tr_model.thresholds import spec_sha256
    doc["spec_sha256"] = spec_sha256(doc["spec"])


def _three_models(doc):
    doc["num_models"] = 3
    for e in doc["entries"]:
        e["thresholds"] = e["thresholds"] + [1]
    doc["fallback_thresholds"] = [1, 1, 1]
    doc.pop("spec")
    doc.pop("spec_sha256")
    doc["model_names"] = None


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    from tr_core.spec import preset
    from tr_model.tuning.autotune import tune
    d = tmp_path_factory.mktemp("heldout-th")
    tune(preset("r2r", [6.0, 27.9], p=0.35), 4, d / "th.json", search="certified", max_gap=0.01)
    return (d / "th.json").read_text()


@pytest.fixture
def here(tmp_path, monkeypatch, table):
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    os.mkfifo(tmp_path / "fifo.json")
    os.symlink(tmp_path / "fifo", tmp_path / "link-to-fifo")
    os.mkdir(tmp_path / "adir")
    (tmp_path / "prompts.jsonl").write_text('{"input_ids": [1, 2, 3]}\n')
    (tmp_path / "t.jsonl").write_text(json.dumps({"session": "a", "step": 0, "model": "small", "prompt_tokens": 50,
                                                  "new_input_tokens": 50, "output_tokens": 5, "gap_s": 0.0,
                                                  "append_only": True}) + "\n")
    (tmp_path / "th.json").write_text(table)
    _table(tmp_path, "gap2.json", lambda d: d["entries"][3].update(gap=2.0))
    _table(tmp_path, "fallback13.json", lambda d: d.update(fallback_thresholds=[1, 3]))
    _table(tmp_path, "delta.json", lambda d: d.update(delta_ms=0.2))
    _table(tmp_path, "upper.json", lambda d: d["entries"][0].update(upper_bound_tok_s=1.0))
    _table(tmp_path, "names3.json", lambda d: d.update(model_names=["a", "b", "c"]))
    _table(tmp_path, "three.json", _three_models)
    return tmp_path


@pytest.mark.parametrize("case", sorted(CASES))
def test_heldout_cli(here, case):
    argv, codes, needle = CASES[case]
    before = listing(here)
    try:
        code, _, err = run(argv, seconds=90)
    except Hang:
        pytest.fail("hung")
    expect = code if code in codes else min(codes)
    clean(code, err, expect, before=before, folder=here, needle=needle)


# ------------------------------------------------------------------------------------------- Python API


def _api_cases():
    import tr_model
    from tr_core.spec import preset
    from tr_model.tuning.autotune import tune
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    return {
        "optimize_many local boxes=": lambda tmp: tr_model.optimize_many(spec, [2], search="local", boxes=True),
        "tune exhaustive max_gap=": lambda tmp: tune(spec, 3, tmp / "t.json", search="exhaustive", max_gap=0.01),
        "evaluate B of the wrong length": lambda tmp: tr_model.evaluate(spec, 3, (1, 1, 1)),
        "optimize N = 0": lambda tmp: tr_model.optimize(spec, 0),
        "read_trace of a folder": lambda tmp: __import__("tr_core.routing_trace", fromlist=["x"]).read_trace(tmp),
    }


API = ["optimize_many local boxes=", "tune exhaustive max_gap=", "evaluate B of the wrong length", "optimize N = 0",
       "read_trace of a folder"]


@pytest.mark.parametrize("case", API)
def test_heldout_api(tmp_path, case):
    from tr_core.errors import TRError
    call = _api_cases()[case]
    with alarm(90):
        with pytest.raises((TRError, ValueError)) as e:
            call(tmp_path)
    assert str(e.value) and "\n" not in str(e.value)
    assert listing(tmp_path) == set()


# ------------------------------------------------------------------------------ the second batch
# Written after the first batch's failures were fixed; measured once (experiments/LOG.md).

CASES_2 = {
    "profile system two /dev/zero profiles": (["tr-profile", "system", "--latency-profile", "/dev/zero", "/dev/zero",
                                               "--trace", TRACE], {2}, "/dev/zero"),
    "kv-plan --placement a folder": (["tr-autotune", "kv-plan", "--placement", "adir"], {2}, "adir"),
    "shadow latency --profile fifo": (["tr-shadow", "latency", "--profile", "fifo"], {2}, "fifo"),
    "optimize --trace a symlink to a fifo": (OPT + ["--method", "simulate", "--trace", "link-to-fifo"], {2}, "link"),
    "shadow stats --prices fifo": (["tr-shadow", "stats", "--synthetic", "--sessions", "3", "--prices", "fifo"], {2},
                                   "fifo"),
    "route-run --prompts a folder": (["tr-profile", "route-run", "--config", SMALL_CONFIG, LARGE_CONFIG, "--prompts",
                                      "adir", "--policy", "confidence", "--tau", "0.5"], {2}, "adir"),
    "optimize --B with --workers": (OPT + ["--B", "1", "2", "--workers", "2"], {2}, "--workers"),
    "optimize simulate --search certified": (OPT + ["--method", "simulate", "--search", "certified"], {2}, "--search"),
    "autotune run local --max-gap": (RUN + ["--search", "local", "--max-gap", "0.1"], {2}, "--max-gap"),
    "shadow simulate two sources": (["tr-shadow", "simulate", "--synthetic", "--workload", "paper", "--sessions", "3"],
                                    {2}, "--"),
    "shadow stats --trace --summary-tokens": (["tr-shadow", "stats", "--trace", "t.jsonl", "--summary-tokens", "500"],
                                              {2}, "--summary-tokens"),
    "show: pruned-exact row below eager": (["tr-autotune", "show", "pruned_below.json"], {2}, "predicted_tok_s"),
    "show: 3 routing rows for 2 models": (["tr-autotune", "show", "rows3.json"], {2}, "num_models"),
    "optimize auto --N 100000": (OPT[:-3] + ["--N", "100000", "--method", "auto", "--no-cache"], {2, 3}, "N"),
    "optimize certified --N 1-2047": (["tr-optimize", *SYSTEM, "--N", "1-2047", "--search", "certified",
                                       "--no-cache"], {2, 3}, "N"),
    "profile latency 256 sizes x 5000 steps": (["tr-profile", "latency", "--config", SMALL_CONFIG, "--device", "cpu",
                                                "--batch-sizes", "1-256", "--steps", "5000"], {2, 3}, "--steps"),
    "measure --duration-s 1e9": (["tr-autotune", "measure", *SYSTEM, "--N", "2", "--B", "1", "2", "--no-predict",
                                  "--duration-s", "1e9"], {2, 3}, "--duration-s"),
    "measure --thresholds with --time-scale 1e-4": (["tr-autotune", "measure", *SYSTEM, "--N", "2", "--thresholds",
                                                     "th.json", "--time-scale", "0.0001"], {2}, "--time-scale"),
    "autotune run --thresholds into a folder/": (["tr-autotune", "run", *SYSTEM, "--N", "3", "--thresholds",
                                                  "adir/"], {2}, "--thresholds"),
    "optimize --spec with --delta-ms -1": (["tr-optimize", "--spec", "spec.json", "--N", "2", "--delta-ms", "-1"],
                                           {2}, "--delta-ms "),
    "show --require-N -1": (["tr-autotune", "show", "th.json", "--require-N", "-1"], {2}, "--require-N"),
    "shadow --gap-s x": (["tr-shadow", "stats", "--synthetic", "--sessions", "3", "--gap-s", "x"], {2}, "--gap-s:"),
    "profile routing --out a folder": (["tr-profile", "routing", "--trace", TRACE, "--out", "adir"], {2}, "--out"),
    "shadow sessions --out a symlink to a fifo": (["tr-shadow", "sessions", "--synthetic", "--sessions", "3", "--out",
                                                   "link-to-fifo"], {2}, "--out"),
    "optimize --L 6 nan": (["tr-optimize", "--p", "0.35", "--L", "6", "nan", "--N", "2"], {2}, "--L"),
    "measure --output-tokens 0": (["tr-autotune", "measure", *SYSTEM, "--N", "2", "--B", "1", "1",
                                   "--output-tokens", "0"], {2}, "--output-tokens"),
    "profile routing an empty trace": (["tr-profile", "routing", "--trace", "empty.jsonl"], {2}, "empty.jsonl"),
    "optimize an empty spec": (["tr-optimize", "--spec", "empty.json", "--N", "2"], {2}, "empty.json"),
}


@pytest.fixture
def here2(here):
    import shutil
    shutil.copy(os.path.join(os.path.dirname(TRACE), "spec-r2r.json"), here / "spec.json")
    (here / "empty.jsonl").write_text("")
    (here / "empty.json").write_text("")

    def below(d):
        e = d["entries"][3]
        e["certificate"] = "pruned-exact"
        e["gap"] = 0.0
        e["predicted_tok_s"] = e["eager_tok_s"] * 0.9
        e["upper_bound_tok_s"] = None

    def rows3(d):
        d["spec"]["routing_matrix"] = d["spec"]["routing_matrix"] + [[1.0, 0.0]]
        _resign(d)

    _table(here, "pruned_below.json", below)
    _table(here, "rows3.json", rows3)
    return here


NOT_CLEAN: dict = {}  # was: "optimize certified --N 1-2047" (hours of work, now refused with its estimate)


@pytest.mark.parametrize("case", sorted(CASES_2))
def test_heldout_cli_second_batch(here2, case):
    if case in NOT_CLEAN:
        pytest.xfail(NOT_CLEAN[case])  # not run: it would hold the suite for the alarm's 90 s
    argv, codes, needle = CASES_2[case]
    before = listing(here2)
    try:
        code, _, err = run(argv, seconds=90)
    except Hang:
        pytest.fail("hung")
    expect = code if code in codes else min(codes)
    clean(code, err, expect, before=before, folder=here2, needle=needle)


def _spoil_cache_entry(tmp, spoil):
    from tr_core.spec import preset
    from tr_model import evaluate
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    fresh = evaluate(spec, 4, (1, 3), cache=str(tmp))
    path = [os.path.join(d, f) for d, _, fs in os.walk(tmp) for f in fs][0]
    with open(path) as f:
        doc = json.load(f)
    spoil(doc)
    with open(path, "w") as f:
        f.write(json.dumps(doc))
    return spec, fresh


CACHE_2 = {"admission latency a string": lambda d: d["admission_latency_ms"].__setitem__(0, "x"),
           "B with a zero": lambda d: d.__setitem__("B", [0, 3]),
           "solver a number": lambda d: d.__setitem__("solver", 7)}


@pytest.mark.parametrize("case", sorted(CACHE_2))
def test_heldout_cache_second_batch(tmp_path, capsys, case):
    from tr_model import evaluate
    spec, fresh = _spoil_cache_entry(tmp_path, CACHE_2[case])
    capsys.readouterr()
    with alarm(60):
        again = evaluate(spec, 4, (1, 3), cache=str(tmp_path))
    err = capsys.readouterr().err
    assert not again.cached and again.throughput_tok_s == fresh.throughput_tok_s
    assert err.count("warning: result cache entry") == 1, err


def _api_cases_2():
    import tr_model
    from tr_core.spec import preset
    from tr_model.tuning.autotune import tune
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    return {
        "optimize_many pruned max_gap=": lambda tmp: tr_model.optimize_many(spec, [2, 3], search="pruned",
                                                                             max_gap=0.1),
        "tune local max_gap=": lambda tmp: tune(spec, 3, tmp / "t.json", search="local", max_gap=0.2),
        "optimize_many N beyond the chain": lambda tmp: tr_model.optimize_many(spec, [3, 5000], search="local"),
    }


@pytest.mark.parametrize("case", ["optimize_many pruned max_gap=", "tune local max_gap=",
                                  "optimize_many N beyond the chain"])
def test_heldout_api_second_batch(tmp_path, case):
    from tr_core.errors import TRError
    call = _api_cases_2()[case]
    with alarm(90):
        with pytest.raises((TRError, ValueError)) as e:
            call(tmp_path)
    assert str(e.value) and "\n" not in str(e.value)
    assert listing(tmp_path) == set()


# ------------------------------------------------------------------------------- the third batch
# Written after every fix above, before it was first run: the figure after the fixes (experiments/LOG.md):
# 24 of 25 clean at the first run; the one failure (an empty --out read as none) was fixed after.

LP = [os.path.join(os.path.dirname(TRACE), f"latency-{m}.json") for m in ("small", "large")]

CASES_3 = {
    "optimize --spec a folder": (["tr-optimize", "--spec", "adir", "--N", "2"], {2}, "adir"),
    "show a symlink to a fifo": (["tr-autotune", "show", "link-to-fifo"], {2}, "link-to-fifo"),
    "profile system --trace fifo": (["tr-profile", "system", "--latency-profile", *LP, "--trace", "fifo"], {2}, "fifo"),
    "shadow --model-config fifo": (["tr-shadow", "stats", "--synthetic", "--sessions", "3", "--latency",
                                    "--model-config", "small=fifo.json"], {2}, "fifo.json"),
    "optimize simulate search --sim-steps with --jitter": (OPT + ["--method", "simulate", "--jitter", "0.2",
                                                                  "--sim-steps", "5000"], {2}, "--sim-steps"),
    "optimize --B with --dask": (OPT + ["--B", "1", "2", "--dask", "tcp://127.0.0.1:1"], {2}, "--dask"),
    "autotune run pruned --max-gap": (RUN + ["--search", "pruned", "--max-gap", "0.1"], {2}, "--max-gap"),
    "shadow sessions --trace --tasks": (["tr-shadow", "sessions", "--trace", "t.jsonl", "--tasks", "3"], {2},
                                        "--tasks"),
    "show: gap 3 in an exhaustive row": (["tr-autotune", "show", "gap3.json"], {2}, "gap"),
    "optimize --B at N = 3000": (OPT[:-3] + ["--N", "3000", "--B", "1", "1", "--no-cache"], {2, 3}, "--N"),
    "measure --warmup-s 1e6": (["tr-autotune", "measure", *SYSTEM, "--N", "2", "--B", "1", "2", "--warmup-s", "1e6",
                                "--duration-s", "1"], {2, 3}, "--warmup-s"),
    "profile latency --warmup-steps 10^6": (["tr-profile", "latency", "--config", SMALL_CONFIG, "--device", "cpu",
                                             "--batch-sizes", "1", "--steps", "100", "--warmup-steps", "1000000"],
                                            {2, 3}, "--warmup-steps"),
    "measure --time-scale 0.03": (["tr-autotune", "measure", *SYSTEM, "--N", "2", "--B", "1", "2", "--no-predict",
                                   "--time-scale", "0.03", "--duration-s", "1"], {2}, "--time-scale"),
    "optimize --sim-budget-s -5": (OPT + ["--method", "simulate", "--sim-budget-s", "-5"], {2}, "--sim-budget-s "),
    "kv-plan --N -1": (["tr-autotune", "kv-plan", "--placement", "fifo", "--N", "-1"], {2}, "--N"),
    "shadow --replay-tpot-s x": (["tr-shadow", "stats", "--synthetic", "--sessions", "3", "--replay-tpot-s", "x"],
                                 {2}, "--replay-tpot-s"),
    "profile routing --out /dev/full": (["tr-profile", "routing", "--trace", TRACE, "--out", "/dev/full"], {2},
                                        "--out"),
    "show --out a folder/": (["tr-autotune", "show", "th.json", "--out", "adir/"], {2}, "--out"),
    "optimize --out empty": (OPT + ["--out", ""], {2}, "--out"),
    "shadow latency --out missing folder": (["tr-shadow", "latency", "--model", "qwen3-0.6b", "--out",
                                             "nodir/x.json"], {2}, "--out"),
    "optimize --max-batch 0": (OPT + ["--max-batch", "0", "none"], {2}, "--max-batch"),
    "autotune run --spec with --p": (["tr-autotune", "run", "--spec", "spec.json", "--p", "0.3", "--N", "2",
                                      "--thresholds", "t.json"], {2}, "--spec"),
}


@pytest.fixture
def here3(here2):
    _table(here2, "gap3.json", lambda d: d["entries"][0].update(gap=3.0))
    return here2


@pytest.mark.parametrize("case", sorted(CASES_3))
def test_heldout_cli_third_batch(here3, case):
    argv, codes, needle = CASES_3[case]
    before = listing(here3)
    try:
        code, _, err = run(argv, seconds=90)
    except Hang:
        pytest.fail("hung")
    expect = code if code in codes else min(codes)
    clean(code, err, expect, before=before, folder=here3, needle=needle)


def _api_cases_3():
    import tr_model
    from tr_core.spec import preset
    from tr_model.tuning.autotune import tune
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    return {"optimize exhaustive policies=": lambda tmp: tr_model.optimize(spec, 3, search="exhaustive",
                                                                            policies=None),
            "tune N = 5000": lambda tmp: tune(spec, 5000, tmp / "t.json"),
            "evaluate N = 3000": lambda tmp: tr_model.evaluate(spec, 3000, (1, 1))}


@pytest.mark.parametrize("case", ["optimize exhaustive policies=", "tune N = 5000", "evaluate N = 3000"])
def test_heldout_api_third_batch(tmp_path, case):
    from tr_core.errors import TRError
    with alarm(90):
        with pytest.raises((TRError, ValueError)) as e:
            _api_cases_3()[case](tmp_path)
    assert str(e.value) and "\n" not in str(e.value)
    assert listing(tmp_path) == set()
