"""One lowering step: a served system at concurrency N, as every kernel reads it.

:func:`lower_system` (from a spec) and :func:`lower_arrays` (from plain arrays) validate once and return a
frozen :class:`LoweredSystem`: routing ``P``, committed tokens ``C`` and their expected commits ``cbar``,
durations ``d`` and the co-running launch law's ``dco`` in quanta, batch caps, the batch-routing outcome
table and the state packing.  Its :attr:`LoweredSystem.tables` is the kernels' record
(:class:`dtmc._kernels.ChainTables`); the chain (and :func:`optimizer.evaluate.evaluate_thresholds` through
it), the decision processes and their bounds, the class reach and the mean field take it instead of
rebuilding it.  :func:`lower_routing` is the part of the lowering that needs no grid (``P``, ``C``, ``cbar``,
caps): the simulator, which keeps its latencies in ms (continuous time), takes those from it.

This module imports nothing else of the project (``dtmc`` is a leaf): a *spec* is anything with ``P``,
``C``, ``M``, ``caps(N)``, ``quanta_table(N, round_to_grid=)``, ``has_corun`` and
``corun_quanta_table(N, round_to_grid=)`` (``tr_core.spec.SystemSpec`` has them).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from dtmc import _kernels as K

KEY_BITS = 62  # a packed state key is an int64 with room to spare

# The chain has always weighted its routing outcomes with lgamma log-factorials, the decision processes with
# summed logs; the two differ in the last bits, and each consumer keeps its own so its numbers stay exact.
FACTORIALS = ("lgamma", "summed")


class DTMCError(ValueError):
    """Invalid chain input, or a chain whose structure the solver refuses."""


def _bits(x: int) -> int:
    return max(1, int(x).bit_length())


_OUTCOMES: dict = {}


def outcome_table(N: int, P: np.ndarray, factorials: str = "lgamma"):
    """``(offsets, parts, prob)``: the compositions of b = 0..N into M parts (rows
    ``offsets[b]:offsets[b+1]`` of ``parts``) and their multinomial probabilities per source model (exactly
    0 when a part lands on a zero-probability destination).  Cached per (N, P, factorials)."""
    if factorials not in FACTORIALS:
        raise DTMCError(f"factorials must be one of {FACTORIALS}, got {factorials!r}")
    P = np.ascontiguousarray(P, dtype=np.float64)
    M = P.shape[0]
    key = (int(N), P.shape, P.tobytes(), factorials)
    hit = _OUTCOMES.get(key)
    if hit is None:
        total = math.comb(int(N) + M, M)
        if total > 60_000_000:
            raise DTMCError(f"M = {M} models at N = {N} need {total:,} batch-routing outcomes; too many to "
                                f"enumerate")
        offsets, parts = K.compositions(int(N), M)
        if factorials == "lgamma":
            logfact = np.array([math.lgamma(x + 1.0) for x in range(int(N) + 1)], dtype=np.float64)
        else:
            logfact = K.summed_log_factorials(int(N))
        hit = (offsets, parts, K.composition_probabilities(P, offsets, parts, logfact))
        if len(_OUTCOMES) > 32:
            _OUTCOMES.clear()
        _OUTCOMES[key] = hit
    return hit


@dataclass(frozen=True)
class LoweredSystem:
    """Everything the kernels need of one system at concurrency N (built once, passed down).

    ``dco`` is the co-running *launch law*'s durations (a batch gets them when another model is busy at
    its launch) or None for the solo law.  ``tables`` (the kernels' record) and the outcome table are
    built on first use, so a caller that only checks the packing pays nothing for them."""

    N: int
    P: np.ndarray = field(repr=False)
    C: np.ndarray = field(repr=False)
    d: np.ndarray = field(repr=False)
    dco: np.ndarray | None = field(repr=False)
    caps: np.ndarray = field(repr=False)
    factorials: str = "lgamma"
    roundings: tuple = ()

    @property
    def M(self) -> int:
        return int(self.P.shape[0])

    @property
    def corun(self) -> bool:
        return self.dco is not None

    @property
    def dmax(self) -> int:
        """The longest duration a batch can get (either law)."""
        return int(self.d.max()) if self.dco is None else int(max(self.d.max(), self.dco.max()))

    @property
    def bn(self) -> int:
        return _bits(self.N)

    @property
    def br(self) -> int:
        return _bits(self.dmax)

    @property
    def key_bits(self) -> int:
        """Bits one packed state needs (at most :data:`KEY_BITS` fit)."""
        return self.M * (2 * self.bn + self.br)

    @property
    def fits(self) -> bool:
        return self.key_bits <= KEY_BITS

    @functools.cached_property
    def cbar(self) -> np.ndarray:
        """Expected tokens committed per completed request, per model."""
        return expected_commits(self.P, self.C)

    @functools.cached_property
    def outcomes(self):
        return outcome_table(self.N, self.P, self.factorials)

    @functools.cached_property
    def tables(self) -> K.ChainTables:
        """The kernels' record; ``dco`` is ``d`` under the solo law (the kernels never read it then)."""
        offsets, parts, prob = self.outcomes
        return K.ChainTables(self.caps, self.d, self.d if self.dco is None else self.dco, self.corun, self.cbar,
                             offsets, parts, prob, self.bn, self.br)

    @functools.cached_property
    def launch_tables(self) -> K.ChainTables:
        """:attr:`tables` without the outcome table (empty arrays), for kernels that never route a batch by
        its multinomial outcomes (the mean field): no enumeration of compositions at large N."""
        none = np.zeros(1, dtype=np.int64)
        return K.ChainTables(self.caps, self.d, self.d if self.dco is None else self.dco, self.corun, self.cbar,
                             none, np.zeros((1, self.M), dtype=np.int64), np.zeros((self.M, 1)), self.bn, self.br)

    def with_packing(self, br: int) -> K.ChainTables:
        """:attr:`tables` with another residual width (a coarse clock packs slots, not quanta)."""
        return self.tables._replace(br=int(br))


def expected_commits(P: np.ndarray, C: np.ndarray) -> np.ndarray:
    """``cbar``: the tokens a completed request of each model commits on average, ``(C * P).sum(axis=1)``."""
    return (C * P).sum(axis=1)


class Routing(NamedTuple):
    """The grid-free part of a lowering (:func:`lower_routing`): routing ``P`` and committed tokens ``C``
    (float64, contiguous), their expected commits ``cbar`` per model and the batch caps clipped to N; the
    same arrays a :class:`LoweredSystem` of the system holds."""

    P: np.ndarray
    C: np.ndarray
    caps: np.ndarray
    cbar: np.ndarray


def _routing(P, C, N, caps):
    """``(P, C, caps, N)`` converted and checked once (caps default N, clipped to N, at least 1)."""
    P = np.ascontiguousarray(P, dtype=np.float64)
    C = np.ascontiguousarray(C, dtype=np.float64)
    N = int(N)
    if N < 1:
        raise DTMCError(f"N must be >= 1, got {N}")
    M = P.shape[0]
    caps = np.full(M, N, dtype=np.int64) if caps is None else np.minimum(np.asarray(caps, dtype=np.int64), N)
    if (caps < 1).any():
        raise DTMCError("batch caps must be >= 1")
    return P, C, np.ascontiguousarray(caps), N


def lower_routing(P, C, N: int, caps=None) -> Routing:
    """The part of :func:`lower_arrays` that needs no quantum grid: ``P``, ``C``, ``cbar`` and the caps at N,
    converted and checked as it does.  For a consumer that keeps its latencies in ms instead of lowering them
    to quanta (the simulator runs in continuous time: rounding its latencies onto a grid would change what it
    simulates, and a spec off the grid has no durations without rounding)."""
    P, C, caps, _ = _routing(P, C, N, caps)
    return Routing(P, C, caps, expected_commits(P, C))


def lower_arrays(P, C, d, N: int, caps=None, dco=None, *, empty: bool = False, factorials: str = "lgamma",
                 roundings: tuple = ()) -> LoweredSystem:
    """The :class:`LoweredSystem` of plain arrays: ``P``, ``C`` (M, M); ``d`` and ``dco`` (M, N+1) durations in
    quanta (``dco`` None: the solo law); ``caps`` (default N, clipped to N).  Durations must be at least one
    quantum from batch size 1 on, and at 0 too with ``empty`` (the empty batch of a policy)."""
    P, C, caps, N = _routing(P, C, N, caps)
    M = P.shape[0]
    first = 0 if empty else 1
    what = " (column 0: the empty batch)" if empty else ""
    d = np.ascontiguousarray(d, dtype=np.int64)
    if d.shape != (M, N + 1):
        raise DTMCError(f"d must have shape (M, N+1) = ({M}, {N + 1}), got {d.shape}")
    if (d[:, first:] < 1).any():
        raise DTMCError(f"durations d must be >= 1 quantum{what}")
    if dco is not None:
        dco = np.ascontiguousarray(dco, dtype=np.int64)
        if dco.shape != (M, N + 1):
            raise DTMCError(f"dco must have shape (M, N+1) = ({M}, {N + 1}), got {dco.shape}")
        if (dco[:, first:] < 1).any():
            raise DTMCError(f"co-running durations dco must be >= 1 quantum{what}")
    return LoweredSystem(N, P, C, d, dco, caps, factorials, tuple(roundings))


def lower_system(spec, N: int, *, round_to_grid: bool = False, factorials: str = "lgamma",
                 empty: bool = False) -> LoweredSystem:
    """The :class:`LoweredSystem` of a validated spec at concurrency N on its quantum grid (``round_to_grid``:
    latencies off the grid are rounded onto it, else refused by the spec)."""
    N = int(N)
    d, roundings = spec.quanta_table(N, round_to_grid=round_to_grid)
    dco = None
    if spec.has_corun:
        dco, co_roundings = spec.corun_quanta_table(N, round_to_grid=round_to_grid)
        roundings = list(roundings) + list(co_roundings)
    return lower_arrays(spec.P, spec.C, d, N, spec.caps(N), dco, empty=empty, factorials=factorials,
                        roundings=tuple(roundings))
