"""The span stage: ``memdiag.otlp_spans`` records in, span records out to the trace stage.

No Faust, no Kafka, no state. A record is one OTLP ``TracesData`` as the Collector's Kafka
exporter writes it (``memdiag.schemas.otlp``); each of its spans becomes a span record
(``memdiag.streams.rules.spans``) and goes to the internal ``otlp-traces`` topic keyed by its
trace id, where the trace stage (``memdiag.streams.stages.traces``) keeps each trace. The
Collector writes a trace's spans over many records, keyed by trace id or not at all; this
stage puts each where its trace lives: one message to each partition of ``otlp-traces``
with the records of the traces that live there.

Bad input is dead-lettered here, with where it was (the record's partition and offset, the
span's index in it): a record that is no OTLP (``not_otlp``), a span with a broken id, one
over ``MEMDIAG_MAX_EVENT_BYTES``, one with a time more than ``MEMDIAG_MAX_CLOCK_SKEW_SECONDS``
ahead of the record's Kafka timestamp (``bad_ts``), and one whose attributes cannot be read
for its role (a malformed JSON attribute, a tool without a name: that span still links its
trace). Every other span of the record goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from memdiag.contract import BAD_TS, BAD_VALUE, NOT_OTLP, TOO_LARGE
from memdiag.contract.envelope import InMessage, Output
from memdiag.contract.words import SEMANTIC
from memdiag.schemas import otlp
from memdiag.schemas.deadletters import add_dead_letter
from memdiag.schemas.decode import Rejected
from memdiag.schemas.models import format_ts
from memdiag.settings import Settings
from memdiag.streams.rules.spans import read_span
from memdiag.streams.stages.sessions import semantic_embedder

#: The span records of one trace in one message, at most (bytes of JSON, about): a record of
#: the Collector's can hold a trace of any size.
MESSAGE_BYTES = 512 * 1024

_NO_TRACE, _NO_SPAN = bytes(16), bytes(8)


class SpanStage:
    """The span stage's logic; one per worker process."""

    def __init__(self, settings: Settings, partition_of: Callable[[str], int]):
        self.settings = settings
        self._partition_of = partition_of
        self._max_bytes = settings.max_event_bytes
        self._max_skew_us = settings.max_skew_us
        self._embed = semantic_embedder(settings) if settings.detector == SEMANTIC else None

    held_bytes = 0

    def settle(self, store: Any) -> None:
        """Nothing held: every batch writes what it changed."""

    def reset(self) -> None:
        pass  # stateless

    def process(self, msgs: list[InMessage], store: Any = None) -> Output:
        out = Output()
        for msg in msgs:
            if msg.timestamp_ms is not None:
                out.timestamp_ms = max(out.timestamp_ms or 0, msg.timestamp_ms)
            try:
                decoded = otlp.decode(msg.value)
            except otlp.NotOtlp as exc:
                rejected = Rejected(0, NOT_OTLP, str(exc), msg.value or b"")
                add_dead_letter(out, msg, rejected, self.settings)
                continue
            partitions: dict[int, list[dict[str, Any]]] = {}
            for item in otlp.spans(decoded.traces):
                rec = self._read(msg, item, out)
                if rec is not None:
                    partitions.setdefault(self._partition_of(rec["t"]), []).append(rec)
            for partition, records in partitions.items():
                out.traces.extend((partition, part) for part in parts(records))
        return out

    def _read(self, msg: InMessage, item: otlp.SpanIn, out: Output) -> dict[str, Any] | None:
        span = item.span

        def reject(reason: str, detail: str) -> None:
            rejected = Rejected(item.index, reason, detail, otlp.span_json(span))
            add_dead_letter(out, msg, rejected, self.settings)

        if len(span.trace_id) != 16 or span.trace_id == _NO_TRACE:
            reject(BAD_VALUE, "the span's trace_id is not 16 bytes, or all zeros")
            return None
        if len(span.span_id) != 8 or span.span_id == _NO_SPAN:
            reject(BAD_VALUE, "the span's span_id is not 8 bytes, or all zeros")
            return None
        if span.parent_span_id and len(span.parent_span_id) != 8:
            reject(BAD_VALUE, "the span's parent_span_id is not 8 bytes")
            return None
        size = span.ByteSize()
        if size > self._max_bytes:
            reject(TOO_LARGE, f"the span is {size} bytes, over MEMDIAG_MAX_EVENT_BYTES="
                   f"{self._max_bytes}; capture less content, or raise the limit")  # fmt: skip
            return None
        start_us = span.start_time_unix_nano // 1000
        end_us = max(span.end_time_unix_nano // 1000, start_us)
        if msg.timestamp_ms is not None and msg.timestamp_ms > 0 and self._max_skew_us is not None:
            horizon = msg.timestamp_ms * 1000 + self._max_skew_us
            if end_us > horizon:
                reject(BAD_TS, f"the span ends at {format_ts(end_us)}, "
                               f"{(end_us - horizon + self._max_skew_us) / 1e6:,.1f} s after its "
                               f"record was published ({format_ts(msg.timestamp_ms * 1000)}), "
                               f"more than MEMDIAG_MAX_CLOCK_SKEW_SECONDS allows: check the "
                               "clock of the host that made it")  # fmt: skip
                return None
        attrs = otlp.attributes(span.attributes)
        exceptions = [otlp.attributes(e.attributes) for e in span.events if e.name == "exception"]
        rec, problem = read_span(
            otlp.hex_id(span.trace_id),
            otlp.hex_id(span.span_id),
            otlp.hex_id(span.parent_span_id) if span.parent_span_id else "",
            start_us,
            end_us,
            attrs,
            item.resource,
            span.status.code == otlp.STATUS_ERROR,
            exceptions,
            span.status.message,
            self._embed,
        )
        if problem is not None:
            reject(problem.reason, problem.detail)
        rec["o"] = [msg.topic, msg.partition, msg.offset, item.index, msg.timestamp_ms]
        return rec


def parts(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """``records`` in messages of about :data:`MESSAGE_BYTES` at most."""
    parts: list[list[dict[str, Any]]] = [[]]
    size = 0
    for rec in records:
        n = len(orjson.dumps(rec))
        if parts[-1] and size + n > MESSAGE_BYTES:
            parts.append([])
            size = 0
        parts[-1].append(rec)
        size += n
    return parts
