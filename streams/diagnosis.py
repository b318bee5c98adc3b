"""Session diagnostics, misleading observations and weights (docs/rules.md): pure code.

- :func:`failure_category`: the first rule of the contract's table that holds.
- :func:`is_misleading`: seen in at least 3 failed sessions and in no accepted one.
- :func:`ema_step`: one weight step per session, aggressive once misleading.
- :class:`Ledger`: what the one owner of an observation keeps: its sessions in the order of
  their outcomes' event time, and the steps that order implies (``memdiag.streams.ledger``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from memdiag.contract import (
    INCOMPLETE,
    OTHER,
    REGRESSION,
    STYLE,
    TEST_FAILURE,
    WRONG_APPROACH,
)

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
_STYLE = re.compile(r"lint|format|prettier|eslint", re.IGNORECASE)
_REGRESSION = re.compile(r"regression|broke|previously", re.IGNORECASE)

#: Failed sessions an observation must be in (and no accepted one) to be misleading.
MISLEADING_MIN_FAILURES = 3


def tool_name(tool: str) -> str:
    """The form a tool is compared in: lowercased, ``-`` and space turned to ``_``."""
    return tool.lower().replace("-", "_").replace(" ", "_")


def failure_category(
    tool_calls: Iterable[tuple[str, bool]],
    error_messages: Sequence[str],
    files_modified: Sequence[str] | None,
) -> str:
    """The category of a failed session. ``tool_calls`` are (tool, success) pairs.

    ``files_modified`` is ``None`` when the outcome cannot know its files (one mapped from
    spans without ``memdiag.file``): the ``incomplete`` rule then does not apply."""
    if any(not ok and tool_name(tool) in TEST_RUNNERS for tool, ok in tool_calls):
        return TEST_FAILURE
    if any(_STYLE.search(m) for m in error_messages):
        return STYLE
    if any(_REGRESSION.search(m) for m in error_messages):
        return REGRESSION
    if files_modified is not None and not files_modified:
        return INCOMPLETE
    if error_messages:
        return WRONG_APPROACH
    return OTHER


def is_misleading(failed_sessions: int, accepted_sessions: int) -> bool:
    return failed_sessions >= MISLEADING_MIN_FAILURES and accepted_sessions == 0


def ema_step(
    weight: float,
    accepted: bool,
    misleading_after: bool,
    alpha_success: float,
    alpha_failure: float,
) -> tuple[float, float, bool]:
    """``w <- w + alpha * (target - w)``; returns (alpha, new weight, aggressive)."""
    if accepted:
        return alpha_success, weight + alpha_success * (1.0 - weight), False
    alpha = min(1.0, 2 * alpha_failure) if misleading_after else alpha_failure
    return alpha, weight + alpha * (0.0 - weight), misleading_after
