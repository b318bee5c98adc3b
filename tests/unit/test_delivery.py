"""``memdiag.streams.checkpoint.delivered``: a checkpoint counts as delivered only when every one of its
delivery futures succeeded, whatever order the broker answers in."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.procs import GC_YOUNG_THRESHOLD, tune_gc
from memdiag.streams.checkpoint import delivered


def resolve_later(futures: list[asyncio.Future[int]], order: list[int], fail: int | None) -> None:
    loop = asyncio.get_running_loop()
    for step, i in enumerate(order):
        if i == fail:
            loop.call_later(step * 0.0005, futures[i].set_exception, OSError("broker said no"))
        else:
            loop.call_later(step * 0.0005, futures[i].set_result, i)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.randoms(use_true_random=False), st.booleans())
def test_waits_for_every_future_in_any_order(n: int, rnd: random.Random, failing: bool) -> None:
    async def go() -> None:
        loop = asyncio.get_running_loop()
        futures = [loop.create_future() for _ in range(n)]
        order = list(range(n))
        rnd.shuffle(order)
        fail = rnd.randrange(n) if failing else None
        resolve_later(futures, order, fail)
        if fail is None:
            await delivered(futures)
            assert all(f.done() for f in futures)
        else:
            with pytest.raises(OSError, match="broker said no"):
                await delivered(futures)
            assert futures[fail].done()

    asyncio.run(go())


async def test_an_older_failure_is_raised_though_the_newest_succeeded() -> None:
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(3)]
    futures[0].set_exception(OSError("lost"))
    futures[1].set_result(1)
    loop.call_later(0.001, futures[2].set_result, 2)
    with pytest.raises(OSError, match="lost"):
        await delivered(futures)


async def test_nothing_to_wait_for() -> None:
    await delivered([])


def test_tune_gc_keeps_collecting_in_larger_steps() -> None:
    import gc

    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.isenabled()
        assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
