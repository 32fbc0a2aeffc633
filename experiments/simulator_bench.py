"""Speed of the event simulator in request-steps per second on one core.

Usage::

    .venv/bin/python experiments/simulator_bench.py [--steps 5000000] [--repeats 5] [--format table|json|csv]

The process pins itself to one CPU (``os.sched_setaffinity``); the kernel is
single threaded anyway.  Every configuration is run ``--repeats`` times after
one compile/warm-up call and the median rate is reported (warm-up request-steps
included in the count, since the kernel simulates them too).  The target of
issue 4 is >= 5 million request-steps/s for M = 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics


from tr_core.spec import LatencyCurve, make_spec, preset  # noqa: E402
from simulator import generate_trace, simulate  # noqa: E402


def configurations():
    r2r = preset("r2r", [6.0, 27.9], p=0.35)
    curves = make_spec([6.0, 27.9], r2r.P, r2r.C,
                       latency_curves=[LatencyCurve("table", (1, 8, 64), (6.0, 6.8, 11.2)),
                                       LatencyCurve("affine", intercept_ms=27.5, per_request_ms=0.3)],
                       max_batch_size=[None, 16])
    me = preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2])
    trace = generate_trace(r2r, 2000, 50, seed=0)
    return [
        ("R2R M=2", r2r, 1, (1, 1), {}),
        ("R2R M=2", r2r, 4, (1, 3), {}),
        ("R2R M=2", r2r, 16, (1, 1), {}),
        ("R2R M=2", r2r, 16, (1, 6), {}),
        ("R2R M=2", r2r, 64, (1, 12), {}),
        ("R2R M=2 jitter 0.2", r2r, 16, (1, 6), {"jitter": 0.2}),
        ("R2R M=2 trace-driven", r2r, 16, (1, 6), {"trace": trace}),
        ("M=2 L(b) + cap 16", curves, 64, (1, 8), {}),
        ("ME M=3", me, 16, (1, 3, 4), {}),
    ]


def search() -> int:
    """B* by simulation for the ME preset (weights 0.5, 0.3, 0.2; L = 6.0, 15.0, 27.9 ms) at N = 16."""
    import time
    from simulator import optimize_by_simulation
    t0 = time.perf_counter()
    me = preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2])
    o = optimize_by_simulation(me, 16, budget_s=60.0, seed=0)
    total = time.perf_counter() - t0
    print(f"ME N=16: B* = {o.best_B}, {o.throughput_tok_s:.2f} +- {o.ci95_tok_s:.2f} tok/s, tie set {o.tie_set}, "
          f"eager {o.eager_throughput_tok_s:.2f} +- {o.eager_ci95_tok_s:.2f}, gain {100 * o.gain_vs_eager:.2f}% "
          f"+- {100 * o.gain_ci95:.2f}%; {o.evaluated} candidates, {o.simulations} simulations, "
          f"{o.request_steps / 1e6:.0f} M request-steps, search {o.seconds:.1f} s (kernel compile or cache load included), script {total:.1f} s")
    for c, st in o.rounds:
        print(f"  round: {c} candidates x {st:,} request-steps")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5_000_000, help="measured request-steps per run (default 5e6)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per configuration (median reported)")
    ap.add_argument("--format", choices=("table", "json", "csv"), default="table")
    ap.add_argument("--search", action="store_true",
                    help="instead: time optimize_by_simulation for the ME preset at N = 16 (60 s budget)")
    args = ap.parse_args(argv)
    if args.search:
        return search()
    try:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    except (AttributeError, OSError):
        pass
    rows = []
    for name, spec, N, B, kw in configurations():
        simulate(spec, N, B, steps=10_000, **kw)   # compile / warm caches
        rates, walls = [], []
        for rep in range(args.repeats):
            r = simulate(spec, N, B, steps=args.steps, seed=rep, **kw)
            rates.append(r.request_steps_per_s)
            walls.append(r.wall_s)
        rows.append({"system": name, "N": N, "B": list(B), "median_request_steps_per_s": statistics.median(rates),
                     "min_request_steps_per_s": min(rates), "median_wall_s": statistics.median(walls),
                     "throughput_tok_s": r.throughput_tok_s, "ci95_tok_s": r.throughput_ci95_tok_s})
    if args.format == "json":
        print(json.dumps({"schema_version": 1, "steps": args.steps, "repeats": args.repeats, "rows": rows}, indent=2))
    elif args.format == "csv":
        print("system,N,B,median_request_steps_per_s,min_request_steps_per_s,median_wall_s")
        for r in rows:
            print(f"{r['system']},{r['N']},{'/'.join(map(str, r['B']))},{r['median_request_steps_per_s']:.0f},"
                  f"{r['min_request_steps_per_s']:.0f},{r['median_wall_s']:.3f}")
    else:
        print(f"{'system':<22} {'N':>3} {'B':<10} {'median Msteps/s':>15} {'min Msteps/s':>12} {'wall s':>7} "
              f"{'tok/s':>9} {'+-95%':>6}")
        for r in rows:
            print(f"{r['system']:<22} {r['N']:>3} {str(tuple(r['B'])):<10} {r['median_request_steps_per_s'] / 1e6:>15.1f} "
                  f"{r['min_request_steps_per_s'] / 1e6:>12.1f} {r['median_wall_s']:>7.3f} {r['throughput_tok_s']:>9.2f} "
                  f"{r['ci95_tok_s']:>6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
