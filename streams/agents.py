"""The worker's stages, wired to the app: decode, call the logic, send. Nothing else lives here.

- spans (``memdiag.streams.otlp``): ``otlp_spans`` (OTLP records, any key) -> span records to
  the internal ``otlp-traces``, keyed by trace (stateless).
- traces (``memdiag.streams.traces``): ``otlp-traces`` -> per-trace state (``t:``, ``tc:``,
  ``tw:``): searches, turns and outcomes to the internal ``span-events`` keyed by session;
  memory writes to ``memory``.
- sessions (``memdiag.streams.processor``): ``events`` and the internal ``session-verdicts``
  and ``span-events`` (all keyed by session, co-partitioned) -> per-session state (``s:``,
  ``c:``, ``z:``): searches, turns, the session diagnostic; steps for the observation owners.
- observations (``memdiag.streams.observations``): internal steps, keyed by observation -> ``o:``:
  the ledger of each observation; weights, and verdicts back to the sessions.
- memory (``memdiag.streams.memory``): ``memory`` (keyed by agent, co-partitioned with
  ``events``) -> per-agent state (``m:``, ``mx:``, ``mm:``): memory rows, probes, breaks.
- judgements (``memdiag.streams.judgements``): ``judgements`` -> a ``judgement`` record each
  (stateless).
- counters (``memdiag.streams.counters``): the increments on ``counters`` -> a per-minute rollup of
  each (``rollups`` table), back on ``counters``.

All seven run as :class:`memdiag.streams.batches.BatchRunner` tasks: batches, one state write
per touched key, offsets committed by the runner only once everything before them is
durable. The sessions, observations, agents and traces share one table (and so one
changelog); their source topics are co-partitioned, so Faust's assignor gives partition p of
all of them to one worker, with changelog partition p. Counters are an alerting signal, not
the record (DuckDB is): an increment the worker buffered in its last second before a crash
is not sent.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from aiokafka.partitioner import murmur2

from memdiag.contract.envelope import InMessage, Output
from memdiag.schemas.deadletters import failed_output
from memdiag.streams.app import Wiring
from memdiag.streams.batches import BatchRunner
from memdiag.streams.counters import Rollups
from memdiag.streams.judgements import JudgementProcessor
from memdiag.streams.memory import MemoryStage
from memdiag.streams.metrics import Counters
from memdiag.streams.observations import ObservationOwner
from memdiag.streams.otlp import SpanStage
from memdiag.streams.outputs import CounterBuffer, Sender, TableStore
from memdiag.streams.processor import Processor
from memdiag.streams.traces import TraceStage

log = logging.getLogger("memdiag.worker")

#: How often aggregated counter increments go to the counters topic (seconds).
COUNTER_FLUSH_SECONDS = 1.0


def register(w: Wiring) -> None:
    app, settings = w.app, w.settings
    partitions = settings.events_partitions

    @lru_cache(maxsize=65_536)
    def partition_of(session_id: str) -> int:
        """The partition Kafka's default partitioner gives a ``session_id`` key."""
        return (murmur2(session_id.encode("utf-8")) & 0x7FFFFFFF) % partitions

    sender = Sender(
        app,
        w.diagnostics,
        w.deadletter,
        w.weights,
        w.events,
        w.steps,
        w.verdicts,
        w.counters,
        w.memory,
        w.otlp_traces,
        w.span_events,
        CounterBuffer(),
        Counters(),
    )
    processor = Processor(settings, partition_of)
    memory = MemoryStage(settings, partition_of)
    traces = TraceStage(settings, partition_of)
    state = TableStore(w.state)

    def on_failure(msg: InMessage, exc: BaseException) -> Any:
        return failed_output(msg, exc, settings)

    every = settings.commit_interval_seconds
    runners = [
        BatchRunner(app, "spans", [w.otlp_spans], SpanStage(settings, partition_of), None, sender,
                    on_failure, commit_interval=every),
        BatchRunner(app, "traces", [w.otlp_traces], traces, state, sender, on_failure,
                    commit_interval=every),
        BatchRunner(app, "sessions", [w.events, w.verdicts, w.span_events], processor, state,
                    sender, on_failure, commit_interval=every),
        BatchRunner(app, "observations", [w.steps], ObservationOwner(settings), state, sender,
                    on_failure, commit_interval=every),
        BatchRunner(app, "memory", [w.memory], memory, state, sender, on_failure,
                    commit_interval=every),
        # stateless, but its outputs are as precious: same offsets discipline
        BatchRunner(app, "judgements", [w.judgements], JudgementProcessor(settings), None,
                    sender, on_failure, commit_interval=every),
    ]  # fmt: skip

    def increment_failed(msg: InMessage, exc: BaseException) -> Output:
        # the alerting signal, never a reason to stop (the runner has logged it)
        return Output()

    # Last: it consumes the increments the others send. Under Faust's own commit it could
    # stop committing after a rebalance (its offsets never moved again: a worker that looked
    # behind forever); under the runner its offsets follow what is durable, like the others.
    runners.append(
        BatchRunner(app, "counters", [w.counters], Rollups(), TableStore(w.rollups), sender,
                    increment_failed, commit_interval=every)
    )  # fmt: skip
    for runner in runners:
        app.task(runner.run)
    w.runners = runners

    @app.timer(COUNTER_FLUSH_SECONDS)
    async def flush_counters() -> None:
        await sender.flush_counters()

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]  # mode types receivers oddly
    async def _on_assigned(sender_: Any, assigned: Any = (), **kwargs: Any) -> None:
        processor.partitions_changed()
        memory.partitions_changed()
        traces.partitions_changed()
        mine = sorted(tp.partition for tp in assigned if tp.topic == w.events.get_topic_name())
        log.info("memdiag worker assigned partitions %s of %s", mine, w.events.get_topic_name())

    @app.on_rebalance_complete.connect  # type: ignore[arg-type]  # mode types receivers oddly
    async def _on_ready(sender_: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        log.info("memdiag worker ready: partitions assigned and state recovered")

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # mode types receivers oddly
    async def _on_revoked(sender_: Any, *args: Any, **kwargs: Any) -> None:
        for runner in runners:
            await runner.on_revoked()

    async def _flush_on_stop(*args: Any, **kwargs: Any) -> None:
        """Every batch's outputs out, the counters they added, then the offsets."""
        for runner in runners:
            await runner.wait_idle(commit=False)
        await sender.flush_counters()
        for runner in runners:
            await runner.commit()
            await runner.stop()

    app.on_before_shutdown.connect(_flush_on_stop)
