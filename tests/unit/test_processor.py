"""The worker's logic without a broker: routing, dead letters, state, sweeping."""

from __future__ import annotations

import json

import orjson

from memdiag.settings import Settings
from streams.processor import (
    DEAD_LETTERS,
    FOLLOWUPS,
    SEARCH_CALLS,
    InMessage,
    Processor,
    SessionState,
    dead_letter_id,
    failed_output,
)

SETTINGS = Settings()


def search(eid: str, ts: str, query: str, ids: list[str], sid: str = "s1", **kw) -> dict:
    return {
        "kind": "search",
        "event_id": eid,
        "ts": ts,
        "session_id": sid,
        "query": query,
        "result_ids": ids,
        **kw,
    }


def msg(value, partition: int = 0, offset: int = 0, key: bytes | None = b"s1") -> InMessage:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return InMessage("memdiag.events", partition, offset, key, raw, 1_795_000_000_000)


def everything_here(_: str) -> int:
    return 0


def test_followup_pair_in_one_batch_writes_state_once() -> None:
    p = Processor(SETTINGS, everything_here)
    store: dict[str, bytes] = {}
    writes = []

    class Counting(dict):
        def __setitem__(self, k, v):
            writes.append(k)
            super().__setitem__(k, v)

    store = Counting()
    out = p.process(
        msg(
            [
                search("a", "2026-11-21T09:30:00Z", "auth flow", ["o1"]),
                search("b", "2026-11-21T09:30:12.250Z", "auth expiry", ["o2"]),
                search("c", "2026-11-21T09:30:13Z", "x", ["o3"], source="viewer"),
            ]
        ),
        store,
    )
    rows = out.diagnostics["s1"]
    assert [
        (r["event_id"], r["is_followup"], r["prev_event_id"], r["gap_seconds"]) for r in rows
    ] == [
        ("a", False, None, None),
        ("b", True, "a", 12.25),
        ("c", False, None, None),
    ]
    assert rows[2]["evaluated"] is False and rows[2]["source"] == "viewer"
    assert writes == ["s1"]
    assert out.counts[(SEARCH_CALLS, (("source", "agent"),))] == 2
    assert out.counts[(SEARCH_CALLS, (("source", "viewer"),))] == 1
    assert out.counts[(FOLLOWUPS, ())] == 1
    assert "query" not in rows[0]


def test_query_text_is_kept_only_when_asked() -> None:
    p = Processor(SETTINGS.with_(store_text=True), everything_here)
    out = p.process(msg(search("a", "2026-11-21T09:30:00Z", "auth", ["o1"])), {})
    assert out.diagnostics["s1"][0]["query"] == "auth"


def test_state_survives_a_restart_of_the_processor() -> None:
    store: dict[str, bytes] = {}
    Processor(SETTINGS, everything_here).process(
        msg(search("a", "2026-11-21T09:30:00Z", "q1", ["o1"])), store
    )
    out = Processor(SETTINGS, everything_here).process(
        msg(search("b", "2026-11-21T09:30:05Z", "q2", ["o2"])), store
    )
    assert out.diagnostics["s1"][0]["is_followup"] is True


def test_events_of_another_partition_are_rerouted_not_processed() -> None:
    p = Processor(SETTINGS, lambda sid: 0 if sid == "here" else 1)
    store: dict[str, bytes] = {}
    out = p.process(
        msg(
            [
                search("a", "2026-11-21T09:30:00Z", "q", ["o"], sid="here"),
                search("b", "2026-11-21T09:30:00Z", "q", ["o"], sid="there", extra=1),
            ],
            key=None,
        ),
        store,
    )
    assert list(out.diagnostics) == ["here"]
    assert out.reroute == {
        "there": [search("b", "2026-11-21T09:30:00Z", "q", ["o"], sid="there", extra=1)]
    }
    assert list(store) == ["here"]


def test_bad_events_in_a_batch_are_dead_lettered_one_each() -> None:
    p = Processor(SETTINGS, everything_here)
    out = p.process(
        msg([search("a", "2026-11-21T09:30:00Z", "q", ["o"]), {"kind": "nope"}, 3], offset=17),
        {},
    )
    assert [r["event_id"] for r in out.diagnostics["s1"]] == ["a"]
    records = [r for _, r in out.deadletters]
    assert [(r["batch_index"], r["reason"], r["offset"]) for r in records] == [
        (1, "unknown_kind", 17),
        (2, "not_an_event", 17),
    ]
    assert records[0]["payload"] == '{"kind":"nope"}'
    assert out.counts[(DEAD_LETTERS, (("reason", "unknown_kind"),))] == 1


def test_dead_letter_identity_is_topic_and_bytes_not_offset() -> None:
    p = Processor(SETTINGS, everything_here)
    a = p.process(msg(b"garbage", offset=1), {}).deadletters[0][1]
    b = p.process(msg(b"garbage", offset=99), {}).deadletters[0][1]
    assert a["dead_letter_id"] == b["dead_letter_id"]
    assert a["dead_letter_id"] == dead_letter_id("memdiag.events", b"garbage", "memdiag.")
    assert a["dead_letter_id"] != dead_letter_id("memdiag.events", b"garbage2", "memdiag.")


def test_dead_letter_payload_is_bounded() -> None:
    p = Processor(SETTINGS.with_(deadletter_payload_bytes=10), everything_here)
    record = p.process(msg(b"x" * 100), {}).deadletters[0][1]
    assert record["payload"] == "x" * 10
    assert record["payload_bytes"] == 100 and record["payload_truncated"] is True


def test_idle_sessions_are_swept_by_event_time() -> None:
    p = Processor(SETTINGS, everything_here)
    store: dict[str, bytes] = {}
    p.process(msg(search("a", "2026-11-20T00:00:00Z", "q", ["o"], sid="old"), key=b"old"), store)
    assert set(store) == {"old"}
    p.process(msg(search("b", "2026-11-21T00:30:00Z", "q", ["o"], sid="new"), key=b"new"), store)
    assert set(store) == {"new"}  # idle 24.5 h > the 24 h retention: swept


def test_sweep_runs_at_most_once_per_minute_of_event_time() -> None:
    p = Processor(SETTINGS, everything_here)
    store: dict[str, bytes] = {}
    p.process(msg(search("a", "2026-11-20T00:00:00Z", "q", ["o"], sid="s0"), key=b"s0"), store)
    p.process(msg(search("b", "2026-11-20T23:59:50Z", "q", ["o"], sid="s1"), key=b"s1"), store)
    assert "s0" in store  # not yet idle 24 h when the sweep ran
    p.process(msg(search("c", "2026-11-21T00:00:10Z", "q", ["o"], sid="s2"), key=b"s2"), store)
    assert "s0" in store  # idle now, but less than a minute of event time since the sweep
    p.process(msg(search("d", "2026-11-21T00:01:00Z", "q", ["o"], sid="s3"), key=b"s3"), store)
    assert "s0" not in store


def test_sweep_index_is_rebuilt_from_the_store_after_a_rebalance() -> None:
    store: dict[str, bytes] = {}
    p = Processor(SETTINGS, everything_here)
    p.process(msg(search("a", "2026-11-20T00:00:00Z", "q", ["o"], sid="old"), key=b"old"), store)
    other = SessionState.new(partition=1).dumps()
    store["elsewhere"] = other
    p.partitions_changed()
    p.process(msg(search("b", "2026-11-21T00:30:00Z", "q", ["o"], sid="new"), key=b"new"), store)
    assert "old" not in store
    assert store["elsewhere"] == other  # another partition's session is left to its owner


def test_state_is_compact_json() -> None:
    store: dict[str, bytes] = {}
    Processor(SETTINGS, everything_here).process(
        msg(search("a", "2026-11-21T09:30:00Z", "private words", ["o1"])), store
    )
    state = orjson.loads(store["s1"])
    assert state["p"] == 0 and "private" not in store["s1"].decode()


def test_a_failure_inside_processing_dead_letters_the_message() -> None:
    p = Processor(SETTINGS, everything_here)
    store = {"s1": b"not the state format"}  # e.g. written by a future version
    m = msg(search("a", "2026-11-21T09:30:00Z", "q", ["o"]), offset=5)
    try:
        p.process(m, store)
        raised = None
    except Exception as exc:  # noqa: BLE001
        raised = exc
    assert raised is not None
    out = failed_output(m, raised, SETTINGS)  # what the agent sends
    ((key, record),) = out.deadletters
    assert key == b"s1" and record["reason"] == "processing_error" and record["offset"] == 5
    assert "memdiag bug" in record["detail"] and record["payload"].startswith("{")
    assert out.counts[(DEAD_LETTERS, (("reason", "processing_error"),))] == 1
