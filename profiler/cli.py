"""``tr-profile``: measure L_i(b), estimate P and C from routing traces, assemble system specs.

Subcommands: ``latency``, ``routing``, ``route-run``, ``system`` (see
``docs/profiler.md``).  Bad input prints one ``error:`` line on stderr and
exits with code 2.  ``routing`` never imports torch.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
import time
from typing import Any, Sequence

from tr_core.errors import TRError

FORMATS = ("table", "json", "csv")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        sys.stderr.write(f"error: {message}\n")
        raise SystemExit(2)


class CLIError(TRError, ValueError):
    pass


def _say(msg: str) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(msg + "\n")


def _int_list(text: str, flag: str) -> list[int]:
    try:
        vals = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise CLIError(f"{flag} must be a comma-separated list of integers, got {text!r}") from None
    if not vals:
        raise CLIError(f"{flag} needs at least one value")
    for v in vals:
        if v < 1:
            raise CLIError(f"{flag} entries must be >= 1, got {v}")
    return vals


def _float_list(text: str, flag: str) -> list[float]:
    try:
        return [float(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise CLIError(f"{flag} must be a comma-separated list of numbers, got {text!r}") from None


def _run_dir(base: str, kind: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    path = os.path.join(base, f"{stamp}-{kind}")
    k = 1
    while os.path.exists(path):
        k += 1
        path = os.path.join(base, f"{stamp}-{kind}-{k}")
    try:
        os.makedirs(path)
    except OSError as e:
        raise CLIError(f"cannot create run folder {path!r}: {e.strerror}") from None
    return path


def _check_out(path: str | None, flag: str = "--out") -> None:
    if path:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise CLIError(f"{flag}: folder {folder!r} does not exist")


def _emit(rows: list[dict], fmt: str, doc: Any = None, extra_lines: Sequence[str] = ()) -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps(doc if doc is not None else rows, indent=2) + "\n")
        return
    if fmt == "csv":
        buf = io.StringIO()
        if rows:
            w = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
            w.writeheader()
            for r in rows:
                w.writerow({k: ("" if v is None else v) for k, v in r.items()})
        sys.stdout.write(buf.getvalue())
        return
    if rows:
        cols = list(rows[0])
        cells = [[_fmt(r[c]) for c in cols] for r in rows]
        widths = [max(len(c), *(len(row[k]) for row in cells)) for k, c in enumerate(cols)]
        sys.stdout.write("  ".join(c.rjust(w) for c, w in zip(cols, widths)) + "\n")
        for row in cells:
            sys.stdout.write("  ".join(v.rjust(w) for v, w in zip(row, widths)) + "\n")
    for line in extra_lines:
        sys.stdout.write(line + "\n")


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


# ----------------------------------------------------------------------------
# subcommands

def _set_threads(a: argparse.Namespace) -> None:
    if getattr(a, "threads", None) is not None:
        if a.threads < 1:
            raise CLIError(f"--threads must be >= 1, got {a.threads}")
        import torch
        torch.set_num_threads(a.threads)


def _default_dtype(dtype: str, device: str) -> str:
    if dtype != "auto":
        return dtype
    return "bf16" if device.startswith("cuda") else "fp32"


def _latency_args(p: argparse.ArgumentParser, batch_default: str) -> None:
    p.add_argument("--batch-sizes", default=batch_default,
                   help=f"comma-separated batch sizes (requests per step), each >= 1 (default {batch_default})")
    p.add_argument("--mode", choices=("decode", "extend"), default="decode",
                   help="decode: 1 new token per request per step; extend: --extend-tokens per request "
                        "(the handoff path) (default decode)")
    p.add_argument("--context", type=int, default=128,
                   help="KV-cache length per request in tokens, held fixed while timing (default 128)")
    p.add_argument("--extend-tokens", type=int, default=8,
                   help="tokens appended per request per step in extend mode (default 8)")
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up steps per batch size (default 3)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per batch size (default 20)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="capture the step into a CUDA graph over a static KV cache and time its replays (CUDA only)")


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", choices=("auto", "fp32", "fp16", "bf16"), default="auto",
                   help="weight/activation dtype (auto: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    p.add_argument("--seed", type=int, default=0, help="seed for random weights and inputs (default 0)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch (torch.set_num_threads); default: torch's choice")


def cmd_latency(a: argparse.Namespace) -> int:
    from profiler.latency import load_model, profile_latency, resolve_device
    from tr_core.spec import write_json_atomic

    sizes = _int_list(a.batch_sizes, "--batch-sizes")
    _check_out(a.out)
    if a.config is not None and not os.path.exists(a.config):
        raise CLIError(f"--config {a.config!r} does not exist")
    device = resolve_device(a.device)
    dtype = _default_dtype(a.dtype, device)
    _set_threads(a)
    model, name = load_model(a.model, a.config, dtype=dtype, device=device, seed=a.seed)
    args = {k: v for k, v in vars(a).items() if k != "func"}
    prof = profile_latency(model, name=name, batch_sizes=sizes, mode=a.mode, context=a.context,
                           extend_tokens=a.extend_tokens, warmup=a.warmup, steps=a.steps, cuda_graph=a.cuda_graph,
                           device=device, dtype=dtype, seed=a.seed, measure_overhead=a.measure_overhead,
                           arguments=args,
                           progress=lambda s: _say(f"batch {s.batch_size}: median {s.median_ms:.4g} ms"))
    doc = prof.to_dict()
    out = a.out or os.path.join(_run_dir(a.run_dir, f"latency-{name}"), "profile.json")
    write_json_atomic(out, doc)
    _say(f"wrote {out}")
    rows = [{"batch_size": s.batch_size, "count": s.count, "min_ms": s.min_ms, "median_ms": s.median_ms,
             "mean_ms": s.mean_ms, "p90_ms": s.p90_ms, "std_ms": s.std_ms,
             "peak_allocated_bytes": s.peak_allocated_bytes} for s in prof.batches]
    extra = []
    if prof.fit:
        extra.append(f"fit: L(b) = {prof.fit.intercept_ms:.4g} + {prof.fit.per_request_ms:.4g} * b ms "
                     f"(R^2 = {prof.fit.r_squared:.3f})")
    extra.append(f"weights {prof.weight_bytes} bytes, KV {prof.kv_bytes_per_token} bytes/token, "
                 f"device {prof.device}, {prof.dtype}, {prof.mode}, context {prof.context_tokens}")
    if prof.timing_overhead:
        extra.append(f"timing overhead: {100 * prof.timing_overhead['overhead']:+.2f}% "
                     f"({prof.timing_overhead['method']})")
    extra.append(f"profile: {out}")
    _emit(rows, a.format, {**doc, "path": out}, extra)
    return 0


def _routing_summary(est) -> tuple[list[dict], list[str]]:
    from profiler.routing import table_rows
    rows = table_rows(est)
    lines = [f"trace: {est.lines} lines, {est.decisions} routing decisions, {est.final_steps} finished requests, "
             f"{est.seconds:.2f} s"]
    for g in est.geometric:
        lines.append(f"model {g.model} runs: {g.verdict}")
    lines.append(f"escalation from model 0 across {est.escalation.requests} requests: {est.escalation.verdict}")
    if est.dropped_last_line:
        lines.append("note: dropped a truncated last line (writer killed mid-write?)")
    return rows, lines


def cmd_routing(a: argparse.Namespace) -> int:
    from profiler.routing import estimate_routing, json_safe, routing_provenance
    from tr_core.spec import save_spec

    _check_out(a.out)
    if a.step_latency_ms is not None and a.latency_profile:
        raise CLIError("give either --step-latency-ms or --latency-profile, not both")
    if a.out and a.step_latency_ms is None and not a.latency_profile:
        raise CLIError("--out writes a spec, which needs latencies: pass --step-latency-ms or --latency-profile")
    est = estimate_routing(a.trace, n_models=a.models, alpha=a.alpha)
    spec = None
    if a.out:
        spec = _spec_from(est, a)
        save_spec(spec, a.out)
        _say(f"wrote {a.out}")
    rows, lines = _routing_summary(est)
    doc = json_safe({"n_models": est.n_models, "routing_matrix": est.P, "committed_tokens": est.C,
                     **routing_provenance(est)})
    if a.out:
        doc["spec"] = a.out
        lines.append(f"spec: {a.out}")
    _emit(rows, a.format, doc, lines)
    return 0


def _spec_from(est, a, profiles=None, extra=None):
    from profiler.latency import load_latency_profile
    from profiler.system import build_system_spec

    if profiles is None and getattr(a, "latency_profile", None):
        profiles = [load_latency_profile(p) for p in a.latency_profile]
    L = _float_list(a.step_latency_ms, "--step-latency-ms") if getattr(a, "step_latency_ms", None) else None
    return build_system_spec(est, step_latency_ms=L, profiles=profiles, delta_ms=a.delta_ms, curve=a.latency_curve,
                             at_batch_size=a.latency_batch_size, name=a.name, extra_provenance=extra)


def _spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--latency-profile", action="append", default=[], metavar="FILE",
                   help="latency profile JSON from 'tr-profile latency', once per model in model order")
    p.add_argument("--latency-curve", choices=("table", "constant", "affine"), default="table",
                   help="how L_i(b) enters the spec: table of medians per batch size, constant L_i, or the affine "
                        "fit a + c*b (default table)")
    p.add_argument("--latency-batch-size", type=int, default=None,
                   help="with --latency-curve constant: the batch size whose median is L_i (default: smallest)")
    p.add_argument("--delta-ms", type=float, default=0.1,
                   help="time quantum of the throughput model in ms; latencies are rounded to it (default 0.1)")
    p.add_argument("--name", default="profiled", help="spec name (default 'profiled')")


def _load_models(paths: Sequence[str], dtype: str, device: str, seed: int):
    from profiler.latency import load_model
    models, names = [], []
    for k, path in enumerate(paths):
        if os.path.isdir(path):
            m, n = load_model(model_path=path, dtype=dtype, device=device, seed=seed + k)
        elif os.path.isfile(path):
            m, n = load_model(config_path=path, dtype=dtype, device=device, seed=seed + k)
        else:
            raise CLIError(f"--model {path!r} does not exist (a model folder or a config.json file)")
        models.append(m)
        names.append(n)
    return models, names


def _route_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", help="JSONL prompts: {\"input_ids\": [...]}, {\"text\": ...}, a bare id list or "
                                     "a bare string per line")
    p.add_argument("--tokenizer", help="local tokenizer folder for text prompts (default: the first --model folder)")
    p.add_argument("--policy", choices=("entropy", "confidence", "ensemble"),
                   help="entropy (R-Stitch), confidence (CITER style) or ensemble (ME)")
    p.add_argument("--tau", type=float, help="threshold in [0, 1]: normalised entropy (entropy) or max "
                                             "probability (confidence)")
    p.add_argument("--weights", help="ensemble weights, one per model, summing to 1 (default uniform)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="committed tokens per request (default 32)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default), > 0 = sampled")
    p.add_argument("--eos-token-id", type=int, default=None, help="stop a request when this token is committed")
    p.add_argument("--common-vocab", action="store_true",
                   help="allow vocab_size to differ and compare only the shared leading logits")


def _do_route_run(a: argparse.Namespace, models, names, trace_out: str):
    from profiler.route_run import load_prompts, run_routing_policy, shared_vocab_size
    from profiler.trace import RoutingTraceRecorder

    if not a.prompts:
        raise CLIError("--prompts is required to run a routing policy")
    if not a.policy:
        raise CLIError("--policy is required to run a routing policy")
    vocab = shared_vocab_size(models, a.common_vocab)
    tok = a.tokenizer or next((p for p in a.model if os.path.isdir(p)), None)
    prompts = load_prompts(a.prompts, tok, vocab)
    weights = _float_list(a.weights, "--weights") if a.weights else None
    with RoutingTraceRecorder(trace_out) as rec:
        res = run_routing_policy(models, prompts, policy=a.policy, tau=a.tau, weights=weights,
                                 max_new_tokens=a.max_new_tokens, temperature=a.temperature, seed=a.seed,
                                 eos_token_id=a.eos_token_id, recorder=rec, device=str(models[0].device),
                                 common_vocab=a.common_vocab)
    return res


def cmd_route_run(a: argparse.Namespace) -> int:
    from profiler.latency import resolve_device
    from profiler.routing import estimate_routing, json_safe

    if not a.model or len(a.model) < 2:
        raise CLIError("route-run needs at least two --model (a model folder or a config.json each)")
    if not a.prompts:
        raise CLIError("--prompts is required")
    if not os.path.exists(a.prompts):
        raise CLIError(f"--prompts {a.prompts!r} does not exist")
    _check_out(a.trace_out, "--trace-out")
    device = resolve_device(a.device)
    dtype = _default_dtype(a.dtype, device)
    _set_threads(a)
    models, names = _load_models(a.model, dtype, device, a.seed)
    trace_out = a.trace_out or os.path.join(_run_dir(a.run_dir, f"route-run-{a.policy}"), "trace.jsonl")
    res = _do_route_run(a, models, names, trace_out)
    est = estimate_routing(trace_out, n_models=len(models))
    rows, lines = _routing_summary(est)
    lines.insert(0, f"route-run: {res.requests} requests, {res.steps} steps, {res.committed_tokens} tokens "
                    f"committed, steps per model {list(res.steps_per_model)}")
    lines.append(f"trace: {trace_out}")
    doc = {"trace": trace_out, "requests": res.requests, "steps": res.steps,
           "committed_tokens": res.committed_tokens, "steps_per_model": list(res.steps_per_model),
           "models": names, "routing_matrix": est.P}
    doc = json_safe(doc)
    _emit(rows, a.format, doc, lines)
    return 0


def cmd_system(a: argparse.Namespace) -> int:
    from profiler.latency import load_latency_profile, load_model, profile_latency, resolve_device
    from profiler.routing import estimate_routing
    from tr_core.spec import save_spec, write_json_atomic

    paths = a.model or []
    _check_out(a.out)
    if a.trace and a.prompts:
        raise CLIError("give either --trace or --prompts (to run a policy), not both")
    if not a.trace and not a.prompts:
        raise CLIError("system needs a routing trace: --trace FILE, or --prompts with --policy to record one")
    if a.latency_profile and len(paths) and len(a.latency_profile) != len(paths):
        raise CLIError(f"{len(a.latency_profile)} --latency-profile for {len(paths)} --model; give one per model")
    if not a.latency_profile and len(paths) < 2:
        raise CLIError("system needs at least two --model (folders or config.json files) or --latency-profile "
                       "files, one per model")
    if a.prompts and len(paths) < 2:
        raise CLIError("recording a trace with --prompts needs the --model of every model")
    sizes = _int_list(a.batch_sizes, "--batch-sizes")
    if a.trace and not os.path.exists(a.trace):
        raise CLIError(f"--trace {a.trace!r} does not exist")
    for p in paths:
        if not os.path.exists(p):
            raise CLIError(f"--model {p!r} does not exist (a model folder or a config.json file)")
    run_dir = _run_dir(a.run_dir, "system")
    device = resolve_device(a.device) if paths else "cpu"
    dtype = _default_dtype(a.dtype, device)
    if paths:
        _set_threads(a)
    extra: dict = {"run_dir": run_dir}
    trace = a.trace
    if not trace:
        models, names = _load_models(paths, dtype, device, a.seed)
        trace = os.path.join(run_dir, "trace.jsonl")
        res = _do_route_run(a, models, names, trace)
        extra["route_run"] = {"policy": a.policy, "tau": a.tau, "weights": a.weights, "requests": res.requests,
                              "steps": res.steps, "max_new_tokens": a.max_new_tokens, "models": names}
        del models
        _say(f"recorded {res.steps} steps into {trace}")
    est = estimate_routing(trace, n_models=max(2, len(paths) or len(a.latency_profile)))
    if a.latency_profile:
        profiles = [load_latency_profile(p) for p in a.latency_profile]
    else:
        profiles = []
        for k, path in enumerate(paths):
            is_dir = os.path.isdir(path)
            model, name = load_model(path if is_dir else None, None if is_dir else path, dtype=dtype, device=device,
                                     seed=a.seed + k)
            prof = profile_latency(model, name=name, batch_sizes=sizes, mode=a.mode, context=a.context,
                                   extend_tokens=a.extend_tokens, warmup=a.warmup, steps=a.steps,
                                   cuda_graph=a.cuda_graph, device=device, dtype=dtype, seed=a.seed,
                                   arguments={"model": path})
            write_json_atomic(os.path.join(run_dir, f"latency-{k}.json"), prof.to_dict())
            profiles.append(prof)
            del model
            _say(f"profiled model {k} ({name})")
    spec = _spec_from(est, a, profiles=profiles, extra=extra)
    out = a.out or os.path.join(run_dir, "spec.json")
    save_spec(spec, out)
    rows, lines = _routing_summary(est)
    lines.append("L_i (ms): " + ", ".join(f"{v:g}" for v in spec.step_latency_ms)
                 + ("  (batch-dependent curves in the spec)" if spec.batch_dependent else ""))
    lines.append(f"spec: {out}")
    from tr_core.spec import spec_to_dict
    _emit(rows, a.format, {"spec_path": out, "spec": spec_to_dict(spec)}, lines)
    return 0


# ----------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tr-profile",
                description="Measure step latencies L_i(b) (ms) of models, estimate the routing matrix P and the "
                            "commit matrix C from routing traces, and assemble system specs for tr-optimize.")
    from profiler import __version__
    p.add_argument("--version", action="version", version=f"tr-profile {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser, metavar="{latency,routing,route-run,system}")

    q = sub.add_parser("latency", help="per-step latency of one model over batch sizes (decode or extend)",
                       description="Time one model's decoding step for each batch size; writes a profile JSON.")
    g = q.add_mutually_exclusive_group(required=True)
    g.add_argument("--model", help="local Hugging Face model folder (real weights; never downloads)")
    g.add_argument("--config", help="config.json (random weights: timing depends on the architecture only)")
    _latency_args(q, "1,2,4,8,16,32")
    _model_args(q)
    q.add_argument("--measure-overhead", action="store_true",
                   help="also measure the relative cost of per-step timing (events/perf_counter vs none)")
    q.add_argument("--out", help="profile JSON path (default: a timestamped folder under --run-dir)")
    q.add_argument("--run-dir", default=os.path.join("runs", "profile"), help="base folder of run folders")
    q.add_argument("--format", choices=FORMATS, default="table", help="stdout format (default table)")
    q.set_defaults(func=cmd_latency)

    q = sub.add_parser("routing", help="estimate P (95%% intervals), C and run-length fit from a JSONL trace",
                       description="Stream a routing trace; estimate P, C, test geometric runs; optionally write a "
                                   "spec (needs latencies).  Does not import torch.")
    q.add_argument("--trace", required=True, help="routing trace (JSONL, optionally .gz)")
    q.add_argument("--models", type=int, default=None, help="number of models M (default: from the trace)")
    q.add_argument("--alpha", type=float, default=0.05, help="significance level of the tests (default 0.05)")
    q.add_argument("--step-latency-ms", default=None, help="L_i in ms, comma-separated, one per model")
    _spec_args(q)
    q.add_argument("--out", help="write a spec JSON for 'tr-optimize --spec' here")
    q.add_argument("--format", choices=FORMATS, default="table", help="stdout format (default table)")
    q.set_defaults(func=cmd_routing)

    q = sub.add_parser("route-run", help="run a token-level routing policy over real models and record the trace",
                       description="Generate prompts under a routing policy with transformers; record the trace.")
    q.add_argument("--model", "--config", action="append", default=[], dest="model",
                   help="a model folder or a config.json, once per model in model order (model 0 = entry)")
    _route_run_args(q)
    _model_args(q)
    q.add_argument("--trace-out", help="trace path (default: a timestamped folder under --run-dir)")
    q.add_argument("--run-dir", default=os.path.join("runs", "profile"), help="base folder of run folders")
    q.add_argument("--format", choices=FORMATS, default="table", help="stdout format (default table)")
    q.set_defaults(func=cmd_route_run)

    q = sub.add_parser("system", help="models + trace (or a route-run) -> complete spec JSON",
                       description="Profile every model's L_i(b), estimate P and C from a trace (or record one), "
                                   "and write a spec for 'tr-optimize --spec'.")
    q.add_argument("--model", "--config", action="append", default=[], dest="model",
                   help="a model folder or a config.json, once per model in model order")
    q.add_argument("--trace", help="routing trace JSONL (else record one with --prompts/--policy)")
    _route_run_args(q)
    _latency_args(q, "1,2,4,8")
    _model_args(q)
    _spec_args(q)
    q.add_argument("--out", help="spec JSON path (default: spec.json in the run folder)")
    q.add_argument("--run-dir", default=os.path.join("runs", "profile"), help="base folder of run folders")
    q.add_argument("--format", choices=FORMATS, default="table", help="stdout format (default table)")
    q.set_defaults(func=cmd_system, step_latency_ms=None)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    if not getattr(a, "func", None):
        parser.print_help(sys.stderr)
        sys.stderr.write("error: choose a subcommand\n")
        return 2
    try:
        return a.func(a)
    except TRError as e:
        sys.stderr.write(f"error: {e}\n")
        return getattr(e, "exit_code", 2)
    except (ValueError, OSError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
