"""The failure category of a failed session (docs/rules.md), and which rule gave it.

One implementation for the worker (which writes ``failure_category``) and for ``memdiag
explain`` (which says which rule fired, from the stored tool calls, errors and files), so
the two cannot disagree. Pure code: no Faust, no Kafka, no DuckDB.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from memdiag.contract import INCOMPLETE, OTHER, REGRESSION, STYLE, TEST_FAILURE, WRONG_APPROACH

TEST_RUNNERS = frozenset(
    {
        "jest",
        "vitest",
        "pytest",
        "go_test",
        "mocha",
        "jasmine",
        "karma",
        "ava",
        "cargo_test",
        "rspec",
        "minitest",
        "phpunit",
        "junit",
        "unittest",
        "nose2",
        "playwright_test",
        "cypress",
    }
)
#: Linters and formatters: a failed call of one is ``style``, whatever its error says (a
#: ``ruff`` run that says only "E501 Line too long" is a style failure, not a wrong approach).
LINTERS = frozenset(
    {
        "eslint",
        "prettier",
        "biome",
        "stylelint",
        "ruff",
        "flake8",
        "pylint",
        "black",
        "isort",
        "autopep8",
        "yapf",
        "rubocop",
        "golangci_lint",
        "gofmt",
        "rustfmt",
        "clippy",
        "ktlint",
        "swiftlint",
        "shellcheck",
        "hadolint",
        "markdownlint",
    }
)
STYLE_PATTERN = re.compile(r"lint|format|prettier|eslint", re.IGNORECASE)
REGRESSION_PATTERN = re.compile(r"regression|broke|previously", re.IGNORECASE)

_QUOTE = 80  # characters of an error message quoted in a reason


def tool_name(tool: str) -> str:
    """The form a tool is compared in: lowercased, ``-`` and space turned to ``_``."""
    return tool.lower().replace("-", "_").replace(" ", "_")


@dataclass(frozen=True, slots=True)
class Classified:
    category: str
    reason: str  # the rule that fired, in words a person reads: "test runner pytest failed"


def _quote(message: str) -> str:
    text = " ".join(message.split())
    return repr(text if len(text) <= _QUOTE else text[: _QUOTE - 1] + "…")


def _mentions(pattern: re.Pattern[str], messages: Sequence[str]) -> str | None:
    """The reason when an error message matches ``pattern``: the message and the word."""
    for message in messages:
        found = pattern.search(message)
        if found:
            return f"error {_quote(message)} mentions {found.group(0).lower()!r}"
    return None


def classify(
    tool_calls: Iterable[tuple[str, bool]],
    error_messages: Sequence[str],
    files_modified: Sequence[str] | None,
) -> Classified:
    """The first rule of the contract's table that holds, and why. ``tool_calls`` are
    (tool, success) pairs; ``files_modified`` is ``None`` when the outcome cannot know its
    files (one mapped from spans without ``memdiag.file``): ``incomplete`` then does not
    apply."""
    failed = [tool for tool, ok in tool_calls if not ok]
    for tool in failed:
        if tool_name(tool) in TEST_RUNNERS:
            return Classified(TEST_FAILURE, f"test runner {tool} failed")
    said = _mentions(STYLE_PATTERN, error_messages)
    if said:
        return Classified(STYLE, said)
    for tool in failed:
        if tool_name(tool) in LINTERS:
            return Classified(STYLE, f"linter or formatter {tool} failed")
    said = _mentions(REGRESSION_PATTERN, error_messages)
    if said:
        return Classified(REGRESSION, said)
    if files_modified is not None and not files_modified:
        return Classified(INCOMPLETE, "no file was modified")
    if error_messages:
        n = len(error_messages)
        return Classified(
            WRONG_APPROACH,
            f"{n} error{'s' if n > 1 else ''} and no failed test runner or linter, no style or "
            f"regression error; the first: {_quote(error_messages[0])}",
        )
    return Classified(
        OTHER, "no rule holds: no failed test runner or linter, no error, files modified"
    )


def failure_category(
    tool_calls: Iterable[tuple[str, bool]],
    error_messages: Sequence[str],
    files_modified: Sequence[str] | None,
) -> str:
    """The category alone (what the worker writes)."""
    return classify(tool_calls, error_messages, files_modified).category
