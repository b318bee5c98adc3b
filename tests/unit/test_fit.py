"""A row over MEMDIAG_MAX_OUTPUT_BYTES is trimmed to fit one Kafka message (the broker refuses
a larger record at every retry, and the worker's checkpoint would never commit again): the
pure rule, and the worker's sender through a broker stand-in that refuses what a broker
refuses."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.contract.envelope import Output
from memdiag.streams.fit import FREE_FORM, NOTE_ROOM, SHORT_TEXT, TRUNCATED, fit
from memdiag.streams.sender import CounterBuffer, Sender
from tests.unit.test_sender_counts import Topic

ids = st.text("abcdefgh_0123456789", min_size=1, max_size=24)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=400),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=8),
    max_leaves=60,
)  # fmt: skip


def diagnostic(observations: list[str], context: Any, errors: list[str]) -> dict[str, Any]:
    return {
        "kind": "session_diagnostic",
        "event_id": "out_1",
        "session_id": "sess_1",
        "outcome": "rejected",
        "failure_category": "tool_error",
        FREE_FORM: context,
        "injected_observation_ids": observations,
        "errors_encountered": [{"message": m, "tool": "bash", "recoverable": False}
                               for m in errors],
        "search_count": 3,
        "followup_count": 1,
        "ts": "2026-11-27T10:00:00.000000Z",
    }  # fmt: skip


def size(record: Any) -> int:
    return len(orjson.dumps(record))


def test_a_row_under_the_limit_is_the_row_itself() -> None:
    row = diagnostic(["obs_1"], {"why": "x"}, ["boom"])
    out, notes = fit(row, 10_000)
    assert out is row and notes == {}


def test_the_largest_fields_are_cut_to_one_size_and_the_note_says_what_was_kept() -> None:
    row = diagnostic([f"obs_{i}" for i in range(60_000)], {"log": "x" * 500_000}, ["boom"])
    out, notes = fit(row, 200_000)
    assert size(out) <= 200_000
    kept = out["injected_observation_ids"]
    assert 0 < len(kept) < 60_000 and kept == row["injected_observation_ids"][: len(kept)]
    assert notes["injected_observation_ids"] == f"kept {len(kept):,} of 60,000 items"
    context = out[FREE_FORM]
    # neither big field is emptied for the other's bulk
    preview = context[FREE_FORM]
    assert isinstance(preview, str) and orjson.dumps(row[FREE_FORM]).decode().startswith(preview)
    assert abs(size(preview) - size(kept)) < 1_000
    assert context[TRUNCATED] == {"bytes": size(row), "limit": 200_000, "fields": notes}
    # what identifies and counts the row is whole
    for name in ("kind", "event_id", "session_id", "outcome", "failure_category",
                 "errors_encountered", "search_count", "followup_count", "ts"):  # fmt: skip
        assert out[name] == row[name]


def test_a_row_without_failure_context_is_trimmed_and_keeps_its_fields() -> None:
    row = {"kind": "judgement", "event_id": "j1", "gold_evidence_ids": ["g"] * 10,
           "retrieved_context_ids": [f"ctx_{i}" for i in range(100_000)]}  # fmt: skip
    out, notes = fit(row, 50_000)
    assert size(out) <= 50_000 and set(out) == set(row)
    assert out["gold_evidence_ids"] == row["gold_evidence_ids"]
    assert list(notes) == ["retrieved_context_ids"]


@settings(max_examples=150, deadline=None)
@given(
    observations=st.lists(ids, max_size=400),
    context=json_values,
    errors=st.lists(st.text(max_size=300), max_size=20),
    limit=st.integers(NOTE_ROOM + 600, 40_000),
)
def test_fit_is_within_the_limit_and_cuts_only_the_tails(
    observations: list[str], context: Any, errors: list[str], limit: int
) -> None:
    row = diagnostic(observations, context, errors)
    out, notes = fit(row, limit)
    again, _ = fit(row, limit)
    assert out == again  # a replay trims the same way
    if size(row) <= limit:
        assert out is row and not notes
        return
    assert size(out) <= limit
    assert set(out) == set(row)
    assert notes and out[FREE_FORM][TRUNCATED]["fields"] == notes
    for name, value in row.items():
        kept = out[name] if name != FREE_FORM else out[FREE_FORM][FREE_FORM]
        if name not in notes:
            assert kept == value
        elif isinstance(value, list):
            whole = kept if "start of one more" not in notes[name] else kept[:-1]
            assert whole == value[: len(whole)] and len(whole) < len(value)
            if whole is not kept:  # the next item, its long texts cut
                assert is_start(kept[-1], value[len(whole)])
        else:  # free-form JSON: the start of its JSON text
            assert isinstance(kept, str) and orjson.dumps(value).decode().startswith(kept)


def is_start(part: Any, item: Any) -> bool:
    """``part`` is ``item`` with some of its texts cut to a start of themselves."""
    if isinstance(item, str):
        return isinstance(part, str) and item.startswith(part)
    return part.keys() == item.keys() and all(
        part[k] == v or (isinstance(v, str) and v.startswith(part[k])) for k, v in item.items()
    )


def test_one_huge_item_keeps_its_start_and_the_room_it_leaves_is_used() -> None:
    """An error with a 900 KB traceback and 30,000 ids: the error keeps the start of its
    message (not "kept 0 of 1"), and what the fields leave under their common size goes to
    the others, so the row uses its limit."""
    row = diagnostic([f"obs_{i:06d}" for i in range(30_000)], None, ["Traceback " * 90_000])
    out, notes = fit(row, 1_000_000)
    assert 950_000 < size(out) <= 1_000_000
    (error,) = out["errors_encountered"]
    assert is_start(error, row["errors_encountered"][0]) and len(error["message"]) > 100_000
    assert notes["errors_encountered"] == "kept 0 of 1 items, and the start of one more"
    assert out["failure_category"] == row["failure_category"]


def test_a_failure_context_that_is_a_list_becomes_the_start_of_its_json() -> None:
    row = diagnostic(["obs_1"], [f"step {i}" for i in range(20_000)], [])
    out, notes = fit(row, 50_000)
    preview = out[FREE_FORM][FREE_FORM]
    assert isinstance(preview, str) and orjson.dumps(row[FREE_FORM]).decode().startswith(preview)
    assert notes[FREE_FORM].startswith("replaced by the first")


def test_a_dead_letter_cut_says_its_payload_is_cut() -> None:
    letter = {"kind": "dead_letter", "dead_letter_id": "d", "reason": "not_json",
              "detail": "d" * 300, "payload": "\u0000" * 64_000, "payload_bytes": 64_000,
              "payload_truncated": False}  # fmt: skip
    out, notes = fit(letter, 100_000)  # control bytes take 6 characters each in JSON
    assert "payload" in notes and out["payload_truncated"] is True and size(out) <= 100_000


def test_short_texts_and_numbers_are_never_cut() -> None:
    row = {"kind": "x", "a": "y" * SHORT_TEXT, "n": 10**12, "big": ["z" * 100] * 1_000}
    out, notes = fit(row, 20_000)
    assert out["a"] == row["a"] and out["n"] == row["n"] and list(notes) == ["big"]


# -- the worker's sender, against a broker that refuses what a broker refuses ---------------


class Broker:
    """Takes a record as a broker with ``message.max.bytes`` does: a larger one fails its
    delivery (``MessageSizeTooLargeError``), and would again on every retry."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.records: list[tuple[str, bytes]] = []

    async def add(self, topic: str, key: bytes | None, value: bytes, *rest: Any) -> None:
        if len(value) + len(key or b"") + 100 > self.max_bytes:
            raise RuntimeError(f"MessageSizeTooLargeError: {len(value):,} bytes")
        self.records.append((topic, value))

    async def flush(self) -> list[Any]:
        return []


def sender(broker: Broker, limit: int) -> Sender:
    topics = [Topic(name) for name in ("diagnostics", "deadletter", "weights", "events",
                                       "steps", "verdicts", "counters", "memory", "traces",
                                       "span_events", "graph_weights")]  # fmt: skip
    return Sender(broker, *topics[:10], CounterBuffer(), None, topics[10], limit)  # type: ignore[arg-type]


def test_the_sender_trims_a_diagnostic_the_broker_would_refuse(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = Broker(max_bytes=1_048_588)  # Apache Kafka's default message.max.bytes
    small = diagnostic(["obs_1"], None, [])
    big = diagnostic([f"obs_{i:07d}" for i in range(80_000)], {"trace": "t" * 400_000}, ["x"])
    assert size(big) > broker.max_bytes
    out = Output()
    out.diagnostic("sess_0", small)
    out.diagnostic("sess_1", big)
    with caplog.at_level(logging.WARNING):
        asyncio.run(sender(broker, 1_000_000).send(out))
    rows = [orjson.loads(v) for _, v in broker.records]
    records = [r for row in rows for r in (row if isinstance(row, list) else [row])]
    assert records[0] == small  # untouched
    trimmed = records[1]
    assert trimmed[FREE_FORM][TRUNCATED]["bytes"] == size(big)
    assert 70_000 > len(trimmed["injected_observation_ids"]) > 10_000
    message = caplog.messages[-1]
    assert "session_diagnostic 'sess_1' on diagnostics" in message
    assert "MEMDIAG_MAX_OUTPUT_BYTES" in message and "injected_observation_ids: kept" in message


def test_the_sender_never_trims_an_internal_topic() -> None:
    broker = Broker(max_bytes=10**9)
    out = Output()
    steps = [{"kind": "step", "session_id": "s", "note": "n" * 300_000}]
    out.steps["obs_1"] = steps
    asyncio.run(sender(broker, 20_000).send(out))
    assert [orjson.loads(v) for _, v in broker.records] == [steps]
