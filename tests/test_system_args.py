"""The system flags live in one module (tr_core.system_args), used by tr-optimize and tr-autotune run/measure."""

from __future__ import annotations

import json

import pytest

from tr_core import system_args
from tr_core.cli import Parser
from tr_core.errors import SpecError

SYSTEM_FLAGS = {"--spec", "--algo", "--p", "--q", "--weights", "--L", "--L-table", "--max-batch", "--delta-ms",
                "--delta-rtol", "--round"}


def _parser():
    p = Parser(prog="t")
    system_args.add_system_args(p)
    return p


def _flags(parser):
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


def _subparser(parser, name):
    import argparse
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return a.choices[name]


def test_every_command_has_the_same_system_flags():
    from tr_model import autotune_cli, cli
    opt = cli.build_parser()
    at = autotune_cli.build_parser()
    for parser in (opt, _subparser(at, "run"), _subparser(at, "measure")):
        assert SYSTEM_FLAGS <= _flags(parser)
        helps = {a.option_strings[0]: a.help for a in parser._actions if a.option_strings}
        assert helps["--L"] == {a.option_strings[0]: a.help for a in _parser()._actions if a.option_strings}["--L"]


def test_the_latency_table_is_read_once(tmp_path, monkeypatch):
    import tr_core.grid as grid
    t = tmp_path / "lat.json"
    t.write_text(json.dumps([{"batch_size": [1, 8], "step_latency_ms": [6.0, 8.0]},
                             {"batch_size": [1, 8], "step_latency_ms": [27.9, 30.0]}]))
    calls = []
    real = grid.load_latency_table
    monkeypatch.setattr(grid, "load_latency_table", lambda *a, **k: calls.append(a) or real(*a, **k))
    s = system_args.build_system(_parser().parse_args(["--p", "0.35", "--L-table", str(t)]), 4)
    assert len(calls) == 1
    assert s.spec.step_latency_ms == (6.0, 27.9) and s.spec.latency_ms(1, 8) == 30.0


@pytest.mark.parametrize("argv,msg", [
    (["--p", "0.35", "--L", "0", "27.9"], "--L: step_latency_ms[0] must be > 0"),
    (["--p", "0.35", "--L", "6", "nan"], "--L: step_latency_ms must be finite"),
    (["--p", "0.35", "--L", "6", "27.9", "--delta-ms", "0"], "--delta-ms must be > 0"),
    (["--p", "0.35", "--L", "6", "27.9", "--max-batch", "4"], "--max-batch needs M = 2 values"),
    (["--p", "1.5", "--L", "6", "27.9"], "--p = 1.5 is not a probability"),
    (["--L", "6", "27.9"], "define the system"),
    (["--p", "0.35", "--q", "0.2", "--L", "6", "27.9"], "--q applies to --algo r-stitch"),
])
def test_values_are_checked_once_by_the_spec_and_named_by_flag(argv, msg):
    with pytest.raises(SpecError) as e:
        system_args.build_system(_parser().parse_args(argv), 4)
    assert msg in str(e.value), str(e.value)


def test_delta_auto_needs_the_largest_N_and_rounds():
    a = _parser().parse_args(["--p", "0.35", "--L", "6.137", "27.9", "--delta-ms", "auto"])
    with pytest.raises(SpecError, match="needs the concurrency N"):
        system_args.build_system(a, None)
    s = system_args.build_system(a, 4)
    assert s.round_to_grid and s.delta_auto["delta_ms"] == s.spec.delta_ms and s.notes()
