"""The shared CLI plumbing (tr_core.cli) keeps the convention of docs/cli-convention.md."""

from __future__ import annotations

import os
import stat

import pytest

from tr_core import cli
from tr_core.errors import SpecError, StateSpaceTooLarge


def _parser():
    p = cli.Parser(prog="tool")
    cli.add_version(p)
    p.add_argument("--N", nargs="+")
    p.add_argument("--delta-ms", type=float)
    p.add_argument("--quiet", action="store_true")
    cli.add_list_arg(p, "--L", convert=float)
    cli.add_output_args(p)
    sub = p.add_subparsers(dest="cmd")
    s = sub.add_parser("run")
    s.add_argument("--instances", type=int, required=True)
    return p


def test_argparse_errors_are_one_line_exit_2_also_in_subcommands(capsys):
    for argv in (["--delta-ms", "x"], ["--nope"], ["run"], ["run", "--instances", "zero"], ["bogus"],
                 ["--format", "xml"]):
        with pytest.raises(SystemExit) as e:
            _parser().parse_args(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, (argv, err)
        assert "usage" not in err


def test_version(capsys):
    from tr_core.version import __version__
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"tool {__version__}"


@pytest.mark.parametrize("argv", [["--delta=0.5"], ["--qui"], ["--delta-m=0.5"],
                                  ["run", "--instances", "1", "--inst", "2"]])
def test_a_long_flag_is_never_abbreviated(argv, capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unrecognized arguments: ") and err.count("\n") == 1, (argv, err)
    a = _parser().parse_args(["--delta-ms=0.5", "--quiet", "run", "--instances", "2"])  # the full spellings
    assert a.delta_ms == 0.5 and a.quiet is True and a.instances == 2


def test_list_arg_space_and_deprecated_comma(capsys):
    assert _parser().parse_args(["--L", "6", "27.9"]).L == [6.0, 27.9]
    assert capsys.readouterr().err == ""
    assert _parser().parse_args(["--L", "6,27.9"]).L == [6.0, 27.9]
    assert "deprecated" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parser().parse_args(["--L", "6", "x"])
    assert capsys.readouterr().err.startswith("error: --L: 'x' is not a number")


def test_int_ranges_are_lazy_and_sorted():
    r = cli.parse_int_ranges(["1-1000000000"], "--N")
    assert len(r) == 1_000_000_000 and r[0] == 1 and r[-1] == 1_000_000_000 and 500 in r
    assert r.spans == ((1, 1_000_000_000),)
    r = cli.parse_int_ranges(["16", "1-4", "3-6", "8"], "--N")
    assert list(r) == [1, 2, 3, 4, 5, 6, 8, 16] and r == [1, 2, 3, 4, 5, 6, 8, 16]
    assert r[6] == 8 and r[-1] == 16 and r[2:4] == [3, 4]


@pytest.mark.parametrize("values,msg", [(["8-4"], "is empty"), (["0"], ">= 1"), (["x"], "not an integer"),
                                        (["1-x"], "not an integer"), ([","], "no values")])
def test_int_ranges_refusals(values, msg):
    with pytest.raises(SpecError, match=msg):
        cli.parse_int_ranges(values, "--N")


def test_comma_int_list_notes_deprecation(capsys):
    assert list(cli.parse_int_list(["1,2,4"], "--N")) == [1, 2, 4]
    assert "deprecated" in capsys.readouterr().err


def test_output_format_from_extension():
    p = _parser()
    assert cli.output_format(p.parse_args([])) == "table"
    assert cli.output_format(p.parse_args(["--out", "x.json"])) == "json"
    assert cli.output_format(p.parse_args(["--out", "x.CSV"])) == "csv"
    assert cli.output_format(p.parse_args(["--out", "x.txt"])) == "table"
    assert cli.output_format(p.parse_args(["--out", "x.json", "--format", "csv"])) == "csv"


def test_emit_writes_the_file_instead_of_stdout(tmp_path, capsys):
    f = tmp_path / "r.txt"
    cli.emit("hello\n", str(f))
    assert f.read_text() == "hello\n" and capsys.readouterr().out == ""
    link = tmp_path / "link.txt"
    link.symlink_to(f)
    cli.emit("again\n", str(link))
    assert link.is_symlink() and f.read_text() == "again\n"
    assert sorted(os.listdir(tmp_path)) == ["link.txt", "r.txt"]


def test_out_refuses_devices_symlinks_to_devices_folders_and_fifos(tmp_path):
    link = tmp_path / "null"
    link.symlink_to("/dev/null")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target, msg in (("/dev/null", "not a regular file"), (str(link), "not a regular file"),
                        (str(tmp_path), "is a folder"), (str(tmp_path) + "/", "names a folder"),
                        (str(fifo), "not a regular file"), (str(tmp_path / "no" / "x.json"), "does not exist")):
        with pytest.raises(SpecError, match=msg):
            cli.emit("x", target)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert sorted(os.listdir(tmp_path)) == ["fifo", "null"]


def _raise(exc):
    def fn(argv):
        raise exc
    return fn


def _numba_style_interrupt():
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise SystemError("CPUDispatcher(<function build_chain>) returned a result with an exception set")
    except SystemError as e:
        return e


@pytest.mark.parametrize("exc,code,msg", [
    (KeyboardInterrupt(), 130, "error: interrupted"),
    (_numba_style_interrupt(), 130, "error: interrupted"),
    (SpecError("bad --L\nsecond line"), 2, "error: bad --L"),
    (StateSpaceTooLarge("too many states"), 3, "error: too many states"),
    (MemoryError(), 3, "error: out of memory"),
])
def test_run_cli_exit_codes(exc, code, msg, capsys):
    with pytest.raises(SystemExit) as e:
        cli.run_cli(_raise(exc), [])
    assert e.value.code == code
    err = capsys.readouterr().err
    assert err.startswith(msg) and err.count("\n") == 1


def test_run_cli_messages_are_one_line(capsys):
    for exc, code in ((KeyboardInterrupt(), 130), (_numba_style_interrupt(), 130), (SpecError("a\nb"), 2),
                      (StateSpaceTooLarge("big"), 3)):
        with pytest.raises(SystemExit) as e:
            cli.run_cli(_raise(exc), [])
        assert e.value.code == code
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1


def test_run_cli_keeps_real_bugs_visible():
    with pytest.raises(ZeroDivisionError):
        cli.run_cli(_raise(ZeroDivisionError("bug")), [])


def test_format_gain():
    assert cli.format_gain(1.11089) == "1.111x" and cli.format_gain(None) == "-"


def test_a_required_flag_is_checked_by_argparse(capsys):
    p = cli.Parser(prog="tool")
    p.add_argument("--N", type=int, required=True)
    assert p.parse_args(["--N", "5"]).N == 5
    with pytest.raises(SystemExit) as e:
        p.parse_args([])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith("error: the following arguments are required: --N\n")


def test_the_suite_keeps_its_result_cache_out_of_the_users_home():
    import tempfile

    from optimizer.cache import default_cache_dir
    home_cache = os.path.join(os.path.expanduser("~"), ".cache")
    d = os.path.realpath(default_cache_dir())
    assert not d.startswith(os.path.realpath(home_cache))
    assert d.startswith(os.path.realpath(tempfile.gettempdir()))
    assert os.environ["XDG_CACHE_HOME"].startswith(tempfile.gettempdir())


COMMANDS = [("tr-optimize", "tr_model.cli", []), ("tr-autotune", "tr_model.autotune_cli", ["show"]),
            ("tr-profile", "profiler.cli", ["routing"]), ("tr-shadow", "shadow_prefill.cli", ["simulate"])]


@pytest.mark.parametrize("prog,module,sub", COMMANDS)
def test_all_four_commands_have_version_and_one_line_argparse_errors(prog, module, sub, run_inproc):
    from tr_core.version import __version__
    r = run_inproc(prog, "--version")
    code, out = r.returncode, r.stdout
    assert code == 0 and out.strip() == f"{prog} {__version__}"
    for argv in (sub + ["--no-such-flag"], sub + ["--format", "xml"]):
        r = run_inproc(prog, *argv)
        code, out, err = r.returncode, r.stdout, r.stderr
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "usage" not in err, (argv, err)


# The spellings of a version that was never released: refused like any unknown flag, never read as an alias.
OLD_SPELLINGS = {
    "tr-optimize --sim-budget": ["tr-optimize", "--p", "0.35", "--L", "6", "28", "--N", "2", "--method", "simulate",
                                 "--sim-budget", "3"],
    "tr-optimize --delta": ["tr-optimize", "--p", "0.35", "--L", "6", "28", "--N", "2", "--delta", "0.5"],
    "autotune run --max-concurrency": ["tr-autotune", "run", "--p", "0.35", "--L", "6", "28", "--thresholds",
                                       "t.json", "--N", "2", "--max-concurrency", "4"],
    "autotune run --out": ["tr-autotune", "run", "--p", "0.35", "--L", "6", "28", "--N", "2", "--thresholds", "t.json",
                           "--out", "t.json"],
    "autotune show --active-requests": ["tr-autotune", "show", "t.json", "--active-requests", "2"],
    "autotune show --require-concurrency": ["tr-autotune", "show", "t.json", "--require-concurrency", "2"],
    "autotune kv-plan --max-concurrency": ["tr-autotune", "kv-plan", "--placement", "p.json", "--max-concurrency", "2"],
    "autotune measure --clients": ["tr-autotune", "measure", "--p", "0.35", "--L", "6", "28", "--B", "1", "1",
                                   "--N", "2", "--clients", "2"],
    "autotune export --max-concurrency": ["tr-autotune", "export", "r2r", "--thresholds", "t.json",
                                          "--max-concurrency", "4"],
    "profile latency --warmup": ["tr-profile", "latency", "--config", "c.json", "--warmup", "1"],
    "profile routing --step-latency-ms": ["tr-profile", "routing", "--trace", "t.jsonl", "--step-latency-ms", "6"],
    "shadow stats --models": ["tr-shadow", "stats", "--synthetic", "--models", "m.json"],
    "shadow stats --gap": ["tr-shadow", "stats", "--synthetic", "--gap", "1.0,0.5"],
    "shadow stats --replay-tpot": ["tr-shadow", "stats", "--synthetic", "--replay-tpot", "0.05"],
    "shadow simulate --cold-age": ["tr-shadow", "simulate", "--synthetic", "--cold-age", "3"],
    "shadow simulate --capacity": ["tr-shadow", "simulate", "--synthetic", "--capacity", "small=17"],
    "shadow compare --warmup": ["tr-shadow", "compare", "--synthetic", "--warmup", "10"],
    "shadow compare --measure": ["tr-shadow", "compare", "--synthetic", "--measure", "80"],
    "shadow compare --drain": ["tr-shadow", "compare", "--synthetic", "--drain", "900"],
}


@pytest.mark.parametrize("case", list(OLD_SPELLINGS))
def test_old_spellings_are_refused(case, run_inproc, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing the command might write lands in the checkout
    argv = OLD_SPELLINGS[case]
    old = case.split()[-1]
    r = run_inproc(*argv)
    assert r.returncode == 2, (case, r.stderr)
    assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, (case, r.stderr)
    assert old in r.stderr and "Traceback" not in r.stderr and "deprecated" not in r.stderr, (case, r.stderr)
