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
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, MessageSizeTooLargeError

from memdiag.kafka import KafkaUnavailable, client_options
from memdiag.schemas import MEMORY_KINDS
from memdiag.settings import Settings

ProgressFn = Callable[[int, int], None]  # (bytes read so far, total bytes)


@dataclass
class PublishStats:
    lines: int = 0
    events: int = 0
    messages: int = 0
    unkeyed_lines: int = 0  # no session key: sent as-is, for the worker to judge
    span_records: int = 0  # OTLP/JSON lines (batches of spans), to otlp_spans
    bytes: int = 0
    #: the lines in messages the broker acknowledged (a failure says how far it got)
    acknowledged: int = 0


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


def iter_lines(path: Path, progress: ProgressFn | None = None) -> Iterator[bytes]:
    total = path.stat().st_size
    done = 0
    with path.open("rb") as f:
        for raw in f:
            done += len(raw)
            line = raw.strip()
            if progress is not None:
                progress(done, total)
            if line:
                yield line


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
    #: each message's delivery, with the number of lines it holds
    pending: list[tuple[asyncio.Future[Any], int]] = []
    buffers: dict[tuple[str, bytes], tuple[list[bytes], int]] = {}
    buffered_bytes = 0

    async def send(topic: str, key: bytes | None, value: bytes, lines: int = 1) -> None:
        pending.append((await producer.send(topic, value=value, key=key), lines))
        stats.messages += 1
        stats.bytes += len(value)
        if len(pending) >= 2_000:
            await _drain(pending, stats)

    async def flush_key(k: tuple[str, bytes]) -> None:
        nonlocal buffered_bytes
        lines, size = buffers.pop(k)
        buffered_bytes -= size
        await send(k[0], k[1], b"[" + b",".join(lines) + b"]", len(lines))

    try:
        for line in iter_lines(path, progress):
            stats.lines += 1
            r = route(line, settings)
            if r.topic == settings.topics.otlp_spans:
                stats.span_records += 1
                await send(r.topic, None, r.payload)
                continue
            if not r.batchable or r.key is None:
                stats.unkeyed_lines += r.key is None
                stats.events += 1
                await send(r.topic, r.key, r.payload)
                continue
            stats.events += 1
            k = (r.topic, r.key)
            lines, size = buffers.get(k, ([], 0))
            if lines and size + len(line) + 1 > max_batch_bytes:
                await flush_key(k)
                lines, size = [], 0
            lines.append(line)
            buffers[k] = (lines, size + len(line) + 1)
            buffered_bytes += len(line) + 1
            if len(lines) >= batch_size:
                await flush_key(k)
            elif buffered_bytes > 64 * 1024 * 1024:  # bound memory on huge files
                for key in list(buffers):
                    await flush_key(key)
        for key in list(buffers):
            await flush_key(key)
        await _drain(pending, stats)
        await producer.flush()
    except KafkaError as exc:
        try:  # how far it got: every delivery's outcome, none left unretrieved
            await _drain(pending, stats)
        except KafkaError:
            pass
        if isinstance(exc, MessageSizeTooLargeError):
            raise KafkaUnavailable(
                f"the broker refused a message as too large ({exc}) after {stats.acknowledged:,} "
                f"of the {stats.lines:,} lines read: a line of {path} (or --batch-size lines of "
                "one session) is over its message.max.bytes. Publishing again stops at the same "
                "place: trim or remove that line, or a smaller --batch-size"
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


async def _drain(pending: list[tuple[asyncio.Future[Any], int]], stats: PublishStats) -> None:
    """Wait for every delivery; count the lines of those acknowledged; raise the first
    failure after all are in (so no future's error goes unretrieved)."""
    if not pending:
        return
    results = await asyncio.gather(*(f for f, _ in pending), return_exceptions=True)
    failure: BaseException | None = None
    for (_, lines), result in zip(pending, results, strict=True):
        if isinstance(result, BaseException):
            failure = failure or result
        else:
            stats.acknowledged += lines
    pending.clear()
    if failure is not None:
        raise failure
