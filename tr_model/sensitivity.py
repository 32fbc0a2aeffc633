r"""How B* and the throughput move with the system: presets side by side, B* maps, profiling-error sensitivity.

Three questions a user asks before trusting thresholds computed from a profile:

**Which systems gain from delayed batching?**  :func:`compare_systems` runs
the B* search for several specs over the same concurrencies and tabulates
``T(B*)``, the eager ``T(1, ..., 1)`` and the gain ``T(B*) / T(1, ..., 1)``.

**Where does B* sit?**  :func:`bstar_grid` maps B* of a two-model preset over
the escalation probability p and the latency ratio ``L1 / L0`` (L0 fixed,
``L1 = ratio * L0`` rounded to the ``delta`` grid).

**How precisely must I profile?**  Suppose the profile reports a parameter
value x but the deployed system has ``x' = x (1 + e)``.  The thresholds are
tuned on the profile, ``B_hat = B*(x)``, and run on the real system.
:func:`profiling_sensitivity` reports, for each parameter and relative error
e:

* the *threshold regret* ``1 - T_{x'}(B_hat) / T_{x'}(B*(x'))``: the fraction
  of the achievable throughput lost by using thresholds tuned on the wrong
  value (zero whenever the error does not move B*);
* the *prediction error* ``T_x(B_hat) / T_{x'}(B_hat) - 1``: how far the
  predicted throughput is from what the real system delivers with those
  thresholds.

Parameters are the preset's probabilities (``p``, ``q``) and each latency
(``L0``, ``L1``, ...); perturbed latencies are rounded to the ``delta`` grid,
perturbed probabilities clipped to [0, 1].  Everything evaluates the exact
chain through :func:`tr_model.optimize` / :func:`tr_model.evaluate`.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import pandas as pd

from tr_core.errors import SpecError
from tr_core.spec import DEFAULT_DELTA_MS, SystemSpec, preset

__all__ = ["compare_systems", "bstar_grid", "perturbed_preset", "profiling_sensitivity", "grid_latency"]


def grid_latency(value_ms: float, delta_ms: float) -> float:
    """``value_ms`` rounded to the nearest positive multiple of ``delta_ms`` (:func:`tr_core.quanta.round_to_grid`)."""
    from tr_core.quanta import round_to_grid
    return round_to_grid(value_ms, delta_ms)


def compare_systems(systems: Mapping[str, SystemSpec], Ns: Sequence[int], **optimize_kw) -> pd.DataFrame:
    """One row per (system, N): B*, its throughput, the eager throughput and the gain."""
    from tr_model.api import optimize_many

    if not systems:
        raise SpecError("compare_systems: no systems given")
    rows = []
    for name, spec in systems.items():
        for o in optimize_many(spec, list(Ns), **optimize_kw):
            rows.append({"system": name, "N": o.N, "best_B": o.best_B, "throughput_tok_s": o.throughput_tok_s,
                         "eager_throughput_tok_s": o.eager_throughput_tok_s, "gain_vs_eager": o.gain_vs_eager,
                         "per_request_tok_s": o.throughput_tok_s / o.N, "evaluated": o.evaluated})
    return pd.DataFrame(rows)


def bstar_grid(algo: str, ps: Sequence[float], latency_ratios: Sequence[float], N: int, *, L0_ms: float = 6.0,
               q: float | None = None, delta_ms: float = DEFAULT_DELTA_MS, **optimize_kw) -> pd.DataFrame:
    """B* of a two-model preset at concurrency ``N`` over a grid of p and ``L1 / L0``.

    Columns: ``p``, ``latency_ratio``, ``L1_ms`` (on the grid), ``N``,
    ``best_B``, ``throughput_tok_s``, ``eager_throughput_tok_s``, ``gain_vs_eager``.
    """
    from tr_model.api import optimize

    if algo not in ("r2r", "citer", "co-llm", "r-stitch"):
        raise SpecError(f"bstar_grid needs a two-model preset (r2r, citer, co-llm, r-stitch), got {algo!r}")
    rows = []
    for r in latency_ratios:
        if not r > 0:
            raise SpecError(f"latency ratios must be > 0, got {r!r}")
        L1 = grid_latency(L0_ms * r, delta_ms)
        for p in ps:
            spec = preset(algo, [grid_latency(L0_ms, delta_ms), L1], p=p, q=q, delta_ms=delta_ms)
            o = optimize(spec, N, **optimize_kw)
            rows.append({"p": float(p), "latency_ratio": float(r), "L1_ms": L1, "N": int(N), "best_B": o.best_B,
                         "throughput_tok_s": o.throughput_tok_s, "eager_throughput_tok_s": o.eager_throughput_tok_s,
                         "gain_vs_eager": o.gain_vs_eager})
    return pd.DataFrame(rows)


def _preset_params(algo: str, step_latency_ms: Sequence[float], p, q, weights) -> dict[str, float]:
    params: dict[str, float] = {}
    if algo in ("r2r", "citer", "co-llm", "r-stitch"):
        params["p"] = float(p)
    if algo == "r-stitch":
        params["q"] = float(q)
    for i, L in enumerate(step_latency_ms):
        params[f"L{i}"] = float(L)
    return params


def perturbed_preset(algo: str, step_latency_ms: Sequence[float], *, p: float | None = None,
                     q: float | None = None, weights: Sequence[float] | None = None, delta_ms: float = DEFAULT_DELTA_MS,
                     parameter: str | None = None, rel_error: float = 0.0) -> SystemSpec:
    """The preset with one parameter (``p``, ``q`` or ``L<i>``) multiplied by ``1 + rel_error``."""
    L = [float(x) for x in step_latency_ms]
    if parameter is not None:
        if parameter in ("p", "q"):
            if parameter == "p" and p is not None:
                p = min(1.0, max(0.0, p * (1.0 + rel_error)))
            elif parameter == "q" and q is not None:
                q = min(1.0, max(0.0, q * (1.0 + rel_error)))
            else:
                raise SpecError(f"parameter {parameter!r} is not defined for preset {algo!r}")
        elif parameter.startswith("L") and parameter[1:].isdigit() and int(parameter[1:]) < len(L):
            i = int(parameter[1:])
            L[i] = L[i] * (1.0 + rel_error)
        else:
            raise SpecError(f"unknown parameter {parameter!r}: use p, q or L0..L{len(L) - 1}")
    L = [grid_latency(x, delta_ms) for x in L]
    return preset(algo, L, p=p, q=q, weights=weights, delta_ms=delta_ms)


def profiling_sensitivity(algo: str, step_latency_ms: Sequence[float], N: int, *, p: float | None = None,
                          q: float | None = None, weights: Sequence[float] | None = None,
                          delta_ms: float = DEFAULT_DELTA_MS, parameters: Sequence[str] | None = None,
                          rel_errors: Sequence[float] = (-0.2, -0.1, -0.05, 0.05, 0.1, 0.2),
                          **optimize_kw) -> pd.DataFrame:
    """Threshold regret and prediction error when one profiled parameter is off by a relative error.

    One row per (parameter, rel_error) with: ``true_value`` (the perturbed
    parameter, after grid rounding for latencies), ``tuned_B`` (B* of the
    profile), ``true_best_B``, ``true_best_tok_s``, ``achieved_tok_s`` (real
    system with ``tuned_B``), ``predicted_tok_s`` (profile's prediction for
    ``tuned_B``), ``regret`` and ``prediction_error`` (see the module docstring).
    """
    from tr_model.api import evaluate, optimize

    params = _preset_params(algo, step_latency_ms, p, q, weights)
    names = list(parameters) if parameters is not None else list(params)
    for n in names:
        if n not in params:
            raise SpecError(f"unknown parameter {n!r} for preset {algo!r}: choose from {', '.join(params)}")
    nominal = perturbed_preset(algo, step_latency_ms, p=p, q=q, weights=weights, delta_ms=delta_ms)
    tuned = optimize(nominal, N, **optimize_kw)
    rows = []
    for name in names:
        for e in rel_errors:
            real = perturbed_preset(algo, step_latency_ms, p=p, q=q, weights=weights, delta_ms=delta_ms,
                                    parameter=name, rel_error=e)
            best = optimize(real, N, **optimize_kw)
            achieved = evaluate(real, N, tuned.best_B, **{k: v for k, v in optimize_kw.items()
                                                          if k in ("solver", "tol", "max_states", "cache")})
            if name == "p":
                true_value = real.routing_matrix[0][1]
            elif name == "q":
                true_value = real.routing_matrix[1][0]
            else:
                true_value = real.step_latency_ms[int(name[1:])]
            rows.append({
                "parameter": name, "rel_error": float(e), "nominal_value": params[name], "true_value": true_value,
                "tuned_B": tuned.best_B, "true_best_B": best.best_B, "true_best_tok_s": best.throughput_tok_s,
                "achieved_tok_s": achieved.throughput_tok_s, "predicted_tok_s": tuned.throughput_tok_s,
                "regret": 1.0 - achieved.throughput_tok_s / best.throughput_tok_s,
                "prediction_error": tuned.throughput_tok_s / achieved.throughput_tok_s - 1.0,
            })
    return pd.DataFrame(rows)
