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
    """The raw delivery does for a stage's channel what Faust's own handler does, seen from
    outside: the same events (key, value, headers, message, one reference), the same pressure
    callbacks and buffer-full sensor calls, and a wait wherever Faust waits (a full queue,
    flow control suspended, the producer buffer over its limit). A partition with any other
    reader, or a channel that is not raw bytes, keeps Faust's handler."""
    from faust.transport.conductor import Conductor

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
    try:
        await raw_delivery(app, original)
    finally:
        app.consumer._thread.thread_loop.close()  # made with the consumer, never started


async def raw_delivery(app, original) -> None:  # type: ignore[no-untyped-def]
    from faust.types import TP, Message

    from memdiag.streams import compat

    tp = TP("raw-in", 0)
    calls: list[tuple[str, object]] = []
    buffer = app.producer.buffer

    async def ebb() -> None:  # Faust's wait does something only over the limit
        if buffer.size > buffer.max_messages:
            calls.append(("ebb", None))

    # spies, in place before the handlers are built (Faust's takes them then)
    app.sensors.on_topic_buffer_full = lambda t: calls.append(("sensor", t))
    app.consumer.on_buffer_full = lambda t: calls.append(("full", t))
    app.consumer.on_buffer_drop = lambda t: calls.append(("drop", t))
    buffer.wait_until_ebb = ebb

    def channel(raw: bool, serializer: str = "raw"):  # type: ignore[no-untyped-def]
        chan = app.topic(
            "raw-in", key_type=bytes, value_type=bytes, key_serializer=serializer,
            value_serializer=serializer, acks=False,
        ).clone_using_queue(app.FlowControlQueue(maxsize=4))  # fmt: skip
        if raw:
            setattr(chan, compat.RAW_CHANNEL, True)
        return chan

    conductor = app.topics  # Faust's Conductor

    def ours(handler: object) -> bool:
        return getattr(handler, "__qualname__", "").startswith("_raw_handler")

    raw, plain = channel(raw=True), channel(raw=False)
    assert ours(conductor._build_handler(tp, {raw}))
    assert not ours(conductor._build_handler(tp, {raw, plain}))  # another reader: Faust's
    assert not ours(conductor._build_handler(tp, {plain}))
    assert not ours(conductor._build_handler(tp, {channel(raw=True, serializer="json")}))

    async def trace(handler, chan) -> list[object]:  # type: ignore[no-untyped-def]
        """What the outside sees of ``handler`` over one scenario."""
        calls.clear()
        seen: list[object] = []
        messages = [
            Message(topic="raw-in", partition=0, offset=o, timestamp=1.5, timestamp_type=0,
                    headers=h, key=k, value=b'{"kind": "search"}', checksum=None, tp=tp)
            for o, (k, h) in enumerate([(None, []), (b"ses_1", [("memdiag-rerouted", b"1")])]
                                       + [(b"k%d" % o, []) for o in range(2, 8)])
        ]  # fmt: skip

        def take() -> None:
            event = chan.queue.get_nowait()
            seen.append((event.key, event.value, event.headers, event.message.offset,
                         event.message.refcount, event.message in messages))  # fmt: skip

        async def blocked(coro) -> bool:  # type: ignore[no-untyped-def]
            task = asyncio.ensure_future(coro)
            await asyncio.sleep(0.01)
            seen.append(("blocked", not task.done()))
            return task

        for m in messages[:4]:  # up to full, with the pressure callbacks
            await handler(m)
        task = await blocked(handler(messages[4]))  # full: waits for room
        take()
        await asyncio.wait_for(task, 1)
        while not chan.queue.empty():
            take()
        app.flow_control.suspend()  # a rebalance: waits until flow resumes
        task = await blocked(handler(messages[5]))
        app.flow_control.resume()
        await asyncio.wait_for(task, 1)
        for _ in range(buffer.max_messages + 1):  # the producer buffer over its limit
            buffer.pending.put_nowait(None)
        await handler(messages[6])
        while not buffer.pending.empty():
            buffer.pending.get_nowait()
        await handler(messages[7])
        while not chan.queue.empty():
            take()
        return seen + calls

    app.flow_control.resume()
    mine = await trace(conductor._build_handler(tp, {raw}), raw)
    faust_own = await trace(original(conductor, tp, {plain}), plain)
    assert mine == faust_own
    assert ("blocked", True) in mine and ("sensor", tp) in mine and ("ebb", None) in mine
    assert ("full", tp) in mine and len([e for e in mine if isinstance(e[0], bytes | None)]) == 8
