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


def test_a_batch_the_producer_refuses_to_queue_fails_its_records_and_raises() -> None:
    class Closed(Producer):
        async def send_batch(self, batch: Builder, topic: str, *, partition: int) -> Any:
            raise RuntimeError("the producer is closed")

    out = batches(Closed())

    async def go() -> asyncio.Future[Delivered] | None:
        future = await out.add("changelog", b"k", b"v", 1, None, None, want=True)
        with pytest.raises(RuntimeError, match="closed"):
            await out.flush()
        return future

    future = asyncio.run(go())
    assert future is not None and isinstance(future.exception(), RuntimeError)
