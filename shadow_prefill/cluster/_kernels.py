"""Compiled kernels of :mod:`shadow_prefill.cluster` (the subpackage's only numba module).

The simulator calls part 1's compiled latency model and Algorithm 1
(:mod:`shadow_prefill._kernels`: ``iteration_time``, ``controller_bound``,
``largest_fit``, ``credit_update``, ...) rather than copies of them.  numba's
on-disk cache checks only the file of the function it compiled, so an edit
there would leave this module's cached machine code stale:
:data:`PART1_SOURCE_SHA256` pins the source of every part 1 kernel used here
(``tests/test_shadow_cluster_kernels.py`` checks it), and updating it after
such an edit is an edit of this file, which recompiles it.  Everything else the
simulator runs per iteration lives here, for the same reason.

The simulation model (state, events, policies, metrics) is documented in
:mod:`shadow_prefill.cluster.sim` and ``docs/shadow_cluster.md``; comments
here say why, not what.
"""

from __future__ import annotations

from collections import namedtuple

import numba as nb
import numpy as np

from shadow_prefill._kernels import (BRANCH_HARVEST, BRANCH_IDLE, BRANCH_ROUTED, Slack, controller_bound, credit_update,
                                     decode_time, iteration_time, largest_fit, prefill_time)

INF = np.inf

#: part 1's kernels (and records, constants) compiled into this module's kernels
PART1_KERNELS = ("iteration_time", "prefill_time", "decode_time", "controller_bound", "largest_fit", "credit_update")
#: SHA-256 of their source (see the module doc); ``tests/test_shadow_cluster_kernels.py`` says the new value
PART1_SOURCE_SHA256 = "e4476f6265400f240779d46178dc4348b8af1fc8cc31980f4938b11fc4b79742"

# ---- policy vector (int64) indices
P_SHADOW = 0        # 0 none, 1 harvest (fixed credit), 2 harvest-slo, 3 dedicated, 4 eager
P_HOST = 1          # host-DRAM spill tier
P_ORACLE = 2        # a switch call's history is cached for free
P_TOP1 = 3          # shadow only to the most likely next model (N > 2)
P_SIZE = 4

SH_NONE = 0
SH_HARVEST = 1
SH_SLO = 2
SH_DEDICATED = 3
SH_EAGER = 4

# ---- parameter vector (float64) indices
Q_BETA = 0
Q_MARGIN = 1
Q_DELTA = 2
Q_NMIN = 3
Q_GATE = 4          # predictive gate on the predicted next-model probability (0: off)
Q_COLD_AGE = 5
Q_SHADOW_CAP = 6    # fraction of the KV pool
Q_CHUNK = 7
Q_MAX_SEQS = 8
Q_WARM = 9          # measurement window [warm, meas_end)
Q_MEAS_END = 10
Q_T_MAX = 11        # hard stop
Q_P_IDLE = 12       # W per GPU
Q_P_MEM = 13        # W per GPU, memory-bound iteration
Q_P_MAX = 14        # W per GPU, compute-bound iteration
Q_POLL = 15         # re-check period of an idle instance whose shadow work waits for KV
Q_CACHE_NORMAL = 16  # keep finished normal requests as (never-hit) cache entries
Q_WHOLE_COPY = 17   # legacy rule: a copy that shadow work extends joins the shadow class whole
Q_COLD_FIRST = 18   # admissions take entries idle > cold age before the shadow class (what shadows may take too)
Q_RECLAIM_GUARD = 19  # after an admission drops unused shadow KV, shadows take no free memory for the cold age
Q_CREDIT_GATE = 20  # Harvest-SLO: the routed-step credit goes only to jobs with P(next call -> model) >= this
Q_SIZE = 21

# ---- request kinds
K_NORMAL = 0
K_ROUTED = 1
K_EAGER = 2

# ---- entry fields (rows of the int64 entry table)
E_INST = 0
E_SESS = 1          # session*M + model, or -1 for a finished normal request
E_TOK = 2
E_BASE = 3          # leading tokens not produced by shadow work
E_LIST = 4          # 0 HBM normal, 1 HBM shadow, 2 host, -1 free
E_PREV = 5
E_NEXT = 6
E_TAIL = 7          # trailing tokens that shadow work appended to a normal-class copy (evict-first)
E_ROWS = 8

# ---- columns of used[i]: 0 active reservations, 1 HBM normal class, 2 HBM shadow-only copies, 3 host,
# 4 shadow tails of normal-class copies (a part of column 1 that is evicted with the shadow class)
U_TAIL = 4

L_NORM = 0
L_SHADOW = 1
L_HOST = 2

# ---- per-instance statistics columns (float64)
S_ENERGY_J = 0
S_BUSY_S = 1
S_PF_NORMAL = 2     # prefill tokens of normal requests (window)
S_PF_ROUTED = 3
S_PF_SHADOW = 4     # shadow tokens (harvested, dedicated or eager) in the window
S_ITERS = 5
S_SHADOW_KV_PEAK = 6
S_SHADOW_KV_INT = 7  # integral of shadow KV tokens over time (window)
S_DEC_TOK = 8
S_SIZE = 9

# ---- global statistics
G_SHADOW_COMPUTED = 0
G_SHADOW_USED = 1
G_END_TIME = 2
G_TRUNCATED = 3
G_EAGER_OVERFLOW = 4
G_ITERS = 5
G_EVICT_HBM = 6
G_SPILL = 7
G_RELOAD_TOK = 8
G_PF_NORMAL_ALL = 9     # prefill tokens over the whole run, per class
G_PF_ROUTED_ALL = 10
G_PF_EAGER_ALL = 11
G_INVARIANT_ERRORS = 12  # end-of-run KV bookkeeping mismatches (0 when consistent)
G_SHADOW_RECLAIMED = 13  # shadow tokens (copies and tails) that admissions evicted from HBM, spilled or dropped
G_SHADOW_DROPPED = 14    # the part of them that was lost (no host copy kept)
G_SIZE = 15

# ---- counters that event helpers advance (one int64 vector, so that helpers need not return them)
N_EAGER = 0         # eager shadow requests created so far
N_HEAP = 1          # call issues waiting in the heap
N_OUTSTANDING = 2   # measured requests and calls not finished yet
N_SIZE = 3


# ============================================================================ records
# The simulator's state travels as named tuples of arrays grouped by role, so that each event helper takes a
# few records instead of every array it touches.  The Python wrapper :func:`simulate` allocates them once per
# run; kernels update the arrays in place.

#: the cluster (static): per-model latency vectors, TPOT SLOs and router token times; per-instance arrays
Cluster = namedtuple("Cluster", "lms model_tpot tok_time inst_model inst_caps inst_pcie inst_tp inst_dedicated "
                                "inst_xfer")
#: normal (non-session) requests, by arrival: time, instance, prompt, output, TTFT and TPOT SLOs
Normals = namedtuple("Normals", "nr_time nr_inst nr_prompt nr_output nr_ttft nr_tpot")
#: sessions (start, call offsets, measured flag) and their routed calls
Calls = namedtuple("Calls", "s_start s_offsets s_measured c_sess c_model c_prompt c_hist c_output c_gap c_switch "
                            "c_ttft c_tpot c_pnext c_top")
#: scalar settings of one run, decoded from the policy and parameter vectors, and the table sizes
Knobs = namedtuple("Knobs", "M I Nn S C SM RE off shadow_mode harvesting ded_mode eager host oracle top1 beta margin "
                            "delta n_min gate cold_age shadow_cap_frac chunk max_seqs warm meas_end t_max p_idle "
                            "p_mem p_max poll cache_normal whole_copy cold_first reclaim_guard credit_gate")
#: per request: normal [0, Nn), routed [Nn, Nn + C), eager after; ``r_next`` links the waiting queues
Requests = namedtuple("Requests", "r_kind r_inst r_prompt r_output r_hist r_hit r_done r_gen r_res r_pend r_ref "
                                  "r_arr r_ready r_first r_finish r_iters r_ttft r_tpot r_next")
#: per instance: waiting queue, running batch, clocks, credit, reclaim-guard time
Instances = namedtuple("Instances", "q_head q_tail q_len pend_tok run n_run inst_next busy_until pcie_free credit "
                                    "reclaim_t")
#: the KV cache: entry table and LRU lists, token counters per instance, session maps, free entries
Cache = namedtuple("Cache", "ent last lists used caps sm_hbm sm_host free_stack nfree")
#: per session (and session-model): sticky instances, shadow targets, shadow jobs; the call-issue heap
Sessions = namedtuple("Sessions", "sticky n_sticky sm_eager s_target s_cur s_active jobs n_jobs job_pos ded_of ht hv")
#: per-iteration scratch: the batch's slack rows (part 1's ``Slack``: what the SLO controller reads of the
#: batch), chunk sizes per running request, running sums (see F_*, I_*)
Scratch = namedtuple("Scratch", "slack chunk_q itf iti")
#: the outputs: per call, per normal request, per instance (S_*) and global (G_*)
Stats = namedtuple("Stats", "c_out c_int n_out istats gstats")
#: everything a run mutates
State = namedtuple("State", "rq inst kv sess scr acc cnt")


# ============================================================================ latency (part 1's model)

@nb.njit(cache=True)
def compute_seconds(lm, n_decode, decode_context, prefill_tokens, prefill_pairs, n_chunks):
    """The arithmetic part of an iteration (what drives GPU power above its memory-bound level)."""
    if lm[0] == 1.0:
        return lm[4] * prefill_tokens + lm[5] * prefill_pairs
    F = lm[6]
    T = n_decode + prefill_tokens
    return lm[1] * (T * lm[2] + (prefill_pairs + decode_context) * lm[4]) / F + (n_decode + n_chunks) * lm[10] / F


@nb.njit(cache=True)
def request_slos(lm, prompt, chunk, ttft_floor, ttft_mult, tpot_floor, tpot_mult, scale):
    """Per-request SLOs: TTFT <= max(1 s, 5 x isolated prefill), TPOT <= max(25 ms, 5 x batch-1 decode)."""
    n = prompt.shape[0]
    ttft = np.empty(n, np.float64)
    tpot = np.empty(n, np.float64)
    for i in range(n):
        ttft[i] = scale * max(ttft_floor, ttft_mult * prefill_time(lm, prompt[i], 0, chunk))
        tpot[i] = scale * max(tpot_floor, tpot_mult * decode_time(lm, 1, float(prompt[i])))
    return ttft, tpot


# ============================================================================ cache entries

@nb.njit(cache=True)
def _unlink(ent, lists, e):
    i = ent[E_INST, e]
    l = ent[E_LIST, e]
    p = ent[E_PREV, e]
    n = ent[E_NEXT, e]
    if p >= 0:
        ent[E_NEXT, p] = n
    else:
        lists[i, l, 0] = n
    if n >= 0:
        ent[E_PREV, n] = p
    else:
        lists[i, l, 1] = p
    ent[E_PREV, e] = -1
    ent[E_NEXT, e] = -1


@nb.njit(cache=True)
def _push_front(ent, lists, e, l):
    i = ent[E_INST, e]
    ent[E_LIST, e] = l
    ent[E_PREV, e] = -1
    h = lists[i, l, 0]
    ent[E_NEXT, e] = h
    if h >= 0:
        ent[E_PREV, h] = e
    else:
        lists[i, l, 1] = e
    lists[i, l, 0] = e


@nb.njit(cache=True)
def _alloc(ent, free_stack, nfree):
    """Pop a free entry id (nfree is a 1-element array); -1 if the table is full."""
    if nfree[0] == 0:
        return -1
    nfree[0] -= 1
    return free_stack[nfree[0]]


@nb.njit(cache=True)
def _release(ent, free_stack, nfree, e):
    ent[E_LIST, e] = -1
    ent[E_TOK, e] = 0
    ent[E_SESS, e] = -1
    ent[E_TAIL, e] = 0
    free_stack[nfree[0]] = e
    nfree[0] += 1


@nb.njit(cache=True)
def _drop(kv, e):
    """Remove an entry from its list and the table (no spill)."""
    ent, lists, used = kv.ent, kv.lists, kv.used
    sm_hbm, sm_host, free_stack, nfree = kv.sm_hbm, kv.sm_host, kv.free_stack, kv.nfree
    i = ent[E_INST, e]
    l = ent[E_LIST, e]
    _unlink(ent, lists, e)
    used[i, 1 + l] -= ent[E_TOK, e]
    if l == L_NORM:
        used[i, U_TAIL] -= ent[E_TAIL, e]
    sm = ent[E_SESS, e]
    if sm >= 0:
        if l == L_HOST:
            if sm_host[sm] == e:
                sm_host[sm] = -1
        elif sm_hbm[sm] == e:
            sm_hbm[sm] = -1
    _release(ent, free_stack, nfree, e)


@nb.njit(cache=True)
def _evict_hbm(kv, e, host, gstats):
    """Evict an HBM entry; a session's entry spills to host DRAM when the tier is on (LRU there)."""
    ent, lists, used, caps, sm_hbm, sm_host = kv.ent, kv.lists, kv.used, kv.caps, kv.sm_hbm, kv.sm_host
    i = ent[E_INST, e]
    sm = ent[E_SESS, e]
    gstats[G_EVICT_HBM] += 1
    if host and sm >= 0 and ent[E_TOK, e] <= caps[i, 1]:
        old = sm_host[sm]
        if old >= 0:
            if ent[E_TOK, old] >= ent[E_TOK, e]:
                _drop(kv, e)
                return
            _drop(kv, old)
        l = ent[E_LIST, e]
        _unlink(ent, lists, e)
        used[i, 1 + l] -= ent[E_TOK, e]
        if l == L_NORM:
            used[i, U_TAIL] -= ent[E_TAIL, e]
        ent[E_TAIL, e] = 0
        sm_hbm[sm] = -1
        _push_front(ent, lists, e, L_HOST)
        used[i, 1 + L_HOST] += ent[E_TOK, e]
        sm_host[sm] = e
        gstats[G_SPILL] += ent[E_TOK, e]
        while used[i, 1 + L_HOST] > caps[i, 1]:
            t = lists[i, L_HOST, 1]
            _drop(kv, t)
        return
    _drop(kv, e)


@nb.njit(cache=True)
def _free_hbm(used, caps, i):
    return caps[i, 0] - used[i, 0] - used[i, 1] - used[i, 2]


@nb.njit(cache=True)
def _make_room(kv, i, need, host, gstats, cold_cutoff, now, reclaim_t):
    """Evict until ``need`` tokens are free; False if impossible.

    Order: normal entries idle since ``cold_cutoff`` (the memory a shadow chunk may take as if it were free;
    only while a shadow class exists, so No Shadow's plain LRU is unchanged), then the shadow class (shadow
    copies, then shadow tails of normal copies), then normal entries, LRU within each.  ``reclaim_t[i]``
    records when an admission last dropped unused shadow KV here (the reclaim guard of ``_shadow_chunks``).
    """
    ent, last, lists, used, caps = kv.ent, kv.last, kv.lists, kv.used, kv.caps
    while _free_hbm(used, caps, i) < need:
        e = lists[i, L_NORM, 1]
        if e >= 0 and last[e] <= cold_cutoff and (used[i, 2] > 0 or used[i, U_TAIL] > 0):
            _evict_hbm(kv, e, host, gstats)
            continue
        e = lists[i, L_SHADOW, 1]
        if e < 0 and used[i, U_TAIL] > 0:
            if _evict_tail(kv, i, host, gstats) > 0:
                reclaim_t[i] = now
            continue
        if e < 0:
            e = lists[i, L_NORM, 1]
        if e < 0:
            return False
        if ent[E_LIST, e] == L_SHADOW:
            gstats[G_SHADOW_RECLAIMED] += ent[E_TOK, e]
            if not (host and ent[E_SESS, e] >= 0 and ent[E_TOK, e] <= caps[i, 1]):
                gstats[G_SHADOW_DROPPED] += ent[E_TOK, e]
                reclaim_t[i] = now
        _evict_hbm(kv, e, host, gstats)
    return True


@nb.njit(cache=True)
def _evict_tail(kv, i, host, gstats):
    """Cut the shadow tail of the least recently used normal-class copy that has one, back to its base.

    The copy's own tokens stay where No Shadow would keep them; with the host tier the whole copy (tail
    included) is spilled first, as any evicted session entry is.  Returns the tail tokens lost (not kept on
    the host).
    """
    ent, last, lists, used, caps = kv.ent, kv.last, kv.lists, kv.used, kv.caps
    sm_host, free_stack, nfree = kv.sm_host, kv.free_stack, kv.nfree
    e = lists[i, L_NORM, 1]
    while e >= 0 and ent[E_TAIL, e] <= 0:
        e = ent[E_PREV, e]
    if e < 0:
        return 0
    tail = ent[E_TAIL, e]
    full = ent[E_TOK, e]
    sm = ent[E_SESS, e]
    gstats[G_EVICT_HBM] += 1
    gstats[G_SHADOW_RECLAIMED] += tail
    lost = tail
    if host and sm >= 0 and full <= caps[i, 1]:
        old = sm_host[sm]
        if old >= 0 and ent[E_TOK, old] >= full:
            lost = 0
        if old < 0 or ent[E_TOK, old] < full:
            if old >= 0:
                _drop(kv, old)
            h = _alloc(ent, free_stack, nfree)
            if h >= 0:
                ent[E_INST, h] = i
                ent[E_SESS, h] = sm
                ent[E_TOK, h] = full
                ent[E_BASE, h] = ent[E_BASE, e]
                ent[E_TAIL, h] = 0
                last[h] = last[e]
                _push_front(ent, lists, h, L_HOST)
                used[i, 1 + L_HOST] += full
                sm_host[sm] = h
                gstats[G_SPILL] += full
                lost = 0
                while used[i, 1 + L_HOST] > caps[i, 1]:
                    _drop(kv, lists[i, L_HOST, 1])
    ent[E_TOK, e] = full - tail
    used[i, 1] -= tail
    used[i, U_TAIL] -= tail
    ent[E_TAIL, e] = 0
    gstats[G_SHADOW_DROPPED] += lost
    return lost


@nb.njit(cache=True)
def _cold_room(kv, i, need, cutoff, own):
    """Free tokens plus tokens of entries idle since ``cutoff`` (not ``own``), counted until ``need``."""
    ent, last, lists, used, caps = kv.ent, kv.last, kv.lists, kv.used, kv.caps
    avail = _free_hbm(used, caps, i)
    for l in (L_SHADOW, L_NORM):
        e = lists[i, l, 1]
        while e >= 0 and avail < need and last[e] <= cutoff:
            if e != own:
                avail += ent[E_TOK, e]
            e = ent[E_PREV, e]
    return avail


@nb.njit(cache=True)
def _evict_cold(kv, i, need, cutoff, own, host, gstats):
    ent, last, lists, used, caps = kv.ent, kv.last, kv.lists, kv.used, kv.caps
    for l in (L_SHADOW, L_NORM):
        e = lists[i, l, 1]
        while e >= 0 and _free_hbm(used, caps, i) < need and last[e] <= cutoff:
            p = ent[E_PREV, e]
            if e != own:
                _evict_hbm(kv, e, host, gstats)
            e = p
    return _free_hbm(used, caps, i) >= need


@nb.njit(cache=True)
def _truncate(kv, e, h):
    """A rewritten history keeps only its first ``h`` tokens of every cached copy."""
    ent, used = kv.ent, kv.used
    if e < 0 or ent[E_TOK, e] <= h:
        return
    i = ent[E_INST, e]
    l = ent[E_LIST, e]
    if h <= 0:
        _drop(kv, e)
        return
    cut = ent[E_TOK, e] - h
    used[i, 1 + l] -= cut
    if l == L_NORM and ent[E_TAIL, e] > 0:
        t = max(0, ent[E_TAIL, e] - cut)
        used[i, U_TAIL] -= ent[E_TAIL, e] - t
        ent[E_TAIL, e] = t
    ent[E_TOK, e] = h
    if ent[E_BASE, e] > h:
        ent[E_BASE, e] = h


@nb.njit(cache=True)
def _check_invariants(kv, run, n_run, r_res):
    """Count KV bookkeeping mismatches: list sums vs counters, links, capacity, session maps, free entries."""
    ent, lists, used, caps = kv.ent, kv.lists, kv.used, kv.caps
    sm_hbm, sm_host, nfree = kv.sm_hbm, kv.sm_host, kv.nfree
    bad = 0
    I = used.shape[0]
    live = 0
    for i in range(I):
        for l in range(3):
            tot = 0
            e = lists[i, l, 0]
            prev = -1
            while e >= 0:
                live += 1
                if ent[E_LIST, e] != l or ent[E_INST, e] != i or ent[E_PREV, e] != prev or ent[E_TOK, e] <= 0:
                    bad += 1
                sm = ent[E_SESS, e]
                if sm >= 0:
                    if l == L_HOST and sm_host[sm] != e:
                        bad += 1
                    if l != L_HOST and sm_hbm[sm] != e:
                        bad += 1
                tot += ent[E_TOK, e]
                prev = e
                e = ent[E_NEXT, e]
            if lists[i, l, 1] != prev:
                bad += 1
            if tot != used[i, 1 + l]:
                bad += 1
        tails = 0
        e = lists[i, L_NORM, 0]
        while e >= 0:
            if ent[E_TAIL, e] < 0 or ent[E_TAIL, e] >= ent[E_TOK, e]:
                bad += 1
            tails += ent[E_TAIL, e]
            e = ent[E_NEXT, e]
        if tails != used[i, U_TAIL]:
            bad += 1
        act = 0
        for k in range(n_run[i]):
            act += r_res[run[i, k]]
        if act != used[i, 0]:
            bad += 1
        if used[i, 0] + used[i, 1] + used[i, 2] > caps[i, 0] or used[i, 3] > caps[i, 1]:
            bad += 1
    # every entry the session maps point at is live, and the table adds up
    for sm in range(sm_hbm.shape[0]):
        e = sm_hbm[sm]
        if e >= 0 and (ent[E_LIST, e] < 0 or ent[E_LIST, e] == L_HOST or ent[E_SESS, e] != sm):
            bad += 1
    for sm in range(sm_host.shape[0]):
        e = sm_host[sm]
        if e >= 0 and (ent[E_LIST, e] != L_HOST or ent[E_SESS, e] != sm):
            bad += 1
    if live + nfree[0] != ent.shape[1]:
        bad += 1
    return float(bad)


# ============================================================================ small heap (call issues)

@nb.njit(cache=True)
def _enqueue(r_next, q_head, q_tail, q_len, i, r):
    """Append request ``r`` to instance ``i``'s FIFO (a linked list through ``r_next``)."""
    if q_tail[i] >= 0:
        r_next[q_tail[i]] = r
    else:
        q_head[i] = r
    q_tail[i] = r
    q_len[i] += 1


@nb.njit(cache=True)
def _dequeue(r_next, q_head, q_tail, q_len, i):
    """Remove the head of instance ``i``'s FIFO."""
    q_head[i] = r_next[q_head[i]]
    if q_head[i] < 0:
        q_tail[i] = -1
    q_len[i] -= 1


@nb.njit(cache=True)
def _queue_eager(st, re, sm, j, t):
    """Create eager shadow request ``re`` for session-model ``sm`` on instance ``j`` at time ``t`` and queue it."""
    r_kind, r_ref, r_inst, r_arr, r_next = st.rq.r_kind, st.rq.r_ref, st.rq.r_inst, st.rq.r_arr, st.rq.r_next
    q_head, q_tail, q_len = st.inst.q_head, st.inst.q_tail, st.inst.q_len
    inst_next, busy_until = st.inst.inst_next, st.inst.busy_until
    sm_eager = st.sess.sm_eager
    r_kind[re] = K_EAGER
    r_ref[re] = sm
    r_inst[re] = j
    r_arr[re] = t
    sm_eager[sm] = re
    _enqueue(r_next, q_head, q_tail, q_len, j, re)
    if inst_next[j] == INF:
        inst_next[j] = max(t, busy_until[j])


@nb.njit(cache=True)
def _heap_push(ht, hv, n, t, v):
    k = n
    ht[k] = t
    hv[k] = v
    while k > 0:
        p = (k - 1) // 2
        if ht[p] < ht[k] or (ht[p] == ht[k] and hv[p] <= hv[k]):
            break
        ht[p], ht[k] = ht[k], ht[p]
        hv[p], hv[k] = hv[k], hv[p]
        k = p
    return n + 1


@nb.njit(cache=True)
def _heap_pop(ht, hv, n):
    n -= 1
    ht[0] = ht[n]
    hv[0] = hv[n]
    k = 0
    while True:
        a = 2 * k + 1
        if a >= n:
            break
        b = a + 1
        c = a
        if b < n and (ht[b] < ht[a] or (ht[b] == ht[a] and hv[b] < hv[a])):
            c = b
        if ht[k] < ht[c] or (ht[k] == ht[c] and hv[k] <= hv[c]):
            break
        ht[c], ht[k] = ht[k], ht[c]
        hv[c], hv[k] = hv[k], hv[c]
        k = c
    return n


@nb.njit(cache=True)
def _job_add(jobs, n_jobs, job_pos, i, s, sm):
    jobs[i, n_jobs[i]] = s
    job_pos[sm] = n_jobs[i]
    n_jobs[i] += 1


@nb.njit(cache=True)
def _job_remove(jobs, n_jobs, job_pos, i, s, sm, M, mm):
    k = job_pos[sm]
    if k < 0:
        return
    last_s = jobs[i, n_jobs[i] - 1]
    jobs[i, k] = last_s
    job_pos[last_s * M + mm] = k
    n_jobs[i] -= 1
    job_pos[sm] = -1



# ============================================================================ event helpers of the simulator
# Each helper is one event (or one phase of an iteration) of :func:`simulate`; they share its state records.
# They are inlined into the event loop (inline="always"): called, each would take its records as hundreds of
# flattened arguments and re-own every array it reads, which made the simulator about 1.5x slower.
# The per-iteration scalars travel in two scratch vectors (``itf`` float, ``iti`` int) so that the phases of
# one iteration hand their running sums to each other without long return tuples.

F_DCTX = 0          # itf: sum of decode contexts
F_PT = 1            # prefill tokens of the batch (shadow included once added)
F_PP = 2            # causal query-key pairs
F_PK = 3            # KV read by prefill chunks
F_NC = 4            # prefill chunks
F_PT_NORM = 5       # prefill tokens per class
F_PT_ROUTED = 6
F_PT_EAGER = 7
F_NEXT_READY = 8    # earliest host/network reload completion among running requests
F_SIZE = 9
I_ND = 0            # iti: decodes in the batch
I_NPF = 1           # prefill chunks in the batch
I_NRUN = 2          # running requests
I_BUDGET = 3        # token budget left
I_ROUTED = 4        # a routed call is in the batch
I_BLOCKED = 5       # an admission was blocked by memory
I_SIZE = 6


@nb.njit(cache=True, inline="always")
def _cache_arrays(kv):
    """The cache arrays that admission, shadow work and the end of an iteration all update."""
    return kv.ent, kv.last, kv.lists, kv.used, kv.free_stack, kv.nfree, kv.sm_hbm, kv.sm_host


@nb.njit(cache=True, inline="always")
def _issue_call(kn, cl, ca, st, c, now):
    """Call ``c`` is issued: start its session, cut rewritten histories, route it, queue it, wake shadow targets."""
    M, I, C, Nn, RE, SM = kn.M, kn.I, kn.C, kn.Nn, kn.RE, kn.SM
    harvesting, eager, ded_mode, host, oracle = kn.harvesting, kn.eager, kn.ded_mode, kn.host, kn.oracle
    inst_model, inst_dedicated, inst_pcie = cl.inst_model, cl.inst_dedicated, cl.inst_pcie
    inst_xfer, tok_time = cl.inst_xfer, cl.tok_time
    c_sess, c_model, c_prompt, c_hist, c_switch = ca.c_sess, ca.c_model, ca.c_prompt, ca.c_hist, ca.c_switch
    s_offsets = ca.s_offsets
    rq = st.rq
    r_inst, r_arr, r_pend, r_next = rq.r_inst, rq.r_arr, rq.r_pend, rq.r_next
    ins = st.inst
    busy_until, inst_next, pend_tok = ins.busy_until, ins.inst_next, ins.pend_tok
    q_head, q_tail, q_len = ins.q_head, ins.q_tail, ins.q_len
    ss_ = st.sess
    s_active, s_cur, s_target, sticky, n_sticky = ss_.s_active, ss_.s_cur, ss_.s_target, ss_.sticky, ss_.n_sticky
    sm_eager, ded_of, jobs, n_jobs, job_pos = ss_.sm_eager, ss_.ded_of, ss_.jobs, ss_.n_jobs, ss_.job_pos
    kv = st.kv
    ent, sm_hbm, sm_host = kv.ent, kv.sm_hbm, kv.sm_host
    c_out, c_int, gstats = st.acc.c_out, st.acc.c_int, st.acc.gstats
    n_eager = st.cnt[N_EAGER]
    s = c_sess[c]
    m = c_model[c]
    h = c_hist[c]
    if c == s_offsets[s]:
        s_active[s] = True
        for mm in range(M):  # sticky instance per model: the one with the fewest sessions
            bi = -1
            for i in range(I):
                if inst_model[i] == mm and not inst_dedicated[i]:
                    if bi < 0 or n_sticky[i] < n_sticky[bi]:
                        bi = i
            sticky[s * M + mm] = bi
            n_sticky[bi] += 1
            _job_add(jobs, n_jobs, job_pos, ded_of[mm] if ded_mode else bi, s, s * M + mm)
    for mm in range(M):
        _truncate(kv, sm_hbm[s * M + mm], h)
        _truncate(kv, sm_host[s * M + mm], h)
        if ded_mode:
            _truncate(kv, sm_hbm[SM + s * M + mm], h)
    s_cur[s] = c
    s_target[s] = c_prompt[c]
    # route: lowest estimated prefill completion counting only uncached tokens
    P = c_prompt[c]
    best = -1
    best_t = INF
    best_hit = 0
    for i in range(I):
        if inst_model[i] != m:
            continue
        is_sticky = sticky[s * M + m] == i
        if inst_dedicated[i]:
            continue
        hit = 0
        extra = 0.0
        if is_sticky:
            e = sm_hbm[s * M + m]
            if e >= 0:
                hit = min(ent[E_TOK, e], h)
            if host:
                eh = sm_host[s * M + m]
                if eh >= 0 and min(ent[E_TOK, eh], h) > hit:
                    extra = (min(ent[E_TOK, eh], h) - hit) * inst_pcie[i]
                    hit = min(ent[E_TOK, eh], h)
        if ded_mode:
            ed = sm_hbm[SM + s * M + m]
            if ed >= 0 and min(ent[E_TOK, ed], h) > hit:
                extra = (min(ent[E_TOK, ed], h) - hit) * inst_xfer[i]
                hit = min(ent[E_TOK, ed], h)
        if oracle and c_switch[c]:
            hit = h
        est = (pend_tok[i] + P - hit) * tok_time[m] + extra
        if est < best_t or (est == best_t and is_sticky):
            best_t = est
            best = i
            best_hit = hit
    i = best
    old = sticky[s * M + m]
    if old != i:
        # the session moves: its cached copies on the old instance can no longer be hit
        e = sm_hbm[s * M + m]
        if e >= 0:
            ent[E_SESS, e] = -1
            sm_hbm[s * M + m] = -1
        e = sm_host[s * M + m]
        if e >= 0:
            _drop(kv, e)
        n_sticky[old] -= 1
        sticky[s * M + m] = i
        n_sticky[i] += 1
        if not ded_mode:
            _job_remove(jobs, n_jobs, job_pos, old, s, s * M + m, M, m)
            _job_add(jobs, n_jobs, job_pos, i, s, s * M + m)
    r = Nn + c
    r_inst[r] = i
    r_arr[r] = now
    r_pend[r] = P - best_hit
    pend_tok[i] += P - best_hit
    _enqueue(r_next, q_head, q_tail, q_len, i, r)
    if inst_next[i] == INF:
        inst_next[i] = max(now, busy_until[i])
    c_out[c, 0] = now
    c_int[c, 2] = i
    # shadow bookkeeping for the other models
    for mm in range(M):
        if mm == m:
            continue
        sm = s * M + mm
        j = sticky[sm]
        if ded_mode:
            j = ded_of[mm]
        if harvesting and inst_next[j] == INF:
            inst_next[j] = max(now, busy_until[j])
        if eager and sm_eager[sm] < 0:
            if n_eager < RE:
                _queue_eager(st, Nn + C + n_eager, sm, j, now)
                n_eager += 1
            else:
                gstats[G_EAGER_OVERFLOW] += 1
    st.cnt[N_EAGER] = n_eager


@nb.njit(cache=True, inline="always")
def _schedule_running(kn, st, i, now, lm):
    """Decodes, then the in-flight prefill chunks of the running requests, under the token budget."""
    chunk = kn.chunk
    run, n_run = st.inst.run, st.inst.n_run
    rq = st.rq
    r_ready, r_done, r_prompt, r_first, r_iters = rq.r_ready, rq.r_done, rq.r_prompt, rq.r_first, rq.r_iters
    r_tpot, r_gen, r_kind, r_arr, r_ttft = rq.r_tpot, rq.r_gen, rq.r_kind, rq.r_arr, rq.r_ttft
    sl = st.scr.slack
    d_first, d_iters, d_tpot = sl.dec_first, sl.dec_iters, sl.dec_tpot
    chunk_q, itf, iti = st.scr.chunk_q, st.scr.itf, st.scr.iti
    # decodes first, then in-flight prefills, then admissions (FIFO), all under the token budget
    nrun = n_run[i]
    budget = chunk
    nd = 0
    dctx = 0.0
    routed_in = False
    next_ready = INF
    for k in range(nrun):
        r = run[i, k]
        chunk_q[k] = 0
        if r_ready[r] > now:
            next_ready = min(next_ready, r_ready[r])
            continue
        if r_done[r] >= r_prompt[r]:
            d_first[nd] = r_first[r]
            d_iters[nd] = r_iters[r]
            d_tpot[nd] = r_tpot[r]
            nd += 1
            dctx += r_prompt[r] + r_gen[r]
            budget -= 1
            if r_kind[r] == K_ROUTED:
                routed_in = True
    itf[:] = 0.0
    itf[F_DCTX] = dctx
    itf[F_NEXT_READY] = next_ready
    iti[I_ND] = nd
    iti[I_NPF] = 0
    iti[I_NRUN] = nrun
    iti[I_ROUTED] = 1 if routed_in else 0
    for k in range(nrun):
        r = run[i, k]
        if r_ready[r] > now or r_done[r] >= r_prompt[r] or budget <= 0:
            continue
        q = min(budget, r_prompt[r] - r_done[r])
        chunk_q[k] = q
        budget -= q
        _add_chunk(st.scr, lm, chunk, r_kind[r], q, r_done[r], r_prompt[r], r_arr[r], r_ttft[r])
    iti[I_BUDGET] = budget


@nb.njit(cache=True, inline="always")
def _add_chunk(scr, lm, chunk, kind, q, done, prompt, arr, ttft):
    """Count a prefill chunk of ``q`` tokens after ``done`` ones into the iteration's sums and slack rows."""
    itf, iti, sl = scr.itf, scr.iti, scr.slack
    itf[F_PT] += q
    itf[F_PP] += q * (done + (q + 1) * 0.5)
    itf[F_PK] += done + q
    itf[F_NC] += 1.0
    k = iti[I_NPF]
    sl.pf_arr[k] = arr
    sl.pf_ttft[k] = ttft
    sl.pf_rem[k] = prefill_time(lm, prompt - done - q, done + q, chunk)
    iti[I_NPF] = k + 1
    if kind == K_ROUTED:
        iti[I_ROUTED] = 1
        itf[F_PT_ROUTED] += q
    elif kind == K_EAGER:
        itf[F_PT_EAGER] += q
    else:
        itf[F_PT_NORM] += q


@nb.njit(cache=True, inline="always")
def _admit(kn, cl, ca, st, i, now, m, lm, cold_cutoff):
    """Admissions from the FIFO waiting queue: prefix hit, host/network reload, KV reservation, first chunk."""
    M, SM, chunk, max_seqs = kn.M, kn.SM, kn.chunk, kn.max_seqs
    host, oracle, ded_mode = kn.host, kn.oracle, kn.ded_mode
    inst_pcie, inst_xfer = cl.inst_pcie, cl.inst_xfer
    c_sess, c_switch = ca.c_sess, ca.c_switch
    ins = st.inst
    pcie_free, pend_tok, reclaim_t = ins.pcie_free, ins.pend_tok, ins.reclaim_t
    q_head, q_tail, q_len, run, n_run = ins.q_head, ins.q_tail, ins.q_len, ins.run, ins.n_run
    scr = st.scr
    chunk_q, itf, iti = scr.chunk_q, scr.itf, scr.iti
    rq = st.rq
    r_next, r_kind, r_ref, r_prompt, r_output = rq.r_next, rq.r_kind, rq.r_ref, rq.r_prompt, rq.r_output
    r_hist, r_hit, r_done, r_res, r_pend = rq.r_hist, rq.r_hit, rq.r_done, rq.r_res, rq.r_pend
    r_arr, r_ready, r_ttft = rq.r_arr, rq.r_ready, rq.r_ttft
    s_active, s_target, sticky, sm_eager = st.sess.s_active, st.sess.s_target, st.sess.sticky, st.sess.sm_eager
    ent, last, lists, used, free_stack, nfree, sm_hbm, sm_host = _cache_arrays(st.kv)
    c_int, c_out, gstats = st.acc.c_int, st.acc.c_out, st.acc.gstats
    nrun = iti[I_NRUN]
    budget = iti[I_BUDGET]
    next_ready = itf[F_NEXT_READY]
    blocked = False
    while q_head[i] >= 0 and nrun < max_seqs and budget > 0:
        r = q_head[i]
        kind = r_kind[r]
        P = r_prompt[r]
        hit = 0
        resident = 0
        free_hit = False
        via_net = False
        e = -1
        eh = -1
        reload = 0
        sm = -1
        if kind == K_EAGER:
            sm = r_ref[r]
            ss = sm // M
            P = s_target[ss]
            r_prompt[r] = P
            r_output[r] = 0
            if sticky[sm] != i or not s_active[ss]:
                _dequeue(r_next, q_head, q_tail, q_len, i)
                sm_eager[sm] = -1
                continue
        if kind != K_NORMAL:
            if kind == K_ROUTED:
                sm = c_sess[r_ref[r]] * M + m
            e = sm_hbm[sm]
            if e >= 0:
                resident = ent[E_TOK, e]
                hit = resident
            eh = sm_host[sm]
            if host and eh >= 0 and ent[E_TOK, eh] > hit:
                reload = ent[E_TOK, eh] - hit
                hit = ent[E_TOK, eh]
            else:
                eh = -1
            if ded_mode and kind == K_ROUTED:
                ed = sm_hbm[SM + sm]
                if ed >= 0 and min(ent[E_TOK, ed], r_hist[r]) > hit:
                    ded_hit = min(ent[E_TOK, ed], r_hist[r])
                    reload = ded_hit - hit
                    hit = ded_hit
                    via_net = True
                    _unlink(ent, lists, ed)  # touch: the warm copy stays for later switches
                    _push_front(ent, lists, ed, ent[E_LIST, ed])
                    last[ed] = now
            if kind == K_ROUTED:
                if hit > r_hist[r]:
                    hit = r_hist[r]
                if oracle and c_switch[r_ref[r]]:
                    hit = r_hist[r]
                    reload = 0
                    eh = -1
                    free_hit = True
            if kind == K_EAGER and hit >= P:
                # nothing to warm: done at once
                _dequeue(r_next, q_head, q_tail, q_len, i)
                sm_eager[sm] = -1
                continue
            if hit > P - 1:
                hit = P - 1
                if reload > 0 and hit < resident + reload:
                    reload = max(0, hit - resident)
        need = P + r_output[r]
        if e >= 0:
            _unlink(ent, lists, e)  # pin: not evictable while we make room
            l = ent[E_LIST, e]
            used[i, 1 + l] -= resident
            if l == L_NORM:
                used[i, U_TAIL] -= ent[E_TAIL, e]
            ent[E_TOK, e] = 0
        if eh >= 0:
            _unlink(ent, lists, eh)  # pin the host copy too (spills could push it out)
            used[i, 1 + L_HOST] -= ent[E_TOK, eh]
        ok = _make_room(st.kv, i, need - resident, host, gstats, cold_cutoff, now, reclaim_t)
        if not ok:
            if e >= 0:
                ent[E_TOK, e] = resident
                used[i, 1 + ent[E_LIST, e]] += resident
                if ent[E_LIST, e] == L_NORM:
                    used[i, U_TAIL] += ent[E_TAIL, e]
                _push_front(ent, lists, e, ent[E_LIST, e])
            if eh >= 0:
                used[i, 1 + L_HOST] += ent[E_TOK, eh]
                _push_front(ent, lists, eh, L_HOST)
            blocked = True
            break
        old_base = 0
        if e >= 0:
            base = ent[E_BASE, e]
            old_base = base
            if kind == K_ROUTED and hit > base and not free_hit:
                gstats[G_SHADOW_USED] += hit - base
                c_int[r_ref[r], 1] = hit - base
            sm_hbm[sm] = -1
            _release(ent, free_stack, nfree, e)
        if eh >= 0:
            base = ent[E_BASE, eh]
            old_base = max(old_base, base)
            if kind == K_ROUTED and hit > base and resident < hit:
                extra_used = hit - max(base, resident)
                if extra_used > 0:
                    gstats[G_SHADOW_USED] += extra_used
                    c_int[r_ref[r], 1] = max(c_int[r_ref[r], 1], 0) + extra_used
            sm_host[sm] = -1
            _release(ent, free_stack, nfree, eh)
        _dequeue(r_next, q_head, q_tail, q_len, i)
        used[i, 0] += need
        r_res[r] = need
        r_hit[r] = hit
        r_done[r] = hit
        pend_tok[i] += (P - hit) - r_pend[r]
        if kind == K_EAGER:
            r_hist[r] = old_base  # tokens of the copy that real calls produced
        if via_net and hit > resident:
            gstats[G_SHADOW_USED] += hit - resident
            c_int[r_ref[r], 1] = hit - resident
        if reload > 0:
            start = max(now, pcie_free[i])
            r_ready[r] = start + reload * (inst_xfer[i] if via_net else inst_pcie[i])
            pcie_free[i] = r_ready[r]
            gstats[G_RELOAD_TOK] += reload
            next_ready = min(next_ready, r_ready[r])
        if kind == K_ROUTED:
            c = r_ref[r]
            c_int[c, 0] = hit
            c_int[c, 3] = reload
            c_out[c, 4] = r_ready[r] - now if reload > 0 else 0.0
            c_out[c, 5] = now - r_arr[r]
        run[i, nrun] = r
        chunk_q[nrun] = 0
        if r_ready[r] <= now and budget > 0:
            q = min(budget, P - hit)
            chunk_q[nrun] = q
            budget -= q
            _add_chunk(scr, lm, chunk, kind, q, hit, P, r_arr[r], r_ttft[r])
        nrun += 1
    n_run[i] = nrun
    itf[F_NEXT_READY] = next_ready
    iti[I_NRUN] = nrun
    iti[I_BUDGET] = budget
    iti[I_BLOCKED] = 1 if blocked else 0


@nb.njit(cache=True, inline="always")
def _shadow_chunks(kn, cl, ca, st, i, now, m, lm, base_t, cap_t):
    """Algorithm 1: shadow chunks appended last to the iteration, by decreasing switch probability.

    A chunk takes free memory or entries idle for more than the cold age.  Reclaim guard: for the cold age
    after an admission here dropped unused shadow KV, free memory is not idle (the pool turns over faster
    than the cold age and the next admission would take it back at once), so chunks take only cold entries.

    Returns ``(shadow tokens, spent on a credit branch, poll again later, iteration seconds)``.
    """
    M, shadow_mode, harvesting, ded_mode, host, top1 = kn.M, kn.shadow_mode, kn.harvesting, kn.ded_mode, kn.host, \
        kn.top1
    gate, margin, n_min, cold_age, shadow_cap_frac = kn.gate, kn.margin, kn.n_min, kn.cold_age, kn.shadow_cap_frac
    whole_copy, off, reclaim_guard, credit_gate = kn.whole_copy, kn.off, kn.reclaim_guard, kn.credit_gate
    inst_caps, inst_dedicated = cl.inst_caps, cl.inst_dedicated
    c_model, c_pnext, c_top = ca.c_model, ca.c_pnext, ca.c_top
    credit, q_head, reclaim_t = st.inst.credit, st.inst.q_head, st.inst.reclaim_t
    jobs, n_jobs, s_active, s_cur, s_target = st.sess.jobs, st.sess.n_jobs, st.sess.s_active, st.sess.s_cur, \
        st.sess.s_target
    kv = st.kv
    ent, last, lists, used, free_stack, nfree, sm_hbm, sm_host = _cache_arrays(kv)
    itf, iti, gstats = st.scr.itf, st.scr.iti, st.acc.gstats
    nd = iti[I_ND]
    npf = iti[I_NPF]
    budget = iti[I_BUDGET]
    routed_in = iti[I_ROUTED] != 0
    blocked = iti[I_BLOCKED] != 0
    dctx = itf[F_DCTX]
    pt = itf[F_PT]
    pp = itf[F_PP]
    pk = itf[F_PK]
    nc = itf[F_NC]
    dur = base_t
    # ---------------- shadow chunks (Algorithm 1), lowest priority
    sh_tok = 0
    stretch_branch = False
    waiting = blocked or q_head[i] >= 0
    poll_wake = False
    if harvesting and not waiting and n_jobs[i] > 0 and budget > 0 and (inst_dedicated[i] or not ded_mode):
        empty = nd + npf == 0
        if inst_dedicated[i]:
            # a dedicated warming instance serves nothing else: it fills its whole token budget
            bnd = INF
            branch = BRANCH_IDLE
            limit = INF
        else:
            bnd, branch, limit = controller_bound(now, empty, shadow_mode == SH_HARVEST, routed_in, credit[i],
                                                  cap_t, base_t, st.scr.slack, nd, npf, margin)
        stretch_branch = branch == BRANCH_ROUTED or branch == BRANCH_HARVEST
        cutoff = now - cold_age
        cap_tokens = int(shadow_cap_frac * inst_caps[i, 0])
        cur_t = base_t
        tries = 0
        while bnd > 0.0 and budget >= n_min and tries < 8:
            tries += 1
            # the pending job with the highest predicted probability of being switched to
            bs = -1
            bp = -1.0
            bpend = 0
            bcov = 0
            for k in range(n_jobs[i]):
                s = jobs[i, k]
                if not s_active[s]:
                    continue
                cix = s_cur[s]
                if cix < 0 or c_model[cix] == m:
                    continue
                sm = s * M + m
                pr = c_pnext[cix, m]
                if gate > 0.0 and pr < gate:
                    continue
                if branch == BRANCH_ROUTED and pr < credit_gate:
                    continue  # stretching a routed call's iteration pays off only for a likely switch
                if top1 and c_top[cix] != m:
                    continue
                e = sm_hbm[off + sm]
                cov = ent[E_TOK, e] if e >= 0 else 0
                eh = sm_host[sm]
                if not ded_mode and eh >= 0 and ent[E_TOK, eh] > cov:
                    continue  # its prefix waits in host DRAM: the switch call reloads it
                pend = s_target[s] - cov
                if pend < n_min:
                    continue
                if pr > bp or (pr == bp and s < bs):
                    bp = pr
                    bs = s
                    bpend = pend
                    bcov = cov
            if bs < 0:
                break
            sm = off + bs * M + m
            own = sm_hbm[sm]
            hi = min(budget, bpend)
            room_cap = cap_tokens - used[i, 2] - used[i, U_TAIL]
            if whole_copy and own >= 0 and ent[E_LIST, own] == L_NORM:
                room_cap -= ent[E_TOK, own]  # legacy: the copy joins the shadow class
            if room_cap < hi:
                hi = room_cap
            keep_free = 0  # free tokens the chunk must leave free (the reclaim guard)
            if reclaim_guard and now - reclaim_t[i] < cold_age:
                keep_free = _free_hbm(used, inst_caps, i)
            avail = _cold_room(kv, i, hi + keep_free, cutoff, own) - keep_free
            if avail < hi:
                hi = avail
            if hi < n_min:
                poll_wake = True
                break
            n, t_new = largest_fit(lm, float(nd), dctx, pt, pp, pk, nc, float(bcov), hi, n_min, limit)
            if n <= 0:
                break
            if not _evict_cold(kv, i, n + keep_free, cutoff, own, host, gstats):
                break
            own = sm_hbm[sm]
            if own < 0:
                own = _alloc(ent, free_stack, nfree)
                if own < 0:
                    break
                ent[E_INST, own] = i
                ent[E_SESS, own] = sm
                ent[E_TOK, own] = 0
                ent[E_BASE, own] = 0
                _push_front(ent, lists, own, L_SHADOW)
                sm_hbm[sm] = own
            elif ent[E_LIST, own] == L_NORM and not whole_copy:
                # only the shadow's own tokens are evict-first: the copy keeps its class and LRU place
                ent[E_TOK, own] += n
                ent[E_TAIL, own] += n
                used[i, 1] += n
                used[i, U_TAIL] += n
            elif ent[E_LIST, own] == L_NORM:
                _unlink(ent, lists, own)
                used[i, 1] -= ent[E_TOK, own]
                used[i, 2] += ent[E_TOK, own]
                _push_front(ent, lists, own, L_SHADOW)
            else:
                _unlink(ent, lists, own)
                _push_front(ent, lists, own, L_SHADOW)
            if ent[E_LIST, own] == L_SHADOW:
                ent[E_TOK, own] += n
                used[i, 2] += n
                last[own] = now
            gstats[G_SHADOW_COMPUTED] += n
            sh_tok += n
            budget -= n
            pt += n
            pp += n * (bcov + (n + 1) * 0.5)
            pk += bcov + n
            cur_t = t_new
        dur = cur_t if sh_tok > 0 else base_t
    itf[F_PT] = pt
    itf[F_PP] = pp
    itf[F_PK] = pk
    iti[I_BUDGET] = budget
    return sh_tok, stretch_branch, poll_wake, dur


@nb.njit(cache=True, inline="always")
def _account_iteration(kn, cl, st, i, m, now, t_end, dur, base_t, sh_tok, stretch_branch):
    """Energy, throughput and shadow-KV statistics of one iteration, and the credit update."""
    lm = cl.lms[m]
    cap_t = kn.beta * cl.model_tpot[m]
    delta, shadow_mode, warm, meas_end = kn.delta, kn.shadow_mode, kn.warm, kn.meas_end
    p_idle, p_mem, p_max = kn.p_idle, kn.p_mem, kn.p_max
    inst_tp, credit, used = cl.inst_tp, st.inst.credit, st.kv.used
    istats, gstats, itf, iti = st.acc.istats, st.acc.gstats, st.scr.itf, st.scr.iti
    nd = iti[I_ND]
    npf = iti[I_NPF]
    dctx = itf[F_DCTX]
    pt = itf[F_PT]
    pp = itf[F_PP]
    nc = itf[F_NC]
    pt_norm = itf[F_PT_NORM]
    pt_routed = itf[F_PT_ROUTED]
    pt_eager = itf[F_PT_EAGER]
    istats[i, S_ITERS] += 1.0
    gstats[G_ITERS] += 1.0
    # ---------------- energy and throughput inside the measurement window
    ov = min(t_end, meas_end) - max(now, warm)
    if ov > 0.0:
        comp = compute_seconds(lm, float(nd), dctx, pt, pp, nc)
        u = min(1.0, comp / dur)
        frac = ov / dur
        istats[i, S_ENERGY_J] += inst_tp[i] * ov * (p_mem + (p_max - p_mem) * u - p_idle)
        istats[i, S_BUSY_S] += ov
        istats[i, S_PF_NORMAL] += pt_norm * frac
        istats[i, S_PF_ROUTED] += pt_routed * frac
        istats[i, S_PF_SHADOW] += (sh_tok + pt_eager) * frac
        istats[i, S_DEC_TOK] += nd * frac
        istats[i, S_SHADOW_KV_INT] += used[i, 2] * ov
    if used[i, 2] > istats[i, S_SHADOW_KV_PEAK]:
        istats[i, S_SHADOW_KV_PEAK] = used[i, 2]
    gstats[G_PF_NORMAL_ALL] += pt_norm
    gstats[G_PF_ROUTED_ALL] += pt_routed
    gstats[G_PF_EAGER_ALL] += pt_eager
    if shadow_mode == SH_EAGER:
        gstats[G_SHADOW_COMPUTED] += pt_eager
    # ---------------- credit (Harvest: every busy iteration; Harvest-SLO: routed iterations)
    decode_only = nd > 0 and npf == 0
    stretch = dur - base_t if (sh_tok > 0 and stretch_branch) else 0.0
    credit[i] = credit_update(credit[i], base_t, decode_only, stretch, delta, cap_t)


@nb.njit(cache=True, inline="always")
def _finish_iteration(kn, ca, st, i, now, t_end, m, nrun):
    """Apply an iteration at its end: prefill progress, first tokens, decodes, output streaming, completions
    (cache entries, the session's next call, eager follow-ups)."""
    M, C, Nn, RE, SM = kn.M, kn.C, kn.Nn, kn.RE, kn.SM
    harvesting, eager, ded_mode, cache_normal = kn.harvesting, kn.eager, kn.ded_mode, kn.cache_normal
    warm, meas_end = kn.warm, kn.meas_end
    c_sess, c_gap, s_offsets, s_measured = ca.c_sess, ca.c_gap, ca.s_offsets, ca.s_measured
    ins = st.inst
    run, n_run, busy_until, inst_next, pend_tok = ins.run, ins.n_run, ins.busy_until, ins.inst_next, ins.pend_tok
    chunk_q = st.scr.chunk_q
    rq = st.rq
    r_kind, r_ref, r_arr, r_prompt, r_output = rq.r_kind, rq.r_ref, rq.r_arr, rq.r_prompt, rq.r_output
    r_hist, r_done, r_gen, r_iters, r_first = rq.r_hist, rq.r_done, rq.r_gen, rq.r_iters, rq.r_first
    r_finish, r_ready, r_res = rq.r_finish, rq.r_ready, rq.r_res
    ss_ = st.sess
    s_active, s_cur, s_target, sticky, n_sticky = ss_.s_active, ss_.s_cur, ss_.s_target, ss_.sticky, ss_.n_sticky
    sm_eager, ded_of, jobs, n_jobs, job_pos = ss_.sm_eager, ss_.ded_of, ss_.jobs, ss_.n_jobs, ss_.job_pos
    ht, hv = ss_.ht, ss_.hv
    kv = st.kv
    ent, last, lists, used, free_stack, nfree, sm_hbm, sm_host = _cache_arrays(kv)
    c_out, n_out = st.acc.c_out, st.acc.n_out
    cnt = st.cnt
    n_eager = cnt[N_EAGER]
    nh = cnt[N_HEAP]
    outstanding = cnt[N_OUTSTANDING]
    # ---------------- apply the iteration (state now, timestamps at t_end)
    keep = 0
    for k in range(nrun):
        r = run[i, k]
        fin = False
        if r_ready[r] > now:
            run[i, keep] = r
            keep += 1
            continue
        q = chunk_q[k]
        if r_done[r] >= r_prompt[r]:
            r_gen[r] += 1
            r_iters[r] += 1
            if r_gen[r] >= r_output[r]:
                fin = True
        elif q > 0:
            r_done[r] += q
            pend_tok[i] -= q
            if r_done[r] >= r_prompt[r]:
                r_first[r] = t_end
                if r_output[r] >= 1:
                    r_gen[r] = 1
                if r_gen[r] >= r_output[r]:
                    fin = True
        if r_kind[r] == K_ROUTED and r_gen[r] > 0:
            # output streaming: the shadow target follows the generated tokens
            c = r_ref[r]
            ss = c_sess[c]
            if s_cur[ss] == c:
                s_target[ss] = r_prompt[r] + r_gen[r]
            if harvesting:
                for mm in range(M):
                    if mm != m:
                        j = ded_of[mm] if ded_mode else sticky[ss * M + mm]
                        if j >= 0 and inst_next[j] == INF:
                            inst_next[j] = max(t_end, busy_until[j])
        if not fin:
            run[i, keep] = r
            keep += 1
            continue
        # ---- finished
        r_finish[r] = t_end
        used[i, 0] -= r_res[r]
        kind = r_kind[r]
        tok = r_prompt[r] + r_output[r]
        if kind == K_NORMAL:
            n_out[r, 0] = r_first[r]
            n_out[r, 1] = t_end
            if r_arr[r] >= warm and r_arr[r] < meas_end:
                outstanding -= 1
        e = -1
        if kind != K_NORMAL or cache_normal:
            e = _alloc(ent, free_stack, nfree)
        if e >= 0:
            ent[E_INST, e] = i
            ent[E_TOK, e] = tok
            ent[E_BASE, e] = tok
            last[e] = t_end
            if kind == K_NORMAL:
                ent[E_SESS, e] = -1
            else:
                if kind == K_ROUTED:
                    ss = c_sess[r_ref[r]]
                    sm = ss * M + m
                else:
                    sm = r_ref[r]
                    ss = sm // M
                    ent[E_BASE, e] = min(r_hist[r], tok)
                    old_e = sm_hbm[sm]
                    if old_e >= 0:  # a later shadow copy (should not happen while eager runs)
                        _drop(kv, old_e)
                ent[E_SESS, e] = sm
                if sticky[sm] != i:
                    ent[E_SESS, e] = -1  # the session moved away meanwhile
                else:
                    if sm_hbm[sm] >= 0:
                        _drop(kv, sm_hbm[sm])
                    sm_hbm[sm] = e
                    eh = sm_host[sm]
                    if eh >= 0 and ent[E_TOK, eh] <= tok:
                        _drop(kv, eh)
            _push_front(ent, lists, e, L_NORM)
            used[i, 1] += tok
        if kind == K_ROUTED:
            c = r_ref[r]
            c_out[c, 1] = r_first[r]
            c_out[c, 2] = t_end
            if s_measured[ss]:
                outstanding -= 1
            if c + 1 < s_offsets[ss + 1]:
                nh = _heap_push(ht, hv, nh, t_end + c_gap[c + 1], c + 1)
            else:
                s_active[ss] = False
                for mm in range(M):
                    o = sticky[ss * M + mm]
                    n_sticky[o] -= 1
                    if ded_mode:
                        _job_remove(jobs, n_jobs, job_pos, ded_of[mm], ss, ss * M + mm, M, mm)
                        ed = sm_hbm[SM + ss * M + mm]
                        if ed >= 0:  # the session is over: its warm copy is dead weight
                            _drop(kv, ed)
                    else:
                        _job_remove(jobs, n_jobs, job_pos, o, ss, ss * M + mm, M, mm)
            if eager:
                for mm in range(M):
                    if mm == m:
                        continue
                    sm2 = ss * M + mm
                    if sm_eager[sm2] < 0 and n_eager < RE and s_active[ss]:
                        j = sticky[sm2]
                        _queue_eager(st, Nn + C + n_eager, sm2, j, t_end)
                        n_eager += 1
        elif kind == K_EAGER:
            sm = r_ref[r]
            ss = sm // M
            sm_eager[sm] = -1
            if s_active[ss] and s_target[ss] > r_prompt[r] and n_eager < RE:
                _queue_eager(st, Nn + C + n_eager, sm, i, t_end)
                n_eager += 1
    n_run[i] = keep
    busy_until[i] = t_end
    cnt[N_EAGER] = n_eager
    cnt[N_HEAP] = nh
    cnt[N_OUTSTANDING] = outstanding


# ============================================================================ the simulator

def knobs(pol, par, cluster, normals, calls):
    """The :data:`Knobs` of one run: the policy and parameter vectors decoded, and the table sizes."""
    M = int(cluster.lms.shape[0])
    C = int(calls.c_model.shape[0])
    S = int(calls.s_start.shape[0])
    shadow_mode = int(pol[P_SHADOW])
    ded_mode = shadow_mode == SH_DEDICATED
    eager = shadow_mode == SH_EAGER
    return Knobs(
        M=M, I=int(cluster.inst_model.shape[0]), Nn=int(normals.nr_time.shape[0]), S=S, C=C, SM=S * M,
        RE=4 * C * (M - 1) + 16 if eager else 0, off=S * M if ded_mode else 0, shadow_mode=shadow_mode,
        harvesting=shadow_mode == SH_HARVEST or shadow_mode == SH_SLO or shadow_mode == SH_DEDICATED,
        ded_mode=ded_mode, eager=eager, host=bool(pol[P_HOST] != 0), oracle=bool(pol[P_ORACLE] != 0),
        top1=bool(pol[P_TOP1] != 0), beta=float(par[Q_BETA]), margin=float(par[Q_MARGIN]),
        delta=float(par[Q_DELTA]), n_min=int(par[Q_NMIN]), gate=float(par[Q_GATE]), cold_age=float(par[Q_COLD_AGE]),
        shadow_cap_frac=float(par[Q_SHADOW_CAP]), chunk=int(par[Q_CHUNK]), max_seqs=int(par[Q_MAX_SEQS]),
        warm=float(par[Q_WARM]), meas_end=float(par[Q_MEAS_END]), t_max=float(par[Q_T_MAX]),
        p_idle=float(par[Q_P_IDLE]), p_mem=float(par[Q_P_MEM]), p_max=float(par[Q_P_MAX]), poll=float(par[Q_POLL]),
        cache_normal=bool(par[Q_CACHE_NORMAL] != 0.0), whole_copy=bool(par[Q_WHOLE_COPY] != 0.0),
        cold_first=bool(par[Q_COLD_FIRST] != 0.0), reclaim_guard=bool(par[Q_RECLAIM_GUARD] != 0.0),
        credit_gate=float(par[Q_CREDIT_GATE]))


def new_state(kn, cluster, normals, calls):
    """The :data:`State` at time 0: requests loaded, queues and caches empty, outputs unset."""
    i8 = np.int64
    f8 = np.float64
    M, I, Nn, S, C, SM = kn.M, kn.I, kn.Nn, kn.S, kn.C, kn.SM
    R = Nn + C + kn.RE
    rq = Requests(
        r_kind=np.zeros(R, i8), r_inst=np.full(R, -1, i8), r_prompt=np.zeros(R, i8), r_output=np.zeros(R, i8),
        r_hist=np.zeros(R, i8), r_hit=np.zeros(R, i8), r_done=np.zeros(R, i8), r_gen=np.zeros(R, i8),
        r_res=np.zeros(R, i8), r_pend=np.zeros(R, i8),
        r_ref=np.full(R, -1, i8),           # call index (routed) or session*M+model (eager)
        r_arr=np.zeros(R, f8), r_ready=np.zeros(R, f8), r_first=np.full(R, -1.0, f8), r_finish=np.full(R, -1.0, f8),
        r_iters=np.zeros(R, i8), r_ttft=np.zeros(R, f8), r_tpot=np.zeros(R, f8), r_next=np.full(R, -1, i8))
    rq.r_kind[:Nn] = K_NORMAL
    rq.r_inst[:Nn] = normals.nr_inst
    rq.r_prompt[:Nn] = normals.nr_prompt
    rq.r_output[:Nn] = normals.nr_output
    rq.r_ttft[:Nn] = normals.nr_ttft
    rq.r_tpot[:Nn] = normals.nr_tpot
    rt = slice(Nn, Nn + C)
    rq.r_kind[rt] = K_ROUTED
    rq.r_prompt[rt] = calls.c_prompt
    rq.r_output[rt] = calls.c_output
    rq.r_hist[rt] = calls.c_hist
    rq.r_ref[rt] = np.arange(C)
    rq.r_ttft[rt] = calls.c_ttft
    rq.r_tpot[rt] = calls.c_tpot
    ins = Instances(
        q_head=np.full(I, -1, i8), q_tail=np.full(I, -1, i8), q_len=np.zeros(I, i8),
        pend_tok=np.zeros(I, i8),           # prefill tokens queued or in flight (router estimate)
        run=np.full((I, kn.max_seqs), -1, i8), n_run=np.zeros(I, i8), inst_next=np.full(I, INF),
        busy_until=np.zeros(I, f8), pcie_free=np.zeros(I, f8), credit=np.zeros(I, f8),
        reclaim_t=np.full(I, -INF))         # last time an admission dropped unused shadow KV (reclaim guard)
    E = Nn + 4 * S * M + kn.RE + 64
    ent = np.full((E_ROWS, E), -1, i8)
    ent[E_TAIL, :] = 0
    # used[i]: see U_TAIL (0 reservations, 1 HBM normal class, 2 HBM shadow copies, 3 host, 4 shadow tails);
    # sm_hbm[s*M+m]: the session's copy on its sticky instance of m; sm_hbm[S*M + s*M+m]: Dedicated's warm copy
    kv = Cache(ent=ent, last=np.zeros(E, f8), lists=np.full((I, 3, 2), -1, i8), used=np.zeros((I, 5), i8),
               caps=cluster.inst_caps, sm_hbm=np.full(2 * SM, -1, i8), sm_host=np.full(SM, -1, i8),
               free_stack=np.arange(E - 1, -1, -1).astype(i8), nfree=np.array([E], i8))
    ded_of = np.full(M, -1, i8)
    for i in range(I):
        if cluster.inst_dedicated[i]:
            ded_of[cluster.inst_model[i]] = i
    sess = Sessions(
        sticky=np.full(SM, -1, i8), n_sticky=np.zeros(I, i8),
        sm_eager=np.full(SM, -1, i8),       # eager request in flight
        s_target=np.zeros(S, i8),
        s_cur=np.full(S, -1, i8),           # current (or last) call index
        s_active=np.zeros(S, np.bool_), jobs=np.full((I, S), -1, i8), n_jobs=np.zeros(I, i8),
        job_pos=np.full(SM, -1, i8), ded_of=ded_of, ht=np.empty(S + 1, f8), hv=np.empty(S + 1, i8))
    ms = kn.max_seqs
    scr = Scratch(slack=Slack(np.empty(ms, f8), np.empty(ms, f8), np.empty(ms, f8), np.empty(ms, f8),
                              np.empty(ms, f8), np.empty(ms, f8)),
                  chunk_q=np.zeros(ms, i8), itf=np.zeros(F_SIZE, f8), iti=np.zeros(I_SIZE, i8))
    acc = Stats(c_out=np.full((C, 6), -1.0, f8), c_int=np.full((C, 4), -1, i8), n_out=np.full((Nn, 2), -1.0, f8),
                istats=np.zeros((I, S_SIZE), f8), gstats=np.zeros(G_SIZE, f8))
    return State(rq=rq, inst=ins, kv=kv, sess=sess, scr=scr, acc=acc, cnt=np.zeros(N_SIZE, i8))


def simulate(pol, par, cluster, normals, calls):
    """Run one cluster simulation (see :mod:`shadow_prefill.cluster.sim` for the model).

    ``cluster``, ``normals``, ``calls``: a :data:`Cluster`, :data:`Normals` and :data:`Calls`; ``pol``, ``par``:
    the policy (P_*) and parameter (Q_*) vectors.

    Returns ``(c_out f8[C, 6], c_int i8[C, 4], n_out f8[Nn, 2], inst_stats f8[I, S_SIZE], gstats f8[G_SIZE])``:
    per call (issue, first token, finish, TTFT SLO met flag unused, reload s, queue s) and (hit, shadow hit,
    instance, reload tokens); per normal request (first token, finish).
    """
    kn = knobs(pol, par, cluster, normals, calls)
    st = new_state(kn, cluster, normals, calls)
    _simulate_jit(kn, cluster, normals, calls, st)
    a = st.acc
    return a.c_out, a.c_int, a.n_out, a.istats, a.gstats


@nb.njit(cache=True)
def _simulate_jit(kn, cl, nr, ca, st):
    """The event loop of :func:`simulate` over records it allocated; fills ``st.acc``."""
    I, Nn, S, C = kn.I, kn.Nn, kn.S, kn.C
    harvesting, beta, poll = kn.harvesting, kn.beta, kn.poll
    cold_age, cold_first = kn.cold_age, kn.cold_first
    warm, meas_end, t_max, p_idle = kn.warm, kn.meas_end, kn.t_max, kn.p_idle
    lms, model_tpot, inst_model, inst_tp = cl.lms, cl.model_tpot, cl.inst_model, cl.inst_tp
    nr_time = nr.nr_time
    s_start, s_offsets, s_measured, c_gap = ca.s_start, ca.s_offsets, ca.s_measured, ca.c_gap
    r_inst, r_arr, r_pend, r_prompt, r_next = st.rq.r_inst, st.rq.r_arr, st.rq.r_pend, st.rq.r_prompt, st.rq.r_next
    ins = st.inst
    q_head, q_tail, q_len, pend_tok = ins.q_head, ins.q_tail, ins.q_len, ins.pend_tok
    inst_next, busy_until = ins.inst_next, ins.busy_until
    ht, hv = st.sess.ht, st.sess.hv
    c_int, istats, gstats = st.acc.c_int, st.acc.istats, st.acc.gstats
    itf, iti = st.scr.itf, st.scr.iti
    cnt = st.cnt

    nh = 0
    outstanding = 0
    for s in range(S):
        c0 = s_offsets[s]
        nh = _heap_push(ht, hv, nh, s_start[s] + c_gap[c0], c0)
        if s_measured[s]:
            outstanding += s_offsets[s + 1] - s_offsets[s]
    for k in range(Nn):
        if nr_time[k] >= warm and nr_time[k] < meas_end:
            outstanding += 1
    cnt[N_HEAP] = nh
    cnt[N_OUTSTANDING] = outstanding

    pa = 0
    now = 0.0
    while True:
        t_arr = nr_time[pa] if pa < Nn else INF
        t_call = ht[0] if cnt[N_HEAP] > 0 else INF
        ib = -1
        t_inst = INF
        for i in range(I):
            if inst_next[i] < t_inst:
                t_inst = inst_next[i]
                ib = i
        now = min(t_arr, min(t_call, t_inst))
        if now == INF:
            break
        if cnt[N_OUTSTANDING] == 0 and now >= meas_end:
            break
        if now > t_max:
            gstats[G_TRUNCATED] = 1.0
            break

        if t_arr <= t_call and t_arr <= t_inst:
            # ------------------------------------------------ normal arrival
            r = pa
            pa += 1
            i = r_inst[r]
            r_arr[r] = now
            r_pend[r] = r_prompt[r]
            pend_tok[i] += r_prompt[r]
            _enqueue(r_next, q_head, q_tail, q_len, i, r)
            if inst_next[i] == INF:
                inst_next[i] = max(now, busy_until[i])
            continue

        if t_call <= t_inst:
            # ------------------------------------------------ a routed call is issued
            c = hv[0]
            cnt[N_HEAP] = _heap_pop(ht, hv, cnt[N_HEAP])
            _issue_call(kn, cl, ca, st, c, now)
            continue
        # ---------------------------------------------------- an iteration starts on instance ib
        i = ib
        m = inst_model[i]
        lm = lms[m]
        T_m = model_tpot[m]
        cap_t = beta * T_m
        # decodes first, then in-flight prefills, then admissions (FIFO), all under the token budget
        _schedule_running(kn, st, i, now, lm)
        cold_cutoff = -INF
        if cold_first:
            cold_cutoff = now - cold_age
        _admit(kn, cl, ca, st, i, now, m, lm, cold_cutoff)
        base_t = iteration_time(lm, float(iti[I_ND]), itf[F_DCTX], itf[F_PT], itf[F_PP], itf[F_PK], itf[F_NC])
        # ---------------- shadow chunks (Algorithm 1), lowest priority
        sh_tok, stretch_branch, poll_wake, dur = _shadow_chunks(kn, cl, ca, st, i, now, m, lm, base_t, cap_t)
        if dur <= 0.0:
            # nothing runnable: sleep until a host reload completes or new work arrives
            if itf[F_NEXT_READY] < INF:
                inst_next[i] = itf[F_NEXT_READY]
            elif poll_wake and harvesting:
                inst_next[i] = now + poll
            else:
                inst_next[i] = INF
            continue
        t_end = now + dur
        _account_iteration(kn, cl, st, i, m, now, t_end, dur, base_t, sh_tok, stretch_branch)
        _finish_iteration(kn, ca, st, i, now, t_end, m, iti[I_NRUN])
        inst_next[i] = t_end

    gstats[G_INVARIANT_ERRORS] = _check_invariants(st.kv, ins.run, ins.n_run, st.rq.r_res)
    # idle energy over the window, all GPUs
    W = meas_end - warm
    for i in range(I):
        istats[i, S_ENERGY_J] += inst_tp[i] * p_idle * W
    for c in range(C):
        c_int[c, 1] = max(c_int[c, 1], 0)
    gstats[G_END_TIME] = now
