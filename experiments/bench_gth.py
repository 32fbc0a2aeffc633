"""GTH elimination orders and arithmetics, side by side (issue 25 item 1).

Usage (from the repository root, in the project's virtual environment)::

    python experiments/bench_gth.py orders [--repeat 3] [--big]   # BFS vs reversed BFS vs RCM per chain
    python experiments/bench_gth.py kernels [--repeat 5]          # double vs extended-exponent elimination
    python experiments/bench_gth.py stiff                         # a sweep of stiff chains vs a 50-digit solve

``orders``: for each chain and each candidate order, the planner's work ceiling (``sum c_k^2``), the
multiply-adds the elimination actually did, the median wall time of the elimination as ``dtmc.gth``
runs it (double, then extended exponents when the double one underflows), which kernel ended it, the
proven bound on the l1 error of pi and the ratio of each to breadth-first.  ``--big`` runs only
R2R p = 0.999, N = 32, B = (1, 8) instead, whose breadth-first and RCM eliminations take minutes
(an order whose work ceiling exceeds 5e10 is run once, and in doubles only: its extended re-run
would take several times as long).  ``stiff``: R2R and R-Stitch with latency ratios 1:200 to 1:1000
(and 1000:1) and p from 1e-5 to 1 - 1e-5, each against a 50-digit GTH (``tests/mp_reference.py``),
with ``auto`` and ``gth``: how many raised, how many reported an estimate or no bound, how many were
flagged, the largest true error and the largest bound of the accurate ones.  It uses only
``tr_model.evaluate``, so it also runs against an older checkout (``PYTHONPATH=<old tree>``).  ``kernels``: the two kernels on the same order where the double one does not underflow.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import dtmc
import tr_model
from dtmc import _kernels as K
from dtmc import solve as S
from tr_core.cli import format_table

CHAINS = [
    # (label, preset, parameters, latencies ms, delta ms, N, B)
    ("R2R p=0.35 N=16 B=(1,1)", "r2r", dict(p=0.35), (6.0, 27.9), 0.1, 16, (1, 1)),
    ("R2R p=0.999 N=16 B=(1,7)", "r2r", dict(p=0.999), (6.0, 27.9), 0.1, 16, (1, 7)),
    ("R2R p=0.999 N=16 B=(1,8)", "r2r", dict(p=0.999), (6.0, 27.9), 0.1, 16, (1, 8)),
    ("R2R p=0.999 N=16 B=(1,1)", "r2r", dict(p=0.999), (6.0, 27.9), 0.1, 16, (1, 1)),
    ("R2R p=0.9999 N=16 B=(1,7)", "r2r", dict(p=0.9999), (6.0, 27.9), 0.1, 16, (1, 7)),
    ("R2R p=1-1e-5 L=0.1:100 N=4 B=(1,2)", "r2r", dict(p=0.99999), (0.1, 100.0), 0.1, 4, (1, 2)),
    ("R2R p=0.999 L=1:200 N=6 B=(3,2)", "r2r", dict(p=0.999), (1.0, 200.0), 1.0, 6, (3, 2)),
    ("R2R p=0.5 L=1:1000 N=6 B=(3,2)", "r2r", dict(p=0.5), (1.0, 1000.0), 1.0, 6, (3, 2)),
    ("R-Stitch q=1e-5 L=0.1:100 N=4 B=(2,1)", "r-stitch", dict(p=0.5, q=1e-5), (0.1, 100.0), 0.1, 4, (2, 1)),
]
BIG = [("R2R p=0.999 N=32 B=(1,8)", "r2r", dict(p=0.999), (6.0, 27.9), 0.1, 32, (1, 8))]


def _chain(preset, kw, L, delta, N, B):
    spec = tr_model.preset(preset, list(L), delta_ms=delta, **kw)
    d, _ = spec.quanta_table(N)
    return dtmc.build_chain(spec.P, spec.C, d, N, B)


def _eliminate(A, lo, kernel, *extra):
    ip, ix = S._i64(A.indptr), S._i64(A.indices)
    return kernel(ip, ix, A.data, lo, *extra)


def _as_gth(A, lo, double_only=False):
    """The elimination as dtmc.gth runs it: double, then extended when the double one underflows
    (``double_only``: the double one alone, marked "double (underflow)" when it underflowed)."""
    # (as dtmc does: the double elimination stops at its first underflow unless it alone is measured)
    r = _eliminate(A, lo, K.gth_solve, not double_only)
    if double_only and (r[0] != K.GTH_OK or r[4] > 0):
        return r, "double (underflow)", r[3]
    if r[0] != K.GTH_OK or r[4] > 0:
        return _eliminate(A, lo, K.gth_solve_scaled), "extended", r[3]
    return r, "double", r[3]


def orders(repeat: int, big: bool) -> None:
    rows = []
    for label, preset, kw, L, delta, N, B in (BIG if big else CHAINS):
        ch = _chain(preset, kw, L, delta, N, B)
        T = ch.T
        base = None
        plan = S.gth_plan(T)
        for name, order in S.gth_orders(T):
            A = T if order is None else T[order][:, order].tocsr()
            lo = K.gth_envelope(S._i64(A.indptr), S._i64(A.indices))
            work, _prof = K.gth_work(lo)
            heavy = work > 5e10
            reps = 1 if heavy else repeat
            ts = []
            for _ in range(reps):
                t0 = time.perf_counter()
                (status, x, Lb, flops, _u, err), kern, flops_double = _as_gth(A, lo, double_only=heavy)
                ts.append(time.perf_counter() - t0)
            t = statistics.median(ts)
            bound = (float(np.expm1(Lb) + 2.0 * err.sum()) if status == K.GTH_OK and np.isfinite(Lb)
                     else float("inf"))
            if base is None:
                base = (work, max(flops, 1), t)
            chosen = (order is None and plan[0] is None) or (order is not None and plan[0] is not None
                                                             and np.array_equal(order, plan[0]))
            rows.append([label if name == S.GTH_ORDERS[0] else "", f"{ch.n_states:,}",
                         name + (" *" if chosen else ""), f"{work:.3g}", f"{base[0] / work:.1f}x",
                         f"{flops:,}", f"{base[1] / max(flops, 1):.1f}x", f"{t:.3f}", f"{base[2] / t:.1f}x",
                         kern, f"{bound:.1e}", str(reps)])
        print(f"done {label}", flush=True)
    print(format_table(["chain", "states", "order (* = chosen)", "work ceiling", "vs BFS", "multiply-adds",
                        "vs BFS", "median s", "vs BFS", "kernel", "pi l1 bound", "runs"], rows))


def kernels(repeat: int) -> None:
    rows = []
    for label, preset, kw, L, delta, N, B in CHAINS:
        ch = _chain(preset, kw, L, delta, N, B)
        order = S.gth_plan(ch.T)[0]
        A = ch.T if order is None else ch.T[order][:, order].tocsr()
        lo = K.gth_envelope(S._i64(A.indptr), S._i64(A.indices))
        r = _eliminate(A, lo, K.gth_solve)
        if r[0] != K.GTH_OK or r[4] > 0:
            rows.append([label, f"{ch.n_states:,}", "underflows", "", "", ""])
            continue
        times = {}
        for kname, kern in (("double", K.gth_solve), ("extended", K.gth_solve_scaled)):
            ts = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                _eliminate(A, lo, kern)
                ts.append(time.perf_counter() - t0)
            times[kname] = statistics.median(ts)
        rows.append([label, f"{ch.n_states:,}", f"{times['double'] * 1e3:.2f}", f"{times['extended'] * 1e3:.2f}",
                     f"{times['extended'] / times['double']:.2f}x", str(repeat)])
    print(format_table(["chain", "states", "double ms", "extended ms", "ratio", "runs"], rows))


def stiff() -> None:
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "mp_reference.py")
    spec = importlib.util.spec_from_file_location("mp_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # the tests' 50-digit reference solve (tests/ is not a package)
    mp_reference = mod.mp_reference
    cases = []
    for L, delta in (((1.0, 200.0), 1.0), ((0.1, 100.0), 0.1), ((100.0, 0.1), 0.1), ((1.0, 1000.0), 1.0)):
        for p in (1e-5, 0.5, 0.999, 0.99999):
            for N, B in ((4, (1, 1)), (6, (1, 3)), (6, (3, 2)), (8, (1, 7))):
                cases.append(("r2r", dict(p=p), L, delta, N, B))
    for L, delta in (((1.0, 200.0), 1.0), ((0.1, 100.0), 0.1)):
        for p, q in ((0.5, 1e-5), (1e-5, 0.5), (0.99999, 1e-5)):
            for N, B in ((3, (1, 1)), (4, (2, 1)), (5, (1, 3))):
                cases.append(("r-stitch", dict(p=p, q=q), L, delta, N, B))
    rows = []
    for solver in ("auto", "gth"):
        stats = dict(chains=0, raised=0, estimate=0, flagged=0, below=0, max_err=0.0, max_bound=0.0, seconds=0.0)
        examples = []
        for name, kw, L, delta, N, B in cases:
            spec = tr_model.preset(name, list(L), delta_ms=delta, **kw)
            _ch, _x, _rec, ref = mp_reference(spec, N, B)
            stats["chains"] += 1
            t0 = time.perf_counter()
            try:
                ev = tr_model.evaluate(spec, N, B, solver=solver)
            except Exception as e:  # noqa: BLE001 - counted: what the issue calls aborted
                stats["raised"] += 1
                examples.append(f"{name} {kw} L={L} N={N} B={B}: {type(e).__name__}")
                continue
            finally:
                stats["seconds"] += time.perf_counter() - t0
            err = abs(ev.throughput_tok_s - ref) / ref
            bound = ev.throughput_error_bound
            if ev.bound_method.startswith(("estimate", "none")):
                stats["estimate"] += 1
                examples.append(f"{name} {kw} L={L} N={N} B={B}: {ev.bound_method} {bound:.2g}, true {err:.1g}")
            elif bound > 1e-6:
                stats["flagged"] += 1
            if err > bound:
                stats["below"] += 1
            stats["max_err"] = max(stats["max_err"], err)
            if bound <= 1e-6:
                stats["max_bound"] = max(stats["max_bound"], bound)
        rows.append([solver, str(stats["chains"]), str(stats["raised"]), str(stats["estimate"]), str(stats["flagged"]),
                     str(stats["below"]), f"{stats['max_err']:.1e}", f"{stats['max_bound']:.1e}",
                     f"{stats['seconds']:.1f}"])
        for line in examples[:6]:
            print(f"  {solver}: {line}")
    print(format_table(["solver", "chains", "raised", "estimate/none", "flagged (proven > 1e-6)", "bound < error",
                        "max true error", "max bound <= 1e-6", "seconds"], rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["orders", "kernels", "stiff"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--big", action="store_true")
    a = ap.parse_args()
    if a.what == "stiff":
        return stiff()
    # compile once, outside the timings
    ch = _chain("r2r", dict(p=0.35), (6.0, 27.9), 0.1, 3, (1, 1))
    lo = K.gth_envelope(S._i64(ch.T.indptr), S._i64(ch.T.indices))
    _eliminate(ch.T, lo, K.gth_solve)
    _eliminate(ch.T, lo, K.gth_solve_scaled)
    orders(a.repeat, a.big) if a.what == "orders" else kernels(a.repeat)


if __name__ == "__main__":
    main()
