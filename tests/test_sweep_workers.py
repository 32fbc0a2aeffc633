"""A sweep on a local pool: each worker solves the all-policy table itself and the workers share out the
first run's kernel compilation (issue 25, the default's first run); the answer is the serial one."""

from __future__ import annotations

import pytest

from optimizer.search import _sweep_chain, optimize_sweep
from tr_core.spec import preset

R2R = preset("r2r", [6.0, 27.9], p=0.35)


def _key(o):
    # the answer (the work done depends on each N's start, which is the previous N of the same worker)
    return (o.N, o.best_B, o.throughput_tok_s, o.certificate)


@pytest.mark.parametrize("search,Ns", [("certified", [3, 5, 6]), ("auto", [2, 3, 21])])
def test_pool_sweep_equals_the_serial_one_bounds_included(search, Ns):
    serial = optimize_sweep(R2R, Ns, search=search, eager=False)
    pooled = optimize_sweep(R2R, Ns, search=search, eager=False, workers=2)
    assert [_key(o) for o in pooled] == [_key(o) for o in serial]


def test_a_worker_solves_the_policy_table_only_where_a_search_reads_it(monkeypatch):
    import optimizer.search as S

    calls = []
    real = S._policy_table
    monkeypatch.setattr(S, "_policy_table", lambda *a: calls.append(a[1]) or real(*a))
    common = dict(search="auto", max_gap=0.005, time_budget_s=None, max_evaluations=None, policies=None,
                  eager=False)
    _sweep_chain((R2R, [2, 3], common, False, 0, 4))   # exhaustive N only: no table
    assert calls == []
    res = _sweep_chain((R2R, [3, 21], common, False, 0, 4))  # the pruned N reads it: solved once, then
    assert calls == [4] and res[-1].certificate == "pruned-exact"


def test_worker_1_compiles_the_bounds_kernels_first(monkeypatch):
    import optimizer.branch as Bd
    import optimizer.search as S

    order = []
    real_table, real_warm = S._policy_table, Bd.warm_box_kernels
    monkeypatch.setattr(S, "_policy_table", lambda *a: order.append("policy table") or real_table(*a))
    monkeypatch.setattr(Bd, "warm_box_kernels", lambda *a: order.append("box kernels") or real_warm(*a))
    common = dict(search="auto", max_gap=0.005, time_budget_s=None, max_evaluations=None, policies=None,
                  eager=False)
    res = _sweep_chain((R2R, [2], common, False, 1, 4))
    assert order == ["policy table", "box kernels"] and res[0].best_B == (1, 2)
    assert Bd.warm_box_kernels(R2R) is True                                   # R2R's steps allow a coarse clock
    assert Bd.warm_box_kernels(preset("r2r", [0.2, 0.3], p=0.35)) is False    # 2 and 3 quanta: no coarse clock
