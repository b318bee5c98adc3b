"""The worker's agents: decode, call the logic, send. Nothing else lives here."""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

import orjson
from aiokafka.partitioner import murmur2
from faust import StreamT

from streams.app import app, deadletter_topic, diagnostics_topic, events_topic, sessions, settings
from streams.metrics import Counters
from streams.processor import InMessage, Output, Processor

log = logging.getLogger("memdiag.worker")


@lru_cache(maxsize=65_536)
def partition_of(session_id: str) -> int:
    """The partition Kafka's default partitioner gives a ``session_id`` key."""
    return (murmur2(session_id.encode("utf-8")) & 0x7FFFFFFF) % settings.events_partitions


processor = Processor(settings, partition_of)
counters = Counters()


@app.agent(events_topic, concurrency=1)
async def process_events(stream: StreamT) -> None:
    async for event in stream.events():
        m = event.message
        msg = InMessage(m.topic, m.partition, m.offset, m.key, m.value, int(m.timestamp * 1000))
        try:
            out = processor.process(msg, sessions)
        except Exception as exc:  # noqa: BLE001 - never let one message stop the agent
            log.exception("failed on %s/%d/%d; dead-lettered", m.topic, m.partition, m.offset)
            out = processor.failed(msg, exc)
        for session_id in processor.expired(m.partition):
            del sessions[session_id]
        await _send(out, m.topic, m.partition, m.offset)


async def _send(out: Output, topic: str, partition: int, offset: int) -> None:
    for key, records in out.diagnostics.items():
        await diagnostics_topic.send(key=key.encode("utf-8"), value=orjson.dumps(records))
    for dl_key, record in out.deadletters:
        await deadletter_topic.send(key=dl_key, value=orjson.dumps(record))
    for session_id, raws in out.reroute.items():
        # Back onto `events`, keyed so Kafka's partitioner puts it where its state lives.
        await events_topic.send(
            key=session_id.encode("utf-8"),
            value=orjson.dumps(raws),
            headers={"memdiag-rerouted-from": f"{topic}/{partition}/{offset}".encode()},
        )
    if out.counts:
        counters.add_all(out.counts)


@app.on_partitions_assigned.connect  # type: ignore[arg-type]  # mode types receivers oddly
async def _on_assigned(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
    processor.partitions_changed()


@app.on_rebalance_complete.connect  # type: ignore[arg-type]  # mode types receivers oddly
async def _on_ready(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
    log.info("memdiag worker ready: partitions assigned and state recovered")
