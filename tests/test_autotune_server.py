"""on_server_start and tr-autotune run: caching, budgets, the background process, failures, bad input."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest

import tr_model
import tr_model.tuning.autotune as autotune
from tr_model.tuning.autotune import inputs_sha256, on_server_start, solver_options, tune
from tr_core.spec import save_spec
from tr_model.thresholds import ThresholdTable, WatchedThresholds

SPEC = tr_model.preset("r2r", [6.0, 27.9], p=0.35)


def _no_compute(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("nothing may be computed")
    monkeypatch.setattr(autotune, "_optimize", boom)
    monkeypatch.setattr(autotune, "spawn_worker", boom)


def test_first_start_computes_second_returns_at_once(tmp_path, monkeypatch):
    out, cache = tmp_path / "th.json", tmp_path / "cache"
    t = on_server_start(SPEC, 6, out, time_budget_s=120, cache_dir=cache, background=False)
    assert t.complete and t.covered_concurrency == 6 and t.source == "file"
    # reference values (delayed-batching-model.md): N = 1 closed form, N = 2 at (1,2), N = 4 at (1,3)
    assert t.predicted(1) == pytest.approx(1000 / (6.0 + 0.35 * 27.9), rel=1e-9)
    assert t.lookup(1) == (1, 1)
    doc = json.loads(out.read_text())
    e = {x["active_requests"]: x for x in doc["entries"]}
    assert e[2]["eager_tok_s"] == pytest.approx(98.96, abs=0.01)
    assert e[4]["eager_tok_s"] == pytest.approx(187.19, abs=0.01)
    assert e[2]["predicted_tok_s"] >= 110.32 - 0.01 and e[4]["predicted_tok_s"] >= 207.95 - 0.01
    # each row is the argmax over the whole feasible set at its own N
    for n in (2, 4):
        feas = [(b0, b1) for b0 in range(1, n + 1) for b1 in range(1, n + 1) if b0 + b1 - 2 < n]
        best = max(tr_model.evaluate(SPEC, n, B).throughput_tok_s for B in feas)
        assert e[n]["predicted_tok_s"] == pytest.approx(best, rel=1e-9)
        assert tr_model.evaluate(SPEC, n, tuple(e[n]["thresholds"])).throughput_tok_s == pytest.approx(best)
    assert doc["provenance"]["inputs_sha256"] == inputs_sha256(SPEC, 6, solver_options())
    assert (cache / (doc["provenance"]["inputs_sha256"] + ".json")).exists()

    assert [x["certificate"] for x in doc["entries"]] == ["exhaustive"] * 6 or \
        {x["certificate"] for x in doc["entries"]} <= {"exhaustive", "pruned-exact"}
    assert not (tmp_path / "th.json.lock").exists() and not (tmp_path / "th.json.worker-job.json").exists()
    _no_compute(monkeypatch)     # a second start reads the file: no optimization, no worker
    before = out.read_bytes()
    t2 = on_server_start(SPEC, 6, out, time_budget_s=120, cache_dir=cache, background=True)
    assert t2.source == "file" and t2.thresholds == t.thresholds
    assert out.read_bytes() == before
    # a new output path is served from the cache directory without computing
    t3 = on_server_start(SPEC, 6, tmp_path / "other.json", cache_dir=cache)
    assert t3.thresholds == t.thresholds and (tmp_path / "other.json").exists()


def test_inputs_hash_tracks_what_matters():
    h = inputs_sha256(SPEC, 8)
    assert h == inputs_sha256(tr_model.preset("r2r", [6.0, 27.9], p=0.35), 8)
    assert h != inputs_sha256(SPEC, 9)
    assert h != inputs_sha256(tr_model.preset("r2r", [6.0, 27.9], p=0.3), 8)
    assert h != inputs_sha256(SPEC, 8, solver_options(max_states=100))
    with_prov = tr_model.make_spec(SPEC.step_latency_ms, SPEC.routing_matrix, SPEC.committed_tokens,
                                   name=SPEC.name, provenance={"measured": "yesterday"})
    assert inputs_sha256(with_prov, 8) == h


def test_no_time_budget_computes_every_row_here_with_the_default_background(tmp_path, caplog):
    """time_budget_s=None with the default background=True is the foreground computation, not a refusal
    (which would start the server on the eager fallback)."""
    out = tmp_path / "th.json"
    with caplog.at_level("WARNING"):
        t = on_server_start(SPEC, 4, out, time_budget_s=None)
    assert not [r for r in caplog.records if "eager fallback" in r.getMessage()]
    assert t.complete and t.covered_concurrency == 4 and t.lookup(4) == (1, 3)


def test_time_budget_writes_a_partial_table_then_resumes(tmp_path):
    out = tmp_path / "th.json"
    t = on_server_start(SPEC, 7, out, time_budget_s=0.0, background=False)
    assert t.covered_concurrency <= 1 and not t.complete            # the worker was killed at once
    disk = ThresholdTable.load(out)
    assert not disk.complete and disk.lookup(7) == (1, 1) and disk.certificate(7) == "extrapolated"
    assert "time budget" in json.loads(out.read_text())["provenance"]["stopped_reason"]
    assert sorted(os.listdir(tmp_path)) == ["th.json"]              # no lock, job, log or temp file left
    t = on_server_start(SPEC, 7, out, time_budget_s=120, background=False)
    assert t.complete and t.covered_concurrency == 7
    assert ThresholdTable.load(out, require_concurrency=7).lookup(7) == t.lookup(7)


def test_background_worker_completes_the_file_atomically(tmp_path, monkeypatch):
    out = tmp_path / "th.json"
    t = on_server_start(SPEC, 12, out, time_budget_s=0.0, cache_dir=tmp_path / "c", background=True)
    assert not t.complete
    watched = WatchedThresholds(out, check_interval_s=0.0)     # what a running server holds
    assert watched.lookup(12) == t.lookup(12) == t.lookup(1)
    lock = json.loads((tmp_path / "th.json.lock").read_text())
    assert lock["pid"] != os.getpid()
    # a second start while the worker runs: no recompute, no second worker
    _no_compute(monkeypatch)
    t1 = on_server_start(SPEC, 12, out, time_budget_s=0.0, cache_dir=tmp_path / "c", background=True)
    assert json.loads((tmp_path / "th.json.lock").read_text())["pid"] == lock["pid"]
    assert t1.lookup(1) == (1, 1) and not t1.complete
    deadline = time.time() + 150
    reads = 0
    while time.time() < deadline:
        tab = ThresholdTable.load(out)           # every read must see a whole, valid file
        reads += 1
        if tab.complete:
            break
        time.sleep(0.05)
    log = tmp_path / "th.json.worker.log"
    assert tab.complete, log.read_text() if log.exists() else ""
    assert watched.lookup(12) == tab.lookup(12) and watched.table.complete and watched.last_error is None
    for _ in range(100):
        if not (tmp_path / "th.json.lock").exists():
            break
        time.sleep(0.05)
    assert not (tmp_path / "th.json.lock").exists()
    monkeypatch.undo()
    ref = tune(SPEC, 12, tmp_path / "fg.json")
    assert tab.thresholds == ref.thresholds
    assert tab.predicted_tok_s == pytest.approx(ref.predicted_tok_s, rel=1e-9)
    _no_compute(monkeypatch)
    t2 = on_server_start(SPEC, 12, out, cache_dir=tmp_path / "c")
    assert t2.complete and t2.thresholds == ref.thresholds


def test_a_start_with_other_inputs_stops_the_old_worker(tmp_path):
    out = tmp_path / "th.json"
    on_server_start(SPEC, 40, out, time_budget_s=0.0, background=True)     # worker for N = 1..40
    pid = json.loads((tmp_path / "th.json.lock").read_text())["pid"]
    other = tr_model.preset("r2r", [6.0, 27.9], p=0.3)
    t = on_server_start(other, 3, out, time_budget_s=60, background=False)
    assert t.complete and not (tmp_path / "th.json.lock").exists()
    deadline = time.time() + 120
    exited = False
    try:
        while time.time() < deadline and not exited:   # the old worker notices at its next write and exits
            try:
                exited = os.waitpid(pid, os.WNOHANG)[0] == pid
            except ChildProcessError:
                exited = True
            time.sleep(0.1)
    finally:
        if not exited:
            os.kill(pid, signal.SIGKILL)   # our own child, started by on_server_start above
            os.waitpid(pid, 0)
    assert exited
    assert ThresholdTable.load(out).inputs_sha256 == inputs_sha256(other, 3, solver_options())


def test_unexpected_failure_logs_one_line_and_returns_eager(tmp_path, monkeypatch, caplog):
    def broken(*a, **k):
        raise RuntimeError("disk exploded\nsecond line")
    monkeypatch.setattr(autotune, "spawn_worker", broken)
    with caplog.at_level(logging.WARNING, logger="tr_model.tuning.autotune"):
        t = on_server_start(SPEC, 5, tmp_path / "th.json", time_budget_s=1, background=True)
    assert t.source == "fallback" and t.lookup(3) == (1, 1) and t.covered_concurrency == 5
    recs = [r for r in caplog.records if r.name == "tr_model.tuning.autotune"]
    assert len(recs) == 1 and "disk exploded" in recs[0].getMessage()
    assert "\n" not in recs[0].getMessage() and "eager" in recs[0].getMessage()


def _curve_spec(bad_at):
    """R2R whose small model's latency leaves the 0.1 ms grid at batch size ``bad_at``: N < bad_at works,
    N = bad_at fails (off-grid latency, no rounding) in the worker exactly as a broken N would."""
    sizes = list(range(1, bad_at + 1))
    lat = [6.0] * (bad_at - 1) + [6.05]
    return tr_model.make_spec([6.0, 27.9], [[0.65, 0.35], [1.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]],
                              latency_curves=[{"batch_size": sizes, "step_latency_ms": lat}, None])


def test_a_failing_n_keeps_the_rows_already_computed(tmp_path, caplog):
    spec = _curve_spec(4)
    out = tmp_path / "th.json"
    with pytest.raises(tr_model.SpecError, match=r"N = 4 failed: .*batch size 4.*rows N = 1..3 are kept"):
        tune(spec, 6, out)                                          # strict form (CLI): reports, keeps rows
    t = ThresholdTable.load(out)
    assert t.covered_concurrency == 3 and t.certificate(6) == "extrapolated" and t.lookup(6) == t.lookup(3)
    assert t.lookup(3) == tr_model.optimize(spec, 3).best_B
    prov = json.loads(out.read_text())["provenance"]
    assert prov["resumable"] is False and prov["stopped_reason"].startswith("N = 4 failed")
    out.unlink()
    with caplog.at_level(logging.WARNING, logger="tr_model.tuning.autotune"):   # the hook: worker process, one line
        t = on_server_start(spec, 6, out, time_budget_s=120, background=True)
    assert t.covered_concurrency == 3 and t.source == "file" and t.lookup(5) == t.lookup(3)
    recs = [r.getMessage() for r in caplog.records if r.name == "tr_model.tuning.autotune"]
    assert len(recs) == 1 and "N = 4 failed" in recs[0] and "N = 1..3" in recs[0], recs


def test_a_corrupted_file_is_logged_before_it_is_replaced(tmp_path, caplog):
    out = tmp_path / "th.json"
    out.write_text('{"schema_version": 2, "entries": [')
    with caplog.at_level(logging.WARNING, logger="tr_model.tuning.autotune"):
        t = on_server_start(SPEC, 3, out, time_budget_s=120, background=False)
    assert t.complete
    recs = [r.getMessage() for r in caplog.records if r.name == "tr_model.tuning.autotune"]
    assert len(recs) == 1 and "corrupted" in recs[0] and str(out) in recs[0] and "not valid JSON" in recs[0]


def test_an_unwritable_cache_folder_keeps_the_computed_table(tmp_path, caplog):
    cache = tmp_path / "cache"
    cache.mkdir()
    with _read_only_dir(cache):
        with caplog.at_level(logging.WARNING, logger="tr_model.tuning.autotune"):
            t = tune(SPEC, 3, tmp_path / "th.json", cache_dir=cache)
        assert t.complete and t.source == "file" and t.lookup(3) != (1, 1)
        recs = [r.getMessage() for r in caplog.records if r.name == "tr_model.tuning.autotune"]
        assert len(recs) == 1 and "cache folder" in recs[0]
        assert os.listdir(cache) == []
        # the hook (worker process) too: the computed table is served, not the eager fallback
        t2 = on_server_start(SPEC, 4, tmp_path / "th2.json", time_budget_s=120, cache_dir=cache,
                             background=False)
        assert t2.complete and t2.source == "file" and t2.lookup(4) == (1, 3) and os.listdir(cache) == []


def test_state_space_limit_stops_the_table(tmp_path):
    out = tmp_path / "th.json"
    t = on_server_start(SPEC, 10, out, time_budget_s=60, background=True, max_states=60)
    assert 1 <= t.covered_concurrency < 10 and not t.complete
    prov = json.loads(out.read_text())["provenance"]
    assert prov["resumable"] is False and "N = " in prov["stopped_reason"]
    assert not (tmp_path / "th.json.lock").exists()          # nothing to finish in the background
    assert t.lookup(10) == t.lookup(t.covered_concurrency)


@contextlib.contextmanager
def _read_only_dir(path):
    """Make ``path`` unwritable even for root (chattr +i), or by mode bits for other users."""
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)]).returncode != 0:
            pytest.skip("running as root and cannot make a folder immutable (chattr +i)")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)])
    else:
        mode = os.stat(path).st_mode
        os.chmod(path, stat.S_IRUSR | stat.S_IXUSR)
        try:
            yield
        finally:
            os.chmod(path, mode)


def test_unwritable_folder_keeps_the_old_file(tmp_path, caplog):
    d = tmp_path / "ro"
    d.mkdir()
    out = d / "th.json"
    tune(SPEC, 3, out)
    old = out.read_bytes()
    spec_file = tmp_path / "spec.json"
    save_spec(SPEC, spec_file)
    with _read_only_dir(d):
        with caplog.at_level(logging.WARNING, logger="tr_model.tuning.autotune"):
            t = on_server_start(SPEC, 5, out, time_budget_s=60, background=True)
        assert t.complete and t.covered_concurrency == 5 and t.source == "memory"
        assert out.read_bytes() == old
        recs = [r for r in caplog.records if r.name == "tr_model.tuning.autotune"]
        assert len(recs) == 1 and "cannot write" in recs[0].getMessage()
        r = _cli("--spec", str(spec_file), "--N", "5", "--thresholds", str(out))
        assert r.returncode == 2 and r.stderr.startswith("error: cannot write")
        assert len(r.stderr.strip().splitlines()) == 1
        assert out.read_bytes() == old
        assert sorted(os.listdir(d)) == ["th.json"]          # no temp file left behind
    assert ThresholdTable.load(out).covered_concurrency == 3


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tr_model.autotune_cli", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_run_show_and_bad_input(tmp_path, run_inproc):
    spec_file = tmp_path / "spec.json"
    save_spec(SPEC, spec_file)
    out = tmp_path / "th.json"
    # the short form (no subcommand) is `run`
    r = _cli("--spec", str(spec_file), "--N", "4", "--thresholds", str(out), "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = r.stdout.strip().splitlines()
    assert rows[0].startswith("N,B*") and len(rows) == 5 and rows[4].startswith("4,1 3,207.95")
    r = _cli("show", str(out), "--N", "99")
    assert r.returncode == 0 and r.stdout.strip() == "1 3"
    r = _cli("run", "--p", "0.35", "--L", "6.0", "27.9", "--N", "4", "--thresholds", str(out), "--quiet")
    assert r.returncode == 0 and r.stderr == "" and "B*" in r.stdout  # reused; --quiet: no notes, the summary

    def one_error(r):
        return r.returncode == 2 and r.stderr.startswith("error:") and len(r.stderr.strip().splitlines()) == 1

    assert one_error(_cli("show", str(out), "--require-N", "8"))      # a table shorter than asked
    # the other refusals in-process: the same main(argv), without a process start each
    tr_autotune = functools.partial(run_inproc, "tr-autotune")
    doc = json.loads(out.read_text())
    doc["schema_version"] = 7
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    r = tr_autotune("show", str(bad))
    assert one_error(r) and "schema_version" in r.stderr
    doc["schema_version"] = 1
    doc["entries"][2]["thresholds"] = [0, 1]
    bad.write_text(json.dumps(doc))
    r = tr_autotune("show", str(bad))
    assert one_error(r) and "entries[2].thresholds[0]" in r.stderr
    assert one_error(tr_autotune("show", str(tmp_path / "missing.json")))
    assert one_error(tr_autotune("--spec", str(spec_file), "--N", "0", "--thresholds", str(out)))
    assert one_error(tr_autotune("--spec", str(tmp_path / "nope.json"), "--N", "3", "--thresholds", str(out)))
    assert one_error(tr_autotune("--spec", str(spec_file), "--N", "3", "--thresholds",
                                 str(tmp_path / "no" / "x.json")))
    assert one_error(tr_autotune("--spec", str(spec_file), "--N", "3", "--thresholds", str(out), "--background"))


def test_the_budget_is_a_limit_when_the_work_is_slow(tmp_path, monkeypatch):
    """A cold numba cache (every kernel compiles, tens of seconds) and then N = 60 (a search of minutes):
    the start returns with the rows it has while that work is still running, and the worker can be killed."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "cold-numba-cache"))   # inherited by the worker
    out = tmp_path / "th.json"
    h = inputs_sha256(SPEC, 80, solver_options())
    rows = [{"active_requests": n, "thresholds": [1, 1], "certificate": "exhaustive", "predicted_tok_s": 1.0,
             "upper_bound_tok_s": 1.0, "gap": 0.0, "eager_tok_s": 1.0, "seconds": 0.0} for n in range(1, 60)]
    autotune.write_thresholds(out, autotune.thresholds_document(SPEC, 80, rows, inputs_hash=h,
                                                                provenance={"resumable": True}))
    budget = 1.0
    t0 = time.monotonic()
    t = on_server_start(SPEC, 80, out, time_budget_s=budget, background=True)
    elapsed = time.monotonic() - t0
    proc = autotune._WORKERS.get(str(out))
    try:
        assert proc is not None and proc.poll() is None       # returned while the slow work still runs
        assert t.covered_concurrency == 59 and t.certificate(80) == "extrapolated" and t.lookup(80) == (1, 1)
        assert "time budget of 1 s" in t.provenance["stopped_reason"]
        assert elapsed < budget + 20.0, elapsed                 # generous: the compile alone takes longer
    finally:
        assert autotune.stop_worker(out)
    assert proc.poll() is not None and not (tmp_path / "th.json.lock").exists()
    assert ThresholdTable.load(out).covered_concurrency == 59  # the killed worker left a valid file


def test_cli_run_accepts_delta_auto_and_certified_search(tmp_path):
    from tr_core.grid import coarsest_delta, spec_latencies
    out = tmp_path / "th.json"
    r = _cli("run", "--p", "0.35", "--L", "6.0", "27.9", "--delta-ms", "auto", "--N", "5", "--thresholds", str(out),
             "--search", "certified", "--max-gap", "0.01", "--quiet")
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["delta_ms"] == pytest.approx(coarsest_delta(spec_latencies(SPEC, 5), 0.01), rel=1e-12)
    assert doc["provenance"]["options"]["search"] == "certified" and doc["complete"]
    for e in doc["entries"]:
        assert e["certificate"] in ("pruned-exact", "certified", "exhaustive") and 0 <= e["gap"] <= 0.01
        assert e["upper_bound_tok_s"] >= e["predicted_tok_s"]


def test_the_deadline_is_taken_on_the_given_clock(tmp_path):
    """An injected clock that jumps past the deadline: the call returns without waiting for the worker,
    whatever the real time, and (background=False) the worker is killed and leaves a resumable file."""
    ticks = iter([0.0] + [1e6] * 1000)
    out = tmp_path / "th.json"
    t = tune(SPEC, 9, out, time_budget_s=30.0, background=False, clock=lambda: next(ticks))
    assert not t.complete and t.covered_concurrency <= 1 and t.lookup(9) == t.lookup(t.covered_concurrency or 1)
    prov = json.loads(out.read_text())["provenance"]
    assert prov["stopped_reason"].startswith("time budget of 30 s reached") and prov["resumable"] is True
    assert str(out) not in autotune._WORKERS and sorted(os.listdir(tmp_path)) == ["th.json"]


@pytest.mark.slow
def test_certified_rows_use_the_all_policy_bound(tmp_path):
    """Rows cut short by a per-N budget carry the all-policy bound (solved once at N = 24, scaled), not the
    no-wait bound: it is within a few percent of B*, and it is still a bound (checked against the exact chain's
    B* found by the pruned search)."""
    from optimizer.bounds import no_wait_bound

    out = tmp_path / "th.json"
    tune(SPEC, 26, out, time_budget_per_n_s=0.02)
    doc = json.loads(out.read_text())
    rows = [e for e in doc["entries"] if e["active_requests"] >= 24 and e["certificate"] == "certified"]
    assert rows
    for e in rows:
        loose = no_wait_bound(SPEC, e["active_requests"]).value_tok_s
        assert e["upper_bound_tok_s"] < 0.9 * loose
    e = doc["entries"][25]
    best = tr_model.optimize(SPEC, 26, search="pruned", eager=False)
    assert e["predicted_tok_s"] <= best.throughput_tok_s * (1 + 1e-9) <= e["upper_bound_tok_s"] * (1 + 2e-9)
    # the bound's own excess over B* (the row's found vector may be poor under a 0.02 s budget)
    assert e["upper_bound_tok_s"] < 1.02 * best.throughput_tok_s


def test_rows_certified_under_a_per_n_budget_are_honest(tmp_path):
    """With a tiny search budget per N the rows are certified with whatever gap the bounds reached; the
    exhaustive optimum must lie between each row's throughput and its upper bound."""
    out = tmp_path / "th.json"
    t = tune(SPEC, 14, out, time_budget_per_n_s=0.02)
    doc = json.loads(out.read_text())
    assert t.complete and doc["provenance"]["options"]["time_budget_per_n_s"] == 0.02
    assert inputs_sha256(SPEC, 14, solver_options()) != doc["provenance"]["inputs_sha256"]
    for n in (1, 9, 14):
        e = doc["entries"][n - 1]
        assert e["certificate"] in ("exhaustive", "pruned-exact", "certified")
        best = tr_model.optimize(SPEC, n)                       # exhaustive, the definition of B*
        assert e["predicted_tok_s"] <= best.throughput_tok_s * (1 + 1e-9)
        assert e["upper_bound_tok_s"] >= best.throughput_tok_s * (1 - 1e-9)
        assert e["gap"] == pytest.approx((e["upper_bound_tok_s"] - e["predicted_tok_s"]) / e["upper_bound_tok_s"],
                                         abs=1e-12)
        if e["certificate"] != "certified":
            assert e["gap"] == 0 and tuple(e["thresholds"]) == best.best_B
