"""Stiff chains (issue 25): latency ratios to 1:1000 and p to 1 - 1e-5, against a 50-digit reference.

On these chains the double GTH elimination underflows (products of many small probabilities leave
the double range, an out-sum rounds to 0) and used to abort with "bad input"; the extended-exponent
elimination (``dtmc._kernels.gth_solve_scaled``) cannot underflow.  Every case must come back within
1e-9 of the 50-digit value or be flagged (``accuracy_ok`` false) with a bound that covers its true
error; none may raise.
"""

import json
from fractions import Fraction

import numpy as np
import pytest

import dtmc
import tr_model
from dtmc import _kernels as K
from dtmc import solve as S
from tr_core.spec import preset

mpmath = pytest.importorskip("mpmath")

from mp_reference import mp_reference, mp_stationary as mp_stationary_ref  # noqa: E402 - the 50-digit reference

U = Fraction(1, 2 ** 53)

# (preset, parameters, latencies ms, delta ms, [(N, B), ...]): ratios 1:10, 1:200, 1:1000
STIFF = [
    ("r2r", dict(p=0.99), (1.0, 10.0), 1.0, [(4, (1, 2))]),
    ("r2r", dict(p=0.999), (1.0, 200.0), 1.0, [(4, (1, 1)), (6, (3, 2))]),
    ("r2r", dict(p=1 - 1e-5), (1.0, 200.0), 1.0, [(6, (1, 3)), (8, (1, 7))]),
    ("r2r", dict(p=0.999), (0.1, 100.0), 0.1, [(3, (1, 2)), (8, (1, 7))]),
    ("r2r", dict(p=1 - 1e-5), (0.1, 100.0), 0.1, [(2, (1, 1)), (4, (1, 2)), (4, (2, 2))]),
    ("r2r", dict(p=0.5), (1.0, 1000.0), 1.0, [(6, (3, 2))]),
    ("r2r", dict(p=1e-5), (1.0, 1000.0), 1.0, [(8, (1, 7))]),
    ("r2r", dict(p=1 - 1e-5), (100.0, 0.1), 0.1, [(6, (1, 3))]),
    ("r-stitch", dict(p=1 - 1e-5, q=1e-5), (1.0, 200.0), 1.0, [(3, (1, 1)), (4, (2, 1))]),
    ("r-stitch", dict(p=0.5, q=1e-5), (0.1, 100.0), 0.1, [(4, (2, 1))]),
    ("r-stitch", dict(p=1e-5, q=0.5), (0.1, 100.0), 0.1, [(3, (1, 1))]),
]
CASES = [(name, kw, L, delta, N, B) for name, kw, L, delta, cases in STIFF for N, B in cases]


def _id(c):
    name, kw, L, delta, N, B = c
    return f"{name}-{'-'.join(f'{k}{v:g}' for k, v in kw.items())}-L{L[0]:g}:{L[1]:g}-N{N}-B{B}"


@pytest.mark.parametrize("name,kw,L,delta,N,B", CASES, ids=[_id(c) for c in CASES])
def test_stiff_chains_against_50_digits(name, kw, L, delta, N, B):
    spec = preset(name, list(L), delta_ms=delta, **kw)
    ch, x_mp, rec, ref = mp_reference(spec, N, B)
    for solver in ("auto", "gth", "anderson"):
        ev = tr_model.evaluate(spec, N, B, solver=solver)       # never raises: none aborted
        err = abs(ev.throughput_tok_s - ref) / ref
        # the bound is never below the true error (whatever the solver) ...
        assert err <= ev.throughput_error_bound, (solver, ev.solver, ev.bound_method, err)
        # ... and a result is within 1e-9 or flagged
        assert err <= 1e-9 or not ev.accuracy_ok, (solver, ev.solver, err, ev.throughput_error_bound)
        if solver != "anderson":
            # the default and GTH are accurate here, with a proven bound (not an estimate)
            assert err <= 1e-9 and ev.accuracy_ok and ev.throughput_error_bound <= 1e-9, (solver, ev.bound_method)
            assert not ev.bound_method.startswith("estimate")
    # the stationary vector's l1 bound covers its true l1 error
    st = dtmc.stationary_distribution(ch.T)
    l1 = float(mpmath.fsum(abs(mpmath.mpf(float(p)) - xi) for xi, p in zip(x_mp, st.pi[rec])))
    assert l1 <= st.error_bound, (st.bound_method, l1, st.error_bound)


def test_double_gth_underflows_where_the_extended_one_does_not():
    """The case of the issue: the double elimination meets an out-sum rounded to 0 in every order."""
    spec = preset("r2r", [0.1, 100.0], p=0.99999)
    d, _ = spec.quanta_table(4)
    ch = dtmc.build_chain(spec.P, spec.C, d, 4, (1, 2))
    for _name, order in S.gth_orders(ch.T):
        A = ch.T if order is None else ch.T[order][:, order].tocsr()
        lo = K.gth_envelope(S._i64(A.indptr), S._i64(A.indices))
        status, *_rest, under, _err = K.gth_solve(S._i64(A.indptr), S._i64(A.indices), A.data, lo)
        assert status == K.GTH_REDUCIBLE or under > 0
        status, x, L, _f, under, err = K.gth_solve_scaled(S._i64(A.indptr), S._i64(A.indices), A.data, lo)
        assert status == K.GTH_OK and under == 0 and np.isfinite(L) and np.all(np.isfinite(err))
    st = dtmc.stationary_distribution(ch.T, solver="gth")
    assert st.bound_method == "gth rounding analysis (extended exponents)"


def test_scaled_gth_equals_double_gth_where_nothing_underflows():
    spec = preset("r2r", [6.0, 27.9], p=0.35)
    d, _ = spec.quanta_table(6)
    ch = dtmc.build_chain(spec.P, spec.C, d, 6, (1, 1))
    A = ch.T
    lo = K.gth_envelope(S._i64(A.indptr), S._i64(A.indices))
    s1, x1, L1, f1, u1, e1 = K.gth_solve(S._i64(A.indptr), S._i64(A.indices), A.data, lo)
    s2, x2, L2, f2, u2, e2 = K.gth_solve_scaled(S._i64(A.indptr), S._i64(A.indices), A.data, lo)
    assert s1 == s2 == K.GTH_OK and u1 == u2 == 0 and f1 == f2 and L1 == L2
    assert np.max(np.abs(x1 - x2) / x1) < 1e-13
    assert np.all(np.abs(x1 - x2) <= e1 + e2)


def _exact(m, e):
    return Fraction(m) * (Fraction(2) ** int(e))


def test_extended_arithmetic_is_correctly_scaled_and_rounded():
    """Sum, product and quotient of extended values far outside the double range: relative error <= u."""
    rng = np.random.default_rng(5)
    for _ in range(400):
        a = rng.uniform(0.1, 10.0) * 10.0 ** rng.integers(-300, 300)
        b = rng.uniform(0.1, 10.0) * 10.0 ** rng.integers(-300, 300)
        am, ae = K._x_from(a)
        bm, be = K._x_from(b)
        assert 1.0 <= am < 2.0 and _exact(am, ae) == Fraction(a)
        ae += int(rng.integers(-5000, 5000))   # beyond any double
        be += int(rng.integers(-40, 40)) + ae - be if rng.random() < 0.5 else 0
        A, B = _exact(am, ae), _exact(bm, be)
        for op, want in ((K._x_add, A + B), (K._x_mul, A * B), (K._x_div, A / B)):
            m, e = op(am, ae, bm, be)
            assert 1.0 <= m < 2.0
            assert abs(_exact(m, e) - want) <= U * want
    # subnormal input, exactly; and back to doubles, subnormal output within 2^-1075
    m, e = K._x_from(5e-324)
    assert (m, e) == (1.0, -1074)
    assert K._x_to(m, e) == 5e-324 and K._x_to(m, e - 200) == 0.0
    m, e = K._x_from(3.0e-310)
    assert K._x_to(m, e) == 3.0e-310 and K._x_to(*K._x_from(0.75)) == 0.75


def test_elimination_order_is_chosen_by_cost():
    """R2R p = 0.999, N = 32, B = (1, 8): reversed breadth-first is the cheapest order by far, so the
    default re-solves with GTH and comes back with a proven bound (it was 30 % off, flagged)."""
    spec = preset("r2r", [6.0, 27.9], p=0.999)
    d, _ = spec.quanta_table(32)
    ch = dtmc.build_chain(spec.P, spec.C, d, 32, (1, 8))
    costs = {name: S.gth_cost(ch.T, order)[0] for name, order in S.gth_orders(ch.T)}
    order, work, _bytes = S.gth_plan(ch.T)
    assert work == min(costs.values()) == costs["reversed breadth-first"]
    assert costs["breadth-first"] > 20 * work and work <= S.GTH_MAX_WORK
    ev = tr_model.evaluate(spec, 32, (1, 8))
    assert ev.solver == "gth (after anderson)" and ev.accuracy_ok and ev.throughput_error_bound <= 1e-8
    assert ev.throughput_tok_s == pytest.approx(833.0532568388721, rel=1e-9)


def test_estimates_are_never_accuracy_ok():
    ev = dtmc.ChainSolution(N=1, B=(1, 1), throughput_per_quantum=1.0, mean_waiting=np.zeros(2),
                            arrival_rate_per_quantum=np.zeros(2), states=1, transitions=1, recurrent_states=1,
                            residual=0.0, solver="gth", iterations=1, build_seconds=0.0, assembly_seconds=0.0,
                            solve_seconds=0.0, bytes_used=0, throughput_error_bound=1e-12,
                            bound_method="estimate: two GTH orders")
    assert not ev.accuracy_ok
    assert dtmc.proven_ok(1e-12, "tree bound") and not dtmc.proven_ok(1e-5, "tree bound")


def test_a_solve_that_does_not_converge_is_not_bad_input(monkeypatch, capsys):
    """A non-converged solve raises SolveFailed (exit 3 with what to do), never a DTMCError (exit 2)."""
    spec = preset("r2r", [6.0, 27.9], p=0.999)
    d, _ = spec.quanta_table(8)
    ch = dtmc.build_chain(spec.P, spec.C, d, 8, (1, 1))
    with pytest.raises(dtmc.SolveFailed) as e:
        dtmc.stationary_distribution(ch.T, solver="gauss-seidel", max_sweeps=2)
    assert not isinstance(e.value, ValueError) and "--tol" in str(e.value)
    from tr_core.errors import SolverFailed
    from tr_model import cli

    def fail(*a, **k):
        raise dtmc.SolveFailed("Anderson-accelerated Gauss-Seidel did not reach the tolerance", "loosen --tol")
    monkeypatch.setattr(dtmc, "solve_chain", fail)
    with pytest.raises(SolverFailed) as e2:
        tr_model.evaluate(spec, 8, (1, 1))
    assert e2.value.exit_code == 3
    with pytest.raises(SystemExit) as ex:
        cli.main(["--p", "0.999", "--L", "6.0", "27.9", "--N", "8", "--B", "1", "1", "--no-cache"])
    out, err = capsys.readouterr()
    assert ex.value.code == 3 and out == ""
    assert err.count("\n") == 1 and err.startswith("error:") and "loosen --tol" in err


def test_gth_failure_keeps_the_iterate(monkeypatch):
    """When GTH fails, auto keeps its iterate with the iterate's own bound (flagged), never raises."""
    spec = preset("r2r", [6.0, 27.9], p=0.999)
    d, _ = spec.quanta_table(16)
    ch = dtmc.build_chain(spec.P, spec.C, d, 16, (1, 8))

    def broken(*a, **k):
        raise dtmc.SolveFailed("GTH elimination met an exponent beyond 2^30")
    monkeypatch.setattr(S, "gth", broken)
    st = dtmc.stationary_distribution(ch.T)
    assert st.solver.startswith("anderson") and st.bound_method == "tree bound"


def test_cli_stiff_case_exits_0_with_an_accurate_answer(run_tool, private_cache):
    spec = preset("r2r", [0.1, 100.0], p=0.99999)
    _ch, _x, _rec, ref = mp_reference(spec, 4, (1, 2))
    r = run_tool("tr-optimize", "--p", "0.99999", "--L", "0.1", "100", "--N", "4", "--B", "1", "2",
                 "--format", "json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)["results"][0]
    assert res["accuracy_ok"] is True
    assert abs(res["throughput_tok_s"] - ref) / ref <= 1e-9
    assert abs(res["throughput_tok_s"] - ref) / ref <= res["throughput_error_bound"] <= 1e-9


@pytest.mark.parametrize("seed", range(6))
def test_extended_gth_bound_holds_below_the_double_range(seed):
    """Random chains whose stationary vector spans 1e-300 .. 1e-1500 (steps up of weight 1e-60 .. 1e-5, a few
    random long jumps down): the double elimination underflows, the extended one's bound covers the true error of
    every component against a 50-digit GTH (whose exponents are unbounded), including those below the double
    range (reported as 0 or subnormal)."""
    rng = np.random.default_rng(seed)
    n = 30 + 5 * seed
    T = np.zeros((n, n))
    for i in range(n):
        if i + 1 < n:
            T[i, i + 1] = 10.0 ** rng.uniform(-60, -5)
        if i > 0:
            T[i, i - 1] = rng.uniform(0.2, 1.0)
        T[i, i] = rng.uniform(0.0, 0.5)
        if rng.random() < 0.3:
            T[i, rng.integers(i + 1)] += rng.uniform(0.0, 0.3)   # a long jump down
    T[0, 0] += 0.1
    T /= T.sum(axis=1, keepdims=True)
    import scipy.sparse as sp
    T = sp.csr_matrix(T)
    x_mp = mp_stationary_ref(T)
    assert min(x_mp) < mpmath.mpf("1e-320")        # the test reaches below the double range
    for order in (None, np.arange(n - 1, -1, -1, dtype=np.int64)):
        A = T if order is None else T[order][:, order].tocsr()
        lo = K.gth_envelope(S._i64(A.indptr), S._i64(A.indices))
        status, x, L, _f, under, e_x = K.gth_solve_scaled(S._i64(A.indptr), S._i64(A.indices), A.data, lo)
        assert status == K.GTH_OK and under == 0 and np.isfinite(L)
        pi, err = (x, e_x) if order is None else (np.empty(n), np.empty(n))
        if order is not None:
            pi[order], err[order] = x, e_x
        for j, xj in enumerate(x_mp):
            e = abs(mpmath.mpf(float(pi[j])) - xj)
            # |pi - y| <= err (y: the exact back-substitution), y within exp(+-L) of the exact vector
            allowed = err[j] + np.expm1(L) * np.exp(L) * (pi[j] + err[j])
            assert e <= mpmath.mpf(float(allowed)) * (1 + mpmath.mpf("1e-12")), (j, float(e), allowed)
    st = dtmc.stationary_distribution(T, solver="gth")
    tot = mpmath.fsum(abs(mpmath.mpf(float(p)) - xj) for p, xj in zip(st.pi, x_mp))
    assert tot <= st.error_bound <= 1e-9, (st.bound_method, float(tot), st.error_bound)
