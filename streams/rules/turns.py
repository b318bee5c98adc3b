"""The turn join (docs/rules.md, "Used / ignored"): pure code, no Faust, no Kafka.

An ``injection`` and the ``response`` of one ``(session_id, turn_id)`` meet here, in either
order, and the verdicts are a function of the turn's events alone, never of their arrival
order:

- The turn's response is its first ``response`` in event time (``(ts, event_id)``: equal
  timestamps are taken in ``event_id`` byte order, never in arrival order). A later second
  response is ignored; an earlier one that arrives late replaces it, and every verdict of
  the turn is judged again.
- Every ``injection`` of the turn counts, before or after the response. An observation
  injected twice keeps the content of its first injection in event time.
- Each distinct observation gets one verdict against the response's words, stamped with
  the later of the two halves' ``ts``.

So a late half only ever adds verdicts or changes them; a verdict never disappears, and
the sink's upsert on ``(session_id, turn_id, observation_id)`` converges to the in-order
result. A half still without its partner when the session's own clock (its newest ``ts``)
passes the half's ``ts`` plus the turn TTL is counted once as unmatched
(``memdiag.unmatched_turn_total{half}``); it is kept all the same, and joins if its partner
comes later.

State keeps keywords and the response's long words (normalised), never the raw texts.
"""

from __future__ import annotations

import msgspec

from memdiag.streams.rules.feedback import Feedback, judge

INJECTION = "injection"
RESPONSE = "response"


class Half(msgspec.Struct, frozen=True, gc=False):
    """One half of a turn, as the join keeps it."""

    ts_us: int
    event_id: str  # the tie-break for equal timestamps
    scope: int  # index in the session's scope table
    words: frozenset[str]  # an injection's observation keywords, or the response's long words
    #: its text's rows (memdiag.semantic) under MEMDIAG_DETECTOR=semantic; None: not embedded
    vectors: bytes | None = None

    @property
    def order(self) -> tuple[int, str]:
        return (self.ts_us, self.event_id)


class Judged(msgspec.Struct, frozen=True, gc=False):
    """The current verdict on one observation of one turn."""

    feedback: Feedback
    ts_us: int  # the later of the two halves
    scope: int  # the response's scope (its fields fall back to the injection's)
    fallback_scope: int
    #: the event id of the later half (equal ts: the larger id): the turn's place among the
    #: observation's verdicts (its strength, memdiag.streams.rules.strength)
    tie: str = ""


#: (observation id, its verdict before (None: first one), its verdict now)
Change = tuple[str, Judged | None, Judged]


class Turn:
    """One turn's halves and current verdicts."""

    __slots__ = ("response", "contents", "judged", "first_ts", "counted", "unjudged", "threshold")

    def __init__(self, threshold: float | None = None) -> None:
        #: MEMDIAG_SIMILARITY_THRESHOLD under MEMDIAG_DETECTOR=semantic (read only when both
        #: halves carry vectors); None: the keyword rule alone
        self.threshold = threshold
        self.response: Half | None = None
        #: observation id -> its content (the first injection carrying it, in event time)
        self.contents: dict[str, Half] = {}
        self.judged: dict[str, Judged] = {}
        self.first_ts: int | None = None  # event time of the turn's first half
        self.counted = False  # counted as unmatched already
        #: a turn from spans that has no response to judge against (its chat span has no
        #: text): its injection is never unmatched
        self.unjudged = False

    def add_injection(
        self,
        ts_us: int,
        event_id: str,
        scope: int,
        observations: list[tuple[str, frozenset[str], bytes | None]],
    ) -> list[Change]:
        """Add an injection's (id, keywords, vectors or None) triples; the verdicts that
        changed."""
        self._saw(ts_us)
        changed: list[Change] = []
        for obs_id, kws, vectors in observations:
            half = Half(ts_us, event_id, scope, kws, vectors)
            known = self.contents.get(obs_id)
            if known is not None and known.order <= half.order:
                continue
            self.contents[obs_id] = half
            if self.response is not None:
                self._judge(obs_id, changed)
        return changed

    def add_response(
        self,
        ts_us: int,
        event_id: str,
        scope: int,
        words: frozenset[str],
        vectors: bytes | None = None,
    ) -> list[Change]:
        """Add a response (its words of at least 5 characters, its vectors or None); the
        verdicts that changed (any of them may, when this becomes the turn's response)."""
        self._saw(ts_us)
        half = Half(ts_us, event_id, scope, words, vectors)
        if self.response is not None and self.response.order <= half.order:
            return []
        self.response = half
        changed: list[Change] = []
        sims: dict[str, float] = {}
        if self.threshold is not None and vectors is not None and len(self.contents) > 1:
            from memdiag.semantic import similarities

            embedded = [(o, h.vectors) for o, h in self.contents.items() if h.vectors is not None]
            found = similarities([v for _, v in embedded], vectors)
            sims = {o: sim for (o, _), sim in zip(embedded, found, strict=True)}
        for obs_id in self.contents:
            self._judge(obs_id, changed, sims.get(obs_id))
        return changed

    def _judge(self, obs_id: str, changed: list[Change], sim: float | None = None) -> None:
        response = self.response
        content = self.contents[obs_id]
        if response is None:
            return
        later = max(response.order, content.order)
        judged = Judged(
            judge(
                content.words,
                response.words,
                content.vectors,
                response.vectors,
                self.threshold,
                sim,
            ),  # fmt: skip
            later[0],
            response.scope,
            content.scope,
            later[1],
        )
        before = self.judged.get(obs_id)
        if before != judged:
            self.judged[obs_id] = judged
            changed.append((obs_id, before, judged))

    def _saw(self, ts_us: int) -> None:
        if self.first_ts is None or ts_us < self.first_ts:
            self.first_ts = ts_us

    def pending_half(self) -> str | None:
        """The half waiting for its partner, if the turn is not joined."""
        if self.response is None:
            return INJECTION if self.contents and not self.unjudged else None
        return None if self.contents else RESPONSE
