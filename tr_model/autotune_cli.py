"""``tr-autotune``: thresholds files for servers, and the KV-cache plan of co-located models.

Subcommands::

    tr-autotune run     --spec FILE | --p P --L MS MS   --max-concurrency N --out FILE
                        [--time-budget-s S] [--background] [--cache-dir DIR]
    tr-autotune show    FILE [--active-requests N] [--require-concurrency N] [--format table|json|csv]
    tr-autotune kv-plan --placement FILE [--gpu-memory-gib G] [--memory-budget-fraction F]
                        [--max-concurrency N] [--format table|json|csv] [--out FILE]
    tr-autotune measure --p P --L MS MS --clients N (--B B0 B1 | --thresholds FILE)
                        [--time-scale S] [--duration-s S] [--warmup-s S]

``tr-autotune --spec FILE --max-concurrency N --out FILE`` (no subcommand) means ``run``.
Bad input: one ``error:`` line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import math
import sys

from tr_core.cli import Parser, format_table, run_cli, to_csv
from tr_core.errors import SpecError

SUBCOMMANDS = ("run", "show", "kv-plan", "measure")


def build_parser() -> Parser:
    p = Parser(prog="tr-autotune", description="Compute delayed-batching thresholds B*(N) for N = 1..max "
               "concurrency into a thresholds file a server reads at start (tr_model.thresholds), inspect such "
               "files, and plan the KV-cache budget of models sharing GPUs.")
    sub = p.add_subparsers(dest="command", parser_class=Parser, metavar="{run,show,kv-plan,measure}")

    r = sub.add_parser("run", help="compute (or reuse) the thresholds file for a spec",
                       description="Compute B*(N) for N = 1..--max-concurrency and write the thresholds file "
                       "atomically. A file (or --cache-dir entry) with the same inputs hash is reused at once; a "
                       "partial one is resumed.")
    g = r.add_argument_group("system (--spec, or a preset via --p/--algo/--weights with --L)")
    g.add_argument("--spec", metavar="FILE.json", help="system spec JSON (tr_core.spec format)")
    g.add_argument("--algo", choices=("r2r", "citer", "co-llm", "r-stitch", "me"), help="routing preset")
    g.add_argument("--p", type=float, help="escalation probability per token from model 0 (r2r/citer/co-llm, "
                   "r-stitch)")
    g.add_argument("--q", type=float, help="r-stitch: probability per token of switching back 1->0")
    g.add_argument("--weights", type=float, nargs="+", metavar="W", help="me: ensemble weights, one per model")
    g.add_argument("--L", type=float, nargs="+", metavar="MS", help="step latency of each model, milliseconds")
    g.add_argument("--delta", type=float, metavar="MS", help="time quantum in milliseconds (default 0.1 or the "
                   "spec's)")
    g.add_argument("--round", action="store_true", help="round latencies to the delta grid (reported)")
    t = r.add_argument_group("tuning")
    t.add_argument("--max-concurrency", type=int, required=True, metavar="N", help="largest number of active "
                   "requests the server admits; the table covers N = 1..this")
    t.add_argument("--out", required=True, metavar="FILE.json", help="thresholds file to write (atomically)")
    t.add_argument("--time-budget-s", type=float, metavar="S", help="stop the foreground computation when the "
                   "next N is predicted to overrun S seconds (default: no limit); the file then has "
                   "complete=false")
    t.add_argument("--background", action="store_true", help="with --time-budget-s: finish the remaining N in a "
                   "separate process that replaces the file atomically when done")
    t.add_argument("--cache-dir", metavar="DIR", help="also keep complete tables as DIR/<inputs_sha256>.json")
    t.add_argument("--solver", default="auto", help="stationary solver passed to tr_model.optimize (default auto)")
    t.add_argument("--tol", type=float, help="stationary residual tolerance (default: the solver's)")
    t.add_argument("--max-states", type=int, metavar="S", help="stop the table before the first N whose chain "
                   "has more than S states")
    t.add_argument("--worker-lock", help="(internal) lock file of a background worker")
    t.add_argument("--worker-token", help="(internal) the worker's token in --worker-lock")
    t.add_argument("--format", choices=("table", "json", "csv"), default="table", help="stdout format of the "
                   "summary")
    t.add_argument("--quiet", action="store_true", help="print nothing on success")

    s = sub.add_parser("show", help="validate a thresholds file and print it (or one lookup)",
                       description="Validate a thresholds file with the vendorable reader and print B*(N).")
    s.add_argument("file", metavar="FILE.json")
    s.add_argument("--active-requests", type=int, metavar="N", help="print only lookup(N) (N beyond the table "
                   "uses its largest N)")
    s.add_argument("--require-concurrency", type=int, metavar="N", help="fail unless the table covers 1..N")
    s.add_argument("--format", choices=("table", "json", "csv"), default="table")

    k = sub.add_parser("kv-plan", help="joint KV-cache budget of subservers sharing GPUs (paper, Appendix B)",
                       description="From each model's config.json and a placement (GPUs per model, tensor "
                       "parallelism), compute weight and KV bytes, the largest common KV-token capacity that "
                       "fits every GPU's budget, and each subserver's memory fraction and launch arguments.")
    k.add_argument("--placement", required=True, metavar="FILE.json", help="placement JSON (see docs/autotune.md; "
                   "example: data/models/paper-placement.json)")
    k.add_argument("--gpu-memory-gib", type=float, metavar="GIB", help="memory of every GPU in GiB (overrides "
                   "the file)")
    k.add_argument("--memory-budget-fraction", type=float, metavar="F", help="fraction of each GPU's memory the "
                   "subservers may use together, in (0, 1] (overrides the file)")
    k.add_argument("--max-concurrency", type=int, metavar="N", help="also report the context tokens each of N "
                   "requests can keep")
    k.add_argument("--format", choices=("table", "json", "csv"), default="table")
    k.add_argument("--out", metavar="FILE.json", help="also write the plan as JSON (atomically)")

    m = sub.add_parser("measure", help="run the reference runtime (emulated steps) and compare with the chain",
                       description="N closed-loop clients against the reference asyncio runtime (three loops per "
                       "subserver, delayed batching), every step sleeping L_i(b) * --time-scale; prints measured "
                       "throughput, per-request speed and admission latency in the spec's time units next to the "
                       "chain's prediction.")
    g = m.add_argument_group("system (--spec, or a preset via --p/--algo/--weights with --L)")
    g.add_argument("--spec", metavar="FILE.json", help="system spec JSON (tr_core.spec format)")
    g.add_argument("--algo", choices=("r2r", "citer", "co-llm", "r-stitch", "me"), help="routing preset")
    g.add_argument("--p", type=float, help="escalation probability per token from model 0")
    g.add_argument("--q", type=float, help="r-stitch: probability per token of switching back 1->0")
    g.add_argument("--weights", type=float, nargs="+", metavar="W", help="me: ensemble weights, one per model")
    g.add_argument("--L", type=float, nargs="+", metavar="MS", help="step latency of each model, milliseconds")
    g.add_argument("--delta", type=float, metavar="MS", help="time quantum of the prediction, milliseconds")
    m.add_argument("--clients", type=int, required=True, metavar="N", help="closed-loop clients (concurrency N)")
    th = m.add_mutually_exclusive_group(required=True)
    th.add_argument("--B", type=int, nargs="+", metavar="B", help="fixed threshold vector, one per model")
    th.add_argument("--thresholds", metavar="FILE.json", help="thresholds file, looked up with the live active "
                    "count")
    m.add_argument("--time-scale", type=float, default=10.0, metavar="X", help="every emulated step lasts L_i(b) times this "
                   "(default 10)")
    m.add_argument("--duration-s", type=float, default=30.0, metavar="S", help="measured window, wall-clock "
                   "seconds (default 30)")
    m.add_argument("--warmup-s", type=float, default=2.0, metavar="S", help="warm-up before the window, wall-clock "
                   "seconds (default 2)")
    m.add_argument("--output-tokens", type=int, default=512, metavar="T", help="output tokens per request "
                   "(default 512)")
    m.add_argument("--seed", type=int, default=0, help="seed of the routing draws (default 0)")
    m.add_argument("--no-predict", action="store_true", help="skip the chain's prediction")
    m.add_argument("--format", choices=("table", "json", "csv"), default="table", help="stdout format")
    return p


def _summary_rows(table) -> list:
    rows = []
    for n in range(1, table.covered_concurrency + 1):
        pred = table.predicted_tok_s[n - 1] if table.predicted_tok_s else math.nan
        eag = table.eager_tok_s[n - 1] if table.eager_tok_s else math.nan
        gain = pred / eag if eag and math.isfinite(eag) and eag > 0 else math.nan
        rows.append([n, " ".join(map(str, table.thresholds[n - 1])), f"{pred:.2f}", f"{eag:.2f}", f"{gain:.4f}"])
    return rows


def _print_table(table, fmt: str, path: str | None) -> None:
    headers = ["N", "B*", "predicted_tok_s", "eager_tok_s", "gain_vs_eager"]
    if fmt == "json":
        with open(path, "r", encoding="utf-8") as f:
            sys.stdout.write(json.dumps(json.load(f), indent=1) + "\n")
    elif fmt == "csv":
        sys.stdout.write(to_csv(headers, _summary_rows(table)))
    else:
        status = "complete" if table.complete else f"partial (N = 1..{table.covered_concurrency})"
        sys.stdout.write(f"thresholds for N = 1..{table.max_concurrency}: {status}\n")
        sys.stdout.write(format_table(headers, _summary_rows(table)) + "\n")


def _spec_from_args(a):
    from tr_core.spec import load_spec, preset
    if a.delta is not None and (not math.isfinite(a.delta) or a.delta <= 0):
        raise SpecError(f"--delta must be > 0 ms, got {a.delta:g}")
    if a.spec:
        if a.L or a.p is not None or a.q is not None or a.weights or a.algo:
            raise SpecError("--spec defines the whole system; do not combine it with --L/--p/--q/--weights/--algo")
        spec = load_spec(a.spec)
        return spec.with_delta(a.delta) if a.delta is not None else spec
    algo = a.algo or ("me" if a.weights else ("r2r" if a.p is not None else None))
    if algo is None:
        raise SpecError("define the system with --spec FILE, or a preset: --p (R2R), --algo, --weights")
    if not a.L:
        raise SpecError("--L is required with a preset: the step latency of each model in ms, e.g. --L 6.0 27.9")
    return preset(algo, a.L, p=a.p, q=a.q, weights=a.weights, delta_ms=0.1 if a.delta is None else a.delta)


def _cmd_run(a) -> int:
    import os

    from tr_model import autotune
    if a.max_concurrency < 1:
        raise SpecError(f"--max-concurrency must be >= 1, got {a.max_concurrency}")
    if a.time_budget_s is not None and (not math.isfinite(a.time_budget_s) or a.time_budget_s < 0):
        raise SpecError(f"--time-budget-s must be >= 0 seconds, got {a.time_budget_s:g}")
    if a.background and a.time_budget_s is None:
        raise SpecError("--background needs --time-budget-s (otherwise everything is computed in the foreground)")
    if a.max_states is not None and a.max_states < 1:
        raise SpecError(f"--max-states must be >= 1, got {a.max_states}")
    if a.tol is not None and (not math.isfinite(a.tol) or a.tol <= 0):
        raise SpecError(f"--tol must be > 0, got {a.tol:g}")
    folder = os.path.dirname(os.path.abspath(a.out))
    if not os.path.isdir(folder):
        raise SpecError(f"--out: folder {folder!r} does not exist")
    spec = _spec_from_args(a)
    try:
        table = autotune.tune(spec, a.max_concurrency, a.out, time_budget_s=a.time_budget_s,
                              cache_dir=a.cache_dir, background=a.background, solver=a.solver, tol=a.tol,
                              max_states=a.max_states, round_to_grid=a.round, worker_lock=a.worker_lock,
                              worker_token=a.worker_token)
    finally:
        if a.worker_lock is not None and autotune._owns_lock(a.worker_lock, a.worker_token):
            for leftover in (a.worker_lock, a.spec if a.spec and a.spec.endswith(".worker-spec.json") else None):
                try:
                    if leftover:
                        os.unlink(leftover)
                except OSError:
                    pass
    if not a.quiet:
        _print_table(table, a.format, a.out)
    return 0


def _cmd_show(a) -> int:
    from tr_model.thresholds import ThresholdTable
    if a.require_concurrency is not None and a.require_concurrency < 1:
        raise SpecError(f"--require-concurrency must be >= 1, got {a.require_concurrency}")
    table = ThresholdTable.load(a.file, require_concurrency=a.require_concurrency)
    if a.active_requests is not None:
        if a.active_requests < 0:
            raise SpecError(f"--active-requests must be >= 0, got {a.active_requests}")
        b = table.lookup(a.active_requests)
        if a.format == "json":
            sys.stdout.write(json.dumps({"active_requests": a.active_requests, "thresholds": list(b)}) + "\n")
        elif a.format == "csv":
            sys.stdout.write(to_csv(["active_requests", "thresholds"], [[a.active_requests, " ".join(map(str, b))]]))
        else:
            sys.stdout.write(" ".join(map(str, b)) + "\n")
        return 0
    _print_table(table, a.format, a.file)
    return 0


def _gib(x: float) -> str:
    return f"{x / 2 ** 30:.3f}"


def _cmd_kv_plan(a) -> int:
    from tr_model.kvplan import load_placement, plan_kv_cache, plan_to_dict
    from tr_core.spec import write_json_atomic
    if a.max_concurrency is not None and a.max_concurrency < 1:
        raise SpecError(f"--max-concurrency must be >= 1, got {a.max_concurrency}")
    if a.gpu_memory_gib is not None and (not math.isfinite(a.gpu_memory_gib) or a.gpu_memory_gib <= 0):
        raise SpecError(f"--gpu-memory-gib must be > 0, got {a.gpu_memory_gib:g}")
    placement = load_placement(a.placement, gpu_memory_gib=a.gpu_memory_gib,
                               memory_budget_fraction=a.memory_budget_fraction)
    plan = plan_kv_cache(placement)
    doc = plan_to_dict(plan, a.max_concurrency)
    if a.out:
        write_json_atomic(a.out, doc)
    headers = ["model", "gpus", "tp", "weights_gib_per_gpu", "kv_bytes_per_token_per_gpu", "kv_cache_gib_per_gpu",
               "memory_fraction", "sglang_args"]
    rows = [[s["model"], ",".join(map(str, s["gpus"])), s["tensor_parallel"], _gib(s["weight_bytes_per_gpu"]),
             s["kv_bytes_per_token_per_gpu"], _gib(s["kv_cache_bytes_per_gpu"]), f"{s['memory_fraction']:.4f}",
             " ".join(s["launch_args"]["sglang"])] for s in plan.subservers]
    if a.format == "json":
        sys.stdout.write(json.dumps(doc, indent=1) + "\n")
    elif a.format == "csv":
        sys.stdout.write(to_csv(headers, rows))
    else:
        sys.stdout.write(f"common KV-token capacity: {plan.kv_token_capacity} tokens per model "
                         f"(binding GPU {plan.binding_gpu})")
        if a.max_concurrency:
            sys.stdout.write(f"; {plan.tokens_per_request(a.max_concurrency)} tokens per request at N = "
                             f"{a.max_concurrency}")
        sys.stdout.write("\n" + format_table(headers, rows) + "\n\n")
        grows = [[g["gpu"], " + ".join(g["models"]), _gib(g["budget_bytes"]), _gib(g["weight_bytes"]),
                  g["kv_bytes_per_token"], g["capacity_tokens"], _gib(g["used_bytes"])] for g in plan.gpus]
        sys.stdout.write(format_table(["gpu", "models", "budget_gib", "weights_gib", "kv_bytes_per_token",
                                       "capacity_tokens", "used_gib"], grows) + "\n")
    return 0


def _cmd_measure(a) -> int:
    from tr_model.runtime import EmulatedExecutor, measure_closed_loop
    from tr_model.thresholds import ThresholdTable
    a.round = False
    spec = _spec_from_args(a)
    if a.clients < 1:
        raise SpecError(f"--clients must be >= 1, got {a.clients}")
    for flag, v in (("--time-scale", a.time_scale), ("--duration-s", a.duration_s)):
        if not math.isfinite(v) or v <= 0:
            raise SpecError(f"{flag} must be > 0, got {v:g}")
    if not math.isfinite(a.warmup_s) or a.warmup_s < 0:
        raise SpecError(f"--warmup-s must be >= 0, got {a.warmup_s:g}")
    if a.output_tokens < 1:
        raise SpecError(f"--output-tokens must be >= 1, got {a.output_tokens}")
    if a.thresholds:
        table = ThresholdTable.load(a.thresholds)
        if table.num_models != spec.M:
            raise SpecError(f"--thresholds has {table.num_models} models, the system has {spec.M}")
        B, thresholds = table.lookup(a.clients), table
    else:
        from tr_core.feasibility import check_thresholds
        B = check_thresholds(a.B, a.clients, spec.M, name="--B")
        thresholds = B
    ex = EmulatedExecutor(spec.latency_ms, time_scale=a.time_scale)
    r = measure_closed_loop(spec, a.clients, thresholds, ex, duration_s=a.duration_s, warmup_s=a.warmup_s,
                            max_output_tokens=a.output_tokens, seed=a.seed)
    doc = {"N": a.clients, "B": list(B), "time_scale": a.time_scale, "model_seconds": r.window_s,
           "measured": {"throughput_tok_s": r.throughput_tok_s, "throughput_ci95_tok_s": r.throughput_ci95_tok_s,
                        "per_request_tok_s": r.per_request_tok_s, "admission_latency_ms": list(r.admission_latency_ms),
                        "mean_batch_size": list(r.mean_batch_size), "relative_timer_noise": r.relative_timer_noise}}
    if not a.no_predict:
        import tr_model
        ev = tr_model.evaluate(spec, a.clients, B, round_to_grid=True)
        doc["predicted"] = {"throughput_tok_s": ev.throughput_tok_s, "per_request_tok_s": ev.per_request_tok_s,
                            "admission_latency_ms": list(ev.admission_latency_ms)}
    headers = ["quantity", "measured", "predicted"]
    pred = doc.get("predicted", {})

    def f(x):
        return "-" if x is None or not math.isfinite(x) else f"{x:.2f}"

    rows = [["throughput_tok_s", f"{f(r.throughput_tok_s)} +- {f(r.throughput_ci95_tok_s)}",
             f(pred.get("throughput_tok_s"))],
            ["per_request_tok_s", f(r.per_request_tok_s), f(pred.get("per_request_tok_s"))]]
    for i in range(spec.M):
        rows.append([f"admission_latency_ms[{i}]", f(r.admission_latency_ms[i]),
                     f(pred["admission_latency_ms"][i]) if pred else "-"])
    if a.format == "json":
        sys.stdout.write(json.dumps(doc, indent=1, default=float) + "\n")
    elif a.format == "csv":
        sys.stdout.write(to_csv(headers, rows))
    else:
        sys.stdout.write(f"N = {a.clients}, B = {list(B)}, {r.window_s:g} s of model time, timer noise "
                         f"{100 * (r.relative_timer_noise or 0):.2f}%\n" + format_table(headers, rows) + "\n")
    return 0


def main_impl(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["run"] + argv  # the original form: tr-autotune --spec FILE --max-concurrency N --out FILE
    a = build_parser().parse_args(argv)
    if a.command == "run":
        return _cmd_run(a)
    if a.command == "show":
        return _cmd_show(a)
    if a.command == "kv-plan":
        return _cmd_kv_plan(a)
    if a.command == "measure":
        return _cmd_measure(a)
    raise SpecError("a subcommand is required: run, show, kv-plan or measure (see tr-autotune --help)")


def main(argv=None) -> int:
    return run_cli(main_impl, argv)


if __name__ == "__main__":
    sys.exit(main())
