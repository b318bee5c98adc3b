"""The one checkpoint (``memdiag.streams.checkpoint``, ``memdiag.streams.store``): after any
failure the state is exactly the state as of the committed offsets, and the records after
them, processed again, give the tables of the reference.

The rule recovery applies is tested as a pure function first; then the whole worker in
memory (``tests.inmemory.World``: the real runner, checkpoint and stages over fake topics)
is killed at each step of a commit, and the broker's logs are checked before each recovery
(what the step says is there is there), the recovered table after it (the committed state,
exactly), and the tables at the end (the reference's).
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.settings import Settings
from memdiag.streams import checkpoint as checkpoint_module
from memdiag.streams.store import (
    OFFSETS_HEADER,
    ChangelogRecord,
    MemoryBackend,
    RebuildPoint,
    RocksBackend,
    assess,
    committed_past,
    covers_of,
    needs_covers,
    replay,
)
from tests.compare import differences, from_records, from_reference
from tests.inmemory import STEPS, World
from tests.reference import reference
from tests.scenario import generate

SETTINGS = Settings()


def rec(offset: int, key: bytes, value: bytes | None, **covers: int) -> ChangelogRecord:
    return ChangelogRecord(offset, key, value, covers or None)


# -- the rule ---------------------------------------------------------------------------------


def test_a_record_applies_only_when_every_offset_it_covers_is_committed() -> None:
    committed = {"events": 10, "steps": 4}
    assert committed_past(None, committed)  # a repair: always
    assert committed_past({"events": 9}, committed)
    assert not committed_past({"events": 10}, committed)  # 10 is the next to process
    assert committed_past({"events": 3, "steps": 3}, committed)
    assert not committed_past({"events": 3, "steps": 4}, committed)  # one topic is enough
    assert not committed_past({"spans": 0}, committed)  # nothing committed of it


def test_the_header_names_the_source_offsets() -> None:
    headers = [("other", b"x"), (OFFSETS_HEADER, orjson.dumps({"t.events": 41}))]
    assert covers_of(headers) == {"t.events": 41}
    assert covers_of([("other", b"x")]) is None and covers_of(None) is None


def test_replay_skips_what_is_ahead_and_repairs_the_keys_it_left() -> None:
    backend = MemoryBackend()
    log = [
        rec(0, b"a", b"1", events=0),
        rec(1, b"b", b"1", events=0),
        rec(2, b"a", b"2", events=5),  # a checkpoint that never committed: skipped
        rec(3, b"c", b"1", events=5),
        rec(4, b"b", None, events=5),
        rec(5, b"c", b"committed", events=3),  # written again by the rerun, committed
    ]
    repairs = replay(backend, log, {"events": 4})
    assert backend.data == {b"a": b"1", b"b": b"1", b"c": b"committed"}
    assert repairs == {b"a", b"b"}  # c's latest record applied: nothing to repair
    # the offset stays before the first skipped record: a restart before the repairs are
    # written reads the skipped records again, and repairs them again
    assert backend.offset == 1


def test_a_skipped_record_applies_on_a_later_replay_unless_a_repair_follows_it() -> None:
    """The hazard: commits pass a skipped record's offsets after a restart whose rerun did
    not write its key again; a replay from the start then brings its stale value back."""
    log = [rec(0, b"k", b"old", events=0), rec(1, b"k", b"stale", events=5)]
    first = MemoryBackend()
    assert replay(first, log, {"events": 1}) == {b"k"}  # skipped: repair it
    later = {"events": 9}  # the rerun went on; its commits are past offset 5
    assert replay(MemoryBackend(), log, later) == set()
    unrepaired = MemoryBackend()
    replay(unrepaired, log, later)
    assert unrepaired.data == {b"k": b"stale"}  # what the repair prevents
    repaired = MemoryBackend()
    replay(repaired, [*log, rec(2, b"k", first.get(b"k"))], later)
    assert repaired.data == {b"k": b"old"}


def compacted(log: list[ChangelogRecord]) -> list[ChangelogRecord]:
    """The log as Kafka's cleaner leaves it once every record is past the compaction lag:
    the latest record of each key."""
    last = {r.key: r for r in log}
    return [r for r in log if last[r.key] is r]


def test_compaction_keeps_the_committed_value_once_the_repair_follows_the_skipped_record() -> None:
    """min.compaction.lag.ms keeps a committed value behind a skipped successor until a
    worker restarts and repairs it; after the repair, compaction keeps the repair."""
    log = [rec(0, b"k", b"old", events=0), rec(1, b"k", b"stale", events=5)]
    too_early = MemoryBackend()
    replay(too_early, compacted(log), {"events": 1})
    assert too_early.get(b"k") is None  # the committed value gone: why the lag exists
    repaired = [*log, rec(2, b"k", b"old")]
    for committed in ({"events": 1}, {"events": 9}):
        backend = MemoryBackend()
        replay(backend, compacted(repaired), committed)
        assert backend.get(b"k") == b"old"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([b"a", b"b", b"c"]),
            st.sampled_from([b"1", b"2", None]),
            st.integers(0, 6),
        ),
        max_size=25,
    ),  # fmt: skip
    st.integers(0, 7),
    st.integers(0, 25),
)
def test_replaying_a_suffix_again_gives_the_same_state(
    writes: list[tuple[bytes, bytes | None, int]], committed: int, cut: int
) -> None:
    """A persistent backend replays from its offset after a restart: what it read before
    and reads again gives the same state as one replay of the whole log."""
    log = [rec(i, k, v, events=o) for i, (k, v, o) in enumerate(writes)]
    once = MemoryBackend()
    replay(once, log, {"events": committed})
    twice = MemoryBackend()
    replay(twice, log[:cut], {"events": committed})
    start = -1 if twice.offset is None else twice.offset
    replay(twice, log[start + 1 :], {"events": committed})
    assert twice.data == once.data


def test_a_rocksdb_backend_keeps_its_values_and_offset_across_opens(tmp_path: Any) -> None:
    path = tmp_path / "state-0"
    backend = RocksBackend(path)
    backend.write({b"s:a": b"1", b"s:b": b"2", b"t:x": b"3"}, 7)
    backend.write({b"s:b": None}, None)
    backend.close()
    again = RocksBackend(path)
    try:
        assert again.offset == 7
        assert list(again.items(b"s:")) == [(b"s:a", b"1")]
        assert again.get(b"t:x") == b"3" and again.get(b"s:b") is None
    finally:
        again.close()
    RocksBackend.destroy(path)
    fresh = RocksBackend(path)
    try:
        assert fresh.offset is None and list(fresh.items(b"")) == []
    finally:
        fresh.close()


# -- the worker killed at each step of a commit ----------------------------------------------


def scenario(seed: int = 3, sessions: int = 40) -> list[dict[str, Any]]:
    return generate(sessions=sessions, seed=seed)


def inspect_the_broker(world: World, step: str, n: int) -> None:
    """What the broker holds when the worker dies at ``step`` of a commit: a strict,
    non-empty part of its changelog records ("changelog") or all of them ("delivered",
    "committed"), ahead of the committed offsets, or covered by them once committed."""
    cp = world.runner.checkpoint
    produced = cp.produced
    in_log = world.changelog_appends[len(world.changelog_appends) - n :]
    assert [(p, r.key, r.value) for p, r in in_log] == [
        (w.partition, w.key, w.value) for w in produced[:n]
    ]
    if step == "changelog":
        assert 0 < n < len(produced)
    else:
        assert n == len(produced)
    headed = [(p, r) for p, r in in_log if covers_of(r.headers)]
    assert headed  # the scenario's commits write state
    if step == "committed":
        assert world.uncommitted(headed) == []  # recovery applies them
    else:
        assert world.uncommitted(headed) == headed  # recovery skips them
    world.expected_state = world.state_as_committed(step)  # type: ignore[attr-defined]


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("fresh", [True, False], ids=["fresh machine", "local state kept"])
def test_a_worker_killed_at_each_step_recovers_the_committed_state(step: str, fresh: bool) -> None:
    events = scenario()
    expected = from_reference(reference(events))
    for seed in range(6):
        world = World(SETTINGS, seed=seed)
        world.publish(events, keyed=seed % 2 == 0)
        world.kill_at = (step, 2 + seed % 3)
        world.on_kill = inspect_the_broker

        def restart(
            _: bool | None = None, world: World = world, real: Any = world._restart
        ) -> None:
            real(fresh)
            recovered = {p: dict(b.data) for p, b in world.table.backends.items() if b.data}
            assert recovered == world.expected_state  # type: ignore[attr-defined]

        world._restart = restart  # type: ignore[method-assign]
        world.run()
        assert world.crashes == 1 and world.kills[0] in (step, "delivered"), world.kills
        assert differences(expected, from_records(world.tables)) == [], (step, seed)


def test_the_records_of_a_killed_commit_are_repaired_by_the_next_checkpoint() -> None:
    events = scenario()
    world = World(SETTINGS, seed=4)
    world.publish(events)
    world.kill_at = ("delivered", 2)
    world.on_kill = inspect_the_broker
    world.run()
    assert world.crashes == 1
    read, repaired = world.replayed[max(world.replayed, key=lambda p: world.replayed[p][1])]
    assert read and repaired  # recovery read the dead commit's records and skipped them
    assert all(not keys for keys in world.table.repairs.values())  # written since


def test_a_refused_commit_drops_the_checkpoint_and_the_partitions_stay() -> None:
    """A commit the broker refuses (a rebalance began) while the worker keeps its
    partitions: what the failed checkpoint wrote is gone from memory (the decoded objects
    too), its changelog records are repaired, and its records are processed again."""
    events = scenario()
    expected = from_reference(reference(events))
    for seed in range(5):
        world = World(SETTINGS, seed=seed)
        world.publish(events)
        for _ in range(3):
            world.kafka.refuse_next_commit = True
            world.run(max_batch=3, max_rounds=30, settle=False)
            assert not world.kafka.refuse_next_commit  # a commit was refused
            values = {p: dict(b.data) for p, b in world.table.backends.items() if b.data}
            assert values == {p: v for p, v in world.committed_state.items() if v}
        world.run()
        assert world.refused == 3 and world.crashes == 0
        assert world.runner.failed_checkpoints >= 3
        # each rollback told the producer to forget what a failed send left unsent
        assert world.kafka.discarded >= world.runner.failed_checkpoints
        assert differences(expected, from_records(world.tables)) == [], seed


def search(sid: str, i: int, minute: int = 0) -> dict[str, Any]:
    return {"kind": "search", "event_id": f"{sid}-{i}", "ts": f"2026-11-21T10:{minute:02d}:{i:02d}Z",
            "session_id": sid, "query": f"q{i}", "result_ids": [f"r{i}"]}  # fmt: skip


def run_with_two_restarts(monkeypatch: pytest.MonkeyPatch, repair: bool) -> tuple[Any, Any]:
    """MEMDIAG_SESSION_KEEP_HOURS is 1 h when a session L is forgotten in a checkpoint that
    produces its changelog and dies before its commit (a skipped tail: L's head deleted, a
    tombstone laid). The worker restarts with 24 h: its rerun keeps L (it writes none of
    those keys). Commits go on past the dead checkpoint's offsets; then a worker on a fresh
    machine replays the whole changelog. What it rebuilds, and what was committed."""
    if not repair:
        real = checkpoint_module.Checkpoint.changelog

        def without_repairs(self: Any, *args: Any) -> Any:
            for table in self.tables.values():
                table.repairs.clear()
            return real(self, *args)

        monkeypatch.setattr(checkpoint_module.Checkpoint, "changelog", without_repairs)
    world = World(Settings(session_keep_hours=1.0), seed=2)
    partition = world._session_partition
    other = next(f"m{i}" for i in range(100) if partition(f"m{i}") == partition("L"))
    world.publish([search("L", i) for i in range(12)])
    world.run()
    world.now_ms += 2 * 3_600_000  # two hours of processing time later, on L's partition
    world.publish([search(other, 1, 30)])
    world.kill_at = ("delivered", world._commits + 1)

    def killed(w: World, step: str, n: int) -> None:
        inspect_the_broker(w, step, n)
        w.settings = Settings(session_keep_hours=24.0)  # the worker that restarts

    world.on_kill = killed
    world.run()
    assert world.crashes == 1 and world.kills == ["delivered"]
    world.publish([search(other, i, 31) for i in range(2, 12)])  # commits pass the tail
    world.run()
    committed = {p: v for p, v in world.committed_state.items() if v}
    assert any(k == b"s:L" for v in committed.values() for k in v)  # L is kept
    world.restart(fresh=True)  # a fresh machine replays the whole changelog
    rebuilt = {p: dict(b.data) for p, b in world.table.backends.items() if b.data}
    return rebuilt, committed


def test_two_restarts_after_a_skipped_tail_with_the_keep_hours_changed_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rebuilt, committed = run_with_two_restarts(monkeypatch, repair=True)
    assert rebuilt == committed


def test_without_the_repairs_the_second_restart_brings_the_dead_checkpoint_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The test above bites: the same history without the repairs loses L (the dead
    checkpoint's delete of its head applies once the commits are past it)."""
    rebuilt, committed = run_with_two_restarts(monkeypatch, repair=False)
    assert rebuilt != committed
    assert not any(k == b"s:L" for v in rebuilt.values() for k in v)


def test_a_source_partition_keeps_its_state_when_its_changelog_is_not_assigned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Faust's assignor leaves out a changelog topic the broker's metadata lacks (a broker that
    restarted, say). The worker still takes its source partitions' records: their state must
    live somewhere, or every checkpoint's values would be dropped and each stage would start
    over at every commit interval (the chaos suite's broker restart found it)."""
    import asyncio
    from types import SimpleNamespace

    from faust.types import TP

    from memdiag.streams.tables import CheckpointStore, StoreOptions

    async def committed(tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return {tp: 9 for tp in tps}

    table = SimpleNamespace(
        name="state", changelog_topic=SimpleNamespace(get_topic_name=lambda: "state-changelog")
    )
    options = StoreOptions(sources=("events", "steps"), kind="memory", path=None,
                           committed=committed)  # fmt: skip

    async def highwaters(*tps: TP) -> dict[TP, int]:
        return {tp: 8 for tp in tps}  # past the local offset: the local values are this log's

    app = SimpleNamespace(consumer=SimpleNamespace(highwaters=highwaters))
    store = CheckpointStore("memdiag://state", app, table, options={"memdiag": options})

    async def rebalance(*assigned: TP) -> None:
        await store.on_rebalance(set(assigned), set(), set())

    asyncio.run(rebalance(TP("events", 0), TP("events", 2), TP("steps", 0)))
    assert sorted(store.backends) == [0, 2]
    assert "state-changelog is not in this worker's assignment" in caplog.text
    store.backends[2].write({b"k": b"v"}, 7, {"events": 6})
    caplog.clear()
    # the changelog listed again: the same backends, now recovered from it; one revoked
    asyncio.run(rebalance(TP("events", 2), TP("state-changelog", 2)))
    assert sorted(store.backends) == [2] and store.backends[2].get(b"k") == b"v"
    assert "not in this worker's assignment" not in caplog.text


# -- the group's offsets moved back, or lost (#38, holes 4 and 5) -------------------------------


def test_a_replay_over_local_state_ahead_of_the_commit_rebuilds_it_first() -> None:
    """docs/rules.md's replay: the group's offsets reset to the earliest while the worker keeps
    its local state (RocksDB: ``fresh=False``). That state covers offsets the group no longer
    has committed; taken again on top of it, the stages find every event already applied and
    count nothing, while the counter stage adds the topic's increments to rollups that hold
    them already (each rollup twice the increments on the topic). A memory store rebuilds
    from the changelog under the skip rule instead. The two backends must agree: DuckDB exact,
    and every rollup the sum of the increments on the topic."""
    events = scenario()
    expected = from_reference(reference(events))
    after: dict[bool, Any] = {}
    for fresh in (True, False):
        world = World(SETTINGS, seed=1, counters=True)
        world.publish(events)
        world.run()
        assert world.rollups_now() == world.increments_by_minute()
        first = sum(world.increments_by_minute().values())
        world.reset_offsets()  # memdiag reset-offsets --to-earliest
        world.restart(fresh=fresh)
        world.run()
        assert differences(expected, from_records(world.tables)) == [], fresh
        assert world.rollups_now() == world.increments_by_minute(), fresh
        # the replay counts every message again: each minute ends at twice its first count
        assert sum(world.increments_by_minute().values()) == 2 * first, fresh
        after[fresh] = world.table_values()
    assert after[False] == after[True]


@pytest.mark.parametrize("snap", [True, False], ids=["to a checkpoint", "to the time"])
def test_a_replay_from_a_point_in_time_rebuilds_the_state_there(snap: bool) -> None:
    """``--to-datetime``: each partition's offset at its first record at or after a time,
    which lands inside some checkpoint. Recovery skips that checkpoint's changelog records
    (they cover offsets past the commit), so the records it covered before the commit would
    count in no state (rollups below the increments on the topic), with either backend. The
    command moves each partition of a table's topic back to the checkpoint that holds its
    target instead: the state is rebuilt exactly there."""
    events = scenario()
    expected = from_reference(reference(events))
    bad = []
    for seed in range(4):
        after: dict[bool, Any] = {}
        for fresh in (True, False):
            world = World(SETTINGS, seed=seed, counters=True)
            world.publish(events)
            world.run()
            start = 1_800_000_000_000
            world.reset_offsets_to(world.now_ms - (world.now_ms - start) // (2 + seed % 3), snap)
            world.restart(fresh=fresh)
            world.run()
            assert differences(expected, from_records(world.tables)) == [], (seed, fresh)
            if world.rollups_now() != world.increments_by_minute():
                bad.append((seed, fresh))
            after[fresh] = world.table_values()
        assert after[True] == after[False], seed
    assert (bad == []) == snap, bad


def test_the_rebuild_point_is_a_checkpoints_boundary() -> None:
    point = RebuildPoint({"events": 10, "steps": 5, "memory": 7})
    for covers in (
        {"events": 3, "steps": 1},
        {"events": 9, "steps": 8},  # past the steps target: not applied
        {"events": 6},  # a rerun after a failure (covers went back): the newest applied
        None,
        {"events": 12},
    ):
        point.add(covers)
    assert point.position("events") == 7  # after the newest applied record naming it
    assert point.position("steps") == 2
    assert point.position("memory") == 7  # no record names it: its target
    only_skipped = RebuildPoint({"events": 1})
    only_skipped.add({"events": 4})
    assert only_skipped.position("events") is None  # the log start


def test_lost_offsets_keep_the_local_state_and_the_position_it_covers() -> None:
    """The group's committed offsets are gone (expired while no worker ran). Nothing covers
    the changelog's records any more; recovery took that for "committed 0": it skipped every
    record, repaired every key to a tombstone, and the worker took the whole history again
    (counting it again). A RocksDB worker's local state holds committed values only: what it
    covers is the committed position, and the worker goes on from there."""
    events = scenario()
    expected = from_reference(reference(events))
    half = len(events) // 2
    world = World(SETTINGS, seed=2, counters=True)
    world.publish(events[:half])
    world.run()
    state = world.table_values()
    processed, increments = world.runner.processed, world.increments_by_minute()
    world.lose_offsets()
    world.restart(fresh=False)  # the local state kept
    assert world.table_values() == state  # nothing wiped
    world.run()
    # not the history again: only what changed no state after the last write of each
    # partition (the counter stage's own rollups on its topic), at least once as ever
    assert world.runner.processed < processed / 5, (world.runner.processed, processed)
    assert world.increments_by_minute() == increments
    world.publish(events[half:])
    world.run()
    assert differences(expected, from_records(world.tables)) == []
    assert world.rollups_now() == world.increments_by_minute()
    assert processed > 0


def test_lost_offsets_without_local_state_take_the_history_again() -> None:
    """Without local state nothing tells lost offsets from a worker that never committed
    (killed in its first checkpoint): no changelog record is known to be committed, so the
    worker starts over from the sources' start, which gives the same tables (the counters
    count the history again)."""
    events = scenario()
    expected = from_reference(reference(events))
    world = World(SETTINGS, seed=2, counters=True)
    world.publish(events)
    world.run()
    first = sum(world.increments_by_minute().values())
    world.lose_offsets()
    world.restart(fresh=True)
    world.run()
    assert differences(expected, from_records(world.tables)) == []
    assert world.rollups_now() == world.increments_by_minute()
    assert sum(world.increments_by_minute().values()) == 2 * first


def test_what_a_backend_covers_is_kept_with_its_values(tmp_path: Any) -> None:
    """The covers of the records a backend's values reflect are written with them, newest
    per topic; values written without covers leave them known only up to an older offset."""
    path = tmp_path / "state-0"
    backend = RocksBackend(path)
    backend.write({b"a": b"1"}, 3, {"events": 10, "steps": 4})
    backend.write({b"b": b"1"}, 5, {"events": 12})
    assert (backend.covers, backend.covers_at) == ({"events": 12, "steps": 4}, 5)
    assert not needs_covers(backend)
    backend.write({b"c": b"1"}, 8)  # the checkpoint passes none
    assert needs_covers(backend) and backend.covers_at == 5
    backend.close()
    again = RocksBackend(path)
    try:
        assert (again.offset, again.covers, again.covers_at) == (8, {"events": 12, "steps": 4}, 5)
    finally:
        again.close()
    memory = MemoryBackend()
    memory.write({}, 2, {"events": 1})
    memory.write({}, None, {"events": 0, "memory": 3})
    assert (memory.covers, memory.covers_at) == ({"events": 1, "memory": 3}, 2)


def test_local_state_is_ahead_when_it_covers_what_is_not_committed() -> None:
    sources = ("events", "steps")
    kept = MemoryBackend()
    kept.write({b"k": b"v"}, 4, {"events": 9, "steps": 3})
    normal = assess(kept, {"events": 10, "steps": 4}, sources)
    assert not normal.rebuild and not normal.lost and normal.ahead == {}
    reset = assess(kept, {"events": 0, "steps": 0}, sources)  # reset to the earliest
    assert reset.rebuild and not reset.lost and reset.ahead == {"events": 9, "steps": 3}
    back = assess(kept, {"events": 10, "steps": 3}, sources)  # one topic went back
    assert back.rebuild and back.ahead == {"steps": 3}
    lost = assess(kept, {}, sources)
    assert lost.lost and not lost.rebuild


def test_with_nothing_committed_local_state_is_the_committed_position() -> None:
    sources = ("events", "steps")
    kept = MemoryBackend()
    kept.write({b"k": b"v"}, 4, {"events": 9, "steps": 3})
    lost = assess(kept, {}, sources)
    assert lost.lost and not lost.rebuild
    assert lost.committed == lost.positions == {"events": 10, "steps": 4}
    # the changelog past the local state is not known to be committed: skipped, repaired
    backend = copy.deepcopy(kept)
    tail = [rec(5, b"k", b"w", events=12, steps=3), rec(6, b"j", b"1", events=12)]
    assert replay(backend, tail, lost.committed) == {b"k", b"j"}
    assert backend.data == {b"k": b"v"} and backend.offset == 4
    fresh = assess(MemoryBackend(), {}, sources)  # no local state: nothing proves a commit
    assert fresh.lost and fresh.committed == {} and fresh.positions == {}


def store_with(
    committed: dict[tuple[str, int], int], kind: str = "memory", path: Any = None
) -> Any:
    """A memdiag store of table ``state`` (sources ``events``, ``steps``; changelog
    ``state-changelog``) on a fake app, its group's committed offsets ``committed``."""
    from types import SimpleNamespace

    from faust.types import TP

    from memdiag.streams.tables import CheckpointStore, StoreOptions

    async def fetch(tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return {tp: committed[tp] for tp in tps if tp in committed}

    async def highwaters(*tps: TP) -> dict[TP, int]:
        return {tp: 1000 for tp in tps}

    table = SimpleNamespace(
        name="state", changelog_topic=SimpleNamespace(get_topic_name=lambda: "state-changelog")
    )
    options = StoreOptions(sources=("events", "steps"), kind=kind, path=path, committed=fetch)
    app = SimpleNamespace(consumer=SimpleNamespace(highwaters=highwaters))
    store = CheckpointStore("memdiag://state", app, table, options={"memdiag": options})
    app.tables = {"state": SimpleNamespace(data=store)}  # type: ignore[attr-defined]
    return store


def recover(store: Any, records: list[ChangelogRecord], partition: int = 0) -> None:
    """Faust's recovery of one changelog partition: the rebalance, the records after the
    store's offset, the end."""
    import asyncio
    from types import SimpleNamespace

    from faust.types import TP

    async def go() -> None:
        await store.on_rebalance({TP("state-changelog", partition), TP("events", partition),
                                  TP("steps", partition)}, set(), set())  # fmt: skip
        start = store.persisted_offset(TP("state-changelog", partition))
        batch = [
            SimpleNamespace(message=SimpleNamespace(
                topic="state-changelog", partition=partition, offset=r.offset, key=r.key,
                value=r.value, headers=[(OFFSETS_HEADER, orjson.dumps(r.covers))],
            ))
            for r in records if start is None or r.offset > start
        ]  # fmt: skip
        store.apply_changelog_batch(batch, None, None)
        await store.on_recovery_completed(set(), set())

    asyncio.run(go())


def test_the_store_rebuilds_local_state_ahead_of_the_commit_and_says_so(
    tmp_path: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A RocksDB partition whose checkpoints wrote values without their covers learns them
    from the record at its offset; after a reset to the earliest it is ahead of the commit:
    rebuilt from the changelog under the skip rule, with one line that says where it stood,
    what is committed and what to do."""
    from memdiag.streams import compat

    log = [rec(0, b"a", b"1", events=4), rec(1, b"b", b"1", events=9, steps=3),
           rec(2, b"c", b"1", events=11)]  # fmt: skip
    asked: list[Any] = []

    async def covers_at(app: Any, wanted: dict[tuple[str, int], int]) -> Any:
        asked.append(dict(wanted))
        return {tp: log[offset].covers for tp, offset in wanted.items()}

    monkeypatch.setattr(compat, "changelog_covers", covers_at)
    committed = {("events", 0): 10, ("steps", 0): 4}
    store = store_with(committed, "rocksdb", tmp_path)
    recover(store, log[:2])
    committed[("events", 0)] = 12  # a checkpoint commits, then writes (without covers)
    store.backends[0].write({b"c": b"1"}, 2)
    asyncio_stop(store)
    store = store_with(committed, "rocksdb", tmp_path)
    recover(store, log)  # nothing ahead: the local state is kept
    assert asked == [{("state-changelog", 0): 2}]
    assert store.backends[0].get(b"c") == b"1" and "ahead" not in caplog.text
    asyncio_stop(store)
    committed.update({("events", 0): 0, ("steps", 0): 0})  # memdiag reset-offsets
    store = store_with(committed, "rocksdb", tmp_path)
    recover(store, log)
    assert store.backends[0].get(b"c") is None and store.backends[0].get(b"a") is None
    assert store.repairs[0] == {b"a", b"b", b"c"}
    line = next(r.getMessage() for r in caplog.records if "not committed" in r.getMessage())
    assert "state partition 0" in line and "events 11 covered, 0 committed" in line
    assert "steps 3 covered, 0 committed" in line and "memdiag reset-offsets" in line
    asyncio_stop(store)


def asyncio_stop(store: Any) -> None:
    import asyncio

    asyncio.run(store.on_stop())


def test_the_store_with_nothing_committed_gives_the_runner_its_start(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Nothing committed, a RocksDB partition's local state covering offsets: taken as the
    committed position, said in one line, and the runner starts there
    (compat.FaustKafka.bases), where nothing is committed; the changelog past it is skipped."""
    import asyncio

    from faust.types import TP

    from memdiag.streams.compat import FaustKafka
    from memdiag.streams.tables import start_positions

    log = [rec(0, b"a", b"1", events=4), rec(1, b"b", b"1", events=9, steps=3),
           rec(2, b"b", b"2", events=12, steps=3)]  # fmt: skip
    committed = {("events", 0): 10, ("steps", 0): 4}
    store = store_with(committed, "rocksdb", tmp_path)
    recover(store, log[:2])
    asyncio_stop(store)
    committed.clear()  # the offsets expired
    store = store_with(committed, "rocksdb", tmp_path)
    kafka = FaustKafka(store.app)

    async def earliest(*tps: TP) -> dict[TP, int]:
        return {tp: 0 for tp in tps}

    async def none(tps: list[Any]) -> dict[Any, int]:
        return {}

    store.app.consumer.earliest_offsets = earliest
    kafka.committed = none  # type: ignore[method-assign]
    recover(store, log)
    bases = asyncio.run(kafka.bases([TP("events", 0), TP("steps", 0), TP("events", 1)]))
    assert bases == {TP("events", 0): 10, TP("steps", 0): 4, TP("events", 1): 0}
    assert start_positions(store.app) == {("events", 0): 10, ("steps", 0): 4}
    assert store.backends[0].get(b"b") == b"1" and store.repairs[0] == {b"b"}
    line = next(r.getMessage() for r in caplog.records if "no committed offset" in r.getMessage())
    assert "state partition 0" in line and "starting at events 10, steps 4" in line
    asyncio_stop(store)
