"""State values longer than a changelog record may be (#38): before, a value over the
broker's message limit failed its checkpoint, and every later one, forever (outputs were
split, state values were not). Now the checkpoint sends such a value in pieces
(``memdiag.streams.store.pieces``) and recovery puts them together (``Replay``).

The format is tested as a pure function against any history of writes, with compaction and
restarts in the middle; then the whole worker in memory on a broker that refuses long
records, killed at each step of a commit; then the Faust store's recovery of the pieces.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.settings import Settings
from memdiag.streams.store import (
    OFFSETS_HEADER,
    PART_HEADER,
    ChangelogRecord,
    MemoryBackend,
    Replay,
    changelog_record,
    part_count,
    pieces,
    replay,
)
from tests.compare import differences, from_records, from_reference
from tests.inmemory import STEPS, World
from tests.reference import reference
from tests.scenario import generate
from tests.unit.test_checkpoint import asyncio_stop, store_with

SETTINGS = Settings()

#: (key, value or None for a delete, the source offset the write's checkpoint covers)
Write = tuple[bytes, bytes | None, int]


def log_of(writes: list[Write], limit: int) -> list[ChangelogRecord]:
    """The changelog the checkpoint writes for ``writes``: each one's pieces, in order, each
    piece headed as the checkpoint heads it (its covers, its part)."""
    log: list[ChangelogRecord] = []
    last: dict[bytes, bytes] = {}
    for key, value, covers in writes:
        old = last.get(key)
        before = 0 if old is None else part_count(len(old), limit)
        headers = [(OFFSETS_HEADER, orjson.dumps({"events": covers}))]
        for k, v, h in pieces(key, value, headers, limit, before):
            log.append(changelog_record(len(log), k, v, h))
        if value is None:
            last.pop(key, None)
        else:
            last[key] = value
    return log


def compacted(log: list[ChangelogRecord]) -> list[ChangelogRecord]:
    """What Kafka's cleaner leaves: the latest record of each key (tombstones kept, as they
    are until ``delete.retention.ms``)."""
    latest = {r.key: r for r in log}
    return [r for r in log if latest[r.key] is r]


def expected(writes: list[Write], committed: int) -> dict[bytes, bytes]:
    """The state as of the committed offset: the writes of committed checkpoints, in order."""
    state: dict[bytes, bytes] = {}
    for key, value, covers in writes:
        if covers < committed:
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    return state


values = st.one_of(st.none(), st.binary(min_size=0, max_size=40))
histories = st.lists(
    st.tuples(st.sampled_from([b"s:a", b"c:a\x000", b"b"]), values, st.integers(0, 9)),
    max_size=30,
).map(lambda ws: sorted(ws, key=lambda w: w[2]))  # checkpoints in the order of their offsets


@settings(max_examples=300, deadline=None)
@given(histories, st.integers(1, 8), st.integers(0, 10), st.integers(0, 200))
def test_long_values_come_back_whole_after_compaction_and_restarts(
    writes: list[Write], limit: int, committed: int, cut: int
) -> None:
    """Any history of writes, cut at any record limit: recovery gives the committed values,
    read at once or stopped anywhere and resumed from the backend's offset (never inside a
    value's pieces, which it would then lose); compacted, once every checkpoint committed
    (compaction before a skipped record is repaired is the changelog lag's business)."""
    log = log_of(writes, limit)
    assert all(r.value is None or len(r.value) <= limit for r in log)
    runs = (("the log", log, committed), ("compacted", compacted(log), 10))
    for name, records, upto in runs:
        want = expected(writes, upto)
        once = MemoryBackend()
        replay(once, records, {"events": upto})
        assert dict(once.data) == want, name
        twice = MemoryBackend()  # stopped during its recovery, before the changelog's end
        Replay(twice, {"events": upto}).apply(records[: cut % (len(records) + 1)])
        start = -1 if twice.offset is None else twice.offset
        replay(twice, [r for r in records if r.offset > start], {"events": upto})
        assert dict(twice.data) == want, (name, "restarted")


@settings(max_examples=200, deadline=None)
@given(histories, st.integers(1, 8))
def test_compaction_leaves_no_part_of_a_value_that_is_gone(writes: list[Write], limit: int) -> None:
    """A value that shrank or was deleted leaves tombstones for the parts it no longer has:
    once compacted, every part left with a value belongs to its key's current value."""
    state = expected(writes, 10)
    for r in compacted(log_of(writes, limit)):
        if r.part is not None and r.value is not None:
            key = r.key.rpartition(b"\xff")[0]
            assert key in state and r.part < part_count(len(state[key]), limit), r


def test_a_piece_whose_parts_compaction_took_keeps_the_value_before_and_is_repaired() -> None:
    """A value's last piece without all its parts (compaction took one: a checkpoint that
    never committed overwrote it, unrepaired past the compaction lag) is not applied half:
    the key keeps what it had and is repaired."""
    headers = [(OFFSETS_HEADER, orjson.dumps({"events": 1}))]
    records = pieces(b"k", b"abcdefgh", headers, 3)
    assert [changelog_record(0, *r).part for r in records] == [0, 1, None]
    log = [changelog_record(0, b"k", b"old", [(OFFSETS_HEADER, b'{"events":0}')])]
    log += [changelog_record(i + 1, k, v, h) for i, (k, v, h) in enumerate(records) if i != 1]
    backend = MemoryBackend()
    repairs = replay(backend, log, {"events": 5})
    assert backend.get(b"k") == b"old" and repairs == {b"k"}


def test_a_crash_between_a_values_parts_repairs_its_key() -> None:
    """A worker killed after sending a part of a new value, before its last piece: recovery
    skips the part and repairs the key (before, only a skipped last piece did, so the key
    kept no repair, and once compaction took the committed part the new one superseded,
    a later rebuild found the committed value broken and lost it)."""

    def headed(covers: int) -> list[tuple[str, bytes]]:
        return [(OFFSETS_HEADER, orjson.dumps({"events": covers}))]

    def records(start: int, *writes: Any) -> list[ChangelogRecord]:
        return [changelog_record(start + i, *w) for i, w in enumerate(writes)]

    old = pieces(b"k", b"abcdefgh", headed(0), 3)  # two parts and a last piece, committed
    crashed = pieces(b"k", b"ABCDEFGHIJK", headed(5), 3)[0]  # its first part, then the kill
    log = records(0, *old, crashed)
    run = Replay(MemoryBackend(), {"events": 1})
    run.apply(log)
    assert run.repairs() == {b"k"} and run.stray == {b"k": 1}
    assert run.backend.get(b"k") == b"abcdefgh"
    # the repair writes the committed value again, over every part the crash left
    before = max(part_count(8, 3), run.stray[b"k"])
    repaired = log + records(len(log), *pieces(b"k", b"abcdefgh", headed(6), 3, before))
    for committed in (7, 10):  # the repair committed; the crashed part's offsets passed or not
        backend = MemoryBackend()
        replay(backend, compacted(repaired), {"events": committed})
        assert backend.get(b"k") == b"abcdefgh", committed


def test_parts_without_their_last_piece_are_dropped_and_their_key_repaired() -> None:
    """A crashed checkpoint's parts, applied once later commits pass their offsets, with no
    last piece after them: at the changelog's end they are dropped, the key is repaired
    (its next write tombstones them), and the backend's offset moves past them (before, it
    stayed pinned before the first, and every restart read the tail again)."""
    committed = [(OFFSETS_HEADER, orjson.dumps({"events": 0}))]
    crashed = [(OFFSETS_HEADER, orjson.dumps({"events": 5}))]
    log = [changelog_record(i, *r) for i, r in enumerate(
        [*pieces(b"k", b"abcdefgh", committed, 3), *pieces(b"k", b"ABCDEFGHIJ", crashed, 3)[:2]]
    )]  # fmt: skip
    backend = MemoryBackend()
    run = Replay(backend, {"events": 10})
    run.apply(log)
    assert backend.offset == 2  # while the parts may still get their last piece
    assert run.repairs() == {b"k"} and run.stray == {b"k": 2}
    assert backend.offset == 4 and backend.get(b"k") == b"abcdefgh"


def test_a_failed_checkpoints_parts_are_tombstoned_by_the_repair() -> None:
    """A checkpoint that split a value and failed: its repair tombstones the parts the
    committed (short) value does not overwrite; compaction then leaves none."""
    world = World(SETTINGS, record_limit=RECORD_LIMIT, max_message_bytes=MESSAGE_BYTES)
    world.publish(scenario(), keyed=True)
    world.kafka.refuse_next_commit = True
    world.run(max_rounds=40, settle=False)
    assert world.refused == 1
    world.run()
    log = [changelog_record(r.offset, r.key or b"", r.value, r.headers)
           for _, r in world.changelog_records()]  # fmt: skip
    live = {r.key.rpartition(b"\xff")[0] for r in compacted(log)
            if r.part is not None and r.value is not None}  # fmt: skip
    state = {k for values in world.table_values()["state"].values() for k in values}
    assert live <= state  # every part left with a value belongs to a key still held


# -- the worker in memory, on a broker that refuses long records ---------------------------

#: the broker's limit here: a session's head and log chunks are longer than this
MESSAGE_BYTES = 700
RECORD_LIMIT = 512


def scenario() -> list[dict[str, Any]]:
    return generate(sessions=40, seed=11)


@pytest.mark.parametrize("step", ["part", *STEPS])
def test_a_worker_whose_state_outgrows_the_broker_limit_recovers_at_each_step(step: str) -> None:
    """Before the fix every checkpoint failed here (the broker refused the first long
    value), and the worker never got past its first records."""
    events = scenario()
    want = from_reference(reference(events))
    for seed in range(3):
        world = World(SETTINGS, seed=seed, record_limit=RECORD_LIMIT,
                      max_message_bytes=MESSAGE_BYTES)  # fmt: skip
        world.publish(events, keyed=seed % 2 == 0)
        world.kill_at = (step, 2)  # in the second commit: the first has landed, and every
        # seed's second commit cuts values (its later ones may not: sessions are written
        # once a checkpoint)
        world.run()
        assert world.crashes == 1, world.kills
        assert differences(want, from_records(world.tables)) == [], (step, seed)
        parts = [r for _, r in world.changelog_appends
                 if any(name == PART_HEADER for name, _ in r.headers)]  # fmt: skip
        assert parts, "no value was long enough to be cut: the test tests nothing"


def test_long_values_under_random_crashes_give_the_reference() -> None:
    events = scenario()
    want = from_reference(reference(events))
    for crash_rate in (0.0, 0.2):
        world = World(SETTINGS, seed=5, crash_rate=crash_rate, record_limit=RECORD_LIMIT,
                      max_message_bytes=MESSAGE_BYTES)  # fmt: skip
        world.publish(events, keyed=True, batch=10)
        world.run()
        assert differences(want, from_records(world.tables)) == [], crash_rate


# -- the Faust store's recovery -----------------------------------------------------------


def test_the_store_puts_the_pieces_together_across_recovery_batches(tmp_path: Any) -> None:
    """Faust hands the store the changelog in batches; a RocksDB store stopped between a
    value's parts and its last piece reads the parts again on its next start."""
    from faust.types import TP

    headers = [(OFFSETS_HEADER, orjson.dumps({"events": 3}))]
    value = bytes(range(256)) * 9
    records = [(b"short", b"v", headers), *pieces(b"long", value, headers, 1000)]
    assert len(records) == 4
    messages = [
        SimpleNamespace(message=SimpleNamespace(topic="state-changelog", partition=0, offset=i,
                                                key=k, value=v, headers=h))
        for i, (k, v, h) in enumerate(records)
    ]  # fmt: skip
    committed = {("events", 0): 10, ("steps", 0): 0}

    def start(store: Any) -> int | None:
        async def go() -> int | None:
            await store.on_rebalance({TP("state-changelog", 0), TP("events", 0),
                                      TP("steps", 0)}, set(), set())  # fmt: skip
            offset: int | None = store.persisted_offset(TP("state-changelog", 0))
            return offset

        return asyncio.run(go())

    store = store_with(committed, "rocksdb", tmp_path)
    assert start(store) is None
    store.apply_changelog_batch(messages[:3], None, None)  # the last piece not yet read
    asyncio_stop(store)
    store = store_with(committed, "rocksdb", tmp_path)
    offset = start(store)
    assert offset == 0  # before the first part: the parts are read again
    store.apply_changelog_batch([m for m in messages if m.message.offset > offset], None, None)
    asyncio.run(store.on_recovery_completed(set(), set()))
    assert store.backends[0].get(b"long") == value and store.backends[0].get(b"short") == b"v"
    assert not store.repairs.get(0)
    asyncio_stop(store)
