"""A session's log: one compact record per event applied (keywords and word sets, never
texts), each read by name, stored as a JSON array whose first element says its kind.

Events published to ``events`` become :class:`SearchRec`, :class:`InjectionRec`,
:class:`ResponseRec` and :class:`OutcomeRec`; what OpenTelemetry spans say (the trace stage's
span retrievals and span turns, ``memdiag.streams.stages.traces``) becomes
:class:`SpanRetrievalRec` and :class:`SpanTurnRec`. ``event_id`` is the event's id (a span's
``trace:span``), ``ts`` its event time in µs, ``scope`` the index of its (agent, org,
project) in the session's scopes.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, cast

import msgspec

from memdiag.schemas.models import Injection, Response, Search, SessionEvent, SessionOutcome
from memdiag.semantic import DIMS
from memdiag.streams.rules.feedback import MIN_KEYWORD_LEN, keywords, normalise_words
from memdiag.streams.rules.followup import is_evaluated, query_key

#: An observation as a turn judges it: (id, its keywords, sorted).
Judgeable = tuple[str, tuple[str, ...]]


class Record(msgspec.Struct, frozen=True, array_like=True, tag_field="kind", gc=False):
    """``gc=False`` (inherited by every record but :class:`OutcomeRec`): a record holds
    strings, numbers, bytes and tuples of them, so it can be in no reference cycle. The
    records a session keeps (one an event) are then not tracked; before, every full
    collection walked each of them (the tuples they hold are untracked by the first
    collection that finds them holding only strings)."""

    event_id: str
    ts: int


class SearchRec(Record, frozen=True, array_like=True, tag="s"):
    source: str
    query_key: str
    #: the results of an evaluated search; only their number otherwise
    result_ids: tuple[str, ...] | int
    scope: int
    published_ms: int
    #: the query itself, only with MEMDIAG_STORE_TEXT=1
    query: str | None = None

    @property
    def evaluated(self) -> bool:
        return not isinstance(self.result_ids, int)


class InjectionRec(Record, frozen=True, array_like=True, tag="i"):
    turn_id: str
    observations: tuple[Judgeable, ...]
    entity_ids: tuple[str, ...]
    #: (source, target, relationship)
    edges: tuple[tuple[str, str, str], ...]
    scope: int
    #: each observation's content's rows (memdiag.semantic), in the order of
    #: ``observations``, under MEMDIAG_DETECTOR=semantic; None: not embedded
    vectors: tuple[bytes, ...] | None = None


class ResponseRec(Record, frozen=True, array_like=True, tag="r"):
    turn_id: str
    #: the response's distinct normalised words long enough to be a keyword, sorted
    words: tuple[str, ...]
    scope: int
    #: the text's rows (memdiag.semantic) under MEMDIAG_DETECTOR=semantic; None: not embedded
    vectors: bytes | None = None


class OutcomeRec(Record, frozen=True, array_like=True, tag="o", gc=True):
    """``gc=True``, unlike the other records: ``failure_context`` is the event's own object
    (see :class:`memdiag.schemas.models.SessionOutcome`)."""

    outcome: str
    #: (tool, file or None, success)
    tool_calls: tuple[tuple[str, str | None, bool], ...]
    files: tuple[str, ...] | None
    #: (message, tool, recoverable)
    errors: tuple[tuple[str, str, bool], ...]
    helpful: tuple[str, ...]
    failure_context: Any
    scope: int
    #: memdiag's own amendments of an outcome from spans: a higher revision takes the place
    #: of the one before
    revision: int = 0


class SpanRetrievalRec(Record, frozen=True, array_like=True, tag="sr"):
    """A retrieval span's results with content: what the conversation's next turn injects."""

    observations: tuple[Judgeable, ...]
    scope: int
    #: each result's content's rows (memdiag.semantic), in the order of ``observations``,
    #: under MEMDIAG_DETECTOR=semantic; None: not embedded
    vectors: tuple[bytes, ...] | None = None


class SpanTurnRec(Record, frozen=True, array_like=True, tag="st"):
    """A chat span: a turn from its start (``ts``) to its end (its response)."""

    end: int
    #: the output text's words (as :attr:`ResponseRec.words`); None: no text to judge
    words: tuple[str, ...] | None
    #: why it cannot be judged, when ``words`` is None
    unjudged: str | None
    scope: int
    #: the output text's rows under MEMDIAG_DETECTOR=semantic; None: not embedded
    vectors: bytes | None = None


LogRecord = SearchRec | InjectionRec | ResponseRec | OutcomeRec | SpanRetrievalRec | SpanTurnRec

_ENCODE = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder(list[LogRecord])


def encode(records: list[LogRecord]) -> bytes:
    return _ENCODE.encode(records)


def decode(raw: bytes) -> list[LogRecord]:
    return _DECODE.decode(raw)


def words_of(text: str) -> tuple[str, ...]:
    """The distinct normalised words of a response long enough to be a keyword, sorted."""
    return tuple(sorted({w for w in normalise_words(text) if len(w) >= MIN_KEYWORD_LEN}))


def record_of(
    event: SessionEvent,
    scope: int,
    published_ms: int,
    store_text: bool,
    revision: int = 0,
    embed: Callable[[str, bool], bytes] | None = None,
) -> LogRecord:
    """The log record of a validated event; ``embed`` (MEMDIAG_DETECTOR=semantic) gives a
    text's rows, kept with an injection's observations and a response."""
    if isinstance(event, Search):
        ids = event.result_ids
        return SearchRec(
            event.event_id,
            event.ts_us,
            event.source,
            query_key(event.query),
            ids if is_evaluated(event.source, ids) else len(ids),
            scope,
            published_ms,
            event.query if store_text else None,
        )
    if isinstance(event, Injection):
        return InjectionRec(
            event.event_id,
            event.ts_us,
            event.turn_id,
            tuple((o.id, tuple(sorted(keywords(o.content)))) for o in event.observations),
            event.graph_entity_ids,
            tuple((e.source_id, e.target_id, e.relationship) for e in event.graph_edge_keys),
            scope,
            None if embed is None else tuple(embed(o.content, True) for o in event.observations),
        )
    if isinstance(event, Response):
        return ResponseRec(
            event.event_id,
            event.ts_us,
            event.turn_id,
            words_of(event.text),
            scope,
            None if embed is None else embed(event.text, False),
        )
    if not isinstance(event, SessionOutcome):
        raise TypeError(f"not a session event: {event!r}")
    return OutcomeRec(
        event.event_id,
        event.ts_us,
        event.outcome,
        tuple((c.tool, c.file, c.success) for c in event.tool_calls),
        event.files_modified,
        tuple((e.message, e.tool, e.recoverable) for e in event.errors),
        event.helpful_observation_ids,
        event.failure_context,
        scope,
        revision,
    )


def span_record_of(d: dict[str, Any], scope: int) -> SpanRetrievalRec | SpanTurnRec:
    """The log record of a span retrieval or a span turn (their results' keywords and the
    turn's words come computed from the trace stage)."""
    if d["kind"] == "span_retrieval":
        observations = tuple((o, tuple(k)) for o, k in d["observations"])
        found = d.get("vectors")
        vectors = None
        if isinstance(found, list) and len(found) == len(observations):
            rows = [_rows(v) for v in found]
            vectors = None if None in rows else tuple(cast(list[bytes], rows))
        return SpanRetrievalRec(d["id"], d["ts"], observations, scope, vectors)
    words = d.get("words")
    return SpanTurnRec(
        d["id"], d["ts"], d["end"], None if words is None else tuple(words), d.get("unjudged"),
        scope, _rows(d.get("vectors")),
    )  # fmt: skip


def _rows(value: Any) -> bytes | None:
    """Vectors as a span record carries them (base64 of whole rows); None when they are not
    (the trace stage never sends such: the turn is judged by the keyword rule)."""
    if not isinstance(value, str):
        return None
    try:
        rows = base64.b64decode(value, validate=True)
    except ValueError:
        return None
    return rows if len(rows) % DIMS == 0 else None
