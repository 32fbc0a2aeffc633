"""Borrowed arrays (``dtmc._kernels._borrow``): a view without its reference-count handle reads and writes the
owner's memory, with the owner's shape and strides, and the kernels built on them return the processes their
callers expect (checked against independent enumerations in tests/test_search_bounds.py)."""

from __future__ import annotations

import numpy as np
from numba import njit

from dtmc._kernels import ChainTables, _borrow, _borrowed_tables


@njit
def _write_through(a, b):
    v = _borrow(a)
    w = _borrow(b)
    s = 0.0
    for i in range(v.shape[0]):
        for j in range(v.shape[1]):
            v[i, j] += 1.0
            s += v[i, j]
    w[1] = 7
    return s, v.shape[0], v.shape[1], v.strides[0], v.strides[1]


def test_a_borrowed_view_is_the_owners_memory():
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    b = np.zeros(3, dtype=np.int64)
    s, r, c, s0, s1 = _write_through(a, b)
    assert (r, c, s0, s1) == (3, 4, a.strides[0], a.strides[1])
    assert s == float(np.arange(12).sum() + 12)
    assert a[2, 3] == 12.0 and b[1] == 7


def test_a_borrowed_view_of_a_strided_array():
    a = np.arange(24, dtype=np.float64).reshape(4, 6)[::2, 1::2]     # not contiguous
    before = a.copy()
    _write_through(a, np.zeros(2, dtype=np.int64))
    assert np.array_equal(a, before + 1.0)


@njit
def _tables_sum(t):
    u = _borrowed_tables(t)
    return u.caps.sum() + u.d.sum() + u.dco.sum() + u.cbar.sum() + u.offsets.sum() + u.parts.sum() + u.prob.sum() \
        + u.bn + u.br + (1 if u.corun else 0)


def test_borrowed_tables_keep_every_field():
    rng = np.random.default_rng(3)
    t = ChainTables(rng.integers(1, 9, 2), rng.integers(1, 9, (2, 5)), rng.integers(1, 9, (2, 5)), True,
                    rng.random(2), rng.integers(0, 9, 6), rng.integers(0, 9, (6, 2)), rng.random((2, 6)), 5, 7)
    want = (t.caps.sum() + t.d.sum() + t.dco.sum() + t.cbar.sum() + t.offsets.sum() + t.parts.sum() + t.prob.sum()
            + t.bn + t.br + 1)
    assert abs(_tables_sum(t) - want) <= 1e-12 * abs(want)
