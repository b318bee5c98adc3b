"""One input message in, everything the worker must send out: the worker's whole logic.

No Faust and no Kafka here. The Faust agent hands each message to :meth:`Processor.process`
with its state store (a Faust table in production, a dict in tests) and sends what comes
back. That keeps the agent a few lines and this module testable in microseconds.

Partitioning. A session's state lives on the partition Kafka's default partitioner gives
its ``session_id``. An event that arrives on another partition (published without a key,
or in a batch keyed by something else) is not processed there: it is re-routed to
``events`` keyed by its ``session_id``, and processed when it arrives on the right
partition. Because re-routing can reorder a session, the rules work in event time
(:class:`streams.followup.SearchHistory`).

State writes are collapsed: each session touched by a message is loaded once and written
once, after all of that message's events are applied. The message is acknowledged only
after the write, so this is as durable as writing per event, and it is what makes batches
cheap (each table write is a changelog message).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from memdiag.settings import Settings
from schemas import SESSION_KINDS
from schemas.decode import Accepted, Decoder, Rejected
from schemas.models import Search, SessionEvent, format_ts
from streams.followup import SearchHistory, Verdict, is_evaluated

# Counter names (CONTRACT section 4). Attributes are a sorted tuple of (name, value).
SEARCH_CALLS = "agentmemory.smart_search.calls_total"
FOLLOWUPS = "agentmemory.smart_search.followup_within_window_total"
DEAD_LETTERS = "memdiag.dead_letter_total"

CounterKey = tuple[str, tuple[tuple[str, str], ...]]

#: dead-letter reason of a message whose processing raised (a bug, never bad input)
PROCESSING_ERROR = "processing_error"

#: How far a partition's event time must advance between two sweeps of expired sessions.
SWEEP_EVERY_US = 60 * 1_000_000


@dataclass(frozen=True, slots=True)
class InMessage:
    """What the worker needs to know of one Kafka message."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None


@dataclass(slots=True)
class Output:
    """Everything one message makes the worker send, grouped by destination and key."""

    diagnostics: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    deadletters: list[tuple[bytes | None, dict[str, Any]]] = field(default_factory=list)
    reroute: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    counts: Counter[CounterKey] = field(default_factory=Counter)

    def diagnostic(self, key: str, record: dict[str, Any]) -> None:
        self.diagnostics.setdefault(key, []).append(record)


class SessionState:
    """Everything the worker keeps per session, and its compact serialised form."""

    __slots__ = ("partition", "newest_ts_us", "searches")

    def __init__(self, partition: int, newest_ts_us: int, searches: SearchHistory):
        self.partition = partition
        self.newest_ts_us = newest_ts_us
        self.searches = searches

    @classmethod
    def new(cls, partition: int) -> SessionState:
        return cls(partition, 0, SearchHistory())

    @classmethod
    def loads(cls, raw: bytes) -> SessionState:
        d = orjson.loads(raw)
        return cls(d["p"], d["t"], SearchHistory.from_state(d.get("s")))

    def dumps(self) -> bytes:
        return orjson.dumps(
            {"p": self.partition, "t": self.newest_ts_us, "s": self.searches.to_state()}
        )


StateStore = MutableMapping[str, bytes]


class Processor:
    """The worker's logic for ``memdiag.events``; one per worker process."""

    def __init__(self, settings: Settings, partition_of: Callable[[str], int]):
        self.settings = settings
        self._partition_of = partition_of
        self._decoder = Decoder(SESSION_KINDS, settings.topics.events, settings.max_event_bytes)
        self._window_us = settings.followup_window_us
        self._retention_us = settings.retention_us
        self._store_text = settings.store_text
        # partition -> {session_id: newest event time}: what the sweeper looks at. Rebuilt
        # from the store the first time a partition is seen after an assignment.
        self._index: dict[int, dict[str, int]] = {}
        self._watermark: dict[int, int] = {}
        self._last_sweep: dict[int, int] = {}

    # -- the hot path -------------------------------------------------------------------

    def process(self, msg: InMessage, store: StateStore) -> Output:
        out = Output()
        decoded = self._decoder.decode(msg.value)
        for rejected in decoded.rejected:
            self._dead_letter(msg, rejected, out)
        if not decoded.accepted:
            return out
        by_session: dict[str, list[Accepted]] = {}
        for acc in decoded.accepted:
            by_session.setdefault(acc.event.session_id, []).append(acc)  # type: ignore[union-attr]
        index = self._partition_index(msg.partition, store)
        watermark = self._watermark.get(msg.partition, 0)
        published_at = format_ts((msg.timestamp_ms or 0) * 1000)
        for session_id, accepted in by_session.items():
            if self._partition_of(session_id) != msg.partition:
                out.reroute[session_id] = [a.raw for a in accepted]
                continue
            raw_state = store.get(session_id)
            state = (
                SessionState.loads(raw_state)
                if raw_state is not None
                else SessionState.new(msg.partition)
            )
            for acc in accepted:
                event: SessionEvent = acc.event  # type: ignore[assignment]
                if event.ts_us > state.newest_ts_us:
                    state.newest_ts_us = event.ts_us
                if isinstance(event, Search):
                    self._search(event, state, out, published_at)
            store[session_id] = state.dumps()
            index[session_id] = state.newest_ts_us
            watermark = max(watermark, state.newest_ts_us)
        self._watermark[msg.partition] = watermark
        return out

    def _search(self, event: Search, state: SessionState, out: Output, published_at: str) -> None:
        out.counts[(SEARCH_CALLS, (("source", event.source),))] += 1
        verdict: Verdict | None = None
        correction: Verdict | None = None
        if is_evaluated(event.source, event.result_ids):
            verdicts = state.searches.observe(
                event.event_id,
                event.ts_us,
                event.query,
                event.result_ids,
                self._window_us,
                self._retention_us,
            )
            verdict = verdicts[0]
            correction = verdicts[1] if len(verdicts) > 1 else None
        scope = event.scope
        record: dict[str, Any] = {
            "kind": "search",
            "event_id": event.event_id,
            "session_id": scope.session_id,
            "ts": format_ts(event.ts_us),
            "source": event.source,
            "result_count": len(event.result_ids),
            "evaluated": verdict is not None,
            "is_followup": bool(verdict and verdict.is_followup),
            "prev_event_id": verdict.prev_event_id if verdict else None,
            "gap_seconds": verdict.gap_seconds if verdict else None,
            "agent_id": scope.agent_id,
            "org_id": scope.org_id,
            "project_id": scope.project_id,
            "published_at": published_at,
        }
        if self._store_text:
            record["query"] = event.query
        out.diagnostic(scope.session_id, record)
        if verdict is not None and verdict.is_followup:
            out.counts[(FOLLOWUPS, ())] += 1
        if correction is not None:
            # A late search changed its successor's predecessor: the sink updates that row.
            out.diagnostic(
                scope.session_id,
                {
                    "kind": "search_correction",
                    "event_id": correction.event_id,
                    "session_id": scope.session_id,
                    "is_followup": correction.is_followup,
                    "prev_event_id": correction.prev_event_id,
                    "gap_seconds": correction.gap_seconds,
                },
            )
            if correction.is_followup:
                out.counts[(FOLLOWUPS, ())] += 1

    def failed(self, msg: InMessage, exc: BaseException) -> Output:
        """The output for a message whose processing raised: it is dead-lettered whole
        (``processing_error``), so the worker goes on and the message does not vanish."""
        out = Output()
        detail = (
            f"the worker failed on this message ({type(exc).__name__}: {exc}); it was not "
            "processed. This is a memdiag bug: report it with this payload"
        )
        self._dead_letter(msg, Rejected(0, PROCESSING_ERROR, detail, msg.value or b""), out)
        return out

    def _dead_letter(self, msg: InMessage, rejected: Rejected, out: Output) -> None:
        out.deadletters.append((msg.key, dead_letter_record(msg, rejected, self.settings)))
        out.counts[(DEAD_LETTERS, (("reason", rejected.reason),))] += 1

    # -- state housekeeping -------------------------------------------------------------

    def partitions_changed(self) -> None:
        """Forget the sweep index: after a rebalance it is rebuilt from the store."""
        self._index.clear()
        self._last_sweep.clear()

    def _partition_index(self, partition: int, store: StateStore) -> dict[str, int]:
        index = self._index.get(partition)
        if index is None:
            index = {}
            for session_id, raw in list(store.items()):
                try:
                    state = SessionState.loads(raw)
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue
                if state.partition == partition:
                    index[session_id] = state.newest_ts_us
            self._index[partition] = index
        return index

    def expired(self, partition: int) -> list[str]:
        """Sessions of ``partition`` idle past the retention, in event time; at most once a
        minute of event time. The caller deletes them (from the agent, so the tombstones go
        to this partition's changelog)."""
        watermark = self._watermark.get(partition)
        index = self._index.get(partition)
        if watermark is None or index is None:
            return []
        if watermark - self._last_sweep.get(partition, 0) < SWEEP_EVERY_US:
            return []
        self._last_sweep[partition] = watermark
        horizon = watermark - self._retention_us
        gone = [sid for sid, newest in index.items() if newest < horizon]
        for sid in gone:
            del index[sid]
        return gone


def dead_letter_id(topic: str, payload: bytes, prefix: str) -> str:
    """The identity of a dead letter: its source topic (without the prefix) and its bytes.

    A replay of the same bad input therefore lands on the same row.
    """
    base = topic[len(prefix) :] if topic.startswith(prefix) else topic
    return hashlib.sha256(base.encode() + b"\0" + payload).hexdigest()


def dead_letter_record(msg: InMessage, rejected: Rejected, settings: Settings) -> dict[str, Any]:
    limit = settings.deadletter_payload_bytes
    payload = rejected.payload
    return {
        "dead_letter_id": dead_letter_id(msg.topic, payload, settings.topic_prefix),
        "topic": msg.topic,
        "partition": msg.partition,
        "offset": msg.offset,
        "batch_index": rejected.index,
        "key": msg.key.decode("utf-8", "replace") if msg.key is not None else None,
        "reason": rejected.reason,
        "detail": rejected.detail,
        "payload": payload[:limit].decode("utf-8", "replace"),
        "payload_bytes": len(payload),
        "payload_truncated": len(payload) > limit,
        "ts": format_ts((msg.timestamp_ms or 0) * 1000),
    }
