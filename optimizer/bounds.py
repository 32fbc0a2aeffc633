r"""Proven upper bounds on the throughput of delayed batching, for pruning and certificates.

Every bound here is a number ``U`` with ``T(B) <= U`` for *every* vector ``B``
in the family it is stated for (the proofs are in ``docs/model.md``, section
"Bounds and certificates"; the tests check each on many random systems).
Observed structure (unimodality, B*(N) growing with N) never appears here: it
may order a search, never prune it.

Notation: ``X_j`` is the long-run rate of request-steps served by model ``j``
(per quantum), ``cbar_j = sum_k C[j][k] P[j][k]`` the expected tokens committed
by one such step, so ``T = sum_j X_j cbar_j``.

**Flow balance.**  Every step on ``i`` is followed by a step on ``j`` with
probability ``P[i][j]``; in a closed system the number of arrivals to ``j`` and
of steps served there differ by at most ``N`` at any time, so the long-run
rates satisfy ``X = X P``.

Let ``y_jb`` be the long-run rate of batches of ``b`` requests (``b <= cap_j``)
launched at model ``j``, so ``X_j = sum_b b y_jb``; such a batch lasts
``d_j(b)`` quanta.

**Little's law.**  Each of its ``b`` requests is in service for ``d_j(b)``
quanta; the time-average number of requests in service,
``sum_jb b d_j(b) y_jb``, cannot exceed ``N``.

**Capacity.**  Model ``j`` runs one batch at a time: its busy fraction
``sum_b d_j(b) y_jb`` is at most 1.

Hence ``T(B) <= max { sum_j cbar_j X_j : X = X P, y >= 0, Little, capacity }``
(a linear program in ``sum_j cap_j`` variables) for *every* feasible ``B``:
:func:`no_wait_bound`.  It implies the coarser program in ``M`` variables
(``sum_j X_j dmin_j <= N`` and ``X_j <= max_b b / d_j(b)``), equal to it when
latencies do not depend on the batch size; with ``L(b)`` it is tighter (a batch
large enough to serve at capacity also holds its requests longer).  It is exact at ``N = 1`` (a lone request never
waits) and loose above; the gap it leaves is the waiting the chain computes.

**Per-chain bracket.**  For one chain with states ``s``, holding times
``tau``, rewards ``g`` and transition matrix ``T``, any vector ``h`` gives

.. math::  \min_s \frac{g + T h - h}{\tau}(s) \;\le\; T(B) \;\le\;
           \max_s \frac{g + T h - h}{\tau}(s)

(the max/min over the recurrent class suffice; over all states is safe),
because ``pi (T h - h) = 0`` for the stationary ``pi`` and ``T(B) = pi g / pi
tau``: :func:`dtmc.chain_bracket` (the rule lives with the chain's solve, which
applies it to every loose iterate: :func:`dtmc.throughput_bracket`).  With
``h`` from a converged solve the bracket is tight; it turns an iterate into a
certified interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from dtmc import chain_bracket, relative_values  # noqa: F401  (bound 2: the rule lives in dtmc.solve)
from tr_core.spec import SystemSpec

# relative slack added to LP optima: the LP solver's rounding must never make a bound too small
LP_SLACK = 1e-9


@dataclass(frozen=True)
class Bound:
    """A proven upper bound (tokens/s) on every vector of a family, with the rule that gives it."""

    value_tok_s: float
    name: str


def _quanta(spec: SystemSpec, N: int, round_to_grid: bool) -> np.ndarray:
    d, _ = spec.quanta_table(int(N), round_to_grid=round_to_grid)
    return d


def _corun_quanta(spec: SystemSpec, N: int, round_to_grid: bool) -> np.ndarray | None:
    """The co-running durations (None without co-running: the solo law)."""
    if not spec.has_corun:
        return None
    dco, _ = spec.corun_quanta_table(int(N), round_to_grid=round_to_grid)
    return dco


def shortest_steps(spec: SystemSpec, N: int, round_to_grid: bool = False) -> np.ndarray:
    """``min(d, dco)`` elementwise: the shortest duration a batch can get under the launch law (``d``
    without co-running).  Bound 1 (Little's law, capacity) needs only a lower bound on each duration."""
    d = _quanta(spec, N, round_to_grid)
    dco = _corun_quanta(spec, N, round_to_grid)
    return d if dco is None else np.minimum(d, dco)


def no_wait_bound(spec: SystemSpec, N: int, *, round_to_grid: bool = False, d: np.ndarray | None = None) -> Bound:
    """``max cbar.X`` over the flows allowed by flow balance, Little's law and capacity, resolved by batch size
    (tokens/s).

    Valid for every feasible ``B`` at concurrency ``N`` (see the module docstring).  With co-running
    latencies a batch lasts ``d`` or ``dco`` (the launch law picks), so the durations used are
    ``min(d, dco)`` (:func:`shortest_steps`; a ``d`` passed in must already be that): every step still
    lasts at least that, and the proof is unchanged.
    """
    from scipy.optimize import linprog

    N = int(N)
    P, C = spec.P, spec.C
    M = spec.M
    if d is None:
        d = shortest_steps(spec, N, round_to_grid)
    caps = spec.caps(N)
    cbar = (C * P).sum(axis=1)
    # variables y[j, b]: the rate of batches of b requests launched at model j (b = 1..cap_j), X_j = sum_b b y[j, b]
    cols = [(j, b) for j in range(M) for b in range(1, int(caps[j]) + 1)]
    size = np.array([b for _, b in cols], dtype=float)
    dur = np.array([float(d[j, b]) for j, b in cols])
    model = np.array([j for j, _ in cols])
    # maximise cbar.X  <=>  minimise -sum cbar_j b y[j, b]
    cost = -cbar[model] * size
    # flow balance X (I - P) = 0: row k is sum_j X_j (1[j = k] - P[j][k])
    A_eq = ((model[None, :] == np.arange(M)[:, None]).astype(float) - P[model, :].T) * size[None, :]
    b_eq = np.zeros(M)
    # one batch at a time on each model (busy fraction <= 1), and Little's law (requests in service <= N)
    A_ub = np.vstack([(model[None, :] == np.arange(M)[:, None]).astype(float) * dur[None, :],
                      (size * dur)[None, :]])
    b_ub = np.concatenate([np.ones(M), [float(N)]])
    res = linprog(cost, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=[(0.0, None)] * len(cols),
                  method="highs")
    if res.status != 0:  # the LP is always feasible (y = 0) and bounded (busy time); be safe anyway
        kappa = np.array([max(b / float(d[j, b]) for b in range(1, int(caps[j]) + 1)) for j in range(M)])
        val = float(np.dot(np.maximum(cbar, 0.0), kappa))
    else:
        val = float(-res.fun)
    per_quantum = val * (1.0 + LP_SLACK) + 1e-300
    return Bound(per_quantum * 1000.0 / spec.delta_ms, "no-wait")


def gap(upper: float, value: float) -> float:
    """Relative gap ``(upper - value) / upper`` (0 when the bound is attained)."""
    if not (upper > 0) or not math.isfinite(upper):
        return float("inf") if upper != value else 0.0
    return max(0.0, (upper - value) / upper)


class Bounder:
    """The proven bounds available for one (spec, N): ``vector_bound(B)`` is the smallest of them.

    Each bound holds for every feasible vector of its family; a vector's bound
    is the minimum over the families it belongs to.  ``policies``: a
    :class:`PolicyBounds` table (all-policy bounds at small N, scaled up).
    """

    def __init__(self, spec: SystemSpec, N: int, *, round_to_grid: bool = False,
                 policies: "PolicyBounds | None" = None):
        self.spec = spec
        self.N = int(N)
        self.d = _quanta(spec, self.N, round_to_grid)
        self.dco = _corun_quanta(spec, self.N, round_to_grid)
        self.global_bound = no_wait_bound(spec, self.N, d=self.d if self.dco is None else np.minimum(self.d, self.dco))
        if policies is not None:
            pb = policies.bound(self.N)
            if pb is not None and pb.value_tok_s < self.global_bound.value_tok_s:
                self.global_bound = pb

    def vector_bound(self, B) -> Bound:
        return self.global_bound


def scaling_valid(spec: SystemSpec, N: int) -> bool:
    """True when per-request throughput bounds may be scaled from N0 up to N (see :class:`PolicyBounds`).

    Needs batch-size-independent latencies (co-running ones included) and no batch cap below N: then
    one request more or less never changes when a batch ends or who it takes.  Under the co-running
    launch law a batch's duration depends only on which models are busy at its launch, and an empty
    batch keeps its model busy exactly as the batch of one it replaces, so the argument is unchanged.
    """
    if spec.batch_dependent or spec._corun_batch_dependent():
        return False
    return all(c is None or int(c) >= int(N) for c in (spec.max_batch_size or ()))


class PolicyBounds:
    r"""All-policy bounds ``lam_n`` (:func:`policy_bound`) for small n, and their scaling to larger N.

    **Scaling** (batch-size-independent latencies, no cap below N): for every
    launch policy of an ``(N+1)``-request system, remove one request ``r``;
    the other N requests follow a launch policy of the N-request system (the
    same launch epochs and decisions; a launch that would have taken only
    ``r`` is an empty batch, an action :func:`policy_bound` includes), so
    their throughput ``T - rate_r`` is at most ``lam_N``.  Summing over the
    N + 1 choices of ``r`` gives ``N T <= (N + 1) lam_N``, and by induction
    ``T(B) <= N * lam_n / n`` for every ``n <= N`` and every feasible ``B``.
    """

    def __init__(self, spec: SystemSpec, *, round_to_grid: bool = False):
        self.spec = spec
        self.round_to_grid = round_to_grid
        self.values: dict[int, BoxResult] = {}

    def compute(self, Ns, *, max_states: int = 400_000, budget_s: float | None = None, **kw) -> "PolicyBounds":
        """Solve :func:`policy_bound` for each n in ``Ns`` (increasing), stopping at a state or time budget."""
        import time as _time

        t0 = _time.perf_counter()
        for n in sorted(set(int(x) for x in Ns)):
            if budget_s is not None and _time.perf_counter() - t0 > budget_s:
                break
            r = policy_bound(self.spec, n, max_states=max_states, round_to_grid=self.round_to_grid, **kw)
            if r.status != "ok":
                break
            self.values[n] = r
        return self

    def bound(self, N: int) -> Bound | None:
        """The smallest proven bound at N from the table (None when none applies)."""
        N = int(N)
        best: Bound | None = None
        for n, r in self.values.items():
            if n == N:
                v, name = r.upper_tok_s, f"all-policy(N={n})"
            elif n < N and scaling_valid(self.spec, N):
                v, name = r.upper_tok_s * N / n, f"all-policy(N={n}) scaled"
            else:
                continue
            if math.isfinite(v) and (best is None or v < best.value_tok_s):
                best = Bound(float(v), name)
        return best


@dataclass(frozen=True)
class BoxResult:
    """The decision-process bound of one threshold box (see :func:`box_bound`)."""

    lo: tuple[int, ...]
    hi: tuple[int, ...]
    upper_tok_s: float          # proven: no vector in the box exceeds it
    lower_tok_s: float          # the box's decision optimum is at least this (not a threshold value)
    states: int
    sweeps: int
    seconds: float
    status: str                 # "ok", "too large", "deadlock"
    # the coarse-clock process itself, kept on request (``keep=True``) so that sub-boxes are cut out of
    # it (``parent=``) instead of being enumerated again
    process: "BoxProcess | None" = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class BoxProcess:
    """A built coarse-clock decision process of one box (the arrays of :func:`optimizer._kernels.coarse_mdp_build`)."""

    N: int
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    coarse: int
    arrays: tuple = field(repr=False)
    # the relative values of its last solve (one slot, filled after the build): a sub-box cut out of this
    # process starts its iteration from them instead of from zero (any start is valid; a near one is fast)
    values: list = field(default_factory=list, repr=False, compare=False)

    def holds(self, N: int, lo, hi, coarse: int) -> bool:
        """Whether the box ``[lo, hi]`` at the same N and clock lies inside this one."""
        return (int(N) == self.N and int(coarse) == self.coarse
                and all(a <= b for a, b in zip(self.lo, lo)) and all(b <= a for a, b in zip(self.hi, hi)))


def box_bound(spec: SystemSpec, N: int, lo, hi, *, target_tok_s: float | None = None, d: np.ndarray | None = None,
              dco: np.ndarray | None = None,
              max_states: int = 2_000_000, max_entries: int = 60_000_000, max_sweeps: int = 3000,
              rtol: float = 1e-6, round_to_grid: bool = False, trace: list | None = None,
              empty: bool = False, max_step: int = 4, coarse: int = 1, omega: float = 0.7,
              give_up: bool = False, parent: BoxProcess | None = None, keep: bool = False,
              solve: bool = True) -> BoxResult:
    """A proven upper bound on ``T(B)`` for every ``B`` with ``lo <= B <= hi`` (componentwise) at N.

    The box's decision process lets each idle model ``j`` launch or wait while
    ``lo_j <= k_j < hi_j``; each threshold vector of the box is one of its
    policies, so by the certificate ``max_s (g + Q*h - h)/tau`` (valid for
    any ``h``, see the module docstring) no vector of the box can exceed it.
    ``h`` comes from value-iteration sweeps; they stop as soon as the bound
    is below ``target_tok_s`` (enough to prune), the bracket is within
    ``rtol``, or ``max_sweeps`` is reached (the bound is valid at any point).

    Co-running (``spec.corun_latency``, or ``dco`` given): the process applies the chain's launch law
    (a launch gets ``dco`` when another model is busy or launches in the same decision), so each
    threshold vector is still one of its stationary policies and the certificate is unchanged; on the
    coarse clock each launch's span is the floor or ceil of the duration the law gives (bound 5's
    argument: the busy set at each stage of a slot is the fine one at that epoch).

    On a coarse clock, ``parent`` (the ``process`` of an earlier result with ``keep=True``, for a box
    holding this one at the same N and clock) lets the process be cut out of the parent's
    (:func:`optimizer._kernels.mdp_restrict`, the same process) instead of enumerated again.
    ``solve=False`` only builds the process (``keep`` it to cut boxes out of it): no bound, ``inf``.
    """
    import time as _time

    from optimizer import _kernels as K

    t0 = _time.perf_counter()
    N = int(N)
    M = spec.M
    lo = np.asarray(lo, dtype=np.int64)
    hi = np.asarray(hi, dtype=np.int64)
    low = lowered(spec, N, round_to_grid, d, dco, empty=bool(empty))
    d = low.d
    dco = low.tables.dco if low.corun else d
    bn = low.bn
    coarse = int(coarse)
    if coarse > 1:
        if empty:
            raise ValueError("the coarse clock does not model empty batches")
        dlo, dhi = coarse_durations(d, coarse)
        dloco, dhico = coarse_durations(dco, coarse)
        shortest = int(min(d[:, 1:].min(), dco[:, 1:].min()))
        if int(min(dlo[:, 1:].min(), dloco[:, 1:].min())) < 1:
            raise ValueError(f"coarse = {coarse} quanta is longer than the shortest step ({shortest} quanta)")
        br = max(1, int(max(dhi.max(), dhico.max())).bit_length())
    else:
        br = low.br
    if M * (2 * bn + br) > 62 or (coarse > 1 and N >= K.NO_LAUNCH):
        # (a coarse process stores its decision bounds, queue sizes, as int16)
        return BoxResult(tuple(lo), tuple(hi), math.inf, -math.inf, 0, 0, 0.0, "too large")
    tables = low.with_packing(br)
    box = K.Box(lo, hi)
    limits = K.Limits(int(max_states), int(max_entries))
    proc = None
    warm_from = None
    if coarse > 1:
        if parent is not None and parent.holds(N, tuple(int(x) for x in lo), tuple(int(x) for x in hi), coarse):
            warm_from = parent
            pa = parent.arrays
            res = K.mdp_restrict(K.CoarseProcess(pa[0], *pa[2:]), box)
        else:
            dur = np.ascontiguousarray(np.stack([dlo, dhi, dloco, dhico]))
            res = K.coarse_mdp_build(N, box, tables, dur, limits, True)
        st, n, keys, tau, g, out_ptr, out_prob, opt_ptr, opt_idx = res[:9]
        if keep and st == K.OK:
            proc = BoxProcess(N, tuple(int(x) for x in lo), tuple(int(x) for x in hi), coarse, (n,) + res[2:])
    else:
        st, n, keys, tau, g, out_ptr, out_prob, opt_ptr, opt_idx = K.mdp_build(N, box, tables, limits, bool(empty))
    if st != K.OK:
        return BoxResult(tuple(int(x) for x in lo), tuple(int(x) for x in hi), math.inf, -math.inf, int(n), 0,
                         _time.perf_counter() - t0, "too large" if st == K.TOO_LARGE else "deadlock")
    if not solve:
        return BoxResult(tuple(int(x) for x in lo), tuple(int(x) for x in hi), math.inf, -math.inf, int(n), 0,
                         _time.perf_counter() - t0, "ok", proc)
    tau = tau[:n].astype(np.float64)
    g = g[:n].copy()
    # rounding of one certificate term grows with the number of products summed in it
    per_state = opt_ptr[out_ptr[1:n + 1]] - opt_ptr[out_ptr[:n]]
    terms = int(per_state.max()) + 8 if n else 8
    scale = 1000.0 / (spec.delta_ms * coarse)
    target = None if target_tok_s is None else target_tok_s / scale
    h = np.zeros(n)
    if warm_from is not None and warm_from.values and st == K.OK:
        # keys of a cut-out process are the parent's state indices
        h = warm_from.values[0][keys[:n]].copy()
        h -= h[0]
    # Relative value iteration of the epoch process with per-step reward g - lam*tau.  With lam fixed at
    # the target, it converges to values whose certificate is below the target exactly when the box's
    # optimum is (the bracket of any h is valid; lam only steers where h converges).
    lam = float(np.sum(g) / np.sum(tau))
    mdp = K.MDP(int(n), out_ptr, out_prob, opt_ptr, opt_idx, g, tau)
    lo_b, hi_b = -math.inf, math.inf
    sweeps = 0
    step = 4
    prev_hi = math.inf
    while True:
        K.mdp_sweeps(mdp, h, lam, step, float(omega))
        sweeps += step
        a, b, mag = K.mdp_bracket(mdp, h)
        err = mag * 4 * terms * np.finfo(np.float64).eps      # rounding in the bracket's sums
        lo_b, hi_b = max(lo_b, a - err), min(hi_b, b + err)   # each is a valid bound: keep the best
        lam = 0.5 * (lo_b + hi_b) if math.isfinite(lo_b + hi_b) else 0.5 * (a + b)
        if trace is not None:
            trace.append((sweeps, lo_b * scale, hi_b * scale))
        if target is not None and hi_b < target:
            break
        if hi_b - lo_b <= rtol * abs(hi_b) or sweeps >= max_sweeps:
            break
        if target is not None and lo_b >= target:      # the box really holds better policies: no prune
            break
        if target is not None and give_up and sweeps >= 32:
            # the upper end falls at most geometrically, so a straight line through the last two
            # checkpoints overestimates progress: stop when even that line misses the target in time
            drop = (prev_hi - hi_b) / step
            if drop <= 0.0 or (hi_b - target) / drop > max_sweeps - sweeps:
                break
        prev_hi = hi_b
        step = min(2 * step, max_step)
    return BoxResult(tuple(int(x) for x in lo), tuple(int(x) for x in hi), hi_b * scale, lo_b * scale, int(n),
                     sweeps, _time.perf_counter() - t0, "ok", proc)


def coarse_durations(d: np.ndarray, coarse: int) -> tuple[np.ndarray, np.ndarray]:
    """Slots a step of ``d`` quanta can span on a clock of ``coarse``-quanta slots: floor and ceil of d / c.

    A batch launched at time ``t`` ends at ``t + d``; read on the slot clock (slot = floor(t / c)) it
    spans ``floor((t + d) / c) - floor(t / c)`` slots, which is ``floor(d / c)`` or ``ceil(d / c)``.
    """
    d = np.asarray(d, dtype=np.int64)
    c = int(coarse)
    return np.ascontiguousarray(d // c), np.ascontiguousarray(-(-d // c))


def lowered(spec: SystemSpec, N: int, round_to_grid: bool = False, d: np.ndarray | None = None,
            dco: np.ndarray | None = None, *, empty: bool = False):
    """The decision processes' :class:`dtmc.LoweredSystem` of ``spec`` at N (``d``/``dco``: durations in quanta
    to use instead of the spec's; they weight routing outcomes with summed log-factorials, as they always
    have)."""
    from dtmc.lowering import lower_arrays, lower_system

    if d is None and dco is None:
        return lower_system(spec, N, round_to_grid=round_to_grid, factorials="summed", empty=empty)
    if d is None:
        d = _quanta(spec, N, round_to_grid)
    if dco is None:
        dco = _corun_quanta(spec, N, round_to_grid)
    return lower_arrays(spec.P, spec.C, d, N, spec.caps(int(N)), dco, empty=empty, factorials="summed")


def policy_bound(spec: SystemSpec, N: int, **kw) -> BoxResult:
    """A proven upper bound on the throughput of *every* launch policy at N (thresholds included).

    The decision process lets every idle model launch (all its waiting
    requests) or wait at every epoch, and also start an empty batch; see
    :func:`box_bound` for the certificate.  Used with :func:`scaled_policy_bound`.
    """
    M = spec.M
    return box_bound(spec, N, (0,) * M, (int(N) + 1,) * M, empty=True, **kw)
