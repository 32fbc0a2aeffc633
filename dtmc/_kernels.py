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

import numpy as np
from numba import njit

EMPTY = -1

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


@njit(cache=True)
def _launch(k, b, r, B, caps, d, M):
    for j in range(M):
        if b[j] == 0 and k[j] >= B[j]:
            take = k[j] if k[j] < caps[j] else caps[j]
            b[j] = take
            k[j] -= take
            r[j] = d[j, take]


@njit(cache=True)
def build_chain(N, B, caps, d, P, cbar, offsets, parts, prob, bn, br, max_states, max_transitions, init_cap):
    """Breadth-first enumeration of the reachable states and their transitions.

    Returns ``(status, n, keys, row_ptr, cols, vals, tau, g)``: the first ``n``
    packed keys in discovery order, the CSR transition matrix (rows in the same
    order, duplicates merged, columns sorted by key within a row), the holding
    time ``tau`` in quanta and the expected committed tokens ``g`` of each
    state.  ``status`` is OK, TOO_MANY_STATES (stopped once ``n`` exceeded
    ``max_states`` or its transitions ``max_transitions``, before the buffers
    could outgrow memory) or DEADLOCK (a state with no running model).
    """
    M = B.shape[0]
    cap = init_cap
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
    _launch(k, b, r, B, caps, d, M)
    key0 = _encode(k, b, r, M, bn, br)
    keys[0] = key0
    _table_find_or_insert(tkeys, tvals, key0, 0)
    n = 1
    nnz = 0
    row_ptr[0] = 0

    obuf_k = np.empty(256, dtype=np.int64)
    obuf_p = np.empty(256, dtype=np.float64)

    head = 0
    while head < n:
        _decode(keys[head], k, b, r, M, bn, br)
        t = np.int64(1) << 62
        for i in range(M):
            if b[i] > 0 and r[i] < t:
                t = r[i]
        if t == (np.int64(1) << 62):
            return DEADLOCK, head, keys, row_ptr, cols, vals, tau, g
        na = 0
        gs = 0.0
        for i in range(M):
            if b[i] > 0 and r[i] == t:
                done[na] = i
                lo[na] = offsets[b[i]]
                hi[na] = offsets[b[i] + 1]
                idx[na] = lo[na]
                na += 1
                gs += b[i] * cbar[i]
        tau[head] = t
        g[head] = gs

        # enumerate the joint multinomial outcomes (odometer over `done`)
        nout = 0
        while True:
            p = 1.0
            for a in range(na):
                p *= prob[done[a], idx[a]]
            if p > 0.0:
                for i in range(M):
                    k2[i] = k[i]
                    if b[i] > 0 and r[i] != t:
                        b2[i] = b[i]
                        r2[i] = r[i] - t
                    else:
                        b2[i] = 0
                        r2[i] = 0
                for a in range(na):
                    c = idx[a]
                    for j in range(M):
                        k2[j] += parts[c, j]
                _launch(k2, b2, r2, B, caps, d, M)
                if nout == obuf_k.shape[0]:
                    obuf_k = _grow(obuf_k, nout + 1)
                    obuf_p = _grow(obuf_p, nout + 1)
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

        # merge duplicate successors, then record the row; one completing model
        # gives distinct successors (its outcomes differ in the queue vector and
        # the launch rule is injective on them), so only simultaneous
        # completions need the sort
        if na > 1:
            order = np.argsort(obuf_k[:nout], kind="mergesort")
        else:
            order = np.arange(nout)
        if nnz + nout > max_transitions:
            return TOO_MANY_STATES, n, keys, row_ptr, cols, vals, tau, g
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
                    return TOO_MANY_STATES, n + 1, keys, row_ptr, cols, vals, tau, g
                if n == keys.shape[0]:
                    keys = _grow(keys, n + 1)
                    tau = _grow(tau, n + 1)
                    g = _grow(g, n + 1)
                if n + 2 > row_ptr.shape[0]:
                    row_ptr = _grow(row_ptr, n + 2)
                keys[n] = kk
                n += 1
                if 2 * n > tkeys.shape[0]:
                    tkeys, tvals = _table_rebuild(keys, n, tkeys.shape[0] * 2)
            cols[nnz] = col
            vals[nnz] = obuf_p[o]
            nnz += 1
        head += 1
        row_ptr[head] = nnz
    return OK, n, keys, row_ptr, cols, vals, tau, g


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
def anderson_gs(indptr, indices, data, x, tol, max_sweeps, m, check_every):
    """Gauss-Seidel sweeps accelerated by Anderson mixing (memory ``m``), in place on ``x``.

    With the fixed-point map ``G`` = one sweep + renormalisation and
    ``f_k = G(x_k) - x_k``, each step solves the small regularised normal
    equations ``(dF^T dF) gamma = dF^T f_k`` over the last ``m`` differences
    and sets ``x_{k+1} = G(x_k) - (dX + dF) gamma``, clipped at zero and
    renormalised.  Every ``check_every`` steps the residual of the iterate is
    checked.
    A residual more than 10x the previous check's restarts the history.
    Stops when ``max_j |(xT)_j - x_j| <= tol * max(x)``, or when four checks
    in a row bring no 10% improvement (the residual has reached the floor
    that rounding allows: on large chains this floor can sit above a tight
    ``tol``; the caller decides whether to accept it).  Returns
    ``(sweeps, residual)``.
    """
    n = indptr.shape[0] - 1
    diag = diagonal(indptr, indices, data)
    dX = np.zeros((m, n), dtype=np.float64)
    dF = np.zeros((m, n), dtype=np.float64)
    G = np.zeros((m, m), dtype=np.float64)
    y = np.empty(n, dtype=np.float64)
    f = np.empty(n, dtype=np.float64)
    x_prev = np.empty(n, dtype=np.float64)
    f_prev = np.empty(n, dtype=np.float64)
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
        have_prev = True
        k = filled if filled < m else m
        if k > 0:
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
            tot = 0.0
            for j in range(n):
                v = y[j]
                for a in range(k):
                    v -= (dX[a, j] + dF[a, j]) * gamma[a]
                if v < 0.0:
                    v = 0.0
                x[j] = v
                tot += v
            if tot > 0.0 and np.isfinite(tot):
                for j in range(n):
                    x[j] /= tot
            else:
                for j in range(n):
                    x[j] = y[j]
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
            if res < 0.9 * best:
                best = res
                stalled = 0
            else:
                stalled += 1
                if stalled >= 4:
                    break
    return it, res
