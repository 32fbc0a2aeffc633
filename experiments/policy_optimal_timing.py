"""The optimal launch policy's speed: the solver before and after, side by side in one run,
next to the B* search and the `residual` class search of the same N.

    PYTHONPATH=. python experiments/policy_optimal_timing.py --N 16 32 48 64 [--corun-slowdown 2.8 1.05]
        [--repeats 3] [--old-max-n 64] [--no-bstar] [--no-residual]

R2R (p = 0.35, L = 6.0 / 27.9 ms, delta = 0.1 ms); ``--corun-slowdown`` applies the co-running launch law with
the latencies rounded to the grid (as ``experiments/policy_table.py``).

* **old**: ``optimizer.policy.optimal_policy`` as it was at cb7b026, restated here (:func:`old_optimal`) over the
  kernels of that commit (``optimizer/_kernels.py`` read from git, so the process build is the old one too):
  value iteration with forward Gauss-Seidel sweeps in blocks of 8, 16, 32, then 64 sweeps between brackets
  (``lam`` moves only at a bracket), to ``rtol = 1e-10``; then the greedy table, its exact chain and the
  empty-batch check.
* **new**: ``optimizer.policy.optimal_policy`` of this tree (one compiled loop, reverse sweeps, the bracket and
  ``lam`` every 4 sweeps, same ``rtol``).
* Both times include building the decision process (old: the kernel of cb7b026; new: this tree's); "s" columns are wall seconds, "cpu s" the
  process's CPU seconds (less sensitive to other load on a shared machine).  The new path is repeated
  ``--repeats`` times when one run is under 20 s (median); the old path and the searches run once.
* **alt-rtol**: the new path once more with ``rtol = --alt-rtol`` (value iteration only to what the 1e-6 gap
  target needs, a policy-iteration fallback behind it).
* **B\\* s**: ``optimizer.search.optimize_thresholds(spec, N, search="auto")`` (what ``tr-optimize`` runs per N,
  one worker); **residual s**: ``tr_model.launch_policy.class_policy(spec, N, "residual", B*)`` (``tr-optimize
  --policy residual``: the process and the steepest ascent from B*).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from optimizer import policy as POL  # noqa: E402
from tr_core.spec import preset  # noqa: E402

OLD_REV = "cb7b026"


def old_kernels(rev: str = OLD_REV):
    """``optimizer/_kernels.py`` at ``rev`` as a module (kept under the temp folder so its numba cache is reused)."""
    import importlib.util
    import subprocess
    import tempfile

    src = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:optimizer/_kernels.py"], capture_output=True,
                         text=True, check=True).stdout
    folder = os.path.join(tempfile.gettempdir(), f"tr-old-kernels-{rev}-m")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"kernels_{rev}.py")
    if not os.path.exists(path) or open(path).read() != src:
        with open(path + ".tmp", "w") as f:
            f.write(src)
        os.replace(path + ".tmp", path)
    spec = importlib.util.spec_from_file_location(f"kernels_{rev}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod      # numba's cache re-imports the module by name when it loads a kernel
    spec.loader.exec_module(mod)
    return mod


K = old_kernels()


def old_build_process(spec, N, rnd):
    """``optimizer.policy.build_process`` at cb7b026 (the same wrapper) over the old kernels."""
    from optimizer.bounds import _corun_quanta, _quanta

    M = spec.M
    d = np.ascontiguousarray(_quanta(spec, N, rnd), dtype=np.int64)
    dco = _corun_quanta(spec, N, rnd)
    dco_a = d if dco is None else np.ascontiguousarray(dco, dtype=np.int64)
    caps = spec.caps(N).astype(np.int64)
    P = np.ascontiguousarray(spec.P)
    cbar = (spec.C * P).sum(axis=1)
    bn = max(1, N.bit_length())
    br = max(1, int(max(d.max(), dco_a.max())).bit_length())
    offsets, parts, prob = K.outcome_table(N, M, P)   # the old kernels' own table
    lo = np.zeros(M, dtype=np.int64)
    hi = np.full(M, N + 1, dtype=np.int64)
    st, n, keys, tau, g, out_ptr, out_prob, opt_ptr, opt_idx, ukey, key0, init = K.policy_mdp_build(
        N, lo, hi, caps, d, dco_a, dco is not None, cbar, offsets, parts, prob, bn, br, 2_000_000, 60_000_000, True)
    assert st == K.OK
    nu = int(out_ptr[n])
    return POL.Process(spec, N, d, None if dco is None else dco_a, caps, int(n), keys[:n].copy(),
                       tau[:n].astype(np.float64), g[:n].copy(), out_ptr[:n + 1].copy(), out_prob[:nu].copy(),
                       opt_ptr[:nu + 1].copy(), opt_idx[:int(opt_ptr[nu])].copy(), ukey[:nu].copy(), int(key0),
                       init.copy(), bn, br)


def old_value_iteration(proc, rtol=1e-10, max_sweeps=200_000, omega=0.7):
    """The value iteration of ``optimizer.policy`` at cb7b026 (before the compiled solver)."""
    n = proc.n
    per_state = proc.opt_ptr[proc.out_ptr[1:n + 1]] - proc.opt_ptr[proc.out_ptr[:n]]
    terms = int(per_state.max()) + 8 if n else 8
    h = np.zeros(n)
    lam = float(np.sum(proc.g) / np.sum(proc.tau))
    lo_b, hi_b = -math.inf, math.inf
    sweeps, step = 0, 8
    while True:
        K.mdp_sweeps(n, proc.out_ptr, proc.out_prob, proc.opt_ptr, proc.opt_idx, proc.g, proc.tau, h, lam, step,
                     float(omega))
        sweeps += step
        a, b, mag = K.mdp_bracket(n, proc.out_ptr, proc.out_prob, proc.opt_ptr, proc.opt_idx, proc.g, proc.tau, h)
        err = mag * 4 * terms * np.finfo(np.float64).eps
        lo_b, hi_b = max(lo_b, a - err), min(hi_b, b + err)
        lam = 0.5 * (lo_b + hi_b)
        if hi_b - lo_b <= rtol * abs(hi_b) or sweeps >= max_sweeps:
            return h, lo_b, hi_b, sweeps
        step = min(2 * step, 64)


def old_optimal(spec, N, rnd):
    """The old ``optimal_policy`` (its policy-iteration fallback never ran in these cases: reported if needed)."""
    t0 = time.perf_counter()
    proc = old_build_process(spec, N, rnd)
    h, lo_b, hi_b, sweeps = old_value_iteration(proc)
    choice, init = POL.greedy(proc, h)
    table = POL.table_of(proc, choice, init)
    sol = POL.evaluate_table(spec, N, table, d=proc.d, dco=proc.dco)
    T = sol.throughput_per_quantum
    gap = (hi_b - T * (1.0 - sol.throughput_error_bound)) / hi_b
    POL._uses_empty(proc, table, choice, init)
    scale = 1000.0 / spec.delta_ms
    return {"T": T * scale, "U": hi_b * scale, "gap": gap, "sweeps": sweeps, "n": proc.n,
            "s": time.perf_counter() - t0}


def timed(fn, *args, **kw):
    w, c = time.perf_counter(), time.process_time()
    out = fn(*args, **kw)
    return out, time.perf_counter() - w, time.process_time() - c


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", type=int, nargs="+", default=[16, 32, 48, 64])
    ap.add_argument("--corun-slowdown", type=float, nargs=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--old-max-n", type=int, default=64, help="run the old path only up to this N")
    ap.add_argument("--no-bstar", action="store_true")
    ap.add_argument("--no-residual", action="store_true")
    ap.add_argument("--alt-rtol", type=float, default=1e-8, help="also run the new path once with this value-iteration "
                    "tolerance (the default 1e-10 keeps the optimum exact to rounding; the gap target is 1e-6)")
    a = ap.parse_args()
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    rnd = False
    if a.corun_slowdown:
        spec = spec.with_corun(list(a.corun_slowdown))
        rnd = True
    case = f"co-running x{a.corun_slowdown[0]:g}/{a.corun_slowdown[1]:g}" if a.corun_slowdown else "solo"
    print(f"{platform.node()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at start; R2R p = 0.35, "
          f"L = 6.0 / 27.9 ms, {case}", flush=True)
    # compile / load every kernel once, outside the timings
    POL.optimal_policy(spec, 2, round_to_grid=rnd)
    old_optimal(spec, 2, rnd)
    print("| case | N | process states | old sweeps | old s (cpu s) | new sweeps | new s (cpu s) | old / new (cpu) "
          "| optimum tok/s | old - new, relative | old gap | new gap | alt-rtol sweeps | alt-rtol s (cpu s) "
          "| alt-rtol - new, relative | alt-rtol gap | B* s (cpu s) | residual s (cpu s) | residual vs optimum | load |")
    print("|---" * 20 + "|", flush=True)
    for N in a.N:
        runs = []
        for _ in range(max(1, a.repeats)):
            r, w, c = timed(POL.optimal_policy, spec, N, round_to_grid=rnd)
            runs.append((w, c, r))
            if w > 20.0:
                break
        w_new = statistics.median(x[0] for x in runs)
        c_new = statistics.median(x[1] for x in runs)
        r = runs[0][2]
        if N <= a.old_max_n:
            o, w_old, c_old = timed(old_optimal, spec, N, rnd)
            old = (f"{o['sweeps']:,} | {w_old:.1f} ({c_old:.1f}) | ", f"{w_old / w_new:.1f} ({c_old / c_new:.1f})",
                   f"{(o['T'] - r.throughput_tok_s) / r.throughput_tok_s:.1e}", f"{o['gap']:.1e}")
        else:
            old = ("- | - | ", "-", "-", "-")
        ra, w_alt, c_alt = timed(POL.optimal_policy, spec, N, round_to_grid=rnd, rtol=a.alt_rtol)
        alt = (f"{ra.sweeps:,} | {w_alt:.1f} ({c_alt:.1f}) | "
               f"{(ra.throughput_tok_s - r.throughput_tok_s) / r.throughput_tok_s:.1e} | {ra.gap:.1e}")
        bs, rs, rv = "-", "-", "-"
        if not a.no_bstar:
            from optimizer.search import optimize_thresholds
            opt, wb, cb = timed(optimize_thresholds, spec, N, search="auto", round_to_grid=rnd)
            bs = f"{wb:.1f} ({cb:.1f})"
            if not a.no_residual:
                from tr_model.tuning.launch_policy import class_policy
                cp, wr, cr = timed(class_policy, spec, N, "residual", opt.best_B, round_to_grid=rnd)
                rs = f"{wr:.1f} ({cr:.1f})"
                rv = f"{(cp.throughput_tok_s - r.throughput_tok_s) / r.throughput_tok_s:+.1e}"
        print(f"| {case} | {N} | {r.process_states:,} | {old[0]}{r.sweeps:,} | {w_new:.1f} ({c_new:.1f}) "
              f"[{len(runs)}] | {old[1]} | {r.throughput_tok_s:.6f} | {old[2]} | {old[3]} | {r.gap:.1e} | {alt} | {bs} | "
              f"{rs} | {rv} | {os.getloadavg()[0]:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
