"""One options source: the search flags of tr-optimize and tr-autotune run are derived from the fields of
tr_core.search_options.SearchOptions, the API keywords are the same fields, the rules are checked once, and a
library error names the field while the command line names the flag."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from tr_core.errors import SpecError, WorkTooLarge
from tr_core.search_options import (SEARCH_FIELDS, FieldError, FieldLimit, SearchOptions, field_flags,
                                    search_options_from_args)


def _actions(parser) -> dict:
    return {a.dest: a for a in parser._actions if a.option_strings}


def _run_parser():
    from tr_model.autotune_cli import build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices["run"]


def test_the_search_flags_of_both_commands_are_the_dataclass_fields():
    from tr_model.cli import build_parser
    flags = field_flags()
    assert set(flags) == set(SEARCH_FIELDS) == {f.name for f in dataclasses.fields(SearchOptions)}
    for parser in (build_parser(), _run_parser()):
        acts = _actions(parser)
        for name, flag in flags.items():
            act = acts[name]
            assert act.option_strings == [flag]
            meta = next(f for f in dataclasses.fields(SearchOptions) if f.name == name).metadata
            if meta["type"] is not None:
                assert act.type is meta["type"]
    opt, run = _actions(build_parser()), _actions(_run_parser())
    # the same help text in both commands, but for the defaults each command states
    for name in SEARCH_FIELDS:
        assert opt[name].choices == run[name].choices
        assert opt[name].metavar == run[name].metavar


def test_the_api_keywords_are_the_fields():
    from tr_model.tuning import autotune
    for fn in (autotune.tune, autotune.on_server_start):
        params = inspect.signature(fn).parameters
        assert set(SEARCH_FIELDS) <= set(params), fn.__name__
        for f in dataclasses.fields(SearchOptions):
            if f.name not in ("max_hours",):
                assert params[f.name].default == f.default, (fn.__name__, f.name)


def test_a_library_error_names_the_field_and_the_cli_names_the_flag(capsys):
    with pytest.raises(FieldError) as e:
        SearchOptions(search="exhaustive", max_gap=0.01)
    assert str(e.value) == "max_gap applies to search = 'certified' or 'auto', not 'exhaustive'"
    assert isinstance(e.value, SpecError)
    assert e.value.render(lambda f: field_flags()[f]) == "--max-gap applies to --search certified or auto, not exhaustive"
    with pytest.raises(FieldError, match=r"^max_states must be an integer >= 1, got 0$"):
        SearchOptions(max_states=0)

    from tr_model.autotune_cli import main
    assert _code(main, ["run", "--p", "0.35", "--L", "6", "28", "--N", "2", "--thresholds", "/tmp/x-never.json",
                        "--max-gap", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --max-gap must be a number in [0, 1), got 2"
    from tr_model.cli import main as opt_main
    assert _code(opt_main, ["--p", "0.35", "--L", "6", "28", "--N", "2", "--max-states", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --max-states must be an integer >= 1, got 0"


def _code(main, argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def test_the_gap_rule_is_checked_once_for_every_entry_point(tmp_path):
    import tr_model
    from tr_model.tuning.autotune import tune
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    for call in (lambda: tr_model.optimize(spec, 2, search="exhaustive", max_gap=0.01),
                 lambda: tr_model.optimize_many(spec, [1, 2], search="pruned", max_gap=0.01),
                 lambda: tune(spec, 2, tmp_path / "t.json", search="local", max_gap=0.01)):
        with pytest.raises(FieldError, match="max_gap applies to search = 'certified' or 'auto'"):
            call()
    # the default gap of a command is not a gap the user gave
    from tr_model.cli import build_parser, optimize_defaults
    a = build_parser().parse_args(["--search", "exhaustive"])
    assert search_options_from_args(a, defaults=optimize_defaults()).max_gap is None
    a = build_parser().parse_args(["--search", "exhaustive", "--max-gap", "0.005"])
    with pytest.raises(FieldError, match="^--max-gap applies to --search certified or auto, not exhaustive$"):
        search_options_from_args(a, defaults=optimize_defaults())


def test_a_limit_names_its_field_in_the_library_and_its_flag_on_the_command_line(tmp_path, capsys):
    import tr_model
    from tr_model.tuning.autotune import tune
    spec = tr_model.preset("r2r", [6.0, 27.9], p=0.35)
    with pytest.raises(FieldLimit) as e:
        tune(spec, 2000, tmp_path / "t.json", max_hours=1e-6)
    assert isinstance(e.value, WorkTooLarge)
    assert "max_hours = 1e-06" in str(e.value) and "time_budget_s" in str(e.value) and "--" not in str(e.value)
    from tr_model.autotune_cli import main
    assert _code(main, ["run", "--p", "0.35", "--L", "6", "28", "--N", "2000", "--thresholds",
                        str(tmp_path / "t.json"), "--max-hours", "1e-6", "--quiet"]) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --N = 2,000") and "--max-hours = 1e-06" in err and "--time-budget-s" in err
    assert "max_hours" not in err and "time_budget_s" not in err
