"""Server-start auto-tuning: compute ``B*(N)`` for N = 1..max_concurrency and keep it in a thresholds file.

A TokenRouter-style server needs ``B*(N)`` for the live number N of active
requests (global state tracking) from its first second.  :func:`on_server_start`
gives it a :class:`~tr_model.thresholds.ThresholdTable` at once:

1. **Inputs hash.**  ``inputs_sha256`` = SHA-256 of the canonical JSON of
   ``{spec without provenance, max_concurrency, tool version, file schema
   version, solver options}``.  If ``out`` (or ``cache_dir/<hash>.json``)
   already holds a complete table with the same hash, it is returned without
   any computation (a second server start costs one file read).
2. **Foreground, within ``time_budget_s``.**  Otherwise N = 1, 2, ... are
   optimized in order (``tr_model.optimize``; N = 1 always), resuming after the
   last N of a partial file with the same hash.  Before each N the cost is
   predicted from the previous ones (``t(N) * max(2, t(N) / t(N-1))``, the
   chain grows quickly with N) and the loop stops when the prediction would
   overrun the budget.  The table computed so far is written atomically
   (temp file in the same folder, fsync, rename) with ``complete: false``.
3. **Background.**  With ``background=True`` the rest is computed by a
   separate process (``python -m tr_model.autotune_cli run ... --worker-lock``,
   new session) that resumes from the partial file and replaces it atomically
   as it progresses and when done.  A lock file ``<out>.lock`` holding the
   worker's token, pid and inputs hash keeps a second server start from
   launching a duplicate worker; a start for other inputs replaces the token,
   and the old worker stops (without writing) at its next ownership check.
4. **Failure.**  A computation failure never raises into the server: one line
   is logged (logger ``tr_model.autotune``) and the eager fallback (all
   thresholds 1, ``ThresholdTable.eager``) is returned.  If only the write
   fails (unwritable folder) the old file is left intact, one line is logged
   and the freshly computed table is returned from memory.

If the chain for some N exceeds ``max_states`` (``StateSpaceTooLarge``) the
table stops at N - 1 with ``complete: false`` and ``provenance.resumable:
false``; runtimes then use ``B*(N - 1)`` for larger N (``lookup`` clamps).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
import subprocess
import sys
import time
from typing import Any, Callable, Mapping

from tr_core.errors import SpecError, StateSpaceTooLarge
from tr_core.spec import SystemSpec, spec_to_dict
from tr_model.thresholds import (THRESHOLDS_FORMAT, THRESHOLDS_SCHEMA_VERSION, ThresholdFileError, ThresholdTable,
                                 canonical_sha256, spec_sha256)

TOOL = "tr-autotune"
log = logging.getLogger("tr_model.autotune")

__all__ = ["on_server_start", "tune", "inputs_sha256", "thresholds_document", "write_thresholds", "solver_options"]


def _tool_version() -> str:
    import tr_model
    return str(tr_model.__version__)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def solver_options(solver: str = "auto", tol: float | None = None, max_states: int | None = None,
                   round_to_grid: bool = False) -> dict:
    """The options passed to ``tr_model.optimize`` (part of the inputs hash)."""
    return {"solver": solver, "tol": tol, "max_states": max_states, "round_to_grid": bool(round_to_grid)}


def inputs_sha256(spec: SystemSpec, max_concurrency: int, options: Mapping[str, Any] | None = None) -> str:
    """Hash of everything that determines the table (see the module docstring)."""
    doc = {k: v for k, v in spec_to_dict(spec).items() if k != "provenance"}
    return canonical_sha256({"spec": doc, "max_concurrency": int(max_concurrency), "tool": TOOL,
                             "tool_version": _tool_version(), "schema_version": THRESHOLDS_SCHEMA_VERSION,
                             "options": dict(options or solver_options())})


def thresholds_document(spec: SystemSpec, max_concurrency: int, entries: list, *, inputs_hash: str,
                        provenance: Mapping[str, Any] | None = None) -> dict:
    """The thresholds file's JSON document (``complete`` follows from the entries)."""
    sdoc = spec_to_dict(spec)
    prov = {"tool": TOOL, "tool_version": _tool_version(), "inputs_sha256": inputs_hash}
    prov.update(provenance or {})
    residuals = [e["residual"] for e in entries if e.get("residual") is not None]
    solvers = sorted({e["solver"] for e in entries if e.get("solver")})
    prov["max_residual"] = max(residuals) if residuals else None
    prov["solver"] = ",".join(solvers) if solvers else None
    prov["compute_seconds"] = float(sum(e.get("seconds", 0.0) for e in entries))
    return {
        "schema_version": THRESHOLDS_SCHEMA_VERSION,
        "format": THRESHOLDS_FORMAT,
        "num_models": spec.M,
        "model_names": list(spec.model_names) if spec.model_names else None,
        "delta_ms": spec.delta_ms,
        "spec": sdoc,
        "spec_sha256": spec_sha256(sdoc),
        "max_concurrency": int(max_concurrency),
        "complete": len(entries) == max_concurrency,
        "fallback_thresholds": [1] * spec.M,
        "entries": entries,
        "provenance": prov,
    }


def write_thresholds(path: str | os.PathLike, doc: Mapping[str, Any]) -> None:
    """Write atomically (temp file in the same folder, fsync, rename); the old file survives any failure."""
    from tr_core.fileio import atomic_write

    def dump(f):
        json.dump(doc, f, indent=1, allow_nan=False)
        f.write("\n")

    atomic_write(path, dump)


def _entry(opt: Any) -> dict:
    def num(x):
        return None if x is None or not math.isfinite(float(x)) else float(x)
    return {"active_requests": int(opt.N), "thresholds": [int(b) for b in opt.best_B],
            "predicted_tok_s": float(opt.throughput_tok_s), "eager_tok_s": float(opt.eager_throughput_tok_s),
            "gain_vs_eager": num(opt.gain_vs_eager), "states": int(opt.states), "residual": num(opt.residual),
            "solver": str(opt.solver), "evaluated": int(opt.evaluated), "seconds": float(opt.seconds)}


def _load_matching(path: str, inputs_hash: str) -> dict | None:
    """The document at ``path`` if it is a valid table for exactly these inputs, else None."""
    try:
        table = ThresholdTable.load(path)
    except ThresholdFileError:
        return None
    if table.inputs_sha256 != inputs_hash:
        return None
    with open(path, "r", encoding="utf-8") as f:
        return json.load(f)


def _lock_path(out: str) -> str:
    return out + ".lock"


def _read_lock(lock: str) -> dict | None:
    """The lock's content if a worker may still hold it (its pid is alive, or not yet recorded), else None."""
    try:
        with open(lock, "r", encoding="utf-8") as f:
            d = json.load(f)
        token = str(d["token"])
        pid = d.get("pid")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if pid is None:  # written just before the worker was started; stale if that start never completed
        try:
            fresh = time.time() - os.stat(lock).st_mtime < 60.0
        except OSError:
            return None
        return d if token and fresh else None
    try:
        os.kill(int(pid), 0)  # signal 0: existence check only, nothing is delivered
    except ProcessLookupError:
        return None
    except (PermissionError, ValueError, OverflowError):
        pass
    try:  # a finished child of this very process is a zombie until reaped: reap it, it is gone
        if os.waitpid(int(pid), os.WNOHANG)[0] == int(pid):
            return None
    except (ChildProcessError, ValueError, OverflowError):
        pass
    return d


def _owns_lock(lock: str | None, token: str | None) -> bool:
    """Whether the lock still names this worker (a newer start for other inputs replaces the token)."""
    if lock is None:
        return True
    try:
        with open(lock, "r", encoding="utf-8") as f:
            return json.load(f).get("token") == token
    except (OSError, ValueError, AttributeError):
        return False


def _revoke_other_worker(out: str, inputs_hash: str) -> None:
    """Make a background worker that is filling ``out`` for other inputs stop before it writes again."""
    lock = _lock_path(out)
    cur = _read_lock(lock)
    if cur is not None and cur.get("inputs_sha256") != inputs_hash:
        try:
            os.unlink(lock)  # the worker checks its token in the lock before every write
        except OSError:
            pass


def tune(spec: SystemSpec, max_concurrency: int, out: str | os.PathLike, *, time_budget_s: float | None = None,
         cache_dir: str | os.PathLike | None = None, background: bool = False, solver: str = "auto",
         tol: float | None = None, max_states: int | None = None, round_to_grid: bool = False,
         worker_lock: str | None = None, worker_token: str | None = None,
         progress: Callable[[dict], None] | None = None,
         write_interval_s: float = 1.0, keep_on_write_error: bool = False) -> ThresholdTable:
    """Make ``out`` hold the table for these inputs (reuse, resume or compute); raises on errors.

    This is the strict form used by the CLI; servers call :func:`on_server_start`.
    ``keep_on_write_error``: when ``out`` cannot be written, log one line and
    return the computed table from memory instead of raising (the old file,
    if any, is left intact).
    """
    if not isinstance(spec, SystemSpec):
        raise SpecError("spec must be a SystemSpec (build it with tr_model.make_spec or tr_model.load_spec)")
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise SpecError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
    if time_budget_s is not None and (not math.isfinite(time_budget_s) or time_budget_s < 0):
        raise SpecError(f"time_budget_s must be >= 0 seconds, got {time_budget_s!r}")
    out = os.fspath(out)
    opts = solver_options(solver, tol, max_states, round_to_grid)
    h = inputs_sha256(spec, max_concurrency, opts)
    cache_file = os.path.join(os.fspath(cache_dir), h + ".json") if cache_dir is not None else None
    if worker_lock is None:
        _revoke_other_worker(out, h)

    doc = _load_matching(out, h)
    if doc is None and cache_file is not None:
        doc = _load_matching(cache_file, h)
        if doc is not None:
            try:
                write_thresholds(out, doc)
            except SpecError as e:
                if not keep_on_write_error:
                    raise
                log.warning("tr-autotune: %s; serving the cached table %s from memory", e, cache_file)
                return ThresholdTable.from_dict(doc, where=f"thresholds file {cache_file!r}", path=cache_file)
    if doc is not None and (doc["complete"] or not doc["provenance"].get("resumable", True)):
        return ThresholdTable.from_dict(doc, where=f"thresholds file {out!r}", path=out)
    if doc is not None and background and worker_lock is None:
        cur = _read_lock(_lock_path(out))
        if cur is not None and cur.get("inputs_sha256") == h:
            # a worker is already completing this very table: serve what it has written so far
            return ThresholdTable.from_dict(doc, where=f"thresholds file {out!r}", path=out)

    entries = list(doc["entries"]) if doc else []
    created = doc["provenance"].get("created_utc", _now()) if doc else _now()
    t0 = time.perf_counter()
    stopped: str | None = None
    resumable = True
    last_write = time.perf_counter()
    import tr_model  # the chain API; imported here because it pulls in numba

    def snapshot() -> dict:
        return thresholds_document(spec, max_concurrency, entries, inputs_hash=h, provenance={
            "created_utc": created, "updated_utc": _now(), "stopped_reason": stopped, "resumable": resumable,
            "options": opts})

    while len(entries) < max_concurrency:
        n = len(entries) + 1
        if time_budget_s is not None and entries:
            secs = [e["seconds"] for e in entries[-2:]]
            growth = max(2.0, secs[-1] / secs[0]) if len(secs) == 2 and secs[0] > 0 else 2.0
            if time.perf_counter() - t0 + secs[-1] * growth > time_budget_s:
                stopped = f"time budget of {time_budget_s:g} s reached before N = {n}"
                break
        try:
            opt = tr_model.optimize(spec, n, **opts)
        except StateSpaceTooLarge as e:
            stopped, resumable = f"N = {n}: {e}", False
            if not entries:
                raise
            break
        entries.append(_entry(opt))
        if progress is not None:
            progress(entries[-1])
        if worker_lock is not None and time.perf_counter() - last_write >= write_interval_s \
                and len(entries) < max_concurrency:
            if not _owns_lock(worker_lock, worker_token):
                raise SpecError(f"worker lock {worker_lock!r} was taken over; stopping")
            write_thresholds(out, snapshot())
            last_write = time.perf_counter()
    doc = snapshot()
    if worker_lock is not None and not _owns_lock(worker_lock, worker_token):
        raise SpecError(f"worker lock {worker_lock!r} was taken over; stopping")
    try:
        write_thresholds(out, doc)
    except SpecError as e:
        if not keep_on_write_error:
            raise
        log.warning("tr-autotune: %s; serving the computed table from memory", e)
        return ThresholdTable.from_dict(doc, where="thresholds (in memory)")
    if doc["complete"] and cache_file is not None:
        os.makedirs(os.path.dirname(cache_file), exist_ok=True)
        write_thresholds(cache_file, doc)
    table = ThresholdTable.from_dict(doc, where=f"thresholds file {out!r}", path=out)
    if background and not doc["complete"] and resumable:
        try:
            spawn_worker(spec, max_concurrency, out, h, cache_dir=cache_dir, options=opts)
        except (OSError, SpecError) as e:
            if not keep_on_write_error:
                raise
            log.warning("tr-autotune: cannot start the background worker (%s); the table stays partial", e)
    return table


def spawn_worker(spec: SystemSpec, max_concurrency: int, out: str, inputs_hash: str, *,
                 cache_dir: str | os.PathLike | None = None, options: Mapping[str, Any] | None = None) -> int | None:
    """Start (unless one already runs for these inputs) a separate process that completes ``out``.

    Returns the worker's pid, or None when a live worker for the same inputs exists.
    """
    lock = _lock_path(out)
    cur = _read_lock(lock)
    if cur is not None and cur.get("inputs_sha256") == inputs_hash:
        return None
    # A live worker for other inputs is not signalled: replacing the lock's token below makes it stop
    # (without writing) at its next ownership check.
    token = os.urandom(16).hex()
    write_thresholds(lock, {"token": token, "inputs_sha256": inputs_hash, "started_utc": _now()})
    opts = dict(options or solver_options())
    spec_file = out + ".worker-spec.json"
    write_thresholds(spec_file, spec_to_dict(spec))
    cmd = [sys.executable, "-m", "tr_model.autotune_cli", "run", "--spec", spec_file,
           "--max-concurrency", str(max_concurrency), "--out", out, "--solver", str(opts["solver"]),
           "--worker-lock", lock, "--worker-token", token, "--quiet"]
    if opts.get("tol") is not None:
        cmd += ["--tol", repr(opts["tol"])]
    if opts.get("max_states") is not None:
        cmd += ["--max-states", str(opts["max_states"])]
    if opts.get("round_to_grid"):
        cmd += ["--round"]
    if cache_dir is not None:
        cmd += ["--cache-dir", os.fspath(cache_dir)]
    logf = open(out + ".worker.log", "ab")
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                                close_fds=True)
    finally:
        logf.close()
    if _owns_lock(lock, token):
        write_thresholds(lock, {"token": token, "pid": proc.pid, "inputs_sha256": inputs_hash,
                                "started_utc": _now()})
    return proc.pid


def on_server_start(spec: SystemSpec, max_concurrency: int, out: str | os.PathLike, time_budget_s: float = 5.0,
                    cache_dir: str | os.PathLike | None = None, background: bool = True, *,
                    solver: str = "auto", tol: float | None = None, max_states: int | None = None,
                    round_to_grid: bool = False) -> ThresholdTable:
    """The thresholds a server should use now; never raises for a computation or write failure.

    Returns the cached table at once when the inputs hash matches; otherwise
    computes N = 1, 2, ... within ``time_budget_s`` seconds, writes the partial
    table atomically and (``background=True``) completes it in a separate
    process.  On failure: one log line and :meth:`ThresholdTable.eager`.
    """
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise SpecError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
    M = spec.M if isinstance(spec, SystemSpec) else 2
    try:
        return tune(spec, max_concurrency, out, time_budget_s=time_budget_s, cache_dir=cache_dir,
                    background=background, solver=solver, tol=tol, max_states=max_states,
                    round_to_grid=round_to_grid, keep_on_write_error=True)
    except Exception as e:  # noqa: BLE001 - a server must start whatever happened
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        log.warning("tr-autotune: %s; using the eager fallback (all thresholds 1)", msg)
    return ThresholdTable.eager(M, max_concurrency)
