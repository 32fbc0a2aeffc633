"""On-disk result cache for chain evaluations.

Key: SHA-256 of the canonical JSON of (spec, N, B, delta, solver, tolerance,
max_states, rounding flag, cache format version, package version, and a hash
of the chain code itself, so an upgrade or a local edit never serves stale
numbers).  Value: the
evaluation as JSON, one file per key under ``<dir>/<key[:2]>/<key>.json``.
Writers go through a temporary file and an atomic rename, so concurrent
writers (processes of one sweep, several server starts) never expose a partial
file; a corrupt or unreadable entry is treated as a miss.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time

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


class ResultCache:
    """A folder of cached evaluations (:class:`optimizer.evaluate.Evaluation`).

    The cache stores plain JSON and rebuilds results with the class the caller
    passes, so it does not import the module that uses it (no import circle).
    """

    def __init__(self, path: str | None = None):
        self.path = os.fspath(path) if path else default_cache_dir()

    def _file(self, key: str) -> str:
        return os.path.join(self.path, key[:2], key + ".json")

    def get(self, key: str, factory):
        """The cached evaluation, or ``None``.

        A hit says so: ``cached=True``, and ``seconds`` is the time this lookup
        took (the original computation time is kept as ``computed_seconds`` in
        the file), never the time of a computation that did not happen now.
        """
        t0 = time.perf_counter()
        try:
            with open(self._file(key), encoding="utf-8") as f:
                d = json.load(f)
            return factory(
                N=d["N"], B=tuple(d["B"]), throughput_tok_s=d["throughput_tok_s"], states=d["states"],
                transitions=d["transitions"], residual=d["residual"], solver=d["solver"],
                seconds=time.perf_counter() - t0,
                mean_waiting=tuple(d["mean_waiting"]),
                admission_latency_ms=tuple(float("nan") if x is None else x for x in d["admission_latency_ms"]),
                per_request_tok_s=d["per_request_tok_s"], iterations=d.get("iterations", 0),
                recurrent_states=d.get("recurrent_states", 0), bytes_used=d.get("bytes_used", 0),
                delta_ms=d.get("delta_ms", 0.1), cached=True,
                pi_error_bound=_bound(d.get("pi_error_bound")),
                throughput_error_bound=_bound(d.get("throughput_error_bound")),
                bound_method=d.get("bound_method", ""))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, ev) -> None:
        folder = os.path.dirname(self._file(key))
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                d = ev.to_dict()
                d["delta_ms"] = ev.delta_ms
                d["computed_seconds"] = ev.seconds
                json.dump(d, f)
            os.replace(tmp, self._file(key))
        except OSError:
            # a read-only or full cache must never fail the computation itself
            try:
                os.unlink(tmp)  # type: ignore[possibly-undefined]
            except (OSError, UnboundLocalError):
                pass
