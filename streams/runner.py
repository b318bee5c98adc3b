"""The worker's one runner: fetch, stages, checkpoint, commit. One per worker process.

Faust owns the consumer group, the assignment and the tables' recovery. The stage topics'
records come to the runner in bulk, straight from Faust's fetch loop
(:func:`memdiag.streams.compat.deliver_in_bulk`): each fetched run of one partition's records
at once, never a Faust message or event per record. The runner then:

1. admits them in offset order, from the committed offsets (:class:`Progress`: after a
   rebalance the fetcher may deliver from a stale position, or drop records it had fetched);
2. hands each stage its messages (:mod:`memdiag.streams.wiring` says which topics feed which
   stage), with its table as the checkpoint shows it;
3. sends each stage's outputs (the checkpoint waits for their delivery);
4. commits the checkpoint every ``MEMDIAG_COMMIT_INTERVAL_SECONDS``, once its input pauses
   for ``MEMDIAG_COMMIT_IDLE_SECONDS``, or once it holds ``MEMDIAG_COMMIT_BYTES``
   (:mod:`memdiag.streams.checkpoint`: changelog, deliveries, one OffsetCommit, then the
   local state).

A checkpoint that fails (a stage's write of the state it held, a delivery, the commit) is
dropped with the stages' decoded and held state, and the runner starts again from the
committed offsets (after a failed write, one record at a time, as below). A stage that
raises on a batch does the same, then takes that batch's records one at a time, each in a
checkpoint of its own (its state written there too), until it finds the one that raises:
that one is dead-lettered, with the reason, and the rest go on. There is one commit path and
one revocation path, for every stage.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from memdiag.contract.envelope import InMessage, Output, StateStore
from memdiag.procs import settles
from memdiag.streams.checkpoint import TP, Checkpoint, CheckpointFailed, Table, Transport
from memdiag.streams.progress import AHEAD, FOREIGN, Progress
from memdiag.streams.sender import Sender

log = logging.getLogger("memdiag.worker")


class Stage(Protocol):
    """A stage's logic: a function of its state and a batch of messages."""

    def process(self, msgs: list[InMessage], store: StateStore) -> Output: ...

    #: about how many bytes of state the stage holds unwritten (it may keep what it changed
    #: in memory across batches, until :meth:`settle`): counted toward MEMDIAG_COMMIT_BYTES
    held_bytes: int

    def settle(self, store: StateStore) -> None:
        """Write what the stage holds unwritten: called before each commit, with the
        checkpoint's store. If it raises, the checkpoint is rolled back."""
        ...

    def reset(self) -> None:
        """Forget every decoded object and in-memory index: the state was rolled back to
        the committed one, or partitions moved."""
        ...


@dataclass
class StageSpec:
    name: str
    topics: tuple[str, ...]
    stage: Stage
    #: the table the stage keeps its state in (None: stateless)
    table: str | None
    #: the output for a message the stage raised on (a dead letter saying so)
    on_failure: Callable[[InMessage, BaseException], Output]
    #: the most input bytes the stage takes in one call (None: a whole batch, up to the
    #: runner's MAX_BATCH_BYTES): a batch is cut into pieces of about this much, each
    #: processed and its outputs sent before the next, so that what a stage makes of one
    #: batch is never all in memory at once (:func:`in_pieces`)
    piece_bytes: int | None = None


class Kafka(Transport, Protocol):
    """The consumer calls the runner needs besides the checkpoint's (the worker's is
    :class:`memdiag.streams.compat.FaustKafka`)."""

    def generation(self) -> int: ...

    def flowing(self) -> bool: ...

    def assignment(self) -> set[Any]: ...

    async def bases(self, tps: list[Any]) -> dict[Any, int]: ...

    async def seek(self, offsets: Mapping[Any, int]) -> None: ...

    async def first_offset(self, tp: Any, offset: int) -> int | None: ...


@dataclass
class Stopped:
    """Where the runner stands at a stop: what its last commit left uncommitted."""

    #: everything taken is committed
    committed: bool
    #: the broker did not answer (or the commit was not done by the deadline): nothing more
    #: was committed, the checkpoint in flight was abandoned
    broker_gone: bool
    #: records taken since the last commit, not committed (they come again on the next start)
    records: int
    partitions: int
    #: batches of outputs the uncommitted checkpoint sent (delivered or not: sent again with
    #: its records)
    outputs: int
    #: checkpoints committed by this run
    checkpoints: int

    def uncommitted(self) -> str:
        """The uncommitted part in words (empty when everything is committed)."""
        if self.committed:
            return ""
        return (
            f"{self.records:,} records taken on {self.partitions} partitions since its last "
            f"commit, and their {self.outputs:,} batches of outputs, are not committed; its "
            f"state and offsets stay as of that commit ({self.checkpoints:,} checkpoints "
            "committed by this run). Those records are processed again on the next start, "
            "and their rows are upserts: DuckDB keeps each once."
        )


@dataclass
class Hole:
    """A partition waiting for a record the fetcher skipped: where, and how often sought."""

    offset: int
    sought_at: float
    seeks: int = 1


@dataclass
class Inbox:
    """Fetched runs waiting for the runner: (generation, tp, records)."""

    limit: int
    runs: deque[tuple[int, Any, list[Any]]] = field(default_factory=deque)
    size: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    room: asyncio.Event = field(default_factory=asyncio.Event)

    def put(self, generation: int, tp: Any, records: list[Any]) -> None:
        self.runs.append((generation, tp, records))
        self.size += len(records)
        self.arrived.set()
        if self.size >= self.limit:
            self.room.clear()

    def take(self, most: int, most_bytes: int) -> list[tuple[int, Any, list[Any]]]:
        """The oldest runs, up to ``most`` records and about ``most_bytes`` of their values (a
        run is cut where either is reached; its rest stays first in line). At least one record
        is taken, however long."""
        out = []
        taken = size = 0
        while self.runs and taken < most and size < most_bytes:
            generation, tp, records = self.runs.popleft()
            cut = min(len(records), most - taken)
            for i in range(cut):
                size += len(records[i].value or b"")
                if size >= most_bytes:
                    cut = i + 1
                    break
            if cut < len(records):
                self.runs.appendleft((generation, tp, records[cut:]))
                records = records[:cut]
            out.append((generation, tp, records))
            taken += cut
        self.size -= taken
        if not self.runs:
            self.arrived.clear()
        if self.size < self.limit:
            self.room.set()
        return out

    def clear(self) -> None:
        self.runs.clear()
        self.size = 0
        self.arrived.clear()
        self.room.set()


class Runner:
    """See the module docstring."""

    #: Records handed to the stages at once, at most: what one batch's outputs hold in memory
    #: until they are sent (5,000 made the worker's peak at 20,000 sessions 66 MB higher, and
    #: its catch-up no faster)
    MAX_BATCH = 1000
    #: ... and about this many bytes of input: a batch's outputs grow with what its records
    #: carry (a message of 500 events, a late session's steps), not with their count
    #: (16 MiB: 1 MiB halved the span stages' rate and 8 MiB cost them a third, a trace's
    #: spans then written once a batch of a few records of 200 spans; a batch of single
    #: events is bounded by its count)
    MAX_BATCH_BYTES = 16 << 20
    #: A partition with a hole is sought back at most this often (seconds): records fetched
    #: before the seek still arrive for a moment, and each of them shows the same hole.
    RESEEK_SECONDS = 0.2
    #: After this many seeks, ask the broker whether the missing records exist at all
    #: (a transactional producer's commit markers and deleted records leave real holes).
    PROBE_AFTER_SEEKS = 3
    #: A commit at revocation not settled after this long is said in the log (and waited for)
    REVOKE_WAIT_SECONDS = 10.0

    def __init__(
        self,
        kafka: Kafka,
        stages: list[StageSpec],
        tables: Mapping[str, Table],
        sender: Sender,
        commit_interval: float = 1.0,
        inbox_limit: int = 5_000,
        fault: Callable[[str, int], None] | None = None,
    ):
        self.kafka = kafka
        self.stages = stages
        self.tables = dict(tables)
        self.sender = sender
        self.commit_interval = commit_interval
        #: a checkpoint holding state values of this many bytes commits at once
        #: (MEMDIAG_COMMIT_BYTES)
        self.commit_bytes = 16 << 20
        #: a checkpoint commits once no record came for this long (MEMDIAG_COMMIT_IDLE_SECONDS;
        #: 0: only the interval and the bytes make it commit)
        self.commit_idle = 0.0
        #: whether a pause may commit: not from a failed checkpoint until one commits again
        #: (a failing commit is tried once an interval, as before the pause commits)
        self._pause_commits = True
        #: called after each checkpoint that committed (the worker gives the heap's free
        #: pages back there: :func:`memdiag.procs.heap_trimmer`); what it raises is logged
        self.after_commit: Callable[[], None] | None = None
        self.fault = fault
        self.stage_of = {topic: spec for spec in stages for topic in spec.topics}
        self.topics = frozenset(self.stage_of)
        self.inbox = Inbox(inbox_limit)
        self.inbox.room.set()
        self.progress = Progress()
        self.checkpoint = Checkpoint(self.tables)
        #: per partition, the end of the records a stage raised on: taken one at a time
        self.suspect: dict[Any, int] = {}
        self._holes: dict[Any, Hole] = {}
        self._lock = asyncio.Lock()
        self.processed = 0
        self.skipped = Counter[str]()
        self.checkpoints = 0
        self.failed_checkpoints = 0
        #: a stop's deadline (time.monotonic()), set when a signal starts the stop
        self.stop_deadline: float | None = None
        #: a stop without a deadline (the worker stopping for another reason) takes this long
        self.stop_timeout = 10.0
        #: ``answers(timeout)``: whether the broker answers within ``timeout`` (a stop whose
        #: commit waits asks it, and gives up at once when it does not)
        self.answers: Callable[[float], Awaitable[bool]] | None = None
        #: told what a stop left (the worker exits at once when the broker is gone)
        self.on_stopped: Callable[[Stopped], None] | None = None
        #: stops the worker on an error only recovery can settle, met outside the run loop
        #: (the worker's is Faust's ``app.crash``)
        self.on_fatal: Callable[[BaseException], Awaitable[None]] | None = None
        self._task: asyncio.Task[Any] | None = None

    # -- input ------------------------------------------------------------------------------

    def deliver(self, generation: int, records: Mapping[Any, list[Any]]) -> None:
        """Fetched records of the runner's topics (Faust's fetch loop calls this)."""
        for tp, run in records.items():
            if run:
                self.inbox.put(generation, tp, run)

    async def run(self) -> None:
        self._task = asyncio.current_task()
        arrived = self.inbox.arrived
        while True:
            try:
                await asyncio.wait_for(arrived.wait(), self._idle_after())
            except TimeoutError:
                async with self._lock:
                    await self._idle()
                continue
            if not self.processed and not self.skipped:
                log.info("runner: first records at %.3f", time.time())  # for benchmarks
            async with self._lock:
                await self._handle(self.inbox.take(self.MAX_BATCH, self.MAX_BATCH_BYTES))
                if self._commit_due():
                    await self._commit()

    def _commit_due(self) -> bool:
        """The interval has passed, or the checkpoint holds MEMDIAG_COMMIT_BYTES of state
        (written, or held by a stage to be written when it commits)."""
        checkpoint = self.checkpoint
        if checkpoint.age() >= self.commit_interval:
            return True
        held = sum(spec.stage.held_bytes for spec in self.stages)
        return checkpoint.pending_bytes + held >= self.commit_bytes

    def _idle_after(self) -> float:
        """How long the run loop waits for records before :meth:`_idle`: the interval's rest,
        or, once the checkpoint holds something, a pause of :attr:`commit_idle` (and at least
        a quarter of the interval since the last commit). A catch-up's last checkpoint then
        commits when its last record is done, not up to an interval later: its offsets, its
        changelog and its counters (which the counters topic's alerts read) go out at once,
        and a crash after it repeats nothing. Live traffic that pauses often commits at most
        four times an interval; after a failed checkpoint, only at the interval, until one
        commits again."""
        if self.checkpoint.empty():
            return self.commit_interval
        age = self.checkpoint.age()
        left = max(0.01, self.commit_interval - age)
        if self.commit_idle <= 0 or not self._pause_commits:
            return left
        return min(left, max(self.commit_idle, self.commit_interval / 4 - age))

    async def _idle(self) -> None:
        """Nothing came for a while: commit, start a generation nothing has started yet
        (a partition Faust left past its committed offset delivers nothing to start one),
        and fetch again any hole still open."""
        self._repairs_due()
        if not self.checkpoint.empty():
            await self._commit()
        generation = self.kafka.generation()
        if self.progress.generation != generation:
            if self.kafka.flowing():
                await self._start(generation)
            return
        now = time.monotonic()
        for tp, hole in list(self._holes.items()):
            if self.progress.next.get(tp) != hole.offset:
                del self._holes[tp]  # filled
            elif now - hole.sought_at >= self.RESEEK_SECONDS:
                await self._reseek(tp, hole, now)

    async def _start(
        self, generation: int, runs: Iterable[tuple[int, Any, list[Any]]] = ()
    ) -> bool:
        """Take records from the runner's partitions' committed offsets, seeking those whose
        fetch is not there (``runs``: the batch in hand, fetched in this generation or
        before). False if another rebalance began meanwhile.

        A partition whose records of this generation so far (the batch's runs, then the
        inbox's) begin exactly at its committed offset needs no seek: the fetch reads on from
        there (:meth:`Progress.admit_run` still seeks back where a record is missing). Seeking
        it anyway made the fetcher drop what it had fetched and fetch it again: at a start or
        a rebalance with a backlog, the first fetches of every partition came twice (the
        batched benchmark's worker read 37 MB for its 17 MB of input). A fetch that begins
        before it is sought too: it may be the log's start with the committed offsets lost
        and the start taken from local state, everything up to it read only to be skipped.
        This relies on the inbox holding only what was fetched since the last seek: every
        stop of the progress (a rollback, a revocation) clears it."""
        tps = sorted(
            (tp for tp in self.kafka.assignment() if tp.topic in self.topics),
            key=lambda tp: (tp.topic, tp.partition),
        )
        first: dict[Any, int] = {}
        for gen, tp, records in itertools.chain(runs, self.inbox.runs):
            if gen == generation and records:
                first.setdefault(tp, records[0].offset)
        try:
            bases = await self.kafka.bases(tps) if tps else {}
            sought = {tp: o for tp, o in bases.items() if first.get(tp) != o}
            if sought:
                await self.kafka.seek(sought)
        except Exception:  # noqa: BLE001 - a partition revoked meanwhile: try again
            log.warning("runner: could not seek to the committed offsets", exc_info=True)
            return False
        if self.kafka.generation() != generation or not self.kafka.flowing():
            return False
        self.progress.start(generation, bases)
        self._holes.clear()
        self.suspect = {tp: end for tp, end in self.suspect.items() if tp in bases}
        log.info(
            "runner: generation %d, starting at %s (%d of %d sought there, the rest fetched "
            "from there)",
            generation,
            {f"{tp.topic.rsplit('.', 1)[-1]}/{tp.partition}": o for tp, o in bases.items()},
            len(sought),
            len(bases),
        )
        return True

    # -- a batch ----------------------------------------------------------------------------

    async def _handle(self, runs: list[tuple[int, Any, list[Any]]]) -> None:
        kafka = self.kafka
        generation = kafka.generation()
        if not kafka.flowing():
            return  # a rebalance is under way: these records are fetched again after it
        if self.progress.generation != generation and not await self._start(generation, runs):
            return
        progress = self.progress
        #: per stage: its messages, and per partition the offset after its last one
        batches: dict[str, tuple[list[InMessage], dict[Any, int]]] = {}
        careful: list[InMessage] = []
        ahead = set()
        for gen, tp, records in runs:
            if gen != generation:
                self.skipped["stale"] += len(records)
                continue  # fetched before the rebalance: fetched again after it
            lo, hi, verdict = progress.admit_run(tp, records)
            if verdict == FOREIGN:
                self.skipped["foreign"] += len(records)
                continue
            self.skipped["behind"] += lo
            if verdict == AHEAD:
                ahead.add(tp)
                self.skipped["ahead"] += len(records) - hi
            if lo == hi:
                continue
            topic, partition = tp.topic, tp.partition
            msgs = [
                InMessage(topic, partition, r.offset, r.key, r.value, r.timestamp)
                for r in records[lo:hi]
            ]
            end = self.suspect.get(tp)
            if end is not None:
                careful += [m for m in msgs if m.offset < end]
                msgs = [m for m in msgs if m.offset >= end]
                if msgs or progress.next[tp] >= end:
                    del self.suspect[tp]
            if msgs:
                name = self.stage_of[topic].name
                batch = batches.get(name)
                if batch is None:
                    batch = batches[name] = ([], {})
                batch[0].extend(msgs)
                batch[1][tp] = msgs[-1].offset + 1
                self.processed += len(msgs)
        for tp in ahead:
            await self._seek_back(tp)
        for msg in careful:
            await self._one_at_a_time(msg)
        for spec in self.stages:
            batch = batches.get(spec.name)
            if batch is None:
                continue
            if self.progress.generation is None or not await self._process(spec, *batch):
                return

    async def _process(self, spec: StageSpec, msgs: list[InMessage], ends: dict[Any, int]) -> bool:
        cp = self.checkpoint
        store: Any = cp.view(spec.table) if spec.table is not None else None
        for piece in in_pieces(msgs, spec.piece_bytes):
            try:
                out = spec.stage.process(piece, store)
            except Exception:  # noqa: BLE001 - find the message that raises, one at a time
                # the pieces before it were sent: the batch is taken again whole (one message
                # at a time), and what they sent is sent again, as after any failed checkpoint
                log.warning("%s: a batch of %d raised; taking it again one message at a time",
                            spec.name, len(msgs), exc_info=True)  # fmt: skip
                for tp, end in ends.items():
                    self.suspect[tp] = max(self.suspect.get(tp, 0), end)
                self._drop("a stage raised")
                return False
            await self._send(out)
            del out  # sent: not held while the next piece is processed
            # a turn of the loop: the producer's requests and their answers are handled in
            # it, and a batch of many pieces would otherwise hold them all until it ends
            await asyncio.sleep(0)
        cp.offsets.update(ends)
        return True

    async def _one_at_a_time(self, msg: InMessage) -> None:
        """A record of a batch a stage raised on: alone in a checkpoint, so that if it
        raises again only it is dropped (and dead-lettered)."""
        if not self.checkpoint.empty():
            await self._commit()
        if self.progress.generation is None:
            return  # that commit failed: everything is taken again
        spec = self.stage_of[msg.topic]
        store: Any = self.checkpoint.view(spec.table) if spec.table is not None else None
        try:
            out = spec.stage.process([msg], store)
            if store is not None:  # its state written here, so that a write that fails is
                spec.stage.settle(store)  # this record's too
        except Exception as exc:  # noqa: BLE001 - never let one message stop the worker
            log.exception("%s failed on %s/%d/%d; dead-lettered", spec.name, msg.topic,
                          msg.partition, msg.offset)  # fmt: skip
            self.checkpoint = Checkpoint(self.tables)
            spec.stage.reset()
            out = spec.on_failure(msg, exc)
        await self._send(out)
        self.checkpoint.offsets[_tp(msg)] = msg.offset + 1
        del store, out  # the checkpoint is freed once it commits (the call after it trims)
        await self._commit()

    async def _send(self, out: Output) -> None:
        self.checkpoint.deliveries += await self.sender.send(out)

    # -- the checkpoint ---------------------------------------------------------------------

    def _repairs_due(self) -> None:
        """Put every partition with keys to repair in the checkpoint, at its committed offsets
        (re-committed as they are), so that this checkpoint writes the repairs whether or not
        records of that partition came (#38). Compaction waits only for time: a key whose
        latest changelog record is uncovered (a failed checkpoint's) could lose its
        committed record to the cleaner, and a rebuild would then skip the uncovered one.
        Re-committing the offsets keeps the checkpoint's guard: the commit is the group's
        generation check, and the records are headed by offsets the group has committed."""
        progress, cp = self.progress, self.checkpoint
        if progress.generation is None or progress.generation != self.kafka.generation():
            return
        for table in self.tables.values():
            for partition, keys in table.repairs.items():
                if not keys or partition not in table.backends:
                    continue
                for topic in table.sources:
                    tp = TP(topic, partition)
                    done = progress.committed.get(tp)
                    if done is not None and tp not in cp.offsets:
                        cp.offsets[tp] = done
                        cp.recommitted.add(tp)

    async def _commit(self) -> None:
        self._repairs_due()
        cp = self.checkpoint
        if not self._settle(cp):
            return
        if cp.empty():
            cp.started = time.monotonic()
            return
        cp.deliveries += await self.sender.flush_counters()
        try:
            await cp.commit(self.kafka, self.fault)
        except CheckpointFailed as exc:
            log.warning("runner: a checkpoint failed (%s); taking its records again", exc)
            cp.failed()
            self._drop(str(exc))
            return
        self.checkpoints += 1
        self._pause_commits = True
        self.sender.committed()
        self.progress.committed_to(cp.offsets)
        self.checkpoint = Checkpoint(self.tables)
        del cp  # its values and records are freed before the call (the heap's trim)
        if self.after_commit is not None:
            try:
                self.after_commit()
            except Exception:  # noqa: BLE001 - the commit stands whatever its aftercare does
                log.exception("runner: the call after a commit raised")

    def _settle(self, cp: Checkpoint) -> bool:
        """Have every stage write what it holds into the checkpoint. False if one raised:
        the checkpoint is rolled back, and its records are taken again one at a time (each
        settled in its own checkpoint), so a write that always fails is dead-lettered with
        its record rather than rolled back again at every commit."""
        try:
            for spec in self.stages:
                if spec.table is not None:
                    spec.stage.settle(cp.view(spec.table))
        except Exception as exc:  # noqa: BLE001 - what a stage held is not in the checkpoint
            log.error("runner: a stage could not write the state it held (%r); taking the "
                      "checkpoint's records again, one at a time", exc, exc_info=True)  # fmt: skip
            for tp, end in cp.offsets.items():
                self.suspect[tp] = max(self.suspect.get(tp, 0), end)
            self._drop(f"a stage could not write the state it held: {exc!r}")
            return False
        return True

    def _drop(self, why: str) -> None:
        """Back to the committed state: the checkpoint's writes and the stages' decoded
        objects go; records are taken again from the committed offsets (a new start)."""
        self.failed_checkpoints += 1
        self._pause_commits = False
        self.checkpoint = Checkpoint(self.tables)
        for spec in self.stages:
            spec.stage.reset()
        self.progress.stop()
        self.inbox.clear()
        self.kafka.discard()  # records a failed send left unsent: never sent now
        self.sender.discard()  # and the counter increments since the last checkpoint
        log.info("runner: state rolled back to the last commit (%s)", why)

    async def on_revoked(self) -> None:
        """Partitions are being revoked: commit what was processed while the generation
        still holds, so the next owner repeats less. The commit is waited for however long
        it takes: a commit is never abandoned. aiokafka retries a commit with the generation
        current when it retries, so one left running could land after the rejoin, over the
        offsets the next owner (this worker, or another) already read. A slow one is said in
        the log every :attr:`REVOKE_WAIT_SECONDS`. Only a stop whose deadline passed gives up
        on it, as a kill would (the worker then exits, and recovery decides)."""
        async with self._lock:
            commit = asyncio.ensure_future(self._commit())
            waited = 0.0
            while True:
                done, _ = await asyncio.wait({commit}, timeout=self.REVOKE_WAIT_SECONDS)
                if done:
                    break
                waited += self.REVOKE_WAIT_SECONDS
                if self.stop_deadline is not None and time.monotonic() >= self.stop_deadline:
                    log.warning("runner: stopping with the revocation's commit still out")
                    break
                log.warning("runner: the commit at revocation has not returned after %.0f s; "
                            "waiting for it (a commit left running could land after the "
                            "rejoin)", waited)  # fmt: skip
            error = commit.exception() if commit.done() else None
            if error is not None:
                # not a failed checkpoint (that one _commit drops itself): a commit whose
                # outcome nobody can tell, or one that landed in part. As from the run
                # loop, the worker stops and recovery decides (a drop here would leave the
                # state behind offsets that did land)
                log.error("runner: the commit at revocation: %r; stopping the worker", error)
                if self.on_fatal is None:
                    raise error
                await self.on_fatal(error)
            elif not commit.done():  # a stop gave up on it: as a kill would leave it
                self.checkpoint.failed()
                self._drop("revoked")
            self.progress.stop()
            self.inbox.clear()
            self.kafka.discard()  # a failed send's leftovers, for partitions maybe gone now
            for spec in self.stages:
                spec.stage.reset()

    async def on_assigned(self) -> None:
        """Partitions moved: what the stages keep in memory belongs to the old assignment."""
        async with self._lock:
            # what the stages hold goes with the checkpoint's writes (or the checkpoint is
            # rolled back)
            self._settle(self.checkpoint)
            for spec in self.stages:
                spec.stage.reset()

    async def stop(self) -> Stopped:
        """Shutting down: commit what was processed, by :attr:`stop_deadline`. When the
        broker is gone (it does not answer, or the commit is not done by then), commit
        nothing more: the checkpoint in flight is abandoned between its steps, as a kill
        would leave it (its outputs are sent again with its records on the next start, its
        changelog records are skipped by recovery), and the runner takes nothing more.
        ``broker_gone`` in what it returns: the broker did not answer at the stop (the
        worker then exits at once: the rest of its stop would only wait for it)."""
        deadline = self.stop_deadline or time.monotonic() + self.stop_timeout
        commit = asyncio.ensure_future(self._final_commit())
        gone = not await settles(commit, deadline, self.answers)
        if commit.done() and not commit.cancelled() and commit.exception() is not None:
            # read, and said as it is (a producer that refused a batch raises here)
            log.error("runner: the commit at the stop raised: %r", commit.exception())
        if gone:
            commit.cancel()
            if self._task is not None and not self._task.done():
                self._task.cancel()  # its commit in flight: abandoned, never completed
        elif self.answers is not None:
            # committed; what follows (Faust's producer flush, leaving the group) waits for
            # the broker, so say whether it is there
            gone = not await self.answers(max(0.1, deadline - time.monotonic()))
        stopped = self.where(broker_gone=gone)
        if self.on_stopped is not None:
            self.on_stopped(stopped)
        return stopped

    async def _final_commit(self) -> None:
        async with self._lock:
            await self._commit()

    def where(self, broker_gone: bool = False) -> Stopped:
        """What is uncommitted now: the records taken since the last commit (admitted in
        offset order from the committed offsets, so the difference counts them) and the
        outputs of the checkpoint in flight."""
        progress = self.progress
        behind = {
            tp: n
            for tp, n in (
                (tp, nxt - progress.committed.get(tp, nxt)) for tp, nxt in progress.next.items()
            )
            if n > 0
        }
        records = sum(behind.values())
        outputs = len(self.checkpoint.deliveries)
        return Stopped(
            committed=not records and self.checkpoint.empty(),
            broker_gone=broker_gone,
            records=records,
            partitions=len(behind),
            outputs=outputs,
            checkpoints=self.checkpoints,
        )

    # -- holes ------------------------------------------------------------------------------

    async def _seek_back(self, tp: Any) -> None:
        """A record is missing before the ones that came: fetch again from the missing one."""
        expected = self.progress.next[tp]
        now = time.monotonic()
        hole = self._holes.get(tp)
        if hole is None or hole.offset != expected:
            self._holes[tp] = Hole(expected, now)
            log.info("runner: %s/%d has a hole at %d: fetching again from it", tp.topic,
                     tp.partition, expected)  # fmt: skip
            await self._seek_quietly(tp, expected)
        elif now - hole.sought_at >= self.RESEEK_SECONDS:
            await self._reseek(tp, hole, now)

    async def _reseek(self, tp: Any, hole: Hole, now: float) -> None:
        hole.seeks += 1
        hole.sought_at = now
        if hole.seeks % self.PROBE_AFTER_SEEKS == 0:
            try:
                first = await self.kafka.first_offset(tp, hole.offset)
            except Exception:  # noqa: BLE001 - no answer: keep fetching
                log.info("runner: probe of %s/%d failed", tp.topic, tp.partition, exc_info=True)
                first = None
            if first is not None and first > hole.offset:
                log.warning(
                    "runner: %s/%d has no records %d..%d (transaction markers or deleted "
                    "records): going on from %d",
                    tp.topic, tp.partition, hole.offset, first - 1, first,
                )  # fmt: skip
                self.progress.skip_to(tp, first)
                self.checkpoint.offsets[tp] = first
                self._holes.pop(tp, None)
                await self._seek_quietly(tp, first)
                return
        await self._seek_quietly(tp, hole.offset)

    async def _seek_quietly(self, tp: Any, offset: int) -> None:
        try:
            await self.kafka.seek({tp: offset})
        except Exception:  # noqa: BLE001 - revoked meanwhile: the next generation seeks anew
            log.info("runner: seek of %s/%d failed", tp.topic, tp.partition, exc_info=True)


def in_pieces(msgs: list[InMessage], most_bytes: int | None) -> list[list[InMessage]]:
    """``msgs`` in order, cut into runs of about ``most_bytes`` of values each (a run ends
    with the message that reaches it; each has at least one); one run if ``most_bytes`` is
    None or they are fewer bytes."""
    if most_bytes is None:
        return [msgs]
    out: list[list[InMessage]] = []
    start = size = 0
    for i, msg in enumerate(msgs):
        size += len(msg.value or b"")
        if size >= most_bytes:
            out.append(msgs[start : i + 1])
            start, size = i + 1, 0
    if start < len(msgs) or not out:
        out.append(msgs[start:])
    return out


def _tp(msg: InMessage) -> TP:
    return TP(msg.topic, msg.partition)
