"""--corun-slowdown / --corun-L-table on tr-optimize and tr-autotune run, and the API form (spec.with_corun)."""

import json

import pytest

import tr_model
from tr_core import system_args
from tr_core.cli import Parser
from tr_core.errors import SpecError

R2R = ["--p", "0.35", "--L", "6", "28"]


def _call(main, argv, capsys):
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:  # the CLI's error path exits (one error line, code 2 or 3)
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err


def _main(argv, capsys):
    from tr_model.cli import main
    return _call(main, argv, capsys)


def _autotune(argv, capsys):
    from tr_model.autotune_cli import main
    return _call(main, argv, capsys)


def _one_error(rc, err, flag):
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("error:") and flag in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("args, flag", [
    (["--corun-slowdown", "0.5", "1"], "--corun-slowdown"),
    (["--corun-slowdown", "nan", "1"], "--corun-slowdown"),
    (["--corun-slowdown", "1", "inf"], "--corun-slowdown"),
    (["--corun-slowdown", "2"], "--corun-slowdown needs M = 2"),
    (["--corun-slowdown", "2", "1", "1"], "--corun-slowdown needs M = 2"),
    (["--corun-slowdown", "x", "1"], "--corun-slowdown"),
])
def test_bad_slowdown_one_error_line_exit_2(args, flag, capsys):
    rc, out, err = _main(R2R + ["--N", "2", "--no-cache"] + args, capsys)
    _one_error(rc, err, flag)
    assert out == ""


@pytest.mark.parametrize("doc, flag", [
    ([{"batch_size": [1, 2], "step_latency_ms": [17.0]}, None], "corun_latency[0]"),
    ([{"batch_size": [1, 2], "step_latency_ms": [17.0, 18.0]}], "has 1 entries but the system has M = 2"),
    ([{"slowdown": 0.7}, None], "corun_latency[0].slowdown must be >= 1"),
    ([{"batch_size": [2, 1], "step_latency_ms": [17.0, 18.0]}, None], "increasing"),
    ([3.0, None], "entry 0 must be null"),
    ({"latency_curves": []}, "'corun_latency'"),
    ("not a list", "expected a list"),
])
def test_bad_table_one_error_line_exit_2(doc, flag, tmp_path, capsys):
    f = tmp_path / "co.json"
    f.write_text(json.dumps(doc))
    rc, out, err = _main(R2R + ["--N", "2", "--no-cache", "--corun-L-table", f], capsys)
    _one_error(rc, err, "--corun-L-table")
    assert flag in err


def test_bad_csv_table(tmp_path, capsys):
    f = tmp_path / "co.csv"
    f.write_text("model,batch_size,step_latency_ms\n0,1,nan\n")
    rc, _, err = _main(R2R + ["--N", "2", "--no-cache", "--corun-L-table", f], capsys)
    _one_error(rc, err, "--corun-L-table")
    f.write_text("model,batch\n0,1\n")
    rc, _, err = _main(R2R + ["--N", "2", "--no-cache", "--corun-L-table", f], capsys)
    _one_error(rc, err, "--corun-L-table")
    f.write_text("model,batch_size,step_latency_ms\n5,1,3\n")
    rc, _, err = _main(R2R + ["--N", "2", "--no-cache", "--corun-L-table", f], capsys)
    _one_error(rc, err, "--corun-L-table")
    rc, _, err = _main(R2R + ["--N", "2", "--no-cache", "--corun-L-table", tmp_path / "missing.json"], capsys)
    _one_error(rc, err, "--corun-L-table")


def test_both_flags_refused(tmp_path, capsys):
    f = tmp_path / "co.json"
    f.write_text(json.dumps([None, None]))
    rc, _, err = _main(R2R + ["--N", "2", "--corun-L-table", f, "--corun-slowdown", "1", "1"], capsys)
    _one_error(rc, err, "--corun-slowdown and --corun-L-table")


@pytest.mark.slow
def test_slowdown_matches_the_api_and_the_spec_field(tmp_path, capsys):
    rc, out, err = _main(R2R + ["--N", "4", "--B", "1", "1", "--no-cache", "--format", "json",
                                "--corun-slowdown", "2.8", "1.05", "--round"], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["spec"]["corun_latency"] == [{"slowdown": 2.8}, {"slowdown": 1.05}]
    spec = tr_model.preset("r2r", [6.0, 28.0], p=0.35).with_corun([2.8, 1.05])
    ev = tr_model.evaluate(spec, 4, (1, 1), round_to_grid=True)
    assert doc["results"][0]["throughput_tok_s"] == pytest.approx(ev.throughput_tok_s, rel=1e-12)
    solo = tr_model.evaluate(tr_model.preset("r2r", [6.0, 28.0], p=0.35), 4, (1, 1))
    assert ev.throughput_tok_s < solo.throughput_tok_s * 0.9
    # a spec file with the field gives the same; a flag that would replace the file's field is refused
    f = tmp_path / "s.json"
    tr_model.save_spec(spec, f)
    rc, out2, _ = _main(["--spec", f, "--N", "4", "--B", "1", "1", "--no-cache", "--format", "json", "--round"],
                        capsys)
    assert rc == 0 and json.loads(out2)["results"][0]["throughput_tok_s"] == doc["results"][0]["throughput_tok_s"]
    rc, _, err3 = _main(["--spec", f, "--N", "4", "--B", "1", "1", "--no-cache", "--format", "json",
                         "--corun-slowdown", "1", "1"], capsys)
    _one_error(rc, err3, "--corun-slowdown and the corun_latency of --spec")


def test_table_file_json_and_csv_agree(tmp_path, capsys):
    j = tmp_path / "co.json"
    j.write_text(json.dumps([{"batch_size": [1, 4], "step_latency_ms": [16.8, 18.0]}, None]))
    c = tmp_path / "co.csv"
    c.write_text("model,batch_size,step_latency_ms\n0,4,18.0\n0,1,16.8\n")
    outs = []
    for f in (j, c):
        rc, out, err = _main(R2R + ["--N", "4", "--B", "1", "2", "--no-cache", "--format", "json",
                                    "--corun-L-table", f], capsys)
        assert rc == 0, err
        outs.append(json.loads(out)["results"][0]["throughput_tok_s"])
    assert outs[0] == outs[1]
    s = system_args.build_system(_parser().parse_args(R2R + ["--corun-L-table", str(j)]), 4)
    assert s.spec.corun_latency_ms(0, 4) == 18.0 and s.spec.corun_latency_ms(1, 4) == 28.0


def _parser():
    p = Parser(prog="t")
    system_args.add_system_args(p)
    return p


def test_below_solo_table_is_a_warning(tmp_path, capsys):
    f = tmp_path / "co.json"
    f.write_text(json.dumps([{"batch_size": [1, 4], "step_latency_ms": [5.0, 18.0]}, None]))
    rc, out, err = _main(R2R + ["--N", "2", "--B", "1", "1", "--no-cache", "--corun-L-table", f, "--round"], capsys)
    assert rc == 0
    warn = [x for x in err.splitlines() if x.startswith("warning:")]
    assert len(warn) == 1 and "corun_latency[0]" in warn[0] and "below the solo latency" in warn[0]


def test_off_grid_corun_needs_round(capsys):
    rc, _, err = _main(R2R + ["--N", "2", "--no-cache", "--corun-slowdown", "1.23", "1"], capsys)
    _one_error(rc, err, "corun_latency[0]")
    assert "--round" in err
    rc, out, err = _main(R2R + ["--N", "2", "--no-cache", "--corun-slowdown", "1.23", "1", "--round"], capsys)
    assert rc == 0 and "co-running latency" in err and "co-running (x1.23, x1)" in out


def test_delta_auto_includes_corun_latencies():
    a = _parser().parse_args(["--p", "0.35", "--L", "6", "27.9", "--corun-slowdown", "2.83", "1",
                              "--delta-ms", "auto"])
    s = system_args.build_system(a, 4)
    d = s.spec.delta_ms
    co = 6 * 2.83
    assert abs(round(co / d) * d - co) / co <= 0.01 + 1e-12


def test_autotune_run_accepts_the_same_flags(tmp_path, capsys):
    out = tmp_path / "th.json"
    rc, _, err = _autotune(["run"] + R2R + ["--N", "3", "--thresholds", out, "--corun-slowdown", "0.9", "1"],
                           capsys)
    _one_error(rc, err, "--corun-slowdown")
    assert not out.exists()
    rc, _, err = _autotune(["run"] + R2R + ["--N", "3", "--thresholds", out, "--corun-slowdown", "2", "1",
                                             "--quiet", "--cache-dir", tmp_path / "c"], capsys)
    assert rc == 0, err
    doc = json.loads(out.read_text())
    assert "corun" in json.dumps(doc)


def test_flags_are_in_the_shared_plumbing():
    from tr_model import autotune_cli, cli
    for parser in (cli.build_parser(), _sub(autotune_cli.build_parser(), "run")):
        flags = {s for a in parser._actions for s in a.option_strings}
        assert {"--corun-slowdown", "--corun-L-table"} <= flags


def _sub(parser, name):
    import argparse
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return a.choices[name]


def test_api_with_corun_validates():
    s = tr_model.preset("r2r", [6.0, 28.0], p=0.35)
    with pytest.raises(SpecError, match=r"corun_latency\[0\]"):
        s.with_corun([0.5, 1.0])
    assert s.with_corun(None) == s and s.with_corun([2.0, None]).has_corun
