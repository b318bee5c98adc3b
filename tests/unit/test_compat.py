"""``streams.compat``: the rest of a coroutine, resumed after its first suspension, behaves
as the whole coroutine would (results, exceptions, cancellation)."""

from __future__ import annotations

import asyncio

import pytest

from streams.compat import _finish


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
