"""The session stage: a batch of messages in, everything to send out. No Faust, no Kafka.

Input: ``events`` (every session-scoped event) and the internal ``session-verdicts`` topic
(the observation owners' answers), both keyed by ``session_id`` and co-partitioned, so one
worker owns partition p of both and of the state's changelog.

Per batch, each event is decoded and validated once, then applied to its
:class:`memdiag.streams.session.session.Session`; a message's consecutive searches of one
session (a producer's batch) are applied in one call
(:meth:`memdiag.streams.session.session.Session.ingest_searches`). A session the stage
changed is held in memory, unwritten, until the runner settles the stage before its next commit
(:meth:`SessionStage.settle`): then it is written once, so a session's events within one
checkpoint (a second of single events, or a burst) cost one state write, as Quix Streams'
transactions write each key once a commit. The store is only ever read for a session the
stage does not hold. What it holds is written earlier when it holds
:attr:`SessionStage.HOLD_MAX` sessions after a batch, and once it has decoded
:attr:`SessionStage.WRITE_BACK_AT` sessions from the store since it last wrote (the decoded
cache did not hold them): held sessions are outside the decoded-state budget
(``MEMDIAG_DECODED_CACHE_MB``) until they are written, and a thousand events of a thousand
interleaved sessions held 30-40 MB beside it (``benchmarks/memory_live.py``). Their bytes
count toward ``MEMDIAG_COMMIT_BYTES`` (about: the bytes of the events applied to them).
A failed checkpoint drops what the stage holds with the rest of its state (:meth:`reset`).
Writing a session twice in a checkpoint gives the same state as writing it once (the store
keeps the last), and the same rows: a session written back, evicted and read again may send
its unchanged session diagnostic once more, which the sink's upsert keeps once.

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
``TOMBSTONE_FACTOR`` times as long: an event for it is then dead-lettered as ``late_event``
and counted (``memdiag.late_event_total``) instead of starting a new, wrong session.

The sessions' keys in the state store, their cache and their forgetting are
:mod:`memdiag.streams.session.states`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

import msgspec
import orjson

from memdiag.contract import (
    LATE_EVENT,
    LATE_EVENTS,
    LATE_SESSION_FORGOTTEN,
    REUSED_EVENT_ID,
)
from memdiag.contract.envelope import InMessage, Output, StateStore
from memdiag.contract.words import SEMANTIC
from memdiag.schemas import SESSION_KINDS
from memdiag.schemas.deadletters import add_dead_letter, digest
from memdiag.schemas.decode import Accepted, Decoder, Rejected
from memdiag.schemas.models import Search, SessionEvent, SessionOutcome, from_dict
from memdiag.semantic import embedder
from memdiag.settings import Settings
from memdiag.streams.lru import shared_budget
from memdiag.streams.session.session import Config, Session
from memdiag.streams.session.states import SessionStates


def semantic_embedder(settings: Settings) -> Callable[[str, bool], bytes]:
    """The similarity model's embedder (MEMDIAG_DETECTOR=semantic), its memories' rows kept
    in the worker's one byte budget of decoded state (``MEMDIAG_DECODED_CACHE_MB``), each
    weighing its bytes: the session stage's and the span stage's."""
    budget = shared_budget(settings.decoded_cache_mb << 20)
    return embedder(cache=budget.cache("memory rows"))


class HeldStateLost(RuntimeError):
    """The stage cannot settle: a batch raised, and the sessions it held are gone."""


class SessionStage:
    """The session stage's logic; one per worker process."""

    #: sessions the stage decodes from the store (the cache did not hold them) at most before
    #: it writes back what it holds (see the module docstring); written, they are in the
    #: budgeted cache like every other. A cached or new session costs little more held, and
    #: a session written back and touched again is written again: at 128, where the cache
    #: holds too few of the live sessions, that was a third more CPU per event
    WRITE_BACK_AT = 512
    #: sessions held unwritten at most at the end of a batch (see the module docstring)
    HOLD_MAX = 2048

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
        self._spans_topic = settings.topics.span_events
        self._config = Config(
            settings.followup_window_us,
            settings.retention_us,
            settings.turn_ttl_us,
            settings.store_text,
            semantic_embedder(settings) if settings.detector == SEMANTIC else None,
            settings.similarity_threshold if settings.detector == SEMANTIC else None,
        )
        self._wall_ms = wall_ms or _wall_ms
        self.states = SessionStates(self._config, settings.keep_ms, settings.session_cache,
                                    settings.decoded_cache_mb << 20)  # fmt: skip
        #: the sessions changed since they were last written, held until the checkpoint
        #: commits (:meth:`settle`)
        self._held: dict[str, Session] = {}
        self.held_bytes = 0
        self._decoded_at = 0
        self._lost = False

    def reset(self) -> None:
        """Forget the expiry index (rebuilt from the store), the decoded sessions and the
        sessions held unwritten (the checkpoint they belonged to is gone)."""
        self._forget_held()
        self._lost = False
        self.states.clear()

    # -- the hot path -----------------------------------------------------------------------

    def process(self, msgs: list[InMessage], store: StateStore) -> Output:
        out = Output()
        touched = self._held
        wall = self._wall_ms()
        states = self.states
        try:
            for msg in msgs:
                # what a held session grows by, about: the events' bytes
                self.held_bytes += len(msg.value or b"")
                states.clocks.advance(msg.partition, msg.timestamp_ms, wall, store)
                if msg.timestamp_ms is not None:
                    out.timestamp_ms = max(out.timestamp_ms or 0, msg.timestamp_ms)
                if msg.topic == self._verdicts_topic:
                    self._verdicts(msg, store, touched, out)
                elif msg.topic == self._spans_topic:
                    self._span_events(msg, store, touched, out)
                else:
                    self._events(msg, store, touched, out)
                if states.clocks.due(msg.partition):
                    # right after the record whose time makes it due, as if each record were
                    # a batch of its own: where a batch ends decides nothing
                    decoded = states.decoded
                    states.sweep(msg.partition, store, out, touched)
                    self._decoded_at += states.decoded - decoded  # the sweep's are not held
            if len(touched) >= self.HOLD_MAX:
                self._write_back(touched, store)
        except BaseException:
            # a held session may be half changed: every one goes, and with them the changes
            # of this checkpoint's earlier batches, so the checkpoint must not commit; the
            # expiry index too (it has the held sessions' times), rebuilt from the store
            self._forget_held()
            self.states.clear()
            self._lost = True
            raise
        return out

    def settle(self, store: StateStore) -> None:
        """Write every session held since the last write: the runner calls it before each
        commit, with the checkpoint's store. :class:`HeldStateLost` if a batch raised since
        the stage was last reset (what it held is gone: the checkpoint must be rolled back,
        which the runner does when a stage raises; this guards any other way out)."""
        if self._lost:
            raise HeldStateLost("a batch raised and the sessions it held are gone")
        self._write_back(self._held, store)

    def _forget_held(self) -> None:
        self._held.clear()
        self.held_bytes = 0
        self._decoded_at = self.states.decoded
        self.states.forget_decoded()

    def _write_back(self, touched: dict[str, Session], store: StateStore) -> None:
        for session in touched.values():
            self.states.write(session, store)
        touched.clear()
        self.states.clocks.save(store)  # the clocks the held sessions' records moved
        self.held_bytes = 0
        self._decoded_at = self.states.decoded

    def _touch(
        self, session_id: str, partition: int, store: StateStore, touched: dict[str, Session]
    ) -> Session | None:
        """The session an event applies to, held in ``touched`` until it is written (None:
        forgotten). Once :attr:`WRITE_BACK_AT` sessions were decoded from the store since
        the last write, what is held is written back first."""
        session = touched.get(session_id)
        if session is not None:
            return session
        if self.states.decoded - self._decoded_at >= self.WRITE_BACK_AT:
            self._write_back(touched, store)
        session = self.states.load(session_id, partition, store)
        if session is not None:
            touched[session_id] = session
        return session

    def _events(
        self, msg: InMessage, store: StateStore, touched: dict[str, Session], out: Output
    ) -> None:
        decoded = self._decoder.decode(msg.value, msg.timestamp_ms)
        for rejected in decoded.rejected:
            add_dead_letter(out, msg, rejected, self.settings)
        published_ms = msg.timestamp_ms or 0
        rerouted: dict[str, list[Any]] = {}
        now_ms = self.states.clocks.now.get(msg.partition, 0)
        # a run of one session's searches, in the message's order, is taken in one call
        # (Session.ingest_searches): a batch of a session's searches is the usual message
        run: list[Accepted] = []
        run_session: Session | None = None
        for acc in decoded.accepted:
            event: SessionEvent = acc.event  # type: ignore[assignment]
            session_id = event.session_id
            if run_session is not None:
                if session_id == run_session.session_id and type(event) is Search:
                    run.append(acc)
                    continue
                self._run(run_session, run, msg, published_ms, now_ms, out)
                run_session, run = None, []
            if self._partition_of(session_id) != msg.partition:
                rerouted.setdefault(session_id, []).append(acc.reroutable())
                continue
            session = self._touch(session_id, msg.partition, store, touched)
            if session is None:  # forgotten: the event is too late to be applied
                out.count(LATE_EVENTS, reason=LATE_SESSION_FORGOTTEN)
                late = Rejected(acc.index, LATE_EVENT, _LATE_DETAIL.format(session_id=session_id),
                                acc.payload)  # fmt: skip
                # its identity is the event's: a rerouted event's message offset is new on
                # every replay, its event_id is not
                identity = ("event", event.event_id)
                add_dead_letter(out, msg, late, self.settings, identity=identity)
                continue
            if type(event) is Search:
                run_session, run = session, [acc]
                continue
            differs = session.ingest(event, published_ms, out)
            if differs:
                self._reused(msg, acc, session_id, differs, out)
                continue
            self._applied(session, event.ts_us, now_ms, out)
        if run_session is not None:
            self._run(run_session, run, msg, published_ms, now_ms, out)
        for session_id, raws in rerouted.items():
            out.reroute.append((session_id, raws, msg.timestamp_ms))

    def _run(self, session: Session, run: list[Accepted], msg: InMessage, published_ms: int,
             now_ms: int, out: Output) -> None:  # fmt: skip
        """A run of one session's searches (:meth:`_events`); a run of one (a message of one
        event) goes through ``ingest``, which has nothing to set up for a run."""
        if len(run) == 1:
            acc = run[0]
            event = cast(Search, acc.event)
            differs = session.ingest(event, published_ms, out)
            if differs:
                self._reused(msg, acc, session.session_id, differs, out)
            else:
                self._applied(session, event.ts_us, now_ms, out)
            return
        events = cast(list[Search], [acc.event for acc in run])
        differing, newest = session.ingest_searches(events, published_ms, out)
        for pos, differs in differing:
            self._reused(msg, run[pos], session.session_id, differs, out)
        if len(differing) < len(run):
            self._applied(session, newest, now_ms, out)

    def _applied(self, session: Session, ts_us: int, now_ms: int, out: Output) -> None:
        """An event of ``session`` at ``ts_us`` was applied (or was one it had)."""
        if now_ms > session.last_seen_ms:
            session.last_seen_ms = now_ms
        if ts_us > out.ts_us:
            out.ts_us = ts_us

    def _reused(self, msg: InMessage, acc: Accepted, session_id: str, differs: tuple[str, ...],
                out: Output) -> None:  # fmt: skip
        """Another event under an id the session took: not applied, dead-lettered."""
        event: SessionEvent = acc.event  # type: ignore[assignment]
        detail = _reused_detail(event, session_id, differs)
        reused = Rejected(acc.index, REUSED_EVENT_ID, detail, acc.payload)
        # one row per reusing event, whatever message (a replayed re-route's offset is new)
        # brought it
        where = ("event", event.event_id, digest(acc.payload))
        add_dead_letter(out, msg, reused, self.settings, identity=where)

    def _span_events(
        self, msg: InMessage, store: StateStore, touched: dict[str, Session], out: Output
    ) -> None:
        """What the trace stage says of one session (memdiag.streams.stages.traces): searches and
        outcomes (events it has validated; an outcome may be a revision), span retrievals and
        span turns."""
        published_ms = msg.timestamp_ms or 0
        for rec in _records(msg):
            session_id = rec["session_id"]
            session = self._touch(session_id, msg.partition, store, touched)
            identity = rec.get("event_id") or rec["id"]
            if session is None:  # forgotten: too late to be applied
                out.count(LATE_EVENTS, reason=LATE_SESSION_FORGOTTEN)
                late = Rejected(0, LATE_EVENT, _LATE_DETAIL.format(session_id=session_id),
                                orjson.dumps(rec))  # fmt: skip
                add_dead_letter(out, msg, late, self.settings, identity=("event", identity))
                continue
            if rec["kind"] in ("span_retrieval", "span_turn"):
                scope = (rec.get("agent_id"), rec.get("org_id"), rec.get("project_id"))
                session.ingest_span(rec, scope, out)
                ts_us = rec.get("end", rec["ts"])
            else:  # a search or an outcome the trace stage made and validated
                event = _from_spans(rec)
                # memdiag's own record: one sent again is a redelivery, whatever it says
                session.ingest(event, published_ms, out, rec.get("revision", 0))
                ts_us = event.ts_us
            session.last_seen_ms = max(
                session.last_seen_ms, self.states.clocks.now.get(msg.partition, 0)
            )
            out.ts_us = max(out.ts_us, ts_us)

    def _verdicts(
        self, msg: InMessage, store: StateStore, touched: dict[str, Session], out: Output
    ) -> None:
        for rec in _records(msg):
            session_id = rec["session_id"]
            # A verdict can come before the session's outcome: after a failed checkpoint the
            # session's events are taken again, and the verdicts its first pass caused may be
            # read first. It is kept; the outcome it names completes the session when it comes.
            session = self._touch(session_id, msg.partition, store, touched)
            if session is None:
                continue  # the session was forgotten: nothing left to correct
            session.last_seen_ms = max(
                session.last_seen_ms, self.states.clocks.now.get(msg.partition, 0)
            )
            session.apply_verdict(
                rec["observation_id"],
                rec["outcome_event_id"],
                rec["misleading"],
                rec["version"],
                out,
            )


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _records(msg: InMessage) -> list[dict[str, Any]]:
    """An internal message: one JSON array of records, written by memdiag itself."""
    doc = orjson.loads(msg.value or b"[]")
    if not isinstance(doc, list):
        raise ValueError("an internal message must be a JSON array")
    return doc


_LATE_DETAIL = (
    "session {session_id!r} was already forgotten (no event for MEMDIAG_SESSION_KEEP_HOURS of "
    "processing time) when this event arrived, so it was not applied. Raise "
    "MEMDIAG_SESSION_KEEP_HOURS, or re-publish the whole session under a new session_id"
)


def _reused_detail(event: SessionEvent, session_id: str, differs: tuple[str, ...]) -> str:
    if differs == ("kind",):
        other = "an event of another kind"
    else:
        other = f"another {event.kind} event, which differs in {', '.join(differs)}"
    return (
        f"event_id {event.event_id!r} was already taken in session {session_id!r} by {other}; "
        "this one was not applied (the event taken first stays). event_id is the idempotency "
        "key: give every distinct event its own"
    )


def _from_spans(rec: dict[str, Any]) -> SessionEvent:
    """A search or an outcome the trace stage made (and validated). An outcome from spans
    that name no file has no ``files_modified``: it cannot know its files."""
    if rec["kind"] == "session_outcome" and "files_modified" not in rec:
        outcome = cast(SessionOutcome, from_dict({**rec, "files_modified": []}))
        return msgspec.structs.replace(outcome, files_modified=None)
    return cast(SessionEvent, from_dict(rec))
