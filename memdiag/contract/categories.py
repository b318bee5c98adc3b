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


def classify(
    tool_calls: Iterable[tuple[str, bool]],
    error_messages: Sequence[str],
    files_modified: Sequence[str] | None,
) -> Classified:
    """The first rule of the contract's table that holds, and why. ``tool_calls`` are
    (tool, success) pairs; ``files_modified`` is ``None`` when the outcome cannot know its
    files (one mapped from spans without ``memdiag.file``): ``incomplete`` then does not
    apply."""
    for tool, ok in tool_calls:
        if not ok and tool_name(tool) in TEST_RUNNERS:
            return Classified(TEST_FAILURE, f"test runner {tool} failed")
    for pattern, category in ((STYLE_PATTERN, STYLE), (REGRESSION_PATTERN, REGRESSION)):
        for message in error_messages:
            found = pattern.search(message)
            if found:
                return Classified(
                    category, f"error {_quote(message)} mentions {found.group(0).lower()!r}"
                )
    if files_modified is not None and not files_modified:
        return Classified(INCOMPLETE, "no file was modified")
    if error_messages:
        n = len(error_messages)
        return Classified(
            WRONG_APPROACH,
            f"{n} error{'s' if n > 1 else ''} and no failed test, style or regression error; "
            f"the first: {_quote(error_messages[0])}",
        )
    return Classified(OTHER, "no rule holds: no failed test runner, no error, files modified")


def failure_category(
    tool_calls: Iterable[tuple[str, bool]],
    error_messages: Sequence[str],
    files_modified: Sequence[str] | None,
) -> str:
    """The category alone (what the worker writes)."""
    return classify(tool_calls, error_messages, files_modified).category
