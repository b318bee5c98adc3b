"""Kafka plumbing shared by the commands: topic creation and pipeline drain checks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from memdiag.settings import ConfigError, Settings


def topic_partitions(settings: Settings) -> dict[str, int]:
    t = settings.topics
    return {
        t.events: settings.events_partitions,
        t.judgements: settings.judgements_partitions,
        t.diagnostics: settings.diagnostics_partitions,
        t.weights: settings.aux_partitions,
        t.counters: settings.aux_partitions,
        t.deadletter: settings.aux_partitions,
        # internal: as wide as `events`, so the observation and gather stages scale with it
        t.observation_steps: settings.events_partitions,
        t.session_verdicts: settings.events_partitions,
    }


async def ensure_topics(settings: Settings) -> None:
    """Create memdiag's topics with explicit partition counts; check existing ones.

    ``retention.ms``/``retention.bytes`` are set explicitly because some brokers (Tansu)
    describe only the settings a topic was created with.
    """
    wanted = topic_partitions(settings)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [
            NewTopic(
                name,
                num_partitions=n,
                replication_factor=settings.replication_factor,
                topic_configs={"retention.ms": "-1", "retention.bytes": "-1"},
            )
            for name, n in wanted.items()
            if name not in existing
        ]
        if new:
            try:
                await admin.create_topics(new)
            except TopicAlreadyExistsError:
                pass  # created concurrently by another process
        events = settings.topics.events
        if events in existing:
            described = await admin.describe_topics([events])
            have = len(described[0]["partitions"])
            if have != settings.events_partitions:
                raise ConfigError(
                    f"topic {events} has {have} partitions but MEMDIAG_EVENTS_PARTITIONS="
                    f"{settings.events_partitions}; set MEMDIAG_EVENTS_PARTITIONS={have} "
                    "(the worker's state is partitioned like this topic)"
                )
    finally:
        await admin.close()


async def true_end_offsets(
    bootstrap: str, tps: Iterable[TopicPartition], reported: dict[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """End offsets that are right even where ListOffsets is not.

    Tansu (the embedded broker) answers ListOffsets(latest) with the base offset of the
    partition's last record batch plus one, so a last batch of several records hides all
    but its first. Reading from ``reported - 1`` to the end gives the true end; on a broker
    that answers correctly (Apache Kafka) it reads one record and returns the same number.
    """
    tps = [tp for tp in tps if reported.get(tp, 0) > 0]
    ends = dict(reported)
    if not tps:
        return ends
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    await reader.start()
    try:
        reader.assign(tps)
        for tp in tps:
            reader.seek(tp, reported[tp] - 1)
        while True:  # the first fetch returns the last batch; an empty one means the end
            batches = await reader.getmany(*tps, timeout_ms=300)
            if not any(batches.values()):
                break
            for tp, records in batches.items():
                if records:
                    ends[tp] = max(ends[tp], records[-1].offset + 1)
    finally:
        await reader.stop()
    return ends


@dataclass(frozen=True, slots=True)
class Lag:
    group: str
    behind: int  # messages not yet committed by the group, over the topics asked about

    @property
    def drained(self) -> bool:
        return self.behind == 0


class LagProbe:
    """Reads how far a consumer group is behind the end of some topics.

    Committed offsets are read *before* end offsets. A worker flushes what it produced
    before it commits, so once ``committed == end`` with that order, everything the group
    consumed and everything it produced from that is in the log: the next stage can be
    checked. (The reverse order can miss a message produced between the two reads.)
    """

    def __init__(self, settings: Settings, group: str, topics: Iterable[str]):
        self.settings = settings
        self.group = group
        self.topics = list(topics)
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> LagProbe:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.settings.bootstrap_servers,
            group_id=self.group,
            enable_auto_commit=False,
        )
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    async def lag(self) -> Lag:
        consumer = self._consumer
        if consumer is None:
            raise RuntimeError("use LagProbe as an async context manager")
        tps: list[TopicPartition] = []
        for topic in self.topics:
            parts = consumer.partitions_for_topic(topic)
            if not parts:
                await consumer._client.force_metadata_update()
                parts = consumer.partitions_for_topic(topic) or set()
            tps.extend(TopicPartition(topic, p) for p in sorted(parts))
        if not tps:
            return Lag(self.group, 0)
        committed = {tp: (await consumer.committed(tp)) or 0 for tp in tps}
        ends = await consumer.end_offsets(tps)
        # Only a partition that looks drained can be fooled by a short ListOffsets answer:
        # read its true end; one that is visibly behind is behind either way.
        looks_drained = [tp for tp in tps if committed[tp] >= ends[tp]]
        if looks_drained:
            ends.update(
                await true_end_offsets(self.settings.bootstrap_servers, looks_drained, ends)
            )
        return Lag(self.group, sum(max(0, ends[tp] - committed[tp]) for tp in tps))


async def wait_drained(
    settings: Settings,
    group: str,
    topics: Iterable[str],
    timeout: float,
    poll: float = 0.2,
    on_poll: Callable[[Lag], None] | None = None,
) -> Lag:
    """Poll until ``group`` has committed everything in ``topics`` (or ``timeout``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with LagProbe(settings, group, topics) as probe:
        while True:
            lag = await probe.lag()
            if on_poll is not None:
                on_poll(lag)
            if lag.drained or loop.time() > deadline:
                return lag
            await asyncio.sleep(poll)
