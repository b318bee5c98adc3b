"""The whole worker in memory: its stages, Kafka-like partitioned topics, and a sink.

No broker and no Faust: partitioned logs, consumer positions and a commit point per
partition, the stages' logic (``memdiag.streams.processor``, ``memdiag.streams.observations``) with a dict
store, and the sink's upsert rules folded in Python. A random scheduler decides which
partitions a batch takes and how large it is, and can crash a stage mid-flight (its
outputs lost, its offsets rewound to the last commit, its state writes kept up to a random
point), so unit tests can feed the same events in many arrival orders and failure
histories, in milliseconds, and compare the tables with the reference.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import orjson
from aiokafka.partitioner import murmur2

from memdiag.contract.envelope import CounterKey, DictStore, InMessage, Output
from memdiag.schemas.decode import parse_ts
from memdiag.settings import Settings
from memdiag.streams.observations import ObservationOwner
from memdiag.streams.otlp import SpanStage
from memdiag.streams.processor import Processor
from memdiag.streams.traces import TraceStage


def partition_for(key: str, partitions: int) -> int:
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions


class RecordingStore(DictStore):
    """A dict store that can keep only a prefix of a batch's writes (a crash)."""

    def __init__(self) -> None:
        super().__init__()
        self.journal: list[tuple[str, bytes | None]] | None = None

    def put(self, key: str, value: bytes, partition: int) -> None:
        if self.journal is not None:
            self.journal.append((key, self.data.get(key)))
        super().put(key, value, partition)

    def delete(self, key: str, partition: int) -> None:
        if self.journal is not None:
            self.journal.append((key, self.data.get(key)))
        super().delete(key, partition)

    def undo_after(self, keep: int) -> None:
        assert self.journal is not None
        for key, before in reversed(self.journal[keep:]):
            if before is None:
                self.data.pop(key, None)
            else:
                self.data[key] = before


class StagedStore(DictStore):
    """A batch's state writes, held over a copy of ``target``: :meth:`land` applies the
    first ``n`` of them to ``target`` (the prefix a crash leaves in the changelog)."""

    def __init__(self, target: DictStore):
        super().__init__(dict(target.data))
        self.target = target
        self.log: list[tuple[str, bytes | None]] = []

    def put(self, key: str, value: bytes, partition: int) -> None:
        super().put(key, value, partition)
        self.log.append((key, value))

    def delete(self, key: str, partition: int) -> None:
        super().delete(key, partition)
        self.log.append((key, None))

    def land(self, n: int) -> None:
        for key, value in self.log[:n]:
            if value is None:
                self.target.data.pop(key, None)
            else:
                self.target.data[key] = value


class Tables:
    """The sink's upsert rules, in Python (analytics/sql/upsert_*.sql)."""

    def __init__(self) -> None:
        self.searches: dict[str, dict[str, Any]] = {}
        self.feedback: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.sessions: dict[str, dict[str, Any]] = {}
        self.history: dict[tuple[str, str], dict[str, Any]] = {}
        self.weights: dict[str, dict[str, Any]] = {}
        self.dead_letters: list[dict[str, Any]] = []

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
        else:
            raise AssertionError(f"unexpected record kind {kind!r}")


class World:
    """Topics, stages and a sink; :meth:`run` drains everything."""

    def __init__(self, settings: Settings, seed: int = 0, crash_rate: float = 0.0):
        self.settings = settings
        self.rng = random.Random(seed)
        self.crash_rate = crash_rate
        self.partitions = settings.events_partitions
        t = settings.topics
        self.events, self.verdicts, self.steps = t.events, t.session_verdicts, t.observation_steps
        self.otlp, self.traces, self.span_events = t.otlp_spans, t.otlp_traces, t.span_events
        self.logs: dict[tuple[str, int], list[InMessage]] = {}
        self.position: dict[tuple[str, int], int] = {}
        self.committed: dict[tuple[str, int], int] = {}
        self.now_ms = 1_800_000_000_000
        self.store = RecordingStore()
        self.processor = Processor(settings, self._session_partition, lambda: self.now_ms)
        self.owner = ObservationOwner(settings)
        self.span_stage = SpanStage(settings, self._session_partition)
        self.trace_stage = TraceStage(settings, self._session_partition, lambda: self.now_ms)
        #: memory_written events the trace stage sent to ``memory`` (no memory stage here)
        self.memory_events: list[dict[str, Any]] = []
        self.tables = Tables()
        #: everything sent, in order: diagnostics and weight records, counter increments
        self.records: list[dict[str, Any]] = []
        self.weights: list[dict[str, Any]] = []
        self.counts: Counter[CounterKey] = Counter()
        self.crashes = 0
        self._robin = 0

    def _session_partition(self, session_id: str) -> int:
        return partition_for(session_id, self.partitions)

    # -- producing ------------------------------------------------------------------------

    def append(
        self,
        topic: str,
        key: str | None,
        value: Any,
        timestamp_ms: int | None = None,
        partition: int | None = None,
    ) -> None:
        if partition is not None:
            pass
        elif key is None:
            partition = self._robin % self.partitions
            self._robin += 1
        else:
            partition = partition_for(key, self.partitions)
        log = self.logs.setdefault((topic, partition), [])
        raw = value if isinstance(value, bytes) else orjson.dumps(value)
        ts = self.now_ms if timestamp_ms is None else timestamp_ms
        log.append(InMessage(topic, partition, len(log), key.encode() if key else None, raw, ts))
        self.now_ms += 1

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

    def pending(self, topics: tuple[str, ...]) -> list[tuple[str, int]]:
        return [
            tp
            for tp, log in self.logs.items()
            if tp[0] in topics and self.position.get(tp, 0) < len(log)
        ]

    def run(self, max_batch: int = 50, max_rounds: int = 1_000_000) -> None:
        stages = (
            (self.otlp,),
            (self.traces,),
            (self.events, self.verdicts, self.span_events),
            (self.steps,),
        )
        for _ in range(max_rounds):
            ready = [s for s in stages if self.pending(s)]
            if not ready:
                return
            self._step(self.rng.choice(ready), max_batch)
        raise AssertionError("the world did not settle")

    def _step(self, topics: tuple[str, ...], max_batch: int) -> None:
        tps = self.pending(topics)
        chosen = self.rng.sample(tps, self.rng.randint(1, len(tps)))
        msgs: list[InMessage] = []
        taken: dict[tuple[str, int], int] = {}
        for tp in chosen:
            start = self.position.get(tp, 0)
            batch = self.logs[tp][start : start + self.rng.randint(1, max_batch)]
            msgs.extend(batch)
            taken[tp] = start + len(batch)
        msgs = _interleave(msgs, self.rng)  # partitions interleave, each one in order
        self.store.journal = []
        stage: Any = {
            (self.steps,): self.owner,
            (self.otlp,): self.span_stage,
            (self.traces,): self.trace_stage,
        }.get(topics, self.processor)
        out = stage.process(msgs, self.store)
        if self.rng.random() < self.crash_rate:
            self._crash(topics, out)
            return
        self.store.journal = None
        self._route(out)
        self.position.update(taken)
        self.committed.update(taken)

    def _crash(self, topics: tuple[str, ...], out: Output) -> None:
        """The stage died after a random prefix of its state writes, having sent some of
        its outputs, before its commit: it restarts from its changelog and the last
        committed offsets."""
        assert self.store.journal is not None
        self.store.undo_after(self.rng.randint(0, len(self.store.journal)))
        self.store.journal = None
        self._route(out, keep=0.5)
        self.crashes += 1
        self.processor.partitions_changed()
        self.trace_stage.partitions_changed()
        for tp in self.logs:
            if tp[0] in topics:
                self.position[tp] = self.committed.get(tp, 0)

    def _route(self, out: Output, keep: float = 1.0) -> None:
        """Send the outputs (each message with probability ``keep``: a crash loses some)."""

        def sent() -> bool:
            return keep >= 1.0 or self.rng.random() < keep

        for records in out.diagnostics.values():
            if sent():
                for record in records:
                    self.tables.add(record)
                    self.records.append(record)
        for records in out.weights.values():
            for record in records:
                if sent():
                    self.tables.add(record)
                    self.weights.append(record)
        if keep >= 1.0:
            self.counts.update(out.counts)
        for key, records in out.steps.items():
            if sent():
                self.append(self.steps, key, records, out.timestamp_ms)
        for key, records in out.verdicts.items():
            if sent():
                self.append(self.verdicts, key, records, out.timestamp_ms)
        for session_id, raws, timestamp_ms in out.reroute:
            if sent():
                self.append(self.events, session_id, raws, timestamp_ms)
        for partition, records in out.traces:
            if sent():
                self.append(self.traces, None, records, out.timestamp_ms, partition)
        for partition, records in out.span_events:
            if sent():
                self.append(self.span_events, None, records, out.timestamp_ms, partition)
        for _agent_id, events, _timestamp_ms in out.reroute_memory:
            if sent():
                self.memory_events.extend(events)
        self.tables.dead_letters.extend(record for _, record in out.deadletters if sent())


def _interleave(msgs: list[InMessage], rng: random.Random) -> list[InMessage]:
    queues: dict[tuple[str, int], list[InMessage]] = {}
    for m in msgs:
        queues.setdefault((m.topic, m.partition), []).append(m)
    out: list[InMessage] = []
    while queues:
        tp = rng.choice(list(queues))
        out.append(queues[tp].pop(0))
        if not queues[tp]:
            del queues[tp]
    return out
