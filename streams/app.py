"""The one Faust app of memdiag, built from a :class:`memdiag.settings.Settings`.

Its id (``MEMDIAG_APP_ID``, default ``memdiag-worker``) names the worker's consumer group
and its changelog topics: keep it stable. Building the app connects to nothing; the broker
is reached only when the worker starts. :func:`create_app` builds the app, its topics and
tables, and registers the stages (``memdiag.streams.agents``).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import faust
from faust.types import TableT, TopicT

from memdiag.kafka import ssl_context
from memdiag.settings import Settings


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
    #: The worker's state, one table for its four stateful stages, apart by key prefix:
    #: sessions (``memdiag.streams.processor``), observations
    #: (``memdiag.streams.observations``), agents' recall pipelines
    #: (``memdiag.streams.memory``) and traces (``memdiag.streams.traces``).
    state: TableT
    #: Counter rollups: counter name and attributes -> {minute: total} (memdiag.streams.counters).
    rollups: TableT
    #: The stages' runners (``memdiag.streams.batches.BatchRunner``), once registered.
    runners: list[Any] = field(default_factory=list)


def faust_app(settings: Settings) -> faust.App:
    # Faust creates its data directory even with memory tables; nothing durable lives
    # there, so keep it out of the user's working directory (one directory per user).
    datadir = Path(tempfile.gettempdir()) / f"memdiag-faust-{os.getuid()}"
    datadir.mkdir(mode=0o700, exist_ok=True)
    return faust.App(
        settings.app_id,
        broker=settings.broker,
        store="memory://",  # durable through the changelog topic; recovered on restart
        datadir=str(datadir / settings.app_id),
        web_enabled=False,
        autodiscover=False,  # create_app registers the agents itself (Faust's default too)
        topic_partitions=settings.events_partitions,
        topic_replication_factor=settings.replication_factor,
        topic_allow_declare=True,
        table_standby_replicas=0,
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
        stream_wait_empty=True,
        stream_buffer_maxsize=4096,
        # per partition and fetch; a quarter more events/s on batched messages than 1 MiB
        consumer_max_fetch_size=4 * 1024 * 1024,
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
        steps=raw_topic(topics.observation_steps, settings.events_partitions),
        verdicts=raw_topic(topics.session_verdicts, settings.events_partitions),
        otlp_spans=raw_topic(topics.otlp_spans, settings.events_partitions),
        otlp_traces=raw_topic(topics.otlp_traces, settings.events_partitions),
        span_events=raw_topic(topics.span_events, settings.events_partitions),
        state=app.Table(
            "state",
            default=None,
            key_type=str,  # JSON-encoded in the changelog
            value_type=bytes,  # raw: the value is already compact JSON
            partitions=settings.events_partitions,
        ),
        rollups=app.Table(
            "rollups",
            default=None,
            key_type=str,
            value_type=bytes,
            partitions=settings.aux_partitions,
        ),
    )
    from memdiag.streams.agents import register

    register(wiring)
    return wiring
