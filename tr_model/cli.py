"""``tr-optimize``: best delayed-batching thresholds for a token-level routed system.

Examples::

    tr-optimize --p 0.35 --L 6.0 27.9                 # R2R preset, N = 1 2 4 8 16
    tr-optimize --algo r-stitch --p 0.2 --q 0.5 --L 6 28 --N 1-16 --format csv
    tr-optimize --spec system.json --N 8 --B 1 5      # evaluate one vector

The command runs in four steps: :func:`validate` turns the flags into a :class:`Plan` (every check
before any work), :func:`compute` produces one result document (the same row schema for the exact
chain and the simulator), :func:`render` formats it (table, JSON or CSV), and the text goes to stdout
or, atomically, to ``--out``.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field

from tr_core.cli import (IntRanges, Parser, Progress, add_list_arg, check_number, add_output_args, add_quiet_arg, add_version, emit, format_gain,
                         format_table, note, output_format, parse_int_list, run_cli, to_csv)
from tr_core.errors import SpecError, StateSpaceTooLarge
from tr_core.search_options import SEARCH_FIELDS, add_search_flags, search_options_from_args
from tr_core.search_rule import DEFAULT_MAX_GAP, DEFAULT_MAX_HOURS, auto_n_limits
from tr_core.spec import spec_to_dict
from tr_core.system_args import System, add_system_args, build_system

OUTPUT_SCHEMA_VERSION = 1
DEFAULT_NS = [1, 2, 4, 8, 16]
DEFAULT_MAX_EVALUATIONS = 1_000_000
LONG_SWEEP_S = 600.0  # a sweep estimated above this (one core) is announced with its estimate
LONG_SWEEP_CHAINS = 200  # a sweep with more chains than this (or a bounded search) reports each N on stderr

# keys every result row carries, whichever method produced it (None where a method has no value)
RESULT_KEYS = ("N", "B", "method", "throughput_tok_s", "ci95_tok_s", "eager_throughput_tok_s", "gain_vs_eager",
               "per_request_tok_s", "admission_latency_ms", "states", "evaluated", "seconds")


def build_parser() -> Parser:
    p = Parser(
        prog="tr-optimize",
        description=("Find the delayed-batching thresholds B* that maximise the decode throughput of a "
                     "token-level routed LLM system (TokenRouter model, exact Markov chain). "
                     "Latencies are per decoding step in milliseconds; throughput is committed output "
                     "tokens per second summed over the N concurrent requests."),
        epilog="Exit codes: 0 ok, 2 bad input, 3 a resource limit (--max-states, --max-evaluations, --max-hours), "
               "130 interrupted. Conventions: docs/cli-convention.md.")
    add_version(p)
    g = add_system_args(p, title="system (one of --p/--algo, --weights, --spec)")
    g.add_argument("--check-delta", action="store_true", help="also solve at delta/2 (when it fits under "
                   "--max-states) and report how much the throughput and B* move")
    _add_search_args(p)
    o = p.add_argument_group("output")
    add_output_args(p, group=o)
    o.add_argument("--all", action="store_true", help="also output every evaluated B")
    o.add_argument("--plot", metavar="FILE", help="also plot throughput over the evaluated B for each N, B* "
                   "marked, eager drawn (.png, .svg or .pdf; needs a search, not --B)")
    o.add_argument("--thresholds", metavar="FILE.json", help="also write the thresholds file of the sweep (the "
                   "product file tr-autotune run writes; --N must be 1..K): schema version 3 with --policy, 2 "
                   "without")
    add_quiet_arg(o)
    return p


def add_search_options(group, *, defaults=None, words=None, fields=SEARCH_FIELDS) -> None:
    """The flags of :class:`tr_core.search_options.SearchOptions` (``tr-optimize`` and ``tr-autotune run``), with
    the stationary solvers' names and help from ``dtmc``."""
    import dtmc
    add_search_flags(group, defaults=defaults, words=words, fields=fields, solver_choices=dtmc.SOLVERS,
                     solver_help=dtmc.solver_help("auto"))


def optimize_defaults() -> dict:
    """tr-optimize's own defaults of the search options (the other fields keep the dataclass's)."""
    import dtmc
    return {"tol": dtmc.DEFAULT_TOL, "max_gap": DEFAULT_MAX_GAP, "max_evaluations": DEFAULT_MAX_EVALUATIONS,
            "max_hours": DEFAULT_MAX_HOURS}


def _add_simulator_args(s) -> None:
    """The simulator's flags (--method simulate or auto); each help opens with the mode it applies to, written
    here once.  Under --method exact they are refused (_check_numbers, _refuse_dropped)."""
    def simulate(flag: str, text: str, when: str = "simulate", **kw) -> None:
        s.add_argument(flag, help=f"{when}: {text}", **kw)

    simulate("--trace", "drive routing by a recorded routing trace (non-geometric runs) instead of P",
             metavar="FILE.jsonl")
    simulate("--sim-budget-s", "wall-clock budget per N for the threshold search, seconds (default %(default)g)",
             type=float, default=60.0, metavar="S")
    simulate("--sim-steps", "request-steps measured per run (default %(default)s)", when="simulate with --B",
             type=int, default=2_000_000, metavar="STEPS")
    simulate("--jitter", "coefficient of variation of a log-normal factor on every step latency (default 0)",
             type=float, default=0.0, metavar="CV")
    simulate("--seed", "random seed (default 0)", type=int, default=0)

def _add_search_args(p) -> None:
    import dtmc

    s = p.add_argument_group("search")
    s.add_argument("--N", nargs="+", metavar="N", help="concurrency: integers or ranges, e.g. 1-16 32 "
                   f"(default {' '.join(map(str, DEFAULT_NS))})")
    add_list_arg(s, "--B", convert=int, what="an integer", metavar="B", help="evaluate exactly this threshold "
                 "vector instead of searching, one integer per model, e.g. 1 5")
    s.add_argument("--method", choices=("exact", "simulate", "auto"), default="exact",
                   help="exact: the Markov chain (default); simulate: the per-request event simulator (95%% "
                   "intervals, statistical ties reported); auto: exact when the chain fits under --max-states "
                   "(default 1,000,000 for auto so the decision is quick), the simulator otherwise")
    _add_simulator_args(s)
    from tr_model.tuning.launch_policy import POLICY_CLASSES, POLICY_CLASSES_HELP
    s.add_argument("--policy", choices=POLICY_CLASSES + ("optimal",), help="also search this compact "
                   "state-dependent launch policy class at each N, from B*(N) (steepest ascent, exact chain "
                   "values): " + POLICY_CLASSES_HELP + ". optimal: the optimal launch policy (value iteration on the all-policy decision process, its "
                   "exact throughput, the bound and the proven gap; the table in --format json; not written to "
                   "--thresholds). Prints the policy's throughput and gain over B*")
    add_search_options(s, defaults=optimize_defaults(), words={
        "max_states": f"{dtmc.DEFAULT_MAX_STATES:,}, about 8 GiB at ~10 transitions per state: fits comfortably in "
                      "24 GB; 1,000,000 with --method auto, so the decision is quick"})
    s.add_argument("--search-budget-s", type=float, metavar="S", help="exact search: wall-clock budget per N, "
                   "seconds; a search still running then stops and answers certified, with the gap its proven "
                   "bounds leave over the vectors it did not reach (default: none, the search runs to its "
                   "certificate)")
    s.add_argument("--workers", default="auto", metavar="K", help="local worker processes for the search "
                   "(default auto: the machine's cores when the sweep has more than 200 chains to evaluate, "
                   "else 1; results are identical for any K)")
    s.add_argument("--dask", metavar="ADDRESS", help="run the evaluations on an existing Dask distributed "
                   "scheduler, e.g. tcp://10.0.0.5:8786 (needs the 'dask' extra)")
    s.add_argument("--cache-dir", metavar="DIR", help="result cache folder: one entry per solved chain, reused "
                   "for the same inputs (default $TR_MODEL_CACHE_DIR or ~/.cache/tr-model/evaluations)")
    s.add_argument("--no-cache", action="store_true", help="neither read nor write the result cache")


# ------------------------------------------------------------------------------------------------ validate


@dataclass
class Plan:
    """Everything :func:`compute` needs, checked."""

    system: System
    Ns: IntRanges
    B: tuple[int, ...] | None
    method: str
    search: dict                   # passed to the searches: search, max_gap, max_evaluations
    workers: int
    kw: dict                       # passed to evaluate / optimize: solver, tol, max_states, round_to_grid, cache
    sim: dict                      # simulator: seed, jitter, trace, budget_s, steps
    roundings: list = field(default_factory=list)
    policy: str | None = None
    thresholds: str | None = None
    all: bool = False
    check_delta: bool = False
    dask: str | None = None
    estimate_s: float | None = None  # the sweep's estimated one-core seconds (a search), None for --B


def _exhaustive_count(M: int, Ns: IntRanges) -> int:
    """Feasible vectors over the sweep, in closed form: sum over N of C(N - 1 + M, M).

    sum_{N=a}^{b} C(N - 1 + M, M) = C(b + M, M + 1) - C(a - 1 + M, M + 1) (hockey-stick identity), so
    ``--N 1-1000000000`` is counted without a loop.
    """
    return sum(math.comb(b + M, M + 1) - math.comb(a - 1 + M, M + 1) for a, b in Ns.spans)


def _auto_spans(M: int, Ns: IntRanges) -> list[tuple[str, list[tuple[int, int]]]]:
    """The searches ``--search auto`` will run over the sweep, each with its spans of N
    (:func:`tr_core.search_rule.resolve_auto`, by the closed-form count of each N's feasible set)."""
    n_ex, n_pr = auto_n_limits(M)
    out = []
    for name, lo, hi in (("exhaustive", 1, n_ex), ("pruned", n_ex + 1, n_pr), ("certified", n_pr + 1, None)):
        spans = [(max(a, lo), b if hi is None else min(b, hi)) for a, b in Ns.spans]
        spans = [(a, b) for a, b in spans if a <= b]
        if spans:
            out.append((name, spans))
    return out


def _sweep_evaluations(M: int, Ns: IntRanges, B, method: str, search: str) -> int:
    """Chains (or simulations) a sweep is known to need before it starts: every feasible B where the search
    is exhaustive (``auto`` included, for the N it searches exhaustively; the simulator's search ranks every
    feasible B), at least one per N otherwise (the bounded searches count their own as they go)."""
    if B is not None:
        return len(Ns)
    if method == "simulate":  # the simulator's search ranks every feasible B at least once
        return _exhaustive_count(M, Ns)
    if search == "exhaustive":
        return _exhaustive_count(M, Ns)
    if search == "auto":
        total = 0
        for name, spans in _auto_spans(M, Ns):
            part = IntRanges(spans)
            total += _exhaustive_count(M, part) if name == "exhaustive" else len(part)
        return total
    return len(Ns)


def _auto_note(M: int, Ns: IntRanges) -> str:
    """What ``--search auto`` does on this sweep, in one line."""
    def span_text(spans):
        return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
    parts = [f"{'pruned (exact)' if name == 'pruned' else name} for N = {span_text(spans)}"
             for name, spans in _auto_spans(M, Ns)]
    return "search auto: " + "; ".join(parts)


def _check_numbers(a) -> None:
    if a.trace and a.method == "exact":
        raise SpecError("--trace drives the simulator: use it with --method simulate or auto")
    check_number(a.sim_budget_s, "--sim-budget-s", gt=0, unit=" seconds")
    check_number(a.search_budget_s, "--search-budget-s", gt=0, unit=" seconds")
    check_number(a.sim_steps, "--sim-steps", ge=1000)
    check_number(a.jitter, "--jitter", ge=0, lt=10)
    if a.plot:
        from tr_model.plots import check_plot_path
        check_plot_path(a.plot)  # a bad extension or folder fails before any work
        if a.B is not None:
            raise SpecError("--plot draws a search over B; drop --B")


def _check_hours(a, M: int, Ns: IntRanges) -> float | None:
    """The sweep's estimated one-core seconds; refused (exit code 3, with the estimate) above --max-hours.

    Exact searches: :func:`optimizer.cost.check_sweep_seconds`.  The simulator's search is bounded by
    ``--sim-budget-s`` per N; ``--method auto`` runs whichever is cheaper for an N (the exact chain when it
    fits), so the smaller of the two counts.  One vector per N (``--B``) is bounded by ``--max-states``.
    """
    if a.B is not None:
        return None
    from optimizer.cost import check_sweep_seconds, describe_seconds, sweep_seconds
    from tr_core.errors import WorkTooLarge
    sim_s = a.sim_budget_s * len(Ns)
    if a.method == "exact" and a.search_budget_s is not None:
        # the budget bounds each N's search (the one chain or box under way when it runs out still ends)
        est = min(sweep_seconds(M, Ns.spans, a.search), a.search_budget_s * len(Ns))
        if est > a.max_hours * 3600.0:
            raise WorkTooLarge(f"--N: {len(Ns):,} values of N at --search-budget-s {a.search_budget_s:g} each is "
                               f"{describe_seconds(est)}, more than --max-hours = {a.max_hours:g}; sweep fewer "
                               f"values of N, lower --search-budget-s, or raise --max-hours")
        return est
    if a.method == "exact":
        return check_sweep_seconds(M, Ns.spans, a.search, a.max_hours, what=f"--N up to {Ns.max:,}",
                                   limit_name="--max-hours", advice="lower N, sweep fewer values of N (e.g. 64 128 "
                                   "256), use --method simulate, or raise --max-hours")
    est = sim_s if a.method == "simulate" else min(sim_s, sweep_seconds(M, Ns.spans, a.search))
    if est > a.max_hours * 3600.0:
        raise WorkTooLarge(f"--N: {len(Ns):,} values of N at --sim-budget-s {a.sim_budget_s:g} each is "
                           f"{describe_seconds(est)}, more than --max-hours = {a.max_hours:g}; sweep fewer values "
                           f"of N, lower --sim-budget-s, or raise --max-hours")
    return est


def _refuse_dropped(a) -> None:
    """Flags the chosen mode would ignore are refused, naming the flag typed (never silently dropped)."""
    from tr_core.cli import refuse_given
    if a.no_cache:
        refuse_given(a, ["cache_dir"], "has no effect with --no-cache (give one of them)")
    if a.B is not None:
        refuse_given(a, ["search", "max_gap", "all", "workers", "dask", "sim_budget_s", "search_budget_s",
                         "max_hours"],
                     "applies to a search over B; --B evaluates one vector (drop one of them)")
    else:
        refuse_given(a, ["sim_steps"], "applies to --method simulate with --B (one vector); a search uses "
                     "--sim-budget-s")
    if a.method == "exact":
        refuse_given(a, ["jitter", "seed", "sim_budget_s", "sim_steps"],
                     "applies to the simulator (--method simulate or auto), not --method exact")
    if a.method == "simulate":
        refuse_given(a, ["solver", "tol", "max_states", "search", "max_gap", "workers", "dask", "check_delta",
                         "search_budget_s"],
                     "applies to the exact chain, not --method simulate")
        refuse_given(a, ["delta_ms", "delta_rtol", "round"], "applies to the exact chain's time grid; --method "
                     "simulate runs in continuous time (drop one of them)")
    if a.method != "exact":
        refuse_given(a, ["all", "workers", "dask"], f"applies to the exact search (--method exact), not --method "
                     f"{a.method} (which solves one N at a time and keeps no table)")
    if a.search in ("exhaustive", "local"):
        refuse_given(a, ["search_budget_s"], f"applies to the pruned, certified and auto searches, not --search "
                     f"{a.search} (drop one of them)")
    if a.dask:
        refuse_given(a, ["workers"], "has no effect with --dask (the scheduler's workers run the evaluations)")
    if a.B is not None:
        refuse_given(a, ["policy", "thresholds"], "searches from B*(N); --B evaluates one vector (drop one of them)")
    if a.method != "exact":
        refuse_given(a, ["policy", "thresholds"], "needs the exact chain (--method exact)")
    if a.policy == "optimal" and a.thresholds:
        raise SpecError("--thresholds carries a compact policy class (--policy busy, residual, window or ratio); the optimal "
                        "table is printed (--format json), not written to a thresholds file")


def _parse_workers(value: str, total: int) -> int:
    from tr_core.cli import default_workers, parse_int_or_word
    k = parse_int_or_word(value, "--workers", ("auto",))
    if k == "auto":
        return default_workers() if total > 200 else 1
    return k


def _grid_roundings(system: System, Ns: IntRanges, method: str) -> list[dict]:
    """Put every latency on the grid once (the simulator runs in continuous time and needs none).

    Constant latencies do not depend on N; batch-size-dependent ones are checked up to the largest N,
    which covers every batch size any N of the sweep can form.
    """
    if method == "simulate":
        return []
    spec = system.spec
    _, roundings = spec.quanta_table(Ns.max if spec.batch_dependent else 1, round_to_grid=system.round_to_grid)
    if spec.has_corun:
        n = Ns.max if spec._corun_batch_dependent() else 1
        _, co = spec.corun_quanta_table(n, round_to_grid=system.round_to_grid)
        roundings = roundings + co
    return roundings


def validate(a) -> Plan:
    """Check every flag and build the plan; nothing is computed yet."""
    Ns = parse_int_list(a.N, "--N") if a.N else IntRanges((n, n) for n in DEFAULT_NS)
    _refuse_dropped(a)
    opts = search_options_from_args(a, defaults=optimize_defaults())  # every search option checked once
    _check_numbers(a)
    system = build_system(a, Ns.max)
    M = system.spec.M
    if a.B is not None:
        from tr_core.feasibility import check_thresholds
        check_thresholds(a.B, Ns.min, M, name="--B")
    from tr_core.feasibility import check_count
    total = _sweep_evaluations(M, Ns, a.B, a.method, opts.search)
    check_count(total, opts.max_evaluations, M=M, what="chains" if a.method != "simulate" else "simulations")
    if a.method == "exact":
        from optimizer.evaluate import check_representable
        check_representable(system.spec, Ns.max, name="--N")
    estimate_s = _check_hours(a, M, Ns)  # after the hard limits: what cannot be done is said as such
    max_states = opts.max_states
    if max_states is None:
        import dtmc
        max_states = 1_000_000 if a.method == "auto" else dtmc.DEFAULT_MAX_STATES
    kw = dict(solver=opts.solver, tol=opts.tol, max_states=max_states, round_to_grid=system.round_to_grid)
    if not a.no_cache:
        from optimizer.cache import default_cache_dir
        kw["cache"] = a.cache_dir or default_cache_dir()
    sim = dict(seed=a.seed, jitter=a.jitter, trace=a.trace, budget_s=a.sim_budget_s, steps=a.sim_steps)
    search = dict(search=opts.search, max_evaluations=opts.max_evaluations)
    if a.search_budget_s is not None and a.B is None and a.method != "simulate":
        search["time_budget_s"] = float(a.search_budget_s)
        if search["search"] == "auto":
            # what auto runs under a time budget at every N (tr_core.search_rule.resolve_auto): said as such in
            # the notes and the thresholds file
            search["search"] = "certified"
    if opts.gap is not None:  # the searches that take a gap (the others refuse one)
        search["max_gap"] = opts.gap
    if a.thresholds:
        from tr_core.cli import check_out_path
        check_out_path(a.thresholds, "--thresholds")
        if Ns.min != 1 or len(Ns) != Ns.max:
            raise SpecError(f"--thresholds writes rows N = 1..K without gaps: give --N 1-{Ns.max}")
    return Plan(system=system, Ns=Ns, B=tuple(a.B) if a.B is not None else None, method=a.method,
                policy=a.policy, thresholds=a.thresholds,
                search=search, workers=_parse_workers(a.workers, _exhaustive_count(M, Ns)), kw=kw, sim=sim,
                roundings=_grid_roundings(system, Ns, a.method), all=a.all, check_delta=a.check_delta,
                dask=a.dask, estimate_s=estimate_s)


def estimate_note(plan: Plan) -> str | None:
    """The sweep's size, said up front when it is long (estimated above ``LONG_SWEEP_S``); None otherwise."""
    if plan.estimate_s is None or plan.estimate_s <= LONG_SWEEP_S:
        return None
    from optimizer.cost import describe_seconds
    how = "each N is reported as it completes" if _long_sweep(plan) else "a progress bar shows on a terminal"
    return (f"this sweep is estimated at {describe_seconds(plan.estimate_s)} of one core (at the rates measured "
            f"for two models); {how}")


def _rounding_notes(roundings: list[dict], M: int) -> list[str]:
    if len(roundings) <= 2 * M:
        return [f"model {r['model']} {'co-running ' if r.get('corun') else ''}latency {r['step_latency_ms']:g} ms "
                f"rounded to {r['rounded_ms']:.6g} ms (relative error {r['relative_error']:+.3g})" for r in roundings]
    out = []
    for i in range(M):
        mine = [r for r in roundings if r["model"] == i]
        if mine:
            worst = max(mine, key=lambda r: abs(r["relative_error"]))
            out.append(f"model {i}: {len(mine)} batch-size latencies rounded to the grid, largest relative "
                       f"error {worst['relative_error']:+.3g} at batch size {worst['batch_size']}")
    return out


# ------------------------------------------------------------------------------------------------- compute


def _row(d: dict, method: str) -> dict:
    """One result row in the common schema (RESULT_KEYS first), method-specific keys after."""
    base = {k: d.get(k) for k in RESULT_KEYS}
    base["method"] = method
    if method == "exact":
        base["ci95_tok_s"] = 0.0
    return {**base, **{k: v for k, v in d.items() if k not in base}}


def _dask_client(address: str):
    try:
        from distributed import Client
    except ImportError:
        raise SpecError("--dask needs the 'dask' extra: pip install 'tokenrouter-model[dask]'") from None
    try:
        return Client(address, timeout=10)
    except (OSError, TimeoutError) as e:
        raise SpecError(f"--dask: cannot connect to the scheduler at {address!r}: {e}") from None


def _compute_exact_search(plan: Plan, doc: dict, progress, on_result=None) -> list:
    from tr_model.api import optimize_many

    client = _dask_client(plan.dask) if plan.dask else None
    try:
        opts = optimize_many(plan.system.spec, plan.Ns, workers=plan.workers, executor=client,
                             progress=progress, on_result=on_result, **plan.search, **plan.kw)
    finally:
        if client is not None:
            client.close()
    doc["results"] = [_row({**o.to_dict(), **_accuracy_of(o)}, "exact") for o in opts]
    if plan.all:
        doc["table"] = [e.to_dict() for o in opts for e in o.evaluations]
    return list(opts)


def _compute_exact_vectors(plan: Plan, doc: dict) -> list:
    from tr_model.api import evaluate

    doc["results"] = [_row(evaluate(plan.system.spec, N, plan.B, **plan.kw).to_dict(), "exact") for N in plan.Ns]
    return []


def _accuracy_of(opt) -> dict:
    """Accuracy of a search result: B*'s bound, the largest over the sweep, all bounded?  And what
    a loose bound on a rejected chain means for B*: ``loose_rejected`` counts the evaluated but
    rejected chains whose bound is above the accuracy tolerance, ``b_star_rivals`` lists those among them
    whose throughput, raised by its bound, reaches B*'s lowered by its own (they could be the true best);
    ``b_star_stands``: B*'s own bound is within tolerance and no rival exists.  The search has already
    re-solved every rival with more effort (:func:`optimizer.optimum.tighten_rivals`): a rival listed here
    is one that effort did not exclude."""
    from optimizer.optimum import b_star_rivals

    best = opt.best
    bounds = [e.throughput_error_bound for e in opt.evaluations] or [best.throughput_error_bound]
    worst = max(bounds)
    loose = [e for e in opt.evaluations if tuple(e.B) != tuple(best.B) and not e.accuracy_ok]
    rivals = [list(e.B) for e in b_star_rivals(opt.evaluations, best)]
    return {"throughput_error_bound": best.to_dict()["throughput_error_bound"],
            "max_throughput_error_bound": worst if math.isfinite(worst) else None,
            "accuracy_ok": all(e.accuracy_ok for e in opt.evaluations) and best.accuracy_ok,
            "loose_rejected": len(loose), "b_star_rivals": rivals,
            "b_star_stands": bool(best.accuracy_ok and not rivals)}


def _ns(rows: list) -> str:
    return ", ".join(str(r["N"]) for r in rows[:5]) + (" ..." if len(rows) > 5 else "")


def _warn_inaccurate(doc: dict) -> None:
    """One ``warning:`` line on stderr when some result's throughput error is not bounded within 1e-6, saying
    what it means for B*: B*'s own value is loose, or only rejected chains are (B* stands when their bounds
    keep them below B*'s throughput, and is not proven when one could reach it)."""
    import dtmc

    bad = [r for r in doc["results"] if r.get("accuracy_ok") is False]
    if not bad:
        return
    tol = f"{dtmc.ACCURACY_TOL:g}"
    own = [r for r in bad if "b_star_stands" not in r or not (r["b_star_stands"] or r["b_star_rivals"])]
    stands = [r for r in bad if r.get("b_star_stands")]
    open_ = [r for r in bad if r not in own and r not in stands]
    parts = []
    if own:
        parts.append(f"at N = {_ns(own)} the throughput of B* itself is not bounded within {tol} relative")
    if stands:
        parts.append(f"at N = {_ns(stands)} only evaluated-but-rejected chains are (their bounds still keep them "
                     f"below B*'s throughput: B* and its throughput stand)")
    if open_:
        n_riv = sum(len(r["b_star_rivals"]) for r in open_)
        parts.append(f"at N = {_ns(open_)} {n_riv} evaluated-but-rejected chain(s) could, within their bounds, "
                     f"reach B*'s throughput (e.g. B = {_b(open_[0]['b_star_rivals'][0])}), even re-solved with "
                     f"more effort: B* is not proven among them (try --solver gth or a smaller --tol)")
    print(f"warning: the throughput error of {len(bad)} result(s) is not bounded within {tol} relative: "
          + "; ".join(parts) + " (see throughput_error_bound, b_star_rivals in --format json)", file=sys.stderr)


def _warn_loose_gap(doc: dict, max_gap: float, budget_s: float | None = None) -> None:
    """One ``warning:`` line on stderr when a certified B* is proven only within more than ``max_gap``: some
    vectors were left to a bound (their chains, or their boxes' processes, over the state budget, or a search
    that reached ``budget_s``, ``--search-budget-s``), and that bound is looser than the gap asked for."""
    loose = [r for r in doc["results"] if r.get("certificate") == "certified" and r.get("gap") is not None
             and not r["gap"] <= max_gap * (1 + 1e-9)]
    if not loose:
        return
    worst = max(loose, key=lambda r: r["gap"])
    left = sum(int(r.get("unresolved") or 0) for r in loose)
    why = ("their chains or their boxes' processes being too large to build within the state caps (a coarser "
           "--delta-ms makes them smaller)")
    if budget_s is not None and any(r.get("seconds", 0.0) >= budget_s for r in loose):
        # a search that reached its budget stopped there; what it left may also have been over a cap
        why = (f"the search at {'that N' if len(loose) == 1 else 'those N'} reached --search-budget-s "
               f"{budget_s:g} before it could evaluate or prune them (a larger budget tightens the gap)")
    print(f"warning: at N = {_ns(loose)} B* is proven only within a gap of up to {100 * worst['gap']:.3g} % "
          f"(N = {worst['N']}), above --max-gap {100 * max_gap:g} %: {left:,} threshold vector(s) were left to a "
          f"bound, {why}", file=sys.stderr)


class _RowReporter:
    """One stderr line per N of a sweep as soon as its B* is final (the table comes at the end)."""

    def __init__(self, total: int):
        self.total, self.done = total, 0

    def __call__(self, o) -> None:
        self.done += 1
        how = {"exhaustive": "exhaustive", "pruned-exact": "pruned, exact"}.get(o.certificate, o.certificate)
        gap = "" if o.exact else f", gap {o.gap:.2%}"
        sys.stderr.write(f"N = {o.N}: B* = {_b(o.best_B)}, {o.throughput_tok_s:.2f} tok/s ({how}{gap}, "
                         f"{o.evaluated} chain{'' if o.evaluated == 1 else 's'}, {o.seconds:.2f} s) "
                         f"[{self.done}/{self.total}]\n")
        sys.stderr.flush()


def _long_sweep(plan: Plan) -> bool:
    """A sweep worth reporting N by N: more than ``LONG_SWEEP_CHAINS`` chains known up front, or a bounded
    search at some N (decided from the flags alone, so the output does not depend on the machine's speed)."""
    if len(plan.Ns) < 2 or plan.B is not None or plan.method != "exact":
        return False
    spec = plan.system.spec
    search = plan.search["search"]
    if search == "auto" and [n for n, _ in _auto_spans(spec.M, plan.Ns)] != ["exhaustive"]:
        return True
    return search != "auto" and search != "exhaustive" or \
        _sweep_evaluations(spec.M, plan.Ns, None, "exact", search) > LONG_SWEEP_CHAINS


def _meaning_notes(plan: Plan) -> list[str]:
    """The system's notes that a reader of the numbers needs: a model that runs no batch in the long run (its
    admission latency is null), a system that commits no token."""
    return [line for line in plan.system.notes() if not line.startswith("--delta-ms auto")]


def compute(plan: Plan, progress=None, on_result=None) -> tuple[dict, list]:
    """The result document, and the optimum objects found (for plotting).  ``on_result(optimum)``: called
    for each N of an exact search as soon as it is final."""
    spec = plan.system.spec
    doc: dict = {"schema_version": OUTPUT_SCHEMA_VERSION, "spec": spec_to_dict(spec), "results": []}
    if plan.system.delta_auto:
        doc["delta_auto"] = dict(plan.system.delta_auto)
    if plan.roundings:
        doc["roundings"] = plan.roundings
    notes = _meaning_notes(plan)
    if notes:  # what makes a null or a tie in the results meaningful (an unreached model, no tokens committed)
        doc["notes"] = notes
    if plan.method != "exact":
        found = _compute_simulated(plan, doc)
    elif plan.B is not None:
        found = _compute_exact_vectors(plan, doc)
    else:
        found = _compute_exact_search(plan, doc, progress, on_result)
        if plan.policy:
            _compute_policies(plan, doc)
    if plan.check_delta:
        doc["delta_check"] = _check_delta(plan, doc["results"])
    return doc, found


def _compute_policies(plan: Plan, doc: dict) -> None:
    """--policy: the class searched at each N from B*(N); ``row["policy"]`` (exit 3 when the decision process
    exceeds its state budget)."""
    from optimizer.policy import PolicyTooLarge
    from tr_model.tuning.launch_policy import class_policy
    from tr_model.thresholds import POLICY_COLUMNS
    spec = plan.system.spec
    if plan.policy == "optimal":
        return _compute_optimal(plan, doc)
    for r in doc["results"]:
        try:
            res = class_policy(spec, r["N"], plan.policy, r["B"], round_to_grid=plan.system.round_to_grid)
        except PolicyTooLarge as e:
            raise StateSpaceTooLarge(f"--policy {plan.policy} at N = {r['N']}: {e}") from None
        r["policy"] = {"class": plan.policy, "columns": list(POLICY_COLUMNS[plan.policy]),
                       "thresholds": [list(x) for x in res.params], "throughput_tok_s": res.throughput_tok_s,
                       "throughput_error_bound": res.throughput_error_bound,
                       "gain_vs_b_star": res.throughput_tok_s / r["throughput_tok_s"] - 1.0,
                       "evaluated": res.evaluated, "chain_states": res.chain_states, "seconds": res.seconds,
                       "certificate": "local (steepest ascent from B*: exact value, not proven optimal in the class)"}


def _compute_optimal(plan: Plan, doc: dict) -> None:
    """--policy optimal: ``optimizer.policy.optimal_policy`` at each N; ``row["policy"]`` with the table."""
    from optimizer.policy import PolicyTooLarge, optimal_policy
    spec = plan.system.spec
    for r in doc["results"]:
        try:
            res = optimal_policy(spec, r["N"], round_to_grid=plan.system.round_to_grid)
        except PolicyTooLarge as e:
            raise StateSpaceTooLarge(f"--policy optimal at N = {r['N']}: {e}") from None
        r["policy"] = {"class": "optimal", "columns": ["table"], "throughput_tok_s": res.throughput_tok_s,
                       "throughput_error_bound": res.throughput_error_bound,
                       "upper_bound_tok_s": res.upper_bound_tok_s, "gap": res.gap,
                       "gain_vs_b_star": res.throughput_tok_s / r["throughput_tok_s"] - 1.0,
                       "process_states": res.process_states, "chain_states": res.chain_states,
                       "empty_batches": res.empty_batches, "rounds": res.rounds, "seconds": res.seconds,
                       "table": res.table.to_json(),
                       "certificate": "optimal within the proven gap to the all-policy bound"}


def _policy_cell(p: dict) -> str:
    if p["class"] == "optimal":
        return f"table of {len(p['table']['entries'])} configurations, gap {p['gap']:.1e}"
    return " ".join("(" + ", ".join("never" if b is None else str(b) for b in x) + ")" for x in p["thresholds"])


def _write_thresholds_file(plan: Plan, found: list, doc_results: list) -> None:
    """--thresholds: the sweep's rows as a thresholds file, by the one writer (tr_model.tuning.autotune.write_sweep)."""
    from tr_model.tuning import autotune
    opts = autotune.solver_options(plan.kw["solver"], plan.kw["tol"], plan.kw["max_states"],
                                   plan.system.round_to_grid, plan.search["search"],
                                   plan.search.get("max_gap", DEFAULT_MAX_GAP),
                                   time_budget_per_n_s=plan.search.get("time_budget_s"), policy=plan.policy)
    autotune.write_sweep(plan.thresholds, plan.system.spec, found, opts, tool="tr-optimize",
                         policy_rows=[r.get("policy") for r in doc_results] if plan.policy else None)


def _compute_simulated(plan: Plan, doc: dict) -> list:
    """--method simulate|auto: per N, the exact chain when allowed and affordable, else the simulator."""
    from tr_model.api import evaluate, optimize

    found: list = []
    sim_kw = None
    for N in plan.Ns:
        if plan.method == "auto" and not plan.sim["trace"]:
            try:
                if plan.B is not None:
                    r = evaluate(plan.system.spec, N, plan.B, **plan.kw).to_dict()
                else:
                    opt = optimize(plan.system.spec, N, **plan.search, **plan.kw)
                    r = opt.to_dict()
                    found.append(opt)
                doc["results"].append(_row({**r, "tie_set": [r["B"]]}, "exact"))
                continue
            except StateSpaceTooLarge:
                pass
        if sim_kw is None:
            sim_kw = _simulator_kwargs(plan)
        doc["results"].append(_simulate_one(plan, N, sim_kw, found))
    return found


def _simulator_kwargs(plan: Plan) -> dict:
    kw = dict(seed=plan.sim["seed"], jitter=plan.sim["jitter"])
    if plan.sim["trace"]:
        from simulator import read_trace
        kw["trace"] = read_trace(plan.sim["trace"])
    return kw


def _simulate_one(plan: Plan, N: int, sim_kw: dict, found: list) -> dict:
    import simulator

    spec = plan.system.spec
    if plan.B is not None:
        res = simulator.simulate(spec, N, plan.B, steps=plan.sim["steps"], **sim_kw)
        return _row({"N": N, "B": list(res.B), "throughput_tok_s": res.throughput_tok_s,
                     "ci95_tok_s": res.throughput_ci95_tok_s, "per_request_tok_s": res.per_request_tok_s,
                     "admission_latency_ms": list(res.admission_latency_ms), "mean_waiting": list(res.mean_waiting),
                     "request_steps": res.request_steps, "tie_set": [list(res.B)], "seconds": res.wall_s},
                    "simulate")
    o = simulator.optimize_by_simulation(spec, N, budget_s=plan.sim["budget_s"], **sim_kw)
    found.append(o)
    best = o.ranking.entries[0].result
    return _row({"N": N, "B": list(o.best_B), "throughput_tok_s": o.throughput_tok_s, "ci95_tok_s": o.ci95_tok_s,
                 "eager_throughput_tok_s": o.eager_throughput_tok_s, "eager_ci95_tok_s": o.eager_ci95_tok_s,
                 "gain_vs_eager": 1.0 + o.gain_vs_eager, "gain_ci95": o.gain_ci95,
                 "per_request_tok_s": best.per_request_tok_s, "admission_latency_ms": list(best.admission_latency_ms),
                 "tie_set": [list(b) for b in o.tie_set], "ranking": o.ranking.to_rows(), "evaluated": o.evaluated,
                 "simulations": o.simulations, "request_steps": o.request_steps, "seconds": o.seconds}, "simulate")


def _check_delta(plan: Plan, results: list) -> list:
    """Re-solve at delta/2 and report the change in throughput and B*."""
    from tr_model.api import evaluate, optimize

    half = plan.system.spec.with_delta(plan.system.spec.delta_ms / 2)
    kw = dict(plan.kw, round_to_grid=True)
    out = []
    for r in results:
        N = r["N"]
        rec = {"N": N, "throughput_tok_s": r["throughput_tok_s"], "B": r["B"], "half_delta_ms": half.delta_ms,
               "half_delta_throughput_tok_s": None, "half_delta_B": None, "relative_change": None,
               "B_moved": None, "note": ""}
        try:
            if plan.B is not None:
                ev = evaluate(half, N, plan.B, **kw)
                thr, B = ev.throughput_tok_s, list(ev.B)
            else:
                o = optimize(half, N, **plan.search, **kw)
                thr, B = o.throughput_tok_s, list(o.best_B)
        except StateSpaceTooLarge:
            rec["note"] = "not affordable (exceeds --max-states)"
            out.append(rec)
            continue
        rec.update(half_delta_throughput_tok_s=thr, half_delta_B=B,
                   relative_change=(thr - r["throughput_tok_s"]) / r["throughput_tok_s"], B_moved=(B != r["B"]))
        out.append(rec)
    return out


# -------------------------------------------------------------------------------------------------- render


def _fmt_lat(x) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}"


def _b(v) -> str:
    return " ".join(map(str, v))


def _bound(x) -> str:
    """A relative throughput error bound; 'inf' when none could be proven (accuracy_ok is then false)."""
    return "inf" if x is None or not math.isfinite(x) else f"{x:.0e}"


def _seconds(x: float, cached: bool) -> str:
    # a cache hit's time is the lookup, not the computation: say so
    return f"{x:.3f} (cache)" if cached else f"{x:.3f}"


def _num(x, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _exact_vector_table(results: list) -> tuple[list, list]:
    headers = ["N", "B", "tok/s", "tok/s/req", "admission_ms", "states", "transitions", "residual", "err_bound",
               "seconds"]
    rows = [[r["N"], _b(r["B"]), f"{r['throughput_tok_s']:.2f}", f"{r['per_request_tok_s']:.2f}",
             " ".join(_fmt_lat(x) for x in r["admission_latency_ms"]), r["states"], r["transitions"],
             f"{r['residual']:.1e}", _bound(r.get("throughput_error_bound")),
             _seconds(r["seconds"], bool(r.get("cached")))] for r in results]
    return headers, rows


def _eager_cell(r: dict) -> str:
    """The eager baseline: exact, simulated (with its 95 % interval, marked) or unknown."""
    x = r.get("eager_throughput_tok_s")
    if x is None:
        return "-"
    if r.get("eager_method") == "simulated":
        return f"{x:.2f} +- {r.get('eager_ci95_tok_s') or 0.0:.2f} (sim)"
    return f"{x:.2f}"


def _certificate_cell(r: dict) -> str:
    """How B* was proven: ``exhaustive``, ``exact`` (pruned by proven bounds), or the proven relative gap to
    the best bound over every vector not evaluated (``certified`` and ``local`` searches)."""
    cert = r.get("certificate")
    if cert in (None, "exhaustive"):
        return "exhaustive" if cert else "-"
    if cert == "pruned-exact":
        return "exact"
    gap = r.get("gap")
    word = "gap" if cert == "certified" else cert
    return f"{word} {100 * gap:.3g} %" if gap is not None and math.isfinite(gap) else f"{word}, no bound"


def _exact_search_table(results: list) -> tuple[list, list]:
    headers = ["N", "B*", "tok/s", "eager tok/s", "gain", "tok/s/req", "admission_ms", "states", "evaluated",
               "certificate", "residual", "err_bound", "seconds"]
    rows = [[r["N"], _b(r["B"]), f"{r['throughput_tok_s']:.2f}", _eager_cell(r),
             format_gain(r["gain_vs_eager"]), f"{r['per_request_tok_s']:.2f}",
             " ".join(_fmt_lat(x) for x in r["admission_latency_ms"]), r["states"], r["evaluated"],
             _certificate_cell(r),
             f"{r['max_residual']:.1e}", _bound(r.get("max_throughput_error_bound", r.get("throughput_error_bound"))),
             _seconds(r["seconds"], bool(r["evaluated"]) and r.get("cached") == r["evaluated"])] for r in results]
    return headers, rows


def _mixed_table(results: list) -> tuple[list, list]:
    rows = []
    for r in results:
        ci = r.get("ci95_tok_s") or 0.0
        thr = f"{r['throughput_tok_s']:.2f}" + (f" +- {ci:.2f}" if r["method"] != "exact" else "")
        tied = [_b(t) for t in (r.get("tie_set") or []) if list(t) != list(r["B"])]
        rows.append([r["N"], _b(r["B"]), thr, _num(r.get("eager_throughput_tok_s")),
                     format_gain(r.get("gain_vs_eager")), r["method"], ", ".join(tied) if tied else "-",
                     f"{r['seconds']:.2f}"])
    return ["N", "B*", "tok/s (95% CI)", "eager tok/s", "gain", "method", "statistically tied with", "seconds"], rows


def _delta_check_table(doc: dict) -> str:
    spec = doc["spec"]
    head = f"\ndelta check (delta = {spec['delta_ms']:g} ms vs {spec['delta_ms'] / 2:g} ms):\n"
    rows = [[c["N"], f"{c['throughput_tok_s']:.2f}", _num(c["half_delta_throughput_tok_s"]),
             _num(c["relative_change"], "+.2e"), _b(c["B"]), "-" if c["half_delta_B"] is None else _b(c["half_delta_B"]),
             c["note"] or ("yes" if c["B_moved"] else "no")] for c in doc["delta_check"]]
    return head + format_table(["N", "tok/s", "tok/s at delta/2", "relative change", "B", "B at delta/2",
                                "B* moved"], rows) + "\n"


def _render_table(doc: dict, vectors: bool) -> str:
    spec, results = doc["spec"], doc["results"]
    if any(r["method"] != "exact" for r in results) or any("tie_set" in r for r in results):
        headers, rows = _mixed_table(results)
    else:
        headers, rows = (_exact_vector_table if vectors else _exact_search_table)(results)
    if any("policy" in r for r in results):
        p0 = next(r["policy"] for r in results if "policy" in r)
        headers = headers + [f"policy {p0['class']} ({', '.join(p0['columns'])})", "policy tok/s", "vs B*",
                             "policy s"]
        for r, row in zip(results, rows):
            p = r.get("policy")
            row += ["-"] * 4 if p is None else [_policy_cell(p), f"{p['throughput_tok_s']:.2f}",
                                               f"{100 * p['gain_vs_b_star']:+.2f} %", f"{p['seconds']:.2f}"]
    Ls = ", ".join(f"{x:g}" for x in spec["step_latency_ms"])
    co = ""
    if spec.get("corun_latency") and any(c is not None for c in spec["corun_latency"]):
        co = ", co-running " + "(" + ", ".join(
            "-" if c is None else (f"x{c['slowdown']:g}" if "slowdown" in c else "table")
            for c in spec["corun_latency"]) + ")"
    text = f"system: {spec['name']}, M = {len(spec['step_latency_ms'])}, L = ({Ls}) ms{co}, " \
           f"delta = {spec['delta_ms']:g} ms\n" + format_table(headers, rows) + "\n"
    if "delta_check" in doc:
        text += _delta_check_table(doc)
    if "table" in doc:
        text += "\nevaluated thresholds:\n" + format_table(
            ["N", "B", "tok/s", "states", "transitions", "residual", "seconds"],
            [[t["N"], _b(t["B"]), f"{t['throughput_tok_s']:.2f}", t["states"], t["transitions"],
              f"{t['residual']:.1e}", f"{t['seconds']:.3f}"] for t in doc["table"]]) + "\n"
    return text


def _render_csv(doc: dict) -> str:
    if "table" in doc:
        keys = ["N", "B", "throughput_tok_s", "states", "transitions", "residual", "solver", "seconds"]
        return to_csv(keys, [[_b(t[k]) if k == "B" else t[k] for k in keys] for t in doc["table"]])
    first, results = doc["results"][0], doc["results"]
    keys = [k for k in first if (not isinstance(first[k], (list, dict)) or k == "B")
            and any(r.get(k) is not None for r in results)]  # a column no method fills is left out
    rows = [[_b(r[k]) if isinstance(r.get(k), list) else r.get(k) for k in keys] for r in doc["results"]]
    if "policy" in first:
        keys = keys + ["policy_class", "policy_thresholds", "policy_tok_s", "policy_gain_vs_b_star"]
        for r, row in zip(results, rows):
            p = r["policy"]
            row += [p["class"], _policy_cell(p), p["throughput_tok_s"], p["gain_vs_b_star"]]
    return to_csv(keys, rows)


def _json_text(doc: dict) -> str:
    """``json.dumps(doc, indent=2)``, except that an optimal policy's table (``--policy optimal``: one entry per
    configuration, 238,160 at R2R N = 64) has one entry per line: indented, such a table is 80 MB and takes
    seconds in the pure-Python indenting encoder; the parsed document is the same."""
    tables = [r["policy"]["table"] for r in doc.get("results", ())
              if isinstance(r.get("policy"), dict) and isinstance(r["policy"].get("table"), dict)
              and isinstance(r["policy"]["table"].get("entries"), list)]
    if not tables:
        return json.dumps(doc, indent=2)
    marks, saved = [], []
    for i, t in enumerate(tables):
        marks.append(f"@@policy-table-entries-{i}-{id(t)}@@")
        saved.append(t["entries"])
        t["entries"] = marks[-1]
    try:
        text = json.dumps(doc, indent=2)
    finally:
        for t, e in zip(tables, saved):
            t["entries"] = e
    for m, e in zip(marks, saved):
        body = json.dumps(e, separators=(", ", ": "))
        if e:
            body = "[\n" + body[1:-1].replace("}, {", "},\n{") + "\n]"
        text = text.replace(json.dumps(m), body, 1)
    return text


def render(doc: dict, fmt: str, vectors: bool = False) -> str:
    """The document as text: ``table`` (for people), ``json`` (the document itself) or ``csv`` (one row per
    result, or per evaluated B with ``--all``)."""
    if fmt == "json":
        return _json_text(doc) + "\n"
    if fmt == "csv":
        return _render_csv(doc)
    return _render_table(doc, vectors)


# ---------------------------------------------------------------------------------------------------- main


def main_impl(argv=None) -> int:
    a = build_parser().parse_args(argv)
    fmt = output_format(a)
    if a.out:
        from tr_core.cli import check_out_path
        check_out_path(a.out)  # before any work
    plan = validate(a)
    speak = fmt == "table" and not a.quiet
    for line in plan.system.warnings():
        print(f"warning: {line}", file=sys.stderr)
    if speak:
        for line in plan.system.notes() + _rounding_notes(plan.roundings, plan.system.spec.M):
            note(line)
        if estimate_note(plan):
            note(estimate_note(plan))
    elif not a.quiet:  # json or csv: stdout is the data, the notes that give it its meaning still go to stderr
        for line in _meaning_notes(plan):
            note(line)
    if speak:
        if (plan.search["search"] == "auto" and plan.B is None and plan.method == "exact"
                and [name for name, _ in _auto_spans(plan.system.spec.M, plan.Ns)] != ["exhaustive"]):
            note(_auto_note(plan.system.spec.M, plan.Ns))
    rows = not a.quiet and _long_sweep(plan)
    # a sweep reports each N as it completes; a single N shows a progress bar on a terminal
    progress = Progress("tr-optimize", enabled=(sys.stderr.isatty() and not a.quiet and not rows))
    doc, found = compute(plan, progress, on_result=_RowReporter(len(plan.Ns)) if rows else None)
    _warn_inaccurate(doc)
    if plan.method == "exact" and plan.B is None:
        _warn_loose_gap(doc, plan.search.get("max_gap", DEFAULT_MAX_GAP), plan.search.get("time_budget_s"))
    if plan.thresholds:
        _write_thresholds_file(plan, found, doc["results"])
        if speak:
            note(f"wrote {plan.thresholds} (schema version {3 if plan.policy else 2}, N = 1..{plan.Ns.max})")
    if a.plot:
        from tr_model.plots import plot_throughput
        plot_throughput(found, a.plot)
    emit(render(doc, fmt, vectors=plan.B is not None), a.out)
    return 0


def main(argv=None) -> int:
    return run_cli(main_impl, argv, keep_heap=True)


if __name__ == "__main__":
    sys.exit(main())
