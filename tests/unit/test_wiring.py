"""The Faust wiring: the app comes from a factory and its settings only (never the
environment), every stage runs in memdiag's one runner and checkpoint, the tables are
memdiag's store, and the counters' stage turns increments into per-minute rollups and their
changelog records. The stage logic is tested as pure functions elsewhere; these tests are
about the wiring."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from memdiag.contract import SEARCH_CALLS
from memdiag.contract.envelope import InMessage
from memdiag.procs import glibc
from memdiag.settings import Settings
from memdiag.streams.app import Wiring, create_app
from memdiag.streams.checkpoint import RECORD_LIMIT


class Batch:
    """aiokafka's ``BatchBuilder``, as the worker uses it: records appended, then closed."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes | None, bytes]] = []

    def append(self, *, timestamp: int | None, key: bytes | None, value: bytes,
               headers: Any) -> object:  # fmt: skip
        self.records.append((key, value))
        return object()

    def close(self) -> None:
        pass

    def size(self) -> int:
        return sum(len(value) for _, value in self.records)


class Producer:
    """Records what the agents send; every delivery succeeds at once. Faust's producer and
    the aiokafka producer inside it (the batch API the worker's records go through)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes, int | None]] = []
        self.client = self  # aiokafka's client, and its cluster metadata

    @property
    def cluster(self) -> Producer:
        return self

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0, 1, 2, 3}

    def _ensure_producer(self) -> Producer:
        return self

    def create_batch(self) -> Batch:
        return Batch()

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        base = len(self.sent)
        self.sent += [(topic, key, value, partition) for key, value in batch.records]
        done = asyncio.get_running_loop().create_future()
        done.set_result(type("Meta", (), {"offset": base})())
        return done

    async def send(self, topic: str, key: bytes | None, value: bytes, partition: int | None,
                   timestamp: float | None, headers: Any, **kwargs: Any) -> asyncio.Future[None]:  # fmt: skip
        self.sent.append((topic, key, value, partition))
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


@pytest.fixture
async def wiring(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Wiring, Producer]]:
    monkeypatch.setenv("MEMDIAG_TOPIC_PREFIX", "from-the-environment.")
    w = create_app(
        Settings(
            broker="kafka://127.0.0.1:1",
            topic_prefix="t.",
            app_id="agents-test",
            state_store="memory",
        )
    )
    producer = Producer()
    w.app.producer = producer  # type: ignore[misc]  # no broker: what would be sent
    yield w, producer


def increment(value: int, ts: str, source: str = "agent") -> bytes:
    return orjson.dumps(
        {
            "type": "increment",
            "name": SEARCH_CALLS,
            "value": value,
            "attributes": {"source": source},
            "ts": ts,
        }  # fmt: skip
    )


async def test_the_app_is_built_from_its_settings_alone(wiring: tuple[Wiring, Producer]) -> None:
    from memdiag.streams.tables import CheckpointStore

    w, _ = wiring
    assert w.app.conf.id == "agents-test"
    assert w.events.get_topic_name() == "t.events"
    assert w.counters.get_topic_name() == "t.counters"
    assert w.state.changelog_topic.get_topic_name() == "agents-test-state-v2-changelog"
    # every stage runs under memdiag's one runner and checkpoint, none as a Faust agent
    assert set(w.app.agents) == set()
    assert [s.name for s in w.runner.stages] == [
        "spans", "traces", "sessions", "observations", "recall", "judgements", "counters",
    ]  # fmt: skip
    assert w.runner.topics == {f"t.{t}" for t in (
        "events", "judgements", "memory", "counters", "otlp_spans", "internal.otlp-traces",
        "internal.span-events", "internal.observation-steps", "internal.session-verdicts",
    )}  # fmt: skip
    # the tables are memdiag's store; no standby would apply uncommitted changelog records
    assert isinstance(w.state.data, CheckpointStore) and isinstance(w.rollups.data, CheckpointStore)
    # the heap is trimmed after commits (memdiag.procs.heap_trimmer) where glibc runs
    assert (w.runner.after_commit is not None) is glibc()
    assert w.app.conf.table_standby_replicas == 0
    # a committed value behind a skipped record outlives a crash (MEMDIAG_CHANGELOG_...)
    assert w.state.changelog_topic.config == {"min.compaction.lag.ms": str(24 * 3600 * 1000)}
    assert w.state.data.sources == tuple(f"t.{t}" for t in (
        "events", "internal.session-verdicts", "internal.span-events",
        "internal.observation-steps", "memory", "internal.otlp-traces",
    ))  # fmt: skip


class Kafka:
    """The checkpoint's Kafka: the producer above, commits remembered."""

    def __init__(self, producer: Producer):
        self.producer = producer
        self.committed: dict[Any, int] = {}
        self.record_limit = RECORD_LIMIT

    async def send(self, topic: str, key: bytes, value: bytes | None, partition: int,
                   headers: Any) -> asyncio.Future[Any]:  # fmt: skip
        future = await self.producer.send(topic, key, value or b"", partition, None, headers)
        future = asyncio.get_running_loop().create_future()
        future.set_result(type("Meta", (), {"offset": len(self.producer.sent)})())
        return future

    async def flush(self) -> list[asyncio.Future[Any]]:
        return []  # each record is sent as it comes

    def discard(self) -> None:
        pass

    async def commit(self, offsets: Any) -> None:
        self.committed.update(offsets)


async def roll_up(w: Wiring, producer: Producer, values: list[bytes]) -> None:
    """What the runner does with one batch of increments: the counters' stage, its outputs,
    then a checkpoint."""
    runner = w.runner
    runner.kafka = Kafka(producer)
    w.rollups.data._open(0)  # partition 0 of the rollups, as if assigned
    spec = next(s for s in runner.stages if s.name == "counters")
    msgs = [
        InMessage("t.counters", 0, i, SEARCH_CALLS.encode(), v, 0) for i, v in enumerate(values)
    ]
    assert await runner._process(spec, msgs, {("t.counters", 0): len(values)})
    await runner._commit()


async def test_increments_become_running_minute_rollups(wiring: tuple[Wiring, Producer]) -> None:
    w, producer = wiring
    for value, ts in ((2, "2026-11-21T09:30:10Z"), (1, "2026-11-21T09:30:50Z"),
                      (5, "2026-11-21T09:31:00Z")):  # fmt: skip
        await roll_up(w, producer, [increment(value, ts)])
    rollups = [orjson.loads(v) for t, _, v, _ in producer.sent if t == "t.counters"]
    assert [(r["minute"][:16], r["value"]) for r in rollups] == [
        ("2026-11-21T09:30", 2),
        ("2026-11-21T09:30", 3),  # the running total of its minute: keep the last one
        ("2026-11-21T09:31", 5),
    ]
    assert all(r["type"] == "rollup" and r["attributes"] == {"source": "agent"} for r in rollups)
    changelog = [(k, p) for t, k, _, p in producer.sent if t == "agents-test-rollups-v2-changelog"]
    assert {p for _, p in changelog} == {0}  # partition named
    # each minute's total under a key of its own, and the counter's list of minutes
    assert len({k for k, _ in changelog}) == 3 and len(changelog) == 5
    assert w.runner.kafka.committed == {("t.counters", 0): 1}


async def test_a_bad_counter_message_does_not_stop_the_stage(
    wiring: tuple[Wiring, Producer],
) -> None:
    w, producer = wiring
    await roll_up(
        w,
        producer,
        [
            b"not json",
            b'{"type":"increment","name":1,"value":"x"}',
            increment(0, "2026-11-21T09:30:10Z"),
            increment(1, "2026-11-21T09:30:10Z"),
        ],
    )
    assert [orjson.loads(v)["value"] for t, _, v, _ in producer.sent if t == "t.counters"] == [1]


def test_a_key_with_many_records_is_sent_in_messages_the_broker_takes() -> None:
    """A batch's rows for one session can exceed the 1 MiB a broker takes by default: they go
    in several messages, each under the limit, in order, and a lone large record alone."""
    import orjson

    from memdiag.streams.sender import MAX_MESSAGE_BYTES, _messages

    def messages(value: object, limit: int = 1_000_000) -> list[bytes]:
        return _messages(value, orjson.dumps, limit, "memdiag.diagnostics", "s1")

    rows = [{"kind": "search", "event_id": f"e{i}", "query": "q" * 300} for i in range(5000)]
    parts = messages(rows)
    assert len(parts) > 1 and all(len(p) <= MAX_MESSAGE_BYTES for p in parts)
    assert [r for p in parts for r in orjson.loads(p)] == rows
    big = [{"text": "x" * (MAX_MESSAGE_BYTES + 1)}]
    assert messages(big) == [orjson.dumps(big)]  # under the output limit: whole, alone
    assert messages({"one": 1}) == [b'{"one":1}']
    # under a limit below the split size, the messages are split to it
    small = messages(rows, limit=100_000)
    assert all(len(p) <= 100_000 for p in small) and len(small) > len(parts)
    assert [r for p in small for r in orjson.loads(p)] == rows


def test_no_heap_trim_where_the_setting_turns_it_off() -> None:
    w = create_app(Settings(broker="kafka://127.0.0.1:1", app_id="agents-untrimmed",
                            state_store="memory", heap_trim_seconds=0.0))  # fmt: skip
    assert w.runner.after_commit is None
