"""The followup rule (CONTRACT section 3, "Followup"): pure functions, no Faust, no Kafka.

A search is *evaluated* only when it comes from the agent and returned results. An evaluated
search is a followup of the session's remembered search (the previous evaluated one) iff
``0 <= ts - prev.ts <= window`` (inclusive), the trimmed, lowercased queries differ (the
same query again is a retry), and the two result sets share no id.

Order. The contract states the rule over a session's searches in order. Keyed producers give
that order for free; unkeyed ones do not (their events are re-routed to the session's
partition and may arrive out of order). :class:`SearchHistory` therefore keeps the session's
evaluated searches sorted by event time (arrival order breaks ties, so an in-order stream
gives exactly the contract's verdicts) and, when a late search lands between two others,
also returns the corrected verdict of its successor. Verdicts are a function of the history
alone, so re-delivering an event re-emits the same verdict: the sink's upsert then changes
nothing.

Retention. A remembered search older than the retention (24 h of event time by default) is
forgotten: it is never a predecessor, whether or not the sweeper has removed it yet, so the
verdict does not depend on when sweeps run.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Most evaluated searches remembered per session (oldest dropped first). Bounds the state
#: of a runaway session; far above what a real session makes in the retention period.
MAX_REMEMBERED = 2_000


def normalise_query(query: str) -> str:
    """The form in which two queries are compared: trimmed and lowercased."""
    return query.strip().lower()


def query_key(query: str) -> str:
    """A short digest of the normalised query: state (and its changelog) keeps no raw text."""
    return hashlib.blake2b(normalise_query(query).encode("utf-8"), digest_size=8).hexdigest()


def is_evaluated(source: str, result_ids: Sequence[str]) -> bool:
    """Only agent searches that returned results are judged (and remembered)."""
    return source == "agent" and len(result_ids) > 0


@dataclass(frozen=True, slots=True)
class Remembered:
    """What a session remembers of one evaluated search."""

    ts_us: int
    seq: int  # arrival order within the session: the tie-break for equal timestamps
    event_id: str
    query_key: str
    result_ids: tuple[str, ...]

    @property
    def order(self) -> tuple[int, int]:
        return (self.ts_us, self.seq)


@dataclass(frozen=True, slots=True)
class Verdict:
    event_id: str
    is_followup: bool
    prev_event_id: str | None
    gap_us: int | None

    @property
    def gap_seconds(self) -> float | None:
        return None if self.gap_us is None else self.gap_us / 1_000_000


def judge(prev: Remembered | None, cur: Remembered, window_us: int, retention_us: int) -> Verdict:
    """The verdict on ``cur`` given the session's remembered search ``prev``."""
    if prev is None or cur.ts_us - prev.ts_us > retention_us:
        return Verdict(cur.event_id, False, None, None)
    gap = cur.ts_us - prev.ts_us
    followup = (
        0 <= gap <= window_us
        and cur.query_key != prev.query_key
        and set(cur.result_ids).isdisjoint(prev.result_ids)
    )
    return Verdict(cur.event_id, followup, prev.event_id, gap)


class SearchHistory:
    """A session's evaluated searches in event-time order, and the verdicts they imply."""

    __slots__ = ("_entries", "_orders", "_ids", "_next_seq", "_rows", "evaluated", "followups")

    def __init__(
        self,
        entries: Sequence[Remembered] = (),
        next_seq: int = 0,
        evaluated: int = 0,
        followups: int = 0,
    ):
        #: evaluated searches ever observed (redeliveries not counted), and how many of
        #: them are followups now (corrections included): they outlive the pruning
        self.evaluated = evaluated
        self.followups = followups
        self._entries: list[Remembered] = sorted(entries, key=lambda e: e.order)
        self._orders = [e.order for e in self._entries]
        # each entry's serialised form, kept beside it: serialising is then one list copy
        self._rows: list[list[Any]] = [_row(e) for e in self._entries]
        self._ids = {e.event_id for e in self._entries}
        self._next_seq = max(next_seq, max((e.seq + 1 for e in self._entries), default=0))

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def entries(self) -> tuple[Remembered, ...]:
        return tuple(self._entries)

    @property
    def newest_ts_us(self) -> int | None:
        return self._entries[-1].ts_us if self._entries else None

    def observe(
        self,
        event_id: str,
        ts_us: int,
        query: str,
        result_ids: Sequence[str],
        window_us: int,
        retention_us: int,
    ) -> list[Verdict]:
        """Remember an evaluated search; return its verdict, then any corrected one.

        The first verdict is always the one of ``event_id``. A second one appears when the
        search arrived late, between two remembered searches, and that changed the verdict
        of its successor (whose predecessor it now is).
        """
        if event_id in self._ids:  # a re-delivery: the same verdict, no change of state
            for i, known in enumerate(self._entries):
                if known.event_id == event_id:
                    return [self._verdict(i, window_us, retention_us)]
        entry = Remembered(ts_us, self._next_seq, event_id, query_key(query), tuple(result_ids))
        self._next_seq += 1
        pos = bisect_left(self._orders, entry.order)
        before = None
        if pos < len(self._entries):  # the successor's verdict before this search arrived
            before = self._verdict(pos, window_us, retention_us)
        self._entries.insert(pos, entry)
        self._orders.insert(pos, entry.order)
        self._rows.insert(pos, _row(entry))
        self._ids.add(event_id)
        verdicts = [self._verdict(pos, window_us, retention_us)]
        self.evaluated += 1
        self.followups += verdicts[0].is_followup
        if before is not None:
            after = self._verdict(pos + 1, window_us, retention_us)
            if after != before:
                verdicts.append(after)
                self.followups += after.is_followup - before.is_followup
        self._prune(retention_us)
        return verdicts

    def _verdict(self, i: int, window_us: int, retention_us: int) -> Verdict:
        prev = self._entries[i - 1] if i > 0 else None
        return judge(prev, self._entries[i], window_us, retention_us)

    def _prune(self, retention_us: int) -> None:
        """Forget searches no in-retention search can have as its predecessor."""
        newest = self._entries[-1].ts_us
        keep_from = bisect_left(self._orders, (newest - retention_us, -1))
        keep_from = max(keep_from, len(self._entries) - MAX_REMEMBERED)
        if keep_from > 0:
            for gone in self._entries[:keep_from]:
                self._ids.discard(gone.event_id)
            del self._entries[:keep_from]
            del self._orders[:keep_from]
            del self._rows[:keep_from]

    # -- serialisation (compact; this goes to the changelog on every write) --------------

    def to_state(self) -> list[Any]:
        return [self._next_seq, self._rows, self.evaluated, self.followups]

    @classmethod
    def from_state(cls, state: list[Any] | None) -> SearchHistory:
        """The inverse of :meth:`to_state`."""
        if not state:
            return cls()
        next_seq, rows, *counts = state
        return cls(
            [Remembered(r[0], r[1], r[2], r[3], tuple(r[4])) for r in rows], next_seq, *counts
        )


def _row(e: Remembered) -> list[Any]:
    return [e.ts_us, e.seq, e.event_id, e.query_key, list(e.result_ids)]
