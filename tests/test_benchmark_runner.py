"""The benchmark runner and its tables: a suite's rows become results/<suite>.json and a table under its topic;
the committed tables are what the committed results give; bad suites and results files are refused."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", os.path.join(BENCH, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


report = _load("report")


def _run(*args, cwd=None):
    return subprocess.run([sys.executable, os.path.join(BENCH, "run.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=cwd or ROOT)


def test_committed_tables_are_what_the_committed_results_give():
    """A hand edit of RESULTS.md, or a results file committed without regenerating the tables, fails here."""
    results = os.path.join(BENCH, "results")
    docs = report.load_results(results)
    assert docs, "benchmarks/results holds no results"
    with open(os.path.join(BENCH, "RESULTS.md"), encoding="utf-8") as f:
        assert f.read() == report.render(docs), "run python benchmarks/report.py"
    for d in docs:  # every table says how to reproduce it and where it ran
        assert d["command"].startswith("python benchmarks/run.py ") and d["machine"].get("cores")
        assert report.topic_of(d) in report.TOPICS


def test_a_suite_runs_to_a_results_file_and_a_table(tmp_path):
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "toy.py").write_text(
        'TITLE = "Toy: squares"\nTOPIC = "search"\nCOMMAND = "python benchmarks/run.py toy"\n'
        'COLUMNS = ["n", "square", "ratio"]\nNOTES = "ratio = square / n."\n'
        'def run(quick):\n    return [{"n": n, "square": n * n, "ratio": float(n)} for n in ((1, 2) if quick else (1, 2, 3))]\n')
    (suites / "_helper.py").write_text("X = 1\n")        # a helper, not a suite
    out = tmp_path / "R.md"
    r = _run("--list", "--suites-dir", suites)
    assert r.returncode == 0 and r.stdout.split()[0] == "toy" and "_helper" not in r.stdout, r.stderr
    r = _run("toy", "--quick", "--suites-dir", suites, "--results-dir", tmp_path / "res", "--report", out)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "res" / "toy.json").read_text())
    assert doc["schema_version"] == 1 and doc["quick"] is True and [x["n"] for x in doc["rows"]] == [1, 2]
    text = out.read_text()
    assert "## Search" in text and "### Toy: squares (`toy`)" in text and "| n | square | ratio |" in text
    assert "| 2 | 4 | 2 |" in text and "ratio = square / n." in text and "run.py toy --quick`" in text
    # --check: current, then stale after a hand edit
    chk = [sys.executable, os.path.join(BENCH, "report.py"), "--results-dir", str(tmp_path / "res"), "--out", str(out)]
    assert subprocess.run([*chk, "--check"], capture_output=True, timeout=120).returncode == 0
    out.write_text(text.replace("| 2 | 4 | 2 |", "| 2 | 5 | 2 |"))
    assert subprocess.run([*chk, "--check"], capture_output=True, timeout=120).returncode == 1


@pytest.mark.parametrize("body, needle", [
    ('TITLE = "t"\nCOMMAND = "c"\nCOLUMNS = ["a"]\n', "run"),                          # no run()
    ('TITLE = "t"\nCOMMAND = "c"\nCOLUMNS = ["a"]\ndef run(quick):\n    return [{"b": 1}]\n', "b"),  # unknown key
])
def test_a_suite_without_the_interface_is_refused_or_fails_alone(tmp_path, body, needle):
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "bad.py").write_text(body)
    r = _run("bad", "--suites-dir", suites, "--results-dir", tmp_path / "res", "--report", tmp_path / "R.md")
    assert r.returncode in (1, 2) and "error:" in r.stderr and needle in r.stderr, r.stderr
    assert not (tmp_path / "res" / "bad.json").exists()


def test_unknown_suite_and_bad_results_file_are_one_error_line(tmp_path):
    r = _run("no-such-suite", "--results-dir", tmp_path / "res", "--report", tmp_path / "R.md")
    assert r.returncode == 2 and r.stderr.strip().startswith("error:") and "no-such-suite" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    res = tmp_path / "res"
    res.mkdir()
    (res / "x.json").write_text(json.dumps({"schema_version": 1, "suite": "x"}))
    r = subprocess.run([sys.executable, os.path.join(BENCH, "report.py"), "--results-dir", str(res), "--out",
                        str(tmp_path / "R.md")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "x.json" in r.stderr and "missing" in r.stderr
    assert not (tmp_path / "R.md").exists()


def test_every_committed_suite_loads_with_the_interface_and_its_results_have_its_columns():
    """A suite file that no longer imports, lost TITLE/COLUMNS/run, or whose committed rows no longer match its
    columns fails here, not at the next benchmark run."""
    runner = _load("run")
    names = runner.suite_names()
    assert "sweep" in names and "scaling" in names
    for name in names:
        mod = runner.load_suite(name)          # raises SuiteError naming what is wrong
        path = os.path.join(BENCH, "results", f"{name}.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                rows = json.load(f)["rows"]
            runner.check_rows(name, mod.COLUMNS, rows)
