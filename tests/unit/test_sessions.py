"""The whole worker without a broker: sessions, observation owners, and their verdicts.

:class:`tests.inmemory.World` routes each stage's output by Kafka's default partitioner, as
the real topics do, so these tests exercise sessions on different partitions sharing
observations, and every arrival order the event-time rule must make irrelevant.
"""

from __future__ import annotations

import dataclasses
import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memdiag import semantic as sm
from memdiag.analytics.sink import DuckDBSink
from memdiag.contract import (
    BAD_TS,
    DEAD_LETTERS,
    FEEDBACK,
    FEEDBACK_RETRACTED,
    LATE_EVENT,
    LATE_EVENTS,
    LATE_SESSION_FORGOTTEN,
    MISLEADING,
    REUSED_EVENT_ID,
    SESSION_OUTCOMES,
    UNMATCHED_TURNS,
)
from memdiag.contract.envelope import DictStore, InMessage, Output
from memdiag.schemas.decode import parse_ts
from memdiag.schemas.models import from_dict
from memdiag.settings import Settings
from memdiag.streams.session.session import CHUNK, CHUNK_MAX, Config, Session
from memdiag.streams.session.states import HEAD, TOMBSTONE, SessionStates, chunk_key
from memdiag.streams.stages.sessions import HeldStateLost, SessionStage
from tests.compare import (
    differences,
    feedback_by_minute,
    from_records,
    from_reference,
    net_feedback,
)
from tests.inmemory import World, partition_for
from tests.reference import reference
from tests.scenario import future_events, generate
from tests.sizes import examples

#: The contract's example events, as the project keeps them (tests/spec checks the copy).
EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "contract_example.jsonl"
SETTINGS = Settings()
PARTITIONS = SETTINGS.events_partitions
HOUR_MS = 3_600_000


def partition(key: str) -> int:
    return partition_for(key, PARTITIONS)


class Worker(World):
    """A world that settles after each publish, in one deterministic schedule."""

    def __init__(self, settings: Settings = SETTINGS, seed: int = 0):
        super().__init__(settings, seed=seed)

    def publish(self, events: list[dict[str, Any]], keyed: bool = True, batch: int = 1) -> None:
        super().publish(events, keyed, batch)
        self.run()


def into_duckdb(
    path: Path, *published: list[dict[str, Any]], settings: Settings = SETTINGS
) -> DuckDBSink:
    """The worker's logic on each list of events in turn (settling after each), its records
    written by the real sink into a new DuckDB file; the sink, to write more."""
    sink = DuckDBSink(path)
    sink.init()
    w = Worker(settings)
    for events in published:
        w.publish(events)
    sink.write([*w.records, *w.weights])
    return sink


def example_events() -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for line in EXAMPLES.read_text().splitlines()
        if line.strip() and json.loads(line)["kind"] != "judgement"
    ]


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
    assert len(w.of_kind("session_diagnostic")) == 1  # sent once, when its verdicts were in


def session(
    sid: str,
    outcome: str,
    obs: list[str],
    ts: str = "2026-11-21T10:00:00Z",
    turn: bool = True,
    outcome_ts: str | None = None,
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
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
            "ts": outcome_ts or ts,
            "session_id": sid,
            "outcome": outcome,
            "tool_calls": [],
            "files_modified": ["a.py"] if outcome != "accepted" else [],
            "errors": [{"message": "wrong", "tool": "edit", "recoverable": True}],
        }
    )
    return events


def at(minute: int) -> str:
    return f"2026-11-21T10:{minute:02d}:00Z"


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
    for i, sid in enumerate(sids[:3]):
        w.publish(session(sid, "rejected", ["shared", f"own-{sid}"], ts=at(i)))
    d = w.diagnostics()
    assert d[sids[0]]["misleading_observation_ids"] == []
    assert d[sids[1]]["misleading_observation_ids"] == []
    assert d[sids[2]]["misleading_observation_ids"] == ["shared"]  # the third failure
    shared = [x for x in w.weights if x["observation_id"] == "shared"]
    assert [x["failed_sessions"] for x in shared] == [1, 2, 3]
    assert [x["aggressive"] for x in shared] == [False, False, True]
    assert w.counts[(MISLEADING, ())] == 1
    w.publish(session(sids[3], "rejected", ["shared"], ts=at(3)))
    assert w.diagnostics()[sids[3]]["misleading_observation_ids"] == ["shared"]
    assert w.counts[(MISLEADING, ())] == 1  # once, when it became misleading


def test_an_accepted_session_clears_misleading_and_gets_the_light_record() -> None:
    sids = sessions_on_distinct_partitions(4)
    w = Worker()
    w.publish(session(sids[0], "accepted", ["x"], ts=at(0)))
    for i, sid in enumerate(sids[1:]):
        w.publish(session(sid, "rework", ["x"], ts=at(i + 1)))
    d = w.diagnostics()
    assert all(d[s]["misleading_observation_ids"] == [] for s in sids)
    light = d[sids[0]]
    assert light["failure_category"] is None
    assert light["tool_call_summary"] is None and light["files_modified"] is None
    assert light["errors_encountered"] is None
    assert d[sids[1]]["failure_category"] == "wrong_approach"


def test_replaying_every_event_changes_nothing() -> None:
    sids = sessions_on_distinct_partitions(4)
    events = [e for i, sid in enumerate(sids) for e in session(sid, "rejected", ["a", "b"], at(i))]
    w = Worker()
    w.publish(events)
    before = from_records(w.tables)
    counts = dict(w.counts)
    w.records.clear()
    w.publish(events)
    assert from_records(w.tables) == before
    assert w.records == []  # a duplicate changes nothing and sends nothing
    assert w.counts[(MISLEADING, ())] == counts[(MISLEADING, ())]
    assert (
        w.counts[(FEEDBACK, (("signal", "ignored"),))]
        == counts[(FEEDBACK, (("signal", "ignored"),))]
    )


def test_ignored_means_ignored_in_every_evaluated_turn() -> None:
    def ev(kind: str, eid: str, second: int, **fields: Any) -> dict[str, Any]:
        return {
            "kind": kind,
            "event_id": eid,
            "session_id": "s",
            "ts": f"2026-11-21T10:00:{second:02d}Z",
            **fields,
        }

    content = "deployment pipelines require approval gates"
    events = [
        ev(
            "injection",
            "i1",
            1,
            turn_id="t1",
            observations=[{"id": o, "content": content} for o in "abc"],
        ),
        ev("response", "r1", 2, turn_id="t1", text="nothing"),
        ev("injection", "i2", 3, turn_id="t2", observations=[{"id": "a", "content": content}]),
        ev("response", "r2", 4, turn_id="t2", text="deployment pipelines require approval"),
        # c's second turn never gets a response: it is not evaluated there
        ev(
            "injection",
            "i3",
            5,
            turn_id="t3",
            observations=[{"id": "c", "content": content}, {"id": "d", "content": content}],
        ),
        ev(
            "session_outcome",
            "o",
            6,
            outcome="rejected",
            tool_calls=[],
            files_modified=[],
            errors=[],
        ),
    ]
    for order in (events, events[::-1]):
        w = Worker()
        w.publish(order)
        d = w.diagnostics()["s"]
        assert d["injected_observation_ids"] == ["a", "b", "c", "d"]  # first seen in event time
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


def test_a_record_timestamp_past_year_9999_is_written_as_the_last_time_there_is() -> None:
    """A Kafka record's timestamp is whatever its producer set: microseconds written as
    milliseconds put it in year 50,000. The search is applied and its row and the dead
    letter beside it carry 9999-12-31T23:59:59.999999Z; the worker does not stop."""
    w = Worker()
    search = {"kind": "search", "session_id": "s", "event_id": "a", "ts": "2026-11-21T10:00:00Z",
              "query": "x", "result_ids": ["1"], "source": "agent"}  # fmt: skip
    far = 1_800_000_000_000_000  # ms: year ~57,000
    w.append(w.events, "s", search, timestamp_ms=far)
    w.append(w.events, "s", {**search, "event_id": "b", "ts": "yesterday"}, timestamp_ms=far)
    w.append(w.events, "s", {**search, "event_id": "c", "ts": "2026-11-21T10:00:01Z"},
             timestamp_ms=-far)  # fmt: skip
    w.run()
    assert w.tables.searches["a"]["published_at"] == "9999-12-31T23:59:59.999999Z"
    assert w.tables.searches["c"]["published_at"] == "0001-01-01T00:00:00.000000Z"
    [dead] = w.tables.dead_letters
    assert (dead["reason"], dead["ts"]) == ("bad_ts", "9999-12-31T23:59:59.999999Z")


def test_a_failed_session_without_any_search_is_visible() -> None:
    w = Worker()
    w.publish(session("s", "rejected", ["o1"]))
    assert w.diagnostics()["s"]["search_count"] == 0


def response(sid: str, eid: str, ts: str, turn: str = "t9") -> dict[str, Any]:
    text = "memory about deployment pipelines"
    return {"kind": "response", "event_id": eid, "ts": ts, "session_id": sid, "turn_id": turn,
            "text": text}  # fmt: skip


def empty_search(sid: str, eid: str, ts: str) -> dict[str, Any]:
    return {"kind": "search", "event_id": eid, "ts": ts, "session_id": sid, "query": "x",
            "result_ids": []}  # fmt: skip


def test_a_half_waiting_past_the_ttl_on_its_sessions_own_clock_is_counted_and_still_joins() -> None:
    w = Worker()
    w.publish(
        [response("s", "r", "2026-11-21T10:00:00Z"), empty_search("s", "q", "2026-11-21T11:00:01Z")]
    )
    assert w.counts[(UNMATCHED_TURNS, (("half", "response"),))] == 1
    w.publish(session("s", "rejected", ["o"], ts="2026-11-21T11:30:00Z", turn=False))
    # the injection of turn t1 is not t9's: t9 stays unmatched; a late injection for t9 joins
    late = session("s", "rejected", ["late"], ts="2026-11-21T09:59:00Z", turn=False)[0]
    w.publish([{**late, "event_id": "s-late", "turn_id": "t9"}])
    rows = {(r["turn_id"], r["observation_id"]) for r in w.of_kind("retrieval_feedback")}
    assert ("t9", "late") in rows


def test_other_sessions_timestamps_never_expire_a_session() -> None:
    """The bug of the issue: a session's pending half expired on its partition's newest ts."""
    other = next(f"x{i}" for i in range(1000) if partition(f"x{i}") == partition("idle"))
    w = Worker()
    w.publish(session("idle", "rejected", ["o"], ts="2026-11-21T10:00:00Z", turn=False))
    w.publish([empty_search(other, "q", "2026-11-21T18:00:01Z")])  # 8 h later, same partition
    assert w.counts[(UNMATCHED_TURNS, (("half", "injection"),))] == 0
    w.publish([{**response("idle", "r", "2026-11-21T10:00:30Z", "t1")}])
    assert w.diagnostics()["idle"]["ignored_observation_ids"] == []  # joined, and used
    assert [r["signal"] for r in w.of_kind("retrieval_feedback")] == ["used"]


def test_an_injection_after_the_outcome_corrects_the_diagnostic_and_takes_its_steps() -> None:
    sids = sessions_on_distinct_partitions(3)
    w = Worker()
    for i, sid in enumerate(sids[:2]):
        w.publish(session(sid, "rejected", ["m"], ts=at(i)))
    events = session(sids[2], "rework", ["own"], ts=at(5))
    late = {**events[0], "event_id": "late-i", "turn_id": "t2", "observations": [
        {"id": "m", "content": "memory m about deployment pipelines"}]}  # fmt: skip
    w.publish(events)
    assert w.diagnostics()[sids[2]]["misleading_observation_ids"] == []
    w.publish([late])  # arrives after the outcome, at the same ts as the session's injection
    d = w.diagnostics()[sids[2]]
    assert events[0]["ts"] == late["ts"] and late["event_id"] < events[0]["event_id"]
    assert d["injected_observation_ids"] == ["m", "own"]  # equal ts: event_id order
    assert d["misleading_observation_ids"] == ["m"]  # m's third failed session
    assert [x["failed_sessions"] for x in w.weights if x["observation_id"] == "m"] == [1, 2, 3]


def test_a_session_with_several_outcomes_counts_once_with_its_last_outcome_in_event_time() -> None:
    events = session("s", "rejected", ["a"], ts=at(0), outcome_ts=at(10))
    later = {**events[-1], "event_id": "s-o2", "outcome": "accepted", "ts": at(20)}
    for order in ([*events, later], [later, *events]):
        w = Worker()
        w.publish(order)
        d = w.diagnostics()["s"]
        assert (d["outcome"], d["event_id"], d["failure_category"]) == ("accepted", "s-o2", None)
        history = w.tables.history
        assert list(history) == [("a", "s")]  # one step per (observation, session)
        assert history[("a", "s")]["outcome"] == "accepted"
        assert w.tables.weights["a"]["current_weight"] == 1.0


def test_a_verdict_a_late_response_changes_is_taken_back_in_its_own_minute() -> None:
    """The turn's first response by event time arrives last: the verdict counted on the
    later response is retracted in its minute, the new one counted in its own."""
    first = session("s", "rejected", ["a"], ts=at(0), turn=False, outcome_ts=at(30))
    later_used = response("s", "s-r2", at(5), turn="t1")  # uses the memory: counted first
    earlier = {**later_used, "event_id": "s-r1", "ts": at(2), "text": "an unrelated answer"}
    w = Worker()
    w.publish([*first, later_used])
    used, ignored = ((("signal", "used"),), (("signal", "ignored"),))
    assert w.counts[(FEEDBACK, used)] == 1
    w.publish([earlier])
    assert w.tables.feedback[("s", "t1", "a")]["signal"] == "ignored"
    assert (w.counts[(FEEDBACK, used)], w.counts[(FEEDBACK, ignored)]) == (1, 1)
    assert w.counts[(FEEDBACK_RETRACTED, used)] == 1
    minute = parse_ts(at(5))  # the used verdict's minute: where it is taken back
    assert w.by_minute[((FEEDBACK_RETRACTED, used), minute)] == 1
    assert net_feedback(w.by_minute) == feedback_by_minute(from_records(w.tables))
    w.publish([earlier, later_used])  # redelivered: nothing more
    assert w.counts[(FEEDBACK_RETRACTED, used)] == 1 and w.counts[(FEEDBACK, ignored)] == 1


def test_a_late_outcome_is_inserted_in_order_and_the_steps_after_it_recomputed() -> None:
    sids = sessions_on_distinct_partitions(4)
    w = Worker()
    for i in (1, 2, 3):
        w.publish(session(sids[i], "rejected", ["m"], ts=at(10 * i)))
    assert w.diagnostics()[sids[3]]["misleading_observation_ids"] == ["m"]
    w.publish(session(sids[0], "accepted", ["m"], ts=at(5)))  # first in event time, last in
    d = w.diagnostics()
    assert all(d[s]["misleading_observation_ids"] == [] for s in sids)  # corrected
    steps = sorted(w.tables.history.values(), key=lambda r: r["step"])
    assert [(r["session_id"], r["step"]) for r in steps] == [(s, i + 1) for i, s in enumerate(sids)]
    assert [round(r["weight"], 6) for r in steps] == [1.0, 0.8, 0.64, 0.512]
    assert w.tables.weights["m"]["current_step"] == 4


def test_a_forgotten_session_sends_a_late_event_to_dead_letters() -> None:
    w = Worker(Settings(session_keep_hours=1.0))
    w.publish(session("s", "rejected", ["o"]))
    w.now_ms += 2 * HOUR_MS  # processing time moves on: other traffic on the partition
    other = next(f"x{i}" for i in range(1000) if partition(f"x{i}") == partition("s"))
    w.publish([empty_search(other, "q1", "2026-11-21T10:00:00Z")])
    assert w.store.get(HEAD + "s") is None and w.store.get(TOMBSTONE + "s") is not None
    before = dict(w.diagnostics())
    w.publish([empty_search("s", "q2", "2026-11-21T10:01:00Z")])
    [dead] = w.tables.dead_letters
    assert dead["reason"] == LATE_EVENT and "forgotten" in dead["detail"]
    assert w.counts[(LATE_EVENTS, (("reason", LATE_SESSION_FORGOTTEN),))] == 1
    assert w.diagnostics() == before  # nothing changed


def _the_contract_examples_search() -> dict[str, Any]:
    return next(e for e in example_events() if e["kind"] == "search")


@pytest.mark.parametrize(
    ("change", "fields"),
    [
        ({"observations": [{"id": "other", "content": "memory other"}]}, "observations"),
        ({"ts": "2026-11-21T10:05:00Z"}, "ts"),
        ({"turn_id": "t9", "agent_id": "a2"}, "turn_id, agent_id/org_id/project_id"),
        ({"kind": "response", "text": "x"}, None),  # another kind
    ],
)
def test_an_event_id_reused_for_other_content_is_dead_lettered_and_changes_nothing(
    change: dict[str, Any], fields: str | None
) -> None:
    """event_id is the idempotency key: an event under a taken id is a redelivery only if it
    is the same event. Another one is not applied (the first stays), and not lost either."""
    events = session("s", "rejected", ["o"])
    w = Worker()
    w.publish(events)
    before = from_records(w.tables)
    reused = {**events[0], **change}  # as a response, its observations are a field ignored
    for keyed in (True, False, True):  # twice as it came, once re-routed: one row
        w.publish([reused], keyed=keyed)
    [dead] = w.tables.dead_letters
    assert dead["reason"] == REUSED_EVENT_ID
    assert "'s-i' was already taken in session 's'" in dead["detail"]
    if fields is None:
        assert "by an event of another kind" in dead["detail"]
    else:
        assert f"another injection event, which differs in {fields};" in dead["detail"]
    assert orjson.loads(dead["payload"]) == reused
    assert w.counts[(DEAD_LETTERS, (("reason", REUSED_EVENT_ID),))] == 3  # each time it came
    assert from_records(w.tables) == before


def test_the_same_event_again_is_a_redelivery_however_it_is_written() -> None:
    """Published again later (its own Kafka timestamp), its ts in another offset, with a
    field memdiag does not read, after its session was written back and read from the store
    again: the same event, nothing sent and nothing dead-lettered."""
    search = {**_the_contract_examples_search(), "session_id": "s"}
    events = [search, *session("s", "rejected", ["o"])]
    w = Worker(Settings(store_text=True))
    w.publish(events)
    before = from_records(w.tables)
    w.processor.states.forget_decoded()  # read back from the store: the records decoded
    w.records.clear()
    w.now_ms += HOUR_MS
    ts = parse_ts(events[1]["ts"]) // 1_000_000  # type: ignore[operator]
    again = [{**e, "extra": 1} for e in events]
    again[1]["ts"] = datetime.fromtimestamp(ts, timezone(timedelta(hours=2))).isoformat()
    w.publish(again, batch=4)
    assert not w.tables.dead_letters
    assert w.records == [] and from_records(w.tables) == before


def test_a_field_only_one_of_them_carries_is_no_difference() -> None:
    """The query's text is kept only under MEMDIAG_STORE_TEXT=1, which may change between
    the first publish and the next: the same search again is still the same search."""
    search = {**_the_contract_examples_search(), "session_id": "s"}
    event = from_dict(search)
    other = from_dict({**search, "query": "another query altogether"})
    for store_text in (False, True):
        session = Session("s", 0, Config(1, 1, 1, store_text=store_text))
        session.ingest(event, 1, Output())
        [known] = session.records
        session.config = Config(1, 1, 1, store_text=not store_text)  # a restart, reconfigured
        assert session.differences(known, event, 0) == ()
        assert session.differences(known, other, 0) == ("query",)


def test_a_search_reusing_an_id_with_another_query_names_the_query() -> None:
    search = {**_the_contract_examples_search(), "session_id": "s"}
    for store_text in (False, True):
        w = Worker(Settings(store_text=store_text))
        w.publish([search, {**search, "query": search["query"] + " and more"}])
        [dead] = w.tables.dead_letters
        assert "another search event, which differs in query;" in dead["detail"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 150)), min_size=2, max_size=24),
    st.integers(0, 1_000),
)
def test_where_a_batch_ends_decides_no_sessions_fate(
    plan: list[tuple[int, int]], seed: int
) -> None:
    """Three sessions on one partition, events published minutes apart around the keep time
    (1 h): whether an event comes before or after its session is forgotten is decided by the
    records alone, as if each were a batch of its own, never by where a batch ends."""
    sids = [s for s in (f"b{i}" for i in range(500)) if partition(s) == partition("b0")][:3]
    base = parse_ts("2026-11-21T10:00:00Z") // 1000  # type: ignore[operator]

    def world(max_batch: int) -> tuple[Any, list[str]]:
        w = World(Settings(session_keep_hours=1.0), seed=seed)
        for i, (who, minute) in enumerate(sorted(plan, key=lambda p: p[1])):
            ts = f"2026-11-21T{10 + minute // 60:02d}:{minute % 60:02d}:00Z"
            event = empty_search(sids[who], f"e{i}", ts)
            w.append(w.events, sids[who], event, timestamp_ms=base + minute * 60_000 + i)
        w.now_ms = base + 10 * HOUR_MS  # the wall clock is after every publish
        w.run(max_batch=max_batch)
        return from_records(w.tables), sorted(d["dead_letter_id"] for d in w.tables.dead_letters)

    assert world(1) == world(50)


def _stage_run(
    msgs: list[InMessage], seed: int, hold_max: int, write_back_at: int
) -> tuple[dict[Any, Any], set[tuple[str, str]], dict[str, bytes]]:
    """The session stage over ``msgs`` in batches of 1 to 6 (seed 0: one a batch), settled
    and its decoded sessions dropped at random points: its rows, dead letters and store."""
    rng = random.Random(seed)
    stage = SessionStage(_KEEP_1H, lambda _: 0, wall_ms=lambda: _T0_MS + 100 * HOUR_MS)
    stage.HOLD_MAX, stage.WRITE_BACK_AT = hold_max, write_back_at
    store = DictStore()
    rows: dict[Any, Any] = {}
    dead: set[tuple[str, str]] = set()
    i = 0
    while i < len(msgs):
        n = rng.randint(1, 6) if seed else 1
        out = stage.process(msgs[i : i + n], store)
        i += n
        for sid, sent in out.diagnostics.items():
            for r in sent:
                rows[(sid, r.get("kind"), r.get("event_id"), r.get("search_event_id"))] = r
        dead |= {(d["reason"], d["dead_letter_id"]) for _, d in out.deadletters}
        if seed and rng.random() < 0.3:
            stage.settle(store)  # a commit
        if seed and rng.random() < 0.2:
            stage.states.forget_decoded()  # the decoded cache evicted
    stage.settle(store)
    return rows, dead, store.data


_KEEP_1H = SETTINGS.with_(session_keep_hours=1.0)
_T0_MS = parse_ts("2026-11-21T10:00:00Z") // 1000  # type: ignore[operator]


@settings(max_examples=examples(100), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 150),
                  st.sampled_from(["search", "search", "outcome", "verdict"])),
        min_size=2, max_size=24,
    ),
    st.integers(1, 10_000),
    st.sampled_from([1, 2, 2048]),
    st.sampled_from([1, 512]),
)  # fmt: skip
def test_batches_commits_and_write_backs_decide_nothing_at_the_keep_edge(
    plan: list[tuple[int, int, str]], seed: int, hold_max: int, write_back_at: int
) -> None:
    """Searches, outcomes and owners' verdicts of three sessions on one partition, minutes
    apart around the keep time (1 h), in one topic order: where batches end, when the
    stage is settled, when its held sessions are written back and when its decoded ones are
    dropped change no row, no dead letter and no byte of the state (from a review)."""
    msgs = []
    for i, (who, minute, kind) in enumerate(sorted(plan, key=lambda p: p[1])):
        sid, ms = f"s{who}", _T0_MS + minute * 60_000 + i
        ts = f"2026-11-21T{10 + minute // 60:02d}:{minute % 60:02d}:00Z"
        if kind == "verdict":
            value = orjson.dumps([{"session_id": sid, "observation_id": "o1",
                                   "outcome_event_id": f"{sid}-o", "misleading": i % 2 == 0,
                                   "version": i}])  # fmt: skip
            topic = SETTINGS.topics.session_verdicts
        else:
            event: dict[str, Any] = (
                {"kind": "search", "event_id": f"e{i}", "ts": ts, "session_id": sid,
                 "query": "q", "result_ids": ["o1"]}
                if kind == "search"
                else {"kind": "session_outcome", "event_id": f"{sid}-o", "ts": ts,
                      "session_id": sid, "outcome": "rejected", "tool_calls": [],
                      "files_modified": ["a.py"], "errors": []}
            )  # fmt: skip
            value, topic = orjson.dumps(event), SETTINGS.topics.events
        msgs.append(InMessage(topic, 0, i, sid.encode(), value, ms))
    assert _stage_run(msgs, seed, hold_max, write_back_at) == _stage_run(msgs, 0, 2048, 512)


def test_a_backlog_published_long_ago_forgets_nothing_while_it_is_caught_up() -> None:
    """Processing time is the partition's Kafka timestamps: a worker that was down for days
    and catches up does not forget the sessions whose events are still in its backlog."""
    w = Worker(Settings(session_keep_hours=1.0))
    w.now_ms += 30 * 24 * HOUR_MS  # the wall clock is a month after the events' publish time
    events = session("s", "rejected", ["o"], turn=False)
    published = parse_ts("2026-11-21T10:00:01Z") // 1000  # type: ignore[operator]
    for i, e in enumerate(events):
        w.append(w.events, "s", e, timestamp_ms=published + i * 2 * HOUR_MS)
    w.run()
    assert w.diagnostics()["s"]["outcome"] == "rejected"
    assert not w.tables.dead_letters


def test_an_event_from_the_future_is_dead_lettered_and_changes_nothing() -> None:
    events = session("s", "rejected", ["o"])
    w = Worker()
    w.publish(events)
    before = from_records(w.tables)
    future = {**events[0], "event_id": "f", "ts": "2099-01-01T00:00:00Z", "turn_id": "t2"}
    w.append(w.events, "s", future, timestamp_ms=1_795_000_000_000)
    w.run()
    [dead] = w.tables.dead_letters
    assert dead["reason"] == BAD_TS and "in the future" in dead["detail"]
    assert from_records(w.tables) == before


def test_a_long_sessions_state_writes_stay_small() -> None:
    """The log goes to the changelog in chunks: a write never grows with the session."""
    w = Worker()
    for i in range(600):
        e = {"kind": "search", "event_id": f"e{i}", "ts": f"2026-11-21T10:{i // 60:02d}:"
             f"{i % 60:02d}Z", "session_id": "s", "query": f"q{i}", "result_ids": [f"r{i}"]}  # fmt: skip
        w.publish([e])
    sizes = [len(v) for k, v in w.store.data.items() if k.startswith(HEAD)]
    assert max(sizes) < 2_000
    assert len(w.store.data) > 600 // CHUNK  # sealed chunks


def _search(i: int, session: str = "s") -> dict[str, Any]:
    return {"kind": "search", "event_id": f"e{i:04d}", "session_id": session,
            "ts": f"2026-11-21T10:{i // 60 % 60:02d}:{i % 60:02d}Z", "query": f"q{i % 7}",
            "result_ids": [f"r{i % 5}"]}  # fmt: skip


def _chunks(store: dict[str, bytes], session: str = "s") -> list[int]:
    """The record counts of a session's sealed chunks, in order."""
    n = orjson.loads(store[HEAD + session])["n"]
    return [len(orjson.loads(store[chunk_key(session, i)])) for i in range(n)]


def test_a_batch_of_one_sessions_events_is_sealed_in_few_chunks() -> None:
    """Once the tail holds CHUNK records, a write seals all of it, CHUNK_MAX a chunk at most:
    150 events in one message are three chunks, not eighteen; single events then seal one
    every CHUNK. Loaded back, the session is its whole log, and the rows are the reference."""
    batch = [_search(i) for i in range(150)]
    singles = [_search(i) for i in range(150, 150 + 2 * CHUNK + 3)]
    w = Worker()
    w.publish(batch, batch=150)
    assert _chunks(w.store.data) == [CHUNK_MAX, CHUNK_MAX, 150 - 2 * CHUNK_MAX]
    for e in singles:
        w.publish([e])
    assert _chunks(w.store.data)[3:] == [CHUNK, CHUNK]
    assert len(orjson.loads(w.store.data[HEAD + "s"])["t"]) == 3  # the open tail
    states = SessionStates(SessionStage(SETTINGS, partition)._config, 3_600_000)
    loaded = states.load("s", partition("s"), w.store)
    assert loaded is not None
    assert [r.event_id for r in loaded.records] == [e["event_id"] for e in batch + singles]
    expected = from_reference(reference(batch + singles))
    assert differences(expected, from_records(w.tables)) == []


def test_a_session_stored_in_chunks_of_eight_goes_on_and_is_forgotten_whole() -> None:
    """State written before chunks grew (every chunk CHUNK records) loads, takes a batch
    sealed the new way after its chunks, and forgetting the session deletes every chunk."""
    first = [_search(i) for i in range(3 * CHUNK + 2)]
    w = Worker()
    for e in first:  # one event a message: chunks of CHUNK, as before
        w.publish([e])
    assert _chunks(w.store.data) == [CHUNK] * 3
    w.restart()  # nothing decoded is kept: the session is read from the store
    later = [_search(i) for i in range(len(first), len(first) + 70)]
    w.publish(later, batch=70)
    assert _chunks(w.store.data) == [CHUNK] * 3 + [CHUNK_MAX, 72 - CHUNK_MAX]
    expected = from_reference(reference(first + later))
    assert differences(expected, from_records(w.tables)) == []
    p = partition("s")
    states = SessionStates(SessionStage(SETTINGS, p)._config, keep_ms=1)
    states.clocks.advance(p, 1_900_000_000_000, 1_900_000_000_000)
    store = DictStore(dict(w.store.data))
    states.sweep(p, store, Output())
    gone = (chunk_key("s", 0)[:-1], HEAD + "s")  # every chunk of "s", and its head
    assert not [k for k in store.data if k.startswith(gone)]
    assert TOMBSTONE + "s" in store.data


def _message(e: dict[str, Any], offset: int, published_ms: int) -> InMessage:
    sid = e["session_id"]
    return InMessage(SETTINGS.topics.events, partition(sid), offset, sid.encode(),
                     orjson.dumps(e), published_ms)  # fmt: skip


def test_a_session_touched_in_many_batches_is_written_once_when_they_commit() -> None:
    """Single events of one session, a batch each: the stage holds the session and writes it
    when the runner settles it (before each commit), once, its whole tail in one chunk.
    Loaded back, the log is whole and the rows are the reference."""
    events = [_search(i) for i in range(2 * CHUNK + 3)]
    published_ms = parse_ts(events[-1]["ts"]) // 1000 + 60_000
    stage = SessionStage(SETTINGS, partition, wall_ms=lambda: published_ms)
    store = DictStore()
    for n, e in enumerate(events):
        stage.process([_message(e, n, published_ms)], store)
    assert store.writes == 0 and stage.held_bytes > 0  # the first record's sweep writes nothing
    stage.settle(store)
    assert store.writes == 3  # one chunk, one head, and the partition's clock
    assert _chunks(store.data) == [len(events)] and stage.held_bytes == 0
    loaded = SessionStates(stage._config, SETTINGS.keep_ms).load("s", partition("s"), store)
    assert loaded is not None and [r.event_id for r in loaded.records] == [
        e["event_id"] for e in events
    ]


def test_a_held_session_that_comes_back_is_not_forgotten_by_the_sweep() -> None:
    """A session last written long ago takes an event and is held; the same batch makes a
    sweep due on its partition. The sweep reads the store, so the held sessions are written
    first: the session is not forgotten (no tombstone, its log whole), and settling it
    later changes nothing more."""
    settings = SETTINGS.with_(session_keep_hours=1.0)
    first, later = _search(0), _search(1)
    later["ts"] = "2026-11-21T12:00:00Z"
    t0 = parse_ts(first["ts"]) // 1000
    clock = [t0]
    stage = SessionStage(settings, partition, wall_ms=lambda: clock[0])
    store = DictStore()
    stage.process([_message(first, 0, t0)], store)
    stage.settle(store)
    clock[0] = t0 + 2 * HOUR_MS  # past MEMDIAG_SESSION_KEEP_HOURS since its last event
    stage.process([_message(later, 1, clock[0])], store)
    assert TOMBSTONE + "s" not in store.data
    stage.settle(store)
    assert TOMBSTONE + "s" not in store.data
    loaded = SessionStates(stage._config, settings.keep_ms).load("s", partition("s"), store)
    assert loaded is not None and [r.event_id for r in loaded.records] == ["e0000", "e0001"]
    assert orjson.loads(store.data[HEAD + "s"])["l"] == clock[0]


def test_what_a_failed_batch_held_is_dropped_with_it() -> None:
    """A batch that raises takes back what the stage held, this batch's and the ones before
    it: the stage refuses to settle until the runner has rolled the checkpoint back, and
    nothing of it is written by the next one."""
    published_ms = parse_ts(_search(3)["ts"]) // 1000 + 60_000
    stage = SessionStage(SETTINGS, partition, wall_ms=lambda: published_ms)
    store = DictStore()
    stage.process([_message(_search(0), 0, published_ms)], store)
    stage.process([_message(_search(1), 1, published_ms)], store)
    broken = InMessage(SETTINGS.topics.session_verdicts, partition("s"), 0, b"s", b"{}")
    with pytest.raises(ValueError):
        stage.process([_message(_search(2), 2, published_ms), broken], store)
    assert stage.held_bytes == 0
    with pytest.raises(HeldStateLost):  # the checkpoint must not commit without them
        stage.settle(store)
    stage.reset()  # the runner's rollback
    stage.settle(store)
    assert store.writes == 0


# -- every arrival order gives the in-order result -------------------------------------------


def small_world_events(seed: int) -> list[dict[str, Any]]:
    return generate(sessions=12, seed=seed)


def _similar(memory: str, response: str) -> float:
    embed = _EMBED[0] = _EMBED[0] or sm.embedder()
    return sm.similarity(embed(memory), embed(response))


_EMBED: list[Any] = [None]
SEMANTIC = dataclasses.replace(SETTINGS, detector="semantic", similarity_threshold=0.19)


@pytest.mark.chaos
@settings(max_examples=examples(35), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(
    st.integers(0, 10_000),
    st.randoms(use_true_random=False),
    st.booleans(),
    st.sampled_from([1, 3, 50]),
    st.sampled_from([0.0, 0.25]),
    st.booleans(),
)
def test_any_arrival_order_gives_the_in_order_tables(
    scenario: int,
    rnd: random.Random,
    keyed: bool,
    max_batch: int,
    crash_rate: float,
    semantic: bool,
) -> None:
    """Under either detector: semantic verdicts are read from the vectors in the log, so a
    replay after a crash judges them again without the texts."""
    events = small_world_events(scenario % 50)
    expected = from_reference(
        reference(events, similar=_similar, threshold=0.19) if semantic else reference(events)
    )
    shuffled = list(events)
    rnd.shuffle(shuffled)
    w = World(SEMANTIC if semantic else SETTINGS, seed=rnd.randrange(1 << 30),
              crash_rate=crash_rate)  # fmt: skip
    w.publish(shuffled, keyed=keyed, batch=rnd.choice([1, 4]))
    w.run(max_batch=max_batch)
    got = from_records(w.tables)
    assert differences(expected, got) == []
    if not w.crashes:  # a crash sends a checkpoint's increments again: counters overcount
        assert net_feedback(w.by_minute) == feedback_by_minute(got)


def test_the_generated_scenario_in_every_mode_gives_the_reference() -> None:
    events = generate(sessions=100, seed=3)
    expected = from_reference(reference(events))
    modes = {
        "single events, keyed": dict(keyed=True, batch=1),
        "batched per session": dict(keyed=True, batch=25),
        "unkeyed": dict(keyed=False, batch=1),
    }
    for name, how in modes.items():
        for crash_rate in (0.0, 0.2):
            w = World(SETTINGS, seed=7, crash_rate=crash_rate)
            w.publish(events, **how)
            w.run()
            got = from_records(w.tables)
            assert differences(expected, got) == [], (name, crash_rate)
            # its redeliveries are redeliveries (none taken for an id reused), however they come
            assert w.tables.dead_letters == [], (name, crash_rate)
            if not w.crashes:  # the verdicts taken back are counted: the net stands
                assert net_feedback(w.by_minute) == feedback_by_minute(got), name
    w = World(SETTINGS, seed=8)
    w.publish(events + future_events(events))
    w.append(w.events, None, orjson.dumps(future_events(events, 1, seed=9)[0]), 1_795_000_000_000)
    w.run()
    assert differences(expected, from_records(w.tables)) == []
    assert {d["reason"] for d in w.tables.dead_letters} == {BAD_TS}


@pytest.mark.parametrize(("crash_rate", "cached"), [(0.0, 2), (0.2, 2), (0.0, 5_000)])
def test_a_batch_of_many_sessions_writes_them_back_as_it_goes_and_gives_the_reference(
    monkeypatch: pytest.MonkeyPatch, crash_rate: float, cached: int
) -> None:
    """The stage holds at most WRITE_BACK_AT sessions it decoded from the store since its
    last write (the rest are in the budgeted cache), and writing a session back twice in one
    batch changes nothing:
    also with crashes. With two sessions cached, a session written back is evicted and read
    again from the checkpoint's writes within the same batch; with all of them cached,
    nothing is decoded and nothing needs writing back."""
    monkeypatch.setattr(SessionStage, "WRITE_BACK_AT", 3)  # sessions decoded from the store
    held: list[int] = []
    touch, process, write = SessionStage._touch, SessionStage.process, SessionStates.write
    written: list[list[str]] = []

    def counting(self: SessionStage, *args: Any) -> Any:
        session = touch(self, *args)
        held.append(self.states.decoded - self._decoded_at)
        return session

    def batch(self: SessionStage, *args: Any) -> Any:
        written.append([])
        return process(self, *args)

    def writing(self: SessionStates, session: Any, store: Any) -> None:
        written[-1].append(session.session_id)
        write(self, session, store)

    monkeypatch.setattr(SessionStage, "_touch", counting)
    monkeypatch.setattr(SessionStage, "process", batch)
    monkeypatch.setattr(SessionStates, "write", writing)
    events = generate(sessions=40, seed=11)
    expected = from_reference(reference(events))
    # whole batches: the stage's calls of up to 200 events are what this is about
    w = World(SETTINGS.with_(session_cache=cached), seed=5, crash_rate=crash_rate,
              piece_bytes=None)  # fmt: skip
    w.publish(events, keyed=True, batch=1)
    w.run(max_batch=200)
    assert differences(expected, from_records(w.tables)) == []
    assert max(held) <= 3
    if cached == 2:
        assert max(held) == 3  # the bound was reached, and held
        # some session was written back, then touched again and written again, in a batch
        assert any(len(ids) > len(set(ids)) for ids in written)
