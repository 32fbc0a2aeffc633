"""The engine's shared kernels exist once, and numba's cache sees every edit of them.

``optimizer/_kernels.py`` and ``simulator/_kernels.py`` call dtmc's hash table, state packing and launch
law (``dtmc/_kernels.py``) instead of keeping copies.  numba's on-disk cache keys a function on its own
file only, so each consumer carries ``_DTMC_KERNELS_SHA``, the sha256 of ``dtmc/_kernels.py``: this test
fails when it is stale, and updating it edits the consumer, which invalidates the consumer's cache.
"""

import hashlib
import math
import os

import numpy as np
import pytest

from dtmc import _kernels as D
from dtmc.lowering import outcome_table
from optimizer import _kernels as O
from simulator import _kernels as S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RNG = np.random.default_rng(25)


def _sha(path):
    with open(os.path.join(ROOT, path), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.mark.parametrize("consumer", [O, S], ids=["optimizer", "simulator"])
def test_cache_stamp_is_current(consumer):
    assert consumer._DTMC_KERNELS_SHA == _sha("dtmc/_kernels.py"), (
        f"dtmc/_kernels.py changed: set _DTMC_KERNELS_SHA in {consumer.__name__.replace('.', '/')}.py to "
        f"{_sha('dtmc/_kernels.py')!r} (that edit also refreshes its numba cache)")


def test_one_copy_of_each_shared_kernel():
    for name, mine in (("_mix", "_mix"), ("_table_find_or_insert", "_find"), ("_table_rebuild", "_rehash"),
                       ("_grow", "_grow"), ("_encode", "_pack"), ("_decode", "_unpack"),
                       ("_launch_mask", "_launch_mask"), ("corun_at_launch", "corun_at_launch")):
        assert getattr(O, mine) is getattr(D, name), name
    assert S.corun_at_launch is D.corun_at_launch
    assert O.EMPTY == D.EMPTY and O.ChainTables is D.ChainTables


@pytest.mark.parametrize("N, M", [(1, 2), (7, 2), (6, 3), (4, 4)])
def test_outcome_tables_agree(N, M):
    # the chain weights outcomes with lgamma, the decision processes with summed logs: the same table to
    # rounding
    P = RNG.random((M, M))
    P[0, M - 1] = 0.0  # a zero-probability destination: its outcomes are exactly 0 on both sides
    P /= P.sum(axis=1, keepdims=True)
    offsets, parts, prob = outcome_table(N, P, "lgamma")
    o_off, o_parts, o_prob = outcome_table(N, P, "summed")
    assert np.array_equal(offsets, o_off) and np.array_equal(parts, o_parts)
    assert np.array_equal(prob == 0.0, o_prob == 0.0)
    np.testing.assert_allclose(o_prob, prob, rtol=1e-12, atol=0.0)
    want = np.array([sum(math.log(v) for v in range(2, x + 1)) for x in range(N + 1)])
    np.testing.assert_allclose(D.summed_log_factorials(N), want, rtol=1e-14)
