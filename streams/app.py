"""The one Faust app of memdiag, built from a :class:`memdiag.settings.Settings`.

Its id (``MEMDIAG_APP_ID``, default ``memdiag-worker``) names the worker's consumer group
and its changelog topics: keep it stable. Building the app connects to nothing; the broker
is reached only when the worker starts. :func:`create_app` builds the app, its topics and
tables, and wires the stages to the runner (:mod:`memdiag.streams.wiring`).

Faust's part is the worker's lifecycle, the consumer group with its co-partitioning assignor
(partition p of every stage topic and of the changelog go to one worker), and each table's
changelog recovery through memdiag's store (:mod:`memdiag.streams.tables`). It never commits
the stage topics (their channel has acks off: the runner's checkpoint commits them), and its
standby replicas are off: a standby would apply changelog records the checkpoint has not
committed.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from faust.types import TableT, TopicT

from memdiag.kafka import DefaultPartitioner, ssl_context
from memdiag.settings import Settings
from memdiag.streams.tables import SCHEME, StoreOptions

#: The tables' names (their changelogs: ``<app id>-<name>-changelog``). ``-v2``: the
#: checkpoint's changelog format (raw keys, records headed by the offsets they cover); the
#: tables of memdiag 0.1 (``state``, ``rollups``) are not read (docs/architecture.md).
STATE_TABLE = "state-v2"
ROLLUPS_TABLE = "rollups-v2"
#: records the worker's consumer hands over per poll, for all its partitions: two of the
#: runner's batches (memdiag.streams.runner.Runner.MAX_BATCH)
MAX_POLL_RECORDS = 2_000


@dataclass
class Wiring:
    """The app and everything the stages are wired to."""

    settings: Settings
    app: faust.App
    events: TopicT
    judgements: TopicT
    #: the recall pipeline's events, keyed by agent_id (co-partitioned with ``events``)
    memory: TopicT
    diagnostics: TopicT
    deadletter: TopicT
    counters: TopicT
    weights: TopicT
    #: graph entity and edge weights, keyed entity:ID or edge:SOURCE|TARGET|RELATIONSHIP
    graph_weights: TopicT
    #: internal: a session's step per observation, keyed by observation_id
    steps: TopicT
    #: internal: observations' verdicts on a failed session, keyed by session_id
    verdicts: TopicT
    #: OpenTelemetry spans in (the Collector's Kafka exporter's records), any key
    otlp_spans: TopicT
    #: internal: span records, keyed by trace id (co-partitioned with ``events``)
    otlp_traces: TopicT
    #: internal: what spans say of a session, keyed by session_id (co-partitioned)
    span_events: TopicT
    #: The state of the four stateful stages, one table apart by key prefix: sessions,
    #: observations, agents' recall pipelines and traces.
    state: TableT
    #: Counter rollups: counter name and attributes -> {minute: total}.
    rollups: TableT
    #: The runner (``memdiag.streams.runner.Runner``), once wired.
    runner: Any = field(default=None)


def changelog_lags(settings: Settings) -> dict[str, int]:
    """The worker's changelog topics (Faust names them ``{app id}-{table}-changelog``), each
    with the ``min.compaction.lag.ms`` it is created with."""
    lag = round(settings.changelog_compaction_lag_hours * 3600 * 1000)
    return {f"{settings.app_id}-{name}-changelog": lag for name in (STATE_TABLE, ROLLUPS_TABLE)}


def faust_app(settings: Settings) -> faust.App:
    # Faust wants a data directory even though memdiag's store keeps its files elsewhere
    # (MEMDIAG_STATE_DIR): keep it out of the user's working directory
    datadir = Path(tempfile.gettempdir()) / f"memdiag-faust-{os.getuid()}"
    datadir.mkdir(mode=0o700, exist_ok=True)
    return faust.App(
        settings.app_id,
        broker=settings.broker,
        store="memory://",  # the tables name memdiag's own store
        datadir=str(datadir / settings.app_id),
        web_enabled=False,
        autodiscover=False,
        topic_partitions=settings.events_partitions,
        topic_replication_factor=settings.replication_factor,
        topic_allow_declare=True,
        table_standby_replicas=0,  # a standby would apply uncommitted changelog records
        processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=settings.commit_interval_seconds,
        broker_session_timeout=settings.session_timeout_seconds,
        broker_heartbeat_interval=settings.heartbeat_interval_seconds,
        broker_rebalance_timeout=max(10.0, settings.session_timeout_seconds * 2),
        producer_linger=0.005,
        producer_max_batch_size=512 * 1024,
        producer_max_request_size=8 * 1024 * 1024,
        producer_acks=-1,
        producer_partitioner=DefaultPartitioner(),  # Kafka's, with a faster murmur2
        stream_wait_empty=False,  # nothing of the stage topics is acked through Faust
        # per partition and fetch: aiokafka holds a fetched partition's bytes until its last
        # record is taken, up to this much a partition (4 MiB held 28 MB at a catch-up,
        # benchmarks/memory_live.py; 1 MiB cost a quarter of the batched rate)
        consumer_max_fetch_size=2 * 1024 * 1024,
        # records decoded per poll (aiokafka keeps the rest of a fetch as its raw bytes):
        # unbounded, every fetched partition's records were decoded at once, 70,000 records
        # and 22 MB at a catch-up of 20,000 sessions (benchmarks/memory_live.py)
        broker_max_poll_records=MAX_POLL_RECORDS,
        stream_recovery_delay=0.0,
        broker_credentials=credentials(settings),
    )


def credentials(settings: Settings) -> faust.types.auth.CredentialsT | None:
    """Faust's form of ``MEMDIAG_KAFKA_*`` (the same as every other client's,
    :func:`memdiag.kafka.client_options`)."""
    context = ssl_context(settings)
    if settings.kafka_security_protocol.startswith("SASL_"):
        return faust.SASLCredentials(
            username=settings.kafka_sasl_username,
            password=settings.kafka_sasl_password,
            mechanism=settings.kafka_sasl_mechanism,
            ssl_context=context,
        )
    if context is not None:
        return faust.SSLCredentials(context)
    return None


def state_path(settings: Settings) -> Path:
    """The folder of the worker's local state (one per app id)."""
    return Path(settings.state_dir) / settings.app_id


def create_app(settings: Settings) -> Wiring:
    app = faust_app(settings)
    topics = settings.topics

    def raw_topic(name: str, partitions: int) -> TopicT:
        return app.topic(
            name,
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
            partitions=partitions,
        )

    kafka_box: list[Any] = []

    async def committed(tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        from memdiag.streams.compat import FaustKafka

        if not kafka_box:
            kafka_box.append(FaustKafka(app))
        found: dict[tuple[str, int], int] = await kafka_box[0].committed(tps)
        return found

    compaction_lag_ms = round(settings.changelog_compaction_lag_hours * 3600 * 1000)

    def table(name: str, sources: tuple[str, ...], partitions: int) -> TableT:
        options = StoreOptions(
            sources=sources,
            kind=settings.state_store,
            path=state_path(settings) if settings.state_store == "rocksdb" else None,
            committed=committed,
            cache_bytes=settings.state_cache_mb << 20,
            write_buffer_bytes=settings.state_write_buffers_mb << 20,
        )
        return app.Table(
            name,
            default=None,
            key_type=bytes,  # raw: the checkpoint writes the bytes itself
            value_type=bytes,
            partitions=partitions,
            store=f"{SCHEME}://{name}",  # (yarl takes an URL without a host for false)
            options={"memdiag": options},
            extra_topic_configs={"min.compaction.lag.ms": str(compaction_lag_ms)},
        )

    stateful = (topics.events, topics.session_verdicts, topics.span_events,
                topics.observation_steps, topics.memory, topics.otlp_traces)  # fmt: skip
    wiring = Wiring(
        settings=settings,
        app=app,
        events=raw_topic(topics.events, settings.events_partitions),
        judgements=raw_topic(topics.judgements, settings.judgements_partitions),
        memory=raw_topic(topics.memory, settings.events_partitions),
        diagnostics=raw_topic(topics.diagnostics, settings.diagnostics_partitions),
        deadletter=raw_topic(topics.deadletter, settings.aux_partitions),
        counters=raw_topic(topics.counters, settings.aux_partitions),
        weights=raw_topic(topics.weights, settings.aux_partitions),
        graph_weights=raw_topic(topics.graph_weights, settings.aux_partitions),
        steps=raw_topic(topics.observation_steps, settings.events_partitions),
        verdicts=raw_topic(topics.session_verdicts, settings.events_partitions),
        otlp_spans=raw_topic(topics.otlp_spans, settings.events_partitions),
        otlp_traces=raw_topic(topics.otlp_traces, settings.events_partitions),
        span_events=raw_topic(topics.span_events, settings.events_partitions),
        state=table(STATE_TABLE, stateful, settings.events_partitions),
        rollups=table(ROLLUPS_TABLE, (topics.counters,), settings.aux_partitions),
    )
    from memdiag.streams.wiring import register

    register(wiring)
    return wiring
