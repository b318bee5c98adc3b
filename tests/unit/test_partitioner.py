"""Kafka's default partitioner, memdiag's faster copy (``memdiag.kafka``): the worker reads a
session's partition from it, and its producer writes every keyed output by it, so it must be
aiokafka's (the Java client's) to the bit, or a session's state and its events would part."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner as AioPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from memdiag.kafka import DefaultPartitioner, murmur2, partition_for
from memdiag.settings import Settings
from memdiag.streams.app import create_app


@given(st.binary(max_size=300))
def test_murmur2_is_kafkas_for_any_bytes(data: bytes) -> None:
    assert murmur2(data) == aiokafka_murmur2(data)


@given(st.text(max_size=120), st.integers(min_value=1, max_value=256))
def test_a_key_goes_where_kafkas_default_partitioner_puts_it(key: str, partitions: int) -> None:
    raw = key.encode("utf-8")
    every = list(range(partitions))
    assert partition_for(raw, partitions) == AioPartitioner()(raw, every, every)
    assert DefaultPartitioner()(raw, every, every[:1]) == AioPartitioner()(raw, every, every)


def test_known_values_of_the_java_client() -> None:
    # org.apache.kafka.common.utils.Utils.murmur2 (as a signed int in Java)
    assert murmur2(b"") == 275646681
    assert murmur2(b"21") & 0xFFFFFFFF == (-973932308) & 0xFFFFFFFF
    assert murmur2(b"foobar") & 0xFFFFFFFF == (-790332482) & 0xFFFFFFFF
    assert murmur2(b"a-little-bit-long-string") & 0xFFFFFFFF == (-985981536) & 0xFFFFFFFF


def test_a_message_without_a_key_goes_to_an_available_partition() -> None:
    chosen = {DefaultPartitioner()(None, [0, 1, 2, 3], [2, 3]) for _ in range(50)}
    assert chosen == {2, 3}
    assert DefaultPartitioner()(None, [0, 1], []) in (0, 1)


def test_the_worker_producer_takes_it() -> None:
    w = create_app(Settings(broker="kafka://127.0.0.1:1", topic_prefix="t.", state_store="memory"))
    assert isinstance(w.app.conf.producer_partitioner, DefaultPartitioner)
    assert isinstance(w.app.producer.partitioner, DefaultPartitioner)
