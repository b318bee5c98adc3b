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
*repaired*: the first thing the worker does after recovery is write each such key's recovered
value (or a tombstone) to the changelog again, before it takes a record. A skipped record
stays in the changelog, and a later replay (another restart, a fresh machine) would find the
commits past it and apply it; the repair that follows it makes sure its stale value never
comes back, whatever the rerun wrote.

:class:`memdiag.streams.tables.CheckpointStore` is the Faust store of the worker's tables
(through Faust's store registry, ``memdiag://``): Faust's recovery hands it the changelog
records; it applies them by the rule above.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

import orjson
from sortedcontainers import SortedDict

#: The changelog header naming the source offsets a record covers: a JSON object
#: ``{topic: offset of the last record processed}`` (the partition is the record's own).
OFFSETS_HEADER = "memdiag-offsets"

#: Where a RocksDB backend keeps the changelog offset its values reflect (no state key
#: starts with a NUL byte).
_OFFSET_KEY = b"\x00memdiag:changelog-offset"

Writes = Mapping[bytes, bytes | None]


class Backend(Protocol):
    """One changelog partition's committed values (keys and values are bytes)."""

    #: the offset of the last changelog record the values reflect (None: none)
    offset: int | None

    def get(self, key: bytes) -> bytes | None: ...

    def items(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The keys starting with ``prefix``, in byte order, with their values."""
        ...

    def write(self, writes: Writes, offset: int | None) -> None:
        """Apply ``writes`` (None: delete) and, if given, remember ``offset``: atomically."""
        ...

    def close(self) -> None: ...


class MemoryBackend:
    """A backend in memory (tests, and ``MEMDIAG_STATE_STORE=memory``): lost with the
    process, so every start replays the whole changelog."""

    def __init__(self) -> None:
        self.data: SortedDict = SortedDict()
        self.offset: int | None = None

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self.data.get(key)
        return value

    def items(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        data = self.data
        for key in data.irange(minimum=prefix):
            if not key.startswith(prefix):
                return
            yield key, data[key]

    def write(self, writes: Writes, offset: int | None) -> None:
        data = self.data
        for key, value in writes.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        if offset is not None:
            self.offset = offset

    def close(self) -> None:
        pass


@lru_cache(maxsize=4)
def _shared_cache(size: int) -> Any:
    """A RocksDB block cache of ``size`` bytes, shared by every database opened with it: the
    worker's memory is bounded by one cache, however many partitions it owns."""
    from rocksdict import Cache

    return Cache(size)


class RocksBackend:
    """A backend in a RocksDB database of its own (one directory per changelog partition):
    memory stays bounded by its caches, and a restart on the same machine replays only the
    changelog past the offset it keeps."""

    def __init__(self, path: Path, cache_bytes: int = 16 << 20):
        from rocksdict import BlockBasedOptions, Options, Rdict

        path.parent.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        table = BlockBasedOptions()
        table.set_block_cache(_shared_cache(cache_bytes))  # one for the process's databases
        options.set_block_based_table_factory(table)
        options.set_write_buffer_size(4 << 20)
        options.set_max_write_buffer_number(2)
        self.path = path
        self._db = Rdict(str(path), options)
        raw = self._db.get(_OFFSET_KEY)
        self.offset: int | None = None if raw is None else int(raw)

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

    def write(self, writes: Writes, offset: int | None) -> None:
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for key, value in writes.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        if offset is not None:
            batch.put(_OFFSET_KEY, str(offset).encode())
        self._db.write(batch)
        if offset is not None:
            self.offset = offset

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


def covers_of(headers: Iterable[tuple[str, bytes]] | None) -> Mapping[str, int] | None:
    """The source offsets a changelog record's headers name (None: it names none)."""
    for name, value in headers or ():
        if name == OFFSETS_HEADER:
            covers: dict[str, int] = orjson.loads(value)
            return covers
    return None


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
    applied = 0
    skipped = 0

    def apply(self, records: Iterable[ChangelogRecord]) -> None:
        writes: dict[bytes, bytes | None] = {}
        last = None
        for rec in records:
            last = rec.offset
            if committed_past(rec.covers, self.committed):
                writes[rec.key] = rec.value
                self.latest_skipped[rec.key] = False
                self.applied += 1
            else:
                self.latest_skipped[rec.key] = True
                self.skipped += 1
                if self.frozen_at is None:
                    self.frozen_at = rec.offset - 1
        if last is None:
            return
        offset = last if self.frozen_at is None else self.frozen_at
        current = self.backend.offset
        self.backend.write(writes, offset if current is None or offset > current else None)

    def repairs(self) -> set[bytes]:
        """The keys whose latest changelog record was skipped."""
        return {key for key, skipped in self.latest_skipped.items() if skipped}


def replay(
    backend: Backend, records: Iterable[ChangelogRecord], committed: Mapping[str, int]
) -> set[bytes]:
    """Recover ``backend`` from changelog records (those after its offset, in order); the keys
    to repair. Pure: the checkpoint's tests drive it without Faust."""
    run = Replay(backend, committed)
    run.apply(records)
    return run.repairs()
