"""What the worker produces, in record batches it fills itself.

aiokafka's ``send`` costs about 10 to 16 us of CPU a record on this machine before the
record is queued, and 6 to 8 us more when its batch is delivered (a future and a metadata
object a record). Its batch API (``create_batch``, ``BatchBuilder.append``, ``send_batch``)
costs about 3 us a record; with each record's partition computed, as here, 8 against 25 us a
record queued and delivered (``benchmarks/produce.py``). Single-event traffic sends about two
records an event (its row, its session's head): the sends were 11.5% of the worker's main
thread on it, and are 7% this way.

:class:`Batches` keeps one open batch per topic-partition. A record goes to its partition
(the one given, or its key's, by the producer's partitioner over the topic's partitions as
the producer's metadata has them, as ``send`` chooses it), into that partition's open batch;
a full batch is sent and a new one opened. :meth:`Batches.flush` sends every open batch and
returns their delivery futures. Records of a partition keep their order: one open batch a
partition, sent in the order they were filled, and aiokafka sends a partition's batches in
the order they were queued, one request at a time.

Every caller flushes before it awaits what it sent (the sender after each output, the
checkpoint before it waits for its deliveries), so nothing stays in an open batch across an
await of a delivery; a flush returns the futures of every batch sent since the last one
(those a full batch sent on its own too), so the checkpoint waits for all of them. What a
failed or cancelled send leaves open is discarded (:meth:`Batches.discard`) when the runner
rolls back or gives partitions up: never sent later, maybe to partitions another worker
owns by then.

A record that wants its own offset (the checkpoint's changelog values, whose offsets the
local state keeps) gets a future of its own, resolved from its batch's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

Partitioner = Callable[[bytes | None, list[int], list[int]], int]
Headers = Sequence[tuple[str, bytes]] | None  # a list is passed on as it is


class Delivered(NamedTuple):
    """A record's place in its partition (what the checkpoint reads of a delivery)."""

    topic: str
    partition: int
    offset: int


class _Open:
    """A partition's batch being filled, and the futures of its records that want one."""

    __slots__ = ("builder", "count", "waiting")

    def __init__(self, builder: Any):
        self.builder = builder
        self.count = 0
        #: (index in the batch, the record's future)
        self.waiting: list[tuple[int, asyncio.Future[Delivered]]] = []


class Batches:
    """One producer's records, in batches a topic-partition at a time.

    ``producer``: a function giving the started aiokafka producer (the worker's is Faust's,
    started after the wiring); ``partitioner``: the producer's (a key's partition)."""

    def __init__(self, producer: Callable[[], Any], partitioner: Partitioner):
        self._producer_of = producer
        self._producer: Any = None
        self._partitioner = partitioner
        self._open: dict[tuple[str, int], _Open] = {}
        #: the delivery futures of batches sent since the last flush
        self._sent: list[asyncio.Future[Any]] = []
        #: topic -> its partitions, sorted, as the producer's metadata had them
        self._partitions: dict[str, list[int]] = {}

    def _started(self) -> Any:
        if self._producer is None:
            self._producer = self._producer_of()
        return self._producer

    async def partition(self, topic: str, key: bytes | None) -> int:
        """The partition ``send`` would give a record of ``key``: the partitioner over the
        topic's partitions, as the producer's metadata has them now."""
        producer = self._started()
        known = producer.client.cluster.partitions_for_topic(topic)
        parts = self._partitions.get(topic)
        if not known:
            known = await producer.partitions_for(topic)  # waits for the topic's metadata
        if parts is None or len(parts) != len(known):
            parts = self._partitions[topic] = sorted(known)
        return self._partitioner(key, parts, parts)

    async def add(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None,
        timestamp_ms: int | None = None, headers: Headers = None, want: bool = False,
    ) -> asyncio.Future[Delivered] | None:  # fmt: skip
        """Queue a record (``timestamp_ms`` None: now). ``want``: return a future of its
        :class:`Delivered` (resolved when its batch is, after a :meth:`flush`)."""
        if partition is None:
            partition = await self.partition(topic, key)
        tp = (topic, partition)
        # aiokafka's compiled builder takes a list, nothing else
        headers = headers if type(headers) is list else list(headers or ())
        while True:
            batch = self._open.get(tp)
            if batch is None:
                batch = self._open[tp] = _Open(self._started().create_batch())
            if batch.builder.append(timestamp=timestamp_ms, key=key, value=value,
                                    headers=headers) is not None:  # fmt: skip
                break
            # full: it goes (a new batch takes any first record)
            self._sent.append(await self._send(tp, batch))
        index = batch.count
        batch.count += 1
        if not want:
            return None
        future: asyncio.Future[Delivered] = asyncio.get_running_loop().create_future()
        batch.waiting.append((index, future))
        return future

    async def flush(self) -> list[asyncio.Future[Any]]:
        """Send every open batch; the delivery futures of every batch sent since the last
        flush (theirs, and those of batches sent when they filled)."""
        while self._open:
            tp, batch = next(iter(self._open.items()))
            self._sent.append(await self._send(tp, batch))
        sent, self._sent = self._sent, []
        return sent

    def discard(self) -> None:
        """Forget every open batch (its records are never sent; the futures that wait for
        them are cancelled) and the futures of batches sent since the last flush (marked
        seen: whoever rolled back does not wait for them)."""
        for batch in self._open.values():
            for _, waiting in batch.waiting:
                waiting.cancel()
        self._open.clear()
        for future in self._sent:
            future.add_done_callback(_seen)
        self._sent.clear()

    async def _send(self, tp: tuple[str, int], batch: _Open) -> asyncio.Future[Any]:
        if self._open.get(tp) is batch:
            del self._open[tp]  # before the await: whatever comes meanwhile opens the next
        batch.builder.close()
        try:
            future: asyncio.Future[Any] = await self._started().send_batch(
                batch.builder, tp[0], partition=tp[1]
            )
        except BaseException as exc:
            for _, waiting in batch.waiting:
                if waiting.done():
                    continue
                if isinstance(exc, asyncio.CancelledError):
                    waiting.cancel()
                else:
                    waiting.set_exception(exc)
                    waiting.exception()  # seen: the caller has the same error
            raise
        if batch.waiting:
            future.add_done_callback(_resolver(tp, batch.waiting))
        return future


def _resolver(
    tp: tuple[str, int], waiting: list[tuple[int, asyncio.Future[Delivered]]]
) -> Callable[[asyncio.Future[Any]], None]:
    def resolve(batch: asyncio.Future[Any]) -> None:
        error = None if batch.cancelled() else batch.exception()
        for index, future in waiting:
            if future.done():
                continue
            if batch.cancelled():
                future.cancel()
            elif error is not None:
                future.set_exception(error)
            elif batch.result() is None:  # acks=0: no offsets (the worker asks acks=all)
                future.set_exception(RuntimeError("the producer's acks=0 gives no offsets"))
            else:
                future.set_result(Delivered(tp[0], tp[1], batch.result().offset + index))

    return resolve


def _seen(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
