"""The whole worker in memory: its runner, its checkpoint and its stages over Kafka-like
partitioned topics, and a sink.

No broker and no Faust: partitioned logs (the changelogs among them), consumer positions and
committed offsets, the worker's own :class:`memdiag.streams.runner.Runner` and
:class:`memdiag.streams.checkpoint.Checkpoint` driven through a fake Kafka, the tables'
backends recovered with the worker's own :func:`memdiag.streams.store.replay`, and the sink's
upsert rules folded in Python. A random scheduler decides which partitions a fetch takes and
how much, when the runner commits, and when the worker is killed: between two batches, or at
a step of its checkpoint (after part of its changelog records, after all of them, after the
commit). A killed worker loses everything in memory; a new one recovers its tables from the
changelog (from nothing, or from the local state a RocksDB store would have kept) and takes
its records again from the committed offsets. Unit tests can so feed the same events in
many arrival orders and failure histories, in milliseconds, and compare the tables with the
reference.
"""

from __future__ import annotations

import asyncio
import copy
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, NamedTuple

import orjson
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.partitioner import murmur2

from memdiag.contract.envelope import CounterKey, InMessage, Output
from memdiag.schemas.deadletters import failed_output
from memdiag.schemas.decode import parse_ts
from memdiag.schemas.models import format_ts
from memdiag.settings import Settings
from memdiag.streams.checkpoint import RECORD_LIMIT, TP, CommitRefused
from memdiag.streams.runner import Runner, StageSpec
from memdiag.streams.sender import CounterBuffer
from memdiag.streams.stages.counters import CounterStage, minute_of
from memdiag.streams.stages.observations import ObservationStage
from memdiag.streams.stages.recall import RecallStage
from memdiag.streams.stages.sessions import SessionStage
from memdiag.streams.stages.spans import SpanStage
from memdiag.streams.stages.traces import TraceStage
from memdiag.streams.store import (
    OFFSETS_HEADER,
    Assessment,
    MemoryBackend,
    RebuildPoint,
    Replay,
    assess,
    changelog_record,
    commit_covers,
    covers_of,
    needs_covers,
)

STATE = "state"
ROLLUPS = "rollups"
#: The steps of a commit a worker can be killed at (:mod:`memdiag.streams.checkpoint`).
STEPS = ("changelog", "delivered", "committed")


@lru_cache(maxsize=65_536)
def partition_for(key: str, partitions: int) -> int:
    """Kafka's default partitioner (remembered, as the worker's ``partition_of`` is)."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


class Killed(BaseException):
    """The worker process died (a BaseException: nothing in the worker catches it)."""


class Record(NamedTuple):
    """A record as the runner sees a fetched one (aiokafka's ``ConsumerRecord``)."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None
    headers: tuple[tuple[str, bytes], ...] = ()


class Metadata(NamedTuple):
    offset: int


def done(result: Any) -> asyncio.Future[Any]:
    """A future already resolved: the fake broker acknowledges at once."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(result)
    return future


class Tables:
    """The sink's upsert rules, in Python (analytics/sql/upsert_*.sql)."""

    def __init__(self) -> None:
        self.searches: dict[str, dict[str, Any]] = {}
        self.feedback: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.sessions: dict[str, dict[str, Any]] = {}
        self.history: dict[tuple[str, str], dict[str, Any]] = {}
        self.weights: dict[str, dict[str, Any]] = {}
        self.strength_history: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.strengths: dict[str, dict[str, Any]] = {}
        self.graph_history: dict[tuple[str, str], dict[str, Any]] = {}
        self.graph: dict[str, dict[str, Any]] = {}
        self.dead_letters: list[dict[str, Any]] = []
        self._dead_letter_ids: set[str] = set()
        #: the recall pipeline's records, last per key (its rows are functions of the state)
        self.recall: dict[tuple[Any, ...], dict[str, Any]] = {}

    def add(self, record: dict[str, Any]) -> None:
        kind = record["kind"]
        if kind == "search":
            self.searches[record["event_id"]] = record
        elif kind == "retrieval_feedback":
            key = (record["session_id"], record["turn_id"], record["observation_id"])
            if record.get("retracted"):
                self.feedback.pop(key, None)
            else:
                self.feedback[key] = record
        elif kind == "session_diagnostic":
            known = self.sessions.get(record["session_id"])
            if known is None or parse_ts(record["ts"]) >= parse_ts(known["ts"]):  # type: ignore[operator]
                self.sessions[record["session_id"]] = record
        elif kind == "observation_weight":
            self.history[(record["observation_id"], record["session_id"])] = record
            known = self.weights.get(record["observation_id"])
            if known is None or record["version"] > known["version"]:
                self.weights[record["observation_id"]] = record
        elif kind == "strength":
            key3 = (record["observation_id"], record["session_id"], record["turn_id"])
            if record.get("retracted"):
                self.strength_history.pop(key3, None)
            else:
                self.strength_history[key3] = record
            known = self.strengths.get(record["observation_id"])
            if known is None or record["version"] > known["version"]:
                self.strengths[record["observation_id"]] = record
            if record["current_step"] == 0:  # no verdict stands: no row
                self.strengths.pop(record["observation_id"], None)
        elif kind == "graph_weight":
            self.graph_history[(record["id"], record["session_id"])] = record
            known = self.graph.get(record["id"])
            if known is None or record["version"] > known["version"]:
                self.graph[record["id"]] = record
        elif kind == "memory_pipeline":
            self.recall[(kind, record["agent_id"], record["memory_id"])] = record
        elif kind in ("pipeline_agent", "recall_probe", "ambient_context"):
            self.recall[(kind, record["agent_id"], record.get("event_id"))] = record
        elif kind in ("pipeline_break", "pipeline_recovered"):
            self.recall[("episode", record["agent_id"], record["episode"])] = record
        else:
            raise AssertionError(f"unexpected record kind {kind!r}")

    def add_dead_letter(self, record: dict[str, Any]) -> None:
        if record["dead_letter_id"] not in self._dead_letter_ids:
            self._dead_letter_ids.add(record["dead_letter_id"])
            self.dead_letters.append(record)


@dataclass
class WorldTable:
    """A table as the checkpoint sees it (:class:`memdiag.streams.checkpoint.Table`); its
    backends are what a worker keeps in memory or on its disk."""

    table_name: str
    changelog: str
    sources: tuple[str, ...]
    backends: dict[int, MemoryBackend] = field(default_factory=dict)
    repairs: dict[int, set[bytes]] = field(default_factory=dict)
    stray_parts: dict[int, dict[bytes, int]] = field(default_factory=dict)
    #: per partition, what the commit in progress covers (as the worker's store keeps it)
    committing: dict[int, dict[str, int]] = field(default_factory=dict)

    def backend(self, partition: int) -> MemoryBackend:
        """A new backend for ``partition``, its covers taken from the commits (as
        :meth:`memdiag.streams.tables.CheckpointStore._open` makes them)."""
        backend = MemoryBackend()
        backend.covers_hint = lambda: self.committing.get(partition)
        self.backends[partition] = backend
        return backend


class WorldKafka:
    """The runner's and the checkpoint's Kafka, over the world's logs."""

    def __init__(self, world: World):
        self.world = world
        #: a commit to refuse, with the partitions staying where they are
        self.refuse_next_commit = False
        self.record_limit = world.record_limit
        #: rollbacks that told the producer to forget what it had not sent
        self.discarded = 0

    def generation(self) -> int:
        return self.world.generation

    def flowing(self) -> bool:
        return True

    def assignment(self) -> set[Any]:
        w = self.world
        return {TP(t, p) for t in w.runner.topics for p in range(w.partitions_of(t))}

    async def bases(self, tps: list[Any]) -> dict[Any, int]:
        """The committed offsets, else where recovery found the changelog's covers end (as
        :meth:`memdiag.streams.compat.FaustKafka.bases`), else the log start."""
        w = self.world
        return {tp: w.committed.get(tp, w.positions.get(tp, 0)) for tp in tps}

    async def seek(self, offsets: Mapping[Any, int]) -> None:
        self.world.position.update(offsets)

    async def first_offset(self, tp: Any, offset: int) -> int | None:
        return None

    async def committed(self, tps: list[Any]) -> dict[Any, int]:
        return {tp: self.world.committed[tp] for tp in tps if tp in self.world.committed}

    async def commit(self, offsets: Mapping[TP, int]) -> None:
        for table in self.world.world_tables():  # as memdiag.streams.compat.FaustKafka does
            table.committing = commit_covers(offsets, table.sources)
        if self.refuse_next_commit:
            self.refuse_next_commit = False
            self.world.refused += 1
            raise CommitRefused("a rebalance began (the test says so)")
        self.world.committed.update(offsets)

    async def flush(self) -> list[asyncio.Future[Any]]:
        return []  # every record is in its log as it is sent

    def discard(self) -> None:
        self.discarded += 1  # nothing waits to be sent here: counted, for the tests

    async def send(
        self, topic: str, key: bytes, value: bytes | None, partition: int,
        headers: list[tuple[str, bytes]] | None,
    ) -> asyncio.Future[Any]:  # fmt: skip
        w = self.world
        if w.max_message_bytes is not None and len(value or b"") > w.max_message_bytes:
            raise MessageSizeTooLargeError(f"{len(value or b'')} bytes to {topic}")
        offset = w.append(topic, key, value, partition=partition,
                          headers=tuple(headers or ()))  # fmt: skip
        if topic == w.changelog:
            w.changelog_appends.append((partition, w.logs[(topic, partition)][offset]))
        return done(Metadata(offset))


class WorldSender:
    """Where a stage's outputs go (the worker's ``Sender``): the internal topics to the
    world's logs, diagnostics, weights and dead letters straight into the sink's tables."""

    def __init__(self, world: World):
        self.world = world
        #: the increments added up per checkpoint, as the worker's ``Sender`` does
        self.buffer = CounterBuffer()

    async def send(self, out: Output) -> list[asyncio.Future[Any]]:
        w = self.world
        for records in out.diagnostics.values():
            for record in records:
                w.tables.add(record)
                w.records.append(record)
        for records in out.weights.values():
            for record in records:
                w.tables.add(record)
                (w.strengths if record["kind"] == "strength" else w.weights).append(record)
        for records in out.graph_weights.values():
            for record in records:
                w.tables.add(record)
                w.graph_weights.append(record)
        w.counts.update(out.counts)
        for (key, minute), (n, _) in out.by_minute.items():
            w.by_minute[(key, minute)] += n
        for key, records in out.steps.items():
            w.append(w.steps, key, records, out.timestamp_ms)
        for key, records in out.verdicts.items():
            w.append(w.verdicts, key, records, out.timestamp_ms)
        for session_id, raws, timestamp_ms in out.reroute:
            w.append(w.events, session_id, raws, timestamp_ms)
        for partition, records in out.traces:
            w.append(w.traces, None, records, out.timestamp_ms, partition)
        for partition, records in out.span_events:
            w.append(w.span_events, None, records, out.timestamp_ms, partition)
        for agent_id, events, timestamp_ms in out.reroute_memory:
            w.memory_events.extend(events)
            w.append(w.memory, agent_id, events, timestamp_ms)
        for _, record in out.deadletters:
            w.tables.add_dead_letter(record)
        if w.rollups is not None:
            for name, record in out.counter_messages:
                w.append(w.counters, name, record)
            if out.counts:
                self.buffer.add(out)
        return []

    def discard(self) -> None:
        """A rollback, as the worker's ``Sender``: the increments not sent yet are forgotten."""
        self.buffer.clear()

    def committed(self) -> None:
        """The worker's ``Sender`` adds the checkpoint's increments to its OpenTelemetry
        counters here; the world has none."""

    async def flush_counters(self) -> list[asyncio.Future[Any]]:
        """The checkpoint's increments, to ``counters`` (with ``counters=True``)."""
        w = self.world
        if w.rollups is not None:
            for name, record in self.buffer.drain():
                w.append(w.counters, name, record)
        return []


class World:
    """Topics, a worker and a sink; :meth:`run` drains everything.

    ``crash_rate``: the chance, at each step of the scheduler, that the worker is killed
    (between two batches, or at a random step of a commit). ``kill_at``: kill it once, at
    this step of its ``after``-th commit (see :data:`STEPS`). ``counters``: the increments go
    to a ``counters`` topic too, and the counter stage rolls them up per minute in a table
    of its own (``rollups``), as in the worker. ``piece_bytes``: the stages of events, steps
    and recall take a batch in pieces of about this many bytes (the worker's
    ``memdiag.streams.wiring.PIECE_BYTES``); by default one of none, 300 and 3,000, drawn
    from ``seed`` apart from the world's other draws."""

    def __init__(
        self,
        settings: Settings,
        seed: int = 0,
        crash_rate: float = 0.0,
        counters: bool = False,
        record_limit: int = RECORD_LIMIT,
        max_message_bytes: int | None = None,
        piece_bytes: int | None | Literal["drawn"] = "drawn",
    ):
        self.settings = settings
        self.piece_bytes: int | None = (
            random.Random(f"pieces {seed}").choice([None, 300, 3000])
            if piece_bytes == "drawn"
            else piece_bytes
        )
        #: the longest changelog value the worker sends as one record
        self.record_limit = record_limit
        #: the broker's limit on a record's value (Kafka's ``message.max.bytes``): a longer
        #: one is refused, as aiokafka's producer refuses it (``MessageSizeTooLargeError``)
        self.max_message_bytes = max_message_bytes
        self.rng = random.Random(seed)
        #: whether the runner or its next batch starts a generation: its own draws, so the
        #: schedule (batches, commits, kills) of a seed stays what it was
        self.start_rng = random.Random(f"start {seed}")
        self.crash_rate = crash_rate
        self.partitions = settings.events_partitions
        t = settings.topics
        self.events, self.verdicts, self.steps = t.events, t.session_verdicts, t.observation_steps
        self.otlp, self.traces, self.span_events = t.otlp_spans, t.otlp_traces, t.span_events
        self.memory = t.memory
        self.changelog = f"{settings.app_id}-{STATE}-changelog"
        self.logs: dict[tuple[str, int], list[Record]] = {}
        self.position: dict[Any, int] = {}
        self.committed: dict[Any, int] = {}
        self.now_ms = 1_800_000_000_000
        self.generation = 1
        self.table = WorldTable(STATE, self.changelog, (self.events, self.verdicts,
                                self.span_events, self.steps, self.memory, self.traces))  # fmt: skip
        for p in range(self.partitions):
            self.table.backend(p)
        self.counters = t.counters
        self.rollups: WorldTable | None = None
        if counters:
            self.rollups = WorldTable(ROLLUPS, f"{settings.app_id}-{ROLLUPS}-changelog",
                                      (self.counters,))  # fmt: skip
            for p in range(self.partitions):
                self.rollups.backend(p)
        self.tables = Tables()
        #: everything sent, in order: diagnostics and weight records, counter increments
        self.records: list[dict[str, Any]] = []
        self.weights: list[dict[str, Any]] = []
        self.strengths: list[dict[str, Any]] = []  # weights of kind strength
        self.graph_weights: list[dict[str, Any]] = []
        self.counts: Counter[CounterKey] = Counter()
        #: the increments by (counter, minute of event time), as the rollups add them up
        self.by_minute: Counter[tuple[CounterKey, int]] = Counter()
        #: memory_written events the trace stage sent to ``memory``
        self.memory_events: list[dict[str, Any]] = []
        self.crashes = 0
        self.refused = 0
        self.kills: list[str] = []
        #: the tables' values as of the last commit: what recovery must give back
        self.committed_state: dict[int, dict[bytes, bytes]] = {}
        #: (step, the commit's number) to kill the worker at once
        self.kill_at: tuple[str, int] | None = None
        #: a test's look at the broker when the worker dies at ``kill_at`` (before recovery)
        self.on_kill: Any = None
        self._commits = 0
        self._robin = 0
        #: per partition, at the last restart: (changelog records read, keys to repair)
        self.replayed: dict[int, tuple[int, int]] = {}
        #: the changelog partitions recovery rebuilt: (table, partition, why)
        self.rebuilt: list[tuple[str, int, Assessment]] = []
        #: where recovery found the worker starts where nothing is committed (as the local
        #: state covers it)
        self.positions: dict[Any, int] = {}
        #: every changelog record, in the order the worker sent them: (partition, record)
        self.changelog_appends: list[tuple[int, Record]] = []
        self.kafka = WorldKafka(self)
        self.runner = self._new_runner()

    # -- the worker --------------------------------------------------------------------------

    def _new_runner(self) -> Runner:
        s = self.settings
        p = self._session_partition

        def on_failure(msg: InMessage, exc: BaseException) -> Output:
            return failed_output(msg, exc, s)

        self.processor = SessionStage(s, p, lambda: self.now_ms)
        self.owner = ObservationStage(s)
        self.span_stage = SpanStage(s, p)
        self.trace_stage = TraceStage(s, p, lambda: self.now_ms)
        self.recall_stage = RecallStage(s, p)
        stages = [
            StageSpec("spans", (self.otlp,), self.span_stage, None, on_failure),
            StageSpec("traces", (self.traces,), self.trace_stage, STATE, on_failure),
            StageSpec("sessions", (self.events, self.verdicts, self.span_events),
                      self.processor, STATE, on_failure, self.piece_bytes),
            StageSpec("observations", (self.steps,), self.owner, STATE, on_failure,
                      self.piece_bytes),
            StageSpec("recall", (self.memory,), self.recall_stage, STATE, on_failure,
                      self.piece_bytes),
        ]  # fmt: skip
        tables = {STATE: self.table}
        if self.rollups is not None:
            stages.append(StageSpec("counters", (self.counters,), CounterStage(), ROLLUPS,
                                    lambda msg, exc: Output()))  # fmt: skip
            tables[ROLLUPS] = self.rollups
        runner = Runner(self.kafka, stages, tables, WorldSender(self),  # type: ignore[arg-type]
                        fault=self._fault)  # fmt: skip
        return runner

    def world_tables(self) -> list[WorldTable]:
        return [self.table] if self.rollups is None else [self.table, self.rollups]

    def _session_partition(self, session_id: str) -> int:
        return partition_for(session_id, self.partitions)

    def partitions_of(self, topic: str) -> int:
        return self.partitions

    @property
    def store(self) -> StoreView:
        """The state table as of the last commit, all partitions together (keys as text)."""
        return StoreView(self)

    # -- producing ------------------------------------------------------------------------

    def append(
        self,
        topic: str,
        key: str | bytes | None,
        value: Any,
        timestamp_ms: int | None = None,
        partition: int | None = None,
        headers: tuple[tuple[str, bytes], ...] = (),
    ) -> int:
        if partition is not None:
            pass
        elif key is None:
            partition = self._robin % self.partitions
            self._robin += 1
        else:
            partition = partition_for(key if isinstance(key, str) else key.decode(),
                                      self.partitions)  # fmt: skip
        log = self.logs.setdefault((topic, partition), [])
        raw = value if isinstance(value, bytes) or value is None else orjson.dumps(value)
        ts = self.now_ms if timestamp_ms is None else timestamp_ms
        raw_key = key.encode() if isinstance(key, str) else key or None
        log.append(Record(len(log), raw_key, raw, ts, headers))
        self.now_ms += 1
        return len(log) - 1

    def publish(self, events: list[dict[str, Any]], keyed: bool = True, batch: int = 1) -> None:
        """Events to ``events``, one per message (or ``batch`` per message, keyed by the
        first one's session, as ``memdiag publish`` does per key), keyed or not."""
        if batch == 1:
            for e in events:
                self.append(self.events, e["session_id"] if keyed else None, e)
            return
        by_session: dict[str, list[dict[str, Any]]] = {}
        for e in events:
            by_session.setdefault(e["session_id"], []).append(e)
        for sid, evs in by_session.items():
            for i in range(0, len(evs), batch):
                self.append(self.events, sid if keyed else None, evs[i : i + batch])

    def publish_spans(self, records: list[tuple[str | None, bytes]]) -> None:
        """OTLP records to ``otlp_spans``, in list order: (key, bytes), keyed or not."""
        for key, raw in records:
            self.append(self.otlp, key, raw)

    # -- consuming --------------------------------------------------------------------------

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]

    def diagnostics(self) -> dict[str, dict[str, Any]]:
        """The current session diagnostics (as the sink keeps them)."""
        return dict(self.tables.sessions)

    def pending(self) -> list[Any]:
        topics = self.runner.topics
        return [
            TP(*tp)
            for tp, log in self.logs.items()
            if tp[0] in topics and self.position.get(TP(*tp), 0) < len(log)
        ]

    def run(self, max_batch: int = 50, max_rounds: int = 1_000_000, settle: bool = True) -> None:
        """Process until everything is processed and committed (``settle``: it must be by
        ``max_rounds`` of the scheduler; else stop there)."""
        asyncio.run(self._run(max_batch, max_rounds, settle))

    async def _run(self, max_batch: int, max_rounds: int, settle: bool) -> None:
        for _ in range(max_rounds):
            try:
                # a rollback (a stage raised, a checkpoint failed) stops the runner's progress:
                # it starts again from the committed offsets, as the worker's loop does, even
                # when every record was fetched already
                if self.pending() or self.runner.progress.generation != self.generation:
                    await self._step(max_batch)
                    continue
                if self.runner.checkpoint.empty():
                    return
                await self._commit()
            except Killed:
                self._restart()
        if settle:
            raise AssertionError("the world did not settle")

    async def _step(self, max_batch: int) -> None:
        runner = self.runner
        if runner.progress.generation != self.generation and self.start_rng.random() < 0.5:
            # as the worker's idle loop starts it; else the next batch starts it, seeking
            # only the partitions whose fetch is not at the committed offset
            await runner._start(self.generation)
        tps = self.pending()
        if not tps:
            return
        chosen = self.rng.sample(tps, self.rng.randint(1, len(tps)))
        runs = []
        for tp in chosen:
            start = self.position.get(tp, 0)
            records = self.logs[tuple(tp)][start : start + self.rng.randint(1, max_batch)]  # type: ignore[index]
            runs.append((self.generation, tp, records))
            self.position[tp] = start + len(records)
        self.rng.shuffle(runs)
        await runner._handle(runs)
        roll = self.rng.random()
        if roll < self.crash_rate / 2:
            self._kill("between batches")
        if roll < self.crash_rate:
            self.kill_at = (self.rng.choice(STEPS), self._commits + 1)
        if roll < 0.3 or runner.checkpoint.age() > 10:
            await self._commit()

    async def _commit(self) -> None:
        await self.runner._commit()

    def _fault(self, step: str, n: int) -> None:
        """The checkpoint's hook between its steps: kill the worker where the test says;
        after a commit, remember the state it made."""
        if step == "written":
            self._commits += 1
            self.committed_state = self._backend_values()
            if self.kill_at is not None and self.kill_at[1] <= self._commits:
                self.kill_at = (self.kill_at[0], self._commits + 1)  # it had no such step
            return
        if self.kill_at is None or self.kill_at[1] != self._commits + 1:
            return
        wanted = self.kill_at[0]
        records = len(self.runner.checkpoint.produced)
        if wanted == "part":  # between a long value's parts and its last piece
            if step != "part":
                return
        elif wanted == "changelog" and step == "changelog":
            if records < 2:  # a strict, non-empty part needs at least two records
                self.kill_at = ("delivered", self.kill_at[1])
                return
            if n < self.rng.randint(1, records - 1):
                return
        elif wanted != step:
            return
        self.kill_at = None
        self._kill(wanted, n)

    def _kill(self, step: str, n: int = 0) -> None:
        self.kills.append(step)
        if self.on_kill is not None:
            self.on_kill(self, step, n)
        raise Killed(step)

    def _backend_values(self) -> dict[int, dict[bytes, bytes]]:
        return {p: dict(b.data) for p, b in self.table.backends.items()}

    def state_as_committed(self, step: str) -> dict[int, dict[bytes, bytes]]:
        """The table's values as of the committed offsets, at a kill at ``step``: those of
        the last commit, and the dying checkpoint's writes if its commit landed."""
        state = copy.deepcopy(self.committed_state)
        if step == "committed":
            for (name, partition), writes in self.runner.checkpoint.writes.items():
                if name != STATE:
                    continue
                values = state.setdefault(partition, {})
                for key, value in writes.items():
                    if value is None:
                        values.pop(key, None)
                    else:
                        values[key] = value
        return {p: v for p, v in state.items() if v}

    def restart(self, settings: Settings | None = None, fresh: bool | None = None) -> None:
        """Kill the worker now and start a new one (with other settings, on a fresh machine
        or not: by default, at random)."""
        if settings is not None:
            self.settings = settings
        self.kills.append("by the test")
        self._restart(fresh)

    def _restart(self, fresh: bool | None = None) -> None:
        """A new worker process: its tables recovered from the changelog (from the local
        state the last one left, or, on a fresh machine, from nothing), its records taken
        again from the committed offsets."""
        self.crashes += 1
        self.generation += 1
        if fresh is None:
            fresh = self.rng.random() < 0.5
        self.positions = {}
        for table in self.world_tables():
            for partition in range(self.partitions):
                self._recover(table, partition, fresh)
        for tp in list(self.position):
            self.position[tp] = self.committed.get(tp, 0)
        self.runner = self._new_runner()

    # -- what an operator does to the group ------------------------------------------------

    def reset_offsets(self, to: int = 0) -> None:
        """``memdiag reset-offsets --to-earliest``: every partition of every topic the worker
        reads committed at ``to`` (offsets committed, not deleted)."""
        for tp in [TP(t, p) for (t, p) in self.logs if t in self.runner.topics]:
            self.committed[tp] = to

    def reset_offsets_to(self, timestamp_ms: int, snap: bool = True) -> None:
        """``memdiag reset-offsets --to-datetime``: each partition at its first record at or
        after ``timestamp_ms``, and (``snap``) a partition feeding a table back to the
        checkpoint that holds it (:class:`memdiag.streams.store.RebuildPoint`, fed the
        table's changelog as the command reads it)."""
        targets = {
            TP(t, p): next((r.offset for r in log if (r.timestamp or 0) >= timestamp_ms), len(log))
            for (t, p), log in self.logs.items()
            if t in self.runner.topics
        }
        self.committed.update(targets)
        if not snap:
            return
        for table in self.world_tables():
            for partition in range(self.partitions):
                aimed = {t: targets[TP(t, partition)] for t in table.sources
                         if TP(t, partition) in targets}  # fmt: skip
                point = RebuildPoint(aimed)
                for r in self.logs.get((table.changelog, partition), []):
                    point.add(covers_of(r.headers))
                for topic in aimed:
                    at = point.position(topic)
                    self.committed[TP(topic, partition)] = 0 if at is None else at

    def lose_offsets(self) -> None:
        """The group's committed offsets are gone (they expired while no worker ran, or the
        group was deleted): nothing is committed, the changelogs stay."""
        self.committed.clear()

    # -- what the counters say -------------------------------------------------------------

    def counter_messages(self, kind: str) -> list[dict[str, Any]]:
        """The ``counters`` topic's records of one type (``increment``, ``rollup``), in the
        order of each partition's log."""
        out = []
        for (topic, _), log in sorted(self.logs.items()):
            if topic == self.counters:
                out += [doc for r in log if (doc := orjson.loads(r.value or b"{}"))["type"] == kind]
        return out

    def rollups_now(self) -> dict[tuple[str, str, str], int]:
        """The last rollup of each (counter, attributes, minute): what alerting reads."""
        return {
            (d["name"], orjson.dumps(d["attributes"], option=orjson.OPT_SORT_KEYS).decode(),
             d["minute"]): d["value"]
            for d in self.counter_messages("rollup")
        }  # fmt: skip

    def increments_by_minute(self) -> dict[tuple[str, str, str], int]:
        """The increments on the topic added up per (counter, attributes, minute): what every
        rollup must say once the counter stage has read them all."""
        totals: Counter[tuple[str, str, str]] = Counter()
        for d in self.counter_messages("increment"):
            minute = format_ts(minute_of(parse_ts(d["ts"])))  # type: ignore[arg-type]
            attrs = orjson.dumps(d["attributes"], option=orjson.OPT_SORT_KEYS).decode()
            totals[(d["name"], attrs, minute)] += d["value"]
        return dict(totals)

    def table_values(self) -> dict[str, dict[int, dict[bytes, bytes]]]:
        """Each table's committed values, per partition (partitions with none left out)."""
        return {
            t.table_name: {p: dict(b.data) for p, b in t.backends.items() if b.data}
            for t in self.world_tables()
        }

    def _recover(self, table: WorldTable, partition: int, fresh: bool) -> None:
        """One changelog partition's recovery, as the worker's store does it
        (:class:`memdiag.streams.tables.CheckpointStore`, with :mod:`memdiag.streams.store`'s
        rules): the local state kept or not, checked against the committed offsets, rebuilt
        if it is ahead of them; with nothing committed, what it covers taken as committed."""
        if fresh or partition not in table.backends:
            table.backend(partition)
        backend = table.backends[partition]
        log = self.logs.get((table.changelog, partition), [])
        committed = {
            topic: offset
            for (topic, p), offset in self.committed.items()
            if p == partition and topic in table.sources
        }
        if needs_covers(backend):
            assert backend.offset is not None  # noqa: S101 - needs_covers says so
            backend.write({}, backend.offset, covers_of(log[backend.offset].headers) or {})
        verdict = assess(backend, committed, table.sources)
        if verdict.rebuild:
            self.rebuilt.append((table.table_name, partition, verdict))
            backend = table.backend(partition)
        start = -1 if backend.offset is None else backend.offset
        records = [
            changelog_record(r.offset, r.key or b"", r.value, r.headers) for r in log[start + 1 :]
        ]
        run = Replay(backend, verdict.committed)
        run.apply(records)
        repairs = run.repairs()
        for topic, offset in verdict.positions.items():
            self.positions[TP(topic, partition)] = offset
        if table is self.table:
            self.replayed[partition] = (len(records), len(repairs))
        table.repairs[partition] = repairs
        table.stray_parts[partition] = dict(run.stray)  # the process's own died with it

    def changelog_records(self, since: int = 0) -> list[tuple[int, Record]]:
        """The changelog's records (partition, record) from each partition's ``since``."""
        return [
            (p, r)
            for p in range(self.partitions)
            for r in self.logs.get((self.changelog, p), [])[since:]
        ]

    def uncommitted(self, records: list[tuple[int, Record]]) -> list[tuple[int, Record]]:
        """Of ``records``, those whose covered offsets the group has not committed past."""
        out = []
        for p, r in records:
            covers = covers_of(r.headers) or {}
            if any(off >= self.committed.get(TP(t, p), 0) for t, off in covers.items()):
                out.append((p, r))
        return out


class StoreView:
    """The state table with the open checkpoint's writes, read like a dict store (tests
    look inside)."""

    def __init__(self, world: World):
        self.data: dict[str, bytes] = {
            k.decode(): v for b in world.table.backends.values() for k, v in b.data.items()
        }
        for writes in world.runner.checkpoint.writes.values():
            for k, v in writes.items():
                if v is None:
                    self.data.pop(k.decode(), None)
                else:
                    self.data[k.decode()] = v

    def get(self, key: str, partition: int = 0) -> bytes | None:
        return self.data.get(key)


__all__ = ["OFFSETS_HEADER", "STEPS", "Killed", "Tables", "World", "partition_for"]
