"""Where the worker's state lives between checkpoints: per changelog partition, the values as
of the last committed checkpoint and the changelog offset they reflect.

A backend (:class:`MemoryBackend`, :class:`RocksBackend`) only ever holds committed values:
the checkpoint (:mod:`memdiag.streams.checkpoint`) writes a checkpoint's values into it after
the offsets they cover are committed, never before. So a failed checkpoint leaves nothing
behind to undo; the checkpoint drops its own writes.

Recovery (:func:`replay`) reads a partition's changelog from the backend's offset on. Every
record the checkpoint produces carries, in its :data:`OFFSETS_HEADER`, the offsets of the
source partitions it covers (the last record processed of each); a record is applied only
when all of them are below the group's committed offsets. A record ahead of them belongs to a
checkpoint that produced its changelog and never committed: it is skipped, and its key is
*repaired*: the next checkpoint writes each such key's recovered value (or a tombstone) to
the changelog again. A skipped record stays in the changelog, and a later replay (another
restart, a fresh machine) would find the commits past it and apply it; the repair that
follows it makes sure its stale value never comes back, whatever the rerun wrote.

Two things recovery decides before it reads (:func:`assess`):

- **Local state ahead of the commit.** A backend also keeps what its values cover
  (:attr:`Backend.covers`: per source topic, the newest offset a record it reflects
  covers). When the group's committed offsets are not past them (the offsets were reset for
  a replay, or went back), the values hold records the worker is about to take again: the
  partition is rebuilt from the changelog under the skip rule, as a memory store would be.
- **Nothing committed.** When the group has no committed offset for any source topic of the
  partition (they expired while no worker ran, or the group was deleted), "nothing
  committed" is not "committed 0" if the local state covers offsets: it holds committed
  values only, so it proves what was committed, and recovery takes its covers as the
  committed position (:attr:`Assessment.positions`: where the worker starts). Without local
  state nothing tells lost offsets from a worker that never committed; see :func:`assess`.

:class:`memdiag.streams.tables.CheckpointStore` is the Faust store of the worker's tables
(through Faust's store registry, ``memdiag://``): Faust's recovery hands it the changelog
records; it applies them by the rule above.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
from sortedcontainers import SortedDict

log = logging.getLogger("memdiag.worker")

#: The changelog header naming the source offsets a record covers: a JSON object
#: ``{topic: offset of the last record processed}`` (the partition is the record's own).
OFFSETS_HEADER = "memdiag-offsets"

#: A state value longer than the transport's record limit goes to the changelog in pieces
#: (:func:`pieces`): its first pieces as *part* records, keyed ``key + 0xFF + index`` (no state
#: key holds the byte 0xFF: they are UTF-8), each headed ``memdiag-part: index``; then the
#: last piece under the key itself, headed ``memdiag-parts: how many parts precede it``.
#: Recovery puts them together (:class:`Replay`). All pieces carry the same covers, so the
#: skip rule takes or skips them together.
PART_HEADER = "memdiag-part"
PARTS_HEADER = "memdiag-parts"
_PART_SEPARATOR = b"\xff"

#: Where a RocksDB backend keeps the changelog offset its values reflect (no state key
#: starts with a NUL byte).
_OFFSET_KEY = b"\x00memdiag:changelog-offset"
#: ... and what they cover: ``{"at": changelog offset, "covers": {topic: offset}}``
_COVERS_KEY = b"\x00memdiag:covers"

Writes = Mapping[bytes, bytes | None]
Covers = Mapping[str, int]


class Backend(Protocol):
    """One changelog partition's committed values (keys and values are bytes)."""

    #: the offset of the last changelog record the values reflect (None: none)
    offset: int | None
    #: per source topic, the newest offset that a record the values reflect covers: where the
    #: local state stands in the sources (the partition is the backend's own)
    covers: dict[str, int]
    #: the changelog offset :attr:`covers` is known up to. Behind :attr:`offset` when values
    #: were written without their covers: recovery then reads the covers of the record at
    #: :attr:`offset` (:func:`needs_covers`)
    covers_at: int | None

    def get(self, key: bytes) -> bytes | None: ...

    def items(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The keys starting with ``prefix``, in byte order, with their values."""
        ...

    #: where a write with an offset and no covers (the checkpoint's) takes its covers from:
    #: the store sets it to the covers of the commit the write follows (:func:`commit_covers`)
    covers_hint: Callable[[], Covers | None] | None

    def write(self, writes: Writes, offset: int | None, covers: Covers | None = None) -> None:
        """Apply ``writes`` (None: delete) and, if given, remember ``offset`` and add
        ``covers`` (the source offsets of the records written) to :attr:`covers`:
        atomically."""
        ...

    def close(self) -> None: ...


def commit_covers(offsets: Mapping[Any, int], sources: Iterable[str]) -> dict[int, dict[str, int]]:
    """Per changelog partition, what a commit of ``offsets`` ({(topic, partition): the next
    offset}) covers of ``sources``: the offsets the checkpoint's changelog records name in
    their header (:data:`OFFSETS_HEADER`)."""
    wanted = set(sources)
    out: dict[int, dict[str, int]] = {}
    for (topic, partition), offset in offsets.items():
        if topic in wanted:
            out.setdefault(partition, {})[topic] = offset - 1
    return out


def _given(
    covers: Covers | None, offset: int | None, hint: Callable[[], Covers | None] | None
) -> Covers | None:
    if covers is None and offset is not None and hint is not None:
        return hint()
    return covers


def _with(covers: dict[str, int], more: Covers) -> dict[str, int]:
    """``covers`` with ``more`` added: the newest offset of each topic."""
    out = dict(covers)
    for topic, offset in more.items():
        if offset > out.get(topic, -1):
            out[topic] = offset
    return out


class MemoryBackend:
    """A backend in memory (tests, and ``MEMDIAG_STATE_STORE=memory``): lost with the
    process, so every start replays the whole changelog."""

    def __init__(self) -> None:
        self.data: SortedDict = SortedDict()
        self.offset: int | None = None
        self.covers: dict[str, int] = {}
        self.covers_at: int | None = None
        self.covers_hint: Callable[[], Covers | None] | None = None

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self.data.get(key)
        return value

    def items(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        data = self.data
        for key in data.irange(minimum=prefix):
            if not key.startswith(prefix):
                return
            yield key, data[key]

    def write(self, writes: Writes, offset: int | None, covers: Covers | None = None) -> None:
        covers = _given(covers, offset, self.covers_hint)
        data = self.data
        for key, value in writes.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        if offset is not None:
            self.offset = offset
        if covers is not None:
            self.covers = _with(self.covers, covers)
            if offset is not None:
                self.covers_at = offset

    def close(self) -> None:
        pass


#: the process's RocksDB block caches and write buffer managers, by size in bytes
_CACHES: dict[int, Any] = {}
_WRITE_BUFFERS: dict[int, Any] = {}


def _shared_cache(size: int) -> Any:
    """A RocksDB block cache of ``size`` bytes, shared by every database opened with it: the
    worker's memory is bounded by one cache, however many partitions it owns."""
    if size not in _CACHES:
        from rocksdict import Cache

        _CACHES[size] = Cache(size)
    return _CACHES[size]


def _shared_write_buffers(size: int) -> Any:
    """RocksDB's write buffer manager of ``size`` bytes, shared by every database opened
    with it: past about 90% of it, the database being written flushes its memtable. Alone,
    each database may hold two 2 MB memtables, and a worker owns one database per partition
    of each table (eight at the defaults): 32 MB between them."""
    if size not in _WRITE_BUFFERS:
        from rocksdict import WriteBufferManager

        _WRITE_BUFFERS[size] = WriteBufferManager(size, False)  # a flush, never a stalled write
    return _WRITE_BUFFERS[size]


def rocks_memory() -> dict[str, int]:
    """The bytes RocksDB holds in this process, as its block caches and write buffer
    managers count them (``benchmarks/traced_worker.py``)."""
    return {
        "block_cache": sum(c.get_usage() for c in _CACHES.values()),
        "write_buffers": sum(w.get_usage() for w in _WRITE_BUFFERS.values()),
    }


#: How long a worker waits for a partition's database that another process on this machine
#: holds (:func:`open_rocks`).
LOCK_WAIT_SECONDS = 30.0


def held_elsewhere(exc: BaseException) -> bool:
    """RocksDB refused to open a database because another process holds its LOCK file."""
    return "While lock file" in str(exc)


async def open_rocks(
    path: Path, cache_bytes: int, write_buffer_bytes: int, wait_seconds: float = LOCK_WAIT_SECONDS
) -> RocksBackend:
    """A partition's database, once no other process holds it. Two workers on one machine
    with one MEMDIAG_STATE_DIR share its folders: when a partition moves between them, the
    new owner is told at the same time as the old one, which closes the database only then
    (Faust closes a table's partitions on the assignment that takes them away), so the new
    owner may find it still held for a moment. It waits, and says so; past ``wait_seconds``
    it raises, saying who to look for."""
    deadline = time.monotonic() + wait_seconds
    said = False
    while True:
        try:
            return RocksBackend(path, cache_bytes, write_buffer_bytes)
        except Exception as exc:
            if not held_elsewhere(exc):
                raise
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"the state database {path} is held by another process after "
                    f"{wait_seconds:.0f} s of waiting: another worker with the same "
                    "MEMDIAG_STATE_DIR and MEMDIAG_APP_ID still has this partition open. "
                    "Stop it, or give each worker a state folder of its own"
                ) from exc
            if not said:
                log.info("state database %s is still held by another process (the "
                         "partition's last owner here); waiting for it", path)  # fmt: skip
                said = True
            await asyncio.sleep(0.1)


class RocksBackend:
    """A backend in a RocksDB database of its own (one directory per changelog partition):
    memory stays bounded by its caches, and a restart on the same machine replays only the
    changelog past the offset it keeps."""

    def __init__(self, path: Path, cache_bytes: int = 16 << 20, write_buffer_bytes: int = 16 << 20):
        from rocksdict import BlockBasedOptions, Options, Rdict

        path.parent.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        table = BlockBasedOptions()
        table.set_block_cache(_shared_cache(cache_bytes))  # one for the process's databases
        options.set_block_based_table_factory(table)
        # 2 MB a memtable: a database gone quiet keeps its memtable unflushed, and eight of
        # them at 4 MB would fill the shared bound, each write then flushing a tiny file
        options.set_write_buffer_size(2 << 20)
        options.set_max_write_buffer_number(2)
        # one bound for all the process's memtables
        options.set_write_buffer_manager(_shared_write_buffers(write_buffer_bytes))
        self.path = path
        self._db = Rdict(str(path), options)
        raw = self._db.get(_OFFSET_KEY)
        self.offset: int | None = None if raw is None else int(raw)
        known = self._db.get(_COVERS_KEY)  # none in a database of an older memdiag
        found = orjson.loads(known) if known is not None else {}
        self.covers: dict[str, int] = dict(found.get("covers", {}))
        self.covers_at: int | None = found.get("at")
        self.covers_hint: Callable[[], Covers | None] | None = None

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self._db.get(key)
        return value

    def items(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        key: bytes
        value: bytes
        for key, value in self._db.items(from_key=prefix):  # type: ignore[assignment]
            if not key.startswith(prefix):
                return
            yield key, value

    def write(self, writes: Writes, offset: int | None, covers: Covers | None = None) -> None:
        from rocksdict import WriteBatch

        covers = _given(covers, offset, self.covers_hint)
        batch = WriteBatch(raw_mode=True)
        for key, value in writes.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        if offset is not None:
            batch.put(_OFFSET_KEY, str(offset).encode())
        merged, at = self.covers, self.covers_at
        if covers is not None:
            merged = _with(merged, covers)
            at = at if offset is None else offset
            batch.put(_COVERS_KEY, orjson.dumps({"at": at, "covers": merged}))
        self._db.write(batch)
        if offset is not None:
            self.offset = offset
        self.covers, self.covers_at = merged, at

    def close(self) -> None:
        self._db.close()

    @staticmethod
    def destroy(path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)


# -- recovery ---------------------------------------------------------------------------------


@dataclass(slots=True)
class ChangelogRecord:
    """A changelog record as recovery sees it."""

    offset: int
    key: bytes
    value: bytes | None
    #: the source offsets it covers (topic -> last offset processed); None: always applied
    covers: Mapping[str, int] | None
    #: a part record's index (its key is its value's key, 0xFF, the index); None: a value
    part: int | None = None
    #: on a value's last piece, how many part records precede it
    parts: int = 0


def changelog_record(
    offset: int, key: bytes, value: bytes | None, headers: Iterable[tuple[str, bytes]] | None
) -> ChangelogRecord:
    """A changelog record, its headers read (the covers, and the pieces of a long value)."""
    covers: Mapping[str, int] | None = None
    part: int | None = None
    parts = 0
    for name, raw in headers or ():
        if name == OFFSETS_HEADER:
            covers = orjson.loads(raw)
        elif name == PART_HEADER:
            part = int(raw)
        elif name == PARTS_HEADER:
            parts = int(raw)
    return ChangelogRecord(offset, key, value, covers, part, parts)


def part_key(key: bytes, index: int) -> bytes:
    return key + _PART_SEPARATOR + str(index).encode()


def part_count(length: int, limit: int) -> int:
    """How many part records a value of ``length`` bytes has (before its last piece)."""
    return 0 if length <= limit else (length - 1) // limit


def pieces(
    key: bytes,
    value: bytes | None,
    headers: list[tuple[str, bytes]] | None,
    limit: int,
    before: int = 0,
) -> list[tuple[bytes, bytes | None, list[tuple[str, bytes]] | None]]:
    """The changelog records of one state write: ``(key, value, headers)``, the value's own
    record last. A value of at most ``limit`` bytes (or a tombstone) is one record; a longer
    one is cut into part records of ``limit`` bytes and a last piece (see
    :data:`PART_HEADER`). ``before``: how many part records the key's previous value had
    (:func:`part_count` of its length); those this write does not overwrite get tombstones
    first, so that compaction clears them."""
    n = 0 if value is None else part_count(len(value), limit)
    out: list[tuple[bytes, bytes | None, list[tuple[str, bytes]] | None]] = [
        (part_key(key, i), None, [*(headers or ()), (PART_HEADER, str(i).encode())])
        for i in range(n, before)
    ]
    if n == 0:
        out.append((key, value, headers))
        return out
    assert value is not None  # noqa: S101 - n > 0
    for i in range(n):
        out.append((part_key(key, i), value[i * limit : (i + 1) * limit],
                    [*(headers or ()), (PART_HEADER, str(i).encode())]))  # fmt: skip
    out.append((key, value[n * limit :], [*(headers or ()), (PARTS_HEADER, str(n).encode())]))
    return out


def covers_of(headers: Iterable[tuple[str, bytes]] | None) -> Mapping[str, int] | None:
    """The source offsets a changelog record's headers name (None: it names none)."""
    return changelog_record(0, b"", None, headers).covers


def committed_past(covers: Mapping[str, int] | None, committed: Mapping[str, int]) -> bool:
    """Whether the group's committed offsets (of the record's partition, by topic) are past
    every source offset the record covers. A topic with nothing committed is past nothing."""
    if not covers:
        return True
    for topic, offset in covers.items():
        done = committed.get(topic)
        if done is None or offset >= done:
            return False
    return True


def needs_covers(backend: Backend) -> bool:
    """Whether the backend's values were written past what it knows they cover (an older
    memdiag wrote them, or a write came without a commit told to the store): recovery then
    reads the covers of the changelog record at its offset, the last checkpoint's (the
    topics that checkpoint moved; an older one may have moved others further, so this is a
    fallback, not the rule)."""
    return backend.offset is not None and backend.covers_at != backend.offset


@dataclass(frozen=True, slots=True)
class Assessment:
    """What recovery does with a partition before it reads the changelog."""

    #: the offsets recovery applies records by (the skip rule's): the group's committed
    #: offsets, or, when the group has none but the local state proves some were committed,
    #: what the local state covers
    committed: dict[str, int]
    #: the group has no committed offset for any source topic of the partition
    lost: bool
    #: the source topics the local state covers at or past the committed offsets (topic ->
    #: the offset it covers): the state is ahead of the commit, and rebuilt
    ahead: dict[str, int]

    @property
    def rebuild(self) -> bool:
        return bool(self.ahead)

    @property
    def positions(self) -> dict[str, int]:
        """Where the worker takes records from, where the group has nothing committed:
        after what the local state covers."""
        return dict(self.committed) if self.lost else {}


def assess(backend: Backend, committed: Covers, sources: Iterable[str]) -> Assessment:
    """See the module docstring. ``committed``: the group's committed offsets of the
    partition's source topics, by topic (a topic with none is absent).

    Nothing committed: a backend holds committed values only (the checkpoint writes it after
    its commit; recovery applies what commits cover), so local state with covers proves
    that the group committed them, and lost its offsets since: they are taken as the
    committed position. Without local state (a memory store, a fresh machine), nothing
    tells lost offsets from a worker that never committed (one killed in its first
    checkpoint): taking its changelog records for committed could lose that checkpoint's
    outputs, so every record is skipped and the worker takes its sources from their start,
    as before any commit."""
    lost = not any(topic in committed for topic in sources)
    if lost:
        local = {topic: offset + 1 for topic, offset in backend.covers.items()}
        return Assessment(local, True, {})
    ahead = {
        topic: offset
        for topic, offset in backend.covers.items()
        if topic not in committed or offset >= committed[topic]
    }
    return Assessment(dict(committed), False, ahead)


def ahead_line(table: str, partition: int, ahead: Covers, committed: Covers) -> str:
    """The log line of a local state found ahead of the commit: where it stands, what is
    committed, what the worker does, what a person does."""
    where = "; ".join(
        f"{topic} {offset:,} covered, {committed[topic]:,} committed" if topic in committed
        else f"{topic} {offset:,} covered, nothing committed"
        for topic, offset in sorted(ahead.items())
    )  # fmt: skip
    return (
        f"{table} partition {partition}: the local state covers records the group has not "
        f"committed ({where}): the group's offsets were reset (a replay) or went back. "
        "Rebuilding it from the changelog as of the committed offsets, as a memory store "
        "does, so that no record counts twice. Nothing to do after memdiag reset-offsets; "
        "otherwise find out what moved the group's offsets"
    )


@dataclass
class Replay:
    """One changelog partition's recovery in progress: what to apply, what to repair."""

    backend: Backend
    committed: Mapping[str, int]
    #: key -> its latest record was skipped (it needs a repair)
    latest_skipped: dict[bytes, bool] = field(default_factory=dict)
    #: the offset before the first record skipped (a persistent backend keeps its offset
    #: there, so that a restart before the repairs re-reads what it skipped)
    frozen_at: int | None = None
    #: a long value's part records read so far: key -> index -> (offset, piece)
    pending: dict[bytes, dict[int, tuple[int, bytes]]] = field(default_factory=dict)
    #: keys whose value's parts were not all in the changelog (left as they were, repaired)
    broken: list[bytes] = field(default_factory=list)
    #: per key, how many part records a checkpoint that never committed may have left in
    #: the changelog (skipped, or never followed by their last piece): the repair that writes
    #: the key again tombstones them (:attr:`memdiag.streams.checkpoint.Table.stray_parts`)
    stray: dict[bytes, int] = field(default_factory=dict)
    #: the offset of the last record read
    last: int | None = None
    applied = 0
    skipped = 0

    def apply(self, records: Iterable[ChangelogRecord]) -> None:
        writes: dict[bytes, bytes | None] = {}
        covered: dict[str, int] = {}
        pending = self.pending
        last = None
        for rec in records:
            last = rec.offset
            if not committed_past(rec.covers, self.committed):
                if rec.part is None:
                    self.latest_skipped[rec.key] = True
                else:  # its key is repaired even if its last piece never came (a crash)
                    key = rec.key.rpartition(_PART_SEPARATOR)[0]
                    self.latest_skipped[key] = True
                    self.stray[key] = max(self.stray.get(key, 0), rec.part + 1)
                self.skipped += 1
                if self.frozen_at is None:
                    self.frozen_at = rec.offset - 1
                continue
            self.applied += 1
            if rec.covers:
                covered = _with(covered, rec.covers)
            if rec.part is not None:
                key = rec.key.rpartition(_PART_SEPARATOR)[0]
                if rec.value is None:  # a tombstone: a shorter value no longer has this part
                    pending.get(key, {}).pop(rec.part, None)
                else:
                    pending.setdefault(key, {})[rec.part] = (rec.offset, rec.value)
                continue
            value = rec.value
            held = pending.pop(rec.key, None)
            if rec.parts:
                if held is None or any(i not in held for i in range(rec.parts)):
                    # compaction took a part the last piece needs (its value was overwritten
                    # by a checkpoint that never committed, and not repaired within the
                    # changelog's compaction lag): the key keeps what it had, and is repaired
                    self.broken.append(rec.key)
                    self.latest_skipped[rec.key] = True
                    continue
                value = b"".join(held[i][1] for i in range(rec.parts)) + (value or b"")
            writes[rec.key] = value
            self.latest_skipped[rec.key] = False
        if last is None:
            return
        self.last = last
        offset = last if self.frozen_at is None else self.frozen_at
        held_at = [o for held in pending.values() for o, _ in held.values()]
        if held_at:  # a restart must read a value's parts again: stop before the first held
            offset = min(offset, min(held_at) - 1)
        current = self.backend.offset
        fresh = offset if current is None or offset > current else None
        self.backend.write(writes, fresh, covered)

    def repairs(self) -> set[bytes]:
        """At the end of the changelog: the keys whose latest changelog record was skipped,
        and those with parts no last piece followed (a checkpoint that produced them and
        never committed, applied once the commits passed it): those parts are dropped, the
        key is repaired, and the backend's offset moves past them."""
        for key, held in self.pending.items():
            if held:
                self.latest_skipped[key] = True
                self.stray[key] = max(self.stray.get(key, 0), max(held) + 1)
        self.pending.clear()
        current = self.backend.offset
        if (
            self.frozen_at is None
            and self.last is not None
            and (current is None or self.last > current)
        ):
            self.backend.write({}, self.last, {})
        return {key for key, skipped in self.latest_skipped.items() if skipped}


def replay(
    backend: Backend, records: Iterable[ChangelogRecord], committed: Mapping[str, int]
) -> set[bytes]:
    """Recover ``backend`` from changelog records (those after its offset, in order); the keys
    to repair. Pure: the checkpoint's tests drive it without Faust."""
    run = Replay(backend, committed)
    run.apply(records)
    return run.repairs()


@dataclass
class RebuildPoint:
    """Where to commit a source partition for the state to be rebuilt exactly there: what an
    offset reset (``memdiag reset-offsets``) commits instead of its target.

    A committed offset inside a checkpoint (a reset to a point in time lands anywhere)
    leaves the state behind it: recovery skips that checkpoint's changelog records (they
    cover offsets past the commit), and the worker takes the records after the commit only,
    so those the checkpoint covered before it count in no state. Fed a changelog
    partition's covers in log order (:meth:`add`), this says, per source topic, the offset
    after the newest record that recovery applies under ``targets`` (the skip rule) and that
    names the topic: at most the target, a checkpoint's boundary."""

    #: per source topic, the offset the reset aims at (for the skip rule: the committed)
    targets: Covers
    #: per topic, what the newest applied record naming it covers (log order)
    newest: dict[str, int] = field(default_factory=dict)
    #: the topics some record names, applied or not
    named: set[str] = field(default_factory=set)

    def add(self, covers: Covers | None) -> None:
        if not covers:
            return
        self.named.update(covers)
        if committed_past(covers, self.targets):
            self.newest.update(covers)

    def position(self, topic: str) -> int | None:
        """The offset to commit for ``topic``: after its newest applied record; None (the log
        start) when records name it and none applies; its target when none names it."""
        if topic in self.newest:
            return self.newest[topic] + 1
        if topic in self.named:
            return None
        return self.targets[topic]
