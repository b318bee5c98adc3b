"""The session stage without a broker: routing, dead letters, state, forgetting."""

from __future__ import annotations

import json

import orjson

from memdiag.contract import DEAD_LETTERS, FOLLOWUPS, SEARCH_CALLS
from memdiag.contract.envelope import DictStore, InMessage
from memdiag.schemas.deadletters import dead_letter_id, digest, failed_output
from memdiag.schemas.decode import parse_ts
from memdiag.settings import Settings
from memdiag.streams.clocks import clock_key
from memdiag.streams.session.states import HEAD, TOMBSTONE
from memdiag.streams.stages.sessions import SessionStage

SETTINGS = Settings()
#: a publish time just after the events below (2026-11-21T09:30-ish)
PUBLISHED_MS = parse_ts("2026-11-21T10:00:00Z") // 1000  # type: ignore[operator]
HOUR_MS = 3_600_000


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


def msg(
    value,
    partition: int = 0,
    offset: int = 0,
    key: bytes | None = b"s1",
    published_ms: int = PUBLISHED_MS,
) -> list[InMessage]:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return [InMessage("memdiag.events", partition, offset, key, raw, published_ms)]


def everything_here(_: str) -> int:
    return 0


def test_a_followup_pair_in_one_message_writes_its_session_once() -> None:
    p = SessionStage(SETTINGS, everything_here)
    store = DictStore()
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
    p.settle(store)  # as the runner does before each commit
    assert store.writes == 1 + 1  # the session, and its partition's clock
    assert out.counts[(SEARCH_CALLS, (("source", "agent"),))] == 2
    assert out.counts[(SEARCH_CALLS, (("source", "viewer"),))] == 1
    assert out.counts[(FOLLOWUPS, ())] == 1
    assert "query" not in rows[0]


def test_a_batch_of_messages_writes_each_touched_session_once() -> None:
    p = SessionStage(SETTINGS, everything_here)
    store = DictStore()
    msgs = [
        *msg(search("a", "2026-11-21T09:30:00Z", "q1", ["o1"]), offset=0),
        *msg(search("b", "2026-11-21T09:30:05Z", "q2", ["o2"]), offset=1),
        *msg(search("c", "2026-11-21T09:30:06Z", "q3", ["o3"], sid="s2"), offset=2, key=b"s2"),
    ]
    out = p.process(msgs, store)
    p.settle(store)  # as the runner does before each commit
    assert store.writes == 2 + 1  # each session once, and their partition's clock
    assert [r["is_followup"] for r in out.diagnostics["s1"]] == [False, True]


def test_query_text_is_kept_only_when_asked() -> None:
    p = SessionStage(SETTINGS.with_(store_text=True), everything_here)
    out = p.process(msg(search("a", "2026-11-21T09:30:00Z", "auth", ["o1"])), DictStore())
    assert out.diagnostics["s1"][0]["query"] == "auth"


def test_state_survives_a_restart_of_the_processor() -> None:
    store = DictStore()
    first = SessionStage(SETTINGS, everything_here)
    first.process(msg(search("a", "2026-11-21T09:30:00Z", "q1", ["o1"])), store)
    first.settle(store)  # committed
    out = SessionStage(SETTINGS, everything_here).process(
        msg(search("b", "2026-11-21T09:30:05Z", "q2", ["o2"])), store
    )
    assert out.diagnostics["s1"][0]["is_followup"] is True


def test_events_of_another_partition_are_rerouted_with_their_publish_time() -> None:
    p = SessionStage(SETTINGS, lambda sid: 0 if sid == "here" else 1)
    store = DictStore()
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
    [(key, raws, published)] = out.reroute
    assert (key, published) == ("there", PUBLISHED_MS)
    # the event as it was sent (its bytes, unknown fields included)
    assert orjson.loads(orjson.dumps(raws)) == [
        search("b", "2026-11-21T09:30:00Z", "q", ["o"], sid="there", extra=1)
    ]
    p.settle(store)  # as the runner does before each commit: only "here" is this partition's
    assert sorted(store.data) == [HEAD + "here", clock_key("sessions", 0)]


def test_an_event_too_deep_to_re_encode_is_rerouted_as_it_was_sent() -> None:
    p = SessionStage(SETTINGS, lambda sid: 1)
    deep: object = 1
    for _ in range(300):
        deep = [deep]
    event = search("b", "2026-11-21T09:30:00Z", "q", ["o"], sid="there", extra=deep)
    raw = ('[' + json.dumps({k: v for k, v in event.items() if k != "extra"})[:-1]
           + ', "extra": ' + "[" * 300 + "1" + "]" * 300 + "}]").encode()  # fmt: skip
    out = p.process([InMessage("memdiag.events", 0, 0, None, raw, PUBLISHED_MS)], DictStore())
    [(_, [sent], _)] = out.reroute
    assert bytes(orjson.dumps(sent)) == raw[1:-1] and not out.deadletters  # never re-encoded


def test_bad_events_in_a_batch_are_dead_lettered_one_each() -> None:
    p = SessionStage(SETTINGS, everything_here)
    out = p.process(
        msg([search("a", "2026-11-21T09:30:00Z", "q", ["o"]), {"kind": "nope"}, 3], offset=17),
        DictStore(),
    )
    assert [r["event_id"] for r in out.diagnostics["s1"]] == ["a"]
    records = [r for _, r in out.deadletters]
    assert [(r["batch_index"], r["reason"], r["offset"]) for r in records] == [
        (1, "unknown_kind", 17),
        (2, "not_an_event", 17),
    ]
    assert records[0]["payload"] == '{"kind": "nope"}'  # the element's bytes, as sent
    assert out.counts[(DEAD_LETTERS, (("reason", "unknown_kind"),))] == 1


def test_an_event_more_than_the_skew_ahead_of_its_publish_time_is_in_the_future() -> None:
    p = SessionStage(SETTINGS, everything_here)
    ok = search("a", "2026-11-21T10:04:59Z", "q", ["o"])  # 299 s ahead: a slow clock
    ahead = search("b", "2026-11-21T10:05:01Z", "q", ["o"])  # 301 s ahead
    out = p.process(msg([ok, ahead]), DictStore())
    assert [r["event_id"] for r in out.diagnostics["s1"]] == ["a"]
    [(_, dead)] = out.deadletters
    assert dead["reason"] == "bad_ts" and "in the future: 301.0 s ahead" in dead["detail"]
    assert "MEMDIAG_MAX_CLOCK_SKEW_SECONDS" in dead["detail"]


def test_dead_letter_identity_is_where_the_input_was_not_its_bytes() -> None:
    """A replay of the same offsets lands on the same row; the same bytes at another offset
    (published again) or at another place of a batch are another input, another row."""
    p = SessionStage(SETTINGS, everything_here)
    a = p.process(msg(b"garbage", offset=1), DictStore()).deadletters[0][1]
    again = p.process(msg(b"garbage", offset=1), DictStore()).deadletters[0][1]
    b = p.process(msg(b"garbage", offset=99), DictStore()).deadletters[0][1]
    assert a["dead_letter_id"] == again["dead_letter_id"]
    assert a["dead_letter_id"] != b["dead_letter_id"]
    garbage = digest(b"garbage")
    assert a["dead_letter_id"] == dead_letter_id("memdiag.events", "memdiag.", 0, 1, 0, garbage)
    batch = p.process(msg([{"kind": "nope"}, {"kind": "nope"}], offset=5), DictStore())
    ids = {d["dead_letter_id"] for _, d in batch.deadletters}
    assert len(ids) == 2  # two bad elements of one batch: two dead letters


def test_dead_letter_payload_is_bounded() -> None:
    p = SessionStage(SETTINGS.with_(deadletter_payload_bytes=10), everything_here)
    record = p.process(msg(b"x" * 100), DictStore()).deadletters[0][1]
    assert record["payload"] == "x" * 10
    assert record["payload_bytes"] == 100 and record["payload_truncated"] is True


def wall(now: list[int]):
    return lambda: now[0]


def test_idle_sessions_are_forgotten_in_processing_time_and_leave_a_tombstone() -> None:
    now = [PUBLISHED_MS + 100 * HOUR_MS]  # the wall clock: a worker catching up
    p = SessionStage(SETTINGS, everything_here, wall(now))
    store = DictStore()
    p.process(msg(search("a", "2026-11-20T00:00:00Z", "q", ["o"], sid="old"), key=b"old"), store)
    # a day and a half of event time later, in the same minute of processing time: kept
    p.process(msg(search("b", "2026-11-21T09:00:00Z", "q", ["o"], sid="new"), key=b"new"), store)
    p.settle(store)  # as the runner does before each commit
    assert HEAD + "old" in store.data
    later = PUBLISHED_MS + 25 * HOUR_MS
    p.process(msg(search("c", "2026-11-21T09:00:01Z", "q", ["o"], sid="new", ), key=b"new",
                  published_ms=later), store)  # fmt: skip
    p.settle(store)
    assert HEAD + "old" not in store.data and TOMBSTONE + "old" in store.data
    assert HEAD + "new" in store.data
    much_later = later + 8 * 24 * HOUR_MS
    now[0] = much_later
    p.process(msg(search("d", "2026-11-21T09:00:02Z", "q", ["o"], sid="new"), key=b"new",
                  published_ms=much_later), store)  # fmt: skip
    assert TOMBSTONE + "old" not in store.data  # tombstones serve 7 x the keep time


def test_a_future_publish_timestamp_cannot_age_anybody() -> None:
    """A producer whose clock is in 2099 stamps its records so: the processing clock is
    capped by the wall clock, so nobody is forgotten because of it."""
    now = [PUBLISHED_MS + HOUR_MS]
    p = SessionStage(SETTINGS, everything_here, wall(now))
    store = DictStore()
    p.process(msg(search("a", "2026-11-21T09:00:00Z", "q", ["o"], sid="s"), key=b"s"), store)
    year_2099 = parse_ts("2099-01-01T00:00:00Z") // 1000  # type: ignore[operator]
    p.process(msg(search("b", "2099-01-01T00:00:00Z", "q", ["o"], sid="x"), key=b"x",
                  published_ms=year_2099), store)  # fmt: skip
    p.settle(store)
    assert HEAD + "s" in store.data


def test_the_forgetting_index_is_rebuilt_from_the_store_after_a_rebalance() -> None:
    now = [PUBLISHED_MS + 100 * HOUR_MS]
    store = DictStore()
    p = SessionStage(SETTINGS, everything_here, wall(now))
    p.process(msg(search("a", "2026-11-20T00:00:00Z", "q", ["o"], sid="old"), key=b"old"), store)
    p.settle(store)  # committed
    other = SessionStage(SETTINGS, lambda _: 1, wall(now))
    other.process(
        msg(search("z", "2026-11-20T00:00:00Z", "q", ["o"], sid="elsewhere"), partition=1,
            key=b"elsewhere"), store
    )  # fmt: skip
    other.settle(store)
    p.reset()
    p.process(msg(search("b", "2026-11-21T00:30:00Z", "q", ["o"], sid="new"), key=b"new",
                  published_ms=PUBLISHED_MS + 30 * HOUR_MS), store)  # fmt: skip
    assert HEAD + "old" not in store.data
    assert HEAD + "elsewhere" in store.data  # another partition's session is left to its owner


def test_state_is_compact_json_without_texts() -> None:
    store = DictStore()
    stage = SessionStage(SETTINGS, everything_here)
    stage.process(msg(search("a", "2026-11-21T09:30:00Z", "private words", ["o1"])), store)
    stage.settle(store)
    state = orjson.loads(store.data[HEAD + "s1"])
    assert state["p"] == 0 and "private" not in store.data[HEAD + "s1"].decode()


def test_a_failure_inside_processing_dead_letters_the_message() -> None:
    p = SessionStage(SETTINGS, everything_here)
    store = DictStore({HEAD + "s1": b"not the state format"})  # e.g. a future version's
    m = msg(search("a", "2026-11-21T09:30:00Z", "q", ["o"]), offset=5)
    try:
        p.process(m, store)
        raised = None
    except Exception as exc:  # noqa: BLE001
        raised = exc
    assert raised is not None
    out = failed_output(m[0], raised, SETTINGS)  # what the runner sends
    ((key, record),) = out.deadletters
    assert key == b"s1" and record["reason"] == "processing_error" and record["offset"] == 5
    assert "memdiag bug" in record["detail"] and record["payload"].startswith("{")
    assert out.counts[(DEAD_LETTERS, (("reason", "processing_error"),))] == 1
