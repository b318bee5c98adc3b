"""The edge: bytes from Kafka in, validated event models or dead-letter reasons out.

Every message is validated exactly once, here. A message holds one event (a JSON object)
or a batch (a JSON array of events); in a batch only the bad elements are rejected. The
decoder never raises on input: whatever the bytes, it says what it accepted and, for the
rest, a ``reason`` (a short, stable label for counters and queries) and a ``detail`` a
person can act on.

Two paths. A good event is decoded and validated in one pass by msgspec, straight into its
model (:mod:`memdiag.schemas.models`: structs that mirror the schema files; a test keeps
them in agreement). Whatever msgspec refuses is read again and checked against the JSON
Schema itself (fastjsonschema), which says why: the schema files stay the one source of the
reasons producers see.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from typing import Any, Union

import fastjsonschema
import msgspec
import orjson

from memdiag.contract import (
    BAD_TS,
    BAD_VALUE,
    ID_TOO_LONG,
    INPUT_REASONS,
    LATE_EVENT,
    MISSING_FIELD,
    NOT_AN_EVENT,
    NOT_JSON,
    REUSED_EVENT_ID,
    TOO_LARGE,
    UNKNOWN_KIND,
    WRONG_TYPE,
)
from memdiag.schemas import EVENT_KINDS, load_schema
from memdiag.schemas.models import (
    EDGE_FIELD_PATTERN,
    MODELS,
    AnyEvent,
    RecallProbe,
    SessionOutcome,
    format_ts,
    iso_to_us,
    ts_us_of,
)

#: The reasons the decoder gives (the `reason` column, dead_letter_total{reason}): the input
#: reasons but ``late_event`` and ``reused_event_id``, which the session stage gives.
REASONS = tuple(r for r in INPUT_REASONS if r not in (LATE_EVENT, REUSED_EVENT_ID))

_RFC3339 = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"
)


class Rejected(msgspec.Struct, frozen=True, gc=False):
    """One event (or whole message) the edge refused, with why."""

    index: int  # position in the batch; 0 for a single event or a whole-message failure
    reason: str
    detail: str
    payload: bytes  # the offending event's bytes (the whole message when it is unreadable)


class Elements:
    """A batch message's elements, each as its bytes: split once, when an element's bytes
    are first needed (an event to re-route or to dead-letter), not for every batch."""

    __slots__ = ("_raw", "_split")

    def __init__(self, raw: bytes):
        self._raw = raw
        self._split: list[msgspec.Raw] | None = None

    def __getitem__(self, index: int) -> msgspec.Raw:
        if self._split is None:
            self._split = _ELEMENTS.decode(self._raw)
        return self._split[index]


class Accepted(msgspec.Struct, frozen=True, gc=False):
    index: int
    event: AnyEvent
    #: the event's bytes as published (kept for re-routing, extra fields included)
    raw: bytes | msgspec.Raw | None
    #: where ``raw`` is when it is None: the elements of the batch the event came in
    elements: Elements | None = None

    @property
    def payload(self) -> bytes:
        raw = self.raw if self.raw is not None else self.elements[self.index]  # type: ignore[index]
        return bytes(raw)

    def reroutable(self) -> orjson.Fragment:
        """The event to put back on its topic, as it was sent (its bytes, not re-encoded)."""
        return orjson.Fragment(self.payload)


class Decoded(msgspec.Struct, frozen=True, gc=False):
    accepted: list[Accepted]
    rejected: list[Rejected]
    batch: bool


Validator = Callable[[Any], Any]


_TOO_DEEP = (
    "the event nests arrays or objects deeper than memdiag reads (about a thousand levels): "
    "flatten it"
)

#: A batch's elements, each left as its bytes.
_ELEMENTS = msgspec.json.Decoder(list[msgspec.Raw])


class _Never(msgspec.Struct, tag_field="kind", tag="\x00"):
    """No event's kind: in a union with a single model, it makes msgspec require ``kind``
    (a single tagged model alone would take an object without one)."""


def models_decoder(kinds: Sequence[str]) -> msgspec.json.Decoder[Any]:
    """One pass from bytes to the model of the event's ``kind``, validated (kinds of this
    set only)."""
    models = (*(MODELS[k] for k in kinds), _Never)
    return msgspec.json.Decoder(Union[models])  # noqa: UP007 - a union built at run time


def batch_decoder(kinds: Sequence[str]) -> msgspec.json.Decoder[Any]:
    """:func:`models_decoder` for a whole batch in one pass (it fails if any element does)."""
    models = (*(MODELS[k] for k in kinds), _Never)
    return msgspec.json.Decoder(list[Union[models]])  # type: ignore[valid-type]  # noqa: UP007


@cache
def _compile_all() -> dict[str, Validator]:
    """Each kind's validator, compiled once per process (pure functions: shared)."""
    # use_default=False: validation must not write the schema's defaults into the event.
    return {
        kind: fastjsonschema.compile(load_schema(kind), use_default=False) for kind in EVENT_KINDS
    }


class Decoder:
    """Compiled validators, built once per process; :meth:`decode` is the hot path.

    ``max_skew_us``: an event whose ``ts`` is more than this ahead of its Kafka record's
    timestamp (when it was published) is rejected as ``bad_ts``, "in the future". Comparing
    with the record's timestamp, not the clock, makes the verdict independent of lag.
    """

    def __init__(
        self,
        allowed_kinds: Sequence[str],
        topic_label: str,
        max_event_bytes: int,
        max_skew_us: int | None = None,
    ):
        self._kinds = tuple(allowed_kinds)
        self._fast = models_decoder(allowed_kinds)
        self._fast_batch = batch_decoder(allowed_kinds)
        self._validators: dict[str, Validator] | None = None  # compiled when first needed
        self._other_kinds = {k for k in EVENT_KINDS if k not in allowed_kinds}
        self._topic_label = topic_label
        self._max_event_bytes = max_event_bytes
        self._max_skew_us = max_skew_us
        self._horizon_us: int | None = None  # set per message from its record timestamp

    def decode(self, raw: bytes | None, timestamp_ms: int | None = None) -> Decoded:
        """``timestamp_ms``: the Kafka record's timestamp (checks events from the future)."""
        self._horizon_us = (
            None
            if timestamp_ms is None or self._max_skew_us is None or timestamp_ms <= 0
            else timestamp_ms * 1000 + self._max_skew_us
        )
        if raw is None:
            return Decoded([], [Rejected(0, NOT_AN_EVENT, "the message has no value", b"")], False)
        accepted: list[Accepted] = []
        rejected: list[Rejected] = []
        first = raw[:1]
        if first == b"{":
            self._one(0, raw, accepted, rejected)
            return Decoded(accepted, rejected, False)
        if first == b"[":
            if len(raw) <= self._max_event_bytes and self._whole(raw, accepted, rejected):
                return Decoded(accepted, rejected, True)
            try:
                elements = _ELEMENTS.decode(raw)
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                return self._slowly(raw)
            for i, element in enumerate(elements):
                self._one(i, element, accepted, rejected)
            return Decoded(accepted, rejected, True)
        return self._slowly(raw)

    def _too_large_detail(self, size: int) -> str:
        return (
            f"event is {size} bytes, over MEMDIAG_MAX_EVENT_BYTES={self._max_event_bytes}; "
            "shorten its texts or raise the limit"
        )

    def _whole(self, raw: bytes, accepted: list[Accepted], rejected: list[Rejected]) -> bool:
        """A batch whose elements all fit the models, in one pass (no element can be over
        the size limit: the whole is not). False: some element does not fit; the caller
        takes them one by one to say which and why."""
        try:
            events = self._fast_batch.decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            return False
        elements = Elements(raw)
        for i, event in enumerate(events):
            if isinstance(event, _Never):
                accepted.clear()
                rejected.clear()
                return False
            problem = self._after_schema(event)
            if problem is None:
                accepted.append(Accepted(i, event, None, elements))
            else:
                rejected.append(Rejected(i, problem[0], problem[1], bytes(elements[i])))
        return True

    def _one(
        self,
        index: int,
        raw: bytes | msgspec.Raw,
        accepted: list[Accepted],
        rejected: list[Rejected],
    ) -> None:
        """One event (a message, or an element of a batch): its model, or why not."""
        size = len(raw)
        if size > self._max_event_bytes:
            rejected.append(Rejected(index, TOO_LARGE, self._too_large_detail(size), bytes(raw)))
            return
        try:
            event = self._fast.decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            rejected.append(self._why(index, raw, exc))
            return
        except RecursionError:
            rejected.append(Rejected(index, BAD_VALUE, _TOO_DEEP, bytes(raw)))
            return
        if isinstance(event, _Never):
            rejected.append(self._why(index, raw, ValueError("no such kind")))
            return
        problem = self._after_schema(event)
        if problem is not None:
            reason, detail = problem
            rejected.append(Rejected(index, reason, detail, bytes(raw)))
            return
        accepted.append(Accepted(index, event, raw))

    def _why(self, index: int, raw: bytes | msgspec.Raw, exc: Exception) -> Rejected:
        """Why msgspec refused an event, in the schema's words."""
        payload = bytes(raw)
        try:
            item = orjson.loads(payload)
        except RecursionError:
            return Rejected(index, BAD_VALUE, _TOO_DEEP, payload)
        except orjson.JSONDecodeError as err:
            return Rejected(index, NOT_JSON, f"not valid UTF-8 JSON: {err}. Publish one JSON "
                            "object or array a message.", payload)  # fmt: skip
        problem = self.check(item)
        if problem is None:  # the schema takes what the model does not: say what msgspec saw
            problem = (BAD_VALUE, str(exc))
        return Rejected(index, problem[0], problem[1], payload)

    def _after_schema(self, event: AnyEvent) -> tuple[str, str] | None:
        """What the schema cannot say: a real date-time, not from the future, scores that
        match the results, a failure_context memdiag can keep."""
        try:
            ts_us = ts_us_of(event.ts)  # remembered for the stages
        except ValueError:
            return (
                BAD_TS,
                f"ts {_show(event.ts)} is not a valid RFC 3339 date-time with an offset "
                "(a real date, in the years 1 to 9999 UTC)",
            )
        if self._horizon_us is not None and ts_us > self._horizon_us:
            ahead = (ts_us - self._horizon_us + (self._max_skew_us or 0)) / 1_000_000
            return (
                BAD_TS,
                f"ts {_show(event.ts)} is in the future: {ahead:,.1f} s ahead of when it was "
                f"published ({format_ts(self._horizon_us - (self._max_skew_us or 0))}, its "
                "Kafka record's timestamp), more than MEMDIAG_MAX_CLOCK_SKEW_SECONDS "
                f"({(self._max_skew_us or 0) / 1_000_000:g} s) allows. Check the clock of "
                "the host that wrote it",
            )
        kind = type(event)  # the model: a class test, where ``event.kind`` is a call
        if kind is SessionOutcome:
            context = event.failure_context  # type: ignore[union-attr]
            if context is not None and deeper_than(context, MAX_DEPTH):
                return (
                    BAD_VALUE,
                    f"failure_context nests deeper than {MAX_DEPTH} levels; memdiag keeps it "
                    "as JSON and re-encodes it: flatten it",
                )
            if context is not None:
                try:
                    orjson.dumps(context)
                except (TypeError, orjson.JSONEncodeError) as exc:
                    return (
                        BAD_VALUE,
                        f"failure_context cannot be kept as JSON ({exc}); memdiag re-encodes "
                        "it, and integers must fit in 64 bits: send larger ones as strings",
                    )
        elif kind is RecallProbe:
            return _scores_problem(event.scores, event.result_ids)  # type: ignore[union-attr]
        return None

    def _slowly(self, raw: bytes) -> Decoded:
        """A message msgspec could not even split: JSON read whole, each element checked."""
        try:
            doc = orjson.loads(raw)
        except RecursionError:
            return Decoded([], [Rejected(0, BAD_VALUE, _TOO_DEEP, raw)], False)
        except orjson.JSONDecodeError as exc:
            reason = TOO_LARGE if len(raw) > self._max_event_bytes else NOT_JSON
            if reason == TOO_LARGE:
                detail = self._too_large_detail(len(raw))
            else:
                detail = f"not valid UTF-8 JSON: {exc}. Publish one JSON object or array a message."
            return Decoded([], [Rejected(0, reason, detail, raw)], False)
        if not isinstance(doc, list):
            accepted: list[Accepted] = []
            rejected: list[Rejected] = []
            self._checked(0, doc, raw, accepted, rejected)
            return Decoded(accepted, rejected, False)
        accepted, rejected = [], []
        for i, item in enumerate(doc):
            self._checked(i, item, None, accepted, rejected)
        return Decoded(accepted, rejected, True)

    def _checked(self, index: int, item: Any, raw: bytes | None, accepted: list[Accepted],
                 rejected: list[Rejected]) -> None:  # fmt: skip
        payload = raw if raw is not None else _dumps(item)
        if len(payload) > self._max_event_bytes:
            rejected.append(Rejected(index, TOO_LARGE, self._too_large_detail(len(payload)),
                                     payload))  # fmt: skip
            return
        problem = self.check(item)
        if problem is None:
            try:  # the schema accepts it: the model must (else say why it does not)
                event: AnyEvent = msgspec.convert(item, MODELS[item["kind"]])  # type: ignore[assignment]
            except msgspec.ValidationError as exc:
                problem = (BAD_VALUE, str(exc))
            except RecursionError:
                problem = (BAD_VALUE, _TOO_DEEP)
            else:
                problem = self._after_schema(event)
                if problem is None:
                    accepted.append(Accepted(index, event, payload))
                    return
        rejected.append(Rejected(index, problem[0], problem[1], payload))

    def check(self, item: Any) -> tuple[str, str] | None:
        """Validate one element; ``None`` if it is a good event, else (reason, detail)."""
        if not isinstance(item, dict):
            return (
                NOT_AN_EVENT,
                f"expected a JSON object (or an array of objects), got {_json_type(item)}",
            )
        kind = item.get("kind")
        if self._validators is None:
            compiled = _compile_all()
            self._validators = {k: compiled[k] for k in self._kinds}
        validator = self._validators.get(kind) if isinstance(kind, str) else None
        if validator is None:
            if "kind" not in item:
                return MISSING_FIELD, "missing required field 'kind'"
            if not isinstance(kind, str):
                return WRONG_TYPE, f"kind must be a string, got {_json_type(kind)}"
            if kind in self._other_kinds:
                return (
                    UNKNOWN_KIND,
                    f"kind {_show(kind)} does not belong on {self._topic_label}; publish "
                    "judgements to the judgements topic, memory_written, memory_indexed, "
                    "recall_probe and ambient_context to memory, and session events to events",
                )
            return (
                UNKNOWN_KIND,
                f"unknown kind {_show(kind)}; expected one of {sorted(self._validators)}",
            )
        try:
            validator(item)
        except fastjsonschema.JsonSchemaValueException as exc:
            return _explain(exc, item)
        if kind == "recall_probe":
            return _scores_problem(item.get("scores"), item["result_ids"])
        return None


def _scores_problem(
    scores: Sequence[Any] | None, result_ids: Sequence[Any]
) -> tuple[str, str] | None:
    if scores is not None and len(scores) != len(result_ids):
        return (
            BAD_VALUE,
            f"scores has {len(scores)} values for {len(result_ids)} result_ids; give one score "
            "per result, in the same order, or no scores",
        )
    return None


def _explain(exc: fastjsonschema.JsonSchemaValueException, item: dict[str, Any]) -> tuple[str, str]:
    path = (exc.name or "data").replace("data.", "", 1).replace("data", "", 1) or "(event)"
    rule = exc.rule
    if rule == "required":
        missing = _missing(exc.rule_definition, exc.value)
        where = "" if path == "(event)" else f" in {path}"
        return MISSING_FIELD, f"missing required field {missing}{where}"
    if rule == "type":
        return (
            WRONG_TYPE,
            f"{path} must be {_expected(exc.rule_definition)}, got {_json_type(exc.value)}",
        )
    if rule == "anyOf" and (names := _spellings(exc.rule_definition)):  # an edge field, unsent
        where = "" if path == "(event)" else f" in {path}"
        return (
            MISSING_FIELD,
            f"missing required field {names[0]!r}{where} (also accepted as "
            + " or ".join(repr(n) for n in names[1:])
            + ")",
        )
    if rule == "pattern" and path == "ts":
        return (
            BAD_TS,
            f"ts {_show(exc.value)} is not RFC 3339 with an offset (e.g. 2026-11-21T09:30:00.250Z)",
        )
    if rule == "pattern" and exc.rule_definition == EDGE_FIELD_PATTERN:
        return (
            BAD_VALUE,
            f"{path} {_show(exc.value)} contains '|', which separates the parts of an edge key "
            "(source|target|relationship): send it without one",
        )
    if rule == "maxLength":
        label = ID_TOO_LONG if path.endswith("id") else BAD_VALUE
        return (
            label,
            f"{path} is {len(exc.value)} characters, over the limit of {exc.rule_definition}",
        )
    if rule == "minLength":
        return BAD_VALUE, f"{path} must not be empty"
    if rule in ("enum", "const"):
        allowed = exc.rule_definition if rule == "enum" else [exc.rule_definition]
        return BAD_VALUE, f"{path} is {_show(exc.value)}, expected one of {allowed}"
    return BAD_VALUE, f"{path}: {exc.message}"


def _spellings(alternatives: Any) -> list[str]:
    """The names of an ``anyOf`` of single ``required`` names (one field's spellings, as in
    an edge key's), else nothing."""
    if not isinstance(alternatives, list) or len(alternatives) < 2:
        return []
    names = []
    for alternative in alternatives:
        required = alternative.get("required") if isinstance(alternative, dict) else None
        if not isinstance(required, list) or len(required) != 1 or len(alternative) != 1:
            return []
        names.append(str(required[0]))
    return names


def _missing(required: Any, value: Any) -> str:
    if isinstance(required, list) and isinstance(value, dict):
        names = [name for name in required if name not in value]
        if names:
            return ", ".join(repr(n) for n in names)
    return repr(required)


def _expected(definition: Any) -> str:
    if isinstance(definition, list):
        return " or ".join(f"a{'n' if t[0] in 'aeiou' else ''} {t}" for t in definition)
    return f"a{'n' if str(definition)[0] in 'aeiou' else ''} {definition}"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def parse_ts(value: str) -> int | None:
    """Microseconds since the epoch of an RFC 3339 string, or ``None`` if it is not one."""
    if not _RFC3339.fullmatch(value):
        return None
    return iso_to_us(value)


def _show(value: Any) -> str:
    """A value in a detail, bounded: never the ``repr`` of a whole (possibly deep) input."""
    if isinstance(value, str):
        return repr(value if len(value) <= 80 else value[:79] + "…")
    if isinstance(value, bool | int | float) or value is None:
        return repr(value)[:80]
    return f"{_json_type(value)}"


def _dumps(item: Any) -> bytes:
    """An element's bytes for its dead letter. orjson refuses to encode more than 254 levels
    of nesting (and ``repr`` recurses without a bound), so deeper input gets a note."""
    try:
        return orjson.dumps(item)
    except (TypeError, orjson.JSONEncodeError):
        return (
            b'"(not re-encodable: nested deeper than the 254 levels orjson writes; the whole '
            b"message is at this dead letter's topic, partition and offset)\""
        )


#: The deepest nesting an event may have where memdiag keeps free-form JSON
#: (``failure_context``): memdiag re-encodes it for the state, the diagnostics and DuckDB,
#: and orjson refuses more than 254 levels. Far beyond any real context.
MAX_DEPTH = 64


def deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests containers more than ``limit`` levels deep (iterative: no
    recursion, however deep the input)."""
    stack = [(value, 0)]
    children: Iterable[Any]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth >= limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
