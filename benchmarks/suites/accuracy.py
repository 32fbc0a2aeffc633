"""Accuracy on stiff and nearly decomposable chains: the default solver (``auto``) next to GTH elimination
(subtraction-free, the accurate reference) and scipy's LU, with the error bound each result reports."""

from __future__ import annotations

import tr_model

from . import _common

TITLE = "Stiff chains: the default solver's error and bound next to GTH and scipy's LU"
TOPIC = "accuracy"
COMMAND = "python benchmarks/run.py accuracy"
COLUMNS = ["chain", "states", "auto_tok_s", "auto_solver", "auto_bound", "auto_vs_gth", "direct_vs_gth",
           "gth_bound", "auto_ms", "gth_ms", "gth_over_auto"]
NOTES = ("auto_vs_gth, direct_vs_gth: relative difference in tok/s from GTH's value; auto_bound, gth_bound: the "
         "proven relative bound on the throughput each evaluation reports (inf: none proven); auto_ms, gth_ms: "
         "median wall ms of the whole evaluation; gth_over_auto = gth_ms / auto_ms.")

# (label, preset, parameters, latencies ms, delta ms, N, B)
CHAINS = [
    ("R2R p=0.35 N=16 B=(1,1)", "r2r", dict(p=0.35), (6.0, 27.9), 0.1, 16, (1, 1)),
    ("R2R p=0.999 N=16 B=(1,7)", "r2r", dict(p=0.999), (6.0, 27.9), 0.1, 16, (1, 7)),
    ("R2R p=0.999 N=16 B=(1,8)", "r2r", dict(p=0.999), (6.0, 27.9), 0.1, 16, (1, 8)),
    ("R2R p=0.9999 N=16 B=(1,7)", "r2r", dict(p=0.9999), (6.0, 27.9), 0.1, 16, (1, 7)),
    ("R2R p=1-1e-5 L=0.1:100 N=4 B=(1,2)", "r2r", dict(p=0.99999), (0.1, 100.0), 0.1, 4, (1, 2)),
    ("R2R p=0.999 L=1:200 N=6 B=(3,2)", "r2r", dict(p=0.999), (1.0, 200.0), 1.0, 6, (3, 2)),
    ("R2R p=0.5 L=1:1000 N=6 B=(3,2)", "r2r", dict(p=0.5), (1.0, 1000.0), 1.0, 6, (3, 2)),
    ("R-Stitch q=1e-5 L=0.1:100 N=4 B=(2,1)", "r-stitch", dict(p=0.5, q=1e-5), (0.1, 100.0), 0.1, 4, (2, 1)),
]
QUICK = {0, 1, 4, 7}


def run(quick: bool) -> list[dict]:
    warm = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    for solver in ("auto", "gth", "direct"):
        tr_model.evaluate(warm, 2, (1, 1), solver=solver)   # compile / load the kernels outside the timings
    rows = []
    repeats = 1 if quick else 3
    for i, (label, name, kw, L, delta, N, B) in enumerate(CHAINS):
        if quick and i not in QUICK:
            continue
        spec = tr_model.preset(name, list(L), delta_ms=delta, **kw)
        t_auto, auto = _common.median_s(lambda: tr_model.evaluate(spec, N, B), repeats)
        t_gth, gth = _common.median_s(lambda: tr_model.evaluate(spec, N, B, solver="gth"), repeats)
        direct = tr_model.evaluate(spec, N, B, solver="direct")
        ref = gth.throughput_tok_s
        rows.append({"chain": label, "states": auto.states, "auto_tok_s": auto.throughput_tok_s,
                     "auto_solver": auto.solver, "auto_bound": auto.throughput_error_bound,
                     "auto_vs_gth": abs(auto.throughput_tok_s - ref) / ref,
                     "direct_vs_gth": abs(direct.throughput_tok_s - ref) / ref,
                     "gth_bound": gth.throughput_error_bound, "auto_ms": t_auto * 1e3, "gth_ms": t_gth * 1e3,
                     "gth_over_auto": t_gth / t_auto})
    return rows
