"""tr-optimize --search-budget-s: a bounded search that reaches its budget answers certified, with a proven
bound that still covers the true optimum, and says why its gap is what it is."""

from __future__ import annotations

import json

R2R = ("--p", "0.35", "--L", "6.0", "27.9")


def _result(out: str) -> dict:
    return json.loads(out)["results"][0]


def _run(run_inproc, *args):
    r = run_inproc("tr-optimize", *args)
    return r.returncode, r.stdout, r.stderr


def test_a_search_that_reaches_its_budget_answers_certified_and_its_bound_covers_the_optimum(run_inproc):
    code, out, err = _run(run_inproc, *R2R, "--N", "24", "--format", "json", "--no-cache", "--quiet")
    assert code == 0, err
    exact = _result(out)
    assert exact["certificate"] in ("pruned-exact", "exhaustive")
    # a budget far shorter than one chain solve: the search stops after its first chain
    code, out, err = _run(run_inproc, *R2R, "--N", "24", "--search-budget-s", "0.000001", "--format",
                                "json", "--no-cache", "--quiet")
    assert code == 0, err
    got = _result(out)
    assert got["certificate"] == "certified"
    assert got["unresolved"] > 0
    assert got["throughput_tok_s"] <= exact["throughput_tok_s"] * (1 + 1e-9)
    assert got["upper_bound_tok_s"] >= exact["throughput_tok_s"] * (1 - 1e-9)
    assert got["gap"] > 0.001
    warn = [x for x in err.splitlines() if x.startswith("warning:")]
    assert len(warn) == 1 and "--search-budget-s" in warn[0], err


def test_a_budget_the_search_does_not_reach_changes_nothing(run_inproc):
    args = (*R2R, "--N", "12", "--search", "pruned", "--format", "json", "--no-cache", "--quiet")
    code, out, err = _run(run_inproc, *args)
    code_b, out_b, err_b = _run(run_inproc, *args, "--search-budget-s", "3600")
    assert code == code_b == 0, err + err_b
    a, b = _result(out), _result(out_b)
    assert (a["B"], a["certificate"], a["throughput_tok_s"]) == (b["B"], b["certificate"], b["throughput_tok_s"])
    assert "warning:" not in err_b


def test_a_budget_must_be_a_positive_number(run_inproc):
    for bad in ("0", "-5", "nan", "inf", "abc"):
        code, out, err = _run(run_inproc, *R2R, "--N", "4", "--search-budget-s", bad)
        lines = [x for x in err.splitlines() if x.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and "--search-budget-s" in lines[0], err


def test_the_budget_bounds_the_time_estimate_of_a_sweep(run_inproc):
    # unbudgeted, N = 1-2000 is estimated at years and refused by --max-hours; 2,000 N at one second each is not
    code, out, err = _run(run_inproc, *R2R, "--N", "1-2000", "--max-hours", "1", "--quiet")
    assert code == 3 and "--max-hours" in err
    code, out, err = _run(run_inproc, *R2R, "--N", "1-2000", "--search-budget-s", "10", "--max-hours",
                                "0.5", "--quiet")
    assert code == 3 and "--search-budget-s 10" in err and "--max-hours" in err, err


class _Clock:
    """A clock for optimizer.branch that moves only when chains are solved: ``per_chain`` seconds each."""

    def __init__(self, per_chain: float):
        self.now, self.per_chain, self.chains = 0.0, per_chain, 0

    def perf_counter(self) -> float:
        return self.now

    def wrap(self, fn):
        def solve(spec, N, todo, *rest, **kw):
            out = fn(spec, N, todo, *rest, **kw)
            self.chains += len(todo)
            self.now += self.per_chain * len(todo)
            return out
        return solve


def test_a_budget_is_checked_between_chains_and_half_is_left_to_the_bounds(monkeypatch):
    """Every chain costs 10 s on the fake clock and the budget is 25 s: the ascent may use 12.5 s, so it stops
    after its second chain (not after its round of neighbours), the box pass prunes in the time left, and the
    later passes stop after one chain more."""
    import types

    import tr_model
    from optimizer import branch
    from optimizer.search import optimize_thresholds

    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    exact = optimize_thresholds(spec, 24, search="pruned")
    clock = _Clock(10.0)
    monkeypatch.setattr(branch, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    monkeypatch.setattr(branch, "_evaluate_each", clock.wrap(branch._evaluate_each))
    got = optimize_thresholds(spec, 24, search="certified", time_budget_s=25.0, workers=1)
    # the eager chain (solved before the ascent, off this clock), two ascent chains (0 -> 10 -> 20 s: the
    # second starts at 10 < 12.5), then one chain of the later passes (20 < 25 -> 30 s) and the stop
    assert clock.chains == 3, clock.chains
    assert got.evaluated == 4
    assert got.certificate == "certified" and got.unresolved > 0
    # the box pass ran in the half the ascent left (this clock does not move while it builds its processes)
    assert any(name.startswith("box") for name in got.pruned_by), got.pruned_by
    assert got.upper_bound_tok_s >= exact.throughput_tok_s * (1 - 1e-9)
    assert got.throughput_tok_s <= exact.throughput_tok_s * (1 + 1e-9)
