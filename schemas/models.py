"""Python models of the input events (docs/events.md).

The JSON Schema files beside this module are the contract; these msgspec structs mirror them
field for field and constraint for constraint (a test keeps the two in agreement), so that a
message is decoded and validated in one pass at the edge. Event time is read as integer
microseconds since the epoch (``ts_us``): exact, cheap to compare, and free of float error
at the window boundary.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ts_to_us(dt: datetime) -> int:
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def us_to_datetime(ts_us: int) -> datetime:
    return datetime.fromtimestamp(ts_us // 1_000_000, tz=UTC).replace(microsecond=ts_us % 1_000_000)


def format_ts(ts_us: int) -> str:
    """RFC 3339 in UTC with microseconds, the form memdiag writes everywhere. Each minute
    is formatted once and remembered (8,192 minutes: 5.7 days), the seconds by arithmetic:
    the worker stamps every row it sends, and a catch-up's rows have nearly as many distinct
    seconds as rows (a datetime per second not remembered cost 8 us, this way 0.7 us).

    A time outside years 1 to 9999 UTC is written as the nearest one inside: event times
    never are (the decoder refuses them), but a Kafka record's timestamp is whatever its
    producer set (microseconds written as milliseconds reach year 50,000), and a row's
    ``published_at`` must not stop the worker."""
    if not MIN_US <= ts_us <= MAX_US:
        ts_us = MIN_US if ts_us < MIN_US else MAX_US
    minute, rest = divmod(ts_us, 60_000_000)
    second, us = divmod(rest, 1_000_000)
    # concatenation, the seconds looked up and the microseconds padded by an added million:
    # 0.7 us, where one f-string with two format specs took 1.0 us
    return _format_minute(minute) + _SECONDS[second] + str(1_000_000 + us)[1:] + "Z"


def written_ts(ts: str, ts_us: int) -> str:
    """``format_ts(ts_us)`` for an event's ``ts`` as the decoder accepted it (``ts_us`` is
    its time): the text itself, or its milliseconds or seconds padded, where it is in UTC
    with a capital ``T`` and ``Z`` (as runtimes write it): 0.24 us where formatting took
    0.48 (one timeit), on a row a search. Any other form (an offset, a lowercase letter,
    more or fewer digits) is formatted from ``ts_us``."""
    if ts[-1:] == "Z" and ts[10:11] == "T":
        n = len(ts)
        if n == 27 and ts[19] == ".":
            return ts
        if n == 24 and ts[19] == ".":
            return ts[:23] + "000Z"
        if n == 20:
            return ts[:19] + ".000000Z"
    return format_ts(ts_us)


_SECONDS = tuple(f"{s:02d}." for s in range(60))


@lru_cache(maxsize=8192)
def _format_minute(minute: int) -> str:
    """``minute`` minutes after the epoch, as YYYY-MM-DDTHH:MM: (UTC)."""
    # YYYY-MM-DDTHH:MM is the first 16 characters for every year memdiag takes (1 to 9999)
    return f"{(_EPOCH + timedelta(minutes=minute)).isoformat(timespec='minutes')[:16]}:"


#: The pattern of ``ts`` in every schema: RFC 3339 with an offset.
TS_PATTERN = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}"
    r"(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$"
)

Ts = Annotated[str, Meta(pattern=TS_PATTERN)]
EventId = Annotated[str, Meta(min_length=1, max_length=128)]
Id256 = Annotated[str, Meta(min_length=1, max_length=256)]
Opt256 = Annotated[str, Meta(max_length=256)]
Count = Annotated[int, Meta(ge=0)]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)


@lru_cache(maxsize=8_192)
def ts_us_of(ts: str) -> int:
    """Microseconds since the epoch of a ``ts`` the decoder accepted (remembered: every
    stage reads an event's time more than once, within the batch that decoded it; 8,192
    entries cover a batch, where 65,536 held 10-15 MB of the worker's heap to no use)."""
    if ts[11:13] == "24":  # hour 24: Python 3.14's parser reads it as the next day's 00
        raise ValueError(f"not an RFC 3339 date-time: {ts!r}")  # (RFC 3339: hours 00-23)
    try:  # the schemas' pattern holds (the decoder checked it): Python's parser reads it
        dt = datetime.fromisoformat(ts)
    except ValueError:  # a lowercase t or z (RFC 3339 allows them; Python 3.11 does not)
        us = iso_to_us(ts)
    else:
        us = (dt - _EPOCH) // _ONE_US if dt.tzinfo is not None else iso_to_us(ts)
        if us is not None and not MIN_US <= us <= MAX_US:
            us = None
    if us is None:  # the decoder refuses these: a model never holds one
        raise ValueError(f"not an RFC 3339 date-time: {ts!r}")
    return us


#: The event times memdiag accepts: those a UTC date-time can write back, years 1 to 9999
#: (0001-01-01T00:00:00+01:00 is in year 0 in UTC: refused).
MIN_US = ts_to_us(datetime(1, 1, 1, tzinfo=UTC))
MAX_US = ts_to_us(datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC))


def iso_to_us(value: str) -> int | None:
    """Microseconds of an RFC 3339-shaped string (``YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM)``,
    ``T`` and ``Z`` in either case; fractions beyond the microsecond are cut off); ``None`` if
    it is no real date-time, or one outside the years 1 to 9999 in UTC. The whole second is
    read once and remembered: a stream's events share their seconds."""
    if len(value) < 20:
        return None
    seconds = _second(value[:19])
    if seconds is None:
        return None
    i, n = 19, len(value)
    micros = 0
    if value[i] == ".":
        j = i + 1
        while j < n and "0" <= value[j] <= "9":
            j += 1
        digits = value[i + 1 : j]
        if not digits:
            return None
        micros = int(digits[:6].ljust(6, "0"))
        i = j
    zone = value[i:]
    if zone in ("Z", "z"):
        offset = 0
    elif len(zone) == 6 and zone[0] in "+-" and zone[3] == ":" and zone[1:3].isdigit() and \
            zone[4:6].isdigit():  # fmt: skip
        offset = int(zone[1:3]) * 3600 + int(zone[4:6]) * 60
        if offset >= 86_400:  # Python's reading: an offset under a day (even +01:67)
            return None
        if zone[0] == "-":
            offset = -offset
    else:
        return None
    ts_us = (seconds - offset) * 1_000_000 + micros
    return ts_us if MIN_US <= ts_us <= MAX_US else None


@lru_cache(maxsize=65_536)
def _second(text: str) -> int | None:
    """Seconds since the epoch of ``YYYY-MM-DDTHH:MM:SS`` read as UTC (None: no such time)."""
    if text[10] not in "Tt" or not (text[:4] + text[5:7] + text[8:10] + text[11:13] + text[14:16]
                                    + text[17:19]).isdigit():  # fmt: skip
        return None
    if text[4] != "-" or text[7] != "-" or text[13] != ":" or text[16] != ":":
        return None
    try:
        dt = datetime(int(text[:4]), int(text[5:7]), int(text[8:10]), int(text[11:13]),
                      int(text[14:16]), int(text[17:19]), tzinfo=UTC)  # fmt: skip
    except ValueError:
        return None
    return ts_to_us(dt) // 1_000_000


class Event(Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="kind", gc=False):
    """What every input event has (schemas/*.schema.json). The models are decoded from the
    wire by msgspec and validated in the same pass (:mod:`memdiag.schemas.decode`); unknown
    fields are ignored, as the schemas allow.

    ``gc=False`` (inherited by every model but :class:`SessionOutcome`): the collector
    never tracks an event. What one holds is strings, numbers and tuples of them or of
    structs that hold the same, so it can be in no reference cycle; a batched message's
    events are tens of thousands of objects the young collections would otherwise walk."""

    event_id: EventId
    ts: Ts

    @property
    def ts_us(self) -> int:
        return ts_us_of(self.ts)

    @property
    def kind(self) -> str:
        return str(self.__struct_config__.tag)


class SessionEventBase(Event, frozen=True, kw_only=True):
    session_id: Id256
    # Optional, but never null (the schemas say string): None only when absent.
    agent_id: Opt256 = None  # type: ignore[assignment]
    org_id: Opt256 = None  # type: ignore[assignment]
    project_id: Opt256 = None  # type: ignore[assignment]


class Search(SessionEventBase, frozen=True, kw_only=True, tag="search"):
    query: str
    result_ids: tuple[str, ...]
    source: Literal["agent", "viewer"] = "agent"


class Observation(Struct, frozen=True, kw_only=True, omit_defaults=True):
    id: Id256
    content: str


#: Each edge field's spellings on the wire, the canonical one first (contract section 10:
#: ``source_id`` or ``sourceId``, ``target_id`` or ``targetId``, ``relationship`` or
#: ``relationshipName`` or ``relationship_name``).
EDGE_FIELD_SPELLINGS: dict[str, tuple[str, ...]] = {
    "source_id": ("source_id", "sourceId"),
    "target_id": ("target_id", "targetId"),
    "relationship": ("relationship", "relationshipName", "relationship_name"),
}

#: The pattern of every edge field in the schema: no ``|``, which separates the parts of an
#: edge key (``source|target|relationship``).
EDGE_FIELD_PATTERN = "^[^|]*$"


def _shown(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:79] + "…")


def _spelled(name: str) -> Any:
    """An optional field read (and written) as ``name`` on the wire."""
    return msgspec.field(default=None, name=name)


class EdgeKey(
    Struct, frozen=True, kw_only=True, omit_defaults=True, repr_omit_defaults=True, gc=False
):
    """A knowledge-graph edge, always read as ``source_id``, ``target_id``,
    ``relationship``. On the wire each field may come in any of its spellings
    (:data:`EDGE_FIELD_SPELLINGS`); decoding folds them into the canonical fields, so the
    other spellings' attributes are always ``None`` on a decoded key (and never encoded).
    Refused (a ``ValueError``, a ``msgspec.ValidationError`` when decoding): a field given
    in no spelling, two spellings of one field that disagree, a ``|`` in a field.
    (``gc=False``: it holds strings only, it can be in no reference cycle.)"""

    # None only while decoding (absent): a decoded key has all three (the schema says string).
    source_id: str = None  # type: ignore[assignment]
    target_id: str = None  # type: ignore[assignment]
    relationship: str = None  # type: ignore[assignment]
    # The other spellings (GraphFeedbackService writes camelCase); None once decoded.
    source_id_camel: str = _spelled("sourceId")
    target_id_camel: str = _spelled("targetId")
    relationship_camel: str = _spelled("relationshipName")
    relationship_snake: str = _spelled("relationship_name")

    def __post_init__(self) -> None:
        # The hot path (today's spelling, no '|'): as few steps as it can be, once per edge.
        if (
            self.source_id_camel is self.target_id_camel is self.relationship_camel
            is self.relationship_snake is None
        ):  # fmt: skip
            try:
                if (
                    "|" not in self.source_id
                    and "|" not in self.target_id
                    and "|" not in self.relationship
                ):
                    return
            except TypeError:  # a canonical field absent (None): another spelling, or none
                pass
        self._fold()

    def _fold(self) -> None:
        """Each field from whichever of its spellings were given, or why not."""
        source = _agreed("source", "source_id", self.source_id, "sourceId", self.source_id_camel)
        target = _agreed("target", "target_id", self.target_id, "targetId", self.target_id_camel)
        relationship = _agreed("relationship", "relationship", self.relationship,
                               "relationshipName", self.relationship_camel)  # fmt: skip
        relationship = _agreed(
            "relationship",
            "relationship" if self.relationship is not None else "relationshipName",
            relationship,
            "relationship_name",
            self.relationship_snake,
        )
        for name, value in (("source_id", source), ("target_id", target),
                            ("relationship", relationship)):  # fmt: skip
            if value is None:
                raise ValueError(
                    f"edge field {name} is missing (spelled "
                    + " or ".join(EDGE_FIELD_SPELLINGS[name])
                    + ")"
                )
            if "|" in value:
                raise ValueError(
                    f"edge field {name} {_shown(value)} contains '|', which separates the "
                    "parts of an edge key (source|target|relationship): send it without one"
                )
        put = msgspec.structs.force_setattr
        put(self, "source_id", source)
        put(self, "target_id", target)
        put(self, "relationship", relationship)
        put(self, "source_id_camel", None)
        put(self, "target_id_camel", None)
        put(self, "relationship_camel", None)
        put(self, "relationship_snake", None)


def _agreed(
    field: str, name: str, value: str | None, other_name: str, other: str | None
) -> str | None:
    """One field from two of its spellings (either may be absent); two that differ are
    refused, named and shown."""
    if other is None:
        return value
    if value is None or value == other:
        return other
    raise ValueError(
        f"the edge's {field} is given twice and the two disagree: {name} is {_shown(value)}, "
        f"{other_name} is {_shown(other)}; send one spelling, or the same value in each"
    )


class Injection(SessionEventBase, frozen=True, kw_only=True, tag="injection"):
    turn_id: Id256
    observations: tuple[Observation, ...]
    graph_entity_ids: tuple[str, ...] = ()
    graph_edge_keys: tuple[EdgeKey, ...] = ()


class Response(SessionEventBase, frozen=True, kw_only=True, tag="response"):
    turn_id: Id256
    text: str


class ToolCall(Struct, frozen=True, kw_only=True, omit_defaults=True):
    tool: str
    success: bool
    file: str = None  # type: ignore[assignment]


class SessionError(Struct, frozen=True, kw_only=True, omit_defaults=True):
    message: str
    tool: str
    recoverable: bool


class SessionOutcome(SessionEventBase, frozen=True, kw_only=True, tag="session_outcome", gc=True):
    """``gc=True``, unlike the other models: ``failure_context`` holds whatever object it was
    given (a client may build one), and a mutable one could point back at the event."""

    outcome: Literal["accepted", "rejected", "rework"]
    tool_calls: tuple[ToolCall, ...]
    #: required of a published outcome (never null); None only in one the trace stage made
    #: from spans that name no file (it cannot know its files: ``incomplete`` does not apply)
    files_modified: tuple[str, ...]
    errors: tuple[SessionError, ...]
    helpful_observation_ids: tuple[str, ...] = ()
    failure_context: Any = None


#: a token count: an integer (1.0 is 1, as JSON Schema's ``integer``)
TokenCount = (
    Annotated[int, Meta(ge=0, le=9_223_372_036_854_775_807)]
    | Annotated[float, Meta(ge=0, le=9_223_372_036_854_775_807)]
)


def _integral(value: int | float | None, name: str) -> int | None:
    """JSON Schema's ``integer`` takes 1.0 for 1: so does memdiag."""
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{name} must be an integer")
        return int(value)
    return value


class Judgement(Event, frozen=True, kw_only=True, tag="judgement"):
    run_id: Id256
    question_id: Id256
    judge_correct: bool
    gold_evidence_ids: tuple[str, ...]
    retrieved_context_ids: tuple[str, ...]
    condition: Opt256 = ""
    repeat_index: (
        Annotated[int, Meta(ge=0, le=2_147_483_647)]
        | Annotated[float, Meta(ge=0, le=2_147_483_647)]
    ) = 0
    latency_ms: Annotated[float, Meta(ge=0)] = None  # type: ignore[assignment]
    tokens: TokenCount = None  # type: ignore[assignment]
    input_tokens: TokenCount = None  # type: ignore[assignment]
    output_tokens: TokenCount = None  # type: ignore[assignment]
    #: a graded score of the answer, 0 (wrong) to 1 (right)
    score: Annotated[float, Meta(ge=0, le=1)] = None  # type: ignore[assignment]
    duration_ms: Annotated[float, Meta(ge=0)] = None  # type: ignore[assignment]
    # provenance: what makes a comparison reproducible (contract section 2)
    run_group_id: Opt256 | None = None
    suite_id: Opt256 | None = None
    suite_version: Opt256 | None = None
    suite_checksum: Opt256 | None = None
    fixture_checksum: Opt256 | None = None
    config_fingerprint: Opt256 | None = None
    git_head: Opt256 | None = None
    service_version: Opt256 | None = None
    # hygiene (contract section 2): a reviewed gold label, and the split the question is in
    label_status: Literal["reviewed", "unreviewed"] | None = None
    split: Opt256 | None = None

    def __post_init__(self) -> None:
        for name in ("repeat_index", "tokens", "input_tokens", "output_tokens"):
            value = getattr(self, name)
            if isinstance(value, float):
                msgspec.structs.force_setattr(self, name, _integral(value, name))


class MemoryEventBase(Event, frozen=True, kw_only=True):
    agent_id: Id256


class MemoryWritten(MemoryEventBase, frozen=True, kw_only=True, tag="memory_written"):
    memory_id: Id256
    name: Annotated[str, Meta(max_length=1024)] = None  # type: ignore[assignment]
    store: Opt256 = None  # type: ignore[assignment]


class MemoryIndexed(MemoryEventBase, frozen=True, kw_only=True, tag="memory_indexed"):
    memory_id: Id256
    store: Opt256 = None  # type: ignore[assignment]


#: A recall probe's defaults (docs/events.md): the top 3, a cosine similarity of 0.35.
PROBE_K = 3
PROBE_THRESHOLD = 0.35


class RecallProbe(MemoryEventBase, frozen=True, kw_only=True, tag="recall_probe"):
    memory_id: Id256
    result_ids: tuple[Opt256, ...]
    scores: tuple[float, ...] = None  # type: ignore[assignment]
    k: Annotated[int, Meta(ge=1, le=10_000)] | Annotated[float, Meta(ge=1, le=10_000)] = PROBE_K
    threshold: float = PROBE_THRESHOLD
    # where the query came from (contract section 9): SRR and the miss reasons are the name's
    query_source: Literal["name", "task"] = "name"

    def __post_init__(self) -> None:
        if isinstance(self.k, float):
            msgspec.structs.force_setattr(self, "k", _integral(self.k, "k"))


class AmbientContext(MemoryEventBase, frozen=True, kw_only=True, tag="ambient_context"):
    session_id: Id256
    memory_ids: tuple[Opt256, ...]


SessionEvent = Search | Injection | Response | SessionOutcome
MemoryEvent = MemoryWritten | MemoryIndexed | RecallProbe | AmbientContext
AnyEvent = SessionEvent | Judgement | MemoryEvent

#: Each kind's model (the schemas' ``kind``).
MODELS: dict[str, type[Event]] = {
    m.__struct_config__.tag: m  # type: ignore[misc]
    for m in (Search, Injection, Response, SessionOutcome, Judgement, MemoryWritten,
              MemoryIndexed, RecallProbe, AmbientContext)
}  # fmt: skip


def from_dict(d: dict[str, Any]) -> AnyEvent:
    """The model of a dict (validated as the wire is: raises ``msgspec.ValidationError``)."""
    event: AnyEvent = msgspec.convert(d, MODELS[d["kind"]])  # type: ignore[assignment]
    return event


def to_dict(event: AnyEvent) -> dict[str, Any]:
    """The wire form of a model (the inverse of :func:`from_dict`): fields at their default
    (absent optional ones) left out."""
    wire: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(event))
    return wire
