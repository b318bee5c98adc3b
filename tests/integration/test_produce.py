"""The worker's batches through a real broker (memdiag.streams.produce over aiokafka's batch
API): what the checkpoint relies on. Each record's offset, computed from its batch's, is where
a consumer finds it; a keyed record is on its key's partition; batches of one partition keep
their order across a full batch and a flush."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from memdiag.kafka import DefaultPartitioner, partition_for
from memdiag.streams.produce import Batches

pytestmark = pytest.mark.integration


async def _records(url: str, topic: str, partitions: int) -> dict[int, list[tuple[bytes, bytes]]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=url, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        found: dict[int, list[tuple[bytes, bytes]]] = {p: [] for p in range(partitions)}
        while batches := await consumer.getmany(*tps, timeout_ms=1500):
            for tp, records in batches.items():
                for r in records:
                    assert r.offset == len(found[tp.partition])  # no gap, from offset 0
                    found[tp.partition].append((r.key, r.value))
        return found
    finally:
        await consumer.stop()


def test_record_offsets_from_their_batches_are_where_a_consumer_finds_them(
    broker_url: str,
) -> None:
    url = broker_url.removeprefix("kafka://")
    topic = f"produce-{uuid.uuid4().hex[:8]}"

    async def go() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=url)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, num_partitions=3, replication_factor=1)])
        finally:
            await admin.close()
        # batches of about 1 KB: 40 records of 100 bytes on one partition fill several
        producer = AIOKafkaProducer(bootstrap_servers=url, max_batch_size=1024, acks=-1)
        await producer.start()
        try:
            out = Batches(lambda: producer, DefaultPartitioner())
            futures = []
            for i in range(40):
                value = b"%03d" % i + b"x" * 97
                futures.append(await out.add(topic, b"p0-%d" % i, value, 0, None,
                                             [("memdiag-offsets", b"{}")], want=True))  # fmt: skip
                if i == 25:
                    await out.flush()  # a half-full batch goes early; the next follow it
            keyed = [b"ses_%02d" % i for i in range(30)]
            for key in keyed:
                await out.add(topic, key, b"keyed")
            sent = await out.flush()
            await asyncio.gather(*sent, *futures)
            assert len(sent) >= 1
        finally:
            await producer.stop()
        found = await _records(url, topic, 3)
        # each future's offset is its record's place in the log, in the order added
        offsets = [f.result().offset for f in futures]  # type: ignore[union-attr]
        assert offsets == list(range(40))
        assert [k for k, _ in found[0] if k.startswith(b"p0-")] == [b"p0-%d" % i for i in range(40)]
        for key in keyed:
            assert (key, b"keyed") in found[partition_for(key, 3)]

    asyncio.run(go())
