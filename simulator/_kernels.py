"""Numba kernel of the per-request event simulator (the only numba module of ``simulator``).

The kernel advances a closed system of ``N`` requests through ``M`` models in
continuous time.  It keeps, like the chain of the spec, the residual time
``res[i]`` of the batch running on each model rather than absolute completion
times: the next event is ``tau = min res[i]``, every running model loses
``tau``, and each model whose residual is then ``<= tie_ms`` completes.  With
grid-valued latencies this reproduces the chain's simultaneous completions
exactly (absolute-time sums such as ``6.0 * 14`` versus ``27.9 * 3`` would
break such ties in an arbitrary floating-point order).

Randomness is counter based: the k-th routing draw of request slot r is
``splitmix64(key[r] + k * K)``, so a request follows the same route whatever
the thresholds are.  That gives common random numbers across candidate
threshold vectors for free and makes a run a pure function of its seed.

Per event:
1. every completing model routes each request of its batch (by the cumulative
   row of P, or by the next recorded step of the replayed trace request) and
   credits the committed tokens; a request that finishes (end of its replayed
   trace request, or ``req_tokens`` committed tokens) is replaced by a new one
   that joins the queue of its entry model;
2. every idle model j with ``k_j >= B_j`` launches ``min(k_j, cap_j)``
   requests from the head of its FIFO queue for ``lat[j, b]`` ms, optionally
   multiplied by a mean-one log-normal factor ``exp(s Z - s^2 / 2)``.

Two serving costs the chain does not see (both off by default, and then the
arithmetic is exactly the plain kernel's):

* **catch-up extend**: model j's cache of a request covers the tokens it had
  when it last ran on j; a step must feed every token committed since, so
  row r feeds ``n_r = max(1, tokens_r - seen_r[j])`` tokens (a new request
  starts with ``prompt_tokens`` and sees nothing, so its first step on a model
  is its prefill).  A batch is padded to ``T = max_r n_r`` and costs
  ``lat[j, b] + ext[j, b] * (T - 1)`` (T rounded up to a captured length
  when buckets are given): ``ext`` is the extra ms per fed token
  beyond the first (e.g. from an extend-k profile:
  ``(L_ext_k(b) - L(b)) / (k - 1)``).
* **co-running, rate-sharing law**: while the set R of models is running,
  model i progresses at rate ``1 / f_i(R)``, ``f_i(R) = prod_{k in R, k != i}
  corun[i, k]`` (a model that shares a GPU with another one gets its share
  of the memory bandwidth).  Residuals are kept in solo milliseconds; the
  set changes only at epochs, so the next epoch is ``tau = min_i res_i f_i``
  and every running model loses ``tau / f_i``.

And one co-running law the chain shares (off when ``lat_co`` equals ``lat``):

* **co-running, launch law**: a batch's duration is fixed when it launches:
  ``lat[j, b]`` when no other model is busy at that instant, ``lat_co[j, b]``
  when at least one is.  Busy means running a batch after this epoch's
  completions, or launching in this same launch pass (two models that start
  together both run co-located); what happens later does not change a
  running batch.  The launching set is decided before any duration, so the
  order of the models in the pass does not matter.

Statistics are accumulated only after the warm-up: tokens, elapsed time and
request-steps per progress bin (for batch means), the time integrals of the
queue lengths and of the busy indicators, admission latencies (launch time
minus queue-join time) as count, sum, an exact-zero count and a log-spaced
histogram, and completed requests with their summed sojourn time.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from dtmc._kernels import corun_at_launch

# The launch law's tie rule is dtmc's kernel (one copy).  numba's cache keys a function on its own file only,
# so a cached kernel here would keep an older inlined copy after an edit of dtmc/_kernels.py: this stamp is
# that file's sha256 (tests/test_kernel_copies.py fails when it is stale; updating it edits this file, which
# invalidates this module's cache).
_DTMC_KERNELS_SHA = "b87f609d6fd3b25423dd51d0044828d420681f528e118edbce5839224daa75f3"


class SimSystem(NamedTuple):
    """The served system: routing (cumulative rows ``pcum`` of P, tokens ``cmat``, expected tokens
    ``exp_tok`` or -1), step latencies ``lat``/``lat_co`` ``[M, N + 1]``, batch caps, and the serving costs
    of the module docstring (``ext``, ``prompt_tokens``, ``tbuckets``, ``corun``)."""

    pcum: np.ndarray
    cmat: np.ndarray
    exp_tok: np.ndarray
    lat: np.ndarray
    lat_co: np.ndarray
    caps: np.ndarray
    ext: np.ndarray
    prompt_tokens: float
    tbuckets: np.ndarray
    corun: np.ndarray


class SimRequests(NamedTuple):
    """Where requests go: ``mode`` 0 routes by P (a request ends after ``req_tokens`` committed tokens when
    that is > 0), mode 1 replays the recorded requests ``off``/``model``/``tok``/``last``."""

    mode: int
    req_tokens: float
    off: np.ndarray
    model: np.ndarray
    tok: np.ndarray
    last: np.ndarray


class SimRun(NamedTuple):
    """The run: randomness, tie tolerance, warm-up and measured length, and the statistics' bins."""

    seed: np.uint64
    jitter_sigma: float
    tie_ms: float
    warm_steps: int
    warm_ms: float
    meas_steps: int
    meas_ms: float
    n_bins: int
    hist_min_ms: float
    hist_inv_log_ratio: float
    n_hist: int


@njit(cache=True)
def _mix64(z):
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@njit(cache=True)
def _unit(h):
    # 53 high bits -> [0, 1)
    return float(h >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True)
def _slot_key(seed, slot, generation):
    return _mix64(_mix64(seed ^ (np.uint64(slot + 1) * np.uint64(0x9E3779B97F4A7C15)))
                  + np.uint64(generation) * np.uint64(0xD1B54A32D192ED03))


@njit(cache=True)
def simulate_kernel(system, thresh, n_req, requests, run):
    """Run one simulation of ``n_req`` requests under thresholds ``thresh``; see the module docstring and
    the records :class:`SimSystem`, :class:`SimRequests` and :class:`SimRun`.

    mode 0: routing by ``pcum`` (cumulative rows of P) with tokens ``cmat``;
    requests finish after ``req_tokens`` committed tokens when that is > 0.
    When ``exp_tok[i] >= 0`` a completed step on model i credits the
    throughput with that expected count instead of the drawn ``cmat[i, j]``
    (conditional Monte Carlo: same mean, less variance); requests still
    count their drawn tokens toward ``req_tokens``.
    mode 1: replay of recorded requests ``off`` (offsets into the flat
    arrays ``model``/``tok``; ``last`` flags the last step of each
    recorded request), closed loop.
    Exactly one of ``meas_steps`` (> 0) and ``meas_ms`` (> 0) sets the
    measured length; likewise ``warm_steps`` / ``warm_ms`` the warm-up.
    ``ext`` ``[M, N + 1]`` (ms per extra fed token, all zero = no catch-up
    cost), ``prompt_tokens`` and ``corun`` ``[M, M]`` (all one = no slowdown):
    see the module docstring.  ``lat_co`` ``[M, N + 1]``: the launch law's
    co-running durations (equal to ``lat`` = no co-running cost).
    ``tbuckets`` (increasing, possibly empty): the
    fed length T is rounded up to the first bucket >= T (CUDA-graph padding;
    beyond the last bucket T stays as it is).

    Returns ``(status, bin_tok, bin_ms, bin_steps, wait_area, busy_area,
    serv_area, adm_cnt, adm_sum, adm_zero, hist, launches, launched,
    max_batch, completions, sojourn_sum, total_steps, co_launches)``
    (``co_launches[i]``: measured launches of model i that took ``lat_co``); status 0 ok, 1
    deadlock (no model can run).  Areas are time integrals (request-ms or ms).
    """
    pcum, cmat, exp_tok, lat, lat_co, caps, ext, prompt_tokens, tbuckets, corun = system
    mode, req_tokens, tr_off, tr_model, tr_tok, tr_last = requests
    (seed, jitter_sigma, tie_ms, warm_steps, warm_ms, meas_steps, meas_ms, n_bins, hist_min_ms,
     hist_inv_log_ratio, n_hist) = run
    M = thresh.shape[0]
    N = n_req
    K2 = np.uint64(0xD6E8FEB86659FD93)
    seed_u = np.uint64(seed)
    jseed = _mix64(seed_u ^ np.uint64(0xA0761D6478BD642F))

    cur = np.zeros(N, np.int64)        # model (mode 0) or flat trace position (mode 1)
    join_t = np.zeros(N)
    start_t = np.zeros(N)
    tok = np.zeros(N)
    draws = np.zeros(N, np.uint64)
    gen = np.zeros(N, np.int64)
    key = np.empty(N, np.uint64)

    q = np.empty((M, N), np.int64)
    qh = np.zeros(M, np.int64)
    qk = np.zeros(M, np.int64)
    run = np.empty((M, N), np.int64)
    bs = np.zeros(M, np.int64)
    res = np.zeros(M)
    nlaunch = np.zeros(M, np.int64)
    done = np.zeros(M, np.bool_)

    bin_tok = np.zeros(n_bins)
    bin_ms = np.zeros(n_bins)
    bin_steps = np.zeros(n_bins, np.int64)
    wait_area = np.zeros(M)
    busy_area = np.zeros(M)
    serv_area = np.zeros(M)
    max_batch = np.zeros(M, np.int64)
    adm_cnt = np.zeros(M, np.int64)
    adm_sum = np.zeros(M)
    adm_zero = np.zeros(M, np.int64)
    hist = np.zeros((M, n_hist), np.int64)
    launches = np.zeros(M, np.int64)
    launched = np.zeros(M, np.int64)
    completions = 0
    sojourn_sum = 0.0

    use_ext = False
    for i in range(M):
        for b in range(ext.shape[1]):
            if ext[i, b] != 0.0:
                use_ext = True
    use_corun = False
    for i in range(M):
        for k in range(M):
            if i != k and corun[i, k] != 1.0:
                use_corun = True
    use_launch = False
    for i in range(M):
        for b in range(lat.shape[1]):
            if lat_co[i, b] != lat[i, b]:
                use_launch = True
    co_launches = np.zeros(M, np.int64)
    tcount = np.full(N, prompt_tokens)      # tokens of each request (prompt + committed)
    seen = np.zeros((N, M))                 # tokens each model's cache covers
    rate_f = np.ones(M)

    n_rec = tr_off.shape[0] - 1
    for r in range(N):
        key[r] = _slot_key(seed_u, r, 0)
        if mode == 1:
            rec = np.int64(_mix64(key[r] ^ np.uint64(0x5851F42D4C957F2D)) % np.uint64(n_rec))
            cur[r] = tr_off[rec]
            m0 = tr_model[cur[r]]
        else:
            cur[r] = 0
            m0 = 0
        t = qh[m0] + qk[m0]
        if t >= N:
            t -= N
        q[m0, t] = r
        qk[m0] += 1

    now = 0.0
    total_steps = 0
    measuring = warm_steps <= 0 and warm_ms <= 0.0
    t0 = 0.0
    s0 = 0
    status = 0

    while True:
        # launch rule, all idle models in one pass
        # (a model's launch changes only its own queue and batch, so the launching set is known up front)
        n_running = 0
        n_launching = 0
        if use_launch:
            for j in range(M):
                if bs[j] > 0:
                    n_running += 1
                elif qk[j] >= thresh[j]:
                    n_launching += 1
        co = corun_at_launch(use_launch, n_running, n_launching)
        for j in range(M):
            if bs[j] == 0 and qk[j] >= thresh[j]:
                b = qk[j]
                if b > caps[j]:
                    b = caps[j]
                h = qh[j]
                for x in range(b):
                    r = q[j, h]
                    run[j, x] = r
                    if measuring:
                        w = now - join_t[r]
                        adm_cnt[j] += 1
                        adm_sum[j] += w
                        if w <= tie_ms:
                            adm_zero[j] += 1
                        else:
                            idx = int(math.log(w / hist_min_ms) * hist_inv_log_ratio)
                            if idx < 0:
                                idx = 0
                            elif idx >= n_hist:
                                idx = n_hist - 1
                            hist[j, idx] += 1
                    h += 1
                    if h >= N:
                        h -= N
                qh[j] = h
                qk[j] -= b
                bs[j] = b
                d = lat[j, b]
                if co:
                    # launch law: at least one other model is running or starting with this one
                    d = lat_co[j, b]
                    if measuring:
                        co_launches[j] += 1
                if use_ext:
                    tmax = 1.0
                    for x in range(b):
                        r = run[j, x]
                        nf = tcount[r] - seen[r, j]
                        if nf > tmax:
                            tmax = nf
                        seen[r, j] = tcount[r]
                    for x in range(tbuckets.shape[0]):
                        if tbuckets[x] >= tmax:   # padded up to the smallest captured length
                            tmax = tbuckets[x]
                            break
                    d += ext[j, b] * (tmax - 1.0)
                if jitter_sigma > 0.0:
                    kk = _mix64(jseed + np.uint64(j + 1) * np.uint64(0x9E3779B97F4A7C15))
                    u1 = _unit(_mix64(kk + np.uint64(2 * nlaunch[j]) * K2))
                    u2 = _unit(_mix64(kk + np.uint64(2 * nlaunch[j] + 1) * K2))
                    z = math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)
                    d *= math.exp(jitter_sigma * z - 0.5 * jitter_sigma * jitter_sigma)
                res[j] = d
                nlaunch[j] += 1
                if measuring:
                    launches[j] += 1
                    launched[j] += b
                    if b > max_batch[j]:
                        max_batch[j] = b

        # next completion epoch
        if use_corun:
            for i in range(M):
                f = 1.0
                if bs[i] > 0:
                    for k in range(M):
                        if k != i and bs[k] > 0:
                            f *= corun[i, k]
                rate_f[i] = f
        tau = np.inf
        for i in range(M):
            if bs[i] > 0 and res[i] * rate_f[i] < tau:
                tau = res[i] * rate_f[i]
        if tau == np.inf:
            status = 1
            break
        if measuring:
            for i in range(M):
                wait_area[i] += qk[i] * tau
                if bs[i] > 0:
                    busy_area[i] += tau
                    serv_area[i] += bs[i] * tau
        now += tau
        for i in range(M):
            done[i] = False
            if bs[i] > 0:
                if use_corun:
                    res[i] -= tau / rate_f[i]
                else:
                    res[i] -= tau
                if res[i] <= tie_ms:
                    done[i] = True

        ev_tok = 0.0
        ev_steps = 0
        for i in range(M):
            if not done[i]:
                continue
            for x in range(bs[i]):
                r = run[i, x]
                if mode == 0:
                    u = _unit(_mix64(key[r] + draws[r] * K2))
                    draws[r] += np.uint64(1)
                    dest = M - 1
                    for jj in range(M - 1):
                        if u < pcum[i, jj]:
                            dest = jj
                            break
                    c = cmat[i, dest]
                    tcount[r] += c
                    if exp_tok[i] >= 0.0:
                        ev_tok += exp_tok[i]
                    else:
                        ev_tok += c
                    if req_tokens > 0.0:
                        tok[r] += c
                        if tok[r] >= req_tokens:
                            if measuring:
                                completions += 1
                                sojourn_sum += now - start_t[r]
                            tok[r] = 0.0
                            start_t[r] = now
                            dest = 0
                            tcount[r] = prompt_tokens
                            for jj in range(M):
                                seen[r, jj] = 0.0
                else:
                    pos = cur[r]
                    ev_tok += tr_tok[pos]
                    tcount[r] += tr_tok[pos]
                    last = tr_last[pos]
                    pos += 1
                    if last:
                        # end of the replayed recorded request: a new one takes the slot
                        if measuring:
                            completions += 1
                            sojourn_sum += now - start_t[r]
                        gen[r] += 1
                        key[r] = _slot_key(seed_u, r, gen[r])
                        rec = np.int64(_mix64(key[r] ^ np.uint64(0x5851F42D4C957F2D)) % np.uint64(n_rec))
                        pos = tr_off[rec]
                        start_t[r] = now
                        tcount[r] = prompt_tokens
                        for jj in range(M):
                            seen[r, jj] = 0.0
                    cur[r] = pos
                    dest = tr_model[pos]
                join_t[r] = now
                t = qh[dest] + qk[dest]
                if t >= N:
                    t -= N
                q[dest, t] = r
                qk[dest] += 1
            ev_steps += bs[i]
            bs[i] = 0
            res[i] = 0.0

        total_steps += ev_steps
        if measuring:
            ms = now - t0
            st = total_steps - s0
            if meas_steps > 0:
                bi = (st - ev_steps) * n_bins // meas_steps
            else:
                bi = int((ms - tau) / meas_ms * n_bins)
            if bi >= n_bins:
                bi = n_bins - 1
            bin_tok[bi] += ev_tok
            bin_ms[bi] += tau
            bin_steps[bi] += ev_steps
            if (meas_steps > 0 and st >= meas_steps) or (meas_steps <= 0 and ms >= meas_ms):
                break
        elif (warm_steps > 0 and total_steps >= warm_steps) or (warm_steps <= 0 and now >= warm_ms):
            measuring = True
            t0 = now
            s0 = total_steps

    return (status, bin_tok, bin_ms, bin_steps, wait_area, busy_area, serv_area, adm_cnt, adm_sum, adm_zero,
            hist, launches, launched, max_batch, completions, sojourn_sum, total_steps, co_launches)
