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
