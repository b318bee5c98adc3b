"""How the stateful stages run inside Faust: in batches, acknowledged only once durable.

Faust's own ``async for event in stream`` acknowledges an event when the agent asks for the
next one, and its commit flushes the producer first. Three holes in that, in the installed
faust-streaming, lost outputs when a worker was killed or a partition moved (the event-time
issue's scaled-out runs):

- the producer's changelog buffer can still hold table writes when ``flush`` returns (it
  gives up waiting after 0.1 s), so an offset can be committed before the state it
  produced is in the changelog;
- a failed delivery is only logged, and the offset is committed anyway;
- an event fetched before a rebalance and found stale is skipped *and acknowledged*, so
  its offset can be committed although it was never processed.

:class:`BatchRunner` takes the stage's messages from a Faust channel (Faust still owns the
consumer group, the assignment, the table's changelog and its recovery), processes them in
batches, writes each touched key once with its partition named (faust-streaming #497), and
acknowledges a batch only after every state write and every output has been acknowledged
by the broker, in offset order. A stale event is never acknowledged: it is fetched again
after the rebalance. So an acknowledged offset always means "its effects are durable", and
at-least-once holds whatever Faust commits when.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import faust
import orjson
from faust.types import EventT, TableT, TopicT

from streams.counters import increments, minute_of
from streams.envelope import CounterKey, InMessage, Output, StateStore
from streams.metrics import Counters

log = logging.getLogger("memdiag.worker")


class Stage(Protocol):
    def process(self, msgs: list[InMessage], store: StateStore) -> Output: ...


class TableStore:
    """A :class:`streams.envelope.StateStore` over a Faust table.

    Writes go to the changelog partition they name (inside a batch there is no "current
    event" for Faust to take it from), and each write's delivery future is kept for the
    runner to wait on before it acknowledges the batch.
    """

    def __init__(self, table: TableT):
        self._table = table
        self._data = table.data
        self.futures: list[Awaitable[Any]] = []

    def get(self, key: str) -> bytes | None:
        value: bytes | None = self._data.get(key)
        return value

    def put(self, key: str, value: bytes, partition: int) -> None:
        self.futures.append(self._table.send_changelog(partition, key, value))
        self._data[key] = value

    def delete(self, key: str, partition: int) -> None:
        self.futures.append(
            self._table.send_changelog(partition, key, None, value_serializer="raw")
        )
        self._data.pop(key, None)

    def keys(self) -> Iterable[str]:
        return list(self._data.keys())

    def take_futures(self) -> list[Awaitable[Any]]:
        futures, self.futures = self.futures, []
        return futures


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
    """Sends a stage's :class:`Output` to its topics; returns the delivery futures."""

    def __init__(
        self,
        diagnostics: TopicT,
        deadletter: TopicT,
        weights: TopicT,
        events: TopicT,
        steps: TopicT,
        verdicts: TopicT,
        counters: TopicT,
        buffer: CounterBuffer,
        metrics: Counters,
    ):
        self.diagnostics, self.deadletter, self.weights = diagnostics, deadletter, weights
        self.events, self.steps, self.verdicts, self.counters = events, steps, verdicts, counters
        self.buffer, self.metrics = buffer, metrics

    async def send(self, out: Output) -> list[Awaitable[Any]]:
        futures: list[Awaitable[Any]] = []
        ts = None if out.timestamp_ms is None else out.timestamp_ms / 1000

        async def put(topic: TopicT, key: str | bytes | None, value: Any, **kw: Any) -> None:
            k = key.encode("utf-8") if isinstance(key, str) else key
            futures.append(await topic.send(key=k, value=orjson.dumps(value), **kw))

        for key, records in out.diagnostics.items():
            await put(self.diagnostics, key, records)
        for obs_id, records in out.steps.items():
            await put(self.steps, obs_id, records, timestamp=ts)
        for session_id, records in out.verdicts.items():
            await put(self.verdicts, session_id, records, timestamp=ts)
        for obs_id, records in out.weights.items():
            for record in records:  # one message per update: the memory system applies each
                await put(self.weights, obs_id, record)
        for dl_key, record in out.deadletters:
            await put(self.deadletter, dl_key, record)
        for session_id, raws, timestamp_ms in out.reroute:
            # back onto `events`, keyed so Kafka's partitioner puts it where its state lives,
            # with its publish time, which the future check and `published_at` read
            await put(
                self.events,
                session_id,
                raws,
                timestamp=None if timestamp_ms is None else timestamp_ms / 1000,
                headers={"memdiag-rerouted": b"1"},
            )
        for name, record in out.counter_messages:
            await put(self.counters, name, record)
        if out.counts:
            self.metrics.add_all(out.counts)
            self.buffer.add(out)
        return futures

    async def flush_counters(self) -> None:
        for name, record in self.buffer.drain():
            await self.counters.send(key=name.encode("utf-8"), value=orjson.dumps(record))


class BatchRunner:
    """Runs one stage over its topics; see the module docstring."""

    #: Batches whose outputs may be in flight at once (the next one is processed meanwhile).
    MAX_IN_FLIGHT = 4

    def __init__(
        self,
        app: faust.App,
        name: str,
        topics: list[TopicT],
        stage: Stage,
        store: TableStore | None,
        sender: Sender,
        on_failure: Callable[[InMessage, BaseException], Output],
        max_batch: int = 2000,
        linger: float = 0.005,
    ):
        self.app = app
        self.name = name
        self.stage = stage
        self.store = store
        self.sender = sender
        self.on_failure = on_failure
        self.max_batch = max_batch
        self.linger = linger
        names = [t.get_topic_name() for t in topics]
        self.channel = app.topic(
            *names,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
        ).clone_using_queue(
            app.FlowControlQueue(maxsize=app.conf.stream_buffer_maxsize, clear_on_resume=True)
        )
        # a channel over topics, added as Faust adds its own changelog readers
        app.topics.add(self.channel)  # type: ignore[arg-type]
        self._in_flight: deque[asyncio.Future[None]] = deque()
        self.processed = 0

    async def run(self) -> None:
        queue = self.channel.queue
        while True:
            batch: list[EventT] = [await queue.get()]
            self._drain(queue, batch)
            if len(batch) < self.max_batch and self.linger:
                await asyncio.sleep(self.linger)  # let a burst of single events gather
                self._drain(queue, batch)
            await self._handle(batch)

    def _drain(self, queue: asyncio.Queue[EventT], batch: list[EventT]) -> None:
        while len(batch) < self.max_batch:
            try:
                batch.append(queue.get_nowait())
            except asyncio.QueueEmpty:
                return

    async def _handle(self, batch: list[EventT]) -> None:
        app = self.app
        # the messages a rebalance waits for (Consumer.wait_empty)
        unacked = app.consumer._unacked_messages  # type: ignore[attr-defined]
        generation = app.consumer_generation_id
        active = app.flow_control.is_active()
        live = []
        msgs = []
        for event in batch:
            m = event.message
            if not active or m.generation_id != generation:
                continue  # fetched before a rebalance: never acked, fetched again after it
            if not m.tracked:  # a rebalance waits for tracked messages to be acked
                m.tracked = True
                unacked.add(m)
            live.append(event)
            msgs.append(
                InMessage(
                    m.topic,
                    m.partition,
                    m.offset,
                    m.key,
                    m.value,
                    None if m.timestamp is None else int(m.timestamp * 1000),
                )
            )
        if not live:
            return
        outputs = self._process(msgs)
        futures = self.store.take_futures() if self.store is not None else []
        for out in outputs:
            futures += await self.sender.send(out)
        previous = self._in_flight[-1] if self._in_flight else None
        self._in_flight.append(asyncio.ensure_future(self._ack(previous, futures, live)))
        while len(self._in_flight) > self.MAX_IN_FLIGHT or (
            self._in_flight and self._in_flight[0].done()
        ):
            await self._in_flight.popleft()  # raises if a delivery failed: the worker stops
        self.processed += len(live)

    def _process(self, msgs: list[InMessage]) -> list[Output]:
        try:
            return [self.stage.process(msgs, self._store())]
        except Exception:  # noqa: BLE001 - find the message that raises, one at a time
            log.warning(
                "%s: a batch of %d raised; retrying message by message",
                self.name,
                len(msgs),
                exc_info=True,
            )
        outputs = []
        for msg in msgs:
            try:
                outputs.append(self.stage.process([msg], self._store()))
            except Exception as exc:  # noqa: BLE001 - never let one message stop the stage
                log.exception(
                    "%s failed on %s/%d/%d; dead-lettered",
                    self.name,
                    msg.topic,
                    msg.partition,
                    msg.offset,
                )
                outputs.append(self.on_failure(msg, exc))
        return outputs

    def _store(self) -> Any:
        return self.store if self.store is not None else {}

    async def _ack(
        self,
        previous: asyncio.Future[None] | None,
        futures: list[Awaitable[Any]],
        events: list[EventT],
    ) -> None:
        """Acknowledge ``events`` once everything they produced is durable, after the batch
        before them (acknowledgements stay in offset order)."""
        if previous is not None:
            await previous
        if futures:
            await asyncio.gather(*futures)
        for event in events:
            event.ack()

    async def wait_idle(self) -> None:
        while self._in_flight:
            await self._in_flight.popleft()
