"""``tr-autotune``: thresholds files for servers, and the KV-cache plan of co-located models.

Subcommands::

    tr-autotune run     --spec FILE | --p P --L MS MS   --N N --thresholds FILE
                        [--time-budget-s S] [--background] [--cache-dir DIR]
    tr-autotune show    FILE [--N N] [--require-N N] [--format table|json|csv] [--out FILE]
    tr-autotune kv-plan --placement FILE [--gpu-memory-gib G] [--memory-budget-fraction F]
                        [--N N] [--format table|json|csv] [--out FILE]
    tr-autotune measure --p P --L MS MS --N N (--B B0 B1 | --thresholds FILE)
                        [--time-scale X] [--duration-s S] [--warmup-s S] [--format ...] [--out FILE]
    tr-autotune export r2r --thresholds FILE [--N N] [--format text|json|env] [--out FILE]
    tr-autotune serve   (--thresholds FILE | --eager --N N) [system flags] [--host H] [--port P]
                        [--executor emulated|torch] [--time-scale X] [--config FILE...]

``tr-autotune --spec FILE --N N --thresholds FILE`` (no subcommand) means ``run``.  The system flags are
``tr-optimize``'s (:mod:`tr_core.system_args`); the conventions (``--N``, ``--out``, exit codes) are in
docs/cli-convention.md.
"""

from __future__ import annotations

import json
import math
import sys

from tr_core.cli import (Parser, add_list_arg, check_number, add_output_args, add_quiet_arg, add_subcommands,
                         add_version, add_window_args, emit, fields_as_flags, flag_name, format_gain, format_table,
                         note, output_format, refuse_given, require_subcommand, run_cli, to_csv)
from tr_core.errors import SpecError
from tr_core.search_options import SEARCH_FIELDS
from tr_core.search_rule import DEFAULT_MAX_HOURS
from tr_core.system_args import add_system_args, build_system

RUN_DEFAULTS = {"max_hours": DEFAULT_MAX_HOURS}  # tr-autotune run's own defaults of the search options

MIN_EMULATED_STEP_S = 2e-4   # measure: a shorter emulated step is below what asyncio's timers resolve
MAX_TIMER_NOISE = 0.05       # measure: warn when the timers' overshoot exceeds this fraction of a step


def build_parser() -> Parser:
    p = Parser(prog="tr-autotune", description="Compute delayed-batching thresholds B*(N) for N = 1..max "
               "concurrency into a thresholds file a server reads at start (tr_model.thresholds), inspect such "
               "files, and plan the KV-cache budget of models sharing GPUs.",
               epilog="Exit codes: 0 ok, 2 bad input, 3 a resource limit, 130 interrupted. "
                      "Conventions: docs/cli-convention.md.")
    add_version(p)
    sub = p.add_subparsers(dest="command", parser_class=Parser, metavar="{run,show,kv-plan,measure,export,serve}")
    add_subcommands(sub, SUBPARSERS)
    return p


def _run_args(r) -> None:
    add_system_args(r)
    t = r.add_argument_group("tuning")
    t.add_argument("--N", type=int, required=True, metavar="N", help="largest number of active requests the "
                   "server admits; the table covers N = 1..this")
    t.add_argument("--thresholds", required=True, metavar="FILE.json", help="thresholds file to write "
                   "(atomically; a regular file)")
    t.add_argument("--time-budget-s", type=float, metavar="S", help="return by S seconds with the rows computed "
                   "so far (default: no limit); the file then has complete=false")
    t.add_argument("--background", action="store_true", help="with --time-budget-s: finish the remaining N in a "
                   "separate process that replaces the file atomically when done")
    t.add_argument("--cache-dir", metavar="DIR", help="result cache folder: also keep each complete table as "
                   "DIR/<inputs_sha256>.json, reused at once for the same inputs (default: none)")
    from tr_model.cli import add_search_options
    add_search_options(t, defaults=RUN_DEFAULTS)
    from tr_model.tuning.launch_policy import POLICY_CLASSES, POLICY_CLASSES_HELP
    t.add_argument("--policy", choices=POLICY_CLASSES, help="also search this compact state-dependent launch "
                   "policy class at each N (from B*(N)) and write a schema-version-3 file the runtime executes: "
                   + POLICY_CLASSES_HELP + " (docs/autotune.md)")
    t.add_argument("--policy-max-n", type=int, metavar="N", help="with --policy: search it only up to this N "
                   "(rows above keep B*(N) as their policy; default: every N)")
    t.add_argument("--format", choices=("table", "json", "csv"), default="table", help="stdout format of the "
                   "summary (json: the thresholds file itself)")
    add_quiet_arg(t)


def _show_args(s) -> None:
    s.add_argument("file", metavar="FILE.json")
    s.add_argument("--N", type=int, metavar="N", help="print only lookup(N), the thresholds for N active "
                   "requests (N beyond the table uses its largest N)")
    s.add_argument("--require-N", type=int, metavar="N", help="fail unless the table has computed rows for 1..N")
    add_output_args(s)
    add_quiet_arg(s)


def _kv_plan_args(k) -> None:
    k.add_argument("--placement", required=True, metavar="FILE.json", help="placement JSON (see docs/autotune.md; "
                   "example: data/models/paper-placement.json)")
    k.add_argument("--gpu-memory-gib", type=float, metavar="GIB", help="memory of every GPU in GiB (overrides "
                   "the file)")
    k.add_argument("--memory-budget-fraction", type=float, metavar="F", help="fraction of each GPU's memory the "
                   "subservers may use together, in (0, 1] (overrides the file)")
    k.add_argument("--N", type=int, metavar="N", help="also report the context tokens each of N concurrent "
                   "requests can keep")
    add_output_args(k)
    add_quiet_arg(k)


def _measure_args(m) -> None:
    add_system_args(m)
    m.add_argument("--N", type=int, required=True, metavar="N", help="closed-loop clients (concurrency N)")
    th = m.add_mutually_exclusive_group(required=True)
    add_list_arg(th, "--B", convert=int, what="an integer", metavar="B", help="fixed threshold vector, one "
                 "integer per model, e.g. 1 5")
    th.add_argument("--thresholds", metavar="FILE.json", help="thresholds file, looked up with the live active "
                    "count")
    m.add_argument("--time-scale", type=float, default=10.0, metavar="X", help="every emulated step lasts L_i(b) "
                   "times this (default 10)")
    add_window_args(m, duration_s=30.0, warmup_s=2.0)
    m.add_argument("--output-tokens", type=int, default=512, metavar="T", help="output tokens per request "
                   "(default 512)")
    m.add_argument("--seed", type=int, default=0, help="seed of the routing draws (default 0)")
    m.add_argument("--no-predict", action="store_true", help="skip the chain's prediction")
    add_output_args(m)
    add_quiet_arg(m)


def _export_args(e) -> None:
    targets = e.add_subparsers(dest="target", parser_class=Parser, metavar="{r2r}")
    r = targets.add_parser("r2r", help="--slm-min-batch-size / --llm-min-batch-size lists for R2R's launcher",
                           description="Print R2R's launch flags --slm-min-batch-size and --llm-min-batch-size "
                           "(script/inference/launch_r2r_server.py): comma lists with one entry per N = 1..the "
                           "server's maximum concurrency, entry N-1 = B*(N) of model 0 (R2R's small 'quick' "
                           "model) and of model 1 (its large 'reference' model). R2R's large model does not "
                           "clamp N to the list, so every N the server can reach must have a row: a table that "
                           "does not cover --N is refused. Extrapolated, certified and local rows "
                           "are named on stderr (in the document with --format json).")
    r.add_argument("--thresholds", required=True, metavar="FILE.json", help="thresholds file (tr-autotune run) "
                   "of a two-model system: model 0 small, model 1 large")
    r.add_argument("--N", type=int, metavar="N", help="the server's maximum concurrency: most requests it will "
                   "hold at once (the clients' concurrency); the lists cover N = 1..this (default: the file's "
                   "max_concurrency)")
    add_output_args(r, ("text", "json", "env"), default="text")
    add_quiet_arg(r)


def _serve_args(s) -> None:
    add_system_args(s)
    th = s.add_argument_group("thresholds")
    g = th.add_mutually_exclusive_group(required=True)
    g.add_argument("--thresholds", metavar="FILE.json", help="thresholds file (tr-autotune run); looked up with the "
                   "number of requests in flight, re-read when replaced")
    g.add_argument("--eager", action="store_true", help="no delayed batching (every B_i = 1): the baseline")
    th.add_argument("--N", type=int, metavar="N", help="largest number of requests in flight at once; more wait for "
                    "admission (default: the thresholds file's N; required with --eager)")
    th.add_argument("--check-interval-s", type=float, default=1.0, metavar="S", help="how often the thresholds "
                    "file's modification time is checked, seconds (default 1)")
    h = s.add_argument_group("HTTP")
    h.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    h.add_argument("--port", type=int, default=8000, metavar="P", help="TCP port (default 8000; 0 picks a free "
                   "one); a port in use is an error")
    h.add_argument("--model-name", default="tokenrouter", help="model name reported by /v1/models and in "
                   "responses (default tokenrouter)")
    h.add_argument("--default-max-tokens", type=int, default=256, metavar="T", help="output tokens of a request "
                   "that gives no max_tokens (default 256)")
    h.add_argument("--shutdown-timeout-s", type=float, default=10.0, metavar="S", help="on SIGTERM/Ctrl-C, how "
                   "long in-flight requests may still finish, seconds (default 10)")
    h.add_argument("--access-log", action="store_true", help="log every HTTP request on stderr")
    lim = s.add_argument_group("limits (each reported in /health; a request over one gets a JSON 4xx)")
    lim.add_argument("--max-tokens-limit", type=int, default=4096, metavar="T", help="most output tokens one "
                     "request may ask (default 4096; above: 422)")
    lim.add_argument("--max-prompt-tokens", type=int, default=8192, metavar="T", help="most prompt tokens "
                     "(default 8192; above: 413)")
    lim.add_argument("--max-body-bytes", type=int, default=2 ** 20, metavar="BYTES", help="largest request body "
                     "(default 1048576; above: 413)")
    lim.add_argument("--max-json-depth", type=int, default=32, metavar="D", help="deepest nesting of the body's "
                     "arrays and objects (default 32; above: 422)")
    lim.add_argument("--max-waiting", type=int, metavar="K", help="most requests waiting for admission beyond "
                     "--N (default 4 x N; beyond: 429)")
    lim.add_argument("--request-deadline-s", type=float, default=600.0, metavar="S", help="longest a request may "
                     "live, seconds (default 600; past it: 504, its runtime request cancelled)")
    lim.add_argument("--body-timeout-s", type=float, default=30.0, metavar="S", help="longest the request body "
                     "may take to arrive, seconds (default 30; past it: 408)")
    add_quiet_arg(h)
    e = s.add_argument_group("executor")
    e.add_argument("--executor", choices=("emulated", "torch"), default="emulated", help="emulated: every step "
                   "sleeps L_i(b) * --time-scale (default); torch: Qwen3 models with random weights from --config")
    e.add_argument("--time-scale", type=float, default=1.0, metavar="X", help="emulated: every step lasts L_i(b) "
                   "times this (default 1: the spec's own latencies); /health reports it")
    e.add_argument("--seed", type=int, default=0, help="seed of the routing draws (request k uses (seed, k)) and of "
                   "the torch executor's weights (default 0)")
    e.add_argument("--config", nargs="+", metavar="CONFIG.json", help="torch: one Qwen3 config.json per model, in "
                   "model order (model 0 = the entry/small model)")
    e.add_argument("--device", default="auto", help="torch: auto (cuda when available), cpu, cuda or cuda:K")
    e.add_argument("--dtype", choices=("auto", "fp32", "fp16", "bf16"), default="auto", help="torch: weights and "
                   "activations (auto: bf16 on CUDA, fp32 on CPU)")
    e.add_argument("--max-len", type=int, default=1024, metavar="TOKENS", help="torch: cache length per request, "
                   "prompt + output tokens (default 1024)")
    e.add_argument("--no-graphs", action="store_true", help="torch: no CUDA graphs (eager steps)")




# -------------------------------------------------------------------------------------------------- helpers


def _summary(table) -> tuple[list, list]:
    """Rows N, B*, predicted and eager tokens/s, gain (``1.111x``) over the computed rows."""
    headers = ["N", "B*", "predicted_tok_s", "eager_tok_s", "gain_vs_eager"]
    rows = []
    for n in range(1, table.covered_concurrency + 1):
        pred = table.predicted_tok_s[n - 1] if table.predicted_tok_s else math.nan
        eag = table.eager_tok_s[n - 1] if table.eager_tok_s else math.nan
        gain = pred / eag if eag and math.isfinite(eag) and eag > 0 and math.isfinite(pred) else None
        rows.append([n, " ".join(map(str, table.thresholds[n - 1])), f"{pred:.2f}", f"{eag:.2f}", gain])
    if table.certificates:  # schema 2: how each row was obtained, and its gap to a proven upper bound
        headers = headers + ["certificate", "gap"]
        for r in rows:
            g = table.gaps[r[0] - 1]
            r += [table.certificates[r[0] - 1], "-" if g is None else f"{g:.2g}"]
    if table.policy_class is not None:  # schema 3: the launch policy per N, its value and gain over B*
        headers = headers + [f"policy ({table.policy_class}: {', '.join(table.policy_columns)})", "policy_tok_s",
                             "policy_vs_B*", "policy_certificate"]
        for r in rows:
            n = r[0]
            pp = table.policy_predicted_tok_s[n - 1]
            pred = table.predicted_tok_s[n - 1] if table.predicted_tok_s else None
            gain = f"{100 * (pp / pred - 1):+.2f} %" if pp is not None and pred else "-"
            r += [_policy_text(table.policy_rows[n - 1]), "-" if pp is None else f"{pp:.2f}", gain,
                  table.policy_certificates[n - 1]]
    return headers, rows


def _policy_text(rows) -> str:
    """``(1, 1, never) (5, 5, 5)``: per model, its thresholds over the policy columns."""
    return " ".join("(" + ", ".join("never" if b is None else str(b) for b in r) + ")" for r in rows)


def _table_text(table, fmt: str, doc) -> str:
    """The table as text; ``json``: its document ``doc`` (as read or written, never read again)."""
    headers, rows = _summary(table)
    if fmt == "json":
        return json.dumps(doc, indent=1) + "\n"
    if fmt == "csv":
        return to_csv(headers, [r[:4] + ["" if r[4] is None else f"{r[4]:.4f}"] + r[5:] for r in rows])
    status = "complete" if table.complete else f"partial (N = 1..{table.covered_concurrency})"
    return (f"thresholds for N = 1..{table.max_concurrency}: {status}\n"
            + format_table(headers, [r[:4] + [format_gain(r[4])] + r[5:] for r in rows]) + "\n")


def _why_partial(table) -> str | None:
    """The line saying why a table stops before its N (None when complete)."""
    if table.complete:
        return None
    prov = getattr(table, "provenance", None) or {}
    reason = prov.get("stopped_reason") or "no reason recorded in the file"
    return (f"the table is partial: N = 1..{table.covered_concurrency} of 1..{table.max_concurrency} computed "
            f"({reason}); rows above are extrapolated")


# ---------------------------------------------------------------------------------------------- sub-commands


def _tune_options(a) -> dict:
    """tune()'s keywords from the flags: the search options (checked once, by SearchOptions) and the rest."""
    from tr_core.search_options import search_options_from_args
    opts = search_options_from_args(a, defaults=RUN_DEFAULTS)
    kw = dict(time_budget_s=a.time_budget_s, cache_dir=a.cache_dir, background=a.background,
              **{k: getattr(opts, k) for k in SEARCH_FIELDS})
    for name in ("policy", "policy_max_n"):
        if getattr(a, name, None) is not None:
            kw[name] = getattr(a, name)
    return kw


# tune()'s keywords -> the dest of the flag that carries each (the search options' flags are their own names)
TUNE_FIELDS = {**{k: k for k in SEARCH_FIELDS}, "max_concurrency": "N", "time_budget_s": "time_budget_s",
               "background": "background", "cache_dir": "cache_dir", "out": "thresholds", "policy": "policy",
               "policy_max_n": "policy_max_n"}


def _cmd_run(a) -> int:
    from tr_core.cli import check_out_path
    from tr_model.tuning import autotune
    from tr_model.thresholds import ThresholdTable
    check_number(a.N, flag_name(a, "N", "--N"), ge=1)
    check_number(a.time_budget_s, "--time-budget-s", ge=0)
    if a.background and a.time_budget_s is None:
        raise SpecError("--background needs --time-budget-s (otherwise everything is computed in the foreground)")
    check_number(a.policy_max_n, "--policy-max-n", ge=1)
    if a.policy is None:
        refuse_given(a, ["policy_max_n"], "applies with --policy (the class whose search it limits)")
    options = _tune_options(a)  # the search options checked (SearchOptions: max_gap with --search exhaustive)
    if a.time_budget_s is not None and not a.background:
        refuse_given(a, ["max_hours"], "has no effect with --time-budget-s in the foreground (the budget bounds the "
                     "work; the rows it leaves are extrapolated): drop one of them, or add --background")
    check_out_path(a.thresholds, "--thresholds")
    system = build_system(a, a.N)
    for line in system.warnings():
        print(f"warning: {line}", file=sys.stderr)
    if not a.quiet:
        for line in system.notes():
            note(line)
    written: dict = {}  # the document of the table: printed as is (another run may replace the file meanwhile)
    with fields_as_flags(a, TUNE_FIELDS):  # a library error names its fields: say the flags instead
        table = autotune.tune(system.spec, a.N, a.thresholds, round_to_grid=system.round_to_grid,
                              document=written, **options)
    why = _why_partial(table)
    if why and not a.quiet:
        note(why)
    if a.format == "json" and not written:  # a table served from memory leaves no document: the file's
        written = ThresholdTable.load_with_document(a.thresholds)[1]
    sys.stdout.write(_table_text(table, a.format, written))
    return 0


def _cmd_show(a) -> int:
    from tr_model.thresholds import ThresholdTable
    check_number(a.require_N, flag_name(a, "require_N", "--require-N"), ge=1)
    check_number(a.N, flag_name(a, "N", "--N"), ge=0)
    fmt = output_format(a)
    table, doc = ThresholdTable.load_with_document(a.file, require_concurrency=a.require_N)
    for line in _embedded_spec_notes(doc, a.file):  # a model never reached: its column of thresholds means nothing
        note(line)
    if a.N is None:
        why = _why_partial(table)
        if why:
            note(why)
        emit(_table_text(table, fmt, doc), a.out)
        return 0
    b = table.lookup(a.N)
    pol = table.policy_of(a.N) if table.policy_class is not None else None
    if fmt == "json":
        d = {"N": a.N, "thresholds": list(b)}
        if pol is not None:
            d["policy"] = {"class": table.policy_class, "columns": list(table.policy_columns),
                           "thresholds": [list(r) for r in pol]}
        text = json.dumps(d) + "\n"
    elif fmt == "csv":
        head, row = ["N", "thresholds"], [a.N, " ".join(map(str, b))]
        if pol is not None:
            head, row = head + ["policy_class", "policy"], row + [table.policy_class, _policy_text(pol)]
        text = to_csv(head, [row])
    else:
        text = " ".join(map(str, b)) + "\n"
        if pol is not None:
            text += f"policy {table.policy_class} ({', '.join(table.policy_columns)}): {_policy_text(pol)}\n"
    emit(text, a.out)
    return 0


def _gib(x: float) -> str:
    return f"{x / 2 ** 30:.3f}"


def _kv_plan_text(plan, doc: dict, fmt: str, N) -> str:
    headers = ["model", "gpus", "tp", "weights_gib_per_gpu", "kv_bytes_per_token_per_gpu", "kv_cache_gib_per_gpu",
               "memory_fraction", "sglang_args"]
    rows = [[s["model"], ",".join(map(str, s["gpus"])), s["tensor_parallel"], _gib(s["weight_bytes_per_gpu"]),
             s["kv_bytes_per_token_per_gpu"], _gib(s["kv_cache_bytes_per_gpu"]), f"{s['memory_fraction']:.4f}",
             " ".join(s["launch_args"]["sglang"])] for s in plan.subservers]
    if fmt == "json":
        return json.dumps(doc, indent=1) + "\n"
    if fmt == "csv":
        return to_csv(headers, rows)
    text = f"common KV-token capacity: {plan.kv_token_capacity} tokens per model (binding GPU {plan.binding_gpu})"
    if N:
        text += f"; {plan.tokens_per_request(N)} tokens per request at N = {N}"
    grows = [[g["gpu"], " + ".join(g["models"]), _gib(g["budget_bytes"]), _gib(g["weight_bytes"]),
              g["kv_bytes_per_token"], g["capacity_tokens"], _gib(g["used_bytes"])] for g in plan.gpus]
    return (text + "\n" + format_table(headers, rows) + "\n\n"
            + format_table(["gpu", "models", "budget_gib", "weights_gib", "kv_bytes_per_token", "capacity_tokens",
                            "used_gib"], grows) + "\n")


def _cmd_kv_plan(a) -> int:
    from tr_model.tuning.kvplan import load_placement, plan_kv_cache, plan_to_dict
    check_number(a.N, flag_name(a, "N", "--N"), ge=1)
    check_number(a.gpu_memory_gib, "--gpu-memory-gib", gt=0)
    fmt = output_format(a)
    placement = load_placement(a.placement, gpu_memory_gib=a.gpu_memory_gib,
                               memory_budget_fraction=a.memory_budget_fraction)
    plan = plan_kv_cache(placement)
    emit(_kv_plan_text(plan, plan_to_dict(plan, a.N), fmt, a.N), a.out)
    return 0


def _measure_thresholds(a, M: int):
    from tr_model.thresholds import ThresholdTable
    if a.thresholds:
        table = ThresholdTable.load(a.thresholds)
        if table.num_models != M:
            raise SpecError(f"--thresholds has {table.num_models} models, the system has {M}")
        return table.lookup(a.N), table
    from tr_core.feasibility import check_thresholds
    B = check_thresholds(a.B, a.N, M, name="--B")
    return B, B


MAX_MEASURE_S = 86_400.0  # measure: wall-clock seconds (warm-up + window) one run may take


def _check_measure(a) -> None:
    check_number(a.N, flag_name(a, "N", "--N"), ge=1)
    for flag, v in (("--time-scale", a.time_scale), ("--duration-s", a.duration_s)):
        check_number(v, flag, gt=0)
    check_number(a.warmup_s, "--warmup-s", ge=0)
    total = a.duration_s + a.warmup_s
    if total > MAX_MEASURE_S:
        from tr_core.errors import WorkTooLarge
        raise WorkTooLarge(f"--duration-s {a.duration_s:g} with --warmup-s {a.warmup_s:g} is {total / 3600:,.1f} hours "
                           f"of wall-clock time, more than the {MAX_MEASURE_S / 3600:g} hours one measurement may "
                           f"take; shorten them (a longer --time-scale is measured in the same wall-clock time)")
    check_number(a.output_tokens, "--output-tokens", ge=1)


def _cmd_measure(a) -> int:
    from tr_model.serving.runtime import EmulatedExecutor, measure_closed_loop
    _check_measure(a)
    fmt = output_format(a)
    system = build_system(a, a.N)
    spec = system.spec
    B, thresholds = _measure_thresholds(a, spec.M)
    shortest_s = min(spec.latency_ms(i, 1) for i in range(spec.M)) * a.time_scale / 1000.0
    if shortest_s < MIN_EMULATED_STEP_S:
        raise SpecError(f"--time-scale {a.time_scale:g} makes the shortest emulated step {shortest_s * 1e6:.3g} us, "
                        f"below the {MIN_EMULATED_STEP_S * 1e6:g} us the event loop's timers can resolve: timer "
                        f"noise would dominate the measurement; use --time-scale >= "
                        f"{a.time_scale * MIN_EMULATED_STEP_S / shortest_s:.3g}")
    ex = EmulatedExecutor(spec.latency_ms, time_scale=a.time_scale,
                          corun_latency_ms=spec.corun_latency_ms if spec.has_corun else None)
    r = measure_closed_loop(spec, a.N, thresholds, ex, duration_s=a.duration_s, warmup_s=a.warmup_s,
                            max_output_tokens=a.output_tokens, seed=a.seed)
    noise = r.relative_timer_noise
    if noise is not None and noise > MAX_TIMER_NOISE:
        print(f"warning: timer noise is {100 * noise:.1f}% of the mean emulated step (more than "
              f"{100 * MAX_TIMER_NOISE:g}%): the measured numbers are dominated by the timers, not the batching; "
              f"raise --time-scale", file=sys.stderr)
    doc = {"N": a.N, "B": list(B), "time_scale": a.time_scale, "model_seconds": r.window_s,
           "measured": {"throughput_tok_s": r.throughput_tok_s, "throughput_ci95_tok_s": r.throughput_ci95_tok_s,
                        "per_request_tok_s": r.per_request_tok_s, "admission_latency_ms": list(r.admission_latency_ms),
                        "mean_batch_size": list(r.mean_batch_size), "relative_timer_noise": r.relative_timer_noise}}
    policy = getattr(thresholds, "policy_class", None)
    if policy is not None:
        doc["policy"] = {"class": policy, "columns": list(thresholds.policy_columns),
                         "thresholds": [list(x) for x in thresholds.policy_of(a.N)]}
    n = min(a.N, len(thresholds.thresholds)) if policy is not None else 0
    if not a.no_predict and policy is not None and thresholds.policy_predicted_tok_s[n - 1] is not None:
        # the file's exact value of its policy at this N (the chain under the policy table)
        doc["predicted"] = {"throughput_tok_s": thresholds.policy_predicted_tok_s[n - 1], "per_request_tok_s": None,
                            "admission_latency_ms": [None] * spec.M}
    elif not a.no_predict:
        from tr_model.api import evaluate
        ev = evaluate(spec, a.N, B, round_to_grid=True)
        doc["predicted"] = {"throughput_tok_s": ev.throughput_tok_s, "per_request_tok_s": ev.per_request_tok_s,
                            "admission_latency_ms": list(ev.admission_latency_ms)}
    emit(_measure_text(doc, r, spec.M, fmt), a.out)
    return 0


def _measure_text(doc: dict, r, M: int, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(doc, indent=1, default=float) + "\n"
    pred = doc.get("predicted", {})

    def f(x):
        return "-" if x is None or not math.isfinite(x) else f"{x:.2f}"

    rows = [["throughput_tok_s", f"{f(r.throughput_tok_s)} +- {f(r.throughput_ci95_tok_s)}",
             f(pred.get("throughput_tok_s"))],
            ["per_request_tok_s", f(r.per_request_tok_s), f(pred.get("per_request_tok_s"))]]
    for i in range(M):
        rows.append([f"admission_latency_ms[{i}]", f(r.admission_latency_ms[i]),
                     f(pred["admission_latency_ms"][i]) if pred else "-"])
    headers = ["quantity", "measured", "predicted"]
    if fmt == "csv":
        return to_csv(headers, rows)
    return (f"N = {doc['N']}, B = {doc['B']}, {r.window_s:g} s of model time, timer noise "
            f"{100 * (r.relative_timer_noise or 0):.2f}%\n" + format_table(headers, rows) + "\n")


def _export_text(args, fmt: str, notes: list) -> str:
    if fmt == "json":
        return json.dumps({**args.to_dict(), "notes": notes}, indent=1) + "\n"
    if fmt == "env":
        return (f"R2R_SLM_MIN_BATCH_SIZE={args.slm_arg}\nR2R_LLM_MIN_BATCH_SIZE={args.llm_arg}\n"
                f"R2R_MAX_CONCURRENCY={args.max_concurrency}\n"
                f"R2R_MIN_BATCH_SIZE_ARGS='{' '.join(args.argv())}'\n")
    return " ".join(args.argv()) + "\n"


def _embedded_spec(doc):
    """The spec embedded in a thresholds document the reader has validated (None when absent)."""
    return doc.get("spec") if isinstance(doc, dict) else None


def _embedded_spec_notes(doc, path: str) -> list:
    """What the embedded spec's routing makes of the table (as ``run`` said when it wrote it): a model never
    reached or left for good, a model keeping every request, no token committed."""
    doc = _embedded_spec(doc)
    if not isinstance(doc, dict):
        return []
    from tr_core.spec import spec_from_dict
    from tr_core.system_args import System
    try:
        spec = spec_from_dict(doc, where=path)
    except SpecError:
        return []
    return System(spec, round_to_grid=False).notes()


def _policy_export_notes(table, K: int) -> list:
    """A version-3 file: which rows carry a launch policy R2R's per-N lists cannot run, and its worth."""
    from tr_model.thresholds import WINDOW_CLASSES

    if table.policy_class is None:
        return []
    lost = []
    for n in range(1, min(K, len(table.thresholds)) + 1):
        row, B = table.policy_of(n), table.lookup(n)
        if table.policy_class in WINDOW_CLASSES:   # (threshold, window_ms): the threshold rule is window 0
            differs = any(r[0] != B[j] or r[1] != 0 for j, r in enumerate(row))
        else:
            differs = any(any(b != B[j] for b in r) for j, r in enumerate(row))
        if differs:
            pp, pred = table.policy_predicted_tok_s[n - 1], table.predicted(n)
            lost.append((n, pp / pred - 1.0 if pp is not None and pred else None))
    if not lost:
        return [f"the file's {table.policy_class} policy equals B*(N) at N = 1..{K}: the lists carry all of it"]
    gains = [g for _, g in lost if g is not None]
    worth = f" (worth up to {100 * max(gains):.2f} % over B*)" if gains else ""
    return [f"the file carries a state-dependent {table.policy_class} policy at {len(lost)} of N = 1..{K}{worth}; "
            f"R2R's --slm/--llm-min-batch-size lists take B*(N) only, exported here (docs/autotune.md, 'A "
            f"state-dependent policy on R2R')"]


def _cmd_export(a) -> int:
    from tr_model.tuning.export import r2r_launch_args, r2r_spec_notes
    from tr_model.thresholds import ThresholdTable
    if a.target != "r2r":
        raise SpecError("export needs a target: tr-autotune export r2r --thresholds FILE")
    check_number(a.N, "--N", ge=1)
    fmt = output_format(a)
    table, doc = ThresholdTable.load_with_document(a.thresholds)
    args = r2r_launch_args(table, a.N)
    notes = args.provenance_lines() + r2r_spec_notes(_embedded_spec(doc))
    notes += _policy_export_notes(table, args.max_concurrency)
    if args.max_concurrency == 1:
        notes.append("with one entry R2R reads each flag as an int (its large model then ignores it); "
                     "B*(1) = (1, 1) is eager anyway")
    if not a.quiet:
        for line in notes:
            note(line)
    emit(_export_text(args, fmt, notes), a.out)
    return 0


def _serve_thresholds(a):
    """(thresholds object, spec document of the file or None, label, max concurrency of the file or None)."""
    from tr_model.thresholds import WatchedThresholds
    if a.eager:
        if a.N is None:
            raise SpecError("--eager needs --N, the largest number of requests in flight")
        return None, None, "eager", None
    # one read of the file: the table, its embedded spec and the reload baseline all come from it
    watched = WatchedThresholds(a.thresholds, check_interval_s=a.check_interval_s, accept=_same_system_as_first(),
                                on_error=_log_reload_error)
    table = watched.table
    why = _why_partial(table)
    if why and not a.quiet:
        note(why)
    return watched, watched.spec_document, f"file {a.thresholds}", table.max_concurrency


def _same_system_as_first():
    """The start-up checks a reload must pass too: the same number of models as the first table loaded and, when
    the file embeds its spec, the same spec (its hash); otherwise the reload is refused and the old table kept."""
    tables: list = []

    def accept(table) -> str | None:
        if not tables:  # the first load: the baseline
            tables.append(table)
            return None
        first = tables[0]
        if table.num_models != first.num_models:
            return (f"the new table has {table.num_models} models, the server runs {first.num_models} "
                    f"('num_models')")
        if first.spec_sha256 is not None and table.spec_sha256 != first.spec_sha256:
            return ("the new table was computed for another system ('spec_sha256' differs from the table loaded "
                    "at start-up)")
        return None
    return accept


def _log_reload_error(msg: str) -> None:
    sys.stderr.write(f"serve: thresholds reload refused, the previous table is kept: {' '.join(msg.split())}\n")
    sys.stderr.flush()


def _serve_spec(a, spec_doc):
    given = a.spec or a.p is not None or a.L or a.weights or a.algo
    if given or spec_doc is None:
        return build_system(a, a.N).spec
    from tr_core.spec import spec_from_dict
    return spec_from_dict(spec_doc, where=f"{a.thresholds}: spec")


def _torch_serve_executor(a, spec, n_slots: int):
    try:
        import torch
        from tr_model.serving.runtime.torch_executor import SlotModel, TorchExecutor, load_shape, random_weights
    except ImportError as e:
        raise SpecError(f"--executor torch needs torch ({e.name} is missing): pip install "
                        "'tokenrouter-model[profile]'") from None
    if not a.config or len(a.config) != spec.M:
        raise SpecError(f"--executor torch needs --config with one config.json per model (M = {spec.M})")
    check_number(a.max_len, "--max-len", ge=2)
    device = a.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[
        a.dtype if a.dtype != "auto" else ("bf16" if device.startswith("cuda") else "fp32")]
    models = []
    for k, path in enumerate(a.config):
        try:
            shape = load_shape(path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise SpecError(f"--config {path}: not a readable Qwen3 config.json ({type(e).__name__}: {e})") from None
        w = random_weights(shape, device=device, dtype=dtype, seed=a.seed + k)
        models.append(SlotModel(shape, w, n_slots=n_slots, max_len=a.max_len, device=device, dtype=dtype,
                                cuda_graphs=False if a.no_graphs else None, name=f"model{k}"))
    ex = TorchExecutor(models)
    from collections import deque
    ex.step_log = deque(maxlen=10_000)  # a long-running server keeps only the recent steps
    return ex


def _refuse_serve_dropped(a) -> None:
    """Flags the chosen executor or thresholds source would ignore are refused, naming both."""
    if a.executor == "emulated":
        refuse_given(a, ["config", "device", "dtype", "max_len", "no_graphs"],
                     "applies to --executor torch, not --executor emulated (the emulated steps sleep L_i(b) * "
                     "--time-scale)")
    else:
        refuse_given(a, ["time_scale"], f"applies to --executor emulated, not --executor {a.executor} (real "
                     "steps take the time they take)")
    if a.eager:
        refuse_given(a, ["check_interval_s"], "applies to a --thresholds file (how often it is re-read); --eager "
                     "reads none")


def _cmd_serve(a) -> int:
    from tr_model.serving import server as serve
    from tr_model.serving.runtime import EmulatedExecutor, FixedThresholds
    _refuse_serve_dropped(a)
    serve.require_http_stack()
    check_number(a.N, "--N", ge=1)
    check_number(a.default_max_tokens, "--default-max-tokens", ge=1)
    check_number(a.time_scale, "--time-scale", gt=0)
    check_number(a.check_interval_s, "--check-interval-s", gt=0)
    check_number(a.shutdown_timeout_s, "--shutdown-timeout-s", ge=0)
    if not 0 <= a.port <= 65535:
        raise SpecError(f"--port must be in 0..65535, got {a.port}")
    if a.executor == "emulated" and a.config:
        raise SpecError("--config is for --executor torch")
    limits = serve.ServeLimits(max_tokens=a.max_tokens_limit, max_prompt_tokens=a.max_prompt_tokens,
                               max_body_bytes=a.max_body_bytes, max_json_depth=a.max_json_depth,
                               max_waiting=a.max_waiting, request_deadline_s=a.request_deadline_s,
                               body_timeout_s=a.body_timeout_s)
    if a.default_max_tokens > limits.max_tokens:
        raise SpecError(f"--default-max-tokens {a.default_max_tokens} is above --max-tokens-limit {limits.max_tokens}")
    thresholds, spec_doc, label, file_N = _serve_thresholds(a)
    spec = _serve_spec(a, spec_doc)
    if thresholds is None:
        thresholds = FixedThresholds((1,) * spec.M)
    elif thresholds.num_models != spec.M:
        raise SpecError(f"--thresholds has {thresholds.num_models} models, the system has {spec.M}")
    N = a.N or file_N
    if file_N is not None and N > file_N and not a.quiet:
        note(f"--N {N} is above the thresholds file's N = {file_N}: above it the last row applies")
    if a.executor == "torch":
        ex = _torch_serve_executor(a, spec, N)
        max_total = a.max_len
    else:
        ex = EmulatedExecutor(spec.latency_ms, time_scale=a.time_scale,
                              corun_latency_ms=spec.corun_latency_ms if spec.has_corun else None)
        max_total = None
    service = serve.RuntimeService(spec, thresholds, ex, max_concurrency=N, seed=a.seed, model_name=a.model_name,
                                   executor_name=a.executor, max_total_tokens=max_total,
                                   default_max_tokens=a.default_max_tokens, thresholds_label=label, limits=limits)

    def announce(url: str) -> None:
        # where the server listens is its result: printed with --quiet too
        sys.stdout.write(f"serving {spec.M} models ({a.executor} executor, time scale "
                         f"{getattr(ex, 'time_scale', 1.0):g}, thresholds: {label}, up to N = {N} in flight) "
                         f"on {url}\n")
        sys.stdout.flush()

    stopped_by = serve.serve(service, a.host, a.port, shutdown_timeout_s=a.shutdown_timeout_s,
                             access_log=a.access_log, announce=announce)
    if not a.quiet:
        note(f"stopped ({stopped_by or 'server exit'}); {service.completed} requests served")
    return 0


# name -> (help, description, argument builder, handler)
SUBPARSERS = {
    "run": ("compute (or reuse) the thresholds file for a spec",
            "Compute B*(N) for N = 1..--N and write the thresholds file atomically. A file (or --cache-dir entry) "
            "with the same inputs hash is reused at once; a partial one is resumed. The summary goes to stdout.",
            _run_args, _cmd_run),
    "show": ("validate a thresholds file and print it (or one lookup)",
             "Validate a thresholds file with the vendorable reader and print B*(N).", _show_args, _cmd_show),
    "kv-plan": ("joint KV-cache budget of subservers sharing GPUs (paper, Appendix B)",
                "From each model's config.json and a placement (GPUs per model, tensor parallelism), compute weight "
                "and KV bytes, the largest common KV-token capacity that fits every GPU's budget, and each "
                "subserver's memory fraction and launch arguments.", _kv_plan_args, _cmd_kv_plan),
    "measure": ("run the reference runtime (emulated steps) and compare with the chain",
                "N closed-loop clients against the reference asyncio runtime (three loops per subserver, delayed "
                "batching), every step sleeping L_i(b) * --time-scale; prints measured throughput, per-request speed "
                "and admission latency in the spec's time units next to the chain's prediction.",
                _measure_args, _cmd_measure),
    "export": ("a thresholds file as a real server's launch arguments (R2R)",
               "Turn a thresholds file into the launch arguments of a serving system.", _export_args, _cmd_export),
    "serve": ("serve the reference runtime behind an OpenAI-compatible HTTP API",
              "Run the reference runtime (delayed batching with the thresholds row of the live number of in-flight "
              "requests, re-read when the file is replaced) behind /v1/completions, /v1/chat/completions, /health and "
              "/v1/models; responses carry usage.completion_tokens and llm_ratio (fraction of tokens committed by the "
              "last model). The system comes from the system flags or else from the thresholds file's spec. SIGTERM "
              "or Ctrl-C: stop accepting, finish in-flight requests (up to --shutdown-timeout-s), exit 0. Needs "
              "starlette and uvicorn (the 'serve' extra).", _serve_args, _cmd_serve),
}
SUBCOMMANDS = tuple(SUBPARSERS)


def main_impl(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version"):
        argv = ["run"] + argv  # the short form: tr-autotune --spec FILE --N N --thresholds FILE
    parser = build_parser()
    a = parser.parse_args(argv)
    require_subcommand(parser, a)
    return a.func(a)


def main(argv=None) -> int:
    return run_cli(main_impl, argv, keep_heap=True)


if __name__ == "__main__":
    sys.exit(main())
