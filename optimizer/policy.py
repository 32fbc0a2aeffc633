r"""The optimal launch policy: beyond one fixed threshold per model.

**The decision process** is the all-policy process of bound 4 (``docs/model.md``;
:func:`optimizer.bounds.policy_bound`): at every epoch, after the completions and the routing, each idle model
may launch (all its waiting requests, up to its cap), wait, or start an *empty batch* (busy ``d_j(0)``
quanta, serving nobody: a timer).  Its states are post-decision states ``(k, b, r)``; a decision is taken
in a *pre-decision configuration* (the same triple per model right after the routing, idle models with
``b = r = 0``), and the options there depend on that configuration only.

**The policy table** is therefore indexed by the pre-decision configuration of all models (a model's own
queue together with every other model's queue, batch and residual) and holds one launch bit per model.
The exact chain accepts such a table instead of thresholds (:func:`dtmc.solve_policy_chain`); a threshold
vector is the table ``launch_j = idle_j and k_j >= B_j``.

**Solving it** (:func:`optimal_policy`): relative value iteration (damped Gauss-Seidel sweeps of
``h <- g - lam tau + max_options h`` in reverse discovery order, ``lam`` re-estimated from the relative values
of a few reference states before every sweep, one compiled loop: :func:`optimizer._kernels.mdp_solve`) until
the certificate bracket
``min_s D(h) <= optimum <= max_s D(h)``, ``D = (g + Q*h - h) / tau``, is within ``rtol``; the greedy policy
of ``h`` is extracted and evaluated *exactly* in the chain under its table (GTH or Anderson with their proven
error bounds).  The **proven gap** is ``(U - T_low) / U`` with ``U = max_s D(h)`` the all-policy bound (valid
for every policy, any ``h``) and ``T_low`` the policy's exact throughput less its proven error: no launch
policy of the process, thresholds included, exceeds ``U``, and the policy reaches ``T_low``.  When the gap is
above ``target_gap`` a policy-iteration step follows (relative values of the policy on the whole process,
greedy improvement), until the policy is stable or ``max_rounds`` is spent.

**Compact classes** (:func:`class_table`), none with empty batches: ``busy`` = one threshold per model and
per "is another model busy" (running, after the epoch's completions): ``launch_j = idle_j and k_j >=
B[j][busy]``; ``residual`` = a third threshold while the others' earliest batch ends before this model's
step would; ``window`` = a threshold and a time window per model: wait while another model's batch ends
within ``W_j`` quanta; ``ratio`` = the same window scaled by the requests about to return over the own
queue, the models deciding in turn (fastest first) and seeing the batches just launched.  Each is evaluated exactly through the same table mechanism and searched by steepest ascent from
``B*`` (a heuristic; its value is exact, its optimality within the class is not proven).  A class is a rule,
so its table is only needed where its chain goes: :func:`class_chain_table` decides each configuration with
the compiled rule (:func:`class_rule`) as the chain's breadth-first enumeration first meets it, without the
all-policy process (whose size limits :func:`class_table` to ME N <= 3); :func:`search_class` does so when
given no process.

Supported: M >= 2 (``2^free`` options per configuration, so M = 2-3 in practice), constant and
batch-dependent latencies, caps and co-running (the process applies the launch law, as bound 4 does).
The only limit is the size of the process (``max_states``); a compact class without the process is limited
by its own chain only.
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from tr_core.spec import SystemSpec

# the classes' names and metadata live in one registry (optimizer.policy_classes); these names stay importable
from optimizer.policy_classes import CLASS_CODE as _CLASS_CODE
from optimizer.policy_classes import CLASS_PARAMS, CLASSES  # noqa: F401
from optimizer.policy_classes import WINDOW_PARAM as _WINDOW_PARAM


class PolicyTooLarge(RuntimeError):
    """The decision process exceeds its state budget (a resource limit, exit code 3 on the command line)."""


@dataclass(frozen=True)
class PolicyTable:
    """A launch policy: ``states`` (n, M, 3) pre-decision configurations (k, b, r per model) and
    ``launch`` (n, M) booleans (idle model j launches; with k_j = 0, an empty batch)."""

    N: int
    states: np.ndarray = field(repr=False)
    launch: np.ndarray = field(repr=False)

    def __len__(self) -> int:
        return int(self.states.shape[0])

    def to_json(self) -> dict:
        """``{"schema_version": 1, "N": .., "entries": [{"k": [...], "b": [...], "r_quanta": [...],
        "launch": [...]}, ...]}`` (only configurations with an idle model carry a decision)."""
        idle = (self.states[:, :, 2] == 0).any(axis=1)
        S = np.asarray(self.states[idle], dtype=np.int64)
        cols = (S[:, :, 0].tolist(), S[:, :, 1].tolist(), S[:, :, 2].tolist(),
                np.asarray(self.launch[idle], dtype=bool).tolist())
        rows = [{"k": k, "b": b, "r_quanta": r, "launch": lm} for k, b, r, lm in zip(*cols)]
        return {"schema_version": 1, "N": self.N, "entries": rows}


@dataclass(frozen=True)
class PolicyResult:
    """The optimal policy at N, its exact throughput and the all-policy bound with the proven gap."""

    N: int
    throughput_tok_s: float            # exact chain under the table
    throughput_error_bound: float      # relative, proven (dtmc)
    upper_bound_tok_s: float           # all-policy bound: no launch policy exceeds it
    lower_bound_tok_s: float           # min_s D(h): the process optimum is at least this
    gap: float                         # (upper - throughput (1 - error)) / upper, proven
    table: PolicyTable
    process_states: int
    chain_states: int
    sweeps: int
    rounds: int                        # policy-iteration rounds after the value iteration
    empty_batches: bool                # the policy starts empty batches in some reachable configuration
    seconds: float


@dataclass
class Process:
    """The built all-policy decision process (arrays of :func:`optimizer._kernels.policy_mdp_build`)."""

    spec: SystemSpec
    N: int
    d: np.ndarray
    dco: np.ndarray | None
    caps: np.ndarray
    n: int
    keys: np.ndarray
    tau: np.ndarray
    g: np.ndarray
    out_ptr: np.ndarray
    out_prob: np.ndarray
    opt_ptr: np.ndarray
    opt_idx: np.ndarray
    ukey: np.ndarray
    init_key: int
    init_opts: np.ndarray
    bn: int
    br: int

    @property
    def M(self) -> int:
        return self.spec.M

    @functools.cached_property
    def configs(self) -> np.ndarray:
        """Every pre-decision configuration of the process, (n, M, 3) rows of (k, b, r), sorted by key."""
        pre = np.unique(np.concatenate([self.ukey, [self.init_key]]))
        return _unpack(self, pre)


def build_process(spec: SystemSpec, N: int, *, round_to_grid: bool = False, max_states: int = 2_000_000,
                  max_entries: int = 60_000_000) -> Process:
    """Enumerate the all-policy decision process at N (every idle model may launch, wait or start an empty
    batch at every epoch; co-running launch law when the spec has it)."""
    from optimizer import _kernels as K
    from optimizer.bounds import lowered

    N = int(N)
    M = spec.M
    low = lowered(spec, N, round_to_grid, empty=True)
    d, dco, caps, bn, br = low.d, low.dco, low.caps, low.bn, low.br
    if not low.fits:
        raise PolicyTooLarge(f"a state of M = {M} models at N = {N} needs {low.key_bits} bits (62 fit); "
                             f"use a coarser --delta-ms")
    box = K.Box(np.zeros(M, dtype=np.int64), np.full(M, N + 1, dtype=np.int64))
    res = K.policy_mdp_build(N, box, low.tables, K.Limits(int(max_states), int(max_entries)), True)
    st, n, keys, tau, g, out_ptr, out_prob, opt_ptr, opt_idx, ukey, key0, init = res
    if st == K.TOO_LARGE:
        raise PolicyTooLarge(f"the all-policy decision process at N = {N} has more than {max_states:,} states "
                             f"or {max_entries:,} option entries")
    if st != K.OK:
        raise RuntimeError("the all-policy decision process reached a configuration with no option (internal)")
    nu = int(out_ptr[n])
    return Process(spec, N, d, dco, caps, int(n), keys[:n].copy(),
                   tau[:n].astype(np.float64), g[:n].copy(), out_ptr[:n + 1].copy(), out_prob[:nu].copy(),
                   opt_ptr[:nu + 1].copy(), opt_idx[:int(opt_ptr[nu])].copy(), ukey[:nu].copy(), int(key0),
                   init.copy(), bn, br)


def _unpack(proc: Process, keys) -> np.ndarray:
    """(n, M, 3) rows of (k, b, r) of packed process keys (the chain's packing, :func:`dtmc.policy_configs`)."""
    from dtmc import policy_configs

    return policy_configs(keys, proc.M, proc.N, (1 << proc.br) - 1)


def value_iteration(proc: Process, *, rtol: float = 1e-10, max_sweeps: int = 200_000, omega: float = 0.7,
                    h: np.ndarray | None = None, floor_rtol: float = 1e-8, every: int = 8,
                    nref: int = 16) -> tuple[np.ndarray, float, float, int]:
    """Relative value iteration until the certificate bracket is within ``rtol``: ``(h, lower, upper, sweeps)``
    in tokens per quantum (``upper`` is proven for every policy, ``lower`` for the process optimum).

    One compiled loop (:func:`optimizer._kernels.mdp_solve`): reverse-order damped Gauss-Seidel sweeps, ``lam``
    re-estimated before every sweep from ``nref`` reference states (0: the bracket's midpoint), the bracket every
    ``every`` sweeps; it also stops where the bracket no longer narrows (rounding) once within ``floor_rtol``."""
    from optimizer import _kernels as K

    n = proc.n
    h = np.zeros(n) if h is None else np.array(h, dtype=np.float64)
    if n == 0:
        return h, -math.inf, math.inf, 0
    per_state = proc.opt_ptr[proc.out_ptr[1:n + 1]] - proc.opt_ptr[proc.out_ptr[:n]]
    terms = int(per_state.max()) + 8
    lam = float(np.sum(proc.g) / np.sum(proc.tau))
    settings = K.SolveSettings(float(omega), max(1, int(every)), max(0, int(nref)), float(rtol),
                               float(max(floor_rtol, rtol)), int(max_sweeps), terms)
    lo_b, hi_b, sweeps, _brackets = K.mdp_solve(_mdp(proc), h, lam, settings)
    return h, float(lo_b), float(hi_b), int(sweeps)


def _mdp(proc: Process):
    """The solvers' record of a process (:class:`optimizer._kernels.MDP`)."""
    from optimizer import _kernels as K

    return K.MDP(int(proc.n), proc.out_ptr, proc.out_prob, proc.opt_ptr, proc.opt_idx, proc.g, proc.tau)


def _choice_states(proc: Process, choice: np.ndarray, init_choice: int) -> np.ndarray:
    """Per outcome, the post-decision state its chosen option leads to."""
    return proc.opt_idx[proc.opt_ptr[:-1] + choice]


def policy_matrix(proc: Process, choice: np.ndarray):
    """The process's transition matrix under ``choice`` (option offset per outcome), over all its states."""
    import scipy.sparse as sp

    rows = np.repeat(np.arange(proc.n), np.diff(proc.out_ptr))
    cols = _choice_states(proc, choice, 0)
    return sp.csr_matrix((proc.out_prob, (rows, cols)), shape=(proc.n, proc.n))


def _evaluation_matrix(proc: Process, choice: np.ndarray, ref: int):
    """``I - P`` of the policy over the whole process with column ``ref`` replaced by the unit vector (CSC): the
    relative-value equations ``(I - P) h = g - T tau`` with ``h[ref] = 0`` (the unknown in that place is the
    residual of row ``ref``, 0 when ``T`` is the policy's gain)."""
    import scipy.sparse as sp

    n = proc.n
    rows = np.repeat(np.arange(n), np.diff(proc.out_ptr))
    cols = _choice_states(proc, choice, 0)
    keep = cols != ref
    eye = np.arange(n)
    return sp.csc_matrix((np.concatenate([np.ones(n), -proc.out_prob[keep]]),
                          (np.concatenate([eye, rows[keep]]), np.concatenate([eye, cols[keep]]))), shape=(n, n))


def greedy(proc: Process, h: np.ndarray) -> tuple[np.ndarray, int]:
    """The greedy choice of ``h`` per outcome and at the initial configuration (ties to the first option)."""
    from optimizer import _kernels as K

    nu = proc.out_ptr[-1]
    choice = K.greedy_choice(int(nu), proc.opt_ptr, proc.opt_idx, h, 0.0)
    init = int(np.argmax(h[proc.init_opts]))
    return choice, init


def table_of(proc: Process, choice: np.ndarray, init_choice: int) -> PolicyTable:
    """The policy table of a choice: one row per distinct pre-decision configuration."""
    pre = np.concatenate([proc.ukey, [proc.init_key]])
    post = np.concatenate([proc.keys[_choice_states(proc, choice, init_choice)],
                           [proc.keys[proc.init_opts[init_choice]]]])
    uk, first = np.unique(pre, return_index=True)
    S = _unpack(proc, uk)
    T = _unpack(proc, post[first])
    launch = (S[:, :, 2] == 0) & (T[:, :, 2] > 0)
    return PolicyTable(proc.N, S, launch)


def evaluate_table(spec: SystemSpec, N: int, table: PolicyTable, *, round_to_grid: bool = False,
                   solver: str = "auto", d=None, dco=None):
    """The exact chain under a policy table (:func:`dtmc.solve_policy_chain`), a :class:`dtmc.ChainSolution`."""
    from dtmc import solve_policy_chain
    from optimizer.bounds import _corun_quanta, _quanta

    if d is None:
        d = _quanta(spec, N, round_to_grid)
        dco = _corun_quanta(spec, N, round_to_grid)
    return solve_policy_chain(spec.P, spec.C, d, int(N), table.states, table.launch, caps=spec.caps(int(N)),
                              solver=solver, dco=dco)


def optimal_policy(spec: SystemSpec, N: int, *, round_to_grid: bool = False, rtol: float = 1e-10,
                   target_gap: float = 1e-6, max_rounds: int = 5, max_states: int = 2_000_000,
                   proc: Process | None = None) -> PolicyResult:
    """The optimal launch policy at N with its exact throughput and the proven gap to the all-policy bound."""
    import scipy.sparse.linalg as spla

    t0 = time.perf_counter()
    if proc is None:
        proc = build_process(spec, N, round_to_grid=round_to_grid, max_states=max_states)
    h, lo_b, hi_b, sweeps = value_iteration(proc, rtol=rtol, floor_rtol=0.01 * target_gap)
    scale = 1000.0 / spec.delta_ms
    rounds = 0
    while True:
        choice, init = greedy(proc, h)
        table = table_of(proc, choice, init)
        sol = evaluate_table(spec, N, table, d=proc.d, dco=proc.dco)
        T = sol.throughput_per_quantum
        low = T * (1.0 - sol.throughput_error_bound)
        gap = (hi_b - low) / hi_b
        if gap <= target_gap or rounds >= max_rounds:
            break
        # policy iteration: relative values of this policy over the whole process, then improve
        rounds += 1
        hp = spla.spsolve(_evaluation_matrix(proc, choice, int(proc.init_opts[init])), proc.g - T * proc.tau)
        if not np.all(np.isfinite(hp)):
            break
        h = hp
        from optimizer import _kernels as K
        per_state = proc.opt_ptr[proc.out_ptr[1:proc.n + 1]] - proc.opt_ptr[proc.out_ptr[:proc.n]]
        a, b, mag = K.mdp_bracket(_mdp(proc), h)
        err = mag * 4 * (int(per_state.max()) + 8) * np.finfo(np.float64).eps
        hi_b = min(hi_b, b + err)
    empty = _uses_empty(proc, table, choice, init)
    return PolicyResult(N=int(N), throughput_tok_s=T * scale, throughput_error_bound=sol.throughput_error_bound,
                        upper_bound_tok_s=hi_b * scale, lower_bound_tok_s=lo_b * scale, gap=max(0.0, gap),
                        table=table, process_states=proc.n, chain_states=int(sol.states), sweeps=sweeps, rounds=rounds,
                        empty_batches=empty, seconds=time.perf_counter() - t0)


def reachable(proc: Process, choice: np.ndarray, init: int) -> np.ndarray:
    """Boolean mask of the process states reachable under the choice from the initial configuration."""
    from scipy.sparse.csgraph import breadth_first_order

    T = policy_matrix(proc, choice)
    order = breadth_first_order(T, int(proc.init_opts[init]), directed=True, return_predecessors=False)
    mask = np.zeros(proc.n, dtype=bool)
    mask[order] = True
    return mask


def reached_configs(proc: Process, choice: np.ndarray, init: int) -> np.ndarray:
    """Packed pre-decision keys met under the choice (its reachable states' outcomes, and the initial one)."""
    mask = reachable(proc, choice, init)
    per = np.diff(proc.out_ptr)
    u_mask = np.repeat(mask, per)
    return np.unique(np.concatenate([proc.ukey[u_mask], [proc.init_key]]))


def _uses_empty(proc: Process, table: PolicyTable, choice: np.ndarray, init: int) -> bool:
    """Whether the policy starts an empty batch in a configuration it meets."""
    keys = reached_configs(proc, choice, init)
    packed = _packed(proc, table)
    pos = np.searchsorted(packed, keys)
    S, Lm = table.states[pos], table.launch[pos]
    return bool(((S[:, :, 0] == 0) & Lm).any())


def _packed(proc: Process, tab: PolicyTable) -> np.ndarray:
    """The table's keys in the process's packing (rows of :func:`table_of` are sorted by them)."""
    from dtmc import policy_keys

    return policy_keys(tab.states, proc.N, (1 << proc.br) - 1)


def decision_margins(proc: Process, h: np.ndarray) -> np.ndarray:
    """Per pre-decision configuration (rows of ``proc.configs``) and model j, how much launching beats
    waiting: ``max h`` over the options where idle model j launches minus ``max h`` over those where it
    waits (NaN where j is running, or cannot both launch and wait).  ``h``: relative values of
    :func:`value_iteration` (tokens per quantum times quanta); a margin within the value iteration's
    tolerance is a tie, either decision optimal."""
    M = proc.M
    keys = np.searchsorted(np.unique(np.concatenate([proc.ukey, [proc.init_key]])), proc.ukey)
    nent = np.diff(proc.opt_ptr)
    owner = np.repeat(keys, nent)
    post = _unpack(proc, proc.keys[proc.opt_idx])
    pre = proc.configs[owner]
    hv = h[proc.opt_idx]
    n = proc.configs.shape[0]
    out = np.full((n, M), np.nan)
    for j in range(M):
        idle = pre[:, j, 2] == 0
        launched = idle & (post[:, j, 2] > 0)
        a = np.full(n, -np.inf)
        b = np.full(n, -np.inf)
        np.maximum.at(a, owner[launched], hv[launched])
        waited = idle & ~launched
        np.maximum.at(b, owner[waited], hv[waited])
        ok = np.isfinite(a) & np.isfinite(b)
        out[ok, j] = a[ok] - b[ok]
    return out


def monotonicity(table: PolicyTable, only=None, margins=None, tol: float = 0.0) -> dict:
    """Is the launch decision monotone (non-decreasing) in the model's own queue for every state of the others?

    The system is closed, so a larger own queue ``k_j`` means fewer requests queued elsewhere.  For each
    model j, the rows where j is idle are grouped by the others' running batches and residuals ``(b_i, r_i)``
    and, for M >= 3, by the queues of all others but the first (which absorbs the change: its queue is
    ``N - k_j - ...``); along a group ``k_j`` moves requests between j's queue and that first other's queue.
    A group violates monotonicity when a launch at some ``k_j`` is followed by a wait at a larger ``k_j``.
    ``only``: a boolean row mask (e.g. the configurations met under the policy).  ``margins`` (rows as the
    table's, e.g. :func:`decision_margins` when the table is ``proc.configs``'s) with ``tol``: a decision
    whose margin is within ``tol`` is a tie and does not count (``launch`` then holds either way).
    Returns per model ``{"groups": .., "violations": .., "example": None or ((k_j, launch), ...) of the first
    violating group}``.
    """
    S, Lm = table.states, table.launch
    tie = np.zeros(Lm.shape, dtype=bool) if margins is None else np.abs(np.asarray(margins)) <= tol
    if only is not None:
        S, Lm, tie = S[only], Lm[only], tie[only]
    M = S.shape[1]
    out = {}
    for j in range(M):
        idle = S[:, j, 2] == 0
        strict = idle & ~tie[:, j]
        Sj, Lj = S[strict], Lm[strict, j]
        oth = [i for i in range(M) if i != j]
        key = np.concatenate([Sj[:, oth, 1], Sj[:, oth, 2], Sj[:, oth[1:], 0]], axis=1)
        groups: dict = {}
        for row, kj, lj in zip(map(tuple, key), Sj[:, j, 0], Lj):
            groups.setdefault(row, []).append((int(kj), bool(lj)))
        bad, example = 0, None
        for v in groups.values():
            v.sort()
            seen = False
            for _k, lj in v:
                if lj:
                    seen = True
                elif seen:
                    bad += 1
                    example = example or tuple(v)
                    break
        out[j] = {"groups": len(groups), "violations": bad, "example": example}
    return out


def class_table(proc: Process, cls: str, params) -> PolicyTable:
    """The table of a compact policy class over every configuration of the process (never an empty batch).

    ``busy``: ``params[j] = (B_idle, B_busy)``; idle model j launches when ``k_j >= B_idle`` while no other
    model runs (after the epoch's completions), ``k_j >= B_busy`` while one does.
    ``residual``: ``params[j] = (B_idle, B_long, B_short)``: as ``busy``, with ``B_long`` while the earliest
    of the others' running batches ends no sooner than j's step would (its duration under the launch law,
    ``dco_j`` with co-running, for the batch it would take) and ``B_short`` while it ends sooner.
    ``window``: ``params[j] = (B_j, W_j)``: idle model j launches when ``k_j >= B_j`` unless another model's
    running batch ends within ``W_j`` quanta (then it waits for the requests that batch will route;
    ``W_j = 0``: the threshold rule).
    ``ratio``: ``params[j] = (B_j, W_j)``: as ``window``, with a window that grows with the requests about to
    return and shrinks with the own queue: j waits while, for some running batch ending in ``t`` quanta,
    ``t * k_j <= W_j * A(t)``, ``A(t)`` the requests of the running batches that end within ``t``.  The models
    decide in turn, fastest step first, and a batch launched earlier in the same epoch counts as running
    (its residual: its step, ``dco`` when another model runs).
    A threshold of N + 1 never launches.
    """
    if cls not in CLASSES:
        raise ValueError(f"unknown policy class {cls!r}; choose one of {', '.join(CLASSES)}")
    # the one compiled rule (``_kernels._class_mask``) decides every configuration; the NumPy statement of the
    # same rule that used to live here is the tests' independent oracle (tests/policy_reference.py)
    return PolicyTable(proc.N, proc.configs, class_rule(proc, cls, params, proc.configs))


def threshold_table(proc: Process, B) -> PolicyTable:
    """The table of a threshold vector (``busy`` with equal thresholds)."""
    return class_table(proc, "busy", [(int(b), int(b)) for b in B])


@dataclass(frozen=True)
class RuleGrid:
    """What a compact class's rule and its chain need at N, without the all-policy process: the step
    lengths in quanta (``d``; ``dco`` with co-running, else None), the batch caps, the routing outcomes and
    the key packing (the chain's).  A :class:`Process` carries the same ``N``, ``d``, ``dco`` and ``caps``."""

    spec: SystemSpec
    N: int
    d: np.ndarray = field(repr=False)
    dco: np.ndarray | None = field(repr=False)
    caps: np.ndarray = field(repr=False)
    outcomes: tuple = field(repr=False)
    bn: int
    br: int

    @property
    def M(self) -> int:
        return self.spec.M


def rule_grid(spec: SystemSpec, N: int, *, round_to_grid: bool = False) -> RuleGrid:
    """The :class:`RuleGrid` of ``spec`` at N (cheap: no enumeration)."""
    from optimizer.bounds import lowered

    N = int(N)
    low = lowered(spec, N, round_to_grid)
    if not low.fits:
        raise PolicyTooLarge(f"a state of M = {spec.M} models at N = {N} needs {low.key_bits} bits "
                             f"(62 fit); use a coarser --delta-ms")
    return RuleGrid(spec, N, low.d, low.dco, low.caps, low.outcomes, low.bn, low.br)




def _rule_args(grid, cls: str, params):
    """The kernel arguments of class ``cls``'s rule on a :class:`RuleGrid` or :class:`Process`."""
    if cls not in CLASSES:
        raise ValueError(f"unknown policy class {cls!r}; choose one of {', '.join(CLASSES)}")
    M = grid.M
    par = np.ascontiguousarray(np.asarray(params, dtype=np.int64).reshape(M, CLASS_PARAMS[cls]))
    order = np.array(sorted(range(M), key=lambda m: (int(grid.d[m, 1]), m)), dtype=np.int64)
    d = np.ascontiguousarray(grid.d, dtype=np.int64)
    dco = d if grid.dco is None else np.ascontiguousarray(grid.dco, dtype=np.int64)
    return _CLASS_CODE[cls], par, order, np.ascontiguousarray(grid.caps, dtype=np.int64), d, dco


def class_rule(grid, cls: str, params, states) -> np.ndarray:
    """The launch bits ((n, M) booleans) of class ``cls`` in the pre-decision configurations ``states``
    ((n, M, 3) rows of k, b, r) on a :class:`RuleGrid` or :class:`Process`: the compiled rule that
    :func:`class_chain_table` and :func:`class_table` apply (the one statement of the class rules in package code)."""
    from optimizer import _kernels as K

    code, par, order, caps, d, dco = _rule_args(grid, cls, params)
    S = np.asarray(states, dtype=np.int64)
    return K.class_launch(code, np.ascontiguousarray(S[:, :, 0]), np.ascontiguousarray(S[:, :, 1]),
                          np.ascontiguousarray(S[:, :, 2]), par, order, caps, d, dco)


@dataclass(frozen=True)
class ReachedTable:
    """A class's table over the configurations its chain meets (:func:`class_chain_table`)."""

    table: PolicyTable
    chain_states: int          # the chain's states (post-decision), as :func:`dtmc.solve_policy_chain` finds
    seconds: float


def class_chain_table(spec: SystemSpec, N: int, cls: str, params, *, round_to_grid: bool = False,
                      grid: RuleGrid | None = None, max_states: int = 20_000_000) -> ReachedTable:
    """The table of a compact class over exactly the pre-decision configurations its chain meets, without
    the all-policy process: a breadth-first enumeration of the chain under the class's rule
    (:func:`optimizer._kernels.class_reach`) decides each configuration when it is first met.  Its decisions
    are :func:`class_table`'s on every configuration (the same compiled rule), and
    :func:`evaluate_table` on it is the class's exact chain.

    Raises :class:`dtmc.DTMCError` when the rule deadlocks (no model runs after a decision) and
    :class:`PolicyTooLarge` beyond ``max_states`` chain states."""
    from dtmc import DTMCError, policy_configs
    from optimizer import _kernels as K

    t0 = time.perf_counter()
    if grid is None:
        grid = rule_grid(spec, N, round_to_grid=round_to_grid)
    code, par, order, caps, d, dco = _rule_args(grid, cls, params)
    offsets, parts, prob = grid.outcomes
    tables = K.ChainTables(caps, d, dco, grid.dco is not None, np.zeros(grid.M), offsets, parts, prob, grid.bn,
                           grid.br)
    st, n, ckeys, cmask, nc = K.class_reach(grid.N, K.ClassRule(code, par, order), tables, int(max_states))
    if st == K.TOO_LARGE:
        raise PolicyTooLarge(f"the chain of class {cls} {tuple(int(x) for x in par.ravel())} at N = {grid.N} "
                             f"has more than {max_states:,} states")
    if st == K.DEADLOCK:
        raise DTMCError(f"class {cls} {tuple(int(x) for x in par.ravel())} reaches a configuration where no "
                        f"model runs (deadlock)")
    keys = ckeys[:nc]
    order_k = np.argsort(keys, kind="mergesort")
    S = policy_configs(keys[order_k], grid.M, grid.N, (1 << grid.br) - 1)
    mask = cmask[:nc][order_k]
    launch = ((mask[:, None] >> np.arange(grid.M, dtype=np.int64)[None, :]) & 1).astype(bool)
    return ReachedTable(PolicyTable(grid.N, S, launch), int(n), time.perf_counter() - t0)


def class_start(cls: str, B) -> list[int]:
    """A class's parameters equal to the threshold vector ``B`` (the search's start; windows 0)."""
    return [0 if w else int(b) for b in B for w in _WINDOW_PARAM[cls]]


def fit_class(proc: Process | None, cls: str, table: PolicyTable, only=None) -> list[int]:
    """The member of class ``window`` that agrees with ``table`` (e.g. the optimal policy's) on the most
    decisions of the rows in ``only`` (default all), model by model (a model's decisions in this class depend
    on its own parameters only); candidate windows are the residuals met there.  A start for
    :func:`search_class` where a steepest ascent from B* stalls (a class member far from B* in several
    parameters at once).  ``proc`` is not needed (the table has N and M)."""
    if cls != "window":
        raise ValueError(f"fit_class supports 'window', not {cls!r}")
    S, L = table.states, table.launch
    if only is not None:
        S, L = S[only], L[only]
    M, N = table.states.shape[1], table.N
    big = np.int64(1) << 40
    running = S[:, :, 2] > 0
    out: list[int] = []
    for j in range(M):
        oth = [i for i in range(M) if i != j]
        idle = ~running[:, j]
        other = running[:, oth].any(axis=1)
        rmin = np.where(running[:, oth], S[:, oth, 2], big).min(axis=1)
        cands = np.unique(np.concatenate([[0], rmin[idle & other]]))
        best, arg = -1, None
        kj = S[:, j, 0]
        for B in range(1, N + 2):
            for W in cands:
                lj = idle & (kj >= B) & ~(rmin <= W)
                agree = int((lj[idle] == L[idle, j]).sum())
                if agree > best:
                    best, arg = agree, (B, int(W))
        out += list(arg)
    return out


def class_value(spec: SystemSpec, N: int, proc: Process | None, cls: str, params, *, round_to_grid: bool = False,
                grid: RuleGrid | None = None, max_states: int = 20_000_000):
    """The exact chain of a class member (a :class:`dtmc.ChainSolution`): over the process's configurations
    (:func:`class_table`) when ``proc`` is given, else over the configurations its chain meets
    (:func:`class_chain_table`, no process; ``grid`` saves recomputing the step tables)."""
    if proc is not None:
        return evaluate_table(spec, N, class_table(proc, cls, params), d=proc.d, dco=proc.dco)
    if grid is None:
        grid = rule_grid(spec, N, round_to_grid=round_to_grid)
    tab = class_chain_table(spec, N, cls, params, grid=grid, max_states=max_states).table
    return evaluate_table(spec, N, tab, d=grid.d, dco=grid.dco)


def search_class(spec: SystemSpec, N: int, proc: Process | None, cls: str, start, *, max_evals: int = 400,
                 round_to_grid: bool = False, progress=None, max_states: int = 20_000_000):
    """Steepest ascent over ``+-1`` moves of a class's thresholds from ``start`` (and jumps to 1 and to N + 1,
    never) and moves of ``+-1, 2, 4, ...`` quanta up to the longest step of its windows (``>= 0``, and a jump
    to 0); ``(params, tok/s, evaluated)``.

    ``proc`` None: each member is evaluated on the configurations its own chain meets
    (:func:`class_chain_table`), without the all-policy process (the same values; ``round_to_grid`` as the
    process would have used; :class:`PolicyTooLarge` when a member's chain exceeds ``max_states``).
    ``progress(params, tok/s)``: called at each improvement.
    A parameter set whose chain deadlocks is skipped.  A heuristic: the value is exact, the optimality in
    the class is not proven."""
    from dtmc import DTMCError

    scale = 1000.0 / spec.delta_ms
    cache: dict = {}
    grid = proc if proc is not None else rule_grid(spec, N, round_to_grid=round_to_grid)

    win = _WINDOW_PARAM[cls] * grid.M
    dlong = int(grid.d.max()) if grid.dco is None else int(max(grid.d.max(), grid.dco.max()))
    wbits = max(1, dlong.bit_length())

    def val(p):
        p = tuple(int(x) for x in p)
        if p not in cache:
            if any((x < 0) if w else (x < 1 or x > N + 1) for x, w in zip(p, win)):
                cache[p] = -math.inf
            else:
                try:
                    cache[p] = class_value(spec, N, proc, cls, p, grid=None if proc is not None else grid,
                                           max_states=max_states).throughput_per_quantum * scale
                except DTMCError:
                    cache[p] = -math.inf
        return cache[p]

    cur = tuple(int(x) for x in start)
    best = val(cur)
    while len(cache) < max_evals:
        nxt = None
        for i in range(len(cur)):
            moves = ([cur[i] + s * (1 << e) for e in range(wbits) for s in (-1, 1)] + [0]) if win[i] \
                else (cur[i] - 1, cur[i] + 1, 1, N + 1)
            for to in moves:
                q = list(cur)
                q[i] = to
                v = val(q)
                if v > best * (1 + 1e-12):
                    best, nxt = v, tuple(q)
        if nxt is not None and progress is not None:
            progress(nxt, best)
        if nxt is None:
            break
        cur = nxt
    return cur, best, len(cache)
