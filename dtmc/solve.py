r"""Stationary distribution of a finite DTMC given as a CSR matrix, with its accuracy.

We want :math:`\pi T = \pi`, :math:`\sum \pi = 1` on the states reachable from
the initial state.  The recurrent structure is checked first: the strongly
connected components of the transition graph are computed and the *closed*
ones (no edge leaving them) found.  One closed class: its states carry all the
mass, every other (transient) state gets exactly zero.  Several closed classes:
the long-run behaviour depends on the start and an error is raised, never an
average.

Solvers (all report the residual :math:`\max_j |(\pi T)_j - \pi_j|`):

``direct``
    scipy's sparse LU (``spsolve``) on :math:`(I - T)^\top \pi = 0` with one
    equation replaced by :math:`\sum \pi = 1`.  Exact up to rounding; slow on
    big chains.  The cross-check path.
``gauss-seidel``
    In-place sweeps :math:`\pi_j \leftarrow \sum_{i\ne j}\pi_i T_{ij}/(1-T_{jj})`
    in state order, renormalised after each sweep, until the residual is at
    most ``tol`` (compiled).  It converges on aperiodic and periodic
    irreducible chains alike in practice, but is not guaranteed to; when it
    does not reach ``tol`` within ``max_sweeps`` the ``auto`` solver falls
    back to ``direct``.
``power``
    Power iteration on the lazy chain :math:`(I+T)/2` (same stationary vector,
    aperiodic), as a slow, simple reference.
``anderson``
    Gauss-Seidel sweeps as a fixed-point map :math:`x \mapsto G(x)`,
    accelerated by Anderson mixing (memory ``m = 4``): each step solves the
    small least-squares problem :math:`\min_\gamma \|f_k - \Delta F\gamma\|`
    over the last differences of the residuals :math:`f = G(x) - x` and
    extrapolates :math:`x_{k+1} = G(x_k) - (\Delta X + \Delta F)\gamma`
    (clipped at zero, renormalised).  On the slowly mixing chains of large
    thresholds it needs 5-10x fewer sweeps than plain Gauss-Seidel; a step
    that does not reduce the residual is replaced by a plain sweep.
``auto``
    ``anderson``, then ``direct`` if it did not converge.

Rounding sets a floor under the attainable residual that grows with the chain
(about 1e-13 relative at a million states).  An iteration that stalls there
stops; its result is accepted when the relative residual is below
``FLOOR_TOL`` (1e-11), with the solver named "... (stopped at the rounding
floor)" and the residual reported as always.  The direct fallback is refused
above ``DIRECT_FALLBACK_LIMIT`` states, where LU fill-in would need minutes
and many GiB.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from scipy.sparse.csgraph import connected_components

from dtmc import _kernels as K
from dtmc.chain import DTMCError

SOLVERS = ("auto", "anderson", "gauss-seidel", "direct", "power")
DEFAULT_TOL = 1e-13  # on max|pi T - pi| / max(pi)
# An iterate that stalls (rounding floor) is accepted when its relative residual is below this;
# its residual is reported as usual, and the solver name says so.
FLOOR_TOL = 1e-11
# Above this many states the direct LU fallback would take minutes and many GiB: refuse instead.
DIRECT_FALLBACK_LIMIT = 300_000


@dataclass(frozen=True)
class StationaryResult:
    pi: np.ndarray
    residual: float
    solver: str
    iterations: int
    seconds: float
    n_recurrent: int
    n_transient: int


def closed_classes(T: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """Label the strongly connected components and flag the closed ones.

    Returns ``(labels, closed)`` where ``closed[c]`` is true when component
    ``c`` has no edge to another component.
    """
    ncomp, labels = connected_components(T, directed=True, connection="strong")
    rows = np.repeat(np.arange(T.shape[0]), np.diff(T.indptr))
    # only edges that carry probability define the structure
    mask = T.data > 0
    lr = labels[rows[mask]]
    lc = labels[T.indices[mask]]
    leaving = np.zeros(ncomp, dtype=bool)
    leaving[lr[lr != lc]] = True
    return labels, ~leaving


def residual(T: sp.csr_matrix, pi: np.ndarray) -> float:
    """``max_j |(pi T)_j - pi_j|``."""
    if not pi.size:
        return 0.0
    TT = T.T.tocsr()
    return float(K.residual_max(TT.indptr.astype(np.int64), TT.indices.astype(np.int64), TT.data, pi))


def _direct(T: sp.csr_matrix) -> np.ndarray:
    n = T.shape[0]
    A = (sp.identity(n, format="csr") - T).T.tocsr().tolil()
    A[0, :] = np.ones(n)
    rhs = np.zeros(n)
    rhs[0] = 1.0
    x = spla.spsolve(A.tocsc(), rhs)
    x = np.maximum(x, 0.0)
    return x / x.sum()


def _power(T: sp.csr_matrix, tol: float, max_iter: int) -> tuple[np.ndarray, int]:
    n = T.shape[0]
    TT = T.T.tocsr()
    x = np.full(n, 1.0 / n)
    for it in range(1, max_iter + 1):
        x = 0.5 * (x + TT @ x)
        x /= x.sum()
        if it % 20 == 0 and float(np.max(np.abs(TT @ x - x))) <= tol * x.max():
            return x, it
    return x, max_iter


def stationary_distribution(T: sp.csr_matrix, solver: str = "auto", tol: float = DEFAULT_TOL,
                            max_sweeps: int = 5_000, x0: np.ndarray | None = None) -> StationaryResult:
    """Stationary distribution of the chain restricted to its unique closed class.

    ``T`` must be row-stochastic.  ``x0`` (optional) warm-starts the iterative
    solvers.  Raises :class:`DTMCError` when the chain has several closed
    classes or the solver is unknown.
    """
    if solver not in SOLVERS:
        raise DTMCError(f"unknown solver {solver!r}; choose one of {', '.join(SOLVERS)}")
    t0 = time.perf_counter()
    n = T.shape[0]
    labels, closed = closed_classes(T)
    cls = np.flatnonzero(closed)
    if cls.size != 1:
        raise DTMCError(f"the chain has {cls.size} closed classes; its long-run behaviour depends on the "
                        f"initial state, so no single stationary distribution exists")
    rec = np.flatnonzero(labels == cls[0])
    sub = T if rec.size == n else T[rec][:, rec].tocsr()
    pi_sub, used, iters = _solve_irreducible(sub, solver, tol, max_sweeps,
                                             None if x0 is None else np.asarray(x0, dtype=np.float64)[rec])
    pi = np.zeros(n)
    pi[rec] = pi_sub
    res = residual(T, pi)
    return StationaryResult(pi=pi, residual=res, solver=used, iterations=iters,
                            seconds=time.perf_counter() - t0, n_recurrent=int(rec.size),
                            n_transient=int(n - rec.size))


def _solve_irreducible(T: sp.csr_matrix, solver: str, tol: float, max_sweeps: int, x0):
    n = T.shape[0]
    if n == 1:
        return np.ones(1), solver if solver != "auto" else "direct", 0
    if solver == "direct":
        return _direct(T), "direct", 1
    if solver == "power":
        x, it = _power(T, tol, max_sweeps * 10)
        return x, "power", it
    TT = T.T.tocsr()
    TT.sort_indices()
    if solver in ("auto", "anderson"):
        x, it, res = _anderson(TT, tol, max_sweeps, x0)
        if res <= tol * x.max():
            return x, "anderson", it
        if res <= max(tol, FLOOR_TOL) * x.max():
            return x, "anderson (stopped at the rounding floor)", it
        if solver == "anderson" or n > DIRECT_FALLBACK_LIMIT:
            raise DTMCError(f"Anderson-accelerated Gauss-Seidel did not reach the tolerance {tol:g} in {it} "
                            f"sweeps (relative residual {res / x.max():.3g}); loosen --tol"
                            + ("" if n > DIRECT_FALLBACK_LIMIT else " or use solver 'direct'"))
        return _direct(T), "direct (after anderson)", it
    x = _start_vector(n, x0)
    sweeps, res = K.gauss_seidel(TT.indptr.astype(np.int64), TT.indices.astype(np.int64), TT.data,
                                 x, float(tol), int(max_sweeps), 10)
    if res <= tol * x.max():
        return x, "gauss-seidel", int(sweeps)
    raise DTMCError(f"Gauss-Seidel did not reach the tolerance {tol:g} in {sweeps} sweeps "
                    f"(residual {res:.3g}); use solver 'direct' or 'auto'")


def _start_vector(n: int, x0) -> np.ndarray:
    if x0 is not None and x0.shape == (n,) and np.all(np.isfinite(x0)) and x0.sum() > 0:
        x = np.maximum(x0, 0.0) + 1e-300
        return x / x.sum()
    return np.full(n, 1.0 / n)


def _anderson(TT: sp.csr_matrix, tol: float, max_sweeps: int, x0, m: int = 4, check_every: int = 5):
    x = _start_vector(TT.shape[0], x0)
    it, res = K.anderson_gs(TT.indptr.astype(np.int64), TT.indices.astype(np.int64), TT.data, x,
                            float(tol), int(max_sweeps), int(m), int(check_every))
    return x, int(it), float(res)
