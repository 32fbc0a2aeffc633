"""``tr-shadow simulate`` and ``tr-shadow compare``: the ShadowPrefill cluster simulator on the command line.

:func:`register` adds both subcommands to ``tr-shadow``'s subparsers; each
sets ``func`` to its handler (``cmd_simulate`` / ``cmd_compare``), which
returns an exit code.  Workload options are the shared ones of
:mod:`shadow_prefill.workload_args`; a synthetic workload's default model
names ``small`` and ``large`` map to Qwen2.5-7B and Llama-3.1-70B unless
``--model-config`` says otherwise.

Flags follow ``docs/cli-convention.md``: seconds in the names (``--warmup-s``,
``--measure-s``, ``--drain-s``, ``--cold-age-s``), space-separated lists
(``--sim-seeds 0 1 2``, ``--approaches Oracle "No Shadow"``), and sweeps named
after the flag they vary (``--sweep load 0.3 0.8``, ``--sweep cold-age-s 1 5``).
The old list forms (``--sweep rho=0.3,0.8``, comma lists) are still read, with a
``note:`` on stderr.

**Overload.**  A run whose measured calls do not all finish before the end of
the drain is *overloaded*: its latency means cover only the calls that finished.
``simulate`` and ``compare`` then print a ``warning:`` line on stderr and mark
the output (``"overloaded": true``, the ``unfinished_calls`` column); ``compare``
reports its reductions over the calls that finish under every approach
(``calls``) out of ``measured_calls``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import replace
from typing import Any, Sequence

from tr_core.cli import Progress, add_output_args, add_quiet_arg, add_subcommands, format_gain, parse_int_ranges
from tr_core.units import finite_number, positive_number

from shadow_prefill.cluster.metrics import compare_runs, reduction_by_context, summarize_comparison
from shadow_prefill.cluster.policies import APPROACH_NAMES, get_policy
from shadow_prefill.cluster.sim import DEFAULT_PAIR, ClusterConfig, Scenario, simulate_cluster
from shadow_prefill.cluster.sweep import SWEEP_PARAMS, calibrated_capacities, run_grid, sweep
from shadow_prefill.cluster.workload import DEFAULT_WINDOWS, SESSION_DRAWS, read_azure_trace, synthetic_request_sizes
from shadow_prefill.errors import ShadowError, ShadowResourceLimit
from shadow_prefill.workload_args import add_workload_args, clean, emit_result, int_at_least, \
    latency_models, name_values, number, synthetic_params, text_table, workload_from_args

__all__ = ["register", "cmd_simulate", "cmd_compare", "SWEEP_FLAGS"]

_DEFAULT_ALIAS = {"small": DEFAULT_PAIR[0], "large": DEFAULT_PAIR[1]}

# --sweep NAME: the flag's name without dashes -> the simulator's parameter (sweep.SWEEP_PARAMS);
# a name not listed here is read as the parameter itself with '-' for '_' (a newly sweepable parameter works)
SWEEP_FLAGS: dict[str, str] = {
    "load": "rho", "session-rate": "session_rate", "slo-scale": "slo_scale", "shadow-kv-cap": "shadow_kv_cap",
    "cold-age-s": "cold_age_s", "host-gb": "host_gb_per_gpu", "beta": "beta", "chunk": "chunk_tokens",
    "n-min": "n_min", "margin": "margin", "delta": "delta", "credit-gate": "credit_gate",
    "models-per-router": "models_per_router",
}
_SWEEP_NAME = {v: k for k, v in SWEEP_FLAGS.items()}  # old --sweep PARAM=... names -> the flag name

# requests + calls one run may simulate before it is refused: ~60x the default run, about 1 GB of event arrays
DEFAULT_MAX_REQUESTS = 10_000_000


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    add_workload_args(p, multi=False)
    c = p.add_argument_group("cluster")
    c.add_argument("--gpu", default="h100", help="GPU preset (h100, h200) or JSON file (default h100)")
    c.add_argument("--model-config", action="append", metavar="MODEL=PRESET|CONFIG",
                   help="architecture of a workload model: built-in name, config.json or saved latency model "
                        "(default: the model's own name; synthetic 'small'/'large' = qwen2.5-7b/llama-3.1-70b)")
    c.add_argument("--tp", type=int_at_least(1, 64), help="tensor-parallel degree of every model (default: the "
                                                          "smallest at which weights take at most half the HBM)")
    c.add_argument("--instances", type=int_at_least(1, 4096), default=4, help="instances per model (default 4)")
    c.add_argument("--chunk", type=int_at_least(1, 10 ** 7), default=2048,
                   help="prefill token budget per iteration (default 2048)")
    c.add_argument("--max-seqs", type=int_at_least(1, 10 ** 6), default=256, help="sequences per batch (default 256)")
    c.add_argument("--host-gb", type=number(0, 1e6), default=64.0, help="host-DRAM KV tier per GPU, GB (default 64)")
    c.add_argument("--slo-scale", type=number(0, 1e6, lo_open=True), default=1.0,
                   help="multiply both SLOs (TTFT max(1 s, 5x isolated prefill), TPOT max(25 ms, 5x batch-1 "
                        "decode)); capacity stays calibrated at this scale (default 1)")
    c.add_argument("--shadow-kv-cap", type=number(0, 1), default=0.25, help="shadow KV cap, fraction of the pool "
                                                                            "(default 0.25)")
    c.add_argument("--cold-age-s", dest="cold_age", metavar="S", type=number(0, 1e9), default=5.0,
                   help="seconds idle before an entry may be displaced by shadow KV (default 5)")
    c.add_argument("--beta", type=number(0, 1e6, lo_open=True), default=0.5,
                   help="iteration cap, x TPOT SLO (default 0.5)")
    c.add_argument("--margin", type=number(0, 1e6), default=0.1, help="SLO margin m of the slack controller "
                                                                       "(default 0.1)")
    c.add_argument("--n-min", type=int_at_least(1, 10 ** 7), default=256,
                   help="minimum shadow chunk, tokens (default 256)")
    c.add_argument("--cache-normal-requests", action="store_true",
                   help="keep finished normal requests as (never-hit) prefix-cache entries")
    c.add_argument("--credit-gate", metavar="PROB", type=number(0, 1), default=ClusterConfig().credit_gate,
                   help="Harvest-SLO's routed-step credit (C2) goes only to shadow jobs whose predicted probability "
                        "that the session's next call goes to their model is at least PROB, a probability in [0, 1] "
                        "(0: every job, the paper's rule; default 0.25, Predictive's threshold)")
    t = p.add_argument_group("normal traffic and run")
    t.add_argument("--traffic", metavar="CSV", help="request sizes from an Azure LLM inference trace CSV "
                                                    "(TIMESTAMP,ContextTokens,GeneratedTokens); default: synthetic "
                                                    "lognormal sizes shaped like the conversation trace")
    t.add_argument("--load", type=number(0, 1e3), default=0.7, help="normal-traffic load rho, fraction of each "
                                                                    "instance's calibrated capacity (default 0.7)")
    t.add_argument("--capacity-rps", dest="capacity", action="append", metavar="RPS|MODEL=RPS",
                   help="per-instance capacity in requests/s instead of calibrating it (MODEL=RPS per model; "
                        "repeatable)")
    t.add_argument("--session-rate", type=number(0, 1e6, lo_open=True), default=0.2,
                   help="routed sessions started per second (default 0.2)")
    t.add_argument("--session-draw", choices=SESSION_DRAWS, default=Scenario().session_draw,
                   help="which sessions of the pool each seed replays: shuffle (a random draw per seed, the same "
                        "for every approach of that seed) or in-order (the pool's first sessions for every seed, "
                        "as before the per-seed draw) (default shuffle)")
    t.add_argument("--warmup-s", dest="warmup", metavar="S", type=number(0, 1e7), default=120.0,
                   help="warm-up seconds before the measured window (default 120)")
    t.add_argument("--measure-s", dest="measure", metavar="S", type=number(0, 1e7, lo_open=True), default=600.0,
                   help="measured window, seconds (default 600)")
    t.add_argument("--drain-s", dest="drain", metavar="S", type=number(0, 1e7), default=1800.0,
                   help="longest drain after the window, seconds; calls still unfinished then mark the run "
                        "overloaded (default 1800)")
    t.add_argument("--max-requests", metavar="N", type=int_at_least(1, 10 ** 12), default=DEFAULT_MAX_REQUESTS,
                   help=f"refuse (exit 3) a run expected to simulate more normal requests and calls than this "
                        f"(default {DEFAULT_MAX_REQUESTS:,})")
    out = p.add_argument_group("output")
    add_output_args(p, group=out)
    add_quiet_arg(out)


def _config_from_args(args, ss) -> ClusterConfig:
    models = latency_models(args, ss.model_names, fallback=_DEFAULT_ALIAS)
    prices = None
    if getattr(args, "_prices", None):
        pr = args._prices
        if all(m in pr for m in ss.model_names):
            prices = tuple((pr[m].input_price, pr[m].output_price) for m in ss.model_names)
    return ClusterConfig(models=tuple(models), gpu=args.gpu, instances=args.instances, chunk_tokens=args.chunk,
                         max_seqs=args.max_seqs, host_gb_per_gpu=args.host_gb, slo_scale=args.slo_scale,
                         beta=args.beta, margin=args.margin, n_min=args.n_min, cold_age_s=args.cold_age,
                         shadow_kv_cap=args.shadow_kv_cap, prices=prices,
                         cache_normal_requests=args.cache_normal_requests, credit_gate=args.credit_gate)


def _capacity(args, ss):
    if not args.capacity:
        return None

    def conv(v: str) -> float:
        return positive_number(v, error=ShadowError, not_a_number="--capacity-rps: expected a number of requests/s",
                               not_positive="--capacity-rps: must be > 0 requests/s")
    default, named = name_values(args.capacity, "--capacity-rps", conv)
    unknown = sorted(set(named) - set(ss.model_names))
    if unknown:
        raise ShadowError(f"--capacity-rps names model(s) not in the workload: {', '.join(unknown)}")
    out = []
    for m in ss.model_names:
        v = named.get(m, default)
        if v is None:
            raise ShadowError(f"--capacity-rps: no rate for model {m!r} (give RPS or {m}=RPS)")
        out.append(v)
    return tuple(out)


def _setup(args):
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


def _table(rows: list[dict], cols: Sequence[tuple[str, str, str]]) -> str:
    def f(v, fmt):
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return "-"
        if fmt == "x":
            return format_gain(v)
        try:
            return fmt.format(v)
        except (ValueError, TypeError):
            return str(v)
    cells = [[c[1] for c in cols]] + [[f(r.get(c[0]), c[2]) for c in cols] for r in rows]
    return text_table(cells, left=1)


def _check_run_size(args, ss, config, cap, windows, rho: float | None = None) -> None:
    """Refuse (exit 3) before simulating when one run's expected requests and calls exceed ``--max-requests``.

    Normal requests arrive until the end of the drain at ``rho x window x capacity`` per instance; sessions
    start during warm-up and window at ``--session-rate``, each with the workload's mean number of calls.
    """
    rho = args.load if rho is None else rho
    mult = max((DEFAULT_WINDOWS[w] if isinstance(w, str) else float(w)) for w in windows)
    t_max = args.warmup + args.measure + args.drain
    normal = rho * mult * sum(cap) * args.instances * t_max
    calls = args.session_rate * (args.warmup + args.measure) * ss.n_calls / max(1, ss.n_sessions)
    total = normal + calls
    if total > args.max_requests:
        raise ShadowResourceLimit(
            f"one run would simulate about {total:,.0f} normal requests and calls ({normal:,.0f} arrive at load "
            f"{rho:g} x window {mult:g} x {sum(cap):g} req/s x {args.instances} instances over {t_max:g} s), more "
            f"than --max-requests {args.max_requests:,}; lower --load, --instances, --measure-s or --drain-s, or "
            f"raise --max-requests")


def _warn_overloaded(rows: Sequence[dict], drain_s: float) -> bool:
    """One ``warning:`` line on stderr when a run left measured calls unfinished; True when it did."""
    bad = [r for r in rows if (r.get("unfinished_calls") or 0) > 0]
    if not bad:
        return False
    worst = max(bad, key=lambda r: r["unfinished_calls"])
    measured = worst.get("measured_calls")
    if measured is None:
        measured = (worst.get("calls") or 0) + worst["unfinished_calls"]
    what = ", ".join(dict.fromkeys(str(r.get("approach")) for r in bad))
    sys.stderr.write(f"warning: overloaded: {worst['unfinished_calls']} of {measured} measured calls were still "
                     f"unfinished {drain_s:g} s after the window ({what}); latencies cover only the calls that "
                     f"finished (raise --drain-s, lower --load or --session-rate)\n")
    return True


# ============================================================================ simulate

_SIM_COLS = (("approach", "approach", "{}"), ("calls", "calls", "{:d}"), ("unfinished_calls", "unfinished", "{:d}"),
             ("switch_calls", "switch", "{:d}"),
             ("mean_call_latency_s", "call lat s", "{:.3f}"), ("mean_switch_latency_s", "switch lat s", "{:.3f}"),
             ("mean_switch_ttft_s", "switch TTFT s", "{:.3f}"), ("hit_rate", "hit", "{:.3f}"),
             ("switch_hit_rate", "switch hit", "{:.3f}"), ("normal_slo_attainment", "normal SLO", "{:.4f}"),
             ("shadow_tokens", "shadow tok", "{:.0f}"), ("shadow_unused_frac", "unused", "{:.2f}"),
             ("energy_per_good_request_j", "J/good req", "{:.1f}"), ("sim_s_per_wall_s", "sim s/wall s", "x"))


def _simulate_args(p: argparse.ArgumentParser) -> None:
    _add_cluster_args(p)
    p.add_argument("--approach", default="Harvest-SLO+Host",
                   help=f"one of: {', '.join(APPROACH_NAMES)} (default Harvest-SLO+Host)")
    p.add_argument("--window", default="peak", help="peak, median, trough or a load multiplier (default peak)")
    p.add_argument("--sim-seed", type=int_at_least(0, 2 ** 63 - 1), default=0,
                   help="seed of arrivals and session starts (default 0)")


def cmd_simulate(args) -> int:
    policy = get_policy(args.approach)
    window = _window(args.window)
    ss, config, sizes, cap = _setup(args)
    if cap is None:
        cap = calibrated_capacities(config, sizes)  # cached: the run below reuses it
    _check_run_size(args, ss, config, cap, [window])
    sc = Scenario(rho=args.load, window=window, warmup_s=args.warmup, measure_s=args.measure,
                  drain_s=args.drain, session_rate=args.session_rate, seed=args.sim_seed,
                  session_draw=args.session_draw)
    run = simulate_cluster(ss, config, policy, sc, sizes, cap)
    s = clean(run.summary())
    s["measured_calls"] = s["calls"] + s["unfinished_calls"]
    s["overloaded"] = _warn_overloaded([s], args.drain)
    emit_result(args, lambda: {"schema_version": 1, "kind": "shadow_cluster_run", "tool": "tr-shadow simulate",
                               "scenario": vars(sc), "config": run.config, "capacity_rps": list(run.capacity_rps),
                               "workload": ss.summary(), "traffic": sizes.describe(), "overloaded": s["overloaded"],
                               "summary": s},
                lambda: [s], lambda: _table([s], _SIM_COLS))
    return 0


# ============================================================================ compare

_CMP_COLS = (("approach", "approach", "{}"), ("calls", "calls", "{:d}"), ("unfinished_calls", "unfinished", "{:d}"),
             ) + tuple((m, lab, "{:.2f}") for m, lab in (
                 ("switch_latency_reduction_pct", "switch lat -%"), ("call_latency_reduction_pct", "call lat -%"),
                 ("switch_ttft_reduction_pct", "switch TTFT -%"), ("task_time_reduction_pct", "task time -%"),
                 ("hit_rate_pct", "hit %"), ("token_cost_reduction_pct", "cost -%"),
                 ("normal_slo_delta_pp", "normal SLO pp"), ("shadow_unused_pct", "unused %"),
                 ("energy_per_good_request_change_pct", "energy +%")))


def _compare_args(p: argparse.ArgumentParser) -> None:
    _add_cluster_args(p)
    p.add_argument("--approaches", nargs="+", metavar="APPROACH",
                   help="approaches to run (default: all ten; with --sweep: Harvest-SLO, Harvest-SLO+Host, "
                        "Oracle+Host); No Shadow is always added as the baseline")
    p.add_argument("--windows", nargs="+", default=["peak", "median", "trough"], metavar="WINDOW",
                   help="windows: peak, median, trough or load multipliers (default: all three)")
    p.add_argument("--sim-seeds", nargs="+", default=["0", "1", "2"], metavar="SEED",
                   help="simulation seeds, integers or ranges A-B (default 0 1 2)")
    p.add_argument("--sweep", nargs="+", metavar=("NAME", "VALUE"),
                   help=f"sweep one parameter: NAME VALUE [VALUE ...], NAME the flag it varies without dashes "
                        f"({', '.join(SWEEP_FLAGS)}); models-per-router needs --synthetic: N = 2.. models from "
                        f"qwen2.5-7b, llama-3.1-70b, llama-3.1-8b, mistral-nemo-12b, mixtral-8x7b, all-target vs "
                        f"top-1")
    p.add_argument("--context-bins", nargs="+", metavar="TOKENS",
                   help="also report switch-call latency reduction per prompt-length bin (increasing token edges)")
    p.add_argument("--workers", default="1", metavar="K|auto", help="local worker processes (default 1)")
    p.add_argument("--dask", metavar="ADDRESS", help="run on an existing Dask scheduler (tcp://host:8786)")


def _workers(v: str) -> int:
    if v == "auto":
        return max(1, (os.cpu_count() or 1))
    try:
        k = int(v)
    except ValueError:
        raise ShadowError(f"--workers must be an integer >= 1 or 'auto', got {v!r}") from None
    if k < 1:
        raise ShadowError(f"--workers must be >= 1, got {k}")
    if k > 1024:
        raise ShadowError(f"--workers must be <= 1024, got {k}")
    return k


def _split(values: Sequence[str] | None, flag: str) -> list[str]:
    """A space-separated list; an item with commas is the deprecated comma list (split, with a note)."""
    from tr_core.cli import note
    out: list[str] = []
    warned = False
    for v in values or []:
        parts = [x.strip() for x in v.split(",")]
        if len(parts) > 1 and not warned:
            note(f"comma-separated lists for {flag} are deprecated; separate the values with spaces")
            warned = True
        out.extend(x for x in parts if x)
    return out


def _numbers(values: Sequence[str], flag: str) -> list[float]:
    return [finite_number(v, error=ShadowError, unreadable=f"{flag}: {v!r} is not a number",
                          not_finite=f"{flag}: {v!r} is not a finite number", catch=(ValueError,)) for v in values]


def _sweep_spec(items: Sequence[str]) -> tuple[str, str, list[float]]:
    """``--sweep NAME V1 V2 ...`` (or the deprecated ``PARAM=V1,V2``) -> (flag name, parameter, values)."""
    from tr_core.cli import note
    items = list(items)
    if "=" in items[0]:
        old, first = items[0].split("=", 1)
        vals = [x.strip() for v in [first] + items[1:] for x in v.split(",") if x.strip()]
        name = _SWEEP_NAME.get(old.strip(), old.strip().replace("_", "-"))
        note(f"--sweep PARAM=V1,V2 is deprecated; use --sweep {name} {' '.join(vals)}")
    else:
        name = items[0].strip()
        vals = _split(items[1:], "--sweep")
    param = SWEEP_FLAGS.get(name, name.replace("-", "_"))
    if param != "models_per_router" and param not in SWEEP_PARAMS:
        raise ShadowError(f"--sweep: cannot sweep {name!r}; sweepable: {', '.join(SWEEP_FLAGS)}")
    if not vals:
        raise ShadowError(f"--sweep {name}: give at least one value (--sweep {name} V1 V2 ...)")
    return name, param, _numbers(vals, f"--sweep {name}")


# --sweep NAME -> the dest of the flag --NAME whose value the sweep replaces (a name not listed: NAME with '_')
_SWEPT_DEST = {"cold-age-s": "cold_age", "session-rate": "session_rate", "slo-scale": "slo_scale",
               "shadow-kv-cap": "shadow_kv_cap", "host-gb": "host_gb", "n-min": "n_min", "credit-gate": "credit_gate"}


def _refuse_compare_dropped(args, sweep_spec) -> None:
    """compare: flags that the sweep or the Dask scheduler would make moot are refused, naming both."""
    from tr_core.cli import given, refuse_given
    if sweep_spec:
        name = sweep_spec[0]
        flag = given(args, _SWEPT_DEST.get(name, name.replace("-", "_")))
        if flag:
            raise ShadowError(f"{flag} is varied by --sweep {name}: its value would be dropped; give the values to "
                              f"--sweep only")
        refuse_given(args, ["context_bins"], "applies to a comparison without --sweep (one block per swept value "
                     "has no bins)")
    if args.dask:
        refuse_given(args, ["workers"], "has no effect with --dask (the scheduler's workers run the simulations)")


def cmd_compare(args) -> int:
    windows = [_window(w) for w in _split(args.windows, "--windows")]
    seeds = list(parse_int_ranges(args.sim_seeds, "--sim-seeds", lo=0, hi=2 ** 63 - 1))
    if not windows:
        raise ShadowError("--windows: give at least one window")
    if len(seeds) > 10000:
        raise ShadowError(f"--sim-seeds: {len(seeds)} seeds; at most 10000 per command")
    sweep_spec = _sweep_spec(args.sweep) if args.sweep else None
    _refuse_compare_dropped(args, sweep_spec)
    if args.approaches:
        approaches = _split(args.approaches, "--approaches")
    elif sweep_spec:
        approaches = ["Harvest-SLO", "Harvest-SLO+Host", "Oracle+Host"]
    else:
        approaches = list(APPROACH_NAMES)
    for a in approaches:
        get_policy(a)
    edges = None
    if args.context_bins:
        edges = [0.0] + _numbers(_split(args.context_bins, "--context-bins"), "--context-bins") + [math.inf]
        if any(b <= a for a, b in zip(edges, edges[1:])):
            raise ShadowError("--context-bins must be increasing token counts > 0")
    workers = _workers(args.workers)
    ss, config, sizes, cap = _setup(args)
    if cap is None:
        cap = calibrated_capacities(config, sizes)
    top_rho = max(sweep_spec[2]) if sweep_spec and sweep_spec[1] == "rho" else None
    _check_run_size(args, ss, config, cap, windows, rho=top_rho)
    client = None
    if args.dask:
        try:
            from distributed import Client
        except ImportError:
            raise ShadowError("--dask needs the 'dask' extra (dask.distributed)") from None
        try:
            client = Client(args.dask, timeout=10)
        except (OSError, ValueError, TypeError) as e:
            raise ShadowError(f"--dask: cannot connect to {args.dask!r}: {e}") from None
    sc = Scenario(rho=args.load, warmup_s=args.warmup, measure_s=args.measure, drain_s=args.drain,
                  session_rate=args.session_rate, session_draw=args.session_draw)
    progress = Progress("runs", enabled=False if args.quiet else None)
    doc: dict = {"schema_version": 1, "kind": "shadow_cluster_comparison", "tool": "tr-shadow compare",
                 "scenario": vars(sc), "seeds": seeds, "windows": windows, "capacity_rps": list(cap),
                 "workload": ss.summary(), "traffic": sizes.describe()}
    try:
        if sweep_spec:
            name, param, values = sweep_spec
            if param == "models_per_router":
                df = _sweep_models(args, values, config, seeds, windows, sc, sizes, workers, client, progress)
            else:
                df = sweep(ss, param, values, config, approaches, seeds, windows, sc, sizes, cap,
                           workers=workers, executor=client, progress=progress)
            df["param"] = name
            rows = [clean(r) for r in df.to_dict("records")]
            doc["sweep"] = {"param": name, "values": values}
            cols = (("param", "param", "{}"), ("value", "value", "{:g}")) + _CMP_COLS
        else:
            runs = run_grid(ss, config, approaches, seeds, windows, sc, sizes, cap, workers=workers,
                            executor=client, progress=progress)
            df = summarize_comparison(compare_runs(runs))
            rows = [clean(r) for r in df.to_dict("records")]
            cols = _CMP_COLS
            if edges is not None:
                doc["by_context"] = [clean(r) for r in reduction_by_context(runs, edges).to_dict("records")]
    finally:
        if client is not None:
            client.close()
    doc["overloaded"] = _warn_overloaded(rows, args.drain)
    doc["results"] = rows
    emit_result(args, lambda: doc, lambda: rows, lambda: _table(rows, cols))
    return 0


def _sweep_models(args, values, config, seeds, windows, sc, sizes, workers, client, progress):
    """``--sweep models-per-router 2 3 ...``: synthetic sessions re-drawn over the first N candidate models."""
    from shadow_prefill.cluster.sweep import sweep_models_per_router
    if not (args.synthetic or getattr(args, "workload", None)):
        raise ShadowError("--sweep models-per-router needs --synthetic (the sessions are re-routed over N models)")
    ns = [int(v) for v in values]
    if any(n != v or n < 2 for n, v in zip(ns, values)):
        raise ShadowError(f"--sweep models-per-router: values must be integers >= 2, got "
                          f"{' '.join(f'{v:g}' for v in values)}")
    base = replace(config, models=DEFAULT_PAIR)
    df = sweep_models_per_router(ns, synthetic=synthetic_params(args), config=base, seeds=seeds, windows=windows,
                                 scenario=sc, sizes=sizes, workers=workers, executor=client, progress=progress)
    df = df.rename(columns={"models_per_router": "value"})
    df.insert(0, "param", "models-per-router")
    return df


# name -> (help, description, argument builder, handler), as shadow_prefill.cli.SUBCOMMANDS
SUBCOMMANDS = {
    "simulate": ("simulate one approach on a cluster (ShadowPrefill, Table 2)",
                 "Simulate a routed session workload and Poisson normal traffic on K instances per model under one "
                 "approach of ShadowPrefill's Table 2, and print its absolute metrics (latencies in seconds, hit rates "
                 "as fractions, energy in joules). A run that leaves measured calls unfinished is flagged as "
                 "overloaded.", _simulate_args, cmd_simulate),
    "compare": ("compare approaches against No Shadow (mean +- 1 SE over seeds x windows)",
                "Run approaches of ShadowPrefill's Table 2 on the same seeds and windows and report each against No "
                "Shadow over the calls that complete under every approach (calls; unfinished calls mark an overloaded "
                "run, with a warning): reductions in %, hit rates in %, SLO changes in percentage points, +-1 "
                "standard error over seeds x windows (the _se columns). With --sweep, one block per value of a "
                "parameter.", _compare_args, cmd_compare),
}


def register(subparsers) -> None:
    """Add ``simulate`` and ``compare`` to ``tr-shadow``'s subparsers."""
    add_subcommands(subparsers, SUBCOMMANDS)
