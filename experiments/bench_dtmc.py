"""Benchmarks of the exact chain (issues 2 and 3): stages, scipy baseline, scaling, sweeps, cold start.

Usage (from the repository root, in the project's virtual environment)::

    python experiments/bench_dtmc.py stages      # BFS / assembly / solve vs scipy spsolve, N = 8 16 32
    python experiments/bench_dtmc.py scaling     # R2R B=(1,1), N = 8 .. 128: states, transitions, s, peak RSS
    python experiments/bench_dtmc.py me          # ME preset, M = 3: N = 3, 4, ... until one takes > 60 s
    python experiments/bench_dtmc.py sweep       # exhaustive B* for N = 1..32 with 2 workers
    python experiments/bench_dtmc.py tolerance   # B* with the default solver == B* with scipy direct
    python experiments/bench_dtmc.py coldstart   # first and second tr-optimize --N 8 in a fresh numba cache
    python experiments/bench_dtmc.py solvers     # issue 13: previous default solver vs the new one, side by side
    python experiments/bench_dtmc.py interleaved # issue 13: the same, interleaved pairs, medians of the ratios
    python experiments/bench_dtmc.py all

Every timing is the median of ``--repeat`` runs (default 5; 1 for the slow
scipy baseline at N = 32).  Tables go to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import dtmc
import tr_model
from optimizer.search import count_feasible
from tr_core.cli import format_table

R2R = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
ME = tr_model.preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2])


def median_time(fn, repeat):
    ts = []
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), out


def stages(repeat):
    rows = []
    tr_model.evaluate(R2R, 2, (1, 1))  # load the compiled kernels
    for N in (8, 16, 32):
        d, _ = R2R.quanta_table(N)
        b_t, ch = median_time(lambda: dtmc.build_chain(R2R.P, R2R.C, d, N, (1, 1)), repeat)
        s_t, st = median_time(lambda: dtmc.stationary_distribution(ch.T), repeat)
        e_t, ev = median_time(lambda: tr_model.evaluate(R2R, N, (1, 1)), repeat)
        sp_rep = 1 if N >= 32 else max(1, repeat // 2)
        sp_t, sp = median_time(lambda: dtmc.stationary_distribution(ch.T, solver="direct"), sp_rep)
        thr_sp = dtmc.throughput_per_quantum(sp.pi, ch.g, ch.tau) * 1e4
        rows.append([N, ch.n_states, ch.n_transitions, f"{ch.build_seconds * 1e3:.1f}",
                     f"{ch.assembly_seconds * 1e3:.1f}", f"{s_t * 1e3:.1f}", f"{e_t * 1e3:.1f}",
                     f"{sp_t:.2f}", f"{sp_t / e_t:.0f}x", f"{st.residual:.1e}", f"{sp.residual:.1e}",
                     f"{abs(ev.throughput_tok_s - thr_sp) / thr_sp:.1e}"])
    print("R2R p=0.35, L=(6.0, 27.9) ms, delta=0.1 ms, B=(1,1); medians of", repeat, "runs "
          "(BFS/assembly: last run)")
    print(format_table(["N", "states", "transitions", "BFS ms", "assembly ms", "solve ms", "whole eval ms",
                        "scipy spsolve s", "speedup", "residual", "spsolve residual", "rel diff tok/s"], rows))


def previous_default(T):
    """The default solve before issue 13, stage for stage: closed classes, Anderson-accelerated Gauss-Seidel
    on the transposed recurrent block, and the residual (which transposed T a second time); no bound."""
    from dtmc.solve import _anderson
    n = T.shape[0]
    labels, closed = dtmc.closed_classes(T)
    rec = np.flatnonzero(labels == np.flatnonzero(closed)[0])
    sub = T if rec.size == n else T[rec][:, rec].tocsr()
    TT = sub.T.tocsr()
    TT.sort_indices()
    x, _, _ = _anderson(TT, dtmc.DEFAULT_TOL, 5_000, None)
    pi = np.zeros(n)
    pi[rec] = x
    return pi, dtmc.residual(T, pi)


def solvers(repeat):
    """Issue 13: speed of the previous default vs the new one on well-conditioned chains, and accuracy of both
    on the issue's nearly decomposable chains (reference: GTH in 50 digits is in the tests; here the
    issue's quoted values and a GTH in reverse Cuthill-McKee order)."""
    from scipy.sparse.csgraph import reverse_cuthill_mckee
    tr_model.evaluate(R2R, 2, (1, 1))
    rows = []
    for N in (8, 16, 32):
        d, _ = R2R.quanta_table(N)
        ch = dtmc.build_chain(R2R.P, R2R.C, d, N, (1, 1))
        t_old, (pi_old, _) = median_time(lambda: previous_default(ch.T), repeat)
        t_new, st = median_time(lambda: dtmc.stationary_distribution(ch.T), repeat)
        b_t, _ = median_time(lambda: dtmc.build_chain(R2R.P, R2R.C, d, N, (1, 1)), repeat)
        e_old = b_t + t_old
        e_new, ev = median_time(lambda: tr_model.evaluate(R2R, N, (1, 1)), repeat)
        thr_old = dtmc.throughput_per_quantum(pi_old, ch.g, ch.tau) * 1e4
        rows.append([N, ch.n_states, f"{t_old * 1e3:.1f}", f"{t_new * 1e3:.1f}", f"{t_new / t_old:.2f}",
                     f"{e_old * 1e3:.1f}", f"{e_new * 1e3:.1f}", f"{e_new / e_old:.2f}", ev.solver,
                     f"{ev.throughput_error_bound:.1e}", f"{abs(ev.throughput_tok_s - thr_old) / thr_old:.1e}"])
    print(f"R2R p=0.35, L=(6.0, 27.9) ms, delta=0.1 ms, B=(1,1); medians of {repeat} runs; "
          "whole eval (previous) = build + previous solve")
    print(format_table(["N", "states", "solve ms (previous)", "solve ms (new)", "ratio", "whole eval ms (previous)",
                        "whole eval ms (new)", "ratio", "solver", "throughput bound", "rel diff tok/s"], rows))
    rows = []
    for p, B, quoted in ((0.999, (1, 7), 471.2141), (0.999, (1, 8), 471.97663), (0.9999, (1, 7), None),
                         (0.9999, (1, 8), None), (0.999, (1, 1), None)):
        spec = tr_model.preset("r2r", [6.0, 27.9], p=p)
        d, _ = spec.quanta_table(16)
        ch = dtmc.build_chain(spec.P, spec.C, d, 16, B)
        order = reverse_cuthill_mckee((ch.T + ch.T.T).tocsr(), symmetric_mode=True)
        ref_st = dtmc.stationary_distribution(ch.T[order][:, order].tocsr(), solver="gth")
        ref = dtmc.throughput_per_quantum(ref_st.pi, ch.g[order], ch.tau[order]) * 1e4
        t_old, (pi_old, res_old) = median_time(lambda: previous_default(ch.T), 1)
        thr_old = dtmc.throughput_per_quantum(pi_old, ch.g, ch.tau) * 1e4
        t_new, ev = median_time(lambda: tr_model.evaluate(spec, 16, B), 1)
        rows.append([p, " ".join(map(str, B)), ch.n_states, "-" if quoted is None else f"{quoted}", f"{ref:.7f}",
                     f"{thr_old:.4f}", f"{abs(thr_old - ref) / ref:.1e}", f"{res_old:.0e}",
                     f"{ev.throughput_tok_s:.7f}", f"{abs(ev.throughput_tok_s - ref) / ref:.1e}",
                     f"{ev.throughput_error_bound:.1e}", f"{ev.solver} / {ev.bound_method}", f"{ev.seconds:.2f}"])
    print("R2R L=(6.0, 27.9) ms, N = 16: previous default vs new default (reference: GTH in RCM order)")
    print(format_table(["p", "B", "states", "quoted", "reference tok/s", "previous", "prev. error", "prev. residual",
                        "new", "new error", "new bound", "new solver / bound", "new s"], rows))


def _previous_result(T, **_):
    """A StationaryResult from the previous default solve (no bound), so that the whole evaluation can run
    through the same pipeline with only the solve swapped."""
    t0 = time.perf_counter()
    pi, res = previous_default(T)
    return dtmc.StationaryResult(pi=pi, residual=res, solver="anderson", iterations=0,
                                 seconds=time.perf_counter() - t0, n_recurrent=int(np.count_nonzero(pi)),
                                 n_transient=int(pi.size - np.count_nonzero(pi)))


def interleaved(repeat, N=32, Bs=((1, 1), (1, 5))):
    """Issue 13 item 4, robust to a loaded machine: the whole evaluation with the new default solve and with
    the previous one (the same ``tr_model.evaluate`` with only ``dtmc.stationary_distribution`` swapped),
    run alternately (ABBA) in one process; per repetition the ratio new / previous, and the median of the
    ratios, in wall and in CPU time (``time.process_time``).  Then the solve's stages, also interleaved."""
    from dtmc import solve as S
    tr_model.evaluate(R2R, 2, (1, 1))
    new_solve = dtmc.stationary_distribution

    def run(fn, which):
        dtmc.stationary_distribution = new_solve if which == "new" else _previous_result
        try:
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            return time.perf_counter() - w0, time.process_time() - c0
        finally:
            dtmc.stationary_distribution = new_solve

    rows = []
    stage_rows = []
    for B in Bs:
        ev = tr_model.evaluate(R2R, N, B)
        t = {"new": [], "previous": []}
        for r in range(repeat):
            for which in (("new", "previous") if r % 2 == 0 else ("previous", "new")):
                t[which].append(run(lambda: tr_model.evaluate(R2R, N, B), which))
        rw = [a[0] / b[0] for a, b in zip(t["new"], t["previous"])]
        rc = [a[1] / b[1] for a, b in zip(t["new"], t["previous"])]
        med = lambda v: statistics.median(v)  # noqa: E731
        rows.append([N, " ".join(map(str, B)), ev.states, f"{med([a[0] for a in t['previous']]) * 1e3:.1f}",
                     f"{med([a[0] for a in t['new']]) * 1e3:.1f}", f"{med(rw):.3f}",
                     f"{sorted(rw)[len(rw) // 4]:.2f}-{sorted(rw)[(3 * len(rw)) // 4]:.2f}",
                     f"{med([a[1] for a in t['previous']]) * 1e3:.1f}", f"{med([a[1] for a in t['new']]) * 1e3:.1f}",
                     f"{med(rc):.3f}", f"{sorted(rc)[len(rc) // 4]:.2f}-{sorted(rc)[(3 * len(rc)) // 4]:.2f}",
                     ev.solver, f"{ev.throughput_error_bound:.1e}"])
        # stages of the solve (CPU ms, medians), the previous and the new default side by side
        d, _ = R2R.quanta_table(N)
        ch = dtmc.build_chain(R2R.P, R2R.C, d, N, B)
        T = ch.T
        st = {}

        def tm(name, fn):
            c0 = time.process_time()
            out = fn()
            st.setdefault(name, []).append(time.process_time() - c0)
            return out
        for r in range(repeat):
            tm("build (enumeration + CSR)", lambda: dtmc.build_chain(R2R.P, R2R.C, d, N, B))
            tm("closed classes", lambda: S.closed_classes(T))
            TT = tm("transpose", lambda: S._with_i64(T.T.tocsr()))
            Ti = S._with_i64(T)
            x = tm("iteration (Anderson-GS)", lambda: S._anderson(TT, dtmc.DEFAULT_TOL, 5_000, None))[0]
            tm("tree bound", lambda: S._tree_log_bound(Ti, TT, x))
            tm("residual", lambda: S._residual_tt(TT, x))
            tm("solve, previous default", lambda: previous_default(T))
            tm("solve, new default", lambda: new_solve(T))
        stage_rows.append([" ".join(map(str, B))] + [f"{statistics.median(v) * 1e3:.1f}" for v in st.values()])
        stage_names = list(st)
    print(f"R2R p=0.35, L=(6.0, 27.9) ms, delta=0.1 ms: whole evaluation, new vs previous default solve, "
          f"{repeat} interleaved pairs (ABBA); ratio = median of the per-pair ratios (IQR beside it)")
    print(format_table(["N", "B", "states", "wall ms prev.", "wall ms new", "wall ratio", "IQR", "CPU ms prev.",
                        "CPU ms new", "CPU ratio", "IQR", "solver", "throughput bound"], rows))
    print(f"Stages, CPU ms, medians of {repeat} (interleaved)")
    print(format_table(["B"] + stage_names, stage_rows))


def _child_peak(code: str) -> tuple[dict, float]:
    """Run ``code`` in a fresh interpreter; return its printed JSON and its peak RSS in MiB."""
    wrapper = code + "\nimport resource, json\nprint(json.dumps(dict(out, peak_kib=resource.getrusage(" \
                     "resource.RUSAGE_SELF).ru_maxrss)))\n"
    r = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"rc {r.returncode}"}, 0.0
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    return doc, doc["peak_kib"] / 1024


BASE_RSS_CODE = "import tr_model, dtmc\nout = {}\n"


def scaling(ns):
    _, base = _child_peak(BASE_RSS_CODE + "tr_model.evaluate(tr_model.preset('r2r',[6.0,27.9],p=0.35),2,(1,1))\n")
    rows = []
    for N in ns:
        code = (BASE_RSS_CODE +
                "import time\nspec = tr_model.preset('r2r',[6.0,27.9],p=0.35)\ntr_model.evaluate(spec,2,(1,1))\n"
                f"t=time.perf_counter(); ev = tr_model.evaluate(spec,{N},(1,1)); el=time.perf_counter()-t\n"
                "out = dict(states=ev.states, transitions=ev.transitions, seconds=el, build=ev.build_seconds,"
                " solve=ev.solve_seconds, residual=ev.residual, solver=ev.solver, bytes=ev.bytes_used,"
                " thr=ev.throughput_tok_s)\n")
        doc, peak = _child_peak(code)
        if "error" in doc:
            rows.append([N, "-", "-", "-", "-", "-", "-", "-", doc["error"][:60]])
            break
        rows.append([N, doc["states"], doc["transitions"], f"{doc['seconds']:.2f}", f"{doc['build']:.2f}",
                     f"{doc['solve']:.2f}", f"{peak - base:.0f}",
                     f"{(peak - base) * 2**20 / doc['transitions']:.0f}", f"{doc['residual']:.1e}"])
        print(f"  N={N} done in {doc['seconds']:.1f}s", file=sys.stderr)
        if doc["seconds"] > 300:
            break
    print(f"R2R B=(1,1) scaling (peak RSS above the {base:.0f} MiB of a bare interpreter with the kernels loaded)")
    print(format_table(["N", "states", "transitions", "seconds", "BFS s", "solve s", "peak MiB", "bytes/transition",
                        "residual"], rows))


def me_preset(limit_s=60.0):
    rows = []
    N = 3
    while True:
        code = (BASE_RSS_CODE +
                "import time\nspec = tr_model.preset('me',[6.0,15.0,27.9],weights=[0.5,0.3,0.2])\n"
                "tr_model.evaluate(spec,1,(1,1,1))\n"
                f"t=time.perf_counter(); ev = tr_model.evaluate(spec,{N},(1,1,1)); el=time.perf_counter()-t\n"
                "out = dict(states=ev.states, transitions=ev.transitions, seconds=el, residual=ev.residual,"
                " solver=ev.solver, thr=ev.throughput_tok_s)\n")
        doc, peak = _child_peak(code)
        if "error" in doc:
            rows.append([N, "-", "-", "-", "-", "-", doc["error"][:60]])
            break
        rows.append([N, doc["states"], doc["transitions"], f"{doc['seconds']:.2f}", f"{peak:.0f}",
                     f"{doc['thr']:.2f}", f"{doc['residual']:.1e} ({doc['solver']})"])
        print(f"  ME N={N}: {doc['seconds']:.1f}s", file=sys.stderr)
        if doc["seconds"] > limit_s / 2 or N >= 12:
            break
        N += 1
    print("ME preset, weights (0.5, 0.3, 0.2), L = (6.0, 15.0, 27.9) ms, delta = 0.1 ms, B = (1,1,1)")
    print(format_table(["N", "states", "transitions", "seconds", "peak MiB", "tok/s", "residual (solver)"], rows))


def sweep(nmax, workers):
    tr_model.evaluate(R2R, 2, (1, 1))
    Ns = list(range(1, nmax + 1))
    t0 = time.perf_counter()
    opts = tr_model.optimize_many(R2R, Ns, workers=workers)
    el = time.perf_counter() - t0
    n_eval = sum(o.evaluated for o in opts)
    assert n_eval == sum(count_feasible(N, 2) for N in Ns)
    print(f"exhaustive B* for R2R, N = 1..{nmax}: {n_eval} evaluated B in {el:.1f} s with {workers} workers "
          f"(max residual {max(e.residual for o in opts for e in o.evaluations):.1e})")
    print(format_table(["N", "B*", "tok/s", "eager tok/s", "gain"],
                       [[o.N, " ".join(map(str, o.best_B)), f"{o.throughput_tok_s:.2f}",
                         f"{o.eager_throughput_tok_s:.2f}", f"{o.gain_vs_eager:.3f}"] for o in opts]))
    return opts


def tolerance(nmax):
    rows = []
    same = True
    for N in range(1, nmax + 1):
        a = tr_model.optimize(R2R, N)
        b = tr_model.optimize(R2R, N, solver="direct")
        worst = max(abs(x.throughput_tok_s - y.throughput_tok_s) / y.throughput_tok_s
                    for x, y in zip(a.evaluations, b.evaluations))
        same &= a.best_B == b.best_B
        rows.append([N, " ".join(map(str, a.best_B)), " ".join(map(str, b.best_B)), f"{worst:.1e}",
                     f"{a.seconds:.2f}", f"{b.seconds:.2f}"])
    for spec, N in ((tr_model.preset("r-stitch", [6.0, 27.9], p=0.2, q=0.5), 8), (ME, 3)):
        a = tr_model.optimize(spec, N)
        b = tr_model.optimize(spec, N, solver="direct")
        worst = max(abs(x.throughput_tok_s - y.throughput_tok_s) / y.throughput_tok_s
                    for x, y in zip(a.evaluations, b.evaluations))
        same &= a.best_B == b.best_B
        rows.append([f"{spec.name} {N}", " ".join(map(str, a.best_B)), " ".join(map(str, b.best_B)),
                     f"{worst:.1e}", f"{a.seconds:.2f}", f"{b.seconds:.2f}"])
    print("B* with the default solver (Anderson-accelerated Gauss-Seidel, tol 1e-13) vs scipy direct LU")
    print(format_table(["N", "B* default", "B* direct", "max rel diff over all B", "default s", "direct s"], rows))
    print("identical B* everywhere:", same)


def coldstart():
    exe = os.path.join(os.path.dirname(sys.executable), "tr-optimize")
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as rcache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, TR_MODEL_CACHE_DIR=rcache)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([exe, "--p", "0.35", "--L", "6.0", "27.9", "--N", "8", "--no-cache"], env=env,
                           check=True, capture_output=True)
            times.append(time.perf_counter() - t0)
    print(format_table(["run", "seconds"], [["first (empty numba cache: compiles)", f"{times[0]:.2f}"],
                                            ["second (kernels from the disk cache)", f"{times[1]:.2f}"],
                                            ["third", f"{times[2]:.2f}"]]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["stages", "scaling", "me", "sweep", "tolerance", "coldstart", "solvers",
                                     "interleaved", "all"])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--nmax", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--scaling-n", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    a = ap.parse_args()
    print(f"# machine: {os.cpu_count()} cores, {os.uname().machine}, python {sys.version.split()[0]}, "
          f"numpy {np.__version__}")
    if a.what in ("stages", "all"):
        stages(a.repeat)
    if a.what in ("scaling", "all"):
        scaling(a.scaling_n)
    if a.what in ("me", "all"):
        me_preset()
    if a.what in ("sweep", "all"):
        sweep(a.nmax, a.workers)
    if a.what in ("tolerance", "all"):
        tolerance(12)
    if a.what in ("coldstart", "all"):
        coldstart()
    if a.what in ("solvers", "all"):
        solvers(a.repeat)
    if a.what in ("interleaved", "all"):
        interleaved(a.repeat)


if __name__ == "__main__":
    main()
