"""A 50-digit reference for stationary vectors and throughputs, independent of the compiled solvers.

A sparse GTH elimination written here in Python and run in mpmath arithmetic (``dps`` digits, last
state first), so its own rounding is far below the errors under test.  Used by
``test_dtmc_stability.py`` and ``test_dtmc_stiff.py``.
"""

import mpmath
import numpy as np
import scipy.sparse as sp

import dtmc


def mp_stationary(T: sp.csr_matrix, dps: int = 50) -> list:
    """Stationary vector of an irreducible chain by GTH in ``dps``-digit arithmetic (last state first)."""
    mpmath.mp.dps = dps
    n = T.shape[0]
    rows = [dict() for _ in range(n)]      # off-diagonal entries of each row
    preds = [set() for _ in range(n)]      # states with an entry into each column
    coo = T.tocoo()
    for i, j, v in zip(coo.row.tolist(), coo.col.tolist(), coo.data.tolist()):
        if i != j and v > 0:
            rows[i][j] = rows[i].get(j, mpmath.mpf(0)) + mpmath.mpf(v)
            preds[j].add(i)
    s = [None] * n
    for k in range(n - 1, 0, -1):
        succ = {j: v for j, v in rows[k].items() if j < k}
        s[k] = mpmath.fsum(succ.values())
        assert s[k] > 0, "not irreducible"
        for i in [i for i in preds[k] if i < k]:
            f = rows[i][k] / s[k]
            for j, b in succ.items():
                if j != i:
                    rows[i][j] = rows[i].get(j, mpmath.mpf(0)) + f * b
                    preds[j].add(i)
    x = [mpmath.mpf(0)] * n
    x[0] = mpmath.mpf(1)
    for k in range(1, n):
        x[k] = mpmath.fsum(x[i] * rows[i][k] for i in preds[k] if i < k) / s[k]
    tot = mpmath.fsum(x)
    return [xi / tot for xi in x]


def mp_reference(spec, N, B):
    """(chain, exact pi on the recurrent class as mpf list, its indices, exact throughput in tok/s)."""
    d, _ = spec.quanta_table(N)
    ch = dtmc.build_chain(spec.P, spec.C, d, N, B)
    labels, closed = dtmc.closed_classes(ch.T)
    rec = np.flatnonzero(labels == np.flatnonzero(closed)[0])
    x = mp_stationary(ch.T[rec][:, rec].tocsr())
    num = mpmath.fsum(xi * mpmath.mpf(float(g)) for xi, g in zip(x, ch.g[rec]))
    den = mpmath.fsum(xi * mpmath.mpf(float(t)) for xi, t in zip(x, ch.tau[rec]))
    return ch, x, rec, float(num / den * 1000 / spec.delta_ms)
