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
