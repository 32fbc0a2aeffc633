"""Parallel, distributed and cached evaluations give results identical to a serial run."""

import json
import os

import pytest

import tr_model
from optimizer.cache import ResultCache
from tr_core.spec import preset

R2R = preset("r2r", [6.0, 27.9], p=0.35)


def _fingerprint(opts):
    return [(o.N, o.best_B, [(e.B, e.throughput_tok_s, e.states) for e in o.evaluations]) for o in opts]


def test_dask_local_cluster_matches_serial():
    distributed = pytest.importorskip("distributed")
    serial = tr_model.optimize_many(R2R, [2, 4, 6])
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        remote = tr_model.optimize_many(R2R, [2, 4, 6], executor=client)
    assert _fingerprint(remote) == _fingerprint(serial)


def test_cache_roundtrip(tmp_path):
    a = tr_model.evaluate(R2R, 6, (1, 3), cache=tmp_path)
    files = [f for _, _, fs in os.walk(tmp_path) for f in fs]
    assert len(files) == 1 and not a.cached
    b = tr_model.evaluate(R2R, 6, (1, 3), cache=tmp_path)
    assert b.cached and b.throughput_tok_s == a.throughput_tok_s and b.states == a.states
    # a different tolerance is a different key
    c = tr_model.evaluate(R2R, 6, (1, 3), cache=tmp_path, tol=1e-10)
    assert not c.cached


def test_cache_corrupt_entry_is_a_miss(tmp_path):
    tr_model.evaluate(R2R, 5, (1, 2), cache=tmp_path)
    path = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs][0]
    with open(path, "w") as f:
        f.write("{truncated")
    ev = tr_model.evaluate(R2R, 5, (1, 2), cache=tmp_path)
    assert not ev.cached
    assert json.load(open(path))["throughput_tok_s"] == ev.throughput_tok_s


def test_cache_concurrent_writers(tmp_path):
    """Two processes filling the same cache: every entry stays a complete JSON document."""
    serial = tr_model.optimize_many(R2R, [5], cache=None)
    a = tr_model.optimize_many(R2R, [5], workers=2, cache=str(tmp_path))
    b = tr_model.optimize_many(R2R, [5], workers=2, cache=str(tmp_path))
    assert _fingerprint(a) == _fingerprint(serial) == _fingerprint(b)
    assert all(e.cached for e in b[0].evaluations)
    cache = ResultCache(tmp_path)
    for d, _, fs in os.walk(tmp_path):
        for f in fs:
            assert not f.startswith(".tmp-")
            json.load(open(os.path.join(d, f)))
    assert cache.path == str(tmp_path)


def test_cli_workers_and_cache(run_tool, tmp_path):
    args = ["--p", "0.35", "--L", "6.0", "27.9", "--N", "3-5", "--format", "json", "--cache-dir", tmp_path]
    one = json.loads(run_tool("tr-optimize", *args, "--workers", "1").stdout)
    two = json.loads(run_tool("tr-optimize", *args[:-2], "--workers", "2", "--no-cache").stdout)  # no --cache-dir:
    # with --no-cache it would be dropped, so it is refused
    again = json.loads(run_tool("tr-optimize", *args, "--workers", "1").stdout)
    key = lambda d: [(r["N"], r["B"], r["throughput_tok_s"]) for r in d["results"]]  # noqa: E731
    assert key(one) == key(two) == key(again)
    r = run_tool("tr-optimize", "--p", "0.35", "--L", "6.0", "27.9", "--workers", "0")
    assert r.returncode == 2 and r.stderr.startswith("error: --workers")


def _blocked_signals():
    import signal
    return sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))


@pytest.mark.skipif(not hasattr(__import__("signal"), "pthread_sigmask"), reason="POSIX signal masks only")
def test_ctrl_c_inside_a_worker_spawn_is_kept_not_lost():
    """A Ctrl-C that lands while a pool worker is spawned is raised once the spawn ends (never discarded,
    as it was with SIG_IGN), and the worker itself starts with SIGINT blocked."""
    import multiprocessing as mp
    import signal
    import threading
    from tr_core.parallel import _workers_ignore_sigint
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # an xdist worker may run with it ignored
    try:
        with pytest.raises(KeyboardInterrupt):
            with _workers_ignore_sigint(True):
                # to this thread: a process-directed signal may go to another thread of an xdist worker,
                # whose Python handler still runs here, inside the window
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
                for _ in range(1000):  # the signal must not arrive inside the window
                    pass
                inside = True
        assert inside
        with _workers_ignore_sigint(True):
            with mp.get_context("spawn").Pool(1) as pool:
                child_blocked = pool.apply(_blocked_signals)
        assert int(signal.SIGINT) in child_blocked
        assert int(signal.SIGINT) not in _blocked_signals()
    finally:
        signal.signal(signal.SIGINT, old)


def test_an_interrupted_cache_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    """Ctrl-C (or SIGTERM's exception) between the entry's temporary file and its rename: the file is removed
    and the interrupt goes on."""
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    ev = tr_model.evaluate(spec, 3, (1, 2))
    cache = ResultCache(str(tmp_path / "c"))

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cache.put("k" * 64, ev)
    monkeypatch.undo()
    assert [f for _, _, fs in os.walk(tmp_path) for f in fs] == []


@pytest.mark.skipif(not hasattr(__import__("signal"), "pthread_sigmask"), reason="POSIX signal masks only")
def test_signals_deferred_holds_sigterm_to_the_end_of_the_section():
    """A signal sent to the process, in a fresh interpreter (the next test covers one that another thread
    takes)."""
    import subprocess
    import sys
    code = """
import os, signal
from tr_core.fileio import signals_deferred
seen = []
signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
with signals_deferred():
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):
        pass
    inside = list(seen)
print(inside, seen == [signal.SIGTERM])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0 and out.stdout.split() == ["[]", "True"], (out.stdout, out.stderr)


@pytest.mark.skipif(not hasattr(__import__("signal"), "pthread_kill"), reason="POSIX threads' signals only")
def test_signals_deferred_holds_a_signal_another_thread_took():
    """A process-directed signal may be taken by another thread; Python runs its handler in the main thread at
    the next switch between the threads, which a mask on the main thread alone does not hold back (a temporary
    cache entry was left behind by a SIGTERM in the command-line tests this way)."""
    import signal
    import threading
    import time

    from tr_core.fileio import signals_deferred

    go, sent = threading.Event(), threading.Event()

    def spin():
        go.wait(30)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)   # taken here, not by the main thread
        sent.set()
        end = time.monotonic() + 0.3
        while time.monotonic() < end:     # keeps asking for the interpreter lock: the threads switch
            pass

    seen: list = []
    old = signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    other = threading.Thread(target=spin)
    other.start()
    try:
        with signals_deferred():
            go.set()
            assert sent.wait(30)    # sent inside the section however slowly the threads are scheduled
            end = time.monotonic() + 0.3
            while time.monotonic() < end:
                pass
            inside = list(seen)
        assert inside == [] and seen == [signal.SIGTERM]
    finally:
        go.set()
        other.join(30)
        signal.signal(signal.SIGTERM, old)
