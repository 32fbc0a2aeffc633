"""The public routing matrix of ../shared/data (read in place, never copied); skipped where it is absent."""

from __future__ import annotations

import os

import pytest

from shadow_prefill.builder import MatrixWorkload
from shadow_prefill.matrix import load_matrix
from shadow_prefill.stats import compute_switch_tax

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data", "llmrouter-dcrouter")
pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "train.json")),
                                reason=f"public data not present at {os.path.normpath(DATA)} (shared/ is beside the "
                                       f"project only on the development machines)")


def test_dcrouter_test_split_every_pair():
    m = load_matrix(os.path.join(DATA, "test.json"))
    assert m.n_queries == 500 and len(m.model_names) == 9
    pairs = m.all_pairs()
    assert len(pairs) == 36
    w = MatrixWorkload(m, seed=0)
    for p in pairs:
        st = compute_switch_tax(w.sessions(p), prices=m.prices)
        assert st["calls"] == 500
        assert 0.0 <= st["switch_share"] < 0.6
        if st["switch_calls"]:
            # the switch tax: switch calls hit less of their prompt than same-model calls
            assert st["hit_switch"] < st["hit_same"]
        assert 0.7 < st["hit_same"] < 0.95
        assert st["cost"]["routed_usd"] <= st["cost"]["no_cache_usd"]
