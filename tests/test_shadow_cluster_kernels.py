"""The simulator's own copies of the iteration latency and of Algorithm 1 agree with part 1's compiled functions."""

from __future__ import annotations

import numpy as np
import pytest

from shadow_prefill import _kernels as part1
from shadow_prefill.budget import shadow_budget
from shadow_prefill.cluster import _kernels as K
from shadow_prefill.latency import build_roofline, fit_linear_model

LMS = [build_roofline("qwen2.5-7b", "h100"), build_roofline("llama-3.1-70b", "h100"),
       build_roofline("mixtral-8x7b", "h200"),
       fit_linear_model([{"n_decode": 1, "time_s": 0.01}, {"n_decode": 64, "decode_context": 64000, "time_s": 0.03},
                         {"prefill_tokens": 2048, "prefill_pairs": 2048 * 1024.5, "time_s": 0.2},
                         {"n_decode": 8, "prefill_tokens": 512, "time_s": 0.06}], name="fit")]


@pytest.mark.parametrize("lm", LMS, ids=lambda m: m.name)
def test_iteration_time_matches_part1(lm):
    rng = np.random.default_rng(0)
    for _ in range(300):
        nd = float(rng.integers(0, 200))
        dctx = float(nd * rng.integers(1, 30000))
        pt = float(rng.integers(0, 4096)) if rng.random() < 0.7 else 0.0
        c = float(rng.integers(0, 60000))
        pp = pt * (c + (pt + 1) / 2)
        pk = c + pt if pt else 0.0
        nc = float(pt > 0)
        a = K.iteration_time(lm.params, nd, dctx, pt, pp, pk, nc)
        b = part1.iteration_time(lm.params, nd, dctx, pt, pp, pk, nc)
        assert a == b
    for p, c in ((1, 0), (2048, 0), (5000, 100), (70000, 3000)):
        assert K.prefill_time(lm.params, p, c, 2048) == part1.prefill_time(lm.params, p, c, 2048)


@pytest.mark.parametrize("lm", LMS[:3], ids=lambda m: m.name)
def test_budget_matches_part1_algorithm1(lm):
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
        qb = bool(rng.random() < 0.1)
        routed = bool(rng.random() < 0.3)
        harvest = bool(rng.random() < 0.3)
        credit = float(rng.uniform(0, 0.02))
        sc = int(rng.integers(0, 30000))
        free_kv = int(rng.integers(0, 5000))
        room = int(rng.integers(0, 2048))
        pending = int(rng.integers(0, 6000))
        beta, margin, n_min = 0.5, 0.1, 256
        n1, b1, br1, _, _ = shadow_budget(now, dec_first, dec_iters, dec_tpot, dec_ctx, pf_arr, pf_ttft, pf_rem,
                                          pf_tok, pf_ctx, qb, routed, credit, lm.params, T, sc, free_kv, room,
                                          pending, beta, margin, n_min, harvest)
        n2, b2, br2 = K.budget_tokens(now, K.Batch(dec_first, dec_iters, dec_tpot, dec_ctx, pf_arr, pf_ttft, pf_rem,
                                                   pf_tok, pf_ctx),
                                      qb, routed, credit, lm.params, T, K.Room(sc, free_kv, room, pending),
                                      K.Controller(beta, margin, n_min, harvest))
        assert n1 == n2, trial
        if not qb:
            assert br1 == br2 and b1 == pytest.approx(b2)


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
