"""Where a broker and Faust disagree, and what memdiag does about it.

Tansu answers ListOffsets(latest) with the base offset of a partition's last record batch
plus one. Faust takes that as the changelog's end when it recovers a table, so a last batch
of several records was lost on restart (a restarted worker forgot searches it had already
judged). :func:`patch_faust_highwaters` makes Faust's recovery use
:func:`memdiag.kafka.true_end_offsets`, which reads the true end. On Apache Kafka the answer
is unchanged, at the cost of one small fetch per changelog partition at recovery.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiokafka import TopicPartition

from memdiag.kafka import true_end_offsets

_PATCHED = False


def patch_faust_highwaters(bootstrap: str) -> None:
    global _PATCHED
    if _PATCHED:
        return
    from faust.transport.drivers import aiokafka as driver

    original = driver.AIOKafkaConsumerThread._highwaters

    async def _highwaters(self: Any, partitions: list[Any]) -> Mapping[Any, int]:
        if self.consumer.in_transaction:
            return await original(self, partitions)
        consumer = self._ensure_consumer()
        reported = await consumer.end_offsets(partitions)
        tps = {TopicPartition(tp.topic, tp.partition): tp for tp in partitions}
        fixed = await true_end_offsets(
            bootstrap,
            list(tps),
            {TopicPartition(tp.topic, tp.partition): off for tp, off in reported.items()},
        )
        return {tps[tp]: off for tp, off in fixed.items()}

    driver.AIOKafkaConsumerThread._highwaters = _highwaters  # type: ignore[method-assign]
    _PATCHED = True
