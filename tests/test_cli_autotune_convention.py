"""tr-autotune and tr-optimize follow the one convention: --N, --delta-ms, --out instead of stdout, 1.111x,
--version, no old spellings, partial tables that say why.  In-process (main(argv))."""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest

from tr_core.version import __version__

PAPER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "models",
                     "paper-placement.json")


def _run(main, argv):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


def _autotune(argv):
    from tr_model.autotune_cli import main
    return _run(main, argv)


def _optimize(argv):
    from tr_model.cli import main
    return _run(main, argv)


@pytest.mark.parametrize("runner,prog", [(_autotune, "tr-autotune"), (_optimize, "tr-optimize")])
def test_version(runner, prog):
    code, out, _ = runner(["--version"])
    assert code == 0 and out.strip() == f"{prog} {__version__}"


def test_run_with_the_current_spellings_only(tmp_path):
    th = tmp_path / "th.json"
    code, out, err = _autotune(["run", "--p", "0.35", "--L", "6.0", "27.9", "--N", "4", "--thresholds", th])
    assert code == 0 and err == "", err
    assert "1.111x" in out and "1.1109" not in out             # gains as 1.111x in tables
    first = th.read_bytes()
    code, out2, err = _autotune(["--p", "0.35", "--L", "6.0", "27.9", "--N", "4", "--thresholds", th,
                                 "--delta-ms", "0.1"])  # no subcommand: run
    assert code == 0 and out2 == out and err == "", err
    assert json.loads(th.read_bytes())["entries"] == json.loads(first)["entries"]
    # the spellings of a version never released are refused, not read as aliases
    for old in (["--max-concurrency", "4", "--thresholds", th], ["--N", "4", "--out", th],
                ["--N", "4", "--thresholds", th, "--delta", "0.1"]):
        code, out3, err = _autotune(["run", "--p", "0.35", "--L", "6.0", "27.9", *old])
        assert code == 2 and out3 == "", (old, err)
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, (old, err)
    assert json.loads(th.read_bytes())["entries"] == json.loads(first)["entries"]


def test_run_accepts_delta_ms_auto(tmp_path):
    code, _, err = _autotune(["run", "--p", "0.35", "--L", "6.137", "27.9", "--N", "3", "--delta-ms", "auto",
                              "--thresholds", tmp_path / "th.json"])
    assert code == 0 and "--delta-ms auto chose delta" in err


def test_a_partial_table_says_why(tmp_path):
    th = tmp_path / "th.json"
    code, out, err = _autotune(["run", "--p", "0.35", "--L", "6.0", "27.9", "--N", "8", "--max-states", "20",
                                "--thresholds", th])
    assert code == 0 and "partial" in out
    notes = [ln for ln in err.splitlines() if ln.startswith("note: the table is partial")]
    assert len(notes) == 1 and "of 1..8 computed" in notes[0] and "no reason recorded" not in notes[0], err
    code, _, err = _autotune(["show", th])
    assert code == 0 and "note: the table is partial" in err


def test_show_out_replaces_stdout_and_takes_the_format_from_the_extension(tmp_path):
    th = tmp_path / "th.json"
    assert _autotune(["run", "--p", "0.35", "--L", "6.0", "27.9", "--N", "3", "--thresholds", th])[0] == 0
    code, out, err = _autotune(["show", th, "--out", tmp_path / "t.csv"])
    assert code == 0 and out == "" and err == ""
    assert (tmp_path / "t.csv").read_text().startswith("N,B*,predicted_tok_s,eager_tok_s,gain_vs_eager")
    code, out, _ = _autotune(["show", th, "--N", "2", "--format", "json"])
    assert json.loads(out) == {"N": 2, "thresholds": [1, 2]}


@pytest.mark.parametrize("argv", [["show", "{th}", "--out", "/dev/null"], ["show", "{th}", "--out", "{tmp}"],
                                  ["kv-plan", "--placement", PAPER, "--out", "/dev/full"],
                                  ["run", "--p", "0.35", "--L", "6", "27.9", "--N", "2", "--thresholds", "/dev/null"]])
def test_out_targets_must_be_regular_files(tmp_path, argv):
    th = tmp_path / "th.json"
    assert _autotune(["run", "--p", "0.35", "--L", "6.0", "27.9", "--N", "2", "--thresholds", th])[0] == 0
    before = sorted(os.listdir(tmp_path))
    code, out, err = _autotune([a.format(th=th, tmp=tmp_path) for a in argv])
    assert code == 2 and err.startswith("error:") and err.count("\n") == 1, err
    assert sorted(os.listdir(tmp_path)) == before and os.path.exists("/dev/null")


@pytest.mark.parametrize("argv,msg", [
    (["run", "--p", "0.35", "--L", "6", "27.9", "--thresholds", "x.json"], "required: --N"),
    (["run", "--p", "0.35", "--L", "6", "27.9", "--N", "2"], "required: --thresholds"),
    (["measure", "--p", "0.35", "--L", "6", "27.9", "--N", "2"], "one of the arguments --B --thresholds"),
    (["show"], "required: FILE.json"),
    (["kv-plan", "--placement", PAPER, "--N", "x"], "invalid int value"),
    (["show", "a.json", "b.json"], "unrecognized arguments: b.json"),
])
def test_argparse_errors_in_subcommands_are_one_line(argv, msg):
    code, out, err = _autotune(argv)
    assert code == 2 and err.startswith("error:") and err.count("\n") == 1 and msg in err, err
    assert "usage" not in err


def test_tr_optimize_empty_range_and_lazy_huge_range():
    code, _, err = _optimize(["--p", "0.35", "--L", "6", "27.9", "--N", "8-4"])
    assert code == 2 and "the range '8-4' is empty" in err
    code, _, err = _optimize(["--p", "0.35", "--L", "6", "27.9", "--N", "1-1000000000", "--no-cache"])
    assert code == 3 and "--max-evaluations" in err and err.count("\n") == 1


@pytest.mark.parametrize("target", ["/dev/null", "link", "folder", "missing/x.json"])
def test_tr_optimize_out_refuses_non_regular_targets_before_any_work(tmp_path, target):
    (tmp_path / "folder").mkdir()
    (tmp_path / "link").symlink_to("/dev/null")
    path = target if target.startswith("/") else str(tmp_path / target)
    code, out, err = _optimize(["--p", "0.35", "--L", "6", "27.9", "--N", "1", "--no-cache", "--out", path])
    assert code == 2 and out == "" and err.startswith("error:") and err.count("\n") == 1, err
    assert sorted(os.listdir(tmp_path)) == ["folder", "link"] and os.listdir(tmp_path / "folder") == []
    assert os.path.islink(tmp_path / "link") and os.path.exists("/dev/null")
