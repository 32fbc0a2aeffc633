"""Searches and bounds under the co-running launch law (docs/model.md, "Co-running" and bounds 1-5).

Every bound must stay >= the exact throughput of every vector of its family, and the pruned search
must return the exhaustive search's B* (same tie rule), on random systems with co-running latencies.
"""

import numpy as np
import pytest

import tr_model
from optimizer.bounds import Bounder, PolicyBounds, box_bound, no_wait_bound, policy_bound, scaling_valid
from optimizer.branch import auto_coarse, coarse_levels, screen_slot
from optimizer.evaluate import evaluate_thresholds
from optimizer.mean_field import mean_field_throughput
from optimizer.search import optimize_thresholds
from tr_core import feasibility as F
from tr_core.errors import SpecError
from tr_core.spec import make_spec, preset


def corun_system(seed, M=None, min_q=1, max_q=4, curves=True, caps=True, positive=False):
    """A small random system on a 1 ms grid with co-running latencies (factors 1-4, or tables).
    ``positive``: every routing probability > 0 (one closed class for every B)."""
    rng = np.random.default_rng(9100 + seed)
    M = M or (2 if seed % 3 else 3)
    rows = []
    for _ in range(M):
        w = rng.integers(1 if positive else 0, 6, size=M).astype(float)
        if w.sum() == 0:
            w[rng.integers(0, M)] = 1
        rows.append(list(w / w.sum()))
    C = [[float(rng.choice([0.0, 0.5, 1.0, 2.0])) for _ in range(M)] for _ in range(M)]
    L = [float(rng.integers(min_q, max_q + 1)) for _ in range(M)]
    lc = None
    if curves and rng.random() < 0.4:
        lc = [None if rng.random() < 0.5 else {"intercept_ms": L[i], "per_request_ms": 1.0} for i in range(M)]
    co = []
    for i in range(M):
        u = rng.random()
        if u < 0.15:
            co.append(None)
        elif u < 0.7:
            co.append({"slowdown": float(rng.choice([1.0, 2.0, 3.0, 4.0]))})
        else:
            # a table, sometimes below the solo latency (allowed with a warning): then a bound that
            # ignored the law (solo durations only) would be too small, so the tests below could fail
            lo_ = max(min_q, 1) - int(L[i])
            sizes = [1, 3]
            co.append({"batch_size": sizes, "step_latency_ms": [float(L[i] + rng.integers(lo_, 2 * max_q)),
                                                                  float(L[i] + rng.integers(lo_, 3 * max_q))]})
    cap = None
    if caps and rng.random() < 0.3:
        cap = [None if rng.random() < 0.5 else int(rng.integers(1, 4)) for _ in range(M)]
    return make_spec(L, rows, C, delta_ms=1.0, latency_curves=lc, max_batch_size=cap, corun_latency=co)


def _values(spec, N):
    out = {}
    for B in F.iter_feasible(N, spec.M):
        try:
            out[B] = evaluate_thresholds(spec, N, B, round_to_grid=True).throughput_tok_s
        except SpecError:  # several closed classes: refused by the chain, nothing to bound
            pass
    return out


def _box(rng, N, M):
    lo = tuple(int(rng.integers(1, N + 1)) for _ in range(M))
    hi = tuple(int(rng.integers(a, N + 1)) for a in lo)
    return lo, hi


def _le(v, bound):
    return v <= bound * (1 + 1e-9) + 1e-9


@pytest.mark.parametrize("seed", range(14))
def test_no_wait_box_and_policy_bounds_hold(seed):
    spec = corun_system(seed)
    rng = np.random.default_rng(seed)
    N = int(rng.integers(2, 5 if spec.M == 2 else 4))
    vals = _values(spec, N)
    nw = no_wait_bound(spec, N, round_to_grid=True).value_tok_s
    assert all(_le(v, nw) for v in vals.values()), (nw, max(vals.values()))
    for _ in range(3):
        lo, hi = _box(rng, N, spec.M)
        r = box_bound(spec, N, lo, hi, max_sweeps=400, round_to_grid=True)
        if F.is_feasible(lo, N):
            assert r.status == "ok"
        if r.status == "ok":
            for B, v in vals.items():
                if all(a <= b <= c for a, b, c in zip(lo, B, hi)):
                    assert _le(v, r.upper_tok_s), (B, v, r.upper_tok_s)
    pb = policy_bound(spec, N, max_sweeps=600, round_to_grid=True)
    assert pb.status == "ok"
    assert all(_le(v, pb.upper_tok_s) for v in vals.values()), (pb.upper_tok_s, max(vals.values()))


@pytest.mark.parametrize("seed", range(8))
def test_box_of_one_vector_is_its_chain(seed):
    # bound 3 on a box {B} has no decisions: its process is the chain, and the bound converges to T(B).
    # This detects a process that does not follow the chain's launch law, in either direction.
    spec = corun_system(400 + seed, positive=True)
    rng = np.random.default_rng(400 + seed)
    N = int(rng.integers(2, 5 if spec.M == 2 else 4))
    vals = _values(spec, N)
    for B in list(vals)[:: max(1, len(vals) // 3)]:
        r = box_bound(spec, N, B, B, rtol=1e-9, max_sweeps=6000, round_to_grid=True)
        assert r.status == "ok"
        assert r.upper_tok_s >= vals[B] * (1 - 1e-9)
        assert r.upper_tok_s <= vals[B] * (1 + 1e-5), (B, vals[B], r.upper_tok_s)


@pytest.mark.parametrize("seed", range(10))
def test_coarse_clock_bound_holds(seed):
    # steps of 3-7 quanta (co-running ones up to 4x that), slots of 2-3 quanta
    spec = corun_system(100 + seed, min_q=3, max_q=7, curves=False)
    if seed < 4:
        # co-running faster than solo on some model: a coarse process that ignored the law would be too low
        spec = spec.with_corun([{"batch_size": [1], "step_latency_ms": [3.0]}] + list(spec.corun_latency[1:]))
    rng = np.random.default_rng(100 + seed)
    N = int(rng.integers(2, 4))
    vals = _values(spec, N)
    for c in (2, 3):
        lo, hi = _box(rng, N, spec.M)
        r = box_bound(spec, N, lo, hi, coarse=c, max_sweeps=400, round_to_grid=True)
        if F.is_feasible(lo, N):
            assert r.status == "ok"
        if r.status == "ok":
            for B, v in vals.items():
                if all(a <= b <= c_ for a, b, c_ in zip(lo, B, hi)):
                    assert _le(v, r.upper_tok_s), (c, B, v, r.upper_tok_s)


def test_coarse_bound_holds_on_r2r_with_the_probe_factors():
    spec = preset("r2r", [6.0, 28.0], p=0.35, corun_latency=[2.8, 1.05], delta_ms=0.2)
    N = 5
    vals = _values(spec, N)
    for lo, hi in (((1, 1), (2, 3)), ((1, 2), (5, 5)), ((2, 1), (3, 4))):
        fine = box_bound(spec, N, lo, hi, round_to_grid=True)
        coarse = box_bound(spec, N, lo, hi, coarse=6, round_to_grid=True)
        inside = [v for B, v in vals.items() if all(a <= b <= c for a, b, c in zip(lo, B, hi))]
        assert fine.status == coarse.status == "ok"
        assert all(_le(v, fine.upper_tok_s) for v in inside)
        assert fine.upper_tok_s <= coarse.upper_tok_s * (1 + 1e-9)   # every fine policy is a coarse one


@pytest.mark.parametrize("seed", range(6))
def test_policy_bound_scales_with_constant_corun(seed):
    # constant latencies and constant factors, no caps: lam_n / n bounds every vector at N > n
    spec = corun_system(200 + seed, M=2, curves=False, caps=False)
    if spec._corun_batch_dependent():
        spec = spec.with_corun([None if c is None or c.kind == "table" else c for c in spec.corun_latency] )
    n = 2
    r = policy_bound(spec, n, max_sweeps=600, round_to_grid=True)
    table = PolicyBounds(spec, round_to_grid=True)
    table.values[n] = r
    N = n + 2
    assert scaling_valid(spec, N)
    b = table.bound(N)
    assert b is not None
    assert all(_le(v, b.value_tok_s) for v in _values(spec, N).values())


def test_scaling_refused_for_batch_dependent_corun():
    spec = preset("r2r", [6.0, 28.0], p=0.35, corun_latency=[{"batch_size": [1, 4], "step_latency_ms": [16.8, 18.0]},
                                                              None])
    assert not scaling_valid(spec, 8)
    assert scaling_valid(spec.with_corun([2.8, 1.0]), 8)


@pytest.mark.parametrize("seed", range(10))
def test_pruned_equals_exhaustive(seed):
    spec = corun_system(300 + seed, curves=seed % 2 == 0, positive=True)
    N = 6 if spec.M == 2 else 4
    ex = optimize_thresholds(spec, N, search="exhaustive", round_to_grid=True)
    pr = optimize_thresholds(spec, N, search="pruned", round_to_grid=True)
    assert pr.best_B == ex.best_B
    assert pr.throughput_tok_s == pytest.approx(ex.throughput_tok_s, rel=1e-12)
    assert pr.certificate in ("pruned-exact", "exhaustive")
    ce = optimize_thresholds(spec, N, search="certified", max_gap=0.05, round_to_grid=True)
    assert ce.upper_bound_tok_s >= ex.throughput_tok_s * (1 - 1e-9)
    assert ce.throughput_tok_s >= ex.throughput_tok_s * (1 - 0.05) - 1e-9


def test_pruned_equals_exhaustive_r2r_probe_factors():
    spec = preset("r2r", [6.0, 28.0], p=0.35, corun_latency=[2.8, 1.05], delta_ms=0.2)
    for N in (16, 24):
        ex = optimize_thresholds(spec, N, search="exhaustive", round_to_grid=True)
        pr = optimize_thresholds(spec, N, search="pruned", round_to_grid=True)
        assert pr.best_B == ex.best_B and pr.certificate == "pruned-exact"
        assert pr.evaluated < ex.evaluated     # the bounds did prune
        au = tr_model.optimize(spec, N, search="auto", round_to_grid=True)
        assert au.best_B == ex.best_B


def test_coarse_levels_keep_a_long_first_slot_under_corun():
    # R2R on the 0.1 ms grid: solo steps 60 and 279 quanta; the small model x2.15 co-running: 129
    d = np.array([[0, 60, 60], [0, 279, 279]])
    dco = np.array([[0, 129, 129], [0, 279, 279]])
    both = np.concatenate([d, dco])
    assert coarse_levels(d) == (30, 12)                # solo: the slots of the search without co-running
    assert coarse_levels(d, d) == (30, 12)             # factor 1: the same
    assert auto_coarse(both, 0.04) == 6                # one rule over both tables: a 5x shorter slot
    levels = coarse_levels(d, dco)
    assert levels == (30, 6)                           # a cheap screen on the solo steps, then the tight slot
    assert auto_coarse(d, 0.04, dco=dco, co_inflation=0.05) < 30     # 129 -> 120 is 7.5 % faster
    for c in levels:                                   # every step, solo or co-running, spans two slots
        assert (both[:, 1:] // c).min() >= 2
    # the probe's factors (168 and 293 quanta): 30 would make the small model's step 12 % faster
    assert coarse_levels(d, np.array([[0, 168, 168], [0, 293, 293]]))[0] == 15


def test_pruned_equals_exhaustive_r2r_fitted_factor():
    # the small model x13/6 on the 0.2 ms grid (steps 30, 140; co-running 65): the first slot (15)
    # is chosen for the solo steps, longer than one rule over both tables allows (5)
    spec = preset("r2r", [6.0, 28.0], p=0.35, corun_latency=[13.0 / 6.0, 1.0], delta_ms=0.2)
    b = Bounder(spec, 16, round_to_grid=True)
    assert coarse_levels(b.d, b.dco) == (15, 5) and auto_coarse(np.concatenate([b.d, b.dco]), 0.04) == 5
    for N in (16, 24):
        ex = optimize_thresholds(spec, N, search="exhaustive", round_to_grid=True)
        stats: dict = {}
        pr = optimize_thresholds(spec, N, search="pruned", round_to_grid=True, stats=stats)
        assert pr.best_B == ex.best_B and pr.certificate == "pruned-exact"
        assert pr.throughput_tok_s == pytest.approx(ex.throughput_tok_s, rel=1e-12)
        assert pr.evaluated < ex.evaluated and stats.get("boxes_pruned", 0) > 0


def test_mean_field_guide_follows_the_law():
    solo = preset("r2r", [6.0, 28.0], p=0.35)
    one = solo.with_corun([1.0, 1.0])
    co = solo.with_corun([2.8, 1.05])
    for B in ((1, 1), (2, 6)):
        assert mean_field_throughput(one, 8, B, round_to_grid=True).throughput_tok_s == \
            mean_field_throughput(solo, 8, B).throughput_tok_s
    # eager keeps both models busy, so the slowdown hits it hardest; the guide sees that
    eager = mean_field_throughput(co, 8, (1, 1), round_to_grid=True).throughput_tok_s
    assert eager < 0.85 * mean_field_throughput(solo, 8, (1, 1)).throughput_tok_s
    # and it stays a fair guide: the vector it picks is within 3 % of B* (it only orders the exact search)
    from optimizer.mean_field import mean_field_thresholds
    spec = preset("r2r", [6.0, 28.0], p=0.35, corun_latency=[2.8, 1.05], delta_ms=0.2)
    guide = mean_field_thresholds(spec, 16, round_to_grid=True)
    best = optimize_thresholds(spec, 16, search="pruned", round_to_grid=True)
    assert tr_model.evaluate(spec, 16, guide.B, round_to_grid=True).throughput_tok_s >= 0.97 * best.throughput_tok_s


def test_screen_slot_is_longer_than_the_first_and_keeps_two_slots_per_step():
    d = np.array([[0, 60, 60], [0, 279, 279]])
    dco = np.array([[0, 168, 168], [0, 293, 293]])
    assert screen_slot(d) is None                      # solo R2R: the first slot (30) is already the longest
    c = screen_slot(d, dco)
    assert c == 30 and c > coarse_levels(d, dco)[0]
    both = np.concatenate([d, dco])
    assert (both[:, 1:] // c).min() >= 2
    assert (both[:, 1:] // (c + 1)).min() < 2          # the longest such slot
    assert screen_slot(d, d) is None


@pytest.mark.parametrize("N", [16, 24])
def test_pruned_equals_exhaustive_with_the_screen_clock(N):
    # the probe's factors on the 0.3 ms grid: steps 20 and 93 quanta, co-running 56 and 98; the first slot
    # is 5 quanta and the screen 10 (the small model's co-running step 11 % faster on it)
    spec = preset("r2r", [6.0, 27.9], p=0.35, corun_latency=[2.8, 1.05], delta_ms=0.3)
    b = Bounder(spec, N, round_to_grid=True)
    assert screen_slot(b.d, b.dco) == 10 and coarse_levels(b.d, b.dco)[0] == 5
    ex = optimize_thresholds(spec, N, search="exhaustive", round_to_grid=True)
    stats: dict = {}
    pr = optimize_thresholds(spec, N, search="pruned", round_to_grid=True, stats=stats)
    assert pr.best_B == ex.best_B and pr.certificate == "pruned-exact"
    assert pr.throughput_tok_s == pytest.approx(ex.throughput_tok_s, rel=1e-12)
    assert stats.get("screen_pruned", 0) >= 1         # some box was pruned on the screen clock
    worst = ex.throughput_tok_s * (1 + 1e-9)
    for B, _name, v in pr.pruned_vectors:              # each pruned vector's bound holds
        e = next(x for x in ex.evaluations if x.B == B)
        assert e.throughput_tok_s <= v * (1 + 1e-9) and e.throughput_tok_s <= worst
