"""The edge: every kind of bad input gets a reason and an actionable detail; nothing raises."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memdiag.schemas import SESSION_KINDS
from memdiag.schemas.decode import REASONS, Decoder, parse_ts

GOOD = {
    "kind": "search",
    "event_id": "ev-1",
    "ts": "2026-11-21T09:30:00.250Z",
    "session_id": "ses",
    "query": "auth flow",
    "result_ids": ["o1"],
}

OUTCOME = {
    "kind": "session_outcome",
    "event_id": "ev-2",
    "ts": "2026-11-21T09:31:00Z",
    "session_id": "ses",
    "outcome": "rejected",
    "tool_calls": [{"tool": "pytest", "success": False}],
    "files_modified": [],
    "errors": [],
}


@pytest.fixture
def decoder() -> Decoder:
    return Decoder(SESSION_KINDS, "memdiag.events", max_event_bytes=4096)


def one(decoder: Decoder, doc) -> tuple[str, str]:
    result = decoder.decode(json.dumps(doc).encode() if not isinstance(doc, bytes) else doc)
    assert not result.accepted and len(result.rejected) == 1
    r = result.rejected[0]
    return r.reason, r.detail


def test_a_good_outcome_is_accepted(decoder: Decoder) -> None:
    result = decoder.decode(json.dumps(OUTCOME).encode())
    assert not result.rejected and result.accepted[0].event.files_modified == ()


def test_good_event_is_accepted_with_event_time_in_microseconds(decoder: Decoder) -> None:
    result = decoder.decode(json.dumps({**GOOD, "extra": {"ignored": True}}).encode())
    assert not result.rejected
    event = result.accepted[0].event
    assert event.ts_us == 1_795_253_400_250_000
    assert event.source == "agent"


@pytest.mark.parametrize(
    ("doc", "reason", "words"),
    [
        (b"{not json", "not_json", "JSON"),
        (b"\xff\xfe", "not_json", "UTF-8"),
        (42, "not_an_event", "number"),
        ("text", "not_an_event", "string"),
        ({**GOOD, "kind": "click"}, "unknown_kind", "click"),
        ({**GOOD, "kind": "judgement"}, "unknown_kind", "judgements topic"),
        ({k: v for k, v in GOOD.items() if k != "kind"}, "missing_field", "kind"),
        ({k: v for k, v in GOOD.items() if k != "query"}, "missing_field", "query"),
        # required of a published outcome (contract section 2); only span outcomes go without
        (
            {k: v for k, v in OUTCOME.items() if k != "files_modified"},
            "missing_field",
            "files_modified",
        ),  # fmt: skip
        ({**GOOD, "result_ids": "o1"}, "wrong_type", "result_ids"),
        ({**GOOD, "result_ids": [1]}, "wrong_type", "result_ids[0]"),
        ({**GOOD, "session_id": 7}, "wrong_type", "session_id"),
        ({**GOOD, "ts": "2026-11-21 09:30"}, "bad_ts", "RFC 3339"),
        ({**GOOD, "ts": "2026-11-21T09:30:00"}, "bad_ts", "offset"),
        ({**GOOD, "ts": "2026-02-30T09:30:00Z"}, "bad_ts", "2026-02-30"),
        ({**GOOD, "event_id": "x" * 129}, "id_too_long", "128"),
        ({**GOOD, "session_id": "s" * 257}, "id_too_long", "256"),
        ({**GOOD, "event_id": ""}, "bad_value", "empty"),
        ({**GOOD, "source": "human"}, "bad_value", "human"),
        ({**GOOD, "query": "q" * 5000}, "too_large", "MEMDIAG_MAX_EVENT_BYTES"),
    ],
)
def test_each_bad_input_has_a_reason_and_a_detail(decoder: Decoder, doc, reason, words) -> None:
    got_reason, detail = one(decoder, doc)
    assert got_reason == reason
    assert words in detail


def test_limits_are_inclusive(decoder: Decoder) -> None:
    ok = {**GOOD, "event_id": "x" * 128, "session_id": "s" * 256}
    assert not decoder.decode(json.dumps(ok).encode()).rejected


def test_in_a_batch_only_the_bad_events_are_rejected(decoder: Decoder) -> None:
    batch = [GOOD, {**GOOD, "event_id": "ev-2", "ts": "nope"}, 7, {**GOOD, "event_id": "ev-3"}]
    result = decoder.decode(json.dumps(batch).encode())
    assert [a.index for a in result.accepted] == [0, 3]
    assert [(r.index, r.reason) for r in result.rejected] == [(1, "bad_ts"), (2, "not_an_event")]
    assert json.loads(result.rejected[0].payload)["event_id"] == "ev-2"


def test_oversized_event_inside_a_batch(decoder: Decoder) -> None:
    batch = [GOOD, {**GOOD, "event_id": "big", "query": "q" * 5000}]
    result = decoder.decode(json.dumps(batch).encode())
    assert [a.index for a in result.accepted] == [0]
    assert result.rejected[0].reason == "too_large"


def test_empty_batch_is_nothing(decoder: Decoder) -> None:
    result = decoder.decode(b"[]")
    assert not result.accepted and not result.rejected


def test_null_value(decoder: Decoder) -> None:
    assert decoder.decode(None).rejected[0].reason == "not_an_event"


@given(st.binary(max_size=300))
def test_never_raises_on_bytes(raw: bytes) -> None:
    result = Decoder(SESSION_KINDS, "memdiag.events", 4096).decode(raw)
    for r in result.rejected:
        assert r.reason in REASONS and r.detail


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(st.sampled_from(sorted(GOOD) + ["x"]), json_values) | json_values)
def test_never_raises_on_json_and_always_says_why(doc) -> None:
    result = Decoder(SESSION_KINDS, "memdiag.events", 4096).decode(orjson.dumps(doc))
    assert len(result.accepted) + len(result.rejected) >= (0 if doc == [] else 1) or doc == []
    for r in result.rejected:
        assert r.reason in REASONS and r.detail


@given(st.dictionaries(st.sampled_from(sorted(GOOD)), json_values), st.data())
def test_mutated_good_event_is_accepted_or_explained(overrides, data) -> None:
    doc = {**GOOD, **overrides}
    result = Decoder(SESSION_KINDS, "memdiag.events", 4096).decode(orjson.dumps(doc))
    assert len(result.accepted) + len(result.rejected) == 1


element = (
    st.dictionaries(st.sampled_from(sorted(GOOD)), json_values).map(lambda o: {**GOOD, **o})
    | st.just(GOOD)
    | st.just(OUTCOME)
    | st.just({**GOOD, "ts": "2026-02-30T00:00:00Z"})  # the model takes it, the date is bad
    | st.just({**GOOD, "kind": "memory_written"})  # a kind of another topic
    | json_values
)


@given(st.lists(element, max_size=6), st.integers(min_value=200, max_value=4096))
def test_a_batch_decodes_as_its_elements_do_one_by_one(batch, limit: int) -> None:
    """Whether the batch takes the one-pass way (every element fits the models) or the
    element-by-element one, each element gets what it gets alone: accepted with its own
    bytes, or rejected with the same reason and detail."""
    decoder = Decoder(SESSION_KINDS, "memdiag.events", limit)
    result = decoder.decode(orjson.dumps(batch))
    accepted = {a.index: a for a in result.accepted}
    rejected = {r.index: r for r in result.rejected}
    assert len(accepted) + len(rejected) == len(batch)
    for i, doc in enumerate(batch):
        alone = decoder.decode(orjson.dumps(doc) if isinstance(doc, dict) else orjson.dumps([doc]))
        sent = orjson.loads(orjson.dumps(doc))  # as published (orjson writes inf as null)
        if i in accepted:
            assert [a.event for a in alone.accepted] == [accepted[i].event]
            assert orjson.loads(accepted[i].payload) == sent
            assert orjson.loads(orjson.dumps(accepted[i].reroutable())) == sent
        else:
            assert [(r.reason, r.detail) for r in alone.rejected] == [
                (rejected[i].reason, rejected[i].detail)
            ]
            assert orjson.loads(rejected[i].payload) == sent


@pytest.mark.parametrize(
    ("text", "us"),
    [
        ("1970-01-01T00:00:00Z", 0),
        ("1970-01-01T00:00:00.001Z", 1000),
        ("1970-01-01T01:00:00+01:00", 0),
        ("1970-01-01t00:00:00.123456789z", 123456),
    ],
)
def test_parse_ts(text: str, us: int) -> None:
    assert parse_ts(text) == us
