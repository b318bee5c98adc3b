"""How the stateful stages run inside Faust: in batches, and committed by memdiag itself,
only up to where everything before is durable.

Faust still owns the consumer group, the assignment, the tables' changelogs and their
recovery. It no longer commits the stages' offsets: in the installed faust-streaming
(0.15.3), its commit lost events whenever partitions moved, graceful scale-in included (the
event-time issue's scaled-out runs, found with an offset trace of every batch):

- after a rebalance the recovery resumes the stream partitions *before* it seeks them to
  their committed offsets, so the fetcher first delivers from wherever it stood, past the
  records it had fetched and dropped when the rebalance began;
- ``Consumer._new_offset`` commits the first run of consecutive acked offsets without
  checking that it starts at the committed offset: the check is skipped when the committed
  offset is unknown (always, between a revocation and the seek, and for offset 0) and is
  off by one otherwise; and a jump in the offsets is recorded as a compaction gap, which
  the commit then counts as done;
- ``seek_to_committed`` does not seek a partition whose committed offset is 0 or missing.

So a record fetched before a rebalance and dropped was committed past and never processed.
:class:`BatchRunner` subscribes with Faust's acks off (Faust then never commits these
topics) and keeps a :class:`Progress` per generation: after every assignment it seeks each
of its partitions to the committed offset itself (or to the log start when none is
committed), processes records only in offset order from there (a record past a hole is put
back by seeking again; one behind is a duplicate and is skipped), and commits a partition's
offset only once everything before it is durable: the state writes (each touched key once
per batch, to the changelog partition it names: faust-streaming #497) and every output,
acknowledged by the broker. Stale records of an older generation are never processed. So a
committed offset always means "its effects are durable", whatever Faust does when.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from faust.types import TP, EventT, TopicT
from mode.utils.futures import notify

from memdiag.contract.envelope import InMessage, Output, StateStore
from memdiag.streams.compat import RAW_CHANNEL
from memdiag.streams.outputs import Sender, TableStore, delivered, in_message
from memdiag.streams.progress import AHEAD, PROCESS, Progress

log = logging.getLogger("memdiag.worker")


class Stage(Protocol):
    """A stage's logic. It may also have ``one_batch()``, a context the runner holds around
    the ``process`` calls of a batch it retries a message at a time."""

    def process(self, msgs: list[InMessage], store: StateStore) -> Output: ...


class FaustOffsets:
    """The consumer calls :class:`BatchRunner` needs, in one place. faust-streaming's aiokafka
    driver runs its consumer in a thread of its own; ``committed`` has no Faust wrapper, so
    it goes through the thread like Faust's own calls do."""

    def __init__(self, app: faust.App):
        self.app = app
        self._probe: AIOKafkaConsumer | None = None

    async def bases(self, tps: list[TP]) -> dict[TP, int]:
        """Each partition's committed offset, or its log start if none is committed (or if
        retention deleted the records since)."""
        consumer: Any = self.app.consumer
        thread = consumer._thread
        client = thread._ensure_consumer()
        earliest = await consumer.earliest_offsets(*tps)
        atps = [TopicPartition(tp.topic, tp.partition) for tp in tps]
        # one OffsetFetch for all of them (aiokafka's ``committed`` asks per partition: a
        # round trip each, which delayed every generation's first record)
        found = await thread.call_thread(client._coordinator.fetch_committed_offsets, atps)
        bases: dict[TP, int] = {}
        for tp, atp in zip(tps, atps, strict=True):
            meta = found.get(atp)
            committed = None if meta is None or meta.offset < 0 else meta.offset
            start = earliest.get(tp) or 0
            bases[tp] = start if committed is None or committed < start else committed
        return bases

    async def seek(self, offsets: Mapping[TP, int]) -> None:
        await self.app.consumer.seek_wait(offsets)

    def assignment(self) -> set[TP]:
        return set(self.app.consumer.assignment())

    async def commit(self, offsets: Mapping[TP, int]) -> bool:
        return bool(await self.app.consumer._commit(offsets))  # type: ignore[attr-defined]

    async def first_offset(self, tp: TP, offset: int) -> int | None:
        """The offset of the first record at or after ``offset`` in the log, asked of the
        broker directly (outside the group): a hole the fetcher keeps skipping is real when
        this is past it. None: the log ends before ``offset``, or no answer in time."""
        if self._probe is None:
            from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

            servers = [f"{u.host}:{u.port}" for u in self.app.conf.broker]
            # the worker's own security settings (MEMDIAG_KAFKA_*, as Faust has them)
            auth = credentials_to_aiokafka_auth(
                self.app.conf.broker_credentials, self.app.conf.ssl_context
            )
            self._probe = AIOKafkaConsumer(
                bootstrap_servers=servers, group_id=None, enable_auto_commit=False, **auth
            )
            await self._probe.start()
        probe = self._probe
        atp = TopicPartition(tp.topic, tp.partition)
        probe.assign([atp])
        probe.seek(atp, offset)
        records = await probe.getmany(atp, timeout_ms=2000, max_records=1)
        got = records.get(atp)
        if got:
            return int(got[0].offset)
        end = (await probe.end_offsets([atp]))[atp]
        return int(end) if end > offset else None

    async def close(self) -> None:
        if self._probe is not None:
            await self._probe.stop()
            self._probe = None


@dataclass
class Hole:
    """A partition waiting for a record the fetcher skipped: where, and how often sought."""

    offset: int
    sought_at: float
    seeks: int = 1


class BatchRunner:
    """Runs one stage over its topics; see the module docstring."""

    #: Batches whose outputs may be in flight at once (the next one is processed meanwhile).
    MAX_IN_FLIGHT = 4
    #: A partition with a hole is sought back at most this often (seconds): records fetched
    #: before the seek still arrive for a moment, and each of them shows the same hole.
    RESEEK_SECONDS = 0.2
    #: A commit that has not returned by then is given up (it may still land): the next
    #: batches wait for their commit, and the group coordinator may hold one through a
    #: rebalance.
    COMMIT_TIMEOUT_SECONDS = 10.0
    #: A batch whose outputs the broker has not acknowledged by then is logged (and waited for).
    SLOW_DELIVERY_SECONDS = 30.0
    #: After this many seeks, ask the broker whether the missing records exist at all
    #: (a transactional producer's commit markers and deleted records leave real holes).
    PROBE_AFTER_SEEKS = 3

    def __init__(
        self,
        app: faust.App,
        name: str,
        topics: list[TopicT],
        stage: Stage,
        store: TableStore | None,
        sender: Sender,
        on_failure: Callable[[InMessage, BaseException], Output],
        max_batch: int = 2000,
        linger: float = 0.005,
        commit_interval: float = 1.0,
    ):
        self.app = app
        self.name = name
        self.stage = stage
        self.store = store
        self.sender = sender
        self.on_failure = on_failure
        self.max_batch = max_batch
        self.linger = linger
        self.commit_interval = commit_interval
        self.topic_names = frozenset(t.get_topic_name() for t in topics)
        self.channel = app.topic(
            *sorted(self.topic_names),
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            acks=False,  # Faust never commits these topics: the runner does
        ).clone_using_queue(
            app.FlowControlQueue(maxsize=app.conf.stream_buffer_maxsize, clear_on_resume=True)
        )
        # raw bytes, read by this runner alone: delivered without Faust's decoding (compat)
        setattr(self.channel, RAW_CHANNEL, True)
        # a channel over topics, added as Faust adds its own changelog readers
        app.topics.add(self.channel)  # type: ignore[arg-type]
        self.offsets = FaustOffsets(app)
        self.progress = Progress()
        self._holes: dict[TP, Hole] = {}
        self._in_flight: deque[asyncio.Future[None]] = deque()
        self._last_commit = 0.0
        self.processed = 0
        self.skipped = Counter[str]()

    async def run(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # a delivery failed or the consumer broke: nothing after the last commit is
            # lost, but this process must not go on as if it had been sent
            log.exception("%s: stopping the worker", self.name)
            await self.app.crash(exc)
            raise

    async def _run(self) -> None:
        queue = self.channel.queue
        while True:
            try:
                first = await asyncio.wait_for(queue.get(), self._idle_after())
            except TimeoutError:
                await self._idle()
                continue
            if not self.processed and not self.skipped:
                log.info("%s: first records at %.3f", self.name, time.time())  # for benchmarks
            batch: list[EventT] = [first]
            self._drain(queue, batch)
            if len(batch) < self.max_batch and self.linger:
                await asyncio.sleep(self.linger)  # let a burst of single events gather
                self._drain(queue, batch)
            await self._handle(batch)

    def _idle_after(self) -> float:
        """How long to wait for a record before :meth:`_idle`: when the commit is due, if
        anything awaits one (so the last records of a burst are committed one interval
        after the commit before, as while records flow), else a commit interval."""
        progress = self.progress
        if self._in_flight or progress.durable != progress.committed:
            due = self._last_commit + self.commit_interval - time.monotonic()
            return max(due, 0.05)
        return self.commit_interval

    async def _idle(self) -> None:
        """Nothing came for a while: commit what the last batches made durable, start a new
        generation that no record has started yet, and fetch again any hole still open (no
        record behind it may come to show it)."""
        if self._in_flight and not self._in_flight[-1].done():
            return
        await self.wait_idle()
        generation = self.app.consumer_generation_id
        if self.progress.generation != generation:
            # Seek to the committed offsets now rather than at the first record: a partition
            # Faust left positioned past them delivers no record to start with (its recovery
            # does not seek a partition whose committed offset is 0, as after a rewind).
            if self.app.flow_control.is_active():
                await self._start_generation(generation)
            return
        now = time.monotonic()
        for tp, hole in list(self._holes.items()):
            if self.progress.next.get(tp) != hole.offset:
                del self._holes[tp]  # filled
            elif now - hole.sought_at >= self.RESEEK_SECONDS:
                await self._reseek(tp, hole, now)

    def _drain(self, queue: asyncio.Queue[EventT], batch: list[EventT]) -> None:
        while len(batch) < self.max_batch:
            try:
                batch.append(queue.get_nowait())
            except asyncio.QueueEmpty:
                return

    async def _start_generation(self, generation: int) -> bool:
        """Seek this stage's partitions to their committed offsets and start counting from
        there. False if another rebalance began meanwhile."""
        await self.wait_idle(commit=False)
        app = self.app
        tps = sorted(
            (tp for tp in self.offsets.assignment() if tp.topic in self.topic_names),
            key=lambda tp: (tp.topic, tp.partition),
        )
        try:
            bases = await self.offsets.bases(tps) if tps else {}
            if bases:
                await self.offsets.seek(bases)
        except Exception:  # noqa: BLE001 - a partition revoked meanwhile: try again
            log.warning("%s: could not seek to the committed offsets", self.name, exc_info=True)
            return False
        if app.consumer_generation_id != generation or not app.flow_control.is_active():
            return False
        self.progress.start(generation, bases)
        self._holes.clear()
        log.info(
            "%s: generation %d, starting at %s",
            self.name,
            generation,
            {f"{tp.topic.rsplit('.', 1)[-1]}/{tp.partition}": o for tp, o in bases.items()},
        )
        return True

    async def _handle(self, batch: list[EventT]) -> None:
        app = self.app
        generation = app.consumer_generation_id
        if not app.flow_control.is_active():
            return  # a rebalance is under way: these records are fetched again after it
        if self.progress.generation != generation and not await self._start_generation(generation):
            return
        progress = self.progress
        live = []
        msgs = []
        ends: dict[TP, int] = {}
        ahead: set[TP] = set()
        for event in batch:
            m = event.message
            if m.generation_id != generation:
                self.skipped["stale"] += 1
                continue  # fetched before the rebalance: fetched again after it
            verdict = progress.admit(m.tp, m.offset)
            if verdict != PROCESS:
                self.skipped[verdict] += 1
                if verdict == AHEAD:
                    ahead.add(m.tp)
                continue
            live.append(event)
            ends[m.tp] = m.offset + 1
            msgs.append(in_message(m))
        if live:
            # A rebalance waits until the consumer's unacked messages are gone (wait_empty):
            # one per batch holds it from here, before anything below awaits, until the
            # batch is delivered, at the cost of one weak reference instead of one a record.
            marker = live[-1].message
            app.consumer._unacked_messages.add(marker)  # type: ignore[attr-defined]
        for tp in ahead:
            await self._seek_back(tp)
        if not live:
            return
        outputs, futures = await self._process(msgs)
        for out in outputs:
            futures += await self.sender.send(out)
        previous = self._in_flight[-1] if self._in_flight else None
        self._in_flight.append(
            asyncio.ensure_future(self._ack(previous, futures, live, marker, generation, ends))
        )
        while len(self._in_flight) > self.MAX_IN_FLIGHT or (
            self._in_flight and self._in_flight[0].done()
        ):
            await self._in_flight.popleft()  # raises if a delivery failed: the worker stops
        self.processed += len(live)

    async def _seek_back(self, tp: TP) -> None:
        """A record is missing before the one that came: fetch again from the missing one."""
        expected = self.progress.next[tp]
        now = time.monotonic()
        hole = self._holes.get(tp)
        if hole is None or hole.offset != expected:
            self._holes[tp] = Hole(expected, now)
            log.info("%s: %s/%d has a hole at %d: fetching again from it", self.name,
                     tp.topic, tp.partition, expected)  # fmt: skip
            await self._seek_quietly(tp, expected)
        elif now - hole.sought_at >= self.RESEEK_SECONDS:
            await self._reseek(tp, hole, now)

    async def _reseek(self, tp: TP, hole: Hole, now: float) -> None:
        hole.seeks += 1
        hole.sought_at = now
        if hole.seeks % self.PROBE_AFTER_SEEKS == 0:
            try:
                first = await self.offsets.first_offset(tp, hole.offset)
            except Exception:  # noqa: BLE001 - no answer: keep fetching
                log.info("%s: probe of %s/%d failed", self.name, tp.topic, tp.partition,
                         exc_info=True)  # fmt: skip
                first = None
            if first is not None and first > hole.offset:
                log.warning(
                    "%s: %s/%d has no records %d..%d (transaction markers or deleted "
                    "records): going on from %d",
                    self.name, tp.topic, tp.partition, hole.offset, first - 1, first,
                )  # fmt: skip
                self.progress.skip_to(tp, first)
                self._holes.pop(tp, None)
                await self._seek_quietly(tp, first)
                return
        await self._seek_quietly(tp, hole.offset)

    async def _seek_quietly(self, tp: TP, offset: int) -> None:
        try:
            await self.offsets.seek({tp: offset})
        except Exception:  # noqa: BLE001 - revoked meanwhile: the next generation seeks anew
            log.info("%s: seek of %s/%d failed", self.name, tp.topic, tp.partition, exc_info=True)

    async def _process(self, msgs: list[InMessage]) -> tuple[list[Output], list[Any]]:
        """The batch's outputs, and the delivery futures of its state writes. A stage writes
        each key it touches once a ``process`` call, the keys a stage's commit depends on
        last; so the writes of each call are flushed on their own: in the retry below, one
        call a message, none of them mixed with another's writes to the same keys."""
        try:
            outputs = [self.stage.process(msgs, self._store())]
            return outputs, await self._flush_store()
        except Exception:  # noqa: BLE001 - find the message that raises, one at a time
            log.warning(
                "%s: a batch of %d raised; retrying message by message",
                self.name,
                len(msgs),
                exc_info=True,
            )
        futures = await self._flush_store()  # what the failed call wrote, on its own
        outputs = []
        with getattr(self.stage, "one_batch", nullcontext)():
            for msg in msgs:
                try:
                    outputs.append(self.stage.process([msg], self._store()))
                except Exception as exc:  # noqa: BLE001 - never let one message stop the stage
                    log.exception(
                        "%s failed on %s/%d/%d; dead-lettered",
                        self.name,
                        msg.topic,
                        msg.partition,
                        msg.offset,
                    )
                    outputs.append(self.on_failure(msg, exc))
                futures += await self._flush_store()
        return outputs, futures

    async def _flush_store(self) -> list[Any]:
        return await self.store.flush(self.app.producer) if self.store is not None else []

    def _store(self) -> Any:
        return self.store if self.store is not None else {}

    async def _ack(
        self,
        previous: asyncio.Future[None] | None,
        futures: list[asyncio.Future[Any]],
        events: list[EventT],
        marker: Any,
        generation: int,
        ends: dict[TP, int],
    ) -> None:
        """Once everything ``events`` produced is durable, after the batch before them: mark
        their offsets safe to commit, and commit now and then. A failed delivery commits
        nothing (the worker stops), but never leaves a rebalance waiting for the events."""
        try:
            if previous is not None:
                await previous
            await self._delivered(futures)
        finally:
            for event in events:
                event.ack()
            consumer: Any = self.app.consumer
            consumer._unacked_messages.discard(marker)
            notify(consumer._waiting_for_ack)  # a waiting rebalance looks again at once
        self.progress.done(generation, ends)
        if time.monotonic() - self._last_commit >= self.commit_interval:
            await self.commit()

    async def _delivered(self, futures: list[asyncio.Future[Any]]) -> None:
        """:func:`delivered`, saying so in the log while the broker keeps a batch waiting."""
        waiting = asyncio.ensure_future(delivered(futures))
        waited = 0.0
        while True:
            try:
                await asyncio.wait_for(asyncio.shield(waiting), self.SLOW_DELIVERY_SECONDS)
                return
            except TimeoutError:
                waited += self.SLOW_DELIVERY_SECONDS
                log.warning("%s: %d outputs of a batch still not acknowledged by the broker "
                            "after %.0f s", self.name, len(futures), waited)  # fmt: skip

    async def commit(self) -> None:
        """Commit what is durable and not committed yet, for the partitions this stage
        still has in the generation its progress belongs to."""
        self._last_commit = time.monotonic()
        if self.progress.generation != self.app.consumer_generation_id:
            return  # a stale progress: its partitions may be someone else's by now
        assigned = self.offsets.assignment()
        offsets = {tp: o for tp, o in self.progress.to_commit().items() if tp in assigned}
        if not offsets:
            return
        try:
            done = await asyncio.wait_for(
                asyncio.shield(self.offsets.commit(offsets)), self.COMMIT_TIMEOUT_SECONDS
            )
        except TimeoutError:
            # never wait on the group coordinator forever: the batches behind this one wait
            # for it. The commit may still land; the next one covers the same offsets.
            log.warning("%s: a commit took over %.0f s; going on without it", self.name,
                        self.COMMIT_TIMEOUT_SECONDS)  # fmt: skip
            return
        if done:
            self.progress.committed_to(offsets)
        # a failed commit (a rebalance began) is harmless: the next owner starts from the
        # last commit, and the stages take what was already applied as redeliveries

    async def wait_idle(self, commit: bool = True) -> None:
        while self._in_flight:
            # shielded: a caller that gives up waiting (on_revoked's time-out) must not
            # cancel the batch's delivery, which the batches after it wait for
            await asyncio.shield(self._in_flight[0])
            self._in_flight.popleft()
        if commit:
            await self.commit()

    async def on_revoked(self) -> None:
        """Partitions are being revoked (Faust has waited for the tracked events): commit
        what is durable while the generation still holds, so the next owner repeats less."""
        try:
            await asyncio.wait_for(self.wait_idle(), timeout=5.0)
        except Exception:  # noqa: BLE001 - only an optimisation: the next owner repeats more
            log.info("%s: no commit at revocation", self.name, exc_info=True)

    async def stop(self) -> None:
        await self.offsets.close()
