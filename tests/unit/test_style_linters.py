"""Linters are style (#36, item 6): a failed linter or formatter call makes a failed session
``style`` whatever its error says, below a failed test runner and above a regression.

The reference below is the contract's table written out again, its linter list copied from
the contract, not imported: the code's list is checked against it, not against itself.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memdiag.contract import SESSION_OUTCOMES
from memdiag.contract.categories import LINTERS, TEST_RUNNERS, classify, failure_category
from memdiag.settings import Settings
from tests.inmemory import World

EDITED = ["src/a.py"]

#: the product contract, section 3, the `style` row, as written there
CONTRACT_LINTERS = (
    "eslint prettier biome stylelint ruff flake8 pylint black isort autopep8 yapf rubocop "
    "golangci_lint gofmt rustfmt clippy ktlint swiftlint shellcheck hadolint markdownlint"
).split()
CONTRACT_RUNNERS = (
    "jest vitest pytest go_test mocha jasmine karma ava cargo_test rspec minitest phpunit "
    "junit unittest nose2 playwright_test cypress"
).split()


def reference(tools: list[tuple[str, bool]], errors: list[str], files: list[str] | None) -> str:
    """The contract's table, first row that holds, written without memdiag's code."""

    def named(tool: str) -> str:
        return re.sub(r"[- ]", "_", tool.lower())

    failed = [named(t) for t, ok in tools if not ok]
    if any(t in CONTRACT_RUNNERS for t in failed):
        return "test_failure"
    if any(re.search("lint|format|prettier|eslint", m, re.I) for m in errors) or any(
        t in CONTRACT_LINTERS for t in failed
    ):
        return "style"
    if any(re.search("regression|broke|previously", m, re.I) for m in errors):
        return "regression"
    if files is not None and not files:
        return "incomplete"
    return "wrong_approach" if errors else "other"


def test_the_list_is_the_contracts() -> None:
    assert set(CONTRACT_LINTERS) == LINTERS and len(CONTRACT_LINTERS) == 21
    assert not LINTERS & TEST_RUNNERS


@pytest.mark.parametrize("linter", CONTRACT_LINTERS)
def test_each_failed_linter_is_style_without_a_style_message(linter: str) -> None:
    c = classify([(linter, False)], ["E501 Line too long"], EDITED)
    assert (c.category, c.reason) == ("style", f"linter or formatter {linter} failed")


@pytest.mark.parametrize(
    "spelling",
    [
        "Ruff",
        "RUFF",
        "golangci-lint",
        "GolangCI Lint",
        "golangci_lint",
        "ESLint",
        "Prettier",
        "MarkdownLint",
        "ShellCheck",
        "Black",
    ],
)
def test_names_compare_lowercased_with_dash_and_space_as_underscore(spelling: str) -> None:
    assert failure_category([(spelling, False)], ["exit status 1"], EDITED) == "style"


@pytest.mark.parametrize(
    "tool",
    ["ruff-format", "eslint_d", "golangcilint", "shell check", "pylint3", "lint", "make lint"],
)
def test_a_tool_off_the_list_is_no_linter(tool: str) -> None:
    """The list is exact, as the test runners' is (`pytest-cov` is no runner either)."""
    assert failure_category([(tool, False)], ["exit status 1"], EDITED) == "wrong_approach"


@pytest.mark.parametrize("linter", ["ruff", "eslint", "Golangci-Lint"])
def test_a_linter_call_that_succeeded_does_not_count(linter: str) -> None:
    assert failure_category([(linter, True)], ["E501 Line too long"], EDITED) == "wrong_approach"
    assert failure_category([(linter, True)], [], EDITED) == "other"
    assert failure_category([(linter, True)], [], []) == "incomplete"


@pytest.mark.parametrize(
    "tools",
    [
        [("pytest", False), ("ruff", False)],
        [("ruff", False), ("pytest", False)],
        [("eslint", False), ("Jest", False)],
    ],
)
def test_a_failed_test_runner_beats_a_failed_linter(tools: list[tuple[str, bool]]) -> None:
    c = classify(tools, ["E501 Line too long"], EDITED)
    assert c.category == "test_failure" and c.reason.startswith("test runner ")


def test_a_failed_linter_beats_a_regression_message() -> None:
    c = classify([("ruff", False)], ["this broke the build, it worked previously"], EDITED)
    assert (c.category, c.reason) == ("style", "linter or formatter ruff failed")


def test_a_failed_linter_beats_incomplete_and_wrong_approach() -> None:
    assert failure_category([("black", False)], [], []) == "style"  # no file modified
    assert failure_category([("black", False)], ["TypeError"], None) == "style"


def test_a_style_message_gives_the_reason_before_a_failed_linter() -> None:
    c = classify([("ruff", False)], ["ruff format would reformat a.py"], EDITED)
    assert c == classify([], ["ruff format would reformat a.py"], EDITED)
    assert c.category == "style" and "mentions 'format'" in c.reason


def test_the_issue_session_through_the_worker() -> None:
    """#36's session: a rework whose failed call was ruff, "E501 Line too long". It was
    wrong_approach; the worker now writes style, and counts it so."""
    world = World(Settings(), seed=0)
    world.publish(
        [
            {
                "kind": "session_outcome",
                "event_id": "o1",
                "ts": "2026-11-21T10:00:00Z",
                "session_id": "s-ruff",
                "outcome": "rework",
                "tool_calls": [
                    {"tool": "edit", "file": "src/a.py", "success": True},
                    {"tool": "ruff", "success": False},
                ],
                "files_modified": ["src/a.py"],
                "errors": [{"message": "E501 Line too long", "tool": "ruff", "recoverable": True}],
            }
        ]
    )
    world.run()
    d = world.diagnostics()["s-ruff"]
    assert (d["outcome"], d["failure_category"]) == ("rework", "style")
    counted = (("failure_category", "style"), ("outcome", "rework"))
    assert world.counts[(SESSION_OUTCOMES, counted)] == 1


# -- properties -------------------------------------------------------------------------------


@st.composite
def spelled(draw: Any, name: str) -> str:
    """``name`` as a producer may spell it: any case, each ``_`` as ``_``, ``-`` or a space."""
    parts = name.split("_")
    seps = [draw(st.sampled_from("_- ")) for _ in parts[1:]]
    text = parts[0] + "".join(s + p for s, p in zip(seps, parts[1:], strict=True))
    upper = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    return "".join(c.upper() if u else c for c, u in zip(text, upper, strict=True))


TOOLS = st.one_of(
    st.sampled_from(CONTRACT_LINTERS).flatmap(spelled),
    st.sampled_from(CONTRACT_RUNNERS).flatmap(spelled),
    st.sampled_from(["edit", "npm", "make", "ruff-format", "lint", "bash"]),
    st.text(max_size=12),
)
MESSAGES = st.one_of(
    st.sampled_from(["E501 Line too long", "lint", "it broke", "Previously fine", "boom", ""]),
    st.text(max_size=30),
)
FILES = st.one_of(st.none(), st.lists(st.just("f"), max_size=2))


@given(st.lists(st.tuples(TOOLS, st.booleans()), max_size=5), st.lists(MESSAGES, max_size=4), FILES)
def test_the_category_is_the_contracts(tools, errors, files) -> None:
    assert failure_category(tools, errors, files) == reference(tools, errors, files)
    assert classify(tools, errors, files).category == failure_category(tools, errors, files)


@given(
    st.lists(st.tuples(TOOLS, st.booleans()), max_size=5),
    st.lists(MESSAGES, max_size=4),
    FILES,
    st.sampled_from(CONTRACT_LINTERS).flatmap(spelled),
)
def test_a_failed_linter_makes_anything_below_test_failure_style(
    tools, errors, files, linter
) -> None:
    before = failure_category(tools, errors, files)
    after = failure_category([*tools, (linter, False)], errors, files)
    assert after == ("test_failure" if before == "test_failure" else "style")
    # and the same call passing changes nothing
    assert failure_category([*tools, (linter, True)], errors, files) == before
