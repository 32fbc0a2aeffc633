"""Server-start auto-tuning: compute ``B*(N)`` for N = 1..max_concurrency and keep it in a thresholds file.

A TokenRouter-style server needs ``B*(N)`` for the live number N of active
requests (global state tracking) from its first second.  :func:`on_server_start`
gives it a :class:`~tr_model.thresholds.ThresholdTable` within its time
budget, always:

1. **Inputs hash.**  ``inputs_sha256`` = SHA-256 of the canonical JSON of
   ``{spec without provenance, max_concurrency, tool version, file schema
   version, solver and search options}``.  If ``out`` (or
   ``cache_dir/<hash>.json``) already holds a complete table with the same
   hash, it is returned without any computation (one file read).  A file that
   exists but cannot be read is logged as corrupted before it is replaced.
2. **The budget is a limit.**  Otherwise the computation runs in a separate
   worker process (``python -m tr_model.tuning.autotune --worker JOB``, its own
   session), never in the server's process: the foreground first writes
   ``out`` with the rows it already has (a partial file with the same hash is
   resumed) and *extrapolated* rows for the rest, starts the worker and waits
   at most until ``start + time_budget_s``.  The worker optimizes N = 1, 2, ...
   in order and replaces ``out`` atomically (temp file, fsync, rename) at most
   every ``0.2`` s, so at the deadline the foreground returns every row the
   worker has written.  A cold numba cache or one expensive N therefore costs
   the server nothing but the budget.
3. **Background.**  With ``background=True`` the worker keeps running after
   the deadline and completes ``out``; a server follows it with
   :class:`~tr_model.thresholds.WatchedThresholds` (the returned table is a
   snapshot).  :func:`stop_worker` kills it.  With ``background=False`` the
   worker is killed at the deadline and the partial file says why.  A lock
   file ``<out>.lock`` holding the worker's token, pid and inputs hash keeps a
   second server start from launching a duplicate worker; a start for other
   inputs replaces the token, and the old worker stops (without writing) at
   its next ownership check.
4. **Rows say how they were obtained.**  Each N is optimized by
   ``optimizer.search.optimize_thresholds`` with ``search`` (default
   ``"auto"``: exact, with proven pruning, where it fits; certified with a
   relative gap of at most ``max_gap`` above); the row's ``certificate`` is
   ``exhaustive``, ``pruned-exact``, ``certified`` (with ``upper_bound_tok_s``
   and ``gap``) or ``local``.  Rows not computed (budget spent, a chain over
   ``max_states``, a failed N) are written as ``extrapolated`` from the
   largest computed N (all ones when none is computed yet).
5. **Failure.**  Nothing raises into the server.  A failing N keeps the rows
   already computed (the table stops there, ``resumable: false``, one log
   line); an unwritable ``out`` folder makes the worker compute into a
   private temporary folder and the computed table is returned from memory
   (``source == "memory"``); an unwritable ``cache_dir`` only skips the cache
   copy; anything unexpected logs one line and returns the eager fallback.

Without a budget (``time_budget_s=None``, the CLI's default) the table is
computed in the calling process.
"""

from __future__ import annotations

import datetime as _dt
import glob
import inspect
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Mapping

from tr_core.cli import is_interrupt
from tr_core import search_rule as S_RULE
from tr_core.search_options import FieldError, FieldLimit, SearchOptions, check_fields
from tr_core.errors import SolverFailed, SpecError, StateSpaceTooLarge, TRError
from tr_core.spec import SystemSpec, spec_from_dict, spec_to_dict
from tr_model.thresholds import (POLICY_SCHEMA_VERSION, THRESHOLDS_FORMAT, THRESHOLDS_SCHEMA_VERSION,
                                 ThresholdFileError, ThresholdTable, canonical_sha256, spec_sha256)

TOOL = "tr-autotune"
SEARCHES = S_RULE.SEARCHES
DEFAULT_MAX_GAP = S_RULE.DEFAULT_MAX_GAP  # certified rows: the relative gap at which a search stops
WORKER_WRITE_INTERVAL_S = 0.2
log = logging.getLogger("tr_model.tuning.autotune")

__all__ = ["on_server_start", "tune", "inputs_sha256", "thresholds_document", "write_thresholds", "write_sweep",
           "solver_options",
           "stop_worker", "spawn_worker"]

_WORKERS: dict[str, subprocess.Popen] = {}  # out path -> the worker this process started for it


def _tool_version() -> str:
    from tr_core.version import __version__
    return str(__version__)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _first_line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def solver_options(solver: str = "auto", tol: float | None = None, max_states: int | None = None,
                   round_to_grid: bool = False, search: str = "auto", max_gap: float = S_RULE.DEFAULT_MAX_GAP,
                   max_evaluations: int | None = None, time_budget_per_n_s: float | None = None,
                   policy: str | None = None, policy_max_n: int | None = None) -> dict:
    """The options of the per-N optimization (part of the inputs hash).

    ``policy``: also search this compact launch-policy class (``busy``, ``residual``) at every
    N <= ``policy_max_n`` (default: every N) and write a schema-version-3 file (:mod:`tr_model.tuning.launch_policy`).

    ``time_budget_per_n_s``: stop each N's certified search after this many
    seconds; the row is then certified with whatever gap its bounds reached
    (possibly above ``max_gap``), so the worker keeps moving through N.
    """
    # each value on its own (the rule between search and max_gap is SearchOptions'; the hash records the gap)
    check_fields(search=search, max_gap=max_gap, solver=solver, tol=tol, max_states=max_states,
                 max_evaluations=max_evaluations)
    if time_budget_per_n_s is not None and (isinstance(time_budget_per_n_s, bool)
                                            or not isinstance(time_budget_per_n_s, (int, float))
                                            or not math.isfinite(time_budget_per_n_s) or time_budget_per_n_s <= 0):
        raise SpecError(f"time_budget_per_n_s must be > 0 seconds, got {time_budget_per_n_s!r}")
    opts = {"solver": solver, "tol": tol, "max_states": max_states, "round_to_grid": bool(round_to_grid),
            "search": search, "max_gap": float(max_gap), "max_evaluations": max_evaluations}
    if time_budget_per_n_s is not None:  # absent when unset: the hash of earlier tables stays valid
        opts["time_budget_per_n_s"] = float(time_budget_per_n_s)
    if policy is not None:  # likewise
        from tr_model.tuning.launch_policy import check_policy_class
        opts["policy"] = check_policy_class(policy)
        if policy_max_n is not None:
            if isinstance(policy_max_n, bool) or not isinstance(policy_max_n, int) or policy_max_n < 1:
                raise SpecError(f"policy_max_n must be an integer >= 1, got {policy_max_n!r}")
            opts["policy_max_n"] = int(policy_max_n)
    elif policy_max_n is not None:
        raise SpecError("policy_max_n applies with a policy class (policy = 'busy', 'residual', 'window' or 'ratio')")
    return opts


def inputs_sha256(spec: SystemSpec, max_concurrency: int, options: Mapping[str, Any] | None = None) -> str:
    """Hash of everything that determines the table (see the module docstring)."""
    doc = {k: v for k, v in spec_to_dict(spec).items() if k != "provenance"}
    opts = dict(options or solver_options())
    return canonical_sha256({"spec": doc, "max_concurrency": int(max_concurrency), "tool": TOOL,
                             "tool_version": _tool_version(),
                             "schema_version": POLICY_SCHEMA_VERSION if opts.get("policy") else
                             THRESHOLDS_SCHEMA_VERSION, "options": opts})


def _computed(entries: list) -> list:
    """The computed prefix of a document's rows (extrapolated rows are a suffix)."""
    out = []
    for e in entries:
        if e.get("certificate") == "extrapolated":
            break
        out.append(e)
    return out


def _extrapolated(computed: list, max_concurrency: int, M: int, policy: str | None = None) -> list:
    """Rows N = K+1..max_concurrency copying B*(K), K the largest computed N (all ones when none is); with a
    policy class, their policy is that vector."""
    if computed:
        k, b = computed[-1]["active_requests"], list(computed[-1]["thresholds"])
    else:
        k, b = None, [1] * M
    extra = {}
    if policy is not None:
        from tr_model.tuning.launch_policy import threshold_row_fields
        extra = threshold_row_fields(policy, b)
    return [{"active_requests": n, "thresholds": list(b), "certificate": "extrapolated", "extrapolated_from": k,
             **extra} for n in range(len(computed) + 1, max_concurrency + 1)]


def thresholds_document(spec: SystemSpec, max_concurrency: int, entries: list, *, inputs_hash: str,
                        provenance: Mapping[str, Any] | None = None, policy: str | None = None,
                        round_to_grid: bool = False) -> dict:
    """The thresholds file's JSON document: the computed rows, then extrapolated rows up to max_concurrency.

    ``policy``: a compact launch-policy class; the document is then schema version 3 with the top-level
    ``policy`` object, and every computed row must carry its policy fields (:mod:`tr_model.tuning.launch_policy`)."""
    computed = _computed(entries)
    sdoc = spec_to_dict(spec)
    prov = {"tool": TOOL, "tool_version": _tool_version(), "inputs_sha256": inputs_hash}
    prov.update(provenance or {})
    residuals = [e["residual"] for e in computed if e.get("residual") is not None]
    solvers = sorted({e["solver"] for e in computed if e.get("solver")})
    gaps = [e["gap"] for e in computed if e.get("gap") is not None]
    prov["max_residual"] = max(residuals) if residuals else None
    prov["solver"] = ",".join(solvers) if solvers else None
    prov["max_gap"] = max(gaps) if gaps else None
    prov["certificates"] = {c: sum(1 for e in computed if e.get("certificate") == c)
                            for c in sorted({e.get("certificate") for e in computed if e.get("certificate")})}
    prov["compute_seconds"] = float(sum(e.get("seconds", 0.0) for e in computed))
    doc = {
        "schema_version": THRESHOLDS_SCHEMA_VERSION if policy is None else POLICY_SCHEMA_VERSION,
        "format": THRESHOLDS_FORMAT,
        "num_models": spec.M,
        "model_names": list(spec.model_names) if spec.model_names else None,
        "delta_ms": spec.delta_ms,
        "spec": sdoc,
        "spec_sha256": spec_sha256(sdoc),
        "max_concurrency": int(max_concurrency),
        "complete": len(computed) == max_concurrency,
        "fallback_thresholds": [1] * spec.M,
        "entries": computed + _extrapolated(computed, max_concurrency, spec.M, policy),
        "provenance": prov,
    }
    if policy is not None:
        from tr_model.tuning.launch_policy import policy_header
        doc["policy"] = policy_header(spec, policy, max_concurrency, round_to_grid=round_to_grid)
        searched = [e for e in computed if e.get("policy_certificate") == "local"]
        prov["policy"] = {"class": policy, "searched_rows": len(searched),
                          "search": "steepest ascent over the class from B*(N) (exact values, not proven "
                                    "optimal within the class)",
                          "max_gain": max((e["policy_predicted_tok_s"] / e["predicted_tok_s"] - 1.0
                                           for e in searched if e.get("predicted_tok_s")), default=None)}
    return doc


def _write_json(path: str | os.PathLike, doc: Mapping[str, Any]) -> None:
    """Write a JSON document atomically (temp file in the same folder, fsync, rename)."""
    from tr_core.fileio import atomic_write

    def dump(f):
        json.dump(doc, f, indent=1, allow_nan=False)
        f.write("\n")

    atomic_write(path, dump)


def write_thresholds(path: str | os.PathLike, doc: Mapping[str, Any]) -> ThresholdTable:
    """The one writer of thresholds files: the document is first validated by the reader (a file the reader
    would refuse is never written: ThresholdFileError), then written atomically (temp file in the same folder,
    fsync, rename; the old file survives any failure).  Returns the validated table."""
    table = ThresholdTable.from_dict(doc, where=f"the thresholds document for {os.fspath(path)!r}",
                                     path=os.fspath(path))
    _write_json(path, doc)
    return table


def write_sweep(path: str | os.PathLike, spec: SystemSpec, optima: list, options: Mapping[str, Any], *,
                policy_rows: list | None = None, tool: str = TOOL) -> ThresholdTable:
    """A thresholds file from the results of a finished sweep N = 1..K (``tr-optimize --thresholds``).

    ``optima``: one ``Optimum`` per N = 1..K in order; ``options``: :func:`solver_options` (the inputs hash);
    ``policy_rows``: per N, the compact policy searched from B*(N) (``thresholds``, ``throughput_tok_s``,
    ``seconds``) when ``options`` name a policy class.  Written by :func:`write_thresholds`."""
    K = len(optima)
    entries = []
    for i, o in enumerate(optima):
        e = _entry(o, options["search"])
        if options.get("policy"):
            p = policy_rows[i]
            e.update(policy_thresholds=p["thresholds"], policy_certificate="local",
                     policy_predicted_tok_s=p["throughput_tok_s"], policy_seconds=p["seconds"])
        entries.append(e)
    doc = thresholds_document(spec, K, entries, inputs_hash=inputs_sha256(spec, K, options),
                              provenance={"created_utc": _now(), "options": dict(options), "tool": tool},
                              **_doc_policy(options))
    return write_thresholds(path, doc)


def _num(x):
    try:
        return None if x is None or not math.isfinite(float(x)) else float(x)
    except (TypeError, ValueError, OverflowError):
        return None


def _entry(opt: Any, search: str) -> dict:
    """One computed row from an ``Optimum`` with the certificate the search gave it.

    ``gap = (upper_bound - predicted) / upper_bound`` as in ``optimizer.bounds.gap``; exact rows have 0.
    """
    thr = float(opt.throughput_tok_s)
    cert = getattr(opt, "certificate", None) or ("local" if search == "local" else "exhaustive")
    upper = _num(getattr(opt, "upper_bound_tok_s", None))
    if cert in ("exhaustive", "pruned-exact"):
        upper, gap = thr, 0.0
    elif upper is None:
        if cert == "certified":
            raise SpecError(f"N = {opt.N}: the search certified a row without an upper bound")
        gap = None
    else:
        upper = max(upper, thr)
        gap = (upper - thr) / upper if upper > 0 else 0.0
    row = {"active_requests": int(opt.N), "thresholds": [int(b) for b in opt.best_B], "certificate": cert,
           "predicted_tok_s": thr, "upper_bound_tok_s": upper, "gap": gap}
    eager = _num(opt.eager_throughput_tok_s)
    if eager is not None:  # the pruned searches may skip the eager chain (the largest one)
        row["eager_tok_s"] = eager
    row.update({"gain_vs_eager": _num(opt.gain_vs_eager), "states": int(opt.states), "residual": _num(opt.residual),
                "solver": str(opt.solver), "evaluated": int(opt.evaluated),
                "pruned": int(getattr(opt, "pruned", 0) or 0), "seconds": float(opt.seconds)})
    return row


# all-policy bound (optimizer.bounds.PolicyBounds) solved once per table at this concurrency and scaled to
# the certified rows: their gap is then 1.3-1.7 % on R2R instead of the no-wait bound's 20-30 % when a
# row's box pass does not finish (experiments/LOG.md "search"); about 12 s for two models
POLICY_BOUND_N = {2: 24, 3: 6}


def _may_certify(spec: SystemSpec, n: int, opts: Mapping[str, Any]) -> bool:
    """Whether the row at ``n`` may come out certified (its search is not exact for sure)."""
    from tr_core import feasibility as F

    mode = opts["search"]
    if mode in ("certified", "local"):
        return True
    if mode != "auto":
        return False
    return S_RULE.resolve_auto(spec.M, F.count_feasible(n, spec.M), time_budget_s=opts.get("time_budget_per_n_s")) \
        == "certified"


def _policy_bounds(spec: SystemSpec, max_concurrency: int, opts: Mapping[str, Any]):
    """The all-policy bound table for the certified rows (None when it cannot be solved in its caps);
    it bounds the rows from its own concurrency up (scaled per request)."""
    from optimizer.bounds import PolicyBounds

    n0 = min(int(max_concurrency), POLICY_BOUND_N.get(spec.M, 4))
    pol = PolicyBounds(spec, round_to_grid=bool(opts.get("round_to_grid"))).compute([n0], max_states=400_000)
    return pol if pol.values else None


def _optimize(spec: SystemSpec, n: int, opts: Mapping[str, Any], start=None, policies=None):
    """B* at one N with the configured search (the certified search when the optimizer has it)."""
    from optimizer import search as S
    kw = {k: opts[k] for k in ("solver", "tol", "max_states", "round_to_grid")}
    params = inspect.signature(S.optimize_thresholds).parameters
    if "search" in params:
        kw["search"] = opts["search"]
        if policies is not None and "policies" in params:
            kw["policies"] = policies
        for key in ("max_gap", "max_evaluations"):
            if key in params and opts.get(key) is not None:
                kw[key] = opts[key]
        if "time_budget_s" in params and opts.get("time_budget_per_n_s") is not None:
            kw["time_budget_s"] = opts["time_budget_per_n_s"]
        if "start" in params and start is not None:
            kw["start"] = tuple(start)  # B*(N-1): orders the work only
        return S.optimize_thresholds(spec, n, **kw)
    if opts["search"] == "local":
        return S.optimize_local(spec, n, start=start, **kw)
    return S.optimize_thresholds(spec, n, **kw)


def _doc_policy(opts: Mapping[str, Any]) -> dict:
    """thresholds_document's policy keywords for these options."""
    if not opts.get("policy"):
        return {}
    return {"policy": opts["policy"], "round_to_grid": bool(opts.get("round_to_grid"))}


def _policy_fields(spec: SystemSpec, n: int, B, opts: Mapping[str, Any]) -> dict:
    """A row's policy fields: the class searched from B*(n) up to policy_max_n, the plain B*(n) above."""
    from tr_model.tuning.launch_policy import class_policy, threshold_row_fields
    top = opts.get("policy_max_n")
    if top is not None and n > top:
        return threshold_row_fields(opts["policy"], B)
    from optimizer.policy import PolicyTooLarge
    try:
        res = class_policy(spec, n, opts["policy"], B, round_to_grid=bool(opts.get("round_to_grid")))
    except PolicyTooLarge as e:  # the row keeps B*(n) as its policy, and says it was not searched
        log.warning("tr-autotune: N = %d: %s; the row's policy is B*(N)", n, _first_line(e))
        return threshold_row_fields(opts["policy"], B)
    return {**res.row_fields(), "policy_seconds": res.seconds}


def _load_matching(path: str, inputs_hash: str) -> dict | None:
    """The document at ``path`` if it is a valid table for exactly these inputs, else None.

    A file that exists but cannot be read or validated is logged as corrupted (it will be replaced).
    """
    if not os.path.lexists(path):
        return None
    try:
        # one read: validated and returned are the same document, even when another process replaces the file
        table, doc = ThresholdTable.load_with_document(path)
        if table.inputs_sha256 != inputs_hash:
            return None
        return doc
    except (ThresholdFileError, OSError, ValueError) as e:
        log.warning("tr-autotune: %s is corrupted and will be replaced (%s)", path, _first_line(e))
        return None


def _lock_path(out: str) -> str:
    return out + ".lock"


def _read_lock(lock: str) -> dict | None:
    """The lock's content if a worker may still hold it (its pid is alive, or not yet recorded), else None."""
    try:
        with open(lock, "r", encoding="utf-8") as f:
            d = json.load(f)
        token = str(d["token"])
        pid = d.get("pid")
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
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
    except (PermissionError, ValueError, OverflowError, TypeError):
        pass
    try:  # a finished child of this very process is a zombie until reaped: reap it, it is gone
        if os.waitpid(int(pid), os.WNOHANG)[0] == int(pid):
            return None
    except (ChildProcessError, ValueError, OverflowError, TypeError):
        pass
    return d


def _owns_lock(lock: str | None, token: str | None) -> bool:
    """Whether the lock still names this worker (a newer start for other inputs replaces the token)."""
    if lock is None:
        return True
    try:
        with open(lock, "r", encoding="utf-8") as f:
            return json.load(f).get("token") == token
    except (OSError, ValueError, AttributeError, RecursionError):
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
        stop_worker(out)


def stop_worker(out: str | os.PathLike) -> bool:
    """Kill the background worker this process started for ``out`` (True if one was running).

    Only a worker started by this very process is signalled (its process
    group, through the ``Popen`` it holds: no pid read from a file).  Its last
    atomic write stays; the lock and job file are removed.
    """
    out = os.fspath(out)
    proc = _WORKERS.pop(out, None)
    if proc is None or proc.poll() is not None:
        return False
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    _remove_worker_files(out)
    return True


def _remove_worker_files(out: str, *, log_file: bool = False) -> None:
    leftovers = [_lock_path(out), out + ".worker-job.json"]
    if log_file:
        leftovers.append(out + ".worker.log")
    # temp files of an atomic write the killed worker did not finish
    leftovers += glob.glob(os.path.join(glob.escape(os.path.dirname(os.path.abspath(out))),
                                        "." + glob.escape(os.path.basename(out)) + ".*.tmp"))
    for p in leftovers:
        try:
            os.unlink(p)
        except OSError:
            pass


def tune(spec: SystemSpec, max_concurrency: int, out: str | os.PathLike, *, time_budget_s: float | None = None,
         cache_dir: str | os.PathLike | None = None, background: bool = False, solver: str = "auto",
         tol: float | None = None, max_states: int | None = None, round_to_grid: bool = False,
         search: str = "auto", max_gap: float | None = None, max_evaluations: int | None = None,
         time_budget_per_n_s: float | None = None, max_hours: float | None = None,
         policy: str | None = None, policy_max_n: int | None = None,
         worker_lock: str | None = None, worker_token: str | None = None,
         progress: Callable[[dict], None] | None = None,
         write_interval_s: float = 1.0, keep_on_write_error: bool = False,
         clock: Callable[[], float] = time.monotonic, document: dict | None = None) -> ThresholdTable:
    """Make ``out`` hold the table for these inputs (reuse, resume or compute); raises on errors.

    This is the strict form used by the CLI; servers call :func:`on_server_start`.
    With ``time_budget_s`` the computation runs in a worker process and this
    call returns by ``clock() + time_budget_s`` (see the module docstring);
    without it, it runs here until done.  ``keep_on_write_error``: when
    ``out`` cannot be written, log one line and return the computed table
    from memory instead of raising (the old file, if any, is left intact).
    ``max_hours``: refuse (:class:`tr_core.errors.WorkTooLarge`, exit code 3) before computing rows whose
    time, estimated by :mod:`optimizer.cost`, is above this many hours of one core (a file or cache entry
    that already holds them is reused whatever the estimate; ``time_budget_s`` in the foreground bounds the
    work instead); ``None``: no limit.
    ``document``: a dict that receives the JSON document of the returned table, so that a caller can print it
    without reading ``out`` again (another process may have replaced that file since).
    """
    t_start = clock()
    if not isinstance(spec, SystemSpec):
        raise SpecError("spec must be a SystemSpec (build it with tr_model.make_spec or tr_model.load_spec)")
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or not 1 <= max_concurrency <= 10 ** 6:
        raise FieldError("{max_concurrency} must be an integer in 1..1000000, got {0}", max_concurrency)
    if time_budget_s is not None and (isinstance(time_budget_s, bool) or not isinstance(time_budget_s, (int, float))
                                      or not math.isfinite(time_budget_s) or time_budget_s < 0):
        raise FieldError("{time_budget_s} must be >= 0 seconds, got {0}", time_budget_s)
    if background and time_budget_s is None:
        raise FieldError("{background} applies with {time_budget_s} (the worker finishes what the budget leaves); "
                         "without {time_budget_s} everything is computed here: give {time_budget_s} or drop "
                         "{background}")
    # the search options, checked once (tr_core.search_options): max_gap with a search that takes none refused
    SearchOptions(search=search, max_gap=max_gap, solver=solver, tol=tol, max_states=max_states,
                  max_evaluations=max_evaluations, max_hours=max_hours)
    from optimizer.evaluate import check_representable
    check_representable(spec, max_concurrency, name="max_concurrency")
    out = os.fspath(out)
    opts = solver_options(solver, tol, max_states, round_to_grid, search,
                          DEFAULT_MAX_GAP if max_gap is None else max_gap, max_evaluations, time_budget_per_n_s,
                          policy, policy_max_n)
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
                return _table(doc, document, where=f"thresholds file {cache_file!r}", path=cache_file)
    if doc is not None and (doc["complete"] or not doc["provenance"].get("resumable", True)):
        return _table(doc, document, where=f"thresholds file {out!r}", path=out)
    if doc is not None and background and worker_lock is None:
        cur = _read_lock(_lock_path(out))
        if cur is not None and cur.get("inputs_sha256") == h:
            # a worker is already completing this very table: serve what it has written so far
            return _table(doc, document, where=f"thresholds file {out!r}", path=out)
    if max_hours is not None and worker_lock is None and (time_budget_s is None or background):
        _check_hours(spec, max_concurrency, len(_computed(doc["entries"])) if doc else 0, opts, max_hours)
    if time_budget_s is None or worker_lock is not None:
        return _compute_here(spec, max_concurrency, out, h, opts, doc, cache_file=cache_file,
                             worker_lock=worker_lock, worker_token=worker_token, progress=progress,
                             write_interval_s=write_interval_s, keep_on_write_error=keep_on_write_error,
                             document=document)
    return _compute_with_deadline(spec, max_concurrency, out, h, opts, doc, cache_dir=cache_dir,
                                  deadline=t_start + time_budget_s, budget=time_budget_s, background=background,
                                  keep_on_write_error=keep_on_write_error, clock=clock, document=document)


def _table(doc: dict, document: dict | None, **kw) -> ThresholdTable:
    """``ThresholdTable.from_dict(doc, **kw)``, with ``doc`` copied into ``document`` when one is given."""
    table = ThresholdTable.from_dict(doc, **kw)
    if document is not None:
        document.clear()
        document.update(doc)
    return table


def _check_hours(spec: SystemSpec, max_concurrency: int, done: int, opts: Mapping[str, Any], max_hours: float):
    """Refuse rows ``done + 1 .. max_concurrency`` when their estimated time is above ``max_hours``
    (:class:`FieldLimit`, exit code 3, naming ``max_hours`` and ``time_budget_s``: a command line names its flags)."""
    if done >= max_concurrency:
        return
    from optimizer.cost import check_sweep_seconds, sweep_seconds
    span = [(done + 1, int(max_concurrency))]
    per_n = opts.get("time_budget_per_n_s")
    if per_n is not None and sweep_seconds(spec.M, span, opts["search"]) > per_n * (max_concurrency - done):
        return  # bounded by the budget per N
    from tr_core.errors import WorkTooLarge
    try:  # the message is a template of fields ({max_hours}); its numbers hold no braces
        check_sweep_seconds(spec.M, span, opts["search"], max_hours, limit_name="{max_hours}",
                            what=f"{{max_concurrency}} = {max_concurrency:,}: computing the rows N = "
                            f"{done + 1:,}..{max_concurrency:,}",
                            advice="lower it, give {time_budget_s} (the rows come as time allows, the rest "
                            "extrapolated), or raise {max_hours}")
    except WorkTooLarge as e:
        raise FieldLimit(str(e)) from None


def _compute_here(spec, max_concurrency, out, h, opts, doc, *, cache_file, worker_lock, worker_token, progress,
                  write_interval_s, keep_on_write_error, document=None) -> ThresholdTable:
    """Optimize N = K+1..max_concurrency in this process, writing ``out`` as rows arrive."""
    entries = _computed(doc["entries"]) if doc else []
    created = doc["provenance"].get("created_utc", _now()) if doc else _now()
    stopped: str | None = None
    resumable = True
    failure: BaseException | None = None
    last_write = time.perf_counter() - write_interval_s  # the first row is written at once
    state = {"note": "in progress" if worker_lock is not None else None}

    def snapshot() -> dict:
        return thresholds_document(spec, max_concurrency, entries, inputs_hash=h, provenance={
            "created_utc": created, "updated_utc": _now(), "stopped_reason": stopped or state["note"],
            "resumable": resumable, "options": opts}, **_doc_policy(opts))

    def check_owner():
        if worker_lock is not None and not _owns_lock(worker_lock, worker_token):
            raise SpecError(f"worker lock {worker_lock!r} was taken over; stopping")

    policies: list = []      # solved at the first row that may be certified, then shared by the rest
    while len(entries) < max_concurrency:
        n = len(entries) + 1
        try:
            if not policies and _may_certify(spec, n, opts):
                policies.append(_policy_bounds(spec, max_concurrency, opts))
            opt = _optimize(spec, n, opts, start=entries[-1]["thresholds"] if entries else None,
                            policies=policies[0] if policies else None)
            row = _entry(opt, opts["search"])
            if opts.get("policy"):
                row.update(_policy_fields(spec, n, row["thresholds"], opts))
        except StateSpaceTooLarge as e:
            stopped, resumable = f"N = {n}: {_first_line(e)}", False
            if not entries:
                raise
            break
        except Exception as e:  # noqa: BLE001 - keep the rows already computed, then report
            if is_interrupt(e):
                # Ctrl-C inside a compiled kernel arrives as numba's SystemError: still an interrupt
                raise KeyboardInterrupt from e
            stopped, resumable, failure = f"N = {n} failed: {_first_line(e)}", False, e
            break
        entries.append(row)
        if progress is not None:
            progress(entries[-1])
        if time.perf_counter() - last_write >= write_interval_s and len(entries) < max_concurrency:
            check_owner()
            try:
                write_thresholds(out, snapshot())
            except SpecError:
                if worker_lock is not None or not keep_on_write_error:
                    raise
            last_write = time.perf_counter()
    state["note"] = None
    doc = snapshot()
    check_owner()
    if failure is not None and not entries:
        # a solve that failed on a valid chain stays exit 3 (not bad input)
        raise (SolverFailed if isinstance(failure, SolverFailed) else SpecError)(stopped) from None
    table = None
    try:
        table = write_thresholds(out, doc)
    except SpecError as e:
        if not keep_on_write_error:
            raise
        log.warning("tr-autotune: %s; serving the computed table from memory", e)
        table = ThresholdTable.from_dict(doc, where="thresholds (in memory)")
    if failure is not None:
        if keep_on_write_error:
            log.warning("tr-autotune: %s; serving N = 1..%d, extrapolated above", stopped, len(entries))
        else:
            raise SpecError(f"{stopped} (rows N = 1..{len(entries)} are kept in {out!r})") from None
    if doc["complete"] and cache_file is not None:
        try:
            os.makedirs(os.path.dirname(cache_file), exist_ok=True)
            write_thresholds(cache_file, doc)
        except (OSError, SpecError) as e:
            log.warning("tr-autotune: cannot keep a copy in the cache folder (%s); %s is complete", _first_line(e),
                        out)
    if document is not None:
        document.clear()
        document.update(doc)
    return table or ThresholdTable.from_dict(doc, where=f"thresholds file {out!r}", path=out)


def _compute_with_deadline(spec, max_concurrency, out, h, opts, doc, *, cache_dir, deadline, budget, background,
                           keep_on_write_error, clock, document=None) -> ThresholdTable:
    """Run the computation in a worker process and return what it has written by ``deadline``."""
    computed = _computed(doc["entries"]) if doc else []
    created = doc["provenance"].get("created_utc", _now()) if doc else _now()
    placeholder = thresholds_document(spec, max_concurrency, computed, inputs_hash=h, provenance={
        "created_utc": created, "updated_utc": _now(), "stopped_reason": "in progress", "resumable": True,
        "options": opts}, **_doc_policy(opts))
    target, private = out, None
    try:
        write_thresholds(out, placeholder)
    except SpecError as e:
        if not keep_on_write_error:
            raise
        private = tempfile.mkdtemp(prefix="tr-autotune-")
        target = os.path.join(private, "thresholds.json")
        log.warning("tr-autotune: %s; computing in %s and serving the table from memory", e, private)
        write_thresholds(target, placeholder)
    proc = spawn_worker(spec, max_concurrency, target, h, cache_dir=None if private else cache_dir, options=opts)
    rc = None
    try:
        while True:
            if proc is not None:
                rc = proc.poll()
                if rc is not None:
                    break
            else:  # a worker started by an earlier start fills the file: stop as soon as it is complete
                cur = _load_matching(target, h)
                if cur is not None and cur["complete"]:
                    break
            left = deadline - clock()
            if left <= 0:
                break
            time.sleep(min(0.05, left))
    except BaseException:  # Ctrl-C while waiting: a worker nobody will wait for is not left running
        if proc is not None and (not background or private):
            stop_worker(target)
        if private:
            shutil.rmtree(private, ignore_errors=True)
        raise
    killed = False
    if proc is not None and rc is None and (not background or private):
        stop_worker(target)
        killed = True
    disk = _load_matching(target, h)
    cur = disk or placeholder
    k = len(_computed(cur["entries"]))
    reason = cur["provenance"].get("stopped_reason")
    if rc not in (None, 0):
        reason = _worker_error(target) or f"the worker exited with status {rc}"
        log.warning("tr-autotune: %s; serving N = 1..%d, extrapolated above", reason, k)
    elif not cur["complete"] and (killed or rc is None):
        reason = f"time budget of {budget:g} s reached with N = 1..{k} computed"
        if killed:
            cur = thresholds_document(spec, max_concurrency, cur["entries"], inputs_hash=h, provenance={
                **cur["provenance"], "updated_utc": _now(), "stopped_reason": reason, "resumable": True},
                **_doc_policy(opts))
            if not private:
                try:
                    write_thresholds(target, cur)
                except SpecError:
                    pass
        else:
            reason += f"; the background worker (pid {proc.pid if proc else 'of an earlier start'}) completes the rest"
        log.info("tr-autotune: %s; follow %s with WatchedThresholds", reason, out)
    if private:
        shutil.rmtree(private, ignore_errors=True)
        return _table(cur, document, where="thresholds (in memory)")
    if killed or rc == 0:
        _remove_worker_files(target, log_file=rc == 0 or not background)
    prov = dict(cur["provenance"], stopped_reason=None if cur["complete"] else reason)
    if document is not None:  # the file as read
        document.clear()
        document.update(cur)
    return ThresholdTable.from_dict(dict(cur, provenance=prov), where=f"thresholds file {out!r}", path=out)


def _worker_error(out: str) -> str | None:
    """The last ``error:`` line of the worker's log."""
    try:
        with open(out + ".worker.log", "r", encoding="utf-8", errors="replace") as f:
            lines = [ln.strip() for ln in f.readlines()[-50:] if ln.startswith("error:")]
    except OSError:
        return None
    return lines[-1][len("error:"):].strip() if lines else None


def spawn_worker(spec: SystemSpec, max_concurrency: int, out: str, inputs_hash: str, *,
                 cache_dir: str | os.PathLike | None = None,
                 options: Mapping[str, Any] | None = None) -> subprocess.Popen | None:
    """Start (unless one already runs for these inputs) a separate process that completes ``out``.

    Returns the worker's ``Popen``, or None when a live worker for the same inputs exists.
    """
    lock = _lock_path(out)
    cur = _read_lock(lock)
    if cur is not None and cur.get("inputs_sha256") == inputs_hash:
        return None
    # A live worker for other inputs is not signalled: replacing the lock's token below makes it stop
    # (without writing) at its next ownership check.
    token = os.urandom(16).hex()
    _write_json(lock, {"token": token, "inputs_sha256": inputs_hash, "started_utc": _now()})
    job = out + ".worker-job.json"
    _write_json(job, {"spec": spec_to_dict(spec), "max_concurrency": max_concurrency, "out": out,
                           "cache_dir": None if cache_dir is None else os.fspath(cache_dir),
                           "options": dict(options or solver_options()), "lock": lock, "token": token})
    cmd = [sys.executable, "-m", "tr_model.tuning.autotune", "--worker", job]
    logf = open(out + ".worker.log", "ab")
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf, start_new_session=True,
                                close_fds=True)
    finally:
        logf.close()
    if _owns_lock(lock, token):
        _write_json(lock, {"token": token, "pid": proc.pid, "inputs_sha256": inputs_hash,
                                "started_utc": _now()})
    _WORKERS[out] = proc
    return proc


def on_server_start(spec: SystemSpec, max_concurrency: int, out: str | os.PathLike, time_budget_s: float = 5.0,
                    cache_dir: str | os.PathLike | None = None, background: bool = True, *,
                    solver: str = "auto", tol: float | None = None, max_states: int | None = None,
                    round_to_grid: bool = False, search: str = "auto", max_gap: float | None = None,
                    max_evaluations: int | None = None, time_budget_per_n_s: float | None = None,
                    max_hours: float | None = None, policy: str | None = None,
                    policy_max_n: int | None = None) -> ThresholdTable:
    """The thresholds a server should use now, by ``time_budget_s`` seconds; never raises for a failure.

    Returns the cached table at once when the inputs hash matches; otherwise
    a worker process computes N = 1, 2, ... and this returns, at the latest
    when the budget is spent, every row the worker has written (the others
    extrapolated).  With ``background=True`` the worker then completes the
    file: the returned table is a snapshot, use
    ``WatchedThresholds(out)`` to follow the file.  ``time_budget_s=None``
    computes every row here (``background`` has nothing left to finish then).
    On failure: one log line and the rows computed so far, or
    :meth:`ThresholdTable.eager`.
    """
    if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
        raise SpecError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
    M = spec.M if isinstance(spec, SystemSpec) else 2
    try:
        return tune(spec, max_concurrency, out, time_budget_s=time_budget_s, cache_dir=cache_dir,
                    background=background and time_budget_s is not None, solver=solver, tol=tol, max_states=max_states,
                    round_to_grid=round_to_grid, search=search, max_gap=max_gap, max_evaluations=max_evaluations,
                    time_budget_per_n_s=time_budget_per_n_s, max_hours=max_hours, policy=policy,
                    policy_max_n=policy_max_n, keep_on_write_error=True)
    except Exception as e:  # noqa: BLE001 - a server must start whatever happened
        log.warning("tr-autotune: %s; using the eager fallback (all thresholds 1)", _first_line(e))
    return ThresholdTable.eager(M, max_concurrency)


def _worker_main(job_path: str) -> int:
    """The background worker: complete the table described by the job file; ``error:`` line and exit 2 on
    failure (the server reads that line from the worker's log)."""
    try:
        with open(job_path, "r", encoding="utf-8") as f:
            job = json.load(f)
        lock, token = job["lock"], job["token"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.stderr.write(f"error: cannot read the worker job {job_path!r}: {_first_line(e)}\n")
        return 2
    code = 0
    try:
        spec = spec_from_dict(job["spec"])
        options = dict(job["options"])
        if options.get("search") not in ("certified", "auto"):
            options.pop("max_gap", None)  # recorded for the inputs hash; these searches take no gap
        tune(spec, int(job["max_concurrency"]), job["out"], cache_dir=job.get("cache_dir"), worker_lock=lock,
             worker_token=token, write_interval_s=WORKER_WRITE_INTERVAL_S, **options)
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        code = 130
    except Exception as e:  # noqa: BLE001 - one line in the log, read by the server
        sys.stderr.write(f"error: {_first_line(e)}\n")
        code = getattr(e, "exit_code", 2) if isinstance(e, TRError) else 2
    finally:
        if _owns_lock(lock, token):
            for p in (lock, job_path):
                try:
                    os.unlink(p)
                except OSError:
                    pass
    return code


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(_worker_main(sys.argv[2]))
    sys.stderr.write("error: usage: python -m tr_model.tuning.autotune --worker JOB.json (internal; use tr-autotune)\n")
    sys.exit(2)
