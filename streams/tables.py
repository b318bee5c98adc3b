"""The Faust store of the worker's tables (``memdiag://``, registered in Faust's store
registry by the package's ``faust.stores`` entry point).

Faust keeps what it is good at: the consumer group, the assignment of each changelog
partition with its co-partitioned source partitions, and the recovery that reads a changelog
partition from the store's offset to its end when the partition is assigned. This store
decides what recovery applies (:mod:`memdiag.streams.store`: only records the committed
offsets cover; the skipped records' keys are repaired by the next checkpoint), whether the
local values are kept at all (rebuilt when they are ahead of the committed offsets; taken
as the committed position when the group has none) and where the values live: a RocksDB
database per partition, or memory.

The stages never touch the store through Faust's table API: the checkpoint
(:mod:`memdiag.streams.checkpoint`) reads its backends and writes committed values into them,
with what they cover, which the transport tells the store as each commit goes out
(:meth:`CheckpointStore.committing`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faust.stores.base import Store
from faust.types import TP

from memdiag.streams.store import (
    Backend,
    ChangelogRecord,
    Covers,
    MemoryBackend,
    Replay,
    RocksBackend,
    ahead_line,
    assess,
    changelog_record,
    commit_covers,
    needs_covers,
    open_rocks,
)

log = logging.getLogger("memdiag.worker")

#: The URL scheme of the store (``Table(store="memdiag://")``).
SCHEME = "memdiag"

#: Committed offsets of some (topic, partition)s; a pair with nothing committed is absent.
CommittedFn = Callable[[list[tuple[str, int]]], Awaitable[dict[tuple[str, int], int]]]


@dataclass
class StoreOptions:
    """What a :class:`CheckpointStore` needs beyond Faust's arguments (``Table(options=
    {"memdiag": StoreOptions(...)})``)."""

    #: the source topics whose records write the table (co-partitioned with its changelog)
    sources: tuple[str, ...]
    #: ``rocksdb``, or ``memory`` (every start replays the whole changelog)
    kind: str
    #: the directory of the table's RocksDB databases (one per partition)
    path: Path | None
    #: how the store learns the group's committed offsets (the skip rule's other half)
    committed: CommittedFn
    #: the RocksDB block cache, one for the worker's databases
    cache_bytes: int = 32 << 20
    #: the bound of all the worker's RocksDB memtables together
    write_buffer_bytes: int = 16 << 20


class CheckpointStore(Store):
    """See the module docstring."""

    def __init__(self, url: Any, app: Any, table: Any, **kwargs: Any) -> None:
        super().__init__(url, app, table, **kwargs)
        options = self.options.get("memdiag") if isinstance(self.options, Mapping) else None
        if not isinstance(options, StoreOptions):
            raise TypeError("a memdiag:// store needs Table(options={'memdiag': StoreOptions})")
        self.settings: StoreOptions = options
        self.changelog: str = self.table.changelog_topic.get_topic_name()
        self.backends: dict[int, Backend] = {}
        #: per partition: keys whose latest changelog record recovery skipped
        self.repairs: dict[int, set[bytes]] = {}
        self.stray_parts: dict[int, dict[bytes, int]] = {}
        self._replays: dict[int, Replay] = {}
        #: where the worker starts in a source partition with nothing committed, as the local
        #: state covers it: (topic, partition) -> offset (:func:`start_positions`)
        self.positions: dict[tuple[str, int], int] = {}
        #: the partitions recovering with nothing committed and no local state
        self._lost: set[int] = set()
        #: per partition, what the commit in progress covers (:meth:`committing`)
        self._committing: dict[int, dict[str, int]] = {}

    # -- what the checkpoint uses ---------------------------------------------------------

    @property
    def sources(self) -> tuple[str, ...]:
        return self.settings.sources

    def committing(self, offsets: Mapping[Any, int]) -> None:
        """A checkpoint commits ``offsets`` (the transport says so as it sends the commit):
        the values it then writes into the backends cover them, as its changelog records'
        headers say; the backends keep that with the values (:attr:`Backend.covers`)."""
        self._committing = commit_covers(offsets, self.sources)

    # -- the backends -----------------------------------------------------------------------

    def _path(self, partition: int) -> Path:
        if self.settings.path is None:
            raise RuntimeError("a rocksdb store needs a path (MEMDIAG_STATE_DIR)")
        return self.settings.path / f"{self.table_name}-{partition}"

    def _open(self, partition: int, opened: Backend | None = None) -> Backend:
        """The partition's backend, opened now unless it is (``opened``: one just opened)."""
        backend = self.backends.get(partition)
        if backend is None:
            if opened is not None:
                backend = opened
            elif self.settings.kind == "memory":
                backend = MemoryBackend()
            else:
                backend = RocksBackend(self._path(partition), self.settings.cache_bytes,
                                       self.settings.write_buffer_bytes)  # fmt: skip
            backend.covers_hint = lambda: self._committing.get(partition)
            self.backends[partition] = backend
        return backend

    def _close(self, partition: int) -> None:
        backend = self.backends.pop(partition, None)
        self.repairs.pop(partition, None)
        self.stray_parts.pop(partition, None)
        self._replays.pop(partition, None)
        self._lost.discard(partition)
        for tp in [tp for tp in self.positions if tp[1] == partition]:
            del self.positions[tp]
        if backend is not None:
            backend.close()

    def _reset(self, partition: int) -> None:
        """Forget a partition's local values (they belong to another changelog)."""
        self._close(partition)
        if self.settings.kind != "memory":
            RocksBackend.destroy(self._path(partition))
        self._open(partition)

    # -- Faust's store interface ----------------------------------------------------------

    def persisted_offset(self, tp: TP) -> int | None:
        backend = self.backends.get(tp.partition)
        return None if backend is None else backend.offset

    def set_persisted_offset(self, tp: TP, offset: int) -> None:
        pass  # offsets are written with the values (the checkpoint, the replay)

    async def need_active_standby_for(self, tp: TP) -> bool:
        return False

    async def on_rebalance(
        self, assigned: Any, revoked: Any, newly_assigned: Any, generation_id: int = 0
    ) -> None:
        """Open the backends of this worker's changelog partitions (close the others) and
        learn the committed offsets their recovery applies records by."""
        logged = {tp.partition for tp in assigned if tp.topic == self.changelog}
        # The source partitions the worker takes records from need their state here even
        # when the changelog partition is missing from the assignment (Faust's assignor
        # leaves out a topic the broker's metadata lacks): without a backend, every value
        # the checkpoint wrote would be dropped, and the stages would start over at each one.
        unlogged = {tp.partition for tp in assigned if tp.topic in self.sources} - logged
        mine = logged | unlogged
        for partition in list(self.backends):
            if partition not in mine:
                self._close(partition)
        for partition in mine:
            if partition in self.backends or self.settings.kind == "memory":
                self._open(partition)
            else:  # its last owner on this machine may still hold it for a moment
                self._open(partition, await open_rocks(
                    self._path(partition), self.settings.cache_bytes,
                    self.settings.write_buffer_bytes,
                ))  # fmt: skip
        if unlogged:
            log.warning(
                "%s: the changelog topic %s is not in this worker's assignment (the broker "
                "did not list it); the state of partitions %s is not recovered from it, only "
                "written to it. Check the topic on the broker: a worker that restarts once it "
                "is listed recovers them",
                self.table_name, self.changelog, sorted(unlogged),
            )  # fmt: skip
        if not logged:
            return
        await self._forget_foreign(logged)
        wanted = [(topic, p) for topic in self.sources for p in sorted(logged)]
        committed = await self.settings.committed(wanted)
        await self._learn_covers(logged)
        for partition in sorted(logged):
            by_topic = {t: o for (t, p), o in committed.items() if p == partition}
            verdict = assess(self.backends[partition], by_topic, self.sources)
            if verdict.rebuild:
                log.warning(ahead_line(self.table_name, partition, verdict.ahead, by_topic))
                self._reset(partition)
            for tp in [tp for tp in self.positions if tp[1] == partition]:
                del self.positions[tp]
            positions = verdict.positions
            for topic, offset in positions.items():
                self.positions[(topic, partition)] = offset
            if positions:
                log.warning(
                    "%s partition %d: the group has no committed offset for its source topics, "
                    "but the local state holds committed values (its offsets expired while no "
                    "worker ran, longer than the broker's offsets.retention.minutes, or the "
                    "group was deleted): taking what the local state covers as committed, "
                    "and starting at %s",
                    self.table_name, partition, _shown(positions),
                )  # fmt: skip
            elif verdict.lost:
                self._lost.add(partition)
            self._replays[partition] = Replay(self.backends[partition], verdict.committed)

    async def _learn_covers(self, partitions: set[int]) -> None:
        """A backend whose values were written without their covers (a database of an older
        memdiag): read them from the changelog record at its offset, the last checkpoint's
        (:func:`memdiag.streams.store.needs_covers`)."""
        wanted = {
            (self.changelog, p): offset
            for p in sorted(partitions)
            if needs_covers(self.backends[p]) and (offset := self.backends[p].offset) is not None
        }
        if not wanted:
            return
        from memdiag.streams.compat import changelog_covers

        found = await changelog_covers(self.app, wanted)
        for key, offset in wanted.items():
            p = key[1]
            if key in found:
                self.backends[p].write({}, offset, found[key] or {})
            else:  # what the values cover is unknown: only a rebuild is sure
                log.warning(
                    "%s partition %d: the changelog record at the local state's offset %d did "
                    "not come; rebuilding the partition from the changelog",
                    self.table_name, p, offset,
                )  # fmt: skip
                self._reset(p)

    async def _forget_foreign(self, partitions: set[int]) -> None:
        """A local database at or past its changelog's end belongs to another changelog (the
        broker was reset, the embedded broker started afresh): rebuild it from this one."""
        held = {p: self.backends[p].offset for p in partitions}
        if all(o is None for o in held.values()):
            return
        tps = [TP(self.changelog, p) for p in sorted(partitions) if held[p] is not None]
        ends = await self.app.consumer.highwaters(*tps)
        for tp in tps:
            offset, end = held[tp.partition], ends.get(tp)
            if offset is not None and (end is None or offset >= end):
                log.warning(
                    "%s: the local state of partition %d is at changelog offset %d, but the "
                    "changelog ends at %s: it belongs to another changelog; rebuilding it",
                    self.table_name, tp.partition, offset, end,
                )  # fmt: skip
                self._reset(tp.partition)

    def apply_changelog_batch(
        self, batch: Iterable[Any], to_key: Callable[[Any], Any], to_value: Callable[[Any], Any]
    ) -> None:
        by_partition: dict[int, list[ChangelogRecord]] = {}
        for event in batch:
            m = event.message
            if m.key is None:
                raise TypeError(f"a changelog record without a key: {m.topic}/{m.partition}")
            by_partition.setdefault(m.partition, []).append(
                changelog_record(m.offset, m.key, m.value, m.headers)
            )
        for partition, records in by_partition.items():
            run = self._replays.get(partition)
            if run is not None:  # else not ours any more: a revoked partition's last buffer
                run.apply(records)

    async def on_recovery_completed(self, active_tps: Any, standby_tps: Any) -> None:
        for partition, run in self._replays.items():
            repairs = run.repairs()
            if run.applied or run.skipped:
                log.info(
                    "%s partition %d recovered: %d changelog records applied, %d skipped "
                    "(ahead of the committed offsets), %d keys to repair",
                    self.table_name, partition, run.applied, run.skipped, len(repairs),
                )  # fmt: skip
            if run.skipped and partition in self._lost:
                log.warning(
                    "%s partition %d: the group has no committed offset for its source topics "
                    "and there is no local state, so none of its %d changelog records is "
                    "known to be committed: the worker takes its sources from their start "
                    "(a worker that never committed; if the group's offsets were lost "
                    "instead, the whole history is processed again: DuckDB stays exact "
                    "while the sources keep it, and the counters count it again)",
                    self.table_name, partition, run.skipped,
                )  # fmt: skip
            if run.broken:
                log.error(
                    "%s partition %d: %d long values lack some of their part records in the "
                    "changelog (compaction took them: a checkpoint that never committed "
                    "overwrote them and was not repaired within the changelog's "
                    "min.compaction.lag.ms), first %r: each keeps the value before it and is "
                    "written again. Check that the changelog's min.compaction.lag.ms is at "
                    "least a day (the worker warns at start when it is shorter)",
                    self.table_name, partition, len(run.broken), run.broken[0],
                )  # fmt: skip
            if repairs:
                self.repairs.setdefault(partition, set()).update(repairs)
            if run.stray:
                self.stray_parts.setdefault(partition, {}).update(run.stray)
        self._replays.clear()
        self._lost.clear()

    def reset_state(self) -> None:
        for partition in list(self.backends):
            self._reset(partition)

    async def backup_partition(
        self, tp: Any, flush: bool = True, purge: bool = False, keep: int = 1
    ) -> None:
        pass

    def restore_backup(self, tp: Any, latest: bool = True, backup_id: int = 0) -> None:
        pass

    async def on_stop(self) -> None:
        for partition in list(self.backends):
            self._close(partition)

    # Faust's mapping interface: nothing uses it (the checkpoint reads the backends).

    def __getitem__(self, key: Any) -> Any:
        raise KeyError(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        raise NotImplementedError("memdiag's state is written by its checkpoint only")

    def __delitem__(self, key: Any) -> None:
        raise NotImplementedError("memdiag's state is written by its checkpoint only")

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def _clear(self) -> None:
        self.reset_state()


def _shown(covers: Covers) -> str:
    return ", ".join(f"{topic} {offset:,}" for topic, offset in sorted(covers.items()))


def checkpoint_stores(app: Any) -> list[CheckpointStore]:
    """The worker's memdiag stores (one per table)."""
    stores = (getattr(table, "data", None) for table in app.tables.values())
    return [store for store in stores if isinstance(store, CheckpointStore)]


def start_positions(app: Any) -> dict[tuple[str, int], int]:
    """Where the worker starts in a source partition with nothing committed, as the local
    state covers it (:func:`memdiag.streams.store.assess`): the runner takes records there,
    not at the log start. Set when the partition is assigned, before any record flows."""
    positions: dict[tuple[str, int], int] = {}
    for store in checkpoint_stores(app):
        positions.update(store.positions)
    return positions
