"""The cluster kernel, split into compiled event helpers, gives bit-identical outputs to the monolithic kernel.

``fixtures/shadow_cluster_kernel_outputs.json`` holds SHA-256 digests of every
output array of 25 fixed-seed runs, written by ``shadow_kernel_cases.py`` from
the kernel before the split (issue 15, item 4).  Issue 16 then changed one rule (a session's copy that shadow
work extends keeps its class; only the shadow tail is evict-first); the fixture replays with the old rule
(``shadow_extends_whole_copy=True``, and no cold-first eviction or reclaim guard), which must leave every output
unchanged; likewise issue 26's credit gate (``credit_gate=0``) and random session draw (``session_draw="in-order"``).
"""

from __future__ import annotations

import json

import pytest

import shadow_kernel_cases as kc


@pytest.fixture(scope="module")
def expected():
    with open(kc.FIXTURE) as f:
        doc = json.load(f)
    assert doc["kind"] == "shadow_cluster_kernel_outputs"
    return doc["cases"]


@pytest.fixture(scope="module")
def cases():
    return {c[0]: c for c in kc.cases()}


def test_fixture_names_every_case(expected, cases):
    assert set(expected) == set(cases)


@pytest.mark.parametrize("name", [c for c in ("default/No Shadow", "default/Harvest", "default/Harvest-SLO+Host",
                                              "default/Dedicated", "default/Eager", "default/Oracle",
                                              "tight/No Shadow", "tight/Host Tier", "tight/Harvest",
                                              "tight/Harvest-SLO", "tight/Harvest-SLO+Host", "tight/Dedicated",
                                              "tight/Eager", "tight/Oracle+Host", "three/Harvest-SLO+Host",
                                              "three/Harvest-SLO+Host, top-1", "three/Dedicated", "three/Eager")])
def test_outputs_identical_to_fixture(name, expected, cases):
    from shadow_prefill.cluster.sim import simulate_cluster
    _, ss, cfg, a, sc, cap = cases[name]
    got = kc.digest(simulate_cluster(ss, kc.legacy(cfg), a, sc, capacity=cap))
    want = expected[name]
    for k in kc.ARRAYS:
        assert got[k] == want[k], f"{name}: {k} differs from the pre-split kernel"
    assert got["invariant_errors"] == 0.0
