"""The one Faust app of memdiag.

Its id (``MEMDIAG_APP_ID``, default ``memdiag-worker``) names the worker's consumer group
and its changelog topics: keep it stable. Building the app connects to nothing; the broker
is reached only when the worker starts. Agents live beside this module (``streams.agents``)
and are found by autodiscovery.
"""

from __future__ import annotations

import faust

from memdiag.settings import Settings


def create_app(settings: Settings) -> faust.App:
    return faust.App(
        settings.app_id,
        broker=settings.broker,
        autodiscover=["streams.agents"],
        origin="streams",
        store="memory://",  # durable through the changelog topic; recovered on restart
        web_enabled=False,
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
    )


settings = Settings.from_env()
app = create_app(settings)
topics = settings.topics


def raw_topic(name: str, partitions: int) -> faust.TopicT:
    return app.topic(
        name,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=partitions,
    )


events_topic = raw_topic(topics.events, settings.events_partitions)
judgements_topic = raw_topic(topics.judgements, settings.judgements_partitions)
diagnostics_topic = raw_topic(topics.diagnostics, settings.diagnostics_partitions)
deadletter_topic = raw_topic(topics.deadletter, settings.aux_partitions)
counters_topic = raw_topic(topics.counters, settings.aux_partitions)
weights_topic = raw_topic(topics.weights, settings.aux_partitions)
#: internal: one session outcome's step per observation, keyed by observation_id
steps_topic = raw_topic(topics.observation_steps, settings.events_partitions)
#: internal: drafts and verdicts of failed sessions, keyed by session_id
verdicts_topic = raw_topic(topics.session_verdicts, settings.events_partitions)

#: The worker's state, one table for its three stateful stages (streams.agents gives each
#: its namespace): sessions ("s:" + session_id -> streams.processor.SessionState),
#: observations ("o:" + observation_id -> streams.diagnosis.ObservationState) and gathers
#: ("g:" + session_id -> streams.observations.Gatherer). Compact JSON values.
state = app.Table(
    "state",
    default=None,
    key_type=str,  # JSON-encoded in the changelog
    value_type=bytes,  # raw: the value is already compact JSON
    partitions=settings.events_partitions,
)

#: Counter rollups: counter name and attributes -> {minute: total} (streams.counters).
rollups = app.Table(
    "rollups",
    default=None,
    key_type=str,
    value_type=bytes,
    partitions=settings.aux_partitions,
)
