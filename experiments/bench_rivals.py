"""Rivals of B*: what proving B* costs in the default search (R2R p = 0.35, L = 6.0 / 27.9 ms).

Three variants of the same search in this process (kernels compiled first, no result cache, one worker,
``--search auto`` as ``tr-optimize`` runs it, the sweep's all-policy table; every N with each variant in
turn, the order rotated from one N to the next, each started near the previous N's B* as the sweep does):

* ``before``: the code before this change: no polishing of the iterate (``dtmc.solve.POLISH_SWEEPS = 0``),
  rivals left as found (``prove=False``);
* ``net only``: no polishing by default, but the search re-solves each rival with ``tighten`` (the safety
  net alone: what it costs when the first solve is loose);
* ``after``: the default now (polishing, and the net, which then finds nothing to do).

Per N: search seconds (wall, the Optimum's own), rivals left, the largest throughput error bound over the
evaluated chains, and whether B* stands.  Usage::

    NUMBA_CACHE_DIR=... python experiments/bench_rivals.py --N 56-64 [--variants before after]
"""

from __future__ import annotations

import argparse
import time


from dtmc import solve as S  # noqa: E402
from optimizer.optimum import b_star_rivals  # noqa: E402
from optimizer.search import _policy_table, optimize_sweep, optimize_thresholds  # noqa: E402
from tr_core.spec import preset  # noqa: E402

VARIANTS = {"before": (0, False), "net only": (0, True), "after": (S.POLISH_SWEEPS, True)}


def run_one(spec, N, variant, start, policies):
    sweeps, prove = VARIANTS[variant]
    keep = S.POLISH_SWEEPS
    S.POLISH_SWEEPS = sweeps
    try:
        c0 = time.process_time()
        o = optimize_thresholds(spec, N, search="auto", start=start, policies=policies, prove=prove)
        cpu = time.process_time() - c0
    finally:
        S.POLISH_SWEEPS = keep
    riv = b_star_rivals(o.evaluations, o.best)
    return dict(B=o.best_B, thr=o.throughput_tok_s, s=o.seconds, cpu=cpu, rivals=[e.B for e in riv],
                worst=max(e.throughput_error_bound for e in o.evaluations),
                stands=o.best.accuracy_ok and not riv, evaluated=o.evaluated)


def run(spec, Ns, variants):
    """Every N with every variant, the variants' order rotated from one N to the next (so that a drift of
    the machine's load does not favour one); each N started near the previous N's B* (scaled), as the
    default sweep's workers do, and with the sweep's all-policy table (n = 12)."""
    policies = _policy_table(spec, 12, False)
    out = {v: {} for v in variants}
    prev = last = None
    for k, N in enumerate(Ns):
        start = None if prev is None else tuple(max(1, round(b * N / last)) for b in prev)
        order = variants[k % len(variants):] + variants[:k % len(variants)]
        for v in order:
            out[v][N] = run_one(spec, N, v, start, policies)
        prev, last = out[variants[0]][N]["B"], N
        print(f"# N = {N}: " + ", ".join(f"{v} {out[v][N]['s']:.2f} s" for v in variants), flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--N", default="56-64", help="range a-b (default 56-64)")
    ap.add_argument("--variants", nargs="+", default=["before", "net only", "after"], choices=list(VARIANTS))
    a = ap.parse_args(argv)
    lo, hi = (int(x) for x in a.N.split("-"))
    Ns = list(range(lo, hi + 1))
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    optimize_sweep(spec, [4], search="pruned")        # compile (or load) every kernel first
    res = run(spec, Ns, list(a.variants))
    out = {v: (res[v],) for v in a.variants}
    first = a.variants[0]
    print("| N | B* | tok/s | " + " | ".join(f"{v} s | {v} rivals | {v} max bound" for v in a.variants)
          + " | " + " | ".join(f"{v} / {first}" for v in a.variants[1:]) + " |")
    print("|" + "---|" * (3 + 3 * len(a.variants) + len(a.variants) - 1))
    for N in Ns:
        r0 = out[first][0][N]
        cells = [str(N), f"({', '.join(map(str, r0['B']))})", f"{r0['thr']:.2f}"]
        for v in a.variants:
            r = out[v][0][N]
            assert r["B"] == r0["B"] and abs(r["thr"] - r0["thr"]) <= 1e-9 * r0["thr"], (v, N)
            cells += [f"{r['s']:.2f}", ",".join(f"({b[0]}, {b[1]})" for b in r["rivals"]) or "-", f"{r['worst']:.1e}"]
        cells += [f"{out[v][0][N]['s'] / r0['s']:.2f}" for v in a.variants[1:]]
        print("| " + " | ".join(cells) + " |")
    tot = [sum(out[v][0][N]["s"] for N in Ns) for v in a.variants]
    cpu = [sum(out[v][0][N]["cpu"] for N in Ns) for v in a.variants]
    print("| total | | | " + " | ".join(f"{t:.1f} | | " for t in tot) + " | "
          + " | ".join(f"{t / tot[0]:.2f}" for t in tot[1:]) + " |")
    for v, t, c in zip(a.variants, tot, cpu):
        stands = sum(out[v][0][N]["stands"] for N in Ns)
        print(f"# {v}: B* proven (stands) at {stands} of {len(Ns)} N; search wall {t:.1f} s, CPU {c:.1f} s")

if __name__ == "__main__":
    main()
