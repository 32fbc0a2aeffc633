"""Command-line pieces shared by every ``tr-shadow`` subcommand: value parsers, workload options, latency models.

Both :mod:`shadow_prefill.cli` (``stats``, ``sessions``, ``latency``) and
:mod:`shadow_prefill.cluster.cli` (``simulate``, ``compare``) import this
module; it imports neither, so the two command modules form no circle.

Value parsers raise :class:`argparse.ArgumentTypeError` (argparse turns it
into one ``error: argument --flag: ...`` line, exit 2) or
:class:`~shadow_prefill.errors.ShadowError` (the same line and exit code,
raised after parsing).  Lists follow the project's CLI convention
(``docs/cli-convention.md``): space-separated, with the old comma-separated
spelling still read for one release and a ``note:`` on stderr (the plumbing of :mod:`tr_core.cli`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any, Callable, Sequence

from tr_core.fileio import json_ready

from shadow_prefill.builder import AgentLoopParams, LengthDist, LogNormal, MatrixWorkload, SyntheticParams, \
    generate_synthetic_sessions
from shadow_prefill.errors import ShadowError
from shadow_prefill.sessions import SessionSet

__all__ = ["int_at_least", "positive_int", "nonneg_int", "number", "name_values", "int_value", "add_workload_args", "loop_params", "synthetic_params", "workload_from_args",
           "latency_models", "emit_result"]

# The largest count a flag may give (sessions, tokens, instances...): far above any real use, small enough that
# sizes computed from it (arrays, products of two counts) stay inside int64.
MAX_COUNT = 10 ** 9


# ============================================================================ value parsers

def int_at_least(lo: int, hi: int = MAX_COUNT) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``[lo, hi]``."""
    def conv(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {v}")
        if v > hi:
            raise argparse.ArgumentTypeError(f"must be <= {hi}, got {v}")
        return v
    return conv


positive_int = int_at_least(1)
nonneg_int = int_at_least(0)


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
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


def name_values(items: Sequence[str] | None, what: str, conv: Callable[[str], Any]) -> tuple[Any, dict[str, Any]]:
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


def int_value(what: str, lo: int = 0, hi: int = MAX_COUNT) -> Callable[[str], int]:
    """A converter for :func:`name_values`: an integer in ``[lo, hi]`` (errors name ``what``)."""
    def conv(v: str) -> int:
        try:
            x = int(v)
        except ValueError:
            raise ShadowError(f"{what}: expected an integer, got {v!r}") from None
        if x < lo:
            raise ShadowError(f"{what}: must be >= {lo}, got {x}")
        if x > hi:
            raise ShadowError(f"{what}: must be <= {hi}, got {x}")
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
        src.add_argument("--workload", choices=("paper", "paper-coding"), metavar="PRESET",
                         help="a paper-calibrated synthetic workload (Table 1 ranges, docs/shadow_prefill.md): paper = "
                              "the routing benchmarks, paper-coding = GHCP-coding; --sessions and --seed apply, the "
                              "other builder options are the preset's")
        src.add_argument("--pair", nargs=2, action="append", metavar=("A", "B"),
                         help="with --matrix: route over this model pair (repeatable; default: every pair)")
    else:
        src = p.add_argument_group("workload source (exactly one)")
        g = src.add_mutually_exclusive_group(required=True)
        g.add_argument("--trace", metavar="FILE", help="a session trace (JSONL, data/schemas/session-trace.schema.json)")
        g.add_argument("--matrix", metavar="FILE", help="a routing-benchmark matrix (queries x model scores, JSON or "
                                                        "JSONL)")
        g.add_argument("--synthetic", action="store_true", help="a synthetic workload (see the synthetic options)")
        g.add_argument("--workload", choices=("paper", "paper-coding"), metavar="PRESET",
                       help="a paper-calibrated synthetic workload (Table 1 ranges, docs/shadow_prefill.md): paper = "
                            "the routing benchmarks, paper-coding = GHCP-coding; --sessions and --seed apply, the "
                            "other builder options are the preset's")
        src.add_argument("--pair", nargs=2, metavar=("A", "B"), help="with --matrix: the model pair to route over")
    src.add_argument("--prices", dest="prices", metavar="FILE",
                              help="model prices, models.json format ({model: {input_price, output_price}} in $/M "
                                   "tokens); for --matrix defaults to models.json next to the matrix")
    src.add_argument("--name", help="workload label in the output (one source only; default: the file name, or "
                                    "'synthetic')")

    b = p.add_argument_group("agent-loop builder (--matrix, --synthetic)")
    b.add_argument("--seed", type=int, default=0, help="random seed of the workload (default 0)")
    b.add_argument("--session-length", default="geometric:12", metavar="DIST",
                   help="calls per session: fixed:N, uniform:A-B, geometric:MEAN, poisson:MEAN (default geometric:12)")
    b.add_argument("--tool-tokens", default="1000,1.0", metavar="MEDIAN[,SIGMA]",
                   help="tool-result tokens appended after each call, lognormal (default 1000,1.0)")
    b.add_argument("--output-tokens", default="300,0.8", metavar="MEDIAN[,SIGMA]",
                   help="output tokens per call, lognormal (default 300,0.8)")
    b.add_argument("--gap-s", dest="gap", default="2.0,1.0", metavar="MEDIAN[,SIGMA]",
                         help="seconds between a call's completion and the next call, lognormal (default 2.0,1.0)")
    b.add_argument("--summary-tokens", type=positive_int, default=1000,
                   help="size of the summary a compaction leaves (default 1000)")
    b.add_argument("--context-window", action="append", metavar="TOKENS|MODEL=TOKENS",
                   help="context window that triggers compaction (default 32768; MODEL=TOKENS per model; repeatable)")
    b.add_argument("--tokenizer", metavar="PATH",
                   help="--matrix: a local tokenizer.json (or its folder) to count query tokens "
                        "(default: the estimate ceil(characters / 4))")
    b.add_argument("--respect-tasks", action="store_true",
                   help="--matrix: end a session where the task label (cluster_id) changes")

    s = p.add_argument_group("synthetic workload (--synthetic)")
    s.add_argument("--sessions", type=int_at_least(1, 10 ** 7), default=100, help="number of sessions (default 100)")
    s.add_argument("--switch-prob", type=number(0.0, 1.0), default=0.25,
                   help="probability that a call switches model (default 0.25)")
    s.add_argument("--synthetic-models", nargs="+", default=["small", "large"], metavar="MODEL",
                   help="model names (default: small large)")
    s.add_argument("--first-input", default="2000,0.7", metavar="MEDIAN[,SIGMA]",
                   help="input tokens of a session's first call, lognormal (default 2000,0.7)")
    s.add_argument("--step-input", default="200,0.8", metavar="MEDIAN[,SIGMA]",
                   help="input tokens of later calls besides the tool result, lognormal (default 200,0.8)")
    s.add_argument("--tasks", type=positive_int, default=1, help="number of task labels (default 1)")


def _lognormal(spec: str, flag: str, **kw) -> LogNormal:
    try:
        d = LogNormal.parse(spec, **kw)
    except ShadowError as e:
        raise ShadowError(f"{flag}: {e}") from None
    if not (math.isfinite(d.median) and math.isfinite(d.sigma)):
        raise ShadowError(f"{flag}: {spec!r}: the median and sigma must be finite")
    return d


def loop_params(args) -> AgentLoopParams:
    default, named = name_values(args.context_window, "--context-window", int_value("--context-window"))
    loop = AgentLoopParams(session_length=LengthDist.parse(args.session_length),
                           tool_tokens=_lognormal(args.tool_tokens, "--tool-tokens"),
                           output_tokens=_lognormal(args.output_tokens, "--output-tokens", lo=1.0),
                           gap_s=_lognormal(args.gap, "--gap-s", integer=False, lo=0.0),
                           summary_tokens=args.summary_tokens,
                           context_window=32768 if default is None else default, context_windows=named)
    loop.check()
    return loop


def synthetic_params(args, models: Sequence[str] | None = None) -> SyntheticParams:
    """The synthetic-workload options as :class:`SyntheticParams` (``models`` overrides ``--synthetic-models``)."""
    if getattr(args, "workload", None):
        from shadow_prefill.builder import workload_preset
        return workload_preset(args.workload, n_sessions=args.sessions, seed=args.seed,
                               models=tuple(models or args.synthetic_models))
    return SyntheticParams(n_sessions=args.sessions, models=tuple(models or args.synthetic_models),
                           switch_prob=args.switch_prob, first_input=_lognormal(args.first_input, "--first-input"),
                           step_input=_lognormal(args.step_input, "--step-input"), loop=loop_params(args),
                           n_tasks=args.tasks, seed=args.seed)


LOOP_OPTIONS = ("session_length", "tool_tokens", "output_tokens", "gap", "summary_tokens", "context_window")
SYNTHETIC_OPTIONS = ("sessions", "switch_prob", "synthetic_models", "first_input", "step_input", "tasks")


def _refuse_dropped(args, matrix: bool, synthetic: bool, preset: str | None) -> None:
    """Builder options the chosen workload source would ignore are refused, naming the flag typed."""
    from tr_core.cli import given

    def refuse(dests, reason):
        for d in dests:
            if given(args, d):
                raise ShadowError(f"{given(args, d)} {reason}")

    if preset:
        refuse(LOOP_OPTIONS + ("switch_prob", "first_input", "step_input", "tasks"),
               f"has no effect with --workload {preset}: the preset sets it (only --sessions, --seed and "
               f"--synthetic-models apply)")
    if not (synthetic or preset):
        refuse(SYNTHETIC_OPTIONS, "applies to --synthetic or --workload only")
    if not (matrix or synthetic):
        refuse(LOOP_OPTIONS, "applies to the agent-loop builder (--matrix or --synthetic), not to "
               + ("--workload" if preset else "--trace (a trace holds its sessions)"))
    if not matrix:
        refuse(("respect_tasks",), "applies to --matrix only")


def _as_list(x) -> list:
    return [] if x is None else (list(x) if isinstance(x, list) else [x])


def workload_from_args(args) -> list[tuple[SessionSet, dict | None, dict | None]]:
    """The workloads the options describe: ``(sessions, accuracy, prices)`` per workload and model pair."""
    from shadow_prefill.matrix import load_matrix, load_prices
    from shadow_prefill.trace_io import read_session_trace

    traces, matrices = _as_list(args.trace), _as_list(args.matrix)
    preset = getattr(args, "workload", None)
    n_sources = len(traces) + len(matrices) + int(bool(args.synthetic or preset))
    if n_sources == 0:
        raise ShadowError("give a workload: --trace FILE, --matrix FILE or --synthetic")
    if args.name and n_sources > 1:
        raise ShadowError("--name labels a single workload; with several, each is named after its file")
    pairs = args.pair
    if pairs and not matrices:
        raise ShadowError("--pair applies to --matrix only (a trace or synthetic workload names its own models)")
    if args.tokenizer and not matrices:
        raise ShadowError("--tokenizer applies to --matrix only")
    _refuse_dropped(args, bool(matrices), bool(args.synthetic), preset)
    prices = load_prices(args.prices) if args.prices else None
    out: list[tuple[SessionSet, dict | None, dict | None]] = []
    loop = loop_params(args) if (matrices or (args.synthetic and not preset)) else None
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
    if args.synthetic or preset:
        sp = synthetic_params(args)
        out.append((generate_synthetic_sessions(sp, name=args.name or preset or "synthetic"), None, prices))
    return out


# ============================================================================ latency models

def latency_models(args, models: Sequence[str], fallback: dict[str, str] | None = None) -> list:
    """A :class:`~shadow_prefill.latency.LatencyModel` for each of ``models``, from ``--model-config``/``--gpu``/
    ``--tp``.

    A model maps to ``--model-config MODEL=SPEC`` or else to its own name: a built-in architecture, a
    ``config.json``, or a latency model saved by ``tr-shadow latency --save-model``.  ``fallback`` maps
    unmapped names that are no built-in (``small`` / ``large`` of a synthetic workload) to one.
    """
    from shadow_prefill.latency import LatencyModel, build_roofline, load_gpu, load_model_arch

    _, named = name_values(args.model_config, "--model-config", str)
    unknown = sorted(set(named) - set(models))
    if unknown:
        raise ShadowError(f"--model-config names model(s) not in the workload: {', '.join(unknown)} "
                          f"(models: {', '.join(models)})")
    gpu = load_gpu(args.gpu)
    out = []
    for m in models:
        spec = named.get(m, m)
        if os.path.splitext(spec)[1] == ".json" and os.path.isfile(spec):
            try:
                with open(spec, "r", encoding="utf-8") as f:
                    doc = json.load(f)
            except (OSError, ValueError, RecursionError):
                doc = None  # load_model_arch below reports what is wrong with the file
            if isinstance(doc, dict) and doc.get("kind") == "latency_model":  # saved by tr-shadow latency
                out.append(LatencyModel.from_dict(doc, where=spec))
                continue
        try:
            arch = load_model_arch(spec, name=m)
        except ShadowError as e:
            if fallback and m not in named and m in fallback:
                arch = load_model_arch(fallback[m], name=fallback[m])
            else:
                raise ShadowError(f"latency model for {m!r}: {e}; map it with --model-config {m}=PRESET|CONFIG.json"
                                  ) from None
        out.append(build_roofline(arch, gpu, args.tp))
    return out


# ============================================================================ output documents

#: a JSON-ready copy: NumPy scalars and arrays as Python values, non-finite floats as ``None``
clean = json_ready


def dumps_document(doc: Any) -> str:
    """A result document as indented JSON (strict: no NaN or Infinity; unknown values are ``null``)."""
    return json.dumps(clean(doc), indent=2, allow_nan=False) + "\n"


def csv_text(rows: Sequence[dict]) -> str:
    """Rows as CSV: the union of their keys in first-seen order as the header; ``None`` and missing are empty."""
    import csv
    import io

    keys: list[str] = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)
    buf = io.StringIO()
    wr = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    wr.writeheader()
    for r in rows:
        wr.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in keys})
    return buf.getvalue()


def emit_result(args, doc: Callable[[], Any], rows: Callable[[], Sequence[dict]], table: Callable[[], str]) -> None:
    """A subcommand's result in its ``--format``, on stdout or into ``--out``: ``json`` the document ``doc()``,
    ``csv`` the rows ``rows()``, ``table`` the text ``table()`` (only the one asked for is made)."""
    from tr_core.cli import emit, output_format
    fmt = output_format(args)
    emit(dumps_document(doc()) if fmt == "json" else csv_text(rows()) if fmt == "csv" else table(), args.out)


def text_table(cells: Sequence[Sequence[str]], left: int = 1) -> str:
    """A plain-text table: the header row ``cells[0]``, a rule of dashes, then the rows; the first ``left``
    columns left-aligned (labels), the others right-aligned (numbers)."""
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = []
    for k, r in enumerate(cells):
        lines.append("  ".join(x.ljust(w) if i < left else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths))))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"
