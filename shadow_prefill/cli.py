"""``tr-shadow``: per-call routing of agent sessions (ShadowPrefill).

Subcommands::

    tr-shadow stats     switch-tax statistics of a workload, per model pair (Table 1 / Figure 2)
    tr-shadow sessions  write a workload (matrix-routed or synthetic) as a session trace (JSONL)
    tr-shadow latency   a model instance's latency figures: isolated prefill, decode, SLOs, KV

    tr-shadow simulate  one approach on a simulated cluster     (shadow_prefill.cluster.cli)
    tr-shadow compare   approaches against No Shadow             (shadow_prefill.cluster.cli)

Every subcommand is a function ``cmd_<name>(args) -> int`` registered in
:data:`SUBCOMMANDS` with its help, description and argument builder; the
workload options they share live in
:mod:`shadow_prefill.workload_args`.  The parser and the error contract are the
project's (:mod:`tr_core.cli`, ``docs/cli-convention.md``): bad input, argparse's
own errors included, is one ``error: ...`` line on stderr and exit 2; Ctrl-C is
``error: interrupted``, exit 130; ``--out FILE`` writes what would go to stdout
into FILE instead, atomically.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any, Callable, Sequence

from tr_core.cli import Parser, add_output_args, add_quiet_arg, add_subcommands, add_version, check_out_path, note, \
    refuse_given, require_subcommand, run_cli
from tr_core.version import __version__ as VERSION

from shadow_prefill.errors import ShadowError
from shadow_prefill.latency import build_roofline, fit_linear_model, load_gpu, load_model_arch, read_profile_points
from shadow_prefill.stats import DEFAULT_CACHE_CAPACITY, STATS_COLUMNS, ReplayParams, compute_switch_tax, flatten_stats
from shadow_prefill.trace_io import atomic_write, format_session_trace, write_session_trace
from shadow_prefill.workload_args import add_workload_args, dumps_document, emit_result, int_value, \
    latency_models, name_values, nonneg_int, number, positive_int, text_table, workload_from_args

__all__ = ["main", "build_parser", "SUBCOMMANDS"]


# ============================================================================ output

def _fmt(v: Any, fmt: str) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isnan(v):
        return "-"
    if isinstance(v, (list, tuple)):
        return " / ".join(map(str, v))
    try:
        return fmt.format(v)
    except (ValueError, TypeError):
        return str(v)


def render_table(rows: list[dict], columns: Sequence[tuple[str, str, str]]) -> str:
    flat = [flatten_stats({k: v for k, v in r.items() if k != "models"}) | {"models": r.get("models")} for r in rows]
    cols = [c for c in columns if any(f.get(c[0]) is not None for f in flat)]
    cells = [[c[1] for c in cols]] + [[_fmt(f.get(c[0]), c[2]) for c in cols] for f in flat]
    return text_table(cells, left=2)


_dumps = dumps_document


# ============================================================================ stats

# tables print ratios as 1.111x (docs/cli-convention.md); JSON keeps the plain number
_STATS_COLUMNS = [(k, lab, "{:.3f}x" if fmt.endswith("x") else fmt) for k, lab, fmt in STATS_COLUMNS]


def _stats_args(p: argparse.ArgumentParser) -> None:
    add_workload_args(p, multi=True)
    c = p.add_argument_group("cache and cost")
    c.add_argument("--cache-capacity", action="append", metavar="TOKENS|MODEL=TOKENS",
                   help=f"per-model cache capacity in tokens of session context (default {DEFAULT_CACHE_CAPACITY}; "
                        f"MODEL=TOKENS per model; repeatable)")
    c.add_argument("--cached-fraction", type=number(0.0, 1.0), default=0.1,
                   help="price of cached input as a fraction of uncached (default 0.1)")
    c.add_argument("--session-rate", type=number(0.0, lo_open=True), default=0.05,
                   help="sessions per second of the replay clock that orders calls for the capacity-limited "
                        "cache (default 0.05)")
    c.add_argument("--replay-tpot-s", dest="replay_tpot", type=number(0.0), default=0.025,
                   help="seconds per output token of the replay clock (default 0.025)")
    lt = p.add_argument_group("isolated call latency (Figure 2d)")
    lt.add_argument("--latency", action="store_true",
                    help="add isolated latency and TTFT of same-model and switch calls from the roofline")
    lt.add_argument("--gpu", default="h100", help="GPU preset (h100, h200) or JSON file (default h100)")
    lt.add_argument("--model-config", action="append", metavar="MODEL=PRESET|CONFIG",
                    help="architecture of a workload model: a built-in name, a config.json, or a saved latency model "
                         "JSON (default: the model's own name as a built-in)")
    lt.add_argument("--tp", type=positive_int, help="tensor-parallel degree (default: the smallest at which weights "
                                                    "take at most half the HBM)")
    lt.add_argument("--chunk", type=positive_int, default=2048, help="prefill chunk tokens (default 2048)")
    out = p.add_argument_group("output")
    add_output_args(p, group=out)
    add_quiet_arg(out)


def cmd_stats(args) -> int:
    if not args.latency:
        refuse_given(args, ["gpu", "model_config", "tp", "chunk"], "applies with --latency (the isolated call "
                     "latencies), which is not given")
    cap_default, cap_named = name_values(args.cache_capacity, "--cache-capacity", int_value("--cache-capacity"))
    capacity: Any = DEFAULT_CACHE_CAPACITY if cap_default is None else cap_default
    if cap_named:
        capacity = {"*": capacity, **cap_named}
    replay = ReplayParams(session_rate=args.session_rate, replay_tpot_s=args.replay_tpot, seed=args.seed)
    replay.check()
    workloads = workload_from_args(args)
    if cap_named:
        known = set().union(*(set(ss.model_names) for ss, _, _ in workloads))
        unknown = sorted(set(cap_named) - known)
        if unknown:
            raise ShadowError(f"--cache-capacity names model(s) not in the workload: {', '.join(unknown)}")
    results = []
    metas: list[dict] = []
    all_models = list(dict.fromkeys(m for ss, _, _ in workloads for m in ss.model_names))
    lms_all = dict(zip(all_models, latency_models(args, all_models))) if args.latency else None
    for ss, acc, prices in workloads:
        cap = capacity
        if isinstance(capacity, dict):
            cap = {k: v for k, v in capacity.items() if k == "*" or k in ss.model_names}
        lms = {m: lms_all[m] for m in ss.model_names} if lms_all is not None else None
        results.append(compute_switch_tax(ss, prices=prices, cached_fraction=args.cached_fraction,
                                          cache_capacity=cap, replay=replay, latency=lms, chunk=args.chunk,
                                          accuracy=acc))
        meta = {"name": ss.name, **{k: v for k, v in ss.meta.items() if k != "pair"}}
        if meta not in metas:
            metas.append(meta)
    doc = {"schema_version": 1, "kind": "switch_tax_stats", "tool": "tr-shadow stats", "version": VERSION,
           "workloads": metas,
           "options": {"cached_fraction": args.cached_fraction, "cache_capacity": capacity,
                       "session_rate": args.session_rate, "replay_tpot_s": args.replay_tpot,
                       "latency": bool(args.latency), "gpu": args.gpu if args.latency else None},
           "results": results}
    emit_result(args, lambda: doc, lambda: [flatten_stats(r) for r in results],
                lambda: render_table(results, _STATS_COLUMNS))
    return 0


# ============================================================================ sessions

def _sessions_args(p: argparse.ArgumentParser) -> None:
    add_workload_args(p, multi=False)
    p.add_argument("--out", metavar="FILE", help="write the trace to FILE instead of stdout (atomically: a temporary "
                                                 "name, then a rename; only a regular file)")
    add_quiet_arg(p)


def cmd_sessions(args) -> int:
    if args.matrix and not args.pair:
        raise ShadowError("--matrix needs --pair A B to write one routed workload")
    if not args.matrix:
        refuse_given(args, ["prices"], "has no effect on the session trace of --trace, --synthetic or --workload "
                     "(prices route a --matrix only)")
    ss = workload_from_args(args)[0][0]
    if not args.out:
        format_session_trace(ss, sys.stdout)
        return 0
    n = write_session_trace(ss, check_out_path(args.out))
    if not args.quiet:
        note(f"wrote {n} calls in {ss.n_sessions} sessions to {args.out}")
    return 0


# ============================================================================ latency

def _latency_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--model", metavar="NAME|CONFIG", help="a built-in architecture or a config.json (or its folder)")
    g.add_argument("--profile", action="append", metavar="FILE",
                   help="measured latency profile(s) to fit a linear model to (repeatable)")
    p.add_argument("--gpu", default="h100", help="GPU preset (h100, h200) or JSON file (default h100)")
    p.add_argument("--tp", type=positive_int, help="tensor-parallel degree (default: smallest with weights <= half HBM)")
    p.add_argument("--prompt", type=positive_int, default=2048, help="prompt tokens for prefill and TTFT (default 2048)")
    p.add_argument("--context", type=nonneg_int, default=1, help="context of the batch-1 decode (default 1)")
    p.add_argument("--chunk", type=positive_int, default=2048, help="prefill chunk tokens (default 2048)")
    add_output_args(p)
    p.add_argument("--save-model", metavar="FILE", help="also save the latency model (JSON) for --model-config")
    add_quiet_arg(p)


def cmd_latency(args) -> int:
    if args.profile:
        refuse_given(args, ["gpu"], "applies to --model (the roofline on a GPU); --profile fits measured points")
    save = check_out_path(args.save_model, "--save-model") if args.save_model else None
    if args.profile:
        pts, kv = [], None
        for f in args.profile:
            p, k = read_profile_points(f)
            pts.extend(p)
            kv = kv or k
        lm = fit_linear_model(pts, name=os.path.splitext(os.path.basename(args.profile[0]))[0], tp=args.tp or 1,
                              kv_bytes_per_token=kv)
    else:
        lm = build_roofline(load_model_arch(args.model), load_gpu(args.gpu), args.tp)
    d = lm.describe(prompt=args.prompt, context=args.context, chunk=args.chunk)
    if save:
        atomic_write(save, lambda f: f.write(_dumps(lm.to_dict())))
    emit_result(args, lambda: {"schema_version": 1, "kind": "latency_figures", **d}, lambda: [flatten_stats(d)],
                lambda: _latency_table(args, d))
    return 0


def _latency_table(args, d: dict) -> str:
    rows = [("model", d["name"]), ("kind", d["kind"]), ("tensor parallel", d["tp"])]
    if "gpu" in d:
        rows.append(("GPU", d["gpu"]))
    if "arch" in d:
        a = d["arch"]
        rows += [("parameters (total / active)", f"{a['total_params'] / 1e9:.2f}B / {a['active_params'] / 1e9:.2f}B"),
                 ("weights per GPU", f"{d['weights_per_gpu_bytes'] / 1e9:.1f} GB"),
                 ("KV bytes per token", f"{d['kv_bytes_per_token']:,}"),
                 ("KV capacity (tokens, 90% HBM)", f"{d['kv_capacity_tokens']:,}"),
                 ("host reload of 1K tokens", f"{d['host_reload_s_per_1k_tokens'] * 1e3:.2f} ms")]
    rows += [(f"isolated prefill of {args.prompt} tokens", f"{d['isolated_prefill_s'] * 1e3:.2f} ms"),
             (f"batch-1 decode (context {args.context})", f"{d['decode_batch1_s'] * 1e3:.2f} ms"),
             (f"TTFT SLO ({args.prompt} tokens)", f"{d['ttft_slo_s']:.3f} s"),
             ("TPOT SLO", f"{d['tpot_slo_s'] * 1e3:.1f} ms")]
    if "fit" in d:
        rows += [("fit points", d["fit"]["points"]), ("fit R^2", f"{d['fit']['r2']:.4f}"),
                 ("fit max relative error", f"{d['fit']['max_rel_error']:.2%}")]
    w = max(len(k) for k, _ in rows)
    return "".join(f"{k.ljust(w)}  {v}\n" for k, v in rows)


# ============================================================================ main

# name -> (help, description, argument builder, handler); simulate and compare: shadow_prefill.cluster.cli
SUBCOMMANDS: dict[str, tuple[str, str, Callable, Callable]] = {
    "stats": ("switch-tax statistics per model pair (Table 1 / Figure 2)",
              "Switch-tax statistics of a routed session workload: switch share, switches per session, prompt at "
              "switch calls, token-weighted prefix hit rates (unbounded and capacity-limited cache), routed token "
              "cost, and optionally isolated call latencies. One row per model pair (every pair of a matrix by "
              "default).", _stats_args, cmd_stats),
    "sessions": ("write a workload as a session trace (JSONL)",
                 "Build a workload (a matrix routed over one model pair, or a synthetic one) and write it as a "
                 "session trace (JSONL) on stdout or into --out; or check and normalise an existing trace.",
                 _sessions_args, cmd_sessions),
    "latency": ("latency figures of one model instance (roofline or fitted)",
                "Isolated prefill, batch-1 decode, the paper's SLOs (TTFT <= max(1 s, 5x isolated prefill), TPOT <= "
                "max(25 ms, 5x batch-1 decode)), KV bytes per token and capacity, from the analytic roofline of a "
                "config.json on a GPU, or fitted to measured profiles.", _latency_args, cmd_latency),
}


def build_parser() -> argparse.ArgumentParser:
    from shadow_prefill.cluster.cli import register  # simulate, compare (imports this module's helpers: none)

    p = Parser(prog="tr-shadow", description="Per-call routing of agent sessions: the model-switch tax, latency "
                                             "models and ShadowPrefill's shadow budget.")
    add_version(p)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    add_subcommands(sub, SUBCOMMANDS)
    register(sub)
    return p


def _run(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    require_subcommand(parser, args)
    for flag in ("out", "save_model"):  # refuse a folder or a device before any work, not after an hour of it
        if getattr(args, flag, None):
            check_out_path(getattr(args, flag), "--" + flag.replace("_", "-"))
    return int(args.func(args) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tr-shadow``; returns the exit code (0 ok, 2 bad input, 3 resource limit, 130 interrupted)."""
    try:
        return run_cli(_run, argv)
    except SystemExit as e:  # --help, --version and the error contract's exits, as a return value
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)


if __name__ == "__main__":
    sys.exit(main())
