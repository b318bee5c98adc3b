"""Recall pipeline health (docs/rules.md, "Recall pipeline health"): the rules, pure.

A memory's status at its agent's clock, whether it ever was unindexed, the break rule, and
a probe's verdict. The agent's state (``memdiag.streams.agent``) applies them in event time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memdiag.contract import INDEXED, NOT_WRITTEN, PENDING, UNINDEXED

#: A probe's ``query_source`` when its query was made from the memory's own name (the
#: default; contract section 9): the probes SRR, the miss reasons and the counter count.
NAME_PROBE = "name"


def probe_verdict(
    memory_id: str,
    result_ids: Sequence[str],
    scores: Sequence[float] | None,
    k: int,
    threshold: float,
) -> tuple[bool, int | None, float | None]:
    """(hit, 1-based rank of ``memory_id`` in the results or None, its score or None)."""
    try:
        i = list(result_ids).index(memory_id)
    except ValueError:
        return False, None, None
    score = None if scores is None else scores[i]
    hit = i < k and (score is None or score >= threshold)
    return hit, i + 1, score


def ms(ts_us: int) -> int:
    """Whole milliseconds of an event time (the deadline's resolution)."""
    return ts_us // 1000


def status(written_us: int | None, indexed_us: int | None, clock_us: int, deadline_ms: int) -> str:
    """A memory's status at the agent's clock."""
    if written_us is None:
        return NOT_WRITTEN
    if indexed_us is not None:
        return INDEXED
    return UNINDEXED if ms(clock_us) - ms(written_us) > deadline_ms else PENDING


def ever_unindexed(
    written_us: int | None, indexed_us: int | None, clock_us: int, deadline_ms: int
) -> bool:
    """Whether the memory counted as unindexed at some point of its agent's event time."""
    if written_us is None:
        return False
    if indexed_us is not None:
        return ms(indexed_us) - ms(written_us) > deadline_ms
    return ms(clock_us) - ms(written_us) > deadline_ms


def break_since(oldest_unindexed_us: int | None, last_indexed_us: int | None) -> int | None:
    """The break rule: the ``written_at`` of the oldest unindexed memory when no index event
    came since it was written, else None."""
    if oldest_unindexed_us is None:
        return None
    if last_indexed_us is not None and last_indexed_us >= oldest_unindexed_us:
        return None
    return oldest_unindexed_us


def later(a: list[Any] | None, ts_us: int, event_id: str) -> bool:
    """Whether (ts, event_id) comes after the kept [ts, event_id, ...] (or none is kept)."""
    return a is None or (ts_us, event_id) > (a[0], a[1])


def earlier(a: list[Any] | None, ts_us: int, event_id: str) -> bool:
    return a is None or (ts_us, event_id) < (a[0], a[1])
