"""Compiled kernels against independent pure-Python implementations, on random inputs (hypothesis)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from shadow_prefill.budget import BudgetParams, Decode, PrefillChunk, decide_shadow_tokens
from shadow_prefill.builder import AgentLoopParams, LengthDist, LogNormal, SyntheticParams, generate_synthetic_sessions
from shadow_prefill.latency import LM_SIZE, LatencyModel, build_roofline
from shadow_prefill.stats import compute_prefix_hits


def reference_hits(ss, capacity, order):
    """Per-model LRU of session entries, written independently of the kernel (OrderedDict, no linked lists)."""
    M = ss.n_models
    sess = ss.session_of_call
    hist = ss.history
    cache = [OrderedDict() for _ in range(M)]  # session -> cached tokens, least recent first
    hits = np.zeros(ss.n_calls, dtype=np.int64)
    for i in order:
        s, m, h = int(sess[i]), int(ss.model[i]), int(hist[i])
        for mm in range(M):  # a rewritten history keeps only its first h tokens everywhere
            if s in cache[mm] and cache[mm][s] > h:
                if h == 0:
                    del cache[mm][s]
                else:
                    cache[mm][s] = h
        hits[i] = cache[m].get(s, 0)
        cache[m].pop(s, None)
        new = min(int(ss.prompt[i] + ss.output[i]), capacity)
        if new > 0:
            cache[m][s] = new
            while sum(cache[m].values()) > capacity:
                cache[m].popitem(last=False)
    return hits


def small_workload(seed, switch_prob, window):
    loop = AgentLoopParams(session_length=LengthDist.parse("uniform:1-8"), tool_tokens=LogNormal(300, 1.0),
                           output_tokens=LogNormal(100, 1.0), context_window=window, summary_tokens=200)
    return generate_synthetic_sessions(SyntheticParams(n_sessions=12, models=("a", "b", "c"), switch_prob=switch_prob,
                                                       first_input=LogNormal(500, 0.5),
                                                       step_input=LogNormal(50, 0.5), loop=loop, seed=seed))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), switch_prob=st.floats(0, 1), window=st.sampled_from([1000, 4000, 100_000]),
       capacity=st.integers(0, 20_000), order_seed=st.integers(0, 1000))
def test_lru_kernel_matches_reference(seed, switch_prob, window, capacity, order_seed):
    ss = small_workload(seed, switch_prob, window)
    # a random interleaving of the sessions that keeps each session in step order
    rng = np.random.default_rng(order_seed)
    owners = np.repeat(np.arange(ss.n_sessions), ss.lengths)
    rng.shuffle(owners)
    nxt = ss.offsets[:-1].copy()
    order = []
    for s in owners:
        order.append(int(nxt[s]))
        nxt[s] += 1
    got = compute_prefix_hits(ss, capacity, order=np.array(order))
    assert np.array_equal(got, reference_hits(ss, capacity, order))
    unbounded = compute_prefix_hits(ss)
    assert np.all(got <= unbounded) and np.all(unbounded <= ss.history)
    big = int((ss.prompt + ss.output).sum())
    assert np.array_equal(compute_prefix_hits(ss, big, order=np.array(order)), unbounded)


def reference_budget(now, decodes, chunks, lm, tpot, queue, routed, credit, free_kv, room, sctx, p: BudgetParams):
    """Algorithm 1 by linear scan over n (no binary search), from the paper's text."""
    if queue:
        return 0
    nd = len(decodes)
    dctx = sum(d.context for d in decodes)
    chunk_list = [(c.tokens, c.context) for c in chunks]
    base = lm.iteration_time(nd, dctx, chunk_list)

    def t(n):  # the shadow chunk adds tokens and attention but no logits row
        pt = sum(q for q, _ in chunk_list) + n
        pp = sum(q * (c + (q + 1) / 2) for q, c in chunk_list) + n * (sctx + (n + 1) / 2)
        pk = sum(c + q for q, c in chunk_list) + sctx + n
        nc = len([q for q, _ in chunk_list if q > 0])
        return float(lm_iteration(lm, nd, dctx, pt, pp, pk, nc))

    cap = p.beta * tpot
    if not decodes and not chunks:
        ok = lambda n: t(n) <= cap
    elif p.harvest or routed:
        ok = lambda n: t(n) - base <= min(credit, cap)
    else:
        sig = [(1 - p.margin) * d.tpot_slo_s * (d.iterations + 1) - (now - d.first_token_s) for d in decodes]
        sig += [(1 - p.margin) * c.ttft_slo_s - (now - c.arrival_s) - c.remaining_s for c in chunks]
        b = min([cap] + sig)
        ok = lambda n: t(n) <= b
    n = 0
    for k in range(1, min(free_kv, room) + 1):
        if ok(k):
            n = k
        else:
            break
    return n if n >= p.n_min else 0


def lm_iteration(lm, *features):
    from shadow_prefill._kernels import iteration_time
    return iteration_time(lm.params, *map(float, features))


@settings(max_examples=40, deadline=None)
@given(n_dec=st.integers(0, 6), n_pf=st.integers(0, 2), now=st.floats(0.5, 2.0), credit=st.floats(0, 0.02),
       routed=st.booleans(), harvest=st.booleans(), queue=st.booleans(), free_kv=st.integers(0, 600),
       room=st.integers(0, 600), sctx=st.integers(0, 5000), n_min=st.integers(1, 64), seed=st.integers(0, 1000),
       linear=st.booleans())
def test_budget_matches_linear_scan(n_dec, n_pf, now, credit, routed, harvest, queue, free_kv, room, sctx, n_min,
                                    seed, linear):
    rng = np.random.default_rng(seed)
    if linear:
        prm = np.zeros(LM_SIZE)
        prm[0], prm[1], prm[2], prm[4], prm[5] = 1.0, 0.004, 2e-5, 1e-5, 1e-9
        lm = LatencyModel(kind="linear", params=prm)
    else:
        lm = ROOFLINE
    tpot = 0.03
    decodes = [Decode(float(now - rng.uniform(0, 1.0)), int(rng.integers(0, 60)), tpot, int(rng.integers(10, 4000)))
               for _ in range(n_dec)]
    chunks = [PrefillChunk(float(now - rng.uniform(0, 0.5)), 1.0, float(rng.uniform(0, 0.3)),
                           int(rng.integers(1, 300)), int(rng.integers(0, 3000))) for _ in range(n_pf)]
    p = BudgetParams(n_min=n_min, harvest=harvest, delta=0.1 if harvest else 0.025)
    d = decide_shadow_tokens(now, decodes, chunks, lm=lm, tpot_slo_s=tpot, queue_nonempty=queue,
                             routed_in_batch=routed, credit_s=credit, free_shadow_kv=free_kv, token_budget_left=room,
                             shadow_context=sctx, params=p)
    want = reference_budget(now, decodes, chunks, lm, tpot, queue, routed, credit, free_kv, room, sctx, p)
    assert d.tokens == want


ROOFLINE = build_roofline("qwen3-0.6b", "h100")


@pytest.mark.parametrize("seed", range(3))
def test_hits_never_exceed_history_on_compacted_sessions(seed):
    ss = small_workload(seed, 0.5, 1000)  # small window: many compactions (rewritten histories)
    assert not ss.append_only.all()
    h = compute_prefix_hits(ss)
    assert np.all(h <= ss.history)
    assert np.all(h[~ss.append_only] == 0)  # a compaction leaves nothing in common
