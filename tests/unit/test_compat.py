"""``memdiag.streams.compat``: the rest of a coroutine, resumed after its first suspension, behaves
as the whole coroutine would (results, exceptions, cancellation)."""

from __future__ import annotations

import asyncio

import pytest

from memdiag.streams.compat import _finish


async def started(coro):  # type: ignore[no-untyped-def]
    """Run ``coro`` up to its first suspension, as the patched delivery does."""
    return _finish(coro, coro.send(None))


async def test_the_rest_runs_to_its_result() -> None:
    gate: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def deliver() -> int:
        got = await gate
        await asyncio.sleep(0)
        return got + 1

    rest = await started(deliver())
    asyncio.get_running_loop().call_later(0.01, gate.set_result, 41)
    assert await rest == 42


async def test_an_exception_after_the_suspension_propagates() -> None:
    async def deliver() -> None:
        await asyncio.sleep(0.001)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        await await_started(deliver())


async def await_started(coro):  # type: ignore[no-untyped-def]
    return await (await started(coro))


async def test_cancelling_the_rest_cancels_the_coroutine() -> None:
    cleaned = []

    async def deliver() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            cleaned.append(True)

    task = asyncio.ensure_future(await started(deliver()))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [True]


def test_the_worker_consumer_waits_at_the_broker_as_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aiokafka import AIOKafkaConsumer
    from faust.transport.drivers import aiokafka as driver

    from memdiag.settings import Settings
    from memdiag.streams.app import faust_app
    from memdiag.streams.compat import patch_faust_fetch_wait

    cls = driver.AIOKafkaConsumerThread
    original = cls._create_worker_consumer
    monkeypatch.setattr(cls, "_create_worker_consumer", original)  # undone after the test
    patch_faust_fetch_wait(123)
    patch_faust_fetch_wait(123)  # twice: still one wrapper, around Faust's own
    assert cls._create_worker_consumer.__wrapped__ is original  # type: ignore[attr-defined]
    app = faust_app(Settings.from_env({}, broker="kafka://127.0.0.1:1", app_id="compat-test"))
    thread = app.consumer._thread

    async def create() -> tuple[int, int, int]:  # aiokafka builds consumers in a running loop
        consumer = thread._create_worker_consumer(app.transport)
        await consumer.stop()
        # the attribute the patch sets is the one aiokafka's own argument sets
        plain = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", fetch_max_wait_ms=7)
        await plain.stop()
        return (
            consumer._fetch_max_wait_ms,
            consumer._max_partition_fetch_bytes,
            plain._fetch_max_wait_ms,
        )

    try:
        wait_ms, fetch_bytes, plain_ms = thread.thread_loop.run_until_complete(create())
    finally:
        thread.thread_loop.close()
        app.loop.close()
    assert (wait_ms, plain_ms) == (123, 7)
    assert fetch_bytes == app.conf.consumer_max_fetch_size == 4 * 1024 * 1024


async def test_a_raw_channel_gets_the_events_fausts_own_handler_makes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The raw delivery hands a stage's queue the same event Faust's handler would (key,
    value, headers, message, one reference), waits for room when the queue is full, and
    leaves a partition with any other reader to Faust."""
    from faust.transport.conductor import Conductor
    from faust.types import TP, Message

    from memdiag.settings import Settings
    from memdiag.streams import compat
    from memdiag.streams.app import faust_app

    original = Conductor._build_handler
    monkeypatch.setattr(Conductor, "_build_handler", original)  # undone after the test
    monkeypatch.setattr(compat, "_RAW_PATCHED", False)
    compat.patch_faust_raw_delivery()
    compat.patch_faust_raw_delivery()  # twice: still one wrapper, around Faust's own
    assert Conductor._build_handler.__wrapped__ is original  # type: ignore[attr-defined]
    app = faust_app(Settings.from_env({}, broker="kafka://127.0.0.1:1", app_id="compat-raw"))
    tp = TP("raw-in", 0)

    def channel(maxsize: int, raw: bool):  # type: ignore[no-untyped-def]
        chan = app.topic(
            "raw-in", key_type=bytes, value_type=bytes, key_serializer="raw",
            value_serializer="raw", acks=False,
        ).clone_using_queue(app.FlowControlQueue(maxsize=maxsize))  # fmt: skip
        if raw:
            setattr(chan, compat.RAW_CHANNEL, True)
        return chan

    def message(offset: int, key: bytes | None, headers: list) -> Message:  # type: ignore[type-arg]
        return Message(
            topic="raw-in", partition=0, offset=offset, timestamp=1.5, timestamp_type=0,
            headers=headers, key=key, value=b'{"kind": "search"}', checksum=None, tp=tp,
        )  # fmt: skip

    try:
        await raw_delivery(app, tp, channel, message, original)
    finally:
        app.consumer._thread.thread_loop.close()  # made with the consumer, never started


async def raw_delivery(app, tp, channel, message, original) -> None:  # type: ignore[no-untyped-def]
    app.flow_control.resume()
    raw, plain = channel(1, raw=True), channel(10, raw=False)
    conductor = app.topics  # Faust's Conductor
    fast = conductor._build_handler(tp, {raw})

    def ours_(handler: object) -> bool:
        return getattr(handler, "__qualname__", "").startswith("_raw_handler")

    assert ours_(fast)
    assert not ours_(conductor._build_handler(tp, {raw, plain}))  # another reader: Faust's
    assert not ours_(conductor._build_handler(tp, {plain}))
    faust_own = original(conductor, tp, {plain})
    cases = [(None, []), (b"ses_1", [("memdiag-rerouted", b"1")])]
    for offset, (key, headers) in enumerate(cases):
        ours, theirs = message(offset, key, headers), message(offset, key, headers)
        await fast(ours)
        await faust_own(theirs)
        mine, faust_event = raw.queue.get_nowait(), plain.queue.get_nowait()
        for attr in ("key", "value", "headers"):
            assert getattr(mine, attr) == getattr(faust_event, attr), attr
        assert mine.message is ours and ours.refcount == theirs.refcount == 1
    # a full queue: the delivery waits for room, then the event is there
    await fast(message(2, b"a", []))
    waiting = asyncio.ensure_future(fast(message(3, b"b", [])))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    assert raw.queue.get_nowait().key == b"a"
    await asyncio.wait_for(waiting, 1)
    assert raw.queue.get_nowait().key == b"b"
