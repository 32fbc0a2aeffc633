"""A sweep's box pass remembers the previous N (optimizer.branch.BoxMemory): it skips only tries, so the
answers are the ones found without it, and the skip rules (margin, age, first-grid side) are as documented."""

from __future__ import annotations

import pytest

import optimizer.branch as BR
from optimizer.branch import BoxMemory
from optimizer.search import optimize_sweep, optimize_thresholds
from tr_core.spec import preset

R2R = preset("r2r", (6.0, 27.9), p=0.35)


def test_the_first_grid_keeps_its_side_while_it_gives_four_or_five_boxes_a_side():
    m = BoxMemory()
    assert m.begin(BR.MEMORY_FROM_N - 1, 4) is None          # below the memory's range: the default grid
    assert m.begin(160, 4) == 40
    m.note(((1, 1), (40, 40)), 30, 1.2)
    assert m.begin(162, 4) == 40                              # 162 <= 5 x 40: the same corners
    assert ((1, 1), (40, 40)) in m.prev
    assert m.begin(200, 4) == 40
    assert m.begin(201, 4) == 51 and m.prev == {}            # a sixth box a side: a new grid, nothing kept
    assert m.begin(120, 4) == 30 and m.prev == {}            # three boxes a side or fewer: a new grid


def test_a_clock_is_skipped_only_where_it_failed_widely_and_is_tried_again_after_three_skips():
    m = BoxMemory()
    m.begin(160, 4)
    box, near = ((1, 41), (40, 80)), ((11, 81), (20, 90))
    limit = 1.0 / (1.0 - 0.001)
    m.note(box, 30, 1.044)          # 4.4 % above the incumbent: skipped on slot 30
    m.note(box, 12, limit * 1.004)  # within the margin beyond the limit: tried
    m.note(near, 1, float("inf"))   # over the fine clock's cap
    skips = []
    for N in (162, 164, 166, 168, 170):
        m.begin(N, 4)
        skips.append((m.skip(box, 30, limit), m.skip(box, 12, limit), m.skip(near, 1, limit),
                      m.skip(near, 30, limit)))
    assert [s[0] for s in skips] == [True, True, True, False, False]   # carried three times, then tried afresh
    assert not any(s[1] for s in skips) and not any(s[3] for s in skips)
    assert [s[2] for s in skips] == [True, True, True, False, False]
    assert m.skipped == 6


def _sweep(Ns, **kw):
    return {o.N: o for o in optimize_sweep(R2R, Ns, search="pruned", workers=1, **kw)}


@pytest.mark.slow
def test_a_memory_that_skips_every_recorded_try_changes_no_answer(monkeypatch):
    Ns = list(range(20, 29, 2))
    exact = {N: optimize_thresholds(R2R, N, search="exhaustive") for N in Ns}
    plain = _sweep(Ns)
    # the most aggressive memory: every clock a box was tried on at the previous N is skipped (the box is
    # split without a build and its vectors go to the finer clocks, sub-boxes and chains)
    monkeypatch.setattr(BR, "MEMORY_FROM_N", 8)
    monkeypatch.setattr(BR, "MEMORY_SKIP_MARGIN", -1.0)
    seen = []

    class Counting(BoxMemory):
        def skip(self, box, c, limit):
            out = super().skip(box, c, limit)
            seen.append(out)
            return out

    monkeypatch.setattr(BR, "BoxMemory", Counting)
    skipping = _sweep(Ns)
    assert sum(seen) > 0, "the memory skipped nothing: the test exercises nothing"
    for N in Ns:
        assert exact[N].certificate == "exhaustive"
        truth = {e.B: e.throughput_tok_s for e in exact[N].evaluations}
        for o in (plain[N], skipping[N]):
            assert o.exact, (N, o.certificate)
            assert o.best_B == exact[N].best_B, N
            assert o.throughput_tok_s == pytest.approx(exact[N].throughput_tok_s, rel=1e-9)
            # every vector the search did not solve was pruned by a bound at least its true throughput
            assert o.pruned_vectors and o.evaluated + len(o.pruned_vectors) == len(truth)
            for B, name, bound in o.pruned_vectors:
                assert bound >= truth[B] * (1 - 1e-9), (N, B, name, bound, truth[B])


def test_a_memory_that_is_not_one_is_refused_by_name():
    from tr_core.errors import SpecError

    with pytest.raises(SpecError, match="box_memory must be an optimizer.branch.BoxMemory"):
        optimize_thresholds(R2R, 4, search="pruned", box_memory={"prev": {}})
