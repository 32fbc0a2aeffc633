r"""Proven upper bounds on the throughput of delayed batching, for pruning and certificates.

Every bound here is a number ``U`` with ``T(B) <= U`` for *every* vector ``B``
in the family it is stated for (the proofs are in ``docs/model.md``, section
"Bounds and certificates"; the tests check each on many random systems).
Observed structure (unimodality, B*(N) growing with N) never appears here: it
may order a search, never prune it.

Notation: ``X_j`` is the long-run rate of request-steps served by model ``j``
(per quantum), ``cbar_j = sum_k C[j][k] P[j][k]`` the expected tokens committed
by one such step, so ``T = sum_j X_j cbar_j``.

**Flow balance.**  Every step on ``i`` is followed by a step on ``j`` with
probability ``P[i][j]``; in a closed system the number of arrivals to ``j`` and
of steps served there differ by at most ``N`` at any time, so the long-run
rates satisfy ``X = X P``.

**Little's law.**  A step of model ``j`` holds its request in service for
``d_j(b)`` quanta (``b`` its batch size), at least ``dmin_j = min_{b <= cap_j}
d_j(b)``.  The time-average number of requests in service is
``sum_j X_j E[d_j] >= sum_j X_j dmin_j`` and cannot exceed ``N``.

**Capacity.**  Model ``j`` runs one batch at a time; a batch of ``b``
(``b <= cap_j``) serves ``b`` steps in ``d_j(b)`` quanta, so
``X_j <= kappa_j = max_{b <= cap_j} b / d_j(b)``.

Hence ``T(B) <= max { cbar . X : X = X P, X >= 0, sum_j X_j dmin_j <= N,
X_j <= kappa_j }`` (a linear program in ``M`` variables) for *every* feasible
``B``: :func:`no_wait_bound`.  It is exact at ``N = 1`` (a lone request never
waits) and loose above; the gap it leaves is the waiting the chain computes.

**Per-chain bracket.**  For one chain with states ``s``, holding times
``tau``, rewards ``g`` and transition matrix ``T``, any vector ``h`` gives

.. math::  \min_s \frac{g + T h - h}{\tau}(s) \;\le\; T(B) \;\le\;
           \max_s \frac{g + T h - h}{\tau}(s)

(the max/min over the recurrent class suffice; over all states is safe),
because ``pi (T h - h) = 0`` for the stationary ``pi`` and ``T(B) = pi g / pi
tau``: :func:`chain_bracket`.  With ``h`` from a converged solve the bracket
is tight; it turns an iterate into a certified interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tr_core.spec import SystemSpec

# relative slack added to LP optima: the LP solver's rounding must never make a bound too small
LP_SLACK = 1e-9


@dataclass(frozen=True)
class Bound:
    """A proven upper bound (tokens/s) on every vector of a family, with the rule that gives it."""

    value_tok_s: float
    name: str


def _quanta(spec: SystemSpec, N: int, round_to_grid: bool) -> np.ndarray:
    d, _ = spec.quanta_table(int(N), round_to_grid=round_to_grid)
    return d


def no_wait_bound(spec: SystemSpec, N: int, *, round_to_grid: bool = False, d: np.ndarray | None = None) -> Bound:
    """``max cbar.X`` over the flows allowed by flow balance, Little's law and capacity (tokens/s).

    Valid for every feasible ``B`` at concurrency ``N`` (see the module docstring).
    """
    from scipy.optimize import linprog

    N = int(N)
    P, C = spec.P, spec.C
    M = spec.M
    if d is None:
        d = _quanta(spec, N, round_to_grid)
    caps = spec.caps(N)
    dmin = np.array([min(int(d[j, b]) for b in range(1, int(caps[j]) + 1)) for j in range(M)], dtype=float)
    kappa = np.array([max(b / float(d[j, b]) for b in range(1, int(caps[j]) + 1)) for j in range(M)])
    cbar = (C * P).sum(axis=1)
    # variables X_0..X_{M-1}; maximise cbar.X  <=>  minimise -cbar.X
    A_eq = (np.eye(M) - P).T          # X (I - P) = 0  <=>  (I - P)^T X = 0
    b_eq = np.zeros(M)
    A_ub = dmin[None, :]
    b_ub = np.array([float(N)])
    res = linprog(-cbar, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq,
                  bounds=[(0.0, float(k)) for k in kappa], method="highs")
    if res.status != 0:  # the LP is always feasible (X = 0) and bounded (capacity); be safe anyway
        val = float(np.dot(np.maximum(cbar, 0.0), kappa))
    else:
        val = float(-res.fun)
    per_quantum = val * (1.0 + LP_SLACK) + 1e-300
    return Bound(per_quantum * 1000.0 / spec.delta_ms, "no-wait")


def chain_bracket(T, g: np.ndarray, tau: np.ndarray, h: np.ndarray) -> tuple[float, float]:
    """Certified ``(lower, upper)`` on a chain's throughput per quantum from any vector ``h``.

    ``T``: CSR transition matrix (rows sum to 1), ``g``/``tau``: per-state
    reward and holding time, ``h``: any finite vector (best: the chain's
    relative values).  See the module docstring for the proof.
    """
    h = np.asarray(h, dtype=np.float64)
    D = (np.asarray(g, dtype=np.float64) + T @ h - h) / np.asarray(tau, dtype=np.float64)
    # widen by the rounding of the products above (|values| * a few ulps)
    scale = (np.abs(g) + np.abs(T) @ np.abs(h) + np.abs(h)) / tau
    err = float(np.max(scale)) * 8 * np.finfo(np.float64).eps * max(1, int(T.shape[0])) ** 0.5
    return float(np.min(D)) - err, float(np.max(D)) + err


def relative_values(T, g: np.ndarray, tau: np.ndarray, pi: np.ndarray) -> np.ndarray:
    """``h`` solving ``g - lam tau + T h - h = 0`` (up to a constant), by a sparse solve.

    ``lam = pi g / pi tau``.  Used to make :func:`chain_bracket` tight; the
    bracket is valid whatever ``h`` is, so an inaccurate ``h`` only widens it.
    """
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla

    n = T.shape[0]
    lam = float(pi @ g) / float(pi @ tau)
    r = np.asarray(g, float) - lam * np.asarray(tau, float)
    # (I - T) h = r with h[ref] = 0: replace the column of ref by a unit column
    ref = int(np.argmax(pi))
    A = (sp.identity(n, format="csr") - T).tolil()
    A[:, ref] = 0.0
    A[ref, ref] = 1.0
    try:
        h = spla.spsolve(A.tocsc(), r)
    except Exception:  # singular (several classes): fall back to h = 0, the bracket stays valid
        return np.zeros(n)
    if not np.all(np.isfinite(h)):
        return np.zeros(n)
    return h


def gap(upper: float, value: float) -> float:
    """Relative gap ``(upper - value) / upper`` (0 when the bound is attained)."""
    if not (upper > 0) or not math.isfinite(upper):
        return float("inf") if upper != value else 0.0
    return max(0.0, (upper - value) / upper)


class Bounder:
    """The proven bounds available for one (spec, N): ``vector_bound(B)`` is the smallest of them.

    Each bound holds for every feasible vector of its family; a vector's bound
    is the minimum over the families it belongs to.
    """

    def __init__(self, spec: SystemSpec, N: int, *, round_to_grid: bool = False):
        self.spec = spec
        self.N = int(N)
        self.d = _quanta(spec, self.N, round_to_grid)
        self.global_bound = no_wait_bound(spec, self.N, d=self.d)

    def vector_bound(self, B) -> Bound:
        return self.global_bound
