"""The followup pipeline end to end: Kafka in, Faust worker, sink, DuckDB out."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)

from memdiag.settings import Settings
from tests.integration.conftest import Pipeline

pytestmark = pytest.mark.integration


def search(eid: str, sid: str, ts: str, query: str, ids: list[str], **kw) -> dict:
    return {
        "kind": "search",
        "event_id": eid,
        "session_id": sid,
        "ts": ts,
        "query": query,
        "result_ids": ids,
        **kw,
    }


def session_events(sid: str) -> list[dict]:
    """a -> b is a followup; c retries b's query; d comes after the window; v is a viewer."""
    return [
        search(f"{sid}-a", sid, "2026-11-21T09:30:00.000Z", "auth flow", ["o1", "o2"]),
        search(f"{sid}-b", sid, "2026-11-21T09:30:12.250Z", "auth token expiry", ["o7"]),
        search(f"{sid}-v", sid, "2026-11-21T09:30:13.000Z", "auth", ["o1"], source="viewer"),
        search(f"{sid}-c", sid, "2026-11-21T09:30:20.000Z", " Auth Token Expiry", ["o8"]),
        search(f"{sid}-e", sid, "2026-11-21T09:30:21.000Z", "auth cookie", []),
        search(f"{sid}-d", sid, "2026-11-21T09:31:30.000Z", "vault secret", ["o9"]),
    ]


EXPECTED = {  # suffix -> (is_followup, prev suffix, gap)
    "a": (False, None, None),
    "b": (True, "a", 12.25),
    "v": (False, None, None),
    "c": (False, "b", 7.75),
    "e": (False, None, None),
    "d": (False, "c", 70.0),
}


def verdicts(p: Pipeline, sid: str) -> dict[str, tuple]:
    rows = p.query(
        f"SELECT event_id, is_followup, prev_event_id, gap_seconds FROM searches "  # noqa: S608
        f"WHERE session_id = '{sid}'"
    )
    return {
        eid.rsplit("-", 1)[1]: (f, prev.rsplit("-", 1)[1] if prev else None, gap)
        for eid, f, prev, gap in rows
    }


def test_keyed_batched_and_unkeyed_sessions_get_the_contract_verdicts(pipeline: Pipeline) -> None:
    pipeline.start()
    keyed, batched = "ses-keyed", "ses-batch"
    unkeyed = [f"ses-nokey-{i}" for i in range(6)]  # spread over partitions, out of order
    messages: list = [(keyed.encode(), e) for e in session_events(keyed)]
    messages.append((batched.encode(), session_events(batched)))
    for sid in unkeyed:
        messages.extend((None, e) for e in session_events(sid))
    pipeline.publish(messages)
    pipeline.drain()
    for sid in [keyed, batched, *unkeyed]:
        assert verdicts(pipeline, sid) == EXPECTED, sid
    assert pipeline.query("SELECT agent_searches, followups FROM followup_rate") == [(40, 8)]


def test_a_bad_event_between_good_ones_is_dead_lettered_and_the_rest_processed(
    pipeline: Pipeline,
) -> None:
    pipeline.start()
    sid = "ses-bad"
    good = session_events(sid)
    pipeline.publish(
        [
            (sid.encode(), good[0]),
            (sid.encode(), b"{this is not json"),
            (
                sid.encode(),
                [good[1], {"kind": "search", "event_id": "no-ts", "session_id": sid}, good[2]],
            ),
            (
                None,
                {
                    "kind": "search",
                    "event_id": "x" * 200,
                    "session_id": sid,
                    "ts": "2026-11-21T09:30:00Z",
                    "query": "q",
                    "result_ids": [],
                },
            ),
            (sid.encode(), good[3:]),
        ]
    )
    pipeline.drain()
    assert verdicts(pipeline, sid) == EXPECTED
    dead = pipeline.query(
        'SELECT reason, batch_index, topic, "partition" IS NOT NULL, "offset" IS NOT NULL, '
        "length(detail) > 0, payload IS NOT NULL FROM dead_letters ORDER BY reason"
    )
    topic = pipeline.settings.topics.events
    assert dead == [
        ("id_too_long", 0, topic, True, True, True, True),
        ("missing_field", 1, topic, True, True, True, True),
        ("not_json", 0, topic, True, True, True, True),
    ]


def test_replaying_the_same_input_leaves_duckdb_unchanged(pipeline: Pipeline) -> None:
    """A replay re-consumes the same offsets: nothing changes, dead letters included.
    Publishing the same lines again is new input: the valid events count once (their
    event_id), each bad line is a new dead letter."""
    pipeline.start()
    messages: list = []
    for i in range(4):
        sid = f"ses-replay-{i}"
        messages.append((sid.encode(), session_events(sid)))
        messages.append((None, search(f"{sid}-late", sid, "2026-11-21T09:30:15Z", "late", ["o3"])))
    messages.append((None, b"not json at all"))
    pipeline.publish(messages)
    pipeline.drain()
    first = pipeline.snapshot()
    assert len(first["searches"]) == 4 * 7 and len(first["dead_letters"]) == 1
    # a replay: the worker's group starts over from the first offset
    pipeline.stop()
    rewind(pipeline.settings, pipeline.settings.app_id, pipeline.settings.topics.events)
    pipeline.start()
    pipeline.drain()
    assert pipeline.snapshot() == first
    # the same lines published again: new input
    pipeline.publish(messages)
    pipeline.drain()
    again = pipeline.snapshot()
    assert {t: rows for t, rows in again.items() if t != "dead_letters"} == {
        t: rows for t, rows in first.items() if t != "dead_letters"
    }
    assert len(again["dead_letters"]) == 2


class AllToOne(AbstractPartitionAssignor):
    """Every partition to the one member, under the protocol name the worker's group uses."""

    name = "faust"
    version = 0

    @classmethod
    def assign(cls, cluster: Any, members: dict[str, Any]) -> dict[str, Any]:
        topics = {t for m in members.values() for t in m.subscription}
        partitions = [
            (t, p) for t in sorted(topics) for p in sorted(cluster.partitions_for_topic(t))
        ]
        assignment: dict[str, Any] = {}
        for i, member in enumerate(sorted(members)):
            mine: dict[str, list[int]] = {}
            if i == 0:
                for t, p in partitions:
                    mine.setdefault(t, []).append(p)
            assignment[member] = ConsumerProtocolMemberAssignment(
                cls.version, sorted(mine.items()), b""
            )
        return assignment

    @classmethod
    def metadata(cls, topics: Any) -> Any:
        return ConsumerProtocolMemberMetadata(cls.version, list(topics), b"")

    @classmethod
    def on_assignment(cls, assignment: Any) -> None:
        pass


def rewind(settings: Settings, group: str, topic: str) -> None:
    """Commit offset 0 on every partition of ``topic`` for ``group`` (stopped meanwhile)."""

    async def go() -> None:
        # join the (now empty) group as its one member: a commit needs a live generation
        c = AIOKafkaConsumer(
            topic,
            bootstrap_servers=settings.bootstrap_servers,
            group_id=group,
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
            partition_assignment_strategy=(AllToOne,),
        )
        await c.start()
        try:
            deadline = asyncio.get_running_loop().time() + 60
            while not c.assignment():
                assert asyncio.get_running_loop().time() < deadline, "never joined the group"
                await c.getmany(timeout_ms=200)
            await c.commit({TopicPartition(topic, tp.partition): 0 for tp in c.assignment()})
        finally:
            await c.stop()

    asyncio.run(go())


def test_a_worker_killed_mid_stream_resumes_from_its_changelog(pipeline: Pipeline) -> None:
    pipeline.start()
    sid = "ses-crash"
    events = session_events(sid)
    pipeline.publish([(sid.encode(), e) for e in events[:2]])
    pipeline.drain()
    pipeline.kill("worker")  # SIGKILL: no goodbye, no final commit
    pipeline.start("worker")
    pipeline.publish([(sid.encode(), e) for e in events[2:]])
    pipeline.drain()
    assert verdicts(pipeline, sid) == EXPECTED  # c and d still see b and c from recovered state
