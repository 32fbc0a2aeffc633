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

File format (``schema_version`` 2, or 3 with a state-dependent launch policy; this reader also reads 1;
JSON Schema in ``data/schemas/thresholds.schema.json``)::

    {"schema_version": 2, "format": "tokenrouter-thresholds",
     "num_models": 2, "model_names": ["small", "large"], "delta_ms": 0.1,
     "spec": {... the system spec ...}, "spec_sha256": "<hex>",
     "max_concurrency": 256, "complete": true,
     "fallback_thresholds": [1, 1],
     "entries": [{"active_requests": 1, "thresholds": [1, 1], "certificate": "exhaustive",
                  "predicted_tok_s": 63.43, "upper_bound_tok_s": 63.43, "gap": 0.0, ...}, ...],
     "provenance": {"tool": "tr-autotune", "tool_version": "0.1.0",
                    "inputs_sha256": "<hex>", "created_utc": "...", ...}}

Every row of a version-2 file says how its vector was obtained (``certificate``):

* ``exhaustive``: every feasible vector was evaluated; ``B*(N)`` is exact;
* ``pruned-exact``: exact, vectors were skipped only by proven upper bounds;
* ``certified``: the best vector found, and a proven ``upper_bound_tok_s`` on
  what any vector reaches at that N; ``gap = (upper_bound - predicted) /
  upper_bound`` bounds what the row may lose, relative;
* ``local``: a local search's result, not guaranteed optimal (its ``gap``,
  when given, still comes from a proven bound);
* ``extrapolated``: nothing was computed for this N (time budget spent, or
  the chain too large); the vector is copied from row ``extrapolated_from``
  (the largest computed N below), or is all ones when ``extrapolated_from`` is
  null.  Extrapolated rows form a suffix of the table.

**Version 3: a state-dependent launch policy** (``docs/autotune.md``, "Schema version 3").  A version-3
file is a version-2 file (every field above keeps its meaning; ``thresholds`` stays ``B*(N)``) with a
top-level ``policy`` object naming a compact policy class and, in every row, that class's thresholds::

    "policy": {"class": "residual",
               "columns": ["others_idle", "others_end_later", "others_end_sooner"],
               "max_batch_size": [null, null],
               "step_ms": [[6.0, ...], [27.9, ...]],                 # model i, batch size b = 1..max_concurrency
               "step_ms_beside_running": [[6.0, ...], [27.9, ...]]}, # the same, launched while another runs
    "entries": [{... the version-2 fields ..., "policy_thresholds": [[1, 1, null], [3, 3, 3]],
                 "policy_certificate": "local", "policy_predicted_tok_s": 208.56}, ...]

``policy_thresholds[j][c]`` is model j's threshold in situation ``columns[c]`` (``null``: never launch in
that situation).  The situation is read at an event (a completion and its routing, an arrival; not as time
passes: a waiting model decides again at the next event), in the state right after the instant's completions
and routing and before any launch of that instant (a model that launches at this very instant still counts
as idle):

* class ``busy``: ``others_idle`` while no other model runs a batch, ``others_busy`` while one does;
* class ``residual``: ``others_idle``; ``others_end_later`` while the earliest-ending running batch of the
  other models ends no sooner than model j's own step would (``step_ms_beside_running[j][b - 1]``, b the
  batch it would take: ``min(waiting, max_batch_size[j])``); ``others_end_sooner`` while it ends sooner
  (by at least half a ``delta_ms``);
* class ``window`` (columns ``threshold``, ``window_ms``): the threshold, unless a running batch of another
  model ends within ``window_ms`` (then model j waits);
* class ``ratio`` (the same columns, and the header's step tables): model j waits while, for some running
  batch of another model ending in ``t`` ms, ``t * waiting[j] <= window_ms * A(t)``, ``A(t)`` the requests in
  the other models' running batches ending within ``t``; the models decide in turn, fastest first, and a
  batch launched earlier in the same instant counts as running (so pass the instant's state before its
  launches, with ``running_batch``, and take all decisions from one :meth:`ThresholdTable.decide` call).

Times are compared on the ``delta_ms`` grid.  Model j launches when it is idle and ``waiting >= threshold >= 1`` (:meth:`ThresholdTable.decide`).  Rows
say how their policy was obtained: ``policy_certificate`` ``local`` (a search over the class from B*; its
``policy_predicted_tok_s`` is the exact chain's throughput under that policy, at least ``predicted_tok_s``)
or ``thresholds`` (not searched: every column equals ``thresholds[j]``, the plain B* policy; extrapolated
rows always are).  A reader that knows only versions 1-2 refuses a version-3 file (``unsupported
schema_version 3``); this reader refuses a newer version or an unknown policy class, naming the field
and what to upgrade.

Rules the reader enforces (each violation names the field):

* ``schema_version`` must be 1, 2 or 3;
* ``entries[k].active_requests == k + 1``: the rows cover N = 1..K with no
  gap, ``1 <= K <= max_concurrency``, and ``K == max_concurrency`` with no
  extrapolated row when ``complete`` is true;
* every threshold is an integer >= 1, every vector has ``num_models`` entries,
  and ``sum_i (B_i - 1) < N`` (the chain's feasibility condition: a vector that
  violates it can deadlock a closed system of N requests);
* every number is a finite JSON number of the right type (no strings, no
  booleans, no NaN or infinity, nothing that overflows a double);
* every number lies in its stated finite range: ``num_models`` 1..4096, ``max_concurrency`` and batch caps
  1..2^31-1, ``delta_ms`` [1e-6, 1e6] ms, step lengths (0, 1e9] ms, ``window_ms`` [0, 1e9] ms, tokens/s
  [0, 1e15] (``MAX_*`` and ``DELTA_MS_RANGE`` below), so that no accepted value can overflow a decision:
  :meth:`ThresholdTable.decide` never raises on a state it accepts (a residual above 1e12 ms counts as 1e12);
* no unknown field (top level, rows, ``policy``), no key twice in one object, the informational row fields
  (``states``, ``seconds``, ``solver``...) of their one type, and every per-model list of the embedded spec
  of ``num_models`` entries;
* values that cannot occur are refused: a ``gap`` outside [0, 1], a ``fallback_thresholds`` other
  than all ones (it applies at any N, N = 1 included), an exact row below its own eager throughput,
  a ``num_models``, ``model_names`` or ``delta_ms`` that disagrees with the embedded ``spec``;
* ``spec_sha256`` equals the SHA-256 of the canonical JSON of ``spec`` without
  its free-form ``provenance`` (see :func:`canonical_sha256`), so an edited or
  truncated spec is detected.

Lookup semantics: ``lookup(N)`` for ``N`` above the last row returns that
row's vector; ``lookup(0)`` returns ``B*(1)`` (an empty system launches
nothing anyway); a negative or non-integer count is an error.
``covered_concurrency`` counts the computed (not extrapolated) rows.

Contract: :meth:`ThresholdTable.load` raises :class:`ThresholdFileError` and
nothing else, whatever the path holds (missing, a directory or device, not
UTF-8, not JSON, nested too deeply, numbers out of range, wrong types, more
than ``MAX_FILE_BYTES``); the reader never substitutes a default silently.
Use :meth:`ThresholdTable.eager` explicitly when you want the all-ones
fallback.  :class:`WatchedThresholds` re-reads a replaced file and keeps the
last good table after a bad replacement; its ``lookup`` never raises for a
file problem.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import reprlib
import stat
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

THRESHOLDS_SCHEMA_VERSION = 2         # written for a plain threshold table
POLICY_SCHEMA_VERSION = 3             # written when the file carries a state-dependent launch policy
READABLE_SCHEMA_VERSIONS = (1, 2, 3)
# compact launch-policy classes a version-3 file may carry: the column names of policy_thresholds
POLICY_COLUMNS = {"busy": ("others_idle", "others_busy"),
                  "residual": ("others_idle", "others_end_later", "others_end_sooner"),
                  "window": ("threshold", "window_ms"),
                  "ratio": ("threshold", "window_ms")}
# classes whose second column is a time window in ms (a number >= 0), not a threshold
WINDOW_CLASSES = ("window", "ratio")
# classes whose header carries the step lengths (step_ms, step_ms_beside_running)
STEP_CLASSES = ("residual", "ratio")
POLICY_CERTIFICATES = ("local", "thresholds")
UPGRADE_HINT = "upgrade tokenrouter-model (or copy its newer tr_model/thresholds.py, standard library only)"
THRESHOLDS_FORMAT = "tokenrouter-thresholds"
CERTIFICATES = ("exhaustive", "pruned-exact", "certified", "local", "extrapolated")
MAX_FILE_BYTES = 64 * 2 ** 20   # a table for N = 1..10^5 with 12 models is about 30 MB
MAX_CONCURRENCY_LIMIT = 2 ** 31 - 1
# The finite range of every numeric field (the reader refuses values outside; the JSON schema states the same),
# so that no accepted value can overflow a decision: times in ms on a grid of delta_ms stay below 2^63 quanta.
MAX_MODELS = 4096
DELTA_MS_RANGE = (1e-6, 1e6)          # delta_ms, ms
MAX_STEP_MS = 1e9                     # policy step_ms, step_ms_beside_running: (0, 1e9] ms
MAX_WINDOW_MS = 1e9                   # policy window_ms column: [0, 1e9] ms
MAX_TOK_S = 1e15                      # predicted / eager / upper-bound / policy-predicted tokens/s: [0, 1e15]
MAX_RESIDUAL_MS = 1e12                # decide(): a residual above this many ms counts as this many (saturates)
# the fields a file may hold (anything else is refused: a misspelt field must not be ignored silently)
TOP_LEVEL_FIELDS = frozenset({"schema_version", "format", "num_models", "model_names", "delta_ms", "spec",
                              "spec_sha256", "max_concurrency", "complete", "fallback_thresholds", "entries",
                              "provenance", "policy"})
ENTRY_FIELDS = frozenset({"active_requests", "thresholds", "predicted_tok_s", "eager_tok_s", "gain_vs_eager",
                          "states", "residual", "solver", "evaluated", "seconds", "certificate",
                          "upper_bound_tok_s", "gap", "pruned", "extrapolated_from", "policy_thresholds",
                          "policy_certificate", "policy_predicted_tok_s", "policy_seconds"})

__all__ = ["THRESHOLDS_SCHEMA_VERSION", "POLICY_SCHEMA_VERSION", "POLICY_COLUMNS", "POLICY_CERTIFICATES",
           "READABLE_SCHEMA_VERSIONS", "THRESHOLDS_FORMAT", "CERTIFICATES",
           "MAX_FILE_BYTES", "ThresholdFileError", "ThresholdTable", "WatchedThresholds", "canonical_sha256",
           "spec_sha256"]


class ThresholdFileError(ValueError):
    """The thresholds file is missing, unreadable, corrupt or violates the format."""


def canonical_sha256(obj: Any) -> str:
    """SHA-256 hex digest of the canonical JSON of ``obj`` (sorted keys, no spaces, ASCII)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def spec_sha256(spec_doc: Mapping[str, Any]) -> str:
    """Hash of a spec document, ignoring its free-form ``provenance`` (which does not change results)."""
    return canonical_sha256({k: v for k, v in spec_doc.items() if k != "provenance"})


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 8, 4, 40, 40
_REPR.maxlong = 40
SHORT_MAX = 160  # characters of a value quoted in an error message


def _short(x: Any) -> str:
    """A bounded repr for messages (a field may hold a huge or deeply nested value).

    The rule of :func:`tr_core.errors.short_repr`, restated because this reader is vendorable (standard
    library only)."""
    try:
        r = _REPR.repr(x)
    except Exception:  # noqa: BLE001 - a repr must never turn into a second error
        return f"<{type(x).__name__}>"
    # reprlib bounds the items and each string, not their sum (long keys at every level add up)
    return r if len(r) <= SHORT_MAX else r[:SHORT_MAX - 3] + "..."


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    """A finite JSON number that fits a double (a 400-digit integer does not)."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(float(x))
    except OverflowError:
        return False


def _parse_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):  # 1e400 parses as infinity
        raise ValueError(f"number {text[:40]} is out of range of a double")
    return x


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(f"key {_short(k)} appears twice in one object (which one counts is undefined)")
            seen.add(k)
    return d


def _read_bytes(p: str) -> bytes:
    """The file's bytes; only a regular file of at most MAX_FILE_BYTES is read (a FIFO or device would block
    or never end)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(p, flags)
    except FileNotFoundError:
        raise ThresholdFileError(f"thresholds file {p!r} does not exist") from None
    except OSError as e:
        raise ThresholdFileError(f"cannot read thresholds file {p!r}: {e.strerror or e}") from None
    except ValueError as e:  # e.g. an embedded NUL in the path
        raise ThresholdFileError(f"cannot read thresholds file {p!r}: {e}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ThresholdFileError(f"thresholds file {p!r} is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise ThresholdFileError(f"thresholds file {p!r} is not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise ThresholdFileError(f"thresholds file {p!r} has {st.st_size} bytes, more than the "
                                     f"{MAX_FILE_BYTES} a thresholds file can need (corrupt?)")
        chunks, total = [], 0
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
            total += len(b)
            if total > MAX_FILE_BYTES:
                raise ThresholdFileError(f"thresholds file {p!r} grew beyond {MAX_FILE_BYTES} bytes while read")
        return b"".join(chunks)
    except OSError as e:
        raise ThresholdFileError(f"cannot read thresholds file {p!r}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def _parse_json(data: bytes, p: str) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ThresholdFileError(f"thresholds file {p!r} is not UTF-8 text (corrupt?)") from None
    if not text.strip():
        raise ThresholdFileError(f"thresholds file {p!r} is empty")
    try:
        return json.loads(text, parse_float=_parse_float, parse_constant=_reject_constant,
                          object_pairs_hook=_no_duplicates)
    except _DuplicateKey as e:
        raise ThresholdFileError(f"thresholds file {p!r}: {e}") from None
    except json.JSONDecodeError as e:
        raise ThresholdFileError(f"thresholds file {p!r} is not valid JSON (corrupt or truncated?): {e}") from None
    except RecursionError:
        raise ThresholdFileError(f"thresholds file {p!r} is nested too deeply to be a thresholds file") from None
    except MemoryError:
        raise ThresholdFileError(f"thresholds file {p!r} is too large to parse") from None
    except ValueError as e:  # NaN/Infinity, 1e400, an integer of more than 4300 digits
        msg = str(e).split(":")[0] if "integer string conversion" in str(e) else str(e)
        raise ThresholdFileError(f"thresholds file {p!r} holds a value that is not a valid number: {msg}") from None


@dataclass(frozen=True)
class ThresholdTable:
    """Validated ``B*(N)`` table; build it with :meth:`load`, :meth:`from_dict` or :meth:`eager`."""

    num_models: int
    max_concurrency: int
    complete: bool
    thresholds: tuple  # thresholds[n - 1] = B*(n), a tuple of num_models ints (extrapolated rows included)
    fallback_thresholds: tuple
    predicted_tok_s: tuple = ()  # per computed row, when every computed row has it
    eager_tok_s: tuple = ()
    model_names: tuple | None = None
    delta_ms: float | None = None
    spec_sha256: str | None = None
    inputs_sha256: str | None = None
    source: str = "file"  # "file", "memory" or "fallback"
    path: str | None = None
    provenance: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    certificates: tuple = ()  # per row: one of CERTIFICATES, or None (schema_version 1 files)
    gaps: tuple = ()  # per row: relative gap of a certified row (0.0 when exact), None when unknown
    schema_version: int = THRESHOLDS_SCHEMA_VERSION
    # version 3: a state-dependent launch policy (empty / None for a plain threshold table)
    policy_class: str | None = None
    policy_columns: tuple = ()
    policy_rows: tuple = ()              # per row: per model, per column, an int or None (never)
    policy_certificates: tuple = ()      # per row: one of POLICY_CERTIFICATES
    policy_predicted_tok_s: tuple = ()   # per row: the exact chain's tok/s under the policy, or None
    policy_max_batch_size: tuple = ()    # per model: an int or None
    policy_step_ms: tuple = ()           # residual class: per model, per batch size 1..max_concurrency
    policy_step_ms_beside_running: tuple = ()

    # ---- the launch decision in a state (every version; a plain table ignores the other models) ----------
    def _row(self, active_requests: int) -> int:
        if not _is_int(active_requests):
            raise ValueError(f"active_requests must be an integer, got {_short(active_requests)}")
        if active_requests < 0:
            raise ValueError(f"active_requests must be >= 0, got {active_requests}")
        return min(max(active_requests, 1), len(self.thresholds)) - 1

    def _state(self, waiting: Any, residual_ms: Any) -> tuple:
        M = self.num_models
        if not isinstance(waiting, (list, tuple)) or len(waiting) != M or not all(
                _is_int(k) and k >= 0 for k in waiting):
            raise ValueError(f"waiting must be {M} integers >= 0 (requests queued per model), got {_short(waiting)}")
        if not isinstance(residual_ms, (list, tuple)) or len(residual_ms) != M or not all(
                _is_num(r) and r >= 0 for r in residual_ms):
            raise ValueError(f"residual_ms must be {M} finite numbers >= 0 (ms left in each model's running "
                             f"batch, 0 when idle), got {_short(residual_ms)}")
        return tuple(waiting), tuple(min(float(r), MAX_RESIDUAL_MS) for r in residual_ms)

    def _half_quantum(self) -> float:
        return 0.5 * self.delta_ms if self.delta_ms else 0.0

    def policy_of(self, active_requests: int) -> tuple:
        """The row's policy thresholds: per model, one value per ``policy_columns`` (None = never); a plain
        table gives its vector as the one column ``("any",)``."""
        n = self._row(active_requests)
        if self.policy_class is None:
            return tuple((b,) for b in self.thresholds[n])
        return self.policy_rows[n]

    def own_step_ms(self, model: int, waiting: int) -> float | None:
        """Model ``model``'s step length beside a running model for the batch it would take from ``waiting``
        requests (the ``residual`` class compares the others' residual time with it); None for other tables."""
        if not self.policy_step_ms_beside_running:
            return None
        cap = self.policy_max_batch_size[model]
        b = max(1, min(int(waiting), cap if cap is not None else waiting, len(self.policy_step_ms_beside_running[model])))
        return self.policy_step_ms_beside_running[model][b - 1]

    def _quanta(self, ms: float) -> int:
        """A time in ms on the chain's grid (nearest quantum, half to even; zero allowed for a residual).

        The project's rule lives in ``tr_core.quanta``; this file is vendored alone (standard library only), so
        it restates it, and tests/test_grid_rounding.py checks the two agree."""
        q = ms / self.delta_ms
        return int(round(q)) if q < 2.0 ** 62 else 2 ** 62   # saturates: every accepted input stays finite

    def _batches(self, running_batch: Any, residual_ms: tuple, half: float) -> tuple:
        M = self.num_models
        if running_batch is None:
            raise ValueError(f"policy class {self.policy_class!r} needs running_batch (the size of each model's "
                             f"running batch, 0 when idle)")
        if not isinstance(running_batch, (list, tuple)) or len(running_batch) != M or not all(
                _is_int(b) and b >= 0 for b in running_batch):
            raise ValueError(f"running_batch must be {M} integers >= 0 (requests in each model's running batch, "
                             f"0 when idle), got {_short(running_batch)}")
        return tuple(b if r > half else 0 for b, r in zip(running_batch, residual_ms))

    def _ratio_thresholds(self, n: int, waiting: tuple, residual_ms: tuple, running_batch: Any) -> tuple:
        """The ``ratio`` class: the models decide in turn, fastest step first (a batch of one alone; ties by
        index), a batch launched earlier in the turn counting as running (residual: its step, beside a running
        model when one runs).  Model j waits while, for some running batch of another model ending in ``t``
        quanta, ``t * waiting[j] <= W_j * A(t)``, ``A(t)`` the requests of the other models' running batches
        ending within ``t`` (``W_j = window_ms / delta_ms``).  Per model: its threshold, or None (waits)."""
        M = self.num_models
        half = self._half_quantum()
        R = [max(1, self._quanta(r)) if r > half else 0 for r in residual_ms]
        Bb = list(self._batches(running_batch, residual_ms, half))
        rows = self.policy_rows[n]
        order = sorted(range(M), key=lambda m: (self.policy_step_ms[m][0], m))
        out: list = [None] * M
        for j in order:
            B, W = rows[j][0], self._quanta(rows[j][1])
            k = waiting[j]
            wait = False
            for i in range(M):
                if i == j or R[i] <= 0:
                    continue
                t = R[i]
                arriving = sum(Bb[m] for m in range(M) if m != j and R[m] > 0 and R[m] <= t)
                if t * k <= W * arriving:
                    wait = True
                    break
            out[j] = None if wait else B
            if R[j] == 0 and not wait and k >= max(B, 1):
                cap = self.policy_max_batch_size[j]
                take = min(k, cap) if cap is not None else k
                beside = any(R[m] > 0 for m in range(M) if m != j)
                steps = (self.policy_step_ms_beside_running if beside else self.policy_step_ms)[j]
                R[j] = max(1, self._quanta(steps[max(1, min(take, len(steps))) - 1]))
                Bb[j] = take
        return tuple(out)

    def launch_threshold(self, active_requests: int, model: int, waiting: Any, residual_ms: Any,
                         running_batch: Any = None) -> int | None:
        """The threshold model ``model`` applies in this state (None: it does not launch in it).

        ``waiting[i]``: requests queued at model i; ``residual_ms[i]``: milliseconds left in model i's running
        batch, 0 when idle, read after the completions of this instant and before its launches (a model that
        launches at this very instant counts as idle).  A residual of at most half a ``delta_ms`` counts as
        idle (the chain's quanta).  ``running_batch[i]``: requests in model i's running batch (class ``ratio``
        only).  For a plain table: ``lookup(active_requests)[model]``.  For class ``ratio`` the decisions of
        the models that decide before ``model`` in the same instant (fastest first) are taken into account."""
        waiting, residual_ms = self._state(waiting, residual_ms)
        if not _is_int(model) or not 0 <= model < self.num_models:
            raise ValueError(f"model must be an integer in 0..{self.num_models - 1}, got {_short(model)}")
        n = self._row(active_requests)
        if self.policy_class is None:
            return self.thresholds[n][model]
        if self.policy_class == "ratio":
            return self._ratio_thresholds(n, waiting, residual_ms, running_batch)[model]
        cols = self.policy_rows[n][model]
        half = self._half_quantum()
        running = [r for i, r in enumerate(residual_ms) if i != model and r > half]
        if self.policy_class == "window":
            if running and max(1, self._quanta(min(running))) <= self._quanta(cols[1]):
                return None
            return cols[0]
        if not running:
            return cols[0]
        if self.policy_class == "busy":
            return cols[1]
        own = self.own_step_ms(model, waiting[model])
        return cols[2] if min(running) <= own - half else cols[1]

    def decide(self, active_requests: int, waiting: Any, residual_ms: Any, running_batch: Any = None) -> tuple:
        """Per model, whether it launches now: idle (residual at most half a quantum), ``waiting >= 1`` and
        ``waiting >=`` its :meth:`launch_threshold` in this state (``running_batch``: class ``ratio`` only)."""
        waiting, residual_ms = self._state(waiting, residual_ms)
        half = self._half_quantum()
        if self.policy_class == "ratio":
            thr = self._ratio_thresholds(self._row(active_requests), waiting, residual_ms, running_batch)
        out = []
        for j in range(self.num_models):
            if residual_ms[j] > half or waiting[j] < 1:
                out.append(False)
                continue
            b = thr[j] if self.policy_class == "ratio" else self.launch_threshold(active_requests, j, waiting,
                                                                                   residual_ms)
            out.append(b is not None and waiting[j] >= b)
        return tuple(out)

    @property
    def covered_concurrency(self) -> int:
        """Largest N with a computed row (``K``); rows above are extrapolated or absent."""
        if self.certificates:
            return sum(1 for c in self.certificates if c != "extrapolated")
        return len(self.thresholds)

    def certificate(self, active_requests: int) -> str | None:
        """How the row used by ``lookup(active_requests)`` was obtained (None: unknown, or the fallback)."""
        if not self.certificates:
            return None
        n = min(max(int(active_requests), 1), len(self.certificates))
        return self.certificates[n - 1]

    def lookup(self, active_requests: int) -> tuple:
        """Threshold vector for ``active_requests`` requests active in the whole system."""
        if not _is_int(active_requests):
            raise ValueError(f"active_requests must be an integer, got {_short(active_requests)}")
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
            raise ValueError(f"num_models must be an integer >= 1, got {_short(num_models)}")
        if not _is_int(max_concurrency) or not 1 <= max_concurrency <= MAX_CONCURRENCY_LIMIT:
            raise ValueError(f"max_concurrency must be an integer in 1..{MAX_CONCURRENCY_LIMIT}, "
                             f"got {_short(max_concurrency)}")
        ones = (1,) * num_models
        return cls(num_models=num_models, max_concurrency=max_concurrency, complete=True,
                   thresholds=(ones,) * max_concurrency, fallback_thresholds=ones, source="fallback")

    @classmethod
    def load(cls, path: str | os.PathLike, *, require_concurrency: int | None = None) -> "ThresholdTable":
        """Read and validate a thresholds file; raises :class:`ThresholdFileError` only.

        ``require_concurrency``: fail unless the file has computed rows for
        N = 1..require_concurrency (use it when the server must not run on a
        partial table).
        """
        return cls.load_with_document(path, require_concurrency=require_concurrency)[0]

    @classmethod
    def load_with_document(cls, path: str | os.PathLike, *,
                           require_concurrency: int | None = None) -> "tuple[ThresholdTable, Any]":
        """:meth:`load`, also returning the parsed JSON document the table was validated from (one read of the
        file: another process replacing it meanwhile cannot make the two disagree)."""
        p = os.fspath(path)
        doc = _parse_json(_read_bytes(p), p)
        table = cls.from_dict(doc, where=f"thresholds file {p!r}", path=p, require_concurrency=require_concurrency)
        return table, doc

    @classmethod
    def from_dict(cls, doc: Any, *, where: str = "thresholds", path: str | None = None,
                  require_concurrency: int | None = None) -> "ThresholdTable":
        """Validate a parsed thresholds document (see the module docstring); raises ThresholdFileError only."""
        if require_concurrency is not None and (not _is_int(require_concurrency) or require_concurrency < 1):
            raise ValueError(f"require_concurrency must be an integer >= 1, got {_short(require_concurrency)}")
        try:
            return cls._validate(doc, where, path, require_concurrency)
        except ThresholdFileError:
            raise
        except RecursionError:
            raise ThresholdFileError(f"{where}: nested too deeply to be a thresholds document") from None
        except Exception as e:  # noqa: BLE001 - the contract: a bad document is a ThresholdFileError
            raise ThresholdFileError(f"{where}: unreadable document (unexpected {type(e).__name__}: "
                                     f"{_short(str(e))})") from None

    @classmethod
    def _validate(cls, doc: Any, where: str, path: str | None, require_concurrency: int | None):
        def fail(msg: str) -> ThresholdFileError:
            return ThresholdFileError(f"{where}: {msg}")

        if not isinstance(doc, dict):
            raise fail("the document must be a JSON object")
        if "schema_version" not in doc:
            raise fail("missing field 'schema_version'")
        ver = doc["schema_version"]
        if not _is_int(ver) or ver not in READABLE_SCHEMA_VERSIONS:
            newer = _is_int(ver) and ver > max(READABLE_SCHEMA_VERSIONS)
            raise fail(f"unsupported schema_version {_short(ver)} (this reader supports "
                       f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))})"
                       + (f"; the file was written by a newer tool: {UPGRADE_HINT}" if newer else ""))
        extra = sorted(set(doc) - TOP_LEVEL_FIELDS)
        if extra:
            raise fail(f"unknown field {_short(extra[0])} (a thresholds file has only "
                       f"{', '.join(sorted(TOP_LEVEL_FIELDS))})")
        fmt = doc.get("format", THRESHOLDS_FORMAT)
        if not isinstance(fmt, str) or fmt != THRESHOLDS_FORMAT:
            raise fail(f"'format' must be {THRESHOLDS_FORMAT!r}, got {_short(fmt)}")
        for key in ("num_models", "max_concurrency", "complete", "entries", "fallback_thresholds"):
            if key not in doc:
                raise fail(f"missing field {key!r}")
        M = doc["num_models"]
        if not _is_int(M) or not 1 <= M <= MAX_MODELS:
            raise fail(f"'num_models' must be an integer in 1..{MAX_MODELS}, got {_short(M)}")
        nmax = doc["max_concurrency"]
        if not _is_int(nmax) or not 1 <= nmax <= MAX_CONCURRENCY_LIMIT:
            raise fail(f"'max_concurrency' must be an integer in 1..{MAX_CONCURRENCY_LIMIT}, got {_short(nmax)}")
        complete = doc["complete"]
        if not isinstance(complete, bool):
            raise fail(f"'complete' must be true or false, got {_short(complete)}")

        def vector(v: Any, name: str, n: int | None) -> tuple:
            if not isinstance(v, list):
                raise fail(f"{name} must be a list of {M} integers, got {_short(v)}")
            if len(v) != M:
                raise fail(f"{name} has {len(v)} entries, expected num_models = {M}")
            for i, b in enumerate(v):
                if not _is_int(b) or b < 1:
                    raise fail(f"{name}[{i}] must be an integer >= 1, got {_short(b)}")
            if n is not None:
                extra = sum(b - 1 for b in v)
                if extra >= n:
                    raise fail(f"{name} = {_short(v)} is infeasible for N = {n}: sum(B_i - 1) = "
                               f"{_short(extra)} must be < N (it could deadlock)")
            return tuple(v)

        def number(e: dict, key: str, name: str, *, nullable: bool, minimum: float = 0.0) -> float | None:
            v = e.get(key)
            if v is None:
                if key in e and not nullable:
                    raise fail(f"{name}.{key} must be a finite number >= {minimum:g}, got null")
                return None
            if not _is_num(v) or not minimum <= v <= MAX_TOK_S:
                raise fail(f"{name}.{key} must be a finite number in [{minimum:g}, {MAX_TOK_S:g}], got {_short(v)}")
            return float(v)

        fallback = vector(doc["fallback_thresholds"], "'fallback_thresholds'", None)
        if sum(b - 1 for b in fallback) >= 1:
            raise fail(f"'fallback_thresholds' = {list(fallback)} is infeasible: the fallback applies at any N, "
                       f"N = 1 included, where sum(B_i - 1) must be 0 (all ones, the eager vector)")
        pol = _policy_header(doc, M, nmax, fail) if ver >= 3 else None
        entries = doc["entries"]
        if not isinstance(entries, list):
            raise fail(f"'entries' must be a list, got {_short(entries)}")
        if not entries:
            raise fail("'entries' is empty: the table covers no N (need at least N = 1)")
        if len(entries) > nmax:
            raise fail(f"'entries' has {len(entries)} rows but max_concurrency is {nmax}")
        ths, pred, eag, certs, gaps = [], [], [], [], []
        prows, pcerts, ppred = [], [], []
        first_extrapolated = None
        for k, e in enumerate(entries):
            name = f"entries[{k}]"
            if not isinstance(e, dict):
                raise fail(f"{name} must be an object, got {_short(e)}")
            unknown = sorted(set(e) - ENTRY_FIELDS)
            if unknown:
                raise fail(f"{name} has unknown field {_short(unknown[0])}")
            _row_types(e, name, fail)
            for key in ("active_requests", "thresholds"):
                if key not in e:
                    raise fail(f"{name} is missing field {key!r}")
            n = e["active_requests"]
            if not _is_int(n) or n != k + 1:
                raise fail(f"{name}.active_requests must be {k + 1} (entries cover N = 1, 2, ... without gaps), "
                           f"got {_short(n)}")
            ths.append(vector(e["thresholds"], f"{name}.thresholds", n))
            cert = None
            if ver >= 2:
                if "certificate" not in e:
                    raise fail(f"{name} is missing field 'certificate'")
                cert = e["certificate"]
                if not isinstance(cert, str) or cert not in CERTIFICATES:
                    raise fail(f"{name}.certificate must be one of {', '.join(CERTIFICATES)}, got {_short(cert)}")
            certs.append(cert)
            if cert == "extrapolated":
                if first_extrapolated is None:
                    first_extrapolated = k
                src = e.get("extrapolated_from")
                if src is None:
                    expect = (1,) * M
                elif not _is_int(src) or not 1 <= src <= first_extrapolated:
                    raise fail(f"{name}.extrapolated_from must be a computed row's N in 1..{first_extrapolated} "
                               f"or null, got {_short(src)}")
                else:
                    expect = ths[src - 1]
                if ths[-1] != expect:
                    raise fail(f"{name}.thresholds = {list(ths[-1])} is not the vector of the row it is "
                               f"extrapolated from ({list(expect)})")
                gaps.append(None)
                if pol is not None:
                    _policy_row(e, name, n, ths[-1], cert, pol, prows, pcerts, ppred, fail)
                continue
            if first_extrapolated is not None:
                raise fail(f"{name} is computed but follows the extrapolated row entries[{first_extrapolated}] "
                           f"(extrapolated rows must come last)")
            for key, acc in (("predicted_tok_s", pred), ("eager_tok_s", eag)):
                v = number(e, key, name, nullable=False)
                if v is not None:
                    acc.append(v)
            gap = None
            if ver >= 2:
                up = number(e, "upper_bound_tok_s", name, nullable=True)
                gap = number(e, "gap", name, nullable=True)
                if gap is not None and gap > 1:
                    raise fail(f"{name}.gap must be in [0, 1] (a relative gap to an upper bound), got {gap:g}")
                if cert in ("exhaustive", "pruned-exact") and gap is None:
                    gap = 0.0
                if cert == "certified" and gap is None:
                    raise fail(f"{name} is certified but has no 'gap'")
                if (cert in ("exhaustive", "pruned-exact") and e.get("eager_tok_s") is not None
                        and e.get("predicted_tok_s") is not None
                        and float(e["predicted_tok_s"]) < float(e["eager_tok_s"]) * (1 - 1e-9)):
                    raise fail(f"{name}.predicted_tok_s = {float(e['predicted_tok_s']):g} is below eager_tok_s = "
                               f"{float(e['eager_tok_s']):g}, impossible for an exact ({cert}) row: the eager "
                               f"vector is one of the vectors searched")
                if up is not None and "predicted_tok_s" in e and up < float(e["predicted_tok_s"]) * (1 - 1e-9):
                    raise fail(f"{name}.upper_bound_tok_s = {up:g} is below predicted_tok_s = "
                               f"{float(e['predicted_tok_s']):g}")
            gaps.append(gap)
            if pol is not None:
                _policy_row(e, name, n, ths[-1], cert, pol, prows, pcerts, ppred, fail)
        computed = len(ths) if first_extrapolated is None else first_extrapolated
        if complete and (len(ths) != nmax or computed != len(ths)):
            raise fail(f"'complete' is true but the computed rows cover N = 1..{computed}, not 1..{nmax} "
                       f"(max_concurrency)")
        if require_concurrency is not None and computed < require_concurrency:
            raise fail(f"the table covers N = 1..{computed} but N = 1..{require_concurrency} was required "
                       f"(complete = {str(complete).lower()})")
        names = doc.get("model_names")
        if names is not None:
            if not isinstance(names, list) or len(names) != M or not all(isinstance(s, str) for s in names):
                raise fail(f"'model_names' must be a list of {M} strings, got {_short(names)}")
            names = tuple(names)
        delta = doc.get("delta_ms")
        if delta is not None and (not _is_num(delta) or not DELTA_MS_RANGE[0] <= delta <= DELTA_MS_RANGE[1]):
            raise fail(f"'delta_ms' must be a number in [{DELTA_MS_RANGE[0]:g}, {DELTA_MS_RANGE[1]:g}] ms, "
                       f"got {_short(delta)}")
        digest = doc.get("spec_sha256")
        if digest is not None and not isinstance(digest, str):
            raise fail(f"'spec_sha256' must be a string, got {_short(digest)}")
        if "spec" in doc:
            if not isinstance(doc["spec"], dict):
                raise fail(f"'spec' must be an object, got {_short(doc['spec'])}")
            if digest is None:
                raise fail("'spec' is present but 'spec_sha256' is missing")
            try:
                actual = spec_sha256(doc["spec"])
            except ValueError:
                raise fail("'spec' holds a value JSON cannot represent (NaN or infinity)") from None
            if actual != digest:
                raise fail("'spec_sha256' does not match the embedded 'spec' (edited or corrupt file)")
            _check_spec_agrees(doc, M, fail)
        prov = doc.get("provenance", {})
        if not isinstance(prov, dict):
            raise fail(f"'provenance' must be an object, got {_short(prov)}")
        inputs = prov.get("inputs_sha256")
        return cls(num_models=M, max_concurrency=nmax, complete=complete, thresholds=tuple(ths),
                   fallback_thresholds=fallback,
                   predicted_tok_s=tuple(pred) if len(pred) == computed else (),
                   eager_tok_s=tuple(eag) if len(eag) == computed else (),
                   model_names=names, delta_ms=None if delta is None else float(delta), spec_sha256=digest,
                   inputs_sha256=inputs if isinstance(inputs, str) else None,
                   source="file" if path is not None else "memory", path=path, provenance=prov,
                   certificates=tuple(certs) if ver >= 2 else (), gaps=tuple(gaps) if ver >= 2 else (),
                   schema_version=ver, **({} if pol is None else dict(
                       policy_class=pol["class"], policy_columns=pol["columns"], policy_rows=tuple(prows),
                       policy_certificates=tuple(pcerts), policy_predicted_tok_s=tuple(ppred),
                       policy_max_batch_size=pol["max_batch_size"], policy_step_ms=pol.get("step_ms", ()),
                       policy_step_ms_beside_running=pol.get("step_ms_beside_running", ()))))


_ROW_TYPES = {"states": "int", "evaluated": "int", "pruned": "int", "seconds": "num", "policy_seconds": "num",
              "residual": "num?", "gain_vs_eager": "num?", "solver": "str?"}


def _row_types(e: Mapping[str, Any], name: str, fail) -> None:
    """The informational row fields the reader does not use still have one type each (no type mixes)."""
    for key, kind in _ROW_TYPES.items():
        if key not in e:
            continue
        v = e[key]
        if kind.endswith("?") and v is None:
            continue
        ok = {"int": lambda x: _is_int(x) and 0 <= x < 2 ** 63, "num": lambda x: _is_num(x) and x >= 0,
              "num?": _is_num, "str?": lambda x: isinstance(x, str)}[kind](v)
        if not ok:
            want = {"int": "an integer >= 0", "num": "a finite number >= 0", "num?": "a finite number or null",
                    "str?": "a string or null"}[kind]
            raise fail(f"{name}.{key} must be {want}, got {_short(v)}")


def _policy_header(doc: Mapping[str, Any], M: int, nmax: int, fail) -> dict:
    """The top-level ``policy`` object of a version-3 file, validated."""
    if "policy" not in doc:
        raise fail("schema_version 3 needs the field 'policy' (the launch policy class)")
    pol = doc["policy"]
    if not isinstance(pol, dict):
        raise fail(f"'policy' must be an object, got {_short(pol)}")
    cls = pol.get("class")
    if not isinstance(cls, str):
        raise fail(f"'policy.class' must be a string naming the policy class, got {_short(cls)}")
    if cls not in POLICY_COLUMNS:
        raise fail(f"'policy.class' {_short(cls)} is not a class this reader knows ({', '.join(POLICY_COLUMNS)}): "
                   f"{UPGRADE_HINT}")
    cols = POLICY_COLUMNS[cls]
    if pol.get("columns") != list(cols):
        raise fail(f"'policy.columns' must be {list(cols)} for class {cls!r}, got {_short(pol.get('columns'))}")
    caps = pol.get("max_batch_size")
    if (not isinstance(caps, list) or len(caps) != M
            or not all(c is None or (_is_int(c) and 1 <= c <= MAX_CONCURRENCY_LIMIT) for c in caps)):
        raise fail(f"'policy.max_batch_size' must be a list of {M} integers >= 1 or null (no cap), got {_short(caps)}")
    out = {"class": cls, "columns": cols, "max_batch_size": tuple(caps)}
    if cls != "busy":
        delta = doc.get("delta_ms")
        if not _is_num(delta) or not DELTA_MS_RANGE[0] <= delta <= DELTA_MS_RANGE[1]:
            raise fail(f"policy class {cls!r} needs 'delta_ms' in [{DELTA_MS_RANGE[0]:g}, {DELTA_MS_RANGE[1]:g}] ms "
                       f"(the residual times are compared on its grid)")
    if cls in STEP_CLASSES:
        for key in ("step_ms", "step_ms_beside_running"):
            v = pol.get(key)
            if not isinstance(v, list) or len(v) != M:
                raise fail(f"'policy.{key}' must be a list of {M} lists (one per model) of {nmax} step lengths "
                           f"in ms (batch sizes 1..max_concurrency), got {_short(v)}")
            rows = []
            for i, row in enumerate(v):
                if not isinstance(row, list) or len(row) != nmax:
                    raise fail(f"'policy.{key}[{i}]' must be a list of {nmax} step lengths in ms (batch sizes "
                               f"1..max_concurrency), got {_short(row)}")
                for b, x in enumerate(row):
                    if not _is_num(x) or not 0 < x <= MAX_STEP_MS:
                        raise fail(f"'policy.{key}[{i}][{b}]' must be a number in (0, {MAX_STEP_MS:g}] ms, "
                                   f"got {_short(x)}")
                rows.append(tuple(float(x) for x in row))
            out[key] = tuple(rows)
    else:
        for key in ("step_ms", "step_ms_beside_running"):
            if key in pol:
                raise fail(f"'policy.{key}' belongs to classes {' and '.join(STEP_CLASSES)}, not {cls!r}")
    extra = set(pol) - {"class", "columns", "max_batch_size", "step_ms", "step_ms_beside_running"}
    if extra:
        raise fail(f"'policy' has unknown field(s) {sorted(extra)}")
    return out


def _policy_row(e: Mapping[str, Any], name: str, n: int, B: tuple, cert: str | None, pol: dict, prows: list,
                pcerts: list, ppred: list, fail) -> None:
    """One row's ``policy_thresholds`` / ``policy_certificate`` / ``policy_predicted_tok_s``, validated."""
    cols = pol["columns"]
    M = len(B)
    v = e.get("policy_thresholds")
    if "policy_thresholds" not in e:
        raise fail(f"{name} is missing field 'policy_thresholds' (schema_version 3)")
    if not isinstance(v, list) or len(v) != M:
        raise fail(f"{name}.policy_thresholds must be a list of {M} lists (one per model), got {_short(v)}")
    row = []
    for j, r in enumerate(v):
        if not isinstance(r, list) or len(r) != len(cols):
            raise fail(f"{name}.policy_thresholds[{j}] must have {len(cols)} entries ({', '.join(cols)}), "
                       f"got {_short(r)}")
        for c, b in enumerate(r):
            if c > 0 and pol["class"] in WINDOW_CLASSES:
                if not _is_num(b) or not 0 <= b <= MAX_WINDOW_MS:
                    raise fail(f"{name}.policy_thresholds[{j}][{c}] ({cols[c]}) must be a number in "
                               f"[0, {MAX_WINDOW_MS:g}] ms, got {_short(b)}")
                continue
            if b is None and c > 0:
                continue
            if not _is_int(b) or not 1 <= b <= n:
                raise fail(f"{name}.policy_thresholds[{j}][{c}] ({cols[c]}) must be an integer in 1..{n} (N)"
                           + (" or null (never)" if c > 0 else "") + f", got {_short(b)}")
        row.append(tuple(float(b) if c > 0 and pol["class"] in WINDOW_CLASSES else b for c, b in enumerate(r)))
    extra = sum(r[0] - 1 for r in row)
    if extra >= n:
        raise fail(f"{name}.policy_thresholds: the {cols[0]} thresholds {[r[0] for r in row]} are infeasible for "
                   f"N = {n}: sum(B_i - 1) = {extra} must be < N (with every model idle nobody would launch)")
    pc = e.get("policy_certificate")
    if not isinstance(pc, str) or pc not in POLICY_CERTIFICATES:
        raise fail(f"{name}.policy_certificate must be one of {', '.join(POLICY_CERTIFICATES)}, got {_short(pc)}")
    if cert == "extrapolated" and pc != "thresholds":
        raise fail(f"{name} is extrapolated: its policy_certificate must be 'thresholds' (its policy is its "
                   f"threshold vector), got {_short(pc)}")
    if pc == "thresholds" and pol["class"] in WINDOW_CLASSES:
        if any(r[0] != B[j] or r[1] != 0 for j, r in enumerate(row)):
            raise fail(f"{name}.policy_thresholds = {_short(v)} must be [thresholds[j], 0] per model, thresholds = "
                       f"{list(B)} (policy_certificate 'thresholds': the threshold rule, no window)")
    elif pc == "thresholds" and any(any(b != B[j] for b in r) for j, r in enumerate(row)):
        raise fail(f"{name}.policy_thresholds = {_short(v)} must repeat thresholds = {list(B)} in every column "
                   f"(policy_certificate 'thresholds')")
    pp = e.get("policy_predicted_tok_s")
    if pp is not None and (not _is_num(pp) or not 0 <= pp <= MAX_TOK_S):
        raise fail(f"{name}.policy_predicted_tok_s must be a number in [0, {MAX_TOK_S:g}], got {_short(pp)}")
    if pc == "local":
        if pp is None:
            raise fail(f"{name} has policy_certificate 'local' but no 'policy_predicted_tok_s'")
        base = e.get("predicted_tok_s")
        if _is_num(base) and pp < float(base) * (1 - 1e-9):
            raise fail(f"{name}.policy_predicted_tok_s = {float(pp):g} is below predicted_tok_s = {float(base):g}: "
                       f"the search starts from B*, so its policy cannot be worse")
    prows.append(tuple(row))
    pcerts.append(pc)
    ppred.append(None if pp is None else float(pp))


def _check_spec_agrees(doc: Mapping[str, Any], M: int, fail) -> None:
    """The file's own fields agree with its embedded spec: model count, model names, time quantum."""
    spec = doc["spec"]
    for key in ("step_latency_ms", "routing_matrix", "committed_tokens", "model_names", "max_batch_size"):
        v = spec.get(key)
        if isinstance(v, list) and len(v) != M:
            raise fail(f"'num_models' = {M} disagrees with the embedded spec, whose {key!r} has {len(v)} models")
    names, spec_names = doc.get("model_names"), spec.get("model_names")
    if isinstance(names, list) and isinstance(spec_names, list) and names != spec_names:
        raise fail(f"'model_names' = {_short(names)} disagrees with the embedded spec's {_short(spec_names)}")
    delta, spec_delta = doc.get("delta_ms"), spec.get("delta_ms")
    if _is_num(delta) and _is_num(spec_delta) and not math.isclose(float(delta), float(spec_delta), rel_tol=1e-9):
        raise fail(f"'delta_ms' = {delta:g} disagrees with the embedded spec's delta_ms = {spec_delta:g}")


class WatchedThresholds:
    """A thresholds file that is re-read when it is replaced (e.g. by a background tuner).

    ``lookup`` checks the file's modification time at most every
    ``check_interval_s`` seconds and reloads it when it changed.  The first
    load must succeed (a missing or invalid file raises ThresholdFileError); a
    later replacement that cannot be read, whatever it holds, keeps the
    previous table and is reported in ``last_error``: ``lookup`` and
    ``refresh`` never raise for a file problem.  Other attributes
    (``complete``, ``covered_concurrency``, ``certificate(n)``...) are the
    current table's.
    """

    def __init__(self, path: str | os.PathLike, check_interval_s: float = 1.0, *, accept=None, on_error=None):
        self.path = os.fspath(path)
        self.check_interval_s = float(check_interval_s)
        self.accept, self.on_error = accept, on_error
        self.reloads = 0
        self.refused_reloads = 0
        stamp = self._stat()  # before the read: a replacement during it is seen at the next check
        table, doc = ThresholdTable.load_with_document(self.path)
        why = accept(table) if accept is not None else None
        if why:
            raise ThresholdFileError(f"thresholds file {self.path!r}: {why}")
        self.table = table
        # the embedded spec of the first load (one read of the file: the table and its spec agree)
        self.spec_document = doc.get("spec") if isinstance(doc, dict) else None
        self.last_error: str | None = None
        self._stamp = stamp
        self._checked = time.monotonic()

    def __getattr__(self, name: str):
        if name == "table":  # not yet set: __init__ failed
            raise AttributeError(name)
        return getattr(self.table, name)

    def _stat(self):
        try:
            st = os.stat(self.path)
            return (st.st_mtime_ns, st.st_size, st.st_ino)
        except (OSError, ValueError):
            return None

    def refresh(self) -> bool:
        """Reload now if the file changed; True when a new table was loaded."""
        self._checked = time.monotonic()
        stamp = self._stat()
        if stamp is None or stamp == self._stamp:
            return False
        try:
            table = ThresholdTable.load(self.path)
            why = self.accept(table) if self.accept is not None else None
            if why:
                raise ThresholdFileError(f"thresholds file {self.path!r}: {why}")
        except Exception as e:  # noqa: BLE001 - a running server keeps its last good table
            self.last_error = str(e) if isinstance(e, ThresholdFileError) else f"{type(e).__name__}: {_short(e)}"
            self._stamp = stamp
            self.refused_reloads += 1
            if self.on_error is not None:
                try:
                    self.on_error(self.last_error)
                except Exception:  # noqa: BLE001 - a logging failure must not stop the server
                    pass
            return False
        self.table = table
        self.reloads += 1
        self._stamp = stamp
        self.last_error = None
        return True

    def _maybe_refresh(self) -> None:
        if time.monotonic() - self._checked >= self.check_interval_s:
            self.refresh()

    def lookup(self, active_requests: int) -> tuple:
        self._maybe_refresh()
        return self.table.lookup(active_requests)

    def launch_threshold(self, active_requests: int, model: int, waiting: Any, residual_ms: Any,
                         running_batch: Any = None) -> int | None:
        self._maybe_refresh()
        return self.table.launch_threshold(active_requests, model, waiting, residual_ms, running_batch)

    def decide(self, active_requests: int, waiting: Any, residual_ms: Any, running_batch: Any = None) -> tuple:
        self._maybe_refresh()
        return self.table.decide(active_requests, waiting, residual_ms, running_batch)
