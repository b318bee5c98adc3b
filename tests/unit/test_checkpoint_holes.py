"""The checkpoint's holes found on paths the kill-at-each-step tests do not take (#38): each
test drives the in-memory worker (tests/inmemory.py) down one such path, and failed on the
code before its fix."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from memdiag.settings import Settings
from memdiag.streams.checkpoint import TP, Checkpoint
from memdiag.streams.session.states import SessionStates
from memdiag.streams.stages.sessions import SessionStage
from tests.inmemory import World, partition_for

HOUR_MS = 3_600_000
T0 = 1_795_000_000_000  # 2026-11-18, in ms


def event(sid: str, n: int, at_ms: int) -> dict[str, Any]:
    ts = datetime.fromtimestamp(at_ms / 1000, UTC).isoformat().replace("+00:00", "Z")
    return {"kind": "search", "event_id": f"{sid}-{n}", "ts": ts, "session_id": sid,
            "query": f"{sid} query {n}", "result_ids": [f"{sid}-r{n}"]}  # fmt: skip


def same_partition(world: World, n: int) -> list[str]:
    """``n`` session ids on partition 0 of the events topic."""
    ids, i = [], 0
    while len(ids) < n:
        sid = f"s{i}"
        if partition_for(sid, world.partitions) == 0:
            ids.append(sid)
        i += 1
    return ids


def test_a_rollback_takes_the_processing_clock_back_too() -> None:
    """Hole 3. A catch-up: on one partition, session C's first event, then (uncommitted) A's,
    C's second 20 minutes later, and B's past the keep time. The checkpoint holding the last
    three is refused, so they are taken again, the first alone. Before the fix the rerun swept
    with the dropped checkpoint's newest time: C was forgotten before its second event came
    again, and that event was dead-lettered as late (the first attempt had applied it)."""
    settings = Settings(session_keep_hours=1.0)
    world = World(settings)
    c, a, b = same_partition(world, 3)
    times = (T0, T0 + 10 * 60_000, T0 + 20 * 60_000, T0 + 3 * HOUR_MS)
    for sid, n, at in ((c, 0, times[0]), (a, 0, times[1]), (c, 1, times[2]), (b, 0, times[3])):
        world.append(world.events, sid, event(sid, n, at), timestamp_ms=at)
    world.now_ms = T0 + 4 * HOUR_MS  # the wall clock: the worker catches up
    tp = TP(world.events, 0)
    log = world.logs[(world.events, 0)]
    runner = world.runner

    async def go() -> None:
        await runner._start(world.generation)
        await runner._handle([(world.generation, tp, log[0:1])])
        await runner._commit()
        await runner._handle([(world.generation, tp, log[1:4])])
        world.kafka.refuse_next_commit = True
        await runner._commit()  # refused: rolled back to C's first event
        assert world.refused == 1
        await runner._start(world.generation)
        await runner._handle([(world.generation, tp, log[1:2])])  # A's first, alone
        await runner._handle([(world.generation, tp, log[2:4])])
        await runner._commit()

    asyncio.run(go())
    late = [d for d in world.tables.dead_letters if d["reason"] == "late_event"]
    assert late == [], [d["detail"] for d in late]


def test_a_revocation_waits_for_its_commit_however_slow() -> None:
    """Hole 1. Partitions are revoked while the checkpoint's OffsetCommit is slow (a broker
    under load, a coordinator moving). aiokafka retries a commit with the generation current
    when it retries, so an abandoned commit can land after the rejoin, over offsets the next
    owner already read. Before the fix the revocation gave up after its wait, dropped the
    checkpoint without queuing its keys for repair, and returned while the commit ran on."""
    world = World(Settings())
    sids = same_partition(world, 3)
    for n, sid in enumerate(sids):
        at = T0 + n * 1000
        world.append(world.events, sid, event(sid, 0, at), timestamp_ms=at)
    world.now_ms = T0 + 60_000
    tp = TP(world.events, 0)
    runner = world.runner
    runner.REVOKE_WAIT_SECONDS = 0.05
    landed: list[str] = []
    commit = world.kafka.commit

    async def slow_commit(offsets: Any) -> None:
        async def land() -> None:
            await asyncio.sleep(0.3)
            await commit(offsets)
            landed.append("commit")

        # the request goes on in the consumer's thread whatever happens to its caller
        await asyncio.shield(asyncio.ensure_future(land()))

    world.kafka.commit = slow_commit  # type: ignore[method-assign]

    async def go() -> None:
        await runner._start(world.generation)
        await runner._handle([(world.generation, tp, world.logs[(world.events, 0)][0:3])])
        await runner.on_revoked()
        landed.append("revoked")
        await asyncio.sleep(0.5)  # what an abandoned commit would still do meanwhile

    asyncio.run(go())
    assert landed == ["commit", "revoked"]  # settled before the revocation returned
    assert world.committed[tp] == 3 and runner.checkpoints == 1
    # the committed state is in the backends, as a commit that completes writes it
    assert world.committed_state == {p: dict(b.data) for p, b in world.table.backends.items()}


def test_a_revocation_whose_commit_landed_in_part_stops_the_worker() -> None:
    """Hole 1's other side: a commit whose outcome cannot be settled (it landed for some
    partitions) is never turned into a drop at revocation, which would leave the state behind
    offsets that did land: the worker stops, as from the run loop, and recovery decides."""
    world = World(Settings())
    for n, sid in enumerate(same_partition(world, 2)):
        world.append(world.events, sid, event(sid, 0, T0 + n), timestamp_ms=T0 + n)
    tp = TP(world.events, 0)
    runner = world.runner
    fatal: list[BaseException] = []

    async def on_fatal(exc: BaseException) -> None:
        fatal.append(exc)

    async def unknown(offsets: Any) -> None:
        raise TimeoutError("no answer")

    async def half(tps: list[Any]) -> dict[Any, int]:
        raise ConnectionError("the broker cannot say")

    runner.on_fatal = on_fatal
    world.kafka.commit = unknown  # type: ignore[method-assign]
    world.kafka.committed = half  # type: ignore[method-assign]

    async def go() -> None:
        await runner._start(world.generation)
        await runner._handle([(world.generation, tp, world.logs[(world.events, 0)][0:2])])
        await runner.on_revoked()

    asyncio.run(go())
    assert [type(e) for e in fatal] == [ConnectionError]
    assert runner.failed_checkpoints == 0  # not dropped as if nothing had landed


def test_repairs_are_written_without_waiting_for_their_partitions_traffic() -> None:
    """Hole 2. A failed checkpoint leaves records in the changelog its commit never covered,
    and queues their keys for repair. Compaction waits only for time: once the lag passes, the
    cleaner may drop each key's committed record, superseded by the uncovered one, and a
    rebuild then skips that one and loses the value. Before the fix the repairs waited for a
    checkpoint that moved their partition's offsets: a quiet partition (here 0, while 1 keeps
    going) kept them pending, however many checkpoints committed. Now every checkpoint writes
    them, with their partition's committed offsets in the header, so each key's latest record
    is one the committed offsets cover."""
    world, busy = quiet_and_busy(4)
    p0, p1 = TP(world.events, 0), TP(world.events, 1)
    log1 = world.logs[(world.events, 1)]
    runner = world.runner

    async def go() -> None:
        g = world.generation
        await queue_repairs(world)  # its changelog records are in the log, uncovered
        world.position[p0] = 2  # the quiet partition's records are taken again ...
        await runner._start(g)
        for i in range(len(busy)):  # ... but only the busy partition gets new records
            await runner._handle([(g, p1, log1[i : i + 1])])
            await runner._commit()

    asyncio.run(go())
    assert not world.table.repairs.get(0)
    latest = {r.key: r for p, r in world.changelog_records() if p == 0}
    assert world.uncommitted([(0, r) for r in latest.values()]) == []


def sessions_on_one_partition(n: int) -> World:
    """A world with ``n`` sessions of partition 0, an event each, in the events topic."""
    world = World(Settings())
    for i, sid in enumerate(same_partition(world, n)):
        world.append(world.events, sid, event(sid, 0, T0 + i), timestamp_ms=T0 + i)
    return world


async def cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel the runner's run loop and wait for it to end."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


def test_a_checkpoint_commits_early_once_its_state_passes_the_byte_limit() -> None:
    """MEMDIAG_COMMIT_BYTES, as Quix's ``commit_every``: the interval is an hour here, so
    only the bytes the checkpoint holds can make it commit; under the limit it does not."""

    def commits(limit: int) -> dict[Any, int]:
        world = sessions_on_one_partition(40)
        runner = world.runner
        runner.commit_interval = 3600.0
        runner.commit_bytes = limit
        tp = TP(world.events, 0)

        async def go() -> None:
            await runner._start(world.generation)
            task = asyncio.create_task(runner.run())
            runner.deliver(world.generation, {tp: world.logs[(world.events, 0)]})
            for _ in range(50):
                await asyncio.sleep(0.01)
            await cancelled(task)

        asyncio.run(go())
        return dict(world.committed)

    assert commits(1000) == {TP(world_events(), 0): 40}
    assert commits(16 << 20) == {}


def test_a_checkpoint_commits_once_its_input_pauses() -> None:
    """MEMDIAG_COMMIT_IDLE_SECONDS: with an interval of 2 s and few bytes, the checkpoint
    commits once no record came for the pause, and a quarter of the interval after the last
    commit at the earliest (once); with the pause off it does not, and while records keep
    coming faster than the pause it does not either."""

    def commits(idle: float, every: float = 0.0) -> tuple[dict[Any, int], float | None, int]:
        world = sessions_on_one_partition(120)
        runner = world.runner
        runner.commit_interval = 2.0
        runner.commit_idle = idle
        tp = TP(world.events, 0)
        log = world.logs[(world.events, 0)]
        first: list[float] = []

        async def go() -> None:
            await runner._start(world.generation)
            runner.checkpoint.started = began = time.monotonic()  # as after a commit
            task = asyncio.create_task(runner.run())
            if every:  # a record every `every` seconds, for 0.9 s
                for n in range(len(log)):
                    runner.deliver(world.generation, {tp: log[n : n + 1]})
                    await asyncio.sleep(every)
                    if time.monotonic() - began >= 0.9:
                        break
            else:
                runner.deliver(world.generation, {tp: log})
                while time.monotonic() - began < 1.0:
                    await asyncio.sleep(0.01)
                    if runner.checkpoints and not first:
                        first.append(time.monotonic() - began)
            await cancelled(task)

        asyncio.run(go())
        return dict(world.committed), (first[0] if first else None), runner.checkpoints

    committed, at, count = commits(0.05)
    assert committed == {TP(world_events(), 0): 120} and count == 1
    assert at is not None and 0.45 <= at < 1.0  # a quarter of the interval, not the pause
    assert commits(0.0) == ({}, None, 0)
    assert commits(0.4, every=0.01)[::2] == ({}, 0)


def test_a_pause_commits_again_only_once_a_checkpoint_committed() -> None:
    """After a failed checkpoint a pause does not commit: a commit that keeps failing is
    tried once an interval, not at every pause (the log would say each)."""
    world = World(Settings())
    runner = world.runner
    runner.commit_interval, runner.commit_idle = 2.0, 0.05
    tp = TP(world.events, 0)
    runner.checkpoint.started = time.monotonic() - 0.1  # a tenth of a second since the last
    runner.checkpoint.offsets[tp] = 1
    assert 0.35 < runner._idle_after() <= 0.4  # the quarter of the interval comes first
    runner.checkpoint.started = time.monotonic() - 1.0  # a second since the last commit
    assert runner._idle_after() == 0.05
    runner._drop("a delivery failed")
    runner.checkpoint.offsets[tp] = 1
    assert runner._idle_after() > 1.9
    asyncio.run(runner._commit())  # a checkpoint commits: pauses commit again
    runner.checkpoint.started = time.monotonic() - 1.0
    runner.checkpoint.offsets[tp] = 1
    assert runner._idle_after() == 0.05


def test_the_call_after_a_commit_runs_after_each_commit_and_never_after_a_failed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker trims its heap there (memdiag.procs.heap_trimmer): after a checkpoint that
    committed, once that checkpoint is freed (its values are what the trim gives back); not
    after an empty one, one whose state could not be written or one refused (rolled back);
    what it raises leaves the commit standing and the runner running."""
    world = sessions_on_one_partition(4)
    runner, g = world.runner, world.generation
    tp, log = TP(world.events, 0), world.logs[(world.events, 0)]
    calls: list[int] = []
    committed: list[weakref.ref[Checkpoint]] = []
    freed: list[bool] = []

    def after() -> None:
        calls.append(runner.checkpoints)
        freed.append(committed[-1]() is None)  # the checkpoint just committed: freed before it
        if len(calls) == 2:
            raise OSError("trim failed")

    runner.after_commit = after
    (stage,) = [spec.stage for spec in runner.stages if isinstance(spec.stage, SessionStage)]

    async def commit() -> None:
        committed.append(weakref.ref(runner.checkpoint))
        await runner._commit()

    async def go() -> None:
        await runner._start(g)
        await commit()  # empty: nothing to commit, nothing called
        await runner._handle([(g, tp, log[0:1])])
        await commit()
        await runner._handle([(g, tp, log[1:2])])
        world.kafka.refuse_next_commit = True
        await commit()  # refused: rolled back, nothing called
        assert calls == [1]
        await runner._handle([(g, tp, log[1:3])])
        await commit()  # the call raises: logged, the commit stands
        await runner._handle([(g, tp, log[3:4])])
        await commit()
        assert calls == [1, 2, 3]
        late = same_partition(world, 5)[4]  # a fifth session of partition 0
        world.append(world.events, late, event(late, 0, T0 + 9), timestamp_ms=T0 + 9)
        assert len(log) == 5
        await runner._handle([(g, tp, log[4:5])])
        assert not runner.checkpoint.empty()
        with monkeypatch.context() as m:
            m.setattr(stage, "settle", lambda store: (_ for _ in ()).throw(OSError("disk")))
            await commit()  # its state could not be written: rolled back, nothing called

    asyncio.run(go())
    assert calls == [1, 2, 3]
    assert freed == [True, True, True]
    assert world.committed[tp] == 4


def world_events() -> str:
    return Settings().topics.events


def quiet_and_busy(busy: int) -> tuple[World, list[str]]:
    """Two sessions on partition 0 with two searches each (a second apart), and ``busy``
    sessions on partition 1, each with one search after them."""
    world = World(Settings())
    quiet = same_partition(world, 2)
    on_1 = [f"b{i}" for i in range(400) if partition_for(f"b{i}", world.partitions) == 1]
    for n, sid in enumerate(quiet):
        world.append(world.events, sid, event(sid, 0, T0 + n), timestamp_ms=T0 + n)
    for n, sid in enumerate(quiet):
        at = T0 + 1000 + n
        world.append(world.events, sid, event(sid, 1, at), timestamp_ms=at)
    for n, sid in enumerate(on_1[:busy]):
        at = T0 + 2000 + n
        world.append(world.events, sid, event(sid, 0, at), timestamp_ms=at)
    world.now_ms = T0 + 60_000
    return world, on_1[:busy]


async def queue_repairs(world: World) -> None:
    """Partition 0's first two records committed, its next two in a checkpoint whose commit
    is refused: their changelog records are in the log, uncovered, and their keys queued for
    repair."""
    runner, g = world.runner, world.generation
    p0, log0 = TP(world.events, 0), world.logs[(world.events, 0)]
    await runner._start(g)
    await runner._handle([(g, p0, log0[0:2])])
    await runner._commit()
    await runner._handle([(g, p0, log0[2:4])])
    world.kafka.refuse_next_commit = True
    await runner._commit()
    assert world.table.repairs.get(0)


def three_sessions() -> tuple[World, list[str]]:
    """A world with one search of each of three sessions on partition 0, a millisecond apart."""
    world = World(Settings())
    sids = same_partition(world, 3)
    for n, sid in enumerate(sids):
        world.append(world.events, sid, event(sid, 0, T0 + n), timestamp_ms=T0 + n)
    world.now_ms = T0 + 60_000
    return world, sids


def session_heads(world: World) -> set[bytes]:
    """The session heads in the worker's committed state."""
    return {k for values in world.table_values()["state"].values() for k in values
            if k.startswith(b"s:")}  # fmt: skip


def test_what_the_session_stage_holds_when_partitions_move_goes_with_the_checkpoint() -> None:
    """The session stage holds the sessions it changed until a commit settles them. An
    assignment resets the stages; what they hold is written into the checkpoint first, and
    it commits with that checkpoint's offsets."""
    world, sids = three_sessions()
    tp, log = TP(world.events, 0), world.logs[(world.events, 0)]
    runner = world.runner

    async def go() -> None:
        g = world.generation
        await runner._start(g)
        await runner._handle([(g, tp, log[0:1])])  # its partition's first sweep writes it
        await runner._handle([(g, tp, log[1:3])])  # held
        await runner.on_assigned()
        await runner._commit()

    asyncio.run(go())
    assert world.committed == {tp: 3}
    assert session_heads(world) == {f"s:{sid}".encode() for sid in sids}


def test_a_write_that_always_fails_is_dead_lettered_with_its_record_not_retried_forever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Settling is a write outside any batch. If it raises, the checkpoint commits nothing
    (its offsets would be ahead of the state) and its records are taken again one at a time,
    each written in its own checkpoint: a write that fails every time fails with its own
    record, which is dead-lettered, and the others commit. (Retaking them together would roll
    back at every commit, forever.)"""
    world, sids = three_sessions()
    bad = sids[1]
    tp, log = TP(world.events, 0), world.logs[(world.events, 0)]
    runner = world.runner
    write = SessionStates.write

    def failing(self: SessionStates, session: Any, store: Any) -> None:
        if session.session_id == bad:
            raise RuntimeError("cannot encode")
        write(self, session, store)

    monkeypatch.setattr(SessionStates, "write", failing)

    async def go() -> None:
        g = world.generation
        await runner._start(g)
        await runner._handle([(g, tp, log[0:1])])  # its partition's first sweep writes it
        await runner._handle([(g, tp, log[1:3])])  # held
        await runner._commit()
        assert world.committed == {} and runner.failed_checkpoints == 1
        world.position[tp] = 0  # taken again from the committed offsets
        await runner._start(g)
        await runner._handle([(g, tp, log[0:3])])

    asyncio.run(go())
    assert world.committed == {tp: 3}
    assert session_heads(world) == {f"s:{sid}".encode() for sid in sids if sid != bad}
    assert [orjson.loads(d["payload"])["session_id"] for d in world.tables.dead_letters] == [bad]


def test_a_batch_that_raised_past_the_runner_leaves_nothing_to_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stage's batch that raises something the runner does not catch (not an Exception)
    drops what the stage held, from the checkpoint's earlier batches too: the stop's final
    commit must then commit nothing, or their offsets would be ahead of their state."""
    world, sids = three_sessions()
    tp, log = TP(world.events, 0), world.logs[(world.events, 0)]
    runner = world.runner
    events = SessionStage._events

    def interrupted(self: SessionStage, msg: Any, *args: Any) -> None:
        if msg.offset == 2:
            raise KeyboardInterrupt
        events(self, msg, *args)

    monkeypatch.setattr(SessionStage, "_events", interrupted)

    async def go() -> None:
        g = world.generation
        await runner._start(g)
        await runner._handle([(g, tp, log[0:1])])
        await runner._handle([(g, tp, log[1:2])])  # held, its offset in the checkpoint
        with pytest.raises(KeyboardInterrupt):
            await runner._handle([(g, tp, log[2:3])])
        await runner._commit()

    asyncio.run(go())
    assert world.committed == {} and runner.failed_checkpoints == 1


def test_a_rollback_sends_no_counter_increment_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stage that raises rolls the checkpoint back, and its records are taken again. The
    increments added up since the last commit (here the pieces of the batch sent before the
    one that raised) came from records that count again: the counter topic (and the
    OpenTelemetry counters) must not get them twice. No crash, no failed commit: each
    counter's increments are those of a run where nothing raised. (Per counter, not per
    minute: an increment no event time was given for is put in the minute of the newest event
    its batch handled, and the retake's batches are single records.)"""
    from tests.scenario import generate

    events = generate(sessions=12, seed=5)
    process = SessionStage._events

    def run(raise_once: bool) -> Counter[Any]:
        world = World(Settings(), seed=1, counters=True, piece_bytes=300)
        world.publish(events)
        raised: list[int] = []

        def flaky(self: SessionStage, msg: Any, *args: Any) -> None:
            if raise_once and not raised and msg.offset == 45:
                raised.append(msg.offset)
                raise RuntimeError("a transient fault")
            process(self, msg, *args)

        monkeypatch.setattr(SessionStage, "_events", flaky)
        world.run()
        assert raised == ([45] if raise_once else [])
        assert world.tables.dead_letters == []
        totals: Counter[Any] = Counter()
        for (name, attributes, _minute), n in world.increments_by_minute().items():
            totals[(name, attributes)] += n
        return totals

    clean = run(raise_once=False)
    assert run(raise_once=True) == clean


def test_a_commit_of_unknown_outcome_with_repairs_is_rolled_back_not_fatal() -> None:
    """A checkpoint with repairs commits their quiet partition again at its committed offsets
    (the repairs' guard). When a commit's outcome is unknown and the broker then says the
    moved partitions did not land, that re-commit reads as landed either way: it must not make
    the commit look landed in part, which stops the worker. It did not land: roll back."""
    world, _ = quiet_and_busy(2)
    p0, p1 = TP(world.events, 0), TP(world.events, 1)
    log1 = world.logs[(world.events, 1)]
    runner = world.runner
    commit = world.kafka.commit

    async def unknown(offsets: Any) -> None:
        raise TimeoutError("no answer")

    async def go() -> None:
        g = world.generation
        await queue_repairs(world)  # p0's keys are queued for repair
        world.position[p0] = 2
        await runner._start(g)
        await runner._handle([(g, p1, log1[0:2])])
        world.kafka.commit = unknown  # type: ignore[method-assign]
        await runner._commit()  # p0 re-committed as it is, p1's move never landed
        world.kafka.commit = commit  # type: ignore[method-assign]

    asyncio.run(go())
    assert runner.failed_checkpoints == 2  # rolled back, not stopped
    assert world.committed[p0] == 2 and p1 not in world.committed
    world.run()  # and everything goes on
    assert (world.committed[p0], world.committed[p1]) == (4, 2)


def test_the_sweeps_are_the_same_after_a_rollback_as_without_it() -> None:
    """Which sessions a sweep forgets decides whether a later event is applied or is late,
    so a rerun must not sweep sooner than the first run did. Before, a rollback started the
    clocks over: a sweep was due at the end of the rerun's first batch, with its time, and a
    session's event applied (its row delivered) in the first attempt was dead-lettered as
    late in the rerun, and counted twice. The clock and its last sweep are state now, taken up
    as committed: both runs apply it."""
    hour = 3_600_000

    def run(refuse: bool) -> tuple[list[str], list[str]]:
        world = World(Settings(session_keep_hours=1.0))
        s, x, y = same_partition(world, 3)
        for sid, n, at in ((s, 0, T0), (x, 0, T0 + hour - 30_000), (y, 0, T0 + hour + 10_000),
                           (s, 1, T0 + hour + 20_000)):  # fmt: skip
            world.append(world.events, sid, event(sid, n, at), timestamp_ms=at)
        world.now_ms = T0 + 2 * hour
        tp, log, runner = TP(world.events, 0), world.logs[(world.events, 0)], world.runner

        async def go() -> None:
            g = world.generation
            await runner._start(g)
            await runner._handle([(g, tp, log[0:1])])
            await runner._commit()
            await runner._handle([(g, tp, log[1:2])])
            await runner._commit()
            await runner._handle([(g, tp, log[2:4])])
            if refuse:
                world.kafka.refuse_next_commit = True
                await runner._commit()
                await runner._start(g)
                await runner._handle([(g, tp, log[2:3])])  # cut differently this time
                await runner._handle([(g, tp, log[3:4])])
            await runner._commit()

        asyncio.run(go())
        late = [orjson.loads(d["payload"])["event_id"] for d in world.tables.dead_letters]
        return sorted(world.tables.searches), late

    first = run(refuse=False)
    assert run(refuse=True) == first
    searches, late = first
    assert late == [] and len(searches) == 4
