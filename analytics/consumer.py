"""The sink process: consume ``diagnostics`` and ``deadletter`` in bounded batches, write
them to DuckDB, then commit the offsets.

Offsets are committed only after the DuckDB transaction has committed, so a crash at any
point re-delivers what was not yet written, and the upserts make the re-delivery harmless.
A batch closes at ``MEMDIAG_SINK_BATCH_ROWS`` records or ``MEMDIAG_SINK_BATCH_SECONDS``,
whichever comes first. A message the sink cannot read becomes a ``dead_letters`` row itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import duckdb
import orjson
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.structs import ConsumerRecord

from memdiag.analytics.db import DatabaseError
from memdiag.analytics.sink import DuckDBSink
from memdiag.contract import SINK_REJECTED
from memdiag.contract.envelope import InMessage
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


class SinkRunner:
    def __init__(self, settings: Settings, sink: DuckDBSink | None = None):
        self.settings = settings
        self.sink = sink or DuckDBSink(
            settings.duckdb_path, storage_version=settings.duckdb_storage_version
        )
        self.consumer: AIOKafkaConsumer | None = None
        self._first_pending_at: float | None = None
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    async def run(self, ready: asyncio.Event | None = None) -> None:
        s = self.settings
        await asyncio.to_thread(self.sink.init)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap_servers,
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
            [s.topics.diagnostics, s.topics.weights, s.topics.deadletter],
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
            await self.consumer.stop()
            self.consumer = None

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
        topic = {"dead_letter": topics.deadletter, "observation_weight": topics.weights}.get(
            str(record.get("kind")), topics.diagnostics
        )
        payload = orjson.dumps(record, default=str)
        limit = self.settings.deadletter_payload_bytes
        return {
            "kind": "dead_letter",
            "dead_letter_id": dead_letter_id(topic, payload, self.settings.topic_prefix),
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
        if self._first_pending_at is None:
            return
        while True:
            try:
                written = await asyncio.to_thread(self.sink.flush)
                break
            except (duckdb.IOException, DatabaseError):
                # the file is locked or unwritable: keep the batch, retry; nothing committed
                log.exception("sink flush failed; retrying in 1s (nothing was committed)")
                await asyncio.sleep(1.0)
            except Exception:  # noqa: BLE001 - bad data: isolate it instead of stalling
                log.exception("sink batch refused; writing it record by record")
                written = await asyncio.to_thread(self.sink.flush_isolating, self._rejected)
                break
        if self.consumer is not None:
            await self.consumer.commit()
        self._first_pending_at = None
        if written:
            log.debug("sink wrote %d rows", written)
