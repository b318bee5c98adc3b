"""Where a broker and Faust disagree, and what memdiag does about it.

Tansu answers ListOffsets(latest) with the base offset of a partition's last record batch
plus one. Faust takes that as the changelog's end when it recovers a table, so a last batch
of several records was lost on restart (a restarted worker forgot searches it had already
judged). :func:`patch_faust_highwaters` makes Faust's recovery use
:func:`memdiag.kafka.true_end_offsets`, which reads the true end. On Apache Kafka the answer
is unchanged, at the cost of one small fetch per changelog partition at recovery.

:func:`patch_faust_fetch_wait` replaces the 1,500 ms that Faust hard-codes as the consumer's
fetch wait: Tansu holds an empty fetch that long even when records arrive meanwhile.

:func:`patch_faust_delivery` takes the cost of four tasks per record out of Faust's fetch
loop (see its docstring), and :func:`patch_faust_raw_delivery` the cost of decoding and
wrapping each record for the stages' raw channels; the offsets Faust got wrong are handled in
``memdiag.streams.batches``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Generator, Mapping
from typing import Any

from aiokafka import TopicPartition

from memdiag.kafka import true_end_offsets

_PATCHED = False


def patch_faust_highwaters(options: dict[str, Any]) -> None:
    """``options``: :func:`memdiag.kafka.client_options`."""
    global _PATCHED
    if _PATCHED:
        return
    from faust.transport.drivers import aiokafka as driver

    original = driver.AIOKafkaConsumerThread._highwaters

    async def _highwaters(self: Any, partitions: list[Any]) -> Mapping[Any, int]:
        if self.consumer.in_transaction:
            return await original(self, partitions)
        consumer = self._ensure_consumer()
        reported = await consumer.end_offsets(partitions)
        tps = {TopicPartition(tp.topic, tp.partition): tp for tp in partitions}
        fixed = await true_end_offsets(
            options,
            list(tps),
            {TopicPartition(tp.topic, tp.partition): off for tp, off in reported.items()},
        )
        return {tps[tp]: off for tp, off in fixed.items()}

    driver.AIOKafkaConsumerThread._highwaters = _highwaters  # type: ignore[method-assign]
    _PATCHED = True


_DELIVERY_PATCHED = False


class _Resume:
    """Drives a coroutine that has already run up to its first suspension: the rest of it,
    as an awaitable (the event loop's task protocol resumes with ``send(None)``)."""

    def __init__(self, coro: Any, yielded: Any):
        self._coro, self._yielded = coro, yielded

    def __await__(self) -> Generator[Any, None, Any]:
        coro, yielded = self._coro, self._yielded
        while True:
            try:
                yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - thrown in (a cancellation): pass on
                try:
                    yielded = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    yielded = coro.send(None)
                except StopIteration as stop:
                    return stop.value


async def _finish(coro: Any, yielded: Any) -> Any:
    return await _Resume(coro, yielded)


def patch_faust_delivery() -> None:
    """Faust's fetch loop hands each record to the agents' queues through
    ``Service.wait_first(deliver(record), suspend_flow.wait())``: four tasks and an
    ``asyncio.wait`` per record, 12% of the worker's time on single-event traffic. Delivery
    almost never suspends (it only waits when a queue is full or the flow is stopped), so
    this runs it directly, and only when it does suspend hands the rest of it to the
    original ``wait_first`` (so a rebalance still interrupts a blocked delivery)."""
    global _DELIVERY_PATCHED
    if _DELIVERY_PATCHED:
        return
    from faust.transport.consumer import Consumer
    from mode import Service
    from mode.services import WaitResults

    original = Service.wait_first
    flow_wait = asyncio.Event.wait.__code__  # Consumer.suspend_flow is an asyncio.Event

    async def wait_first(self: Any, *coros: Any, timeout: Any = None) -> Any:
        if (
            len(coros) == 2
            and timeout is None
            and inspect.iscoroutine(coros[0])
            and getattr(coros[1], "cr_code", None) is flow_wait
            and not self.suspend_flow.is_set()
        ):
            deliver, flow = coros
            try:
                yielded = deliver.send(None)
            except StopIteration as stop:
                flow.close()
                return WaitResults([deliver], [stop.value], False)
            except BaseException:
                flow.close()
                raise
            return await original(self, _finish(deliver, yielded), flow)
        return await original(self, *coros, timeout=timeout)

    Consumer.wait_first = wait_first  # type: ignore[method-assign]
    _DELIVERY_PATCHED = True


def patch_faust_fetch_wait(ms: int) -> None:
    """Make the worker's consumer wait at most ``ms`` for records at the broker
    (``MEMDIAG_FETCH_MAX_WAIT_MS``). Faust passes a fixed 1,500 ms to aiokafka; Apache Kafka
    answers a waiting fetch as soon as records arrive, but Tansu holds it for the whole
    wait, which put up to 1.5 s of latency on each hop of a live stream."""
    from faust.transport.drivers import aiokafka as driver

    cls = driver.AIOKafkaConsumerThread
    original = getattr(cls._create_worker_consumer, "__wrapped__", cls._create_worker_consumer)

    def _create_worker_consumer(self: Any, transport: Any) -> Any:
        consumer = original(self, transport)
        if not hasattr(consumer, "_fetch_max_wait_ms"):
            raise RuntimeError(
                "this aiokafka keeps its fetch wait elsewhere: update "
                "memdiag.streams.compat.patch_faust_fetch_wait"
            )
        consumer._fetch_max_wait_ms = ms  # read when the consumer starts its fetcher
        return consumer

    _create_worker_consumer.__wrapped__ = original  # type: ignore[attr-defined]
    cls._create_worker_consumer = _create_worker_consumer  # type: ignore[method-assign]


#: Set on a channel that takes raw ``bytes`` keys and values and is the only reader of its
#: topics (the stages' channels, ``memdiag.streams.batches``): see :func:`patch_faust_raw_delivery`.
RAW_CHANNEL = "_memdiag_raw_channel"

_RAW_PATCHED = False


def patch_faust_raw_delivery() -> None:
    """Deliver the records of a raw channel (:data:`RAW_CHANNEL`) to its queue directly.

    Faust's per-partition handler (Cython, ``ConductorHandler``) calls back into Python for
    every record: it waits on the producer buffer's size (a settings look-up a record), runs
    the key and value through the serializer registry (a no-op for raw bytes) and builds the
    event through ``app.conf``: 12% of the worker's time on single-event traffic. For a
    partition whose only reader is a raw channel, this handler does the same with none of
    that: flow control, the producer buffer (which memdiag never fills: the stages send
    straight to the producer), the reference count, the event, and the queue with its
    pressure callbacks, as Faust does. Every other partition keeps Faust's handler."""
    global _RAW_PATCHED
    if _RAW_PATCHED:
        return
    from faust.transport.conductor import Conductor

    original = Conductor._build_handler

    def _build_handler(self: Any, tp: Any, channels: Any) -> Any:
        if len(channels) == 1:
            (channel,) = channels
            if getattr(channel, RAW_CHANNEL, False) and _is_raw(channel.schema):
                return _raw_handler(self.app, tp, channel)
        return original(self, tp, channels)

    _build_handler.__wrapped__ = original  # type: ignore[attr-defined]
    Conductor._build_handler = _build_handler  # type: ignore[method-assign]
    _RAW_PATCHED = True


def _is_raw(schema: Any) -> bool:
    """Faust's decoding would hand over the record's bytes as they are (and never raise)."""
    return (
        schema.key_serializer == schema.value_serializer == "raw"
        and schema.key_type is schema.value_type is bytes
    )


def _raw_handler(app: Any, tp: Any, channel: Any) -> Any:
    consumer = app.consumer
    acquire_flow_control = app.flow_control.acquire
    buffer = app.producer.buffer
    limit = buffer.max_messages
    pending = None if app.conf.producer_threaded else buffer.pending
    on_topic_buffer_full = app.sensors.on_topic_buffer_full
    event_type = app.conf.Event

    def on_pressure_high() -> None:
        on_topic_buffer_full(tp)
        consumer.on_buffer_full(tp)

    def on_pressure_drop() -> None:
        consumer.on_buffer_drop(tp)

    async def on_message(message: Any) -> None:
        await acquire_flow_control()
        if (buffer.size if pending is None else pending.qsize()) > limit:
            await buffer.wait_until_ebb()
        message.incref(1)
        event = event_type(app, message.key, message.value, message.headers, message)
        queue = channel.queue
        if queue.full():
            on_topic_buffer_full(tp)
            # wait for room, as Faust does; a rebalance that cancels the wait drops the
            # event (Faust's put would go on and queue it, to be skipped as stale)
            await queue.put(event)
            return
        queue.put_nowait_enhanced(
            event, on_pressure_high=on_pressure_high, on_pressure_drop=on_pressure_drop
        )

    return on_message
