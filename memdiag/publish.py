"""Publishing a JSON Lines file of events, batched the way the contract allows.

Events go to ``events`` keyed by ``session_id``, judgements to ``judgements`` keyed by
``run_id``, and the recall pipeline's events to ``memory`` keyed by ``agent_id``. A line that
is an OTLP/JSON ``TracesData`` (an object with ``resourceSpans``, as the Collector's ``file``
exporter writes a batch of spans) goes whole to ``otlp_spans``, unkeyed, one record a line,
as the Collector's Kafka exporter would send it.
Consecutive events of one key are packed into one message (a JSON array) of at most
``batch_size`` events and ``max_batch_bytes``: the order within a key is kept, which is the
only order Kafka promises anyway. The publisher does not judge events: a line that is not
JSON, or has no usable key, is sent as it is (unkeyed, alone) and the worker dead-letters it
with a reason, so nothing vanishes and the worker stays the one judge.

One thing only the broker can judge: a message over its ``message.max.bytes`` (Apache Kafka:
1 MiB by default), or over the producer's 8 MiB. A refused batch is sent again line by line;
a line refused alone goes to the dead letters in its place (``too_large``, its start as the
payload), and the publishing goes on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, MessageSizeTooLargeError, RecordListTooLargeError

from memdiag.contract import TOO_LARGE
from memdiag.kafka import KafkaUnavailable, client_options
from memdiag.schemas import MEMORY_KINDS
from memdiag.schemas.deadletters import dead_letter_id, digest
from memdiag.schemas.models import format_ts
from memdiag.settings import Settings

ProgressFn = Callable[[int, int], None]  # (bytes read so far, total bytes)


@dataclass
class PublishStats:
    """What a publish did. Lines dead-lettered as too large count in ``too_large`` (and in
    ``acknowledged``), not in ``events`` or ``span_records``."""

    lines: int = 0  # non-empty lines read
    events: int = 0
    messages: int = 0  # messages the broker acknowledged on the input topics
    unkeyed_lines: int = 0  # no session key: sent as-is, for the worker to judge
    span_records: int = 0  # OTLP/JSON lines (batches of spans), to otlp_spans
    bytes: int = 0  # the bytes of those messages
    #: the lines the broker acknowledged, on their topic or as dead letters (a failure says
    #: how far it got)
    acknowledged: int = 0
    #: lines the broker refused as too large for one message: dead-lettered in their place
    too_large: int = 0


class Line(NamedTuple):
    number: int  # its line number in the file, from 1
    payload: bytes


class Sent(NamedTuple):
    """A message on its way, and what to do if the broker refuses it as too large."""

    future: asyncio.Future[Any] | None  # None: the producer refused it before sending it
    topic: str
    key: bytes | None
    lines: list[Line]  # its lines, sent again one at a time if it is refused as too large
    batched: bool  # a JSON array of its lines (else: one line as it was read)
    size: int  # its bytes


@dataclass(frozen=True, slots=True)
class Routed:
    topic: str
    key: bytes | None
    payload: bytes  # the line, exactly as read
    batchable: bool


def route(line: bytes, settings: Settings) -> Routed:
    """Where one line goes. Never raises: the worker is the judge of bad input."""
    t = settings.topics
    try:
        doc: Any = orjson.loads(line)
    except orjson.JSONDecodeError:
        return Routed(t.events, None, line, False)
    if not isinstance(doc, dict):
        return Routed(t.events, None, line, False)
    if "resourceSpans" in doc and "kind" not in doc:
        return Routed(t.otlp_spans, None, line, False)
    if doc.get("kind") == "judgement":
        run_id = doc.get("run_id")
        key = run_id.encode("utf-8") if isinstance(run_id, str) and run_id else None
        return Routed(t.judgements, key, line, key is not None)
    if doc.get("kind") in MEMORY_KINDS:
        agent_id = doc.get("agent_id")
        key = agent_id.encode("utf-8") if isinstance(agent_id, str) and agent_id else None
        return Routed(t.memory, key, line, key is not None)
    session_id = doc.get("session_id")
    key = session_id.encode("utf-8") if isinstance(session_id, str) and session_id else None
    return Routed(t.events, key, line, key is not None)


def iter_lines(path: Path, progress: ProgressFn | None = None) -> Iterator[tuple[int, bytes]]:
    """Each non-empty line, stripped, with its line number in the file (from 1)."""
    total = path.stat().st_size
    done = 0
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            done += len(raw)
            line = raw.strip()
            if progress is not None:
                progress(done, total)
            if line:
                yield number, line


async def publish_file(
    path: Path,
    settings: Settings,
    batch_size: int = 500,
    max_batch_bytes: int = 900 * 1024,
    progress: ProgressFn | None = None,
) -> PublishStats:
    stats = PublishStats()
    producer = AIOKafkaProducer(
        **client_options(settings),
        acks="all",
        linger_ms=5,
        max_batch_size=1024 * 1024,
        max_request_size=8 * 1024 * 1024,
        request_timeout_ms=30_000,
    )
    await producer.start()
    pending: list[Sent] = []
    pending_bytes = 0
    #: messages refused as too large, whose lines go again one at a time at the next drain
    refused: list[Sent] = []
    buffers: dict[tuple[str, bytes], tuple[list[Line], int]] = {}
    buffered_bytes = 0

    async def send(topic: str, key: bytes | None, value: bytes, lines: list[Line],
                   batched: bool) -> None:  # fmt: skip
        nonlocal pending_bytes
        try:
            future = await producer.send(topic, value=value, key=key)
        except MessageSizeTooLargeError:  # over the producer's own max_request_size
            refused.append(Sent(None, topic, key, lines, batched, len(value)))
            return
        pending.append(Sent(future, topic, key, lines, batched, len(value)))
        pending_bytes += len(value)
        if len(pending) >= 2_000 or pending_bytes > 32 * 1024 * 1024:
            await drain()

    async def drain() -> None:
        """Wait for every message sent; raise the first failure that is not "too large";
        then send each line of the refused messages again on its own."""
        nonlocal pending_bytes
        failed = await _drain(pending, stats)
        pending_bytes = 0
        for sent, exc in failed:
            if not isinstance(exc, TOO_LARGE_ERRORS):
                raise exc
            refused.append(sent)
        while refused:
            sent = refused.pop(0)
            for line in sent.lines:
                await alone(sent, line)

    async def alone(sent: Sent, line: Line) -> None:
        """One line of a refused message, sent on its own and waited for, with nothing else
        queued: a batch of its own (the producer packs records sent together into one batch,
        and the broker judges the batch). Refused again, it is dead-lettered in its place."""
        value = b"[" + line.payload + b"]" if sent.batched else line.payload
        try:
            await (await producer.send(sent.topic, value=value, key=sent.key))
        except TOO_LARGE_ERRORS as exc:
            letter = orjson.dumps(too_large_letter(sent.topic, sent.key, line, settings, exc))
            await (await producer.send(settings.topics.deadletter, value=letter, key=sent.key))
            stats.too_large += 1
            if sent.topic == settings.topics.otlp_spans:
                stats.span_records -= 1
            else:
                stats.events -= 1
                stats.unkeyed_lines -= sent.key is None  # it never went to the worker
        else:
            stats.messages += 1
            stats.bytes += len(value)
        stats.acknowledged += 1

    async def flush_key(k: tuple[str, bytes]) -> None:
        nonlocal buffered_bytes
        lines, size = buffers.pop(k)
        buffered_bytes -= size
        await send(k[0], k[1], b"[" + b",".join(line.payload for line in lines) + b"]", lines, True)

    try:
        for number, payload in iter_lines(path, progress):
            stats.lines += 1
            line = Line(number, payload)
            r = route(payload, settings)
            if r.topic == settings.topics.otlp_spans:
                stats.span_records += 1
                await send(r.topic, None, r.payload, [line], False)
                continue
            if not r.batchable or r.key is None:
                stats.unkeyed_lines += r.key is None
                stats.events += 1
                await send(r.topic, r.key, r.payload, [line], False)
                continue
            stats.events += 1
            k = (r.topic, r.key)
            lines, size = buffers.get(k, ([], 0))
            if lines and size + len(payload) + 1 > max_batch_bytes:
                await flush_key(k)
                lines, size = [], 0
            lines.append(line)
            buffers[k] = (lines, size + len(payload) + 1)
            buffered_bytes += len(payload) + 1
            if len(lines) >= batch_size:
                await flush_key(k)
            elif buffered_bytes > 64 * 1024 * 1024:  # bound memory on huge files
                for key in list(buffers):
                    await flush_key(key)
        for key in list(buffers):
            await flush_key(key)
        await drain()
        await producer.flush()
    except KafkaError as exc:
        await _drain(pending, stats)  # how far it got: every delivery's outcome, none unread
        if isinstance(exc, TOO_LARGE_ERRORS):  # a dead letter refused: nothing else to do
            raise KafkaUnavailable(
                f"the broker refused a message as too large ({exc}) after {stats.acknowledged:,} "
                f"of the {stats.lines:,} lines read, even the dead letter of a line too large "
                "for it: its message.max.bytes is below what memdiag needs (64 KB and more)"
            ) from exc
        raise KafkaUnavailable(
            f"the broker stopped acknowledging ({type(exc).__name__}: {exc}) after "
            f"{stats.acknowledged:,} of the {stats.lines:,} lines read. Publishing the whole "
            "file again is safe for the tables: an event the worker already took changes no "
            "state and no row (docs/rules.md); a line it refused is dead-lettered again."
        ) from exc
    finally:
        await producer.stop()
    return stats


#: what the broker (or the producer, over its max_request_size) says of a message too large
TOO_LARGE_ERRORS = (MessageSizeTooLargeError, RecordListTooLargeError)


def too_large_letter(
    topic: str, key: bytes | None, line: Line, settings: Settings, exc: Exception
) -> dict[str, Any]:
    """The dead letter of a line no message can carry, as the worker writes one: the same
    line published again (a rerun of the file) is the same row."""
    limit = settings.deadletter_payload_bytes
    payload = line.payload
    return {
        "dead_letter_id": dead_letter_id(
            topic, settings.topic_prefix, "publish", line.number, digest(payload)
        ),
        "topic": topic,
        "partition": None,
        "offset": None,
        "batch_index": None,
        "key": key.decode("utf-8", "replace") if key is not None else None,
        "reason": TOO_LARGE,
        "detail": (
            f"the broker refused line {line.number:,} of the published file ({len(payload):,} "
            f"bytes) as too large for one message ({type(exc).__name__}): memdiag publish "
            "sent it here in its place. Trim what the event carries (long texts, big id "
            "lists), or raise the broker's message.max.bytes and MEMDIAG_MAX_EVENT_BYTES"
        ),
        "payload": payload[:limit].decode("utf-8", "replace"),
        "payload_bytes": len(payload),
        "payload_truncated": len(payload) > limit,
        "ts": format_ts(time.time_ns() // 1000),
    }


async def _drain(pending: list[Sent], stats: PublishStats) -> list[tuple[Sent, BaseException]]:
    """Wait for every delivery; count the messages and lines acknowledged; the failed ones,
    with their errors (every future's outcome is read, so none goes unretrieved)."""
    if not pending:
        return []
    results = await asyncio.gather(
        *(sent.future for sent in pending if sent.future is not None), return_exceptions=True
    )
    failed = []
    for sent, result in zip(pending, results, strict=True):
        if isinstance(result, BaseException):
            failed.append((sent, result))
        else:
            stats.messages += 1
            stats.bytes += sent.size
            stats.acknowledged += len(sent.lines)
    pending.clear()
    return failed
