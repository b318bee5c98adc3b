"""One session: its events in, its records out, the same whatever order the events came in.

Pure code: no Faust, no Kafka. The session stage (``memdiag.streams.stages.sessions``) loads a
:class:`Session` from the state store (``memdiag.streams.session.states``), feeds it new
events and the observation owners' verdicts, writes it back and sends what it emitted.

What is kept. A session's state is its **log** (:mod:`memdiag.streams.session.records`): a
compact record of every event applied, in arrival order (its ``seq``). Everything else (the
search history, the turns, the aggregate the diagnostic needs) is derived from the log in
memory, and rebuilt from it when the session is loaded.

Event time. Every rule here is a function of the session's events, not of their arrival
order (docs/rules.md):

- followups: :class:`memdiag.streams.rules.followup.SearchHistory` keeps searches in
  ``(ts, event_id)`` order and corrects a successor when a search lands before it;
- turns: :class:`memdiag.streams.rules.turns.Turn` judges every injection against the turn's
  first response in event time; turns from spans are :mod:`memdiag.streams.session.
  span_turns`;
- the diagnostic summarises all of the session's events, whatever their ``ts`` relative to
  the outcome, with the fields of its **last outcome in event time**. An event that arrives
  after the outcome corrects it, and the corrected diagnostic is sent again;
- injected ids (and graph ids) are in first-seen order *in event time*.

Ties. Events of the session with equal ``ts`` (the same microsecond) are taken in
``event_id`` order (byte order), never in arrival order: the followup predecessor, a turn's
first response, the first-seen order of ids and the last outcome all break ties so. An
unkeyed or re-routed producer's events do not arrive in the order they were published in.

The session's own clock is its newest ``ts``: it alone runs the turn TTL (counting unmatched
halves) and the search retention. Other sessions' timestamps never touch it.

Duplicates. An event whose ``event_id`` is in the log already (a producer's retry, a file
published twice) changes nothing and sends nothing. A crash is not this module's concern: the
worker's checkpoint (:mod:`memdiag.streams.checkpoint`) brings the session back as of the
committed offsets and the records after them come again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from memdiag.contract import (
    ACCEPTED,
    FOLLOWUPS,
    LATE_BEYOND_RETENTION,
    LATE_EVENTS,
    SEARCH_CALLS,
    SESSION_OUTCOMES,
    UNMATCHED_TURNS,
)
from memdiag.contract.envelope import CounterKey, Output, counter_key
from memdiag.schemas.models import Search, SessionEvent, written_ts
from memdiag.streams.rules.feedback import USED
from memdiag.streams.rules.followup import Remembered, SearchHistory, Verdict, query_key
from memdiag.streams.rules.turns import Change, Judged, Turn
from memdiag.streams.session.records import (
    InjectionRec,
    LogRecord,
    OutcomeRec,
    ResponseRec,
    SearchRec,
    SpanTurnRec,
    record_of,
    span_record_of,
)
from memdiag.streams.session.rows import (
    Scope,
    category_of,
    count_verdict,
    diagnostic_row,
    feedback_row,
    retracted_row,
    search_row,
)
from memdiag.streams.session.span_turns import SpanTurns

log = logging.getLogger("memdiag.worker")

#: The hot counters' keys, made once (a search's source is ``agent`` or ``viewer``)
#: what two events under one ``event_id`` may differ in and still be one event (see
#: :meth:`Session.differences`)
_NOT_COMPARED = frozenset({"published_ms", "revision", "vectors"})
#: a record's fields by the event fields they come from (the rest have the event's names)
_EVENT_FIELDS = {
    "query_key": "query",
    "scope": "agent_id/org_id/project_id",
    "entity_ids": "graph_entity_ids",
    "edges": "graph_edge_keys",
    "words": "text",
    "files": "files_modified",
    "helpful": "helpful_observation_ids",
}

_SEARCH_KEYS: dict[str, CounterKey] = {
    src: counter_key(SEARCH_CALLS, source=src) for src in ("agent", "viewer")
}
_FOLLOWUP_KEY = counter_key(FOLLOWUPS)

#: Where an id was first seen: (ts, event id, its position in that event)
FirstSeen = tuple[int, str, int]

#: The fewest records a sealed chunk of a session's log holds: a write rewrites the open
#: chunk (the head's tail), never the whole session, so a long session costs no more per
#: event than a short one. A session keeps the size it was first written with (``cs`` in its
#: head).
CHUNK = 8
#: The most records one sealed chunk holds. A write seals the whole tail once it holds
#: :data:`CHUNK` records, up to this many a chunk: a batch of 60 events of one session is
#: one chunk, not seven (each a changelog record, a store write and a read at every load).
CHUNK_MAX = 64


@dataclass(frozen=True, slots=True)
class Config:
    """The settings a session's rules read."""

    window_us: int
    retention_us: int
    turn_ttl_us: int
    store_text: bool = False
    #: MEMDIAG_DETECTOR=semantic: a text's rows (memdiag.semantic), kept in the log with
    #: each injected observation and each response (``remember``: an observation's content,
    #: which comes again; a response does not); None: the keyword rule alone
    embed: Callable[[str, bool], bytes] | None = None
    #: MEMDIAG_SIMILARITY_THRESHOLD under semantic; None under keyword
    similarity_threshold: float | None = None


@dataclass(slots=True)
class OwnerVerdict:
    """An observation owner's latest verdict on this session."""

    outcome_event_id: str
    misleading: bool
    version: int


def vector_bytes(rec: LogRecord) -> int:
    """The stored bytes of a record's vectors (an injection's or a response's; 0: none):
    the log is JSON, a vector's bytes base64 in quotes."""
    vectors = getattr(rec, "vectors", None)
    if vectors is None:
        return 0
    if isinstance(vectors, bytes):
        return 4 * ((len(vectors) + 2) // 3) + 2
    return sum(4 * ((len(v) + 2) // 3) + 2 for v in vectors)


class Session(SpanTurns):
    """A session's log and everything derived from it."""

    def __init__(self, session_id: str, partition: int, config: Config):
        self.session_id = session_id
        self.partition = partition
        self.config = config
        self.records: list[LogRecord] = []  # the log, in arrival order
        #: how much of the log is in sealed chunks of the store, in how many, and the fewest
        #: records a chunk seals (:mod:`memdiag.streams.session.states`)
        self.sealed = 0
        self.chunks = 0
        self.chunk = CHUNK
        self.chunk_bytes = 0  # the stored bytes of its sealed chunks (what its cache weighs)
        #: the stored bytes of the log's vectors (MEMDIAG_DETECTOR=semantic): held decoded
        #: as bytes (3/4 of their base64), so its cache weighs them once, not as objects
        self.vector_bytes = 0
        self.scopes: list[Scope] = []
        self._scope_index: dict[Scope, int] = {}
        self.last_seen_ms = 0  # processing time (Kafka timestamp) of the last event
        self.verdicts: dict[str, OwnerVerdict] = {}
        self._init_spans()
        self._reset()

    def _reset(self) -> None:
        """Everything derived from the log, as before its first record."""
        config = self.config
        self._seq_of: dict[str, int] = {}  # event id -> seq (its latest revision's)
        self._first_seq: dict[str, int] = {}  # event id -> seq of its first record
        self.clock = 0  # the session's newest ts
        self.history = SearchHistory(config.window_us, config.retention_us)
        self.empty_agent_searches = 0
        self.turns: dict[str, Turn] = {}
        self._pending_turns: set[str] = set()
        # first appearance in event time: id -> (ts, event id, position in its event)
        self._observations: dict[str, FirstSeen] = {}
        self._entities: dict[str, FirstSeen] = {}
        self._edges: dict[tuple[str, str, str], FirstSeen] = {}
        self._obs_turns: dict[str, list[int]] = {}  # id -> [evaluated turns, used turns]
        self.outcome_seq: int | None = None  # the last outcome in event time
        self._emitted: dict[str, Any] | None = None  # the diagnostic last sent
        self._reset_spans()

    # -- input ------------------------------------------------------------------------------

    def scope(self, agent_id: str | None, org_id: str | None, project_id: str | None) -> int:
        """The index of a scope in the session's scope table (added if new)."""
        key = (agent_id, org_id, project_id)
        index = self._scope_index.get(key)
        if index is None:
            index = self._scope_index[key] = len(self.scopes)
            self.scopes.append(key)
        return index

    def ingest(
        self, event: SessionEvent, published_ms: int, out: Output, revision: int = 0
    ) -> tuple[str, ...]:
        """Apply a validated event. An outcome's higher ``revision`` (memdiag's own amendment
        of an outcome from spans) takes the place of the one before. An event whose
        ``event_id`` the session holds already is not applied: it returns () if it is the
        same event (a redelivery, or published twice), and otherwise the fields in which it
        differs from the one taken (:meth:`differences`: the producer reused the id, and the
        stage dead-letters it)."""
        seq = self._seq_of.get(event.event_id)
        if seq is not None:
            known = self.records[seq]
            if not (isinstance(known, OutcomeRec) and revision > known.revision):
                return self.differences(known, event, revision)
        scope = self.scope(event.agent_id, event.org_id, event.project_id)
        rec = record_of(event, scope, published_ms, self.config.store_text, revision,
                        self.config.embed)  # fmt: skip
        self.records.append(rec)
        if self.config.embed is not None:
            self.vector_bytes += vector_bytes(rec)
        self._apply(rec, len(self.records) - 1, out)
        return ()

    def ingest_searches(
        self, events: list[Search], published_ms: int, out: Output
    ) -> tuple[list[tuple[int, tuple[str, ...]]], int]:
        """:meth:`ingest` of each search in turn, giving the same log, rows and counts, for a
        batch's run of one session's searches (``tests/unit/test_search_runs.py`` holds the
        two equal on every order of arrival: a change to :func:`record_of`'s search,
        :meth:`_apply` or :meth:`_search` must be made here too, and that test says where
        not). The usual search is taken in one loop, its counts added once for the run
        (:meth:`Output.add_at`): a new one, the session open, no turn waiting for its other
        half, and (if evaluated) within the retention and after every search the session
        remembers. Any other goes the general way (:meth:`ingest`, or :meth:`_search` once
        it is in the log). Returns ``(position, fields)`` of each search whose ``event_id``
        another event of the session took (:meth:`ingest`'s answer), and the newest time of
        the others (0: none)."""
        differing: list[tuple[int, tuple[str, ...]]] = []
        seq_of, first_seq, records = self._seq_of, self._first_seq, self.records
        history = self.history
        retention = self.config.retention_us
        store_text = self.config.store_text
        sid, scopes = self.session_id, self.scopes
        rows: list[dict[str, Any]] = []
        # the counts' event times, added once (Output.add_at)
        searched: dict[CounterKey, list[int]] = {key: [] for key in _SEARCH_KEYS.values()}
        followups: list[int] = []
        scope_of: Scope | None = None
        scope = 0
        newest = 0
        for pos, event in enumerate(events):
            eid = event.event_id
            source = event.source
            search_key = _SEARCH_KEYS.get(source)
            if (
                eid in seq_of
                or self._pending_turns
                or self.outcome_seq is not None
                or search_key is None
            ):
                if rows:  # the rows before it go first, whatever it sends
                    out.diagnostics.setdefault(sid, []).extend(rows)
                    rows = []
                differs = self.ingest(event, published_ms, out)
                if differs:
                    differing.append((pos, differs))
                elif event.ts_us > newest:
                    newest = event.ts_us
                continue
            ts = event.ts_us
            if ts > newest:
                newest = ts
            ids = event.result_ids
            evaluated = source == "agent" and len(ids) > 0
            where = (event.agent_id, event.org_id, event.project_id)
            if where != scope_of:
                scope, scope_of = self.scope(*where), where
            qkey = query_key(event.query)
            rec = SearchRec(eid, ts, source, qkey, ids if evaluated else len(ids), scope,
                            published_ms, event.query if store_text else None)  # fmt: skip
            # as _apply
            seq = len(records)
            records.append(rec)
            seq_of[eid] = seq
            first_seq.setdefault(eid, seq)
            if ts > self.clock:
                self.clock = ts
                history.prune(ts - retention)
            # as _search
            verdict = None
            if evaluated:
                if ts >= self.clock - retention:
                    verdict = history.observe_last(Remembered(ts, eid, qkey, ids))
                if verdict is None:  # late, or before a search remembered: corrects one
                    if rows:
                        out.diagnostics.setdefault(sid, []).extend(rows)
                        rows = []
                    self._search(rec, out)
                    continue
            elif source == "agent":
                self.empty_agent_searches += 1
            searched[search_key].append(ts)
            if verdict is not None and verdict.is_followup:
                followups.append(ts)
            rows.append(search_row(sid, rec, verdict, scopes[scope], written_ts(event.ts, ts)))
        if rows:
            out.diagnostics.setdefault(sid, []).extend(rows)
        for key, times in searched.items():
            out.add_at(key, times)
        out.add_at(_FOLLOWUP_KEY, followups)
        return differing, newest

    def differences(self, known: LogRecord, event: SessionEvent, revision: int) -> tuple[str, ...]:
        """The fields in which ``event`` differs from ``known``, the record the session took
        under its ``event_id``, compared as the session keeps them (its record: keywords and
        word sets, the query's key; never the publish time, a redelivery's own, nor the
        semantic detector's vectors, which are not computed again for a duplicate), where
        both carry a value (the query's text is kept only with MEMDIAG_STORE_TEXT=1, which
        may have changed since). A different kind is ``("kind",)``."""
        scope = self._scope_index.get((event.agent_id, event.org_id, event.project_id), -1)
        rec = record_of(event, scope, 0, self.config.store_text, revision)
        if type(rec) is not type(known):
            return ("kind",)
        differ = (
            _EVENT_FIELDS.get(name, name)
            for name in rec.__struct_fields__
            if name not in _NOT_COMPARED and _differ(getattr(rec, name), getattr(known, name))
        )
        return tuple(dict.fromkeys(differ))  # the query's key and its text: one "query"

    def ingest_span(self, d: dict[str, Any], scope: Scope, out: Output) -> None:
        """Apply a span retrieval or a span turn (``memdiag.streams.stages.traces``) unless
        it is a duplicate."""
        if d["id"] in self._seq_of:
            return
        rec = span_record_of(d, self.scope(*scope))
        self.records.append(rec)
        self.vector_bytes += vector_bytes(rec)
        self._apply(rec, len(self.records) - 1, out)

    def replay(self, records: list[LogRecord]) -> None:
        """Rebuild the derived state from a log read back from the store (sends nothing):
        its spans first (a turn's injection is made of every retrieval the log has), then
        every record in the order it came."""
        start = len(self.records)
        self.records.extend(records)
        self.vector_bytes += sum(map(vector_bytes, records))
        for seq in range(start, len(self.records)):
            self._know_span(self.records[seq], seq)
        self._spans_known = True
        try:
            for seq in range(start, len(self.records)):
                self._apply(self.records[seq], seq, None)
        finally:
            self._spans_known = False

    def apply_verdict(
        self, obs_id: str, outcome_event_id: str, misleading: bool, version: int, out: Output
    ) -> None:
        """An observation owner's verdict: is ``obs_id`` misleading once this session (with
        that outcome) is counted? The newest version of each owner's answer wins."""
        known = self.verdicts.get(obs_id)
        if known is not None and known.version > version:
            return
        self.verdicts[obs_id] = OwnerVerdict(outcome_event_id, misleading, version)
        self._send_diagnostic(out)

    # -- rules ------------------------------------------------------------------------------

    def _apply(self, rec: LogRecord, seq: int, out: Output | None) -> None:
        self._seq_of[rec.event_id] = seq
        self._first_seq.setdefault(rec.event_id, seq)
        # a span turn's clock is its end (its response)
        ts = rec.end if isinstance(rec, SpanTurnRec) else rec.ts
        if ts > self.clock:
            self.clock = ts
            self.history.prune(ts - self.config.retention_us)
        if isinstance(rec, SearchRec):
            self._search(rec, out)
        elif isinstance(rec, InjectionRec):
            self._injection(rec, out)
        elif isinstance(rec, ResponseRec):
            self._response(rec, out)
        elif isinstance(rec, OutcomeRec):
            self._outcome(rec, seq, out)
        else:
            self._span(rec, seq, out)
        if self._pending_turns:
            self._count_unmatched(out)

    def _search(self, rec: SearchRec, out: Output | None) -> None:
        ts = rec.ts
        verdicts: list[Verdict] = []
        late = False
        if not isinstance(rec.result_ids, int):  # evaluated
            if ts < self.clock - self.config.retention_us:
                late = True  # its predecessor may be forgotten: written, not judged
                self.history.evaluated += 1
            else:
                remembered = Remembered(ts, rec.event_id, rec.query_key, rec.result_ids)
                verdicts = self.history.observe(remembered)
        elif rec.source == "agent":
            self.empty_agent_searches += 1
        if out is None:
            return
        key = _SEARCH_KEYS.get(rec.source)
        if key is None:
            out.count(SEARCH_CALLS, at_us=ts, source=rec.source)
        else:
            out.add(key, 1, ts)
        if late:
            out.count(LATE_EVENTS, at_us=ts, reason=LATE_BEYOND_RETENTION)
        out.diagnostic(self.session_id, self._search_row(rec, verdicts[0] if verdicts else None))
        for v in verdicts:
            if v.is_followup:
                out.add(_FOLLOWUP_KEY, 1, ts)
        if len(verdicts) > 1:  # the successor's verdict changed: its row again, corrected
            successor = cast(SearchRec, self.records[self._seq_of[verdicts[1].event_id]])
            out.diagnostic(self.session_id, self._search_row(successor, verdicts[1]))
        if self.outcome_seq is not None:  # a closed session's counts changed
            self._send_diagnostic(out)

    def _injection(self, rec: InjectionRec, out: Output | None) -> None:
        ts, eid = rec.ts, rec.event_id
        turn = self._turn(rec.turn_id)
        vectors = rec.vectors or (None,) * len(rec.observations)
        changes = turn.add_injection(
            ts,
            eid,
            rec.scope,
            [(o, frozenset(k), v) for (o, k), v in zip(rec.observations, vectors, strict=True)],
        )
        new_obs = []
        for pos, (obs_id, _) in enumerate(rec.observations):
            first = self._observations.get(obs_id)
            if first is None:
                new_obs.append(obs_id)
            if first is None or (ts, eid, pos) < first:
                self._observations[obs_id] = (ts, eid, pos)
        new_graph = []
        for pos, entity in enumerate(rec.entity_ids):
            if _first_seen(self._entities, entity, (ts, eid, pos)):
                new_graph.append(entity_key(entity))
        for pos, edge in enumerate(rec.edges):
            if _first_seen(self._edges, tuple(edge), (ts, eid, pos)):
                new_graph.append(edge_key(*edge))
        self._turn_changed(rec.turn_id, turn, changes, out)
        if out is not None and self.outcome_seq is not None and new_obs:
            self._send_steps(new_obs, out)
        if out is not None and self.outcome_seq is not None and new_graph:
            self._send_steps(new_graph, out, graph=True)
        self._send_diagnostic(out)

    def _response(self, rec: ResponseRec, out: Output | None) -> None:
        turn = self._turn(rec.turn_id)
        changes = turn.add_response(
            rec.ts, rec.event_id, rec.scope, frozenset(rec.words), rec.vectors
        )
        self._turn_changed(rec.turn_id, turn, changes, out)
        self._send_diagnostic(out)

    def _outcome(self, rec: OutcomeRec, seq: int, out: Output | None) -> None:
        if self._first_seq[rec.event_id] != seq:  # a revision: in the place of the one before
            current = self.outcome_seq
            if current is not None and self.records[current].event_id == rec.event_id:
                self.outcome_seq = seq
                self._emitted = None
                self._send_diagnostic(out)
            return
        current = self.outcome_seq
        if current is not None and _order(self.records[current]) > _order(rec):
            # an earlier outcome, arriving late: the last one in event time stands
            if out is not None:
                self._count_outcome(rec, out)
            return
        self.outcome_seq = seq
        self._emitted = None
        if out is None:
            return
        self._count_outcome(rec, out)
        self._send_steps(list(self._observations), out)
        self._send_steps(self._graph_keys(), out, graph=True)
        self._send_diagnostic(out)

    def _count_outcome(self, rec: OutcomeRec, out: Output) -> None:
        """Each outcome event counts once, with its own category."""
        category = category_of(rec) if rec.outcome != ACCEPTED else ""
        out.count(SESSION_OUTCOMES, at_us=rec.ts, failure_category=category, outcome=rec.outcome)

    def _turn(self, turn_id: str) -> Turn:
        turn = self.turns.get(turn_id)
        if turn is None:
            turn = self.turns[turn_id] = Turn(self.config.similarity_threshold)
        return turn

    def _turn_changed(
        self, turn_id: str, turn: Turn, changes: list[Change], out: Output | None
    ) -> None:
        if turn.pending_half() is None:
            self._pending_turns.discard(turn_id)
        else:
            self._pending_turns.add(turn_id)
        for obs_id, before, now in changes:
            counts = self._obs_turns.setdefault(obs_id, [0, 0])
            if before is not None:
                counts[0] -= 1
                counts[1] -= before.feedback.signal == USED
            counts[0] += 1
            counts[1] += now.feedback.signal == USED
            if out is not None:
                self._verdict_changed(turn_id, obs_id, before, now, out)

    def _count_unmatched(self, out: Output | None) -> None:
        """Count (once) each half whose partner has not come within the turn TTL of the
        session's own clock. The half is kept: a partner that comes later still joins."""
        if not self._pending_turns:
            return
        horizon = self.clock - self.config.turn_ttl_us
        for turn_id in list(self._pending_turns):
            turn = self.turns[turn_id]
            half = turn.pending_half()
            if half is None or turn.counted:
                self._pending_turns.discard(turn_id)
                continue
            if turn.first_ts is not None and turn.first_ts < horizon:
                turn.counted = True
                self._pending_turns.discard(turn_id)
                if out is not None:
                    out.count(UNMATCHED_TURNS, at_us=self.clock, half=half)

    # -- the session diagnostic -------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.outcome_seq is not None

    def injected_observation_ids(self) -> list[str]:
        return _in_first_seen_order(self._observations)

    def _last_outcome(self) -> OutcomeRec:
        if self.outcome_seq is None:
            raise RuntimeError(f"session {self.session_id} has no outcome yet")
        return cast(OutcomeRec, self.records[self.outcome_seq])

    def diagnostic(self) -> dict[str, Any]:
        """The ``session_diagnostic`` of the session as it stands, with the misleading ids
        the owners have answered so far (see :meth:`complete`). Only for a closed one."""
        rec = self._last_outcome()
        observations = self.injected_observation_ids()
        misleading = []
        for obs_id in observations:
            v = self.verdicts.get(obs_id)
            if v is not None and v.outcome_event_id == rec.event_id and v.misleading:
                misleading.append(obs_id)
        ignored = [o for o in observations if (c := self._obs_turns.get(o)) and c[0] and not c[1]]
        return diagnostic_row(
            self.session_id,
            rec,
            self.scopes[rec.scope],
            observations,
            _in_first_seen_order(self._entities),
            _in_first_seen_order(self._edges),
            misleading,
            ignored,
            self.history.evaluated + self.empty_agent_searches,
            self.history.followups,
        )

    def complete(self) -> bool:
        """Whether every observation owner has answered for the current outcome. An accepted
        session, or one without observations, needs no answer: nothing of it can be
        misleading once it counts."""
        if self.outcome_seq is None:
            return False
        rec = self._last_outcome()
        if rec.outcome == ACCEPTED:
            return True
        for obs_id in self._observations:
            v = self.verdicts.get(obs_id)
            if v is None or v.outcome_event_id != rec.event_id:
                return False
        return True

    def _send_diagnostic(self, out: Output | None, force: bool = False) -> None:
        """Send the diagnostic if the session is closed, every verdict is in, and it differs
        from the one last sent (or ``force``: a rebuild re-sends it)."""
        if out is None or self.outcome_seq is None or not self.complete():
            return
        diagnostic = self.diagnostic()
        if force or diagnostic != self._emitted:
            self._emitted = diagnostic
            out.diagnostic(self.session_id, diagnostic)

    def flush_incomplete(self, out: Output) -> bool:
        """Send the diagnostic even though some verdict never came (the session is being
        forgotten): the missing ones count as not misleading. True if it sent one."""
        if self.outcome_seq is None or self.complete():
            return False
        log.warning(
            "session %s is forgotten with %d observation verdicts missing; its diagnostic is "
            "sent with them counted as not misleading",
            self.session_id,
            sum(1 for o in self._observations if o not in self.verdicts),
        )
        out.diagnostic(self.session_id, self.diagnostic())
        return True

    def _graph_keys(self) -> list[str]:
        """The graph entities and edges injected in the session, as their owners know them."""
        return [entity_key(e) for e in self._entities] + [edge_key(*e) for e in self._edges]

    def _send_steps(self, obs_ids: list[str], out: Output, graph: bool = False) -> None:
        """One step per observation (``graph``: per graph entity or edge key) for its owner:
        this session, with its last outcome (its ``ts`` and ``event_id`` say which of two
        outcomes is the newer; a revision of an outcome from spans is the same outcome)."""
        rec = self._last_outcome()
        for obs_id in obs_ids:
            out.step(
                obs_id,
                {
                    **({"type": "graph"} if graph else {}),
                    "observation_id": obs_id,
                    "session_id": self.session_id,
                    "outcome_event_id": rec.event_id,
                    "outcome": rec.outcome,
                    "ts_us": rec.ts,
                },
            )

    # -- rows -------------------------------------------------------------------------------

    def _search_row(self, rec: SearchRec, verdict: Verdict | None) -> dict[str, Any]:
        return search_row(self.session_id, rec, verdict, self.scopes[rec.scope])

    def _verdict_changed(
        self, turn_id: str, obs_id: str, before: Judged | None, now: Judged | None, out: Output
    ) -> None:
        """A verdict of the session changed from ``before`` (None: new) to ``now`` (None:
        taken back): its row, its counts, and its step for the observation's owner (its
        strength, :mod:`memdiag.streams.rules.strength`)."""
        sid = self.session_id
        if now is None:
            out.diagnostic(sid, retracted_row(sid, turn_id, obs_id))
        else:
            out.diagnostic(sid, self._feedback_row(turn_id, obs_id, now))
        count_verdict(out, before, now)
        # seq: the log's length, which only grows and a replay repeats: the owner ignores a
        # message older than one it applied (memdiag.streams.rules.strength, "Stale messages")
        step: dict[str, Any] = {"type": "verdict", "observation_id": obs_id, "session_id": sid,
                                "turn_id": turn_id, "used": None,
                                "seq": len(self.records)}  # fmt: skip
        if now is not None:
            step.update(used=now.feedback.signal == USED, ts_us=now.ts_us, tie=now.tie)
        elif before is not None:  # where the step taken back was: folded in, it is late
            step.update(was=[before.ts_us, before.tie])
        out.step(obs_id, step)

    def _feedback_row(self, turn_id: str, obs_id: str, judged: Judged) -> dict[str, Any]:
        scopes = self.scopes
        return feedback_row(self.session_id, turn_id, obs_id, judged, scopes[judged.scope],
                            scopes[judged.fallback_scope])  # fmt: skip


def _differ(a: Any, b: Any) -> bool:
    """Two values of a field, both carried, that differ."""
    return a is not None and b is not None and a != b


def _order(rec: LogRecord) -> tuple[int, str]:
    """An event's place in its session's event time: ``ts``, then ``event_id``."""
    return (rec.ts, rec.event_id)


def _first_seen(index: dict[Any, FirstSeen], key: Any, at: FirstSeen) -> bool:
    """Keep ``at`` if it is the key's first appearance in event time; True if the key is new."""
    first = index.get(key)
    if first is None or at < first:
        index[key] = at
    return first is None


def entity_key(entity_id: str) -> str:
    """A graph entity as ``graph_weights`` keys it (contract section 10)."""
    return f"entity:{entity_id}"


def edge_key(source: str, target: str, relationship: str) -> str:
    """A graph edge as ``graph_weights`` keys it: ``edge:SOURCE|TARGET|RELATIONSHIP`` (an
    edge field never holds ``|``: the injection schema refuses it)."""
    return f"edge:{source}|{target}|{relationship}"


def _in_first_seen_order(index: dict[Any, FirstSeen]) -> list[Any]:
    return sorted(index, key=index.__getitem__)
