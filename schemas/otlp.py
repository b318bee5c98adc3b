"""The edge for OpenTelemetry spans: a ``memdiag.otlp_spans`` record in, its spans out.

A record is what the OpenTelemetry Collector's Kafka exporter writes: one ``TracesData``
(wire-identical to ``ExportTraceServiceRequest``) per exported batch, encoded ``otlp_proto``
(its default) or ``otlp_json``. Both are read with the official ``opentelemetry-proto``
messages, never a parser of our own. OTLP/JSON writes trace and span ids as hex where
protobuf's JSON mapping expects base64, so the ids are put right before the message is
built; protobuf's own JSON (base64 ids, as ``MessageToJson`` writes it) is read too, and the
two are told apart by length (32 and 16 hex digits, 24 and 12 base64 characters).

Nothing here knows the GenAI conventions (``memdiag.streams.rules.spans`` does): this module turns
bytes into spans with plain Python attribute values, and says why when it cannot.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status, TracesData

STATUS_ERROR = Status.STATUS_CODE_ERROR

PROTO, JSON = "otlp_proto", "otlp_json"


class NotOtlp(ValueError):
    """The bytes are no OTLP ``TracesData``; the message says what they looked like."""


@dataclass(frozen=True, slots=True)
class Decoded:
    traces: TracesData
    encoding: str  # PROTO or JSON


def decode(raw: bytes | None) -> Decoded:
    """A record's ``TracesData``. JSON when it starts with ``{`` (after white space), else
    protobuf. Raises :class:`NotOtlp` with a reason a person can act on."""
    if not raw:
        raise NotOtlp("the record is empty: an OTLP TracesData has at least one resource")
    if raw[:1] != b"\n" and raw.lstrip(b" \t\r\n")[:1] == b"{":  # protobuf starts with \n
        return Decoded(_from_json(raw), JSON)
    traces = TracesData()
    try:
        traces.ParseFromString(raw)
    except DecodeError as exc:
        if raw.lstrip()[:1] == b"{":  # JSON after a newline after all
            return Decoded(_from_json(raw), JSON)
        raise NotOtlp(
            f"not an OTLP TracesData in otlp_proto ({exc}) nor otlp_json: point the "
            "Collector's kafka exporter at this topic with traces.encoding otlp_proto or "
            "otlp_json"
        ) from None
    if not traces.resource_spans:
        raise NotOtlp("protobuf bytes without resource_spans: not an OTLP TracesData")
    return Decoded(traces, PROTO)


_ID_FIELDS = {"traceId": 16, "spanId": 8, "parentSpanId": 8}


def _from_json(raw: bytes) -> TracesData:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise NotOtlp(f"not valid JSON ({exc}): expected OTLP/JSON (otlp_json)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans", []), list):
        raise NotOtlp("JSON, but not an OTLP TracesData: expected an object with resourceSpans")
    for rs in doc.get("resourceSpans", ()):
        for ss in _items(rs, "scopeSpans"):
            for span in _items(ss, "spans"):
                _ids_to_base64(span)
                for link in _items(span, "links"):
                    _ids_to_base64(link)
    traces = TracesData()
    try:
        json_format.ParseDict(doc, traces, ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise NotOtlp(f"OTLP/JSON that does not fit TracesData: {exc}") from None
    return traces


def _items(parent: Any, key: str) -> list[Any]:
    value = parent.get(key) if isinstance(parent, dict) else None
    return value if isinstance(value, list) else []


def _ids_to_base64(obj: Any) -> None:
    """OTLP/JSON's hex ids to the base64 protobuf's JSON mapping reads (ids already in
    base64, as protobuf itself writes them, are left alone; anything else fails the parse)."""
    if not isinstance(obj, dict):
        return
    for key, size in _ID_FIELDS.items():
        value = obj.get(key)
        if isinstance(value, str) and len(value) == 2 * size:
            try:
                obj[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
            except ValueError:
                pass  # not hex: the parse says what is wrong with it


def hex_id(raw: bytes) -> str:
    return raw.hex()


def value(v: AnyValue) -> Any:
    """A plain Python value of an attribute (bytes as hex, key-value lists as dicts)."""
    which = v.WhichOneof("value")
    if which == "string_value":
        return v.string_value
    if which == "int_value":
        return v.int_value
    if which == "double_value":
        return v.double_value
    if which == "bool_value":
        return v.bool_value
    if which == "array_value":
        return [value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return v.bytes_value.hex()
    return None


def attributes(kvs: Any) -> dict[str, Any]:
    """A repeated ``KeyValue`` as a dict (a key given twice: the last wins)."""
    out: dict[str, Any] = {}
    kv: KeyValue
    for kv in kvs:
        out[kv.key] = value(kv.value)
    return out


@dataclass(frozen=True, slots=True)
class SpanIn:
    """One span of a record, with what it needs of its resource."""

    index: int  # its position among the record's spans
    span: Span
    resource: dict[str, Any]


def spans(traces: TracesData) -> Iterator[SpanIn]:
    index = 0
    for rs in traces.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for span in ss.spans:
                yield SpanIn(index, span, resource)
                index += 1


def span_json(span: Span) -> bytes:
    """A span as OTLP/JSON (hex ids): a dead letter's payload, readable by a person."""
    doc = json_format.MessageToDict(span, use_integers_for_enums=True)
    for key in _ID_FIELDS:
        if key in doc:
            doc[key] = base64.b64decode(doc[key]).hex()
    return orjson.dumps(doc)
