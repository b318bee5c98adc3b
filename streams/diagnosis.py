"""Session diagnostics, misleading observations and weights (CONTRACT section 3): pure code.

- :func:`failure_category`: the first rule of the contract's table that holds.
- :func:`is_misleading`: seen in at least 3 failed sessions and in no accepted one.
- :func:`ema_step`: one weight step per session outcome, aggressive once misleading.
- :class:`ObservationState`: what the one owner of an observation keeps, and the step a
  session outcome makes it take, idempotent under redelivery.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

ACCEPTED = "accepted"
FAILED_OUTCOMES = frozenset({"rejected", "rework"})

#: Every category the distribution reports, in the contract's order. ``unknown`` is never
#: produced by the rule; it counts failed sessions whose category is missing or foreign.
CATEGORIES = (
    "test_failure",
    "style",
    "regression",
    "incomplete",
    "wrong_approach",
    "other",
    "unknown",
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
    files_modified: Sequence[str],
) -> str:
    """The category of a failed session. ``tool_calls`` are (tool, success) pairs."""
    if any(not ok and tool_name(tool) in TEST_RUNNERS for tool, ok in tool_calls):
        return "test_failure"
    if any(_STYLE.search(m) for m in error_messages):
        return "style"
    if any(_REGRESSION.search(m) for m in error_messages):
        return "regression"
    if not files_modified:
        return "incomplete"
    if error_messages:
        return "wrong_approach"
    return "other"


def is_misleading(failed_sessions: int, accepted_sessions: int) -> bool:
    return failed_sessions >= MISLEADING_MIN_FAILURES and accepted_sessions == 0


@dataclass(frozen=True, slots=True)
class Step:
    """One EMA step of one observation's weight, caused by one session's outcome."""

    observation_id: str
    session_key: str  # what identifies the outcome (memdiag: session and outcome event id)
    outcome: str
    alpha: float
    previous_weight: float
    new_weight: float
    aggressive: bool
    misleading: bool  # after counting this session
    became_misleading: bool  # this session made it misleading
    failed_sessions: int
    accepted_sessions: int
    seq: int  # the observation's step number, 1-based: orders its weight updates
    ts_us: int  # event time of the session outcome


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


class ObservationState:
    """Everything the owner of one observation keeps.

    ``recent`` remembers the last :attr:`RECENT` steps whole (the outcome's identity as an
    8-byte digest), so a redelivered session outcome (after a worker crash) re-emits its
    step instead of taking a second one. Only a redelivery that arrives after more than
    ``RECENT`` other outcomes of the same observation would be counted twice: redeliveries
    come within seconds, and a replay of whole sessions is stopped before it gets here
    (sessions remember the events they applied). About 2 KB per observation.
    """

    RECENT = 16
    __slots__ = ("failed", "accepted", "weight", "seq", "recent")

    def __init__(
        self,
        failed: int = 0,
        accepted: int = 0,
        weight: float = 1.0,
        seq: int = 0,
        recent: list[list[Any]] | None = None,
    ):
        self.failed = failed
        self.accepted = accepted
        self.weight = weight
        self.seq = seq
        self.recent: list[list[Any]] = recent or []

    @property
    def misleading(self) -> bool:
        return is_misleading(self.failed, self.accepted)

    def apply(
        self,
        observation_id: str,
        session_key: str,
        outcome: str,
        ts_us: int,
        alpha_success: float,
        alpha_failure: float,
    ) -> tuple[Step, bool]:
        """The step for this session outcome, and whether it is new (False: a replay).

        ``session_key`` identifies the outcome (memdiag passes session and outcome event id:
        a session reported with two outcomes takes two steps)."""
        key = hashlib.blake2b(session_key.encode("utf-8"), digest_size=8).hexdigest()
        for row in self.recent:
            if row[0] == key:
                return _step_from_row(observation_id, session_key, row), False
        was_misleading = self.misleading
        accepted = outcome == ACCEPTED
        if accepted:
            self.accepted += 1
        else:
            self.failed += 1
        misleading = self.misleading
        alpha, new_weight, aggressive = ema_step(
            self.weight, accepted, misleading, alpha_success, alpha_failure
        )
        self.seq += 1
        step = Step(
            observation_id,
            session_key,
            outcome,
            alpha,
            self.weight,
            new_weight,
            aggressive,
            misleading,
            misleading and not was_misleading,
            self.failed,
            self.accepted,
            self.seq,
            ts_us,
        )
        self.weight = new_weight
        self.recent.append([key, *_step_row(step)[1:]])
        del self.recent[: -self.RECENT]
        return step, True

    def to_state(self) -> list[Any]:
        return [self.failed, self.accepted, self.weight, self.seq, self.recent]

    @classmethod
    def from_state(cls, state: list[Any] | None) -> ObservationState:
        if not state:
            return cls()
        return cls(*state)


def _step_row(s: Step) -> list[Any]:
    return [
        s.session_key,
        s.outcome,
        s.alpha,
        s.previous_weight,
        s.new_weight,
        int(s.aggressive),
        int(s.misleading),
        int(s.became_misleading),
        s.failed_sessions,
        s.accepted_sessions,
        s.seq,
        s.ts_us,
    ]


def _step_from_row(observation_id: str, session_key: str, row: list[Any]) -> Step:
    _, outcome, alpha, prev, new, aggr, mis, became, failed, accepted, seq, ts = row
    return Step(
        observation_id,
        session_key,
        outcome,
        alpha,
        prev,
        new,
        bool(aggr),
        bool(mis),
        bool(became),
        failed,
        accepted,
        seq,
        ts,
    )
