r"""The delayed-batching DTMC: reachable states, transition matrix and rewards.

The chain is observed right after each batch-completion epoch and the launches
it causes.  A state is ``s = (k_i, b_i, r_i)_{i<M}`` (waiting, running batch
size, residual quanta), with :math:`\sum_i (k_i + b_i) = N`.  From ``s``:

* :math:`\tau(s) = \min_{b_i>0} r_i`, :math:`A(s) = \{i : b_i>0, r_i=\tau\}`;
* the other running models keep running with :math:`r_i - \tau`;
* each :math:`i \in A` routes its :math:`b_i` requests by
  :math:`\mathrm{Multinomial}(b_i, P_i)`; the joint outcome is the product;
* every idle model j with :math:`k_j \ge B_j` launches
  :math:`\min(k_j, \mathrm{cap}_j)` requests with residual
  :math:`d_j(\text{batch})` quanta, or :math:`d^{co}_j(\text{batch})` (co-running, when given) if
  another model is running after the completions or launches in the same pass;
* outcomes leading to the same state are merged (one matrix entry per pair).

Rewards: holding time :math:`\tau(s)` and expected committed tokens
:math:`g(s) = \sum_{i\in A} b_i \sum_j C_{ij}P_{ij}`.

This module imports nothing else of the project: it takes plain arrays.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from dtmc import _kernels as K
from dtmc.lowering import KEY_BITS, DTMCError, LoweredSystem, _bits, lower_arrays


class StateLimitExceeded(RuntimeError):
    """Enumeration stopped because the reachable set exceeded ``max_states``."""

    def __init__(self, max_states: int, estimate: int, bytes_estimate: int, transitions: bool = False,
                 max_transitions: int = 0):
        self.max_states = max_states
        self.estimate = estimate
        self.bytes_estimate = bytes_estimate
        self.transitions = transitions
        self.max_transitions = max_transitions
        what = (f"its transitions exceed max_transitions = {max_transitions:,}" if transitions
                else f"the reachable state space exceeds max_states = {max_states:,}")
        super().__init__(f"{what} (upper-bound estimate {estimate:,} states, about "
                         f"{bytes_estimate / 2**30:.1f} GiB)")


# Bytes held per state and per transition at the peak of build + solve:
# key, tau, g, row pointer, hash slots (2 x 16 at load <= 1/2), decoded state,
# solver vectors; per transition: column index and value in the CSR, its
# transpose, and the growth slack of the edge buffers.
BYTES_PER_STATE = 8 + 8 + 8 + 8 + 32 + 24 * 3 + 8 * 4
BYTES_PER_TRANSITION = (8 + 8) * 3
DEFAULT_MAX_STATES = 20_000_000
# transitions cost ~40 bytes at the peak (CSR, its transpose, buffer slack): 150M is ~6 GiB
DEFAULT_MAX_TRANSITIONS = 150_000_000


@dataclass(frozen=True)
class Chain:
    """A built chain.  ``T`` is CSR (rows sum to 1), states in BFS discovery order."""

    N: int
    B: tuple[int, ...]
    keys: np.ndarray
    T: sp.csr_matrix
    tau: np.ndarray          # holding time of each state, quanta (float64 for fast dot products)
    g: np.ndarray            # expected committed tokens at the epoch ending each state
    waiting: np.ndarray      # (n, M) k_i of each state
    batch: np.ndarray        # (n, M) b_i of each state
    residual: np.ndarray     # (n, M) r_i of each state
    arrivals: np.ndarray     # (n, M) expected requests routed into each queue at the epoch
    build_seconds: float
    assembly_seconds: float

    @property
    def n_states(self) -> int:
        return int(self.keys.shape[0])

    @property
    def n_transitions(self) -> int:
        return int(self.T.nnz)

    @property
    def bytes_used(self) -> int:
        arrays = [self.keys, self.tau, self.g, self.waiting, self.batch, self.residual, self.arrivals,
                  self.T.data, self.T.indices, self.T.indptr]
        return int(sum(a.nbytes for a in arrays))


def key_bits(M: int, N: int, dmax: int) -> int:
    """Bits a packed state key of ``M`` models needs at concurrency ``N`` with durations up to ``dmax`` quanta."""
    return M * (2 * _bits(N) + _bits(dmax))


def max_packed_n(M: int, dmax: int) -> int:
    """The largest N whose states fit a packed key (0 when none does), for durations up to ``dmax`` quanta."""
    per_model = KEY_BITS // M - _bits(dmax)
    if per_model < 2:
        return 0
    return (1 << (per_model // 2)) - 1


def state_bound(N: int, d: np.ndarray, B: np.ndarray, caps: np.ndarray, dco: np.ndarray | None = None) -> int:
    """A cheap upper bound on the number of reachable states (no allocation).

    Counts vectors ``(k_i, b_i, r_i)`` with ``sum(k_i + b_i) = N``, idle
    models holding fewer than ``B_i`` (or more only while running), and ``r_i``
    within ``1..max d_i``.  It is loose (often by 10-100x) but cheap, and it
    never undercounts; the enumeration itself stops at ``max_states``.
    """
    M = len(B)
    if dco is not None:
        d = np.maximum(d, dco)
    # generating-function count: per model, the number of (k, b, r) with k+b = m
    per = []
    for i in range(M):
        dmax = int(d[i, 1:].max())
        c = np.zeros(N + 1, dtype=object)
        for m in range(N + 1):
            idle = 1 if m < B[i] else 0
            running = sum(dmax for bb in range(1, min(m, caps[i]) + 1))
            c[m] = idle + running
        per.append(c)
    acc = np.zeros(N + 1, dtype=object)
    acc[:] = 0
    acc[: N + 1] = per[0]
    for i in range(1, M):
        nxt = np.zeros(N + 1, dtype=object)
        nxt[:] = 0
        for a in range(N + 1):
            if acc[a] == 0:
                continue
            for m in range(N + 1 - a):
                nxt[a + m] += acc[a] * per[i][m]
        acc = nxt
    return int(acc[N])


def build_chain(P: np.ndarray, C: np.ndarray, d: np.ndarray, N: int, B, caps=None,
                max_states: int = DEFAULT_MAX_STATES, max_transitions: int = DEFAULT_MAX_TRANSITIONS,
                dco: np.ndarray | None = None) -> Chain:
    """Enumerate the states reachable from the initial state and assemble the chain.

    ``P``, ``C``: (M, M) routing probabilities and committed tokens.  ``d``:
    (M, N+1) integer durations in quanta, ``d[i, b]`` for a batch of ``b``
    (column 0 unused).  ``B``: thresholds (length M, feasible:
    ``sum(B_i - 1) < N``).  ``caps``: batch caps (default N).  Raises
    :class:`StateLimitExceeded` once more than ``max_states`` states or
    ``max_transitions`` transitions are found, before they could exhaust memory.

    ``dco``: (M, N+1) co-running durations (the launch law: a batch launched while another model is
    running after the epoch's completions, or launching in the same pass, gets ``dco``; otherwise
    ``d``).  ``None`` builds the solo chain (the kernel's solo path, state for state today's chain).
    """
    low = lower_arrays(P, C, d, N, caps, dco)
    return build_lowered_chain(low, B, max_states=max_states, max_transitions=max_transitions)


def build_lowered_chain(low: LoweredSystem, B, *, max_states: int = DEFAULT_MAX_STATES,
                        max_transitions: int = DEFAULT_MAX_TRANSITIONS) -> Chain:
    """:func:`build_chain` of a lowered system (:func:`dtmc.lowering.lower_system`)."""
    M, N = low.M, low.N
    B = np.ascontiguousarray(B, dtype=np.int64)
    if B.shape != (M,):
        raise DTMCError(f"B must have M = {M} entries, got {B.shape[0] if B.ndim else 0}")
    if (B < 1).any():
        raise DTMCError(f"thresholds must be >= 1, got B = {tuple(int(x) for x in B)}")
    if int((B - 1).sum()) >= N:
        raise DTMCError(f"B = {tuple(int(x) for x in B)} is infeasible for N = {N}: "
                        f"sum(B_i - 1) = {int((B - 1).sum())} must be < N")
    dmax = low.dmax
    if key_bits(M, N, dmax) > KEY_BITS:
        raise DTMCError(f"a state of M = {M} models with N = {N} and max duration {dmax} quanta "
                        f"needs {key_bits(M, N, dmax)} bits, more than the {KEY_BITS} a packed key holds; "
                        f"use a coarser delta")
    t0 = time.perf_counter()
    tables = low.tables
    status, *raw = K.build_chain(N, B, tables, K.BuildLimits(int(max_states), int(max_transitions), 1024))
    raw = _Raw(*raw)
    n = raw.n
    if status == K.TOO_MANY_STATES:
        est = state_bound(N, low.d, B, low.caps, low.dco)
        raise StateLimitExceeded(int(max_states), max(est, n),
                                 max(est, n) * (BYTES_PER_STATE + 10 * BYTES_PER_TRANSITION),
                                 transitions=n <= max_states, max_transitions=int(max_transitions))
    if status == K.DEADLOCK:
        raise DTMCError("the chain reached a state where no model runs (deadlock); check B and the routing matrix")
    return _assemble(N, tuple(int(x) for x in B), low.P, raw, low.bn, low.br, t0)


class _Raw(NamedTuple):
    """A build kernel's output after its status: the first ``n`` entries of the buffers are the chain."""

    n: int
    keys: np.ndarray
    row_ptr: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    tau: np.ndarray
    g: np.ndarray


def _assemble(N, B, P, raw: _Raw, bn, br, t0) -> Chain:
    """The :class:`Chain` of a kernel's output (``t0`` when the build began)."""
    t1 = time.perf_counter()
    M = P.shape[0]
    n, keys, row_ptr, cols, vals, tau, g = raw
    nnz = int(row_ptr[n])
    keys = keys[:n].copy()
    T = sp.csr_matrix((vals[:nnz].copy(), cols[:nnz].copy(), row_ptr[: n + 1].copy()), shape=(n, n))
    W, Bb, R = K.decode_states(keys, M, bn, br)
    # expected arrivals into queue j at the epoch that ends state s (a running model has r > 0; an empty
    # batch of a policy table has b = 0 and brings nobody)
    done = (R > 0) & (R == tau[:n, None])
    arrivals = (Bb * done) @ P
    t2 = time.perf_counter()
    return Chain(N=N, B=B, keys=keys, T=T, tau=tau[:n].astype(np.float64), g=g[:n].copy(),
                 waiting=W, batch=Bb, residual=R, arrivals=arrivals,
                 build_seconds=t1 - t0, assembly_seconds=t2 - t1)


def policy_keys(states, N: int, dmax: int) -> np.ndarray:
    """Pack pre-decision configurations ``states`` ((n, M, 3): k, b, r per model) with the chain's packing
    for concurrency N and longest duration ``dmax`` quanta."""
    S = np.ascontiguousarray(states, dtype=np.int64)
    return K.encode_configs(np.ascontiguousarray(S[:, :, 0]), np.ascontiguousarray(S[:, :, 1]),
                            np.ascontiguousarray(S[:, :, 2]), _bits(N), _bits(dmax))


def policy_configs(keys, M: int, N: int, dmax: int) -> np.ndarray:
    """Unpack keys of :func:`policy_keys`'s packing into (n, M, 3) rows of (k, b, r)."""
    W, Bb, R = K.decode_states(np.ascontiguousarray(keys, dtype=np.int64), int(M), _bits(N), _bits(dmax))
    return np.stack([W, Bb, R], axis=2)


def build_policy_chain(P: np.ndarray, C: np.ndarray, d: np.ndarray, N: int, states, launch, caps=None,
                       max_states: int = DEFAULT_MAX_STATES, max_transitions: int = DEFAULT_MAX_TRANSITIONS,
                       dco: np.ndarray | None = None) -> Chain:
    """The chain under a launch-policy table instead of thresholds.

    ``states``: (n, M, 3) integer array, each row a *pre-decision configuration* ``(k_i, b_i, r_i)`` of
    every model right after an epoch's completions and routing and before any launch (an idle model has
    ``b_i = r_i = 0``; the initial configuration is ``k_0 = N``, all else 0).  ``launch``: (n, M) booleans,
    ``launch[s, j]`` = idle model ``j`` launches ``min(k_j, cap_j)`` requests in configuration ``s``, or
    an *empty batch* (busy ``d_j(0)`` quanta, serving nobody) when ``k_j = 0``.  Every reachable
    configuration must be in the table (a missing one, a launch of a running model, or a duplicate row
    raises :class:`DTMCError`); the co-running law (``dco``) is the threshold chain's.  A threshold
    vector ``B`` is the table ``launch[s, j] = (b_j = r_j = 0 and k_j >= max(B_j, 1))``.
    """
    low = lower_arrays(P, C, d, N, caps, dco, empty=True)
    return build_lowered_policy_chain(low, states, launch, max_states=max_states, max_transitions=max_transitions)


def build_lowered_policy_chain(low: LoweredSystem, states, launch, *, max_states: int = DEFAULT_MAX_STATES,
                               max_transitions: int = DEFAULT_MAX_TRANSITIONS) -> Chain:
    """:func:`build_policy_chain` of a lowered system (lowered with ``empty=True``)."""
    M, N = low.M, low.N
    S = np.asarray(states)
    Lm = np.asarray(launch)
    if S.ndim != 3 or S.shape[1:] != (M, 3):
        raise DTMCError(f"policy states must have shape (n, M = {M}, 3), got {S.shape}")
    if Lm.shape != S.shape[:2]:
        raise DTMCError(f"policy launch must have shape {S.shape[:2]}, got {Lm.shape}")
    if S.size and (S.min() < 0 or ((S[:, :, 0] + S[:, :, 1]).sum(axis=1) != N).any()):
        raise DTMCError(f"every policy configuration must hold N = {N} requests (sum of k_i + b_i)")
    dmax, bn, br = low.dmax, low.bn, low.br
    if M * (2 * bn + br) > 62:
        raise DTMCError(f"a state of M = {M} models with N = {N} and max duration {dmax} quanta "
                        f"needs {M * (2 * bn + br)} bits, more than the 62 a packed key holds; use a coarser delta")
    if S.size and int(S[:, :, 2].max()) > dmax:
        raise DTMCError(f"a policy configuration has a residual above the longest duration ({dmax} quanta)")
    keys = policy_keys(S, N, dmax) if S.size else np.zeros(0, dtype=np.int64)
    mask = (Lm.astype(np.int64) << np.arange(M, dtype=np.int64)[None, :]).sum(axis=1) if S.size \
        else np.zeros(0, dtype=np.int64)
    order = np.argsort(keys, kind="mergesort")
    keys, mask = np.ascontiguousarray(keys[order]), np.ascontiguousarray(mask[order])
    if keys.size > 1 and (np.diff(keys) == 0).any():
        raise DTMCError("the policy table lists a configuration twice")
    t0 = time.perf_counter()
    tables = low.tables
    status, *raw, bad = K.build_policy_chain(N, tables, K.BuildLimits(int(max_states), int(max_transitions), 1024),
                                             keys, mask)
    raw = _Raw(*raw)
    n = raw.n
    if status == K.TOO_MANY_STATES:
        raise StateLimitExceeded(int(max_states), n, n * (BYTES_PER_STATE + 10 * BYTES_PER_TRANSITION),
                                 transitions=n <= max_states, max_transitions=int(max_transitions))
    if status == K.DEADLOCK:
        raise DTMCError("the policy reaches a state where no model runs (deadlock)")
    if status == K.BAD_POLICY:
        W, Bb, R = K.decode_states(np.array([bad], dtype=np.int64), M, bn, br)
        cfg = tuple((int(W[0, i]), int(Bb[0, i]), int(R[0, i])) for i in range(M))
        raise DTMCError(f"the policy table has no valid decision for the reachable configuration "
                        f"(k, b, r per model) = {cfg}")
    return _assemble(N, (), low.P, raw, bn, br, t0)
