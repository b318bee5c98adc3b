"""The one checkpoint: the state exactly as of the committed offsets, for every stage.

Between two checkpoints the stages read and write their tables through a :class:`StateView`:
reads see the checkpoint's own writes first, then the committed values (the table's
backends, :mod:`memdiag.streams.store`); writes stay in the checkpoint. The stages know
nothing of offsets or crashes: they are functions of (state, messages) -> (writes, outputs).
(A stage may hold what it changed in memory across batches: the runner settles it into the
checkpoint's writes before each commit, and a rollback resets it.)

:meth:`Checkpoint.commit` makes a checkpoint durable, in this order (Quix Streams'
``Checkpoint.commit`` is the model):

1. the changelog: the last value of each key written (and each key to repair), each record
   headed by the source offsets it covers (:data:`memdiag.streams.store.OFFSETS_HEADER`); a
   value longer than the transport's record limit in pieces
   (:func:`memdiag.streams.store.pieces`);
2. wait until the broker has every output the checkpoint sent and every changelog record;
3. commit the source offsets, all of them in one request;
4. only then write the values into the backends, with the changelog offset they reach.

A failure before 3 commits nothing: the checkpoint's writes are dropped, the stages' decoded
objects forgotten, and the worker takes its records again from the committed offsets (the
runner's job). Its changelog records may be in the log already: they are skipped by recovery
(their offsets are ahead of the commit), and their keys are repaired by the next checkpoint,
which writes each one's committed value again. A commit whose outcome is unknown (the request
timed out) is settled by asking the broker for the committed offsets. A crash anywhere leaves
the changelog and the commit in one of these same states, and recovery reads them the same
way. So the state after any failure is the state as of the committed offsets, and the
records after them are processed again, producing the same outputs: the sink's upserts make
that exactly-once in DuckDB.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import orjson

from memdiag.streams.store import OFFSETS_HEADER, Backend, part_count, pieces

log = logging.getLogger("memdiag.worker")


class TP(NamedTuple):
    """A source partition (equal to, and hashed as, Faust's and aiokafka's own)."""

    topic: str
    partition: int


class Table(Protocol):
    """A table the checkpoint writes (:class:`memdiag.streams.tables.CheckpointStore`)."""

    changelog: str
    table_name: str
    #: per partition: the committed values
    backends: Mapping[int, Backend]
    #: per partition: keys whose changelog records may be ahead of the commit (recovery
    #: skipped them, or a failed checkpoint produced them): the next checkpoint writes their
    #: committed values again
    repairs: dict[int, set[bytes]]
    #: per partition: key -> how many part records a checkpoint that never committed may have
    #: left in the changelog for it; the key's next write tombstones those it does not
    #: overwrite
    stray_parts: dict[int, dict[bytes, int]]

    @property
    def sources(self) -> tuple[str, ...]: ...


#: The longest state value the worker's changelog takes as one record: a longer one goes in
#: pieces (:func:`memdiag.streams.store.pieces`). Half of Kafka's default ``message.max.bytes``
#: (1 MiB), which leaves room for the headers and for a broker configured below the default.
RECORD_LIMIT = 512 * 1024


class Transport(Protocol):
    """What the checkpoint needs of Kafka (the worker's producer and consumer)."""

    #: the longest changelog value sent as one record (:data:`RECORD_LIMIT`)
    record_limit: int

    async def send(
        self, topic: str, key: bytes, value: bytes | None, partition: int,
        headers: list[tuple[str, bytes]] | None,
    ) -> asyncio.Future[Any]:  # fmt: skip
        """Queue a record; the future resolves to its metadata (``.offset``) once the
        records queued are sent (:meth:`flush`)."""
        ...

    async def flush(self) -> list[asyncio.Future[Any]]:
        """Send every record queued; the delivery futures of what was sent since the last
        flush."""
        ...

    def discard(self) -> None:
        """Forget the records queued and not sent (a send failed, or a checkpoint was given
        up): their futures are cancelled."""
        ...

    async def commit(self, offsets: Mapping[TP, int]) -> None:
        """Commit the offsets in one request; :class:`CommitRefused` when the broker
        refused it (nothing was committed), any other exception when the outcome is unknown."""
        ...

    async def committed(self, tps: list[TP]) -> dict[TP, int]:
        """The group's committed offsets (a partition with none is absent)."""
        ...


class CommitRefused(Exception):
    """The broker refused the commit: nothing of it was committed (a rebalance began)."""


class CheckpointFailed(Exception):
    """The checkpoint did not commit; its state was dropped."""


#: Called between the steps of a commit (``part`` after each part record of a long value,
#: ``changelog`` after each record, ``delivered``, ``committed``, ``written``) with the number
#: of changelog records: tests kill the worker there.
Fault = Callable[[str, int], None]


@dataclass(slots=True)
class ChangelogWrite:
    table: Table
    partition: int
    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]] | None
    #: the part records of the key's committed value (one longer than the record limit),
    #: which this write must clear if it has fewer
    split_before: int = 0


@dataclass
class Checkpoint:
    """One checkpoint's state writes, processed offsets and deliveries (see the module
    docstring). A new one starts when the last one committed or failed."""

    tables: Mapping[str, Table]
    #: per source partition, the offset after the last record processed (what to commit)
    offsets: dict[TP, int] = field(default_factory=dict)
    #: per (table name, partition): key -> value (None: delete), the last write of each
    writes: dict[tuple[str, int], dict[bytes, bytes | None]] = field(default_factory=dict)
    #: the outputs' delivery futures
    deliveries: list[asyncio.Future[Any]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    #: what the commit produced to the changelog, once it started
    produced: list[ChangelogWrite] = field(default_factory=list)
    #: the repairs the commit included: table name -> partition -> keys
    repaired: dict[str, dict[int, set[bytes]]] = field(default_factory=dict)
    #: the transport's record limit, once the commit started
    record_limit: int = RECORD_LIMIT
    #: the bytes of the state values written so far (each write counted, a key written
    #: twice twice): the runner commits early past MEMDIAG_COMMIT_BYTES
    pending_bytes: int = 0
    #: the partitions in :attr:`offsets` only to commit their committed offsets again (the
    #: repairs' guard): a commit of those lands or not without telling
    recommitted: set[TP] = field(default_factory=set)

    def view(self, table: str) -> StateView:
        return StateView(self, self.tables[table])

    def processed(self, tp: TP, next_offset: int) -> None:
        self.offsets[tp] = next_offset

    def empty(self) -> bool:
        """Nothing to commit: no record processed, no write, no output. (Repairs go with a
        checkpoint that commits their partition's offsets: the runner puts every partition
        with repairs due in each checkpoint, at its committed offsets if no record of it came,
        so a quiet partition's repairs wait for no traffic.)"""
        return not self.offsets and not self.writes and not self.deliveries

    def age(self) -> float:
        return time.monotonic() - self.started

    # -- the commit ---------------------------------------------------------------------------

    def changelog(self, limit: int = RECORD_LIMIT) -> list[ChangelogWrite]:
        """Step 1's records: each written key's last value, and the keys to repair (their
        committed value again), headed by the source offsets of their partition; each with
        the part records its committed value has under the record ``limit``."""
        out: list[ChangelogWrite] = []
        for name, table in self.tables.items():
            sources = set(table.sources)
            # repairs only where this checkpoint commits offsets (the runner adds each partition
            # with repairs due, at its committed offsets): then every record it writes to that
            # changelog partition names offsets the group commits, and the commit checks that
            # the worker still owns the partition
            moving = {p for (topic, p) in self.offsets if topic in sources}
            repairs = {p: set(keys) for p, keys in table.repairs.items() if keys and p in moving}
            self.repaired[name] = repairs
            partitions = {p for (n, p) in self.writes if n == name} | set(repairs)
            for partition in sorted(partitions):
                writes = self.writes.setdefault((name, partition), {})
                backend = table.backends.get(partition)
                committed: dict[bytes, bytes | None] = {}  # the repairs' values, read once
                for key in sorted(repairs.get(partition, ())):
                    if key not in writes and backend is not None:
                        writes[key] = committed[key] = backend.get(key)
                covers = {
                    topic: offset - 1
                    for (topic, p), offset in self.offsets.items()
                    if p == partition and topic in sources
                }
                headers = [(OFFSETS_HEADER, orjson.dumps(covers))] if covers else None
                stray = table.stray_parts.get(partition) or {}
                for key, value in writes.items():
                    if key in committed:
                        old = committed[key]
                    else:
                        old = None if backend is None else backend.get(key)
                    before = 0 if old is None else part_count(len(old), limit)
                    before = max(before, stray.get(key, 0))
                    out.append(ChangelogWrite(table, partition, key, value, headers, before))
        return out

    async def commit(self, transport: Transport, fault: Fault | None = None) -> None:
        """Steps 1 to 4; :class:`CheckpointFailed` if it committed nothing. (The transport
        bounds the time each call may take; this awaits nothing else, so a transport that
        never waits makes it run to the end at once, as the tests drive it.)"""
        self.record_limit = limit = transport.record_limit
        self.produced = records = self.changelog(limit)
        # per write, the future of its value's own record (the last of its pieces)
        futures: list[asyncio.Future[Any]] = []
        parts: list[asyncio.Future[Any]] = []
        try:
            for n, rec in enumerate(records, 1):
                records_of = pieces(rec.key, rec.value, rec.headers, limit, rec.split_before)
                for key, value, headers in records_of[:-1]:
                    parts.append(await transport.send(
                        rec.table.changelog, key, value, rec.partition, headers
                    ))  # fmt: skip
                    if fault is not None:
                        fault("part", n)
                key, value, headers = records_of[-1]
                futures.append(await transport.send(
                    rec.table.changelog, key, value, rec.partition, headers
                ))  # fmt: skip
                if fault is not None:
                    fault("changelog", n)
            sent = await transport.flush()
            await delivered([*self.deliveries, *sent, *parts, *futures])
        except Exception as exc:  # a delivery failed, or the broker is away: commit nothing
            raise CheckpointFailed(f"its outputs were not all delivered: {exc!r}") from exc
        if fault is not None:
            fault("delivered", len(records))
        if self.offsets:
            await self._commit_offsets(transport)
        if fault is not None:
            fault("committed", len(records))
        self._write_backends(records, futures)
        if fault is not None:
            fault("written", len(records))

    async def _commit_offsets(self, transport: Transport) -> None:
        try:
            await transport.commit(self.offsets)
            return
        except CommitRefused as exc:
            raise CheckpointFailed(f"the broker refused the commit: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - the outcome is unknown: ask
            log.warning("a commit's outcome is unknown (%r): asking the broker", exc)
        tps = list(self.offsets)
        # raises if the broker cannot say: the worker stops, and recovery decides
        committed = await transport.committed(tps)
        # a partition committed again at its committed offsets reads as landed either way:
        # only the ones this commit moves say whether it landed
        moved = [tp for tp in tps if tp not in self.recommitted]
        landed = [tp for tp in moved if committed.get(tp) == self.offsets[tp]]
        if moved and len(landed) == len(moved):
            return
        if landed:
            # a commit that landed in part: no rollback in this process can make the state
            # agree with it. On the restart, recovery applies the changelog records the landed
            # commits cover and skips (and repairs) the others: per partition, the state is
            # then the committed one
            raise RuntimeError(
                f"a commit landed for {len(landed)} of {len(moved)} partitions; stopping so "
                "that recovery brings each partition's state to its committed offsets"
            )
        raise CheckpointFailed("the commit did not land")

    def _write_backends(
        self, records: list[ChangelogWrite], futures: list[asyncio.Future[Any]]
    ) -> None:
        """Step 4: the committed values into the backends, each partition with the offset
        of its last changelog record."""
        by_partition: dict[tuple[str, int], tuple[Table, dict[bytes, bytes | None], int]] = {}
        for rec, future in zip(records, futures, strict=True):
            key = (rec.table.table_name, rec.partition)
            offset = future.result().offset
            known = by_partition.get(key)
            if known is None:
                by_partition[key] = (rec.table, {rec.key: rec.value}, offset)
            else:
                known[1][rec.key] = rec.value
                by_partition[key] = (known[0], known[1], max(known[2], offset))
        for (_, partition), (table, writes, offset) in by_partition.items():
            backend = table.backends.get(partition)
            if backend is not None:  # else revoked meanwhile: its next owner recovers it
                backend.write(writes, offset)
        for name, repairs in self.repaired.items():
            table = self.tables[name]
            for partition, keys in repairs.items():
                left = table.repairs.get(partition)
                if left is not None:
                    left -= keys
        for rec in records:  # their stray parts are tombstoned now
            if rec.split_before:
                rec.table.stray_parts.get(rec.partition, {}).pop(rec.key, None)

    def failed(self) -> None:
        """After a failed commit: every key the commit produced may be in the changelog
        without its commit; the next checkpoint writes its committed value again (and
        tombstones the parts a long value of it may have left there)."""
        for rec in self.produced:
            rec.table.repairs.setdefault(rec.partition, set()).add(rec.key)
            parts = 0 if rec.value is None else part_count(len(rec.value), self.record_limit)
            if parts:
                stray = rec.table.stray_parts.setdefault(rec.partition, {})
                stray[rec.key] = max(stray.get(rec.key, 0), parts)


class StateView:
    """A table as a stage sees it in a checkpoint (the ``StateStore`` of
    :mod:`memdiag.contract.envelope`): the checkpoint's writes over the committed values."""

    __slots__ = ("_checkpoint", "_writes", "_table", "_name", "_backends")

    def __init__(self, checkpoint: Checkpoint, table: Table):
        self._checkpoint = checkpoint
        self._writes = checkpoint.writes
        self._table = table
        self._name = table.table_name
        self._backends = table.backends

    def get(self, key: str, partition: int) -> bytes | None:
        k = key.encode()
        writes = self._writes.get((self._name, partition))
        if writes is not None and k in writes:
            return writes[k]
        backend = self._backends.get(partition)
        return None if backend is None else backend.get(k)

    def put(self, key: str, value: bytes, partition: int) -> None:
        self._partition(partition)[key.encode()] = value
        self._checkpoint.pending_bytes += len(value)

    def delete(self, key: str, partition: int) -> None:
        self._partition(partition)[key.encode()] = None

    def _partition(self, partition: int) -> dict[bytes, bytes | None]:
        slot = (self._name, partition)
        writes = self._writes.get(slot)
        if writes is None:
            writes = self._writes[slot] = {}
        return writes

    def items(self, prefix: str, partition: int) -> Iterator[tuple[str, bytes]]:
        """The keys starting with ``prefix`` (in no particular order) and their values."""
        p = prefix.encode()
        writes = self._writes.get((self._name, partition)) or {}
        for key, value in writes.items():
            if key.startswith(p) and value is not None:
                yield key.decode(), value
        backend = self._backends.get(partition)
        if backend is None:
            return
        for key, value in backend.items(p):
            if key not in writes:
                yield key.decode(), value


async def delivered(futures: list[asyncio.Future[Any]]) -> None:
    """Return once every one of ``futures`` (the producer's delivery futures) succeeded;
    raise as soon as one is seen failed. ``asyncio.gather`` puts a callback on each future,
    and the producer then schedules one call per record; waiting on the newest first usually
    finds the older ones done. On a failure the others' outcomes are marked seen, so the log
    shows the failure once instead of once a record."""
    try:
        for future in reversed(futures):
            if not future.done():
                await future
        for future in futures:
            future.result()
    except BaseException:
        for future in futures:
            if future.done():
                _seen(future)
            else:
                future.add_done_callback(_seen)
        raise


def _seen(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


#: How a runner waits for its stages' outputs: the futures it hands the checkpoint.
Deliveries = Callable[[], Awaitable[None]]
