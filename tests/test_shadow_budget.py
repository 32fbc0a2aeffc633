"""Every branch of the shadow budget (Algorithm 1) and of the credit rule, with hand-computed values.

The latency model is linear so the arithmetic is short: an iteration takes
10 ms plus 10 us per token (decode or prefill).  The TPOT SLO is T = 40.01 ms,
so the iteration cap is beta * T = 20.005 ms (the odd 5 us keeps every bound
half a token away from an integer, out of floating-point reach).
"""

from __future__ import annotations

import numpy as np
import pytest

from shadow_prefill.budget import (HARVEST, HARVEST_SLO, BudgetBatch, BudgetParams, Controller, CreditAccount, Decode,
                                   PrefillChunk, ShadowRoom, credit_update, decide_shadow_tokens, shadow_budget)
from shadow_prefill.errors import ShadowError
from shadow_prefill.latency import LM_SIZE, LatencyModel, build_roofline


def linear(c0=0.010, per_token=1e-5, per_pair=0.0) -> LatencyModel:
    p = np.zeros(LM_SIZE)
    p[0] = 1.0          # linear kind
    p[1] = c0
    p[2] = per_token    # per decode
    p[4] = per_token    # per prefill token
    p[5] = per_pair
    return LatencyModel(kind="linear", params=p, name="unit")


LM = linear()
T = 0.04001
FAR = [Decode(first_token_s=9.9, iterations=100, tpot_slo_s=0.05, context=1000) for _ in range(100)]  # now = 10


def test_queue_branch_returns_zero():
    for kw in ({"queue_nonempty": True}, {"admission_blocked": True}):
        d = decide_shadow_tokens(10.0, FAR, [], lm=LM, tpot_slo_s=T, **kw)
        assert (d.tokens, d.branch) == (0, "queue")
        assert d.base_s == pytest.approx(0.011)
        assert d.stretch_s == 0.0
    # also on an idle instance
    assert decide_shadow_tokens(0.0, [], [], lm=LM, tpot_slo_s=T, queue_nonempty=True).tokens == 0


def test_idle_branch():
    # 0.010 + 1e-5 n <= 0.020005  ->  n <= 1000.5
    d = decide_shadow_tokens(0.0, [], [], lm=LM, tpot_slo_s=T)
    assert (d.tokens, d.branch) == (1000, "idle")
    assert d.budget_s == pytest.approx(0.020005)
    assert d.base_s == 0.0 and d.with_shadow_s == pytest.approx(0.020)
    # limits: free shadow KV, the iteration's token budget, pending shadow tokens
    assert decide_shadow_tokens(0.0, [], [], lm=LM, tpot_slo_s=T, free_shadow_kv=700).tokens == 700
    assert decide_shadow_tokens(0.0, [], [], lm=LM, tpot_slo_s=T, token_budget_left=300).tokens == 300
    assert decide_shadow_tokens(0.0, [], [], lm=LM, tpot_slo_s=T, pending_shadow_tokens=100).tokens == 0   # < n_min 256
    assert decide_shadow_tokens(0.0, [], [], lm=LM, tpot_slo_s=T, free_shadow_kv=255).tokens == 0
    assert decide_shadow_tokens(0.0, [], [], lm=LM, tpot_slo_s=T, free_shadow_kv=256).tokens == 256
    # a minimum chunk that no longer fits: 0.010 + 1e-5 * 1024 > 0.020005
    assert decide_shadow_tokens(0.0, [], [], lm=LM, tpot_slo_s=T, params=BudgetParams(n_min=1024)).tokens == 0
    # beta scales the cap: beta = 0.25 -> 0.0100025 -> n <= 0.25
    assert decide_shadow_tokens(0.0, [], [], lm=LM, tpot_slo_s=T, params=BudgetParams(beta=0.25, n_min=1)).tokens == 0


def test_slack_branch_capped_by_beta():
    # requests far ahead of their SLO: b = beta T; base = 0.010 + 100e-5 = 0.011; n <= 900.5
    d = decide_shadow_tokens(10.0, FAR, [], lm=LM, tpot_slo_s=T)
    assert (d.tokens, d.branch) == (900, "slack")
    assert d.budget_s == pytest.approx(0.020005)
    assert d.with_shadow_s == pytest.approx(0.020)
    assert d.stretch_s == pytest.approx(0.009)


def test_slack_branch_decode_limited():
    # one decode: first token at 0, 4 iterations done, T_r = 50 ms, margin 0.1, now = 0.210003
    # sigma = 0.9 * 0.05 * 5 - 0.210003 = 0.014997; base = 0.01001; n <= 498.7
    dec = [Decode(first_token_s=0.0, iterations=4, tpot_slo_s=0.05, context=500)]
    d = decide_shadow_tokens(0.210003, dec, [], lm=LM, tpot_slo_s=T)
    assert (d.tokens, d.branch) == (498, "slack")
    assert d.budget_s == pytest.approx(0.014997)
    # the smallest slack in the batch wins
    d2 = decide_shadow_tokens(0.210003, dec + FAR[:1], [], lm=LM, tpot_slo_s=T)
    assert d2.budget_s == pytest.approx(0.014997)
    # a larger margin shrinks it: margin 0.2 -> sigma = 0.8 * 0.25 - 0.210003 < 0
    d3 = decide_shadow_tokens(0.210003, dec, [], lm=LM, tpot_slo_s=T, params=BudgetParams(margin=0.2))
    assert d3.tokens == 0 and d3.budget_s < 0


def test_slack_branch_prefill_limited():
    # a prefilling request: arrived at 0, TTFT SLO 1 s, 0.3 s of prefill left, a 100-token chunk in the batch
    # sigma = 0.9 * 1.0 - 0.584997 - 0.3 = 0.015003; base = 0.010 + 100e-5 = 0.011; n <= 400.3
    ch = [PrefillChunk(arrival_s=0.0, ttft_slo_s=1.0, remaining_s=0.3, tokens=100, context=0)]
    d = decide_shadow_tokens(0.584997, [], ch, lm=LM, tpot_slo_s=T)
    assert (d.tokens, d.branch) == (400, "slack")
    assert d.budget_s == pytest.approx(0.015003)
    # past its slack: nothing
    late = decide_shadow_tokens(0.7, [], ch, lm=LM, tpot_slo_s=T)
    assert (late.tokens, late.branch) == (0, "slack")


def test_routed_branch_spends_credit_on_stretch():
    # base 0.011; the credit bounds the stretch: 1e-5 n <= 0.003005 -> n = 300
    d = decide_shadow_tokens(10.0, FAR, [], lm=LM, tpot_slo_s=T, routed_in_batch=True, credit_s=0.003005)
    assert (d.tokens, d.branch) == (300, "routed")
    assert d.stretch_s == pytest.approx(0.003)
    # credit above beta T is capped at beta T: n <= 2000.5
    assert decide_shadow_tokens(10.0, FAR, [], lm=LM, tpot_slo_s=T, routed_in_batch=True, credit_s=0.5).tokens == 2000
    # no credit, or too little for a minimum chunk (200 < 256): nothing
    assert decide_shadow_tokens(10.0, FAR, [], lm=LM, tpot_slo_s=T, routed_in_batch=True, credit_s=0.0).tokens == 0
    assert decide_shadow_tokens(10.0, FAR, [], lm=LM, tpot_slo_s=T, routed_in_batch=True, credit_s=0.002005).tokens == 0


def test_harvest_variant_uses_credit_on_every_busy_iteration():
    d = decide_shadow_tokens(10.0, FAR, [], lm=LM, tpot_slo_s=T, credit_s=0.003005, params=HARVEST)
    assert (d.tokens, d.branch) == (300, "harvest")
    assert decide_shadow_tokens(0.0, [], [], lm=LM, tpot_slo_s=T, params=HARVEST).branch == "idle"
    assert decide_shadow_tokens(10.0, FAR, [], lm=LM, tpot_slo_s=T, params=HARVEST, queue_nonempty=True).tokens == 0
    assert HARVEST.delta == 0.1 and HARVEST_SLO.delta == 0.025 and HARVEST_SLO.beta == 0.5


def test_shadow_chunk_attends_over_its_context():
    # t = 0.010 + 1e-8 * pairs; a chunk of n tokens over 10,000 cached has n (10000 + (n + 1) / 2) pairs
    # 99 * 10050 = 994,950 <= 1e6 < 100 * 10050.5: n = 99
    lm = linear(per_token=0.0, per_pair=1e-8)
    d = decide_shadow_tokens(0.0, [], [], lm=lm, tpot_slo_s=0.04, shadow_context=10_000, params=BudgetParams(n_min=64))
    assert d.tokens == 99
    assert decide_shadow_tokens(0.0, [], [], lm=lm, tpot_slo_s=0.04, shadow_context=0, params=BudgetParams(n_min=64)).tokens \
        == 1413  # n (n + 1) / 2 <= 1e6


def test_roofline_answer_is_the_largest_feasible():
    lm = build_roofline("qwen3-8b", "h100")
    tpot = lm.tpot_slo()
    dec = [Decode(first_token_s=0.0, iterations=60, tpot_slo_s=tpot, context=3000 + 50 * i) for i in range(16)]
    ch = [PrefillChunk(arrival_s=1.0, ttft_slo_s=2.0, remaining_s=0.05, tokens=100, context=4000)]
    kw = dict(lm=lm, tpot_slo_s=tpot, shadow_context=8000)
    d = decide_shadow_tokens(1.2, dec, ch, params=BudgetParams(n_min=1), **kw)
    assert d.branch == "slack" and d.tokens > 0
    assert d.with_shadow_s <= d.budget_s
    # one token more is infeasible: asking for a minimum chunk of n + 1 yields nothing
    assert decide_shadow_tokens(1.2, dec, ch, params=BudgetParams(n_min=d.tokens + 1), **kw).tokens == 0
    # the same through the array kernel
    batch = BudgetBatch(np.zeros(16), np.full(16, 60.0), np.full(16, tpot), np.array([x.context for x in dec], float),
                        np.array([1.0]), np.array([2.0]), np.array([0.05]), np.array([100.0]), np.array([4000.0]))
    n, b, br, base, t = shadow_budget(1.2, batch, False, False, 0.0, lm.params, tpot,
                                      ShadowRoom(8000, 1 << 40, 1 << 40, 1 << 40), Controller(0.5, 0.1, 1, False))
    assert (n, br) == (d.tokens, 3) and t == pytest.approx(d.with_shadow_s) and base == pytest.approx(d.base_s)


def test_credit_update_rule():
    # accrue delta x duration of a decode-only iteration
    assert credit_update(0.001, 0.012, True, 0.0, 0.025, 0.02) == pytest.approx(0.0013)
    # pay for stretch; no accrual on an iteration with prefill chunks
    assert credit_update(0.0013, 0.015, False, 0.0005, 0.025, 0.02) == pytest.approx(0.0008)
    # capped at beta T
    assert credit_update(0.019, 0.1, True, 0.0, 0.025, 0.02) == pytest.approx(0.02)
    # never negative
    assert credit_update(0.0002, 0.01, False, 0.001, 0.025, 0.02) == 0.0
    acct = CreditAccount(tpot_slo_s=0.04)
    assert acct.cap_s == pytest.approx(0.02)
    for _ in range(40):
        acct.update(0.010, decode_only=True)
    assert acct.credit_s == pytest.approx(40 * 0.025 * 0.010)
    d = decide_shadow_tokens(10.0, FAR, [], lm=LM, tpot_slo_s=T, routed_in_batch=True, credit_s=acct.credit_s + 5e-6)
    assert d.tokens == 1000       # stretch 0.01 = 1000 tokens
    acct.update(d.base_s, decode_only=True, stretch_s=d.stretch_s)
    assert acct.credit_s == pytest.approx(0.025 * 0.011, abs=1e-9)
    assert CreditAccount(0.04, HARVEST).params.delta == 0.1


def test_parameter_checks():
    with pytest.raises(ShadowError):
        BudgetParams(beta=0)
    with pytest.raises(ShadowError):
        BudgetParams(margin=1.0)
    with pytest.raises(ShadowError):
        BudgetParams(delta=-0.1)
    with pytest.raises(ShadowError):
        BudgetParams(n_min=0)
    with pytest.raises(ShadowError):
        decide_shadow_tokens(0.0, [], [], lm=LM, tpot_slo_s=0.0)
    with pytest.raises(ShadowError):
        decide_shadow_tokens(0.0, [], [], lm=LM, tpot_slo_s=T, free_shadow_kv=-1)
