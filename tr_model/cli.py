"""``tr-optimize``: best delayed-batching thresholds for a token-level routed system.

Examples::

    tr-optimize --p 0.35 --L 6.0 27.9                 # R2R preset, N = 1 2 4 8 16
    tr-optimize --algo r-stitch --p 0.2 --q 0.5 --L 6 28 --N 1-16 --format csv
    tr-optimize --spec system.json --N 8 --B 1 5      # evaluate one vector
"""

from __future__ import annotations

import json
import math
import sys

from tr_core.cli import Parser, Progress, format_table, parse_int_list, run_cli, to_csv
from tr_core.errors import SpecError
from tr_core.spec import PRESETS, load_spec, preset, spec_to_dict, write_json_atomic

OUTPUT_SCHEMA_VERSION = 1
DEFAULT_NS = [1, 2, 4, 8, 16]


def build_parser() -> Parser:
    import dtmc

    p = Parser(
        prog="tr-optimize",
        description=("Find the delayed-batching thresholds B* that maximise the decode throughput of a "
                     "token-level routed LLM system (TokenRouter model, exact Markov chain). "
                     "Latencies are per decoding step in milliseconds; throughput is committed output "
                     "tokens per second summed over the N concurrent requests."),
        epilog="Exit codes: 0 ok, 2 bad input, 3 state space larger than --max-states.")
    g = p.add_argument_group("system (one of --p/--algo, --weights, --spec)")
    g.add_argument("--algo", choices=PRESETS, help="routing-algorithm preset (default r2r when --p is given; "
                   "me when --weights is given)")
    g.add_argument("--p", type=float, help="escalation probability per token from model 0 (r2r/citer/co-llm), "
                   "or 0->1 switch probability (r-stitch)")
    g.add_argument("--q", type=float, help="r-stitch: probability per token of switching back 1->0")
    g.add_argument("--weights", type=float, nargs="+", metavar="W", help="me: ensemble weights, one per model, sum 1")
    g.add_argument("--L", type=float, nargs="+", metavar="MS", help="step latency of each model in ms "
                   "(one decoding step of a batch), e.g. --L 6.0 27.9")
    g.add_argument("--spec", metavar="FILE.json", help="system spec JSON (general M, P, C, L; see docs/formats.md)")
    g.add_argument("--L-table", metavar="FILE", help="batch-size-dependent step latencies L_i(b): JSON list of "
                   "per-model curves ({batch_size, step_latency_ms} tables, {intercept_ms, per_request_ms} affine "
                   "laws, or null) or CSV with columns model,batch_size,step_latency_ms (ms)")
    g.add_argument("--max-batch", nargs="+", metavar="CAP", help="batch cap per model (requests; 'none' for no cap); "
                   "the excess keeps waiting")
    g.add_argument("--delta", metavar="MS", help="time quantum in ms, or 'auto' for the coarsest grid that "
                   "represents every latency within --delta-rtol (default 0.1, or the spec's delta_ms); every "
                   "latency must be a multiple of it unless --round")
    g.add_argument("--delta-rtol", type=float, default=0.01, metavar="R", help="relative rounding error allowed "
                   "by --delta auto (default %(default)g)")
    g.add_argument("--round", action="store_true", help="round latencies to the delta grid and report the error")
    g.add_argument("--check-delta", action="store_true", help="also solve at delta/2 (when it fits under "
                   "--max-states) and report how much the throughput and B* move")
    s = p.add_argument_group("search")
    s.add_argument("--N", nargs="+", metavar="N", help="concurrency: integers or ranges, e.g. 1-16 32 "
                   f"(default {' '.join(map(str, DEFAULT_NS))})")
    s.add_argument("--B", type=int, nargs="+", metavar="B", help="evaluate exactly this threshold vector "
                   "instead of searching")
    s.add_argument("--method", choices=("exact", "simulate", "auto"), default="exact",
                   help="exact: the Markov chain (default); simulate: the per-request event simulator (95%% "
                   "intervals, statistical ties reported); auto: exact when the chain fits under --max-states "
                   "(default 1,000,000 for auto so the decision is quick), the simulator otherwise")
    s.add_argument("--trace", metavar="FILE.jsonl", help="simulate: drive routing by a recorded routing trace "
                   "(non-geometric runs) instead of P")
    s.add_argument("--sim-budget", type=float, default=60.0, metavar="S", help="simulate: wall-clock budget "
                   "per N for the threshold search, seconds (default %(default)g)")
    s.add_argument("--sim-steps", type=int, default=2_000_000, metavar="STEPS", help="simulate with --B: "
                   "request-steps measured per run (default %(default)s)")
    s.add_argument("--jitter", type=float, default=0.0, metavar="CV", help="simulate: coefficient of variation "
                   "of a log-normal factor on every step latency (default 0)")
    s.add_argument("--seed", type=int, default=0, help="simulate: random seed (default 0)")
    s.add_argument("--search", choices=("exhaustive", "local"), default="exhaustive",
                   help="exhaustive: every feasible B (the definition of B*, default); local: steepest ascent "
                   "over +-1 neighbours from the previous N's B* (far fewer chains; a heuristic)")
    s.add_argument("--solver", default="auto", choices=dtmc.SOLVERS, help="stationary solver (default auto: "
                   "compiled Gauss-Seidel, direct LU fallback)")
    s.add_argument("--tol", type=float, default=dtmc.DEFAULT_TOL, help="stationary residual tolerance, "
                   "relative to max(pi) (default %(default)g)")
    s.add_argument("--max-states", type=int, default=None, metavar="S",
                   help=f"refuse chains with more states than this (default {dtmc.DEFAULT_MAX_STATES:,}, "
                   "about 8 GiB at ~10 transitions per state: fits comfortably in 24 GB; exit code 3)")
    s.add_argument("--workers", default="auto", metavar="K", help="local worker processes for the search "
                   "(default auto: the machine's cores when the sweep has more than 200 chains to evaluate, "
                   "else 1; results are identical for any K)")
    s.add_argument("--dask", metavar="ADDRESS", help="run the evaluations on an existing Dask distributed "
                   "scheduler, e.g. tcp://10.0.0.5:8786 (needs the 'dask' extra)")
    s.add_argument("--cache-dir", metavar="DIR", help="result cache folder (default $TR_MODEL_CACHE_DIR or "
                   "~/.cache/tr-model/evaluations)")
    s.add_argument("--no-cache", action="store_true", help="neither read nor write the result cache")
    o = p.add_argument_group("output")
    o.add_argument("--format", choices=("table", "json", "csv"), default="table", help="stdout format")
    o.add_argument("--all", action="store_true", help="also output every evaluated B")
    o.add_argument("--out", metavar="FILE.json", help="also write the JSON document to this file (atomically)")
    o.add_argument("--plot", metavar="FILE", help="also plot throughput over the evaluated B for each N, B* "
                   "marked, eager drawn (.png, .svg or .pdf; needs a search, not --B)")
    o.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _parse_delta(value):
    if value is None or value == "auto":
        return value
    try:
        delta = float(value)
    except ValueError:
        raise SpecError(f"--delta must be a number of ms or 'auto', got {value!r}") from None
    if not math.isfinite(delta) or delta <= 0:
        raise SpecError(f"--delta must be > 0 ms, got {value}")
    return delta


def _parse_caps(values, M):
    if values is None:
        return None
    if len(values) != M:
        raise SpecError(f"--max-batch needs M = {M} values (one per model), got {len(values)}")
    caps = []
    for v in values:
        if str(v).lower() in ("none", "null", "-"):
            caps.append(None)
            continue
        try:
            c = int(v)
        except ValueError:
            raise SpecError(f"--max-batch values must be integers >= 1 or 'none', got {v!r}") from None
        if c < 1:
            raise SpecError(f"--max-batch values must be >= 1, got {c}")
        caps.append(c)
    return caps


def spec_from_args(a):
    """The system spec the flags describe (delta 'auto' is resolved later, once N is known)."""
    from dataclasses import replace

    # other tools reuse this with parsers that lack the extension flags
    for flag in ("L_table", "max_batch"):
        if not hasattr(a, flag):
            setattr(a, flag, None)
    spec = _base_spec_from_args(a)
    if a.L_table:
        from tr_core.grid import load_latency_table
        spec = replace(spec, latency_curves=tuple(load_latency_table(a.L_table, spec.M)))
    caps = _parse_caps(a.max_batch, spec.M)
    if caps is not None:
        spec = replace(spec, max_batch_size=tuple(caps))
    return spec


def _base_spec_from_args(a):
    delta = _parse_delta(a.delta)
    if a.spec:
        if a.L or a.p is not None or a.q is not None or a.weights or a.algo:
            raise SpecError("--spec defines the whole system; do not combine it with --L/--p/--q/--weights/--algo")
        spec = load_spec(a.spec)
        return spec.with_delta(delta) if isinstance(delta, float) else spec
    algo = a.algo
    if algo is None:
        if a.weights:
            algo = "me"
        elif a.p is not None:
            algo = "r2r"
        else:
            raise SpecError("define the system with --p (R2R preset), --algo, --weights or --spec")
    if not a.L and a.L_table:
        from tr_core.grid import load_latency_table
        M = len(a.weights) if a.weights else 2
        curves = load_latency_table(a.L_table, M)
        if any(c is None for c in curves):
            raise SpecError("--L is required for models without a curve in --L-table")
        a.L = [c.latency_ms(1) for c in curves]
    if not a.L:
        raise SpecError("--L is required: the step latency of each model in ms, e.g. --L 6.0 27.9")
    for i, L in enumerate(a.L):
        if not math.isfinite(L) or L <= 0:
            raise SpecError(f"--L values must be > 0 ms, got {L:g} for model {i}")
    if algo != "me" and a.weights:
        raise SpecError(f"--weights applies to --algo me, not {algo}")
    if algo in ("r2r", "citer", "co-llm") and a.q is not None:
        raise SpecError(f"--q applies to --algo r-stitch, not {algo}")
    return preset(algo, a.L, p=a.p, q=a.q, weights=a.weights, delta_ms=delta if isinstance(delta, float) else 0.1)


def _parse_workers(value: str, M: int, Ns) -> int:
    from optimizer.search import count_feasible
    from tr_core.cli import default_workers
    if value == "auto":
        total = sum(count_feasible(M, N) for N in Ns)
        return default_workers() if total > 200 else 1
    try:
        k = int(value)
    except ValueError:
        raise SpecError(f"--workers must be an integer >= 1 or 'auto', got {value!r}") from None
    if k < 1:
        raise SpecError(f"--workers must be >= 1, got {k}")
    return k


def _dask_client(address: str):
    try:
        from distributed import Client
    except ImportError:
        raise SpecError("--dask needs the 'dask' extra: pip install 'tokenrouter-model[dask]'") from None
    try:
        return Client(address, timeout=10)
    except (OSError, TimeoutError) as e:
        raise SpecError(f"--dask: cannot connect to the scheduler at {address!r}: {e}") from None


def _fmt_lat(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:.2f}"


def main_impl(argv=None) -> int:
    from tr_model.api import evaluate, optimize_many

    a = build_parser().parse_args(argv)
    spec = spec_from_args(a)
    Ns = parse_int_list(a.N, "--N") if a.N else list(DEFAULT_NS)
    if not Ns:
        raise SpecError("--N: no concurrency given")
    import dtmc
    if a.max_states is None:
        a.max_states = 1_000_000 if a.method == "auto" else dtmc.DEFAULT_MAX_STATES
    if a.max_states < 1:
        raise SpecError(f"--max-states must be >= 1, got {a.max_states}")
    if a.trace and a.method == "exact":
        raise SpecError("--trace drives the simulator: use it with --method simulate or auto")
    if not (a.sim_budget > 0):
        raise SpecError(f"--sim-budget must be > 0 seconds, got {a.sim_budget:g}")
    if a.sim_steps < 1000:
        raise SpecError(f"--sim-steps must be >= 1000, got {a.sim_steps}")
    if not (0 <= a.jitter < 10):
        raise SpecError(f"--jitter must be in [0, 10), got {a.jitter:g}")
    workers = _parse_workers(a.workers, spec.M, Ns)
    if a.plot:
        from tr_model.plots import check_plot_path
        check_plot_path(a.plot)  # a bad extension or folder fails before any work
        if a.B is not None:
            raise SpecError("--plot draws a search over B; drop --B")
    if not (a.tol > 0):
        raise SpecError(f"--tol must be > 0, got {a.tol:g}")
    if a.delta == "auto":
        from dataclasses import replace
        from tr_core.grid import coarsest_delta, spec_latencies
        delta = coarsest_delta(spec_latencies(spec, max(Ns)), a.delta_rtol)
        spec = replace(spec, delta_ms=delta)
        a.round = True
        if a.format == "table":
            sys.stderr.write(f"note: --delta auto chose delta = {delta:.6g} ms (every latency within "
                             f"{a.delta_rtol:g} relative)\n")
    # validate the grid once, up front, for every N (batch-dependent latencies depend on N)
    roundings = []
    for N in Ns if a.method != "simulate" else ():
        # the simulator runs in continuous time and needs no grid
        _, r = spec.quanta_table(N, round_to_grid=a.round)
        roundings.extend(x for x in r if x not in roundings)
    if roundings and a.format == "table":
        if len(roundings) <= 2 * spec.M:
            for r in roundings:
                sys.stderr.write(f"note: model {r['model']} latency {r['step_latency_ms']:g} ms rounded to "
                                 f"{r['rounded_ms']:.6g} ms (relative error {r['relative_error']:+.3g})\n")
        else:
            for i in range(spec.M):
                mine = [r for r in roundings if r["model"] == i]
                if mine:
                    worst = max(mine, key=lambda r: abs(r["relative_error"]))
                    sys.stderr.write(f"note: model {i}: {len(mine)} batch-size latencies rounded to the grid, "
                                     f"largest relative error {worst['relative_error']:+.3g} at batch size "
                                     f"{worst['batch_size']}\n")
    kw = dict(solver=a.solver, tol=a.tol, max_states=a.max_states, round_to_grid=a.round)
    if not a.no_cache:
        from optimizer.cache import default_cache_dir
        kw["cache"] = a.cache_dir or default_cache_dir()

    doc: dict = {"schema_version": OUTPUT_SCHEMA_VERSION, "spec": spec_to_dict(spec), "results": []}
    if a.delta == "auto":
        doc["delta_auto"] = {"delta_ms": spec.delta_ms, "rtol": a.delta_rtol}
    if roundings:
        doc["roundings"] = roundings
    if a.method != "exact":
        found: list = []
        _run_simulation_methods(spec, Ns, a, kw, doc, found)
        rows, headers = _simulation_rows(doc)
        if a.plot:
            from tr_model.plots import plot_throughput
            plot_throughput(found, a.plot)
    elif a.B is not None:
        for N in Ns:
            ev = evaluate(spec, N, a.B, **kw)
            doc["results"].append(ev.to_dict())
        rows = [[r["N"], " ".join(map(str, r["B"])), f"{r['throughput_tok_s']:.2f}",
                 f"{r['per_request_tok_s']:.2f}",
                 " ".join(_fmt_lat(x if x is not None else float('nan')) for x in r["admission_latency_ms"]),
                 r["states"], r["transitions"], f"{r['residual']:.1e}", f"{r['seconds']:.3f}"]
                for r in doc["results"]]
        headers = ["N", "B", "tok/s", "tok/s/req", "admission_ms", "states", "transitions", "residual", "seconds"]
    if a.method == "exact" and a.B is None:
        prog = Progress("tr-optimize", enabled=(sys.stderr.isatty() and not a.quiet))
        client = _dask_client(a.dask) if a.dask else None
        try:
            opts = optimize_many(spec, Ns, workers=workers, executor=client, progress=prog, search=a.search, **kw)
        finally:
            if client is not None:
                client.close()
        if a.plot:
            from tr_model.plots import plot_throughput
            plot_throughput(opts, a.plot)
        table = []
        for o in opts:
            doc["results"].append(o.to_dict())
            if a.all:
                table.extend(e.to_dict() for e in o.evaluations)
        if a.all:
            doc["table"] = table
        rows = [[r["N"], " ".join(map(str, r["B"])), f"{r['throughput_tok_s']:.2f}",
                 f"{r['eager_throughput_tok_s']:.2f}", f"{r['gain_vs_eager']:.3f}x", f"{r['per_request_tok_s']:.2f}",
                 " ".join(_fmt_lat(x if x is not None else float('nan')) for x in r["admission_latency_ms"]),
                 r["states"], r["evaluated"], f"{r['max_residual']:.1e}", f"{r['seconds']:.3f}"]
                for r in doc["results"]]
        headers = ["N", "B*", "tok/s", "eager tok/s", "gain", "tok/s/req", "admission_ms", "states", "evaluated",
                   "residual", "seconds"]

    if a.check_delta:
        doc["delta_check"] = _check_delta(spec, Ns, a, kw, doc["results"])
    if a.out:
        write_json_atomic(a.out, doc)
    if a.format == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    elif a.format == "csv":
        if a.all and "table" in doc:
            keys = ["N", "B", "throughput_tok_s", "states", "transitions", "residual", "solver", "seconds"]
            sys.stdout.write(to_csv(keys, [[t[k] if k != "B" else " ".join(map(str, t[k])) for k in keys]
                                           for t in doc["table"]]))
        else:
            keys = [k for k in doc["results"][0] if not isinstance(doc["results"][0][k], (list, dict))
                    or k == "B"]
            sys.stdout.write(to_csv(keys, [[" ".join(map(str, r[k])) if isinstance(r[k], list) else r[k]
                                            for k in keys] for r in doc["results"]]))
    else:
        name = spec.name
        Ls = ", ".join(f"{x:g}" for x in spec.step_latency_ms)
        sys.stdout.write(f"system: {name}, M = {spec.M}, L = ({Ls}) ms, delta = {spec.delta_ms:g} ms\n")
        sys.stdout.write(format_table(headers, rows) + "\n")
        if "delta_check" in doc:
            sys.stdout.write(f"\ndelta check (delta = {spec.delta_ms:g} ms vs {spec.delta_ms / 2:g} ms):\n")
            sys.stdout.write(format_table(
                ["N", "tok/s", "tok/s at delta/2", "relative change", "B", "B at delta/2", "B* moved"],
                [[c["N"], f"{c['throughput_tok_s']:.2f}",
                  "-" if c["half_delta_throughput_tok_s"] is None else f"{c['half_delta_throughput_tok_s']:.2f}",
                  "-" if c["relative_change"] is None else f"{c['relative_change']:+.2e}",
                  " ".join(map(str, c["B"])),
                  "-" if c["half_delta_B"] is None else " ".join(map(str, c["half_delta_B"])),
                  c["note"] or ("yes" if c["B_moved"] else "no")] for c in doc["delta_check"]]) + "\n")
        if a.all and "table" in doc:
            sys.stdout.write("\nevaluated thresholds:\n")
            sys.stdout.write(format_table(["N", "B", "tok/s", "states", "transitions", "residual", "seconds"],
                                          [[t["N"], " ".join(map(str, t["B"])), f"{t['throughput_tok_s']:.2f}",
                                            t["states"], t["transitions"], f"{t['residual']:.1e}",
                                            f"{t['seconds']:.3f}"] for t in doc["table"]]) + "\n")
    return 0


def _simulator_kwargs(a):
    kw = dict(seed=a.seed, jitter=a.jitter)
    if a.trace:
        from simulator import read_trace
        kw["trace"] = read_trace(a.trace)
    return kw


def _run_simulation_methods(spec, Ns, a, kw, doc, found=None):
    """--method simulate|auto: per N, the exact chain when allowed and affordable, else the simulator.

    The optimum objects (exact or simulated) are appended to ``found`` for plotting.
    """
    from tr_model.api import evaluate, optimize
    from tr_core.errors import StateSpaceTooLarge

    sim_kw = None
    for N in Ns:
        if a.method == "auto" and not a.trace:
            try:
                if a.B is not None:
                    r = evaluate(spec, N, a.B, **kw).to_dict()
                else:
                    opt = optimize(spec, N, **kw)
                    r = opt.to_dict()
                    if found is not None:
                        found.append(opt)
                r.update(method="exact", ci95_tok_s=0.0, tie_set=[r["B"]])
                doc["results"].append(r)
                continue
            except StateSpaceTooLarge:
                pass
        if sim_kw is None:
            sim_kw = _simulator_kwargs(a)
        doc["results"].append(_simulate_one(spec, N, a, sim_kw, found))


def _simulate_one(spec, N, a, sim_kw, found=None):
    import simulator

    if a.B is not None:
        res = simulator.simulate(spec, N, a.B, steps=a.sim_steps, **sim_kw)
        return {"N": N, "B": list(res.B), "method": "simulate", "throughput_tok_s": res.throughput_tok_s,
                "ci95_tok_s": res.throughput_ci95_tok_s, "per_request_tok_s": res.per_request_tok_s,
                "admission_latency_ms": list(res.admission_latency_ms), "mean_waiting": list(res.mean_waiting),
                "request_steps": res.request_steps, "tie_set": [list(res.B)], "seconds": res.wall_s}
    o = simulator.optimize_by_simulation(spec, N, budget_s=a.sim_budget, **sim_kw)
    if found is not None:
        found.append(o)
    best = o.ranking.entries[0].result
    return {"N": N, "B": list(o.best_B), "method": "simulate", "throughput_tok_s": o.throughput_tok_s,
            "ci95_tok_s": o.ci95_tok_s, "eager_throughput_tok_s": o.eager_throughput_tok_s,
            "eager_ci95_tok_s": o.eager_ci95_tok_s, "gain_vs_eager": 1.0 + o.gain_vs_eager,
            "gain_ci95": o.gain_ci95, "per_request_tok_s": best.per_request_tok_s,
            "admission_latency_ms": list(best.admission_latency_ms), "tie_set": [list(b) for b in o.tie_set],
            "ranking": o.ranking.to_rows(), "evaluated": o.evaluated, "simulations": o.simulations,
            "request_steps": o.request_steps, "seconds": o.seconds}


def _simulation_rows(doc):
    rows = []
    for r in doc["results"]:
        ci = r.get("ci95_tok_s") or 0.0
        thr = f"{r['throughput_tok_s']:.2f}" + (f" +- {ci:.2f}" if r["method"] != "exact" else "")
        eager = r.get("eager_throughput_tok_s")
        ties = r.get("tie_set") or []
        tied = [" ".join(map(str, t)) for t in ties if list(t) != list(r["B"])]
        rows.append([r["N"], " ".join(map(str, r["B"])), thr, "-" if eager is None else f"{eager:.2f}",
                     "-" if r.get("gain_vs_eager") is None else f"{r['gain_vs_eager']:.3f}x", r["method"],
                     ", ".join(tied) if tied else "-", f"{r['seconds']:.2f}"])
    return rows, ["N", "B*", "tok/s (95% CI)", "eager tok/s", "gain", "method", "statistically tied with", "seconds"]


def _check_delta(spec, Ns, a, kw, results):
    """Re-solve at delta/2 and report the change in throughput and B*."""
    from tr_model.api import evaluate, optimize
    from tr_core.errors import StateSpaceTooLarge

    half = spec.with_delta(spec.delta_ms / 2)
    kw = dict(kw, round_to_grid=True)
    out = []
    for r in results:
        N = r["N"]
        rec = {"N": N, "throughput_tok_s": r["throughput_tok_s"], "B": r["B"], "half_delta_ms": half.delta_ms,
               "half_delta_throughput_tok_s": None, "half_delta_B": None, "relative_change": None,
               "B_moved": None, "note": ""}
        try:
            if a.B is not None:
                ev = evaluate(half, N, a.B, **kw)
                thr, B = ev.throughput_tok_s, list(ev.B)
            else:
                o = optimize(half, N, **kw)
                thr, B = o.throughput_tok_s, list(o.best_B)
        except StateSpaceTooLarge:
            rec["note"] = "not affordable (exceeds --max-states)"
            out.append(rec)
            continue
        rec.update(half_delta_throughput_tok_s=thr, half_delta_B=B,
                   relative_change=(thr - r["throughput_tok_s"]) / r["throughput_tok_s"],
                   B_moved=(B != r["B"]))
        out.append(rec)
    return out


def main(argv=None) -> int:
    return run_cli(main_impl, argv)


if __name__ == "__main__":
    sys.exit(main())
