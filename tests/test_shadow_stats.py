"""Switch-tax statistics: costs and isolated latencies by hand on a six-call session."""

from __future__ import annotations

import numpy as np
import pytest

from shadow_prefill.errors import ShadowError
from shadow_prefill.latency import LM_SIZE, LatencyModel
from shadow_prefill.matrix import ModelPrice
from shadow_prefill.sessions import Call, SessionSet
from shadow_prefill.stats import ReplayParams, flatten_stats, compute_switch_tax

# model, prompt, new input, output: hits (unbounded) are 0, 110, 0, 180, 20, 20 (see test_shadow_sessions)
CALLS = [Call("A", 0, "S", 100, 100, 10), Call("A", 1, "S", 160, 50, 20), Call("A", 2, "L", 220, 40, 5),
         Call("A", 3, "S", 250, 25, 10), Call("A", 4, "S", 300, 280, 10, append_only=False),
         Call("A", 5, "L", 340, 30, 5)]
PRICES = {"S": ModelPrice(1.0, 2.0), "L": ModelPrice(10.0, 20.0)}


def test_costs_by_hand():
    ss = SessionSet.from_calls(CALLS)
    st = compute_switch_tax(ss, prices=PRICES, cached_fraction=0.1, cache_capacity=None)
    c = st["cost"]
    # S: billed input 100 + (50 + 0.1*110) + (70 + 0.1*180) + (280 + 0.1*20) = 531 at $1/M, output 50 at $2/M
    # L: billed input 220 + (320 + 0.1*20) = 542 at $10/M, output 10 at $20/M
    assert c["routed_usd"] == pytest.approx((531 + 100 + 5420 + 200) / 1e6)
    assert c["billed_input_tokens"] == pytest.approx(531 + 542)
    assert c["no_cache_usd"] == pytest.approx((810 + 100 + 5600 + 200) / 1e6)
    # switch calls lose (history - hit) tokens of discount: 180 on L, 45 on S, 290 on L
    assert c["switch_tax_usd"] == pytest.approx((180 * 10 + 45 * 1 + 290 * 10) * 0.9 / 1e6)
    # every call on one model: new inputs 525 at full price, histories 845 at 10%, outputs 60
    assert c["only_usd"]["S"] == pytest.approx((525 + 84.5) * 1.0 / 1e6 + 60 * 2.0 / 1e6)
    assert c["only_usd"]["L"] == pytest.approx((525 + 84.5) * 10.0 / 1e6 + 60 * 20.0 / 1e6)
    assert c["cached_input_tokens"] == 330 and c["input_tokens"] == 1370
    # cached input at full price: the routed cost equals the no-cache cost
    st1 = compute_switch_tax(ss, prices=PRICES, cached_fraction=1.0, cache_capacity=None)
    assert st1["cost"]["routed_usd"] == pytest.approx(st1["cost"]["no_cache_usd"])
    assert st["calls_per_model"] == {"S": 4, "L": 2}
    with pytest.raises(ShadowError, match="no price"):
        compute_switch_tax(ss, prices={"S": PRICES["S"]})
    with pytest.raises(ShadowError, match="cached fraction"):
        compute_switch_tax(ss, cached_fraction=1.5)


def test_isolated_latency_by_hand():
    p = np.zeros(LM_SIZE)
    p[0], p[1], p[4] = 1.0, 0.010, 1e-4  # linear: 10 ms per iteration + 0.1 ms per prefill token
    lm = LatencyModel(kind="linear", params=p)
    st = compute_switch_tax(SessionSet.from_calls(CALLS), latency={"S": lm, "L": lm}, cache_capacity=None)
    lt = st["latency"]
    # uncached tokens 100, 50, 220, 70, 280, 320 -> TTFT = 0.01 + 1e-4 q; then (O - 1) decode steps of 10 ms
    ttft = [0.02, 0.015, 0.032, 0.017, 0.038, 0.042]
    lat = [t + (o - 1) * 0.01 for t, o in zip(ttft, [10, 20, 5, 10, 10, 5])]
    assert lt["ttft_switch_s"] == pytest.approx(np.mean([ttft[i] for i in (2, 3, 5)]))
    assert lt["latency_same_s"] == pytest.approx(np.mean([lat[i] for i in (1, 4)]))
    assert lt["latency_all_s"] == pytest.approx(np.mean(lat))
    assert lt["switch_slowdown"] == pytest.approx(np.mean([lat[i] for i in (2, 3, 5)]) / np.mean([lat[1], lat[4]]))
    with pytest.raises(ShadowError, match="no latency model"):
        compute_switch_tax(SessionSet.from_calls(CALLS), latency={"S": lm})


def test_capacity_columns_and_accuracy():
    calls = [Call("A", 0, "S", 100, 100, 10, score=1.0), Call("A", 1, "S", 160, 50, 20, score=0.0)]
    ss = SessionSet.from_calls(calls)
    st = compute_switch_tax(ss, cache_capacity=50, replay=ReplayParams(seed=1))
    assert st["hit_all"] == pytest.approx(110 / 260)
    assert st["hit_all_cap"] == pytest.approx(50 / 260)     # the entry keeps its first 50 tokens
    assert st["cache_capacity_tokens"] == {"S": 50}
    assert st["accuracy"] == {"routed": 0.5}
    assert st["hit_switch"] is None and st["prompt_switch_mean_tokens"] is None
    flat = flatten_stats(st)
    assert flat["cost.cached_fraction"] == 0.1 and flat["models"] == "S"
