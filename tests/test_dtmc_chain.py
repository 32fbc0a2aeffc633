"""The exact chain: reference values, closed forms, solver cross-checks, structure checks."""

import json
import os

import numpy as np
import pytest
import scipy.sparse as sp

import dtmc
import tr_model
from tr_core.spec import make_spec, preset

HERE = os.path.dirname(os.path.abspath(__file__))
REF = json.load(open(os.path.join(HERE, "fixtures", "reference_values.json")))
R2R = preset("r2r", [6.0, 27.9], p=0.35)


@pytest.mark.parametrize("case", REF["cases"], ids=[c["id"] for c in REF["cases"]])
def test_reference_values(case):
    ev = tr_model.evaluate(R2R, case["N"], case["B"])
    assert ev.states == case["states"]
    assert ev.transitions == case["transitions"]
    if case["tok_s"] is not None:
        assert ev.throughput_tok_s == pytest.approx(case["tok_s"], abs=0.006)
    assert ev.residual < 1e-12


def stationary_of(P):
    w, v = np.linalg.eig(np.asarray(P).T)
    x = np.real(v[:, np.argmin(np.abs(w - 1))])
    return x / x.sum()


@pytest.mark.parametrize("seed", range(8))
def test_single_request_closed_form(seed):
    """N = 1: one request walks the routing chain; T = sum mu_i cbar_i / sum mu_i L_i."""
    rng = np.random.default_rng(seed)
    M = 2 + seed % 2
    P = rng.dirichlet(np.ones(M), size=M)
    P[:, -1] = 1.0 - P[:, :-1].sum(axis=1)
    C = rng.uniform(0, 3, size=(M, M))
    L = rng.integers(1, 400, size=M) * 0.1
    spec = make_spec(L, P, C)
    mu = stationary_of(P)
    expected = 1000.0 * float(mu @ (P * C).sum(axis=1)) / float(mu @ L)
    ev = tr_model.evaluate(spec, 1, (1,) * M)
    assert ev.throughput_tok_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("p,L0,L1", [(0.1, 5.0, 30.0), (0.5, 12.3, 45.6), (0.9, 1.0, 99.9), (0.0, 6.0, 27.9)])
def test_r2r_n1_formula(p, L0, L1):
    ev = tr_model.evaluate(preset("r2r", [L0, L1], p=p), 1, (1, 1))
    assert ev.throughput_tok_s == pytest.approx(1000.0 / (L0 + p * L1), rel=1e-10)


def test_periodic_chain():
    """P = [[0,1],[1,0]] with N = 1 alternates deterministically: a period-2 chain."""
    spec = make_spec([2.0, 3.0], [[0, 1], [1, 0]], [[0, 2], [5, 0]])
    for solver in ("auto", "direct", "power", "gauss-seidel"):
        ev = tr_model.evaluate(spec, 1, (1, 1), solver=solver)
        assert ev.throughput_tok_s == pytest.approx(1000.0 * 7 / 5.0, rel=1e-10)


def _pi_check(T, pi):
    assert pi.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.all(pi >= 0)
    assert np.max(np.abs(T.T @ pi - pi)) < 1e-12


@pytest.mark.parametrize("N,B", [(4, (1, 1)), (6, (2, 3)), (8, (1, 5)), (10, (3, 1))])
def test_solvers_agree_and_balance(N, B):
    d, _ = R2R.quanta_table(N)
    ch = dtmc.build_chain(R2R.P, R2R.C, d, N, B)
    res = {}
    for solver in ("direct", "gauss-seidel", "power"):
        st = dtmc.stationary_distribution(ch.T, solver=solver)
        _pi_check(ch.T, st.pi)
        res[solver] = dtmc.throughput_per_quantum(st.pi, ch.g, ch.tau)
    assert res["gauss-seidel"] == pytest.approx(res["direct"], rel=1e-9)
    assert res["power"] == pytest.approx(res["direct"], rel=1e-8)


def test_rows_stochastic_and_merged():
    d, _ = R2R.quanta_table(8)
    ch = dtmc.build_chain(R2R.P, R2R.C, d, 8, (1, 1))
    assert np.allclose(np.asarray(ch.T.sum(axis=1)).ravel(), 1.0, atol=1e-12)
    # one entry per distinct (s, s')
    coo = ch.T.tocoo()
    pairs = coo.row.astype(np.int64) * ch.n_states + coo.col
    assert np.unique(pairs).size == pairs.size
    # conservation: every state holds N requests
    assert np.all(ch.waiting.sum(axis=1) + ch.batch.sum(axis=1) == 8)


def test_transient_states_get_zero_mass():
    """The initial state of R2R N=4 B=(1,3) is never re-entered."""
    d, _ = R2R.quanta_table(4)
    ch = dtmc.build_chain(R2R.P, R2R.C, d, 4, (2, 1))
    st = dtmc.stationary_distribution(ch.T)
    labels, closed = dtmc.closed_classes(ch.T)
    rec = labels == np.flatnonzero(closed)[0]
    assert st.n_transient == int((~rec).sum())
    assert np.all(st.pi[~rec] == 0.0)
    if st.n_transient:
        assert st.pi[0] == 0.0 or rec[0]


def test_several_closed_classes_raise():
    T = sp.csr_matrix(np.array([[0.0, 0.5, 0.5], [0, 1.0, 0], [0, 0, 1.0]]))
    with pytest.raises(dtmc.DTMCError, match="closed classes"):
        dtmc.stationary_distribution(T)


def test_hand_solved_reducible():
    """Transient start feeding a 2-cycle: pi = (0, 1/3, 2/3) for T below."""
    T = sp.csr_matrix(np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.5, 0.5]]))
    for solver in dtmc.SOLVERS:
        st = dtmc.stationary_distribution(T, solver=solver)
        assert st.pi == pytest.approx([0.0, 1 / 3, 2 / 3], abs=1e-12)
        assert st.n_transient == 1


def test_three_models_and_multinomial():
    spec = preset("me", [1.0, 2.0, 3.0], weights=[0.5, 0.3, 0.2])
    ev = tr_model.evaluate(spec, 3, (1, 1, 1))
    ev2 = tr_model.evaluate(spec, 3, (1, 1, 1), solver="direct")
    assert ev.throughput_tok_s == pytest.approx(ev2.throughput_tok_s, rel=1e-9)
    assert ev.states > 10


def test_zero_probability_outcomes_create_no_states():
    """With p = 0 the large model is never used: only model-0 states are reachable."""
    spec = preset("r2r", [6.0, 27.9], p=0.0)
    ev = tr_model.evaluate(spec, 5, (1, 1))
    assert ev.states == 1 and ev.throughput_tok_s == pytest.approx(5 * 1000 / 6.0)


def test_state_limit():
    with pytest.raises(tr_model.StateSpaceTooLarge, match="max_states"):
        tr_model.evaluate(R2R, 16, (1, 1), max_states=100)


def test_admission_latency_little_law_n1():
    """N = 1: nobody ever waits, so every admission latency is zero."""
    ev = tr_model.evaluate(R2R, 1, (1, 1))
    assert ev.mean_waiting == pytest.approx((0.0, 0.0))
    assert ev.admission_latency_ms == pytest.approx((0.0, 0.0))
    assert ev.per_request_tok_s == pytest.approx(ev.throughput_tok_s)


def test_batch_cap_limits_batch():
    spec = make_spec([6.0, 27.9], [[0.65, 0.35], [1, 0]], [[1, 0], [1, 0]], max_batch_size=[2, None])
    d, _ = spec.quanta_table(4)
    ch = dtmc.build_chain(spec.P, spec.C, d, 4, (1, 1), caps=spec.caps(4))
    assert ch.batch[:, 0].max() == 2
    uncapped = tr_model.evaluate(R2R, 4, (1, 1)).throughput_tok_s
    assert tr_model.evaluate(spec, 4, (1, 1)).throughput_tok_s < uncapped


def test_batch_dependent_latency_constant_table_is_identity():
    """A flat L(b) table must give exactly the constant-latency chain."""
    flat = make_spec([6.0, 27.9], R2R.P, R2R.C,
                     latency_curves=[{"batch_size": [1, 8], "step_latency_ms": [6.0, 6.0]}, None])
    a = tr_model.evaluate(flat, 6, (1, 2))
    b = tr_model.evaluate(R2R, 6, (1, 2))
    assert (a.states, a.transitions) == (b.states, b.transitions)
    assert a.throughput_tok_s == pytest.approx(b.throughput_tok_s, rel=1e-12)


def test_batch_dependent_latency_slows_down():
    slow = make_spec([6.0, 27.9], R2R.P, R2R.C,
                     latency_curves=[{"intercept_ms": 5.0, "per_request_ms": 1.0}, None])
    assert tr_model.evaluate(slow, 6, (1, 1)).throughput_tok_s < tr_model.evaluate(R2R, 6, (1, 1)).throughput_tok_s


def test_transition_limit_stops_enumeration():
    d, _ = R2R.quanta_table(16)
    with pytest.raises(dtmc.StateLimitExceeded) as info:
        dtmc.build_chain(R2R.P, R2R.C, d, 16, (1, 1), max_transitions=500)
    assert info.value.transitions and "max_transitions = 500" in str(info.value)


def test_rounding_floor_is_reported_not_hidden():
    """A tolerance below what rounding allows stops at the floor, says so, and keeps the value."""
    ref = tr_model.evaluate(R2R, 12, (1, 1))
    ev = tr_model.evaluate(R2R, 12, (1, 1), tol=1e-30)
    assert "rounding floor" in ev.solver
    assert ev.residual > 0
    assert ev.throughput_tok_s == pytest.approx(ref.throughput_tok_s, rel=1e-11)


@pytest.mark.parametrize("N,B", [(3, (1, 1)), (4, (2, 1)), (5, (1, 3))])
def test_recurrent_class_matches_networkx(N, B):
    """The closed class found by dtmc equals networkx's attracting component of the same graph."""
    nx = pytest.importorskip("networkx")
    d, _ = R2R.quanta_table(N)
    ch = dtmc.build_chain(R2R.P, R2R.C, d, N, B)
    coo = ch.T.tocoo()
    G = nx.DiGraph()
    G.add_nodes_from(range(ch.n_states))
    G.add_edges_from((int(i), int(j)) for i, j, v in zip(coo.row, coo.col, coo.data) if v > 0)
    attracting = list(nx.attracting_components(G))
    labels, closed = dtmc.closed_classes(ch.T)
    ours = [set(np.flatnonzero(labels == c).tolist()) for c in np.flatnonzero(closed)]
    assert sorted(map(sorted, ours)) == sorted(map(sorted, attracting))
    st = dtmc.stationary_distribution(ch.T)
    assert set(np.flatnonzero(st.pi > 0).tolist()) == attracting[0]
