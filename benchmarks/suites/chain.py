"""Chain speed: the whole exact evaluation (enumeration, CSR, default solve, rewards) next to the same evaluation
with scipy's sparse LU (``solver="direct"``: SuperLU with COLAMD), in one run."""

from __future__ import annotations

import tr_model

from . import _common

TITLE = "Exact chain: the default evaluation next to scipy's spsolve"
TOPIC = "chain speed"
COMMAND = "python benchmarks/run.py chain"
COLUMNS = ["system", "N", "B", "states", "transitions", "eval_ms", "build_ms", "solve_ms", "scipy_eval_ms",
           "speedup_vs_scipy", "solver", "residual", "throughput_error_bound", "rel_diff_vs_scipy", "repeats"]
NOTES = ("eval_ms: `tr_model.evaluate` with the default solver (median of `repeats`; build_ms and solve_ms are that "
         "evaluation's stages); scipy_eval_ms: the same call with `solver=\"direct\"` (scipy's spsolve), median of "
         "fewer repeats where it takes seconds; speedup_vs_scipy = scipy_eval_ms / eval_ms; rel_diff_vs_scipy: "
         "|tok/s default - tok/s scipy| / tok/s scipy.  R2R: p = 0.35, L = (6.0, 27.9) ms; ME: weights (0.5, 0.3, "
         "0.2), L = (6.0, 15.0, 27.9) ms; delta = 0.1 ms.  The scipy columns are empty ('-') above 60,000 states, where "
         "spsolve's fill-in takes minutes.")


SCIPY_MAX_STATES = 60_000   # above it the scipy columns are left empty ('-')


def _systems(quick: bool):
    r2r = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    me = tr_model.preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2])
    out = [("R2R", r2r, 8, (1, 1)), ("R2R", r2r, 16, (1, 1)), ("R2R", r2r, 16, (1, 6)), ("ME", me, 4, (1, 1, 1))]
    if not quick:
        out += [("R2R", r2r, 32, (1, 1)), ("ME", me, 6, (1, 2, 2))]
    return out


def run(quick: bool) -> list[dict]:
    r2r = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    tr_model.evaluate(r2r, 2, (1, 1))                      # load the compiled kernels outside the timings
    tr_model.evaluate(r2r, 2, (1, 1), solver="direct")
    rows = []
    for name, spec, N, B in _systems(quick):
        repeats = 3 if quick else 5
        t, ev = _common.median_s(lambda: tr_model.evaluate(spec, N, B), repeats)
        if ev.states > SCIPY_MAX_STATES:   # spsolve's fill-in on these chains takes minutes and gigabytes
            t_sp, sp, sp_repeats = None, None, 0
        else:
            t_sp_probe, sp = _common.median_s(lambda: tr_model.evaluate(spec, N, B, solver="direct"), 1)
            sp_repeats = 1 if t_sp_probe > 2.0 or quick else 3
            t_sp = t_sp_probe if sp_repeats == 1 else _common.median_s(
                lambda: tr_model.evaluate(spec, N, B, solver="direct"), sp_repeats)[0]
        rows.append({"system": name, "N": N, "B": list(B), "states": ev.states, "transitions": ev.transitions,
                     "eval_ms": t * 1e3, "build_ms": (ev.build_seconds + ev.assembly_seconds) * 1e3,
                     "solve_ms": ev.solve_seconds * 1e3, "scipy_eval_ms": None if sp is None else t_sp * 1e3,
                     "speedup_vs_scipy": None if sp is None else t_sp / t,
                     "solver": ev.solver, "residual": ev.residual, "throughput_error_bound": ev.throughput_error_bound,
                     "rel_diff_vs_scipy": None if sp is None else
                     abs(ev.throughput_tok_s - sp.throughput_tok_s) / sp.throughput_tok_s,
                     "repeats": f"{repeats} / {sp_repeats}"})
    return rows
