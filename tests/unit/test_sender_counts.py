"""The OpenTelemetry counters take a checkpoint's increments once it committed: they cannot
take one back, and a checkpoint that fails (a stage that raised, a failed delivery, a refused
commit) is taken again and counts again."""

from __future__ import annotations

import asyncio
from typing import Any

from memdiag.contract import SEARCH_CALLS
from memdiag.contract.envelope import Output, counter_key
from memdiag.streams.sender import CounterBuffer, Sender


class Topic:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_topic_name(self) -> str:
        return self.name


class NoBroker:
    async def add(self, *args: Any) -> None:
        pass

    async def flush(self) -> list[Any]:
        return []


class Recorded:
    def __init__(self) -> None:
        self.added: list[dict[Any, int]] = []

    def add_all(self, counts: Any) -> None:
        self.added.append(dict(counts))


def test_the_opentelemetry_counters_wait_for_the_commit() -> None:
    metrics = Recorded()
    topics = [Topic(f"t{i}") for i in range(11)]
    sender = Sender(NoBroker(), *topics[:10], CounterBuffer(), metrics, topics[10])  # type: ignore[arg-type]
    key = counter_key(SEARCH_CALLS, source="agent")

    def out() -> Output:
        o = Output()
        o.add(key, 2, 1_795_000_000_000_000)
        return o

    async def go() -> None:
        await sender.send(out())
        await sender.flush_counters()
        assert metrics.added == []  # sent to the topic, not yet exported
        sender.discard()  # the checkpoint failed: its records are taken again
        await sender.send(out())
        await sender.flush_counters()
        sender.committed()
        sender.committed()  # nothing more to add

    asyncio.run(go())
    assert metrics.added == [{key: 2}]
