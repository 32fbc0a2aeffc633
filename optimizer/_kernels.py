"""Compiled kernels of the optimizer (the only numba module of ``optimizer``).

The family bound of :mod:`optimizer.bounds` needs the decision process in
which every idle model ``j`` holding ``k_j`` requests may launch or wait when
``lo_j <= k_j < hi_j`` (it must launch at ``k_j >= hi_j`` and cannot below
``lo_j``).  Every threshold vector with ``lo <= B <= hi`` is one stationary
policy of it.  :func:`mdp_build` enumerates the states reachable under *any*
such policy (breadth-first, like the chain itself) and, per state, the merged
routing outcomes and the post-launch states each outcome can lead to;
:func:`mdp_sweeps` runs in-place value-iteration sweeps; :func:`mdp_bracket`
evaluates the certificate ``max_s (g + Q*h - h) / tau`` for the final ``h``.

Two builders on purpose: :func:`mdp_build` (fine clock) merges routing outcomes
that give the same queues, :func:`coarse_mdp_build` (bound 5) must keep them
apart because the order of completions matters.  Their last ten lines (indexing
the option keys) look alike; one shared kernel returning the grown arrays was
measured 7-12 % slower on the box pass (R2R, N = 64, alternating runs), so each
keeps its own loop.

State packing (as in the chain): model i holds ``k_i`` and ``b_i`` (``bn``
bits each) and ``r_i`` (``br`` bits) in one int64 key.  Kernels take and
return NumPy arrays and scalars only.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from dtmc._kernels import EMPTY, I0, I1, ChainTables, _borrow, _borrowed_tables, _launch_mask, corun_at_launch
from dtmc._kernels import _decode as _unpack
from dtmc._kernels import _encode as _pack
from dtmc._kernels import _grow, _mix, _table_size  # noqa: F401  (the hash table's, re-exported for the tests)
from dtmc._kernels import _table_find_or_insert as _find
from dtmc._kernels import _table_rebuild as _rehash

# The hash table, the state packing and the launch law above are dtmc's own kernels (one copy each).
# numba's cache keys a function on its own file only: a cached kernel here that inlined an older dtmc
# kernel would survive an edit of dtmc/_kernels.py.  This stamp is the sha256 of that file;
# tests/test_kernel_copies.py fails when it is stale, and updating it edits this file, which invalidates
# this module's cache.
_DTMC_KERNELS_SHA = "b87f609d6fd3b25423dd51d0044828d420681f528e118edbce5839224daa75f3"

class Box(NamedTuple):
    """A threshold box ``lo <= B <= hi`` (componentwise): the launch freedom of a decision process."""

    lo: np.ndarray
    hi: np.ndarray


class Limits(NamedTuple):
    """When an enumeration gives up: more than ``max_states`` states or ``max_entries`` option entries."""

    max_states: int
    max_entries: int


class MDP(NamedTuple):
    """A built decision process as the solvers read it: ``n`` states, routing outcomes
    ``out_ptr[s]:out_ptr[s+1]`` with probabilities ``out_prob``, the options ``opt_idx[opt_ptr[u]:opt_ptr[u+1]]``
    of outcome ``u``, rewards ``g`` and holding times ``tau`` (float64)."""

    n: int
    out_ptr: np.ndarray
    out_prob: np.ndarray
    opt_ptr: np.ndarray
    opt_idx: np.ndarray
    g: np.ndarray
    tau: np.ndarray


class SolveSettings(NamedTuple):
    """How :func:`mdp_solve` iterates and when it stops (see there)."""

    omega: float
    every: int
    nref: int
    rtol: float
    floor_rtol: float
    max_sweeps: int
    terms: int


class CoarseProcess(NamedTuple):
    """A coarse-clock process with the decision bounds :func:`mdp_restrict` cuts sub-boxes out by: the
    arrays of :func:`coarse_mdp_build` after its status (``keys`` left out)."""

    n: int
    tau: np.ndarray
    g: np.ndarray
    out_ptr: np.ndarray
    out_prob: np.ndarray
    opt_ptr: np.ndarray
    opt_idx: np.ndarray
    opt_w: np.ndarray
    opt_l: np.ndarray
    ninit: int
    init_idx: np.ndarray
    init_w: np.ndarray
    init_l: np.ndarray


class ClassRule(NamedTuple):
    """A compact policy class's rule: its kernel code, parameters (M, P) and the models by step length."""

    cls: int
    par: np.ndarray
    order: np.ndarray


class _OptionScratch(NamedTuple):
    free: np.ndarray
    k2: np.ndarray
    b2: np.ndarray
    r2: np.ndarray


class _CoarseScratch(NamedTuple):
    cfg: np.ndarray
    nxt: np.ndarray
    opts: np.ndarray
    ow: np.ndarray
    ol: np.ndarray
    stage: np.ndarray
    kk: np.ndarray
    bb: np.ndarray
    rr: np.ndarray
    ch: np.ndarray
    nch: np.ndarray
    first: np.ndarray
    k: np.ndarray
    b: np.ndarray
    r: np.ndarray
    done: np.ndarray
    idx: np.ndarray
    clo: np.ndarray
    chi: np.ndarray


# lmin of a model that never launched: above any queue a coarse-clock process is built for (N < NO_LAUNCH,
# box_bound checks), and the largest int16, the type of the decision bounds a kept process stores per entry
NO_LAUNCH = 32767
OK = 0
TOO_LARGE = 1
DEADLOCK = 2


@njit(cache=True, inline="always")
def _completing(b, r, t, offsets, done, clo, chi, idx, M):
    """The models whose batches end at ``t`` (into ``done``) with the ranges of their routing outcomes (the
    odometer ``idx`` over ``[clo, chi)`` set to its first reading); returns how many."""
    na = I0
    for i in range(M):
        if r[i] > 0 and r[i] == t:
            done[na] = i
            clo[na] = offsets[b[i]]
            chi[na] = offsets[b[i] + 1]
            idx[na] = clo[na]
            na += 1
    return na


@njit(cache=True, inline="always")
def _next_outcome(idx, clo, chi, na):
    """Advance the odometer ``idx`` over the joint routing outcomes; False once every outcome was read."""
    a = na - 1
    while a >= 0:
        idx[a] += 1
        if idx[a] < chi[a]:
            return True
        idx[a] = clo[a]
        a -= 1
    return False


@njit(cache=True, inline="always")
def _routed(k, b, r, t, idx, na, parts, k2, b2, r2, M):
    """Into ``(k2, b2, r2)``: the configuration after the batches ending at ``t`` complete and their requests
    are routed as outcome ``idx`` says (no launch yet)."""
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


@njit(cache=True)
def _options(k, b, r, box, tables, out, empty, sc):
    """Post-launch keys reachable from the pre-decision configuration (k, b, r) under the box's launch
    freedom; returns their count.

    A model is idle when ``r == 0``.  With ``empty``, an idle model may also start an empty batch
    (busy for ``d[j, 0]`` quanta, serving nobody).  Each decision is applied by the chain's own launch
    law (:func:`dtmc._kernels._launch_mask`).  ``sc``: scratch (:class:`_OptionScratch`).
    """
    lo, hi = box.lo, box.hi
    caps, d, dco, corun, bn, br = tables.caps, tables.d, tables.dco, tables.corun, tables.bn, tables.br
    free, k2, b2, r2 = sc.free, sc.k2, sc.b2, sc.r2
    M = k.shape[0]
    nf = 0
    for j in range(M):
        if r[j] == 0 and (k[j] >= 1 or empty) and k[j] >= lo[j] and k[j] < hi[j]:
            free[nf] = j
            nf += 1
    cnt = 0
    for mask in range(1 << nf):
        lmask = 0
        for j in range(M):
            k2[j] = k[j]
            b2[j] = b[j]
            r2[j] = r[j]
            if r[j] == 0 and (k[j] >= 1 or empty):
                launch = k[j] >= hi[j] and k[j] >= 1
                if not launch:
                    for f in range(nf):
                        if free[f] == j and (mask >> f) & 1:
                            launch = True
                if launch:
                    lmask |= 1 << j
        _launch_mask(k2, b2, r2, lmask, caps, d, dco, corun, M)
        running = False
        for j in range(M):
            if r2[j] > 0:
                running = True
        if running:
            out[cnt] = _pack(k2, b2, r2, M, bn, br)
            cnt += 1
    return cnt


@njit(cache=True)
def _mdp_build(N, box, tables, limits, empty, keep):
    """Enumerate the decision process of the threshold box ``box`` (:class:`Box`) of the system ``tables``
    (dtmc's :class:`ChainTables`) within ``limits`` (:class:`Limits`).

    Launches follow the chain's launch law (co-running included, see :func:`_options`); every threshold
    vector of the box is still one stationary policy of it.

    Returns ``(status, n, keys, tau, g, out_ptr, out_prob, opt_ptr, opt_idx, ukey, key0, init)``:
    state ``s`` has routing outcomes ``out_ptr[s]:out_ptr[s+1]`` (merged,
    probabilities ``out_prob``), and outcome ``u`` may lead to the states
    ``opt_idx[opt_ptr[u]:opt_ptr[u+1]]`` (one per allowed launch decision).
    ``status``: OK, TOO_LARGE (more than ``max_states`` states or
    ``max_entries`` option entries) or DEADLOCK.  With ``keep``, ``ukey[u]`` is outcome ``u``'s
    pre-decision key (the configuration after the completions and routing, before any launch; idle
    models have ``b = r = 0``; unfilled otherwise), ``key0`` the initial configuration's (all N at
    model 0) and ``init`` the state indices its decision may lead to.
    """
    # the box and the tables are borrowed (dtmc._kernels._borrow; the caller owns them): each call of
    # _options per routing outcome would otherwise count references to five of their arrays
    box = Box(_borrow(box.lo), _borrow(box.hi))
    tables = _borrowed_tables(tables)
    cbar, offsets, parts, prob, bn, br = (tables.cbar, tables.offsets, tables.parts, tables.prob, tables.bn,
                                          tables.br)
    max_states, max_entries = limits.max_states, limits.max_entries
    M = box.lo.shape[0]
    cap = 1024
    keys = np.empty(cap, dtype=np.int64)
    tau = np.empty(cap, dtype=np.int64)
    g = np.empty(cap, dtype=np.float64)
    out_ptr = np.zeros(cap + 1, dtype=np.int64)
    out_prob = np.empty(cap * 4, dtype=np.float64)
    opt_ptr = np.zeros(cap * 4 + 1, dtype=np.int64)
    opt_idx = np.empty(cap * 8, dtype=np.int64)
    tcap = 4096
    tkeys = np.full(tcap, EMPTY, dtype=np.int64)
    tvals = np.empty(tcap, dtype=np.int64)
    k = np.zeros(M, dtype=np.int64)
    b = np.zeros(M, dtype=np.int64)
    r = np.zeros(M, dtype=np.int64)
    k2 = np.zeros(M, dtype=np.int64)
    b2 = np.zeros(M, dtype=np.int64)
    r2 = np.zeros(M, dtype=np.int64)
    done = np.zeros(M, dtype=np.int64)
    idx = np.zeros(M, dtype=np.int64)
    clo = np.zeros(M, dtype=np.int64)
    chi = np.zeros(M, dtype=np.int64)
    optbuf = np.empty(1 << M, dtype=np.int64)
    sc = _OptionScratch(np.zeros(M, dtype=np.int64), np.zeros(M, dtype=np.int64), np.zeros(M, dtype=np.int64),
                        np.zeros(M, dtype=np.int64))
    ukeys = np.empty(256, dtype=np.int64)
    uprob = np.empty(256, dtype=np.float64)

    # initial configuration: all N wait at model 0, every allowed first decision is a start state
    ukeep = np.empty(cap * 4 if keep else 1, dtype=np.int64)
    init = np.empty(1 << M, dtype=np.int64)
    k[0] = N
    key0 = _pack(k, b, r, M, bn, br)
    n = I0
    cnt = _options(k, b, r, box, tables, optbuf, empty, sc)
    if cnt == 0:
        return DEADLOCK, 0, keys, tau, g, out_ptr, out_prob, opt_ptr, opt_idx, ukeep, key0, init
    init = init[:cnt]
    for q in range(cnt):
        ix, ins = _find(tkeys, tvals, optbuf[q], n)
        init[q] = ix
        if ins:
            keys[n] = optbuf[q]
            n += 1
    nu = 0
    ne = I0
    head = 0
    while head < n:
        _unpack(keys[head], k, b, r, M, bn, br)
        t = np.int64(1) << 62
        for i in range(M):
            if r[i] > 0 and r[i] < t:
                t = r[i]
        if t == (np.int64(1) << 62):
            return DEADLOCK, head, keys, tau, g, out_ptr, out_prob, opt_ptr, opt_idx, ukeep, key0, init
        na = _completing(b, r, t, offsets, done, clo, chi, idx, M)
        gs = 0.0
        for a in range(na):
            gs += b[done[a]] * cbar[done[a]]
        tau[head] = t
        g[head] = gs
        # routing outcomes -> pre-decision keys (no launch yet).  Every array this state can fill is grown
        # here, before the loops: an array reassigned inside a loop costs two atomic reference-count updates per
        # iteration (numba): measured, half of the build's time.
        mmax = I1
        for a in range(na):
            mmax *= chi[a] - clo[a]
        if mmax > ukeys.shape[0]:
            ukeys = _grow(ukeys, mmax)
            uprob = _grow(uprob, mmax)
        m = 0
        while True:
            p = 1.0
            for a in range(na):
                p *= prob[done[a], idx[a]]
            if p > 0.0:
                _routed(k, b, r, t, idx, na, parts, k2, b2, r2, M)
                ukeys[m] = _pack(k2, b2, r2, M, bn, br)
                uprob[m] = p
                m += 1
            if not _next_outcome(idx, clo, chi, na):
                break
        order = np.argsort(ukeys[:m], kind="mergesort")
        nopt = m * (1 << M)                 # at most 2^M options per outcome
        if nu + m + 2 >= out_prob.shape[0]:
            out_prob = _grow(out_prob, nu + m + 3)
        if nu + m + 3 >= opt_ptr.shape[0]:
            opt_ptr = _grow(opt_ptr, nu + m + 4)
        if keep and nu + m + 2 >= ukeep.shape[0]:
            ukeep = _grow(ukeep, nu + m + 3)
        if ne + nopt > opt_idx.shape[0]:
            opt_idx = _grow(opt_idx, ne + nopt)
        if n + nopt >= keys.shape[0]:
            keys = _grow(keys, n + nopt + 1)
            tau = _grow(tau, n + nopt + 1)
            g = _grow(g, n + nopt + 1)
            out_ptr = _grow(out_ptr, keys.shape[0] + 1)
        if 2 * (n + nopt) > tkeys.shape[0]:
            tkeys, tvals = _rehash(keys, n, _table_size(n + nopt, tkeys.shape[0]))
        last = np.int64(-2)
        for q in range(m):
            o = order[q]
            if ukeys[o] == last:
                out_prob[nu - 1] += uprob[o]
                continue
            last = ukeys[o]
            out_prob[nu] = uprob[o]
            if keep:
                ukeep[nu] = last
            _unpack(last, k2, b2, r2, M, bn, br)
            cnt = _options(k2, b2, r2, box, tables, optbuf, empty, sc)
            if cnt == 0:
                return DEADLOCK, head, keys, tau, g, out_ptr, out_prob, opt_ptr, opt_idx, ukeep, key0, init
            if ne + cnt > max_entries:
                return TOO_LARGE, n, keys, tau, g, out_ptr, out_prob, opt_ptr, opt_idx, ukeep, key0, init
            for c2 in range(cnt):
                ix, ins = _find(tkeys, tvals, optbuf[c2], n)
                if ins:
                    if n >= max_states:
                        return TOO_LARGE, n, keys, tau, g, out_ptr, out_prob, opt_ptr, opt_idx, ukeep, key0, init
                    keys[n] = optbuf[c2]
                    n += 1
                opt_idx[ne] = ix
                ne += 1
            nu += 1
            opt_ptr[nu] = ne
        head += 1
        out_ptr[head] = nu
    return OK, n, keys, tau, g, out_ptr, out_prob, opt_ptr, opt_idx, ukeep, key0, init


@njit(cache=True)
def mdp_build(N, box, tables, limits, empty):
    """The decision process of the threshold box ``box`` (:func:`_mdp_build`); returns
    ``(status, n, keys, tau, g, out_ptr, out_prob, opt_ptr, opt_idx)``."""
    res = _mdp_build(N, box, tables, limits, empty, False)
    return res[0], res[1], res[2], res[3], res[4], res[5], res[6], res[7], res[8]


@njit(cache=True)
def policy_mdp_build(N, box, tables, limits, empty):
    """:func:`mdp_build` that also returns, per routing outcome, its pre-decision key, the initial
    configuration's key and the states its decision may lead to (the optimal-policy solver):
    ``(status, n, keys, tau, g, out_ptr, out_prob, opt_ptr, opt_idx, ukey, init_key, init_opts)``."""
    return _mdp_build(N, box, tables, limits, empty, True)


@njit(cache=True)
def _qmax(s, h, out_ptr, out_prob, opt_ptr, opt_idx):
    q = 0.0
    for u in range(out_ptr[s], out_ptr[s + 1]):
        best = -1e300
        for e in range(opt_ptr[u], opt_ptr[u + 1]):
            v = h[opt_idx[e]]
            if v > best:
                best = v
        q += out_prob[u] * best
    return q


@njit(cache=True)
def mdp_sweeps(mdp, h, lam, sweeps, omega):
    """``sweeps`` in-place Gauss-Seidel value-iteration sweeps of ``h <- g - lam tau + Q* h`` on ``mdp``
    (:class:`MDP`), renormalised.

    ``omega < 1`` damps each update (``h += omega (new - h)``): the aperiodicity transform, which makes
    the iteration converge on periodic processes (coarse clocks with commensurate steps are).
    """
    n, out_ptr, out_prob, opt_ptr, opt_idx, g, tau = mdp
    for _ in range(sweeps):
        for s in range(n):
            v = g[s] - lam * tau[s] + _qmax(s, h, out_ptr, out_prob, opt_ptr, opt_idx)
            h[s] += omega * (v - h[s])
        ref = h[0]
        for s in range(n):
            h[s] -= ref


@njit(cache=True)
def mdp_bracket(mdp, h):
    """``(min_s D, max_s D, max_s |terms|)`` with ``D = (g + Q*h - h) / tau`` on ``mdp`` (:class:`MDP`): the
    optimum lies in between."""
    n, out_ptr, out_prob, opt_ptr, opt_idx, g, tau = mdp
    lo = 1e300
    hi = -1e300
    mag = 0.0
    for s in range(n):
        q = _qmax(s, h, out_ptr, out_prob, opt_ptr, opt_idx)
        D = (g[s] + q - h[s]) / tau[s]
        if D < lo:
            lo = D
        if D > hi:
            hi = D
        a = (abs(g[s]) + abs(q) + abs(h[s])) / tau[s]
        if a > mag:
            mag = a
    return lo, hi, mag


# ---------------------------------------------------------------------------------------------
# The coarse-clock relaxation (docs/model.md, bound 5).  Time is read on a clock of slots of
# ``c`` quanta; a batch launched inside a slot ends ``floor`` or ``ceil`` of its quanta / c slots
# later (the controller picks), and completions that fall in one slot happen in an order the
# controller picks (an ordered partition of the completing models), each stage followed by the
# launch rule of the box.  Every trajectory of the fine chain is one history-dependent policy of
# it, so its certificate bounds the fine chain; the state space shrinks by about c per residual.

@njit(cache=True, inline="always")
def _same_span(cfg, c, first, ch, caps, dur, co, M):
    """Whether the launch choice ``first + ch`` of row ``c`` picks a ceil (2) for some model whose
    floor and ceil spans are equal in the table the launch law gives (``co``): that row is the same
    as the one with the floor, so listing it again adds nothing (only the co-running case can have
    such choices: ``two`` looks at both tables)."""
    for j in range(M):
        if first[j] + ch[j] == 2:
            k = cfg[c, j]
            take = k if k < caps[j] else caps[j]
            if co:
                if dur[2, j, take] == dur[3, j, take]:
                    return True
            elif dur[0, j, take] == dur[1, j, take]:
                return True
    return False


@njit(cache=True)
def _stage_launch(cfg, ncfg, out, box, tables, dur, sc):
    """Expand configurations ``cfg[:ncfg]`` (rows k | b | r | wmax | lmin) by every allowed launch decision
    into ``out``.

    Per idle model j: wait (when ``k_j < hi_j``), or launch all waiting (when ``k_j >= max(lo_j, 1)``,
    forced at ``k_j >= hi_j``) for ``dur[0]`` or ``dur[1]`` slots (floor and ceil of the duration).  ``wmax_j``/``lmin_j`` keep the largest
    queue at which j chose to wait and the smallest at which it launched, so that a sub-box
    ``[lo', hi']`` allows the row's decisions exactly when ``wmax < hi'`` and ``lmin >= lo'``
    (:func:`mdp_restrict`).  With ``corun``, a launch spans ``dur[2]``/``dur[3]`` slots (the co-running
    duration's floor and ceil) when another model is busy at this stage (``r != 0``: running, or
    completing later in the slot) or launches in the same decision, as in the chain
    (:func:`dtmc._kernels.corun_at_launch`).  Returns the row count written (``sc``: scratch,
    :class:`_CoarseScratch`).
    """
    lo, hi, caps, corun = box.lo, box.hi, tables.caps, tables.corun
    ch, nch, first = sc.ch, sc.nch, sc.first
    M = lo.shape[0]
    nout = 0
    for c in range(ncfg):
        nrun = 0
        for j in range(M):
            k = cfg[c, j]
            if cfg[c, 2 * M + j] != 0:
                nrun += 1
            if cfg[c, 2 * M + j] != 0 or k < 1 or k < lo[j]:
                first[j] = 0
                nch[j] = 1
            else:
                take = k if k < caps[j] else caps[j]
                two = dur[0, j, take] != dur[1, j, take] or (corun and dur[2, j, take] != dur[3, j, take])
                if k >= hi[j]:
                    first[j] = 1
                    nch[j] = 2 if two else 1
                else:
                    first[j] = 0
                    nch[j] = 3 if two else 2
            ch[j] = 0
        while True:
            nl = 0
            for j in range(M):
                if first[j] + ch[j] > 0:
                    nl += 1
            co = corun_at_launch(corun, nrun, nl)
            if not (corun and _same_span(cfg, c, first, ch, caps, dur, co, M)):
                for x in range(5 * M):
                    out[nout, x] = cfg[c, x]
                for j in range(M):
                    a = first[j] + ch[j]
                    k = cfg[c, j]
                    if a > 0:
                        take = k if k < caps[j] else caps[j]
                        out[nout, j] = k - take
                        out[nout, M + j] = take
                        if co:
                            out[nout, 2 * M + j] = dur[2, j, take] if a == 1 else dur[3, j, take]
                        else:
                            out[nout, 2 * M + j] = dur[0, j, take] if a == 1 else dur[1, j, take]
                        if k < out[nout, 4 * M + j]:
                            out[nout, 4 * M + j] = k
                    elif nch[j] > 1 and k > out[nout, 3 * M + j]:
                        out[nout, 3 * M + j] = k          # chose to wait at k
                nout += 1
            j = 0
            while j < M:
                ch[j] += 1
                if ch[j] < nch[j]:
                    break
                ch[j] = 0
                j += 1
            if j == M:
                break
    return nout


@njit(cache=True, inline="always")
def _order(okey, ow, ol, a, key, b, M):
    """Sign of (okey, ow[a], ol[a]) - (key, ow[b], ol[b]) in lexicographic order."""
    if okey != key:
        return 1 if okey > key else -1
    for j in range(M):
        if ow[a, j] != ow[b, j]:
            return 1 if ow[a, j] > ow[b, j] else -1
    for j in range(M):
        if ol[a, j] != ol[b, j]:
            return 1 if ol[a, j] > ol[b, j] else -1
    return 0


# inlined (here and in _coarse_options): called once per routing outcome, where a call with this many
# array arguments cost more than its body (pruned search at N = 64: 11.4 -> 9.7 s, median of alternating runs)
@njit(cache=True, inline="always")
def _launch_keys(cfg, c, box, tables, dur, nopt, sc):
    """The last stage of :func:`_stage_launch` for row ``c`` of ``cfg``, straight to packed keys.

    Inserts each key of a configuration with a running model, with its decision bounds (``ow``/``ol``
    rows: wmax/lmin), into ``opts[:nopt]``, sorted by (key, bounds), identical entries once; returns the
    new count.  One key may appear with different bounds (different decisions reach it): a sub-box
    keeps the key when it allows any of them.  Durations as in :func:`_stage_launch`; ``sc``: scratch
    (:class:`_CoarseScratch`).
    """
    lo, hi, caps, corun, bn, br = box.lo, box.hi, tables.caps, tables.corun, tables.bn, tables.br
    opts, ow, ol, ch, nch, first, kk, bb, rr = sc.opts, sc.ow, sc.ol, sc.ch, sc.nch, sc.first, sc.kk, sc.bb, sc.rr
    M = lo.shape[0]
    nrun = 0
    for j in range(M):
        k = cfg[c, j]
        ch[j] = 0
        if cfg[c, 2 * M + j] != 0:
            nrun += 1
        if cfg[c, 2 * M + j] != 0 or k < 1 or k < lo[j]:
            first[j] = 0
            nch[j] = 1
        else:
            take = k if k < caps[j] else caps[j]
            two = dur[0, j, take] != dur[1, j, take] or (corun and dur[2, j, take] != dur[3, j, take])
            if k >= hi[j]:
                first[j] = 1
                nch[j] = 2 if two else 1
            else:
                first[j] = 0
                nch[j] = 3 if two else 2
    while True:
        running = False
        nl = 0
        for j in range(M):
            if first[j] + ch[j] > 0:
                nl += 1
        co = corun_at_launch(corun, nrun, nl)
        # a ceil choice whose span equals the floor's gives the floor's row again: skip it
        skip = corun and _same_span(cfg, c, first, ch, caps, dur, co, M)
        for j in range(M):
            if skip:
                break
            a = first[j] + ch[j]
            k = cfg[c, j]
            ow[nopt, j] = cfg[c, 3 * M + j]
            ol[nopt, j] = cfg[c, 4 * M + j]
            if a > 0:
                take = k if k < caps[j] else caps[j]
                kk[j] = k - take
                bb[j] = take
                if co:
                    rr[j] = dur[2, j, take] if a == 1 else dur[3, j, take]
                else:
                    rr[j] = dur[0, j, take] if a == 1 else dur[1, j, take]
                if k < ol[nopt, j]:
                    ol[nopt, j] = k
            else:
                kk[j] = k
                bb[j] = cfg[c, M + j]
                rr[j] = cfg[c, 2 * M + j]
                if nch[j] > 1 and k > ow[nopt, j]:
                    ow[nopt, j] = k
            if rr[j] > 0:
                running = True
        if running:
            # the candidate sits in row nopt of ow/ol; find its place among rows 0..nopt-1
            key = _pack(kk, bb, rr, M, bn, br)
            q = nopt
            same = False
            while q > 0:
                o = _order(opts[q - 1], ow, ol, q - 1, key, nopt, M)
                if o <= 0:
                    same = o == 0
                    break
                q -= 1
            if not same:
                for j in range(M):
                    kk[j] = ow[nopt, j]
                    bb[j] = ol[nopt, j]
                for x in range(nopt, q, -1):
                    opts[x] = opts[x - 1]
                    for j in range(M):
                        ow[x, j] = ow[x - 1, j]
                        ol[x, j] = ol[x - 1, j]
                opts[q] = key
                for j in range(M):
                    ow[q, j] = kk[j]
                    ol[q, j] = bb[j]
                nopt += 1
        j = 0
        while j < M:
            ch[j] += 1
            if ch[j] < nch[j]:
                break
            ch[j] = 0
            j += 1
        if j == M:
            break
    return nopt


@njit(cache=True, inline="always")
def _coarse_options(k, b, r, t, done, na, cidx, box, tables, dur, ordered, sc):
    """Post-launch keys of one joint routing outcome (``cidx[a]`` = composition of completing ``done[a]``).

    With ``ordered``, every ordered partition of the completing models is a possible order of their
    completions (stage by stage, launch rule after each); without it they complete together.
    Writes the keys with their decision bounds (see :func:`_launch_keys`) to ``opts``/``ow``/``ol`` and
    returns their count.  ``sc.cfg``/``sc.nxt`` hold at least ``3**(M*M)`` rows (every launch choice at
    every stage) of ``5 M`` columns; the rest of ``sc`` is scratch.
    """
    parts, stage, cfg, nxt = tables.parts, sc.stage, sc.cfg, sc.nxt
    M = k.shape[0]
    nopt = 0
    for a in range(na):
        stage[a] = 0
    while True:
        # is ``stage[:na]`` an ordered partition with stages 0..S-1 all used?
        S = 0
        for a in range(na):
            if stage[a] + 1 > S:
                S = stage[a] + 1
        ok = True
        if na > 1:
            for s_ in range(S):
                hit = False
                for a in range(na):
                    if stage[a] == s_:
                        hit = True
                if not hit:
                    ok = False
        if ok and (ordered or S == 1):
            ncfg = 1
            for i in range(M):
                cfg[0, i] = k[i]
                cfg[0, M + i] = b[i]
                cfg[0, 3 * M + i] = -1
                cfg[0, 4 * M + i] = NO_LAUNCH
                if r[i] > 0 and r[i] != t:
                    cfg[0, 2 * M + i] = r[i] - t
                else:
                    # completing later in the slot: still busy (r = 1 is only a marker)
                    cfg[0, 2 * M + i] = 1 if r[i] > 0 else 0
            for s_ in range(S):
                for c in range(ncfg):
                    for a in range(na):
                        if stage[a] == s_:
                            i = done[a]
                            cfg[c, M + i] = 0
                            cfg[c, 2 * M + i] = 0
                            for j in range(M):
                                cfg[c, j] += parts[cidx[a], j]
                if s_ == S - 1:
                    for c in range(ncfg):
                        nopt = _launch_keys(cfg, c, box, tables, dur, nopt, sc)
                else:
                    ncfg = _stage_launch(cfg, ncfg, nxt, box, tables, dur, sc)
                    cfg, nxt = nxt, cfg
        a = 0
        while a < na:
            stage[a] += 1
            if stage[a] < na:
                break
            stage[a] = 0
            a += 1
        if a == na:
            break
    return nopt


@njit(cache=True)
def coarse_mdp_build(N, box, tables, dur, limits, ordered):
    """Enumerate the coarse-clock decision process of the box ``box`` of the system ``tables`` (whose ``d``
    and ``dco`` it does not read) within ``limits``.

    ``dur`` (4, M, N + 1): floor and ceil in slots of the solo durations, then of the co-running ones;
    ``tables.corun``: whether the chain's launch law uses the latter (see :func:`_stage_launch`).

    Returns the outputs of :func:`mdp_build` (status, n, keys, tau, g, out_ptr, out_prob, opt_ptr,
    opt_idx), then what :func:`mdp_restrict` needs to cut a sub-box's process out of this one: the
    decision bounds of every option (``opt_w``/``opt_l``, ``M`` per entry, flat) and the initial
    states with theirs (``ninit``, ``init_idx``, ``init_w``, ``init_l``).
    """
    M = box.lo.shape[0]
    rows = 1
    for _ in range(M * M):
        rows *= 3
    z = np.zeros
    sc = _CoarseScratch(z((rows, 5 * M), dtype=np.int64), z((rows, 5 * M), dtype=np.int64),
                        z(rows + 1, dtype=np.int64), z((rows + 1, M), dtype=np.int64),
                        z((rows + 1, M), dtype=np.int64), z(M, dtype=np.int64), z(M, dtype=np.int64),
                        z(M, dtype=np.int64), z(M, dtype=np.int64), z(M, dtype=np.int64), z(M, dtype=np.int64),
                        z(M, dtype=np.int64), z(M, dtype=np.int64), z(M, dtype=np.int64), z(M, dtype=np.int64),
                        z(M, dtype=np.int64), z(M, dtype=np.int64), z(M, dtype=np.int64), z(M, dtype=np.int64))
    return _coarse_mdp_build(N, box, tables, dur, limits, ordered, sc)


@njit(cache=True, inline="always")
def _borrowed_scratch(sc):
    """:class:`_CoarseScratch` with every array borrowed (the caller owns them)."""
    return _CoarseScratch(_borrow(sc.cfg), _borrow(sc.nxt), _borrow(sc.opts), _borrow(sc.ow), _borrow(sc.ol),
                          _borrow(sc.stage), _borrow(sc.kk), _borrow(sc.bb), _borrow(sc.rr), _borrow(sc.ch),
                          _borrow(sc.nch), _borrow(sc.first), _borrow(sc.k), _borrow(sc.b), _borrow(sc.r),
                          _borrow(sc.done), _borrow(sc.idx), _borrow(sc.clo), _borrow(sc.chi))


@njit(cache=True)
def _coarse_mdp_build(N, box, tables, dur, limits, ordered, sc):
    """:func:`coarse_mdp_build` on the scratch arrays ``sc`` (:class:`_CoarseScratch`) that it allocated."""
    # Every array the outcome loop hands to its inlined helpers is a borrowed view (dtmc._kernels._borrow):
    # counting their references took half of the build.  All are owned by the caller.
    box = Box(_borrow(box.lo), _borrow(box.hi))
    tables = _borrowed_tables(tables)
    dur = _borrow(dur)
    sc = _borrowed_scratch(sc)
    cbar, offsets, prob, bn, br = tables.cbar, tables.offsets, tables.prob, tables.bn, tables.br
    max_states, max_entries = limits.max_states, limits.max_entries
    M = box.lo.shape[0]
    cap = 1024
    keys = np.empty(cap, dtype=np.int64)
    tau = np.empty(cap, dtype=np.int64)
    g = np.empty(cap, dtype=np.float64)
    out_ptr = np.zeros(cap + 1, dtype=np.int64)
    out_prob = np.empty(cap * 4, dtype=np.float64)
    opt_ptr = np.zeros(cap * 4 + 1, dtype=np.int64)
    opt_idx = np.empty(cap * 8, dtype=np.int64)
    # decision bounds are queue sizes below NO_LAUNCH: int16 halves what they took as int32
    opt_w = np.empty(cap * 8 * M, dtype=np.int16)
    opt_l = np.empty(cap * 8 * M, dtype=np.int16)
    tcap = 4096
    tkeys = np.full(tcap, EMPTY, dtype=np.int64)
    tvals = np.empty(tcap, dtype=np.int64)
    k, b, r, done, idx, clo, chi = sc.k, sc.b, sc.r, sc.done, sc.idx, sc.clo, sc.chi
    cfg, nxt, opts, ow, ol = sc.cfg, sc.nxt, sc.opts, sc.ow, sc.ol
    # initial configuration: all N wait at model 0, launch rule once (no completions: one stage)
    cfg[0, 0] = N
    for i in range(M):
        cfg[0, 3 * M + i] = -1
        cfg[0, 4 * M + i] = NO_LAUNCH
    out = nxt
    nst = _stage_launch(cfg, I1, out, box, tables, dur, sc)
    init_idx = np.empty(nst, dtype=np.int64)
    init_w = np.empty(nst * M, dtype=np.int64)
    init_l = np.empty(nst * M, dtype=np.int64)
    ninit = 0
    n = I0
    for c in range(nst):
        running = False
        for i in range(M):
            k[i] = out[c, i]
            b[i] = out[c, M + i]
            r[i] = out[c, 2 * M + i]
            if r[i] > 0:
                running = True
        if running:
            key = _pack(k, b, r, M, bn, br)
            ix, ins = _find(tkeys, tvals, key, n)
            if ins:
                keys[n] = key
                n += 1
            init_idx[ninit] = ix
            for i in range(M):
                init_w[ninit * M + i] = out[c, 3 * M + i]
                init_l[ninit * M + i] = out[c, 4 * M + i]
            ninit += 1
    if n == 0:
        return (DEADLOCK, 0, keys, tau, g, out_ptr, out_prob, opt_ptr, opt_idx, opt_w, opt_l, ninit, init_idx,
                init_w, init_l)
    nu = 0
    ne = I0
    head = 0
    st = OK
    while head < n:
        _unpack(keys[head], k, b, r, M, bn, br)
        t = np.int64(1) << 62
        for i in range(M):
            if r[i] > 0 and r[i] < t:
                t = r[i]
        na = _completing(b, r, t, offsets, done, clo, chi, idx, M)
        gs = 0.0
        for a in range(na):
            gs += b[done[a]] * cbar[done[a]]
        tau[head] = t
        g[head] = gs
        nu0 = nu
        ne0 = ne
        while True:
            # One pass over the state's outcomes.  A buffer that is full ends the pass; it is grown out here
            # and the pass starts again from the state's first outcome (the states it added keep their
            # numbers, so the redone pass finds them): an array reassigned inside the outcome loop would cost
            # numba two atomic reference-count updates per outcome (about half of the build's time).
            nu = nu0
            ne = ne0
            for a in range(na):
                idx[a] = clo[a]
            full = False
            cnt = 0
            while True:
                p = 1.0
                for a in range(na):
                    p *= prob[done[a], idx[a]]
                if p > 0.0:
                    cnt = _coarse_options(k, b, r, t, done, na, idx, box, tables, dur, ordered, sc)
                    if cnt == 0:
                        st = DEADLOCK
                        n = head
                        break
                    if ne + cnt > max_entries:
                        st = TOO_LARGE
                        break
                    if (nu + 2 >= out_prob.shape[0] or nu + 3 >= opt_ptr.shape[0] or ne + cnt > opt_idx.shape[0]
                            or n + cnt >= keys.shape[0] or 2 * (n + cnt) > tkeys.shape[0]):
                        full = True
                        break
                    out_prob[nu] = p
                    for c2 in range(cnt):
                        ix, ins = _find(tkeys, tvals, opts[c2], n)
                        if ins:
                            if n >= max_states:
                                st = TOO_LARGE
                                break
                            keys[n] = opts[c2]
                            n += 1
                        opt_idx[ne] = ix
                        for j in range(M):
                            opt_w[ne * M + j] = ow[c2, j]
                            opt_l[ne * M + j] = ol[c2, j]
                        ne += 1
                    if st != OK:
                        break
                    nu += 1
                    opt_ptr[nu] = ne
                if not _next_outcome(idx, clo, chi, na):
                    break
            if st != OK or not full:
                break
            out_prob = _grow(out_prob, nu + 3)
            opt_ptr = _grow(opt_ptr, nu + 4)
            opt_idx = _grow(opt_idx, ne + cnt)
            opt_w = _grow(opt_w, (ne + cnt) * M)
            opt_l = _grow(opt_l, (ne + cnt) * M)
            if n + cnt >= keys.shape[0]:
                keys = _grow(keys, n + cnt + 1)
                tau = _grow(tau, n + cnt + 1)
                g = _grow(g, n + cnt + 1)
                out_ptr = _grow(out_ptr, keys.shape[0] + 1)
            if 2 * (n + cnt) > tkeys.shape[0]:
                tkeys, tvals = _rehash(keys, n, _table_size(n + cnt, tkeys.shape[0]))
        if st != OK:
            break
        head += 1
        out_ptr[head] = nu
    return st, n, keys, tau, g, out_ptr, out_prob, opt_ptr, opt_idx, opt_w, opt_l, ninit, init_idx, init_w, init_l


@njit(cache=True, inline="always")
def _allowed(w, l, e, lo, hi, M):
    """Whether entry ``e``'s decisions (waits up to ``w``, launches from ``l``) fit the box ``[lo, hi]``."""
    for j in range(M):
        if w[e * M + j] >= hi[j] or l[e * M + j] < lo[j]:
            return False
    return True


@njit(cache=True, inline="always")
def _copy_bounds(w, l, e, w2, l2, e2, M):
    for j in range(M):
        w2[e2 * M + j] = w[e * M + j]
        l2[e2 * M + j] = l[e * M + j]


@njit(cache=True, inline="always")
def _reach(s, where, order, n2):
    """Number state ``s`` of the parent in breadth-first order if it is new; returns the new count."""
    if where[s] < 0:
        where[s] = n2
        order[n2] = s
        n2 += 1
    return n2


@njit(cache=True)
def mdp_restrict(proc, box):
    """The process of a sub-box ``[lo, hi]``, cut out of a coarse-clock process built for a box holding it.

    A sub-box allows an option (a sequence of launch decisions) when every model's waits happened
    below ``hi_j`` and its launches at or above ``lo_j``: ``wmax_j < hi_j`` and ``lmin_j >= lo_j``.
    Its states are those reachable from the allowed initial states through allowed options, and
    its options at each (state, outcome) are the allowed ones: exactly what
    :func:`coarse_mdp_build` enumerates for the sub-box, renumbered in breadth-first order.
    ``proc``: the parent (:class:`CoarseProcess`).  Returns the same tuple as :func:`coarse_mdp_build`
    (``keys`` holds the parent's indices).
    """
    n = proc.n
    M = box.lo.shape[0]
    nu_max = proc.out_ptr[n]
    ne_max = proc.opt_ptr[nu_max]
    ninit = proc.ninit
    where = np.full(n, -1, dtype=np.int64)
    order = np.empty(n, dtype=np.int64)
    out = CoarseProcess(0, np.empty(n, dtype=np.int64), np.empty(n, dtype=np.float64), np.zeros(n + 1, dtype=np.int64),
                        np.empty(nu_max + 1, dtype=np.float64), np.zeros(nu_max + 2, dtype=np.int64),
                        np.empty(ne_max + 1, dtype=np.int64), np.empty((ne_max + 1) * M, dtype=np.int16),
                        np.empty((ne_max + 1) * M, dtype=np.int16), 0, np.empty(ninit, dtype=np.int64),
                        np.empty(ninit * M, dtype=np.int64), np.empty(ninit * M, dtype=np.int64))
    st, n2, ninit2 = _restrict(proc, box, out, where, order)
    return (st, n2, order, out.tau, out.g, out.out_ptr, out.out_prob, out.opt_ptr, out.opt_idx, out.opt_w, out.opt_l,
            ninit2, out.init_idx, out.init_w, out.init_l)


@njit(cache=True, inline="always")
def _borrowed_process(p):
    """:class:`CoarseProcess` with every array borrowed (the caller owns them)."""
    return CoarseProcess(p.n, _borrow(p.tau), _borrow(p.g), _borrow(p.out_ptr), _borrow(p.out_prob),
                         _borrow(p.opt_ptr), _borrow(p.opt_idx), _borrow(p.opt_w), _borrow(p.opt_l), p.ninit,
                         _borrow(p.init_idx), _borrow(p.init_w), _borrow(p.init_l))


@njit(cache=True)
def _restrict(proc, box, out, where, order):
    """:func:`mdp_restrict` into the arrays of ``out`` (a :class:`CoarseProcess` it allocated, counts unused) and
    ``where``/``order``; returns (status, states, initial states).  Every array is borrowed (the caller owns
    them): the helpers called per entry would otherwise count references to each (half of the time)."""
    n, tau, g, out_ptr, out_prob, opt_ptr, opt_idx, opt_w, opt_l, ninit, init_idx, init_w, init_l = _borrowed_process(proc)
    _, tau2, g2, out_ptr2, out_prob2, opt_ptr2, opt_idx2, opt_w2, opt_l2, _, init_idx2, init_w2, init_l2 = (
        _borrowed_process(out))
    lo, hi, where, order = _borrow(box.lo), _borrow(box.hi), _borrow(where), _borrow(order)
    M = lo.shape[0]
    n2 = 0
    ninit2 = 0
    for e in range(ninit):
        if _allowed(init_w, init_l, e, lo, hi, M):
            n2 = _reach(init_idx[e], where, order, n2)
            init_idx2[ninit2] = where[init_idx[e]]
            _copy_bounds(init_w, init_l, e, init_w2, init_l2, ninit2, M)
            ninit2 += 1
    if n2 == 0:
        return DEADLOCK, 0, ninit2
    nu = 0
    ne = I0
    head = 0
    while head < n2:
        s = order[head]
        tau2[head] = tau[s]
        g2[head] = g[s]
        for u in range(out_ptr[s], out_ptr[s + 1]):
            cnt = 0
            for e in range(opt_ptr[u], opt_ptr[u + 1]):
                if _allowed(opt_w, opt_l, e, lo, hi, M):
                    n2 = _reach(opt_idx[e], where, order, n2)
                    opt_idx2[ne] = where[opt_idx[e]]
                    _copy_bounds(opt_w, opt_l, e, opt_w2, opt_l2, ne, M)
                    ne += 1
                    cnt += 1
            if cnt == 0:
                return DEADLOCK, head, ninit2
            out_prob2[nu] = out_prob[u]
            nu += 1
            opt_ptr2[nu] = ne
        head += 1
        out_ptr2[head] = nu
    return OK, n2, ninit2


# --------------------------------------------------------------------------------------------------
# Mean-field guide (optimizer.mean_field): the chain with every multinomial split replaced by its mean.
# Masses are real numbers of requests, time stays on the integer quantum grid, so simultaneous
# completions are exact ties, as in the chain.

@njit(cache=True)
def mean_field_run(N, B, tables, P, warm_events, events, tol):
    """Run the mean-field dynamics of thresholds ``B``; returns ``(status, tokens, quanta, tokens_2, quanta_2)``.

    ``tokens/quanta`` is the time average over ``events`` completion epochs after ``warm_events``;
    ``tokens_2/quanta_2`` the same over the second half only (their difference measures convergence).
    A model launches when idle and its queue exceeds ``B_j - 1 + tol`` (the chain's ``k_j >= B_j`` for
    integer ``k``); it takes ``min(queue, cap_j)``, for ``d[j, round(take)]`` quanta, or ``dco`` with
    ``corun`` when another model is busy or launches in the same pass (the chain's launch law).
    status: 0 ok, 2 deadlock (no model running and none can launch).  ``tables``: the system (dtmc's
    :class:`ChainTables`; its outcome table is not read).
    """
    caps, d, dco, corun, cbar = tables.caps, tables.d, tables.dco, tables.corun, tables.cbar
    M = B.shape[0]
    q = np.zeros(M)
    x = np.zeros(M)
    end = np.zeros(M, dtype=np.int64)
    busy = np.zeros(M, dtype=np.bool_)
    arr = np.zeros(M)
    q[0] = float(N)
    now = np.int64(0)
    t0 = np.int64(0)
    th = np.int64(0)
    tok = 0.0
    tok_h = 0.0
    half = warm_events + events // 2
    for e in range(warm_events + events + 1):
        # launch rule, every idle model in one pass
        co = False
        if corun:
            nrun = 0
            nl = 0
            for j in range(M):
                if busy[j]:
                    nrun += 1
                elif q[j] > B[j] - 1 + tol:
                    nl += 1
            co = corun_at_launch(corun, nrun, nl)
        for j in range(M):
            if not busy[j] and q[j] > B[j] - 1 + tol:
                take = q[j] if q[j] < caps[j] else float(caps[j])
                bi = int(take + 0.5)
                if bi < 1:
                    bi = 1
                if bi > caps[j]:
                    bi = caps[j]
                x[j] = take
                q[j] -= take
                busy[j] = True
                end[j] = now + (dco[j, bi] if co else d[j, bi])
        if e == warm_events:
            t0 = now
            tok = 0.0
        if e == half:
            th = now
            tok_h = 0.0
        if e == warm_events + events:
            break
        t = np.int64(1) << 62
        for i in range(M):
            if busy[i] and end[i] < t:
                t = end[i]
        if t == np.int64(1) << 62:
            return 2, 0.0, 0.0, 0.0, 0.0
        now = t
        for j in range(M):
            arr[j] = 0.0
        for i in range(M):
            if busy[i] and end[i] == t:
                gain = x[i] * cbar[i]
                tok += gain
                tok_h += gain
                for j in range(M):
                    arr[j] += x[i] * P[i, j]
                busy[i] = False
                x[i] = 0.0
        for j in range(M):
            q[j] += arr[j]
    return 0, tok, float(now - t0), tok_h, float(now - th)


# ---------------------------------------------------------------------------------------------
# The optimal launch policy: helpers of the all-policy process (built by policy_mdp_build).

@njit(cache=True)
def mdp_solve(mdp, h, lam, settings):
    """Relative value iteration of the all-policy process ``mdp`` (:class:`MDP`) to a certificate bracket of
    ``rtol``, in one call (``settings``: :class:`SolveSettings`).

    Damped Gauss-Seidel sweeps of ``h <- g - lam tau + Q* h`` (as :func:`mdp_sweeps`) in *reverse* discovery
    order (a state's successors are mostly discovered after it, so one sweep carries values back along many
    epochs).  Before every sweep ``lam`` is re-estimated from ``h`` itself: ``sum (g + Q* h - h) / sum tau``
    over ``nref`` reference states spread over the process (at the fixed point every state gives the optimal
    gain), kept inside the proven bracket; a ``lam`` left stale between brackets steers ``h`` towards the wrong
    fixed point, and these two changes cut the sweeps about 15-fold.  After every ``every``
    sweeps the certificate bracket of :func:`mdp_bracket` (with its rounding allowance, ``4 terms eps`` of the
    largest term) is taken.  ``nref = 0``, or a bracket that has not narrowed by 10 % over 16 brackets while
    above ``floor_rtol``, falls back to ``lam`` = the midpoint of the best bracket so far.  Stops when the
    bracket is within ``rtol`` (relative), when it is within ``floor_rtol`` and has not narrowed by 10 % over 4
    brackets (the rounding floor), or after ``max_sweeps``.  ``h`` is updated in place; returns ``(lower,
    upper, sweeps, brackets)``: ``upper`` is proven for every policy, ``lower`` for the process optimum."""
    n, out_ptr, out_prob, opt_ptr, opt_idx, g, tau = mdp
    omega, every, nref, rtol, floor_rtol, max_sweeps, terms = settings
    eps = 2.220446049250313e-16
    lo_b = -1e300
    hi_b = 1e300
    sweeps = 0
    brackets = 0
    ref_w = 1e300
    since = 0
    nr = min(nref, n)
    while True:
        for _ in range(every):
            if nr > 0 and sweeps > 0:
                num = 0.0
                den = 0.0
                for j in range(nr):
                    s = (j * n) // nr
                    num += g[s] + _qmax(s, h, out_ptr, out_prob, opt_ptr, opt_idx) - h[s]
                    den += tau[s]
                lam = num / den
                if lam < lo_b:
                    lam = lo_b
                if lam > hi_b:
                    lam = hi_b
            for s in range(n - 1, -1, -1):
                v = g[s] - lam * tau[s] + _qmax(s, h, out_ptr, out_prob, opt_ptr, opt_idx)
                h[s] += omega * (v - h[s])
            ref = h[0]
            for s in range(n):
                h[s] -= ref
            sweeps += 1
        a, b, mag = mdp_bracket(mdp, h)
        brackets += 1
        err = mag * 4 * terms * eps
        if a - err > lo_b:
            lo_b = a - err
        if b + err < hi_b:
            hi_b = b + err
        lam = 0.5 * (lo_b + hi_b)
        w = hi_b - lo_b
        if w <= rtol * abs(hi_b) or sweeps >= max_sweeps:
            return lo_b, hi_b, sweeps, brackets
        if w < 0.9 * ref_w:
            ref_w = w
            since = 0
        else:
            since += 1
            if since >= 4 and w <= floor_rtol * abs(hi_b):
                return lo_b, hi_b, sweeps, brackets
            if since >= 16 and nr > 0:      # the estimate does not settle: the bracket's midpoint from here on
                nr = 0
                since = 0


@njit(cache=True)
def greedy_choice(nu, opt_ptr, opt_idx, h, tie):
    """Per outcome, the offset of the option with the largest ``h`` (ties within ``tie`` go to the first)."""
    ch = np.zeros(nu, dtype=np.int64)
    for u in range(nu):
        best = -1e300
        for e in range(opt_ptr[u], opt_ptr[u + 1]):
            if h[opt_idx[e]] > best + tie:
                best = h[opt_idx[e]]
                ch[u] = e - opt_ptr[u]
    return ch


# ---------------------------------------------------------------------------------------------
# Compact policy classes without the all-policy process: the class rule decided in a kernel
# (:func:`class_launch`) and the configurations the chain under it meets (:func:`class_reach`), so a class
# is evaluated on exactly the configurations its chain visits (``optimizer.policy.class_chain_table``).

CLS_BUSY = 0
CLS_RESIDUAL = 1
CLS_WINDOW = 2
CLS_RATIO = 3
RULE_BIG = np.int64(1) << 40     # "no running batch" / "never" in the rule's comparisons


@njit(cache=True)
def _class_mask(cls, k, b, r, par, order, caps, d, dco, R, Bb):
    """The launch bits (bit j: idle model j launches) of class ``cls`` with parameters ``par`` (M, P) in the
    pre-decision configuration (k, b, r); never an empty batch.  ``order``: the models by step length (the
    ``ratio`` class decides in that order); ``R``, ``Bb``: scratch of M entries.  The rule is the one
    stated in ``optimizer.policy.class_table``'s docstring, configuration by configuration."""
    M = k.shape[0]
    mask = np.int64(0)
    if cls == CLS_RATIO:
        for j in range(M):
            R[j] = r[j]
            Bb[j] = b[j]
        for q in range(M):
            j = order[q]
            other = False
            wait = False
            for i in range(M):
                if i == j or R[i] <= 0:
                    continue
                other = True
                t = R[i]
                arriving = np.int64(0)
                for l in range(M):
                    if l != j and R[l] > 0 and R[l] <= t:
                        arriving += Bb[l]
                if t * k[j] <= par[j, 1] * arriving:
                    wait = True
            b0 = par[j, 0] if par[j, 0] > 1 else np.int64(1)
            if r[j] == 0 and k[j] >= b0 and not wait:
                take = k[j] if k[j] < caps[j] else caps[j]
                R[j] = dco[j, take] if other else d[j, take]
                Bb[j] = take
                mask |= np.int64(1) << j
        return mask
    for j in range(M):
        if r[j] > 0:
            continue
        other = False
        rmin = RULE_BIG
        for i in range(M):
            if i != j and r[i] > 0:
                other = True
                if r[i] < rmin:
                    rmin = r[i]
        if cls == CLS_WINDOW:
            thr = RULE_BIG if rmin <= par[j, 1] else par[j, 0]
        else:
            thr = par[j, 1] if other else par[j, 0]
            if cls == CLS_RESIDUAL and other:
                take = k[j] if k[j] < caps[j] else caps[j]
                if rmin < dco[j, take]:
                    thr = par[j, 2]
        if thr < 1:
            thr = np.int64(1)
        if k[j] >= thr:
            mask |= np.int64(1) << j
    return mask


@njit(cache=True)
def class_launch(cls, K, Bb, R, par, order, caps, d, dco):
    """:func:`_class_mask` over many configurations ((n, M) arrays k, b, r): (n, M) launch booleans."""
    n, M = K.shape
    out = np.zeros((n, M), dtype=np.bool_)
    k = np.zeros(M, dtype=np.int64)
    b = np.zeros(M, dtype=np.int64)
    r = np.zeros(M, dtype=np.int64)
    sR = np.zeros(M, dtype=np.int64)
    sB = np.zeros(M, dtype=np.int64)
    for s in range(n):
        for j in range(M):
            k[j] = K[s, j]
            b[j] = Bb[s, j]
            r[j] = R[s, j]
        mask = _class_mask(cls, k, b, r, par, order, caps, d, dco, sR, sB)
        for j in range(M):
            out[s, j] = (mask >> j) & 1 == 1
    return out


@njit(cache=True, inline="always")
def _apply_launch(k, b, r, mask, tables, M):
    """The chain's launch law (:func:`dtmc._kernels._launch_mask`) on the models of ``mask``; returns whether
    some model runs afterwards."""
    _launch_mask(k, b, r, mask, tables.caps, tables.d, tables.dco, tables.corun, M)
    busy = False
    for j in range(M):
        if r[j] > 0:
            busy = True
    return busy


@njit(cache=True)
def class_reach(N, rule, tables, max_states):
    """Breadth-first enumeration of the chain of the system ``tables`` (dtmc's :class:`ChainTables`) under
    the class rule ``rule`` (:class:`ClassRule`, :func:`_class_mask`), deciding each pre-decision
    configuration with the rule when it is first met.

    Returns ``(status, n, ckeys, cmask, nc)``: ``n`` states (post-decision, as the chain's), the ``nc``
    packed pre-decision configurations met (the initial one first) and their launch bits.  ``status``: OK,
    TOO_LARGE (more than ``max_states`` states) or DEADLOCK (a decision leaves no model running)."""
    cls, par, order = rule
    caps, d, dco, offsets, parts, prob, bn, br = (tables.caps, tables.d, tables.dco, tables.offsets, tables.parts,
                                                  tables.prob, tables.bn, tables.br)
    M = caps.shape[0]
    cap = 1024
    keys = np.empty(cap, dtype=np.int64)
    ckeys = np.empty(cap, dtype=np.int64)
    cmask = np.empty(cap, dtype=np.int64)
    tkeys = np.full(4096, EMPTY, dtype=np.int64)
    tvals = np.empty(4096, dtype=np.int64)
    ckt = np.full(4096, EMPTY, dtype=np.int64)
    ckv = np.empty(4096, dtype=np.int64)
    k = np.zeros(M, dtype=np.int64)
    b = np.zeros(M, dtype=np.int64)
    r = np.zeros(M, dtype=np.int64)
    k2 = np.zeros(M, dtype=np.int64)
    b2 = np.zeros(M, dtype=np.int64)
    r2 = np.zeros(M, dtype=np.int64)
    sR = np.zeros(M, dtype=np.int64)
    sB = np.zeros(M, dtype=np.int64)
    done = np.zeros(M, dtype=np.int64)
    idx = np.zeros(M, dtype=np.int64)
    clo = np.zeros(M, dtype=np.int64)
    chi = np.zeros(M, dtype=np.int64)

    k[0] = N
    ckeys[0] = _pack(k, b, r, M, bn, br)
    cmask[0] = _class_mask(cls, k, b, r, par, order, caps, d, dco, sR, sB)
    _find(ckt, ckv, ckeys[0], I0)
    nc = I1
    if not _apply_launch(k, b, r, cmask[0], tables, M):
        return DEADLOCK, 0, ckeys, cmask, nc
    keys[0] = _pack(k, b, r, M, bn, br)
    _find(tkeys, tvals, keys[0], I0)
    n = I1
    head = 0
    while head < n:
        _unpack(keys[head], k, b, r, M, bn, br)
        t = np.int64(1) << 62
        for i in range(M):
            if r[i] > 0 and r[i] < t:
                t = r[i]
        na = _completing(b, r, t, offsets, done, clo, chi, idx, M)
        # every buffer this state can fill is grown before the outcome loop (see coarse_mdp_build: an array
        # reassigned inside it would cost two atomic reference-count updates per outcome)
        mmax = I1
        for a in range(na):
            mmax *= chi[a] - clo[a]
        if nc + mmax > ckeys.shape[0]:
            ckeys = _grow(ckeys, nc + mmax)
            cmask = _grow(cmask, nc + mmax)
        if 2 * (nc + mmax) > ckt.shape[0]:
            ckt, ckv = _rehash(ckeys, nc, _table_size(nc + mmax, ckt.shape[0]))
        if n + mmax > keys.shape[0]:
            keys = _grow(keys, n + mmax)
        if 2 * (n + mmax) > tkeys.shape[0]:
            tkeys, tvals = _rehash(keys, n, _table_size(n + mmax, tkeys.shape[0]))
        while True:
            p = 1.0
            for a in range(na):
                p *= prob[done[a], idx[a]]
            if p > 0.0:
                _routed(k, b, r, t, idx, na, parts, k2, b2, r2, M)
                ck = _pack(k2, b2, r2, M, bn, br)
                ci, ins = _find(ckt, ckv, ck, nc)
                if ins:
                    ckeys[nc] = ck
                    cmask[nc] = _class_mask(cls, k2, b2, r2, par, order, caps, d, dco, sR, sB)
                    nc += 1
                if not _apply_launch(k2, b2, r2, cmask[ci], tables, M):
                    return DEADLOCK, n, ckeys, cmask, nc
                key = _pack(k2, b2, r2, M, bn, br)
                _ix, ins = _find(tkeys, tvals, key, n)
                if ins:
                    if n >= max_states:
                        return TOO_LARGE, n + 1, ckeys, cmask, nc
                    keys[n] = key
                    n += 1
            if not _next_outcome(idx, clo, chi, na):
                break
        head += 1
    return OK, n, ckeys, cmask, nc
