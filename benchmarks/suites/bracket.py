"""The throughput bracket's relative values: Gauss-Seidel sweeps forwards against backwards through the states.

For each chain the stationary vector comes from the default solve; then the relative values ``h = r + T h`` are
iterated from zero as ``dtmc.solve.relative_values`` does (Anderson memory ``BRACKET_GS_MEMORY``, at most
``BRACKET_GS_SWEEPS`` sweeps, stopped at a bracket of ``0.5 * ACCURACY_TARGET``), once in each order, in turn.
``relative_values`` runs the backward order first and the forward one only when that stops short."""

from __future__ import annotations

import numpy as np

import tr_model

from . import _common

TITLE = "Throughput bracket: relative values swept forwards against backwards (sweeps, bracket, seconds)"
TOPIC = "accuracy"
COMMAND = "python benchmarks/run.py bracket"
COLUMNS = ["chain", "states", "fwd_sweeps", "fwd_bracket", "fwd_s", "bwd_sweeps", "bwd_bracket", "bwd_s",
           "fwd_over_bwd"]
NOTES = ("fwd_*, bwd_*: the iteration swept forwards (the order before) and backwards (tried first now): sweeps "
         "run (it stops at a bracket of 5e-10 relative, after 600 sweeps, or when four checks in a row gain "
         "less than 10 %), the relative width of the certified throughput bracket its h gives, and the median "
         "wall seconds of the iteration alone (the two orders interleaved); fwd_over_bwd = fwd_s / bwd_s.")

# (label, preset, parameters, latencies ms, N, B)
CHAINS = [
    ("R2R p=0.35 N=16 eager", "r2r", dict(p=0.35), (6.0, 27.9), 16, (1, 1)),
    ("R2R p=0.35 N=64 eager", "r2r", dict(p=0.35), (6.0, 27.9), 64, (1, 1)),
    ("R2R p=0.35 N=128 B=(8,60)", "r2r", dict(p=0.35), (6.0, 27.9), 128, (8, 60)),
    ("R2R p=0.35 N=256 B=(21,157)", "r2r", dict(p=0.35), (6.0, 27.9), 256, (21, 157)),
    ("ME N=6 eager", "me", dict(weights=[0.5, 0.3, 0.2]), (6.0, 15.0, 27.9), 6, (1, 1, 1)),
    ("ME N=8 eager", "me", dict(weights=[0.5, 0.3, 0.2]), (6.0, 15.0, 27.9), 8, (1, 1, 1)),
]
QUICK = {0, 3, 4}


def _iterate(args, rest, n, backward):
    from dtmc import _kernels as K
    h = np.zeros(n)
    sweeps, spread = K.poisson_gs(*args, h, *rest, backward)
    return int(sweeps), h


def run(quick: bool) -> list[dict]:
    from dtmc.chain import build_lowered_chain
    from dtmc.lowering import lower_system
    from dtmc.solve import (ACCURACY_TARGET, BRACKET_GS_MEMORY, BRACKET_GS_SWEEPS, _i64, chain_bracket,
                            stationary_distribution)

    rows = []
    for i, (label, name, kw, L, N, B) in enumerate(CHAINS):
        if quick and i not in QUICK:
            continue
        spec = tr_model.preset(name, list(L), **kw)
        ch = build_lowered_chain(lower_system(spec, N), B, max_states=5_000_000, max_transitions=100_000_000)
        g, tau = np.asarray(ch.g, dtype=np.float64), np.asarray(ch.tau, dtype=np.float64)
        pi = stationary_distribution(ch.T, rewards=(g, tau)).pi
        lam = float(pi @ g) / float(pi @ tau)
        T = ch.T.tocsr()
        n = T.shape[0]
        args = (_i64(T.indptr), _i64(T.indices), np.ascontiguousarray(T.data, dtype=np.float64), g - lam * tau,
                tau, int(np.argmax(pi)))
        rest = (0.5 * ACCURACY_TARGET * abs(lam), int(BRACKET_GS_SWEEPS), int(BRACKET_GS_MEMORY), 10)
        if not rows:
            _iterate(args, (rest[0], 1, rest[2], rest[3]), n, True)   # load the kernel outside the timings
        out = {}
        ts = _common.interleaved({o: (lambda o=o: out.__setitem__(o, _iterate(args, rest, n, o == "bwd")))
                                  for o in ("fwd", "bwd")}, 1 if quick or n > 1_000_000 else 3)
        row = {"chain": label, "states": n}
        for o in ("fwd", "bwd"):
            sweeps, h = out[o]
            lo, hi = chain_bracket(T, g, tau, h)
            row[f"{o}_sweeps"] = sweeps
            row[f"{o}_bracket"] = float(max(lam - lo, hi - lam) / lam)
            row[f"{o}_s"] = ts[o]
        row["fwd_over_bwd"] = ts["fwd"] / ts["bwd"] if ts["bwd"] > 0 else float("nan")
        rows.append(row)
    return rows
