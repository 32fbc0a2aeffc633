"""Compiled kernels of :mod:`shadow_prefill` (the package's only numba module).

Every kernel takes and returns NumPy arrays and scalars; the public modules
validate their inputs and document the math:

* latency vectors (``lm``) and :func:`iteration_time`: :mod:`shadow_prefill.latency`;
* the agent loop (:func:`grow_contexts`) and synthetic routes: :mod:`shadow_prefill.builder`;
* prefix-cache hits, the replay clock and isolated call latencies: :mod:`shadow_prefill.stats`;
* the shadow budget (Algorithm 1) and its credit rule: :mod:`shadow_prefill.budget`.
"""

from __future__ import annotations

from collections import namedtuple

import numba as nb
import numpy as np

# branch codes of shadow_budget (names in shadow_prefill.budget.BRANCH_NAMES)
BRANCH_QUEUE = 0
BRANCH_IDLE = 1
BRANCH_ROUTED = 2
BRANCH_SLACK = 3
BRANCH_HARVEST = 4

#: the batch :func:`shadow_budget` reads: decodes (first-token time s, iterations done, TPOT SLO s, context tokens),
#: then prefill chunks (arrival s, TTFT SLO s, predicted remaining prefill s, chunk tokens, cached context tokens)
BudgetBatch = namedtuple("BudgetBatch", "dec_first_token_s dec_iters dec_tpot_slo_s dec_context pf_arrival_s "
                                        "pf_ttft_slo_s pf_remaining_s pf_tokens pf_context")
#: the shadow job's cached context and the three caps on its chunk: free shadow KV, token budget, pending tokens
ShadowRoom = namedtuple("ShadowRoom", "shadow_context free_shadow_kv token_room pending")
#: controller parameters: iteration cap (x TPOT SLO), SLO margin, minimum chunk, fixed-credit (Harvest) mode
Controller = namedtuple("Controller", "beta margin n_min harvest")
#: what the slack branch of :func:`controller_bound` reads: the decode rows and prefill-chunk rows of the batch
Slack = namedtuple("Slack", "dec_first dec_iters dec_tpot pf_arr pf_ttft pf_rem")


@nb.njit(cache=True, inline="always")  # inlined into the budget's search loop: a call per probe costs ~4x
def iteration_time(lm, n_decode, decode_context, prefill_tokens, prefill_pairs, prefill_kv, n_chunks):
    """Seconds of one iteration with the given features (module doc) under latency vector ``lm``."""
    T = n_decode + prefill_tokens
    if T <= 0:
        return 0.0
    if lm[0] == 1.0:  # linear
        return lm[1] + lm[2] * n_decode + lm[3] * decode_context + lm[4] * prefill_tokens + lm[5] * prefill_pairs
    F = lm[6]
    B = lm[7]
    gemm = max(T * lm[2] / F, lm[3] / B)
    pre = 0.0
    if prefill_tokens > 0:
        pre = max(prefill_pairs * lm[4] / F, prefill_kv * lm[5] / B)
    dec = 0.0
    if n_decode > 0:
        dec = max(decode_context * lm[4] / F, decode_context * lm[5] / B)
    ar = 0.0
    if lm[8] > 0.0 or lm[9] > 0.0:
        ar = 2.0 * (lm[8] + T * lm[9])
    rows = n_decode + n_chunks
    head = 0.0
    if rows > 0:
        head = max(rows * lm[10] / F, lm[11] / B)
    return lm[1] * (gemm + pre + dec + ar) + head + lm[12] + n_decode * lm[13]


@nb.njit(cache=True)
def prefill_time(lm, tokens, cached, chunk):
    """Isolated chunked prefill: ``tokens`` new tokens after ``cached`` ones, ``chunk`` tokens per iteration."""
    t = 0.0
    done = 0
    while done < tokens:
        q = min(chunk, tokens - done)
        c = cached + done
        pairs = q * (c + (q + 1) * 0.5)
        t += iteration_time(lm, 0.0, 0.0, float(q), pairs, float(c + q), 1.0)
        done += q
    return t


@nb.njit(cache=True)
def decode_time(lm, batch, context):
    """One decode iteration of ``batch`` requests that each attend over ``context`` tokens."""
    return iteration_time(lm, float(batch), float(batch) * context, 0.0, 0.0, 0.0, 0.0)


# ============================================================================ the model object


@nb.njit(cache=True)
def grow_contexts(offsets, query, tool, out, model, window, summary):
    """Prompts of an agent loop (module doc).  Returns prompt, new_input, output, append_only per call."""
    n = query.shape[0]
    prompt = np.empty(n, np.int64)
    new_input = np.empty(n, np.int64)
    output = np.empty(n, np.int64)
    append_only = np.ones(n, np.bool_)
    for s in range(offsets.shape[0] - 1):
        prev_len = 0
        for i in range(offsets[s], offsets[s + 1]):
            w = window[model[i]]
            o = out[i]
            if i == offsets[s]:
                hist = 0
                new = query[i]
            else:
                hist = prev_len
                new = tool[i - 1] + query[i]
            if hist + new + o > w:
                if i != offsets[s]:
                    append_only[i] = False
                    new = summary + new
                hist = 0
                if new + o > w:
                    if o > w // 2:
                        o = w // 2
                    if new > w - o:
                        new = w - o
            prompt[i] = hist + new
            new_input[i] = new
            output[i] = o
            prev_len = hist + new + o
    return prompt, new_input, output, append_only


# --------------------------------------------------------------------------- token counts


@nb.njit(cache=True)
def markov_routes(offsets, start, sw, shift, M, model):
    for s in range(offsets.shape[0] - 1):
        cur = start[s]
        for i in range(offsets[s], offsets[s + 1]):
            if i != offsets[s] and sw[i]:
                cur = (cur + shift[i]) % M
            model[i] = cur


@nb.njit(cache=True)
def markov_routes_from(offsets, start, u, switch_from, shift, M, model):
    """Routes of a Markov router whose switch probability depends on the current model: call i (not a
    session's first) leaves model ``cur`` when ``u[i] < switch_from[cur]``, for ``cur + shift[i]`` (mod M)."""
    for s in range(offsets.shape[0] - 1):
        cur = start[s]
        for i in range(offsets[s], offsets[s + 1]):
            if i != offsets[s] and u[i] < switch_from[cur]:
                cur = (cur + shift[i]) % M
            model[i] = cur


@nb.njit(cache=True)
def prefix_hits_unbounded(offsets, model, prompt, hist, output, n_models):
    n = prompt.shape[0]
    hits = np.zeros(n, np.int64)
    valid = np.zeros(n_models, np.int64)
    for s in range(offsets.shape[0] - 1):
        valid[:] = 0
        for i in range(offsets[s], offsets[s + 1]):
            h = hist[i]
            for m in range(n_models):
                if valid[m] > h:
                    valid[m] = h
            hits[i] = valid[model[i]]
            valid[model[i]] = prompt[i] + output[i]
    return hits


@nb.njit(cache=True, inline="always")
def _lru_unlink(e, m, prv, nxt, head, tail):
    """Remove entry e from model m's doubly linked LRU list."""
    if prv[e] >= 0:
        nxt[prv[e]] = nxt[e]
    else:
        head[m] = nxt[e]
    if nxt[e] >= 0:
        prv[nxt[e]] = prv[e]
    else:
        tail[m] = prv[e]


@nb.njit(cache=True)
def prefix_hits_lru(order, session_of_call, n_sessions, model, prompt, hist, output, n_models, cap):
    n = prompt.shape[0]
    E = n_sessions * n_models
    size = np.zeros(E, np.int64)
    prv = np.full(E, -1, np.int64)
    nxt = np.full(E, -1, np.int64)
    inlist = np.zeros(E, np.bool_)
    head = np.full(n_models, -1, np.int64)  # most recent
    tail = np.full(n_models, -1, np.int64)  # least recent
    total = np.zeros(n_models, np.int64)
    hits = np.zeros(n, np.int64)
    for k in range(order.shape[0]):
        i = order[k]
        s = session_of_call[i]
        h = hist[i]
        for mm in range(n_models):
            e = s * n_models + mm
            if inlist[e] and size[e] > h:
                total[mm] -= size[e] - h
                size[e] = h
                if h == 0:
                    _lru_unlink(e, mm, prv, nxt, head, tail)
                    inlist[e] = False
        m = model[i]
        e = s * n_models + m
        hits[i] = size[e] if inlist[e] else 0
        new = prompt[i] + output[i]
        if new > cap[m]:
            new = cap[m]
        if inlist[e]:
            total[m] -= size[e]
            _lru_unlink(e, m, prv, nxt, head, tail)
            inlist[e] = False
        size[e] = new
        if new > 0:
            inlist[e] = True
            total[m] += new
            prv[e] = -1
            nxt[e] = head[m]
            if head[m] >= 0:
                prv[head[m]] = e
            head[m] = e
            if tail[m] < 0:
                tail[m] = e
            while total[m] > cap[m]:
                t = tail[m]
                total[m] -= size[t]
                size[t] = 0
                inlist[t] = False
                tail[m] = prv[t]
                if tail[m] >= 0:
                    nxt[tail[m]] = -1
                else:
                    head[m] = -1
    return hits


@nb.njit(cache=True)
def issue_times(offsets, starts, gap, output, tpot):
    n = gap.shape[0]
    t = np.empty(n, np.float64)
    for s in range(offsets.shape[0] - 1):
        now = starts[s]
        for i in range(offsets[s], offsets[s + 1]):
            now += gap[i]
            t[i] = now
            now += output[i] * tpot
    return t


@nb.njit(cache=True)
def call_latencies(lms, model, prompt, hits, output, chunk):
    n = prompt.shape[0]
    ttft = np.empty(n, np.float64)
    lat = np.empty(n, np.float64)
    for i in range(n):
        lm = lms[model[i]]
        t = prefill_time(lm, prompt[i] - hits[i], hits[i], chunk)
        ttft[i] = t
        if output[i] > 1:
            ctx = prompt[i] + 0.5 * (output[i] - 1)
            t += (output[i] - 1) * decode_time(lm, 1, ctx)
        lat[i] = t
    return ttft, lat


# ------------------------------------------------------------------------------- public helpers


@nb.njit(cache=True)
def shadow_budget(now, batch, queue_blocked, routed_in_batch, credit_s, lm, tpot_slo_s, room, ctl):
    """Shadow tokens for one iteration (module doc).

    ``batch``: a :data:`BudgetBatch`; ``room``: a :data:`ShadowRoom`; ``ctl``: a :data:`Controller`.
    ``queue_blocked``: the waiting queue is non-empty or an admission was
    blocked.  ``lm``: latency vector.  ``tpot_slo_s``: the instance's T.

    Returns ``(n, budget_s, branch, base_s, with_shadow_s)``: the tokens, the
    bound b of the branch taken, the branch code, and the predicted iteration
    time without and with the n shadow tokens.
    """
    dec_context, pf_tokens, pf_context = batch.dec_context, batch.pf_tokens, batch.pf_context
    nd = batch.dec_first_token_s.shape[0]
    npf = batch.pf_arrival_s.shape[0]
    dctx = 0.0
    for r in range(nd):
        dctx += dec_context[r]
    pt = 0.0
    pp = 0.0
    pk = 0.0
    nc = 0.0
    for r in range(npf):
        q = pf_tokens[r]
        if q > 0:
            c = pf_context[r]
            pt += q
            pp += q * (c + (q + 1) * 0.5)
            pk += c + q
            nc += 1.0
    base = iteration_time(lm, float(nd), dctx, pt, pp, pk, nc)
    if queue_blocked:
        return 0, 0.0, BRANCH_QUEUE, base, base
    slack = Slack(batch.dec_first_token_s, batch.dec_iters, batch.dec_tpot_slo_s, batch.pf_arrival_s,
                  batch.pf_ttft_slo_s, batch.pf_remaining_s)
    b, branch, limit = controller_bound(now, nd + npf == 0, ctl.harvest, routed_in_batch, credit_s,
                                        ctl.beta * tpot_slo_s, base, slack, nd, npf, ctl.margin)
    hi = min(room.token_room, room.free_shadow_kv, room.pending)
    if hi < ctl.n_min or b <= 0.0:
        return 0, b, branch, base, base
    n, t = largest_fit(lm, float(nd), dctx, pt, pp, pk, nc, float(room.shadow_context), hi, ctl.n_min, limit)
    if t < 0.0:
        return 0, b, branch, base, base
    return n, b, branch, base, t


@nb.njit(cache=True)
def controller_bound(now, empty, harvest, routed, credit_s, cap_t, base, slack, nd, npf, margin):
    """Algorithm 1's branch for a batch whose iteration takes ``base`` s: ``(b, branch, limit on t(B + n))``.

    ``slack``: a :data:`Slack` whose first ``nd`` decode rows and ``npf`` prefill rows are the batch; ``cap_t``:
    beta times the TPOT SLO.  The credit branches bound the stretch, so their limit is ``base + b``.
    """
    if empty:
        return cap_t, BRANCH_IDLE, cap_t
    if harvest:
        b = min(credit_s, cap_t)
        return b, BRANCH_HARVEST, base + b
    if routed:
        b = min(credit_s, cap_t)
        return b, BRANCH_ROUTED, base + b
    dec_first, dec_iters, dec_tpot = slack.dec_first, slack.dec_iters, slack.dec_tpot
    pf_arr, pf_ttft, pf_rem = slack.pf_arr, slack.pf_ttft, slack.pf_rem
    b = cap_t
    keep = 1.0 - margin
    for r in range(nd):
        s = keep * dec_tpot[r] * (dec_iters[r] + 1) - (now - dec_first[r])
        if s < b:
            b = s
    for r in range(npf):
        s = keep * pf_ttft[r] - (now - pf_arr[r]) - pf_rem[r]
        if s < b:
            b = s
    return b, BRANCH_SLACK, b


@nb.njit(cache=True)
def largest_fit(lm, nd, dctx, pt, pp, pk, nc, sc, hi, n_min, limit):
    """Largest n in [n_min, hi] with t(B + n shadow tokens over sc cached) <= limit, and that time.

    The batch B is given by its features (``nd`` decodes over ``dctx`` context; ``pt`` prefill tokens, ``pp``
    pairs, ``pk`` KV read, ``nc`` chunks).  The shadow chunk adds no logits row.  ``(0, -1.0)`` when none fits.
    """
    if hi < n_min:
        return 0, -1.0
    t_hi = iteration_time(lm, nd, dctx, pt + hi, pp + hi * (sc + (hi + 1) * 0.5), pk + sc + hi, nc)
    if t_hi <= limit:
        return hi, t_hi
    lo = n_min
    t_lo = iteration_time(lm, nd, dctx, pt + lo, pp + lo * (sc + (lo + 1) * 0.5), pk + sc + lo, nc)
    if t_lo > limit:
        return 0, -1.0
    # invariant: t(lo) <= limit < t(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        t_mid = iteration_time(lm, nd, dctx, pt + mid, pp + mid * (sc + (mid + 1) * 0.5), pk + sc + mid, nc)
        if t_mid <= limit:
            lo = mid
            t_lo = t_mid
        else:
            hi = mid
    return lo, t_lo


@nb.njit(cache=True)
def credit_update(credit_s, base_s, decode_only, stretch_s, delta, cap_s):
    """Credit after an iteration: ``clip(credit - stretch + delta * base [decode-only], 0, cap)``.

    ``base_s``: the iteration's time without shadow work; ``decode_only``: its
    batch (shadow excluded) held decodes and no prefill chunk; ``stretch_s``:
    the time shadow work added; ``cap_s``: beta times the TPOT SLO.
    """
    c = credit_s - stretch_s
    if decode_only:
        c += delta * base_s
    if c > cap_s:
        c = cap_s
    if c < 0.0:
        c = 0.0
    return c


# ------------------------------------------------------------------------------ Python view
