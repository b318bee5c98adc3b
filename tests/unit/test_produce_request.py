"""``memdiag.streams.produce_request``: aiokafka's produce request with its record batches
copied once. The bytes are aiokafka's own for every request (drawn here), the producer's
sender builds it once the worker patches it, and the start-up check refuses an encoder that
differs."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest
from aiokafka.producer import sender
from aiokafka.protocol import produce
from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.streams import compat, produce_request

INT32 = st.integers(-(2**31), 2**31 - 1)
#: a record batch's buffer: aiokafka's builder gives a bytearray
BUFFERS = st.none() | st.binary(max_size=300).flatmap(
    lambda data: st.sampled_from([data, bytearray(data), memoryview(data)])
)
TOPICS = st.none() | st.lists(
    st.tuples(st.text(max_size=40), st.none() | st.lists(st.tuples(INT32, BUFFERS), max_size=4)),
    max_size=4,
)
REQUESTS = st.tuples(
    st.none() | st.text(max_size=30),
    st.integers(-(2**15), 2**15 - 1),  # required_acks: an int16
    INT32,  # timeout
    TOPICS,
)
VERSIONS = sorted(produce_request.FAST, key=lambda cls: cls.API_VERSION)


def test_versions_three_to_seven_have_the_one_copy_encoder() -> None:
    assert [cls.API_VERSION for cls in VERSIONS] == [3, 4, 5, 6, 7]
    assert produce_request.same_bytes() == []


@settings(max_examples=300, deadline=None)
@given(request=REQUESTS, version=st.sampled_from(VERSIONS))
def test_the_bytes_are_aiokafkas_for_any_request(request: tuple[Any, ...], version: Any) -> None:
    unjoined = produce_request.FAST[version](*request).encode()
    fast = bytes(unjoined)
    assert fast == version(*request).encode()
    assert len(unjoined) == len(fast)
    # and they read back as what was sent (aiokafka's decoder: a broker's view)
    transactional_id, acks, timeout, topics = version.decode(fast).__dict__.values()
    assert (transactional_id, acks, timeout) == request[:3]
    sent = (
        None
        if request[3] is None
        else [
            (t, None if p is None else [(i, None if r is None else bytes(r)) for i, r in p])
            for t, p in request[3]
        ]
    )
    assert topics == sent


def _sent_while_traced(request_class: Any, batch: bytes) -> int:
    """The most memory aiokafka's connection held at once while it sent a request of
    ``batch`` (tracemalloc)."""
    request = request_class(None, -1, 30_000, [("t", [(2, batch)])])
    tracemalloc.start()
    try:
        data = produce_request.sent_by_aiokafka(request)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(data) > len(batch)
    return peak


def test_a_large_batch_is_copied_once_from_the_batch_to_the_socket() -> None:
    """The point of it. aiokafka's encoding holds two copies of the batch at once at least
    (a level's parts and their join), six in all, and its connection two more (the header
    in front, then the size); the request memdiag builds is copied once, into the bytes the
    connection writes."""
    batch = bytes(range(256)) * 4096  # 1 MiB
    ours = _sent_while_traced(produce_request.ProduceRequest, batch)
    aiokafkas = _sent_while_traced(produce.ProduceRequest, batch)
    assert ours < 1.1 * len(batch)
    assert aiokafkas > 1.9 * len(batch)


def test_the_connection_writes_the_same_bytes_for_it_as_for_aiokafkas_own() -> None:
    topics = [("memdiag.diagnostics", [(0, b"\x00" * 300), (5, bytearray(b"rows"))])]
    for version in (3, 5, 7):
        ours = produce_request.sent_by_aiokafka(
            produce_request.ProduceRequest("tx", -1, 5_000, topics), version
        )
        theirs = produce_request.sent_by_aiokafka(
            produce.ProduceRequest("tx", -1, 5_000, topics), version
        )
        assert ours == theirs
        assert int.from_bytes(ours[:4], "big") == len(ours) - 4  # the size: what follows


def test_an_unjoined_request_is_joined_only_once_the_size_goes_in_front() -> None:
    unjoined = produce_request.Unjoined([b"ab", memoryview(b"cd")], 4)
    headed = b"H" + unjoined
    assert isinstance(headed, produce_request.Unjoined) and len(headed) == 5
    assert b"S" + headed == b"SHabcd"
    assert bytes(unjoined) == b"abcd"
    with pytest.raises(TypeError):  # a str, say: not taken
        "H" + unjoined  # type: ignore[operator]
    # its length is its bytes', whatever a view's format
    assert len(produce_request._unjoined([b"ab", memoryview(bytes(8)).cast("I")])) == 10


def test_a_connection_that_writes_the_request_some_other_way_stops_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An aiokafka whose connection would hand the writer an Unjoined (it writes the
    header, the size and the request another way) is caught at start, not at the first
    produce."""
    from aiokafka.conn import AIOKafkaConnection

    def send(self: Any, request: Any, expect_response: bool = True) -> Any:
        struct = request.prepare(self._versions)
        header = struct.build_request_header(correlation_id=1, client_id=self._client_id)
        body = struct.encode()
        self._writer.write(len(body).to_bytes(4, "big") + header.encode() + body)
        return self._writer.drain()

    monkeypatch.setattr(AIOKafkaConnection, "send", send)
    with pytest.raises(compat.IncompatibleFaust, match="connection does not send"):
        compat.check()


@pytest.mark.parametrize("top, fast", [(7, True), (3, True), (2, False), (0, False)])
def test_the_struct_built_is_the_broker_versions_with_the_encoder_from_three(
    top: int, fast: bool
) -> None:
    """Brokers older than Kafka 0.11 (versions 0-2, no transactional id) keep aiokafka's."""
    request = produce_request.ProduceRequest(None, 1, 1_000, [("t", [(0, b"x")])])
    struct = request.prepare({0: (0, top)})
    assert struct.API_VERSION == top
    assert (type(struct).encode is produce_request.encode) is fast
    assert isinstance(struct, produce.ProduceRequest._CLASSES[top])


def test_the_worker_patch_makes_the_producer_build_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sender, "ProduceRequest", produce.ProduceRequest)
    monkeypatch.setattr(compat, "_PATCHED", set())
    compat.patch_produce_encoding()
    assert sender.ProduceRequest is produce_request.ProduceRequest
    compat.check()  # patched, the check still passes

    class Batch:
        def get_data_buffer(self) -> bytes:
            return b"records"

    class Sender:  # what SendProduceReqHandler reads of aiokafka's sender
        client = None
        _txn_manager = None
        _acks = -1
        _request_timeout_ms = 40_000
        _retry_backoff = 0.1

    from aiokafka.structs import TopicPartition

    handler = sender.SendProduceReqHandler(Sender(), {TopicPartition("t", 0): Batch()})
    request = handler.create_request()
    assert isinstance(request, produce_request.ProduceRequest)
    assert type(request.prepare({0: (0, 7)})).encode is produce_request.encode


def test_an_encoder_that_differs_stops_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    version = VERSIONS[-1]
    wrong = type("Wrong", (version,), {"encode": lambda self: b"not aiokafka's bytes"})
    monkeypatch.setitem(produce_request.FAST, version, wrong)
    with pytest.raises(compat.IncompatibleFaust, match="ProduceRequest_v7 encodes differently"):
        compat.check()


def test_an_aiokafka_whose_request_cannot_be_built_is_named_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def changed() -> list[str]:
        raise TypeError("ProduceRequest_v7() takes no arguments")

    monkeypatch.setattr(produce_request, "same_bytes", changed)
    with pytest.raises(compat.IncompatibleFaust, match=r"aiokafka \d.*takes no arguments"):
        compat.check()


def test_a_sender_that_builds_no_produce_request_of_its_own_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(sender, "ProduceRequest")
    with pytest.raises(compat.IncompatibleFaust, match="builds no ProduceRequest"):
        compat.check()
