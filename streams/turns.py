"""The turn join (CONTRACT section 3, "Used / ignored"): pure code, no Faust, no Kafka.

An ``injection`` and the ``response`` of one ``(session_id, turn_id)`` meet here, in either
order. :class:`Turns` holds a session's turns in one of three states:

- ``injection`` pending: the observations injected so far (id and keywords), waiting for
  the response. Several injections of one turn before its response are merged (distinct
  observations, first content wins).
- ``response`` pending: the response's words of at least 5 characters (shorter words can
  never match a keyword), waiting for the injection.
- ``done``: joined. Each distinct observation got exactly one verdict, and the verdicts
  are kept so a redelivered half re-emits the same feedback (whose upsert then changes
  nothing) instead of starting a new half that would expire as unmatched.

A pending half expires ``ttl`` of event time after its own ``ts``; :meth:`Turns.expire`
returns it so the caller counts it (``memdiag.unmatched_turn_total{half}``). A done turn is
forgotten after the same ``ttl``. An injection that arrives for a turn already done adds
nothing: its new observations, if any, are counted as an unmatched injection half, because
the response they would be judged against is no longer kept (keeping every response's
words for a session's lifetime would make each state write as large as the conversation).

State keeps keywords and response words (normalised, lowercase, no punctuation), never the
raw texts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from streams.feedback import (
    IGNORED,
    MIN_KEYWORD_LEN,
    USED,
    Feedback,
    judge_keywords,
    keywords,
    normalise_words,
)

INJECTION = "injection"
RESPONSE = "response"
_PENDING_INJECTION, _PENDING_RESPONSE, _DONE = "i", "r", "d"


@dataclass(frozen=True, slots=True)
class ObservationFeedback:
    """The verdict on one observation of one joined turn."""

    turn_id: str
    observation_id: str
    feedback: Feedback
    ts_us: int  # event time of the join: the later of the two halves


@dataclass(frozen=True, slots=True)
class Joined:
    """What one half brought about: the verdicts of its turn, if the turn is joined.

    ``fresh`` is False when the verdicts were already emitted once (a redelivered half):
    the records are re-sent, so a crash between state write and send loses nothing, but
    they must not be counted again.
    """

    feedback: tuple[ObservationFeedback, ...]
    fresh: bool
    late_observations: int = 0  # observations of an injection for a turn already done


NOTHING = Joined((), False)


class Turns:
    """A session's turns, keyed by ``turn_id``; see the module docstring."""

    __slots__ = ("_turns",)

    def __init__(self, turns: dict[str, list[Any]] | None = None):
        # turn_id -> [state, ts_us, event_ids, payload]
        #   i: payload = [[observation_id, frozenset of keywords], ...] (a list in state)
        #   r: payload = [word, ...]
        #   d: payload = [[observation_id, used(0/1), keyword_count, matched_count], ...]
        self._turns: dict[str, list[Any]] = turns or {}

    def __len__(self) -> int:
        return len(self._turns)

    def pending(self) -> Iterable[tuple[str, str, int]]:
        """(turn_id, half, ts_us) of every half waiting for its partner."""
        for turn_id, (state, ts, _, _) in self._turns.items():
            if state == _PENDING_INJECTION:
                yield turn_id, INJECTION, ts
            elif state == _PENDING_RESPONSE:
                yield turn_id, RESPONSE, ts

    def next_expiry(self, ttl_us: int) -> int | None:
        """Event time at which the oldest turn (pending or done) expires."""
        if not self._turns:
            return None
        return min(t[1] for t in self._turns.values()) + ttl_us

    # -- the two halves -----------------------------------------------------------------

    def add_injection(
        self, event_id: str, ts_us: int, turn_id: str, observations: Sequence[tuple[str, str]]
    ) -> Joined:
        """``observations`` are (id, content) pairs, as injected (duplicates allowed)."""
        turn = self._turns.get(turn_id)
        if turn is None:
            self._turns[turn_id] = [
                _PENDING_INJECTION,
                ts_us,
                [event_id],
                _distinct_keywords(observations, ()),
            ]
            return NOTHING
        state, ts, event_ids, payload = turn
        if event_id in event_ids:
            return self._replay(turn_id, turn)
        if state == _PENDING_INJECTION:
            event_ids.append(event_id)
            known = {obs_id for obs_id, _ in payload}
            payload.extend(_distinct_keywords(observations, known))
            turn[1] = min(ts, ts_us)
            return NOTHING
        if state == _PENDING_RESPONSE:
            words = frozenset(payload)
            judged = [
                (obs_id, judge_keywords(kws, words))
                for obs_id, kws in _distinct_keywords(observations, ())
            ]
            return self._join(turn_id, [event_id, *event_ids], judged, max(ts, ts_us))
        # done: an injection for a turn whose response was already judged
        event_ids.append(event_id)
        judged_ids = {row[0] for row in payload}
        late = {obs_id for obs_id, _ in observations if obs_id not in judged_ids}
        return Joined((), False, len(late))

    def add_response(self, event_id: str, ts_us: int, turn_id: str, text: str) -> Joined:
        turn = self._turns.get(turn_id)
        if turn is None:
            words = sorted({w for w in normalise_words(text) if len(w) >= MIN_KEYWORD_LEN})
            self._turns[turn_id] = [_PENDING_RESPONSE, ts_us, [event_id], words]
            return NOTHING
        state, ts, event_ids, payload = turn
        if event_id in event_ids:
            return self._replay(turn_id, turn)
        if state == _PENDING_INJECTION:
            response = frozenset(normalise_words(text))
            judged = [(obs_id, judge_keywords(frozenset(kws), response)) for obs_id, kws in payload]
            return self._join(turn_id, [*event_ids, event_id], judged, max(ts, ts_us))
        # A second response of a turn (a different event): the turn keeps its first
        # response, as a turn has one. Remember the id so a redelivery is recognised.
        event_ids.append(event_id)
        return NOTHING

    def _join(
        self, turn_id: str, event_ids: list[str], judged: list[tuple[str, Feedback]], ts_us: int
    ) -> Joined:
        rows = [
            [obs_id, 1 if fb.signal == USED else 0, fb.keyword_count, fb.matched_count]
            for obs_id, fb in judged
        ]
        self._turns[turn_id] = [_DONE, ts_us, event_ids, rows]
        return Joined(_feedback(turn_id, rows, ts_us), True)

    def _replay(self, turn_id: str, turn: list[Any]) -> Joined:
        if turn[0] != _DONE:
            return NOTHING
        return Joined(_feedback(turn_id, turn[3], turn[1]), False)

    # -- expiry and serialisation -------------------------------------------------------

    def expire(self, horizon_us: int, ttl_us: int) -> list[tuple[str, str]]:
        """Drop turns older than ``horizon_us - ttl_us``; return the pending halves dropped
        as (turn_id, half)."""
        cutoff = horizon_us - ttl_us
        gone: list[tuple[str, str]] = []
        for turn_id in [t for t, v in self._turns.items() if v[1] < cutoff]:
            state = self._turns.pop(turn_id)[0]
            if state == _PENDING_INJECTION:
                gone.append((turn_id, INJECTION))
            elif state == _PENDING_RESPONSE:
                gone.append((turn_id, RESPONSE))
        return gone

    def to_state(self) -> dict[str, list[Any]]:
        state = {}
        for turn_id, turn in self._turns.items():
            if turn[0] == _PENDING_INJECTION:
                turn = [*turn[:3], [[o, sorted(kws)] for o, kws in turn[3]]]
            state[turn_id] = turn
        return state

    @classmethod
    def from_state(cls, state: dict[str, list[Any]] | None) -> Turns:
        turns = state or {}
        for turn in turns.values():
            if turn[0] == _PENDING_INJECTION:
                turn[3] = [[o, frozenset(kws)] for o, kws in turn[3]]
        return cls(turns)


def _distinct_keywords(
    observations: Sequence[tuple[str, str]], known: Iterable[str]
) -> list[list[Any]]:
    """[[id, sorted keywords], ...] for each observation id not yet seen, first one wins."""
    seen = set(known)
    out: list[list[Any]] = []
    for obs_id, content in observations:
        if obs_id in seen:
            continue
        seen.add(obs_id)
        out.append([obs_id, keywords(content)])  # a frozenset in memory; a list in state
    return out


def _feedback(turn_id: str, rows: list[list[Any]], ts_us: int) -> tuple[ObservationFeedback, ...]:
    return tuple(
        ObservationFeedback(
            turn_id,
            obs_id,
            Feedback(
                USED if used else IGNORED,
                matched / kw if kw else 0.0,
                kw,
                matched,
            ),
            ts_us,
        )
        for obs_id, used, kw, matched in rows
    )
