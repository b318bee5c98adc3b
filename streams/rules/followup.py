"""The followup rule (docs/rules.md, "Followup"): pure functions, no Faust, no Kafka.

A search is *evaluated* only when it comes from the agent and returned results. An evaluated
search is a followup of its predecessor (the session's evaluated search just before it in
event time, if at most the retention earlier) iff ``ts - prev.ts <= window`` (inclusive), the
trimmed, lowercased queries differ (the same query again is a retry), and the two result
sets share no id.

Order. :class:`SearchHistory` keeps a session's evaluated searches sorted by ``(ts,
event_id)``: searches with equal timestamps (the same microsecond) are taken in ``event_id``
byte order, never in arrival order, as the contract says (an unkeyed or re-routed producer's
events do not arrive in the order they were published in). A search that arrives late,
between two others, gets its own verdict and changes its successor's:
:meth:`SearchHistory.observe` returns both. Verdicts are a function of the history alone, so
any arrival order converges to the in-order verdicts, and a redelivered search gets the same
verdict again.

Retention. Searches are remembered for the retention (24 h of the session's own event time
by default). :meth:`SearchHistory.prune` forgets what no search within the retention of the
session's newest one can need, and keeps the newest search before the cut-off: it is the
predecessor of any search that lands just after it, in whatever order they arrive.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Sequence

import msgspec


def normalise_query(query: str) -> str:
    """The form in which two queries are compared: trimmed and lowercased."""
    return query.strip().lower()


#: an empty 8-byte BLAKE2b, copied for each query (the same digest): the whole key took
#: 0.36 us this way and 0.63 setting one up with its digest size each time (one timeit)
_BLAKE2B_8 = hashlib.blake2b(digest_size=8)


def query_key(query: str) -> str:
    """A short digest of the normalised query: state (and its changelog) keeps no raw text."""
    digest = _BLAKE2B_8.copy()
    digest.update(normalise_query(query).encode("utf-8"))
    return digest.hexdigest()


def is_evaluated(source: str, result_ids: Sequence[str]) -> bool:
    """Only agent searches that returned results are judged (and remembered)."""
    return source == "agent" and len(result_ids) > 0


class Remembered(msgspec.Struct, frozen=True, gc=False):
    """What a session remembers of one evaluated search."""

    ts_us: int
    event_id: str  # the tie-break for equal timestamps (byte order: str order of its UTF-8)
    query_key: str
    result_ids: tuple[str, ...]

    @property
    def order(self) -> tuple[int, str]:
        return (self.ts_us, self.event_id)


class Verdict(msgspec.Struct, frozen=True, gc=False):
    event_id: str
    is_followup: bool
    prev_event_id: str | None
    gap_us: int | None
    #: Every condition of a followup but the window: a predecessor exists, the query differs
    #: from it and the result sets are disjoint. ``is_followup`` is this and
    #: ``gap <= window``, so the verdict under any other window is a query away
    #: (``memdiag calibrate``).
    disjoint_new_query: bool = False

    @property
    def gap_seconds(self) -> float | None:
        return None if self.gap_us is None else self.gap_us / 1_000_000


def judge(prev: Remembered | None, cur: Remembered, window_us: int, retention_us: int) -> Verdict:
    """The verdict on ``cur`` given its predecessor ``prev`` (the search just before it)."""
    if prev is None or cur.ts_us - prev.ts_us > retention_us:
        return Verdict(cur.event_id, False, None, None)
    gap = cur.ts_us - prev.ts_us
    disjoint_new = cur.query_key != prev.query_key and set(cur.result_ids).isdisjoint(
        prev.result_ids
    )
    followup = disjoint_new and 0 <= gap <= window_us
    return Verdict(cur.event_id, followup, prev.event_id, gap, disjoint_new)


class SearchHistory:
    """A session's evaluated searches in ``(ts, event_id)`` order, and the verdicts they imply.

    ``evaluated`` and ``followups`` count every evaluated search ever observed (pruned ones
    included: a pruned search's verdict is final, because nothing can land before it any
    more) and how many of them are followups now, corrections included.
    """

    __slots__ = ("_entries", "_orders", "_index", "evaluated", "followups", "_window", "_ret")

    def __init__(self, window_us: int, retention_us: int):
        self._entries: list[Remembered] = []
        self._orders: list[tuple[int, str]] = []
        self._index: dict[str, Remembered] = {}
        self.evaluated = 0
        self.followups = 0
        self._window = window_us
        self._ret = retention_us

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._index

    @property
    def entries(self) -> tuple[Remembered, ...]:
        return tuple(self._entries)

    def observe(self, entry: Remembered) -> list[Verdict]:
        """Remember a new evaluated search; return its verdict, then its successor's if that
        changed (the search arrived late, between two others)."""
        verdict = self.observe_last(entry)
        if verdict is not None:
            return [verdict]
        pos = bisect_left(self._orders, entry.order)
        before = self._verdict_at(pos) if pos < len(self._entries) else None
        self._entries.insert(pos, entry)
        self._orders.insert(pos, entry.order)
        self._index[entry.event_id] = entry
        verdicts = [self._verdict_at(pos)]
        self.evaluated += 1
        self.followups += verdicts[0].is_followup
        if before is not None:
            after = self._verdict_at(pos + 1)
            if after != before:
                verdicts.append(after)
                self.followups += after.is_followup - before.is_followup
        return verdicts

    def observe_last(self, entry: Remembered) -> Verdict | None:
        """:meth:`observe` in the usual case, a search after every remembered one (no
        successor to correct): remembered, and its verdict. None if it is not after every
        one: nothing is remembered then (:meth:`observe` takes it)."""
        orders = self._orders
        order = (entry.ts_us, entry.event_id)
        if orders and order <= orders[-1]:
            return None
        entries = self._entries
        verdict = judge(entries[-1] if entries else None, entry, self._window, self._ret)
        entries.append(entry)
        orders.append(order)
        self._index[entry.event_id] = entry
        self.evaluated += 1
        self.followups += verdict.is_followup
        return verdict

    def verdict(self, event_id: str) -> Verdict | None:
        """The current verdict of a remembered search (``None`` once it is pruned)."""
        entry = self._index.get(event_id)
        if entry is None:
            return None
        return self._verdict_at(bisect_left(self._orders, entry.order))

    def successor_verdict(self, event_id: str) -> Verdict | None:
        """The current verdict of the search just after ``event_id``, if any."""
        entry = self._index.get(event_id)
        if entry is None:
            return None
        pos = bisect_left(self._orders, entry.order) + 1
        return self._verdict_at(pos) if pos < len(self._entries) else None

    def _verdict_at(self, i: int) -> Verdict:
        prev = self._entries[i - 1] if i > 0 else None
        return judge(prev, self._entries[i], self._window, self._ret)

    def prune(self, cutoff_us: int) -> None:
        """Forget searches before ``cutoff_us`` except the newest of them (the predecessor a
        search at or after the cut-off may need)."""
        orders = self._orders
        if len(orders) < 2 or orders[1][0] >= cutoff_us:
            return  # nothing but the newest before the cut-off (every clock tick asks)
        keep_from = bisect_left(self._orders, (cutoff_us, "")) - 1
        if keep_from > 0:
            for gone in self._entries[:keep_from]:
                del self._index[gone.event_id]
            del self._entries[:keep_from]
            del self._orders[:keep_from]
