"""The chain under a launch-policy table, and the optimal launch policy (issue 27)."""

import numpy as np
import pytest

from dtmc import DTMCError, solve_chain, solve_policy_chain, stationary_distribution
from optimizer.policy import (PolicyTable, build_process, class_table, evaluate_table, greedy, monotonicity,
                              optimal_policy, policy_matrix, reachable, threshold_table, value_iteration)
from tr_core.spec import make_spec, preset


def _r2r():
    return preset("r2r", [6.0, 27.9], p=0.35)


def _quanta(spec, N):
    d, _ = spec.quanta_table(N)
    dco = spec.corun_quanta_table(N)[0] if spec.has_corun else None
    return d, dco


SYSTEMS = [
    ("r2r", _r2r(), 5, [(1, 1), (1, 3), (2, 2), (3, 1), (1, 5)]),
    ("r2r-corun", _r2r().with_corun([2.8, 2.0]), 4, [(1, 1), (1, 3), (2, 3)]),
    ("me3-caps", make_spec([0.3, 0.5, 0.7], [[0.5, 0.3, 0.2]] * 3, [[1, 1, 1]] * 3, delta_ms=0.1,
                           max_batch_size=[2, 3, 4]), 3, [(1, 1, 1), (2, 1, 1), (1, 2, 2)]),
    ("r2r-Lb-cap", make_spec([0.6, 2.0], [[0.65, 0.35], [1.0, 0.0]], [[1, 0], [1, 0]], delta_ms=0.1,
                             latency_curves=[{"intercept_ms": 0.5, "per_request_ms": 0.1},
                                             {"intercept_ms": 1.8, "per_request_ms": 0.2}],
                             max_batch_size=[None, 3], corun_latency=[2.0, 1.5]), 5,
     [(1, 1), (1, 3), (2, 2), (4, 2)]),
]


@pytest.mark.parametrize("name,spec,N,Bs", SYSTEMS, ids=[s[0] for s in SYSTEMS])
def test_threshold_table_reproduces_the_threshold_chain(name, spec, N, Bs):
    proc = build_process(spec, N)
    d, dco = _quanta(spec, N)
    for B in Bs:
        ref = solve_chain(spec.P, spec.C, d, N, B, caps=spec.caps(N), dco=dco)
        got = evaluate_table(spec, N, threshold_table(proc, B))
        assert got.states == ref.states and got.transitions == ref.transitions
        assert got.throughput_per_quantum == pytest.approx(ref.throughput_per_quantum, rel=1e-12, abs=0)


def test_the_table_decides():
    """Flipping one decision the threshold policy meets changes the chain; a missing row is refused."""
    spec, N = _r2r(), 4
    proc = build_process(spec, N)
    tab = threshold_table(proc, (1, 3))
    base = evaluate_table(spec, N, tab).throughput_per_quantum
    # the configuration (k0 = 1 idle, model 1 idle with 3 waiting) launches model 1 under B = (1, 3)
    S = tab.states
    row = np.flatnonzero((S[:, 0, 0] == 1) & (S[:, 1, 0] == 3) & (S[:, :, 2] == 0).all(axis=1))
    assert row.size == 1 and tab.launch[row[0], 1]
    launch = tab.launch.copy()
    launch[row[0], 1] = False
    other = evaluate_table(spec, N, PolicyTable(N, S, launch)).throughput_per_quantum
    assert abs(other - base) > 1e-6 * base
    keep = np.ones(len(tab), dtype=bool)
    keep[row[0]] = False
    d, _ = _quanta(spec, N)
    with pytest.raises(DTMCError, match="no valid decision"):
        solve_policy_chain(spec.P, spec.C, d, N, S[keep], tab.launch[keep])
    bad = tab.launch.copy()
    bad[:, 0] = True            # launches model 0 while it runs
    with pytest.raises(DTMCError, match="no valid decision"):
        solve_policy_chain(spec.P, spec.C, d, N, S, bad)


@pytest.mark.parametrize("name,spec,N", [("r2r", _r2r(), 4), ("r2r-corun", _r2r().with_corun([2.8, 2.0]), 4),
                                         ("me3", preset("me", [0.3, 0.5, 0.7], weights=[0.5, 0.3, 0.2]), 3),
                                         ("r2r-Lb-cap", SYSTEMS[3][1], 4)])
def test_optimal_policy_meets_the_bound(name, spec, N):
    proc = build_process(spec, N)
    r = optimal_policy(spec, N, proc=proc)
    assert r.gap <= 1e-6
    assert r.throughput_tok_s <= r.upper_bound_tok_s * (1 + 1e-9)
    # no threshold vector beats it
    d, dco = _quanta(spec, N)
    from tr_core.feasibility import iter_feasible
    best = max(solve_chain(spec.P, spec.C, d, N, B, caps=spec.caps(N), dco=dco).throughput_per_quantum
               for B in iter_feasible(N, spec.M))
    assert r.throughput_tok_s >= best * 1000 / spec.delta_ms * (1 - 1e-9)
    # independent evaluation: the process's own matrix under the greedy choice, on its reachable states
    h, _lo, _hi, _sw = value_iteration(proc, rtol=1e-10)
    choice, init = greedy(proc, h)
    mask = reachable(proc, choice, init)
    T = policy_matrix(proc, choice)[mask][:, mask].tocsr()
    pi = stationary_distribution(T, solver="gth").pi
    thr = float(pi @ proc.g[mask] / (pi @ proc.tau[mask])) * 1000 / spec.delta_ms
    assert thr == pytest.approx(r.throughput_tok_s, rel=1e-10)
    assert r.chain_states == int(mask.sum())


def test_busy_class_and_monotonicity():
    spec, N = _r2r(), 4
    proc = build_process(spec, N)
    a = evaluate_table(spec, N, class_table(proc, "busy", [(1, 1), (3, 3)])).throughput_per_quantum
    d, _ = _quanta(spec, N)
    assert a == pytest.approx(solve_chain(spec.P, spec.C, d, N, (1, 3)).throughput_per_quantum, rel=1e-12)
    b = evaluate_table(spec, N, class_table(proc, "busy", [(1, 2), (3, 3)])).throughput_per_quantum
    assert b != pytest.approx(a, rel=1e-9)
    # model 0 launches at k0 = 1 and waits at k0 = 2 (model 1 running the same batch, one request moved
    # from its queue to model 0's): flagged; launching at both is monotone
    S = np.array([[[1, 0, 0], [1, 1, 5]], [[2, 0, 0], [0, 1, 5]], [[2, 0, 0], [0, 1, 4]]])
    flags = monotonicity(PolicyTable(3, S, np.array([[True, False], [False, False], [True, False]])))
    assert flags[0]["groups"] == 2 and flags[0]["violations"] == 1 and flags[0]["example"] == ((1, True), (2, False))
    flags = monotonicity(PolicyTable(3, S, np.array([[True, False], [True, False], [True, False]])))
    assert flags[0]["violations"] == 0


def test_residual_class_reaches_the_optimum_at_small_n():
    """R2R, N = 4: the SLM waits while the LLM's batch ends before its own step would; that one rule is the
    optimal policy (equal throughput), and with B_short = B_long the class is the threshold chain."""
    spec, N = _r2r(), 4
    proc = build_process(spec, N)
    d, _ = _quanta(spec, N)
    same = evaluate_table(spec, N, class_table(proc, "residual", [(1, 1, 1), (3, 3, 3)])).throughput_per_quantum
    assert same == pytest.approx(solve_chain(spec.P, spec.C, d, N, (1, 3)).throughput_per_quantum, rel=1e-12)
    opt = optimal_policy(spec, N, proc=proc)
    res = evaluate_table(spec, N, class_table(proc, "residual", [(1, 1, 2), (3, 3, 3)]))
    assert res.throughput_per_quantum * 1e4 == pytest.approx(opt.throughput_tok_s, rel=1e-10)
    assert res.throughput_per_quantum > same * (1 + 1e-3)


def test_policy_iteration_closes_a_loose_value_iteration():
    """Value iteration stopped at a 20 % bracket leaves a greedy policy whose proven gap is large; the
    policy-iteration rounds bring it to the optimum (the same throughput as the tight solve) with gap <= 1e-6."""
    spec, N = _r2r(), 4
    proc = build_process(spec, N)
    tight = optimal_policy(spec, N, proc=proc)
    loose = optimal_policy(spec, N, proc=proc, rtol=0.2)
    assert loose.rounds >= 1 and loose.gap <= 1e-6
    assert loose.throughput_tok_s == pytest.approx(tight.throughput_tok_s, rel=1e-10)
    stuck = optimal_policy(spec, N, proc=proc, rtol=0.2, max_rounds=0)
    assert stuck.rounds == 0 and stuck.gap > 1e-6


def test_window_class():
    """W = 0 is the threshold chain; the SLM's window of one SLM step (wait while the LLM returns sooner) is
    the optimum at R2R N = 4 (the residual rule); the search from B* finds a value at least as high."""
    spec, N = _r2r(), 4
    proc = build_process(spec, N)
    d, _ = _quanta(spec, N)
    same = evaluate_table(spec, N, class_table(proc, "window", [(1, 0), (3, 0)])).throughput_per_quantum
    assert same == pytest.approx(solve_chain(spec.P, spec.C, d, N, (1, 3)).throughput_per_quantum, rel=1e-12)
    opt = optimal_policy(spec, N, proc=proc)
    win = evaluate_table(spec, N, class_table(proc, "window", [(1, int(d[0, 1]) - 1), (3, 0)]))
    assert win.throughput_per_quantum * 1e4 == pytest.approx(opt.throughput_tok_s, rel=1e-10)
    from optimizer.policy import class_start, search_class
    p, v, _n = search_class(spec, N, proc, "window", class_start("window", (1, 3)))
    assert v >= opt.throughput_tok_s * (1 - 1e-9)
    # a window of 0 quanta on every model but with the ratio class is again the threshold chain
    r0 = evaluate_table(spec, N, class_table(proc, "ratio", [(1, 0), (3, 0)])).throughput_per_quantum
    assert r0 == pytest.approx(same, rel=1e-12)


def test_ratio_window_waits_for_returning_requests():
    """The ratio class's decisions: model 0 (the fastest, deciding first) waits exactly where some running batch
    ends in ``t`` quanta with ``t k_0 <= W A(t)``; the slowest model sees the batch model 0 just launched."""
    from optimizer.policy import Process
    spec, N = preset("me", [0.3, 0.5, 0.7], weights=[0.5, 0.3, 0.2]), 3
    proc = build_process(spec, N)
    S = proc.configs
    tab = class_table(proc, "ratio", [(1, 2), (1, 0), (1, 0)])
    for s, lm in zip(S, tab.launch):
        k0, idle0 = s[0, 0], s[0, 2] == 0
        if not idle0 or k0 == 0:
            assert not lm[0]
            continue
        run = [i for i in (1, 2) if s[i, 2] > 0]
        wait = any(s[i, 2] * k0 <= 2 * sum(s[l, 1] for l in run if s[l, 2] <= s[i, 2]) for i in run)
        assert lm[0] == (not wait)
    assert isinstance(proc, Process)
    # all idle, k = (2, 0, 1): model 0 launches 2 (a step of d_0(2) quanta, A = 2 requests coming back);
    # model 2 (queue 1) waits iff d_0(2) * 1 <= W_2 * 2
    row = np.flatnonzero((S[:, :, 0] == [2, 0, 1]).all(axis=1) & (S[:, :, 2] == 0).all(axis=1))
    assert row.size == 1
    t = int(proc.d[0, 2])
    seen = set()
    for W2 in range(t + 1):
        lm = class_table(proc, "ratio", [(1, 0), (1, 0), (1, W2)]).launch[row[0]]
        assert lm[0] and lm[2] == (t > 2 * W2)
        seen.add(bool(lm[2]))
    assert seen == {True, False}


def test_decision_margins_agree_with_the_optimal_table():
    """Where the margin of launching over waiting is clear, the optimal (greedy) table takes that side; a
    non-monotone group made only of ties is not counted."""
    from optimizer.policy import decision_margins, table_of
    spec, N = _r2r(), 6
    proc = build_process(spec, N)
    h, _lo, _hi, _sw = value_iteration(proc, rtol=1e-10)
    choice, init = greedy(proc, h)
    tab = table_of(proc, choice, init)
    assert np.array_equal(tab.states, proc.configs)
    marg = decision_margins(proc, h)
    tol = 1e-9 * (np.abs(h).max() + 1)
    clear = np.isfinite(marg) & (np.abs(marg) > tol)
    assert clear.any()
    assert np.array_equal(tab.launch[clear], marg[clear] > 0)
    # the 2-model example of test_busy_class_and_monotonicity with the offending wait marked a tie
    S = np.array([[[1, 0, 0], [1, 1, 5]], [[2, 0, 0], [0, 1, 5]]])
    Lm = np.array([[True, False], [False, False]])
    assert monotonicity(PolicyTable(3, S, Lm))[0]["violations"] == 1
    m = np.array([[1.0, np.nan], [0.0, np.nan]])
    assert monotonicity(PolicyTable(3, S, Lm), margins=m, tol=1e-12)[0]["violations"] == 0


def test_window_from_the_fitted_start_reaches_the_corun_optimum():
    """R2R with co-running 1.5 / 1.05 at N = 4: the ascent from B* stalls 2 % below the optimum; from the window
    member that best fits the optimal table it reaches it: the SLM launches at any queue unless the LLM returns
    within its window.  Empty batches are ties there: the greedy table may start one in a configuration it meets
    (the solver before issue 27 target 3 did, in two), but only where launching and waiting are worth the same
    to rounding."""
    from optimizer.policy import (_packed, class_start, decision_margins, fit_class, reached_configs, search_class,
                                  table_of)
    spec, N = _r2r().with_corun([1.5, 1.05]), 4
    proc = build_process(spec, N, round_to_grid=True)
    opt = optimal_policy(spec, N, proc=proc, round_to_grid=True)
    h, _lo, _hi, _sw = value_iteration(proc, rtol=1e-10)
    choice, init = greedy(proc, h)
    tab = table_of(proc, choice, init)
    met = np.isin(_packed(proc, tab), reached_configs(proc, choice, init))
    empty = (tab.states[:, :, 0] == 0) & tab.launch & met[:, None]
    marg = decision_margins(proc, h)
    assert np.all(np.abs(marg[empty]) <= 1e-9 * (np.abs(h).max() + 1))
    start = fit_class(proc, "window", tab, met)
    p, v, _n = search_class(spec, N, proc, "window", start)
    assert v == pytest.approx(opt.throughput_tok_s, rel=1e-10)
    _p, vb, _n = search_class(spec, N, proc, "window", class_start("window", (2, 3)))
    assert vb < opt.throughput_tok_s * (1 - 0.01)
    with pytest.raises(ValueError):
        fit_class(proc, "ratio", tab, met)


def test_optimal_decision_is_monotone_where_the_policy_goes_but_not_everywhere():
    """R2R N = 8: in the configurations the optimal policy meets, every model's launch decision is monotone in its
    own queue for each state of the other; over all configurations of the process it is not, and the
    violations are strict (margins beyond the value iteration's tolerance), not ties of the greedy choice."""
    from optimizer.policy import _packed, decision_margins, reached_configs, table_of
    spec, N = _r2r(), 8
    proc = build_process(spec, N)
    h, _lo, _hi, _sw = value_iteration(proc, rtol=1e-10)
    choice, init = greedy(proc, h)
    tab = table_of(proc, choice, init)
    met = np.isin(_packed(proc, tab), reached_configs(proc, choice, init))
    marg = decision_margins(proc, h)
    tol = 1e-9 * (np.abs(h).max() + 1)
    on_met = monotonicity(tab, only=met, margins=marg, tol=tol)
    assert all(m["violations"] == 0 for m in on_met.values())
    assert sum(m["groups"] for m in on_met.values()) >= 5
    everywhere = monotonicity(tab, margins=marg, tol=tol)
    assert sum(m["violations"] for m in everywhere.values()) > 0
