"""The session stage: a batch of messages in, everything to send out. No Faust, no Kafka.

Input: ``events`` (every session-scoped event) and the internal ``session-verdicts`` topic
(the observation owners' answers), both keyed by ``session_id`` and co-partitioned, so one
worker owns partition p of both and of the state's changelog.

Per batch, each event is decoded and validated once, then applied to its
:class:`streams.session.Session`. Each touched session is written once, after the whole
batch, so a burst of events for one session costs one state write.

Partitioning. A session's state lives on the partition Kafka's default partitioner gives
its ``session_id``. An event that arrives on another partition (published without a key, or
in a batch keyed by something else) is re-routed to ``events`` keyed by its ``session_id``,
with its original Kafka timestamp, and applied when it arrives there. Re-routing reorders a
session; the rules work in event time, so it changes nothing.

Processing time. Forgetting a session is the one thing decided by time rather than by
events: ``MEMDIAG_SESSION_KEEP_HOURS`` after its last event, measured on its partition's
Kafka timestamps (capped by the wall clock), so a worker that was down and catches up does
not forget sessions whose events are still in its backlog, and a producer with a clock in
the future cannot age anybody. A forgotten session leaves a tombstone for
:data:`TOMBSTONE_FACTOR` times as long: an event for it is then dead-lettered as
``late_event`` and counted (``memdiag.late_event_total``) instead of starting a new,
wrong session.

State keys (one table shared with the other stages, apart by prefix):
``s:<session_id>`` the head (log tail, scopes, verdicts); ``c:<session_id>\\0<n>`` sealed log
chunks; ``z:<session_id>`` tombstones.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from memdiag.contract import (
    DEAD_LETTERS,
    LATE_EVENT,
    LATE_EVENTS,
    LATE_SESSION_FORGOTTEN,
    PROCESSING_ERROR,
)
from memdiag.settings import Settings
from schemas import SESSION_KINDS
from schemas.decode import Decoder, Rejected
from schemas.models import SessionEvent, format_ts
from streams.envelope import InMessage, Output, StateStore
from streams.session import Config, Session

log = logging.getLogger("memdiag.worker")

HEAD, CHUNK_PREFIX, TOMBSTONE = "s:", "c:", "z:"

#: A forgotten session's tombstone outlives it this many times MEMDIAG_SESSION_KEEP_HOURS.
TOMBSTONE_FACTOR = 7

#: How far a partition's processing clock must move between two sweeps, at most (ms).
SWEEP_EVERY_MS = 60_000


def chunk_key(session_id: str, index: int) -> str:
    return f"{CHUNK_PREFIX}{session_id}\0{index}"


class Clocks:
    """Per partition: the processing-time clock (newest Kafka timestamp, capped by the wall
    clock) and an index of what expires when, rebuilt from the store after a rebalance."""

    def __init__(self, sweep_every_ms: int = SWEEP_EVERY_MS) -> None:
        self.sweep_every_ms = sweep_every_ms
        self.now: dict[int, int] = {}
        self.expiry: dict[int, dict[str, int]] = {}  # partition -> key -> last seen (ms)
        self._last_sweep: dict[int, int] = {}

    def clear(self) -> None:
        self.expiry.clear()
        self._last_sweep.clear()

    def advance(self, partition: int, timestamp_ms: int | None, wall_ms: int) -> int:
        now = self.now.get(partition, 0)
        if timestamp_ms is not None and timestamp_ms > now:
            now = self.now[partition] = min(timestamp_ms, wall_ms)
        return now

    def due(self, partition: int) -> bool:
        now = self.now.get(partition, 0)
        if now - self._last_sweep.get(partition, 0) < self.sweep_every_ms:
            return False
        self._last_sweep[partition] = now
        return True


class Processor:
    """The session stage's logic; one per worker process."""

    #: Most decoded sessions kept in memory (the store holds them all).
    CACHE_SIZE = 50_000

    def __init__(
        self,
        settings: Settings,
        partition_of: Callable[[str], int],
        wall_ms: Callable[[], int] | None = None,
    ):
        self.settings = settings
        self._partition_of = partition_of
        self._decoder = Decoder(
            SESSION_KINDS, settings.topics.events, settings.max_event_bytes, settings.max_skew_us
        )
        self._verdicts_topic = settings.topics.session_verdicts
        self._config = Config(
            settings.followup_window_us,
            settings.retention_us,
            settings.turn_ttl_us,
            settings.store_text,
        )
        self._keep_ms = settings.keep_ms
        self._wall_ms = wall_ms or _wall_ms
        self._clocks = Clocks(min(SWEEP_EVERY_MS, max(1, self._keep_ms // 4)))
        # session_id -> (the head bytes last written, the session they encode). The store
        # hands back the very bytes object written, so identity proves the cache current;
        # after a rebalance or a recovery the bytes are new and the session is rebuilt.
        self._cache: dict[str, tuple[bytes, Session]] = {}

    def partitions_changed(self) -> None:
        """Forget the expiry index (rebuilt from the store) and the decoded sessions."""
        self._clocks.clear()
        self._cache.clear()

    # -- the hot path -----------------------------------------------------------------------

    def process(self, msgs: list[InMessage], store: StateStore) -> Output:
        out = Output()
        touched: dict[str, Session] = {}
        wall = self._wall_ms()
        try:
            for msg in msgs:
                self._clocks.advance(msg.partition, msg.timestamp_ms, wall)
                if msg.timestamp_ms is not None:
                    out.timestamp_ms = max(out.timestamp_ms or 0, msg.timestamp_ms)
                if msg.topic == self._verdicts_topic:
                    self._verdicts(msg, store, touched, out)
                else:
                    self._events(msg, store, touched, out)
            for session in touched.values():
                self._write(session, store)
            for partition in {m.partition for m in msgs}:
                self._sweep(partition, store, out)
        except BaseException:
            self._cache.clear()  # a session may have changed and not been written
            raise
        return out

    def _events(
        self, msg: InMessage, store: StateStore, touched: dict[str, Session], out: Output
    ) -> None:
        decoded = self._decoder.decode(msg.value, msg.timestamp_ms)
        for rejected in decoded.rejected:
            add_dead_letter(out, msg, rejected, self.settings)
        published_ms = msg.timestamp_ms or 0
        rerouted: dict[str, list[dict[str, Any]]] = {}
        for acc in decoded.accepted:
            event: SessionEvent = acc.event  # type: ignore[assignment]
            session_id = event.scope.session_id
            if self._partition_of(session_id) != msg.partition:
                rerouted.setdefault(session_id, []).append(acc.raw)
                continue
            session = touched.get(session_id) or self._load(session_id, msg.partition, store)
            if session is None:  # forgotten: the event is too late to be applied
                out.count(LATE_EVENTS, reason=LATE_SESSION_FORGOTTEN)
                add_dead_letter(out, msg, _late(acc.index, acc.raw, session_id), self.settings)
                continue
            touched[session_id] = session
            session.ingest(event, published_ms, out)
            session.last_seen_ms = max(session.last_seen_ms, self._clocks.now.get(msg.partition, 0))
            out.ts_us = max(out.ts_us, event.ts_us)
        for session_id, raws in rerouted.items():
            out.reroute.append((session_id, raws, msg.timestamp_ms))

    def _verdicts(
        self, msg: InMessage, store: StateStore, touched: dict[str, Session], out: Output
    ) -> None:
        for rec in _records(msg):
            session_id = rec["session_id"]
            session = touched.get(session_id) or self._load(
                session_id, msg.partition, store, create=False
            )
            if session is None:
                continue  # the session was forgotten: nothing left to correct
            touched[session_id] = session
            session.apply_verdict(
                rec["observation_id"],
                rec["outcome_event_id"],
                rec["misleading"],
                rec["version"],
                out,
            )

    # -- state --------------------------------------------------------------------------------

    def _load(
        self, session_id: str, partition: int, store: StateStore, create: bool = True
    ) -> Session | None:
        raw = store.get(HEAD + session_id)
        if raw is None:
            if not create or store.get(TOMBSTONE + session_id) is not None:
                return None
            return Session(session_id, partition, self._config)
        cached = self._cache.get(session_id)
        if cached is not None and cached[0] is raw:
            return cached[1]
        head = orjson.loads(raw)
        chunks = []
        for i in range(head["n"]):
            chunk = store.get(chunk_key(session_id, i))
            if chunk is None:
                raise RuntimeError(f"session {session_id}: log chunk {i} is missing")
            chunks.append(orjson.loads(chunk))
        return Session.restore(session_id, head, chunks, self._config)

    def _write(self, session: Session, store: StateStore) -> None:
        while (sealed := session.seal()) is not None:
            index, chunk = sealed
            store.put(chunk_key(session.session_id, index), orjson.dumps(chunk), session.partition)
        raw = orjson.dumps(session.header())
        store.put(HEAD + session.session_id, raw, session.partition)
        cache = self._cache
        if len(cache) >= self.CACHE_SIZE and session.session_id not in cache:
            cache.pop(next(iter(cache)))  # the oldest entry
        cache[session.session_id] = (raw, session)
        self._expiry(session.partition, store)[session.session_id] = session.last_seen_ms

    def _expiry(self, partition: int, store: StateStore) -> dict[str, int]:
        index = self._clocks.expiry.get(partition)
        if index is None:
            index = {}
            for key in store.keys():
                if key.startswith(HEAD):
                    raw = store.get(key)
                    if raw is None:
                        continue
                    head = orjson.loads(raw)
                    if head.get("p") == partition:
                        index[key[len(HEAD) :]] = head["l"]
                elif key.startswith(TOMBSTONE):
                    raw = store.get(key)
                    if raw is None:
                        continue
                    stone = orjson.loads(raw)
                    if stone[0] == partition:
                        index[key] = stone[1]
            self._clocks.expiry[partition] = index
        return index

    def _sweep(self, partition: int, store: StateStore, out: Output) -> None:
        """Forget the sessions of ``partition`` idle for MEMDIAG_SESSION_KEEP_HOURS of its
        processing time (leaving a tombstone), and the tombstones that have served."""
        if not self._clocks.due(partition):
            return
        now = self._clocks.now.get(partition, 0)
        index = self._expiry(partition, store)
        keep = self._keep_ms
        for key, last_seen in list(index.items()):
            if key.startswith(TOMBSTONE):
                if last_seen < now - keep * TOMBSTONE_FACTOR:
                    store.delete(key, partition)
                    del index[key]
                continue
            if last_seen >= now - keep:
                continue
            session = self._load(key, partition, store, create=False)
            del index[key]
            self._cache.pop(key, None)
            if session is None:
                continue
            session.flush_incomplete(out)
            for i in range(session.sealed // session.chunk):
                store.delete(chunk_key(key, i), partition)
            store.delete(HEAD + key, partition)
            store.put(TOMBSTONE + key, orjson.dumps([partition, now]), partition)
            index[TOMBSTONE + key] = now


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _records(msg: InMessage) -> list[dict[str, Any]]:
    """An internal message: one JSON array of records, written by memdiag itself."""
    doc = orjson.loads(msg.value or b"[]")
    if not isinstance(doc, list):
        raise ValueError("an internal message must be a JSON array")
    return doc


def _late(index: int, raw: dict[str, Any], session_id: str) -> Rejected:
    return Rejected(
        index,
        LATE_EVENT,
        f"session {session_id!r} was already forgotten (no event for "
        "MEMDIAG_SESSION_KEEP_HOURS of processing time) when this event arrived, so it was "
        "not applied. Raise MEMDIAG_SESSION_KEEP_HOURS, or re-publish the whole session "
        "under a new session_id",
        orjson.dumps(raw),
    )


def failed_output(msg: InMessage, exc: BaseException, settings: Settings) -> Output:
    """The output for a message whose processing raised: it is dead-lettered whole
    (``processing_error``), so the agent goes on and the message does not vanish."""
    out = Output()
    detail = (
        f"the worker failed on this message ({type(exc).__name__}: {exc}); it was not "
        "processed. This is a memdiag bug: report it with this payload"
    )
    add_dead_letter(out, msg, Rejected(0, PROCESSING_ERROR, detail, msg.value or b""), settings)
    return out


def add_dead_letter(out: Output, msg: InMessage, rejected: Rejected, settings: Settings) -> None:
    """Send ``rejected`` (from ``msg``) to the dead-letter topic, and count it."""
    out.deadletters.append((msg.key, dead_letter_record(msg, rejected, settings)))
    out.count(DEAD_LETTERS, reason=rejected.reason)


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
