"""Best fixed thresholds B*, the best compact policy class, the optimal launch policy and the all-policy bound,
side by side (issue 27, item 4's exact columns).

    PYTHONPATH=. python experiments/policy_table.py --N 4 8 16 32 [--corun-slowdown 2.8 1.05] [--algo me]
        [--classes busy residual window ratio] [--json rows.json] [--process-max-states 2000000]
        [--process-max-entries 60000000] [--b-star b_star.json] [--bound-n 2 3] [--bound-max-states 2000000]
        [--max-evals 400] [--b-star-search pruned|local] [--b-star-start B1 B2]

R2R (p = 0.35, L = 6.0 / 27.9 ms) or ME (w = 0.5 / 0.3 / 0.2, L = 6.0 / 15.0 / 27.9 ms), delta = 0.1 ms;
``--corun-slowdown`` (one factor per model, missing ones 1.0) applies the co-running launch law with the
latencies rounded to the grid.  B*: the exact threshold search (optimizer.optimize_thresholds, pruned).
Classes (optimizer.policy.class_chain_table: the class's table over the configurations its own chain meets,
no all-policy process): exact values in the chain under the class's table, steepest ascent from B* (heuristic
search, at most --max-evals members); window also from the member that best fits the optimal table
(optimizer.policy.fit_class), the better of the two, where the optimum is available.  optimum: the greedy policy of relative value iteration on the all-policy
process, evaluated exactly in the chain under its table; bound: the all-policy bound; gap = proven
(bound - optimum) / bound.  Monotone: groups of configurations the optimal policy meets where the launch
decision is not monotone in the model's own queue, ties (margin within 1e-9 of the relative values' scale)
excluded; "all" counts them over every configuration of the process.

Each row is written to ``--json`` (temp file, then rename) as soon as it is done (and after B* and each class),
with the seconds of its phases (B*, process, optimum, value iteration for the margins, classes, monotonicity),
the peak RSS so far and the load average.  A row whose all-policy process exceeds ``--process-max-states`` /
``--process-max-entries`` has its optimum, its gap and the monotonicity columns recorded as infeasible (with
the limit; the exit code is then 3); its classes are still searched (they need no process), and its bound
column is the smallest all-policy bound that needs no process at N: the no-waiting bound (bound 1, whose
argument holds for every launch policy) and, when scaling is valid, ``N lam_n / n`` from the all-policy
process at each ``--bound-n`` n (bound 4, optimizer.bounds.PolicyBounds).  ``--b-star``: a JSON object
``{"N": {"B": [...], "how": "..."}}`` of B* found apart (e.g. a pruned search run earlier); its value is
evaluated again here, exactly.

``--b-star-search local`` (with ``--b-star-start``, e.g. the pattern of B* at smaller N) finds B* by steepest
ascent over the +-1 neighbours instead of the exact pruned search (which, with co-running 2.8 / 1.05, is the
dearest part of a row beyond N = 24); the row's ``B_star_certificate`` then says whether it is proven: "bound"
when the vector's exact value reaches the all-policy bound within 1e-6 (relative, less its proven error), so no
threshold vector, indeed no launch policy, does better by more than that; else "local (not proven)".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np

from optimizer.policy import (CLASSES, PolicyTooLarge, _packed, build_process, class_start, class_value,
                              decision_margins, fit_class, greedy, monotonicity, optimal_policy, reached_configs,
                              search_class, value_iteration)
import optimizer.policy as P
from optimizer.search import optimize_thresholds
from tr_core.spec import preset


def fmt(params, k):
    return ", ".join("(" + ", ".join(str(x) for x in params[k * j:k * j + k]) + ")" for j in range(len(params) // k))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--N", type=int, nargs="+", default=[4, 8, 12, 16])
    ap.add_argument("--corun-slowdown", type=float, nargs="+", default=None)
    ap.add_argument("--classes", nargs="+", choices=CLASSES, default=list(CLASSES))
    ap.add_argument("--json", default=None)
    ap.add_argument("--process-max-states", type=int, default=2_000_000, help="all-policy process state budget")
    ap.add_argument("--process-max-entries", type=int, default=60_000_000,
                    help="all-policy process option-entry budget")
    ap.add_argument("--b-star-search", choices=("pruned", "local"), default="pruned",
                    help="pruned: the exact search; local: steepest ascent from --b-star-start, proven only when "
                         "it reaches the all-policy bound")
    ap.add_argument("--b-star-start", type=int, nargs="+", default=None, help="start vector of the local search")
    ap.add_argument("--algo", choices=("r2r", "me"), default="r2r",
                    help="r2r: p = 0.35, L = 6.0 / 27.9 ms; me: w = (0.5, 0.3, 0.2), L = 6.0 / 15.0 / 27.9 ms")
    ap.add_argument("--b-star", default=None, help="JSON {N: {B: [...], how: ...}} of B* found apart")
    ap.add_argument("--bound-n", type=int, nargs="*", default=[],
                    help="all-policy processes solved at these n for the scaled bound of rows without a process")
    ap.add_argument("--bound-max-states", type=int, default=2_000_000)
    ap.add_argument("--max-evals", type=int, default=400, help="class members evaluated per ascent, at most")
    a = ap.parse_args()
    spec = (preset("r2r", [6.0, 27.9], p=0.35) if a.algo == "r2r"
            else preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2]))
    rnd = False
    if a.corun_slowdown:
        spec = spec.with_corun(list(a.corun_slowdown) + [1.0] * (spec.M - len(a.corun_slowdown)))
        rnd = True
    from optimizer.policy import CLASS_PARAMS
    given = {int(k): v for k, v in json.load(open(a.b_star)).items()} if a.b_star else {}
    pbounds = None
    if a.bound_n:
        from optimizer.bounds import PolicyBounds
        pbounds = PolicyBounds(spec, round_to_grid=rnd).compute(a.bound_n, max_states=a.bound_max_states)
        for n, rb in sorted(pbounds.values.items()):
            print(f"all-policy bound at n = {n}: {rb.upper_tok_s:.4f} tok/s ({rb.states:,} states, "
                  f"{rb.seconds:.0f} s)", flush=True)
    rows = []
    too_large = False
    seen_h: dict = {}
    _vi = P.value_iteration

    def keep_h(proc, **kw):      # optimal_policy's value iteration, its h kept for the margins (not recomputed)
        out = _vi(proc, **kw)
        if kw.get("rtol") == 1e-10 and kw.get("h") is None:
            seen_h["h"] = out[0]
        return out

    P.value_iteration = keep_h

    def save():
        if a.json:
            with open(a.json + ".tmp", "w") as f:
                json.dump(rows, f, indent=1, default=str)
            os.replace(a.json + ".tmp", a.json)
    print("| N | B* | B* tok/s | best class | its parameters per model | class tok/s | optimum tok/s | bound tok/s "
          "| proven gap | optimum vs B* | class vs B* | class short of optimum | "
          + " | ".join(f"{c} vs B*" for c in a.classes)
          + " | non-monotone groups met / all (ties excluded) | empty batches | process states | policy chain states "
          "| best class chain states | s |")
    print("|---" * (18 + len(a.classes)) + "|")
    for N in a.N:
        t0 = time.perf_counter()
        phase = {}
        if N in given:
            from optimizer.evaluate import evaluate_thresholds
            B = tuple(int(x) for x in given[N]["B"])
            ev = evaluate_thresholds(spec, N, B, round_to_grid=rnd)
            bt, bt_err = ev.throughput_tok_s, ev.throughput_error_bound
            cert = given[N].get("how", "given")
        else:
            # a local B* is certified by the all-policy bound below, so its rivals are not re-solved
            opt = optimize_thresholds(spec, N, round_to_grid=rnd, search=a.b_star_search, start=a.b_star_start,
                                      prove=a.b_star_search == "pruned")
            B, bt, cert = tuple(opt.best_B), opt.throughput_tok_s, opt.certificate
            bt_err = opt.best.throughput_error_bound
        phase["b_star"] = time.perf_counter() - t0
        row = dict(N=N, B_star=list(B), B_star_tok_s=bt, B_star_certificate=cert, classes={},
                   corun_slowdown=a.corun_slowdown, algo=a.algo)
        rows.append(row)
        save()
        r = proc = h = met = None
        try:
            proc = build_process(spec, N, round_to_grid=rnd, max_states=a.process_max_states,
                                 max_entries=a.process_max_entries)
        except PolicyTooLarge as e:
            too_large = True
            row.update(infeasible=str(e), process_max_states=a.process_max_states,
                       process_max_entries=a.process_max_entries)
        phase["process"] = time.perf_counter() - t0 - sum(phase.values())
        if proc is not None:
            r = optimal_policy(spec, N, proc=proc, round_to_grid=rnd)
            phase["optimum"] = time.perf_counter() - t0 - sum(phase.values())
            # the relative values for the margins: the optimum's own value iteration (same process, same rtol, so
            # the same h) when it ran one and no policy-iteration round replaced its h; else a fresh one
            h = seen_h.pop("h", None) if r.rounds == 0 else None
            seen_h.clear()
            if h is None:
                h, *_ = value_iteration(proc, rtol=1e-10)
            phase["margins_value_iteration"] = time.perf_counter() - t0 - sum(phase.values())
            choice, init = greedy(proc, h)
            met = np.isin(_packed(proc, r.table), reached_configs(proc, choice, init))
            if N not in given and a.b_star_search == "local":
                low = bt * (1.0 - bt_err)
                row["B_star_certificate"] = ("bound" if (r.upper_bound_tok_s - low) / r.upper_bound_tok_s <= 1e-6
                                             else "local (not proven)")
        found = row["classes"]
        for c in a.classes:
            tc = time.perf_counter()
            p, v, nev = search_class(spec, N, None, c, class_start(c, B), round_to_grid=rnd, max_evals=a.max_evals)
            if c == "window" and r is not None:  # a second ascent from the member that best fits the optimum
                p2, v2, nev2 = search_class(spec, N, None, c, fit_class(None, c, r.table, met), round_to_grid=rnd,
                                            max_evals=a.max_evals)
                nev += nev2
                if v2 > v:
                    p, v = p2, v2
            sol = class_value(spec, N, None, c, p, round_to_grid=rnd)
            found[c] = dict(params=list(p), tok_s=v, evaluated=nev, chain_states=int(sol.states),
                            error_bound=sol.throughput_error_bound, seconds=time.perf_counter() - tc)
            save()
        phase["classes"] = time.perf_counter() - t0 - sum(phase.values())
        best_c = max(a.classes, key=lambda c: found[c]["tok_s"])
        bp, bv = found[best_c]["params"], found[best_c]["tok_s"]
        row.update(best_class=best_c, best_class_tok_s=bv)
        pct = lambda x: f"{100 * (x / bt - 1):+.2f} %"  # noqa: E731
        if r is not None:
            # monotonicity of the optimal table, ties excluded, on the configurations it meets and on all
            marg = decision_margins(proc, h)
            tol = 1e-9 * float(np.max(np.abs(h)) + 1.0)
            mono_met = monotonicity(r.table, only=met, margins=marg, tol=tol)
            mono_all = monotonicity(r.table, margins=marg, tol=tol)
            raw_all = monotonicity(r.table)
            nm_met = sum(m["violations"] for m in mono_met.values())
            nm_all = sum(m["violations"] for m in mono_all.values())
            nm_raw = sum(m["violations"] for m in raw_all.values())
            phase["monotonicity"] = time.perf_counter() - t0 - sum(phase.values())
            row.update(optimum_tok_s=r.throughput_tok_s, optimum_error_bound=r.throughput_error_bound,
                       bound_tok_s=r.upper_bound_tok_s, bound_how="all-policy process at N", gap=r.gap,
                       nonmonotone_met=nm_met, nonmonotone_all=nm_all, nonmonotone_all_with_ties=nm_raw,
                       monotone_example={str(k): m["example"] for k, m in mono_all.items()},
                       empty_batches=r.empty_batches, process_states=r.process_states, chain_states=r.chain_states,
                       optimum_sweeps=r.sweeps, optimum_rounds=r.rounds)
            opt_cells = (f"{r.throughput_tok_s:.4f} | {r.upper_bound_tok_s:.4f} | {r.gap:.1e} | "
                         f"{pct(r.throughput_tok_s)} | {pct(bv)} | {100 * (1 - bv / r.throughput_tok_s):.2f} %")
            tail = (f"{nm_met} / {nm_all} ({nm_raw} with ties) | {'yes' if r.empty_batches else 'no'} "
                    f"| {r.process_states:,} | {r.chain_states:,}")
        else:
            from optimizer.bounds import no_wait_bound, shortest_steps
            ub = no_wait_bound(spec, N, d=shortest_steps(spec, N, rnd)).value_tok_s
            how_b = "no-waiting (bound 1)"
            pb = pbounds.bound(N) if pbounds is not None else None
            if pb is not None and pb.value_tok_s < ub:
                ub, how_b = pb.value_tok_s, pb.name
            row.update(bound_tok_s=ub, bound_how=how_b)
            opt_cells = f"n/a | {ub:.2f} ({how_b}) | n/a | n/a | {pct(bv)} | n/a"
            tail = f"n/a | n/a | > {a.process_max_states:,} | n/a"
        row.update(seconds=time.perf_counter() - t0, seconds_by_phase=phase,
                   peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                   load_1min=os.getloadavg()[0])
        print(f"| {N} | {B} | {bt:.2f} | {best_c} | {fmt(bp, CLASS_PARAMS[best_c])} | {bv:.2f} | {opt_cells} | "
              + " | ".join(pct(found[c]["tok_s"]) for c in a.classes)
              + f" | {tail} | {found[best_c]['chain_states']:,} | {row['seconds']:.0f} |", flush=True)
        save()
    if too_large:
        print("error: the all-policy process exceeded --process-max-states / --process-max-entries at some N "
              "(the optimum columns of those rows marked infeasible; their classes and bound computed)",
              file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
