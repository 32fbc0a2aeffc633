"""Flags that cannot both apply are refused, on every command: the tables of docs/cli-convention.md
("Flag interactions, per command") are read here and every row's example is run in this process.

A refused row: exit 2, exactly one non-empty stderr line, starting ``error:`` and naming every flag of the
row's ``flags`` column, no traceback.  A row whose rule starts with ``warning:``: exit 0 and a ``warning:``
line naming the flag.  The Python API refuses the same conflicts among its keywords (``SpecError``).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "cli-convention.md"
SECTION = "### Flag interactions, per command"
COMMANDS = ("tr-optimize", "tr-autotune", "tr-profile", "tr-shadow", "tr-plan")
# sub-commands whose flags exclude each other: each needs a row of its own
SUBCOMMANDS = {"tr-autotune": ("run", "measure", "serve"),
               "tr-profile": ("latency", "routing", "route-run", "system"),
               "tr-shadow": ("stats", "sessions", "latency", "simulate", "compare")}

# input files an example may name under {tmp} (written before it runs); any other {tmp} path is an output
FIXTURES = {
    "corun.csv": "model,batch_size,step_latency_ms\n0,1,7.0\n1,1,30.0\n",
    "L.csv": "model,batch_size,step_latency_ms\n0,1,6.0\n1,1,15.0\n2,1,27.9\n",
    "prompts.jsonl": '{"input_ids": [1, 2, 3]}\n',
    "prices.json": "{}\n",
    "s.jsonl": "",
}


def _cells(line: str) -> list[str]:
    """A markdown table row's cells (a ``|`` inside backticks is part of the cell)."""
    cells, cur, code = [], "", False
    for ch in line.strip().strip("|"):
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            cells.append(cur.strip())
            cur = ""
        else:
            cur += ch
    cells.append(cur.strip())
    return cells


def _rows() -> list[dict]:
    text = DOC.read_text(encoding="utf-8")
    assert SECTION in text, f"{DOC} has no section {SECTION!r}"
    body = text.split(SECTION, 1)[1]
    body = re.split(r"^#{2,3} ", body, maxsplit=1, flags=re.M)[0]  # up to the next section (#### stays inside)
    rows, command, header = [], None, None
    for line in body.splitlines():
        m = re.match(r"^#### `([^`]+)`", line)
        if m:
            command, header = m.group(1), None
            continue
        if not line.startswith("|"):
            header = None if not line.strip() else header
            continue
        cells = _cells(line)
        if header is None:
            header = cells
            assert header == ["flags", "rule", "example"], f"unexpected table header {header}"
            continue
        if set("".join(cells)) <= set("-: "):
            continue  # the separator row
        flags = re.findall(r"--[A-Za-z][\w-]*", cells[0])
        ex = re.fullmatch(r"`([^`]+)`", cells[2])
        assert ex, f"the example of row {cells} is not one command line in backticks"
        rows.append({"command": command, "flags": flags, "rule": cells[1], "example": ex.group(1),
                     "id": f"{command}: {' '.join(flags)}"})
    return rows


ROWS = _rows()


def test_every_command_has_rows():
    assert len(ROWS) >= 40
    for cmd in COMMANDS:
        mine = [r for r in ROWS if r["command"] == cmd]
        assert mine, f"no flag-interaction row for {cmd}"
        for r in mine:
            assert shlex.split(r["example"])[0] == cmd, r
            assert len(r["flags"]) >= 2 or r["rule"].startswith("warning:"), r
    for cmd, subs in SUBCOMMANDS.items():
        used = {shlex.split(r["example"])[1] for r in ROWS if r["command"] == cmd}
        assert set(subs) <= used, f"{cmd}: no row for {sorted(set(subs) - used)}"


@pytest.fixture
def no_serving(monkeypatch):
    """A serve example that is not refused must fail here, not start a server."""
    import tr_model.serving.server

    def refuse(*a, **k):
        raise AssertionError("the example was not refused: the server would start")
    monkeypatch.setattr(tr_model.serving.server, "serve", refuse)


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_interaction_row(row, run_inproc, tmp_path, monkeypatch, no_serving):
    monkeypatch.chdir(ROOT)  # the examples name data/examples/... relative to the repository
    monkeypatch.setenv("TR_MODEL_CACHE_DIR", str(tmp_path / "cache-default"))
    for name, content in FIXTURES.items():
        if "{tmp}/" + name in row["example"]:
            (tmp_path / name).write_text(content, encoding="utf-8")
    argv = shlex.split(row["example"].replace("{tmp}", str(tmp_path)))
    for a in argv:  # an example reads files only from data/examples or {tmp}
        if "/" in a and not a.startswith("tcp://"):
            assert a.startswith(("data/examples", str(tmp_path))), a
    r = run_inproc(argv[0], *argv[1:])
    assert "Traceback" not in r.stderr, r.stderr
    if row["rule"].startswith("warning:"):
        assert r.returncode == 0, r.stderr
        warn = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
        assert warn and all(f in "\n".join(warn) for f in row["flags"][:1]), r.stderr
        return
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    for flag in row["flags"]:
        assert re.search(re.escape(flag) + r"(?![\w-])", lines[0]), f"{flag} not named: {lines[0]}"
    assert not any(tmp_path.glob("runs*")), "a refused example left a run folder"


# ------------------------------------------------------------------------------------------ the Python API

def test_api_preset_refuses_a_routing_parameter_it_does_not_read():
    import tr_model
    from tr_core.errors import SpecError
    with pytest.raises(SpecError, match=r"--q applies to preset 'r-stitch', not 'r2r'"):
        tr_model.preset("r2r", [6.0, 28.0], p=0.3, q=0.5)
    with pytest.raises(SpecError, match=r"--weights applies to preset 'me', not 'r2r' \(which routes by --p"):
        tr_model.preset("r2r", [6.0, 28.0], p=0.3, weights=[0.5, 0.5])
    with pytest.raises(SpecError, match=r"--p applies to the two-model presets, not 'me' \(which routes by --weights"):
        tr_model.preset("me", [6.0, 28.0], p=0.3, weights=[0.5, 0.5])
    assert tr_model.preset("r-stitch", [6.0, 28.0], p=0.3, q=0.5).M == 2  # what it reads is still read


def test_api_optimize_refuses_max_gap_with_a_search_that_has_none():
    import tr_model
    from tr_core.errors import SpecError
    spec = tr_model.preset("r2r", [6.0, 28.0], p=0.35)
    with pytest.raises(SpecError) as e:
        tr_model.optimize(spec, 2, search="exhaustive", max_gap=0.01)
    assert "max_gap" in str(e.value) and "exhaustive" in str(e.value)


def test_api_plan_refuses_p_with_spec():
    import tr_model
    from tr_core.errors import SpecError
    spec = tr_model.load_spec(str(ROOT / "data" / "examples" / "spec-r2r.json"))
    cfg = [str(ROOT / "data" / "examples" / f"{m}-config.json") for m in ("small", "large")]
    with pytest.raises(SpecError) as e:
        tr_model.plan(cfg, "h200", 1, [2], p=0.3, spec=spec)
    assert "p and spec" in str(e.value)


def test_api_tune_refuses_options_without_their_partner(tmp_path):
    import tr_model
    from tr_core.errors import SpecError
    from tr_model.tuning.autotune import tune
    spec = tr_model.preset("r2r", [6.0, 28.0], p=0.35)
    with pytest.raises(SpecError) as e:
        tune(spec, 2, tmp_path / "th.json", background=True)
    assert "background" in str(e.value) and "time_budget_s" in str(e.value)
    with pytest.raises(SpecError) as e:
        tune(spec, 2, tmp_path / "th.json", policy_max_n=2)
    assert "policy_max_n" in str(e.value) and "policy" in str(e.value).replace("policy_max_n", "")
    with pytest.raises(SpecError) as e:
        tune(spec, 2, tmp_path / "th.json", search="exhaustive", max_gap=0.01)
    assert "max_gap" in str(e.value) and "exhaustive" in str(e.value)
    assert not (tmp_path / "th.json").exists()
