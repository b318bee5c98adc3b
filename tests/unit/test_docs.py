"""The reference pages that follow from the code are current (scripts/make_docs.py), and
every doc page the README or another page links to exists."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def make_docs():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("make_docs", ROOT / "scripts" / "make_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", ["docs/events.md", "docs/commands.md", "docs/configuration.md"])
def test_generated_page_is_current(page: str) -> None:
    render = make_docs().PAGES[page]
    assert (ROOT / page).read_text() == render(), f"{page} is out of date: run `make docs`"


def test_links_between_pages_resolve() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", page.read_text()):
            if not (page.parent / target).is_file():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken


def test_nothing_outside_tests_spec_reads_outside_the_repository() -> None:
    """Only tests/spec may look at ../shared (the product contract): the rest of the
    repository works on a clone alone."""
    offenders = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if path.is_dir() or rel.parts[0] in {".git", ".venv", ".build", "build"} or rel.parts[:2] == ("tests", "spec"):
            continue
        if path.suffix not in {".py", ".md", ".toml", ".yaml", ".yml", ""} and path.name != "Makefile":
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if re.search(r"\.\./shared|parents\[3\]|shared/examples|CONTRACT\.md", text):
            offenders.append(str(rel))
    assert offenders == ["tests/unit/test_docs.py"], offenders
