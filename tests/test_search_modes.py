"""Pruned and certified searches agree with the exhaustive one; certificates are correct; refusals come first."""

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from optimizer import optimize_sweep, optimize_thresholds
from optimizer.bounds import Bound, Bounder
from optimizer.branch import branch_and_bound
from tr_core import feasibility as F
from tr_core.spec import make_spec, preset

R2R = preset("r2r", [6.0, 27.9], p=0.35)
RSTITCH = preset("r-stitch", [6.0, 28.0], p=0.3, q=0.5)
ME = preset("me", [6.0, 15.0, 27.9], weights=[0.5, 0.3, 0.2])


def _same(a, b):
    assert a.best_B == b.best_B
    assert a.throughput_tok_s == pytest.approx(b.throughput_tok_s, rel=1e-12)


@pytest.mark.parametrize("spec,N", [(R2R, 5), (R2R, 7), (RSTITCH, 5), (ME, 3)])
def test_pruned_equals_exhaustive(spec, N):
    ex = optimize_thresholds(spec, N, search="exhaustive")
    pr = optimize_thresholds(spec, N, search="pruned")
    _same(ex, pr)
    assert pr.certificate == "pruned-exact" and pr.gap == 0.0 and pr.upper_bound_tok_s == pr.throughput_tok_s
    assert pr.evaluated + pr.pruned + pr.unresolved == F.count_feasible(N, spec.M)
    assert sum(pr.pruned_by.values()) == pr.pruned == len(pr.pruned_vectors)
    assert ex.certificate == "exhaustive" and ex.evaluated == F.count_feasible(N, spec.M)


class _OracleBounder:
    """A bounder whose bounds are the exact throughputs (+ a margin): exercises real pruning."""

    def __init__(self, table, margin):
        self.table, self.margin = table, margin

    def vector_bound(self, B):
        return Bound(self.table[B] * (1 + self.margin), "oracle")


@pytest.mark.parametrize("margin", [0.0, 0.01, 0.2])
def test_pruning_with_valid_bounds_keeps_the_exact_answer(margin):
    N = 6
    ex = optimize_thresholds(R2R, N)
    table = {e.B: e.throughput_tok_s for e in ex.evaluations}
    o = branch_and_bound(R2R, N, bounder=_OracleBounder(table, margin), start=(2, 2))
    _same(ex, o)
    assert o.certificate == "pruned-exact"
    assert o.evaluated + o.pruned == len(table)
    if margin < 0.05:
        assert o.pruned > 0 and o.pruned_by == {"oracle": o.pruned}
    for B, name, value in o.pruned_vectors:       # every pruned vector was proven below the optimum
        assert table[B] <= value and value < o.throughput_tok_s


def test_certified_gap_covers_every_vector():
    N = 7
    ex = optimize_thresholds(R2R, N)
    table = {e.B: e.throughput_tok_s for e in ex.evaluations}
    o = branch_and_bound(R2R, N, bounder=_OracleBounder(table, 0.004), max_gap=0.005, eager=False)
    assert o.upper_bound_tok_s >= max(table.values())
    assert o.gap <= 0.005 + 1e-12
    assert o.throughput_tok_s >= o.upper_bound_tok_s * (1 - 0.005) - 1e-9
    # a zero time budget stops after the first ascent step: the rest is unresolved but still bounded
    o = optimize_thresholds(R2R, N, search="certified", time_budget_s=0.0, eager=False, start=(2, 3))
    assert o.unresolved > 0 and o.certificate == "certified"
    assert o.upper_bound_tok_s >= max(table.values())
    assert o.gap == pytest.approx((o.upper_bound_tok_s - o.throughput_tok_s) / o.upper_bound_tok_s)
    assert o.eager is None and o.to_dict()["eager_throughput_tok_s"] is None


def test_local_reports_a_proven_bound():
    ex = optimize_thresholds(R2R, 8)
    lo = optimize_thresholds(R2R, 8, search="local")
    assert lo.certificate == "local"
    assert lo.upper_bound_tok_s >= ex.throughput_tok_s and 0 < lo.gap < 1


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


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_specs(), st.integers(1, 4))
def test_pruned_equals_exhaustive_on_random_systems(spec, N):
    ex = optimize_thresholds(spec, N)
    pr = optimize_thresholds(spec, N, search="pruned")
    _same(ex, pr)
    assert pr.upper_bound_tok_s >= max(e.throughput_tok_s for e in ex.evaluations) * (1 - 1e-9)


def test_sweep_modes_and_auto():
    ex = optimize_sweep(R2R, [3, 5])
    au = optimize_sweep(R2R, [3, 5], search="auto")
    pr = optimize_sweep(R2R, [5, 3], search="pruned")
    for a, b, c in zip(ex, au, reversed(pr)):
        _same(a, b)
        _same(a, c)


def test_refusals_are_counted_in_closed_form():
    with pytest.raises(F.TooManyEvaluations, match="more than --max-evaluations = 5"):
        optimize_thresholds(R2R, 10, max_evaluations=5)
    with pytest.raises(F.TooManyEvaluations):
        optimize_sweep(R2R, [10 ** 9], max_evaluations=1000)
    with pytest.raises(F.TooManyEvaluations, match="pruned search"):
        optimize_thresholds(R2R, 8, search="pruned", max_evaluations=3)
    # the certified search stops at the limit instead, and says what is left
    o = optimize_thresholds(R2R, 8, search="certified", max_evaluations=3, eager=False)
    assert o.evaluated <= 3 and o.unresolved > 0 and o.certificate == "certified"


@pytest.mark.parametrize("argv", [
    ["--N", "8", "--max-evaluations", "5"],
    ["--N", "1-1000000000"],
])
def test_cli_refuses_with_exit_3_and_one_line(argv, tmp_path):
    r = subprocess.run([sys.executable, "-m", "tr_model.cli", "--p", "0.35", "--L", "6", "27.9", *argv,
                        "--cache-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "--max-evaluations" in lines[0]
    assert r.stdout == ""


@pytest.mark.parametrize("spec,N", [(R2R, 8), (RSTITCH, 6), pytest.param(ME, 4, marks=pytest.mark.slow)])
def test_box_pruning_keeps_the_exact_answer(spec, N):
    """Force the box pass (every chain over 30 states is deferred): same B*, every pruned box proven."""
    ex = optimize_thresholds(spec, N)
    table = {e.B: e.throughput_tok_s for e in ex.evaluations}
    stats = {}
    o = branch_and_bound(spec, N, bounder=Bounder(spec, N), boxes=True, cheap_states=30, cheap_factor=0,
                         min_box=2, whole_pass=False,
                         start=(1,) * spec.M, stats=stats)
    _same(ex, o)
    assert o.certificate == "pruned-exact"
    assert o.evaluated + o.pruned == len(table)
    assert stats["deferred"] > 0 and stats.get("boxes_tried", 0) > 0
    for B, name, value in o.pruned_vectors:
        assert table[B] <= value * (1 + 1e-9) and value < o.throughput_tok_s


@pytest.mark.parametrize("N", [10, 13])
def test_whole_set_box_pass_on_the_coarse_clock_keeps_the_exact_answer(N):
    """R2R on its 0.1 ms grid: the first box pass prunes on the coarse clocks (slot = 30 and 12 quanta)."""
    ex = optimize_thresholds(R2R, N)
    table = {e.B: e.throughput_tok_s for e in ex.evaluations}
    stats = {}
    o = branch_and_bound(R2R, N, bounder=Bounder(R2R, N), boxes=True, start=(1, 1), eager=False, min_box=2,
                         stats=stats)
    _same(ex, o)
    assert o.certificate == "pruned-exact" and o.evaluated + o.pruned == len(table)
    assert any("slot=" in name for name in o.pruned_by), o.pruned_by
    assert o.evaluated < len(table) / 2
    for B, name, value in o.pruned_vectors:
        assert table[B] <= value * (1 + 1e-9) and value < o.throughput_tok_s


def test_parallel_sweep_equals_the_serial_one():
    """Whole N values per worker: the same B*(N) whatever the pool."""
    Ns = [2, 3, 5, 6, 9]
    serial = optimize_sweep(R2R, Ns, search="pruned", eager=False)
    pooled = optimize_sweep(R2R, Ns, search="pruned", eager=False, workers=2)
    assert [o.N for o in pooled] == Ns
    for a, b in zip(serial, pooled):
        _same(a, b)
        assert b.certificate == "pruned-exact"


def test_auto_is_exact_with_pruning_between_the_exhaustive_and_certified_ranges():
    """auto: exhaustive to 210 vectors, the pruned search for two models to 8,256 (N = 128), certified with a budget."""
    assert optimize_thresholds(R2R, 20, search="auto").certificate == "exhaustive"      # 210 vectors
    o = optimize_thresholds(R2R, 21, search="auto", eager=False)                       # 231 vectors
    assert o.certificate == "pruned-exact" and o.evaluated + o.pruned == F.count_feasible(21, 2)
    b = optimize_thresholds(R2R, 21, search="auto", eager=False, time_budget_s=60.0)
    assert b.certificate in ("certified", "pruned-exact") and b.gap <= 0.005
    assert b.throughput_tok_s >= o.throughput_tok_s * (1 - 0.005)
