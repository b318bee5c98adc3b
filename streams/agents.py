"""The worker's agents: decode, call the logic, send. Nothing else lives here.

Three stages for sessions, each an agent with its own namespace of the one state table
(their source topics are co-partitioned, so one worker owns partition p of all three and of
the table's changelog), and one for benchmarks:

- ``process_events``: ``events`` -> per-session state (``s:``): searches, the turn
  join, the session aggregate; emits diagnostics, and on an outcome the steps and drafts.
- ``own_observations``: internal steps, keyed by observation -> ``o:``: counts
  and weights; emits weight updates and verdicts.
- ``gather_sessions``: internal drafts and verdicts, keyed by session -> ``g:``:
  emits the failed sessions' ``session_diagnostic``.
- ``attribute_judgements``: ``judgements`` -> a ``judgement`` diagnostic each (stateless).
- ``roll_up_counters``: the increments on ``counters`` -> a per-minute rollup of each
  (``rollups`` table), back on ``counters``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import orjson
from aiokafka.partitioner import murmur2
from faust import StreamT
from faust.types import EventT

from streams.app import (
    app,
    counters_topic,
    deadletter_topic,
    diagnostics_topic,
    events_topic,
    judgements_topic,
    rollups,
    settings,
    state,
    steps_topic,
    verdicts_topic,
    weights_topic,
)
from streams.counters import Rollups, increments
from streams.judgements import JudgementProcessor
from streams.metrics import Counters
from streams.observations import Gatherer, ObservationOwner
from streams.processor import (
    InMessage,
    Output,
    PrefixedStore,
    Processor,
    StateStore,
    failed_output,
)

log = logging.getLogger("memdiag.worker")


@lru_cache(maxsize=65_536)
def partition_of(session_id: str) -> int:
    """The partition Kafka's default partitioner gives a ``session_id`` key."""
    return (murmur2(session_id.encode("utf-8")) & 0x7FFFFFFF) % settings.events_partitions


processor = Processor(settings, partition_of)
owner = ObservationOwner(settings)
gatherer = Gatherer(settings)
judge = JudgementProcessor(settings)
rollup = Rollups()
counters = Counters()
sessions = PrefixedStore(state, "s:")
observations = PrefixedStore(state, "o:")
gathers = PrefixedStore(state, "g:")


async def _run(
    stream: StreamT, process: Callable[[InMessage, StateStore], Output], store: StateStore
) -> None:
    event: EventT
    async for event in stream.events():
        m = event.message
        msg = InMessage(m.topic, m.partition, m.offset, m.key, m.value, int(m.timestamp * 1000))
        try:
            out = process(msg, store)
        except Exception as exc:  # noqa: BLE001 - never let one message stop the agent
            log.exception("failed on %s/%d/%d; dead-lettered", m.topic, m.partition, m.offset)
            out = failed_output(msg, exc, settings)
        if not out.ts_us:
            out.ts_us = msg.timestamp_ms * 1000 if msg.timestamp_ms else 0
        await _send(out, m.topic, m.partition, m.offset)


@app.agent(events_topic, concurrency=1)
async def process_events(stream: StreamT) -> None:
    await _run(stream, processor.process, sessions)


@app.agent(steps_topic, concurrency=1)
async def own_observations(stream: StreamT) -> None:
    await _run(stream, owner.process, observations)


@app.agent(verdicts_topic, concurrency=1)
async def gather_sessions(stream: StreamT) -> None:
    await _run(stream, gatherer.process, gathers)


@app.agent(judgements_topic, concurrency=1)
async def attribute_judgements(stream: StreamT) -> None:
    await _run(stream, judge.process, {})  # stateless: each record is the event's function


@app.agent(counters_topic, concurrency=1)
async def roll_up_counters(stream: StreamT) -> None:
    await _run(stream, rollup.process, rollups)


async def _send(out: Output, topic: str, partition: int, offset: int) -> None:
    for key, records in out.diagnostics.items():
        await diagnostics_topic.send(key=key.encode("utf-8"), value=orjson.dumps(records))
    for obs_id, records in out.steps.items():
        await steps_topic.send(key=obs_id.encode("utf-8"), value=orjson.dumps(records))
    for session_id, records in out.verdicts.items():
        await verdicts_topic.send(key=session_id.encode("utf-8"), value=orjson.dumps(records))
    for obs_id, records in out.weights.items():
        # one message per update: the memory system applies each as it comes
        for record in records:
            await weights_topic.send(key=obs_id.encode("utf-8"), value=orjson.dumps(record))
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
        for name, record in increments(out.counts, out.ts_us):
            await counters_topic.send(key=name.encode("utf-8"), value=orjson.dumps(record))
    for name, record in out.counter_messages:
        await counters_topic.send(key=name.encode("utf-8"), value=orjson.dumps(record))


@app.on_partitions_assigned.connect  # type: ignore[arg-type]  # mode types receivers oddly
async def _on_assigned(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
    processor.partitions_changed()
    gatherer.partitions_changed()


@app.on_rebalance_complete.connect  # type: ignore[arg-type]  # mode types receivers oddly
async def _on_ready(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
    log.info("memdiag worker ready: partitions assigned and state recovered")
