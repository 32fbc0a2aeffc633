"""Helpers the suites share (loaded as a sibling module: ``from . import _common``)."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import tempfile
import threading
import time


def median_s(fn, repeats: int):
    """The median wall seconds of ``repeats`` calls of ``fn()`` and the last call's result."""
    ts, out = [], None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), out


def interleaved(fns: dict, repeats: int) -> dict:
    """Median seconds of each function, run in turn ``repeats`` times (a load change hits them alike)."""
    ts = {k: [] for k in fns}
    for _ in range(max(1, repeats)):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            ts[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in ts.items()}


def run_process(argv: list, timeout_s: float):
    """Run ``argv`` to its end: ``(exit code, stdout, stderr, wall seconds, peak RSS in MB)``.  The peak is this
    child's own (``wait4``), not the high-water mark of every child so far; past ``timeout_s`` it is killed
    (exit code -9)."""
    code, out, err, seconds, usage = run_process_usage(argv, timeout_s)
    return code, out, err, seconds, usage.ru_maxrss / 1024.0


def _tree_rss_mb(root: int) -> float:
    """The summed resident memory (MB) of process ``root`` and its descendants, read from /proc (0 elsewhere)."""
    try:
        pids = [int(x) for x in os.listdir("/proc") if x.isdigit()]
    except OSError:
        return 0.0
    parent, rss = {}, {}
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/statm") as f:
                rss[pid] = int(f.read().split()[1]) * page
            parent[pid] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        for c, pp in parent.items():
            if pp == p and c not in tree:
                tree.add(c)
                frontier.append(c)
    return sum(rss.get(p, 0) for p in tree) / 2**20


def _start_session(argv: list, fo, fe, env, cwd, timeout_s: float):
    """``argv`` started in a session of its own, and a timer (not started) that kills the whole session at
    ``timeout_s``: a command's pool workers would outlive a kill of the command alone and run on beside the
    next rows."""
    proc = subprocess.Popen(argv, stdout=fo, stderr=fe, text=True, env=env, cwd=cwd, start_new_session=True)

    def kill_tree():
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc, threading.Timer(timeout_s, kill_tree)


def run_process_tree(argv: list, timeout_s: float, env: dict | None = None, interval_s: float = 0.5,
                     cwd: str | None = None):
    """:func:`run_process` with the process tree's summed resident memory sampled every ``interval_s``:
    ``(exit code, stdout, stderr, wall seconds, peak RSS of the largest process in MB, peak summed RSS of the
    process and its workers in MB)``."""
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        t0 = time.perf_counter()
        proc, timer = _start_session(argv, fo, fe, env, cwd, timeout_s)
        peak = [0.0]
        stop = threading.Event()

        def sample():
            while not stop.wait(interval_s):
                peak[0] = max(peak[0], _tree_rss_mb(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        timer.start()
        sampler.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
            stop.set()
            sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - t0
        fo.seek(0)
        fe.seek(0)
        return proc.returncode, fo.read(), fe.read(), seconds, usage.ru_maxrss / 1024.0, peak[0]


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def git(*args, cwd=ROOT, check=True) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    if check and r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout.strip()


def worktree(commit: str, prefix: str) -> str:
    """A ``git worktree`` of ``commit`` under the temporary folder (``<prefix>-<sha>``): reused when it is a
    clean checkout of that commit, else made again (a baseline for side-by-side runs)."""
    import shutil

    sha = git("rev-parse", "--verify", commit + "^{commit}")
    path = os.path.join(tempfile.gettempdir(), f"{prefix}-{sha[:10]}")
    git("worktree", "prune")   # registrations whose folders are gone
    registered = git("worktree", "list", "--porcelain").splitlines()
    is_registered = f"worktree {path}" in registered
    if os.path.isdir(path) and is_registered:
        head = git("rev-parse", "HEAD", cwd=path, check=False)
        dirty = git("status", "--porcelain", "--untracked-files=no", cwd=path, check=False)
        if head == sha and not dirty:
            return path
    if is_registered:
        git("worktree", "remove", "--force", path)
    if os.path.exists(path):
        shutil.rmtree(path)
    git("worktree", "add", "--detach", path, sha)
    return path


def run_process_usage(argv: list, timeout_s: float, env: dict | None = None, cwd: str | None = None):
    """:func:`run_process` with the child's resource usage (its waited-for workers included, as ``wait4``
    counts them): ``(exit code, stdout, stderr, wall seconds, usage)``; past ``timeout_s`` the session is
    killed (exit code -9)."""
    with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
        t0 = time.perf_counter()
        proc, timer = _start_session(argv, fo, fe, env, cwd, timeout_s)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - t0
        fo.seek(0)
        fe.seek(0)
        return proc.returncode, fo.read(), fe.read(), seconds, usage
