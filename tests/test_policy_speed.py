"""The fast optimal-policy solver (issue 27, target 3) against the solver it replaced.

The reference is the value iteration of ``optimizer.policy`` before the change (forward Gauss-Seidel sweeps in
blocks of up to 64, ``lam`` moved only at a bracket, ``rtol = 1e-10``), restated here from the kernels it used
(``mdp_sweeps``, ``mdp_bracket``); the new solver must return the same policy value and a valid proven gap."""

import math

import numpy as np
import pytest

from optimizer import _kernels as K
from optimizer import policy as POL
from tr_core.spec import preset


def _old_value_iteration(proc, rtol=1e-10, omega=0.7, max_sweeps=200_000):
    n = proc.n
    per_state = proc.opt_ptr[proc.out_ptr[1:n + 1]] - proc.opt_ptr[proc.out_ptr[:n]]
    terms = int(per_state.max()) + 8
    h = np.zeros(n)
    lam = float(np.sum(proc.g) / np.sum(proc.tau))
    lo_b, hi_b = -math.inf, math.inf
    sweeps, step = 0, 8
    mdp = K.MDP(n, proc.out_ptr, proc.out_prob, proc.opt_ptr, proc.opt_idx, proc.g, proc.tau)
    while True:
        K.mdp_sweeps(mdp, h, lam, step, omega)
        sweeps += step
        a, b, mag = K.mdp_bracket(mdp, h)
        err = mag * 4 * terms * np.finfo(np.float64).eps
        lo_b, hi_b = max(lo_b, a - err), min(hi_b, b + err)
        lam = 0.5 * (lo_b + hi_b)
        if hi_b - lo_b <= rtol * abs(hi_b) or sweeps >= max_sweeps:
            return h, lo_b, hi_b, sweeps
        step = min(2 * step, 64)


def _old_optimum(spec, N, proc):
    """The old path's greedy policy: (exact tok/s, its proven relative error, all-policy bound tok/s)."""
    h, _lo, hi, _sw = _old_value_iteration(proc)
    choice, init = POL.greedy(proc, h)
    sol = POL.evaluate_table(spec, N, POL.table_of(proc, choice, init), d=proc.d, dco=proc.dco)
    scale = 1000.0 / spec.delta_ms
    return sol.throughput_per_quantum * scale, sol.throughput_error_bound, hi * scale


def _r2r():
    return preset("r2r", [6.0, 27.9], p=0.35)


CASES = [("r2r-4", _r2r(), 4, False), ("r2r-8", _r2r(), 8, False),
         ("r2r-corun-1.5-4", _r2r().with_corun([1.5, 1.05]), 4, True)]


@pytest.mark.parametrize("name,spec,N,rnd", CASES, ids=[c[0] for c in CASES])
def test_fast_solver_matches_the_old_one(name, spec, N, rnd):
    proc = POL.build_process(spec, N, round_to_grid=rnd)
    T_old, err_old, U_old = _old_optimum(spec, N, proc)
    r = POL.optimal_policy(spec, N, proc=proc, round_to_grid=rnd)
    # the same optimum: the policy's exact chain value, to the chains' proven errors (1e-12 or better here)
    assert r.throughput_tok_s == pytest.approx(T_old, rel=1e-11, abs=0)
    assert r.throughput_error_bound <= 1e-11 and err_old <= 1e-11
    # a valid proven gap: the bound is at least the policy's value, and both bounds agree within the gaps
    assert r.gap <= 1e-6
    assert r.upper_bound_tok_s >= r.throughput_tok_s * (1 - r.throughput_error_bound)
    assert r.upper_bound_tok_s == pytest.approx(U_old, rel=2e-6)
    assert r.lower_bound_tok_s <= r.throughput_tok_s * (1 + 1e-12)
    # the new loop needs far fewer sweeps than the old one's 2,000 or so (48-64 here)
    assert r.sweeps < 300


def test_corun_optimum_beats_every_class_and_its_empty_batches_are_ties():
    """R2R with co-running 1.5 / 1.05 at N = 4: the fast solver's optimum beats every compact class member tried
    (B* as each class, and each class's ascent from B*) by more than its proven gap.  The old solver's table
    started empty batches in two configurations it meets; they are ties (launching and waiting worth the same
    to 1e-11 of the relative values), so a table of the same value need not: the value is what must agree."""
    spec, N = _r2r().with_corun([1.5, 1.05]), 4
    proc = POL.build_process(spec, N, round_to_grid=True)
    r = POL.optimal_policy(spec, N, proc=proc, round_to_grid=True)
    assert r.gap <= 1e-6
    h_old = _old_value_iteration(proc)[0]
    choice, init = POL.greedy(proc, h_old)
    tab = POL.table_of(proc, choice, init)
    met = np.isin(POL._packed(proc, tab), POL.reached_configs(proc, choice, init))
    empty = (tab.states[:, :, 0] == 0) & tab.launch & met[:, None]
    marg = POL.decision_margins(proc, h_old)
    assert empty.any() and np.all(np.abs(marg[empty]) <= 1e-9 * np.abs(h_old).max())
    for cls in ("busy", "residual", "ratio"):
        _p, v, _n = POL.search_class(spec, N, proc, cls, POL.class_start(cls, (2, 3)))
        assert v < r.throughput_tok_s * (1 - 1e-3)


def test_the_bracket_is_a_bound_at_every_stop():
    """Stopped early (a loose rtol or a sweep cap), the bracket still holds the optimum: lower <= optimum <= upper."""
    spec, N = _r2r(), 6
    proc = POL.build_process(spec, N)
    opt = POL.optimal_policy(spec, N, proc=proc).throughput_tok_s / 1e4
    for kw in ({"rtol": 0.3}, {"rtol": 1e-3}, {"max_sweeps": 4}, {"max_sweeps": 12, "every": 3}):
        _h, lo, hi, sw = POL.value_iteration(proc, **kw)
        assert lo <= opt * (1 + 1e-12) and hi >= opt * (1 - 1e-12)
        if "rtol" in kw:
            assert hi - lo <= kw["rtol"] * hi
        else:
            assert sw >= kw["max_sweeps"]


def test_cli_json_writes_an_optimal_table_one_entry_per_line():
    """tr-optimize --format json: the same document as the indented dump, the optimal table one entry per line,
    the document itself left as it was; without a table the text is the indented dump."""
    import json

    from tr_model.cli import render
    entries = [{"k": [3 - i, i], "b": [0, 1], "r_quanta": [0, 5], "launch": [bool(i % 2), False]} for i in range(4)]
    doc = {"schema_version": 1, "results": [
        {"N": 4, "B": [1, 3], "policy": {"class": "optimal", "gap": 1e-9,
                                         "table": {"schema_version": 1, "N": 4, "entries": entries}}},
        {"N": 5, "B": [1, 3], "policy": {"class": "optimal", "table": {"schema_version": 1, "N": 5, "entries": []}}},
        {"N": 6, "B": [1, 4]}]}
    text = render(doc, "json")
    assert json.loads(text) == json.loads(json.dumps(doc, indent=2))
    assert doc["results"][0]["policy"]["table"]["entries"] is entries
    rows = [ln for ln in text.splitlines() if ln.lstrip().startswith('{"k"')]
    assert len(rows) == len(entries) and all(json.loads(ln.rstrip(",")) in entries for ln in rows)
    plain = {"schema_version": 1, "results": [{"N": 4, "B": [1, 3]}]}
    assert render(plain, "json") == json.dumps(plain, indent=2) + "\n"
