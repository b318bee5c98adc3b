"""What a stage's batch sends, straight to the producer: the state writes (each touched key
once per batch, to the changelog partition it names) and the outputs (diagnostics, dead
letters, weights, internal topics, counters); and waiting until the broker has them all."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable
from typing import Any

import faust
import orjson
from faust.types import TableT, TopicT

from memdiag.contract.envelope import CounterKey, InMessage, Output
from memdiag.streams.counters import increments, minute_of
from memdiag.streams.metrics import Counters


def in_message(m: Any) -> InMessage:
    """What the logic sees of a Faust message (its timestamp in integer milliseconds)."""
    return InMessage(
        m.topic,
        m.partition,
        m.offset,
        m.key,
        m.value,
        None if m.timestamp is None else int(m.timestamp * 1000),
    )


class TableStore:
    """A :class:`memdiag.contract.envelope.StateStore` over a Faust table.

    Writes change the table at once and are kept until :meth:`flush` sends them to the
    changelog partition they name (inside a batch there is no "current event" for Faust to
    take it from: faust-streaming #497), straight to the producer: Faust's own path
    (``send_changelog``, its buffer and its future wrappers) cost a fifth of the worker's
    time on single-event traffic. The keys are encoded as Faust encodes them (JSON), so
    Faust's recovery reads them back. The runner waits for the delivery futures before it
    commits.
    """

    def __init__(self, table: TableT):
        self._table = table
        self._data = table.data
        self._changelog = table.changelog_topic.get_topic_name()
        # Faust's memory store evicts, after a recovery, the keys of partitions no longer
        # assigned, by this map; only its own changelog reads fill it, so writes do too
        self._partitions: dict[str, int] = getattr(self._data, "_key_partition", {})
        self._pending: dict[str, tuple[int, bytes | None]] = {}

    def get(self, key: str) -> bytes | None:
        value: bytes | None = self._data.get(key)
        return value

    def put(self, key: str, value: bytes, partition: int) -> None:
        self._pending.pop(key, None)  # sent in the order of the last writes: see flush
        self._pending[key] = (partition, value)
        self._data[key] = value
        self._partitions[key] = partition

    def delete(self, key: str, partition: int) -> None:
        self._pending.pop(key, None)
        self._pending[key] = (partition, None)
        self._data.pop(key, None)
        self._partitions.pop(key, None)

    def keys(self) -> Iterable[str]:
        return list(self._data.keys())

    async def flush(self, producer: Any) -> list[asyncio.Future[Any]]:
        """Send the writes since the last flush (the last one of each key, in the order of
        those last writes: a stage that writes its commit key last gets it sent last); their
        delivery futures."""
        pending, self._pending = self._pending, {}
        send, topic, dumps = producer.send, self._changelog, orjson.dumps
        return [
            await send(topic, dumps(key), value, partition, None, None)
            for key, (partition, value) in pending.items()
        ]


class CounterBuffer:
    """Counter increments, added up per (counter, attributes, minute of event time) and
    sent at most once a second: the rollups and alerting keep their minute resolution, and
    a busy worker sends a few counter messages a second instead of one per message."""

    def __init__(self) -> None:
        self._pending: Counter[tuple[CounterKey, int]] = Counter()
        self._newest: dict[tuple[CounterKey, int], int] = {}

    def add(self, out: Output) -> None:
        """An output's increments: each in its event's minute where the stage knew the event,
        the rest in the minute of the newest event the stage handled."""
        for bucket, (value, ts_us) in out.by_minute.items():
            self._add(bucket, value, ts_us)
        fallback = out.ts_us or (out.timestamp_ms or 0) * 1000
        for key, value in out.untimed_counts().items():
            self._add((key, minute_of(fallback)), value, fallback)

    def _add(self, bucket: tuple[CounterKey, int], value: int, ts_us: int) -> None:
        self._pending[bucket] += value
        self._newest[bucket] = max(self._newest.get(bucket, 0), ts_us)

    def drain(self) -> list[tuple[str, dict[str, Any]]]:
        """The (key, record) increments to send, one per counter, attributes and minute."""
        out = []
        for (key, _minute), value in self._pending.items():
            out.extend(increments({key: value}, self._newest[(key, _minute)]))
        self._pending.clear()
        self._newest.clear()
        return out


class Sender:
    """Sends a stage's :class:`Output` to its topics, straight to the producer (Faust's
    ``Topic.send`` wraps each message in futures and buffers of its own); returns the
    delivery futures."""

    def __init__(
        self,
        app: faust.App,
        diagnostics: TopicT,
        deadletter: TopicT,
        weights: TopicT,
        events: TopicT,
        steps: TopicT,
        verdicts: TopicT,
        counters: TopicT,
        memory: TopicT,
        otlp_traces: TopicT,
        span_events: TopicT,
        buffer: CounterBuffer,
        metrics: Counters,
    ):
        self.app = app
        self.diagnostics, self.deadletter, self.weights = (
            diagnostics.get_topic_name(), deadletter.get_topic_name(), weights.get_topic_name()
        )  # fmt: skip
        self.events, self.steps = events.get_topic_name(), steps.get_topic_name()
        self.verdicts, self.counters = verdicts.get_topic_name(), counters.get_topic_name()
        self.memory = memory.get_topic_name()
        self.otlp_traces = otlp_traces.get_topic_name()
        self.span_events = span_events.get_topic_name()
        self.buffer, self.metrics = buffer, metrics

    async def send(self, out: Output) -> list[asyncio.Future[Any]]:
        futures: list[asyncio.Future[Any]] = []
        ts = None if out.timestamp_ms is None else out.timestamp_ms / 1000
        send: Any = self.app.producer.send  # aiokafka's delivery futures
        dumps = orjson.dumps

        async def put(
            topic: str, key: str | bytes | None, value: Any, timestamp: float | None = None,
            headers: Any = None, partition: int | None = None,
        ) -> None:  # fmt: skip
            k = key.encode("utf-8") if isinstance(key, str) else key
            futures.append(await send(topic, k, dumps(value), partition, timestamp, headers))

        for key, records in out.diagnostics.items():
            await put(self.diagnostics, key, records)
        for obs_id, records in out.steps.items():
            await put(self.steps, obs_id, records, ts)
        for session_id, records in out.verdicts.items():
            await put(self.verdicts, session_id, records, ts)
        # to the partition their traces (sessions) live on: one message a partition, not one
        # a trace, so a record of the Collector's costs a few messages, however many traces
        for partition, records in out.traces:
            await put(self.otlp_traces, None, records, ts, partition=partition)
        for partition, records in out.span_events:
            await put(self.span_events, None, records, ts, partition=partition)
        for obs_id, records in out.weights.items():
            for record in records:  # one message per update: the memory system applies each
                await put(self.weights, obs_id, record)
        for dl_key, record in out.deadletters:
            await put(self.deadletter, dl_key, record)
        for topic, reroute in ((self.events, out.reroute), (self.memory, out.reroute_memory)):
            for key, raws, timestamp_ms in reroute:
                # back onto its topic, keyed so Kafka's partitioner puts it where its state
                # lives, with its publish time, which the future check and `published_at` read
                await put(
                    topic,
                    key,
                    raws,
                    None if timestamp_ms is None else timestamp_ms / 1000,
                    [("memdiag-rerouted", b"1")],
                )
        for name, record in out.counter_messages:
            await put(self.counters, name, record)
        if out.counts:
            self.metrics.add_all(out.counts)
            self.buffer.add(out)
        return futures

    async def flush_counters(self) -> None:
        send = self.app.producer.send
        for name, record in self.buffer.drain():
            await send(self.counters, name.encode("utf-8"), orjson.dumps(record), None, None, None)


async def delivered(futures: list[asyncio.Future[Any]]) -> None:
    """Return once every one of ``futures`` (the producer's delivery futures) succeeded;
    raise as soon as one is seen failed. ``asyncio.gather`` puts a callback on each future,
    and the producer then schedules one call per record (a tenth of the worker's time on
    single events); waiting on the newest first usually finds the older ones done: one wait
    per batch. On a failure the others' outcomes are marked seen, so the log shows the
    failure once instead of once a record."""
    try:
        for future in reversed(futures):
            if not future.done():
                await future
        for future in futures:
            future.result()
    except BaseException:
        for future in futures:
            if future.done():
                _seen(future)
            else:
                future.add_done_callback(_seen)
        raise


def _seen(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
