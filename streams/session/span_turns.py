"""Turns from OpenTelemetry spans (docs/spans.md): a session's chat spans and the retrievals
they inject, whatever order the spans come in. Part of :class:`memdiag.streams.session.
session.Session` (a mixin: the session's own state, this module's rules).

A span turn's injection is made of the span retrievals since the conversation's turn before
it ((ts, id) after that turn's, up to its own), their results in that order, each memory
once: the injection a runtime would have published, at the turn's start, with its response
(the turn's text) at its end. A turn without results injects nothing and is not judged. A
search that comes after its turn adds its results to that turn (the usual order: a chat span
names its conversation and comes at once, searches wait for their agent span). A chat span
that comes after a later turn takes the searches before it from that turn: then the session
is derived again from its log, and the rows that changed are sent again (those that no longer
hold are retracted). So the rows are those of the in-order events whatever order the spans
came in.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import TYPE_CHECKING, Any, cast

from memdiag.contract import UNJUDGED_TURNS, UNMATCHED_TURNS
from memdiag.contract.envelope import Output
from memdiag.streams.session.records import (
    InjectionRec,
    LogRecord,
    ResponseRec,
    SpanRetrievalRec,
    SpanTurnRec,
)

if TYPE_CHECKING:
    from memdiag.streams.rules.turns import Change, Turn

#: (ts, id, seq) of a span record: its place among the session's span retrievals or turns
SpanKey = tuple[int, str, int]


#: A memory a span turn injects: its id, its keywords and, under MEMDIAG_DETECTOR=semantic,
#: its content's rows (None: not embedded).
Injected = tuple[str, tuple[str, ...], bytes | None]


def _order(entry: SpanKey) -> tuple[int, str]:
    return entry[0], entry[1]


class SpanTurns:
    """The span retrievals and span turns of a session, in (ts, id) order; each turn's
    injection as applied."""

    if TYPE_CHECKING:  # what this part uses of the session (memdiag.streams.session.session)
        session_id: str
        records: list[LogRecord]
        turns: dict[str, Turn]
        clock: int
        outcome_seq: int | None
        _emitted: dict[str, Any] | None
        _seq_of: dict[str, int]
        _observations: dict[str, tuple[int, str, int]]

        def _reset(self) -> None: ...
        def _apply(self, rec: LogRecord, seq: int, out: Output | None) -> None: ...
        def _injection(self, rec: InjectionRec, out: Output | None) -> None: ...
        def _response(self, rec: ResponseRec, out: Output | None) -> None: ...
        def _turn_changed(self, turn_id: str, turn: Turn, changes: list[Change],
                          out: Output | None) -> None: ...  # fmt: skip
        def _send_steps(self, obs_ids: list[str], out: Output) -> None: ...
        def _send_diagnostic(self, out: Output | None, force: bool = False) -> None: ...
        def _verdict_changed(self, turn_id: str, obs_id: str, before: Any, now: Any,
                             out: Output) -> None: ...  # fmt: skip

    def _init_spans(self) -> None:
        self._span_retrievals: list[SpanKey] = []
        self._span_turns: list[SpanKey] = []
        self._spans_known = False  # replaying a log whose spans are all in the lists

    def _reset_spans(self) -> None:
        #: span turn id -> the injection applied for it (empty if none)
        self._span_applied: dict[str, list[Injected]] = {}

    def _know_span(self, rec: LogRecord, seq: int) -> None:
        """Put a span record in the lists (replay: before any record is applied)."""
        if isinstance(rec, SpanRetrievalRec):
            insort(self._span_retrievals, (rec.ts, rec.event_id, seq))
        elif isinstance(rec, SpanTurnRec):
            insort(self._span_turns, (rec.ts, rec.event_id, seq))

    def _span(self, rec: SpanRetrievalRec | SpanTurnRec, seq: int, out: Output | None) -> None:
        if self._spans_known:  # a replay: the lists are complete
            if isinstance(rec, SpanTurnRec):
                self._apply_turn(rec, out)
            return
        self._know_span(rec, seq)
        at = (rec.ts, rec.event_id)
        i = bisect_left(self._span_turns, at, key=_order)
        if isinstance(rec, SpanRetrievalRec):
            if i == len(self._span_turns):
                return  # no turn after it yet: the next one takes it
            _, turn_id, turn_seq = self._span_turns[i]
            turn_rec = cast(SpanTurnRec, self.records[turn_seq])
            applied = self._span_applied.get(turn_id)
            injected = self._injection_of(i)
            if applied == injected:
                return  # nothing new for it (its memories were all there)
            if not applied:
                self._apply_turn(turn_rec, out)
            elif not self._extend_turn(turn_rec, applied, injected, out):
                self._rebuild(out)  # an injection already judged changes otherwise
            return
        if i + 1 < len(self._span_turns):
            after = self._span_turns[i + 1]
            if self._span_applied.get(after[1]) != self._injection_of(i + 1):
                self._rebuild(out)  # the turn after loses what came before this one
                return
        self._apply_turn(rec, out)

    def _injection_of(self, i: int) -> list[Injected]:
        """The injection of the ``i``-th span turn: the results of the retrievals since the
        turn before, in (ts, id) order, each memory once (first seen)."""
        turn = self._span_turns[i]
        retrievals = self._span_retrievals
        lo = 0 if i == 0 else bisect_right(retrievals, _order(self._span_turns[i - 1]), key=_order)
        hi = bisect_right(retrievals, _order(turn), key=_order)
        seen: set[str] = set()
        injected: list[Injected] = []
        for _, _, rseq in retrievals[lo:hi]:
            retrieval = cast(SpanRetrievalRec, self.records[rseq])
            vectors = retrieval.vectors or (None,) * len(retrieval.observations)
            for (obs_id, kws), v in zip(retrieval.observations, vectors, strict=True):
                if obs_id not in seen:
                    seen.add(obs_id)
                    injected.append((obs_id, kws, v))
        return injected

    def _extend_turn(
        self,
        rec: SpanTurnRec,
        applied: list[Injected],
        injected: list[Injected],
        out: Output | None,
    ) -> bool:
        """A late retrieval only adds memories to a judged turn (the usual way: a chat span
        names its conversation and comes at once, its searches wait for their agent span):
        judge the new ones, put each memory of the turn at its place in event time. False
        when it does more (a memory of the turn now reads another content): rebuild."""
        before = {obs_id: (kws, v) for obs_id, kws, v in applied}
        if any(before.get(obs_id, (kws, v)) != (kws, v) for obs_id, kws, v in injected):
            return False
        if not before.keys() <= {obs_id for obs_id, _, _ in injected}:
            return False
        key, ts = rec.event_id, rec.ts
        added: list[tuple[str, frozenset[str], bytes | None]] = [
            (o, frozenset(k), v) for o, k, v in injected if o not in before
        ]
        turn = self.turns[key]
        changes = turn.add_injection(ts, key, rec.scope, added)
        new_obs = []
        for pos, (obs_id, _, _) in enumerate(injected):
            first = self._observations.get(obs_id)
            if first is None:
                new_obs.append(obs_id)
            if first is None or (ts, key, pos) < first or first[:2] == (ts, key):
                self._observations[obs_id] = (ts, key, pos)  # its place in this turn now
        self._span_applied[key] = injected
        self._turn_changed(key, turn, changes, out)
        if out is not None and self.outcome_seq is not None and new_obs:
            self._send_steps(new_obs, out)
        self._send_diagnostic(out)
        return True

    def _apply_turn(self, rec: SpanTurnRec, out: Output | None) -> None:
        """Apply a span turn with its injection as the lists have it now (only ever once
        per log replay, or for a turn whose injection was empty)."""
        key = rec.event_id
        i = bisect_left(self._span_turns, (rec.ts, key), key=_order)
        injected = self._injection_of(i)
        self._span_applied[key] = injected
        if not injected:
            return
        # each memory with its own vectors or None (as _extend_turn adds them): a transient
        # record, never stored, so a None among them is read as "not embedded"
        vectors = tuple(v for _, _, v in injected)
        self._injection(
            InjectionRec(key, rec.ts, key, tuple((o, k) for o, k, _ in injected), (), (),
                         rec.scope, cast(Any, vectors) if any(vectors) else None),
            out,
        )  # fmt: skip
        if rec.words is not None:
            self._response(ResponseRec(key, rec.end, key, rec.words, rec.scope, rec.vectors), out)
        else:
            self.turns[key].unjudged = True  # no response will come: never unmatched
            if out is not None:
                out.count(UNJUDGED_TURNS, at_us=rec.end, reason=rec.unjudged or "no_text")

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
                    self._verdict_changed(turn_id, obs_id, before, now, out)
            if turn.unjudged and turn_id not in unjudged:
                turn_rec: Any = self.records[self._seq_of[turn_id]]
                out.count(UNJUDGED_TURNS, at_us=turn_rec.end,
                          reason=turn_rec.unjudged or "no_text")  # fmt: skip
            half = turn.pending_half()
            if turn.counted and turn_id not in unmatched and half is not None:
                # the replay marked it (sending nothing): count it, once, as _apply would
                out.count(UNMATCHED_TURNS, at_us=self.clock, half=half)
        for (turn_id, obs_id), before in judged.items():  # judged before, no longer in its turn
            self._verdict_changed(turn_id, obs_id, before, None, out)
        if self.outcome_seq is not None:
            self._send_steps([o for o in self._observations if o not in observations], out)
        self._send_diagnostic(out, force=True)
