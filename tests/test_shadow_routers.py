"""The paper's router variants over a routing matrix (max accuracy, random) and the paper-calibrated presets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from shadow_prefill.builder import MatrixWorkload, WORKLOAD_PRESETS, generate_synthetic_sessions, workload_preset
from shadow_prefill.errors import ShadowError
from shadow_prefill.matrix import load_matrix
from shadow_prefill.stats import compute_switch_tax

MODELS = {"tiny": {"size": "1B", "input_price": 0.1, "output_price": 0.1},
          "big": {"size": "70B", "input_price": 1.0, "output_price": 2.0}}


@pytest.fixture
def matrix(tmp_path):
    rng = np.random.default_rng(5)
    qs = [{"question": "q" * int(rng.integers(10, 400)),
           "scores": {"tiny": float(rng.random()), "big": float(rng.random())}} for _ in range(400)]
    (tmp_path / "m.json").write_text(json.dumps(qs))
    (tmp_path / "models.json").write_text(json.dumps(MODELS))
    return load_matrix(str(tmp_path / "m.json"))


def test_max_accuracy_takes_the_best_score(matrix):
    pair = matrix.ordered_pair("tiny", "big")
    w = MatrixWorkload(matrix, seed=0, policy="max-accuracy")
    ch = w.route(pair)
    idx = [matrix.model_index(x) for x in pair]
    s = matrix.scores[:, idx]
    assert np.array_equal(ch, np.argmax(s, axis=1))  # continuous scores: no ties
    # it is at least as accurate as accuracy per cost, which trades accuracy for price
    acc = MatrixWorkload(matrix, seed=0).accuracy(pair)["routed"]
    assert w.accuracy(pair)["routed"] >= acc
    assert w.sessions(pair).meta["policy"] == "max-accuracy"


def test_random_router_is_uniform_and_reproducible(matrix):
    pair = matrix.ordered_pair("tiny", "big")
    a = MatrixWorkload(matrix, seed=3, policy="random").route(pair)
    b = MatrixWorkload(matrix, seed=3, policy="random").route(pair)
    assert np.array_equal(a, b)
    # binomial(400, 1/2): 4 standard deviations is 40 calls
    assert abs(int(a.sum()) - 200) <= 40
    st = compute_switch_tax(MatrixWorkload(matrix, seed=3, policy="random").sessions(pair))
    assert 0.35 < st["switch_share"] < 0.65
    with pytest.raises(ShadowError):
        MatrixWorkload(matrix, policy="oracle")


@pytest.mark.parametrize("name,lo_hi", [
    # the routing benchmarks (issue 26: mean switch prompt inside the benchmarks' 10-19K); the same-model hit
    # rate (91.7%) is above the paper's 80-89%: the heavy-tailed first input that gives the p99 is cached on
    # every later call (docs/shadow_prefill.md); in the cluster No Shadow's all-call hit rate is 77.4% (paper 75.0%)
    ("paper", {"switch_share": (0.19, 0.33), "switches_per_session_mean": (2.0, 4.1),
               "prompt_switch_mean_tokens": (10e3, 19e3), "prompt_switch_p99_tokens": (45e3, 113e3),
               "hit_switch": (0.44, 0.65)}),
    ("paper-onetask", {"switch_share": (0.19, 0.33), "switches_per_session_mean": (2.0, 4.1),
                       "prompt_switch_mean_tokens": (10e3, 36e3), "prompt_switch_p99_tokens": (45e3, 131e3),
                       "hit_same": (0.80, 0.89), "hit_switch": (0.44, 0.65)}),
    ("paper-coding", {"switch_share": (0.19, 0.33), "switches_per_session_mean": (1.8, 2.4),
                      "prompt_switch_mean_tokens": (0.7 * 63e3, 1.3 * 63e3),
                      "prompt_switch_p99_tokens": (0.7 * 131e3, 1.3 * 131e3), "hit_switch": (0.40, 0.50)}),
])
def test_presets_land_in_table1_ranges(name, lo_hi):
    assert name in WORKLOAD_PRESETS
    st = compute_switch_tax(generate_synthetic_sessions(workload_preset(name, n_sessions=800, seed=2)))
    for k, (lo, hi) in lo_hi.items():
        assert lo <= st[k] <= hi, f"{name}: {k} = {st[k]:.3f} outside [{lo}, {hi}]"
    with pytest.raises(ShadowError):
        workload_preset("nope")
