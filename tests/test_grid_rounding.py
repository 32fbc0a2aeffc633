"""Grid rounding has one home, :mod:`tr_core.quanta` (issue 25, item 4): every caller agrees with it, and a
second copy of the rule (``max(1, round(L / delta))``) anywhere in the packages fails this test."""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

from tr_core import quanta as Q

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("tr_core", "dtmc", "optimizer", "simulator", "profiler", "shadow_prefill", "tr_model")


def _cases(n=400, seed=7):
    rng = np.random.default_rng(seed)
    deltas = rng.choice([0.1, 0.05, 0.25, 1.0, 0.3, 0.01], n)
    values = np.exp(rng.uniform(math.log(0.001), math.log(500.0), n))
    # halves, exact multiples and values just off the grid: where two copies of a rule would part
    values[:60] = (np.arange(60) + 0.5) * deltas[:60]
    values[60:120] = (np.arange(1, 61)) * deltas[60:120]
    values[120:150] = (np.arange(1, 31)) * deltas[120:150] * (1 + 3e-9)
    return list(zip(values.tolist(), deltas.tolist()))


def test_the_rule():
    assert Q.quanta(29.295, 0.1) == 293 and Q.round_to_grid(29.295, 0.1) == pytest.approx(29.3)
    assert Q.quanta(0.01, 0.1) == 1 and Q.round_to_grid(0.01, 0.1) == pytest.approx(0.1)  # at least one quantum
    assert Q.quanta(1.25, 0.5) == 2 and Q.quanta(1.75, 0.5) == 4  # half to even, as round() and np.round
    assert Q.on_grid(27.9, 0.1) and not Q.on_grid(27.95, 0.1) and not Q.on_grid(0.04, 0.1)
    for v, d in _cases():
        r = Q.round_to_grid(v, d)
        assert Q.on_grid(r, d), (v, d, r)           # a rounded latency reads back on the grid
        assert Q.quanta(r, d) == Q.quanta(v, d)
        assert abs(r - v) <= d / 2 * (1 + 1e-9) or Q.quanta(v, d) == 1


def test_every_caller_agrees_with_the_rule():
    from profiler import system as profiler_system
    from tr_core import grid
    from tr_core.spec import preset
    from tr_model.sensitivity import grid_latency

    cases = _cases()
    v = np.array([c[0] for c in cases])
    d = np.array([c[1] for c in cases])
    np.testing.assert_array_equal(Q.quanta_array(v, d), [Q.quanta(a, b) for a, b in cases])
    np.testing.assert_array_equal(grid.grid_errors(v, d), Q.grid_errors(v, d))
    for a, b in cases:
        assert grid_latency(a, b) == Q.round_to_grid(a, b)
        assert profiler_system.round_to_grid(a, b) == Q.round_to_grid(a, b)
    # the spec's duration tables (--round), constant and co-running latencies
    for a, b in cases[::7]:
        if not 1e-4 < a / b < 1e6:
            continue
        spec = preset("r2r", [a, 2 * a], p=0.35, delta_ms=b)
        dq, roundings = spec.quanta_table(3, round_to_grid=True)
        assert dq[0, 1] == Q.quanta(a, b) and dq[1, 1] == Q.quanta(2 * a, b)
        assert bool(roundings) == (not Q.on_grid(a, b) or not Q.on_grid(2 * a, b))
        for r in roundings:
            assert r["rounded_ms"] == pytest.approx(Q.round_to_grid(r["step_latency_ms"], b), rel=1e-12)
        co, _ = spec.with_corun([1.5, None]).corun_quanta_table(3, round_to_grid=True)
        assert co[0, 1] == Q.quanta(1.5 * a, b) and co[1, 1] == dq[1, 1]
    # the coarsest grid meets its tolerance by the same rule
    lat = [6.0, 27.9, 13.37]
    delta = grid.coarsest_delta(lat, rtol=0.01)
    assert np.abs(Q.grid_errors(lat, delta)).max() <= 0.01 * (1 + 1e-9)


# a copy of the rule: max(1, round(x / delta)), np.round(x / delta), or a whole-quanta test on x / delta
_X = r"[\w.]+(?:\[[^\]]*\])?"  # a name, perhaps indexed: L, lat, self.L[i], L[None, :]
COPIES = [re.compile(p) for p in (
    rf"round\(\s*{_X}\s*/\s*[\w.]*delta",          # round(L / delta), np.round(lat / self.delta_ms)
    rf"rint\(\s*{_X}\s*/\s*[\w.]*delta",
    rf"floor\(\s*{_X}\s*/\s*[\w.]*delta\w*(?:\[[^\]]*\])?\s*\+\s*0?\.5",
)]


# ... or in two steps: q = lat / self.delta_ms, then round(q) a few lines below
RATIO = re.compile(r"^\s*(\w+)\s*=\s*[\w.\[\]()]+\s*/\s*[\w.]*delta\w*\s*$")


def copies_in(lines) -> list[int]:
    """Line numbers (1-based) of a copy of the rule."""
    out, ratio_vars = [], {}
    for n, line in enumerate(lines, 1):
        m = RATIO.match(line)
        if m:
            ratio_vars[m.group(1)] = n
        near = [v for v, at in ratio_vars.items() if n - at <= 6]
        if any(p.search(line) for p in COPIES) or any(re.search(rf"(round|rint)\(\s*{v}\s*\)", line) for v in near):
            out.append(n)
    return out


# Files vendored alone into a server (standard library only, no import of tr_core): they restate the rule, and
# test_vendored_restatements_agree checks each against tr_core.quanta.
VENDORED = {os.path.join("tr_model", "thresholds.py")}


def test_vendored_restatements_agree():
    from tr_core.quanta import quanta
    from tr_model.thresholds import ThresholdTable
    with open(os.path.join(ROOT, "tr_model", "thresholds.py"), encoding="utf-8") as fh:
        assert len(copies_in(fh.read().splitlines())) == 1, "the vendorable reader restates the rule once"
    table = ThresholdTable.__new__(ThresholdTable)
    rng = np.random.default_rng(5)
    for delta in (0.1, 0.05, 0.25, 1.0):
        object.__setattr__(table, "delta_ms", delta)  # a frozen dataclass: only its rounding is used here
        values = np.concatenate([rng.uniform(delta / 2 + 1e-9, 400 * delta, 500), np.arange(1, 60) * delta,
                                 (np.arange(1, 60) + 0.5) * delta])
        for ms in values:
            assert table._quanta(float(ms)) == quanta(float(ms), delta), (ms, delta)


def test_no_second_copy_of_the_rule():
    found = []
    for pkg in PACKAGES:
        for d, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                path = os.path.join(d, f)
                rel = os.path.relpath(path, ROOT)
                if not f.endswith(".py") or rel == os.path.join("tr_core", "quanta.py") or rel in VENDORED:
                    continue
                with open(path, encoding="utf-8") as fh:
                    lines = fh.read().splitlines()
                found += [f"{os.path.relpath(path, ROOT)}:{n}: {lines[n - 1].strip()}" for n in copies_in(lines)]
    assert not found, "grid rounding outside tr_core/quanta.py:\n" + "\n".join(found)


def test_the_copy_detector_can_fail():
    # the copies this test replaced (tr_core/spec.py twice, tr_core/grid.py, profiler/system.py, sensitivity)
    for text in ("q = max(1, int(round(value_ms / delta_ms)))", "q = np.maximum(1.0, np.round(latencies / delta))",
                 "q = np.maximum(1.0, np.round(L[None, :] / block[:, None]))".replace("block", "delta")):
        assert copies_in([text]) == [1], text
    two_steps = ["                q = lat / self.delta_ms", "                if q > MAX_QUANTA:",
                 "                    raise SpecError('...')", "                qi = max(1, int(round(q)))"]
    assert copies_in(two_steps) == [4]
    assert copies_in(["start = tuple(max(1, round(b * N / last)) for b in prev)"]) == []
