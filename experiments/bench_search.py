"""Benchmarks of the threshold search at server scale (issue 17): exact, pruned, certified, side by side.

Usage (from the repository root, in the project's virtual environment)::

    python experiments/bench_search.py exact --N 1-64 --workers 2 --exhaustive-max 40
                                                             # R2R: the pruned sweep, timed whole, vs exhaustive
    python experiments/bench_search.py bound --N 8 16 32       # all-policy bound vs exact B* (R2R)
    python experiments/bench_search.py certified --N 65-256 --budget 1.0 --bound-n 32
    python experiments/bench_search.py me --N 1-8 --workers 2   # ME (M = 3): exhaustive vs pruned
    python experiments/bench_search.py mean-field --N 8-64:8 80-256:32 --exact-max 64 --budget 20
                                                             # the mean-field guide vs the chain (R2R)

Each row: N, B* of each method, throughput, chains evaluated / pruned / left unresolved, seconds,
and for certified rows the proven upper bound and the gap.  ``--json FILE`` also writes the rows.
The machine is shared: run long ranges in pieces (``--N 1-16``, ``--N 17-24``...).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from optimizer import optimize_sweep, optimize_thresholds
from optimizer.bounds import PolicyBounds, no_wait_bound, policy_bound
from tr_core.cli import IntRanges, format_table, parse_int_list
from tr_core.spec import preset

R2R = preset("r2r", [6.0, 27.9], p=0.35)
ME = preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2])


def _ns(values) -> list[int]:
    r = parse_int_list(values, "--N")
    return list(r) if isinstance(r, IntRanges) else list(r)


def exact(spec, Ns, workers: int, exhaustive_max: int) -> list[dict]:
    """The pruned sweep over all of ``Ns`` (whole N values shared over ``workers``), timed as a whole,
    next to the exhaustive search for every N <= ``exhaustive_max`` (same pool size)."""
    t0, c0 = time.perf_counter(), time.process_time()
    pruned = optimize_sweep(spec, Ns, search="pruned", workers=workers, eager=False)
    sweep_s = time.perf_counter() - t0
    print(f"# pruned sweep N = {Ns[0]}..{Ns[-1]}: {sweep_s:.1f} s wall with {workers} worker(s) "
          f"(parent CPU {time.process_time() - c0:.1f} s)", file=sys.stderr, flush=True)
    ex_ns = [N for N in Ns if N <= exhaustive_max]
    t1 = time.perf_counter()
    exh = {o.N: o for o in (optimize_sweep(spec, ex_ns, search="exhaustive", workers=workers) if ex_ns else [])}
    ex_total = time.perf_counter() - t1
    rows = []
    for pr in pruned:
        N = pr.N
        row = {"N": N}
        if N in exh:
            ex = exh[N]
            # seconds: the sum of its chains' solve times (one pool serves the whole exhaustive sweep)
            row.update(ex_B=list(ex.best_B), ex_tok_s=ex.throughput_tok_s, ex_evaluated=ex.evaluated,
                       ex_chain_s=ex.seconds)
        boxes = sum(v for k, v in pr.pruned_by.items() if k.startswith("box"))
        coarse = sum(v for k, v in pr.pruned_by.items() if "slot=" in k)
        row.update(B=list(pr.best_B), tok_s=pr.throughput_tok_s, evaluated=pr.evaluated, pruned=pr.pruned,
                   pruned_by_box=boxes, pruned_on_coarse_clock=coarse, certificate=pr.certificate, s=pr.seconds)
        if "ex_B" in row:
            row["identical"] = row["ex_B"] == row["B"] and abs(row["ex_tok_s"] - row["tok_s"]) <= 1e-9 * row["tok_s"]
        rows.append(row)
        _echo(row)
    print(f"# whole pruned sweep: {sweep_s:.1f} s; exhaustive N <= {exhaustive_max}: {ex_total:.1f} s",
          file=sys.stderr, flush=True)
    return rows


def bound(spec, Ns) -> list[dict]:
    rows = []
    for N in Ns:
        t0 = time.perf_counter()
        r = policy_bound(spec, N)
        t1 = time.perf_counter()
        ex = optimize_thresholds(spec, N, search="exhaustive")
        row = {"N": N, "B": list(ex.best_B), "tok_s": ex.throughput_tok_s, "policy_bound_tok_s": r.upper_tok_s,
               "bracket_tok_s": r.upper_tok_s - r.lower_tok_s, "excess": r.upper_tok_s / ex.throughput_tok_s - 1,
               "no_wait_tok_s": no_wait_bound(spec, N).value_tok_s, "states": r.states, "sweeps": r.sweeps,
               "bound_s": t1 - t0, "per_request_bound": r.upper_tok_s / N}
        rows.append(row)
        _echo(row)
    return rows


def certified(spec, Ns, budget: float, bound_n: int, workers: int) -> list[dict]:
    t0 = time.perf_counter()
    pol = PolicyBounds(spec).compute([bound_n])
    tb = time.perf_counter() - t0
    r = pol.values[bound_n]
    print(f"# all-policy bound at N = {bound_n}: {r.upper_tok_s:.3f} tok/s ({r.states:,} states, "
          f"{r.sweeps} sweeps, {tb:.1f} s)", file=sys.stderr)
    # a start for the first N: B* at a small N, found exactly, scaled up (observed structure: only orders)
    n0 = min(16, Ns[0])
    seed = optimize_thresholds(spec, n0, search="exhaustive", workers=workers)
    rows = []
    prev, prev_n = seed.best_B, n0
    for N in Ns:
        t1 = time.perf_counter()
        if prev is not None:  # B* of the previous N scaled to N: only orders the work
            prev = tuple(max(1, round(b * N / prev_n)) for b in prev)
        prev_n = N
        o = optimize_thresholds(spec, N, search="certified", time_budget_s=budget, start=prev, eager=False,
                                policies=pol, workers=workers)
        prev = o.best_B
        row = {"N": N, "B": list(o.best_B), "tok_s": o.throughput_tok_s, "upper_bound_tok_s": o.upper_bound_tok_s,
               "gap": o.gap, "certificate": o.certificate, "evaluated": o.evaluated, "pruned": o.pruned,
               "unresolved": o.unresolved, "s": time.perf_counter() - t1}
        rows.append(row)
        _echo(row)
    print(f"# whole table: {time.perf_counter() - t0:.1f} s (bound {tb:.1f} s)", file=sys.stderr)
    return rows


def mean_field(spec, Ns, exact_max: int, budget: float, bound_n: int) -> list[dict]:
    """The mean-field guide next to the chain: its B and value, the exact throughput of its B, and the
    reference B* (exact pruned search for N <= ``exact_max``, else a certified search with ``budget``)."""
    from optimizer.evaluate import evaluate_thresholds
    from optimizer.mean_field import mean_field_thresholds

    pol = PolicyBounds(spec).compute([bound_n]) if max(Ns) > exact_max else None
    rows = []
    prev = None
    for N in Ns:
        t1 = time.perf_counter()
        g = mean_field_thresholds(spec, N)
        tg = time.perf_counter() - t1
        at = evaluate_thresholds(spec, N, g.B)
        t2 = time.perf_counter()
        if N <= exact_max:
            ref = optimize_thresholds(spec, N, search="pruned", eager=False, start=prev)
        else:
            ref = optimize_thresholds(spec, N, search="certified", eager=False, start=g.B, policies=pol,
                                      time_budget_s=budget)
        prev = ref.best_B
        top = ref.throughput_tok_s
        row = {"N": N, "B_mf": list(g.B), "mf_tok_s": g.throughput_tok_s, "mf_drift": g.drift,
               "guide_s": tg, "chain_at_B_mf_tok_s": at.throughput_tok_s,
               "B_ref": list(ref.best_B), "ref_tok_s": top, "ref": ref.certificate, "ref_gap": ref.gap,
               "mf_error_pct": 100.0 * (g.throughput_tok_s - top) / top,
               "regret_pct": 100.0 * (top - at.throughput_tok_s) / top, "ref_s": time.perf_counter() - t2}
        rows.append(row)
        _echo(row)
    return rows


def _echo(row: dict) -> None:
    print(json.dumps({k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()}),
          file=sys.stderr, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("exact", "bound", "certified", "me", "mean-field"))
    p.add_argument("--N", nargs="+", default=["1-16"])
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--exhaustive-max", type=int, default=40, help="run the exhaustive search up to this N")
    p.add_argument("--budget", type=float, default=1.0, help="certified: seconds per N")
    p.add_argument("--bound-n", type=int, default=32, help="certified: N of the all-policy bound")
    p.add_argument("--exact-max", type=int, default=64, help="mean-field: exact reference up to this N")
    p.add_argument("--preset", choices=("r2r", "me"), default="r2r", help="mean-field: the system")
    p.add_argument("--json", help="also write the rows to this file")
    a = p.parse_args(argv)
    Ns = _ns(a.N)
    if a.what == "exact":
        rows = exact(R2R, Ns, a.workers, a.exhaustive_max)
    elif a.what == "me":
        rows = exact(ME, Ns, a.workers, a.exhaustive_max)
    elif a.what == "mean-field":
        rows = mean_field(R2R if a.preset == "r2r" else ME, Ns, a.exact_max, a.budget, a.bound_n)
    elif a.what == "bound":
        rows = bound(R2R, Ns)
    else:
        rows = certified(R2R, Ns, a.budget, a.bound_n, a.workers)
    if rows:
        keys = list(dict.fromkeys(k for r in rows for k in r))
        fmt = [[(f"{r[k]:.4g}" if isinstance(r.get(k), float) else r.get(k, "")) for k in keys] for r in rows]
        print(format_table(keys, fmt))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
