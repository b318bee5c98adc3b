"""Which topics feed which stage, and the runner they all run in. Nothing else lives here.

- spans: ``otlp_spans`` (OTLP records, any key) -> span records to the internal
  ``otlp-traces``, keyed by trace. Keeps nothing.
- traces: ``otlp-traces`` -> each trace's spans; searches, turns and outcomes to the internal
  ``span-events`` keyed by session; memory writes to ``memory``.
- sessions: ``events``, the internal ``session-verdicts`` and ``span-events`` (all keyed by
  session, co-partitioned) -> each session's log: searches, turns, the session diagnostic;
  steps for the observations.
- observations: the internal ``observation-steps``, keyed by observation -> each
  observation's ledger: weights, and verdicts back to the sessions.
- recall: ``memory`` (keyed by agent, co-partitioned with ``events``) -> each agent's
  pipeline: memory rows, probes, breaks.
- judgements: ``judgements`` -> a ``judgement`` record each. Keeps nothing.
- counters: the increments on ``counters`` -> a per-minute rollup of each (its own table),
  back on ``counters``.

Each stage is the module of its name in :mod:`memdiag.streams.stages`. The four stateful
stages share one table; their source topics are co-partitioned with its changelog, so Faust's
assignor gives partition p of all of them to one worker. All seven run in one
:class:`memdiag.streams.runner.Runner` and one checkpoint. Counters are an alerting signal,
not the record (DuckDB is): a crash before a checkpoint's commit sends that checkpoint's
increments again when its records are processed again.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

from memdiag.contract.envelope import InMessage, Output
from memdiag.kafka import broker_answers, partition_for
from memdiag.procs import heap_trimmer
from memdiag.schemas.deadletters import failed_output
from memdiag.streams.app import Wiring
from memdiag.streams.compat import FaustKafka, deliver_in_bulk, producer_batches
from memdiag.streams.metrics import Counters
from memdiag.streams.runner import Runner, StageSpec
from memdiag.streams.sender import CounterBuffer, Sender
from memdiag.streams.stages.counters import CounterStage
from memdiag.streams.stages.judgements import JudgementStage
from memdiag.streams.stages.observations import ObservationStage
from memdiag.streams.stages.recall import RecallStage
from memdiag.streams.stages.sessions import SessionStage
from memdiag.streams.stages.spans import SpanStage
from memdiag.streams.stages.traces import TraceStage

log = logging.getLogger("memdiag.worker")

#: The input a stage of events, steps, recall probes or judgements takes in one call
#: (:attr:`memdiag.streams.runner.StageSpec.piece_bytes`): its outputs grow with the input
#: (one batch of 16 MiB of steps at a catch-up made 73,000 weight and strength records,
#: 35 MB of the worker's heap; `memdiag run` catching up on 20,000 sessions peaked at
#: 307-330 MB with whole batches, 280-284 MB in pieces). The span stages take whole batches:
#: a trace's spans are written once a call, and smaller calls cost them a third of their rate.
PIECE_BYTES = 2 << 20


def register(w: Wiring) -> Runner:
    app, settings = w.app, w.settings
    partitions = settings.events_partitions

    @lru_cache(maxsize=16_384)
    def partition_of(key: str) -> int:
        """The partition Kafka's default partitioner gives a key (a session, an agent).
        Remembered for the sessions in flight: 16,384 keys hold about 3 MB (65,536 held
        13 MB once a fleet's sessions filled it), and a key not remembered costs 2 us."""
        return partition_for(key.encode("utf-8"), partitions)

    def name(topic: Any) -> str:
        return str(topic.get_topic_name())

    # every record the worker sends, in batches it fills itself (its producer starts later)
    batches = producer_batches(app)
    sender = Sender(
        batches, w.diagnostics, w.deadletter, w.weights, w.events, w.steps, w.verdicts,
        w.counters, w.memory, w.otlp_traces, w.span_events, CounterBuffer(), Counters(),
        w.graph_weights, settings.max_output_bytes,
    )  # fmt: skip

    def on_failure(msg: InMessage, exc: BaseException) -> Output:
        return failed_output(msg, exc, settings)

    def increment_failed(msg: InMessage, exc: BaseException) -> Output:
        return Output()  # the alerting signal, never a reason to stop (the runner logged it)

    state, rollups = w.state.name, w.rollups.name
    stages = [
        StageSpec("spans", (name(w.otlp_spans),), SpanStage(settings, partition_of), None,
                  on_failure),
        StageSpec("traces", (name(w.otlp_traces),), TraceStage(settings, partition_of), state,
                  on_failure),
        StageSpec("sessions", (name(w.events), name(w.verdicts), name(w.span_events)),
                  SessionStage(settings, partition_of), state, on_failure, PIECE_BYTES),
        StageSpec("observations", (name(w.steps),), ObservationStage(settings), state,
                  on_failure, PIECE_BYTES),
        StageSpec("recall", (name(w.memory),), RecallStage(settings, partition_of), state,
                  on_failure, PIECE_BYTES),
        StageSpec("judgements", (name(w.judgements),), JudgementStage(settings), None,
                  on_failure, PIECE_BYTES),
        StageSpec("counters", (name(w.counters),), CounterStage(), rollups, increment_failed),
    ]  # fmt: skip
    kafka = FaustKafka(app, batches)
    tables: dict[str, Any] = {t.name: t.data for t in (w.state, w.rollups)}  # memdiag's store
    runner = Runner(kafka, stages, tables, sender, settings.commit_interval_seconds)
    runner.commit_bytes = settings.commit_bytes
    runner.commit_idle = settings.commit_idle_seconds
    runner.stop_timeout = settings.shutdown_timeout_seconds
    if settings.heap_trim_seconds > 0:
        runner.after_commit = heap_trimmer(settings.heap_trim_seconds)

    async def answers(timeout: float) -> bool:
        return await broker_answers(settings, timeout)

    runner.answers = answers
    runner.on_fatal = app.crash
    w.runner = runner
    # Faust subscribes the stage topics through this channel and assigns them; their records
    # never reach it: they go to the runner in bulk (memdiag.streams.compat.deliver_in_bulk)
    channel = app.topic(
        *sorted(runner.topics),
        key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw",
        acks=False,
    )  # fmt: skip
    app.topics.add(channel)
    deliver_in_bulk(app, runner.topics, runner.deliver, runner.inbox.room)
    app.task(_crash_on_error(app, runner))

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]  # mode types receivers oddly
    async def _on_revoked(sender_: Any, *args: Any, **kwargs: Any) -> None:
        await runner.on_revoked()

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]  # mode types receivers oddly
    async def _on_assigned(sender_: Any, assigned: Any = (), **kwargs: Any) -> None:
        await runner.on_assigned()
        mine = sorted(tp.partition for tp in assigned if tp.topic == name(w.events))
        log.info("memdiag worker assigned partitions %s of %s", mine, name(w.events))

    @app.on_rebalance_complete.connect  # type: ignore[arg-type]  # mode types receivers oddly
    async def _on_ready(sender_: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        log.info("memdiag worker ready: partitions assigned and state recovered")

    async def _flush_on_stop(*args: Any, **kwargs: Any) -> None:
        stopped = await runner.stop()
        if not stopped.broker_gone:
            await kafka.close()

    app.on_before_shutdown.connect(_flush_on_stop)
    return runner


def _crash_on_error(app: Any, runner: Runner) -> Any:
    async def run() -> None:
        try:
            await runner.run()
        except Exception as exc:
            log.exception("runner: stopping the worker")
            await app.crash(exc)
            raise

    run.__name__ = "memdiag_runner"
    return run
