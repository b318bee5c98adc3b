"""Hostile input through the worker's logic (in memory, every stage) and into DuckDB: no
crash, exactly one dead letter with an input reason per bad event, and the valid results
exactly those of a clean run. ``MEMDIAG_FUZZ_INPUTS`` sets the number of hostile inputs
(``make chaos`` runs 5,000 through a real broker too)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memdiag.analytics.sink import DuckDBSink
from memdiag.contract import INPUT_REASONS, PROCESSING_ERROR
from memdiag.contract.envelope import DictStore, InMessage
from memdiag.schemas import SESSION_KINDS
from memdiag.schemas.decode import Decoder
from memdiag.settings import Settings
from memdiag.streams.stages.sessions import SessionStage
from tests.compare import differences, from_records, from_reference
from tests.hostile import encode, mixed
from tests.inmemory import World, partition_for
from tests.reference import reference

pytestmark = pytest.mark.chaos  # also in the reliability suite, at 5,000 inputs

SETTINGS = Settings()
INPUTS = int(os.environ.get("MEMDIAG_FUZZ_INPUTS", "1200"))


def run(messages: list[tuple[str | None, Any]], seed: int) -> World:
    world = World(SETTINGS, seed=seed)
    for key, value in messages:
        raw = value if isinstance(value, bytes) else encode(value)
        world.append(world.events, key, raw)
    world.run(max_batch=40)
    return world


def test_hostile_input_is_dead_lettered_once_each_and_changes_nothing(tmp_path: Path) -> None:
    messages, valid, expected = mixed(seed=3, n=INPUTS)
    world = run(messages, seed=3)
    letters = world.tables.dead_letters
    reasons = Counter(d["reason"] for d in letters)
    assert PROCESSING_ERROR not in reasons
    assert set(reasons) <= set(INPUT_REASONS)
    assert reasons == expected
    assert len({d["dead_letter_id"] for d in letters}) == len(letters)  # one row each
    # the valid results: exactly those of the valid events alone, in any arrival
    assert differences(from_records(world.tables), from_reference(reference(valid))) == []
    # and into DuckDB: every dead letter a row
    sink = DuckDBSink(tmp_path / "h.duckdb")
    sink.init()
    sink.write([*world.records, *world.weights, *({"kind": "dead_letter", **d} for d in letters)])
    import duckdb

    with duckdb.connect(str(tmp_path / "h.duckdb"), read_only=True) as con:
        [(rows,)] = con.execute("SELECT count(*) FROM dead_letters").fetchall()
        sql_ids = con.execute(
            "SELECT count(*) FROM searches WHERE event_id LIKE '%OR 1=1 --'"
        ).fetchall()
    assert rows == sum(expected.values())
    assert sql_ids[0][0] == sum(
        1 for e in valid if e["kind"] == "search" and e["event_id"].endswith("OR 1=1 --")
    )


def test_a_replay_of_the_same_offsets_adds_no_dead_letter() -> None:
    messages, _, expected = mixed(seed=4, n=200)
    world = run(messages, seed=4)
    first = {d["dead_letter_id"] for d in world.tables.dead_letters}
    for tp in world.position:  # the worker's group starts over from the beginning
        world.position[tp] = world.committed[tp] = 0
    world.run(max_batch=40)
    assert {d["dead_letter_id"] for d in world.tables.dead_letters} == first
    assert len(first) == sum(expected.values())


def test_the_same_bad_line_published_twice_is_two_dead_letters() -> None:
    world = World(SETTINGS, seed=1)
    for _ in range(2):
        world.append(world.events, None, b"not json")
    world.append(world.events, "s", [{"kind": "nope"}, {"kind": "nope"}])  # one batch, twice
    world.run()
    assert len({d["dead_letter_id"] for d in world.tables.dead_letters}) == 4


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "kind",
                    "event_id",
                    "ts",
                    "session_id",
                    "query",
                    "result_ids",
                    "source",
                    "turn_id",
                    "x",
                ]
            ),
            children,
            max_size=5,
        )
    ),  # fmt: skip
    max_leaves=30,
)
KINDS = st.sampled_from(list(SESSION_KINDS) + ["judgement", "drop table"])


TIMES = st.one_of(
    st.just("2026-11-21T09:30:00Z"),
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
    st.from_regex(r"\A\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)\Z"),
)


def nested(depth: int) -> Any:
    value: Any = "x"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


@st.composite
def mutated_events(draw: Any) -> Any:
    """A valid-looking event with one field replaced by an arbitrary JSON value (sometimes
    nested deep), its time drawn from every date-time shape."""
    event = {
        "kind": draw(KINDS),
        "event_id": draw(st.text(min_size=1, max_size=8)),
        "ts": draw(TIMES),
        "session_id": "s",
        "query": "q",
        "result_ids": ["a"],
        "turn_id": "t",
        "text": "x",
        "observations": [{"id": "o", "content": "c"}],
        "outcome": "rejected",
        "tool_calls": [],
        "files_modified": [],
        "errors": [],
    }
    field = draw(st.sampled_from(sorted(event)))
    how = draw(st.sampled_from(["drop", "value", "deep"]))
    if how == "drop":
        del event[field]
    elif how == "value":
        event[field] = draw(json_values)
    else:
        event[field] = nested(draw(st.integers(200, 1000)))
    return event


@settings(
    max_examples=max(300, INPUTS // 4),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(st.one_of(mutated_events(), json_values), min_size=1, max_size=6))
def test_any_batch_is_accounted_element_by_element(batch: list[Any]) -> None:
    """Each element is accepted or refused with an input reason, exactly once; the worker's
    session stage never raises on it."""
    raw = encode(batch)
    decoder = Decoder(SESSION_KINDS, "memdiag.events", SETTINGS.max_event_bytes, None)
    decoded = decoder.decode(raw, 1_800_000_000_000)
    indexes = sorted([a.index for a in decoded.accepted] + [r.index for r in decoded.rejected])
    assert indexes == list(range(len(batch)))
    assert all(r.reason in INPUT_REASONS for r in decoded.rejected)
    processor = SessionStage(SETTINGS, lambda sid: partition_for(sid, SETTINGS.events_partitions))
    out = processor.process(
        [InMessage("memdiag.events", 0, 0, None, raw, 1_800_000_000_000)],
        DictStore(),
    )
    assert all(d["reason"] != PROCESSING_ERROR for _, d in out.deadletters)
