"""A compact state-dependent launch policy per N, in the form a thresholds file (schema version 3) carries.

:func:`class_policy` searches one compact class of ``optimizer.policy`` (``busy``, ``residual``, ``window``, ``ratio``) at one N
from the threshold vector ``B`` (steepest ascent, exact chain values: the value is exact, the optimality
within the class is not proven) and returns the row fields of a version-3 file; :func:`policy_header` is
the file's top-level ``policy`` object (the columns' names, the batch caps and, for ``residual`` and ``ratio``, the step
lengths the rule compares with); :func:`threshold_row_fields` is the row of an N that was not searched (its
policy is its threshold vector).  The file format is in :mod:`tr_model.thresholds`; the runtime executes it
(:mod:`tr_model.serving.runtime.core`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from tr_core.errors import SpecError
from tr_core.spec import SystemSpec
from tr_model.thresholds import POLICY_COLUMNS, STEP_CLASSES, WINDOW_CLASSES

__all__ = ["POLICY_CLASSES", "ClassPolicy", "class_policy", "policy_header", "threshold_row_fields",
           "check_policy_class"]

POLICY_CLASSES = tuple(POLICY_COLUMNS)
# the classes in words, for --policy of tr-optimize and tr-autotune run
POLICY_CLASSES_HELP = ("busy = a threshold per model while no other model runs and one while another does; residual = "
                       "idle / the other's batch ends no sooner than this model's step / ends sooner; window = a "
                       "threshold, waiting while another model's batch ends within a window (ms); ratio = the window "
                       "scaled by the requests about to return over the own queue, models deciding in turn")


def check_policy_class(cls) -> str:
    if cls not in POLICY_COLUMNS:
        raise SpecError(f"policy class must be one of {', '.join(POLICY_COLUMNS)}, got {cls!r}")
    return cls


@dataclass(frozen=True)
class ClassPolicy:
    """The best policy of a class found at N: ``params[j][c]`` (None = never), its exact throughput."""

    N: int
    cls: str
    B: tuple                       # the threshold vector the search started from
    params: tuple
    throughput_tok_s: float        # exact chain under the class table
    throughput_error_bound: float  # relative, proven (dtmc)
    start_tok_s: float             # the same chain machinery at B (the class's threshold policy)
    evaluated: int
    chain_states: int
    seconds: float

    @property
    def gain(self) -> float:
        return self.throughput_tok_s / self.start_tok_s - 1.0 if self.start_tok_s > 0 else 0.0

    def row_fields(self) -> dict:
        return {"policy_thresholds": [list(r) for r in self.params], "policy_certificate": "local",
                "policy_predicted_tok_s": self.throughput_tok_s}


def class_policy(spec: SystemSpec, N: int, cls: str, B, *, round_to_grid: bool = False,
                 max_states: int = 2_000_000, max_evals: int = 400) -> ClassPolicy:
    """Search class ``cls`` at N from the threshold vector ``B`` (normally B*(N)).

    Each member is evaluated exactly on the configurations its own chain meets
    (:func:`optimizer.policy.class_chain_table`), without the all-policy decision process.
    Raises :class:`optimizer.policy.PolicyTooLarge` when a member's chain exceeds ``max_states``."""
    from optimizer import policy as POL

    check_policy_class(cls)
    t0 = time.perf_counter()
    N = int(N)
    grid = POL.rule_grid(spec, N, round_to_grid=round_to_grid)
    start = POL.class_start(cls, B)
    scale = 1000.0 / spec.delta_ms

    def value(p):
        tab = POL.class_chain_table(spec, N, cls, p, grid=grid, max_states=max_states).table
        return POL.evaluate_table(spec, N, tab, d=grid.d, dco=grid.dco)

    base = value(start)
    params, best, evaluated = POL.search_class(spec, N, None, cls, start, max_evals=max_evals,
                                               round_to_grid=round_to_grid, max_states=max_states)
    if best < base.throughput_per_quantum * scale:  # the ascent never leaves a better start
        params, best = tuple(start), base.throughput_per_quantum * scale
    sol = value(params)
    k = POL.CLASS_PARAMS[cls]
    rows = []
    for j in range(spec.M):
        r = [int(x) for x in params[j * k:(j + 1) * k]]
        if r[0] > N:
            raise SpecError(f"N = {N}: the {cls} search left model {j} never launching with every model idle "
                            f"(internal: such a policy deadlocks)")
        if cls in WINDOW_CLASSES:  # (threshold, window in quanta) -> (threshold, window_ms)
            rows.append((r[0], _ms(r[1], spec.delta_ms)))
        else:
            rows.append(tuple(None if (c > 0 and x > N) else x for c, x in enumerate(r)))
    return ClassPolicy(N=N, cls=cls, B=tuple(int(b) for b in B), params=tuple(rows),
                       throughput_tok_s=float(sol.throughput_per_quantum * scale),
                       throughput_error_bound=float(sol.throughput_error_bound),
                       start_tok_s=float(base.throughput_per_quantum * scale), evaluated=int(evaluated),
                       chain_states=int(sol.states), seconds=time.perf_counter() - t0)


def threshold_row_fields(cls: str, B) -> dict:
    """The policy fields of a row whose policy is its threshold vector (not searched, or extrapolated)."""
    k = len(POLICY_COLUMNS[check_policy_class(cls)])
    if cls in WINDOW_CLASSES:  # the threshold rule: no window
        return {"policy_thresholds": [[int(b), 0] for b in B], "policy_certificate": "thresholds"}
    return {"policy_thresholds": [[int(b)] * k for b in B], "policy_certificate": "thresholds"}


def policy_header(spec: SystemSpec, cls: str, max_concurrency: int, *, round_to_grid: bool = False) -> dict:
    """The top-level ``policy`` object of a version-3 file for ``spec`` up to ``max_concurrency``.

    ``step_ms[i][b - 1]``: model i's step for a batch of b on the chain's grid; ``step_ms_beside_running``:
    the same launched while another model runs (the co-running launch law; equal without co-running)."""
    check_policy_class(cls)
    n = int(max_concurrency)
    caps = [None if spec.max_batch_size is None or spec.max_batch_size[i] is None else int(spec.max_batch_size[i])
            for i in range(spec.M)]
    head = {"class": cls, "columns": list(POLICY_COLUMNS[cls]), "max_batch_size": caps}
    if cls in STEP_CLASSES:
        d, _ = spec.quanta_table(n, round_to_grid=round_to_grid)
        dco = spec.corun_quanta_table(n, round_to_grid=round_to_grid)[0] if spec.has_corun else d
        head["step_ms"] = [[_ms(d[i, b], spec.delta_ms) for b in range(1, n + 1)] for i in range(spec.M)]
        head["step_ms_beside_running"] = [[_ms(dco[i, b], spec.delta_ms) for b in range(1, n + 1)]
                                          for i in range(spec.M)]
    return head


def _ms(quanta, delta_ms: float) -> float:
    x = float(quanta) * float(delta_ms)
    return float(f"{x:.12g}") if math.isfinite(x) else x  # 279 * 0.1 prints as 27.9, not 27.900000000000002
