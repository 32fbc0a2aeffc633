"""One house for every command (issue 25, item 4): the same --quiet, the same missing-subcommand line, --B in
the list syntax of --L and --N, tr-autotune run's --solver and --search from the same homes as tr-optimize's."""

import argparse

import pytest

import dtmc
from tr_core.cli import QUIET_HELP
from tr_core.search_rule import SEARCHES, search_help

MULTI = [("profiler.cli", "tr-profile"), ("tr_model.autotune_cli", "tr-autotune"), ("shadow_prefill.cli", "tr-shadow")]


def _parsers():
    import importlib

    for mod in ("tr_model.cli", "profiler.cli", "tr_model.autotune_cli", "shadow_prefill.cli"):
        yield mod, importlib.import_module(mod).build_parser()


def _walk(parser):
    yield parser
    for act in parser._actions:
        if isinstance(act, argparse._SubParsersAction):
            for sub in dict.fromkeys(act.choices.values()):
                yield from _walk(sub)


def _flag(parser, name):
    return next((a for a in parser._actions if name in a.option_strings), None)


def test_quiet_means_one_thing_everywhere():
    seen = 0
    for _, top in _parsers():
        for p in _walk(top):
            act = _flag(p, "--quiet")
            if act is not None:
                assert act.help == QUIET_HELP, (p.prog, act.help)
                seen += 1
    assert seen >= 6


@pytest.mark.parametrize("module, prog", MULTI)
def test_one_wording_for_a_missing_subcommand(module, prog, capsys):
    import importlib

    main = importlib.import_module(module).main
    try:
        code = main([])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("error: a subcommand is required: ") and err[0].endswith(f"(see {prog} --help)")


@pytest.mark.parametrize("values, want", [(["1", "5"], [1, 5]), (["1,5"], [1, 5])])
def test_b_takes_the_list_syntax(values, want):
    from tr_model.autotune_cli import build_parser as autotune_parser
    from tr_model.cli import build_parser

    a = build_parser().parse_args(["--p", "0.35", "--L", "6", "28", "--N", "8", "--B", *values])
    assert a.B == want
    m = autotune_parser().parse_args(["measure", "--p", "0.35", "--L", "6", "28", "--N", "8", "--B", *values])
    assert m.B == want


@pytest.mark.parametrize("bad", ["x", "1.5"])
def test_b_refuses_a_non_integer_in_one_line(bad, capsys):
    from tr_model.cli import main

    try:
        code = main(["--p", "0.35", "--L", "6", "28", "--N", "8", "--B", "1", bad])
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == [f"error: --B: {bad!r} is not an integer"]


def test_autotune_run_solver_and_search_come_from_their_homes():
    from tr_model.autotune_cli import build_parser

    run = next(p for p in _walk(build_parser()) if p.prog.endswith(" run"))
    solver, search = _flag(run, "--solver"), _flag(run, "--search")
    assert tuple(solver.choices) == dtmc.SOLVERS and solver.help.endswith(dtmc.solver_help("auto"))
    assert tuple(search.choices) == SEARCHES and search.help.endswith(search_help("auto"))
