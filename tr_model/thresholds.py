"""Reader of delayed-batching threshold files (vendorable: standard library only).

A scheduler that applies TokenRouter's delayed batching needs, for the number
``N`` of requests currently active in the whole system (the paper's *global
state tracking*), the threshold vector ``B*(N) = (B_0, ..., B_{M-1})``: model i
launches a batch only when it is idle and at least ``B_i`` requests wait for it.
``tr-autotune`` computes ``B*(N)`` for N = 1..max_concurrency from the
delayed-batching chain and writes them to a JSON *thresholds file*; this module
reads that file.  It imports nothing outside the Python standard library and
nothing from this project, so a serving runtime (SGLang, vLLM or your own) can
copy this single file into its tree.

Usage::

    table = ThresholdTable.load("thresholds.json")      # validates, or raises ThresholdFileError
    b = table.lookup(active_requests)[my_model_index]    # launch when waiting >= b

File format (``schema_version`` 1; JSON Schema in
``data/schemas/thresholds.schema.json``)::

    {"schema_version": 1, "format": "tokenrouter-thresholds",
     "num_models": 2, "model_names": ["small", "large"], "delta_ms": 0.1,
     "spec": {... the system spec ...}, "spec_sha256": "<hex>",
     "max_concurrency": 16, "complete": true,
     "fallback_thresholds": [1, 1],
     "entries": [{"active_requests": 1, "thresholds": [1, 1],
                  "predicted_tok_s": 63.43, "eager_tok_s": 63.43, ...}, ...],
     "provenance": {"tool": "tr-autotune", "tool_version": "0.1.0",
                    "inputs_sha256": "<hex>", "created_utc": "...", ...}}

Rules the reader enforces (each violation names the field):

* ``schema_version`` must be 1;
* ``entries[k].active_requests == k + 1``: the table covers N = 1..K with no
  gap, ``1 <= K <= max_concurrency``, and ``K == max_concurrency`` when
  ``complete`` is true;
* every threshold is an integer >= 1, every vector has ``num_models`` entries,
  and ``sum_i (B_i - 1) < N`` (the chain's feasibility condition: a vector that
  violates it can deadlock a closed system of N requests);
* ``spec_sha256`` equals the SHA-256 of the canonical JSON of ``spec`` without
  its free-form ``provenance`` (see :func:`canonical_sha256`), so an edited or
  truncated spec is detected.

Lookup semantics: ``lookup(N)`` for ``N`` above the largest covered ``K``
returns ``B*(K)`` (the table may be incomplete while the background tuner is
still running); ``lookup(0)`` returns ``B*(1)`` (an empty system launches
nothing anyway); a negative or non-integer count is an error.  A missing or
corrupt file always raises :class:`ThresholdFileError`; the reader never
substitutes a default silently.  Use :meth:`ThresholdTable.eager` explicitly
when you want the all-ones fallback.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

THRESHOLDS_SCHEMA_VERSION = 1
THRESHOLDS_FORMAT = "tokenrouter-thresholds"

__all__ = ["THRESHOLDS_SCHEMA_VERSION", "THRESHOLDS_FORMAT", "ThresholdFileError", "ThresholdTable",
           "WatchedThresholds", "canonical_sha256", "spec_sha256"]


class ThresholdFileError(ValueError):
    """The thresholds file is missing, unreadable, corrupt or violates the format."""


def canonical_sha256(obj: Any) -> str:
    """SHA-256 hex digest of the canonical JSON of ``obj`` (sorted keys, no spaces, ASCII)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def spec_sha256(spec_doc: Mapping[str, Any]) -> str:
    """Hash of a spec document, ignoring its free-form ``provenance`` (which does not change results)."""
    return canonical_sha256({k: v for k, v in spec_doc.items() if k != "provenance"})


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class ThresholdTable:
    """Validated ``B*(N)`` table; build it with :meth:`load`, :meth:`from_dict` or :meth:`eager`."""

    num_models: int
    max_concurrency: int
    complete: bool
    thresholds: tuple  # thresholds[n - 1] = B*(n), a tuple of num_models ints
    fallback_thresholds: tuple
    predicted_tok_s: tuple = ()
    eager_tok_s: tuple = ()
    model_names: tuple | None = None
    delta_ms: float | None = None
    spec_sha256: str | None = None
    inputs_sha256: str | None = None
    source: str = "file"  # "file", "memory" or "fallback"
    path: str | None = None
    provenance: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def covered_concurrency(self) -> int:
        """Largest N with a computed entry (``K``); ``lookup`` clamps larger counts to it."""
        return len(self.thresholds)

    def lookup(self, active_requests: int) -> tuple:
        """Threshold vector for ``active_requests`` requests active in the whole system."""
        if not _is_int(active_requests):
            raise ValueError(f"active_requests must be an integer, got {active_requests!r}")
        if active_requests < 0:
            raise ValueError(f"active_requests must be >= 0, got {active_requests}")
        n = min(max(active_requests, 1), len(self.thresholds))
        return self.thresholds[n - 1]

    def predicted(self, active_requests: int) -> float | None:
        """Predicted tokens/s at ``B*(N)`` for the clamped N, or None for the fallback table."""
        if not self.predicted_tok_s:
            return None
        n = min(max(int(active_requests), 1), len(self.predicted_tok_s))
        return self.predicted_tok_s[n - 1]

    @classmethod
    def eager(cls, num_models: int, max_concurrency: int = 1) -> "ThresholdTable":
        """The eager fallback (every model launches as soon as one request waits)."""
        if not _is_int(num_models) or num_models < 1:
            raise ValueError(f"num_models must be an integer >= 1, got {num_models!r}")
        if not _is_int(max_concurrency) or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be an integer >= 1, got {max_concurrency!r}")
        ones = (1,) * num_models
        return cls(num_models=num_models, max_concurrency=max_concurrency, complete=True,
                   thresholds=(ones,) * max_concurrency, fallback_thresholds=ones, source="fallback")

    @classmethod
    def load(cls, path: str | os.PathLike, *, require_concurrency: int | None = None) -> "ThresholdTable":
        """Read and validate a thresholds file.

        ``require_concurrency``: fail unless the file covers N = 1..require_concurrency
        (use it when the server must not run on a partial table).
        """
        p = os.fspath(path)
        try:
            with open(p, "r", encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise ThresholdFileError(f"thresholds file {p!r} does not exist") from None
        except OSError as e:
            raise ThresholdFileError(f"cannot read thresholds file {p!r}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise ThresholdFileError(f"thresholds file {p!r} is not UTF-8 text (corrupt?)") from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise ThresholdFileError(f"thresholds file {p!r} is not valid JSON (corrupt or truncated?): {e}") from None
        return cls.from_dict(doc, where=f"thresholds file {p!r}", path=p, require_concurrency=require_concurrency)

    @classmethod
    def from_dict(cls, doc: Any, *, where: str = "thresholds", path: str | None = None,
                  require_concurrency: int | None = None) -> "ThresholdTable":
        """Validate a parsed thresholds document (see the module docstring for the rules)."""

        def fail(msg: str) -> ThresholdFileError:
            return ThresholdFileError(f"{where}: {msg}")

        if not isinstance(doc, dict):
            raise fail("the document must be a JSON object")
        if "schema_version" not in doc:
            raise fail("missing field 'schema_version'")
        ver = doc["schema_version"]
        if ver != THRESHOLDS_SCHEMA_VERSION or not _is_int(ver):
            raise fail(f"unsupported schema_version {ver!r} (this reader supports {THRESHOLDS_SCHEMA_VERSION})")
        if doc.get("format", THRESHOLDS_FORMAT) != THRESHOLDS_FORMAT:
            raise fail(f"'format' must be {THRESHOLDS_FORMAT!r}, got {doc.get('format')!r}")
        for key in ("num_models", "max_concurrency", "complete", "entries", "fallback_thresholds"):
            if key not in doc:
                raise fail(f"missing field {key!r}")
        M = doc["num_models"]
        if not _is_int(M) or M < 1:
            raise fail(f"'num_models' must be an integer >= 1, got {M!r}")
        nmax = doc["max_concurrency"]
        if not _is_int(nmax) or nmax < 1:
            raise fail(f"'max_concurrency' must be an integer >= 1, got {nmax!r}")
        complete = doc["complete"]
        if not isinstance(complete, bool):
            raise fail(f"'complete' must be true or false, got {complete!r}")

        def vector(v: Any, name: str, n: int | None) -> tuple:
            if not isinstance(v, list):
                raise fail(f"{name} must be a list of {M} integers")
            if len(v) != M:
                raise fail(f"{name} has {len(v)} entries, expected num_models = {M}")
            for i, b in enumerate(v):
                if not _is_int(b) or b < 1:
                    raise fail(f"{name}[{i}] must be an integer >= 1, got {b!r}")
            if n is not None and sum(b - 1 for b in v) >= n:
                raise fail(f"{name} = {v} is infeasible for N = {n}: sum(B_i - 1) = "
                           f"{sum(b - 1 for b in v)} must be < N (it could deadlock)")
            return tuple(v)

        fallback = vector(doc["fallback_thresholds"], "'fallback_thresholds'", None)
        entries = doc["entries"]
        if not isinstance(entries, list):
            raise fail("'entries' must be a list")
        if not entries:
            raise fail("'entries' is empty: the table covers no N (need at least N = 1)")
        if len(entries) > nmax:
            raise fail(f"'entries' has {len(entries)} rows but max_concurrency is {nmax}")
        ths, pred, eag = [], [], []
        for k, e in enumerate(entries):
            name = f"entries[{k}]"
            if not isinstance(e, dict):
                raise fail(f"{name} must be an object")
            for key in ("active_requests", "thresholds"):
                if key not in e:
                    raise fail(f"{name} is missing field {key!r}")
            n = e["active_requests"]
            if not _is_int(n) or n != k + 1:
                raise fail(f"{name}.active_requests must be {k + 1} (entries cover N = 1, 2, ... without gaps), "
                           f"got {n!r}")
            ths.append(vector(e["thresholds"], f"{name}.thresholds", n))
            for key, acc in (("predicted_tok_s", pred), ("eager_tok_s", eag)):
                if key in e:
                    if not _is_num(e[key]) or e[key] < 0:
                        raise fail(f"{name}.{key} must be a finite number >= 0, got {e[key]!r}")
                    acc.append(float(e[key]))
        if complete and len(ths) != nmax:
            raise fail(f"'complete' is true but 'entries' cover N = 1..{len(ths)}, not 1..{nmax} (max_concurrency)")
        if require_concurrency is not None and len(ths) < require_concurrency:
            raise fail(f"the table covers N = 1..{len(ths)} but N = 1..{require_concurrency} was required "
                       f"(complete = {str(complete).lower()})")
        names = doc.get("model_names")
        if names is not None:
            if not isinstance(names, list) or len(names) != M or not all(isinstance(s, str) for s in names):
                raise fail(f"'model_names' must be a list of {M} strings")
            names = tuple(names)
        delta = doc.get("delta_ms")
        if delta is not None and (not _is_num(delta) or delta <= 0):
            raise fail(f"'delta_ms' must be a number > 0, got {delta!r}")
        digest = doc.get("spec_sha256")
        if "spec" in doc:
            if not isinstance(doc["spec"], dict):
                raise fail("'spec' must be an object")
            if digest is None:
                raise fail("'spec' is present but 'spec_sha256' is missing")
            if spec_sha256(doc["spec"]) != digest:
                raise fail("'spec_sha256' does not match the embedded 'spec' (edited or corrupt file)")
        prov = doc.get("provenance", {})
        if not isinstance(prov, dict):
            raise fail("'provenance' must be an object")
        inputs = prov.get("inputs_sha256")
        return cls(num_models=M, max_concurrency=nmax, complete=complete, thresholds=tuple(ths),
                   fallback_thresholds=fallback,
                   predicted_tok_s=tuple(pred) if len(pred) == len(ths) else (),
                   eager_tok_s=tuple(eag) if len(eag) == len(ths) else (),
                   model_names=names, delta_ms=None if delta is None else float(delta), spec_sha256=digest,
                   inputs_sha256=inputs if isinstance(inputs, str) else None,
                   source="file" if path is not None else "memory", path=path, provenance=prov)


class WatchedThresholds:
    """A thresholds file that is re-read when it is replaced (e.g. by a background tuner).

    ``lookup`` checks the file's modification time at most every
    ``check_interval_s`` seconds and reloads it when it changed.  The first
    load must succeed (a missing or invalid file raises); a later invalid
    replacement keeps the previous table and is reported in ``last_error``
    (a running server should not lose its thresholds because of a bad write).
    """

    def __init__(self, path: str | os.PathLike, check_interval_s: float = 1.0):
        self.path = os.fspath(path)
        self.check_interval_s = float(check_interval_s)
        self.table = ThresholdTable.load(self.path)
        self.last_error: str | None = None
        self._stamp = self._stat()
        self._checked = time.monotonic()

    def _stat(self):
        try:
            st = os.stat(self.path)
            return (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            return None

    def refresh(self) -> bool:
        """Reload now if the file changed; True when a new table was loaded."""
        self._checked = time.monotonic()
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return False
        try:
            self.table = ThresholdTable.load(self.path)
        except ThresholdFileError as e:
            self.last_error = str(e)
            self._stamp = stamp
            return False
        self._stamp = stamp
        self.last_error = None
        return True

    def lookup(self, active_requests: int) -> tuple:
        if time.monotonic() - self._checked >= self.check_interval_s:
            self.refresh()
        return self.table.lookup(active_requests)
