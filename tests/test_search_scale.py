"""Searches at server scale: the eager chain is a rival like any other, and a chain over the state budget is
bounded, never a refusal (the answer is then certified with the gap its bound leaves)."""

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from optimizer import branch, optimize_thresholds
from optimizer.optimum import with_eager_estimate
from tr_core.errors import StateSpaceTooLarge
from tr_core.spec import make_spec, preset
from tr_model import api

R2R = preset("r2r", [6.0, 27.9], p=0.35)


def _exhaustive_table(spec, N):
    ex = optimize_thresholds(spec, N, search="exhaustive")
    return ex, {e.B: e.throughput_tok_s for e in ex.evaluations}


@pytest.mark.parametrize("N", [9, 12])
def test_eager_over_its_first_cap_is_a_rival_and_the_answer_is_unchanged(N, monkeypatch):
    ex, table = _exhaustive_table(R2R, N)
    monkeypatch.setattr(branch, "EAGER_FIRST_STATES", 5)      # no eager chain fits: it waits its turn
    o = optimize_thresholds(R2R, N, search="pruned")
    assert o.best_B == ex.best_B and o.throughput_tok_s == pytest.approx(ex.throughput_tok_s, rel=1e-12)
    assert o.certificate == "pruned-exact"
    if o.eager is None:                     # rejected by a bound, never solved
        assert o.eager_method == "none" and o.to_dict()["eager_throughput_tok_s"] is None
        assert any(B == (1, 1) for B, _, _ in o.pruned_vectors)
    else:
        assert o.eager_method == "exact" and o.eager_throughput_tok_s == pytest.approx(table[(1, 1)], rel=1e-9)


def test_the_api_simulates_an_eager_baseline_the_search_never_solved(monkeypatch):
    N = 12
    ex, table = _exhaustive_table(R2R, N)
    monkeypatch.setattr(branch, "EAGER_FIRST_STATES", 5)
    o = api.optimize(R2R, N, search="pruned")
    assert o.best_B == ex.best_B
    if o.eager is None:
        assert o.eager_method == "simulated" and o.eager_ci95_tok_s > 0
        assert abs(o.eager_throughput_tok_s - table[(1, 1)]) <= 4 * o.eager_ci95_tok_s
        assert o.gain_vs_eager == pytest.approx(o.throughput_tok_s / o.eager_throughput_tok_s)
        d = o.to_dict()
        assert d["eager_method"] == "simulated" and d["eager_ci95_tok_s"] == o.eager_ci95_tok_s
    else:
        assert o.eager_method == "exact"
    # a search told to skip the baseline gets none
    assert api.optimize(R2R, N, search="pruned", eager=False).eager_method == "none"


def test_an_exact_baseline_is_never_replaced():
    o = optimize_thresholds(R2R, 5, search="exhaustive")
    assert o.eager is not None and with_eager_estimate(o, 1.0, 0.1, "simulated") is o


@pytest.mark.parametrize("search", ["pruned", "certified"])
def test_chains_over_the_state_budget_are_bounded_not_refused(search):
    """max_states below most chains: before, the search stopped with StateSpaceTooLarge."""
    N = 8
    ex, table = _exhaustive_table(R2R, N)
    o = optimize_thresholds(R2R, N, search=search, max_states=60)
    assert o.best_B in table and o.throughput_tok_s == pytest.approx(table[o.best_B], rel=1e-12)
    # whatever is left unresolved, the upper bound covers every feasible vector, the optimum included
    assert o.upper_bound_tok_s >= max(table.values()) * (1 - 1e-9)
    assert o.gap == pytest.approx(max(0.0, (o.upper_bound_tok_s - o.throughput_tok_s) / o.upper_bound_tok_s))
    big = [B for B in table if B not in {e.B for e in o.evaluations}]
    assert big and o.evaluated + o.pruned + o.unresolved == len(table)
    if o.certificate == "pruned-exact":
        assert o.best_B == ex.best_B


@st.composite
def small_specs(draw):
    M = draw(st.integers(2, 3))
    rows = []
    for _ in range(M):
        w = [draw(st.integers(1, 4)) for _ in range(M)]
        rows.append([x / sum(w) for x in w])
    C = [[draw(st.sampled_from([0.0, 1.0])) for _ in range(M)] for _ in range(M)]
    L = [float(draw(st.integers(1, 5))) for _ in range(M)]
    return make_spec(L, rows, C, delta_ms=1.0)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_specs(), st.integers(2, 5), st.integers(4, 40))
def test_a_state_budget_never_breaks_the_certificate(spec, N, cap):
    """Random systems and state budgets: the reported bound is never below the true optimum, and an answer
    that says it is exact is the exhaustive one."""
    ex, table = _exhaustive_table(spec, N)
    try:
        o = optimize_thresholds(spec, N, search="pruned", max_states=cap)
    except StateSpaceTooLarge as e:          # only when no chain at all fits
        assert "no threshold vector's chain fits" in str(e)
        assert min(x.states for x in ex.evaluations) > cap
        return
    assert o.upper_bound_tok_s >= max(table.values()) * (1 - 1e-9)
    assert o.throughput_tok_s == pytest.approx(table[o.best_B], rel=1e-9)
    if o.certificate == "pruned-exact":
        assert o.best_B == ex.best_B


@pytest.mark.parametrize("N", [10, 14])
def test_boxes_over_their_cap_cost_no_build_and_the_certificate_still_covers_the_optimum(N):
    """Every box over a tiny state cap (the first grid's too): the certified search leaves their vectors to their proven bound
    (no enumeration), the exact search still evaluates them; both answers stay honest."""
    ex, table = _exhaustive_table(R2R, N)
    stats: dict = {}
    o = branch.branch_and_bound(R2R, N, boxes=True, max_gap=0.02, max_box_states=60, stats=stats, cheap_states=30,
                                cheap_factor=1, first_box_states=None)
    assert stats.get("boxes_too_large", 0) > 0 and stats.get("left_to_bound", 0) > 0
    assert o.certificate == "certified" and o.unresolved >= stats["left_to_bound"]
    assert o.throughput_tok_s <= ex.throughput_tok_s * (1 + 1e-12)
    assert o.upper_bound_tok_s >= ex.throughput_tok_s * (1 - 1e-9)       # the certificate covers B*
    for B, _, v in o.pruned_vectors:
        assert v >= table[B] * (1 - 1e-9)
    stats_x: dict = {}
    x = branch.branch_and_bound(R2R, N, boxes=True, max_gap=0.0, max_box_states=60, stats=stats_x, cheap_states=30,
                                cheap_factor=1, first_box_states=None)
    assert x.best_B == ex.best_B and x.certificate == "pruned-exact"
    assert stats_x.get("left_to_bound", 0) == 0


def test_a_vector_below_a_failed_box_top_is_not_built():
    assert branch._below_any((3, 5), [(4, 5)]) and not branch._below_any((5, 5), [(4, 5)])
    assert branch._in_boxes((2, 3), [((1, 1), (2, 4))]) and not branch._in_boxes((3, 3), [((1, 1), (2, 4))])


def test_server_scale_sweeps_solve_a_second_all_policy_level():
    from optimizer import search
    assert search._policy_levels(R2R, 12, 256) == (12, search.SERVER_POLICY_N)
    assert search._policy_levels(R2R, 12, 128) == (12,)
    # a gap below what the level leaves: not solved, unless a time budget may leave vectors to its bound
    assert search._policy_levels(R2R, 12, 256, max_gap=0.001) == (12,)
    assert search._policy_levels(R2R, 12, 256, max_gap=0.001, time_budget_s=60.0) == (12, search.SERVER_POLICY_N)
    me = preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2])
    assert search._policy_levels(me, 12, 256) == (12,)


def test_the_first_grid_gets_its_own_larger_cap_and_the_answer_stays_exact():
    """A cap under every box process: with the first grid's own cap its boxes are built and prune (fewer
    vectors left to single chains); without it they are over the cap.  Either way B* is the exhaustive one."""
    N = 14
    ex, _ = _exhaustive_table(R2R, N)
    out = {}
    for first in (None, 10**6):
        stats: dict = {}
        o = branch.branch_and_bound(R2R, N, boxes=True, max_box_states=60, first_box_states=first, stats=stats,
                                    cheap_states=30, cheap_factor=1)
        assert o.best_B == ex.best_B and o.certificate == "pruned-exact"
        out[first] = (stats, o)
    small, big = out[None][0], out[10**6][0]
    assert small.get("boxes_too_large", 0) > big.get("boxes_too_large", 0)
    assert big.get("boxes_pruned", 0) > small.get("boxes_pruned", 0)
    assert out[10**6][1].evaluated < out[None][1].evaluated


def test_the_whole_set_pass_shared_out_to_workers_prunes_what_the_one_pass_prunes(monkeypatch):
    """The first-grid boxes on two worker processes: the same vectors pruned by the same boxes with the same
    bounds, the same chains evaluated, the same B*."""
    N = 24
    one = branch.branch_and_bound(R2R, N, boxes=True)
    monkeypatch.setattr(branch, "PARALLEL_BOX_N", 1)
    calls = []
    real = branch._box_pass_parallel
    monkeypatch.setattr(branch, "_box_pass_parallel", lambda *a, **k: calls.append(1) or real(*a, **k))
    two = branch.branch_and_bound(R2R, N, boxes=True, workers=2)
    assert calls == [1]
    assert two.best_B == one.best_B and two.certificate == one.certificate == "pruned-exact"
    assert sorted(two.pruned_vectors) == sorted(one.pruned_vectors) and two.pruned_by == one.pruned_by
    assert sorted(e.B for e in two.evaluations) == sorted(e.B for e in one.evaluations)


def test_a_sub_box_sharing_the_corner_of_a_box_over_the_cap_on_a_finer_clock_is_not_built_there():
    """A cap that the finer clocks' processes exceed: the sub-boxes that share such a box's bottom corner skip
    that clock (no build), and the answer and every pruned vector's bound stay as proven."""
    N = 24
    ex, table = _exhaustive_table(R2R, N)
    stats: dict = {}
    o = branch.branch_and_bound(R2R, N, boxes=True, max_box_states=400, first_box_states=10**6, stats=stats,
                                cheap_states=30, cheap_factor=1)
    assert stats.get("finer_skipped", 0) > 0
    assert o.best_B == ex.best_B and o.certificate == "pruned-exact"
    for B, _, v in o.pruned_vectors:
        assert v >= table[B] * (1 - 1e-9)


def test_a_three_model_search_on_a_pool_answers_as_one_process(monkeypatch):
    """Three models with the pool forced from small N: the answer does not depend on it."""
    import tr_core.parallel as parallel

    spec = make_spec([0.3, 0.5, 0.7], [[0.5, 0.3, 0.2]] * 3, [[1.0] * 3] * 3, delta_ms=0.1, name="small-me")
    N = 7
    one = optimize_thresholds(spec, N, search="pruned", boxes=True)
    monkeypatch.setattr(branch, "PARALLEL_BOX_N", 1)
    started = []
    real = parallel.local_pool
    monkeypatch.setattr(parallel, "local_pool", lambda k, *a, **kw: started.append(k) or real(k, *a, **kw))
    two = optimize_thresholds(spec, N, search="pruned", boxes=True, workers=2)
    assert started == [2]
    assert two.best_B == one.best_B and two.certificate == one.certificate == "pruned-exact"
    assert two.throughput_tok_s == pytest.approx(one.throughput_tok_s, rel=1e-12)
    assert sorted(two.pruned_vectors) == sorted(one.pruned_vectors)
