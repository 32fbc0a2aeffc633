"""Relative links in the docs pages resolve, and the index links every page in docs/."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = ["index.md", "model.md", "formats.md", "howto-thresholds.md", "limitations.md", "cli.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page):
    text = (DOCS / page).read_text()
    bad = []
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        path = target.split("#", 1)[0]
        if not (DOCS / path).exists():
            bad.append(target)
    assert not bad, f"docs/{page} links to missing files: {bad}"


def test_index_links_every_page():
    index = (DOCS / "index.md").read_text()
    linked = {t.split("#", 1)[0] for t in LINK.findall(index)}
    pages = {p.name for p in DOCS.glob("*.md")} - {"index.md"}
    missing = sorted(pages - linked)
    assert not missing, f"docs/index.md does not link {missing}"


def test_readme_points_at_the_model_page():
    assert "docs/model.md" in (ROOT / "README.md").read_text()
