"""The system flags, once: one function adds them to a parser, one builds the spec from them.

Used by ``tr-optimize`` and every ``tr-autotune`` sub-command that describes a system (``run``, ``measure``).
The flags::

    --spec FILE | --algo NAME --p P [--q Q] | --weights W...     routing (M, P, C)
    --L MS...                                                    step latency of each model, ms
    --L-table FILE                                               batch-size-dependent L_i(b) (read once)
    --max-batch CAP...                                           batch cap per model ('none' = no cap)
    --corun-slowdown F... | --corun-L-table FILE                 co-running latency per model (factor >= 1
                                                                 on L_i(b), or measured tables)
    --delta-ms MS|auto [--delta-rtol R] [--round]                the time grid

Every value is validated once, by the spec (:mod:`tr_core.spec`); an error from there is prefixed with
the flag that carried the value (``--L: step_latency_ms[0] must be > 0``).  ``--delta-ms auto`` needs
the largest N, because batch-size-dependent latencies depend on it; it then picks the coarsest grid that
represents every latency within ``--delta-rtol`` and rounds to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tr_core.cli import add_list_arg, flag_name, given, parse_int_or_word, refuse_given
from tr_core.errors import SpecError
from tr_core.spec import DEFAULT_DELTA_MS, PRESETS, SystemSpec, load_spec, preset
from tr_core.units import finite_number

DEFAULT_DELTA_RTOL = 0.01


@dataclass(frozen=True)
class System:
    """The spec the flags describe and how to put it on the time grid."""

    spec: SystemSpec
    round_to_grid: bool
    delta_auto: dict | None = None  # {"delta_ms": ..., "rtol": ...} when --delta-ms auto chose the grid

    def warnings(self) -> list[str]:
        """Lines for stderr after ``warning:``: a co-running table below the solo latency."""
        return self.spec.corun_warnings()

    def notes(self) -> list[str]:
        """Lines for stderr: the grid ``--delta-ms auto`` chose; a system that never commits a token."""
        out = []
        if self.delta_auto:
            out.append(f"--delta-ms auto chose delta = {self.delta_auto['delta_ms']:.6g} ms (every latency "
                       f"within {self.delta_auto['rtol']:g} relative)")
        out.extend(self.spec.routing_notes())
        if self.spec.commits_no_tokens:
            out.append("no step of this system commits a token (every P[i][j] * C[i][j] is 0): the throughput "
                       "is 0 for every B, so every B ties and the gain over eager is undefined")
        return out


def add_system_args(parser, *, title: str = "system (--spec, or a preset: --p/--algo/--weights with --L)",
                    extensions: bool = True):
    """Add the system flags as one argument group; ``extensions`` adds ``--L-table`` and ``--max-batch``."""
    g = parser.add_argument_group(title)
    g.add_argument("--spec", metavar="FILE.json", help="system spec JSON (general M, P, C, L; see docs/formats.md)")
    g.add_argument("--algo", choices=PRESETS, help="routing-algorithm preset (default r2r when --p is given; "
                   "me when --weights is given)")
    g.add_argument("--p", type=float, help="escalation probability per token from model 0 (r2r/citer/co-llm), "
                   "or 0->1 switch probability (r-stitch)")
    g.add_argument("--q", type=float, help="r-stitch: probability per token of switching back 1->0")
    add_list_arg(g, "--weights", metavar="W", help="me: ensemble weights, one per model, sum 1")
    add_list_arg(g, "--L", metavar="MS", help="step latency of each model in ms (one decoding step of a "
                 "batch), e.g. --L 6.0 27.9")
    if extensions:
        g.add_argument("--L-table", metavar="FILE", help="batch-size-dependent step latencies L_i(b): JSON list "
                       "of per-model curves ({batch_size, step_latency_ms} tables, {intercept_ms, per_request_ms} "
                       "affine laws, or null) or CSV with columns model,batch_size,step_latency_ms (ms)")
        add_list_arg(g, "--max-batch", convert=str, metavar="CAP", help="batch cap per model (requests; 'none' "
                     "for no cap); the excess keeps waiting")
        add_list_arg(g, "--corun-slowdown", convert=str, metavar="F", help="co-running slowdown per model "
                     "(dimensionless, >= 1): a batch launched while another model is busy takes F_i * L_i(b) ms "
                     "(docs/model.md, Co-running); 1 for no slowdown")
        g.add_argument("--corun-L-table", metavar="FILE", help="measured co-running step latencies Lco_i(b) "
                       "(ms): JSON list of per-model entries (null, {slowdown: F} or {batch_size, step_latency_ms} "
                       "tables), or CSV with columns model,batch_size,step_latency_ms (as --L-table)")
    g.add_argument("--delta-ms", metavar="MS", help="time quantum in ms, or 'auto' for the coarsest grid that "
                   f"represents every latency within --delta-rtol (default {DEFAULT_DELTA_MS:g}, or the spec's "
                   "delta_ms); every latency must be a multiple of it unless --round")
    g.add_argument("--delta-rtol", type=float, default=DEFAULT_DELTA_RTOL, metavar="R", help="relative rounding "
                   "error allowed by --delta-ms auto (default %(default)g)")
    g.add_argument("--round", action="store_true", help="round latencies to the delta grid and report the error")
    return g


def parse_delta(value, flag: str = "--delta-ms") -> float | str | None:
    """``--delta-ms``: None, ``'auto'`` or a finite number of ms > 0 (``flag``: the spelling the user typed)."""
    if value is None or value == "auto":
        return value
    try:
        delta = float(value)
    except (TypeError, ValueError):
        raise SpecError(f"{flag} must be a number of ms or 'auto', got {value!r}") from None
    if not math.isfinite(delta) or delta <= 0:
        raise SpecError(f"{flag} must be > 0 ms, got {value}")
    return delta


def parse_caps(values, M: int) -> tuple[int | None, ...] | None:
    """``--max-batch``: one integer >= 1 or 'none' per model."""
    if values is None:
        return None
    if len(values) != M:
        raise SpecError(f"--max-batch needs M = {M} values (one per model), got {len(values)}")
    caps: list[int | None] = []
    for v in values:
        c = parse_int_or_word(v, "--max-batch values", ("none", "null", "-"))
        caps.append(None if isinstance(c, str) else c)
    return tuple(caps)


def parse_corun_slowdown(values, M: int) -> tuple[float, ...] | None:
    """``--corun-slowdown``: one finite factor >= 1 per model."""
    if values is None:
        return None
    if len(values) != M:
        raise SpecError(f"--corun-slowdown needs M = {M} values (one per model), got {len(values)}")
    out = []
    for i, v in enumerate(values):
        f = finite_number(v, error=SpecError, unreadable=f"--corun-slowdown: {v!r} (model {i}) is not a number",
                          not_finite=f"--corun-slowdown: the factor of model {i} must be finite, got {v}")
        if f < 1:
            raise SpecError(f"--corun-slowdown: the factor of model {i} must be >= 1 (co-running is not faster "
                            f"than running alone), got {v}")
        out.append(f)
    return tuple(out)


def _flag_error(flag: str, e: SpecError) -> SpecError:
    return SpecError(f"{flag}: {e}")


def _preset_from_args(a, curves, delta: float | None) -> SystemSpec:
    algo = a.algo or ("me" if a.weights else ("r2r" if a.p is not None else None))
    if algo is None:
        raise SpecError("define the system with --p (R2R preset), --algo, --weights or --spec")
    L = a.L
    if not L and curves is not None:
        if any(c is None for c in curves):
            raise SpecError("--L is required for models without a curve in --L-table")
        L = [c.latency_ms(1) for c in curves]
    if not L:
        raise SpecError("--L is required: the step latency of each model in ms, e.g. --L 6.0 27.9")
    if algo != "me" and a.weights:
        raise SpecError(f"--weights applies to --algo me, not {algo}")
    if algo == "me":
        for dest in ("p", "q"):
            if getattr(a, dest, None) is not None:
                flag = flag_name(a, dest, "--" + dest)
                if not a.weights:
                    raise SpecError(f"{flag} applies to the two-model presets (r2r, citer, co-llm, r-stitch), not "
                                    f"--algo me (which routes by --weights)")
                raise SpecError(f"{flag} and --weights both give the routing: {flag} applies to the two-model presets "
                                f"(r2r, citer, co-llm, r-stitch), --weights to the ensemble (me); give one of them")
    if algo in ("r2r", "citer", "co-llm") and a.q is not None:
        raise SpecError(f"--q applies to --algo r-stitch, not {algo}")
    try:
        return preset(algo, L, p=a.p, q=a.q, weights=a.weights, delta_ms=DEFAULT_DELTA_MS if delta is None else delta)
    except SpecError as e:
        if str(e).startswith(("step_latency_ms", "delta_ms")):
            raise _flag_error("--L" if str(e).startswith("step") else flag_name(a, "delta_ms", "--delta-ms"),
                              e) from None
        raise


def _with_corun(a, spec: SystemSpec) -> SystemSpec:
    """Apply ``--corun-slowdown`` or ``--corun-L-table`` (either replaces a spec's ``corun_latency``)."""
    factors = getattr(a, "corun_slowdown", None)
    table = getattr(a, "corun_L_table", None)
    if factors is not None and table:
        raise SpecError("--corun-slowdown and --corun-L-table both give the co-running latencies; use one")
    if factors is not None:
        flag, entries = "--corun-slowdown", list(parse_corun_slowdown(factors, spec.M))
    elif table:
        from tr_core.grid import load_corun_table
        flag, entries = "--corun-L-table", load_corun_table(table, spec.M)
    else:
        return spec
    try:
        return spec.with_corun(entries)
    except SpecError as e:
        raise _flag_error(flag, e) from None


# flag dest -> the spec field it would replace
_OVERRIDES = {"L_table": "latency_curves", "max_batch": "max_batch_size", "corun_slowdown": "corun_latency",
              "corun_L_table": "corun_latency"}


_WHAT = {"latency_curves": "batch-size-dependent latencies", "max_batch_size": "batch caps",
         "corun_latency": "co-running latencies"}


def _refuse_overridden(a, spec: SystemSpec) -> None:
    """A flag that would silently replace a field the spec file sets is refused naming both (``--delta-ms``
    is the exception: it chooses the grid, documented as overriding the spec's ``delta_ms``)."""
    for dest, key in _OVERRIDES.items():
        flag = given(a, dest) or ((getattr(a, dest, None) is not None) and "--" + dest.replace("_", "-"))
        if flag and getattr(spec, key) is not None:
            raise SpecError(f"{flag} and the {key} of --spec {a.spec!r} both give the {_WHAT[key]}: give one of them "
                            f"(drop {flag}, or remove {key} from the file)")


def _models_in(a) -> int:
    if a.spec:
        return -1
    if a.weights:
        return len(a.weights)
    return len(a.L) if a.L else 2


def build_system(a, N_max: int | None = None) -> System:
    """The :class:`System` the parsed flags describe.

    ``N_max`` (the largest concurrency the command will use) is needed by ``--delta-ms auto`` only.
    ``--L-table`` is read once here.
    """
    delta = parse_delta(getattr(a, "delta_ms", None), flag_name(a, "delta_ms", "--delta-ms"))
    if delta != "auto":
        refuse_given(a, ["delta_rtol"], "applies to --delta-ms auto only (it bounds the rounding auto chooses)")
    else:
        refuse_given(a, ["round"], "has no effect with --delta-ms auto (auto always rounds, within --delta-rtol)")
    L_table = getattr(a, "L_table", None)
    if a.spec:
        if a.L or a.p is not None or a.q is not None or a.weights or a.algo:
            raise SpecError("--spec defines the whole system; do not combine it with --L/--p/--q/--weights/--algo")
        spec = load_spec(a.spec)
        _refuse_overridden(a, spec)
        if isinstance(delta, float):
            spec = spec.with_delta(delta)
        curves = None
        if L_table:
            from tr_core.grid import load_latency_table
            curves = load_latency_table(L_table, spec.M)
    else:
        curves = None
        if L_table:
            from tr_core.grid import load_latency_table
            curves = load_latency_table(L_table, _models_in(a))
        spec = _preset_from_args(a, curves, delta if isinstance(delta, float) else None)
    if curves is not None:
        spec = replace(spec, latency_curves=tuple(curves))
    caps = parse_caps(getattr(a, "max_batch", None), spec.M)
    if caps is not None:
        spec = replace(spec, max_batch_size=caps)
    spec = _with_corun(a, spec)
    round_to_grid = bool(getattr(a, "round", False))
    if delta != "auto":
        return System(spec, round_to_grid)
    if N_max is None:
        raise SpecError("--delta-ms auto needs the concurrency N (the grid depends on the batch sizes)")
    from tr_core.grid import coarsest_delta, spec_latencies
    rtol = getattr(a, "delta_rtol", DEFAULT_DELTA_RTOL)
    d = coarsest_delta(spec_latencies(spec, N_max), rtol)
    return System(replace(spec, delta_ms=d), True, {"delta_ms": d, "rtol": rtol})
