"""One house for every command: the same --quiet on every subcommand, the same missing-subcommand line, --B in
the list syntax of --L and --N, tr-autotune run's --solver and --search from the same homes as tr-optimize's."""

import argparse
import os

import pytest

import dtmc
from conftest import ROOT
from tr_core.cli import QUIET_HELP
from tr_core.search_rule import SEARCHES, search_help

MULTI = [("profiler.cli", "tr-profile"), ("tr_model.autotune_cli", "tr-autotune"), ("shadow_prefill.cli", "tr-shadow")]
MODULES = ("tr_model.cli", "profiler.cli", "tr_model.autotune_cli", "shadow_prefill.cli", "tr_model.plan_cli")


def _parsers():
    import importlib

    for mod in MODULES:
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


def _leaves(parser):
    """The parsers that run something: every subcommand, and a command without subcommands."""
    return [p for p in _walk(parser)
            if not any(isinstance(act, argparse._SubParsersAction) for act in p._actions)]


def test_every_subcommand_takes_quiet():
    leaves = [p for _, top in _parsers() for p in _leaves(top)]
    assert len(leaves) >= 19
    assert [p.prog for p in leaves if _flag(p, "--quiet") is None] == []


# One command line per subcommand, run as is and with --quiet: the same exit code, and no note: line with --quiet.
# Most make notes without --quiet (a comma list, a partial table, extrapolated rows, a written file, noisy
# profiles); a command that cannot finish here in a second (a server, a benchmark of one, ten approaches) is
# given a bad input the command itself refuses after parsing (exit 2, the same error: line both times).
EX = os.path.join(ROOT, "data", "examples")
SYSTEM = ["--p", "0.35", "--L", "6", "27.9"]
LATENCIES = [os.path.join(EX, "latency-small.json"), os.path.join(EX, "latency-large.json")]
CONFIGS = [os.path.join(EX, "small-config.json"), os.path.join(EX, "large-config.json")]
TRACE = os.path.join(EX, "routing-trace.jsonl")
QUIET_CASES = {
    "tr-optimize": (["tr-optimize", "--p", "0.35", "--L", "6,27.9", "--N", "2", "--no-cache"], 0),
    "tr-plan": (["tr-plan", "--model", os.path.join(ROOT, "data/models/Qwen3-0.6B/config.json"), "--model",
                 os.path.join(ROOT, "data/models/Qwen3-32B/config.json"), "--gpu", "h200", "--gpus", "1", "--N", "2",
                 "--context-tokens", "512"], 0),
    "tr-autotune run": (["tr-autotune", "run", *SYSTEM, "--N", "3", "--thresholds", "new.json", "--time-budget-s",
                         "0"], 0),
    "tr-autotune show": (["tr-autotune", "show", "partial.json"], 0),
    "tr-autotune kv-plan": (["tr-autotune", "kv-plan", "--placement",
                             os.path.join(ROOT, "data", "models", "paper-placement.json"), "--N", "16"], 0),
    "tr-autotune measure": (["tr-autotune", "measure", *SYSTEM, "--N", "2", "--B", "1", "2", "--no-predict",
                             "--duration-s", "0.3", "--warmup-s", "0"], 0),
    "tr-autotune export r2r": (["tr-autotune", "export", "r2r", "--thresholds", "partial.json"], 0),
    "tr-autotune serve": (["tr-autotune", "serve", *SYSTEM, "--eager"], 2),  # --eager needs --N
    "tr-profile latency": (["tr-profile", "latency", "--config", CONFIGS[0], "--device", "cpu", "--batch-sizes", "1",
                            "--steps", "1", "--warmup-steps", "0", "--threads", "1", "--out", "p.json"], 0),
    "tr-profile routing": (["tr-profile", "routing", "--trace", TRACE, "--L", "6,27.9"], 0),
    "tr-profile route-run": (["tr-profile", "route-run", "--config", *CONFIGS, "--prompts", "prompts.jsonl",
                              "--policy", "confidence", "--tau", "0.5", "--max-new-tokens", "2", "--device", "cpu",
                              "--trace-out", "rr.jsonl"], 0),
    "tr-profile system": (["tr-profile", "system", "--latency-profile", *LATENCIES, "--trace", TRACE, "--out",
                           "spec.json"], 0),
    "tr-profile roofline": (["tr-profile", "roofline", *LATENCIES, "--bandwidth-gbs", "100"], 0),
    "tr-profile serve-bench": (["tr-profile", "serve-bench", "--url", "http://127.0.0.1:9", "--N", "1",  # not a
                                "--predicted", os.path.join(EX, "spec-r2r.json")], 2),  # result file
    "tr-shadow stats": (["tr-shadow", "stats", "--synthetic", "--sessions", "3"], 0),
    "tr-shadow sessions": (["tr-shadow", "sessions", "--synthetic", "--sessions", "3", "--out", "s.jsonl"], 0),
    "tr-shadow latency": (["tr-shadow", "latency", "--model", "qwen3-8b"], 0),
    "tr-shadow simulate": (["tr-shadow", "simulate", "--synthetic", "--sessions", "3", "--warmup-s", "0",
                            "--measure-s", "5", "--drain-s", "5"], 0),
    "tr-shadow compare": (["tr-shadow", "compare", "--synthetic", "--sessions", "3", "--windows", "noon"], 2),
}


def test_the_quiet_cases_cover_every_subcommand():
    assert sorted(QUIET_CASES) == sorted(p.prog for _, top in _parsers() for p in _leaves(top))


@pytest.fixture(scope="module")
def partial_table(tmp_path_factory):
    """A thresholds file with no row computed: show and export name its extrapolated rows in notes."""
    from conftest import call_inproc
    d = tmp_path_factory.mktemp("quiet")
    r = call_inproc("tr-autotune", "run", *SYSTEM, "--N", "3", "--thresholds", d / "partial.json",
                    "--time-budget-s", "0", "--quiet")
    assert r.returncode == 0, r.stderr
    return d / "partial.json"


@pytest.mark.parametrize("case", sorted(QUIET_CASES))
def test_quiet_silences_the_notes_of_every_subcommand(case, run_inproc, partial_table, tmp_path, monkeypatch):
    import shutil
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TR_MODEL_CACHE_DIR", str(tmp_path / "cache"))
    shutil.copy(partial_table, "partial.json")
    (tmp_path / "prompts.jsonl").write_text('{"input_ids": [1, 2, 3]}\n')
    argv, code = QUIET_CASES[case]
    loud = run_inproc(*argv)
    quiet = run_inproc(*argv, "--quiet")
    assert loud.returncode == code, loud.stderr
    assert quiet.returncode == code, quiet.stderr
    assert [ln for ln in quiet.stderr.splitlines() if ln.startswith("note:")] == [], quiet.stderr
    assert "Traceback" not in quiet.stderr
    if code == 2:  # refused by the command itself, not by the parser: the same one line, --quiet or not
        assert quiet.stderr == loud.stderr and quiet.stderr.startswith("error: ")
        assert quiet.stderr.count("\n") == 1 and "unrecognized arguments" not in quiet.stderr


def test_a_note_made_while_parsing_waits_for_quiet(capsys):
    from tr_core import cli
    p = cli.Parser(prog="tool")
    cli.add_list_arg(p, "--L")
    cli.add_quiet_arg(p)

    def command(argv):
        p.parse_args(argv)
        cli.note("chosen")
        return 0

    assert cli.run_cli(command, ["--L", "6,28"]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "note: comma-separated lists for --L are deprecated; separate the values with spaces", "note: chosen"]
    assert cli.run_cli(command, ["--L", "6,28", "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    cli.note("outside a command")  # --quiet held for that command only
    assert capsys.readouterr().err == "note: outside a command\n"
    with pytest.raises(SystemExit):  # a bad flag after a comma list: the note, then the one error line
        p.parse_args(["--L", "6,28", "--nope"])
    assert capsys.readouterr().err.splitlines() == [
        "note: comma-separated lists for --L are deprecated; separate the values with spaces",
        "error: unrecognized arguments: --nope"]
