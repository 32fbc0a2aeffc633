"""From measured latencies and a routing estimate to a complete system spec.

Latencies enter the spec on the ``delta_ms`` grid of the throughput model: every
measured median is rounded to the nearest positive multiple of ``delta_ms``
(at least one quantum) and the raw figures, the rounded ones and the relative
rounding error are kept in ``provenance.latency``.  Three forms:

* ``constant``: ``L_i`` = median at the smallest profiled batch size (or at
  ``at_batch_size`` when given), the paper's batch-independent model;
* ``table``: ``latency_curves[i] = LatencyCurve('table', batch sizes, medians)``
  (the spec interpolates linearly between profiled sizes and is flat beyond);
  ``step_latency_ms[i]`` is the table's first entry;
* ``affine``: ``a_i + c_i b`` from the profile's least-squares fit (falls back
  to ``table`` when the fit is missing or has a negative slope).

The routing matrices come from :mod:`profiler.routing`; their intervals,
goodness-of-fit tests and request spread go to ``provenance.routing``.

Co-running (``corun_profiles``, from ``tr-profile latency --corun``): one
entry per model, a co-running profile or ``None``; each becomes the table
``corun_latency[i] = {"batch_size": [...], "step_latency_ms": [...]}`` of its
medians on the same grid (``None`` stays null: no co-running cost).  A
co-running profile must time the same model as the solo one (same config
hash) and be timed the same way; a solo profile given as co-running, or the
reverse, is refused.  ``provenance.corun_latency`` keeps the raw medians, the
rounded ones, the other model and its batch size, and the ratio to the solo
median at every batch size profiled both ways; a co-running median below the
solo one is a warning.

Consistency (:func:`check_profiles`).  The spec's ``L_i(b)`` is the time of one
decode step, and the models of one system must be timed the same way, so
profiles that mix CUDA-graph and eager steps, GPU events and CPU wall clock,
or that time extend steps, are refused unless ``allow_mixed``.  A curve is
flagged (a warning, not an error) when its median drops by more than 3% from
one profiled batch size to the next (a batch never costs less than a smaller
one; a drop is noise or a throttled machine), or when a batch size's samples
are noisy: ``std / median > 0.1`` or ``(p90 - min) / median > 0.25``.
"""

from __future__ import annotations

import time
from typing import Sequence

from profiler.latency import LatencyProfile, ProfileError
from profiler.routing import RoutingEstimate, routing_provenance, spec_matrices
from tr_core.quanta import round_to_grid  # noqa: F401  (the grid rule's one home; importable here too)
from tr_core.spec import LatencyCurve, SystemSpec, make_spec

CURVES = ("table", "constant", "affine")
DROP_TOLERANCE = 0.03
NOISE_STD = 0.10
NOISE_SPREAD = 0.25

__all__ = ["CURVES", "round_to_grid", "latency_fields", "corun_fields", "build_system_spec", "check_profiles",
           "curve_warnings"]


def _how(prof: LatencyProfile) -> str:
    return ("CUDA graph" if prof.cuda_graph else "eager") + (" on GPU" if prof.timing == "cuda_events" else
                                                              " on CPU")


def check_profiles(profiles: Sequence[LatencyProfile], *, allow_mixed: bool = False,
                   corun_profiles: Sequence[LatencyProfile | None] = ()) -> list[str]:
    """Refuse profiles that cannot form one decode-latency spec; return the warnings (see the module docstring).

    ``corun_profiles`` (one per model or ``None``) are held to the same rules as the solo ones."""
    warnings: list[str] = []
    problems: list[str] = []
    labelled = [(f"model {i}", p) for i, p in enumerate(profiles)]
    labelled += [(f"model {i} co-running", p) for i, p in enumerate(corun_profiles) if p is not None]
    for label, prof in labelled:
        if prof.mode != "decode":
            what = "latency profile" if "co-running" not in label else "co-running profile"
            problems.append(f"the {what} of {label.replace(' co-running', '')} ({prof.model}) times {prof.mode} "
                            f"steps of {prof.extend_tokens} tokens, but a spec's L_i is a decode step")
    kinds = {_how(p) for _, p in labelled}
    if len(kinds) > 1:
        problems.append("the latency profiles mix " + " and ".join(sorted(kinds)) + " ("
                        + ", ".join(f"{label}: {_how(p)}" for label, p in labelled) + ")")
    if problems:
        if not allow_mixed:
            raise ProfileError(problems[0] + "; profile every model the same way, or pass --allow-mixed")
        warnings.extend(f"{p} (accepted: --allow-mixed)" for p in problems)
    for label, prof in labelled:
        warnings.extend(f"{label} ({prof.model}): {w}" for w in curve_warnings(prof))
    return warnings


def curve_warnings(prof: LatencyProfile) -> list[str]:
    """Non-monotone steps and noisy batch sizes of one profile (empty when the curve looks sound)."""
    out = []
    stats = sorted(prof.batches, key=lambda s: s.batch_size)
    for a, b in zip(stats, stats[1:]):
        if b.median_ms < a.median_ms * (1 - DROP_TOLERANCE):
            out.append(f"latency drops from {a.median_ms:.4g} ms at b = {a.batch_size} to {b.median_ms:.4g} ms at "
                       f"b = {b.batch_size} (a non-monotone curve: noise or a busy machine; profile again with "
                       f"more --steps)")
    for s in stats:
        if s.median_ms > 0 and (s.std_ms / s.median_ms > NOISE_STD or (s.p90_ms - s.min_ms) / s.median_ms
                                > NOISE_SPREAD):
            out.append(f"noisy samples at b = {s.batch_size} (std {s.std_ms:.3g} ms, min {s.min_ms:.4g}, p90 "
                       f"{s.p90_ms:.4g}, median {s.median_ms:.4g} ms)")
    return out


def auto_delta(values_ms: Sequence[float], rtol: float) -> float:
    """``--delta-ms auto``: the coarsest grid representing every latency within ``rtol``."""
    from tr_core.grid import coarsest_delta
    return coarsest_delta(values_ms, rtol=rtol)


def latency_fields(profiles: Sequence[LatencyProfile], *, delta_ms: float, curve: str = "table",
                   at_batch_size: int | None = None):
    """``(step_latency_ms, latency_curves or None, provenance list)`` for the spec."""
    if curve not in CURVES:
        raise ProfileError(f"--latency-curve must be one of {', '.join(CURVES)}, got {curve!r}")
    if not delta_ms > 0:
        raise ProfileError(f"--delta-ms must be > 0, got {delta_ms}")
    L: list[float] = []
    curves: list[LatencyCurve | None] = []
    prov: list[dict] = []
    for i, prof in enumerate(profiles):
        med = prof.median_ms()
        sizes = sorted(med)
        if at_batch_size is not None:
            if at_batch_size not in med:
                raise ProfileError(f"--latency-batch-size {at_batch_size} was not profiled for model {i} "
                                   f"({prof.model}); profiled sizes: {', '.join(map(str, sizes))}")
            b0 = at_batch_size
        else:
            b0 = sizes[0]
        rounded = {b: round_to_grid(med[b], delta_ms) for b in sizes}
        kind = curve
        if kind == "affine" and (prof.fit is None or prof.fit.per_request_ms < 0
                                 or prof.fit.intercept_ms + prof.fit.per_request_ms <= 0):
            kind = "table"
        if kind == "table" and len(sizes) < 2:
            kind = "constant"
        if kind == "constant":
            L.append(rounded[b0])
            curves.append(None)
        elif kind == "table":
            L.append(rounded[sizes[0]])
            curves.append(LatencyCurve("table", batch_size=tuple(sizes),
                                       step_latency_ms=tuple(rounded[b] for b in sizes)))
        else:
            a, c = prof.fit.intercept_ms, prof.fit.per_request_ms
            L.append(round_to_grid(a + c, delta_ms))
            curves.append(LatencyCurve("affine", intercept_ms=a, per_request_ms=c))
        prov.append({
            "model": prof.model, "config_sha256": prof.config_sha256, "device": prof.device, "dtype": prof.dtype,
            "mode": prof.mode, "context_tokens": prof.context_tokens, "extend_tokens": prof.extend_tokens,
            "cuda_graph": prof.cuda_graph, "timing": prof.timing, "curve": kind,
            "batch_size": sizes, "median_ms": [med[b] for b in sizes], "p90_ms": [s.p90_ms for s in prof.batches],
            "rounded_ms": [rounded[b] for b in sizes],
            "max_relative_rounding": max(abs(rounded[b] - med[b]) / med[b] for b in sizes),
            "fit": None if prof.fit is None else {"intercept_ms": prof.fit.intercept_ms,
                                                  "per_request_ms": prof.fit.per_request_ms,
                                                  "r_squared": prof.fit.r_squared},
            "weight_bytes": prof.weight_bytes, "kv_bytes_per_token": prof.kv_bytes_per_token,
        })
    if all(c is None for c in curves):
        return L, None, prov
    return L, curves, prov


def _check_solo_profiles(profiles: Sequence[LatencyProfile]) -> None:
    for i, prof in enumerate(profiles):
        if prof.is_corun:
            raise ProfileError(f"--latency-profile of model {i} ({prof.model}) was timed co-running (beside "
                               f"{prof.corun['model']}); give it with --corun-profile and a solo profile here")


def _check_corun_profiles(profiles: Sequence[LatencyProfile] | None,
                          corun_profiles: Sequence[LatencyProfile | None]) -> None:
    for i, prof in enumerate(corun_profiles):
        if prof is None:
            continue
        if not prof.is_corun:
            raise ProfileError(f"--corun-profile of model {i} ({prof.model}) is a solo profile (no 'corun' block); "
                               f"measure it with 'tr-profile latency --corun OTHER'")
        if profiles is not None and prof.config_sha256 != profiles[i].config_sha256:
            raise ProfileError(f"--corun-profile of model {i} times {prof.model} but --latency-profile of model {i} "
                               f"times {profiles[i].model} (different config_sha256): give them in the same order")


def corun_fields(corun_profiles: Sequence[LatencyProfile | None], *, delta_ms: float,
                 profiles: Sequence[LatencyProfile] | None = None):
    """``(corun_latency entries, provenance list, warnings)``: one table (or ``None``) per model on the grid."""
    entries: list[dict | None] = []
    prov: list[dict | None] = []
    warnings: list[str] = []
    for i, prof in enumerate(corun_profiles):
        if prof is None:
            entries.append(None)
            prov.append(None)
            continue
        med = prof.median_ms()
        sizes = sorted(med)
        rounded = {b: round_to_grid(med[b], delta_ms) for b in sizes}
        entries.append({"batch_size": sizes, "step_latency_ms": [rounded[b] for b in sizes]})
        solo = profiles[i].median_ms() if profiles is not None else {}
        ratio = {b: med[b] / solo[b] for b in sizes if b in solo}
        below = [b for b, r in ratio.items() if r < 1.0]
        if below:
            warnings.append(f"model {i} ({prof.model}): the co-running median is below the solo one at b = "
                            + ", ".join(map(str, below)) + " (noise, or a busy machine during the solo profile)")
        prov.append({"model": prof.model, "config_sha256": prof.config_sha256, "device": prof.device,
                     "cuda_graph": prof.cuda_graph, "timing": prof.timing, "corun": dict(prof.corun),
                     "batch_size": sizes, "median_ms": [med[b] for b in sizes],
                     "rounded_ms": [rounded[b] for b in sizes],
                     "max_relative_rounding": max(abs(rounded[b] - med[b]) / med[b] for b in sizes),
                     "ratio_to_solo": {str(b): r for b, r in sorted(ratio.items())}})
    return entries, prov, warnings


def build_system_spec(estimate: RoutingEstimate, *, step_latency_ms: Sequence[float] | None = None,
                      profiles: Sequence[LatencyProfile] | None = None, delta_ms: float = 0.1,
                      curve: str = "table", at_batch_size: int | None = None, name: str = "profiled",
                      model_names: Sequence[str] | None = None, extra_provenance: dict | None = None,
                      allow_mixed: bool = False, delta_rtol: float = 0.01,
                      warnings: list | None = None,
                      corun_profiles: Sequence[LatencyProfile | None] | None = None) -> SystemSpec:
    """A validated spec: latencies from ``profiles`` (or given ``step_latency_ms``), P and C from ``estimate``.

    ``corun_profiles``: one co-running profile (or ``None``) per model, written
    as the spec's ``corun_latency`` tables (see the module docstring).

    ``delta_ms='auto'`` picks the coarsest grid within ``delta_rtol``; profile
    warnings (:func:`check_profiles`) are appended to ``warnings`` and kept in
    ``provenance.latency_warnings``.
    """
    M = estimate.n_models
    curves = None
    lat_prov: list | dict
    notes: list[str] = []
    corun_meds: list[float] = []
    if profiles is not None:
        _check_solo_profiles(profiles)
    if corun_profiles is not None:
        if len(corun_profiles) != M:
            raise ProfileError(f"the trace has {M} models but --corun-profile gives {len(corun_profiles)} entries "
                               f"(one per model, 'none' for a model without one)")
        _check_corun_profiles(profiles, corun_profiles)
        corun_meds = [s.median_ms for p in corun_profiles if p is not None for s in p.batches]
    if profiles is not None:
        if len(profiles) != M:
            raise ProfileError(f"the trace has {M} models but {len(profiles)} latency profiles were given")
        notes = check_profiles(profiles, allow_mixed=allow_mixed, corun_profiles=corun_profiles or ())
        if delta_ms == "auto":
            delta_ms = auto_delta([s.median_ms for p in profiles for s in p.batches] + corun_meds, delta_rtol)
        L, curves, lat_prov = latency_fields(profiles, delta_ms=delta_ms, curve=curve, at_batch_size=at_batch_size)
        if model_names is None:
            model_names = [p.model for p in profiles]
    elif step_latency_ms is not None:
        L = [float(v) for v in step_latency_ms]
        if len(L) != M:
            raise ProfileError(f"--L has {len(L)} values but the trace has {M} models")
        lat_prov = {"source": "given on the command line", "step_latency_ms": L}
        if corun_profiles is not None:
            notes = check_profiles([], allow_mixed=allow_mixed, corun_profiles=corun_profiles)
        if delta_ms == "auto":
            delta_ms = auto_delta(L + corun_meds, delta_rtol)
    else:
        raise ProfileError("a spec needs latencies: pass --L or --latency-profile (one per model)")
    P, C = spec_matrices(estimate)
    from profiler import __version__
    prov = {"tool": "tr-profile", "tool_version": __version__,
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "routing": routing_provenance(estimate), "latency": lat_prov}
    if notes:
        prov["latency_warnings"] = notes
        if warnings is not None:
            warnings.extend(notes)
    corun = None
    if corun_profiles is not None and any(p is not None for p in corun_profiles):
        corun, prov["corun_latency"], corun_notes = corun_fields(corun_profiles, delta_ms=delta_ms, profiles=profiles)
        if corun_notes:
            prov.setdefault("latency_warnings", []).extend(corun_notes)
            if warnings is not None:
                warnings.extend(corun_notes)
    if extra_provenance:
        prov.update(extra_provenance)
    kw = {"corun_latency": corun} if corun is not None else {}
    return make_spec(L, P, C, delta_ms=delta_ms, name=name,
                     model_names=list(model_names) if model_names is not None else None,
                     latency_curves=curves, provenance=prov, **kw)
