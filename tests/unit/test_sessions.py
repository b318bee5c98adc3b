"""The whole worker without a broker: events -> sessions -> observation owners -> gather.

``Worker`` below routes each stage's output by Kafka's default partitioner, as the real
topics do, so these tests exercise the partitioning the issue is about: sessions on
different partitions sharing observations.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from aiokafka.partitioner import murmur2
from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.settings import Settings
from streams.observations import Gatherer, ObservationOwner
from streams.processor import (
    FEEDBACK,
    MISLEADING,
    SESSION_OUTCOMES,
    UNMATCHED_TURNS,
    InMessage,
    Output,
    Processor,
)

#: A copy of CONTRACT's example events (shared/examples/events.jsonl), so the tests run on a
#: clone without the shared folder; test_the_copy_is_current checks it where both exist.
EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "contract_example.jsonl"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "examples" / "events.jsonl"
SETTINGS = Settings()
PARTITIONS = 4


def partition(key: str) -> int:
    return (murmur2(key.encode()) & 0x7FFFFFFF) % PARTITIONS


class Worker:
    """Three stages, each with one state dict per partition, fed in Kafka's order."""

    def __init__(self, settings: Settings = SETTINGS):
        self.events = Processor(settings, partition)
        self.owner = ObservationOwner(settings)
        self.gather = Gatherer(settings)
        self.stores: dict[str, list[dict[str, bytes]]] = {
            s: [{} for _ in range(PARTITIONS)] for s in ("events", "owner", "gather")
        }
        self.records: list[dict[str, Any]] = []
        self.weights: list[dict[str, Any]] = []
        self.counts: Counter = Counter()
        self._offset = 0

    def publish(self, events: list[dict[str, Any]]) -> None:
        for e in events:
            self._run("events", e["session_id"], orjson.dumps(e))

    def _run(self, stage: str, key: str, value: bytes) -> None:
        p = partition(key)
        self._offset += 1
        msg = InMessage(f"memdiag.{stage}", p, self._offset, key.encode(), value, 0)
        logic = {"events": self.events, "owner": self.owner, "gather": self.gather}[stage]
        out: Output = logic.process(msg, self.stores[stage][p])
        self.counts.update(out.counts)
        for records in out.diagnostics.values():
            self.records.extend(records)
        for recs in out.weights.values():
            self.weights.extend(recs)
        for obs_id, recs in out.steps.items():
            self._run("owner", obs_id, orjson.dumps(recs))
        for session_id, recs in out.verdicts.items():
            self._run("gather", session_id, orjson.dumps(recs))

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]

    def diagnostics(self) -> dict[str, dict[str, Any]]:
        return {r["session_id"]: r for r in self.of_kind("session_diagnostic")}


def example_events() -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for line in EXAMPLES.read_text().splitlines()
        if line.strip() and json.loads(line)["kind"] != "judgement"
    ]


def test_the_copy_is_current() -> None:
    if not SHARED.exists():
        return  # a clone without the shared folder: nothing to compare
    assert EXAMPLES.read_text() == SHARED.read_text()


def test_the_contract_example() -> None:
    w = Worker()
    w.publish(example_events())
    feedback = {r["observation_id"]: r for r in w.of_kind("retrieval_feedback")}
    assert feedback["obs_7"]["signal"] == "used" and feedback["obs_9"]["signal"] == "ignored"
    assert feedback["obs_7"]["turn_id"] == "t1" and feedback["obs_7"]["keyword_count"] == 8
    d = w.diagnostics()["ses_abc"]
    assert d["outcome"] == "rejected" and d["failure_category"] == "test_failure"
    assert d["injected_observation_ids"] == ["obs_7", "obs_9"]
    assert d["injected_graph_entity_ids"] == ["node_x"]
    assert d["injected_graph_edge_keys"] == [
        {"source_id": "node_x", "target_id": "node_y", "relationship": "DEPENDS_ON"}
    ]
    assert d["ignored_observation_ids"] == ["obs_9"]
    assert d["misleading_observation_ids"] == []
    assert (d["search_count"], d["followup_count"]) == (2, 1)
    assert d["helpful_observation_ids"] == ["obs_7"]
    assert d["files_modified"] == ["src/auth.ts"]
    assert d["tool_call_summary"][0] == {
        "tool": "vitest",
        "file": "src/auth.test.ts",
        "success": False,
    }
    assert [x["weight"] for x in w.weights] == [0.8, 0.8]
    assert (
        w.counts[
            (SESSION_OUTCOMES, (("failure_category", "test_failure"), ("outcome", "rejected")))
        ]
        == 1
    )
    assert w.counts[(FEEDBACK, (("signal", "used"),))] == 1


def session(
    sid: str, outcome: str, obs: list[str], ts: str = "2026-11-21T10:00:00Z", turn=True
) -> list[dict]:
    events: list[dict] = [
        {
            "kind": "injection",
            "event_id": f"{sid}-i",
            "ts": ts,
            "session_id": sid,
            "turn_id": "t1",
            "observations": [
                {"id": o, "content": f"memory {o} about deployment pipelines"} for o in obs
            ],
        }
    ]
    if turn:
        events.append(
            {
                "kind": "response",
                "event_id": f"{sid}-r",
                "ts": ts,
                "session_id": sid,
                "turn_id": "t1",
                "text": "unrelated answer",
            }
        )
    events.append(
        {
            "kind": "session_outcome",
            "event_id": f"{sid}-o",
            "ts": ts,
            "session_id": sid,
            "outcome": outcome,
            "tool_calls": [],
            "files_modified": ["a.py"] if outcome != "accepted" else [],
            "errors": [{"message": "wrong", "tool": "edit", "recoverable": True}],
        }
    )
    return events


def sessions_on_distinct_partitions(n: int) -> list[str]:
    found: dict[int, str] = {}
    i = 0
    while len(found) < n:
        found.setdefault(partition(f"sess-{i}"), f"sess-{i}")
        i += 1
    return list(found.values())


def test_an_observation_shared_across_partitions_is_counted_once_per_session() -> None:
    sids = sessions_on_distinct_partitions(4)
    w = Worker()
    for sid in sids[:3]:
        w.publish(session(sid, "rejected", ["shared", f"own-{sid}"]))
    d = w.diagnostics()
    assert d[sids[0]]["misleading_observation_ids"] == []
    assert d[sids[1]]["misleading_observation_ids"] == []
    assert d[sids[2]]["misleading_observation_ids"] == ["shared"]  # the third failure
    shared = [x for x in w.weights if x["observation_id"] == "shared"]
    assert [x["failed_sessions"] for x in shared] == [1, 2, 3]
    assert [x["aggressive"] for x in shared] == [False, False, True]
    assert w.counts[(MISLEADING, ())] == 1
    w.publish(session(sids[3], "rejected", ["shared"]))
    assert w.diagnostics()[sids[3]]["misleading_observation_ids"] == ["shared"]
    assert w.counts[(MISLEADING, ())] == 1  # once, when it became misleading


def test_an_accepted_session_clears_misleading_and_gets_the_light_record() -> None:
    sids = sessions_on_distinct_partitions(4)
    w = Worker()
    w.publish(session(sids[0], "accepted", ["x"]))
    for sid in sids[1:]:
        w.publish(session(sid, "rework", ["x"]))
    d = w.diagnostics()
    assert all(d[s]["misleading_observation_ids"] == [] for s in sids)
    light = d[sids[0]]
    assert light["failure_category"] is None
    assert light["tool_call_summary"] is None and light["files_modified"] is None
    assert light["errors_encountered"] is None
    assert d[sids[1]]["failure_category"] == "wrong_approach"


def test_replaying_every_event_changes_nothing() -> None:
    sids = sessions_on_distinct_partitions(4)
    events = [e for sid in sids for e in session(sid, "rejected", ["a", "b"])]
    w = Worker()
    w.publish(events)
    first_records = list(w.records)
    first_weights = list(w.weights)
    w.records.clear()
    w.weights.clear()
    counts = Counter(w.counts)
    w.publish(events)
    # the same records again (the sink's upserts make them no-ops), no new steps
    assert set(map(orjson.dumps, w.records)) == set(map(orjson.dumps, first_records))
    assert set(map(orjson.dumps, w.weights)) == set(map(orjson.dumps, first_weights))
    assert w.counts[(MISLEADING, ())] == counts[(MISLEADING, ())]
    assert (
        w.counts[(FEEDBACK, (("signal", "ignored"),))]
        == counts[(FEEDBACK, (("signal", "ignored"),))]
    )


def test_ignored_means_ignored_in_every_evaluated_turn() -> None:
    base = {"session_id": "s", "ts": "2026-11-21T10:00:00Z"}
    content = "deployment pipelines require approval gates"
    events = [
        {
            **base,
            "kind": "injection",
            "event_id": "i1",
            "turn_id": "t1",
            "observations": [
                {"id": "a", "content": content},
                {"id": "b", "content": content},
                {"id": "c", "content": content},
            ],
        },
        {**base, "kind": "response", "event_id": "r1", "turn_id": "t1", "text": "nothing"},
        {
            **base,
            "kind": "injection",
            "event_id": "i2",
            "turn_id": "t2",
            "observations": [{"id": "a", "content": content}],
        },
        {
            **base,
            "kind": "response",
            "event_id": "r2",
            "turn_id": "t2",
            "text": "deployment pipelines require approval",
        },
        # c's second turn never gets a response: it is not evaluated there
        {
            **base,
            "kind": "injection",
            "event_id": "i3",
            "turn_id": "t3",
            "observations": [{"id": "c", "content": content}, {"id": "d", "content": content}],
        },
        {
            **base,
            "kind": "session_outcome",
            "event_id": "o",
            "outcome": "rejected",
            "tool_calls": [],
            "files_modified": [],
            "errors": [],
        },
    ]
    w = Worker()
    w.publish(events)
    d = w.diagnostics()["s"]
    assert d["injected_observation_ids"] == ["a", "b", "c", "d"]
    assert d["ignored_observation_ids"] == ["b", "c"]  # a used once; d never evaluated
    assert d["failure_category"] == "incomplete"


def test_search_and_followup_counts() -> None:
    base = {"kind": "search", "session_id": "s", "source": "agent"}
    events = [
        {**base, "event_id": "a", "ts": "2026-11-21T10:00:00Z", "query": "x", "result_ids": ["1"]},
        {**base, "event_id": "b", "ts": "2026-11-21T10:00:05Z", "query": "y", "result_ids": ["2"]},
        {**base, "event_id": "c", "ts": "2026-11-21T10:00:06Z", "query": "z", "result_ids": []},
        {
            **base,
            "event_id": "v",
            "ts": "2026-11-21T10:00:07Z",
            "query": "z",
            "result_ids": ["3"],
            "source": "viewer",
        },
        {
            "kind": "session_outcome",
            "event_id": "o",
            "ts": "2026-11-21T10:10:00Z",
            "session_id": "s",
            "outcome": "rejected",
            "tool_calls": [],
            "files_modified": [],
            "errors": [],
        },
    ]
    w = Worker()
    w.publish(events)
    d = w.diagnostics()["s"]
    assert (d["search_count"], d["followup_count"]) == (3, 1)
    assert d["injected_observation_ids"] == [] and d["misleading_observation_ids"] == []


def test_a_failed_session_without_any_search_is_visible() -> None:
    w = Worker()
    w.publish(session("s", "rejected", ["o1"]))
    assert w.diagnostics()["s"]["search_count"] == 0


def test_a_response_that_never_meets_its_injection_is_counted_after_the_ttl() -> None:
    w = Worker()
    w.publish(
        [
            {
                "kind": "response",
                "event_id": "r",
                "ts": "2026-11-21T10:00:00Z",
                "session_id": "s",
                "turn_id": "t9",
                "text": "hello",
            },
            {
                "kind": "search",
                "event_id": "q",
                "ts": "2026-11-21T11:00:01Z",
                "session_id": "s",
                "query": "x",
                "result_ids": [],
            },
        ]
    )
    assert w.counts[(UNMATCHED_TURNS, (("half", "response"),))] == 1


def test_an_idle_pending_half_is_swept_even_if_its_session_sees_no_more_events() -> None:
    w = Worker()
    w.publish(session("idle", "rejected", ["o"], ts="2026-11-21T10:00:00Z", turn=False))
    # other sessions of the same partition move event time on
    other = next(f"x{i}" for i in range(1000) if partition(f"x{i}") == partition("idle"))
    w.publish(
        [
            {
                "kind": "search",
                "event_id": "q",
                "ts": "2026-11-21T11:00:01Z",
                "session_id": other,
                "query": "x",
                "result_ids": [],
            }
        ]
    )
    assert w.counts[(UNMATCHED_TURNS, (("half", "injection"),))] == 1
    # the closed session itself is forgotten one TTL after its last event
    assert "idle" not in w.stores["events"][partition("idle")]


@settings(max_examples=40, deadline=None)
@given(st.permutations(list(range(6))))
def test_any_session_order_gives_the_same_misleading_verdicts_at_the_end(order) -> None:
    sids = sessions_on_distinct_partitions(4) + ["extra-1", "extra-2"]
    outcomes = ["rejected", "rework", "rejected", "accepted", "rejected", "rework"]
    sessions = [
        session(sids[i], outcomes[i], ["m", f"solo-{i}"] if i != 3 else ["other"]) for i in range(6)
    ]
    w = Worker()
    for i in order:
        w.publish(sessions[i])
    last = [x for x in w.weights if x["observation_id"] == "m"][-1]
    assert (last["failed_sessions"], last["misleading"]) == (5, True)
    d = w.diagnostics()
    flagged = [s for s in sids if "m" in d[s]["misleading_observation_ids"]]
    # exactly the sessions from the third failure on see it as misleading
    assert len(flagged) == 3
