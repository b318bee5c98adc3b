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
failed or cancelled send leaves open or queued is discarded (:meth:`Batches.discard`) when
the runner rolls back or gives partitions up: never sent later, maybe to partitions another
worker owns by then.

A batch sent goes into its partition's queue, not straight to aiokafka, and the worker goes
on. aiokafka takes one batch a partition at a time (``send_batch`` waits until the
partition's last batch left in a request) and keeps one request a broker in flight, so a
stage whose outputs filled a partition's batch twice within a round trip waited, idle, for
the broker. In the batched benchmark's worker (240,000 events, ``benchmarks/profile_worker.py``)
the outputs' sends took 240-280 ms of each second, 170-180 of them CPU, and the checkpoint's
changelog sends 60-90 ms, nearly all of it waiting. A task a partition (its *pump*) hands the
queue's batches to aiokafka in order, each when aiokafka takes it. The queues hold at most
:attr:`Batches.MAX_QUEUED_BYTES`; a send beyond that waits for room, as aiokafka's own
buffer made it wait. A batch aiokafka refuses to take (the producer closed, or failed) fails
its records' futures and those of every batch queued after it on its partition, which the
checkpoint sees when it waits for them; every later add or flush raises (nothing may go
after it), as the send raised before the queues: the worker stops, and its restart makes a
new producer.
(The pumps and aiokafka's sender run on the worker's event loop: the runner gives the loop a
turn after each piece of a batch it sends, :meth:`memdiag.streams.runner.Runner._process`.)

A record that wants its own offset (the checkpoint's changelog values, whose offsets the
local state keeps) gets a future of its own, resolved from its batch's.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
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


class _Queued:
    """A closed batch waiting for aiokafka to take it, and its delivery future."""

    __slots__ = ("builder", "future", "size")

    def __init__(self, builder: Any, future: asyncio.Future[Any], size: int):
        self.builder = builder
        self.future = future
        self.size = size


class Batches:
    """One producer's records, in batches a topic-partition at a time.

    ``producer``: a function giving the started aiokafka producer (the worker's is Faust's,
    started after the wiring); ``partitioner``: the producer's (a key's partition)."""

    #: The bytes of closed batches the partitions' queues hold before a send waits for room
    #: (two of the worker's largest produce requests, 8 MB each).
    MAX_QUEUED_BYTES = 16 << 20

    def __init__(self, producer: Callable[[], Any], partitioner: Partitioner):
        self._producer_of = producer
        self._producer: Any = None
        self._partitioner = partitioner
        self._open: dict[tuple[str, int], _Open] = {}
        #: the delivery futures of batches sent since the last flush
        self._sent: list[asyncio.Future[Any]] = []
        #: topic -> its partitions, sorted, as the producer's metadata had them
        self._partitions: dict[str, list[int]] = {}
        #: per topic-partition: the closed batches aiokafka has not taken yet, oldest first
        self._queues: dict[tuple[str, int], deque[_Queued]] = {}
        #: per topic-partition with a queue: the task handing it to aiokafka
        self._pumps: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.queued_bytes = 0
        self._room: asyncio.Event | None = None
        #: why aiokafka refused the first batch it did not take: every later add and flush
        #: raises, as the send of that batch raised before the queues. A refusal is the
        #: producer closed or its sender failed (aiokafka keeps refusing then), or a
        #: partition stalled past the request timeout (20 minutes at Faust's default; aiokafka
        #: has expired the batches in flight by then): the worker stops, and its restart
        #: makes a new producer
        self.refusal: BaseException | None = None

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
        self._refuse_if_refused()
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
            await self._send(tp, batch)
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
        self._refuse_if_refused()
        while self._open:
            tp, batch = next(iter(self._open.items()))
            await self._send(tp, batch)
        sent, self._sent = self._sent, []
        return sent

    def discard(self) -> None:
        """Forget every open and queued batch (its records are never sent; the futures that
        wait for them are cancelled) and the futures of batches sent since the last flush
        (marked seen: whoever rolled back does not wait for them). A batch aiokafka took is
        sent whatever comes."""
        for batch in self._open.values():
            for _, waiting in batch.waiting:
                waiting.cancel()
        self._open.clear()
        for pump in self._pumps.values():
            pump.cancel()
        self._pumps.clear()
        for queue in self._queues.values():
            for queued in queue:
                queued.future.cancel()  # and, through its resolver, its records' futures
        self._queues.clear()
        self.queued_bytes = 0
        self._wake()
        for future in self._sent:
            future.add_done_callback(_seen)
        self._sent.clear()

    async def _send(self, tp: tuple[str, int], batch: _Open) -> None:
        """Close ``batch`` and put it in its partition's queue (its future in the next
        flush's); wait while the queues are over :attr:`MAX_QUEUED_BYTES`."""
        if self._open.get(tp) is batch:
            del self._open[tp]  # before any await: whatever comes meanwhile opens the next
        if self.refusal is not None:  # came while this add or flush waited for room
            for _, waiting in batch.waiting:
                waiting.cancel()
            self._refuse_if_refused()
        builder = batch.builder
        builder.close()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if batch.waiting:
            future.add_done_callback(_resolver(tp, batch.waiting))
        self._sent.append(future)
        size = builder.size()
        queue = self._queues.get(tp)
        if queue is None:
            queue = self._queues[tp] = deque()
        queue.append(_Queued(builder, future, size))
        self.queued_bytes += size
        pump = self._pumps.get(tp)
        if pump is None or pump.done():  # done: ended, its callback not run yet
            pump = self._pumps[tp] = loop.create_task(self._pump(tp, queue))
            pump.add_done_callback(partial(self._pumped, tp, queue))
        while self.queued_bytes > self.MAX_QUEUED_BYTES and self._pumps:
            if self._room is None:
                self._room = asyncio.Event()
            self._room.clear()
            await self._room.wait()

    async def _pump(self, tp: tuple[str, int], queue: deque[_Queued]) -> None:
        """Hand ``tp``'s queued batches to aiokafka, oldest first, each once it takes it."""
        producer = self._started()
        while queue:
            queued = queue[0]
            if not queued.future.done():
                try:
                    delivery = await producer.send_batch(queued.builder, tp[0],
                                                         partition=tp[1])  # fmt: skip
                except asyncio.CancelledError:
                    raise
                except BaseException as exc:  # noqa: BLE001 - its records fail with it
                    self.refusal = self.refusal or exc
                    self._fail(tp, queue, exc)
                    return
                delivery.add_done_callback(_chained(queued.future))
            queue.popleft()
            if self._queues.get(tp) is queue:
                self.queued_bytes -= queued.size
                self._wake()

    def _pumped(self, tp: tuple[str, int], queue: deque[_Queued], pump: asyncio.Task[None]) -> None:
        """A pump ended (its queue empty, refused, or cancelled): it is forgotten, unless
        :meth:`discard` forgot it already or a new one took its place (a send that came
        between its end and this call: the new one sends what it left). One cancelled with
        batches left (by anything but a discard, which forgets the queue first: a stop
        cancelling every task, say) fails them: nothing else would ever send them."""
        if self._pumps.get(tp) is not pump:
            return
        del self._pumps[tp]
        if queue:
            why = "the producer's queue for this partition was cancelled before aiokafka took it"
            self._fail(tp, queue, RuntimeError(why))
        elif self._queues.get(tp) is queue:
            del self._queues[tp]
        self._wake()

    def _fail(self, tp: tuple[str, int], queue: deque[_Queued], exc: BaseException) -> None:
        """aiokafka refused a batch (or its pump was cancelled): it and every batch queued
        after it on ``tp`` fail (none may go ahead of it), with ``exc``."""
        mine = self._queues.get(tp) is queue
        for queued in queue:
            if mine:
                self.queued_bytes -= queued.size
            if not queued.future.done():
                queued.future.set_exception(exc)
                _seen(queued.future)  # no warning at its collection: the checkpoint raises it
        queue.clear()
        if mine:
            del self._queues[tp]
        self._wake()

    def _refuse_if_refused(self) -> None:
        """Raise if aiokafka refused a batch (:attr:`refusal`): nothing is queued after it,
        which could land ahead of the refused batch's records."""
        if self.refusal is not None:
            raise RuntimeError(
                f"the producer refused a batch ({self.refusal!r}); it takes no more"
            ) from self.refusal

    def _wake(self) -> None:
        if self._room is not None and self.queued_bytes <= self.MAX_QUEUED_BYTES:
            self._room.set()


def _chained(ours: asyncio.Future[Any]) -> Callable[[asyncio.Future[Any]], None]:
    """Settle ``ours`` as aiokafka settles its batch's delivery."""

    def settle(delivery: asyncio.Future[Any]) -> None:
        if ours.done():  # discarded meanwhile: its outcome concerns nobody
            _seen(delivery)
        elif delivery.cancelled():
            ours.cancel()
        elif delivery.exception() is not None:
            ours.set_exception(delivery.exception())  # type: ignore[arg-type]
        else:
            ours.set_result(delivery.result())

    return settle


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
