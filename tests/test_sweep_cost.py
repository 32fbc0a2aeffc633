"""Unbounded work is refused up front with a size estimate (issue 25, item 2): :mod:`optimizer.cost`.

``tr-optimize`` and ``tr-autotune run`` accept every N the exact chain can hold (2,047 for R2R at delta =
0.1 ms), so a sweep to such an N would run for years without a word.  These tests check the estimate's
arithmetic, that the commands refuse before any work (exit 3, one ``error:`` line with the estimate and
the flag to raise), that ``--max-hours`` lets a user through, and that what people run is not refused.
"""

from __future__ import annotations

import json
import os

import pytest

from optimizer import cost
from tr_core import search_rule as S
from tr_core.errors import SpecError, WorkTooLarge

SYSTEM = ["--p", "0.35", "--L", "6", "27.9"]


def _called(run_inproc, prog, argv):
    """``(exit code, stdout, stderr)`` of the console script's main(argv), in this process (conftest's fixture)."""
    r = run_inproc(prog, *argv)
    return r.returncode, r.stdout, r.stderr


# ------------------------------------------------------------------------------------------ the estimate


def test_the_estimate_adds_over_spans_and_grows_with_n():
    one = cost.sweep_seconds(2, [(1, 100)], "certified")
    two = cost.sweep_seconds(2, [(1, 40), (41, 100)], "certified")
    assert one == pytest.approx(two, rel=1e-12)
    assert cost.sweep_seconds(2, [(1, 64)], "exhaustive") > cost.sweep_seconds(2, [(1, 32)], "exhaustive") > 0
    assert cost.sweep_seconds(2, [(5, 4)], "auto") == 0.0
    # auto = exhaustive up to the rule's N, bounded above it
    n_ex = S.largest_n(S.AUTO_EXHAUSTIVE_MAX, 2)
    auto = cost.sweep_seconds(2, [(1, 64)], "auto")
    assert auto == pytest.approx(cost.sweep_seconds(2, [(1, n_ex)], "exhaustive")
                                 + cost.sweep_seconds(2, [(n_ex + 1, 64)], "pruned"), rel=1e-12)
    assert cost.sweep_seconds(2, [(1, 64)], "local") < cost.sweep_seconds(2, [(1, 64)], "certified")
    with pytest.raises(ValueError):
        cost.sweep_seconds(2, [(1, 4)], "fastest")


def test_the_estimate_is_near_the_sum_over_n():
    # the integral stands for a sum: check it against the sum itself on a span a loop can do
    ref_s, ref_n, power = cost._BOUNDED
    exact = sum(ref_s * (n / ref_n) ** power for n in range(21, 301))
    assert cost.sweep_seconds(2, [(21, 300)], "pruned") == pytest.approx(exact, rel=1e-3)


def test_what_people_run_is_accepted_and_years_are_refused():
    day = S.DEFAULT_MAX_HOURS * 3600
    assert cost.sweep_seconds(2, [(1, 64)], "auto") < 600            # the default sweep: minutes
    assert cost.sweep_seconds(2, [(65, 256)], "certified") < day     # the certified table of experiments/LOG.md
    assert cost.sweep_seconds(2, [(1, 2047)], "certified") > 1000 * day
    with pytest.raises(WorkTooLarge) as e:
        cost.check_sweep_seconds(2, [(1, 2047)], "certified", 24, what="--N up to 2,047", limit_name="--max-hours",
                                 advice="lower N")
    assert e.value.exit_code == 3 and "years" in str(e.value) and "--max-hours = 24" in str(e.value)
    assert cost.check_sweep_seconds(2, [(1, 2047)], "certified", None, what="", limit_name="", advice="") > 0


@pytest.mark.parametrize("seconds,text", [(30, "about 30 seconds"), (600, "about 10.0 minutes"),
                                          (3 * 3600, "about 3.0 hours"), (5 * 86400, "about 5.0 days"),
                                          (500 * 365.25 * 86400, "about 500 years")])
def test_durations_read_in_their_unit(seconds, text):
    assert cost.describe_seconds(seconds) == text


# ------------------------------------------------------------------------------------------ tr-optimize


@pytest.mark.parametrize("argv,needle", [
    (["--N", "1-2047", "--search", "certified"], "certified search"),
    (["--N", "2047"], "auto search"),
    (["--N", "1-128", "--search", "exhaustive"], "exhaustive search"),
    (["--N", "1-2000", "--method", "simulate", "--max-evaluations", "10000000000"], "--sim-budget-s 60"),
])
def test_tr_optimize_refuses_years_before_any_work(tmp_path, monkeypatch, argv, needle, run_inproc):
    monkeypatch.chdir(tmp_path)
    code, out, err = _called(run_inproc, "tr-optimize", [*SYSTEM, *argv, "--no-cache", "--out", "r.json"])
    assert code == 3 and out == "" and os.listdir(tmp_path) == [], err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], err
    assert "--max-hours" in lines[0] and "about" in lines[0]


def test_tr_optimize_max_hours_lets_a_long_sweep_through_with_its_estimate_said():
    from tr_model.cli import build_parser, estimate_note, validate

    args = [*SYSTEM, "--N", "1-400", "--search", "certified", "--no-cache"]
    with pytest.raises(WorkTooLarge):
        validate(build_parser().parse_args(args))
    plan = validate(build_parser().parse_args(args + ["--max-hours", "100"]))
    assert plan.estimate_s == pytest.approx(cost.sweep_seconds(2, [(1, 400)], "certified"))
    assert "about 26.8 hours" in estimate_note(plan) and "each N is reported" in estimate_note(plan)
    # the default sweep is short: no note
    assert estimate_note(validate(build_parser().parse_args([*SYSTEM, "--N", "1-64", "--no-cache"]))) is None


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_tr_optimize_max_hours_must_be_positive(value, run_inproc):
    code, _, err = _called(run_inproc, "tr-optimize", [*SYSTEM, "--N", "2", "--no-cache", "--max-hours", value])
    assert code == 2 and err.startswith("error: --max-hours") and err.count("\n") == 1, err


# ------------------------------------------------------------------------------------- tr-autotune, tune


def test_tr_autotune_run_refuses_years_naming_its_flags(tmp_path, run_inproc):
    out = tmp_path / "t.json"
    code, _, err = _called(run_inproc, "tr-autotune", ["run", *SYSTEM, "--N", "2047", "--thresholds", str(out)])
    assert code == 3 and not out.exists(), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --N = 2,047") and "--max-hours = 24" in lines[0], err
    assert "--time-budget-s" in lines[0] and "max_hours" not in lines[0].replace("--max-hours", "")


def test_tune_refuses_only_rows_it_would_compute(tmp_path):
    from tr_core.spec import preset
    from tr_model.tuning.autotune import tune

    spec = preset("r2r", [6.0, 27.9], p=0.35)
    out = tmp_path / "t.json"
    with pytest.raises(WorkTooLarge, match="max_concurrency = 2,047"):
        tune(spec, 2047, out, max_hours=24.0)
    assert not out.exists()
    with pytest.raises(SpecError, match="max_hours"):
        tune(spec, 4, out, max_hours=0)
    # a complete table is reused whatever the estimate of computing it again
    t = tune(spec, 3, out, search="exhaustive")
    doc = json.loads(out.read_text())
    assert tune(spec, 3, out, search="exhaustive", max_hours=1e-9).max_concurrency == t.max_concurrency == 3
    assert json.loads(out.read_text()) == doc
