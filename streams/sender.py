"""What a stage's batch sends, in record batches memdiag fills itself
(:mod:`memdiag.streams.produce`): diagnostics, dead letters, weights, the internal topics and
the counters. The checkpoint (:mod:`memdiag.streams.checkpoint`) waits for every batch's
delivery before it commits."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any

import orjson
from faust.types import TopicT

from memdiag.contract.envelope import CounterKey, Output
from memdiag.streams.fit import fit
from memdiag.streams.metrics import Counters
from memdiag.streams.produce import Batches
from memdiag.streams.stages.counters import increments, minute_of

log = logging.getLogger(__name__)


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

    def clear(self) -> None:
        """Forget the increments not sent yet (a rollback: their records are taken again)."""
        self._pending.clear()
        self._newest.clear()

    def drain(self) -> list[tuple[str, dict[str, Any]]]:
        """The (key, record) increments to send, one per counter, attributes and minute."""
        out = []
        for (key, _minute), value in self._pending.items():
            out.extend(increments({key: value}, self._newest[(key, _minute)]))
        self._pending.clear()
        self._newest.clear()
        return out


class Sender:
    """Sends a stage's :class:`Output` to its topics in record batches it fills itself
    (:class:`memdiag.streams.produce.Batches`: Faust's ``Topic.send`` wraps each message in
    futures and buffers of its own, and aiokafka's ``send`` costs a future a record);
    returns the batches' delivery futures."""

    def __init__(
        self,
        batches: Batches,
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
        graph_weights: TopicT,
        max_output_bytes: int = 1_000_000,
    ):
        self.batches = batches
        #: MEMDIAG_MAX_OUTPUT_BYTES: a record over it is trimmed (memdiag.streams.fit)
        self.max_output_bytes = max_output_bytes
        self.diagnostics, self.deadletter, self.weights = (
            diagnostics.get_topic_name(), deadletter.get_topic_name(), weights.get_topic_name()
        )  # fmt: skip
        self.events, self.steps = events.get_topic_name(), steps.get_topic_name()
        self.verdicts, self.counters = verdicts.get_topic_name(), counters.get_topic_name()
        self.memory = memory.get_topic_name()
        self.graph_weights = graph_weights.get_topic_name()
        self.otlp_traces = otlp_traces.get_topic_name()
        self.span_events = span_events.get_topic_name()
        self.buffer, self.metrics = buffer, metrics
        #: the OpenTelemetry counters' increments since the last commit, added once it landed
        self._metric_counts: Counter[CounterKey] = Counter()

    async def send(self, out: Output) -> list[asyncio.Future[Any]]:
        ts = out.timestamp_ms
        add = self.batches.add
        dumps = orjson.dumps
        limit = self.max_output_bytes

        async def put(
            topic: str, key: str | bytes | None, value: Any, timestamp_ms: int | None = None,
            headers: Any = None, partition: int | None = None, trim: bool = False,
        ) -> None:  # fmt: skip
            k = key.encode("utf-8") if isinstance(key, str) else key
            # only rows for the sink are trimmed: the internal topics carry state and events
            for data in _messages(value, dumps, limit if trim else _NO_LIMIT, topic, key):
                await add(topic, k, data, partition, timestamp_ms, headers)

        for key, records in out.diagnostics.items():
            await put(self.diagnostics, key, records, trim=True)
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
                await put(self.weights, obs_id, record, trim=True)
        for graph_key, records in out.graph_weights.items():
            for record in records:  # keyed entity:ID or edge:SOURCE|TARGET|RELATIONSHIP
                await put(self.graph_weights, graph_key, record, trim=True)
        for dl_key, record in out.deadletters:
            await put(self.deadletter, dl_key, record, trim=True)
        for topic, reroute in ((self.events, out.reroute), (self.memory, out.reroute_memory)):
            for key, raws, timestamp_ms in reroute:
                # back onto its topic, keyed so Kafka's partitioner puts it where its state
                # lives, with its publish time, which the future check and `published_at` read
                await put(topic, key, raws, timestamp_ms, [("memdiag-rerouted", b"1")])
        for name, record in out.counter_messages:
            await put(self.counters, name, record)
        if out.counts:
            self._metric_counts.update(out.counts)
            self.buffer.add(out)
        return await self.batches.flush()

    def discard(self) -> None:
        """A rollback: the increments since the last checkpoint are neither sent nor exported
        (the records they came from are taken again, and count then)."""
        self.buffer.clear()
        self._metric_counts.clear()

    def committed(self) -> None:
        """The checkpoint committed: its increments go to the OpenTelemetry counters (which
        cannot take one back, so they wait for the commit)."""
        if self._metric_counts:
            self.metrics.add_all(self._metric_counts)
            self._metric_counts.clear()

    async def flush_counters(self) -> list[asyncio.Future[Any]]:
        """The increments added up since the last flush (the checkpoint sends them with its
        outputs: a crash, a failed delivery or a refused commit after it sends them again)."""
        for name, record in self.buffer.drain():
            await self.batches.add(self.counters, name.encode("utf-8"), orjson.dumps(record))
        return await self.batches.flush()


#: The largest message memdiag sends of several records: under the 1 MiB a broker takes by
#: default (``message.max.bytes``), with room for the record batch around it.
MAX_MESSAGE_BYTES = 512 * 1024
#: the limit of the internal topics' records: never trimmed (they carry events and state)
_NO_LIMIT = 1 << 62


def _messages(value: Any, dumps: Any, limit: int, topic: str, key: Any) -> list[bytes]:
    """``value`` as one message, or a list of records as several, each under
    :data:`MAX_MESSAGE_BYTES` (a record larger than that goes alone, trimmed to ``limit`` if
    it is over: :func:`memdiag.streams.fit.fit`): a batch's outputs for one key can be many,
    and a message the broker refuses would fail every checkpoint."""
    data: bytes = dumps(value)
    n = len(data)
    if n <= MAX_MESSAGE_BYTES and n <= limit:
        return [data]
    if isinstance(value, list) and len(value) > 1:
        half = len(value) // 2
        return _messages(value[:half], dumps, limit, topic, key) + _messages(
            value[half:], dumps, limit, topic, key
        )
    if len(data) <= limit:
        return [data]
    one = isinstance(value, list)  # a list of one record: its brackets count
    record = value[0] if one else value
    if not isinstance(record, dict):
        return [data]
    fitted, notes = fit(record, limit, dumps, overhead=2 * one)
    _trimmed(topic, key, record, notes, len(data))
    return [dumps([fitted] if one else fitted)]


def _trimmed(topic: str, key: Any, record: dict[str, Any], notes: dict[str, str],
             size: int) -> None:  # fmt: skip
    """Say what was trimmed of a record over MEMDIAG_MAX_OUTPUT_BYTES (or that nothing could
    be: the broker will refuse it if its own limit is lower)."""
    what = f"{record.get('kind', 'record')} {key!r} on {topic} ({size:,} bytes)"
    if notes:
        fields = "; ".join(f"{name}: {note}" for name, note in notes.items())
        log.warning("a %s is over MEMDIAG_MAX_OUTPUT_BYTES and was trimmed: %s", what, fields)
    else:
        log.error(
            "a %s is over MEMDIAG_MAX_OUTPUT_BYTES and has nothing to trim; it is sent whole, "
            "and a broker whose message.max.bytes is lower refuses it",
            what,
        )
