"""The worker's records in batches it fills itself (memdiag.streams.produce), over a fake of
aiokafka's batch API: each record on its partition and in its order, a full batch sent and
the next opened, every open batch sent by a flush, and each record's own offset (or its
batch's failure) where one is wanted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.kafka import DefaultPartitioner, partition_for
from memdiag.streams.produce import Batches, Delivered

TOPICS = {"out": 4, "changelog": 2}


class Builder:
    """aiokafka's ``BatchBuilder``: takes ``room`` records (a first record always fits)."""

    def __init__(self, room: int):
        self.room = room
        self.records: list[tuple[Any, ...]] = []
        self.closed = False

    def append(self, *, timestamp: int | None, key: bytes | None, value: bytes | None,
               headers: Any) -> object | None:  # fmt: skip
        assert not self.closed
        assert type(headers) is list  # the compiled builder takes nothing else
        if self.records and len(self.records) >= self.room:
            return None
        self.records.append((key, value, timestamp, tuple(headers)))
        return object()

    def close(self) -> None:
        self.closed = True

    def size(self) -> int:
        return 100 * len(self.records)


class Producer:
    """aiokafka's producer: its batch API, a log per partition, and its cluster metadata."""

    def __init__(self, room: int = 3, fail: set[int] | None = None):
        self.room = room
        self.logs: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
        self.batches: list[tuple[str, int, int]] = []  # (topic, partition, records), in order
        self.pending: list[tuple[asyncio.Future[Any], int]] = []
        self.fail = fail or set()  # the indices of the batches whose delivery fails
        self.client = self

    @property
    def cluster(self) -> Producer:
        return self

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return set(range(TOPICS[topic])) if topic in TOPICS else None

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(TOPICS[topic]))

    def create_batch(self) -> Builder:
        return Builder(self.room)

    async def send_batch(self, batch: Builder, topic: str, *, partition: int) -> asyncio.Future[Any]:
        assert batch.closed and batch.records
        log = self.logs.setdefault((topic, partition), [])
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if len(self.batches) in self.fail:
            future.set_exception(RuntimeError("the broker refused the batch"))
        else:
            future.set_result(type("Meta", (), {"offset": len(log)})())
            log.extend(batch.records)
        self.batches.append((topic, partition, len(batch.records)))
        return future


def batches(producer: Producer) -> Batches:
    return Batches(lambda: producer, DefaultPartitioner())


Record = tuple[str, bytes | None, bytes, int | None]

records = st.lists(
    st.tuples(
        st.sampled_from(sorted(TOPICS)),
        st.one_of(st.none(), st.binary(min_size=1, max_size=6)),
        st.binary(max_size=4),
        st.one_of(st.none(), st.integers(0, 1)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(records, st.integers(1, 5), st.lists(st.integers(0, 40), max_size=5))
def test_each_record_lands_on_its_partition_in_order_with_its_own_offset(
    sent: list[Record], room: int, flush_after: list[int]
) -> None:
    producer = Producer(room)
    out = batches(producer)

    async def go() -> list[tuple[Record, int, asyncio.Future[Delivered] | None]]:
        placed = []
        for i, (topic, key, value, given_partition) in enumerate(sent):
            want = i % 2 == 0
            future = await out.add(topic, key, value, given_partition, 1_000 + i,
                                   [("h", b"%d" % i)], want=want)  # fmt: skip
            assert (future is not None) == want
            if key is None and given_partition is None:
                partition = -1  # a random one: found below by the record's value and index
            else:
                partition = (given_partition if given_partition is not None
                             else partition_for(key or b"", TOPICS[topic]))  # fmt: skip
            placed.append(((topic, key, value, given_partition), partition, future))
            if i in flush_after:
                await out.flush()
        await out.flush()
        assert not out._open  # nothing left open
        return placed

    placed = asyncio.run(go())
    # every record is in exactly one log, in the order it was added, with its headers
    seen: dict[tuple[str, int], list[int]] = {}
    where: dict[int, tuple[str, int, int]] = {}
    for (topic, partition), log in producer.logs.items():
        for offset, (_, _, ts, headers) in enumerate(log):
            index = int(headers[0][1])
            assert ts == 1_000 + index
            seen.setdefault((topic, partition), []).append(index)
            where[index] = (topic, partition, offset)
    assert sorted(where) == list(range(len(sent)))
    for indices in seen.values():
        assert indices == sorted(indices)
    for i, ((topic, key, value, _), partition, future) in enumerate(placed):
        got_topic, got_partition, offset = where[i]
        assert got_topic == topic
        assert producer.logs[(topic, got_partition)][offset][:2] == (key, value)
        if partition != -1:
            assert got_partition == partition
        if future is not None:
            assert future.result() == Delivered(topic, got_partition, offset)
    # no batch holds more than its room, and a batch is full unless a flush sent it
    assert all(n <= room for _, _, n in producer.batches)


def test_a_batch_that_fails_fails_the_records_that_wait_for_it() -> None:
    producer = Producer(room=2, fail={1})
    out = batches(producer)

    async def go() -> tuple[list[asyncio.Future[Delivered] | None], list[asyncio.Future[Any]]]:
        futures = [await out.add("changelog", b"k", b"%d" % i, 0, None, None, want=True)
                   for i in range(5)]  # fmt: skip
        return futures, await out.flush()

    futures, flushed = asyncio.run(go())
    # batches of 2, 2 and 1: the second's delivery failed
    assert [n for _, _, n in producer.batches] == [2, 2, 1]
    assert [f.result().offset for f in (futures[0], futures[1])] == [0, 1]  # type: ignore[union-attr]
    for f in futures[2:4]:
        assert f is not None and isinstance(f.exception(), RuntimeError)
    assert futures[4] is not None and futures[4].result().offset == 2
    # the flush hands over every batch sent since the last one, those sent when full too:
    # the checkpoint waits for the failed one
    assert len(flushed) == 3
    assert [f.exception() is not None for f in flushed] == [False, True, False]


def test_what_a_rollback_discards_is_never_sent() -> None:
    """After a failed send, the runner rolls back: the open batches go unsent, whatever
    waits for their records is cancelled, and the next flush hands over only what came
    after."""
    producer = Producer(room=10)
    out = batches(producer)

    async def go() -> tuple[asyncio.Future[Delivered] | None, list[asyncio.Future[Any]]]:
        waiting = await out.add("changelog", b"k", b"old", 0, None, None, want=True)
        await out.add("out", b"ses", b"old")
        out.discard()
        await out.add("out", b"ses", b"new")
        return waiting, await out.flush()

    waiting, flushed = asyncio.run(go())
    assert waiting is not None and waiting.cancelled()
    assert [r[1] for log in producer.logs.values() for r in log] == [b"new"]
    assert len(flushed) == 1


def test_a_batch_the_producer_refuses_to_queue_fails_its_records_and_those_after_it() -> None:
    """aiokafka refuses to take a batch (the producer is closed): its records and every
    batch queued after it on its partition fail with the refusal, which the checkpoint sees
    in the flush's futures; another partition's batches are not held back."""

    class Closed(Producer):
        async def send_batch(self, batch: Builder, topic: str, *, partition: int) -> Any:
            if topic == "changelog" and partition == 1:
                raise RuntimeError("the producer is closed")
            return await super().send_batch(batch, topic, partition=partition)

    producer = Closed(room=1)
    out = batches(producer)

    async def go() -> tuple[list[Any], list[asyncio.Future[Any]], Any]:
        futures = [await out.add("changelog", b"k", b"v%d" % i, 1, None, None, want=True)
                   for i in range(3)]  # fmt: skip
        other = await out.add("changelog", b"k", b"w", 0, None, None, want=True)
        flushed = await out.flush()
        with pytest.raises(RuntimeError, match="closed"):
            await asyncio.gather(*flushed)
        await asyncio.sleep(0)
        # and the producer is done for: the next record raises, as a send that refused did
        # before the queues (the worker stops, and its restart makes a new producer)
        with pytest.raises(RuntimeError, match="refused a batch .*closed"):
            await out.add("changelog", b"k", b"later", 0)
        with pytest.raises(RuntimeError, match="refused a batch .*closed"):
            await out.flush()
        return futures, flushed, other

    futures, flushed, other = asyncio.run(go())
    assert len(flushed) == 4
    for future in futures:
        assert future is not None and isinstance(future.exception(), RuntimeError)
    assert other.result() == Delivered("changelog", 0, 0)
    assert producer.logs == {("changelog", 0): [(b"k", b"w", None, ())]}
    assert out.queued_bytes == 0 and not out._queues and not out._pumps


class OneAtATime(Producer):
    """aiokafka's rule: ``send_batch`` takes a partition's batch only once the one before
    it has left in a request (:meth:`drain` lets every taken batch leave)."""

    def __init__(self, room: int = 1):
        super().__init__(room)
        self.undrained: dict[tuple[str, int], asyncio.Event] = {}

    async def send_batch(self, batch: Builder, topic: str, *, partition: int) -> Any:
        tp = (topic, partition)
        while tp in self.undrained:
            await self.undrained[tp].wait()
        self.undrained[tp] = asyncio.Event()
        return await super().send_batch(batch, topic, partition=partition)

    def drain(self) -> None:
        for gate in self.undrained.values():
            gate.set()
        self.undrained.clear()


async def turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_full_batch_never_waits_for_the_one_before_it_to_leave() -> None:
    """The worker goes on while aiokafka holds a partition's earlier batch: the batches
    queue, and go to aiokafka one at a time, in their order, as each leaves."""
    producer = OneAtATime(room=1)
    out = batches(producer)

    async def go() -> list[asyncio.Future[Any]]:
        futures = []
        for i in range(4):  # a batch a record: each add fills one
            futures.append(await out.add("out", b"k", b"%d" % i, 2, None, None, want=True))
        flushed = await out.flush()  # returned at once: nothing waited for a drain
        await turns()
        assert [r[1] for r in producer.logs[("out", 2)]] == [b"0"]  # one taken
        assert out.queued_bytes == 300
        for taken in range(2, 5):
            producer.drain()
            await turns()
            assert [r[1] for r in producer.logs[("out", 2)]] == [b"%d" % i for i in range(taken)]
        assert [f.result().offset for f in futures] == [0, 1, 2, 3]  # type: ignore[union-attr]
        assert out.queued_bytes == 0 and not out._queues and not out._pumps
        return flushed

    flushed = asyncio.run(go())
    assert len(flushed) == 4 and all(f.done() and f.exception() is None for f in flushed)


def test_a_send_waits_for_room_once_the_queues_hold_their_most() -> None:
    producer = OneAtATime(room=1)
    out = batches(producer)
    out.MAX_QUEUED_BYTES = 150  # a batch and a half of one record (100 bytes each)

    async def go() -> None:
        for i in range(3):
            await out.add("out", b"k", b"%d" % i, 0)
        # the fourth record closes the third batch: aiokafka takes the first, and two stay
        # queued (200 bytes), over the most
        fourth = asyncio.create_task(out.add("out", b"k", b"3", 0))
        await turns()
        assert not fourth.done() and out.queued_bytes == 200
        producer.drain()  # the first batch leaves: the second is taken, 100 queued
        await turns()
        assert fourth.done() and out.queued_bytes == 100
        flush = asyncio.create_task(out.flush())  # the last batch: waits for room too
        while out._pumps or not flush.done():
            producer.drain()
            await turns()

    asyncio.run(go())
    assert [r[1] for r in producer.logs[("out", 0)]] == [b"0", b"1", b"2", b"3"]


def test_a_rollback_forgets_the_queued_batches_and_what_waits_for_them() -> None:
    """What aiokafka took goes; what was still queued is never sent, its records' futures
    cancelled; what comes after the rollback goes after what aiokafka took."""
    producer = OneAtATime(room=1)
    out = batches(producer)

    async def go() -> list[asyncio.Future[Delivered] | None]:
        futures = [await out.add("changelog", b"k", b"old%d" % i, 0, None, None, want=True)
                   for i in range(3)]  # fmt: skip
        await out.flush()
        await turns()
        out.discard()
        assert out.queued_bytes == 0 and not out._queues and not out._pumps
        futures.append(await out.add("changelog", b"k", b"new", 0, None, None, want=True))
        await out.flush()
        for _ in range(3):
            producer.drain()
            await turns()
        return futures

    futures = asyncio.run(go())
    assert [r[1] for r in producer.logs[("changelog", 0)]] == [b"old0", b"new"]
    assert futures[0] is not None and futures[0].result().offset == 0
    assert all(f is not None and f.cancelled() for f in futures[1:3])
    assert futures[3] is not None and futures[3].result().offset == 1


def test_a_pump_cancelled_by_anything_but_a_rollback_fails_its_queue() -> None:
    """A stop that cancels every task (not :meth:`Batches.discard`) may cancel a pump, even
    before it ran: what it held fails, so no checkpoint waits for it forever, and the next
    batch of its partition gets a pump of its own."""
    producer = OneAtATime(room=1)
    out = batches(producer)

    async def go() -> tuple[list[Any], Any]:
        futures = [await out.add("out", b"k", b"%d" % i, 1, None, None, want=True)
                   for i in range(3)]  # fmt: skip
        out._pumps[("out", 1)].cancel()  # before its first step
        await turns()
        assert not out._pumps and not out._queues and out.queued_bytes == 0
        later = await out.add("out", b"k", b"later", 1, None, None, want=True)
        await out.flush()
        for _ in range(3):
            producer.drain()
            await turns()
        return futures, later

    futures, later = asyncio.run(go())
    for future in futures[:2]:  # the two closed batches; the third record's was open
        assert future is not None and isinstance(future.exception(), RuntimeError)
    assert futures[2] is not None and futures[2].result().offset == 0
    assert later is not None and later.result().offset == 1
    assert [r[1] for r in producer.logs[("out", 1)]] == [b"2", b"later"]


def test_nothing_is_queued_after_a_refusal_that_came_while_a_send_waited_for_room() -> None:
    """A flush waits for room; meanwhile aiokafka refuses a partition's batch. The flush's
    next batch of that partition must not go (it would land ahead of the refused one's
    records): it raises, and its records' futures are cancelled."""

    class RefusesFirst(OneAtATime):
        def __init__(self) -> None:
            super().__init__(room=1)
            self.refuse = asyncio.Event()

        async def send_batch(self, batch: Builder, topic: str, *, partition: int) -> Any:
            await self.refuse.wait()  # a0 and b both wait for the moment of the refusal
            if batch.records[0][1] == b"a0":
                raise RuntimeError("a request timed out")
            return await super().send_batch(batch, topic, partition=partition)

    producer = RefusesFirst()
    out = batches(producer)
    out.MAX_QUEUED_BYTES = 150

    async def go() -> Any:
        await out.add("out", b"k", b"a0", 0)
        other = await out.add("out", b"k", b"b", 1, None, None, want=True)
        await out.add("out", b"k", b"a1", 0)  # a0 closed: its pump waits in send_batch
        # the flush closes b's batch first: 200 bytes queued, over the most, so it waits
        flush = asyncio.create_task(out.flush())
        await turns()
        assert not flush.done()
        producer.refuse.set()  # a0 refused: room, and the flush goes on to a1's batch
        with pytest.raises(RuntimeError, match="refused a batch"):
            await flush
        await turns()
        return other

    other = asyncio.run(go())
    assert ("out", 0) not in producer.logs  # a1 never went ahead of a0
    assert other is not None and other.result().offset == 0  # b was queued before: it went
