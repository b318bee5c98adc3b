"""One session: its events in, its records out, the same whatever order the events came in.

Pure code: no Faust, no Kafka. The session stage (``memdiag.streams.processor``) loads a
:class:`Session` from the state store, feeds it new events and the observation owners'
verdicts, writes it back and sends what it emitted.

What is kept. A session's state is its **log**: a compact record of every event applied,
in arrival order (its ``seq``). Everything else (the search history, the turns, the
aggregate the diagnostic needs) is derived from the log in memory, and rebuilt from it after
a restart or a rebalance. The log is what goes to the changelog, in chunks of
:data:`CHUNK` records: a write rewrites only the open chunk, never the whole session, so a
long session costs no more per event than a short one.

Event time. Every rule here is a function of the session's events, not of their arrival
order (docs/rules.md):

- followups: :class:`memdiag.streams.followup.SearchHistory` keeps searches in ``(ts, seq)`` order
  and corrects a successor when a search lands before it;
- turns: :class:`memdiag.streams.turns.Turn` judges every injection against the turn's first
  response in event time;
- the diagnostic summarises all of the session's events, whatever their ``ts`` relative to
  the outcome, with the fields of its **last outcome in event time**. An event that arrives
  after the outcome corrects it, and the corrected diagnostic is sent again;
- injected ids (and graph ids) are in first-seen order *in event time*.

The session's own clock is its newest ``ts``: it alone runs the turn TTL (counting unmatched
halves) and the search retention. Other sessions' timestamps never touch it.

Duplicates. An event whose ``event_id`` is in the log already (a producer's retry, a file
published twice) changes nothing and sends nothing. A crash is not this module's concern: the
worker's checkpoint (:mod:`memdiag.streams.checkpoint`) brings the session back as of the
committed offsets and the records after them come again.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass
from typing import Any

from memdiag.contract import (
    ACCEPTED,
    FEEDBACK,
    FOLLOWUPS,
    LATE_BEYOND_RETENTION,
    LATE_EVENTS,
    SEARCH_CALLS,
    SESSION_OUTCOMES,
    UNJUDGED_TURNS,
    UNMATCHED_TURNS,
)
from memdiag.contract.envelope import Output
from memdiag.schemas.models import (
    Injection,
    Response,
    Search,
    SessionEvent,
    SessionOutcome,
    SessionScope,
    format_ts,
)
from memdiag.streams.diagnosis import failure_category
from memdiag.streams.feedback import MIN_KEYWORD_LEN, USED, keywords, normalise_words
from memdiag.streams.followup import Remembered, SearchHistory, Verdict, is_evaluated, query_key
from memdiag.streams.turns import Change, Judged, Turn

log = logging.getLogger("memdiag.worker")

#: Records per sealed chunk of a session's log. A session keeps the chunk size it was first
#: written with (``cs`` in its head).
CHUNK = 8

# Log record layouts (JSON arrays; index 0 is the kind, 1 the event id, 2 the ts in µs):
#   ["s", eid, ts, source, query_key, result_ids | result_count, scope, published_ms, query?]
#   ["i", eid, ts, turn_id, [[obs_id, [keyword, ...]], ...], entity_ids, edges, scope]
#   ["r", eid, ts, turn_id, [word, ...], scope]
#   ["o", eid, ts, outcome, tool_calls, files | None, errors, helpful_ids, failure_context,
#    scope, revision?]
# and, from spans (memdiag.streams.traces; the id is the span's "trace:span"):
#   ["sr", id, ts, [[obs_id, [keyword, ...]], ...], scope]   a retrieval's results
#   ["st", id, ts, end_ts, [word, ...] | None, unjudged reason | None, scope]   a turn
SEARCH, INJECTION, RESPONSE, OUTCOME = "s", "i", "r", "o"
SPAN_RETRIEVAL, SPAN_TURN = "sr", "st"

Scope = tuple[str | None, str | None, str | None]  # agent_id, org_id, project_id


@dataclass(frozen=True, slots=True)
class Config:
    """The settings a session's rules read."""

    window_us: int
    retention_us: int
    turn_ttl_us: int
    store_text: bool = False


@dataclass(slots=True)
class OwnerVerdict:
    """An observation owner's latest verdict on this session."""

    outcome_event_id: str
    misleading: bool
    version: int


def record_of(event: SessionEvent, scope: int, published_ms: int, store_text: bool) -> list[Any]:
    """The compact log record of a validated event (keywords, not texts)."""
    if isinstance(event, Search):
        ids: Any = (
            list(event.result_ids)
            if is_evaluated(event.source, event.result_ids)
            else len(event.result_ids)
        )
        rec = [SEARCH, event.event_id, event.ts_us, event.source, query_key(event.query), ids]
        rec += [scope, published_ms]
        if store_text:
            rec.append(event.query)
        return rec
    if isinstance(event, Injection):
        return [
            INJECTION,
            event.event_id,
            event.ts_us,
            event.turn_id,
            [[o.id, sorted(keywords(o.content))] for o in event.observations],
            list(event.graph_entity_ids),
            [[e.source_id, e.target_id, e.relationship] for e in event.graph_edge_keys],
            scope,
        ]
    if isinstance(event, Response):
        words = sorted({w for w in normalise_words(event.text) if len(w) >= MIN_KEYWORD_LEN})
        return [RESPONSE, event.event_id, event.ts_us, event.turn_id, words, scope]
    if not isinstance(event, SessionOutcome):
        raise TypeError(f"not a session event: {event!r}")
    rec = [
        OUTCOME,
        event.event_id,
        event.ts_us,
        event.outcome,
        [[c.tool, c.file, c.success] for c in event.tool_calls],
        None if event.files_modified is None else list(event.files_modified),
        [[e.message, e.tool, e.recoverable] for e in event.errors],
        list(event.helpful_observation_ids),
        event.failure_context,
        scope,
    ]
    if event.revision:
        rec.append(event.revision)
    return rec


def span_record_of(d: dict[str, Any], scope: int) -> list[Any]:
    """The log record of a span retrieval or a span turn (``memdiag.streams.traces``: their
    results' keywords and the turn's words come computed, as the rules read them)."""
    if d["kind"] == "span_retrieval":
        return [SPAN_RETRIEVAL, d["id"], d["ts"], d["observations"], scope]
    return [SPAN_TURN, d["id"], d["ts"], d["end"], d.get("words"), d.get("unjudged"), scope]


def _revision(rec: list[Any]) -> int:
    return rec[10] if rec[0] == OUTCOME and len(rec) > 10 else 0


class Session:
    """A session's log and everything derived from it."""

    def __init__(self, session_id: str, partition: int, config: Config):
        self.session_id = session_id
        self.partition = partition
        self.config = config
        self.records: list[list[Any]] = []  # the log, in arrival order
        self.sealed = 0  # records[:sealed] are in sealed chunks of the store
        self.chunk = CHUNK  # records per sealed chunk, for the session's whole life
        self.scopes: list[Scope] = []
        self._scope_index: dict[Scope, int] = {}
        self.last_seen_ms = 0  # processing time (Kafka timestamp) of the last event
        self.verdicts: dict[str, OwnerVerdict] = {}
        # the spans' retrievals and turns, by (ts, id, seq): complete as the log is (see
        # _span); a turn's injection is made of the retrievals since the one before
        self._span_retrievals: list[tuple[int, str, int]] = []
        self._span_turns: list[tuple[int, str, int]] = []
        self._spans_known = False  # replaying a log whose spans are all in the lists
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
        # first appearance in event time: id -> (ts, seq, position in its event)
        self._observations: dict[str, tuple[int, int, int]] = {}
        self._entities: dict[str, tuple[int, int, int]] = {}
        self._edges: dict[tuple[str, str, str], tuple[int, int, int]] = {}
        self._obs_turns: dict[str, list[int]] = {}  # id -> [evaluated turns, used turns]
        self.outcome_seq: int | None = None  # the last outcome in event time
        self._emitted: dict[str, Any] | None = None  # the diagnostic last sent
        #: span turn id -> the injection applied for it ([[obs_id, keywords]]; [] if none)
        self._span_applied: dict[str, list[list[Any]]] = {}

    # -- input ------------------------------------------------------------------------------

    def scope_of(self, event: SessionEvent) -> int:
        return self._scope(event.scope)

    def _scope(self, s: SessionScope) -> int:
        key = (s.agent_id, s.org_id, s.project_id)
        index = self._scope_index.get(key)
        if index is None:
            index = self._scope_index[key] = len(self.scopes)
            self.scopes.append(key)
        return index

    def ingest(self, event: SessionEvent, published_ms: int, out: Output) -> None:
        """Apply a validated event (nothing if it is a duplicate; for a higher revision of an
        outcome, put it in the place of the one before)."""
        seq = self._seq_of.get(event.event_id)
        revised = (
            seq is not None
            and isinstance(event, SessionOutcome)
            and event.revision > _revision(self.records[seq])
        )
        if seq is not None and not revised:
            return  # a duplicate
        rec = record_of(event, self.scope_of(event), published_ms, self.config.store_text)
        self.records.append(rec)
        self._apply(rec, len(self.records) - 1, out)

    def ingest_span(self, d: dict[str, Any], scope: SessionScope, out: Output) -> None:
        """Apply a span retrieval or a span turn (``memdiag.streams.traces``) unless it is a
        duplicate."""
        if d["id"] in self._seq_of:
            return
        rec = span_record_of(d, self._scope(scope))
        self.records.append(rec)
        self._apply(rec, len(self.records) - 1, out)

    def replay(self, records: list[list[Any]]) -> None:
        """Rebuild the derived state from a log read back from the store (sends nothing):
        its spans first (a turn's injection is made of every retrieval the log has), then
        every record in the order it came."""
        start = len(self.records)
        self.records.extend(records)
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

    def _apply(self, rec: list[Any], seq: int, out: Output | None) -> None:
        kind, eid, ts = rec[0], rec[1], rec[2]
        self._seq_of[eid] = seq
        self._first_seq.setdefault(eid, seq)
        if kind == SPAN_TURN:
            ts = rec[3]  # the turn's clock is its end (its response)
        if ts > self.clock:
            self.clock = ts
            self.history.prune(ts - self.config.retention_us)
        if kind == SEARCH:
            self._search(rec, seq, out)
        elif kind == INJECTION:
            self._injection(rec, seq, out)
        elif kind == RESPONSE:
            self._response(rec, seq, out)
        elif kind == OUTCOME:
            self._outcome(rec, seq, out)
        else:
            self._span(rec, seq, out)
        self._count_unmatched(out)

    def _search(self, rec: list[Any], seq: int, out: Output | None) -> None:
        _, eid, ts, source, qkey, ids = rec[:6]
        verdicts: list[Verdict] = []
        late = False
        if isinstance(ids, list):  # evaluated
            if ts < self.clock - self.config.retention_us:
                late = True  # its predecessor may be forgotten: written, not judged
                self.history.evaluated += 1
            else:
                verdicts = self.history.observe(Remembered(ts, seq, eid, qkey, tuple(ids)))
        elif source == "agent":
            self.empty_agent_searches += 1
        if out is None:
            return
        out.count(SEARCH_CALLS, at_us=ts, source=source)
        if late:
            out.count(LATE_EVENTS, at_us=ts, reason=LATE_BEYOND_RETENTION)
        out.diagnostic(self.session_id, self._search_row(rec, verdicts[0] if verdicts else None))
        for v in verdicts:
            if v.is_followup:
                out.count(FOLLOWUPS, at_us=ts)
        if len(verdicts) > 1:  # the successor's verdict changed: its row again, corrected
            self._send_search(verdicts[1], out)
        self._send_diagnostic(out)

    def _injection(self, rec: list[Any], seq: int, out: Output | None) -> None:
        _, _, ts, turn_id, observations, entities, edges, scope = rec
        turn = self._turn(turn_id)
        changes = turn.add_injection(ts, seq, scope, [(o, frozenset(k)) for o, k in observations])
        new_obs = []
        for pos, (obs_id, _) in enumerate(observations):
            first = self._observations.get(obs_id)
            if first is None:
                new_obs.append(obs_id)
            if first is None or (ts, seq, pos) < first:
                self._observations[obs_id] = (ts, seq, pos)
        for pos, entity in enumerate(entities):
            _first_seen(self._entities, entity, (ts, seq, pos))
        for pos, edge in enumerate(edges):
            _first_seen(self._edges, (edge[0], edge[1], edge[2]), (ts, seq, pos))
        self._turn_changed(turn_id, turn, changes, out)
        if out is not None and self.outcome_seq is not None and new_obs:
            self._send_steps(new_obs, out)
        self._send_diagnostic(out)

    def _response(self, rec: list[Any], seq: int, out: Output | None) -> None:
        _, _, ts, turn_id, words, scope = rec
        turn = self._turn(turn_id)
        changes = turn.add_response(ts, seq, scope, frozenset(words))
        self._turn_changed(turn_id, turn, changes, out)
        self._send_diagnostic(out)

    def _outcome(self, rec: list[Any], seq: int, out: Output | None) -> None:
        if self._first_seq[rec[1]] != seq:  # a revision: in the place of the one before
            if self.outcome_seq is not None and self.records[self.outcome_seq][1] == rec[1]:
                self.outcome_seq = seq
                self._emitted = None
                self._send_diagnostic(out)
            return
        current = self.outcome_seq
        if current is not None and self.records[current][2] > rec[2]:
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
        self._send_diagnostic(out)

    def _count_outcome(self, rec: list[Any], out: Output) -> None:
        """Each outcome event counts once, with its own category."""
        category = self._category(rec) if rec[3] != ACCEPTED else ""
        out.count(SESSION_OUTCOMES, at_us=rec[2], failure_category=category, outcome=rec[3])

    def _turn(self, turn_id: str) -> Turn:
        turn = self.turns.get(turn_id)
        if turn is None:
            turn = self.turns[turn_id] = Turn()
        return turn

    # -- turns from spans ---------------------------------------------------------------------
    #
    # A span turn's injection is made of the span retrievals since the conversation's turn
    # before it ((ts, id) after that turn's, up to its own), their results in that order, each
    # memory once: the injection a runtime would have published, at the turn's start, with
    # its response (the turn's text) at its end. A turn without results injects nothing and
    # is not judged. A search that comes after its turn adds its results to that turn (the
    # usual order: a chat span names its conversation and comes at once, searches wait for
    # their agent span). A chat span that comes after a later turn takes the searches before
    # it from that turn: then the session is derived again from its log, and the rows that
    # changed are sent again (those that no longer hold are retracted). So the rows are
    # those of the in-order events whatever order the spans came in.

    def _know_span(self, rec: list[Any], seq: int) -> None:
        """Put a span record in the lists (replay: before any record is applied)."""
        if rec[0] == SPAN_RETRIEVAL:
            insort(self._span_retrievals, (rec[2], rec[1], seq))
        elif rec[0] == SPAN_TURN:
            insort(self._span_turns, (rec[2], rec[1], seq))

    def _span(self, rec: list[Any], seq: int, out: Output | None) -> None:
        if self._spans_known:  # a replay: the lists are complete
            if rec[0] == SPAN_TURN:
                self._apply_turn(rec, seq, out)
            return
        self._know_span(rec, seq)
        entry = (rec[2], rec[1], seq)
        if rec[0] == SPAN_RETRIEVAL:
            i = bisect_left(self._span_turns, entry[:2], key=lambda t: t[:2])
            if i == len(self._span_turns):
                return  # no turn after it yet: the next one takes it
            turn = self._span_turns[i]
            applied = self._span_applied.get(turn[1])
            injected = self._injection_of(i)
            if applied == injected:
                return  # nothing new for it (its memories were all there)
            if not applied:
                self._apply_turn(self.records[turn[2]], turn[2], out)
            elif not self._extend_turn(self.records[turn[2]], turn[2], applied, injected, out):
                self._rebuild(out)  # an injection already judged changes otherwise
            return
        i = bisect_left(self._span_turns, entry[:2], key=lambda t: t[:2])
        if i + 1 < len(self._span_turns):
            after = self._span_turns[i + 1]
            if self._span_applied.get(after[1]) != self._injection_of(i + 1):
                self._rebuild(out)  # the turn after loses what came before this one
                return
        self._apply_turn(rec, seq, out)

    def _injection_of(self, i: int) -> list[list[Any]]:
        """The injection of the ``i``-th span turn: the results of the retrievals since the
        turn before, in (ts, id) order, each memory once (first seen)."""
        turn = self._span_turns[i]
        lo = 0
        if i > 0:
            lo = bisect_right(self._span_retrievals, self._span_turns[i - 1][:2],
                              key=lambda r: r[:2])  # fmt: skip
        hi = bisect_right(self._span_retrievals, turn[:2], key=lambda r: r[:2])
        seen: set[str] = set()
        injected = []
        for _, _, rseq in self._span_retrievals[lo:hi]:
            for obs_id, kws in self.records[rseq][3]:
                if obs_id not in seen:
                    seen.add(obs_id)
                    injected.append([obs_id, kws])
        return injected

    def _extend_turn(
        self,
        rec: list[Any],
        seq: int,
        applied: list[list[Any]],
        injected: list[list[Any]],
        out: Output | None,
    ) -> bool:
        """A late retrieval only adds memories to a judged turn (the usual way: a chat span
        names its conversation and comes at once, its searches wait for their agent span):
        judge the new ones, put each memory of the turn at its place in event time. False
        when it does more (a memory of the turn now reads another content): rebuild."""
        before = {obs_id: kws for obs_id, kws in applied}
        if any(before.get(obs_id, kws) != kws for obs_id, kws in injected):
            return False
        if not before.keys() <= {obs_id for obs_id, _ in injected}:
            return False
        _, key, ts, _, _, _, scope = rec
        added = [(o, frozenset(k)) for o, k in injected if o not in before]
        turn = self.turns[key]
        changes = turn.add_injection(ts, seq, scope, added)
        new_obs = []
        for pos, (obs_id, _) in enumerate(injected):
            first = self._observations.get(obs_id)
            if first is None:
                new_obs.append(obs_id)
            if first is None or (ts, seq, pos) < first or first[:2] == (ts, seq):
                self._observations[obs_id] = (ts, seq, pos)  # its place in this turn now
        self._span_applied[key] = injected
        self._turn_changed(key, turn, changes, out)
        if out is not None and self.outcome_seq is not None and new_obs:
            self._send_steps(new_obs, out)
        self._send_diagnostic(out)
        return True

    def _apply_turn(self, rec: list[Any], seq: int, out: Output | None) -> None:
        """Apply a span turn with its injection as the lists have it now (only ever once
        per log replay, or for a turn whose injection was empty)."""
        _, key, ts, end, words, unjudged, scope = rec
        i = bisect_left(self._span_turns, (ts, key), key=lambda t: t[:2])
        injected = self._injection_of(i)
        self._span_applied[key] = injected
        if not injected:
            return
        self._injection([INJECTION, key, ts, key, injected, [], [], scope], seq, out)
        if words is not None:
            self._response([RESPONSE, key, end, key, words, scope], seq, out)
        else:
            self.turns[key].unjudged = True  # no response will come: never unmatched
            if out is not None:
                out.count(UNJUDGED_TURNS, at_us=end, reason=unjudged or "no_text")

    def _rebuild(self, out: Output | None) -> None:
        """Derive the session again from its log (a late span changed a judged turn), and
        send what changed: rows changed or new, rows retracted, the diagnostic, and the
        steps of memories new to the session."""
        if out is None:
            return  # a replay derives every turn from the complete lists anyway
        judged = {(t, o): j for t, turn in self.turns.items() for o, j in turn.judged.items()}
        observations = set(self._observations)
        unjudged = {k for k, t in self.turns.items() if t.unjudged}
        unmatched = {k for k, t in self.turns.items() if t.counted}
        emitted = self._emitted
        self._reset()
        self._emitted = emitted
        self._spans_known = True
        try:
            for seq, rec in enumerate(self.records):
                self._apply(rec, seq, None)
        finally:
            self._spans_known = False
        for turn_id, turn in self.turns.items():
            for obs_id, now in turn.judged.items():
                before = judged.pop((turn_id, obs_id), None)
                if before != now:
                    out.diagnostic(self.session_id, self._feedback_row(turn_id, obs_id, now))
                    if before is None:
                        out.count(FEEDBACK, at_us=now.ts_us, signal=now.feedback.signal)
            if turn.unjudged and turn_id not in unjudged:
                end = self.records[self._seq_of[turn_id]][3]
                reason = self.records[self._seq_of[turn_id]][5] or "no_text"
                out.count(UNJUDGED_TURNS, at_us=end, reason=reason)
            half = turn.pending_half()
            if turn.counted and turn_id not in unmatched and half is not None:
                # the replay marked it (sending nothing): count it, once, as _apply would
                out.count(UNMATCHED_TURNS, at_us=self.clock, half=half)
        for turn_id, obs_id in judged:  # judged before, no longer in its turn
            out.diagnostic(self.session_id, self._retracted_row(turn_id, obs_id))
        if self.outcome_seq is not None:
            self._send_steps([o for o in self._observations if o not in observations], out)
        self._send_diagnostic(out, force=True)

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
                out.diagnostic(self.session_id, self._feedback_row(turn_id, obs_id, now))
                if before is None:
                    out.count(FEEDBACK, at_us=now.ts_us, signal=now.feedback.signal)

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

    # -- the session diagnostic -----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self.outcome_seq is not None

    def injected_observation_ids(self) -> list[str]:
        return _in_first_seen_order(self._observations)

    def _category(self, rec: list[Any]) -> str:
        return failure_category(((c[0], c[2]) for c in rec[4]), [e[0] for e in rec[6]], rec[5])

    def diagnostic(self) -> dict[str, Any]:
        """The ``session_diagnostic`` of the session as it stands, with the misleading ids
        the owners have answered so far (see :meth:`complete`). Only for a closed one."""
        rec = self.records[self._last_outcome()]
        _, eid, ts, outcome, calls, files, errors, helpful, context, scope = rec[:10]
        agent_id, org_id, project_id = self.scopes[scope]
        observations = self.injected_observation_ids()
        failed = outcome != ACCEPTED
        misleading = []
        if failed:
            for obs_id in observations:
                v = self.verdicts.get(obs_id)
                if v is not None and v.outcome_event_id == eid and v.misleading:
                    misleading.append(obs_id)
        return {
            "kind": "session_diagnostic",
            "event_id": eid,
            "session_id": self.session_id,
            "outcome": outcome,
            "failure_category": self._category(rec) if failed else None,
            "failure_context": context,
            "injected_observation_ids": observations,
            "injected_graph_entity_ids": _in_first_seen_order(self._entities),
            "injected_graph_edge_keys": [
                {"source_id": s, "target_id": t, "relationship": r}
                for s, t, r in _in_first_seen_order(self._edges)
            ],
            "tool_call_summary": (
                [{"tool": c[0], "file": c[1], "success": c[2]} for c in calls] if failed else None
            ),
            "files_modified": list(files) if failed and files is not None else None,
            "errors_encountered": (
                [{"message": e[0], "tool": e[1], "recoverable": e[2]} for e in errors]
                if failed
                else None
            ),
            "helpful_observation_ids": list(helpful),
            "misleading_observation_ids": misleading,
            "ignored_observation_ids": [
                o for o in observations if (c := self._obs_turns.get(o)) and c[0] and not c[1]
            ],
            "search_count": self.history.evaluated + self.empty_agent_searches,
            "followup_count": self.history.followups,
            "ts": format_ts(ts),
            "agent_id": agent_id,
            "org_id": org_id,
            "project_id": project_id,
        }

    def complete(self) -> bool:
        """Whether every observation owner has answered for the current outcome. An accepted
        session, or one without observations, needs no answer: nothing of it can be
        misleading once it counts."""
        if self.outcome_seq is None:
            return False
        rec = self.records[self.outcome_seq]
        if rec[3] == ACCEPTED:
            return True
        eid = rec[1]
        for obs_id in self._observations:
            v = self.verdicts.get(obs_id)
            if v is None or v.outcome_event_id != eid:
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

    def _send_steps(self, obs_ids: list[str], out: Output) -> None:
        """One step per observation for its owner: this session, with its last outcome
        (``seq``: its first record's, the same for every revision of it)."""
        rec = self.records[self._last_outcome()]
        seq = self._first_seq[rec[1]]
        for obs_id in obs_ids:
            out.step(
                obs_id,
                {
                    "observation_id": obs_id,
                    "session_id": self.session_id,
                    "outcome_event_id": rec[1],
                    "outcome": rec[3],
                    "ts_us": rec[2],
                    "seq": seq,
                },
            )

    def _last_outcome(self) -> int:
        if self.outcome_seq is None:
            raise RuntimeError(f"session {self.session_id} has no outcome yet")
        return self.outcome_seq

    # -- rows ---------------------------------------------------------------------------------

    def _send_search(self, verdict: Verdict, out: Output) -> None:
        """A remembered search's row, with its current verdict."""
        rec = self.records[self._seq_of[verdict.event_id]]
        out.diagnostic(self.session_id, self._search_row(rec, verdict))

    def _search_row(self, rec: list[Any], verdict: Verdict | None) -> dict[str, Any]:
        _, eid, ts, source, _, ids, scope, published_ms = rec[:8]
        agent_id, org_id, project_id = self.scopes[scope]
        row: dict[str, Any] = {
            "kind": "search",
            "event_id": eid,
            "session_id": self.session_id,
            "ts": format_ts(ts),
            "source": source,
            "result_count": len(ids) if isinstance(ids, list) else ids,
            "evaluated": isinstance(ids, list),
            "is_followup": bool(verdict and verdict.is_followup),
            "prev_event_id": verdict.prev_event_id if verdict else None,
            "gap_seconds": verdict.gap_seconds if verdict else None,
            "disjoint_new_query": bool(verdict and verdict.disjoint_new_query),
            "agent_id": agent_id,
            "org_id": org_id,
            "project_id": project_id,
            "published_at": format_ts(published_ms * 1000),
        }
        if len(rec) > 8:
            row["query"] = rec[8]
        return row

    def _retracted_row(self, turn_id: str, obs_id: str) -> dict[str, Any]:
        """An observation no longer in a turn (a late span moved it): the sink deletes its row."""
        return {
            "kind": "retrieval_feedback",
            "session_id": self.session_id,
            "turn_id": turn_id,
            "observation_id": obs_id,
            "retracted": True,
        }

    def _feedback_row(self, turn_id: str, obs_id: str, judged: Judged) -> dict[str, Any]:
        fb = judged.feedback
        primary, fallback = self.scopes[judged.scope], self.scopes[judged.fallback_scope]
        agent_id, org_id, project_id = (
            a if a is not None else b for a, b in zip(primary, fallback, strict=True)
        )
        return {
            "kind": "retrieval_feedback",
            "session_id": self.session_id,
            "turn_id": turn_id,
            "observation_id": obs_id,
            "signal": fb.signal,
            "match_ratio": fb.match_ratio,
            "keyword_count": fb.keyword_count,
            "matched_count": fb.matched_count,
            "ts": format_ts(judged.ts_us),
            "agent_id": agent_id,
            "org_id": org_id,
            "project_id": project_id,
        }

    # -- persistence --------------------------------------------------------------------------

    def header(self) -> dict[str, Any]:
        """The session's head in the store: what is not in sealed chunks."""
        head: dict[str, Any] = {
            "p": self.partition,
            "l": self.last_seen_ms,
            "n": self.sealed // self.chunk,
            "cs": self.chunk,
            "sc": self.scopes,
            "t": self.records[self.sealed :],
        }
        if self.verdicts:
            head["v"] = {
                o: [v.outcome_event_id, v.misleading, v.version] for o, v in self.verdicts.items()
            }
        return head

    def seal(self) -> tuple[int, list[list[Any]]] | None:
        """The next full chunk of the log to write under its own key, if there is one."""
        size = self.chunk
        if len(self.records) - self.sealed < size:
            return None
        chunk = self.records[self.sealed : self.sealed + size]
        index = self.sealed // size
        self.sealed += size
        return index, chunk

    @classmethod
    def restore(
        cls, session_id: str, head: dict[str, Any], chunks: list[list[list[Any]]], config: Config
    ) -> Session:
        """The inverse of :meth:`header` and :meth:`seal`."""
        session = cls(session_id, head["p"], config)
        session.chunk = head["cs"]
        session.last_seen_ms = head["l"]
        for agent_id, org_id, project_id in head["sc"]:
            scope = (agent_id, org_id, project_id)
            session._scope_index[scope] = len(session.scopes)
            session.scopes.append(scope)
        records = [rec for chunk in chunks for rec in chunk]
        session.sealed = len(records)
        session.replay(records + head["t"])
        for obs_id, (eid, misleading, version) in head.get("v", {}).items():
            session.verdicts[obs_id] = OwnerVerdict(eid, misleading, version)
        return session


def _first_seen(index: dict[Any, tuple[int, int, int]], key: Any, at: tuple[int, int, int]) -> None:
    first = index.get(key)
    if first is None or at < first:
        index[key] = at


def _in_first_seen_order(index: dict[Any, tuple[int, int, int]]) -> list[Any]:
    return sorted(index, key=index.__getitem__)
