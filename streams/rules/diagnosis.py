"""Session diagnostics, misleading observations and weights (docs/rules.md): pure code.

- :func:`failure_category`: the first rule of the contract's table that holds (its home is
  :mod:`memdiag.contract.categories`, shared with ``memdiag explain``).
- :func:`is_misleading`: seen in at least 3 failed sessions and in no accepted one.
- :func:`ema_step`: one weight step per session, aggressive once misleading.
- :class:`Ledger`: what the one owner of an observation keeps: its sessions in the order of
  their outcomes' event time, and the steps that order implies (``memdiag.streams.rules.ledger``).
- :func:`failure_mode`: a benchmark judgement's (docs/rules.md, "Benchmark judgement"): a
  reader failure (all the gold evidence was in the context and the answer was still wrong),
  a retrieval failure (some gold evidence never reached the context), or unattributed (no
  gold to check against).
"""

from __future__ import annotations

from collections.abc import Collection

from memdiag.contract import READER_FAILURE, RETRIEVAL_FAILURE, UNATTRIBUTED
from memdiag.contract.categories import (
    LINTERS,
    REGRESSION_PATTERN,
    STYLE_PATTERN,
    TEST_RUNNERS,
    failure_category,
    tool_name,
)

__all__ = [
    "LINTERS",
    "MISLEADING_MIN_FAILURES",
    "REGRESSION_PATTERN",
    "STYLE_PATTERN",
    "TEST_RUNNERS",
    "ema_step",
    "failure_category",
    "failure_mode",
    "is_misleading",
    "tool_name",
]

#: Failed sessions an observation must be in (and no accepted one) to be misleading.
MISLEADING_MIN_FAILURES = 3


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


def failure_mode(
    judge_correct: bool, gold_evidence_ids: Collection[str], retrieved_context_ids: Collection[str]
) -> str | None:
    """None when correct; otherwise which side failed."""
    if judge_correct:
        return None
    if not gold_evidence_ids:
        return UNATTRIBUTED
    if set(gold_evidence_ids) <= set(retrieved_context_ids):
        return READER_FAILURE
    return RETRIEVAL_FAILURE
