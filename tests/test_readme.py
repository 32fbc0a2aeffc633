"""The README's two commands are exactly what CI runs."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _blocks():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    out = {}
    for title in ("Set up and run the main job", "Run the tests"):
        m = re.search(r"## " + re.escape(title) + r"\s+```bash\n(.*?)\n```", text, re.S)
        assert m, f"README section {title!r} with a bash block is missing"
        out[title] = m.group(1).strip()
    return out


def test_ci_runs_readme_commands():
    ci = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read().splitlines()
    for title, cmd in _blocks().items():
        assert cmd in ci, f"{title}: .ci/run does not run the README command verbatim"
    assert "tr-optimize --p 0.35 --L 6.0 27.9" in _blocks()["Set up and run the main job"]


def test_readme_example_output_is_what_the_default_prints(capsys, tmp_path):
    """The README's example table is what ``tr-optimize --p 0.35 --L 6.0 27.9`` prints with today's defaults
    (every column but the timings and the float-noise ones: residual, err_bound, seconds)."""
    from tr_model.cli import main

    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    m = re.search(r"## Example\s+```text\n\$ tr-optimize (.*?)\n(.*?)\n```", text, re.S)
    assert m, "README's Example block is missing"
    argv, shown = m.group(1).split(), m.group(2).splitlines()
    assert main(argv + ["--cache-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[:3] == shown[:3]  # system line, headers, rule

    def cells(line):
        keep = line.split()
        return keep[:-3]  # residual, err_bound, seconds
    assert [cells(x) for x in printed[3:]] == [cells(x) for x in shown[3:]]
