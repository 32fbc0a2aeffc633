"""System specs of token-level routed serving, their validation and JSON form.

A system has M cooperating models (model 0 is the entry model).  After one
decoding step on model i a request moves to model j with probability
``P[i][j]`` and commits ``C[i][j]`` output tokens.  One decoding step of a batch
of b requests on model i lasts ``L_i(b)`` milliseconds; the paper's model has
``L_i(b) = L_i`` for every b, and the extensions allow a table over batch sizes
(linearly interpolated, flat beyond its ends) or an affine law ``a_i + c_i b``.
Time is discretised in quanta of ``delta`` ms: ``d_i(b) = L_i(b) / delta`` must
be an integer (within a relative 1e-9), otherwise the spec is rejected with the
rounding it would need, or rounded on request with the relative error reported.

A model may also cap its batch size (``max_batch_size``): a launch then takes at
most that many waiting requests and the rest keep waiting.

The JSON form (``schema_version`` 1) is::

    {"schema_version": 1, "name": "r2r", "model_names": ["small", "large"],
     "step_latency_ms": [6.0, 27.9],
     "routing_matrix": [[0.65, 0.35], [1.0, 0.0]],
     "committed_tokens": [[1, 0], [1, 0]],
     "delta_ms": 0.1,
     "latency_curves": [null, {"batch_size": [1, 8, 32],
                               "step_latency_ms": [27.9, 29.0, 33.5]}],
     "max_batch_size": [null, 64],
     "provenance": {...}}

``latency_curves`` entries are ``null`` (constant ``step_latency_ms[i]``), a
table ``{"batch_size": [...], "step_latency_ms": [...]}`` or an affine law
``{"intercept_ms": a, "per_request_ms": c}``.  ``provenance`` is free-form
(profiler intervals, sources) and is carried through untouched.

``corun_latency`` (optional, one entry per model) is the step latency of a batch that runs while at
least one other model is busy (co-located on the same GPUs): ``null`` (no slowdown, ``Lco_i(b) =
L_i(b)``), ``{"slowdown": F}`` with a finite ``F >= 1`` (``Lco_i(b) = F L_i(b)``) or a table
``{"batch_size": [...], "step_latency_ms": [...]}`` interpolated like ``latency_curves``.  A table
below the solo latency is allowed (:meth:`SystemSpec.corun_warnings` says where).  The chain's law:
a batch's duration is fixed at its launch, co-running when another model is busy then (see
docs/model.md, "Co-running").
"""

from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from tr_core import quanta as _Q
from tr_core.errors import SpecError
from tr_core.fileio import atomic_write, read_json
# the grid rule has one home (tr_core.quanta); its constants stay importable from here
from tr_core.quanta import GRID_TOL, MAX_QUANTA  # noqa: F401
from tr_core.units import finite_number

SPEC_SCHEMA_VERSION = 1
DEFAULT_DELTA_MS = 0.1  # the time quantum when none is given (specs, presets, the CLIs, sensitivity sweeps)
PROB_TOL = 1e-9

__all__ = [
    "SPEC_SCHEMA_VERSION",
    "LatencyCurve",
    "CorunLatency",
    "SystemSpec",
    "make_spec",
    "preset",
    "PRESETS",
    "load_spec",
    "save_spec",
    "spec_from_dict",
    "spec_to_dict",
    "write_json_atomic",
]


# Bounds that keep every derived quantity finite and representable: durations in quanta are int64 in the
# chain (and a chain with more than 2**31 quanta per step could never be solved); a step shorter than a
# nanosecond or committing more than 1e9 tokens would turn throughputs into overflowing numbers.
MIN_MS = 1e-6
MAX_MS = 1e9
MAX_TOKENS_PER_STEP = 1e9
MAX_DEPTH = 32


def _show(x: Any) -> str:
    """A short description of a JSON value for an error message."""
    if isinstance(x, str):
        return f"the string {x[:40]!r}" + ("..." if len(x) > 40 else "")
    if isinstance(x, bool) or x is None:
        return json.dumps(x)
    if isinstance(x, Mapping):
        return "an object"
    if isinstance(x, (list, tuple)):
        return "a list"
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


def _is_number(x: Any) -> bool:
    import numbers
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _json_number(x: Any, where: str) -> float:
    """A JSON number (not a string, not a boolean), finite as a float."""
    if not _is_number(x):
        raise SpecError(f"{where} must be a number, got {_show(x)}")
    return finite_number(x, error=SpecError, unreadable=f"{where} = {_show(x)} is too large",  # a huge int
                         not_finite=f"{where} must be finite, got {x!r}", catch=(OverflowError,))


def _json_int(x: Any, where: str) -> int:
    v = _json_number(x, where)
    if v != int(v):
        raise SpecError(f"{where} must be an integer, got {x!r}")
    return int(x) if isinstance(x, int) else int(v)


def _json_list(x: Any, where: str, n: int | None = None) -> list:
    if not isinstance(x, list):
        raise SpecError(f"{where} must be a list, got {_show(x)}")
    if n is not None and len(x) != n:
        raise SpecError(f"{where} must have M = {n} entries (one per model), got {len(x)}")
    return x


def _depth(x: Any) -> int:
    """Nesting depth of a JSON value, without recursion."""
    best, stack = 0, [(x, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, Mapping):
            best = max(best, d)
            stack.extend((w, d + 1) for w in v.values())
        elif isinstance(v, (list, tuple)):
            best = max(best, d)
            stack.extend((w, d + 1) for w in v)
    return best


def _finite(x: float, what: str) -> float:
    return finite_number(x, error=SpecError, unreadable=f"{what} must be a number, got {x!r}",
                         not_finite=f"{what} must be finite, got {x!r}")


@dataclass(frozen=True)
class LatencyCurve:
    """Step latency of one model as a function of batch size.

    ``kind='table'``: ``batch_size`` (strictly increasing, >= 1) and
    ``step_latency_ms`` (> 0) at those sizes, linear in between, flat outside.
    ``kind='affine'``: ``intercept_ms + per_request_ms * b``.
    """

    kind: str
    batch_size: tuple[int, ...] = ()
    step_latency_ms: tuple[float, ...] = ()
    intercept_ms: float = 0.0
    per_request_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.kind == "table":
            bs, ls = self.batch_size, self.step_latency_ms
            if len(bs) == 0 or len(bs) != len(ls):
                raise SpecError("latency table: 'batch_size' and 'step_latency_ms' must be non-empty and of equal length")
            if any(int(b) != b or b < 1 for b in bs):
                raise SpecError("latency table: 'batch_size' entries must be integers >= 1")
            if any(b2 <= b1 for b1, b2 in zip(bs, bs[1:])):
                raise SpecError("latency table: 'batch_size' must be strictly increasing")
            if any((not math.isfinite(v)) or v <= 0 for v in ls):
                raise SpecError("latency table: 'step_latency_ms' entries must be > 0")
        elif self.kind == "affine":
            if not (math.isfinite(self.intercept_ms) and math.isfinite(self.per_request_ms)):
                raise SpecError("affine latency: 'intercept_ms' and 'per_request_ms' must be finite")
            if self.intercept_ms + self.per_request_ms <= 0 or self.per_request_ms < 0 and self.intercept_ms <= 0:
                raise SpecError("affine latency: L(1) = intercept_ms + per_request_ms must be > 0")
        else:
            raise SpecError(f"latency curve kind must be 'table' or 'affine', got {self.kind!r}")

    def latency_ms(self, b: int) -> float:
        """Step latency in ms of a batch of ``b >= 1`` requests."""
        if self.kind == "affine":
            return self.intercept_ms + self.per_request_ms * b
        return float(np.interp(b, self.batch_size, self.step_latency_ms))

    def to_dict(self) -> dict:
        if self.kind == "affine":
            return {"intercept_ms": self.intercept_ms, "per_request_ms": self.per_request_ms}
        return {"batch_size": list(self.batch_size), "step_latency_ms": list(self.step_latency_ms)}

    @staticmethod
    def from_dict(d: Mapping[str, Any], where: str) -> "LatencyCurve":
        if not isinstance(d, Mapping):
            raise SpecError(f"{where} must be an object, null, or absent, got {_show(d)}")
        if "batch_size" in d or "step_latency_ms" in d:
            for key in ("batch_size", "step_latency_ms"):
                if key not in d:
                    raise SpecError(f"{where} is missing field {key!r}")
            extra = sorted(set(d) - {"batch_size", "step_latency_ms"})
            if extra:
                raise SpecError(f"{where}: unknown field(s) {', '.join(map(str, extra))}")
            bs = tuple(_json_int(b, f"{where}.batch_size[{k}]") for k, b in enumerate(_json_list(d["batch_size"], f"{where}.batch_size")))
            ls = tuple(_json_number(v, f"{where}.step_latency_ms[{k}]")
                       for k, v in enumerate(_json_list(d["step_latency_ms"], f"{where}.step_latency_ms")))
            try:
                return LatencyCurve("table", batch_size=bs, step_latency_ms=ls)
            except SpecError as e:
                raise SpecError(f"{where}: {e}") from None
        if "intercept_ms" in d:
            extra = sorted(set(d) - {"intercept_ms", "per_request_ms"})
            if extra:
                raise SpecError(f"{where}: unknown field(s) {', '.join(map(str, extra))}")
            a = _json_number(d["intercept_ms"], f"{where}.intercept_ms")
            c = _json_number(d.get("per_request_ms", 0.0), f"{where}.per_request_ms")
            try:
                return LatencyCurve("affine", intercept_ms=a, per_request_ms=c)
            except SpecError as e:
                raise SpecError(f"{where}: {e}") from None
        raise SpecError(f"{where} needs either 'batch_size'+'step_latency_ms' or 'intercept_ms'+'per_request_ms'")


@dataclass(frozen=True)
class CorunLatency:
    """Step latency of one model while another model is busy (co-running on the same GPUs).

    ``kind='slowdown'``: ``Lco(b) = slowdown * L(b)`` with a finite ``slowdown >= 1``.
    ``kind='table'``: ``curve`` (a :class:`LatencyCurve` table) gives ``Lco(b)`` directly, linear in
    between its batch sizes and flat outside, like ``latency_curves``.
    """

    kind: str
    slowdown: float = 1.0
    curve: LatencyCurve | None = None

    def __post_init__(self) -> None:
        if self.kind == "slowdown":
            f = self.slowdown
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f):
                raise SpecError(f"slowdown must be a finite number, got {f!r}")
            if f < 1:
                raise SpecError(f"slowdown must be >= 1 (a co-running step is not faster than a solo one), "
                                f"got {f:g}")
            if f * 1.0 > MAX_MS:
                raise SpecError(f"slowdown = {f:g} is too large")
        elif self.kind == "table":
            if not isinstance(self.curve, LatencyCurve) or self.curve.kind != "table":
                raise SpecError("a co-running table needs a LatencyCurve of kind 'table'")
        else:
            raise SpecError(f"co-running latency kind must be 'slowdown' or 'table', got {self.kind!r}")

    @staticmethod
    def factor(f: float) -> "CorunLatency":
        return CorunLatency("slowdown", slowdown=float(f))

    @staticmethod
    def table(batch_size: Sequence[int], step_latency_ms: Sequence[float]) -> "CorunLatency":
        return CorunLatency("table", curve=LatencyCurve("table", batch_size=tuple(int(b) for b in batch_size),
                                                        step_latency_ms=tuple(float(v) for v in step_latency_ms)))

    def latency_ms(self, solo_ms: float, b: int) -> float:
        """Co-running latency in ms of a batch of ``b`` whose solo latency is ``solo_ms``."""
        if self.kind == "slowdown":
            return self.slowdown * solo_ms
        return self.curve.latency_ms(b)

    @property
    def batch_dependent(self) -> bool:
        return self.kind == "table" and len(set(self.curve.step_latency_ms)) > 1

    def to_dict(self) -> dict:
        if self.kind == "slowdown":
            return {"slowdown": self.slowdown}
        return self.curve.to_dict()

    @staticmethod
    def from_dict(d: Any, where: str) -> "CorunLatency":
        if isinstance(d, CorunLatency):
            return d
        if not isinstance(d, Mapping):
            raise SpecError(f"{where} must be null, {{\"slowdown\": F}} or a table {{\"batch_size\": [...], "
                            f"\"step_latency_ms\": [...]}}, got {_show(d)}")
        if "slowdown" in d:
            extra = sorted(map(str, set(d) - {"slowdown"}))
            if extra:
                raise SpecError(f"{where}: unknown field(s) {', '.join(extra)} (a slowdown entry has only 'slowdown')")
            f = _json_number(d["slowdown"], f"{where}.slowdown")
            if f < 1:
                raise SpecError(f"{where}.slowdown must be >= 1 (Lco = slowdown * L is not faster than "
                                f"the solo step), got {f:g}")
            if f > MAX_MS:
                raise SpecError(f"{where}.slowdown = {f:g} is too large")
            return CorunLatency("slowdown", slowdown=f)
        if "batch_size" in d or "step_latency_ms" in d:
            curve = LatencyCurve.from_dict(d, where)
            return CorunLatency("table", curve=curve)
        raise SpecError(f"{where} needs either 'slowdown' or 'batch_size'+'step_latency_ms'")


@dataclass(frozen=True)
class SystemSpec:
    """A validated routed-serving system.  Build it with :func:`make_spec` or :func:`preset`."""

    step_latency_ms: tuple[float, ...]
    routing_matrix: tuple[tuple[float, ...], ...]
    committed_tokens: tuple[tuple[float, ...], ...]
    delta_ms: float = DEFAULT_DELTA_MS
    name: str = "custom"
    model_names: tuple[str, ...] | None = None
    latency_curves: tuple[LatencyCurve | None, ...] | None = None
    max_batch_size: tuple[int | None, ...] | None = None
    provenance: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    corun_latency: tuple[CorunLatency | None, ...] | None = None

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def M(self) -> int:
        return len(self.step_latency_ms)

    @property
    def P(self) -> np.ndarray:
        return np.array(self.routing_matrix, dtype=np.float64)

    @property
    def C(self) -> np.ndarray:
        return np.array(self.committed_tokens, dtype=np.float64)

    def latency_ms(self, i: int, b: int = 1) -> float:
        """Step latency of model ``i`` for a batch of ``b`` requests (ms)."""
        curve = self.latency_curves[i] if self.latency_curves else None
        if curve is None:
            return self.step_latency_ms[i]
        return curve.latency_ms(b)

    @property
    def batch_dependent(self) -> bool:
        return bool(self.latency_curves) and any(c is not None for c in self.latency_curves)

    @property
    def has_corun(self) -> bool:
        """True when some model has a co-running latency (even a slowdown of 1: the chain then takes the
        co-running law, which gives today's chain back)."""
        return bool(self.corun_latency) and any(c is not None for c in self.corun_latency)

    def corun_latency_ms(self, i: int, b: int = 1) -> float:
        """Step latency (ms) of a batch of ``b`` on model ``i`` launched while another model is busy."""
        solo = self.latency_ms(i, b)
        law = self.corun_latency[i] if self.corun_latency else None
        return solo if law is None else law.latency_ms(solo, b)

    def _corun_batch_dependent(self) -> bool:
        return self.batch_dependent or (self.has_corun and any(
            c is not None and c.kind == "table" for c in self.corun_latency))

    def corun_warnings(self) -> list[str]:
        """Where a co-running table lies below the solo latency (allowed, but a co-running step is
        normally not faster than a solo one).  Checked at every breakpoint of both curves and at
        batch sizes 1 and 1024 (both are piecewise linear in b between those points)."""
        out = []
        if not self.has_corun:
            return out
        for i, law in enumerate(self.corun_latency):
            if law is None or law.kind != "table":
                continue
            solo = self.latency_curves[i] if self.latency_curves else None
            pts = set(law.curve.batch_size) | {1, 1024}
            if solo is not None and solo.kind == "table":
                pts |= set(solo.batch_size)
            below = [b for b in sorted(pts) if self.corun_latency_ms(i, b) < self.latency_ms(i, b) * (1 - 1e-12)]
            if below:
                b = below[0]
                out.append(f"corun_latency[{i}] is below the solo latency at batch size(s) "
                           f"{', '.join(map(str, below[:6]))}{' ...' if len(below) > 6 else ''} "
                           f"(b = {b}: {self.corun_latency_ms(i, b):g} ms co-running < {self.latency_ms(i, b):g} ms "
                           f"solo); a co-running step is then modelled as faster than a solo one")
        return out

    def caps(self, N: int) -> np.ndarray:
        """Per-model batch caps as an int64 array (``N`` where uncapped)."""
        out = np.full(self.M, N, dtype=np.int64)
        if self.max_batch_size:
            for i, c in enumerate(self.max_batch_size):
                if c is not None:
                    out[i] = min(int(c), N)
        return out

    def quanta_table(self, N: int, round_to_grid: bool = False) -> tuple[np.ndarray, list[dict]]:
        """``d[i, b]`` = duration in quanta of a batch of b on model i, for b = 0..N.

        Column 0 is unused (set to ``d[i, 1]``).  Returns the table and a list of
        the roundings applied (empty when every latency lies on the grid).
        Raises :class:`SpecError` when a latency is off the grid and
        ``round_to_grid`` is false, naming the model, the batch size and the
        rounding that would be needed.
        """
        d, roundings = _quanta_table(self, int(N), bool(round_to_grid))
        return d.copy(), [dict(r) for r in roundings]

    def corun_quanta_table(self, N: int, round_to_grid: bool = False) -> tuple[np.ndarray, list[dict]]:
        """``d_co[i, b]`` = duration in quanta of a batch of b on model i launched while another model is
        busy, for b = 0..N, on the same grid as :meth:`quanta_table` (column 0 = column 1).

        Without ``corun_latency`` it equals :meth:`quanta_table`.  Off-grid co-running latencies are
        refused (naming ``corun_latency[i]`` and the batch size) unless ``round_to_grid``; the roundings
        applied are returned like :meth:`quanta_table`'s, with ``"corun": True``.
        """
        d, roundings = _corun_quanta_table(self, int(N), bool(round_to_grid))
        return d.copy(), [dict(r) for r in roundings]

    def _corun_quanta_table(self, N: int, round_to_grid: bool) -> tuple[np.ndarray, list[dict]]:
        if not self.has_corun:
            return self._quanta_table(N, round_to_grid)
        if N < 1:
            raise SpecError(f"N must be >= 1, got {N}")
        varies = self._corun_batch_dependent()
        return self._duration_table(N, round_to_grid, self.corun_latency_ms, varies, corun=True)

    def _quanta_table(self, N: int, round_to_grid: bool) -> tuple[np.ndarray, list[dict]]:
        if N < 1:
            raise SpecError(f"N must be >= 1, got {N}")
        return self._duration_table(N, round_to_grid, self.latency_ms, self.batch_dependent, corun=False)

    def _duration_table(self, N: int, round_to_grid: bool, latency, varies: bool,
                        corun: bool) -> tuple[np.ndarray, list[dict]]:
        """``d[i, b]`` in quanta of ``latency(i, b)`` (:mod:`tr_core.quanta`), b = 0..N, and the roundings."""
        d = np.zeros((self.M, N + 1), dtype=np.int64)
        roundings: list[dict] = []
        sizes = range(1, N + 1) if varies else (1,)
        what = "co-running latency" if corun else "latency"
        for i in range(self.M):
            for b in sizes:
                lat = latency(i, b)
                q = lat / self.delta_ms
                if q > MAX_QUANTA:
                    raise SpecError(f"{what} of model {i} ({lat:g} ms) is {q:.3g} quanta of delta = "
                                    f"{self.delta_ms:g} ms, more than {MAX_QUANTA:,}; use a coarser --delta-ms")
                qi = _Q.quanta(lat, self.delta_ms)
                if not _Q.on_grid(lat, self.delta_ms):
                    rel = (qi * self.delta_ms - lat) / lat
                    info = {"model": i, "batch_size": b, "step_latency_ms": lat,
                            "rounded_ms": qi * self.delta_ms, "relative_error": rel}
                    if corun:
                        info["corun"] = True
                    if not round_to_grid:
                        if corun:
                            where, also = f"corun_latency[{i}]" + (f" at batch size {b}" if varies else ""), \
                                " (co-running)"
                        else:
                            where = f"step_latency_ms[{i}]" if not varies else f"latency of model {i} at batch size {b}"
                            also = ""
                        raise SpecError(
                            f"{where} = {lat:g} ms{also} is not a multiple of delta = {self.delta_ms:g} ms; "
                            f"rounding would give {qi * self.delta_ms:.6g} ms (relative error {rel:+.3g}); "
                            f"pass --round to apply it, or use --delta-ms auto or a finer --delta-ms")
                    roundings.append(info)
                d[i, b] = qi
            if not varies:
                d[i, :] = d[i, 1]
            else:
                d[i, 0] = d[i, 1]
        return d, roundings

    @property
    def commits_no_tokens(self) -> bool:
        """True when no step ever commits a token (every P[i][j] * C[i][j] is 0): the throughput is 0."""
        return all(p * c == 0 for pr, cr in zip(self.routing_matrix, self.committed_tokens) for p, c in zip(pr, cr))

    def routing_notes(self) -> list[str]:
        """What the routing matrix makes of each model, where that makes a result need a word: a model no
        request ever reaches from the entry model, a model every request leaves for good (visited only
        before the system settles), a model whose every step routes back to itself.  Such a model runs no
        batch in the long run: its threshold has no effect and its admission latency is undefined (``-`` in
        tables, ``null`` in JSON).  Empty for the usual systems."""
        return routing_notes(self)

    def to_dict(self) -> dict:
        return spec_to_dict(self)

    def with_delta(self, delta_ms: float) -> "SystemSpec":
        return _replace(self, delta_ms=delta_ms)

    def with_corun(self, corun_latency: Sequence[CorunLatency | Mapping | float | None] | None) -> "SystemSpec":
        """The same system with these co-running latencies (entries as for :func:`make_spec`; ``None``
        removes them): ``spec.with_corun([2.8, 1.05])`` is the API form of ``--corun-slowdown 2.8 1.05``."""
        return _replace(self, corun_latency=parse_corun(corun_latency))


def _model_label(spec: "SystemSpec", i: int) -> str:
    return f"model {i} ({spec.model_names[i]})" if spec.model_names else f"model {i}"


def _reach(P, start: int) -> set[int]:
    seen, stack = {start}, [start]
    while stack:
        i = stack.pop()
        for j, p in enumerate(P[i]):
            if p > 0 and j not in seen:
                seen.add(j)
                stack.append(j)
    return seen


def routing_notes(spec: "SystemSpec") -> list[str]:
    """See :meth:`SystemSpec.routing_notes`: one line per kind, naming the models."""
    P = spec.routing_matrix
    M = len(P)
    reach = [_reach(P, i) for i in range(M)]
    from_entry = reach[0]
    unreached = [i for i in range(M) if i not in from_entry]
    # a model reached from the entry is recurrent when every model it reaches leads back to it
    left = [i for i in sorted(from_entry) if any(i not in reach[j] for j in reach[i])]
    selfish = [i for i in range(M) if P[i][i] == 1.0]
    out = []
    undefined = "its threshold has no effect and its admission latency is undefined ('-' in tables, null in JSON)"
    if unreached:
        names = ", ".join(_model_label(spec, i) for i in unreached)
        out.append(f"{names} {'is' if len(unreached) == 1 else 'are'} never reached: no route of routing_matrix "
                   f"leads there from the entry model 0, so no request ever runs on "
                   f"{'it' if len(unreached) == 1 else 'them'}; {undefined}")
    if left:
        names = ", ".join(_model_label(spec, i) for i in left)
        out.append(f"{names} {'is' if len(left) == 1 else 'are'} left for good: a request moves on and never "
                   f"comes back (routing_matrix), so in the long run no batch runs there; {undefined}")
    for i in selfish:
        if i in from_entry:
            out.append(f"{_model_label(spec, i)} routes every step to itself (routing_matrix[{i}][{i}] = 1): a "
                       "request that reaches it stays there for good" + (
                           "; the other models never run" if i == 0 else ""))
    return out


@functools.lru_cache(maxsize=512)
def _quanta_table(spec: SystemSpec, N: int, round_to_grid: bool) -> tuple[np.ndarray, list[dict]]:
    # one conversion per (spec, N, rounding): a threshold search asks once per B (callers get copies)
    return spec._quanta_table(N, round_to_grid)


@functools.lru_cache(maxsize=512)
def _corun_quanta_table(spec: SystemSpec, N: int, round_to_grid: bool) -> tuple[np.ndarray, list[dict]]:
    return spec._corun_quanta_table(N, round_to_grid)


def _replace(spec: SystemSpec, **kw) -> SystemSpec:
    from dataclasses import replace
    return replace(spec, **kw)


def _validate(s: SystemSpec) -> None:
    M = len(s.step_latency_ms)
    if M < 2:
        raise SpecError(f"a system needs at least 2 models, step_latency_ms has {M}")
    for i, L in enumerate(s.step_latency_ms):
        if not math.isfinite(L) or L <= 0:
            raise SpecError(f"step_latency_ms[{i}] must be > 0, got {L!r}")
        if not MIN_MS <= L <= MAX_MS:
            raise SpecError(f"step_latency_ms[{i}] = {L:g} ms is outside [{MIN_MS:g}, {MAX_MS:g}] ms")
    if not math.isfinite(s.delta_ms) or s.delta_ms <= 0:
        raise SpecError(f"delta_ms must be > 0, got {s.delta_ms!r}")
    if s.delta_ms < MIN_MS:
        raise SpecError(f"delta_ms = {s.delta_ms:g} ms is below {MIN_MS:g} ms (a nanosecond)")
    for name, mat in (("routing_matrix", s.routing_matrix), ("committed_tokens", s.committed_tokens)):
        if len(mat) != M:
            raise SpecError(f"{name} must have M = {M} rows (one per model), got {len(mat)}")
        for i, row in enumerate(mat):
            if len(row) != M:
                raise SpecError(f"{name}[{i}] must have M = {M} entries, got {len(row)}")
            for j, v in enumerate(row):
                if not math.isfinite(v):
                    raise SpecError(f"{name}[{i}][{j}] must be finite, got {v!r}")
    for i, row in enumerate(s.routing_matrix):
        for j, v in enumerate(row):
            if v < 0 or v > 1:
                raise SpecError(f"routing_matrix[{i}][{j}] = {v:g} is not a probability in [0, 1]")
        tot = math.fsum(row)
        if abs(tot - 1.0) > PROB_TOL:
            raise SpecError(f"routing_matrix row {i} sums to {tot:.12g}, not 1 (tolerance {PROB_TOL:g})")
    for i, row in enumerate(s.committed_tokens):
        for j, v in enumerate(row):
            if v < 0:
                raise SpecError(f"committed_tokens[{i}][{j}] = {v:g} must be >= 0")
            if v > MAX_TOKENS_PER_STEP:
                raise SpecError(f"committed_tokens[{i}][{j}] = {v:g} is more than {MAX_TOKENS_PER_STEP:g} tokens "
                                "per step")
    if s.model_names is not None and len(s.model_names) != M:
        raise SpecError(f"model_names must have M = {M} entries, got {len(s.model_names)}")
    for i, c in _entries(s.latency_curves, "latency_curves", LatencyCurve, M, ""):
        _check_sampled(f"latency_curves[{i}]", c.latency_ms)
    for i, c in _entries(s.corun_latency, "corun_latency", CorunLatency, M, " (one per model)"):
        _check_sampled(f"corun_latency[{i}]", lambda b, i=i: s.corun_latency_ms(i, b))
    if s.max_batch_size is not None:
        if len(s.max_batch_size) != M:
            raise SpecError(f"max_batch_size must have M = {M} entries, got {len(s.max_batch_size)}")
        for i, c in enumerate(s.max_batch_size):
            if c is not None and (int(c) != c or c < 1):
                raise SpecError(f"max_batch_size[{i}] must be an integer >= 1 or null, got {c!r}")


def _entries(items, name: str, cls: type, M: int, per_model: str):
    """The (index, entry) pairs of an optional per-model list that are not None, after checking its length and
    the entries' type (lazily: an entry's type is checked just before the caller checks that entry)."""
    if items is None:
        return
    if len(items) != M:
        raise SpecError(f"{name} must have M = {M} entries{per_model}, got {len(items)}")
    for i, c in enumerate(items):
        if c is not None and not isinstance(c, cls):
            raise SpecError(f"{name}[{i}] must be a {cls.__name__} or None")
        if c is not None:
            yield i, c


def _check_sampled(where: str, latency_ms) -> None:
    """A curve's latency at sample batch sizes is within [MIN_MS, MAX_MS].  A co-running latency is a checked
    solo latency times a factor >= 1, or a table of values > 0, so only a solo curve can be non-positive."""
    for b in (1, 2, 4, 8, 16, 64, 256, 1024):
        lat = latency_ms(b)
        if lat <= 0:
            raise SpecError(f"{where} gives a non-positive latency at batch size {b}")
        if not (math.isfinite(lat) and MIN_MS <= lat <= MAX_MS):
            raise SpecError(f"{where} gives {lat:g} ms at batch size {b}, outside [{MIN_MS:g}, {MAX_MS:g}] ms")


def _tuple_matrix(m: Any, name: str) -> tuple[tuple[float, ...], ...]:
    try:
        arr = [[float(v) for v in row] for row in m]
    except (TypeError, ValueError):
        raise SpecError(f"{name} must be a square matrix of numbers") from None
    return tuple(tuple(r) for r in arr)


def make_spec(step_latency_ms: Sequence[float], routing_matrix: Any, committed_tokens: Any,
              delta_ms: float = DEFAULT_DELTA_MS, name: str = "custom", model_names: Sequence[str] | None = None,
              latency_curves: Sequence[LatencyCurve | Mapping | None] | None = None,
              max_batch_size: Sequence[int | None] | None = None,
              provenance: Mapping[str, Any] | None = None,
              corun_latency: Sequence[CorunLatency | Mapping | float | None] | None = None) -> SystemSpec:
    """Build and validate a :class:`SystemSpec` from plain Python values.

    ``corun_latency`` entries may be ``None``, a :class:`CorunLatency`, a number (a slowdown factor) or
    a JSON-style mapping (``{"slowdown": F}`` or a table)."""
    try:
        L = tuple(_finite(v, "step_latency_ms") for v in step_latency_ms)
    except TypeError:
        raise SpecError("step_latency_ms must be a list of numbers") from None
    curves = None
    if latency_curves is not None:
        curves = tuple(
            c if (c is None or isinstance(c, LatencyCurve)) else LatencyCurve.from_dict(c, f"latency_curves[{i}]")
            for i, c in enumerate(latency_curves))
    caps = None
    if max_batch_size is not None:
        caps = tuple(None if c is None else c for c in max_batch_size)
    return SystemSpec(
        step_latency_ms=L,
        routing_matrix=_tuple_matrix(routing_matrix, "routing_matrix"),
        committed_tokens=_tuple_matrix(committed_tokens, "committed_tokens"),
        delta_ms=_finite(delta_ms, "delta_ms"),
        name=str(name),
        model_names=tuple(model_names) if model_names is not None else None,
        latency_curves=curves,
        max_batch_size=caps,
        provenance=dict(provenance or {}),
        corun_latency=parse_corun(corun_latency),
    )


def parse_corun(values: Any, where: str = "corun_latency") -> tuple[CorunLatency | None, ...] | None:
    """Co-running latencies from plain values: ``None`` (absent) or a list of entries, each ``None``, a
    :class:`CorunLatency`, a slowdown factor or a JSON-style mapping.  Messages name ``where[i]``."""
    if values is None:
        return None
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
        raise SpecError(f"{where} must be a list (one entry per model), got {_show(values)}")
    out: list[CorunLatency | None] = []
    for i, c in enumerate(values):
        w = f"{where}[{i}]"
        if c is None or isinstance(c, CorunLatency):
            out.append(c)
        elif _is_number(c):
            f = _json_number(c, w)
            if f < 1:
                raise SpecError(f"{w} = {f:g}: a slowdown factor must be >= 1")
            out.append(CorunLatency.from_dict({"slowdown": f}, w))
        else:
            out.append(CorunLatency.from_dict(c, w))
    return tuple(out)


# ----------------------------------------------------------------------------
# presets (Table 1 of the TokenRouter paper)

PRESETS = ("r2r", "citer", "co-llm", "r-stitch", "me")


def preset(algo: str, step_latency_ms: Sequence[float], p: float | None = None, q: float | None = None,
           weights: Sequence[float] | None = None, delta_ms: float = DEFAULT_DELTA_MS, **kw) -> SystemSpec:
    """The spec of a routing algorithm from the paper's Table 1.

    ``r2r``/``citer``/``co-llm``: escalate with probability ``p``, the peer
    returns after one token (P = [[1-p, p], [1, 0]], C = [[1, 0], [1, 0]]).
    ``r-stitch``: symmetric switching, P = [[1-p, p], [q, 1-q]] and
    C = [[1, 0], [0, 1]] (the switch-triggering token is regenerated).
    ``me``: every row of P equals the ensemble ``weights``, C all ones.
    """
    algo = algo.lower()
    if algo not in PRESETS:
        raise SpecError(f"--algo must be one of {', '.join(PRESETS)}, got {algo!r}")
    L = list(step_latency_ms)
    # a routing parameter the preset does not read is refused, naming it and the preset (never dropped)
    if algo != "me" and weights is not None:
        raise SpecError(f"--weights applies to preset 'me', not {algo!r} (which routes by --p"
                        f"{' and --q' if algo == 'r-stitch' else ''}): give one of them")
    if algo == "me":
        for flag, v in (("--p", p), ("--q", q)):
            if v is not None:
                raise SpecError(f"{flag} applies to the two-model presets, not 'me' (which routes by --weights): "
                                f"give one of them")
    elif algo != "r-stitch" and q is not None:
        raise SpecError(f"--q applies to preset 'r-stitch', not {algo!r} (which routes by --p alone)")

    def prob(x, flag):
        if x is None:
            raise SpecError(f"preset {algo!r} needs {flag}")
        v = _finite(x, flag)
        if v < 0 or v > 1:
            raise SpecError(f"{flag} = {v:g} is not a probability in [0, 1]")
        return v

    if algo in ("r2r", "citer", "co-llm"):
        if len(L) != 2:
            raise SpecError(f"preset {algo!r} has M = 2 models; --L needs 2 values, got {len(L)}")
        pv = prob(p, "--p")
        P = [[1 - pv, pv], [1.0, 0.0]]
        C = [[1.0, 0.0], [1.0, 0.0]]
    elif algo == "r-stitch":
        if len(L) != 2:
            raise SpecError(f"preset 'r-stitch' has M = 2 models; --L needs 2 values, got {len(L)}")
        pv, qv = prob(p, "--p"), prob(q, "--q")
        P = [[1 - pv, pv], [qv, 1 - qv]]
        C = [[1.0, 0.0], [0.0, 1.0]]
    else:
        if weights is None:
            raise SpecError("preset 'me' needs --weights")
        w = [_finite(x, "--weights") for x in weights]
        if len(w) != len(L):
            raise SpecError(f"--weights has {len(w)} values but --L has {len(L)}; they must match (one per model)")
        if any(x < 0 for x in w):
            raise SpecError("--weights must be >= 0")
        tot = math.fsum(w)
        if abs(tot - 1.0) > PROB_TOL:
            raise SpecError(f"--weights sum to {tot:.12g}, not 1 (tolerance {PROB_TOL:g})")
        P = [list(w) for _ in L]
        C = [[1.0] * len(L) for _ in L]
    return make_spec(L, P, C, delta_ms=delta_ms, name=algo, **kw)


# ----------------------------------------------------------------------------
# JSON

def spec_to_dict(spec: SystemSpec) -> dict:
    d: dict[str, Any] = {
        "schema_version": SPEC_SCHEMA_VERSION,
        "name": spec.name,
        "step_latency_ms": list(spec.step_latency_ms),
        "routing_matrix": [list(r) for r in spec.routing_matrix],
        "committed_tokens": [list(r) for r in spec.committed_tokens],
        "delta_ms": spec.delta_ms,
    }
    if spec.model_names is not None:
        d["model_names"] = list(spec.model_names)
    if spec.latency_curves is not None:
        d["latency_curves"] = [None if c is None else c.to_dict() for c in spec.latency_curves]
    if spec.max_batch_size is not None:
        d["max_batch_size"] = list(spec.max_batch_size)
    if spec.corun_latency is not None:
        d["corun_latency"] = [None if c is None else c.to_dict() for c in spec.corun_latency]
    if spec.provenance:
        d["provenance"] = dict(spec.provenance)
    return d


_KNOWN_KEYS = {"schema_version", "name", "step_latency_ms", "routing_matrix", "committed_tokens", "delta_ms",
               "model_names", "latency_curves", "max_batch_size", "provenance", "M", "corun_latency"}


def _check_json_types(d: Mapping[str, Any]) -> int:
    """Check every field of a spec document for its JSON type; return M.  Messages name the field."""
    L = _json_list(d["step_latency_ms"], "step_latency_ms")
    M = len(L)
    if M < 2:
        raise SpecError(f"a system needs at least 2 models, step_latency_ms has {M}")
    for i, v in enumerate(L):
        _json_number(v, f"step_latency_ms[{i}]")
    for key in ("routing_matrix", "committed_tokens"):
        rows = _json_list(d[key], key)
        if len(rows) != M:
            raise SpecError(f"{key} must have M = {M} rows (one per model), got {len(rows)}")
        for i, row in enumerate(rows):
            for j, v in enumerate(_json_list(row, f"{key}[{i}]", M)):
                _json_number(v, f"{key}[{i}][{j}]")
    if "delta_ms" in d:
        _json_number(d["delta_ms"], "delta_ms")
    if "M" in d and _json_int(d["M"], "M") != M:
        raise SpecError(f"'M' = {d['M']!r} but step_latency_ms has {M} entries")
    if "name" in d and not isinstance(d["name"], str):
        raise SpecError(f"name must be a string, got {_show(d['name'])}")
    if d.get("model_names") is not None:
        for i, v in enumerate(_json_list(d["model_names"], "model_names", M)):
            if not isinstance(v, str):
                raise SpecError(f"model_names[{i}] must be a string, got {_show(v)}")
    if d.get("latency_curves") is not None:
        _json_list(d["latency_curves"], "latency_curves", M)  # entries are checked by LatencyCurve.from_dict
    if d.get("corun_latency") is not None:
        _json_list(d["corun_latency"], "corun_latency", M)  # entries are checked by CorunLatency.from_dict
    if d.get("max_batch_size") is not None:
        for i, v in enumerate(_json_list(d["max_batch_size"], "max_batch_size", M)):
            if v is not None:
                _json_int(v, f"max_batch_size[{i}]")
    if d.get("provenance") is not None and not isinstance(d["provenance"], Mapping):
        raise SpecError(f"provenance must be an object, got {_show(d['provenance'])}")
    return M


def _json_corun(values: Any) -> list | None:
    """In a JSON document a bare number is not a corun_latency entry (only null, {"slowdown": F} or a table)."""
    if values is None:
        return None
    for i, c in enumerate(values):
        if c is not None and not isinstance(c, Mapping):
            raise SpecError(f"corun_latency[{i}] must be null, {{\"slowdown\": F}} or a table "
                            f"{{\"batch_size\": [...], \"step_latency_ms\": [...]}}, got {_show(c)}")
    return list(values)


def spec_from_dict(d: Mapping[str, Any], where: str = "spec") -> SystemSpec:
    """Validate a spec document (as loaded from JSON) and build the spec.

    Every field is checked for its JSON type first (a string where a number belongs is refused, not
    converted), then for its value; errors name ``where`` (the file) and the field, e.g.
    ``s.json: max_batch_size[0] must be an integer, got 1.5``.
    """
    if not isinstance(d, Mapping):
        raise SpecError(f"{where}: a spec must be a JSON object, got {_show(d)}")
    if _depth(d) > MAX_DEPTH:
        raise SpecError(f"{where}: nested more than {MAX_DEPTH} levels deep; not a spec")
    ver = d.get("schema_version", SPEC_SCHEMA_VERSION)
    if isinstance(ver, bool) or ver != SPEC_SCHEMA_VERSION:
        raise SpecError(f"{where}: unsupported schema_version {ver!r} (this tool reads {SPEC_SCHEMA_VERSION})")
    unknown = sorted(map(str, set(d) - _KNOWN_KEYS))
    if unknown:
        raise SpecError(f"{where}: unknown field(s) {', '.join(unknown)} (free text belongs in 'name' or "
                        f"'provenance')")
    for key in ("step_latency_ms", "routing_matrix", "committed_tokens"):
        if key not in d:
            raise SpecError(f"{where}: missing field {key!r}")
    try:
        _check_json_types(d)
        return make_spec(
            d["step_latency_ms"], d["routing_matrix"], d["committed_tokens"],
            delta_ms=d.get("delta_ms", DEFAULT_DELTA_MS), name=d.get("name", "custom"),
            model_names=d.get("model_names"), latency_curves=d.get("latency_curves"),
            max_batch_size=d.get("max_batch_size"), provenance=d.get("provenance"),
            corun_latency=_json_corun(d.get("corun_latency")))
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None


def load_spec(path: str | os.PathLike) -> SystemSpec:
    """Read a spec JSON file; unreadable or malformed files raise :class:`SpecError`."""
    return spec_from_dict(read_json(path, "spec file"), where=os.fspath(path))


def write_json_atomic(path: str | os.PathLike, doc: Any) -> None:
    """Write ``doc`` as indented JSON, atomically (see :mod:`tr_core.fileio`)."""
    def dump(f):
        json.dump(doc, f, indent=2, sort_keys=False)
        f.write("\n")

    atomic_write(path, dump)


def save_spec(spec: SystemSpec, path: str | os.PathLike) -> None:
    """Write the spec's JSON form atomically."""
    write_json_atomic(path, spec_to_dict(spec))
