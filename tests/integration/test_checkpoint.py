"""The one checkpoint through a real broker: a worker killed (SIGKILL) after its changelog
records and before its commit leaves exactly that in the broker (records ahead of the
committed offsets, the offsets unmoved); the worker that restarts skips them, repairs their
keys, processes the records again, and DuckDB equals the reference.

Every other step, and every arrival order, is killed in-process on the whole worker in
memory (``tests/unit/test_checkpoint.py``); this is the one case through the broker.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from memdiag.kafka import client_options
from memdiag.runner import spawn_child
from memdiag.streams.app import STATE_TABLE
from memdiag.streams.store import covers_of
from tests.compare import differences, from_duckdb, from_reference
from tests.integration.conftest import Pipeline
from tests.reference import reference
from tests.scenario import generate

pytestmark = pytest.mark.integration


def changelog_and_commits(p: Pipeline) -> tuple[list[tuple[int, dict[str, int] | None]],
                                                  dict[tuple[str, int], int]]:  # fmt: skip
    """The state changelog's records (partition, covered offsets) and the worker group's
    committed offsets, as the broker has them."""
    s = p.settings
    changelog = f"{s.app_id}-{STATE_TABLE}-changelog"

    async def go() -> tuple[list[tuple[int, dict[str, int] | None]], dict[tuple[str, int], int]]:
        reader = AIOKafkaConsumer(**client_options(s), enable_auto_commit=False)
        group = AIOKafkaConsumer(**client_options(s), group_id=s.app_id,
                                 enable_auto_commit=False)  # fmt: skip
        await reader.start()
        await group.start()
        try:
            tps = [TopicPartition(changelog, n) for n in range(s.events_partitions)]
            reader.assign(tps)
            await reader.seek_to_beginning(*tps)
            records: list[tuple[int, dict[str, int] | None]] = []
            while batches := await reader.getmany(timeout_ms=1500):
                for tp, msgs in batches.items():
                    records += [(tp.partition, covers_of(m.headers)) for m in msgs]  # type: ignore[arg-type]
            committed = {}
            for topic in {t for _, covers in records for t in covers or ()}:
                for n in range(s.events_partitions):
                    offset = await group.committed(TopicPartition(topic, n))
                    committed[(topic, n)] = offset or 0
            return records, committed
        finally:
            await reader.stop()
            await group.stop()

    return asyncio.run(go())


def test_a_worker_killed_after_its_changelog_before_its_commit(pipeline: Pipeline) -> None:
    events = generate(sessions=60, seed=5)
    expected = from_reference(reference(events))
    pipeline.start("sink")
    pipeline.publish_events(events, keyed=True)
    killer = spawn_child("killer", "delivered 20", pipeline.settings, pipeline.workdir,
                         module="tests.killer")  # fmt: skip
    assert killer.proc.wait(120) == -9, killer.tail()
    killer.log_file.close()
    assert "killing the worker at delivered" in killer.log_path.read_text()

    records, committed = changelog_and_commits(pipeline)
    ahead = [
        (partition, covers)
        for partition, covers in records
        if covers and any(o >= committed.get((t, partition), 0) for t, o in covers.items())
    ]
    # the dead commit's records are in the changelog, ahead of offsets it never committed
    assert ahead, (records[-5:], committed)
    assert any(committed.values())  # two commits before it landed

    pipeline.start("worker")
    deadline = time.monotonic() + 60
    log = pipeline.workdir / "worker.log"
    while "memdiag worker ready" not in log.read_text():
        assert time.monotonic() < deadline, pipeline.children["worker"].tail()
        time.sleep(0.2)
    skipped = re.findall(rf"{STATE_TABLE} partition \d+ recovered: \d+ changelog records "
                         r"applied, (\d+) skipped", log.read_text())  # fmt: skip
    assert sum(int(n) for n in skipped) == len(ahead)  # exactly the dead commit's
    pipeline.drain(timeout=120)
    assert differences(expected, from_duckdb(pipeline.query)) == []
