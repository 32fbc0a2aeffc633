"""Compiled kernels of the delayed-batching chain (the only numba module of ``dtmc``).

Every kernel takes and returns NumPy arrays and scalars.  Kernels that call
each other live here together, because numba's on-disk cache does not notice
edits in another file.

State packing
-------------
A state ``(k_0, b_0, r_0, ..., k_{M-1}, b_{M-1}, r_{M-1})`` is one int64 key:
model i occupies ``2*bn + br`` bits at offset ``i*(2*bn+br)``, holding
``k_i`` (bn bits), ``b_i`` (bn bits) and ``r_i`` (br bits), where
``bn = bits(N)`` and ``br = bits(max d)``.  The caller checks that the total
fits in 62 bits.

Hash table
----------
Open addressing with linear probing over a power-of-two table of int64 keys
(``-1`` = empty) and int64 state indices, grown to keep the load under 1/2.
The mixing function is the 64-bit finaliser of MurmurHash3 (a public-domain
constant set), needed because packed keys differ only in a few low bits.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

# int64 zero and one: a literal 0 or 1 passed to a jitted helper (or a counter started at one) would make numba
# compile a second specialization of the helper for the literal's own type (first-run compile time)
I0 = np.int64(0)
I1 = np.int64(1)

EMPTY = -1



class ChainTables(NamedTuple):
    """The system as the enumeration reads it: launch law (``caps``, durations ``d``, co-running ``dco`` and
    whether it applies), expected tokens per completed request ``cbar``, the batch-routing outcomes
    (:func:`compositions` and their :func:`composition_probabilities`) and the key packing widths."""

    caps: np.ndarray
    d: np.ndarray
    dco: np.ndarray
    corun: bool
    cbar: np.ndarray
    offsets: np.ndarray
    parts: np.ndarray
    prob: np.ndarray
    bn: int
    br: int


class BuildLimits(NamedTuple):
    """When the enumeration gives up (states, transitions) and the buffer size it starts with."""

    max_states: int
    max_transitions: int
    init_cap: int


# status codes returned by the BFS kernel
OK = 0
TOO_MANY_STATES = 1
DEADLOCK = 2


@njit(cache=True)
def _mix(key):
    h = np.uint64(key)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
    return h


@njit(cache=True)
def _table_find_or_insert(tkeys, tvals, key, new_index):
    """Return (index, inserted) for ``key``; inserts ``new_index`` when absent."""
    mask = np.uint64(tkeys.shape[0] - 1)
    slot = _mix(key) & mask
    while True:
        s = np.int64(slot)
        k = tkeys[s]
        if k == key:
            return tvals[s], False
        if k == EMPTY:
            tkeys[s] = key
            tvals[s] = new_index
            return new_index, True
        slot = (slot + np.uint64(1)) & mask


@njit(cache=True)
def _table_rebuild(keys, n, capacity):
    tkeys = np.full(capacity, EMPTY, dtype=np.int64)
    tvals = np.empty(capacity, dtype=np.int64)
    for i in range(n):
        _table_find_or_insert(tkeys, tvals, keys[i], i)
    return tkeys, tvals


@njit(cache=True)
def _table_size(count, size):
    """The hash table size (a power of two, at least twice ``size``) that holds ``count`` keys at most half full."""
    cap = size * 2
    while 2 * count > cap:
        cap *= 2
    return cap


@njit(cache=True)
def _grow(a, need):
    """``a`` itself, or a copy at least twice as long when it holds fewer than ``need`` items (any dtype)."""
    if need <= a.shape[0]:
        return a
    cap = a.shape[0] * 2
    while cap < need:
        cap *= 2
    out = np.empty(cap, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


@njit(cache=True)
def compositions(N, M):
    """All compositions of b into M non-negative parts, for b = 0..N.

    Returns ``(offsets, parts)``: the compositions of b are rows
    ``offsets[b]:offsets[b+1]`` of ``parts`` (shape (total, M)), in
    lexicographic order.
    """
    # count C(b+M-1, M-1) for each b
    offsets = np.zeros(N + 2, dtype=np.int64)
    for b in range(N + 1):
        c = 1
        for t in range(1, M):
            c = c * (b + t) // t
        offsets[b + 1] = offsets[b] + c
    parts = np.zeros((offsets[N + 1], M), dtype=np.int64)
    x = np.zeros(M, dtype=np.int64)
    for b in range(N + 1):
        row = offsets[b]
        # first composition: everything in the last part
        for j in range(M):
            x[j] = 0
        x[M - 1] = b
        while True:
            for j in range(M):
                parts[row, j] = x[j]
            row += 1
            # next composition in lexicographic order of (x_0, ..., x_{M-2})
            j = M - 2
            moved = False
            while j >= 0:
                rest = x[M - 1]
                if rest > 0:
                    x[j] += 1
                    x[M - 1] = rest - 1
                    moved = True
                    break
                # carry: return x[j] to the tail and move left
                x[M - 1] += x[j]
                x[j] = 0
                j -= 1
            if not moved:
                break
    return offsets, parts


@njit(cache=True)
def composition_probabilities(P, offsets, parts, logfact):
    """Multinomial probability of each composition for each source model.

    ``prob[i, c] = b! / prod_j x_j! * prod_j P[i, j]^x_j``; exactly zero when a
    part lands on a zero-probability destination, so impossible outcomes never
    create states.
    """
    M = P.shape[0]
    n = parts.shape[0]
    prob = np.zeros((M, n), dtype=np.float64)
    Nmax = offsets.shape[0] - 2
    for i in range(M):
        for b in range(Nmax + 1):
            for c in range(offsets[b], offsets[b + 1]):
                lp = logfact[b]
                ok = True
                for j in range(M):
                    x = parts[c, j]
                    if x > 0:
                        if P[i, j] <= 0.0:
                            ok = False
                            break
                        lp += x * np.log(P[i, j]) - logfact[x]
                if ok:
                    prob[i, c] = np.exp(lp)
    return prob


@njit(cache=True)
def summed_log_factorials(N):
    """``log(v!)`` for v = 0..N as running sums of ``log(v)`` (the decision processes' weights; the chain's
    are lgamma's, see :mod:`dtmc.lowering`)."""
    logf = np.zeros(N + 1)
    for v in range(2, N + 1):
        logf[v] = logf[v - 1] + np.log(v)
    return logf


@njit(cache=True)
def _encode(k, b, r, M, bn, br):
    key = np.int64(0)
    shift = np.int64(0)
    for i in range(M):
        key |= np.int64(k[i]) << shift
        shift += bn
        key |= np.int64(b[i]) << shift
        shift += bn
        key |= np.int64(r[i]) << shift
        shift += br
    return key


@njit(cache=True)
def _decode(key, k, b, r, M, bn, br):
    mn = (np.int64(1) << bn) - 1
    mr = (np.int64(1) << br) - 1
    shift = np.int64(0)
    for i in range(M):
        k[i] = (key >> shift) & mn
        shift += bn
        b[i] = (key >> shift) & mn
        shift += bn
        r[i] = (key >> shift) & mr
        shift += br


@njit(cache=True, inline="always")
def corun_at_launch(corun, running, launching):
    """The co-running *launch law*'s tie rule, the one copy every kernel calls (chain, decision processes,
    coarse clock, mean field, simulator): a batch launched now gets its co-running duration when the law
    is on and another model is busy at this instant, i.e. ``running`` models keep running after this
    epoch's completions, or more than one model (itself included) launches in this same pass."""
    return corun and (running > 0 or launching > 1)


@njit(cache=True, inline="always")
def _launch_mask(k, b, r, mask, caps, d, dco, corun, M):
    """Launch every model whose bit is set in ``mask`` (idle ones): ``min(k_j, cap_j)`` requests, or an
    *empty batch* (busy ``d_j(0)`` quanta, serving nobody) when ``k_j = 0``.  The one launch law of the
    chain: without co-running every launch gets ``d``; with it, a launch gets ``dco`` when another model
    is busy at this instant (:func:`corun_at_launch`), otherwise ``d``."""
    co = False
    if corun:
        running = 0
        launching = 0
        for j in range(M):
            if (mask >> j) & 1:
                launching += 1
            elif r[j] > 0:
                running += 1
        co = corun_at_launch(corun, running, launching)
    for j in range(M):
        if (mask >> j) & 1:
            take = k[j] if k[j] < caps[j] else caps[j]
            b[j] = take
            k[j] -= take
            r[j] = dco[j, take] if co else d[j, take]


@njit(cache=True, inline="always")
def _launch(k, b, r, B, caps, d, dco, corun, M):
    """The threshold launch pass: every idle model with ``k_j >= B_j`` launches (:func:`_launch_mask`)."""
    mask = 0
    for j in range(M):
        if r[j] == 0 and k[j] >= B[j]:
            mask |= 1 << j
    _launch_mask(k, b, r, mask, caps, d, dco, corun, M)


# The chain under a launch-policy table.  The launch rule is replaced by a lookup: the
# *pre-decision configuration* (k_i, b_i, r_i of every model right after an epoch's completions and
# routing, before any launch; an idle model has b_i = r_i = 0) is packed like a state and looked up
# in ``pol_keys`` (sorted); ``pol_mask`` bit j says that idle model j launches (:func:`_launch_mask`,
# an empty batch when k_j = 0).  A model is running when r_i > 0 (an empty batch has b_i = 0 and runs).

BAD_POLICY = 3      # a configuration missing from the table, or a launch of a running model


@njit(cache=True)
def _policy_launch(k, b, r, pol_keys, pol_mask, caps, d, dco, corun, M, bn, br):
    """Apply the table's decision to the pre-decision configuration (k, b, r) in place.

    Returns the looked-up key (>= 0) on success, ``-1 - key`` when the configuration is missing or the
    mask launches a running model."""
    key = _encode(k, b, r, M, bn, br)
    pos = np.searchsorted(pol_keys, key)
    if pos >= pol_keys.shape[0] or pol_keys[pos] != key:
        return -1 - key
    mask = pol_mask[pos]
    for j in range(M):
        if (mask >> j) & 1 and r[j] > 0:
            return -1 - key
    _launch_mask(k, b, r, mask, caps, d, dco, corun, M)
    return key


@njit(cache=True, inline="always")
def _decide(k, b, r, B, pol_keys, pol_mask, tables, M):
    """The launch decision of the chain being built: the thresholds' when ``pol_keys`` is None (numba
    prunes the other branch at compile time, so the threshold chain has no table code), else the table's.
    Returns ``>= 0`` on success, ``-1 - key`` for a configuration the table cannot decide.

    ``pol_keys`` stays an argument of its own (not a field of a record): the pruning sees only arguments
    that are None."""
    if pol_keys is None:
        _launch(k, b, r, B, tables.caps, tables.d, tables.dco, tables.corun, M)
        return 0
    return _policy_launch(k, b, r, pol_keys, pol_mask, tables.caps, tables.d, tables.dco, tables.corun, M,
                          tables.bn, tables.br)


@njit(cache=True)
def _build(N, B, pol_keys, pol_mask, tables, limits):
    """Breadth-first enumeration of the reachable states and their transitions, under thresholds ``B``
    (``pol_keys`` None) or the policy table ``(pol_keys, pol_mask)`` (``B`` unused; :func:`_decide`), for
    the system ``tables`` (:class:`ChainTables`) within ``limits`` (:class:`BuildLimits`).

    Returns ``(status, n, keys, row_ptr, cols, vals, tau, g, bad_key)``: the first ``n`` packed keys in
    discovery order, the CSR transition matrix (rows in the same order, duplicates merged, columns sorted
    by key within a row), the holding time ``tau`` in quanta and the expected committed tokens ``g`` of
    each state; ``bad_key`` the packed configuration the table could not decide (status BAD_POLICY),
    else -1.  ``status`` is OK, TOO_MANY_STATES (stopped once ``n`` exceeded ``max_states`` or its
    transitions ``max_transitions``, before the buffers could outgrow memory), DEADLOCK (a state with
    no running model) or BAD_POLICY.
    """
    cbar, offsets, parts, prob, bn, br = (tables.cbar, tables.offsets, tables.parts, tables.prob, tables.bn,
                                          tables.br)
    max_states, max_transitions = limits.max_states, limits.max_transitions
    M = tables.caps.shape[0]
    cap = limits.init_cap
    keys = np.empty(cap, dtype=np.int64)
    tau = np.empty(cap, dtype=np.int64)
    g = np.empty(cap, dtype=np.float64)
    row_ptr = np.empty(cap + 1, dtype=np.int64)
    ecap = cap * 8
    cols = np.empty(ecap, dtype=np.int64)
    vals = np.empty(ecap, dtype=np.float64)
    tcap = 1024
    while tcap < 2 * cap:
        tcap *= 2
    tkeys = np.full(tcap, EMPTY, dtype=np.int64)
    tvals = np.empty(tcap, dtype=np.int64)

    k = np.zeros(M, dtype=np.int64)
    b = np.zeros(M, dtype=np.int64)
    r = np.zeros(M, dtype=np.int64)
    k2 = np.zeros(M, dtype=np.int64)
    b2 = np.zeros(M, dtype=np.int64)
    r2 = np.zeros(M, dtype=np.int64)
    done = np.zeros(M, dtype=np.int64)   # indices of completing models
    idx = np.zeros(M, dtype=np.int64)    # odometer over their compositions
    lo = np.zeros(M, dtype=np.int64)
    hi = np.zeros(M, dtype=np.int64)

    # initial state: all N wait at model 0, then one launch pass
    k[0] = N
    got = _decide(k, b, r, B, pol_keys, pol_mask, tables, M)
    if got < 0:
        return BAD_POLICY, 0, keys, row_ptr, cols, vals, tau, g, -1 - got
    key0 = _encode(k, b, r, M, bn, br)
    keys[0] = key0
    _table_find_or_insert(tkeys, tvals, key0, I0)
    n = I1
    nnz = 0
    row_ptr[0] = 0

    obuf_k = np.empty(256, dtype=np.int64)
    obuf_p = np.empty(256, dtype=np.float64)

    head = 0
    while head < n:
        _decode(keys[head], k, b, r, M, bn, br)
        t = np.int64(1) << 62
        for i in range(M):
            if r[i] > 0 and r[i] < t:
                t = r[i]
        if t == (np.int64(1) << 62):
            return DEADLOCK, head, keys, row_ptr, cols, vals, tau, g, -1
        na = I0
        gs = 0.0
        for i in range(M):
            if r[i] > 0 and r[i] == t:
                done[na] = i
                lo[na] = offsets[b[i]]
                hi[na] = offsets[b[i] + 1]
                idx[na] = lo[na]
                na += 1
                gs += b[i] * cbar[i]
        tau[head] = t
        g[head] = gs
        # Every buffer this state can fill is grown here, before its loops: an array reassigned inside a
        # loop costs numba two atomic reference-count updates per iteration (about half of a large build).
        mmax = I1
        for a in range(na):
            mmax *= hi[a] - lo[a]
        if mmax > obuf_k.shape[0]:
            obuf_k = _grow(obuf_k, mmax)
            obuf_p = _grow(obuf_p, mmax)
        if n + mmax >= keys.shape[0]:
            keys = _grow(keys, n + mmax + 1)
            tau = _grow(tau, n + mmax + 1)
            g = _grow(g, n + mmax + 1)
        if n + mmax + 2 > row_ptr.shape[0]:
            row_ptr = _grow(row_ptr, n + mmax + 2)
        if 2 * (n + mmax) > tkeys.shape[0]:
            tkeys, tvals = _table_rebuild(keys, n, _table_size(n + mmax, tkeys.shape[0]))

        # enumerate the joint multinomial outcomes (odometer over `done`)
        nout = 0
        while True:
            p = 1.0
            for a in range(na):
                p *= prob[done[a], idx[a]]
            if p > 0.0:
                for i in range(M):
                    k2[i] = k[i]
                    if r[i] > 0 and r[i] != t:
                        b2[i] = b[i]
                        r2[i] = r[i] - t
                    else:
                        b2[i] = 0
                        r2[i] = 0
                for a in range(na):
                    c = idx[a]
                    for j in range(M):
                        k2[j] += parts[c, j]
                got = _decide(k2, b2, r2, B, pol_keys, pol_mask, tables, M)
                if got < 0:
                    return BAD_POLICY, n, keys, row_ptr, cols, vals, tau, g, -1 - got
                obuf_k[nout] = _encode(k2, b2, r2, M, bn, br)
                obuf_p[nout] = p
                nout += 1
            # advance odometer
            a = na - 1
            while a >= 0:
                idx[a] += 1
                if idx[a] < hi[a]:
                    break
                idx[a] = lo[a]
                a -= 1
            if a < 0:
                break

        # merge duplicate successors, then record the row.  Under thresholds, one completing model gives
        # distinct successors (its outcomes differ in the queue vector and the launch rule is injective
        # on them), so only simultaneous completions need the sort; a table need not be injective
        # (empty batches, state-dependent launches): always sort
        if na > 1 or pol_keys is not None:
            order = np.argsort(obuf_k[:nout], kind="mergesort")
        else:
            order = np.arange(nout)
        if nnz + nout > max_transitions:
            return TOO_MANY_STATES, n, keys, row_ptr, cols, vals, tau, g, -1
        if nnz + nout > cols.shape[0]:
            cols = _grow(cols, nnz + nout)
            vals = _grow(vals, nnz + nout)
        last = np.int64(-2)
        for q in range(nout):
            o = order[q]
            kk = obuf_k[o]
            if kk == last:
                vals[nnz - 1] += obuf_p[o]
                continue
            last = kk
            col, inserted = _table_find_or_insert(tkeys, tvals, kk, n)
            if inserted:
                if n >= max_states:
                    return TOO_MANY_STATES, n + 1, keys, row_ptr, cols, vals, tau, g, -1
                keys[n] = kk
                n += 1
            cols[nnz] = col
            vals[nnz] = obuf_p[o]
            nnz += 1
        head += 1
        row_ptr[head] = nnz
    return OK, n, keys, row_ptr, cols, vals, tau, g, -1


@njit(cache=True)
def build_chain(N, B, tables, limits):
    """The chain under thresholds ``B`` (:func:`_build`).

    ``tables.dco``/``tables.corun``: the co-running durations and whether the launch law uses them (see
    :func:`_launch_mask`); with ``corun`` false ``dco`` is ignored and the chain is the solo one.
    Returns ``(status, n, keys, row_ptr, cols, vals, tau, g)``; ``status`` OK, TOO_MANY_STATES or DEADLOCK.
    """
    st, n, keys, row_ptr, cols, vals, tau, g, _bad = _build(N, B, None, None, tables, limits)
    return st, n, keys, row_ptr, cols, vals, tau, g


@njit(cache=True)
def build_policy_chain(N, tables, limits, pol_keys, pol_mask):
    """The chain under the policy table ``(pol_keys, pol_mask)`` (:func:`_build`); returns
    ``(status, n, keys, row_ptr, cols, vals, tau, g, bad_key)``."""
    B = np.zeros(tables.caps.shape[0], dtype=np.int64)      # unused: the table decides
    return _build(N, B, pol_keys, pol_mask, tables, limits)


@njit(cache=True)
def decode_states(keys, M, bn, br):
    """Unpack keys into (k, b, r) arrays of shape (n, M)."""
    n = keys.shape[0]
    K = np.empty((n, M), dtype=np.int64)
    Bb = np.empty((n, M), dtype=np.int64)
    R = np.empty((n, M), dtype=np.int64)
    k = np.zeros(M, dtype=np.int64)
    b = np.zeros(M, dtype=np.int64)
    r = np.zeros(M, dtype=np.int64)
    for s in range(n):
        _decode(keys[s], k, b, r, M, bn, br)
        for i in range(M):
            K[s, i] = k[i]
            Bb[s, i] = b[i]
            R[s, i] = r[i]
    return K, Bb, R


@njit(cache=True)
def leaving_components(indptr, indices, data, labels, ncomp):
    """Flag the components (``labels`` of the states) with an edge of positive probability to another one.

    One pass over the CSR arrays (any integer dtype).
    """
    n = indptr.shape[0] - 1
    leaving = np.zeros(ncomp, dtype=np.bool_)
    for i in range(n):
        li = labels[i]
        if leaving[li]:
            continue
        for q in range(indptr[i], indptr[i + 1]):
            if data[q] > 0.0 and labels[indices[q]] != li:
                leaving[li] = True
                break
    return leaving


@njit(cache=True)
def diagonal(indptr, indices, data):
    """The diagonal of a CSR matrix (self-loop probabilities ``T_jj`` of ``T^T``)."""
    n = indptr.shape[0] - 1
    diag = np.zeros(n, dtype=np.float64)
    for j in range(n):
        for q in range(indptr[j], indptr[j + 1]):
            if indices[q] == j:
                diag[j] += data[q]
    return diag


@njit(cache=True)
def gauss_seidel(indptr, indices, data, x, tol, max_sweeps, check_every):
    """Plain Gauss-Seidel sweeps (:func:`gs_sweep`) for ``x = x T`` on the transposed matrix.

    ``indptr/indices/data`` are the CSR arrays of ``T^T`` (row j lists the
    predecessors i of state j with ``T[i, j]``).  Every ``check_every`` sweeps
    the residual ``max_j |(x T)_j - x_j|`` of the normalised vector is
    computed; the loop stops once it is <= ``tol * max(x)`` (a relative test:
    the scale of the stationary vector shrinks with the number of states).
    Returns ``(sweeps, residual)``.
    """
    diag = diagonal(indptr, indices, data)
    res = np.inf
    sweeps = 0
    while sweeps < max_sweeps:
        gs_sweep(indptr, indices, data, diag, x)
        sweeps += 1
        if sweeps % check_every == 0 or sweeps == max_sweeps:
            res = residual_max(indptr, indices, data, x)
            if res <= tol * x.max():
                break
    return sweeps, res


@njit(cache=True)
def poisson_sweep(indptr, indices, data, r, ref, x, backward):
    """One in-place Gauss-Seidel sweep for ``h = r + T h`` (CSR of ``T``), then the shift to ``x[ref] = 0``.

    ``backward``: through the states from the last to the first.  ``h`` of a state is read from its
    successors, which the breadth-first enumeration mostly numbers after it, so a backward sweep carries
    values back along a whole run of clock ticks at once (a forward one moves them one tick a sweep).  The
    order changes the iteration's spectrum, though: on some chains only one of the two converges (see
    :func:`dtmc.solve.relative_values`, which tries backwards first)."""
    n = indptr.shape[0] - 1
    for k in range(n):
        i = n - 1 - k if backward else k
        s = r[i]
        dg = 0.0
        for q in range(indptr[i], indptr[i + 1]):
            j = indices[q]
            if j == i:
                dg += data[q]
            else:
                s += data[q] * x[j]
        if dg < 1.0:
            x[i] = s / (1.0 - dg)
    c = x[ref]
    for i in range(n):
        x[i] -= c


@njit(cache=True)
def poisson_spread(indptr, indices, data, r, tau, x):
    """``max D - min D`` for ``D = (r + T x - x) / tau``: the width of the throughput bracket ``x`` gives."""
    n = indptr.shape[0] - 1
    lo = np.inf
    hi = -np.inf
    for i in range(n):
        s = r[i] - x[i]
        for q in range(indptr[i], indptr[i + 1]):
            s += data[q] * x[indices[q]]
        v = s / tau[i]
        if v < lo:
            lo = v
        if v > hi:
            hi = v
    return hi - lo


@njit(cache=True)
def anderson_workspace(m, n):
    """The arrays one Anderson-accelerated iteration of length ``n`` and memory ``m`` works in:
    ``(dX, dF, G, y, f, x_prev, f_prev)`` (a memory of 0 still gets one history row, never used)."""
    mm = m if m > 0 else 1
    return (np.zeros((mm, n), dtype=np.float64), np.zeros((mm, n), dtype=np.float64),
            np.zeros((mm, mm), dtype=np.float64), np.empty(n, dtype=np.float64),
            np.empty(n, dtype=np.float64), np.empty(n, dtype=np.float64), np.empty(n, dtype=np.float64))


@njit(cache=True)
def stall_count(value, best, stalled):
    """The stopping rule's bookkeeping: ``(best, stalled)`` after a check that measured ``value``; a check
    counts as stalled unless it improves on the best so far by 10 %."""
    if value < 0.9 * best:
        return value, 0
    return best, stalled + 1


@njit(cache=True)
def poisson_gs(indptr, indices, data, r, tau, ref, x, tol, max_sweeps, m, check_every, backward):
    """The relative values ``h = r + T h`` (shifted to ``h[ref] = 0``) by Gauss-Seidel sweeps accelerated by
    Anderson mixing of memory ``m`` (:func:`anderson_mix`; ``m = 0``: plain sweeps), in place on ``x``.

    ``indptr/indices/data``: the CSR arrays of ``T`` itself (row i lists the successors of state i).  The
    equation has a solution only when ``pi r = 0``; the shift after each sweep absorbs what an approximate
    ``r`` leaves (relative value iteration).  Every ``check_every`` sweeps the spread of
    :func:`poisson_spread` is computed: it is the width of the throughput bracket ``x`` gives
    (:func:`dtmc.solve.chain_bracket`), whatever ``x`` is.  A spread more than 10x the previous check's
    restarts the history from the plain sweep.  Stops when it is <= ``tol``, or when four checks in a row
    bring no 10 % improvement (the rounding floor, or a slowly mixing chain the caller hands to a direct
    solve).  ``backward``: the sweeps' order (:func:`poisson_sweep`).  Returns ``(sweeps, spread)``.
    """
    n = indptr.shape[0] - 1
    dX, dF, G, y, f, x_prev, f_prev = anderson_workspace(m, n)
    have_prev, filled, stalled, sweeps = False, 0, 0, 0
    spread, best = np.inf, np.inf
    while sweeps < max_sweeps:
        y[:] = x
        poisson_sweep(indptr, indices, data, r, ref, y, backward)
        sweeps += 1
        if m > 0:
            filled = anderson_mix(x, y, f, x_prev, f_prev, dX, dF, G, filled, have_prev, m)
            have_prev = True
            c = x[ref]
            for i in range(n):
                x[i] -= c
        else:
            for i in range(n):
                x[i] = y[i]
        if sweeps % check_every == 0 or sweeps == max_sweeps:
            sp = poisson_spread(indptr, indices, data, r, tau, x)
            if m > 0 and not (sp <= 10.0 * spread):
                for i in range(n):
                    x[i] = y[i]
                sp = poisson_spread(indptr, indices, data, r, tau, x)
                filled = 0
                have_prev = False
            spread = sp
            if not (spread > tol):
                break
            best, stalled = stall_count(spread, best, stalled)
            if stalled >= 4:
                break
    return sweeps, spread


@njit(cache=True)
def residual_max(indptr, indices, data, x):
    """``max_j |sum_i x_i T_ij - x_j|`` given the CSR arrays of ``T^T``."""
    n = indptr.shape[0] - 1
    res = 0.0
    for j in range(n):
        s = 0.0
        for q in range(indptr[j], indptr[j + 1]):
            s += x[indices[q]] * data[q]
        e = abs(s - x[j])
        if e > res:
            res = e
    return res


@njit(cache=True)
def gs_sweep(indptr, indices, data, diag, x):
    """One in-place Gauss-Seidel sweep for ``x = x T`` (CSR of ``T^T``), then renormalise."""
    n = indptr.shape[0] - 1
    for j in range(n):
        s = 0.0
        for q in range(indptr[j], indptr[j + 1]):
            i = indices[q]
            if i != j:
                s += x[i] * data[q]
        denom = 1.0 - diag[j]
        if denom > 0.0:
            x[j] = s / denom
    tot = 0.0
    for j in range(n):
        tot += x[j]
    for j in range(n):
        x[j] /= tot


@njit(cache=True)
def anderson_mix(x, y, f, x_prev, f_prev, dX, dF, G, filled, have_prev, m):
    """One Anderson step of memory ``m``, writing the mixed iterate into ``x`` (nothing clipped or scaled).

    ``x``: the current iterate, ``y = G(x)``; ``f`` receives the step ``y - x``.  The differences to the previous pair
    (``x_prev``, ``f_prev``) enter the history ``dX``, ``dF`` (rows, a ring of ``m``) and its Gram matrix
    ``G``; the step solves the small regularised normal equations ``(dF^T dF) gamma = dF^T f`` and sets
    ``x = y - (dX + dF) gamma`` (``x = y`` while the history is empty); ``x_prev``, ``f_prev`` become the
    current pair.  Returns the new count of history rows filled.
    """
    n = x.shape[0]
    for j in range(n):
        f[j] = y[j] - x[j]
    if have_prev:
        col = filled % m
        for j in range(n):
            dX[col, j] = x[j] - x_prev[j]
            dF[col, j] = f[j] - f_prev[j]
        filled += 1
        k = filled if filled < m else m
        for a in range(k):
            s = 0.0
            for j in range(n):
                s += dF[a, j] * dF[col, j]
            G[a, col] = s
            G[col, a] = s
    for j in range(n):
        x_prev[j] = x[j]
        f_prev[j] = f[j]
    k = filled if filled < m else m
    if k == 0:
        for j in range(n):
            x[j] = y[j]
        return filled
    A = np.empty((k, k), dtype=np.float64)
    rhs = np.empty(k, dtype=np.float64)
    tr = 0.0
    for a in range(k):
        tr += G[a, a]
    for a in range(k):
        for b in range(k):
            A[a, b] = G[a, b]
        A[a, a] += 1e-12 * tr + 1e-300
        s = 0.0
        for j in range(n):
            s += dF[a, j] * f[j]
        rhs[a] = s
    gamma = np.linalg.solve(A, rhs)
    for j in range(n):
        v = y[j]
        for a in range(k):
            v -= (dX[a, j] + dF[a, j]) * gamma[a]
        x[j] = v
    return filled


@njit(cache=True)
def anderson_gs(indptr, indices, data, x, tol, max_sweeps, m, check_every):
    """Gauss-Seidel sweeps accelerated by Anderson mixing (memory ``m``), in place on ``x``.

    With the fixed-point map ``G`` = one sweep + renormalisation and
    ``f_k = G(x_k) - x_k``, each step solves the small regularised normal
    equations ``(dF^T dF) gamma = dF^T f_k`` over the last ``m`` differences
    and sets ``x_{k+1} = G(x_k) - (dX + dF) gamma`` (:func:`anderson_mix`),
    clipped at zero and renormalised.  Every ``check_every`` steps the
    residual of the iterate is checked.
    A residual more than 10x the previous check's restarts the history.
    Stops when ``max_j |(xT)_j - x_j| <= tol * max(x)``, or when four checks
    in a row bring no 10% improvement (the residual has reached the floor
    that rounding allows: on large chains this floor can sit above a tight
    ``tol``; the caller decides whether to accept it).  Returns
    ``(sweeps, residual)``.
    """
    n = indptr.shape[0] - 1
    diag = diagonal(indptr, indices, data)
    dX, dF, G, y, f, x_prev, f_prev = anderson_workspace(m, n)
    have_prev = False
    filled = 0
    res = np.inf
    best = np.inf
    stalled = 0
    it = 0
    while it < max_sweeps:
        for j in range(n):
            y[j] = x[j]
        gs_sweep(indptr, indices, data, diag, y)
        it += 1
        mixed = have_prev     # with no history the step is the plain sweep, kept as it is
        filled = anderson_mix(x, y, f, x_prev, f_prev, dX, dF, G, filled, have_prev, m)
        have_prev = True
        if mixed:
            tot = 0.0
            for j in range(n):
                if x[j] < 0.0:
                    x[j] = 0.0
                tot += x[j]
            if tot > 0.0 and np.isfinite(tot):
                for j in range(n):
                    x[j] /= tot
            else:
                for j in range(n):
                    x[j] = y[j]
        if it % check_every == 0:
            r_acc = residual_max(indptr, indices, data, x)
            if not (r_acc <= 10.0 * res):
                # the extrapolation went astray since the last check: restart from the plain sweep
                for j in range(n):
                    x[j] = y[j]
                r_acc = residual_max(indptr, indices, data, x)
                filled = 0
                have_prev = False
            res = r_acc
            xmax = 0.0
            for j in range(n):
                if x[j] > xmax:
                    xmax = x[j]
            if res <= tol * xmax:
                break
            best, stalled = stall_count(res, best, stalled)
            if stalled >= 4:
                break
    return it, res


# ---------------------------------------------------------------------------
# GTH (Grassmann-Taksar-Heyman) state reduction and the a-posteriori tree bound
# ---------------------------------------------------------------------------

UNIT_ROUNDOFF = 2.0 ** -53
SMALLEST_NORMAL = 2.2250738585072014e-308
GTH_OK = 0
GTH_REDUCIBLE = 1
GTH_UNDERFLOW = 3    # gth_solve(..., stop_on_underflow=True) stopped at the first underflow


@njit(cache=True)
def _gamma(m):
    """``gamma_m = m u / (1 - m u)``: the relative error bound of m chained roundings."""
    mu = m * UNIT_ROUNDOFF
    return mu / (1.0 - mu)


@njit(cache=True)
def gth_envelope(indptr, indices):
    """Envelope of the symmetrised pattern of a CSR matrix: ``lo[i]``, the smallest ``j <= i`` linked to i.

    Row i of the elimination keeps columns ``lo[i]..i-1`` (its part left of
    the diagonal) and column i keeps rows ``lo[i]..i-1`` (its part above):
    eliminating states in index order creates fill only there (skyline
    storage).
    """
    n = indptr.shape[0] - 1
    lo = np.arange(n)
    for i in range(n):
        for q in range(indptr[i], indptr[i + 1]):
            j = indices[q]
            if j < i:
                if j < lo[i]:
                    lo[i] = j
            elif j > i:
                if i < lo[j]:
                    lo[j] = i
    return lo


@njit(cache=True)
def gth_work(lo):
    """``(sum_k c_k^2, sum_k c_k)`` with ``c_k = #{i > k : lo[i] <= k}``: a ceiling on the multiply-adds
    of :func:`gth_solve` and its stored entries per triangle (the profile)."""
    n = lo.shape[0]
    start = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        if lo[i] < i:
            start[lo[i]] += 1
            start[i] -= 1
    work = 0.0
    prof = 0
    c = 0
    for k in range(n):
        c += start[k]
        work += float(c) * float(c)
        prof += c
    return work, prof


@njit(cache=True)
def _active_add(act, where, na, i):
    act[na] = i
    where[i] = na
    return na + 1


@njit(cache=True)
def _active_remove(act, where, na, i):
    p = where[i]
    last = act[na - 1]
    act[p] = last
    where[last] = p
    where[i] = -1
    return na - 1


@njit(cache=True)
def _alive_by_step(lo, n):
    """The rows (and columns) grouped by the elimination step at which they become alive: row i joins at step
    ``lo[i]`` (its envelope's first column) when ``lo[i] < i``; the rows of step k are
    ``byk[bstart[k]:bstart[k+1]]``.  Shared by both GTH eliminations."""
    bstart = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        if lo[i] < i:
            bstart[lo[i] + 1] += 1
    for k in range(n):
        bstart[k + 1] += bstart[k]
    byk = np.empty(bstart[n], dtype=np.int64)
    fill = bstart[:n].copy()
    for i in range(n):
        if lo[i] < i:
            byk[fill[lo[i]]] = i
            fill[lo[i]] += 1
    return bstart, byk


@njit(cache=True)
def gth_solve(indptr, indices, data, lo, stop_on_underflow=False):
    """Stationary vector of an irreducible chain by GTH state reduction (subtraction-free).

    ``indptr/indices/data``: CSR of the transition matrix in elimination order
    (diagonal ignored: the out-rate of a state is the sum of its off-diagonal
    entries, never ``1 - T_kk``); ``lo`` from :func:`gth_envelope`.  States
    ``0..n-2`` are eliminated in order; eliminating k turns the chain into the
    chain watched only on the states left (censoring): ``A_ij += A_ik A_kj /
    s_k`` with ``s_k = sum_{j>k} A_kj``.  Back-substitution ``x_k =
    sum_{i>k} x_i A_ik / s_k`` then recovers the stationary vector.  Every
    operation adds, multiplies or divides non-negative numbers, so each
    result carries a small *relative* error whatever the conditioning of the
    chain.  Storage is the skyline of the envelope (row parts ``L``, column
    parts ``U``); the rows and columns alive at step k are kept in a list.

    Returns ``(status, x, log_bound, flops, underflows, err)``: ``x``
    normalised; ``log_bound`` bounds ``|ln(y_j / pi_j)|`` for the exact
    back-substitution ``y`` on the computed reduced chains (normalised), by
    summing, per eliminated state with ``p`` predecessors and ``m``
    successors, ``p gamma_{m+3}`` (the reduced chain's updated entries carry
    relative error ``gamma_{m+3}``, and a spanning tree holds at most p of
    them: Markov chain tree theorem), doubled for the normalisation; ``err``
    bounds ``|x_j - y_j|`` componentwise (absolute, propagated through the
    back-substitution with its rounding, so components below the double
    range keep a valid bound).  A subnormal term costs at most one more u
    when it lands in a normal sum; ``underflows`` counts reduced-chain
    entries that stayed below the smallest normal double, which voids
    ``log_bound``; with ``stop_on_underflow`` the elimination stops at the
    step where the first one appears (status ``GTH_UNDERFLOW``).
    """
    n = indptr.shape[0] - 1
    off = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        off[i + 1] = off[i] + (i - lo[i])
    L = np.zeros(off[n], dtype=np.float64)   # L[off[i] + j - lo[i]] = A_ij, j < i
    U = np.zeros(off[n], dtype=np.float64)   # U[off[j] + i - lo[j]] = A_ij, i < j
    for i in range(n):
        for q in range(indptr[i], indptr[i + 1]):
            j = indices[q]
            if j < i:
                L[off[i] + j - lo[i]] += data[q]
            elif j > i:
                U[off[j] + i - lo[j]] += data[q]
    # rows (and columns) by the step at which they become alive
    bstart, byk = _alive_by_step(lo, n)
    act = np.empty(n, dtype=np.int64)
    where = np.full(n, -1, dtype=np.int64)
    na = I0
    s = np.zeros(n, dtype=np.float64)
    sn = np.zeros(n, dtype=np.int64)     # successors summed into s[k] (its rounding)
    pred_i = np.empty(n, dtype=np.int64)
    pred_a = np.empty(n, dtype=np.float64)
    succ_j = np.empty(n, dtype=np.int64)
    succ_b = np.empty(n, dtype=np.float64)
    log_bound = 0.0
    flops = 0
    under = 0
    x = np.zeros(n, dtype=np.float64)
    for k in range(n - 1):
        if where[k] >= 0:
            na = _active_remove(act, where, na, k)
        for t in range(bstart[k], bstart[k + 1]):
            na = _active_add(act, where, na, byk[t])
        sk = 0.0
        ns = 0
        npred = 0
        for t in range(na):
            i = act[t]
            b = U[off[i] + k - lo[i]]
            if b > 0.0:
                sk += b
                succ_j[ns] = i
                succ_b[ns] = b
                ns += 1
            a = L[off[i] + k - lo[i]]
            if a > 0.0:
                pred_i[npred] = i
                pred_a[npred] = a
                npred += 1
        if not sk > 0.0:
            return GTH_REDUCIBLE, x, np.inf, flops, under, x
        s[k] = sk
        for t in range(npred):
            i = pred_i[t]
            f = pred_a[t] / sk
            base_i = off[i] - lo[i]
            for r in range(ns):
                j = succ_j[r]
                if j == i:
                    continue
                # a subnormal term is off by up to 2^-1075, i.e. by at most u of a normal sum (hence
                # gamma_{m+3}); a sum that stays subnormal voids the bound
                if j < i:
                    v = L[base_i + j] + f * succ_b[r]
                    L[base_i + j] = v
                else:
                    q = off[j] + i - lo[j]
                    v = U[q] + f * succ_b[r]
                    U[q] = v
                if v < SMALLEST_NORMAL:
                    under += 1
            flops += ns
        log_bound += npred * _gamma(ns + 3)
        sn[k] = ns
        if stop_on_underflow and under > 0:
            # the caller redoes it in extended exponents: no point in finishing
            return GTH_UNDERFLOW, x, np.inf, flops, under, x
    # back-substitution, rebuilding the alive sets in reverse; err[k] bounds |x_k - y_k| absolutely, y the
    # exact back-substitution on the computed reduced chains (so components below the double range, whose
    # relative error is lost, still have a known absolute error)
    err = np.zeros(n, dtype=np.float64)
    tiny = 2.0 ** -1074
    na = I0
    for i in range(n):
        where[i] = -1
    x[n - 1] = 1.0
    if n >= 2 and lo[n - 1] <= n - 2:
        na = _active_add(act, where, na, n - 1)
    for k in range(n - 2, -1, -1):
        if k < n - 2:
            # alive at k: lo[i] <= k < i; from k+1: add i = k+1 (if lo <= k), drop those with lo = k+1
            if lo[k + 1] <= k:
                na = _active_add(act, where, na, k + 1)
            for t in range(bstart[k + 1], bstart[k + 2]):
                i = byk[t]
                if where[i] >= 0:
                    na = _active_remove(act, where, na, i)
        acc = 0.0
        eacc = 0.0
        p = 0
        for t in range(na):
            i = act[t]
            a = L[off[i] + k - lo[i]]
            if a > 0.0:
                acc += x[i] * a
                eacc += err[i] * a
                p += 1
        xk = acc / s[k]
        x[k] = xk
        m = p + 4
        err[k] = (eacc / s[k]) * (1.0 + _gamma(m)) + _gamma(2 * p + sn[k] + 4) * xk + 2.0 * m * tiny / s[k]
        if xk > 1e250:
            # the stationary vector spans more than 1e250: scale down what is computed so far
            for i in range(k, n):
                x[i] *= 1e-250
                err[i] = err[i] * 1e-250 + tiny
    tot = 0.0
    for i in range(n):
        tot += x[i]
    g_n = _gamma(n + 2)
    for i in range(n):
        x[i] /= tot
        err[i] = err[i] / tot * (1.0 + g_n) + tiny
    return GTH_OK, x, 2.0 * log_bound, flops, under, err


# ---------------------------------------------------------------------------
# GTH in extended-exponent arithmetic: nothing can underflow
# ---------------------------------------------------------------------------
# A value is a pair (m, e) = m 2^e with m in [1, 2) (or m = 0): a double mantissa and an integer
# exponent.  Products, quotients and sums of such pairs are rounded once in the mantissa, exactly as
# the plain double operations are (relative error <= u), and no result ever leaves the range, so the
# rounding analysis of :func:`gth_solve` holds without its underflow proviso.  Stored exponents are
# int32; a value beyond 2^+-GTH_EXPONENT_LIMIT (far beyond any chain that fits in memory) stops the
# elimination with GTH_RANGE.

GTH_RANGE = 2
GTH_EXPONENT_LIMIT = 1 << 30
_MANTISSA_MASK = (1 << 52) - 1
_ONE_BITS = 1023 << 52


@intrinsic
def _borrow(typingctx, arr):
    """The array ``arr`` without its reference-count handle: a view that numba never counts.

    numba counts references to every array a variable holds: each array a helper takes as an argument, or
    reads off a tuple, costs two atomic updates per call, even when the helper is inlined.  In a loop that
    calls helpers millions of times with a dozen arrays each, those updates took half of the time
    (a coarse-clock box process: 47 % of its build in ``NRT_incref``/``NRT_decref``).  A borrowed view
    costs none.  It is valid only while its owner lives: borrow a kernel's own arguments (its caller
    holds them until the kernel returns) and never return or keep a borrowed view.
    """
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, value=args[0])
        ary.meminfo = cgutils.get_null_value(ary.meminfo.type)
        ary.parent = cgutils.get_null_value(ary.parent.type)
        return ary._getvalue()

    return arr(arr), codegen


@njit(cache=True, inline="always")
def _borrowed_tables(tables):
    """:class:`ChainTables` with every array borrowed (:func:`_borrow`; the caller owns them)."""
    return ChainTables(_borrow(tables.caps), _borrow(tables.d), _borrow(tables.dco), tables.corun,
                       _borrow(tables.cbar), _borrow(tables.offsets), _borrow(tables.parts), _borrow(tables.prob),
                       tables.bn, tables.br)


@intrinsic
def _double_bits(typingctx, x):
    """The bit pattern of a double as an int64 (a bit cast; the inverse of :func:`_subnormal`)."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@njit(cache=True)
def _x_from(v):
    """``v >= 0`` (a double, subnormal allowed) as an extended pair ``(m, e)``, exactly."""
    if not v > 0.0:
        return 0.0, np.int64(0)
    e = np.int64(0)
    if v < SMALLEST_NORMAL:
        v = v * 18446744073709551616.0   # 2^64: exact for a subnormal
        e = np.int64(-64)
    b = _double_bits(v)
    return _subnormal((b & _MANTISSA_MASK) | _ONE_BITS), e + ((b >> 52) & 0x7FF) - 1023


@njit(cache=True)
def _x_to(m, e):
    """The double nearest ``m 2^e`` (``e <= 1023``); below the normal range one rounding, error <= 2^-1075."""
    if m == 0.0 or e < -1100:
        return 0.0
    if e >= -1022:
        return m * _subnormal((e + 1023) << 52)
    return (m * _subnormal(np.int64(1) << 52)) * _subnormal((e + 1022 + 1023) << 52)


@njit(cache=True)
def _x_mul(am, ae, bm, be):
    if am == 0.0 or bm == 0.0:
        return 0.0, np.int64(0)
    m = am * bm
    e = ae + be
    if m >= 2.0:
        return m * 0.5, e + 1
    return m, e


@njit(cache=True)
def _x_div(am, ae, bm, be):
    if am == 0.0:
        return 0.0, np.int64(0)
    m = am / bm
    e = ae - be
    if m < 1.0:
        return m * 2.0, e - 1
    return m, e


@njit(cache=True)
def _x_add(am, ae, bm, be):
    """Sum of two non-negative extended values, rounded once (a term below 2^-63 of the other is dropped:
    relative error < u)."""
    if bm == 0.0:
        return am, ae
    if am == 0.0:
        return bm, be
    if ae < be:
        am, ae, bm, be = bm, be, am, ae
    dd = ae - be
    if dd > 63:
        return am, ae
    m = am + bm * _subnormal((1023 - dd) << 52)
    if m >= 2.0:
        return m * 0.5, ae + 1
    return m, ae


@njit(cache=True)
def gth_solve_scaled(indptr, indices, data, lo):
    """:func:`gth_solve` in extended-exponent arithmetic (mantissa and integer exponent per entry).

    The same elimination, order and storage (1.5x the bytes: mantissas and int32 exponents),
    1.1-2.7x the time; used when the double elimination underflows (stiff chains: products of many
    small probabilities leave the double range, an out-sum rounds to 0 and the plain kernel stops).
    Nothing underflows here, so its a-priori bound always holds.  The back-substitution carries a
    *relative* bound ``rel_k`` per component against the exact back-substitution ``y`` on the computed
    reduced chains: ``x_k = (sum_i x_i A_ik) / s_k`` with every ``x_i`` within ``rel_i`` of ``y_i`` (all
    terms positive) is within ``max_i rel_i`` plus the rounding of its ``p`` products, their sum, the
    out-sum ``s_k`` of ``m`` terms and the division, ``gamma_{p+m+4}``.  Returns the tuple of
    :func:`gth_solve` (``underflows`` is 0; ``err`` bounds ``|x_j - y_j|``, y normalised, including the
    final rounding to double, which is absolute, 2^-1074, only below the normal range).
    """
    n = indptr.shape[0] - 1
    off = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        off[i + 1] = off[i] + (i - lo[i])
    Lm = np.zeros(off[n], dtype=np.float64)
    Le = np.zeros(off[n], dtype=np.int32)
    Um = np.zeros(off[n], dtype=np.float64)
    Ue = np.zeros(off[n], dtype=np.int32)
    for i in range(n):
        for q in range(indptr[i], indptr[i + 1]):
            j = indices[q]
            if j == i or not data[q] > 0.0:
                continue
            vm, ve = _x_from(data[q])
            if j < i:
                p = off[i] + j - lo[i]
                wm, we = _x_add(Lm[p], np.int64(Le[p]), vm, ve)
                Lm[p] = wm
                Le[p] = we
            else:
                p = off[j] + i - lo[j]
                wm, we = _x_add(Um[p], np.int64(Ue[p]), vm, ve)
                Um[p] = wm
                Ue[p] = we
    bstart, byk = _alive_by_step(lo, n)
    act = np.empty(n, dtype=np.int64)
    where = np.full(n, -1, dtype=np.int64)
    na = I0
    sm = np.zeros(n, dtype=np.float64)
    se = np.zeros(n, dtype=np.int64)
    sn = np.zeros(n, dtype=np.int64)
    pred_i = np.empty(n, dtype=np.int64)
    pred_m = np.empty(n, dtype=np.float64)
    pred_e = np.empty(n, dtype=np.int64)
    succ_j = np.empty(n, dtype=np.int64)
    succ_m = np.empty(n, dtype=np.float64)
    succ_e = np.empty(n, dtype=np.int64)
    log_bound = 0.0
    flops = 0
    x = np.zeros(n, dtype=np.float64)
    for k in range(n - 1):
        if where[k] >= 0:
            na = _active_remove(act, where, na, k)
        for t in range(bstart[k], bstart[k + 1]):
            na = _active_add(act, where, na, byk[t])
        skm = 0.0
        ske = np.int64(0)
        ns = 0
        npred = 0
        for t in range(na):
            i = act[t]
            q = off[i] + k - lo[i]
            if Um[q] > 0.0:
                skm, ske = _x_add(skm, ske, Um[q], np.int64(Ue[q]))
                succ_j[ns] = i
                succ_m[ns] = Um[q]
                succ_e[ns] = Ue[q]
                ns += 1
            if Lm[q] > 0.0:
                pred_i[npred] = i
                pred_m[npred] = Lm[q]
                pred_e[npred] = Le[q]
                npred += 1
        if not skm > 0.0:
            return GTH_REDUCIBLE, x, np.inf, flops, 0, x
        sm[k] = skm
        se[k] = ske
        for t in range(npred):
            i = pred_i[t]
            fm, fe = _x_div(pred_m[t], pred_e[t], skm, ske)
            base_i = off[i] - lo[i]
            for r in range(ns):
                j = succ_j[r]
                if j == i:
                    continue
                pm, pe = _x_mul(fm, fe, succ_m[r], succ_e[r])
                if j < i:
                    q = base_i + j
                    vm, ve = _x_add(Lm[q], np.int64(Le[q]), pm, pe)
                    Lm[q] = vm
                    Le[q] = ve
                else:
                    q = off[j] + i - lo[j]
                    vm, ve = _x_add(Um[q], np.int64(Ue[q]), pm, pe)
                    Um[q] = vm
                    Ue[q] = ve
                if ve > GTH_EXPONENT_LIMIT or ve < -GTH_EXPONENT_LIMIT:
                    return GTH_RANGE, x, np.inf, flops, 0, x
            flops += ns
        log_bound += npred * _gamma(ns + 3)
        sn[k] = ns
    # back-substitution (alive sets rebuilt in reverse, as in gth_solve), with relative bounds
    xm = np.zeros(n, dtype=np.float64)
    xe = np.zeros(n, dtype=np.int64)
    rel = np.zeros(n, dtype=np.float64)
    na = I0
    for i in range(n):
        where[i] = -1
    xm[n - 1] = 1.0
    if n >= 2 and lo[n - 1] <= n - 2:
        na = _active_add(act, where, na, n - 1)
    for k in range(n - 2, -1, -1):
        if k < n - 2:
            if lo[k + 1] <= k:
                na = _active_add(act, where, na, k + 1)
            for t in range(bstart[k + 1], bstart[k + 2]):
                i = byk[t]
                if where[i] >= 0:
                    na = _active_remove(act, where, na, i)
        am = 0.0
        ae = np.int64(0)
        rmax = 0.0
        p = 0
        for t in range(na):
            i = act[t]
            q = off[i] + k - lo[i]
            if Lm[q] > 0.0:
                pm, pe = _x_mul(xm[i], xe[i], Lm[q], np.int64(Le[q]))
                am, ae = _x_add(am, ae, pm, pe)
                if rel[i] > rmax:
                    rmax = rel[i]
                p += 1
        xm[k], xe[k] = _x_div(am, ae, sm[k], se[k])
        rel[k] = rmax + (1.0 + rmax) * _gamma(p + sn[k] + 4)
    tm = 0.0
    te = np.int64(0)
    R = 0.0
    for i in range(n):
        tm, te = _x_add(tm, te, xm[i], xe[i])
        if rel[i] > R:
            R = rel[i]
    err = np.zeros(n, dtype=np.float64)
    if not R < 0.25:
        for i in range(n):
            err[i] = np.inf
    g_n = _gamma(n + 2)
    tiny = 2.0 ** -1074
    for i in range(n):
        qm, qe = _x_div(xm[i], xe[i], tm, te)
        v = _x_to(qm, qe)
        x[i] = v
        eta = (1.0 + rel[i]) * (1.0 + 2.0 * R) * (1.0 + g_n) - 1.0
        e = eta / (1.0 - eta) * v * (1.0 + g_n)
        if qe < -1022:
            e += tiny
        err[i] += e
    return GTH_OK, x, 2.0 * log_bound, flops, 0, err


@njit(cache=True)
def _two_sum(a, b):
    """``(s, e)`` with ``s = fl(a + b)`` and ``a + b = s + e`` exactly (Knuth)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


@intrinsic
def _fma(typingctx, a, b, c):
    """``a * b + c`` rounded once (LLVM's ``llvm.fma.f64``: the FMA instruction, or libm's exact ``fma``)."""
    if not (a == types.float64 and b == types.float64 and c == types.float64):
        return None

    def codegen(context, builder, signature, args):
        d = ir.DoubleType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(d, [d, d, d]), "llvm.fma.f64")
        return builder.call(fn, args)

    return types.float64(types.float64, types.float64, types.float64), codegen


@intrinsic
def _subnormal(typingctx, k):
    """``k * 2^-1074`` for ``0 <= k < 2^52`` by reinterpreting the integer's bits as a double.

    Exactly the value of the product, without floating-point arithmetic on a subnormal result
    (which costs a microcode assist, ~100 cycles, on x86).
    """
    if k != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@njit(cache=True)
def _two_prod(a, b):
    """``(p, e)`` with ``p = fl(a b)`` and ``a b = p + e`` exactly barring underflow.

    ``e = fma(a, b, -p)``: the product's error is a double whenever it is not below the normal
    range, so the single rounding of the fused operation leaves it exact (two operations instead of
    Dekker's seventeen; below the normal range it is off by at most 2^-1075, as Dekker's would be).
    """
    p = a * b
    return p, _fma(a, b, -p)


@njit(cache=True)
def _find(uf, a):
    while uf[a] != a:
        uf[a] = uf[uf[a]]
        a = uf[a]
    return a


@njit(cache=True)
def _kruskal_pass(ea, eb, ew, uf, usz, ta, tb, tw, ne):
    """Add edges ``ea -> eb`` (flows ``ew``) by decreasing bucketed flow while they join components.

    A positive double's bit pattern shifted right by 50 is its exponent and two leading mantissa
    bits: a bucket index monotone in the flow, in steps of at most 2^(1/4) (a counting sort).
    """
    NB = 8192
    n = uf.shape[0]
    m = ea.shape[0]
    bits = ew.view(np.int64)
    count = np.zeros(NB + 1, dtype=np.int64)
    for t in range(m):
        count[NB - 1 - (bits[t] >> 50) + 1] += 1
    for b in range(NB):
        count[b + 1] += count[b]
    perm = np.empty(m, dtype=np.int64)
    for t in range(m):
        b = NB - 1 - (bits[t] >> 50)
        perm[count[b]] = t
        count[b] += 1
    for r in range(m):
        if ne == n - 1:
            break
        t = perm[r]
        i = ea[t]
        j = eb[t]
        ri = _find(uf, i)
        rj = _find(uf, j)
        if ri != rj:
            if usz[ri] > usz[rj]:
                ri, rj = rj, ri
            uf[ri] = rj
            usz[rj] += usz[ri]
            ta[ne] = i
            tb[ne] = j
            tw[ne] = ew[t] * (1.0 - _gamma(I1))
            ne += 1
    return ne


@njit(cache=True)
def _max_flow_tree(indptr, indices, data, x, ea, eb, ew):
    """A spanning tree of large one-way flows ``x_i T_ij`` (Kruskal on bucketed flows).

    ``ea -> eb`` (flows ``ew``, all positive): every state's largest outgoing
    and incoming flow, found by the caller (these contain Boruvka's first
    round, all edges of the maximum spanning tree).  Kruskal runs over them
    with flows bucketed in steps of 2^(1/4) (a counting sort over the
    exponent bits); if that leaves several components, it continues over all
    edges of T.  Returns ``(order, parent, w)``: states in breadth-first
    order of the tree from state 0 (parents first; shorter than n when the
    graph is disconnected), each state's parent and a lower bound on the
    flow of the edge to it.
    """
    n = indptr.shape[0] - 1
    uf = np.arange(n)
    usz = np.ones(n, dtype=np.int64)
    ta = np.empty(n, dtype=np.int64)
    tb = np.empty(n, dtype=np.int64)
    tw = np.empty(n, dtype=np.float64)
    ne = _kruskal_pass(ea, eb, ew, uf, usz, ta, tb, tw, I0)
    if ne < n - 1:
        nnz = indptr[n]
        fa = np.empty(nnz, dtype=np.int64)
        fb = np.empty(nnz, dtype=np.int64)
        fw = np.empty(nnz, dtype=np.float64)
        m = 0
        for i in range(n):
            for q in range(indptr[i], indptr[i + 1]):
                wq = x[i] * data[q]
                if indices[q] != i and wq > 0.0:
                    fa[m] = i
                    fb[m] = indices[q]
                    fw[m] = wq
                    m += 1
        ne = _kruskal_pass(fa[:m], fb[:m], fw[:m], uf, usz, ta, tb, tw, ne)
    # root the tree at state 0 (breadth-first)
    deg = np.zeros(n + 1, dtype=np.int64)
    for e in range(ne):
        deg[ta[e] + 1] += 1
        deg[tb[e] + 1] += 1
    for i in range(n):
        deg[i + 1] += deg[i]
    adj = np.empty(2 * ne, dtype=np.int64)
    adjw = np.empty(2 * ne, dtype=np.float64)
    fillp = deg[:n].copy()
    for e in range(ne):
        adj[fillp[ta[e]]] = tb[e]
        adjw[fillp[ta[e]]] = tw[e]
        fillp[ta[e]] += 1
        adj[fillp[tb[e]]] = ta[e]
        adjw[fillp[tb[e]]] = tw[e]
        fillp[tb[e]] += 1
    parent = np.full(n, -1, dtype=np.int64)
    w = np.zeros(n, dtype=np.float64)
    order = np.empty(n, dtype=np.int64)
    seen = np.zeros(n, dtype=np.bool_)
    order[0] = 0
    seen[0] = True
    w[0] = np.inf
    head = 0
    no = 1
    while head < no:
        v = order[head]
        head += 1
        for t in range(deg[v], deg[v + 1]):
            c = adj[t]
            if not seen[c]:
                seen[c] = True
                parent[c] = v
                w[c] = adjw[t]
                order[no] = c
                no += 1
    return order[:no], parent, w


@njit(cache=True)
def tree_bound(indptr, indices, data, tindptr, tindices, tdata, x):
    """A-posteriori bound on ``max_j |ln(x_j / pi_j)|`` for any approximation ``x`` (normalised).

    ``indptr/indices/data``: CSR of T; ``t*``: CSR of its transpose.  The
    flow imbalance of each state, ``f_j = sum_{i!=j} x_i T_ij - x_j sum_{i!=j}
    T_ji`` (double-double), is moved along a spanning tree of large flows
    (:func:`_max_flow_tree`): the tree edge above state j must carry the
    imbalance ``F_j`` of j's subtree, which rescales that one transition by a
    factor ``1 + eps_j`` with ``|eps_j| <= |F_j| / w_j`` (``w_j``: its flow).
    ``x`` is then exactly stationary for the perturbed chain, and by the
    Markov chain tree theorem (each stationary weight is a sum over spanning
    trees of products with one outgoing edge per state) every ``x_j / pi_j``
    lies within ``exp(+-2 E)``, ``E = sum_a max_{e at a} -ln(1 - eps_e)``.
    Rounding in ``f`` and in the subtree sums is bounded and added to
    ``|F_j|``; a subtree's imbalance is also bounded from the other side of
    the edge (it is minus the imbalance of the rest).

    Returns ``(2 E, status)``: ``status`` 0, or 1 when the graph of positive
    flows is not connected (the bound is then inf).  The bound is inf when
    some ``eps >= 1`` (the approximation cannot be certified).
    """
    n = indptr.shape[0] - 1
    f = np.zeros(n, dtype=np.float64)
    beta = np.zeros(n, dtype=np.float64)
    u2 = UNIT_ROUNDOFF * UNIT_ROUNDOFF
    # each state's largest outgoing and incoming flow: the candidate edges of the spanning tree
    ea = np.empty(2 * n, dtype=np.int64)
    eb = np.empty(2 * n, dtype=np.int64)
    ew = np.empty(2 * n, dtype=np.float64)
    ne = I0
    for j in range(n):
        # in- and outflow in double-double (error-free products and sums), so that the rounding left
        # in f_j is ~u^2 of the flows: subtree sums of f must resolve weak links carrying 1e-20 of the flow
        sh = 0.0
        sl = 0.0
        mo = 0
        bq = -1
        bp = 0.0
        for q in range(indptr[j], indptr[j + 1]):
            if indices[q] != j:
                sh, e = _two_sum(sh, data[q])
                sl += e
                mo += 1
                if data[q] > bp:
                    bp = data[q]
                    bq = q
        oh, ol = _two_prod(x[j], sh)
        ol += x[j] * sl
        if bq >= 0 and x[j] * bp > 0.0:
            ea[ne] = j
            eb[ne] = indices[bq]
            ew[ne] = x[j] * bp
            ne += 1
        ih = 0.0
        il = 0.0
        mi = 0
        bi = -1
        bw = 0.0
        for q in range(tindptr[j], tindptr[j + 1]):
            i = tindices[q]
            if i != j:
                ph, pl = _two_prod(x[i], tdata[q])
                ih, e = _two_sum(ih, ph)
                il += e + pl
                mi += 1
                if ph > bw:
                    bw = ph
                    bi = i
        if bi >= 0:
            ea[ne] = bi
            eb[ne] = j
            ew[ne] = bw
            ne += 1
        dh, e = _two_sum(ih, -oh)
        f[j] = dh + (e + (il - ol))
        m = mi + mo + 4
        # (+ the absolute error of products that fell below the normal range, 2^-1074 each)
        beta[j] = 4.0 * m * m * u2 * (ih + oh) + UNIT_ROUNDOFF * abs(f[j]) + _subnormal(np.int64(4 * m))
    order, parent, w = _max_flow_tree(indptr, indices, data, x, ea[:ne], eb[:ne], ew[:ne])
    if order.shape[0] < n:
        return np.inf, 1
    # subtree sums of the imbalances (F), of their rounding bounds (Bb) and of the rounding of these sums (Se)
    F = f.copy()
    Bb = beta.copy()
    Se = np.zeros(n, dtype=np.float64)
    for t in range(n - 1, 0, -1):
        j = order[t]
        p = parent[j]
        F[p] += F[j]
        Bb[p] += Bb[j]
        Se[p] += Se[j] + UNIT_ROUNDOFF * abs(F[p])
    root = order[0]
    tot_F = F[root]
    tot_B = Bb[root]
    g_n = _gamma(n + 2)
    m = np.zeros(n, dtype=np.float64)
    for t in range(1, n):
        j = order[t]
        # |true subtree imbalance| from this side, or as minus the imbalance of the rest
        side = abs(F[j]) + Bb[j] * (1.0 + g_n) + Se[j] * (1.0 + g_n)
        other = (abs(tot_F - F[j]) + (tot_B - Bb[j]) + g_n * tot_B + 2.0 * Se[root]
                 + UNIT_ROUNDOFF * (abs(tot_F) + abs(F[j]))) * (1.0 + g_n)
        imb = side if side < other else other
        if not w[j] > 0.0:
            return np.inf, 0
        eps = imb / w[j]
        if eps > m[j]:
            m[j] = eps
        p = parent[j]
        if eps > m[p]:
            m[p] = eps
    E = 0.0
    for a in range(n):
        if m[a] >= 1.0:
            return np.inf, 0
        E += -np.log1p(-m[a])
    return 2.0 * E * (1.0 + 1e-12), 0


@njit(cache=True)
def encode_configs(W, Bb, R, bn, br):
    """Pack rows of (k, b, r) arrays of shape (n, M) into keys (the chain's packing)."""
    n, M = W.shape
    out = np.empty(n, dtype=np.int64)
    for s in range(n):
        out[s] = _encode(W[s], Bb[s], R[s], M, bn, br)
    return out
