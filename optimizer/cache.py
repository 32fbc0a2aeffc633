"""On-disk result cache for chain evaluations.

Key: SHA-256 of the canonical JSON of (spec, N, B, delta, solver, tolerance,
max_states, rounding flag, cache format version, package version, and a hash
of the chain code itself, so an upgrade or a local edit never serves stale
numbers).  Value: the
evaluation as JSON, one file per key under ``<dir>/<key[:2]>/<key>.json``.
Writers go through a temporary file and an atomic rename, so concurrent
writers (processes of one sweep, several server starts) never expose a partial
file; every entry is validated on read, and a corrupt, mistyped or non-finite one is
reported on stderr and recomputed, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import sys
import tempfile
import time

from tr_core.errors import short_repr
from tr_core.fileio import signals_deferred
from tr_core.spec import SystemSpec, spec_to_dict

CACHE_FORMAT = 1


def default_cache_dir() -> str:
    env = os.environ.get("TR_MODEL_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tr-model", "evaluations")


_CODE_HASH: str | None = None


def code_fingerprint() -> str:
    """SHA-256 over the source of the modules that compute an evaluation."""
    global _CODE_HASH
    if _CODE_HASH is None:
        import dtmc
        h = hashlib.sha256()
        folder = os.path.dirname(dtmc.__file__)
        files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".py"))
        # the evaluation module sits next to this one (found by path: importing it would be a circle)
        for path in files + [os.path.join(os.path.dirname(os.path.abspath(__file__)), "evaluate.py")]:
            with open(path, "rb") as f:
                h.update(f.read())
        _CODE_HASH = h.hexdigest()
    return _CODE_HASH


def evaluation_key(spec: SystemSpec, N: int, B, solver: str, tol: float, max_states: int,
                   round_to_grid: bool) -> str:
    from tr_core.version import __version__
    d = spec_to_dict(spec)
    d.pop("provenance", None)
    d.pop("name", None)
    d.pop("model_names", None)
    doc = {"format": CACHE_FORMAT, "version": __version__, "spec": d, "N": int(N), "B": [int(b) for b in B],
           "solver": solver, "tol": float(tol), "max_states": int(max_states), "round": bool(round_to_grid),
           "code": code_fingerprint()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _bound(x) -> float:
    return float("inf") if x is None else float(x)


MAX_ENTRY_BYTES = 1 << 20   # an entry is a few hundred bytes per model


class _Invalid(Exception):
    pass


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def check_entry(d, expect: tuple | None = None) -> None:
    """Raise ``_Invalid`` (naming the field) unless ``d`` is a well-formed evaluation entry.

    Types are JSON types (a string where a number belongs is refused, never converted); numbers are
    finite; counts are integers; ``expect = (N, B)`` must match the entry's own.
    """
    if not isinstance(d, dict):
        raise _Invalid("not a JSON object")

    def need(key, ok, what):
        if key not in d:
            raise _Invalid(f"missing field {key!r}")
        if not ok(d[key]):
            raise _Invalid(f"{key!r} must be {what}, got {short_repr(d[key])}")

    need("N", lambda v: _is_int(v) and v >= 1, "an integer >= 1")
    need("B", lambda v: isinstance(v, list) and v and all(_is_int(b) and b >= 1 for b in v), "a list of integers >= 1")
    M = len(d["B"])
    for key in ("throughput_tok_s", "per_request_tok_s", "residual"):
        need(key, lambda v: _is_num(v) and v >= 0, "a finite number >= 0")
    for key in ("states", "transitions"):
        need(key, lambda v: _is_int(v) and v >= (1 if key == "states" else 0), "a non-negative integer")
    need("solver", lambda v: isinstance(v, str), "a string")
    need("mean_waiting", lambda v: isinstance(v, list) and len(v) == M and all(_is_num(x) and x >= 0 for x in v),
         f"a list of {M} finite numbers >= 0")
    need("admission_latency_ms", lambda v: isinstance(v, list) and len(v) == M
         and all(x is None or (_is_num(x) and x >= 0) for x in v), f"a list of {M} numbers >= 0 or null")
    for key in ("pi_error_bound", "throughput_error_bound"):
        if d.get(key) is not None and not (_is_num(d[key]) and d[key] >= 0):
            raise _Invalid(f"{key!r} must be a finite number >= 0 or null, got {short_repr(d[key])}")
    for key in ("iterations", "recurrent_states", "bytes_used"):
        if key in d and not (_is_int(d[key]) and d[key] >= 0):
            raise _Invalid(f"{key!r} must be a non-negative integer, got {short_repr(d[key])}")
    if "delta_ms" in d and not (_is_num(d["delta_ms"]) and d["delta_ms"] > 0):
        raise _Invalid(f"'delta_ms' must be a finite number > 0, got {short_repr(d['delta_ms'])}")
    if "bound_method" in d and not isinstance(d["bound_method"], str):
        raise _Invalid(f"'bound_method' must be a string, got {short_repr(d['bound_method'])}")
    if expect is not None:
        N, B = expect
        if d["N"] != int(N) or tuple(d["B"]) != tuple(int(b) for b in B):
            raise _Invalid(f"it holds N = {d['N']}, B = {tuple(d['B'])}, not N = {N}, B = {tuple(B)}")


class ResultCache:
    """A folder of cached evaluations (:class:`optimizer.evaluate.Evaluation`).

    The cache stores plain JSON and rebuilds results with the class the caller
    passes, so it does not import the module that uses it (no import circle).
    """

    def __init__(self, path: str | None = None, *, report: bool = True):
        self.path = os.fspath(path) if path else default_cache_dir()
        self.report = report   # a warning line on stderr for each invalid entry met
        self.invalid = 0       # entries met that failed validation (each was recomputed)

    def _file(self, key: str) -> str:
        return os.path.join(self.path, key[:2], key + ".json")

    def get(self, key: str, factory, expect: tuple | None = None):
        """The cached evaluation, or ``None``.

        A hit says so: ``cached=True``, and ``seconds`` is the time this lookup
        took (the original computation time is kept as ``computed_seconds`` in
        the file), never the time of a computation that did not happen now.

        Every entry is validated before it is trusted (:func:`check_entry`): a
        corrupt, truncated, mistyped or non-finite entry, one for another
        ``expect = (N, B)``, or a path that is not a regular file is a miss, reported once on stderr as
        ``warning: ...; recomputed`` and counted in ``self.invalid`` (the recomputed result replaces
        it).  A missing entry is a plain miss.
        """
        t0 = time.perf_counter()
        path = self._file(key)
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return None  # a miss
        try:
            if not stat.S_ISREG(st.st_mode):
                raise _Invalid("not a regular file")
            if st.st_size > MAX_ENTRY_BYTES:
                raise _Invalid(f"{st.st_size:,} bytes, more than an entry can be")
            with open(path, "rb") as f:
                raw = f.read(MAX_ENTRY_BYTES + 1)
            try:
                d = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
            except (ValueError, RecursionError) as e:
                raise _Invalid(f"not valid JSON ({str(e).splitlines()[0][:80] if str(e) else type(e).__name__})")
            check_entry(d, expect)
            return factory(
                N=d["N"], B=tuple(d["B"]), throughput_tok_s=float(d["throughput_tok_s"]), states=d["states"],
                transitions=d["transitions"], residual=float(d["residual"]), solver=d["solver"],
                seconds=time.perf_counter() - t0,
                mean_waiting=tuple(float(x) for x in d["mean_waiting"]),
                admission_latency_ms=tuple(float("nan") if x is None else float(x) for x in d["admission_latency_ms"]),
                per_request_tok_s=float(d["per_request_tok_s"]), iterations=d.get("iterations", 0),
                recurrent_states=d.get("recurrent_states", 0), bytes_used=d.get("bytes_used", 0),
                delta_ms=float(d.get("delta_ms", 0.1)), cached=True,
                pi_error_bound=_bound(d.get("pi_error_bound")),
                throughput_error_bound=_bound(d.get("throughput_error_bound")),
                bound_method=d.get("bound_method", ""))
        except _Invalid as e:
            self._report(path, str(e))
        except OSError as e:
            self._report(path, f"unreadable ({e.strerror or e})")
        except (KeyError, TypeError, ValueError) as e:  # the factory refused it
            self._report(path, f"{type(e).__name__}: {str(e)[:80]}")
        return None

    def _report(self, path: str, why: str) -> None:
        self.invalid += 1
        if self.report:
            sys.stderr.write(f"warning: result cache entry {path} is invalid ({why}); ignored and recomputed\n")

    def put(self, key: str, ev) -> None:
        folder = os.path.dirname(self._file(key))
        d = ev.to_dict()
        d["delta_ms"] = ev.delta_ms
        d["computed_seconds"] = ev.seconds
        text = json.dumps(d)
        tmp = None
        # Ctrl-C or SIGTERM while the entry is written would leave its temporary file behind: held back until
        # the entry is renamed into place (or cleaned up)
        with signals_deferred():
            try:
                os.makedirs(folder, exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                os.replace(tmp, self._file(key))
            except BaseException as e:
                if tmp is not None:
                    try:
                        os.unlink(tmp)
                    except OSError:
                        pass
                if not isinstance(e, OSError):
                    raise
                # a read-only or full cache must never fail the computation itself
