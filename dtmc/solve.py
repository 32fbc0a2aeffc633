r"""Stationary distribution of a finite DTMC given as a CSR matrix, with its accuracy.

We want :math:`\pi T = \pi`, :math:`\sum \pi = 1` on the states reachable from
the initial state.  The recurrent structure is checked first: the strongly
connected components of the transition graph are computed and the *closed*
ones (no edge leaving them) found.  One closed class: its states carry all the
mass, every other (transient) state gets exactly zero.  Several closed classes:
the long-run behaviour depends on the start and an error is raised, never an
average.

Solvers (all report the residual :math:`\max_j |(\pi T)_j - \pi_j|` and an
error bound, below):

``gth``
    Grassmann-Taksar-Heyman state reduction (:func:`gth`, compiled): states
    are eliminated one by one, each elimination leaving the chain watched on
    the remaining states, :math:`A_{ij} \mathrel{+}= A_{ik}A_{kj}/s_k` with
    :math:`s_k = \sum_{j>k} A_{kj}` (never :math:`1 - T_{kk}`), then
    back-substitution.  No subtraction, so every component has a small
    *relative* error however weakly the chain's parts are coupled; its
    rounding analysis gives an a-priori bound.  Skyline storage of the
    symmetrised pattern, in the cheapest of breadth-first, reversed
    breadth-first and reverse Cuthill-McKee order (:func:`gth_plan`).  Where
    the double elimination underflows (stiff chains), it is repeated in
    extended-exponent arithmetic, which cannot.
``direct``
    scipy's sparse LU (``spsolve``) on :math:`(I - T)^\top \pi = 0` with one
    equation replaced by :math:`\sum \pi = 1`.  Slow on big chains, and
    inaccurate on nearly decomposable ones (cancellation).  A cross-check.
``gauss-seidel``
    In-place sweeps :math:`\pi_j \leftarrow \sum_{i\ne j}\pi_i T_{ij}/(1-T_{jj})`
    in state order, renormalised after each sweep, until the residual is at
    most ``tol`` (compiled).
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
    ``anderson`` and its tree bound; GTH instead when that bound leaves the
    throughput error above ``ACCURACY_TARGET`` (1e-9) and GTH is cheap, or
    above ``ACCURACY_TOL`` (1e-6) and GTH fits; GTH (else ``direct``) when
    the iteration does not converge.

A small residual proves nothing on slowly mixing chains: a vector that
misplaces the mass between two weakly coupled parts has a residual of the
size of the coupling.  Hence the error bound, ``error_bound`` (on
:math:`\max_j |\tilde\pi_j/\pi_j - 1|`, so also on the l1 error):

* *tree bound* (:func:`bound_error`, every solver): the flow imbalances of
  :math:`\tilde\pi` (double-double) are routed along a spanning tree of large
  flows, which makes :math:`\tilde\pi` exactly stationary for a chain whose
  transitions differ by known factors :math:`1+\epsilon_e`; by the Markov
  chain tree theorem :math:`|\ln(\tilde\pi_j/\pi_j)| \le 2\sum_a \max_{e\ni a}
  -\ln(1-\epsilon_e)`.  Infinite when some :math:`\epsilon_e \ge 1`.
* *GTH rounding analysis* (:func:`dtmc._kernels.gth_solve`, or
  :func:`dtmc._kernels.gth_solve_scaled` after an underflow).
* *estimate* (bound_method ``estimate: ...``), only when GTH has neither:
  ten times the l1 distance to a second, independent solve.  Never
  ``accuracy_ok``.

A solve that does not converge raises :class:`SolveFailed` (a valid chain, not
bad input: the tools exit with code 3 and say what to do).

Rounding sets a floor under the attainable residual that grows with the chain
(about 1e-13 relative at a million states).  An iteration that stalls there
stops; its result is accepted when the relative residual is below
``FLOOR_TOL`` (1e-11), with the solver named "... (stopped at the rounding
floor)" and the residual reported as always.  The direct fallback is refused
above ``DIRECT_FALLBACK_LIMIT`` states, where LU fill-in would need minutes
and many GiB.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from scipy.sparse.csgraph import connected_components

from dtmc import _kernels as K
from dtmc.chain import DTMCError

SOLVERS = ("auto", "anderson", "gauss-seidel", "gth", "direct", "power")
DEFAULT_TOL = 1e-13  # on max|pi T - pi| / max(pi)
# An iterate that stalls (rounding floor) is accepted when its relative residual is below this;
# its residual is reported as usual, and the solver name says so.
FLOOR_TOL = 1e-11
# Above this many states the direct LU fallback would take minutes and many GiB: refuse instead.
DIRECT_FALLBACK_LIMIT = 300_000
# ``auto`` re-solves with GTH when the throughput error bound of the iterate exceeds ACCURACY_TARGET and
# GTH is cheap (work ceiling sum_k c_k^2 <= GTH_CHEAP_WORK, ~10-50 ms; the true count is 10-100x lower), or
# when it exceeds ACCURACY_TOL and GTH fits at all (ceiling <= GTH_MAX_WORK, ~1-5 s, and GTH_MAX_BYTES).  A result whose
# throughput bound exceeds ACCURACY_TOL is flagged (accuracy_ok False).
ACCURACY_TARGET = 1e-9
ACCURACY_TOL = 1e-6
GTH_CHEAP_WORK = 2e8
GTH_CHEAP_NNZ = 300_000   # above this many transitions the cheap re-solve is not even planned
GTH_MAX_WORK = 2e10
GTH_MAX_BYTES = 2 * 2**30
# A converged iterate whose throughput bound is above POLISH_ABOVE (= ACCURACY_TOL: the chains that would be
# flagged; below, the cost would buy nothing a result reports) is polished by at most POLISH_SWEEPS plain
# Gauss-Seidel sweeps (rounds of 2, 4, 8, ... while the bound keeps falling; see polish), aiming at
# ACCURACY_TARGET; with ``tighten`` (a search's rival of B*) from ACCURACY_TARGET up, by at most
# TIGHT_POLISH_SWEEPS, and auto then runs GTH up to GTH_TIGHT_WORK (~10-50 s) when the bound is still above
# ACCURACY_TOL.
POLISH_ABOVE = ACCURACY_TOL
POLISH_SWEEPS = 16
# a polishing round that lowers the tree bound by less than this factor is the last
POLISH_MIN_FALL = 1.5
TIGHT_POLISH_SWEEPS = 512
GTH_TIGHT_WORK = 2e11
# An iterate whose pi bound leaves the throughput error above ACCURACY_TOL (ACCURACY_TARGET with ``tighten``)
# gets the relative-value bracket of its throughput (throughput_bracket: the relative values of the Poisson
# equation, iterated, then by one sparse LU solve when that is not enough) before any GTH re-solve; the LU
# only up to BRACKET_MAX_STATES states (BRACKET_TIGHT_STATES with ``tighten``), the iteration at any size.
# Measured on R2R (p = 0.35, L = 6.0 / 27.9 ms) at N = 256: 0.2-0.3 s at 23,000-30,000 states against 1e-3
# left by the tree bound, 32 s at 630,000 states.
BRACKET_MAX_STATES = 200_000
BRACKET_TIGHT_STATES = 700_000
# ... and only when its fill is not prohibitive: the LU is skipped when lu_work (the smaller skyline work of the
# breadth-first order and its reverse) is above this.  R2R (p = 0.35, L = 6.0 / 27.9 ms): 1.8e11 -> LU 0.3 s
# (N = 256, 22,693 states), 9.7e11 -> 12 s (N = 64 eager, 228,265), 2.3e13 -> 52 s (N = 256 (8, 100), 651,546);
# R2R under the H200 graph-mode L(b) at N = 32, eager (173,897 states, every batch size its own duration):
# 4.5e14, and the LU had not ended after 10 minutes
BRACKET_LU_MAX_WORK = 5e13
# The relative values are first iterated (Gauss-Seidel, at most BRACKET_GS_SWEEPS sweeps in each order) until
# the bracket they give is within ACCURACY_TARGET; only a chain that mixes too slowly for that gets the LU
# solve.  Measured (sweeps backwards, then forwards if needed) on R2R (p = 0.35, L = 6.0 / 27.9 ms) at N = 256:
# 30-40 sweeps at 5,000-23,000 states (forwards alone 20-150), against 0.22-0.37 s for the LU (a bracket of
# 1e-11 either way); ME (w = 0.5 / 0.3 / 0.2) eager at N = 8, 1.48 M states: 100 sweeps, 4.5 s (forwards 600
# sweeps, 26 s); benchmarks/RESULTS.md, "Throughput bracket" (`python benchmarks/run.py bracket`).
BRACKET_GS_SWEEPS = 600
BRACKET_GS_MEMORY = 4
# skyline bytes per stored entry: the double elimination keeps 2 x 8, the extended-exponent one (used
# when the first underflows) 2 x (8 + 4)
GTH_BYTES_PER_ENTRY = 24


class SolveFailed(RuntimeError):
    """A valid chain whose stationary solve failed or hit a resource limit (not bad input).

    ``advice`` says what to do (another solver, a looser tolerance, a coarser grid).
    """

    def __init__(self, message: str, advice: str = ""):
        self.advice = advice
        super().__init__(message + (f"; {advice}" if advice else ""))


@dataclass(frozen=True)
class StationaryResult:
    pi: np.ndarray
    residual: float
    solver: str
    iterations: int
    seconds: float
    n_recurrent: int
    n_transient: int
    # bound on max_j |pi_j / pi*_j - 1| over the recurrent states (pi* the exact stationary vector of
    # the chain as stored); inf when none could be established
    error_bound: float = float("inf")
    bound_method: str = ""
    # a second GTH solve in another elimination order, when the bound is only an estimate from the two
    pi_alt: np.ndarray | None = None
    # GTH rounding analysis: |ln(y_j / pi*_j)| <= log_bound for the exact back-substitution y, and
    # |pi_j - y_j| <= abs_error_j (None for the other bounds, where log_bound bounds pi itself)
    log_bound: float = float("inf")
    abs_error: np.ndarray | None = None
    # certified (lower, upper) on sum(pi g) / sum(pi tau) from throughput_bracket, when the solve was given
    # the rewards and its pi bound left the throughput loose (None otherwise)
    throughput_bracket: tuple | None = None


def closed_classes(T: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """Label the strongly connected components and flag the closed ones.

    Returns ``(labels, closed)`` where ``closed[c]`` is true when component
    ``c`` has no edge to another component.
    """
    ncomp, labels = connected_components(T, directed=True, connection="strong")
    # only edges that carry probability define the structure (one compiled pass: the vectorised form
    # built four arrays of nnz entries and took twice as long as the components themselves)
    leaving = K.leaving_components(T.indptr, T.indices, T.data, labels, int(ncomp))
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
                            max_sweeps: int = 5_000, x0: np.ndarray | None = None,
                            tighten: bool = False, rewards=None) -> StationaryResult:
    """Stationary distribution of the chain restricted to its unique closed class, with an error bound.

    ``T`` must be row-stochastic.  ``x0`` (optional) warm-starts the iterative
    solvers.  ``error_bound`` bounds the relative error of every recurrent
    component (see :func:`bound_error`, and :func:`gth` for the GTH bound).
    With ``solver="auto"`` an iterate whose bound would leave the throughput
    error above ``ACCURACY_TARGET`` is replaced by a GTH solve when GTH fits
    (``GTH_MAX_WORK``, ``GTH_MAX_BYTES``).  Before that, an ``anderson``,
    ``gauss-seidel`` or ``auto`` iterate whose throughput bound is above
    ``POLISH_ABOVE`` (1e-6) is polished by plain Gauss-Seidel sweeps
    (:func:`polish`, at most ``POLISH_SWEEPS``).
    ``tighten``: more effort for a result whose bound matters (a search's
    rival of B*): up to ``TIGHT_POLISH_SWEEPS`` sweeps, and ``auto`` runs GTH
    up to ``GTH_TIGHT_WORK``.  ``rewards``: ``(g, tau)`` per state (the
    chain's reward and holding time); with them an iterative solve whose pi
    bound leaves the throughput ``g/tau`` error above ``ACCURACY_TOL`` also
    gets :func:`throughput_bracket` (``throughput_bracket`` of the result;
    with ``auto``, a bracket within ``ACCURACY_TARGET`` replaces the GTH
    re-solve).  Raises :class:`DTMCError` when the
    chain has several closed classes or the solver is unknown.
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
    TT = sub.T.tocsr()
    TT.sort_indices()
    # int64 index arrays once, so the kernels (iteration, bound, residual) do not each copy them
    sub, TT = _with_i64(sub), _with_i64(TT)
    rw = None
    if rewards is not None:
        rw = tuple(np.asarray(v, dtype=np.float64) for v in rewards)
        rw = rw if rec.size == n else (rw[0][rec], rw[1][rec])
    pi_sub, used, iters, log_bound, how, extra = _solve_irreducible(
        sub, TT, solver, tol, max_sweeps, None if x0 is None else np.asarray(x0, dtype=np.float64)[rec],
        tighten=tighten, rewards=rw)
    pi = np.zeros(n)
    pi[rec] = pi_sub
    alt, err, bracket = extra
    pi_alt = abs_err = None
    bound = float(np.expm1(log_bound))
    if alt is not None:
        pi_alt = np.zeros(n)
        pi_alt[rec] = alt
        # an estimate, not a bound: ten times the l1 distance of two GTH solves in different orders
        bound = float(10.0 * np.abs(pi_sub - alt).sum() + 1e-15)
    elif err is not None:
        abs_err = np.zeros(n)
        abs_err[rec] = err
        # |pi - y| <= err componentwise, and normalising y/sum(y) against pi moves it by at most sum(err) more
        bound = float(np.expm1(log_bound) + 2.0 * err.sum())
    # the class is closed, so (pi T)_j = 0 = pi_j on every transient state: the residual is the block's
    res = _residual_tt(TT, pi_sub)
    return StationaryResult(pi=pi, residual=res, solver=used, iterations=iters,
                            seconds=time.perf_counter() - t0, n_recurrent=int(rec.size),
                            n_transient=int(n - rec.size), error_bound=bound, bound_method=how,
                            pi_alt=pi_alt, log_bound=float(log_bound), abs_error=abs_err,
                            throughput_bracket=bracket)


def throughput_bound(pi_error_bound: float, n: int) -> float:
    """Relative error bound of a ratio ``sum(pi a) / sum(pi b)`` (a, b >= 0) given the pi bound.

    Each sum moves by a factor within ``exp(+-L)``, ``L = ln(1 + bound)``
    (the bound is on ``|pi_j/pi*_j - 1|``, and ``ln(1 - e) >= -L`` needs
    ``e <= 1 - exp(-L)``, which holds for the tree and GTH bounds, both of
    log form), and each sum's own rounding by ``gamma_n``.
    """
    if not np.isfinite(pi_error_bound):
        return float("inf")
    g = n * 2.0 ** -53 / (1.0 - n * 2.0 ** -53)
    return float(np.expm1(2.0 * np.log1p(pi_error_bound) + 4.0 * g))


def bound_error(T: sp.csr_matrix, pi: np.ndarray) -> float:
    """A-posteriori bound on ``max_j |pi_j / pi*_j - 1|`` for an approximation ``pi`` of an irreducible chain.

    The tree bound of :func:`dtmc._kernels.tree_bound`: the imbalances of
    ``pi`` are routed along a spanning tree, which makes ``pi`` the exact
    stationary vector of a chain whose transitions differ from ``T``'s by
    known relative factors; the Markov chain tree theorem turns those into a
    relative bound on every component.  It is inf when ``pi`` cannot be
    certified (e.g. a slowly mixing chain whose weak links carry less flow
    than the imbalances).
    """
    T = T.tocsr()
    T.sort_indices()
    TT = T.T.tocsr()
    return float(np.expm1(_tree_log_bound(T, TT, np.asarray(pi, dtype=np.float64))))


def _i64(a):
    return a.astype(np.int64, copy=False)


def _with_i64(A: sp.csr_matrix) -> sp.csr_matrix:
    """The same CSR matrix (shared data) with int64 index arrays."""
    if A.indptr.dtype == np.int64 and A.indices.dtype == np.int64:
        return A
    B = sp.csr_matrix(A.shape, dtype=A.dtype)
    B.data, B.indices, B.indptr = A.data, _i64(A.indices), _i64(A.indptr)
    B.has_sorted_indices = A.has_sorted_indices
    return B


def _tree_log_bound(T, TT, x) -> float:
    n = T.shape[0]
    if n == 1:
        return 0.0
    L, status = K.tree_bound(_i64(T.indptr), _i64(T.indices), T.data, _i64(TT.indptr), _i64(TT.indices),
                             TT.data, x)
    return float(L) if status == 0 else float("inf")


def _residual_tt(TT, pi) -> float:
    if not pi.size:
        return 0.0
    return float(K.residual_max(_i64(TT.indptr), _i64(TT.indices), TT.data, pi))


GTH_ORDERS = ("breadth-first", "reversed breadth-first", "reverse Cuthill-McKee")


def gth_orders(T: sp.csr_matrix) -> list:
    """The candidate elimination orders: ``[(name, order or None for the states' own), ...]``.

    The states' own order is breadth-first from the initial state; eliminating it *reversed* removes
    the far states first, while they still have few neighbours left (on R2R chains 20-500x fewer
    multiply-adds); reverse Cuthill-McKee narrows the band of the symmetrised pattern.
    """
    from scipy.sparse.csgraph import reverse_cuthill_mckee
    n = T.shape[0]
    out = [(GTH_ORDERS[0], None)]
    if n > 2:
        out.append((GTH_ORDERS[1], np.arange(n - 1, -1, -1, dtype=np.int64)))
        out.append((GTH_ORDERS[2], reverse_cuthill_mckee((T + T.T).tocsr(), symmetric_mode=True)
                    .astype(np.int64)))
    return out


def gth_cost(T: sp.csr_matrix, order) -> tuple[float, int]:
    """``(work, bytes)`` of GTH in ``order``: the ceiling ``sum_k c_k^2`` on its multiply-adds (``c_k``: rows
    alive at step k of the skyline) and the bytes of the skyline in extended-exponent storage."""
    A = T if order is None else T[order][:, order].tocsr()
    work, prof = K.gth_work(K.gth_envelope(_i64(A.indptr), _i64(A.indices)))
    return float(work), GTH_BYTES_PER_ENTRY * int(prof)


def gth_plan(T: sp.csr_matrix, limit: float | None = None) -> tuple[np.ndarray | None, float, int]:
    """Elimination order for GTH and its cost: ``(order or None for the given one, work, bytes)``.

    Breadth-first, reversed breadth-first and reverse Cuthill-McKee orders (:func:`gth_orders`) are
    compared by the work ceiling of the skyline each leaves (:func:`gth_cost`, a few passes over the
    matrix each) and the cheapest is returned.  ``limit`` is accepted for compatibility and unused.
    """
    T = T.tocsr()
    best = None
    for _name, order in gth_orders(T):
        work, nbytes = gth_cost(T, order)
        if best is None or work < best[1]:
            best = (order, work, nbytes)
    return best


def gth(T: sp.csr_matrix, plan=None):
    """GTH stationary vector of an irreducible chain: ``(pi, log_bound, how, pi_alt, abs_err)``.

    The elimination runs in doubles, and again in extended-exponent arithmetic
    (:func:`dtmc._kernels.gth_solve_scaled`, which cannot underflow) when the
    double one underflowed; ``how`` then ends with "(extended exponents)".
    With ``how`` starting "gth rounding analysis": ``log_bound`` bounds
    ``|ln(y_j / pi*_j)|`` for the exact back-substitution ``y`` and
    ``abs_err`` bounds ``|pi_j - y_j|`` (see
    :func:`dtmc._kernels.gth_solve`).  With ``"tree bound"`` (taken when it is
    smaller): ``log_bound`` bounds ``|ln(pi_j / pi*_j)|`` and ``abs_err`` is
    None.  When neither exists, GTH is run again in a second elimination
    order and ``pi_alt`` is returned: the caller estimates the error from the
    two (``how`` then says "estimate").  Raises :class:`SolveFailed` when the
    elimination fails in both arithmetics.
    """
    T = T.tocsr()
    plan = plan if plan is not None else gth_plan(T)
    pi, a_priori, err, scaled = _gth_once(T, plan[0])
    TT = T.T.tocsr()
    TT.sort_indices()
    post = _tree_log_bound(T, TT, pi)
    tag = " (extended exponents)" if scaled else ""
    if np.isfinite(a_priori):
        l1_priori = float(np.expm1(a_priori) + 2.0 * err.sum())
        if l1_priori <= np.expm1(post):
            return pi, a_priori, "gth rounding analysis" + tag, None, err
    if np.isfinite(post):
        return pi, post, "tree bound", None, None
    # neither bound: a second, independent elimination order for an estimate
    others = [(gth_cost(T, o), o) for name, o in gth_orders(T)
              if (o is None) != (plan[0] is None) or (o is not None and not np.array_equal(o, plan[0]))]
    others = [(c, o) for c, o in others if c[0] <= max(GTH_MAX_WORK, 2.0 * plan[1]) and c[1] <= GTH_MAX_BYTES]
    if not others:
        return pi, float("inf"), "none (no GTH bound, no second order fits)", None, None
    _c, other = min(others, key=lambda t: t[0][0])
    pi_alt = _gth_once(T, other)[0]
    return pi, float("inf"), "estimate: two GTH orders", pi_alt, None


def _gth_once(T, order):
    """``(pi, log bound of the exact back-substitution, absolute errors, extended arithmetic used)``.

    The double elimination first; where it underflows (a reduced-chain entry below the normal range,
    or an out-sum rounded to 0 on a stiff chain), the extended-exponent one, whose bound always holds.
    """
    n = T.shape[0]
    A = T if order is None else T[order][:, order].tocsr()
    lo = K.gth_envelope(_i64(A.indptr), _i64(A.indices))
    ip, ix = _i64(A.indptr), _i64(A.indices)
    status, x, L, _flops, under, err = K.gth_solve(ip, ix, A.data, lo, True)
    scaled = status != K.GTH_OK or under > 0
    if scaled:
        status, x, L, _flops, under, err = K.gth_solve_scaled(ip, ix, A.data, lo)
    elif float(np.expm1(L) + 2.0 * err.sum()) > ACCURACY_TARGET:
        # the double back-substitution's absolute error terms (2^-1074 / s_k) are loose where out-sums
        # are near the bottom of the double range: the extended one's relative bound is kept when tighter
        s2, x2, L2, _f2, _u2, err2 = K.gth_solve_scaled(ip, ix, A.data, lo)
        if s2 == K.GTH_OK and float(np.expm1(L2) + 2.0 * err2.sum()) < float(np.expm1(L) + 2.0 * err.sum()):
            x, L, err, scaled = x2, L2, err2, True
    if status != K.GTH_OK:
        what = ("an exponent beyond 2^30" if status == K.GTH_RANGE
                else "a state with no way out of the states left")
        raise SolveFailed(f"GTH elimination met {what} on a chain of {n:,} states (internal error: the "
                          f"recurrent class is irreducible)", "use --solver anderson")
    if order is not None:
        pi = np.empty(n)
        pi[order] = x
        e = np.empty(n)
        e[order] = err
    else:
        pi, e = x, err
    return pi, float(L), e, scaled


def _solve_irreducible(T: sp.csr_matrix, TT: sp.csr_matrix, solver: str, tol: float, max_sweeps: int, x0,
                       tighten: bool = False, rewards=None):
    """``(pi, solver used, iterations, log bound, bound method, (second solve or None, GTH abs. errors or None,
    throughput bracket or None))``; ``rewards``: ``(g, tau)`` on these states, for :func:`throughput_bracket`."""
    n = T.shape[0]
    if n == 1:
        return np.ones(1), solver if solver != "auto" else "direct", 0, 0.0, "exact (one state)", (None, None, None)
    if solver == "gth":
        x, L, how, alt, err = gth(T)
        return x, "gth", 1, L, how, (alt, err, None)
    if solver == "direct":
        x = _direct(T)
        return x, "direct", 1, _tree_log_bound(T, TT, x), "tree bound", (None, None, None)
    if solver == "power":
        x, it = _power(T, tol, max_sweeps * 10)
        return x, "power", it, _tree_log_bound(T, TT, x), "tree bound", (None, None, None)
    if solver in ("auto", "anderson"):
        x, it, res = _anderson(TT, tol, max_sweeps, x0)
        if res <= tol * x.max():
            used = "anderson"
        elif res <= max(tol, FLOOR_TOL) * x.max():
            used = "anderson (stopped at the rounding floor)"
        elif solver == "anderson":
            raise SolveFailed(f"Anderson-accelerated Gauss-Seidel did not reach the tolerance {tol:g} in {it} "
                              f"sweeps (relative residual {res / x.max():.3g})",
                              "loosen --tol, or use --solver auto or gth")
        else:
            used = None
        L = float("inf")
        if used is not None:
            L = _tree_log_bound(T, TT, x)
            if throughput_bound(float(np.expm1(L)), n) > (ACCURACY_TARGET if tighten else POLISH_ABOVE):
                # the far, improbable states are not converged *relatively* (see polish): a few plain sweeps
                x, L, k = polish(T, TT, x, L, max_sweeps=TIGHT_POLISH_SWEEPS if tighten else POLISH_SWEEPS)
                if k:
                    it += k
                    used = f"{used} + {k} gauss-seidel sweeps"
            tb = throughput_bound(float(np.expm1(L)), n)
            br = _bracket_if_loose(T, x, tb, rewards, tighten)
            if solver == "anderson" or tb <= ACCURACY_TARGET or _bracket_error(br, x, rewards) <= ACCURACY_TARGET:
                # (a tight bracket bounds the throughput: no GTH re-solve for it)
                return x, used, it, L, "tree bound", (None, None, br)
            limit = GTH_MAX_WORK if tb > ACCURACY_TOL else GTH_CHEAP_WORK
            if tighten and tb > ACCURACY_TOL:
                limit = GTH_TIGHT_WORK
            if limit == GTH_CHEAP_WORK and T.nnz > GTH_CHEAP_NNZ:
                # a bound in (1e-9, 1e-6] on a big chain: GTH would not be cheap; skip even planning it
                return x, used, it, L, "tree bound", (None, None, br)
        else:
            br = None
            limit = GTH_TIGHT_WORK if tighten else GTH_MAX_WORK
        # auto: the iterate is not bounded tightly enough (or did not converge): GTH where it fits
        plan = gth_plan(T)
        if plan[1] <= limit and plan[2] <= GTH_MAX_BYTES:
            try:
                xg, Lg, how, alt, err = gth(T, plan)
            except (SolveFailed, MemoryError):
                if used is None:
                    raise
                # GTH failed: the iterate is kept, with its own (loose) bound; nothing is discarded
                return x, used, it, L, "tree bound", (None, None, br)
            if alt is None and not np.isfinite(Lg) and used is not None:
                # no bound and no second GTH order: the iterate is the second, independent solve
                alt, how = x, "estimate: GTH vs anderson"
            lg1 = float(np.expm1(Lg)) + (0.0 if err is None else 2.0 * float(err.sum()))
            if used is None or lg1 <= np.expm1(L) or alt is not None:
                # (the bracket bounds the chain's true throughput, whichever vector is reported)
                return (xg, f"gth (after {'anderson' if used is None else used.split(' ')[0]})", it, Lg, how,
                        (alt, err, br))
        if used is not None:
            return x, used, it, L, "tree bound", (None, None, br)
        if n > DIRECT_FALLBACK_LIMIT:
            raise SolveFailed(f"Anderson-accelerated Gauss-Seidel did not reach the tolerance {tol:g} in {it} "
                              f"sweeps (relative residual {res / x.max():.3g}), and the chain ({n:,} states) "
                              f"is too large for GTH (work ceiling {plan[1]:.3g} multiply-adds) or sparse LU",
                              "loosen --tol, or use a coarser --delta-ms")
        xd = _direct(T)
        return xd, "direct (after anderson)", it, _tree_log_bound(T, TT, xd), "tree bound", (None, None, None)
    x = _start_vector(n, x0)
    sweeps, res = K.gauss_seidel(_i64(TT.indptr), _i64(TT.indices), TT.data, x, float(tol), int(max_sweeps), 10)
    if res <= tol * x.max():
        L = _tree_log_bound(T, TT, x)
        if throughput_bound(float(np.expm1(L)), n) > (ACCURACY_TARGET if tighten else POLISH_ABOVE):
            x, L, k = polish(T, TT, x, L, max_sweeps=TIGHT_POLISH_SWEEPS if tighten else POLISH_SWEEPS)
            sweeps += k
        br = _bracket_if_loose(T, x, throughput_bound(float(np.expm1(L)), n), rewards, tighten)
        return x, "gauss-seidel", int(sweeps), L, "tree bound", (None, None, br)
    raise SolveFailed(f"Gauss-Seidel did not reach the tolerance {tol:g} in {sweeps} sweeps "
                      f"(residual {res:.3g})", "loosen --tol, or use --solver auto or gth")


def _bracket_if_loose(T: sp.csr_matrix, x: np.ndarray, tb: float, rewards, tighten: bool):
    """:func:`throughput_bracket` of the iterate ``x`` when its pi bound leaves the throughput error ``tb``
    above ``ACCURACY_TOL`` (``ACCURACY_TARGET`` with ``tighten``); None otherwise (or without ``rewards``).
    Its LU fallback only for chains of at most ``BRACKET_MAX_STATES`` states (``BRACKET_TIGHT_STATES``): a
    larger one keeps the iterated bracket, whatever its width."""
    if rewards is None or not tb > (ACCURACY_TARGET if tighten else ACCURACY_TOL):
        return None
    direct = T.shape[0] <= (BRACKET_TIGHT_STATES if tighten else BRACKET_MAX_STATES)
    return throughput_bracket(T, rewards[0], rewards[1], x, direct=direct)


def _bracket_error(br, x: np.ndarray, rewards) -> float:
    """The relative error the bracket ``br`` proves on the throughput of ``x`` (inf without one)."""
    if br is None:
        return float("inf")
    return bracket_error(br, float(x @ rewards[0]) / float(x @ rewards[1]))


def bracket_error(br, value: float) -> float:
    """``max(value - lo, hi - value) / value`` for a certified bracket ``br = (lo, hi)`` of the true
    throughput: a bound on the relative error of ``value`` (inf when it is not positive)."""
    lo, hi = br
    if not (value > 0) or not (np.isfinite(lo) and np.isfinite(hi)):
        return float("inf")
    return float(max(value - lo, hi - value, 0.0) / value)


def chain_bracket(T, g: np.ndarray, tau: np.ndarray, h: np.ndarray) -> tuple[float, float]:
    """Certified ``(lower, upper)`` on a chain's throughput ``lam = pi g / pi tau`` from any vector ``h``.

    ``T``: CSR transition matrix (rows sum to 1), ``g``/``tau``: per-state reward and holding time (tau > 0),
    ``h``: any finite vector (best: the chain's relative values).  For the stationary ``pi``,
    ``pi (T h - h) = 0``, so ``lam = pi (g + T h - h) / pi tau`` is a ``pi tau``-weighted mean of
    ``D = (g + T h - h) / tau`` and lies between its min and max (over all states: the recurrent ones suffice,
    more only widens it).  Each ``D`` is widened by the rounding of its sums.
    """
    h = np.asarray(h, dtype=np.float64)
    g = np.asarray(g, dtype=np.float64)
    tau = np.asarray(tau, dtype=np.float64)
    D = (g + T @ h - h) / tau
    scale = (np.abs(g) + abs(T) @ np.abs(h) + np.abs(h)) / tau
    err = float(np.max(scale)) * 8 * np.finfo(np.float64).eps * max(1, int(T.shape[0])) ** 0.5
    return float(np.min(D)) - err, float(np.max(D)) + err


def relative_values(T, g: np.ndarray, tau: np.ndarray, pi: np.ndarray, *, method: str = "direct",
                    max_sweeps: int | None = None, tol: float = 0.5 * ACCURACY_TARGET) -> np.ndarray:
    """``h`` with ``g - lam tau + T h - h = 0`` and ``h = 0`` at the most probable state.

    ``lam = pi g / pi tau`` from the given (approximate) ``pi``.  ``method``: ``"direct"``, one sparse LU
    solve: the equation is singular (``h`` is defined up to a constant), so the column of the reference
    state is replaced by a unit one, whose unknown absorbs the inconsistency an approximate ``lam`` leaves;
    ``"gauss-seidel"``, relative value iteration (:func:`dtmc._kernels.poisson_gs`) from zero, stopped once
    the bracket ``h`` gives is narrower than ``tol * lam`` or after ``max_sweeps`` sweeps (default
    ``BRACKET_GS_SWEEPS``; Anderson memory ``BRACKET_GS_MEMORY``): sweeping backwards through the states,
    then, when that stops short of ``tol``, forwards from zero again (the narrower bracket's ``h`` is kept).
    :func:`chain_bracket` is valid whatever ``h`` is, so an inaccurate ``h`` only widens it; a failed
    solve returns zeros (the widest bracket, still valid).
    """
    if method not in ("direct", "gauss-seidel"):
        raise ValueError(f"method must be 'direct' or 'gauss-seidel', got {method!r}")
    n = T.shape[0]
    pi = np.asarray(pi, dtype=np.float64)
    lam = float(pi @ g) / float(pi @ tau)
    r = np.asarray(g, dtype=np.float64) - lam * np.asarray(tau, dtype=np.float64)
    ref = int(np.argmax(pi))
    if method == "gauss-seidel":
        Tc = T.tocsr()
        args = (_i64(Tc.indptr), _i64(Tc.indices), np.ascontiguousarray(Tc.data, dtype=np.float64), r,
                np.ascontiguousarray(tau, dtype=np.float64), ref)
        rest = (float(tol * abs(lam)), int(BRACKET_GS_SWEEPS if max_sweeps is None else max_sweeps),
                int(BRACKET_GS_MEMORY), 10)
        # backwards first (values travel against the enumeration's order: a few sweeps where forwards takes
        # hundreds), forwards from zero when that stops short: on some chains only one order converges
        best, width = np.zeros(n), math.inf
        for backward in (True, False):
            h = np.zeros(n)
            _, spread = K.poisson_gs(*args, h, *rest, backward)
            if np.all(np.isfinite(h)) and spread < width:
                best, width = h, spread
            if width <= rest[0]:
                break
        return best
    A = (sp.identity(n, format="csr") - T).tocsc()
    A.sort_indices()
    s, e = int(A.indptr[ref]), int(A.indptr[ref + 1])
    at = s + np.flatnonzero(A.indices[s:e] == ref)
    A.data[s:e] = 0.0
    if at.size == 1:
        A.data[at] = 1.0
    else:   # no stored diagonal entry in that column (never for a chain with a transition out of ref)
        A = A.tolil()
        A[ref, ref] = 1.0
        A = A.tocsc()
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", spla.MatrixRankWarning)   # singular: checked below
            h = spla.spsolve(A, r)
    except Exception:  # singular (several classes): the bracket stays valid with h = 0
        return np.zeros(n)
    if not np.all(np.isfinite(h)):
        return np.zeros(n)
    h[ref] = 0.0
    return h


def lu_work(T: sp.csr_matrix) -> float:
    """A cheap proxy of a sparse LU's cost on ``I - T``: the smaller GTH work ceiling (:func:`gth_cost`) of the
    states' own (breadth-first) order and its reverse (no reordering to compute: a few passes over the
    matrix).  It decides only whether the bracket's LU is tried."""
    T = T.tocsr()
    n = T.shape[0]
    work = gth_cost(T, None)[0]
    if n > 2:
        work = min(work, gth_cost(T, np.arange(n - 1, -1, -1, dtype=np.int64))[0])
    return work


def throughput_bracket(T, g: np.ndarray, tau: np.ndarray, pi: np.ndarray, *,
                       direct: bool = True) -> tuple[float, float]:
    """Certified ``(lower, upper)`` on the throughput of an irreducible chain: :func:`chain_bracket` with the
    relative values of :func:`relative_values` (from the approximate ``pi``), iterated first and, with
    ``direct``, solved by LU when the iteration leaves the bracket wider than ``ACCURACY_TARGET`` (then the two
    brackets, both valid, are intersected).  Its width is set by the residual of the Poisson equation, the same at every state, so
    it stays tight where a bound on every component of ``pi`` cannot be (the improbable states of a large,
    slowly mixing chain)."""
    br = chain_bracket(T, g, tau, relative_values(T, g, tau, pi, method="gauss-seidel"))
    pi = np.asarray(pi, dtype=np.float64)
    value = float(pi @ g) / float(pi @ tau)
    if not direct or bracket_error(br, value) <= ACCURACY_TARGET or lu_work(T) > BRACKET_LU_MAX_WORK:
        return br
    lo, hi = chain_bracket(T, g, tau, relative_values(T, g, tau, pi, method="direct"))
    return max(lo, br[0]), min(hi, br[1])


def polish(T: sp.csr_matrix, TT: sp.csr_matrix, x: np.ndarray, log_bound: float,
           max_sweeps: int = POLISH_SWEEPS) -> tuple[np.ndarray, float, int]:
    """Plain Gauss-Seidel sweeps on a converged iterate, kept while its tree bound falls:
    ``(x, log bound, sweeps)`` (the input itself and 0 sweeps when none helped).

    Why: the iterations stop on the residual relative to ``max(pi)``, which cannot see states whose
    probability is 1e-90 of the largest (the far corners of a large chain: R2R p = 0.35, N = 64, eager,
    has 41,772 states below 1e-20 of the largest).  There the iterate can be wrong by any factor, and the
    tree bound, a sum over *every* state of its relative imbalance, says so: 290 relative on the
    throughput after 10 Anderson sweeps.  A Gauss-Seidel sweep sets each component from its
    predecessors' current values, so the relative error of those states falls at every sweep, while
    Anderson's extrapolation (made for the residual) need not reduce it; on that chain two sweeps bring
    the bound to 1.9e-5 and six to 1.9e-8.  The bound is recomputed from scratch after each round
    (2, 4, 8, ... sweeps), so it holds whatever the sweeps did; the rounds stop once it is within
    ``ACCURACY_TARGET``, falls by less than ``POLISH_MIN_FALL`` in a round, or ``max_sweeps`` are spent.
    (A slowly mixing chain's bound falls steadily but slowly: R2R with the H200 graph-mode L(b) at N = 32,
    eager, 173,897 states, 1.6e-6 after Anderson, 1.8x in the first two sweeps, 8.5e-9 after 16.)
    """
    n = T.shape[0]
    ip, ix = _i64(TT.indptr), _i64(TT.indices)
    done = 0
    step = 2
    used = 0
    while done < max_sweeps and throughput_bound(float(np.expm1(log_bound)), n) > ACCURACY_TARGET:
        step = min(step, max_sweeps - done)
        y = x.copy()
        K.gauss_seidel(ip, ix, TT.data, y, 0.0, int(step), int(step) + 1)
        done += step
        L2 = _tree_log_bound(T, TT, y)
        if not L2 < log_bound:
            break
        improved = math.expm1(log_bound) >= POLISH_MIN_FALL * math.expm1(L2)
        x, log_bound, used = y, L2, done
        if not improved:
            break
        step *= 2
    return x, float(log_bound), used


def _start_vector(n: int, x0) -> np.ndarray:
    if x0 is not None and x0.shape == (n,) and np.all(np.isfinite(x0)) and x0.sum() > 0:
        x = np.maximum(x0, 0.0) + 1e-300
        return x / x.sum()
    return np.full(n, 1.0 / n)


def _anderson(TT: sp.csr_matrix, tol: float, max_sweeps: int, x0, m: int = 4, check_every: int = 5):
    x = _start_vector(TT.shape[0], x0)
    it, res = K.anderson_gs(_i64(TT.indptr), _i64(TT.indices), TT.data, x,
                            float(tol), int(max_sweeps), int(m), int(check_every))
    return x, int(it), float(res)


def solver_help(default: str = "auto") -> str:
    """The ``--solver`` help text, from the constants that define what ``auto`` does."""
    parts = {
        "auto": (f"Anderson-accelerated Gauss-Seidel, re-solved by GTH (underflow-safe elimination) when the "
                 f"iterate's proven throughput error bound is above {ACCURACY_TARGET:g} and GTH is cheap "
                 f"(<= {GTH_CHEAP_WORK:.0e} multiply-adds), or above {ACCURACY_TOL:g} and GTH fits "
                 f"(<= {GTH_MAX_WORK:.0e} multiply-adds, {GTH_MAX_BYTES / 2**30:g} GiB) or the iteration does "
                 f"not converge; sparse LU when neither converges nor fits, up to {DIRECT_FALLBACK_LIMIT:,} "
                 f"states"),
        "anderson": "Anderson-accelerated Gauss-Seidel only",
        "gauss-seidel": "plain Gauss-Seidel",
        "gth": "GTH elimination (subtraction-free, underflow-safe; in the cheapest of breadth-first, reversed "
               "breadth-first and reverse Cuthill-McKee order)",
        "direct": "sparse LU",
        "power": "power iteration",
    }
    assert set(parts) == set(SOLVERS)
    return "; ".join(f"{k}: {parts[k]}" + (" (default)" if k == default else "") for k in SOLVERS)
