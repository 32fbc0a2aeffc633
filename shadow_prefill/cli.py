"""``tr-shadow``: per-call routing of agent sessions (ShadowPrefill).

Subcommands::

    tr-shadow stats     switch-tax statistics of a workload, per model pair (Table 1 / Figure 2)
    tr-shadow sessions  write a workload (matrix-routed or synthetic) as a session trace (JSONL)
    tr-shadow latency   a model instance's latency figures: isolated prefill, decode, SLOs, KV

Every subcommand is a function ``cmd_<name>(args) -> int`` registered in
:data:`SUBCOMMANDS` with its argument builder, so later ones (``simulate``,
``compare``) plug in the same way and reuse :func:`add_workload_args` /
:func:`workload_from_args`.  User errors print one ``error: ...`` line on
stderr and exit 2.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import sys
from typing import Any, Callable, Sequence

from tr_core.errors import TRError

from shadow_prefill.builder import AgentLoopParams, LengthDist, LogNormal, MatrixWorkload, SyntheticParams, \
    generate_synthetic_sessions
from shadow_prefill.errors import ShadowError
from shadow_prefill.latency import LatencyModel, build_roofline, fit_linear_model, load_gpu, load_model_arch, \
    read_profile_points
from shadow_prefill.matrix import load_matrix, load_prices
from shadow_prefill.sessions import SessionSet
from shadow_prefill.stats import DEFAULT_CACHE_CAPACITY, STATS_COLUMNS, ReplayParams, compute_switch_tax, flatten_stats
from shadow_prefill.trace_io import atomic_write, read_session_trace, write_session_trace

__all__ = ["main", "build_parser", "SUBCOMMANDS", "add_workload_args", "workload_from_args"]

from tr_core.version import __version__ as VERSION


# ============================================================================ argument helpers

def _int_at_least(lo: int) -> Callable[[str], int]:
    def conv(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        return v
    return conv


_positive_int = _int_at_least(1)
_nonneg_int = _int_at_least(0)


def _float(lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> Callable[[str], float]:
    def conv(s: str) -> float:
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be finite, got {s!r}")
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise argparse.ArgumentTypeError(f"must be {'>' if lo_open else '>='} {lo:g}, got {v:g}")
        if hi is not None and v > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi:g}, got {v:g}")
        return v
    return conv


def _name_values(items: Sequence[str] | None, what: str, conv: Callable[[str], Any]) -> tuple[Any, dict[str, Any]]:
    """``["32768", "big=131072"]`` -> (32768, {"big": 131072}); the bare value is the default."""
    default, named = None, {}
    for it in items or []:
        if "=" in it:
            k, v = it.rsplit("=", 1)
            if not k:
                raise ShadowError(f"{what}: empty model name in {it!r}")
            named[k] = conv(v)
        else:
            default = conv(it)
    return default, named


def _int_value(what: str) -> Callable[[str], int]:
    def conv(v: str) -> int:
        try:
            x = int(v)
        except ValueError:
            raise ShadowError(f"{what}: expected an integer, got {v!r}") from None
        if x < 0:
            raise ShadowError(f"{what}: must be >= 0, got {x}")
        return x
    return conv


# ============================================================================ workloads

def add_workload_args(p: argparse.ArgumentParser, multi: bool = True) -> None:
    """Options that define session workloads (shared by every subcommand that needs them).

    ``multi``: ``--trace`` and ``--matrix`` may repeat and mix with ``--synthetic`` (one result row per workload
    and pair); otherwise exactly one source.
    """
    if multi:
        src = p.add_argument_group("workload sources (at least one; --trace and --matrix repeatable)")
        src.add_argument("--trace", metavar="FILE", action="append",
                         help="a session trace (JSONL, data/schemas/session-trace.schema.json)")
        src.add_argument("--matrix", metavar="FILE", action="append",
                         help="a routing-benchmark matrix (queries x model scores, JSON or JSONL)")
        src.add_argument("--synthetic", action="store_true", help="a synthetic workload (see the synthetic options)")
        src.add_argument("--pair", nargs=2, action="append", metavar=("A", "B"),
                         help="with --matrix: route over this model pair (repeatable; default: every pair)")
    else:
        src = p.add_argument_group("workload source (exactly one)")
        g = src.add_mutually_exclusive_group(required=True)
        g.add_argument("--trace", metavar="FILE", help="a session trace (JSONL, data/schemas/session-trace.schema.json)")
        g.add_argument("--matrix", metavar="FILE", help="a routing-benchmark matrix (queries x model scores, JSON or "
                                                        "JSONL)")
        g.add_argument("--synthetic", action="store_true", help="a synthetic workload (see the synthetic options)")
        src.add_argument("--pair", nargs=2, metavar=("A", "B"), help="with --matrix: the model pair to route over")
    src.add_argument("--prices", "--models", dest="prices", metavar="FILE",
                     help="model prices, models.json format ({model: {input_price, output_price}} in $/M tokens); "
                          "for --matrix defaults to models.json next to the matrix")
    src.add_argument("--name", help="workload label in the output (one source only; default: the file name, or "
                                    "'synthetic')")

    b = p.add_argument_group("agent-loop builder (--matrix, --synthetic)")
    b.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    b.add_argument("--session-length", default="geometric:12", metavar="DIST",
                   help="calls per session: fixed:N, uniform:A-B, geometric:MEAN, poisson:MEAN (default geometric:12)")
    b.add_argument("--tool-tokens", default="1000,1.0", metavar="MEDIAN[,SIGMA]",
                   help="tool-result tokens appended after each call, lognormal (default 1000,1.0)")
    b.add_argument("--output-tokens", default="300,0.8", metavar="MEDIAN[,SIGMA]",
                   help="output tokens per call, lognormal (default 300,0.8)")
    b.add_argument("--gap", default="2.0,1.0", metavar="MEDIAN[,SIGMA]",
                   help="seconds between a call's completion and the next call, lognormal (default 2.0,1.0)")
    b.add_argument("--summary-tokens", type=_positive_int, default=1000,
                   help="size of the summary a compaction leaves (default 1000)")
    b.add_argument("--context-window", action="append", metavar="TOKENS|MODEL=TOKENS",
                   help="context window that triggers compaction (default 32768; MODEL=TOKENS per model; repeatable)")
    b.add_argument("--tokenizer", metavar="PATH",
                   help="--matrix: a local tokenizer.json (or its folder) to count query tokens "
                        "(default: the estimate ceil(characters / 4))")
    b.add_argument("--respect-tasks", action="store_true",
                   help="--matrix: end a session where the task label (cluster_id) changes")

    s = p.add_argument_group("synthetic workload (--synthetic)")
    s.add_argument("--sessions", type=_positive_int, default=100, help="number of sessions (default 100)")
    s.add_argument("--switch-prob", type=_float(0.0, 1.0), default=0.25,
                   help="probability that a call switches model (default 0.25)")
    s.add_argument("--synthetic-models", nargs="+", default=["small", "large"], metavar="MODEL",
                   help="model names (default: small large)")
    s.add_argument("--first-input", default="2000,0.7", metavar="MEDIAN[,SIGMA]",
                   help="input tokens of a session's first call, lognormal (default 2000,0.7)")
    s.add_argument("--step-input", default="200,0.8", metavar="MEDIAN[,SIGMA]",
                   help="input tokens of later calls besides the tool result, lognormal (default 200,0.8)")
    s.add_argument("--tasks", type=_positive_int, default=1, help="number of task labels (default 1)")


def _loop_params(args) -> AgentLoopParams:
    default, named = _name_values(args.context_window, "--context-window", _int_value("--context-window"))
    loop = AgentLoopParams(session_length=LengthDist.parse(args.session_length),
                           tool_tokens=LogNormal.parse(args.tool_tokens),
                           output_tokens=LogNormal.parse(args.output_tokens, lo=1.0),
                           gap_s=LogNormal.parse(args.gap, integer=False, lo=0.0),
                           summary_tokens=args.summary_tokens,
                           context_window=32768 if default is None else default, context_windows=named)
    loop.check()
    return loop


def _as_list(x) -> list:
    return [] if x is None else (list(x) if isinstance(x, list) else [x])


def workload_from_args(args) -> list[tuple[SessionSet, dict | None, dict | None]]:
    """The workloads the options describe: ``(sessions, accuracy, prices)`` per workload and model pair."""
    traces, matrices = _as_list(args.trace), _as_list(args.matrix)
    n_sources = len(traces) + len(matrices) + int(bool(args.synthetic))
    if n_sources == 0:
        raise ShadowError("give a workload: --trace FILE, --matrix FILE or --synthetic")
    if args.name and n_sources > 1:
        raise ShadowError("--name labels a single workload; with several, each is named after its file")
    pairs = args.pair
    if pairs and not matrices:
        raise ShadowError("--pair applies to --matrix only (a trace or synthetic workload names its own models)")
    if args.tokenizer and not matrices:
        raise ShadowError("--tokenizer applies to --matrix only")
    prices = load_prices(args.prices) if args.prices else None
    out: list[tuple[SessionSet, dict | None, dict | None]] = []
    loop = _loop_params(args) if (matrices or args.synthetic) else None
    for path in matrices:
        m = load_matrix(path, args.prices)
        w = MatrixWorkload(m, loop, seed=args.seed, tokenizer=args.tokenizer, respect_tasks=args.respect_tasks,
                           name=args.name)
        if pairs is None:
            plist = m.all_pairs()
        elif isinstance(pairs[0], str):
            plist = [m.ordered_pair(*pairs)]
        else:
            plist = [m.ordered_pair(a, b) for a, b in pairs]
        out.extend((w.sessions(p), w.accuracy(p), m.prices) for p in plist)
    for path in traces:
        out.append((read_session_trace(path, name=args.name), None, prices))
    if args.synthetic:
        sp = SyntheticParams(n_sessions=args.sessions, models=tuple(args.synthetic_models),
                             switch_prob=args.switch_prob, first_input=LogNormal.parse(args.first_input),
                             step_input=LogNormal.parse(args.step_input), loop=loop, n_tasks=args.tasks,
                             seed=args.seed)
        out.append((generate_synthetic_sessions(sp, name=args.name or "synthetic"), None, prices))
    return out


# ============================================================================ output

def _emit(text: str, out: str | None) -> None:
    if out:
        atomic_write(out, lambda f: f.write(text))
    else:
        sys.stdout.write(text)


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
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    lines = []
    for k, r in enumerate(cells):
        lines.append("  ".join(x.ljust(w) if i < 2 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths))))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def render_csv(rows: list[dict]) -> str:
    flat = [flatten_stats(r) for r in rows]
    keys: list[str] = []
    for f in flat:
        for k in f:
            if k not in keys:
                keys.append(k)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    for f in flat:
        w.writerow({k: ("" if f.get(k) is None else f.get(k)) for k in keys})
    return buf.getvalue()


def _json_default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _dumps(doc: Any) -> str:
    return json.dumps(doc, indent=2, default=_json_default, allow_nan=False) + "\n"


# ============================================================================ latency models

def _latency_models(args, models: Sequence[str]) -> dict[str, LatencyModel]:
    """A latency model for each of ``models`` (every model of every workload of the command)."""
    _, named = _name_values(args.model_config, "--model-config", str)
    unknown = sorted(set(named) - set(models))
    if unknown:
        raise ShadowError(f"--model-config names model(s) not in the workload: {', '.join(unknown)} "
                          f"(models: {', '.join(models)})")
    gpu = load_gpu(args.gpu)
    out = {}
    for m in models:
        spec = named.get(m, m)
        if os.path.splitext(spec)[1] == ".json" and os.path.exists(spec):
            try:
                with open(spec, "r", encoding="utf-8") as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                doc = None
            if isinstance(doc, dict) and doc.get("kind") == "latency_model":  # saved by tr-shadow latency --save-model
                out[m] = LatencyModel.from_dict(doc, where=spec)
                continue
        try:
            arch = load_model_arch(spec, name=m)
        except ShadowError as e:
            raise ShadowError(f"latency model for {m!r}: {e}; map it with --model-config {m}=PRESET|CONFIG.json") from None
        out[m] = build_roofline(arch, gpu, args.tp)
    return out


# ============================================================================ stats

def _stats_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("stats", help="switch-tax statistics per model pair (Table 1 / Figure 2)",
                       description="Switch-tax statistics of a routed session workload: switch share, switches per "
                                   "session, prompt at switch calls, token-weighted prefix hit rates (unbounded and "
                                   "capacity-limited cache), routed token cost, and optionally isolated call "
                                   "latencies. One row per model pair (every pair of a matrix by default).")
    add_workload_args(p, multi=True)
    c = p.add_argument_group("cache and cost")
    c.add_argument("--cache-capacity", action="append", metavar="TOKENS|MODEL=TOKENS",
                   help=f"per-model cache capacity in tokens of session context (default {DEFAULT_CACHE_CAPACITY}; "
                        f"MODEL=TOKENS per model; repeatable)")
    c.add_argument("--cached-fraction", type=_float(0.0, 1.0), default=0.1,
                   help="price of cached input as a fraction of uncached (default 0.1)")
    c.add_argument("--session-rate", type=_float(0.0, lo_open=True), default=0.05,
                   help="sessions per second of the replay clock that orders calls for the capacity-limited "
                        "cache (default 0.05)")
    c.add_argument("--replay-tpot", type=_float(0.0), default=0.025,
                   help="seconds per output token of the replay clock (default 0.025)")
    lt = p.add_argument_group("isolated call latency (Figure 2d)")
    lt.add_argument("--latency", action="store_true",
                    help="add isolated latency and TTFT of same-model and switch calls from the roofline")
    lt.add_argument("--gpu", default="h100", help="GPU preset (h100, h200) or JSON file (default h100)")
    lt.add_argument("--model-config", action="append", metavar="MODEL=PRESET|CONFIG",
                    help="architecture of a workload model: a built-in name, a config.json, or a saved latency model "
                         "JSON (default: the model's own name as a built-in)")
    lt.add_argument("--tp", type=_positive_int, help="tensor-parallel degree (default: the smallest at which weights "
                                                     "take at most half the HBM)")
    lt.add_argument("--chunk", type=_positive_int, default=2048, help="prefill chunk tokens (default 2048)")
    o = p.add_argument_group("output")
    o.add_argument("--format", choices=("table", "json", "csv"), default="table")
    o.add_argument("--out", metavar="FILE", help="write the output to FILE (atomically) instead of stdout")
    return p


def cmd_stats(args) -> int:
    cap_default, cap_named = _name_values(args.cache_capacity, "--cache-capacity", _int_value("--cache-capacity"))
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
    lms_all = _latency_models(args, all_models) if args.latency else None
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
    if args.format == "json":
        text = _dumps(doc)
    elif args.format == "csv":
        text = render_csv(results)
    else:
        text = render_table(results, STATS_COLUMNS)
    _emit(text, args.out)
    return 0


# ============================================================================ sessions

def _sessions_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("sessions", help="write a workload as a session trace (JSONL)",
                       description="Build a workload (a matrix routed over one model pair, or a synthetic one) and "
                                   "write it as a session trace; or check and normalise an existing trace.")
    add_workload_args(p, multi=False)
    p.add_argument("--out", metavar="FILE", required=True, help="the trace to write (atomically)")
    return p


def cmd_sessions(args) -> int:
    if args.matrix and not args.pair:
        raise ShadowError("--matrix needs --pair A B to write one routed workload")
    ss = workload_from_args(args)[0][0]
    n = write_session_trace(ss, args.out)
    if sys.stderr.isatty():
        sys.stderr.write(f"wrote {n} calls in {ss.n_sessions} sessions to {args.out}\n")
    return 0


# ============================================================================ latency

def _latency_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("latency", help="latency figures of one model instance (roofline or fitted)",
                       description="Isolated prefill, batch-1 decode, the paper's SLOs (TTFT <= max(1 s, 5x isolated "
                                   "prefill), TPOT <= max(25 ms, 5x batch-1 decode)), KV bytes per token and capacity, "
                                   "from the analytic roofline of a config.json on a GPU, or fitted to measured "
                                   "profiles.")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--model", metavar="NAME|CONFIG", help="a built-in architecture or a config.json (or its folder)")
    g.add_argument("--profile", action="append", metavar="FILE",
                   help="measured latency profile(s) to fit a linear model to (repeatable)")
    p.add_argument("--gpu", default="h100", help="GPU preset (h100, h200) or JSON file (default h100)")
    p.add_argument("--tp", type=_positive_int, help="tensor-parallel degree (default: smallest with weights <= half HBM)")
    p.add_argument("--prompt", type=_positive_int, default=2048, help="prompt tokens for prefill and TTFT (default 2048)")
    p.add_argument("--context", type=_nonneg_int, default=1, help="context of the batch-1 decode (default 1)")
    p.add_argument("--chunk", type=_positive_int, default=2048, help="prefill chunk tokens (default 2048)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--out", metavar="FILE", help="write the output to FILE (atomically) instead of stdout")
    p.add_argument("--save-model", metavar="FILE", help="also save the latency model (JSON) for --model-config")
    return p


def cmd_latency(args) -> int:
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
    if args.save_model:
        atomic_write(args.save_model, lambda f: f.write(_dumps(lm.to_dict())))
    if args.format == "json":
        _emit(_dumps({"schema_version": 1, "kind": "latency_figures", **d}), args.out)
        return 0
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
    _emit("".join(f"{k.ljust(w)}  {v}\n" for k, v in rows), args.out)
    return 0


# ============================================================================ main

SUBCOMMANDS: dict[str, tuple[Callable, Callable]] = {
    "stats": (_stats_parser, cmd_stats),
    "sessions": (_sessions_parser, cmd_sessions),
    "latency": (_latency_parser, cmd_latency),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tr-shadow", description="Per-call routing of agent sessions: the model-switch "
                                "tax, latency models and ShadowPrefill's shadow budget.")
    p.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (builder, func) in SUBCOMMANDS.items():
        builder(sub).set_defaults(func=func)
    __import__("shadow_prefill.cluster.cli", fromlist=["register"]).register(sub)  # simulate, compare (part 2)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TRError as e:
        sys.stderr.write(f"error: {e}\n")
        return e.exit_code
    except (ValueError, OSError) as e:  # anything the validation above did not name: still one line, exit 2
        sys.stderr.write(f"error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130
    except BrokenPipeError:
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0


if __name__ == "__main__":
    sys.exit(main())
