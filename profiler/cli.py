"""``tr-profile``: measure L_i(b), estimate P and C from routing traces, assemble system specs.

Subcommands: ``latency``, ``routing``, ``route-run``, ``system``, ``roofline``,
``serve-bench`` (see ``docs/profiler.md``).  Built on the shared plumbing of :mod:`tr_core.cli`
and its convention (``docs/cli-convention.md``): bad input is one ``error:``
line and exit 2, Ctrl-C exit 130, lists are space-separated, ``--out FILE``
writes what stdout would get to FILE instead (the format from ``--format`` or
the file's extension).  The JSON output of ``latency`` is the profile, of
``system`` (and of ``routing`` when latencies are given) the spec, so
``--out x.json`` writes the file the next tool reads.  ``routing`` and
``roofline`` never import torch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Sequence

from tr_core.cli import (Parser, add_list_arg, add_output_args, add_quiet_arg, add_subcommands, add_version,
                         add_window_args, check_number, check_out_path, emit, format_table, note, output_format,
                         parse_int_ranges, refuse_given, require_subcommand, run_cli, to_csv)
from tr_core.errors import SpecError, WorkTooLarge
from tr_core.units import positive_number

MAX_PROFILED_STEPS = 1_000_000  # timed + warm-up steps of one tr-profile run
MAX_BATCH_SIZES = 256


def _say(a: argparse.Namespace, msg: str) -> None:
    """Progress for a person at a terminal (silent when piped or --quiet)."""
    if sys.stderr.isatty() and not getattr(a, "quiet", False):
        sys.stderr.write(msg + "\n")


def _warn(a: argparse.Namespace, msg: str) -> None:
    if not getattr(a, "quiet", False):
        note(msg)


def _batch_sizes(values: Sequence[str]) -> list[int]:
    sizes = parse_int_ranges(values, "--batch-sizes", lo=1, hi=1 << 20)
    if len(sizes) > MAX_BATCH_SIZES:
        raise SpecError(f"--batch-sizes: {len(sizes)} batch sizes asked, at most {MAX_BATCH_SIZES} are profiled "
                        f"in one run")
    return list(sizes)


def _delta(text: str | None) -> float | str:
    if text is None:
        return 0.1
    if text == "auto":
        return "auto"
    return positive_number(text, error=SpecError, not_a_number="--delta-ms must be a number of ms > 0 or 'auto'",
                           not_positive="--delta-ms must be a finite number of ms > 0")


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _render(rows: list[dict], fmt: str, doc: Any, lines: Sequence[str] = ()) -> str:
    """The text of one result: a table (plus summary lines), CSV of the rows, or the JSON document."""
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    headers = list(rows[0]) if rows else []
    if fmt == "csv":
        return to_csv(headers, [["" if r[h] is None else r[h] for h in headers] for r in rows]) if rows else ""
    text = format_table(headers, [[_cell(r[h]) for h in headers] for r in rows]) + "\n" if rows else ""
    return text + "".join(line + "\n" for line in lines)


def _out_is_json(a: argparse.Namespace, fmt: str) -> bool:
    return bool(a.out) and fmt == "json"


# ----------------------------------------------------------------------------
# shared option groups

def _set_threads(a: argparse.Namespace) -> None:
    if getattr(a, "threads", None) is not None:
        if a.threads < 1:
            raise SpecError(f"--threads must be >= 1, got {a.threads}")
        import torch
        torch.set_num_threads(a.threads)


def _default_dtype(dtype: str, device: str) -> str:
    if dtype != "auto":
        return dtype
    return "bf16" if device.startswith("cuda") else "fp32"


def _latency_args(p: argparse.ArgumentParser, batch_default: Sequence[str]) -> None:
    g = p.add_argument_group("latency measurement")
    g.add_argument("--batch-sizes", nargs="+", default=list(batch_default), metavar="B",
                   help=f"batch sizes (requests per step), each >= 1; values or ranges A-B "
                        f"(default {' '.join(batch_default)})")
    g.add_argument("--mode", choices=("decode", "extend"), default="decode",
                   help="decode: 1 new token per request per step; extend: --extend-tokens per request "
                        "(the handoff path) (default decode)")
    g.add_argument("--context", type=int, default=128,
                   help="KV-cache length per request in tokens, held fixed while timing (default 128)")
    g.add_argument("--extend-tokens", type=int, default=8,
                   help="tokens appended per request per step in extend mode (default 8)")
    g.add_argument("--warmup-steps", type=int, default=3, help="untimed warm-up steps per batch size (default 3)")
    g.add_argument("--steps", type=int, default=20, help="timed steps per batch size (default 20)")
    g.add_argument("--cuda-graph", action="store_true",
                   help="capture the step into a CUDA graph over a static KV cache and time its replays (CUDA only)")
    g.add_argument("--attention", choices=("serving", "transformers"), default="serving",
                   help="serving: GQA-native attention without a mask, as serving engines run it; transformers: "
                        "the model's own implementation (default serving; see docs/profiler.md)")
    g.add_argument("--bandwidth-gbs", type=float, default=None, metavar="GB/S",
                   help="memory bandwidth for the roofline in GB/s (default: the GPU's spec-sheet figure, else a "
                        "measured device-to-device copy)")


def _model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--dtype", choices=("auto", "fp32", "fp16", "bf16"), default="auto",
                   help="weight/activation dtype (auto: bf16 on CUDA, fp32 on CPU)")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    g.add_argument("--seed", type=int, default=0, help="seed for random weights and inputs (default 0)")
    g.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (torch.set_num_threads); default: torch's choice")


def _common_args(p: argparse.ArgumentParser, run_dir: bool = True) -> None:
    g = p.add_argument_group("output")
    add_output_args(p, group=g)
    add_quiet_arg(g)
    if run_dir:
        g.add_argument("--run-dir", default=os.path.join("runs", "profile"),
                       help="base folder of run folders (default runs/profile)")


def _spec_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("spec")
    g.add_argument("--latency-profile", nargs="+", action="extend", default=[], metavar="FILE",
                   help="latency profile JSON from 'tr-profile latency', one per model in model order")
    g.add_argument("--corun-profile", nargs="+", action="extend", default=[], metavar="FILE",
                   help="co-running latency profile JSON from 'tr-profile latency --corun', one per model in model "
                        "order ('none' for a model without one); written as the spec's corun_latency tables")
    g.add_argument("--latency-curve", choices=("table", "constant", "affine"), default="table",
                   help="how L_i(b) enters the spec: table of medians per batch size, constant L_i, or the affine "
                        "fit a + c*b (default table)")
    g.add_argument("--latency-batch-size", type=int, default=None,
                   help="with --latency-curve constant: the batch size whose median is L_i (default: smallest)")
    g.add_argument("--delta-ms", default=None, metavar="MS",
                   help="time quantum of the throughput model in ms, or 'auto' for the coarsest grid within "
                        "--delta-rtol; latencies are rounded to it (default 0.1)")
    g.add_argument("--delta-rtol", type=float, default=0.01, metavar="R",
                   help="relative rounding error allowed by --delta-ms auto (default 0.01)")
    g.add_argument("--allow-mixed", action="store_true",
                   help="accept profiles that mix eager and CUDA-graph steps, CPU and GPU timing, or extend steps")
    g.add_argument("--name", default="profiled", help="spec name (default 'profiled')")


def _trace_format_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace-format", choices=("tokenrouter", "r2r"), default="tokenrouter",
                   help="tokenrouter: this project's routing trace (one line per step, docs/formats.md); r2r: R2R's "
                        "per-token records (GenerationRecorder.to_dataframe(): source_model quick|reference, "
                        "position), mapped onto two models (docs/profiler.md) (default tokenrouter)")


def _estimate(a: argparse.Namespace, n_models: int | None):
    """Estimate P and C from --trace in --trace-format."""
    from profiler.routing import estimate_routing
    traces = list(a.trace)
    if a.trace_format == "r2r":
        from profiler.r2r import estimate_r2r_requests, read_r2r
        if n_models not in (None, 2):
            raise SpecError(f"R2R records describe two models (small, large); --models is {n_models}")
        alpha = getattr(a, "alpha", 0.05)
        if not 0 < alpha < 1:
            raise SpecError(f"--alpha must lie in (0, 1), got {alpha}")
        t0 = time.perf_counter()
        a.r2r_requests = read_r2r(traces)  # kept for --trace-out
        return estimate_r2r_requests(a.r2r_requests, alpha=alpha, started=t0)
    if len(traces) > 1:
        raise SpecError("several --trace files are read with --trace-format r2r; a routing trace is one file "
                        "(concatenate them, with distinct request ids)")
    return estimate_routing(traces[0], n_models=n_models, alpha=getattr(a, "alpha", 0.05))


def _run_dir(base: str, kind: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = os.path.join(base, f"{stamp}-{kind}")
    k = 1
    while os.path.exists(path):
        k += 1
        path = os.path.join(base, f"{stamp}-{kind}-{k}")
    made = []  # the folders this call creates, innermost last: a failed run removes them again if empty
    parent = os.path.dirname(os.path.abspath(path))
    while parent and not os.path.exists(parent):
        made.insert(0, parent)
        parent = os.path.dirname(parent)
    try:
        os.makedirs(path)
    except OSError as e:
        raise SpecError(f"cannot create run folder {path!r}: {e.strerror}") from None
    _CREATED[path] = made
    return path


_CREATED: dict = {}


def _drop_if_empty(path: str | None) -> None:
    """A failed run leaves no empty run folder behind (what it did write stays, for the post-mortem)."""
    if path:
        for folder in [path] + _CREATED.pop(path, [])[::-1]:
            try:
                os.rmdir(folder)  # only succeeds when empty
            except OSError:
                break


# ----------------------------------------------------------------------------
# latency

def _latency_rows(prof) -> list[dict]:
    roof = {r["batch_size"]: r for r in (prof.roofline or {}).get("batches", [])}
    rows = []
    for s in prof.batches:
        row = {"batch_size": s.batch_size, "count": s.count, "min_ms": s.min_ms, "median_ms": s.median_ms,
               "mean_ms": s.mean_ms, "p90_ms": s.p90_ms, "std_ms": s.std_ms,
               "peak_allocated_bytes": s.peak_allocated_bytes}
        if roof:
            r = roof.get(s.batch_size, {})
            row.update({"bytes_read": r.get("bytes_read"), "floor_ms": r.get("floor_ms"),
                        "measured_over_floor": r.get("measured_over_floor")})
        rows.append(row)
    return rows


def cmd_latency(a: argparse.Namespace) -> int:
    from profiler.latency import ProfileError, load_model, profile_latency, resolve_device
    from profiler.system import curve_warnings
    from tr_core.fileio import atomic_write

    fmt = output_format(a)
    sizes = _batch_sizes(a.batch_sizes)
    if a.out:
        check_out_path(a.out)
    if a.config is not None and not os.path.exists(a.config):
        raise SpecError(f"--config {a.config!r} does not exist")
    if a.corun_batch_size is not None and a.corun is None:
        raise SpecError("--corun-batch-size needs --corun (the model that runs beside the timed one)")
    _refuse_latency_options(a)
    if _out_is_json(a, fmt):
        refuse_given(a, ["run_dir"], "has no effect when --out receives the JSON profile (no run folder is made)")
    corun_batch = 1 if a.corun_batch_size is None else a.corun_batch_size
    if a.corun is not None:
        if not os.path.exists(a.corun):
            raise SpecError(f"--corun {a.corun!r} does not exist (a config.json file or a model folder)")
        if os.path.isdir(a.corun) and not os.path.exists(os.path.join(a.corun, "config.json")):
            raise SpecError(f"--corun {a.corun!r} is a folder without config.json (a local model folder)")
        if corun_batch < 1:
            raise SpecError(f"--corun-batch-size must be >= 1, got {corun_batch}")
        if a.measure_overhead:
            raise SpecError("--measure-overhead times the model alone; it cannot be combined with --corun")
    device = resolve_device(a.device)
    dtype = _default_dtype(a.dtype, device)
    _set_threads(a)
    model, name = load_model(a.model, a.config, dtype=dtype, device=device, seed=a.seed)
    other, other_name = None, ""
    if a.corun is not None:
        is_dir = os.path.isdir(a.corun)
        try:
            other, other_name = load_model(a.corun if is_dir else None, None if is_dir else a.corun, dtype=dtype,
                                           device=device, seed=a.seed + 1)
        except ProfileError as e:
            raise ProfileError(f"--corun: {e}") from None
    args = {k: v for k, v in vars(a).items() if k != "func" and not k.startswith("_")}
    prof = profile_latency(model, name=name, batch_sizes=sizes, mode=a.mode, context=a.context,
                           extend_tokens=a.extend_tokens, warmup=a.warmup_steps, steps=a.steps,
                           cuda_graph=a.cuda_graph, device=device, dtype=dtype, seed=a.seed,
                           measure_overhead=a.measure_overhead, attention=a.attention, bandwidth_gbs=a.bandwidth_gbs,
                           arguments=args, corun_model=other, corun_name=other_name, corun_batch=corun_batch,
                           progress=lambda s: _say(a, f"batch {s.batch_size}: median {s.median_ms:.4g} ms"))
    doc = prof.to_dict()
    lines = []
    if not _out_is_json(a, fmt):  # the profile document goes to --out itself when that is JSON
        kind = f"latency-{name}" + ("-corun" if prof.is_corun else "")
        path = os.path.join(_run_dir(a.run_dir, kind), "profile.json")
        atomic_write(path, lambda f: f.write(json.dumps(doc, indent=2) + "\n"), what="profile")
        lines.append(f"profile: {path}")
    for w in curve_warnings(prof):
        _warn(a, w)
    if prof.fit:
        lines.insert(0, f"fit: L(b) = {prof.fit.intercept_ms:.4g} + {prof.fit.per_request_ms:.4g} * b ms "
                        f"(R^2 = {prof.fit.r_squared:.3f})")
    lines.append(f"weights {prof.weight_bytes} bytes, KV {prof.kv_bytes_per_token} bytes/token, device {prof.device}, "
                 f"{prof.dtype}, {prof.mode}, context {prof.context_tokens}, "
                 f"{'CUDA graph' if prof.cuda_graph else 'eager'}, attention {prof.attention}")
    if prof.roofline:
        lines.append(f"roofline: floor = bytes read / {prof.roofline['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s "
                     f"({prof.roofline['bandwidth_source']})")
    if prof.timing_overhead:
        lines.append(f"timing overhead: {100 * prof.timing_overhead['overhead']:+.2f}% "
                     f"({prof.timing_overhead['method']})")
    if prof.is_corun:
        c = prof.corun
        mean = "-" if c["mean_step_ms"] is None else f"{c['mean_step_ms']:.4g} ms"
        lines.append(f"co-running: timed while {c['model']} decoded batches of {c['batch_size']} beside it "
                     f"({c['runner']}; {c['steps']} of its steps, mean {mean} each)")
    emit(_render(_latency_rows(prof), fmt, doc, lines), a.out)
    return 0


# ----------------------------------------------------------------------------
# roofline of stored profiles

def cmd_roofline(a: argparse.Namespace) -> int:
    from profiler.latency import load_latency_profile
    from profiler.roofline import profile_roofline

    fmt = output_format(a)
    if a.out:
        check_out_path(a.out)
    if a.bandwidth_gbs is not None and not (a.bandwidth_gbs > 0 and math.isfinite(a.bandwidth_gbs)):
        raise SpecError(f"--bandwidth-gbs must be a finite number > 0, got {a.bandwidth_gbs}")
    if a.config and len(a.config) not in (1, len(a.profiles)):
        raise SpecError(f"--config: give one config, or one per profile ({len(a.profiles)})")
    rows, docs = [], []
    for k, path in enumerate(a.profiles):
        prof = load_latency_profile(path)
        cfg = a.config[k if len(a.config) > 1 else 0] if a.config else None
        roof = profile_roofline(prof, bandwidth_gbs=a.bandwidth_gbs, config_path=cfg, profile_path=path)
        docs.append({"profile": path, "model": prof.model, "mode": prof.mode, "cuda_graph": prof.cuda_graph,
                     "device": prof.device, "roofline": roof})
        med = prof.median_ms()
        for r in roof["batches"]:
            rows.append({"profile": os.path.basename(path), "mode": prof.mode + (f"{prof.extend_tokens}"
                                                                             if prof.mode == "extend" else ""),
                         "graph": "yes" if prof.cuda_graph else "no", "batch_size": r["batch_size"],
                         "median_ms": med[r["batch_size"]], "gb_read": r["bytes_read"] / 1e9,
                         "floor_ms": r["floor_ms"], "measured_over_floor": r["measured_over_floor"]})
    lines = sorted({f"bandwidth: {d['roofline']['bandwidth_bytes_per_s'] / 1e12:g} TB/s "
                    f"({d['roofline']['bandwidth_source']})" for d in docs})
    emit(_render(rows, fmt, {"schema_version": 1, "kind": "roofline", "profiles": docs}, lines), a.out)
    return 0


# ----------------------------------------------------------------------------
# routing

def _refuse_latency_options(a) -> None:
    """Latency-measurement options the chosen mode ignores (latency and system)."""
    if a.mode != "extend":
        refuse_given(a, ["extend_tokens"], f"applies to --mode extend, not --mode {a.mode} (a decode step appends "
                     "one token per request)")


def _refuse_system_dropped(a) -> None:
    """``system``: options for work the chosen inputs skip (recording a trace, profiling the models)."""
    if a.trace:
        refuse_given(a, ["policy", "tau", "weights", "max_new_tokens", "temperature", "eos_token_id", "tokenizer",
                         "common_vocab"], "applies to recording a trace with --prompts, not to a given --trace")
    if a.latency_profile:
        refuse_given(a, ["batch_sizes", "mode", "context", "extend_tokens", "warmup_steps", "steps", "cuda_graph",
                         "attention", "bandwidth_gbs"], "measures the --model latencies; --latency-profile gives "
                     "them (nothing is profiled)")
        if a.trace:
            refuse_given(a, ["dtype", "device", "threads"], "has no effect with --trace and --latency-profile (no "
                         "model is loaded)")


def _refuse_spec_options(a) -> None:
    """Spec options that the others make moot (routing and system)."""
    if getattr(a, "latency_curve", "table") != "constant":
        refuse_given(a, ["latency_batch_size"], "applies to --latency-curve constant (the batch size whose median is "
                     "L_i)")
    if getattr(a, "delta_ms", None) != "auto":
        refuse_given(a, ["delta_rtol"], "applies to --delta-ms auto only (it bounds the rounding auto chooses)")
    if getattr(a, "L", None) is not None:
        refuse_given(a, ["latency_curve", "allow_mixed"], "applies to --latency-profile (--L gives constant "
                     "latencies)")


def _routing_summary(est) -> tuple[list[dict], list[str]]:
    from profiler.routing import table_rows
    rows = table_rows(est)
    lines = [f"trace: {est.lines} lines, {est.decisions} routing decisions, {est.final_steps} finished requests, "
             f"{est.seconds:.2f} s"]
    missing = est.unobserved_models()
    if missing:
        lines.append(f"note: model(s) {', '.join(map(str, missing))} take no routing decision in the trace: their "
                     f"rows of P and C are unknown ('-' in the table, null in JSON), and no spec can be built from it")
    for g in est.geometric:
        lines.append(f"model {g.model} runs: {g.verdict}")
    lines.append(f"escalation from model 0 across {est.escalation.requests} requests: {est.escalation.verdict}")
    if est.dropped_last_line:
        lines.append("note: dropped a truncated last line (writer killed mid-write?)")
    return rows, lines


def _corun_profiles(a: argparse.Namespace):
    """The --corun-profile files, loaded (``None`` for 'none'), or None when the flag is absent."""
    from profiler.latency import ProfileError, load_latency_profile

    paths = getattr(a, "corun_profile", None) or []
    if not paths:
        return None
    out = []
    for path in paths:
        if path == "none":
            out.append(None)
            continue
        if not os.path.exists(path):
            raise SpecError(f"--corun-profile {path!r} does not exist (a profile from 'tr-profile latency --corun', "
                            f"or 'none')")
        try:
            out.append(load_latency_profile(path))
        except ProfileError as e:
            raise ProfileError(f"--corun-profile: {e}") from None
    if all(p is None for p in out):
        raise SpecError("--corun-profile: every entry is 'none'; drop the flag for a spec without co-running")
    return out


def _spec_from(est, a, profiles=None, extra=None, corun_profiles=None):
    from profiler.latency import load_latency_profile
    from profiler.system import build_system_spec

    if profiles is None and getattr(a, "latency_profile", None):
        profiles = [load_latency_profile(p) for p in a.latency_profile]
    if profiles:
        for i in range(len(profiles)):
            for j in range(i):
                if profiles[i] == profiles[j]:
                    print(f"warning: --latency-profile: models {j} and {i} have the same profile ({profiles[i].model}, "
                          f"every figure equal): both models would be timed alike; was one file given twice?",
                          file=sys.stderr)
    if corun_profiles is None:
        corun_profiles = _corun_profiles(a)
    L = getattr(a, "L", None)
    warnings: list[str] = []
    spec = build_system_spec(est, step_latency_ms=L, profiles=profiles, delta_ms=_delta(a.delta_ms),
                             curve=a.latency_curve, at_batch_size=a.latency_batch_size, name=a.name,
                             extra_provenance=extra, allow_mixed=a.allow_mixed, delta_rtol=a.delta_rtol,
                             warnings=warnings, corun_profiles=corun_profiles)
    for w in warnings:
        _warn(a, w)
    return spec


def cmd_routing(a: argparse.Namespace) -> int:
    from profiler.routing import json_safe, routing_provenance
    from tr_core.spec import spec_to_dict

    fmt = output_format(a)
    if a.out:
        check_out_path(a.out)
    if a.L is not None and a.latency_profile:
        raise SpecError("give either --L or --latency-profile, not both")
    if a.corun_profile and a.L is None and not a.latency_profile:
        raise SpecError("--corun-profile needs the solo latencies too (--L or --latency-profile): it adds the "
                        "co-running tables to a spec")
    if a.models is not None and not 1 <= a.models <= 64:
        raise SpecError(f"--models must be in 1..64, got {a.models}")
    if a.L is None and not a.latency_profile:  # no spec is built: its options would be dropped
        refuse_given(a, ["latency_curve", "latency_batch_size", "delta_ms", "delta_rtol", "allow_mixed", "name"],
                     "shapes the spec, which is built only with latencies (--L or --latency-profile)")
    _refuse_spec_options(a)
    if a.trace_out:
        if a.trace_format != "r2r":
            raise SpecError("--trace-out converts R2R records: use it with --trace-format r2r")
        check_out_path(a.trace_out, "--trace-out")
    est = _estimate(a, a.models)
    rows, lines = _routing_summary(est)
    if a.trace_out:
        lines.append(f"routing trace: {a.trace_out}")
    if a.trace_format == "r2r":
        lines.insert(0, f"R2R records: {est.lines} tokens in {est.final_steps} requests from {len(a.trace)} file(s); a "
                        f"reference token = a small-model step whose token is discarded + a large-model step")
    if a.L is not None or a.latency_profile:
        spec = _spec_from(est, a, extra={"trace_format": a.trace_format} if a.trace_format == "r2r" else None)
        doc = spec_to_dict(spec)
        lines.append("L_i (ms): " + ", ".join(f"{v:g}" for v in spec.step_latency_ms))
    else:
        doc = json_safe({"n_models": est.n_models, "routing_matrix": est.P, "committed_tokens": est.C,
                         **routing_provenance(est)})
        notes = [line[len("note: "):] for line in lines if line.startswith("note: model(s)")]
        if notes:  # what the nulls in the matrices mean
            doc["notes"] = notes
    text = _render(rows, fmt, doc, lines)
    if a.trace_out:  # written once everything is validated and computed (atomically, like --out)
        from profiler.r2r import r2r_routing_trace
        from tr_core.routing_trace import write_trace
        write_trace(r2r_routing_trace(a.r2r_requests), a.trace_out)
    emit(text, a.out)
    return 0


# ----------------------------------------------------------------------------
# route-run and system

def _load_models(paths: Sequence[str], dtype: str, device: str, seed: int):
    from profiler.latency import load_model
    models, names = [], []
    for k, path in enumerate(paths):
        if os.path.isdir(path):
            m, n = load_model(model_path=path, dtype=dtype, device=device, seed=seed + k)
        elif os.path.isfile(path):
            m, n = load_model(config_path=path, dtype=dtype, device=device, seed=seed + k)
        else:
            raise SpecError(f"--model {path!r} does not exist (a model folder or a config.json file)")
        models.append(m)
        names.append(n)
    return models, names


def _route_run_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("routing policy")
    g.add_argument("--prompts", help="JSONL prompts: {\"input_ids\": [...]}, {\"text\": ...}, a bare id list or "
                                     "a bare string per line")
    g.add_argument("--tokenizer", help="local tokenizer folder for text prompts (default: the first --model folder)")
    g.add_argument("--policy", choices=("entropy", "confidence", "ensemble"),
                   help="entropy (R-Stitch), confidence (CITER style) or ensemble (ME)")
    g.add_argument("--tau", type=float, help="threshold in [0, 1]: normalised entropy (entropy) or max "
                                             "probability (confidence)")
    add_list_arg(g, "--weights", metavar="W", help="ensemble weights, one per model, summing to 1 (default uniform)")
    g.add_argument("--max-new-tokens", type=int, default=32, help="committed tokens per request (default 32)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default), > 0 = sampled")
    g.add_argument("--eos-token-id", type=int, default=None, help="stop a request when this token is committed")
    g.add_argument("--common-vocab", action="store_true",
                   help="allow vocab_size to differ and compare only the shared leading logits")


def _do_route_run(a: argparse.Namespace, models, names, trace_out: str):
    """Run the policy and record its trace into ``trace_out``: under a temporary name beside it, renamed onto it
    when the run is complete, so an error or a signal leaves no partial trace (and an existing file as it was)."""
    import tempfile
    from profiler.route_run import load_prompts, run_routing_policy, shared_vocab_size
    from profiler.trace import RoutingTraceRecorder
    from tr_core.fileio import signals_deferred

    if not a.prompts:
        raise SpecError("--prompts is required to run a routing policy")
    if not a.policy:
        raise SpecError("--policy is required to run a routing policy")
    vocab = shared_vocab_size(models, a.common_vocab)
    tok = a.tokenizer or next((p for p in a.model if os.path.isdir(p)), None)
    prompts = load_prompts(a.prompts, tok, vocab)
    partial = None
    try:
        with signals_deferred():  # a signal here is raised at the end of the block, inside the clean-up's reach
            fd, partial = tempfile.mkstemp(prefix="." + os.path.basename(trace_out) + ".", suffix=".tmp",
                                           dir=os.path.dirname(os.path.abspath(trace_out)))
            os.close(fd)
        with RoutingTraceRecorder(partial) as rec:
            res = run_routing_policy(models, prompts, policy=a.policy, tau=a.tau, weights=a.weights,
                                     max_new_tokens=a.max_new_tokens, temperature=a.temperature, seed=a.seed,
                                     eos_token_id=a.eos_token_id, recorder=rec, device=str(models[0].device),
                                     common_vocab=a.common_vocab)
        os.chmod(partial, 0o644)
        os.replace(partial, trace_out)
    finally:
        if partial is not None and os.path.exists(partial):
            os.unlink(partial)
    return res


def cmd_route_run(a: argparse.Namespace) -> int:
    from profiler.latency import resolve_device
    from profiler.routing import estimate_routing, json_safe

    fmt = output_format(a)
    if not a.model or len(a.model) < 2:
        raise SpecError("route-run needs at least two --model (a model folder or a config.json each)")
    if not a.prompts:
        raise SpecError("--prompts is required")
    if not a.policy:
        raise SpecError("--policy is required to run a routing policy")
    from tr_core.fileio import require_regular_file
    require_regular_file(a.prompts, "--prompts file")
    if a.trace_out:
        refuse_given(a, ["run_dir"], "has no effect with --trace-out (the trace goes there; no run folder is made)")
        check_out_path(a.trace_out, "--trace-out")
    if a.out:
        check_out_path(a.out)
    from profiler.route_run import check_policy_args
    # every argument is checked before a model is loaded or a file opened (an existing --trace-out stays as it was)
    check_policy_args(len(a.model), policy=a.policy, tau=a.tau, weights=a.weights, max_new_tokens=a.max_new_tokens,
                      temperature=a.temperature)
    device = resolve_device(a.device)
    dtype = _default_dtype(a.dtype, device)
    _set_threads(a)
    models, names = _load_models(a.model, dtype, device, a.seed)
    folder = None if a.trace_out else _run_dir(a.run_dir, f"route-run-{a.policy}")
    trace_out = a.trace_out or os.path.join(folder, "trace.jsonl")
    try:  # the trace is recorded under a temporary name beside it and renamed when the run is complete
        res = _do_route_run(a, models, names, trace_out)
    except BaseException:
        _drop_if_empty(folder)
        raise
    est = estimate_routing(trace_out, n_models=len(models))
    rows, lines = _routing_summary(est)
    lines.insert(0, f"route-run: {res.requests} requests, {res.steps} steps, {res.committed_tokens} tokens "
                    f"committed, steps per model {list(res.steps_per_model)}")
    lines.append(f"trace: {trace_out}")
    doc = json_safe({"trace": trace_out, "requests": res.requests, "steps": res.steps,
                     "committed_tokens": res.committed_tokens, "steps_per_model": list(res.steps_per_model),
                     "models": names, "routing_matrix": est.P})
    emit(_render(rows, fmt, doc, lines), a.out)
    return 0


def cmd_system(a: argparse.Namespace) -> int:
    from profiler.latency import load_latency_profile, resolve_device

    fmt = output_format(a)
    paths = a.model or []
    if a.out:
        check_out_path(a.out)
    _refuse_spec_options(a)
    if a.trace and a.prompts:
        raise SpecError("give either --trace or --prompts (to run a policy), not both")
    _refuse_system_dropped(a)
    _refuse_latency_options(a)
    if not a.trace and not a.prompts:
        raise SpecError("system needs a routing trace: --trace FILE, or --prompts with --policy to record one")
    if a.latency_profile and len(paths) and len(a.latency_profile) != len(paths):
        raise SpecError(f"{len(a.latency_profile)} --latency-profile for {len(paths)} --model; give one per model")
    if not a.latency_profile and len(paths) < 2:
        raise SpecError("system needs at least two --model (folders or config.json files) or --latency-profile "
                        "files, one per model")
    if a.prompts and len(paths) < 2:
        raise SpecError("recording a trace with --prompts needs the --model of every model")
    if a.mode != "decode" and not a.allow_mixed:
        raise SpecError("--mode extend times extend steps, but a spec's L_i is a decode step; use --mode decode, "
                        "or pass --allow-mixed")
    sizes = _batch_sizes(a.batch_sizes)
    _delta(a.delta_ms)
    for t in a.trace or ():
        if not os.path.exists(t):
            raise SpecError(f"--trace {t!r} does not exist")
    if a.trace and len(a.trace) > 1 and a.trace_format != "r2r":
        raise SpecError("several --trace files are read with --trace-format r2r; a routing trace is one file")
    if a.trace_format == "r2r" and not a.trace:
        raise SpecError("--trace-format r2r needs --trace FILE (R2R's records); --prompts records this project's "
                        "format")
    for p in paths:
        if not os.path.exists(p):
            raise SpecError(f"--model {p!r} does not exist (a model folder or a config.json file)")
    if a.corun_batch_size is not None:
        if a.corun_batch_size < 1:
            raise SpecError(f"--corun-batch-size must be >= 1, got {a.corun_batch_size}")
        if a.latency_profile or a.corun_profile:
            raise SpecError("--corun-batch-size measures co-running curves while profiling the --model; with "
                            "--latency-profile files give the co-running ones with --corun-profile")
        if len(paths) != 2:
            raise SpecError(f"--corun-batch-size measures each of two models beside the other; with {len(paths)} "
                            f"models profile them with 'tr-profile latency --corun' and pass --corun-profile")
    profiles = [load_latency_profile(p) for p in a.latency_profile]  # read (and refused) before any work
    corun_profiles = _corun_profiles(a)
    device = resolve_device(a.device) if paths else "cpu"
    run_dir = _run_dir(a.run_dir, "system")
    try:
        return _system_in(a, fmt, paths, sizes, profiles, run_dir, device, corun_profiles)
    except BaseException:
        trace = os.path.join(run_dir, "trace.jsonl")
        if os.path.exists(trace) and os.path.getsize(trace) == 0:
            os.unlink(trace)
        _drop_if_empty(run_dir)
        raise


def _measure_corun(a, paths, sizes, run_dir, device, dtype) -> list:
    """``system --corun-batch-size``: each of the two models timed beside the other (both loaded at once)."""
    from profiler.latency import load_model, profile_latency
    from tr_core.fileio import atomic_write

    models, names = [], []
    for k, path in enumerate(paths):
        is_dir = os.path.isdir(path)
        m, n = load_model(path if is_dir else None, None if is_dir else path, dtype=dtype, device=device,
                          seed=a.seed + k)
        models.append(m)
        names.append(n)
    out = []
    for k in range(2):
        prof = profile_latency(models[k], name=names[k], batch_sizes=sizes, mode=a.mode, context=a.context,
                               extend_tokens=a.extend_tokens, warmup=a.warmup_steps, steps=a.steps,
                               cuda_graph=a.cuda_graph, device=device, dtype=dtype, seed=a.seed,
                               attention=a.attention, bandwidth_gbs=a.bandwidth_gbs,
                               arguments={"model": paths[k], "corun": paths[1 - k]},
                               corun_model=models[1 - k], corun_name=names[1 - k], corun_batch=a.corun_batch_size)
        doc = prof.to_dict()
        atomic_write(os.path.join(run_dir, f"latency-corun-{k}.json"),
                     lambda f, d=doc: f.write(json.dumps(d, indent=2) + "\n"), what="profile")
        out.append(prof)
        _say(a, f"profiled model {k} ({names[k]}) beside model {1 - k}")
    del models
    return out


def _system_in(a, fmt, paths, sizes, profiles, run_dir, device, corun_profiles=None) -> int:
    from profiler.latency import load_model, profile_latency
    from tr_core.fileio import atomic_write
    from tr_core.spec import save_spec, spec_to_dict

    dtype = _default_dtype(a.dtype, device)
    if paths:
        _set_threads(a)
    extra: dict = {"run_dir": run_dir}
    if a.trace:
        extra["trace_format"] = a.trace_format
    trace = a.trace
    if not trace:
        models, names = _load_models(paths, dtype, device, a.seed)
        trace = os.path.join(run_dir, "trace.jsonl")
        res = _do_route_run(a, models, names, trace)
        extra["route_run"] = {"policy": a.policy, "tau": a.tau, "weights": a.weights, "requests": res.requests,
                              "steps": res.steps, "max_new_tokens": a.max_new_tokens, "models": names}
        del models
        _say(a, f"recorded {res.steps} steps into {trace}")
        a.trace, a.trace_format = [trace], "tokenrouter"
    est = _estimate(a, max(2, len(paths) or len(a.latency_profile)))
    if not profiles:
        for k, path in enumerate(paths):
            is_dir = os.path.isdir(path)
            model, name = load_model(path if is_dir else None, None if is_dir else path, dtype=dtype, device=device,
                                     seed=a.seed + k)
            prof = profile_latency(model, name=name, batch_sizes=sizes, mode=a.mode, context=a.context,
                                   extend_tokens=a.extend_tokens, warmup=a.warmup_steps, steps=a.steps,
                                   cuda_graph=a.cuda_graph, device=device, dtype=dtype, seed=a.seed,
                                   attention=a.attention, bandwidth_gbs=a.bandwidth_gbs,
                                   arguments={"model": path})
            doc = prof.to_dict()
            atomic_write(os.path.join(run_dir, f"latency-{k}.json"),
                         lambda f, d=doc: f.write(json.dumps(d, indent=2) + "\n"), what="profile")
            profiles.append(prof)
            del model
            _say(a, f"profiled model {k} ({name})")
    if a.corun_batch_size is not None:
        corun_profiles = _measure_corun(a, paths, sizes, run_dir, device, dtype)
    spec = _spec_from(est, a, profiles=profiles, extra=extra, corun_profiles=corun_profiles)
    rows, lines = _routing_summary(est)
    lines.append("L_i (ms): " + ", ".join(f"{v:g}" for v in spec.step_latency_ms)
                 + ("  (batch-dependent curves in the spec)" if spec.batch_dependent else ""))
    if corun_profiles is not None:
        lines.append("co-running Lco_i(b) tables: " + ", ".join(
            f"model {i}: " + ("none" if p is None else f"{len(p.batches)} batch sizes beside {p.corun['model']}")
            for i, p in enumerate(corun_profiles)))
    if not _out_is_json(a, fmt):
        path = os.path.join(run_dir, "spec.json")
        save_spec(spec, path)
        lines.append(f"spec: {path}")
    emit(_render(rows, fmt, spec_to_dict(spec), lines), a.out)
    return 0


# ----------------------------------------------------------------------------
# serve-bench

def _num(x: Any, digits: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def cmd_serve_bench(a: argparse.Namespace) -> int:
    from profiler import serve_bench as sb
    Ns = parse_int_ranges(a.N, "--N", lo=1)
    if len(Ns) > 64:
        raise SpecError(f"--N: {len(Ns)} concurrencies asked, at most 64 in one run")
    if Ns.max > sb.MAX_CLIENTS:
        raise sb.LimitError(f"--N {Ns.max}: at most {sb.MAX_CLIENTS} concurrent clients (one thread each)")
    for flag, v, zero in (("--duration-s", a.duration_s, False), ("--warmup-s", a.warmup_s, True),
                          ("--request-timeout-s", a.request_timeout_s, False),
                          ("--connect-timeout-s", a.connect_timeout_s, False)):
        if not math.isfinite(v) or v < 0 or (v == 0 and not zero):
            raise SpecError(f"{flag} must be {'>=' if zero else '>'} 0, got {v:g}")
    if a.time_scale is not None and not (math.isfinite(a.time_scale) and a.time_scale > 0):
        raise SpecError(f"--time-scale must be > 0, got {a.time_scale:g}")
    check_number(a.max_tokens, "--max-tokens", ge=1)
    check_number(a.prompt_words, "--prompt-words", ge=1)
    check_number(a.max_retries, "--max-retries", ge=0)
    check_number(a.slices, "--slices", ge=1)
    fmt = output_format(a)
    if a.out:
        check_out_path(a.out)
    predicted = sb.load_predicted(a.predicted, list(Ns)) if a.predicted else None
    scheme, host, port, base = sb.parse_target(a.url)
    t = sb.Target(scheme, host, port, base, a.endpoint, a.model or "default", a.max_tokens, not a.no_ignore_eos,
                  a.connect_timeout_s, a.request_timeout_s)
    info = sb.probe(t, min(a.request_timeout_s, max(a.connect_timeout_s, 10.0)))
    if a.model is None and "model" in info:
        t = sb.Target(**{**t.__dict__, "model": info["model"]})
    scale = a.time_scale
    if scale is None:
        scale = info.get("time_scale", 1.0)
        if scale != 1.0:
            _warn(a, f"the server reports time_scale {scale:g}: measured rates are multiplied by it (model time)")
    results = []
    for n in Ns:
        _say(a, f"N = {n}: {a.warmup_s:g} s warm-up + {a.duration_s:g} s window")
        r = sb.run_phase(t, n, warmup_s=a.warmup_s, duration_s=a.duration_s, max_retries=a.max_retries,
                         slices=a.slices, time_scale=scale, prompt_words=a.prompt_words, seed=a.seed,
                         on_progress=lambda m: _say(a, m))
        row = r.as_dict()
        if predicted:
            p = predicted[n]
            row["predicted_tok_s"] = p["predicted_tok_s"]
            row["B"] = p["B"]
            row["ratio"] = r.throughput_tok_s / p["predicted_tok_s"] if p["predicted_tok_s"] > 0 else None
        results.append(row)
    doc = {"schema_version": 1, "format": "tokenrouter-serve-bench", "url": t.url, "endpoint": t.endpoint,
           "model": t.model, "max_tokens": a.max_tokens, "warmup_s": a.warmup_s, "duration_s": a.duration_s,
           "time_scale": scale, "predicted_file": a.predicted,
           "server_health": info.get("health"), "results": results}
    emit(_serve_bench_text(doc, fmt), a.out)
    return 0


def _serve_bench_text(doc: dict, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(doc, indent=1) + "\n"
    pred = doc["predicted_file"] is not None
    headers = ["N", "requests", "retries", "measured_tok_s", "ci95_tok_s", "per_request_tok_s", "per_request_ci95",
               "latency_s", "llm_ratio", "idle", "server_in_flight", "load_avg", "server_tok_s", "server_ci95"]
    if pred:
        headers += ["B", "predicted_tok_s", "ratio"]
    rows = []
    for r in doc["results"]:
        row = [r["N"], r["window_requests"], r["retries"], _num(r["throughput_tok_s"]),
               _num(r["throughput_ci95_tok_s"]), _num(r["per_request_tok_s"]), _num(r["per_request_ci95_tok_s"]),
               _num(r["mean_latency_s"], 3), _num(r["llm_ratio"], 4), _num(r["client_idle_fraction"], 4),
               _num(r["server_mean_in_flight"], 3), _num(r["load_average"][1]), _num(r["server_throughput_tok_s"]),
               _num(r["server_throughput_ci95_tok_s"])]
        if pred:
            B = r.get("B")
            row += [" ".join(map(str, B)) if isinstance(B, list) else "-", _num(r["predicted_tok_s"]),
                    "-" if r.get("ratio") is None else f"{r['ratio']:.3f}x"]
        rows.append(row)
    if fmt == "csv":
        return to_csv(headers, rows)
    head = (f"{doc['url']} ({doc['endpoint']}, model {doc['model']}), max_tokens {doc['max_tokens']}, "
            f"{doc['warmup_s']:g} s warm-up + {doc['duration_s']:g} s window per N, rates x{doc['time_scale']:g} "
            f"(time scale); 95% intervals; idle = clients' time between requests; server_in_flight = mean requests "
            f"inside the server, server_tok_s = tokens/s counted as the server commits them (tr-autotune serve "
            f"only)\n")
    return head + format_table(headers, rows) + "\n"


# ----------------------------------------------------------------------------

def _add_latency(q: argparse.ArgumentParser) -> None:
    g = q.add_mutually_exclusive_group(required=True)
    g.add_argument("--model", help="local Hugging Face model folder (real weights; never downloads)")
    g.add_argument("--config", help="config.json (random weights: timing depends on the architecture only)")
    _latency_args(q, ["1", "2", "4", "8", "16", "32"])
    _model_args(q)
    q.add_argument("--measure-overhead", action="store_true",
                   help="also measure the relative cost of per-step timing (events/perf_counter vs none)")
    g = q.add_argument_group("co-running (the spec's corun_latency)")
    g.add_argument("--corun", metavar="CONFIG.json",
                   help="time the model while this other model (a config.json, random weights, or a local model "
                        "folder) decodes continuously beside it on the same device: in its own CUDA stream on a "
                        "GPU, in a second thread on CPU; the profile is marked co-running")
    g.add_argument("--corun-batch-size", type=int, default=None, metavar="B",
                   help="requests per step of the --corun model (default 1)")
    _common_args(q)


def _add_routing(q: argparse.ArgumentParser) -> None:
    q.add_argument("--trace", required=True, nargs="+", action="extend", metavar="FILE",
                   help="routing trace (JSONL, optionally .gz); with --trace-format r2r one or more files of "
                        "R2R per-token records (CSV, JSON lines or Parquet; one file per request, or a request_id "
                        "column)")
    _trace_format_arg(q)
    q.add_argument("--trace-out", metavar="FILE.jsonl", help="with --trace-format r2r: also write the records as "
                   "this project's routing trace (last step of a request next_model = -1), e.g. for "
                   "'tr-optimize --method simulate --trace'")
    q.add_argument("--models", type=int, default=None, help="number of models M (default: from the trace)")
    q.add_argument("--alpha", type=float, default=0.05, help="significance level of the tests (default 0.05)")
    add_list_arg(q, "--L", metavar="MS", help="step latency L_i of each model in ms, e.g. --L 6 27.9")
    _spec_args(q)
    _common_args(q, run_dir=False)


def _add_route_run(q: argparse.ArgumentParser) -> None:
    q.add_argument("--model", "--config", nargs="+", action="extend", default=[], dest="model",
                   help="model folders or config.json files in model order (model 0 = entry)")
    _route_run_args(q)
    _model_args(q)
    q.add_argument("--trace-out", help="trace path (default: a timestamped folder under --run-dir)")
    _common_args(q)


def _add_system(q: argparse.ArgumentParser) -> None:
    q.add_argument("--model", "--config", nargs="+", action="extend", default=[], dest="model",
                   help="model folders or config.json files in model order")
    q.add_argument("--trace", nargs="+", action="extend", metavar="FILE",
                   help="routing trace JSONL, or R2R records with --trace-format r2r (else record one with "
                        "--prompts/--policy)")
    _trace_format_arg(q)
    _route_run_args(q)
    _latency_args(q, ["1", "2", "4", "8"])
    q.add_argument("--corun-batch-size", type=int, default=None, metavar="B",
                   help="also measure co-running curves: each of the two --model timed beside the other decoding "
                        "batches of B requests (as 'tr-profile latency --corun'), written as corun_latency")
    _model_args(q)
    _spec_args(q)
    _common_args(q)
    q.set_defaults(L=None)


def _add_roofline(q: argparse.ArgumentParser) -> None:
    q.add_argument("profiles", nargs="+", metavar="PROFILE", help="latency profile JSON files")
    q.add_argument("--config", nargs="+", action="extend", default=[], metavar="FILE",
                   help="model config.json (one, or one per profile) to tell a tied from an untied embedding "
                        "(default: the config recorded in the profile's arguments, when it exists)")
    q.add_argument("--bandwidth-gbs", type=float, default=None, metavar="GB/S",
                   help="memory bandwidth in GB/s (default: the spec-sheet figure of the profile's device)")
    _common_args(q, run_dir=False)


def _add_serve_bench(q: argparse.ArgumentParser) -> None:
    q.add_argument("--url", required=True, help="server address, e.g. http://127.0.0.1:8000 (a trailing /v1 is "
                   "accepted)")
    q.add_argument("--N", nargs="+", required=True, metavar="N", help="concurrencies to measure (requests in "
                   "flight), values or ranges, e.g. --N 1 2 4 8 16")
    add_window_args(q, duration_s=60.0, warmup_s=10.0, per=" per N")
    q.add_argument("--endpoint", choices=("chat", "completions"), default="chat", help="POST /v1/chat/completions "
                   "(default) or /v1/completions")
    q.add_argument("--model", help="model name sent with each request (default: the first of the server's "
                   "/v1/models, else 'default')")
    q.add_argument("--max-tokens", type=int, default=128, metavar="T", help="max_tokens of every request (default "
                   "128); ignore_eos is sent too, so servers that know it generate exactly T")
    q.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos: true")
    q.add_argument("--prompt-words", type=int, default=16, metavar="W", help="words per generated prompt "
                   "(default 16)")
    q.add_argument("--request-timeout-s", type=float, default=300.0, metavar="S", help="longest a request may take, "
                   "seconds (default 300); a request over it is cut and retried")
    q.add_argument("--connect-timeout-s", type=float, default=5.0, metavar="S", help="connection timeout, seconds "
                   "(default 5)")
    q.add_argument("--max-retries", type=int, default=3, metavar="K", help="retries per request after a "
                   "connection error, timeout, HTTP 408/429/5xx or malformed answer (default 3); then the "
                   "benchmark stops with an error")
    q.add_argument("--slices", type=int, default=10, metavar="K", help="batch-means slices of the window "
                   "(default 10): the server's committed-token count (tr-autotune serve) is read at their "
                   "boundaries; the client-side estimate uses fewer when a slice would be shorter than two request "
                   "lifetimes")
    q.add_argument("--time-scale", type=float, metavar="X", help="multiply measured rates by X (the server runs X "
                   "times slower than the model; default: the time_scale the server's /health reports, else 1)")
    q.add_argument("--predicted", metavar="FILE.json", help="thresholds file (tr-autotune run) or tr-optimize JSON: "
                   "predicted tokens/s per N beside the measurement, with the ratio; must cover every --N")
    q.add_argument("--seed", type=int, default=0, help="seed of the prompts (default 0)")
    add_quiet_arg(q)
    add_output_args(q)


# name -> (help, description, argument builder, handler)
SUBCOMMANDS = {
    "latency": ("per-step latency of one model over batch sizes (decode or extend)",
                "Time one model's decoding step for each batch size; the JSON output is the profile (kept in a run "
                "folder unless --out receives it).", _add_latency, cmd_latency),
    "routing": ("estimate P (95%% intervals), C and run-length fit from a JSONL trace",
                "Stream a routing trace; estimate P, C, test geometric runs.  With latencies (--L or "
                "--latency-profile) the JSON output is a spec for 'tr-optimize --spec'.  Does not import torch.",
                _add_routing, cmd_routing),
    "route-run": ("run a token-level routing policy over real models and record the trace",
                  "Generate prompts under a routing policy with transformers; record the trace.",
                  _add_route_run, cmd_route_run),
    "system": ("models + trace (or a route-run) -> complete spec JSON",
               "Profile every model's L_i(b) (or read profiles), estimate P and C from a trace (or record one), and "
               "build a spec for 'tr-optimize --spec'; the JSON output is the spec (kept in the run folder unless "
               "--out receives it).", _add_system, cmd_system),
    "roofline": ("memory-bandwidth floor beside stored latency profiles",
                 "For each profile and batch size: bytes read per step (weights + KV at the profiled context), the "
                 "floor time at the device's memory bandwidth, and measured / floor.  Does not import torch.",
                 _add_roofline, cmd_roofline),
    "serve-bench": ("closed-loop benchmark of a live OpenAI-compatible server vs prediction",
                    "Keep exactly N requests in flight against an OpenAI-compatible server (each client sends its "
                    "next request when its previous one returns), for each N: warm-up, a measured window, then the "
                    "requests in flight are drained. Reports total output tokens/s (95%% interval by batch means), "
                    "per-request tokens/s (95%% interval), llm_ratio when the server reports it, and with --predicted "
                    "the prediction beside the measurement. Works against tr-autotune serve, R2R, SGLang and vLLM "
                    "(usage.completion_tokens). Does not import torch.", _add_serve_bench, cmd_serve_bench),
}


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="tr-profile",
               description="Measure step latencies L_i(b) (ms) of models, estimate the routing matrix P and the "
                           "commit matrix C from routing traces, and assemble system specs for tr-optimize.")
    add_version(p)
    sub = p.add_subparsers(dest="command", parser_class=Parser,
                           metavar="{latency,routing,route-run,system,roofline,serve-bench}")
    add_subcommands(sub, SUBCOMMANDS)
    return p


def main_impl(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    require_subcommand(parser, a)
    for flag in ("context", "extend_tokens", "steps", "warmup_steps", "max_new_tokens"):
        if hasattr(a, flag):
            check_number(getattr(a, flag), "--" + flag.replace("_", "-"), ge=1 if flag == "steps" else 0)
    _check_step_count(a)
    return a.func(a)


def _check_step_count(a) -> None:
    """Refuse, before any work, a profile that would time more model steps than a run can sensibly take
    (``--steps 1000000000`` would run for days), with the count."""
    if not hasattr(a, "steps") or not hasattr(a, "batch_sizes"):
        return
    try:
        n_sizes = len(parse_int_ranges(a.batch_sizes, "--batch-sizes", lo=1, hi=1 << 20))
    except SpecError:
        return  # reported, naming the flag, by the command itself
    if n_sizes > MAX_BATCH_SIZES:
        return  # --batch-sizes is refused by the command itself, naming it
    total = n_sizes * (a.steps + getattr(a, "warmup_steps", 0))
    if total > MAX_PROFILED_STEPS:
        raise WorkTooLarge(f"--steps {a.steps:,} over {n_sizes} batch size(s) would run {total:,} model steps (warm-up "
                        f"included), more than {MAX_PROFILED_STEPS:,}: at even 10 ms a step that is "
                        f"{total * 0.01 / 3600:,.1f} hours; lower --steps or --warmup-steps")


def main(argv: Sequence[str] | None = None) -> int:
    return run_cli(main_impl, argv)


if __name__ == "__main__":
    sys.exit(main())
