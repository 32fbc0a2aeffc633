"""The simulator compiles in part 1's iteration latency and Algorithm 1 (pinned by source digest), and its steps
of Algorithm 1 give what part 1's ``shadow_budget`` gives."""

from __future__ import annotations

import hashlib
import inspect

import numpy as np
import pytest

from shadow_prefill import _kernels as part1
from shadow_prefill.budget import BudgetBatch, Controller, ShadowRoom, shadow_budget
from shadow_prefill.cluster import _kernels as K
from shadow_prefill.latency import build_roofline, fit_linear_model

LMS = [build_roofline("qwen2.5-7b", "h100"), build_roofline("llama-3.1-70b", "h100"),
       build_roofline("mixtral-8x7b", "h200"),
       fit_linear_model([{"n_decode": 1, "time_s": 0.01}, {"n_decode": 64, "decode_context": 64000, "time_s": 0.03},
                         {"prefill_tokens": 2048, "prefill_pairs": 2048 * 1024.5, "time_s": 0.2},
                         {"n_decode": 8, "prefill_tokens": 512, "time_s": 0.06}], name="fit")]


def part1_source_digest() -> str:
    """SHA-256 of what the cluster kernels compile in from part 1: the kernels' source, the records' fields and
    the branch codes (numba freezes global constants into machine code)."""
    h = hashlib.sha256()
    for name in K.PART1_KERNELS:
        h.update(inspect.getsource(getattr(part1, name).py_func).encode())
    h.update(" ".join(part1.Slack._fields).encode())
    h.update(repr([part1.BRANCH_QUEUE, part1.BRANCH_IDLE, part1.BRANCH_ROUTED, part1.BRANCH_SLACK,
                   part1.BRANCH_HARVEST]).encode())
    return h.hexdigest()


def test_cluster_kernels_pin_the_part1_source_they_compile_in():
    # numba's disk cache of shadow_prefill/cluster/_kernels.py does not see edits of shadow_prefill/_kernels.py;
    # the pinned digest makes such an edit fail here until the cluster module is edited too (which recompiles it)
    got = part1_source_digest()
    assert K.PART1_SOURCE_SHA256 == got, (
        f"part 1's kernels changed: set PART1_SOURCE_SHA256 = {got!r} in shadow_prefill/cluster/_kernels.py")


def test_cluster_kernels_use_part1_latency_and_algorithm1():
    # one latency model and one Algorithm 1: the simulator calls part 1's kernels, not copies of them
    for name in K.PART1_KERNELS:
        assert getattr(K, name) is getattr(part1, name), name
    assert K.Slack is part1.Slack
    src = inspect.getsource(K)
    for name in K.PART1_KERNELS:
        assert f"def {name}(" not in src, name


@pytest.mark.parametrize("lm", LMS[:3], ids=lambda m: m.name)
def test_shadow_chunk_steps_match_part1_algorithm1(lm):
    """The simulator's steps (controller_bound on the batch's slack rows and base time, then largest_fit under
    the caps) give part 1's shadow_budget on random batches."""
    rng = np.random.default_rng(1)
    T = 0.05
    for trial in range(400):
        nd = int(rng.integers(0, 40))
        npf = int(rng.integers(0, 3))
        now = 100.0
        dec_first = now - rng.uniform(0, 5, nd)
        dec_iters = rng.integers(0, 300, nd).astype(float)
        dec_tpot = np.full(nd, T)
        dec_ctx = rng.integers(100, 20000, nd).astype(float)
        pf_arr = now - rng.uniform(0, 2, npf)
        pf_ttft = rng.uniform(1, 5, npf)
        pf_rem = rng.uniform(0, 1, npf)
        pf_tok = rng.integers(1, 2048, npf).astype(float)
        pf_ctx = rng.integers(0, 5000, npf).astype(float)
        routed = bool(rng.random() < 0.3)
        harvest = bool(rng.random() < 0.3)
        credit = float(rng.uniform(0, 0.02))
        sc = int(rng.integers(0, 30000))
        free_kv = int(rng.integers(0, 5000))
        room = int(rng.integers(0, 2048))
        pending = int(rng.integers(0, 6000))
        beta, margin, n_min = 0.5, 0.1, 256
        n1, b1, br1, base1, t1 = shadow_budget(
            now, BudgetBatch(dec_first, dec_iters, dec_tpot, dec_ctx, pf_arr, pf_ttft, pf_rem, pf_tok, pf_ctx),
            False, routed, credit, lm.params, T, ShadowRoom(sc, free_kv, room, pending),
            Controller(beta, margin, n_min, harvest))
        # the features the simulator's scratch sums hold (_add_chunk) and its base time
        dctx = float(dec_ctx.sum())
        pt = float(pf_tok.sum())
        pp = float(sum(q * (c + (q + 1) * 0.5) for q, c in zip(pf_tok, pf_ctx)))
        pk = float(sum(c + q for q, c in zip(pf_tok, pf_ctx)))
        base = K.iteration_time(lm.params, float(nd), dctx, pt, pp, pk, float(npf))
        assert base == pytest.approx(base1, rel=1e-12)
        b2, br2, limit = K.controller_bound(now, nd + npf == 0, harvest, routed, credit, beta * T, base,
                                            K.Slack(dec_first, dec_iters, dec_tpot, pf_arr, pf_ttft, pf_rem), nd,
                                            npf, margin)
        assert br1 == br2 and b1 == pytest.approx(b2), trial
        n2 = 0
        if b2 > 0.0:
            n2, t2 = K.largest_fit(lm.params, float(nd), dctx, pt, pp, pk, float(npf), float(sc),
                                   min(room, free_kv, pending), n_min, limit)
            if n2 > 0:
                assert t2 == pytest.approx(t1, rel=1e-12)
        assert n1 == n2, trial
    # a blocked queue takes nothing
    n, b, br, _, _ = shadow_budget(100.0, BudgetBatch(*([np.zeros(0)] * 9)), True, False, 0.0, lm.params, T,
                                   ShadowRoom(0, 5000, 5000, 5000), Controller(0.5, 0.1, 1, False))
    assert (n, b, br) == (0, 0.0, part1.BRANCH_QUEUE)


def test_heap_orders_by_time_then_id():
    rng = np.random.default_rng(2)
    t = rng.integers(0, 20, 200).astype(float)
    v = np.arange(200)
    ht = np.empty(201)
    hv = np.empty(201, np.int64)
    n = 0
    for a, b in zip(t, v):
        n = K._heap_push(ht, hv, n, a, b)
    got = []
    while n:
        got.append((ht[0], hv[0]))
        n = K._heap_pop(ht, hv, n)
    assert got == sorted(zip(t, v))


def test_request_slos_by_hand():
    lm = LMS[1]
    p = np.array([100, 5000, 60000], np.int64)
    ttft, tpot = K.request_slos(lm.params, p, 2048, 1.0, 5.0, 0.025, 5.0, 1.0)
    for k, x in enumerate(p):
        assert ttft[k] == pytest.approx(max(1.0, 5 * lm.prefill_time(int(x), 0, 2048)))
        assert tpot[k] == pytest.approx(max(0.025, 5 * lm.decode_time(1, float(x))))
    ttft2, _ = K.request_slos(lm.params, p, 2048, 1.0, 5.0, 0.025, 5.0, 2.0)
    assert np.allclose(ttft2, 2 * ttft)
