"""docs/cli.md is exactly what docs/gen_cli_reference.py generates from the parsers, and matches real --help output."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REGEN = "run: .venv/bin/python docs/gen_cli_reference.py  (then commit docs/cli.md)"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_reference", ROOT / "docs" / "gen_cli_reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cli_md_is_up_to_date():
    gen = _generator()
    expected = gen.render()
    current = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    if current != expected:
        cur, exp = current.splitlines(), expected.splitlines()
        first = next((i for i, (a, b) in enumerate(zip(cur, exp)) if a != b), min(len(cur), len(exp)))
        pytest.fail(f"docs/cli.md is out of date with the CLIs' argparse parsers (first difference at line "
                    f"{first + 1}: file {cur[first] if first < len(cur) else '<end>'!r} vs generated "
                    f"{exp[first] if first < len(exp) else '<end>'!r}); {REGEN}")


def test_every_console_script_is_documented():
    # the console scripts declared in pyproject.toml, read independently of the generator
    text = (ROOT / "pyproject.toml").read_text()
    block = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    scripts = {line.split("=", 1)[0].strip() for line in block.splitlines() if "=" in line}
    documented = {c for c, _, _ in _generator().COMMANDS}
    assert scripts == documented, f"pyproject scripts {sorted(scripts)} vs documented {sorted(documented)}"
    md = (ROOT / "docs" / "cli.md").read_text()
    for s in scripts:
        assert f"\n## {s}\n" in md


@pytest.mark.parametrize("argv", [["tr_model.cli"], ["profiler.cli", "latency"], ["tr_model.autotune_cli", "run"]])
def test_real_help_output_appears_verbatim(argv):
    # what a user sees from the installed command (a separate process, fixed width) is in the page
    env = dict(os.environ, COLUMNS="100")
    code = f"import sys, {argv[0]} as m; sys.exit(m.main(sys.argv[1:]))"
    r = subprocess.run([sys.executable, "-c", code, *argv[1:], "--help"], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    md = (ROOT / "docs" / "cli.md").read_text()
    assert r.stdout.strip() in md, f"--help of {' '.join(argv)} is not in docs/cli.md; {REGEN}"
