"""Numba kernels of the profiler (the only module of ``profiler`` that imports numba).

The routing-trace reader hands raw bytes of a JSONL file to :func:`consume_lines`,
which parses every line in place (no Python objects per line), keeps a small
per-request state in an open-addressing hash table and accumulates the
sufficient statistics of the estimators:

* ``counts[i, j]`` -- steps on model i whose routing decision was j,
* ``csum[i, j]``, ``csq[i, j]`` -- sum and sum of squares of committed tokens,
* ``at_risk[i, a]``, ``events[i, a]`` -- discrete hazard table of run ages
  (a step on model i at run age a is "at risk" of ending the run; it is an event
  when it routes elsewhere),
* ``runs[i, a]`` -- completed runs of known length a,
* per request: steps on the entry model 0 and escalations from it, folded into
  ``esc_acc``/``esc_hist`` when the request finishes.

The per-request table holds one slot per request in flight; a request that ends
(``next_model == -1``) frees its slot (tombstone), so memory follows the number
of concurrent requests, not the length of the trace.

Lines the fast path does not handle (escapes in keys or in ``request_id``,
nested values, duplicate keys, missing fields, wrong types) are not guessed at:
the kernel stops and returns ``STATUS_FALLBACK`` so the caller can parse that
line with :func:`json.loads`, validate it with a precise message, and feed it
through :func:`apply_record`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

STATUS_DONE = 0  # every complete line of the buffer consumed
STATUS_FALLBACK = 1  # line at out[1] needs the slow path
STATUS_TABLE_FULL = 2  # grow the request table, then resume at out[1]
STATUS_ERROR = 3  # semantic error at out[1], code in out[3]

ERR_NONE = 0
ERR_STEP_GAP = 1  # step is not previous step + 1
ERR_MODEL_MISMATCH = 2  # model differs from the previous line's next_model
ERR_MODEL_RANGE = 3  # model or next_model outside [0, mcap) (next_model may be -1)

SLOT_EMPTY = 0
SLOT_LIVE = 1
SLOT_TOMB = 2

_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)

# out[] layout shared with the Python driver
OUT_STATUS = 0
OUT_POS = 1  # byte offset of the first unconsumed line
OUT_LINES = 2  # lines consumed (terminated by \n)
OUT_ERR = 3
OUT_ERR_END = 4  # end offset (exclusive, without \n) of the offending line
OUT_LIVE = 5
OUT_TOMB = 6
OUT_MAX_MODEL = 7
OUT_PEAK = 8  # most requests in flight at once
OUT_LEN = 9


class RequestTable(NamedTuple):
    """The open-addressing table of requests in flight, one array per field of a slot: request key, slot
    state (SLOT_*), last step, its next model, run age (-1: unknown), steps on model 0 and escalations
    from it."""

    keys: np.ndarray
    state: np.ndarray
    step: np.ndarray
    nxt: np.ndarray
    age: np.ndarray
    n0: np.ndarray
    x0: np.ndarray


class TraceStats(NamedTuple):
    """The sufficient statistics (module docstring) and the ``out[]`` counters shared with the driver."""

    counts: np.ndarray
    csum: np.ndarray
    csq: np.ndarray
    at_risk: np.ndarray
    events: np.ndarray
    runs: np.ndarray
    esc_acc: np.ndarray
    esc_hist: np.ndarray
    final_acc: np.ndarray
    out: np.ndarray


@njit(cache=True)
def hash_bytes(buf, start, end, tag):
    """FNV-1a (64 bit) of a type tag byte followed by ``buf[start:end]``."""
    h = _FNV_OFFSET
    h = (h ^ np.uint64(tag)) * _FNV_PRIME
    for k in range(start, end):
        h = (h ^ np.uint64(buf[k])) * _FNV_PRIME
    return np.int64(h)


@njit(cache=True)
def _slot_of(key, tkeys, tstate):
    """Slot holding ``key``, or -(first free slot) - 1 when absent."""
    cap = tkeys.shape[0]
    mask = cap - 1
    k = np.int64(key) & mask
    first_tomb = -1
    for _ in range(cap):
        s = tstate[k]
        if s == SLOT_EMPTY:
            if first_tomb >= 0:
                return -first_tomb - 1
            return -k - 1
        if s == SLOT_LIVE:
            if tkeys[k] == key:
                return k
        elif first_tomb < 0:
            first_tomb = k
        k = (k + 1) & mask
    return -first_tomb - 1


@njit(cache=True)
def _finish_request(n0, x0, esc_acc, esc_hist):
    if n0 <= 0:
        return
    rate = x0 / n0
    esc_acc[0] += 1.0
    esc_acc[1] += x0 * x0 / n0
    esc_acc[2] += x0
    esc_acc[3] += n0
    esc_acc[4] += rate
    esc_acc[5] += rate * rate
    nb = esc_hist.shape[0]
    b = int(rate * nb)
    if b >= nb:
        b = nb - 1
    esc_hist[b] += 1


@njit(cache=True)
def apply_record(key, step, model, nxt, tokens, mcap, table, stats):
    """Fold one validated record into ``stats`` (:class:`TraceStats`), its request's slot in ``table``
    (:class:`RequestTable`); returns an ERR_* code.

    Returns -1 (and changes nothing) when the table needs to grow first.
    """
    tkeys, tstate, tstep, tnext, tage, tn0, tx0 = table
    counts, csum, csq, at_risk, events, runs, esc_acc, esc_hist, final_acc, out = stats
    if model < 0 or model >= mcap or nxt < -1 or nxt >= mcap:
        return ERR_MODEL_RANGE
    kcap = at_risk.shape[1] - 1
    slot = _slot_of(key, tkeys, tstate)
    if slot < 0:
        free = -slot - 1
        cap = tkeys.shape[0]
        if (out[OUT_LIVE] + out[OUT_TOMB] + 1) * 2 > cap:
            return -1
        if tstate[free] == SLOT_TOMB:
            out[OUT_TOMB] -= 1
        tstate[free] = SLOT_LIVE
        out[OUT_LIVE] += 1
        if out[OUT_LIVE] > out[OUT_PEAK]:
            out[OUT_PEAK] = out[OUT_LIVE]
        tkeys[free] = key
        # a request first seen after step 0 started its current run unobserved
        tage[free] = 1 if step == 0 else -1
        tn0[free] = 0
        tx0[free] = 0
        slot = free
    else:
        if step != tstep[slot] + 1:
            return ERR_STEP_GAP
        if model != tnext[slot]:
            return ERR_MODEL_MISMATCH
    if model > out[OUT_MAX_MODEL]:
        out[OUT_MAX_MODEL] = model
    if nxt > out[OUT_MAX_MODEL]:
        out[OUT_MAX_MODEL] = nxt
    age = tage[slot]
    if nxt < 0:
        final_acc[0] += 1.0
        final_acc[1] += tokens
        _finish_request(tn0[slot], tx0[slot], esc_acc, esc_hist)
        tstate[slot] = SLOT_TOMB
        out[OUT_LIVE] -= 1
        out[OUT_TOMB] += 1
        return ERR_NONE
    counts[model, nxt] += 1
    csum[model, nxt] += tokens
    csq[model, nxt] += tokens * tokens
    if model == 0:
        tn0[slot] += 1
        if nxt != 0:
            tx0[slot] += 1
    if age >= 1:
        a = age if age < kcap else kcap
        at_risk[model, a] += 1
        if nxt != model:
            events[model, a] += 1
            runs[model, a] += 1
    if nxt == model:
        tage[slot] = age + 1 if age >= 1 else -1
    else:
        tage[slot] = 1
    tstep[slot] = step
    tnext[slot] = nxt
    return ERR_NONE


@njit(cache=True)
def apply_token_sources(offsets, first_steps, is_ref, start, mcap, table, stats):
    """Fold per-token model choices of two-model requests (R2R's records) into the statistics.

    Request r owns tokens ``offsets[r]:offsets[r+1]`` of ``is_ref``; its chain steps are, per token, one
    step on model 0 committing it (``is_ref`` false, decision 0), or one step on model 0 committing nothing
    (decision 1) followed by one step on model 1 committing it (decision 0); then an end line
    (``next_model = -1``, 1 token for ``final_acc``).  Request keys are the request indices; steps start at
    ``first_steps[r]``.  Returns the index of the first request not applied: ``n`` when done, ``r`` when
    the table must grow first (request r untouched: only its first step can need a slot); a negative value
    ``-code`` for an ERR_* code (cannot happen for well-formed input).
    """
    n = offsets.shape[0] - 1
    for r in range(start, n):
        step = first_steps[r]
        for t in range(offsets[r], offsets[r + 1]):
            ref = is_ref[t]
            # model 0's step: commits the token, or (a reference token) hands over committing nothing
            code = apply_record(r, step, 0, 1 if ref else 0, 0.0 if ref else 1.0, mcap, table, stats)
            if code == -1:
                return r
            if code != 0:
                return -code
            step += 1
            if ref:  # model 1's step commits it
                code = apply_record(r, step, 1, 0, 1.0, mcap, table, stats)
                if code != 0:
                    return -code
                step += 1
        code = apply_record(r, step, 0, -1, 1.0, mcap, table, stats)
        if code != 0:
            return -code
    return n


@njit(cache=True)
def finish_all(tstate, tn0, tx0, esc_acc, esc_hist):
    """At end of trace: fold the requests still in flight into the escalation statistics."""
    for s in range(tstate.shape[0]):
        if tstate[s] == SLOT_LIVE:
            _finish_request(tn0[s], tx0[s], esc_acc, esc_hist)


@njit(cache=True)
def rehash(old, new):
    """Move the live slots of the table ``old`` into ``new`` (larger or as large, empty); returns the number
    moved."""
    old_keys, old_state, old_step, old_next, old_age, old_n0, old_x0 = old
    keys, state, step, nxt, age, n0, x0 = new
    moved = 0
    for s in range(old_keys.shape[0]):
        if old_state[s] != SLOT_LIVE:
            continue
        slot = _slot_of(old_keys[s], keys, state)
        f = -slot - 1
        state[f] = SLOT_LIVE
        keys[f] = old_keys[s]
        step[f] = old_step[s]
        nxt[f] = old_next[s]
        age[f] = old_age[s]
        n0[f] = old_n0[s]
        x0[f] = old_x0[s]
        moved += 1
    return moved


@njit(cache=True)
def _is_ws(c):
    return c == 32 or c == 9 or c == 13


@njit(cache=True)
def _match_key(buf, ks, ke, names, offs):
    """Index of the known key equal to buf[ks:ke], or -1."""
    n = ke - ks
    for k in range(offs.shape[0] - 1):
        a = offs[k]
        b = offs[k + 1]
        if b - a != n:
            continue
        same = True
        for t in range(n):
            if buf[ks + t] != names[a + t]:
                same = False
                break
        if same:
            return k
    return -1


@njit(cache=True)
def _parse_line(buf, p, e, names, offs, rec_i, rec_f):
    """Parse one flat JSON object in buf[p:e].  Returns True on success.

    Fills rec_i = [key hash, step, model, next_model] and rec_f = [committed_tokens].
    Known keys (order of ``offs``): request_id, step, model, next_model,
    committed_tokens.  Other keys are skipped when their values are scalars.
    """
    seen = 0
    while p < e and _is_ws(buf[p]):
        p += 1
    if p >= e or buf[p] != 123:  # '{'
        return False
    p += 1
    while True:
        while p < e and _is_ws(buf[p]):
            p += 1
        if p >= e or buf[p] != 34:  # '"'
            return False
        p += 1
        ks = p
        while p < e and buf[p] != 34:
            if buf[p] == 92:  # backslash in a key: slow path
                return False
            p += 1
        if p >= e:
            return False
        kidx = _match_key(buf, ks, p, names, offs)
        p += 1
        while p < e and _is_ws(buf[p]):
            p += 1
        if p >= e or buf[p] != 58:  # ':'
            return False
        p += 1
        while p < e and _is_ws(buf[p]):
            p += 1
        if p >= e:
            return False
        if kidx >= 0:
            if (seen >> kidx) & 1:
                return False  # duplicate key
            seen |= 1 << kidx
        c = buf[p]
        if c == 34:  # string value
            p += 1
            vs = p
            while p < e and buf[p] != 34:
                if buf[p] == 92:
                    if kidx >= 0:
                        return False
                    p += 1
                p += 1
            if p >= e:
                return False
            if kidx == 0:
                rec_i[0] = hash_bytes(buf, vs, p, 115)  # 's'
            elif kidx > 0:
                return False
            p += 1
        elif c == 45 or (c >= 48 and c <= 57):  # number
            vs = p
            neg = False
            if c == 45:
                neg = True
                p += 1
            ds = p
            mant = np.int64(0)
            nd = 0
            while p < e and buf[p] >= 48 and buf[p] <= 57:
                if nd < 18:
                    mant = mant * 10 + (buf[p] - 48)
                nd += 1
                p += 1
            if p == ds:
                return False
            if buf[ds] == 48 and p - ds > 1:
                return False  # leading zero: not JSON
            is_int = True
            scale = nd - 18 if nd > 18 else 0
            if p < e and buf[p] == 46:  # '.'
                is_int = False
                p += 1
                fs = p
                while p < e and buf[p] >= 48 and buf[p] <= 57:
                    if nd < 18:
                        mant = mant * 10 + (buf[p] - 48)
                        nd += 1
                        scale -= 1
                    p += 1
                if p == fs:
                    return False
            if p < e and (buf[p] == 101 or buf[p] == 69):  # exponent
                is_int = False
                p += 1
                eneg = False
                if p < e and (buf[p] == 43 or buf[p] == 45):
                    eneg = buf[p] == 45
                    p += 1
                es = p
                ev = 0
                while p < e and buf[p] >= 48 and buf[p] <= 57:
                    if ev < 100000:
                        ev = ev * 10 + (buf[p] - 48)
                    p += 1
                if p == es:
                    return False
                scale += -ev if eneg else ev
            if kidx == 0:
                if not is_int or nd > 18:
                    return False  # the slow path checks the id's range
                rec_i[0] = hash_bytes(buf, vs, p, 105)  # 'i'
            elif kidx >= 1 and kidx <= 3:
                if not is_int or nd > 18:
                    return False
                rec_i[kidx] = -mant if neg else mant
            elif kidx == 4:
                v = float(mant) * 10.0 ** scale
                rec_f[0] = -v if neg else v
        elif c == 116 or c == 102 or c == 110:  # true / false / null
            if kidx >= 0:
                return False
            while p < e and buf[p] >= 97 and buf[p] <= 122:
                p += 1
        else:
            return False  # nested object/array or garbage: slow path
        while p < e and _is_ws(buf[p]):
            p += 1
        if p >= e:
            return False
        if buf[p] == 44:  # ','
            p += 1
            continue
        if buf[p] == 125:  # '}'
            p += 1
            break
        return False
    while p < e and _is_ws(buf[p]):
        p += 1
    if p != e or seen != 31:
        return False
    if (rec_i[1] < 0 or rec_i[1] > 4611686018427387904 or rec_i[3] < -1 or rec_i[2] < 0 or rec_f[0] < 0.0
            or rec_f[0] != rec_f[0] or rec_f[0] > 1e12):
        return False  # outside the format's ranges (tr_core.routing_trace): let the slow path name the field
    return True


@njit(cache=True)
def consume_lines(buf, n, names, offs, mcap, table, stats):
    """Parse and fold every complete (newline-terminated) line of ``buf[:n]``.

    Stops early with STATUS_FALLBACK / STATUS_TABLE_FULL / STATUS_ERROR at the
    start of the line concerned (``out[OUT_POS]``); ``out[OUT_LINES]`` counts the
    lines fully consumed in this call.
    """
    out = stats.out
    rec_i = np.zeros(4, dtype=np.int64)
    rec_f = np.zeros(1, dtype=np.float64)
    p = 0
    lines = 0
    out[OUT_STATUS] = STATUS_DONE
    while p < n:
        e = p
        while e < n and buf[e] != 10:
            e += 1
        if e >= n:
            break  # incomplete last line: keep for the next buffer
        blank = True
        for t in range(p, e):
            if not _is_ws(buf[t]):
                blank = False
                break
        if not blank:
            if not _parse_line(buf, p, e, names, offs, rec_i, rec_f):
                out[OUT_STATUS] = STATUS_FALLBACK
                out[OUT_POS] = p
                out[OUT_ERR_END] = e
                out[OUT_LINES] = lines
                return
            code = apply_record(rec_i[0], rec_i[1], rec_i[2], rec_i[3], rec_f[0], mcap, table, stats)
            if code != ERR_NONE:
                out[OUT_STATUS] = STATUS_TABLE_FULL if code < 0 else STATUS_ERROR
                out[OUT_ERR] = code
                out[OUT_POS] = p
                out[OUT_ERR_END] = e
                out[OUT_LINES] = lines
                return
        lines += 1
        p = e + 1
    out[OUT_POS] = p
    out[OUT_LINES] = lines


@njit(cache=True)
def simulate_routes(P, n_steps, first_model, u):
    """Model sequence of one request under a Markov routing matrix.

    ``u`` holds ``n_steps`` uniforms; returns (models, next_models) of length n_steps.
    """
    M = P.shape[0]
    cum = np.empty((M, M))
    for i in range(M):
        acc = 0.0
        for j in range(M):
            acc += P[i, j]
            cum[i, j] = acc
        cum[i, M - 1] = 1.0
    models = np.empty(n_steps, dtype=np.int64)
    nexts = np.empty(n_steps, dtype=np.int64)
    m = first_model
    for t in range(n_steps):
        models[t] = m
        j = 0
        while u[t] >= cum[m, j] and j < M - 1:
            j += 1
        nexts[t] = j
        m = j
    return models, nexts


@njit(cache=True)
def _put_text(out, p, text):
    """Write the ASCII ``text`` into ``out`` at ``p``; returns the next position."""
    for ch in text:
        out[p] = ord(ch)
        p += 1
    return p


@njit(cache=True)
def _put_int(out, p, v, digits):
    """Write the decimal integer ``v`` into ``out`` at ``p`` (``digits``: scratch); returns the next position."""
    if v < 0:
        out[p] = 45
        p += 1
        v = -v
    nd = 0
    while True:
        digits[nd] = 48 + v % 10
        nd += 1
        v //= 10
        if v == 0:
            break
    for k in range(nd - 1, -1, -1):
        out[p] = digits[k]
        p += 1
    return p


@njit(cache=True)
def format_trace_lines(rid, step, model, nxt, tokens_int, out):
    """Write canonical trace lines (integer request ids and tokens) into ``out``; returns bytes used."""
    p = 0
    digits = np.empty(24, dtype=np.uint8)
    for r in range(rid.shape[0]):
        p = _put_int(out, _put_text(out, p, '{"request_id": '), rid[r], digits)
        p = _put_int(out, _put_text(out, p, ', "step": '), step[r], digits)
        p = _put_int(out, _put_text(out, p, ', "model": '), model[r], digits)
        p = _put_int(out, _put_text(out, p, ', "next_model": '), nxt[r], digits)
        p = _put_int(out, _put_text(out, p, ', "committed_tokens": '), tokens_int[r], digits)
        out[p] = 125
        out[p + 1] = 10
        p += 2
    return p
