"""The sink process: consume ``diagnostics`` and ``deadletter`` in bounded batches, write
them to DuckDB, then commit the offsets.

Offsets are committed only after the DuckDB transaction has committed, so a crash at any
point re-delivers what was not yet written, and the upserts make the re-delivery harmless.
A batch closes at ``MEMDIAG_SINK_BATCH_ROWS`` records or ``MEMDIAG_SINK_BATCH_SECONDS``,
whichever comes first. A message the sink cannot read becomes a ``dead_letters`` row itself.

A stop (:meth:`SinkRunner.stop`) writes what the sink holds, then commits, by its deadline
(``MEMDIAG_SHUTDOWN_TIMEOUT_SECONDS``). When the broker is gone the rows are written all the
same (DuckDB is local) but nothing more is committed: those messages come again on the next
start, and the upserts keep each row once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import ConsumerRecord

from memdiag.analytics.db import DatabaseError
from memdiag.analytics.sink import DATA_ERRORS, DuckDBSink
from memdiag.contract import SINK_REJECTED
from memdiag.contract.envelope import InMessage
from memdiag.kafka import broker_answers, client_options
from memdiag.procs import EXIT_UNCOMMITTED, settles
from memdiag.schemas.deadletters import dead_letter_id, dead_letter_record
from memdiag.schemas.decode import NOT_AN_EVENT, NOT_JSON, Rejected
from memdiag.schemas.models import format_ts
from memdiag.settings import Settings

log = logging.getLogger("memdiag.sink")


class _FlushOnRevoke(ConsumerRebalanceListener):
    def __init__(self, runner: SinkRunner):
        self.runner = runner

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.runner.flush_and_commit()

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("sink assigned %d partitions", len(assigned))


class SinkFatal(RuntimeError):
    """The DuckDB file cannot be written (disk full, permission denied, a read-only file
    system, a corrupt file): the sink stops with this message. Nothing is lost: the sink
    commits nothing it did not write, so Kafka replays it when the sink restarts."""


def is_lock_conflict(exc: BaseException) -> bool:
    """Another process holds the file: DuckDB's own words, or memdiag's after waiting."""
    text = str(exc)
    return (
        "Could not set lock on file" in text
        or "Conflicting lock is held" in text
        or (isinstance(exc, DatabaseError) and "stayed locked" in text)
    )


def fatal_message(path: str, exc: BaseException) -> str:
    text = str(exc)
    lowered = text.lower()
    cause, todo = "DuckDB could not write it", "fix the cause"
    for needle, why, what in (
        ("no space left", "the disk is full", "free space"),
        ("permission denied", "permission denied", "give the sink's user write access"),
        ("read-only file system", "the file system is read-only", "mount it read-write"),
        ("not a valid duckdb database", "the file is not a valid DuckDB database", "move it away"),
        ("not a duckdb file", "the file is not a valid DuckDB database", "move it away"),
        ("corrupt", "the file is corrupt", "move it away (and restore a copy)"),
        ("checksum", "the file is corrupt", "move it away (and restore a copy)"),
    ):
        if needle in lowered:
            cause, todo = why, what
            break
    return (
        f"the sink cannot write {path}: {cause} ({text}). It stopped without committing, so "
        f"nothing is lost: Kafka keeps the data. {todo[0].upper() + todo[1:]}, then restart "
        "the sink: it resumes where it stopped"
    )


class SinkRunner:
    #: seconds between the retries of a write that failed for another reason than a lock
    retry_delays: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 15.0)

    def __init__(self, settings: Settings, sink: DuckDBSink | None = None):
        self.settings = settings
        self.sink = sink or DuckDBSink(
            settings.duckdb_path,
            storage_version=settings.duckdb_storage_version,
            topic_prefix=settings.topic_prefix,
            payload_bytes=settings.deadletter_payload_bytes,
        )
        self.consumer: AIOKafkaConsumer | None = None
        self._first_pending_at: float | None = None
        self._stopping = asyncio.Event()
        self._opened = False
        # a revocation flushes from aiokafka's coordinator task: one flush at a time
        self._flushing = asyncio.Lock()
        # another process's lock is said once a wait (a wait ends with a write), then every
        # LOCK_REMIND_SECONDS while it lasts
        self._lock_said_at: float | None = None
        self.sink.on_lock_wait = self._lock_wait
        #: a stop's deadline (time.monotonic()): what is not written and committed by then
        #: is left to the next start
        self.deadline: float | None = None
        #: the broker did not answer at a stop: nothing more is committed
        self.broker_gone = False
        #: since the last commit: messages taken, and rows written from them
        self.uncommitted_messages = 0
        self.uncommitted_rows = 0
        #: records held and not written when a stop ran out of time
        self.unwritten = 0

        async def answers(timeout: float) -> bool:
            return await broker_answers(settings, timeout)

        self.answers: Callable[[float], Awaitable[bool]] | None = answers

    #: how often a long wait on another process's lock is said again
    LOCK_REMIND_SECONDS = 600.0

    def _lock_wait(self, text: str) -> None:
        now = time.monotonic()
        if self._lock_said_at is None:
            log.warning("%s", text)
            self._lock_said_at = now
        elif now - self._lock_said_at >= self.LOCK_REMIND_SECONDS:
            log.warning("still %s", text)
            self._lock_said_at = now

    def stop(self, deadline: float | None = None) -> None:
        """Stop: write what is held, commit it by ``deadline`` (``time.monotonic()``), and
        nothing more once the broker is found gone."""
        self.deadline = deadline
        self._stopping.set()

    def _out_of_time(self) -> bool:
        return (
            self._stopping.is_set()
            and self.deadline is not None
            and time.monotonic() >= self.deadline
        )

    def _left(self) -> float | None:
        if not self._stopping.is_set() or self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    async def open_file(self) -> None:
        """Create or upgrade the DuckDB file's schema, before anything is consumed: a file
        that cannot be written stops the sink at once (:class:`SinkFatal`), one that another
        process holds is waited for."""
        if self._opened:
            return
        path = self.settings.duckdb_path
        while True:
            try:
                await asyncio.to_thread(self.sink.init)
                self._opened = True
                return
            except Exception as exc:  # noqa: BLE001 - whatever DuckDB says, the file is unusable
                if not is_lock_conflict(exc):
                    raise SinkFatal(fatal_message(path, exc)) from exc
                await asyncio.sleep(1.0)  # a reader holds it: wait (said once), never fatal

    async def run(self, ready: asyncio.Event | None = None) -> None:
        s = self.settings
        await self.open_file()
        self.consumer = AIOKafkaConsumer(
            **client_options(s),
            group_id=s.sink_group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=int(s.session_timeout_seconds * 1000),
            heartbeat_interval_ms=int(s.heartbeat_interval_seconds * 1000),
            max_poll_interval_ms=300_000,
            fetch_max_bytes=64 * 1024 * 1024,
            max_partition_fetch_bytes=16 * 1024 * 1024,
            fetch_max_wait_ms=s.fetch_max_wait_ms,
        )
        self.consumer.subscribe(
            [s.topics.diagnostics, s.topics.weights, s.topics.graph_weights, s.topics.deadletter],
            listener=_FlushOnRevoke(self),
        )
        await self.consumer.start()
        log.info("memdiag sink started: %s -> %s", s.bootstrap_servers, s.duckdb_path)
        if ready is not None:
            ready.set()
        try:
            while not self._stopping.is_set():
                batches = await self.consumer.getmany(
                    timeout_ms=int(s.sink_batch_seconds * 1000 / 2) or 1,
                    max_records=s.sink_batch_rows,
                )
                for messages in batches.values():
                    for m in messages:
                        self._add_message(m)
                if self._due():
                    await self.flush_and_commit()
            await self.flush_and_commit()
        finally:
            await self._stop_consumer()

    async def _stop_consumer(self) -> None:
        """Leave the group; once the broker is gone (or past the deadline), without waiting
        for it: aiokafka would wait for the coordinator. A stop asks the broker if nothing
        told yet whether it is there (the line at the end says it)."""
        consumer, self.consumer = self.consumer, None
        if consumer is None:
            return
        stop = asyncio.ensure_future(consumer.stop())
        left = self._left()
        soon = 1.0 if left is None else min(1.0, left)
        if self.broker_gone:
            done = bool((await asyncio.wait({stop}, timeout=soon))[0])
        else:
            done = await settles(stop, self.deadline, self.answers)
            self.broker_gone = not done
            if done and self._stopping.is_set() and self.answers is not None:
                self.broker_gone = not await self.answers(soon)
        if not done:
            stop.cancel()
            log.info("sink: stopped its consumer without the broker's answer")
        elif not stop.cancelled():  # aiokafka's fetcher re-raises its own cancelled fetch
            try:
                stop.result()
            except Exception:  # noqa: BLE001 - stopping anyway: say it, do not crash on it
                log.warning("sink: its consumer's stop failed", exc_info=True)

    def _due(self) -> bool:
        if self.sink.pending == 0:
            return self._first_pending_at is not None  # consumed only unknown/empty: commit
        if self.sink.pending >= self.settings.sink_batch_rows:
            return True
        started = self._first_pending_at or time.monotonic()
        return time.monotonic() - started >= self.settings.sink_batch_seconds

    def _add_message(self, m: ConsumerRecord[bytes, bytes]) -> None:
        if self._first_pending_at is None:
            self._first_pending_at = time.monotonic()
        self.uncommitted_messages += 1
        is_deadletter = m.topic == self.settings.topics.deadletter
        try:
            doc: Any = orjson.loads(m.value) if m.value is not None else None
        except orjson.JSONDecodeError as exc:
            self._unreadable(m, NOT_JSON, f"the sink could not parse this message: {exc}")
            return
        records = doc if isinstance(doc, list) else [doc]
        for i, record in enumerate(records):
            if not isinstance(record, dict):
                self._unreadable(m, NOT_AN_EVENT, "expected a JSON object or array of objects", i)
                continue
            if is_deadletter:
                record = {"kind": "dead_letter", **record}
            self.sink.add(record)

    def _unreadable(
        self, m: ConsumerRecord[bytes, bytes], reason: str, detail: str, i: int = 0
    ) -> None:
        msg = InMessage(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp)
        payload = m.value or b""
        record = dead_letter_record(msg, Rejected(i, reason, detail, payload), self.settings)
        self.sink.add({"kind": "dead_letter", **record})

    def _rejected(self, record: dict[str, Any], error: str) -> dict[str, Any]:
        """The dead letter of a record DuckDB refused (the source offset is not known)."""
        topics = self.settings.topics
        topic = {
            "dead_letter": topics.deadletter,
            "observation_weight": topics.weights,
            "strength": topics.weights,
            "graph_weight": topics.graph_weights,
        }.get(str(record.get("kind")), topics.diagnostics)
        try:
            payload = orjson.dumps(record, default=str)
        except orjson.JSONEncodeError:  # nested deeper than orjson writes: a note instead
            payload = orjson.dumps({"kind": record.get("kind"), "note": "not re-encodable"})
        limit = self.settings.deadletter_payload_bytes
        return {
            "kind": "dead_letter",
            # the same record refused again (a redelivery) is the same row
            "dead_letter_id": dead_letter_id(
                topic, self.settings.topic_prefix, "record", hashlib.sha256(payload).hexdigest()
            ),
            "topic": topic,
            "partition": None,
            "offset": None,
            "batch_index": None,
            "key": None,
            "reason": SINK_REJECTED,
            "detail": f"DuckDB refused this record: {error}",
            "payload": payload[:limit].decode("utf-8", "replace"),
            "payload_bytes": len(payload),
            "payload_truncated": len(payload) > limit,
            "ts": format_ts(time.time_ns() // 1000),
        }

    async def flush_and_commit(self) -> None:
        """Write what is buffered, then commit its offsets. A record DuckDB refuses is
        dead-lettered (the batch is written record by record); a problem with the file is
        waited for (a lock) or retried a bounded number of times (:class:`SinkFatal`).
        Nothing is committed that is not written."""
        async with self._flushing:
            await self._flush_and_commit()

    async def _flush_and_commit(self) -> None:
        if self._first_pending_at is None:
            return
        failures = 0
        while True:
            try:
                try:
                    written = await asyncio.to_thread(self.sink.flush)
                except DATA_ERRORS:
                    log.exception("sink batch refused; writing it record by record")
                    written = await asyncio.to_thread(self.sink.flush_isolating, self._rejected)
                break
            except Exception as exc:  # noqa: BLE001 - the file's problem: wait, retry or stop
                # Nothing was committed: Kafka keeps the batch whatever happens next.
                if self._out_of_time():  # a stop: the next start writes it
                    self.unwritten = self.sink.pending
                    log.warning("sink could not write %s by its stop's deadline (%s); nothing "
                                "of it committed", self.settings.duckdb_path, exc)  # fmt: skip
                    return
                if is_lock_conflict(exc):  # a reader holds the file (said once): never fatal
                    await asyncio.sleep(min(1.0, self._left() or 1.0))
                    continue
                failures += 1
                if failures >= len(self.retry_delays) + 1:
                    raise SinkFatal(fatal_message(self.settings.duckdb_path, exc)) from exc
                delay = self.retry_delays[failures - 1]
                log.warning(
                    "sink cannot write %s (%s); retry %d of %d in %.0fs, nothing committed",
                    self.settings.duckdb_path,
                    exc,
                    failures,
                    len(self.retry_delays),
                    delay,
                )
                left = self._left()
                await asyncio.sleep(delay if left is None else min(delay, left))
        self.unwritten = 0
        self.uncommitted_rows += written
        if self.consumer is not None:
            try:
                if await self._commit():
                    self.uncommitted_messages = self.uncommitted_rows = 0
            except (CommitFailedError, IllegalStateError) as exc:
                # A long wait (a reader holding the file past max_poll_interval_ms) cost the
                # sink its partitions: it rejoins and reads again from its last commit; what
                # it wrote meanwhile is written again, as upserts.
                log.warning("sink could not commit (%s); it goes on from its last commit", exc)
                if not self._stopping.is_set():  # read again, and counted again
                    self.uncommitted_messages = self.uncommitted_rows = 0
        self._first_pending_at = None
        if self._lock_said_at is not None:
            log.info("the DuckDB file is free again: the sink wrote what waited")
            self._lock_said_at = None
        if written:
            log.debug("sink wrote %d rows in %.1f ms (%.1f ms of it waiting for the file)",
                      written, self.sink.last_flush_seconds * 1000,
                      self.sink.last_wait_seconds * 1000)  # fmt: skip

    async def _commit(self) -> bool:
        """Commit what was read (all of it written). A commit waiting for the broker
        (aiokafka waits as long as it takes) is cut short by a stop: then it has until the
        deadline, and none at all once the broker does not answer. False: not committed,
        the broker gone (nothing more is tried)."""
        if self.broker_gone or self.consumer is None:
            return False
        commit = asyncio.ensure_future(self.consumer.commit())
        if not self._stopping.is_set():
            stopping = asyncio.ensure_future(self._stopping.wait())
            try:
                await asyncio.wait({commit, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
        if not commit.done() and not await settles(commit, self.deadline, self.answers):
            commit.cancel()
            self.broker_gone = True
            # aiokafka's own request under the commit fails later, unseen: not worth a trace
            asyncio.get_running_loop().set_exception_handler(_quiet_kafka_errors)
            return False
        commit.result()
        return True

    def stopped(self) -> tuple[str, int]:
        """What the stop left, in words, and the exit status (0: everything committed)."""
        held = self.sink.pending + self.unwritten
        written = self.sink.rows_written
        if not self.uncommitted_messages and not held:
            return (f"It wrote {written:,} rows to DuckDB in this run and committed "
                    "everything it read.", 0)  # fmt: skip
        if held:
            what = (f"it could not write {held:,} records it held ({written:,} rows "
                    "written in this run)")  # fmt: skip
        else:
            what = (f"it wrote all it held to DuckDB ({self.uncommitted_rows:,} rows since its "
                    f"last commit, {written:,} in this run)")  # fmt: skip
        return (
            f"{what[0].upper()}{what[1:]}; {self.uncommitted_messages:,} messages read since "
            "its last commit are not committed: they come again on the next start, and the "
            "upserts keep each row once in DuckDB.",
            EXIT_UNCOMMITTED,
        )


def _quiet_kafka_errors(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's handler once the broker is gone at a stop: aiokafka's abandoned
    requests fail unseen (debug), anything else is shown as usual."""
    if isinstance(context.get("exception"), KafkaError):
        log.debug("after the broker went: %s", context.get("message"))
        return
    loop.default_exception_handler(context)
