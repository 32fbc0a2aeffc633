"""``tr-shadow simulate`` and ``tr-shadow compare``: the ShadowPrefill cluster simulator on the command line.

:func:`register` adds both subcommands to ``tr-shadow``'s subparsers; each
sets ``func`` to its handler (``cmd_simulate`` / ``cmd_compare``), which
returns an exit code.  Workload options are part 1's
(:func:`shadow_prefill.cli.add_workload_args`); a synthetic workload's
default model names ``small`` and ``large`` map to Qwen2.5-7B and
Llama-3.1-70B unless ``--model-config`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from shadow_prefill.cluster.metrics import compare_runs, reduction_by_context, summarize_comparison
from shadow_prefill.cluster.policies import APPROACH_NAMES, get_policy
from shadow_prefill.cluster.sim import DEFAULT_PAIR, ClusterConfig, Scenario, simulate_cluster
from shadow_prefill.cluster.sweep import SWEEP_PARAMS, calibrated_capacities, run_grid, sweep
from shadow_prefill.cluster.workload import DEFAULT_WINDOWS, read_azure_trace, synthetic_request_sizes
from shadow_prefill.errors import ShadowError

__all__ = ["register", "cmd_simulate", "cmd_compare"]

_DEFAULT_ALIAS = {"small": DEFAULT_PAIR[0], "large": DEFAULT_PAIR[1]}


def _num(lo: float | None = None, lo_open: bool = False, integer: bool = False):
    def conv(s: str):
        try:
            v = int(s) if integer else float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if integer else 'a number'}, got {s!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be finite, got {s!r}")
        if lo is not None and (v < lo or (lo_open and v == lo)):
            raise argparse.ArgumentTypeError(f"must be {'>' if lo_open else '>='} {lo:g}, got {v:g}")
        return v
    return conv


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    from shadow_prefill.cli import add_workload_args
    add_workload_args(p, multi=False)
    c = p.add_argument_group("cluster")
    c.add_argument("--gpu", default="h100", help="GPU preset (h100, h200) or JSON file (default h100)")
    c.add_argument("--model-config", action="append", metavar="MODEL=PRESET|CONFIG",
                   help="architecture of a workload model: built-in name, config.json or saved latency model "
                        "(default: the model's own name; synthetic 'small'/'large' = qwen2.5-7b/llama-3.1-70b)")
    c.add_argument("--tp", type=_num(1, integer=True), help="tensor-parallel degree of every model (default: the "
                                                            "smallest at which weights take at most half the HBM)")
    c.add_argument("--instances", type=_num(1, integer=True), default=4, help="instances per model (default 4)")
    c.add_argument("--chunk", type=_num(1, integer=True), default=2048, help="prefill token budget per iteration "
                                                                             "(default 2048)")
    c.add_argument("--max-seqs", type=_num(1, integer=True), default=256, help="sequences per batch (default 256)")
    c.add_argument("--host-gb", type=_num(0), default=64.0, help="host-DRAM KV tier per GPU, GB (default 64)")
    c.add_argument("--slo-scale", type=_num(0, lo_open=True), default=1.0,
                   help="multiply both SLOs (TTFT max(1 s, 5x isolated prefill), TPOT max(25 ms, 5x batch-1 "
                        "decode)); capacity stays calibrated at this scale (default 1)")
    c.add_argument("--shadow-kv-cap", type=_num(0), default=0.25, help="shadow KV cap, fraction of the pool "
                                                                       "(default 0.25)")
    c.add_argument("--cold-age", type=_num(0), default=5.0, help="seconds idle before an entry may be displaced by "
                                                                 "shadow KV (default 5)")
    c.add_argument("--beta", type=_num(0, lo_open=True), default=0.5, help="iteration cap, x TPOT SLO (default 0.5)")
    c.add_argument("--margin", type=_num(0), default=0.1, help="SLO margin m of the slack controller (default 0.1)")
    c.add_argument("--n-min", type=_num(1, integer=True), default=256, help="minimum shadow chunk, tokens "
                                                                            "(default 256)")
    c.add_argument("--cache-normal-requests", action="store_true",
                   help="keep finished normal requests as (never-hit) prefix-cache entries")
    t = p.add_argument_group("normal traffic and run")
    t.add_argument("--traffic", metavar="CSV", help="request sizes from an Azure LLM inference trace CSV "
                                                    "(TIMESTAMP,ContextTokens,GeneratedTokens); default: synthetic "
                                                    "lognormal sizes shaped like the conversation trace")
    t.add_argument("--load", type=_num(0), default=0.7, help="normal-traffic load rho, fraction of each instance's "
                                                             "calibrated capacity (default 0.7)")
    t.add_argument("--capacity", action="append", metavar="RPS|MODEL=RPS",
                   help="per-instance capacity in requests/s instead of calibrating it (MODEL=RPS per model)")
    t.add_argument("--session-rate", type=_num(0, lo_open=True), default=0.2,
                   help="routed sessions started per second (default 0.2)")
    t.add_argument("--warmup", type=_num(0), default=120.0, help="warm-up seconds (default 120)")
    t.add_argument("--measure", type=_num(0, lo_open=True), default=600.0, help="measured seconds (default 600)")
    t.add_argument("--drain", type=_num(0), default=1800.0, help="longest drain after the window, s (default 1800)")
    o = p.add_argument_group("output")
    o.add_argument("--format", choices=("table", "json", "csv"), default="table")
    o.add_argument("--out", metavar="FILE", help="write the output to FILE (atomically) instead of stdout")


def _config_from_args(args, ss) -> ClusterConfig:
    from shadow_prefill.cli import _name_values
    from shadow_prefill.latency import LatencyModel, build_roofline, load_gpu, load_model_arch
    _, named = _name_values(args.model_config, "--model-config", str)
    unknown = sorted(set(named) - set(ss.model_names))
    if unknown:
        raise ShadowError(f"--model-config names model(s) not in the workload: {', '.join(unknown)} "
                          f"(models: {', '.join(ss.model_names)})")
    gpu = load_gpu(args.gpu)
    models = []
    for m in ss.model_names:
        spec = named.get(m, m)
        if spec.endswith(".json") and os.path.exists(spec):
            try:
                with open(spec, "r", encoding="utf-8") as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                doc = None
            if isinstance(doc, dict) and doc.get("kind") == "latency_model":
                models.append(LatencyModel.from_dict(doc, where=spec))
                continue
        try:
            arch = load_model_arch(spec, name=m)
        except ShadowError:
            if m not in named and m in _DEFAULT_ALIAS:
                arch = load_model_arch(_DEFAULT_ALIAS[m], name=_DEFAULT_ALIAS[m])
            else:
                raise ShadowError(f"no architecture for model {m!r}: map it with --model-config {m}=PRESET|CONFIG")
        models.append(build_roofline(arch, gpu, args.tp))
    prices = None
    if getattr(args, "_prices", None):
        pr = args._prices
        if all(m in pr for m in ss.model_names):
            prices = tuple((pr[m].input_price, pr[m].output_price) for m in ss.model_names)
    return ClusterConfig(models=tuple(models), gpu=args.gpu, instances=args.instances, chunk_tokens=args.chunk,
                         max_seqs=args.max_seqs, host_gb_per_gpu=args.host_gb, slo_scale=args.slo_scale,
                         beta=args.beta, margin=args.margin, n_min=args.n_min, cold_age_s=args.cold_age,
                         shadow_kv_cap=args.shadow_kv_cap, prices=prices,
                         cache_normal_requests=args.cache_normal_requests)


def _capacity(args, ss):
    if not args.capacity:
        return None
    from shadow_prefill.cli import _name_values

    def conv(v: str) -> float:
        try:
            x = float(v)
        except ValueError:
            raise ShadowError(f"--capacity: expected a number of requests/s, got {v!r}") from None
        if not (x > 0 and math.isfinite(x)):
            raise ShadowError(f"--capacity: must be > 0 requests/s, got {v!r}")
        return x
    default, named = _name_values(args.capacity, "--capacity", conv)
    unknown = sorted(set(named) - set(ss.model_names))
    if unknown:
        raise ShadowError(f"--capacity names model(s) not in the workload: {', '.join(unknown)}")
    out = []
    for m in ss.model_names:
        v = named.get(m, default)
        if v is None:
            raise ShadowError(f"--capacity: no rate for model {m!r} (give RPS or {m}=RPS)")
        out.append(v)
    return tuple(out)


def _setup(args):
    from shadow_prefill.cli import workload_from_args
    ss, _acc, prices = workload_from_args(args)[0]
    args._prices = prices
    config = _config_from_args(args, ss)
    sizes = read_azure_trace(args.traffic) if args.traffic else synthetic_request_sizes()
    return ss, config, sizes, _capacity(args, ss)


def _window(s: str):
    s = s.strip()
    if s in DEFAULT_WINDOWS:
        return s
    try:
        v = float(s)
    except ValueError:
        raise ShadowError(f"unknown window {s!r}: use peak, median, trough or a load multiplier") from None
    if not (v >= 0 and math.isfinite(v)):
        raise ShadowError(f"a window multiplier must be >= 0, got {s!r}")
    return v


def _emit(text: str, out: str | None) -> None:
    from shadow_prefill.trace_io import atomic_write
    if out:
        atomic_write(out, lambda f: f.write(text))
    else:
        sys.stdout.write(text)


def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (np.floating, float)):
        v = float(x)
        return v if math.isfinite(v) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def _table(rows: list[dict], cols: Sequence[tuple[str, str, str]]) -> str:
    def f(v, fmt):
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return "-"
        try:
            return fmt.format(v)
        except (ValueError, TypeError):
            return str(v)
    cells = [[c[1] for c in cols]] + [[f(r.get(c[0]), c[2]) for c in cols] for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    lines = []
    for k, r in enumerate(cells):
        lines.append("  ".join(x.ljust(w[i]) if i == 0 else x.rjust(w[i]) for i, x in enumerate(r)))
        if k == 0:
            lines.append("  ".join("-" * x for x in w))
    return "\n".join(lines) + "\n"


def _csv(rows: list[dict]) -> str:
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


# ============================================================================ simulate

_SIM_COLS = (("approach", "approach", "{}"), ("calls", "calls", "{:d}"), ("switch_calls", "switch", "{:d}"),
             ("mean_call_latency_s", "call lat s", "{:.3f}"), ("mean_switch_latency_s", "switch lat s", "{:.3f}"),
             ("mean_switch_ttft_s", "switch TTFT s", "{:.3f}"), ("hit_rate", "hit", "{:.3f}"),
             ("switch_hit_rate", "switch hit", "{:.3f}"), ("normal_slo_attainment", "normal SLO", "{:.4f}"),
             ("shadow_tokens", "shadow tok", "{:.0f}"), ("shadow_unused_frac", "unused", "{:.2f}"),
             ("energy_per_good_request_j", "J/good req", "{:.1f}"), ("sim_s_per_wall_s", "sim s/wall s", "{:.0f}"))


def _simulate_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("simulate", help="simulate one approach on a cluster (ShadowPrefill, Table 2)",
                       description="Simulate a routed session workload and Poisson normal traffic on K instances "
                                   "per model under one approach of ShadowPrefill's Table 2, and print its absolute "
                                   "metrics (latencies in seconds, hit rates as fractions, energy in joules).")
    _add_cluster_args(p)
    p.add_argument("--approach", default="Harvest-SLO+Host",
                   help=f"one of: {', '.join(APPROACH_NAMES)} (default Harvest-SLO+Host)")
    p.add_argument("--window", default="peak", help="peak, median, trough or a load multiplier (default peak)")
    p.add_argument("--sim-seed", type=int, default=0, help="seed of arrivals and session starts (default 0)")
    return p


def cmd_simulate(args) -> int:
    policy = get_policy(args.approach)
    ss, config, sizes, cap = _setup(args)
    sc = Scenario(rho=args.load, window=_window(args.window), warmup_s=args.warmup, measure_s=args.measure,
                  drain_s=args.drain, session_rate=args.session_rate, seed=args.sim_seed)
    run = simulate_cluster(ss, config, policy, sc, sizes, cap)
    s = _clean(run.summary())
    if args.format == "json":
        doc = {"schema_version": 1, "kind": "shadow_cluster_run", "tool": "tr-shadow simulate",
               "scenario": _clean(vars(sc)), "config": _clean(run.config), "capacity_rps": list(run.capacity_rps),
               "workload": ss.summary(), "traffic": sizes.describe(), "summary": s}
        text = json.dumps(doc, indent=2) + "\n"
    elif args.format == "csv":
        text = _csv([s])
    else:
        text = _table([s], _SIM_COLS)
    _emit(text, args.out)
    return 0


# ============================================================================ compare

_CMP_COLS = (("approach", "approach", "{}"),) + tuple(
    (m, lab, "{:.2f}") for m, lab in (
        ("switch_latency_reduction_pct", "switch lat -%"), ("call_latency_reduction_pct", "call lat -%"),
        ("switch_ttft_reduction_pct", "switch TTFT -%"), ("task_time_reduction_pct", "task time -%"),
        ("hit_rate_pct", "hit %"), ("token_cost_reduction_pct", "cost -%"), ("normal_slo_delta_pp", "normal SLO pp"),
        ("shadow_unused_pct", "unused %"), ("energy_per_good_request_change_pct", "energy +%")))


def _compare_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("compare", help="compare approaches against No Shadow (mean +- 1 SE over seeds x windows)",
                       description="Run approaches of ShadowPrefill's Table 2 on the same seeds and windows and "
                                   "report each against No Shadow over the calls that complete under every "
                                   "approach: reductions in %, hit rates in %, SLO changes in percentage points, "
                                   "+-1 standard error over seeds x windows (the _se columns). With --sweep, one "
                                   "block per value of a parameter.")
    _add_cluster_args(p)
    p.add_argument("--approaches", help="comma-separated approaches (default: all ten; with --sweep: Harvest-SLO, "
                                        "Harvest-SLO+Host, Oracle+Host)")
    p.add_argument("--windows", default="peak,median,trough", help="comma-separated windows: peak, median, trough "
                                                                    "or load multipliers (default all three)")
    p.add_argument("--sim-seeds", default="0,1,2", help="comma-separated simulation seeds (default 0,1,2)")
    p.add_argument("--sweep", metavar="PARAM=V1,V2,...",
                   help=f"sweep one parameter ({', '.join(SWEEP_PARAMS)}, or models_per_router with --synthetic: "
                        f"N = 2.. models from qwen2.5-7b, llama-3.1-70b, llama-3.1-8b, mistral-nemo-12b, "
                        f"mixtral-8x7b, all-target vs top-1); default approaches then Harvest-SLO, "
                        f"Harvest-SLO+Host, Oracle+Host")
    p.add_argument("--context-bins", metavar="T1,T2,...",
                   help="also report switch-call latency reduction per prompt-length bin (token edges)")
    p.add_argument("--workers", default="1", metavar="K|auto", help="local worker processes (default 1)")
    p.add_argument("--dask", metavar="ADDRESS", help="run on an existing Dask scheduler (tcp://host:8786)")
    return p


def _workers(v: str) -> int:
    if v == "auto":
        return max(1, (os.cpu_count() or 1))
    try:
        k = int(v)
    except ValueError:
        raise ShadowError(f"--workers must be an integer >= 1 or 'auto', got {v!r}") from None
    if k < 1:
        raise ShadowError(f"--workers must be >= 1, got {k}")
    return k


def _progress():
    if not sys.stderr.isatty():
        return None

    def prog(done, total):
        sys.stderr.write(f"\r{done}/{total} runs")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()
    return prog


def cmd_compare(args) -> int:
    ss, config, sizes, cap = _setup(args)
    windows = [_window(w) for w in args.windows.split(",") if w.strip()]
    try:
        seeds = [int(s) for s in args.sim_seeds.split(",") if s.strip()]
    except ValueError:
        raise ShadowError(f"--sim-seeds must be comma-separated integers, got {args.sim_seeds!r}") from None
    if not windows or not seeds:
        raise ShadowError("need at least one window and one seed")
    workers = _workers(args.workers)
    client = None
    if args.dask:
        try:
            from distributed import Client
        except ImportError:
            raise ShadowError("--dask needs the 'dask' extra (dask.distributed)") from None
        try:
            client = Client(args.dask, timeout=10)
        except OSError as e:
            raise ShadowError(f"--dask: cannot connect to {args.dask!r}: {e}") from None
    sc = Scenario(rho=args.load, warmup_s=args.warmup, measure_s=args.measure, drain_s=args.drain,
                  session_rate=args.session_rate)
    if args.approaches:
        approaches = [a.strip() for a in args.approaches.split(",") if a.strip()]
    elif args.sweep:
        approaches = ["Harvest-SLO", "Harvest-SLO+Host", "Oracle+Host"]
    else:
        approaches = list(APPROACH_NAMES)
    for a in approaches:
        get_policy(a)
    if cap is None:
        cap = calibrated_capacities(config, sizes)
    doc: dict = {"schema_version": 1, "kind": "shadow_cluster_comparison", "tool": "tr-shadow compare",
                 "scenario": _clean(vars(sc)), "seeds": seeds, "windows": windows, "capacity_rps": list(cap),
                 "workload": ss.summary(), "traffic": sizes.describe()}
    try:
        if args.sweep:
            if "=" not in args.sweep:
                raise ShadowError("--sweep must look like PARAM=V1,V2,...")
            param, vals = args.sweep.split("=", 1)
            param = param.strip()
            try:
                values = [float(v) for v in vals.split(",") if v.strip()]
            except ValueError:
                raise ShadowError(f"--sweep values must be numbers, got {vals!r}") from None
            if param == "models_per_router":
                df = _sweep_models(args, values, config, seeds, windows, sc, sizes, workers, client)
            else:
                df = sweep(ss, param, values, config, approaches, seeds, windows, sc, sizes, cap,
                           workers=workers, executor=client, progress=_progress())
            rows = [_clean(r) for r in df.to_dict("records")]
            doc["sweep"] = {"param": param, "values": values}
            cols = (("param", "param", "{}"), ("value", "value", "{:g}")) + _CMP_COLS
        else:
            runs = run_grid(ss, config, approaches, seeds, windows, sc, sizes, cap, workers=workers,
                            executor=client, progress=_progress())
            df = summarize_comparison(compare_runs(runs))
            rows = [_clean(r) for r in df.to_dict("records")]
            cols = _CMP_COLS
            if args.context_bins:
                try:
                    edges = [0.0] + [float(x) for x in args.context_bins.split(",") if x.strip()] + [math.inf]
                except ValueError:
                    raise ShadowError("--context-bins must be comma-separated token counts") from None
                if any(b <= a for a, b in zip(edges, edges[1:])):
                    raise ShadowError("--context-bins must increase")
                doc["by_context"] = [_clean(r) for r in reduction_by_context(runs, edges).to_dict("records")]
    finally:
        if client is not None:
            client.close()
    doc["results"] = rows
    if args.format == "json":
        text = json.dumps(doc, indent=2) + "\n"
    elif args.format == "csv":
        text = _csv(rows)
    else:
        text = _table(rows, cols)
    _emit(text, args.out)
    return 0


def _sweep_models(args, values, config, seeds, windows, sc, sizes, workers, client):
    """``--sweep models_per_router=2,3,...``: synthetic sessions re-drawn over the first N candidate models."""
    from shadow_prefill.builder import LogNormal, SyntheticParams
    from shadow_prefill.cli import _loop_params
    from shadow_prefill.cluster.sweep import sweep_models_per_router
    if not args.synthetic:
        raise ShadowError("--sweep models_per_router needs --synthetic (the sessions are re-routed over N models)")
    ns = [int(v) for v in values]
    if any(n != v or n < 2 for n, v in zip(ns, values)):
        raise ShadowError(f"models_per_router values must be integers >= 2, got {values}")
    syn = SyntheticParams(n_sessions=args.sessions, switch_prob=args.switch_prob,
                          first_input=LogNormal.parse(args.first_input), step_input=LogNormal.parse(args.step_input),
                          loop=_loop_params(args), n_tasks=args.tasks, seed=args.seed)
    base = replace(config, models=DEFAULT_PAIR)
    df = sweep_models_per_router(ns, synthetic=syn, config=base, seeds=seeds, windows=windows, scenario=sc,
                                 sizes=sizes, workers=workers, executor=client, progress=_progress())
    df = df.rename(columns={"models_per_router": "value"})
    df.insert(0, "param", "models_per_router")
    return df


def register(subparsers) -> None:
    """Add ``simulate`` and ``compare`` to ``tr-shadow``'s subparsers."""
    _simulate_parser(subparsers).set_defaults(func=cmd_simulate)
    _compare_parser(subparsers).set_defaults(func=cmd_compare)
