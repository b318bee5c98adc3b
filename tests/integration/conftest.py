"""A real broker for the integration tests, and a pipeline (worker + sink) per test.

Broker, in order of preference: ``MEMDIAG_TEST_BROKER`` (any Kafka-protocol broker), Apache
Kafka through testcontainers where a Docker engine answers, else the embedded Tansu. Every
test gets its own topic prefix, consumer groups and DuckDB file (uuid), so tests never see
each other's data.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from memdiag import procs
from memdiag.kafka import ensure_topics, wait_drained
from memdiag.runner import Child, sink_inputs, spawn_child, wait_worker
from memdiag.schemas import MEMORY_KINDS
from memdiag.settings import Settings


def _docker_available() -> bool:
    if not shutil.which("docker"):
        return False
    if not os.environ.get("DOCKER_HOST") and not os.path.exists("/var/run/docker.sock"):
        return False  # a client without an engine (as on our machines): don't even try
    try:
        import docker

        client = docker.from_env()
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # noqa: BLE001
        return False


@pytest.fixture(scope="session")
def broker_url() -> Iterator[str]:
    explicit = os.environ.get("MEMDIAG_TEST_BROKER")
    if explicit:
        yield explicit if "://" in explicit else f"kafka://{explicit}"
        return
    if _docker_available():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as kafka:
            yield f"kafka://{kafka.get_bootstrap_server()}"
        return
    from memdiag.broker import EmbeddedBroker

    with EmbeddedBroker() as broker:
        yield broker.url


class Pipeline:
    def __init__(self, settings: Settings, workdir: Path):
        self.settings = settings
        self.workdir = workdir
        self.children: dict[str, Child] = {}

    def start(self, *names: str) -> None:
        """Start processes by name: ``worker``, ``sink``, or ``worker2``... (more workers)."""
        for name in names or ("worker", "sink"):
            command = "worker" if name.startswith("worker") else name
            self.children[name] = spawn_child(name, command, self.settings, self.workdir)

    def kill(self, name: str) -> None:
        child = self.children.pop(name)
        child.proc.kill()
        child.proc.wait(10)
        child.log_file.close()

    def terminate(self, name: str) -> None:
        """Stop one process gracefully (SIGTERM), as a scale-in does."""
        child = self.children.pop(name)
        procs.stop(child.proc)
        child.log_file.close()

    def stop(self) -> None:
        for name in list(self.children)[::-1]:
            child = self.children.pop(name)
            procs.stop(child.proc)
            child.log_file.close()

    def publish(
        self, messages: list[tuple[bytes | None, object]], topic: str | None = None
    ) -> None:
        """Each (key, value): value is an event dict, a list of them (a batch) or raw bytes."""

        async def go() -> None:
            p = AIOKafkaProducer(bootstrap_servers=self.settings.bootstrap_servers, acks="all")
            await p.start()
            try:
                for key, value in messages:
                    raw = value if isinstance(value, bytes) else orjson.dumps(value)
                    await p.send_and_wait(topic or self.settings.topics.events, raw, key=key)
            finally:
                await p.stop()

        asyncio.run(go())

    def publish_events(
        self, events: list[dict[str, Any]], keyed: bool = True, rate: float = 0.0
    ) -> None:
        """One event per message, in list order: keyed by session (memory events by agent,
        on ``memory``), or unkeyed (round-robin over the partitions, as a producer without a
        key does), at ``rate`` a second."""

        async def go() -> None:
            p = AIOKafkaProducer(
                bootstrap_servers=self.settings.bootstrap_servers, acks="all", linger_ms=2
            )
            await p.start()
            try:
                topics = self.settings.topics
                partitions = self.settings.events_partitions
                start = time.monotonic()
                pending = []
                for i, e in enumerate(events):
                    if rate and i % 10 == 0:
                        ahead = start + i / rate - time.monotonic()
                        if ahead > 0:
                            await asyncio.sleep(ahead)
                    memory = e.get("kind") in MEMORY_KINDS
                    topic = topics.memory if memory else topics.events
                    key = e["agent_id" if memory else "session_id"].encode() if keyed else None
                    pending.append(
                        await p.send(
                            topic, orjson.dumps(e), key=key,
                            partition=None if keyed else i % partitions,
                        )
                    )  # fmt: skip
                await asyncio.gather(*pending)
            finally:
                await p.stop()

        asyncio.run(go())

    def drain_worker(self, timeout: float = 60.0) -> None:
        def watch(_lag: object) -> None:
            for child in self.children.values():
                child.check_alive()

        lag = asyncio.run(wait_worker(self.settings, timeout, on_poll=watch))
        assert lag.drained, f"worker behind by {lag.behind}:\n{self.children['worker'].tail()}"

    def drain(self, timeout: float = 60.0) -> None:
        def watch(_lag: object) -> None:
            for child in self.children.values():
                child.check_alive()

        s = self.settings
        lag = asyncio.run(wait_worker(s, timeout, on_poll=watch))
        assert lag.drained, f"worker behind by {lag.behind}:\n{self.children['worker'].tail()}"
        lag = asyncio.run(wait_drained(s, s.sink_group, sink_inputs(s), timeout, on_poll=watch))
        assert lag.drained, f"sink behind by {lag.behind}:\n{self.children['sink'].tail()}"

    def query(self, sql: str) -> list[tuple]:
        from memdiag.analytics.db import connect

        con = connect(self.settings.duckdb_path, read_only=True)
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()

    def snapshot(self) -> dict[str, list[tuple]]:
        """Every table, without the wall-clock ``ingested_at`` column."""
        tables = {
            "searches": "*",
            "dead_letters": "*",
            "retrieval_feedback": "* EXCLUDE (ingested_at)",
            "session_diagnostics": "* EXCLUDE (ingested_at)",
            "observation_weights": "*",
            "observation_weight_history": "*",
            "judgements": "* EXCLUDE (ingested_at)",
            "memory_pipeline": "* EXCLUDE (updated_at)",
            "recall_probes": "* EXCLUDE (ingested_at)",
            "pipeline_agents": "* EXCLUDE (updated_at)",
            "pipeline_breaks": "*",
        }
        return {
            t: self.query(f"SELECT {cols} FROM {t} ORDER BY ALL")  # noqa: S608
            for t, cols in tables.items()
        }

    def consume(self, topic: str) -> list[tuple[bytes | None, Any]]:
        """Every message on ``topic`` so far (call after :meth:`drain`), as (key, JSON)."""

        async def go() -> list[tuple[bytes | None, Any]]:
            c = AIOKafkaConsumer(
                bootstrap_servers=self.settings.bootstrap_servers, enable_auto_commit=False
            )
            await c.start()
            try:
                parts = c.partitions_for_topic(topic) or set()
                if not parts:
                    await c.force_metadata_update()  # type: ignore[attr-defined]
                    parts = c.partitions_for_topic(topic) or set()
                tps = [TopicPartition(topic, p) for p in sorted(parts)]
                c.assign(tps)
                await c.seek_to_beginning(*tps)
                got: list[tuple[bytes | None, Any]] = []
                while batches := await c.getmany(timeout_ms=1000):
                    for msgs in batches.values():
                        got.extend((m.key, orjson.loads(m.value)) for m in msgs)
                return got
            finally:
                await c.stop()

        return asyncio.run(go())


def pipeline_settings(broker_url: str, workdir: Path, label: str = "test") -> Settings:
    """A pipeline of its own on ``broker_url``: a unique topic prefix, consumer groups and
    DuckDB file, and short batches and commits; its topics created."""
    run = uuid.uuid4().hex[:10]
    settings = Settings.from_env(
        {},
        broker=broker_url,
        topic_prefix=f"t{run}.",
        app_id=f"memdiag-{label}-{run}",
        sink_group=f"memdiag-{label}-sink-{run}",
        duckdb_path=str(workdir / "memdiag.duckdb"),
        state_dir=str(workdir / "state"),
        sink_batch_seconds=0.2,
        commit_interval_seconds=0.5,
    )
    asyncio.run(ensure_topics(settings))
    return settings


@pytest.fixture
def pipeline(broker_url: str, tmp_path: Path) -> Iterator[Pipeline]:
    yield from _pipeline(pipeline_settings(broker_url, tmp_path), tmp_path)


@pytest.fixture
def semantic_pipeline(broker_url: str, tmp_path: Path) -> Iterator[Pipeline]:
    """A pipeline whose worker runs the semantic used/ignored rule (MEMDIAG_DETECTOR)."""
    settings = pipeline_settings(broker_url, tmp_path)
    yield from _pipeline(dataclasses.replace(settings, detector="semantic"), tmp_path)


def _pipeline(settings: Settings, workdir: Path) -> Iterator[Pipeline]:
    p = Pipeline(settings, workdir)
    try:
        yield p
    finally:
        p.stop()


__all__ = ["Pipeline", "duckdb"]
