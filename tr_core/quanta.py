"""Rounding latencies to the time grid: the one home of the rule.

A latency ``L`` ms on a grid of ``delta`` ms lasts ``q = max(1, round(L / delta))`` quanta (round half to
even, as Python's :func:`round` and :func:`numpy.round` both do; never zero quanta); it lies *on* the grid
when ``L / delta`` is within ``GRID_TOL`` (relative, at least absolute) of a whole number >= 1.  Who uses it:
the spec's duration tables (:meth:`tr_core.spec.SystemSpec.quanta_table`, ``--round``), the coarsest-grid
search (:func:`tr_core.grid.coarsest_delta`, ``--delta-ms auto``), the profiler's rounded latencies
(:mod:`profiler.system`) and the sensitivity sweeps (:func:`tr_model.sensitivity.grid_latency`).
tests/test_grid_rounding.py checks that they agree and that no second copy of the rule appears.

This module imports only NumPy.
"""

from __future__ import annotations

import numpy as np

__all__ = ["GRID_TOL", "MAX_QUANTA", "quanta", "on_grid", "round_to_grid", "quanta_array", "grid_errors"]

# relative tolerance within which L / delta counts as a whole number of quanta
GRID_TOL = 1e-9
# durations in quanta are int64 in the chain, and a chain with more quanta per step could never be solved
MAX_QUANTA = 2 ** 31


def quanta(value_ms: float, delta_ms: float) -> int:
    """The whole number of quanta ``value_ms`` rounds to: ``max(1, round(value_ms / delta_ms))``."""
    return max(1, int(round(value_ms / delta_ms)))


def on_grid(value_ms: float, delta_ms: float) -> bool:
    """Whether ``value_ms`` is a whole number (>= 1) of quanta within ``GRID_TOL``."""
    q = value_ms / delta_ms
    return round(q) >= 1 and abs(q - round(q)) <= GRID_TOL * max(1.0, abs(q))


def round_to_grid(value_ms: float, delta_ms: float) -> float:
    """``value_ms`` rounded to the grid, in ms (12 decimals, so that it reads back on the grid)."""
    return float(round(quanta(value_ms, delta_ms) * delta_ms, 12))


def quanta_array(values_ms, delta_ms) -> np.ndarray:
    """:func:`quanta` of an array of latencies (float64; broadcasts ``delta_ms`` too)."""
    return np.maximum(1.0, np.round(np.asarray(values_ms, dtype=np.float64) / delta_ms))


def grid_errors(values_ms, delta_ms) -> np.ndarray:
    """The relative error of each latency once rounded: ``(quanta * delta - L) / L``."""
    L = np.asarray(values_ms, dtype=np.float64)
    return (quanta_array(L, delta_ms) * delta_ms - L) / L
