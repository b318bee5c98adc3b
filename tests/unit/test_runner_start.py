"""Where the runner takes a generation's records from: a partition whose fetch begins exactly
at its committed offset is read on, not sought (a seek makes the fetcher drop what it fetched
and fetch it again); any other is sought there."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from memdiag.settings import Settings
from memdiag.streams.checkpoint import TP
from tests.inmemory import World

T0 = 1_795_000_000_000  # ms


def _search(n: int) -> dict[str, Any]:
    ts = datetime.fromtimestamp((T0 + n * 1000) / 1000, UTC).isoformat().replace("+00:00", "Z")
    return {"kind": "search", "event_id": f"e{n}", "ts": ts, "session_id": "s1",
            "query": f"query {n}", "result_ids": [f"r{n}"]}  # fmt: skip


def _world(n: int) -> tuple[World, TP, list[Any], list[dict[Any, int]]]:
    """A world with ``n`` searches of one session on its events topic, and the seeks its
    runner asks for."""
    world = World(Settings())
    for i in range(n):
        world.append(world.events, "s1", _search(i), timestamp_ms=T0 + i * 1000)
    tp = next(TP(t, p) for t, p in world.logs if t == world.events)
    seeks: list[dict[Any, int]] = []
    seek = world.kafka.seek

    async def recorded(offsets: Mapping[Any, int]) -> None:
        seeks.append(dict(offsets))
        await seek(offsets)

    world.kafka.seek = recorded  # type: ignore[method-assign]
    return world, tp, world.logs[tuple(tp)], seeks  # type: ignore[index]


def _rows(world: World) -> list[str]:
    """The search rows in the sink's table."""
    return sorted(world.tables.searches)


def test_a_generation_whose_fetch_is_at_the_committed_offset_is_read_on_without_a_seek() -> None:
    world, tp, log, seeks = _world(6)
    runner = world.runner

    async def go() -> None:
        await runner._handle([(world.generation, tp, log[0:3])])
        await runner._handle([(world.generation, tp, log[3:6])])
        await runner._commit()

    asyncio.run(go())
    assert all(tp not in s for s in seeks), seeks
    assert runner.processed == 6 and _rows(world) == [f"e{i}" for i in range(6)]
    assert world.committed[tp] == 6


def test_a_fetch_from_before_the_committed_offset_is_sought_to_it() -> None:
    """A fetch that begins before the committed offset (the log's start, say) is sought: what
    lies before would be fetched only to be skipped."""
    world, tp, log, seeks = _world(6)
    world.committed[tp] = 2  # e0 and e1 were taken by an earlier worker
    runner = world.runner

    async def go() -> None:
        await runner._handle([(world.generation, tp, log[0:6])])
        await runner._commit()

    asyncio.run(go())
    assert seeks[0][tp] == 2
    assert runner.processed == 4 and runner.skipped["behind"] == 2
    assert _rows(world) == [f"e{i}" for i in range(2, 6)]


def test_with_the_offsets_lost_the_log_before_the_local_state_is_not_read_again() -> None:
    """The group's offsets expired while no worker ran; the worker keeps its local state,
    whose covers say where to go on. The fetch starts at the log's start (nothing committed,
    reset to earliest): the partition is sought to where the state ends, not read from the
    start and skipped: only the first batch, fetched before the seek, is (from a review: the
    whole log was)."""
    world, tp, log, seeks = _world(400)
    world.run()
    world.lose_offsets()
    world.restart(fresh=False)
    for i in range(400, 404):
        world.append(world.events, "s1", _search(i), timestamp_ms=T0 + i * 1000)
    world.start_rng.random = lambda: 0.9  # type: ignore[method-assign]  # the batch starts it
    world.run()  # batches of at most 50 records
    assert world.runner.skipped["behind"] <= 50, dict(world.runner.skipped)
    assert world.runner.processed == 4
    assert _rows(world) == sorted(f"e{i}" for i in range(404))


def test_a_fetch_past_the_committed_offset_is_sought_back_and_nothing_is_missed() -> None:
    world, tp, log, seeks = _world(6)
    runner = world.runner

    async def go() -> None:
        await runner._handle([(world.generation, tp, log[2:4])])  # e0, e1 not fetched
        assert runner.processed == 0
        await runner._handle([(world.generation, tp, log[0:6])])  # fetched from the seek
        await runner._commit()

    asyncio.run(go())
    assert seeks[0][tp] == 0
    assert runner.processed == 6 and _rows(world) == [f"e{i}" for i in range(6)]


def test_the_inbox_tells_where_a_partition_the_batch_lacks_is_fetched_from() -> None:
    """The batch in hand holds another partition's records only; this one's are waiting in
    the inbox from its committed offset on: it is not sought either."""
    world, tp, log, seeks = _world(4)
    runner = world.runner
    runner.deliver(world.generation, {tp: log[0:4]})

    async def go() -> None:
        await runner._start(world.generation, [])
        await runner._handle(runner.inbox.take(100, 1 << 20))
        await runner._commit()

    asyncio.run(go())
    assert all(tp not in s for s in seeks), seeks
    others = {t for s in seeks for t in s}
    assert others, "the partitions nothing was fetched from are sought"
    assert runner.processed == 4


def test_after_a_refused_commit_the_records_rolled_back_are_fetched_again() -> None:
    """A checkpoint refused: the next batch continues the fetch past the committed offset,
    so the partition is sought back and the rolled-back records are taken again, once."""
    world, tp, log, seeks = _world(6)
    runner = world.runner

    async def go() -> None:
        await runner._handle([(world.generation, tp, log[0:2])])
        await runner._commit()
        await runner._handle([(world.generation, tp, log[2:4])])
        world.kafka.refuse_next_commit = True
        await runner._commit()  # refused: e2 and e3 rolled back
        assert world.refused == 1
        await runner._handle([(world.generation, tp, log[4:6])])  # the fetch went on
        assert seeks[-1][tp] == 2
        await runner._handle([(world.generation, tp, log[2:6])])  # from the seek
        await runner._commit()

    asyncio.run(go())
    assert runner.processed == 2 + 2 + 4  # e2 and e3 twice: the first time rolled back
    assert _rows(world) == [f"e{i}" for i in range(6)]
    assert world.committed[tp] == 6
