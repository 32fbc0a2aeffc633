"""The optimizer's copies of dtmc's kernels agree with dtmc's, function for function (issue 25, item 4).

``dtmc`` is a leaf and each package has one numba module, so ``optimizer/_kernels.py`` keeps its own copies
of the hash table, the state packing and the routing outcome table (``duplicates`` lists them).  They must
stay the same functions: a change to one side that the other misses fails here.
"""

import math

import numpy as np
import pytest

from dtmc import _kernels as D
from optimizer import _kernels as O

RNG = np.random.default_rng(25)


def test_the_copies_share_their_constant():
    assert D.EMPTY == O.EMPTY


def test_mix():
    keys = np.concatenate([RNG.integers(-2 ** 62, 2 ** 62, size=200), [0, 1, -1, 2 ** 62, -(2 ** 62)]])
    for k in keys:
        assert D._mix(np.int64(k)) == O._mix(np.int64(k))


@pytest.mark.parametrize("capacity", [16, 64, 1024])
def test_find_or_insert_and_rebuild(capacity):
    keys = RNG.integers(0, 3 * capacity, size=capacity * 2 // 3).astype(np.int64)  # repeats included
    td, vd = np.full(capacity, D.EMPTY, dtype=np.int64), np.empty(capacity, dtype=np.int64)
    to, vo = td.copy(), vd.copy()
    n = 0
    for key in keys:
        a = D._table_find_or_insert(td, vd, key, n)
        b = O._find(to, vo, key, n)
        assert (int(a[0]), bool(a[1])) == (int(b[0]), bool(b[1]))
        n += int(a[1])
    assert np.array_equal(td, to)
    occupied = td != D.EMPTY
    assert np.array_equal(vd[occupied], vo[occupied])
    uniq = np.array(list(dict.fromkeys(keys.tolist())), dtype=np.int64)
    rd, ro = D._table_rebuild(uniq, uniq.size, capacity * 2), O._rehash(uniq, uniq.size, capacity * 2)
    assert np.array_equal(rd[0], ro[0]) and np.array_equal(rd[1][rd[0] != D.EMPTY], ro[1][ro[0] != D.EMPTY])


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_grow(dtype):
    a = np.arange(5, dtype=dtype)
    for need in (3, 5, 6, 10, 11, 41):
        x, y = D._grow(a, need), O._grow(a, need)
        assert x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x[:5], y[:5])
        assert (x is a) == (y is a)


@pytest.mark.parametrize("M, bn, br", [(2, 5, 4), (3, 4, 3), (4, 3, 2)])
def test_pack_and_unpack(M, bn, br):
    for _ in range(200):
        k = RNG.integers(0, 2 ** bn, size=M).astype(np.int64)
        b = RNG.integers(0, 2 ** bn, size=M).astype(np.int64)
        r = RNG.integers(0, 2 ** br, size=M).astype(np.int64)
        key = D._encode(k, b, r, M, bn, br)
        assert key == O._pack(k, b, r, M, bn, br)
        out_d = [np.zeros(M, dtype=np.int64) for _ in range(3)]
        out_o = [np.zeros(M, dtype=np.int64) for _ in range(3)]
        D._decode(key, *out_d, M, bn, br)
        O._unpack(key, *out_o, M, bn, br)
        for x, y, want in zip(out_d, out_o, (k, b, r)):
            assert np.array_equal(x, want) and np.array_equal(y, want)


@pytest.mark.parametrize("N, M", [(1, 2), (7, 2), (6, 3), (4, 4)])
def test_outcome_table_is_compositions_with_their_probabilities(N, M):
    P = RNG.random((M, M))
    P[0, M - 1] = 0.0  # a zero-probability destination: its outcomes are exactly 0 on both sides
    P /= P.sum(axis=1, keepdims=True)
    offsets, parts = D.compositions(N, M)
    logfact = np.array([math.lgamma(x + 1.0) for x in range(N + 1)], dtype=np.float64)
    prob = D.composition_probabilities(P, offsets, parts, logfact)
    o_off, o_parts, o_prob = O.outcome_table(N, M, P)
    assert np.array_equal(offsets, o_off) and np.array_equal(parts, o_parts)
    assert np.array_equal(prob == 0.0, o_prob == 0.0)
    np.testing.assert_allclose(o_prob, prob, rtol=1e-12, atol=0.0)
