"""The search names, the ``auto`` rule and its ``--help`` (tr_core.search_rule), and tr-optimize's default:
what the help says is what the searches do (issue 25, item 3)."""

import math
import re
from types import SimpleNamespace

import pytest

import dtmc
import tr_model
from optimizer.search import optimize_sweep, optimize_thresholds
from tr_core import search_rule as R
from tr_core.cli import IntRanges

SPEC = tr_model.preset("r2r", [6.0, 27.9], p=0.35)


def _action(parser, flag):
    return next(a for a in parser._actions if flag in a.option_strings)


def test_resolve_auto_boundaries_follow_the_constants():
    n_ex, n_pr = R.largest_n(R.AUTO_EXHAUSTIVE_MAX, 2), R.largest_n(R.AUTO_PRUNED_MAX, 2)
    assert (n_ex, n_pr) == (20, 128)
    c = lambda n, m=2: math.comb(n - 1 + m, m)  # noqa: E731
    assert R.resolve_auto(2, c(n_ex)) == "exhaustive" and R.resolve_auto(2, c(n_ex + 1)) == "pruned"
    assert R.resolve_auto(2, c(n_pr)) == "pruned" and R.resolve_auto(2, c(n_pr + 1)) == "certified"
    assert R.auto_n_limits(2) == (n_ex, n_pr)
    w_ex, w_pr = R.auto_n_limits(3)
    assert (w_ex, w_pr) == (6, 9)
    assert R.resolve_auto(3, c(w_ex, 3)) == "exhaustive" and R.resolve_auto(3, c(w_ex + 1, 3)) == "pruned"
    assert R.resolve_auto(3, c(w_pr, 3)) == "pruned" and R.resolve_auto(3, c(w_pr + 1, 3)) == "certified"
    assert R.resolve_auto(2, 3, time_budget_s=1.0) == "certified"


def test_search_help_is_built_from_the_rule():
    from tr_model.cli import build_parser

    act = _action(build_parser(), "--search")
    assert act.default == R.DEFAULT_SEARCH == "auto"
    assert tuple(act.choices) == R.SEARCHES
    text = act.help
    assert text == R.search_help(R.DEFAULT_SEARCH)
    for name in R.SEARCHES:
        assert f"{name}:" in text
    # every N the help names is where resolve_auto changes its answer
    limits = [int(x) for x in re.findall(r"N <= (\d+)", text)]
    assert limits == [R.largest_n(R.AUTO_EXHAUSTIVE_MAX, 2), R.largest_n(R.AUTO_PRUNED_MAX, 2)]
    answers = [R.resolve_auto(2, math.comb(n + 1, 2)) for n in (limits[0], limits[0] + 1, limits[1], limits[1] + 1)]
    assert answers == ["exhaustive", "pruned", "pruned", "certified"]
    assert f"{R.AUTO_EXHAUSTIVE_MAX:,}" in text and f"{R.AUTO_PRUNED_MAX:,}" in text
    assert _action(build_parser(), "--max-gap").default == R.DEFAULT_MAX_GAP


def test_solver_help_is_built_from_the_solver_constants():
    from tr_model.cli import build_parser

    act = _action(build_parser(), "--solver")
    assert act.default == "auto" and tuple(act.choices) == dtmc.SOLVERS
    for value in (f"{dtmc.ACCURACY_TARGET:g}", f"{dtmc.ACCURACY_TOL:g}", f"{dtmc.solve.GTH_MAX_WORK:.0e}",
                  f"{dtmc.solve.DIRECT_FALLBACK_LIMIT:,}"):
        assert value in act.help, value
    for name in dtmc.SOLVERS:
        assert f"{name}:" in act.help


def test_optimizer_and_autotune_use_the_one_home():
    import optimizer
    from optimizer import search as S
    from tr_model.tuning import autotune

    assert S.SEARCHES is R.SEARCHES and optimizer.DEFAULT_MAX_GAP == R.DEFAULT_MAX_GAP
    assert set(autotune.SEARCHES) == set(R.SEARCHES)


@pytest.mark.parametrize("N, certificate", [(3, "exhaustive"), (21, "pruned-exact")])
def test_auto_runs_what_the_rule_says(N, certificate):
    o = optimize_thresholds(SPEC, N, search="auto")
    assert o.certificate == certificate
    if N <= 20:
        ex = optimize_thresholds(SPEC, N, search="exhaustive")
        assert o.best_B == ex.best_B and o.throughput_tok_s == ex.throughput_tok_s


def test_auto_spans_and_counted_evaluations():
    from tr_model.cli import _auto_note, _auto_spans, _sweep_evaluations

    Ns = IntRanges([(1, 64)])
    assert _auto_spans(2, Ns) == [("exhaustive", [(1, 20)]), ("pruned", [(21, 64)])]
    assert _auto_spans(2, IntRanges([(100, 200)])) == [("pruned", [(100, 128)]), ("certified", [(129, 200)])]
    assert _auto_spans(3, IntRanges([(1, 12)])) == [("exhaustive", [(1, 6)]), ("pruned", [(7, 9)]),
                                                     ("certified", [(10, 12)])]
    ex20 = sum(math.comb(n + 1, 2) for n in range(1, 21))
    assert _sweep_evaluations(2, Ns, None, "exact", "auto") == ex20 + 44
    assert _sweep_evaluations(2, Ns, None, "exact", "exhaustive") == math.comb(66, 3)
    assert _auto_note(2, Ns) == "search auto: exhaustive for N = 1-20; pruned (exact) for N = 21-64"


def test_sweep_reports_each_n_once(tmp_path):
    seen = []
    res = optimize_sweep(SPEC, [1, 2, 3, 5], search="auto", on_result=lambda o: seen.append(o.N))
    assert sorted(seen) == [1, 2, 3, 5] and [o.N for o in res] == [1, 2, 3, 5]
    seen.clear()
    optimize_sweep(SPEC, [1, 2, 3], search="exhaustive", on_result=lambda o: seen.append(o.N))
    assert seen == [1, 2, 3]


def test_sweep_on_a_pool_relays_each_n(tmp_path):
    seen = []
    res = optimize_sweep(SPEC, [2, 3, 4, 22], search="auto", workers=2, cache=str(tmp_path / "c"),
                         on_result=lambda o: seen.append((o.N, o.best_B)))
    assert sorted(seen) == sorted((o.N, o.best_B) for o in res)


def test_cli_default_is_auto_and_sweeps_show_rows(capsys, tmp_path):
    from tr_model import cli

    rc = cli.main(["--p", "0.35", "--L", "6", "27.9", "--N", "2-3", "21", "--cache-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 0
    assert "note: search auto: exhaustive for N = 2-3; pruned (exact) for N = 21" in err
    lines = [x for x in err.splitlines() if x.startswith("N = ")]
    assert len(lines) == 3 and "pruned, exact" in lines[-1] and lines[-1].endswith("[3/3]")
    assert "21" in out.splitlines()[-1]
    rc = cli.main(["--p", "0.35", "--L", "6", "27.9", "--N", "2-3", "21", "--quiet", "--cache-dir", str(tmp_path)])
    assert rc == 0 and capsys.readouterr().err == ""
    rc = cli.main(["--p", "0.35", "--L", "6", "27.9", "--N", "2-3", "--cache-dir", str(tmp_path)])
    assert rc == 0 and capsys.readouterr().err == ""   # a short exhaustive sweep: only the table


def test_cli_default_with_corun_runs_the_auto_rule(capsys, tmp_path):
    """Co-running latencies: the default search works and is exact (pruned == exhaustive at N = 21)."""
    import json

    from tr_model import cli

    argv = ["--p", "0.35", "--L", "6", "28", "--corun-slowdown", "1.5", "1.2", "--N", "21",
            "--cache-dir", str(tmp_path), "--format", "json"]
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, err
    auto = json.loads(out)["results"][0]
    assert auto["certificate"] == "pruned-exact"
    assert cli.main(argv + ["--search", "exhaustive"]) == 0
    ex = json.loads(capsys.readouterr().out)["results"][0]
    assert auto["B"] == ex["B"] and auto["throughput_tok_s"] == pytest.approx(ex["throughput_tok_s"], rel=1e-9)


def _ev(B, thr, bound, method="tree bound"):
    return SimpleNamespace(B=B, throughput_tok_s=thr, throughput_error_bound=bound, bound_method=method,
                           accuracy_ok=dtmc.proven_ok(bound, method),
                           to_dict=lambda: {"throughput_error_bound": bound})


@pytest.mark.parametrize("rival, stands, rivals", [
    (_ev((1, 3), 90.0, 1e-3), True, []),                   # loose, but its bound keeps it below B*
    (_ev((1, 3), 99.99, 1e-3), False, [[1, 3]]),           # loose and could reach B*'s throughput
    (_ev((1, 3), 50.0, 1e-3, "estimate: x"), False, [[1, 3]]),   # no proven bound: cannot be ruled out
    (_ev((1, 3), 50.0, 1e-12), True, []),                  # a tight one is no concern
])
def test_what_a_loose_rejected_chain_means_for_b_star(rival, stands, rivals, capsys):
    from tr_model.cli import _accuracy_of, _warn_inaccurate

    best = _ev((1, 2), 100.0, 1e-12)
    acc = _accuracy_of(SimpleNamespace(best=best, evaluations=[best, rival]))
    assert acc["b_star_stands"] is stands and acc["b_star_rivals"] == rivals
    _warn_inaccurate({"results": [{"N": 4, **acc}]})
    err = capsys.readouterr().err
    if acc["accuracy_ok"]:
        assert err == ""
    else:
        assert err.startswith("warning:") and len(err.splitlines()) == 1
        assert ("B* and its throughput stand" in err) is stands
        assert ("B* is not proven" in err) is (not stands)
