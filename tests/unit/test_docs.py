"""The reference pages that follow from the code are current (scripts/make_docs.py), and
every doc page the README or another page links to exists."""

from __future__ import annotations

import importlib.util
import re
import subprocess
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
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    outside = re.compile(
        r"\.\./shared|shared/examples|CONTRACT\.md|parents\[3\]|parents\[2\]\.parent|"
        r"os\.pardir|\.parent\.parent\.parent"
    )
    offenders = []
    for rel in listed:
        if rel.startswith("tests/spec/") or rel == "tests/unit/test_docs.py":
            continue
        try:
            text = (ROOT / rel).read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if outside.search(text):
            offenders.append(rel)
    assert not offenders


def test_the_rules_page_states_the_category_rule_as_coded() -> None:
    from memdiag.contract import CATEGORIES
    from memdiag.contract.categories import (
        LINTERS,
        REGRESSION_PATTERN,
        STYLE_PATTERN,
        TEST_RUNNERS,
    )

    text = (ROOT / "docs" / "rules.md").read_text()
    table = text.split("| category | when |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (.*) \|$", table, re.M)
    assert [name for name, _ in rows] == [c for c in CATEGORIES if c != "unknown"]
    named = {name: set(re.findall(r"`(\w\w+)`", when)) for name, when in rows}
    assert named["test_failure"] == TEST_RUNNERS
    assert named["style"] == set(STYLE_PATTERN.pattern.split("|")) | LINTERS
    assert named["regression"] == set(REGRESSION_PATTERN.pattern.split("|"))
