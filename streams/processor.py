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
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from memdiag.settings import Settings
from schemas import SESSION_KINDS
from schemas.decode import Accepted, Decoder, Rejected
from schemas.models import (
    Injection,
    Response,
    Search,
    SessionEvent,
    SessionOutcome,
    format_ts,
)
from streams.diagnosis import ACCEPTED
from streams.followup import SearchHistory, Verdict, is_evaluated
from streams.session import SessionAggregate, draft_diagnostic
from streams.turns import Joined, Turns

# Counter names (CONTRACT section 4). Attributes are a sorted tuple of (name, value).
SEARCH_CALLS = "agentmemory.smart_search.calls_total"
FOLLOWUPS = "agentmemory.smart_search.followup_within_window_total"
DEAD_LETTERS = "memdiag.dead_letter_total"
FEEDBACK = "agentmemory.retrieval_feedback_total"
UNMATCHED_TURNS = "memdiag.unmatched_turn_total"
SESSION_OUTCOMES = "agentmemory.session_outcome_total"
MISLEADING = "agentmemory.misleading_observation_total"

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
    #: internal, keyed by observation id: a session outcome's step for each observation
    steps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: internal, keyed by session id: drafts and verdicts to gather into a diagnostic
    verdicts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: keyed by observation id: weight updates for the memory system (``weights`` topic)
    weights: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: keyed by counter name: messages for the ``counters`` topic besides the increments
    counter_messages: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    #: event time of the message (its newest event), for the counter increments; 0: unknown
    ts_us: int = 0

    def diagnostic(self, key: str, record: dict[str, Any]) -> None:
        self.diagnostics.setdefault(key, []).append(record)


class SessionState:
    """Everything the worker keeps per session, and its compact serialised form.

    ``closed`` is the session's last outcome (event id and the diagnostic it produced), kept
    so a redelivered outcome re-emits the same diagnostic and steps instead of nothing.
    """

    __slots__ = ("partition", "newest_ts_us", "searches", "turns", "agg", "closed")

    def __init__(
        self,
        partition: int,
        newest_ts_us: int,
        searches: SearchHistory,
        turns: Turns,
        agg: SessionAggregate,
        closed: list[Any] | None,
    ):
        self.partition = partition
        self.newest_ts_us = newest_ts_us
        self.searches = searches
        self.turns = turns
        self.agg = agg
        self.closed = closed

    @classmethod
    def new(cls, partition: int) -> SessionState:
        return cls(partition, 0, SearchHistory(), Turns(), SessionAggregate(), None)

    @classmethod
    def loads(cls, raw: bytes) -> SessionState:
        d = orjson.loads(raw)
        return cls(
            d["p"],
            d["t"],
            SearchHistory.from_state(d.get("s")),
            Turns.from_state(d.get("u")),
            SessionAggregate.from_state(d.get("a")),
            d.get("c"),
        )

    def dumps(self) -> bytes:
        d: dict[str, Any] = {"p": self.partition, "t": self.newest_ts_us}
        if len(self.searches):
            d["s"] = self.searches.to_state()
        if len(self.turns):
            d["u"] = self.turns.to_state()
        d["a"] = self.agg.to_state()
        if self.closed is not None:
            d["c"] = self.closed
        return orjson.dumps(d)

    def life_ends(self, retention_us: int, turn_ttl_us: int) -> int:
        """Event time after which the whole session is forgotten."""
        return self.newest_ts_us + (turn_ttl_us if self.closed is not None else retention_us)

    def deadline(self, retention_us: int, turn_ttl_us: int) -> int:
        """Event time at which something of this session expires (the sweep's clock).

        An open session lives ``retention`` past its newest event; a session that has had
        its outcome only ``turn_ttl`` (late halves of its last turns may still arrive).
        """
        deadline = self.life_ends(retention_us, turn_ttl_us)
        turns = self.turns.next_expiry(turn_ttl_us)
        return deadline if turns is None else min(deadline, turns)


StateStore = MutableMapping[str, bytes]


class PrefixedStore(MutableMapping[str, bytes]):
    """One namespace of a shared state store: keys are stored as ``prefix + key``.

    The worker's three stateful stages share one Faust table (and so one changelog): each
    extra table costs the worker a third of its end-to-end throughput on Tansu, and their
    source topics are co-partitioned anyway, so one table holds all three, apart by prefix.
    """

    __slots__ = ("_store", "_prefix")

    def __init__(self, store: MutableMapping[str, bytes], prefix: str):
        self._store = store
        self._prefix = prefix

    def __getitem__(self, key: str) -> bytes:
        return self._store[self._prefix + key]

    def get(self, key: str, default: Any = None) -> Any:
        return self._store.get(self._prefix + key, default)

    def __setitem__(self, key: str, value: bytes) -> None:
        self._store[self._prefix + key] = value

    def __delitem__(self, key: str) -> None:
        del self._store[self._prefix + key]

    def __iter__(self) -> Iterator[str]:
        n = len(self._prefix)
        return (k[n:] for k in list(self._store) if k.startswith(self._prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class ExpiryIndex:
    """Per partition: key -> event time at which it expires, and the partition's event-time
    clock (its newest ``ts``). Rebuilt from the store after a rebalance; the sweep visits
    it at most once per :data:`SWEEP_EVERY_US` of event time."""

    def __init__(self) -> None:
        self.deadlines: dict[int, dict[str, int]] = {}
        self.watermark: dict[int, int] = {}
        self._last_sweep: dict[int, int] = {}

    def clear(self) -> None:
        self.deadlines.clear()
        self._last_sweep.clear()

    def advance(self, partition: int, ts_us: int) -> None:
        if ts_us > self.watermark.get(partition, 0):
            self.watermark[partition] = ts_us

    def sweep(self, partition: int) -> tuple[list[str], dict[str, int], int] | None:
        """What a due sweep of ``partition`` visits: (keys, their index, the watermark)."""
        due = self.due(partition)
        if not due:
            return None
        return due, self.deadlines[partition], self.watermark[partition]

    def due(self, partition: int) -> list[str]:
        """Keys of ``partition`` whose deadline has passed, if a sweep is due."""
        watermark = self.watermark.get(partition)
        index = self.deadlines.get(partition)
        if watermark is None or index is None:
            return []
        if watermark - self._last_sweep.get(partition, 0) < SWEEP_EVERY_US:
            return []
        self._last_sweep[partition] = watermark
        return [key for key, deadline in index.items() if deadline <= watermark]


class Processor:
    """The worker's logic for ``memdiag.events``; one per worker process."""

    def __init__(self, settings: Settings, partition_of: Callable[[str], int]):
        self.settings = settings
        self._partition_of = partition_of
        self._decoder = Decoder(SESSION_KINDS, settings.topics.events, settings.max_event_bytes)
        self._window_us = settings.followup_window_us
        self._retention_us = settings.retention_us
        self._turn_ttl_us = settings.turn_ttl_us
        self._store_text = settings.store_text
        self._expiry = ExpiryIndex()
        # session_id -> (the bytes last written to the store, the state they encode).
        # Decoding a long session's state on every event is the worker's biggest cost; the
        # store hands back the very bytes object we wrote, so identity proves the cached
        # state is current. After a rebalance or a recovery the bytes are new: decoded anew.
        self._cache: dict[str, tuple[bytes, SessionState]] = {}

    #: Most decoded session states kept in memory.
    CACHE_SIZE = 50_000

    # -- the hot path -------------------------------------------------------------------

    def process(self, msg: InMessage, store: StateStore) -> Output:
        out = Output()
        decoded = self._decoder.decode(msg.value)
        for rejected in decoded.rejected:
            self._dead_letter(msg, rejected, out)
        try:
            if decoded.accepted:
                self._apply(msg, decoded.accepted, store, out)
            self._sweep(msg.partition, store, out)
        except BaseException:
            self._cache.clear()  # a state may have been changed and not written
            raise
        return out

    def _load(self, session_id: str, raw: bytes | None, partition: int) -> SessionState:
        if raw is None:
            return SessionState.new(partition)
        cached = self._cache.get(session_id)
        if cached is not None and cached[0] is raw:
            return cached[1]
        return SessionState.loads(raw)

    def _store(self, session_id: str, state: SessionState, store: StateStore) -> None:
        raw = state.dumps()
        store[session_id] = raw
        if len(self._cache) >= self.CACHE_SIZE and session_id not in self._cache:
            self._cache.pop(next(iter(self._cache)))  # the oldest entry
        self._cache[session_id] = (raw, state)

    def _apply(
        self, msg: InMessage, accepted_events: list[Accepted], store: StateStore, out: Output
    ) -> None:
        by_session: dict[str, list[Accepted]] = {}
        for acc in accepted_events:
            by_session.setdefault(acc.event.session_id, []).append(acc)  # type: ignore[union-attr]
        index = self._partition_index(msg.partition, store)
        horizon = self._expiry.watermark.get(msg.partition, 0)
        published_at = format_ts((msg.timestamp_ms or 0) * 1000)
        for session_id, accepted in by_session.items():
            if self._partition_of(session_id) != msg.partition:
                out.reroute[session_id] = [a.raw for a in accepted]
                continue
            state = self._load(session_id, store.get(session_id), msg.partition)
            self._expire_turns(state, horizon, out)
            for acc in accepted:
                event: SessionEvent = acc.event  # type: ignore[assignment]
                if event.ts_us > state.newest_ts_us:
                    state.newest_ts_us = event.ts_us
                if isinstance(event, Search):
                    self._search(event, state, out, published_at)
                elif isinstance(event, Injection):
                    self._injection(event, state, out)
                elif isinstance(event, Response):
                    self._response(event, state, out)
                elif isinstance(event, SessionOutcome):
                    self._outcome(event, state, out)
            self._store(session_id, state, store)
            index[session_id] = state.deadline(self._retention_us, self._turn_ttl_us)
            self._expiry.advance(msg.partition, state.newest_ts_us)
        out.ts_us = max((a.event.ts_us for a in accepted_events), default=0)

    def _search(self, event: Search, state: SessionState, out: Output, published_at: str) -> None:
        out.counts[(SEARCH_CALLS, (("source", event.source),))] += 1
        verdict: Verdict | None = None
        correction: Verdict | None = None
        if event.source == "agent" and not event.result_ids:
            state.agg.empty_search(event.event_id)
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

    def _injection(self, event: Injection, state: SessionState, out: Output) -> None:
        observations = [(o.id, o.content) for o in event.observations]
        first = state.agg.first_time(event.event_id)
        if first:
            state.agg.injection(
                [o.id for o in event.observations],
                event.graph_entity_ids,
                [(e.source_id, e.target_id, e.relationship) for e in event.graph_edge_keys],
            )
        joined = state.turns.add_injection(event.event_id, event.ts_us, event.turn_id, observations)
        if joined.late_observations and first:
            out.counts[(UNMATCHED_TURNS, (("half", "injection"),))] += 1
        self._feedback(event, joined, first, state, out)

    def _response(self, event: Response, state: SessionState, out: Output) -> None:
        first = state.agg.first_time(event.event_id)
        joined = state.turns.add_response(event.event_id, event.ts_us, event.turn_id, event.text)
        self._feedback(event, joined, first, state, out)

    def _feedback(
        self,
        event: Injection | Response,
        joined: Joined,
        first: bool,
        state: SessionState,
        out: Output,
    ) -> None:
        """Send the turn's verdicts; fold them into the session (and count them) only the
        first time: a redelivered or replayed half re-sends the same records."""
        scope = event.scope
        for fb in joined.feedback:
            out.diagnostic(
                scope.session_id,
                {
                    "kind": "retrieval_feedback",
                    "session_id": scope.session_id,
                    "turn_id": fb.turn_id,
                    "observation_id": fb.observation_id,
                    "signal": fb.feedback.signal,
                    "match_ratio": fb.feedback.match_ratio,
                    "keyword_count": fb.feedback.keyword_count,
                    "matched_count": fb.feedback.matched_count,
                    "ts": format_ts(fb.ts_us),
                    "agent_id": scope.agent_id,
                    "org_id": scope.org_id,
                    "project_id": scope.project_id,
                },
            )
            if joined.fresh and first:
                state.agg.feedback(fb.observation_id, fb.feedback.signal == "used")
                out.counts[(FEEDBACK, (("signal", fb.feedback.signal),))] += 1

    def _outcome(self, event: SessionOutcome, state: SessionState, out: Output) -> None:
        if not state.agg.first_time(event.event_id):
            # Redelivered: re-send what it produced (the sink and the observation owners
            # recognise it), so a crash between the state write and the sends loses nothing.
            if state.closed is not None and state.closed[0] == event.event_id:
                self._emit_outcome(state.closed[1], event.ts_us, out)
            return
        draft = draft_diagnostic(state.agg, state.searches, event)
        state.closed = [event.event_id, draft]
        attrs = (("failure_category", draft["failure_category"] or ""), ("outcome", event.outcome))
        out.counts[(SESSION_OUTCOMES, attrs)] += 1
        self._emit_outcome(draft, event.ts_us, out)

    def _emit_outcome(self, draft: dict[str, Any], ts_us: int, out: Output) -> None:
        """The diagnostic itself, or (for a failed session with observations) the draft to
        gather and one step per observation for its owner."""
        session_id = draft["session_id"]
        observation_ids = draft["injected_observation_ids"]
        for obs_id in observation_ids:
            out.steps.setdefault(obs_id, []).append(
                {
                    "observation_id": obs_id,
                    "session_id": session_id,
                    "outcome_event_id": draft["event_id"],
                    "outcome": draft["outcome"],
                    "ts_us": ts_us,
                }
            )
        if draft["outcome"] == ACCEPTED or not observation_ids:
            # nothing of it can be misleading after an accepted session counts
            out.diagnostic(session_id, draft)
        else:
            out.verdicts.setdefault(session_id, []).append(
                {
                    "kind": "draft",
                    "session_id": session_id,
                    "outcome_event_id": draft["event_id"],
                    "ts_us": ts_us,
                    "draft": draft,
                }
            )

    def _dead_letter(self, msg: InMessage, rejected: Rejected, out: Output) -> None:
        add_dead_letter(out, msg, rejected, self.settings)

    # -- state housekeeping -------------------------------------------------------------

    def _expire_turns(self, state: SessionState, horizon_us: int, out: Output) -> None:
        for _, half in state.turns.expire(horizon_us, self._turn_ttl_us):
            out.counts[(UNMATCHED_TURNS, (("half", half),))] += 1

    def partitions_changed(self) -> None:
        """Forget the sweep index (rebuilt from the store) and the decoded states."""
        self._expiry.clear()
        self._cache.clear()

    def _partition_index(self, partition: int, store: StateStore) -> dict[str, int]:
        index = self._expiry.deadlines.get(partition)
        if index is None:
            index = {}
            for session_id, raw in list(store.items()):
                try:
                    state = SessionState.loads(raw)
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue
                if state.partition == partition:
                    index[session_id] = state.deadline(self._retention_us, self._turn_ttl_us)
            self._expiry.deadlines[partition] = index
        return index

    def _sweep(self, partition: int, store: StateStore, out: Output) -> None:
        """Expire what is due on ``partition``, in event time: unmatched turn halves
        (counted), and whole sessions idle past their life. Runs inside the agent, so the
        writes and tombstones go to this partition's changelog."""
        sweep = self._expiry.sweep(partition)
        if sweep is None:
            return
        due, index, watermark = sweep
        for session_id in due:
            raw = store.get(session_id)
            if raw is None:
                index.pop(session_id, None)
                continue
            state = self._load(session_id, raw, partition)
            self._expire_turns(state, watermark, out)
            if state.life_ends(self._retention_us, self._turn_ttl_us) <= watermark:
                del store[session_id]
                index.pop(session_id, None)
                self._cache.pop(session_id, None)
            else:
                self._store(session_id, state, store)
                index[session_id] = state.deadline(self._retention_us, self._turn_ttl_us)


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
    out.counts[(DEAD_LETTERS, (("reason", rejected.reason),))] += 1


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
