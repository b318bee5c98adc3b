"""The JSON Schema files: valid 2020-12 schemas, the Python models round-trip through them,
and the compiled fast validator agrees with the reference implementation."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import fastjsonschema
import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.schemas import EVENT_KINDS, load_schema
from memdiag.schemas.decode import parse_ts
from memdiag.schemas.models import (
    EdgeKey,
    Injection,
    Judgement,
    Observation,
    Response,
    Search,
    SessionError,
    SessionOutcome,
    SessionScope,
    ToolCall,
    format_ts,
    from_dict,
    to_dict,
)

#: the contract's example events, as the project keeps them (tests/data)
EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "contract_example.jsonl"


@pytest.mark.parametrize("kind", EVENT_KINDS)
def test_schema_is_valid_2020_12(kind: str) -> None:
    schema = load_schema(kind)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_the_example_events_validate() -> None:
    for line in EXAMPLES.read_text().splitlines():
        event = json.loads(line)
        jsonschema.validate(event, load_schema(event["kind"]))


text = st.text(max_size=20)
ident = st.text(min_size=1, max_size=40)
opt = st.none() | ident
ts_us = st.integers(min_value=0, max_value=4_102_444_800_000_000)  # up to 2100
scope = st.builds(SessionScope, ident, opt, opt, opt)
idlist = st.lists(ident, max_size=4).map(tuple)

events = st.one_of(
    st.builds(Search, ident, ts_us, scope, text, idlist, st.sampled_from(["agent", "viewer"])),
    st.builds(
        Injection,
        ident,
        ts_us,
        scope,
        ident,
        st.lists(st.builds(Observation, ident, text), max_size=3).map(tuple),
        idlist,
        st.lists(st.builds(EdgeKey, text, text, text), max_size=2).map(tuple),
    ),
    st.builds(Response, ident, ts_us, scope, ident, text),
    st.builds(
        SessionOutcome,
        ident,
        ts_us,
        scope,
        st.sampled_from(["accepted", "rejected", "rework"]),
        st.lists(st.builds(ToolCall, text, st.booleans(), st.none() | ident), max_size=3).map(
            tuple
        ),
        idlist,
        st.lists(st.builds(SessionError, text, text, st.booleans()), max_size=2).map(tuple),
        idlist,
        st.none() | text,
    ),
    st.builds(
        Judgement,
        ident,
        ts_us,
        ident,
        ident,
        st.booleans(),
        idlist,
        idlist,
        text,
        st.integers(min_value=0, max_value=50),
        st.none() | st.floats(min_value=0, max_value=1e6),
        st.none() | st.integers(min_value=0, max_value=10**6),
    ),
)


@given(events)
def test_models_round_trip_through_the_schema(event) -> None:
    wire = json.loads(json.dumps(to_dict(event)))
    jsonschema.validate(wire, load_schema(event.kind))
    fastjsonschema.compile(load_schema(event.kind))(wire)
    ts = parse_ts(wire["ts"])
    assert ts == event.ts_us
    assert from_dict(wire, ts) == event


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)


@given(events, st.sampled_from(["drop", "replace"]), st.data())
def test_fast_validator_agrees_with_reference(event, how: str, data) -> None:
    wire = json.loads(json.dumps(to_dict(event)))
    key = data.draw(st.sampled_from(sorted(wire)))
    if how == "drop":
        del wire[key]
    else:
        wire[key] = data.draw(json_values)
    schema = load_schema(event.kind)
    reference = jsonschema.Draft202012Validator(schema).is_valid(wire)
    try:
        fastjsonschema.compile(schema)(wire)
        fast = True
    except fastjsonschema.JsonSchemaValueException:
        fast = False
    assert fast == reference


@settings(max_examples=500)
@given(st.integers(min_value=-62_135_596_800_000_000, max_value=253_402_300_799_999_999))
def test_format_ts_is_rfc3339_utc_with_microseconds(ts_us: int) -> None:
    """The fast formatter equals the plain ``isoformat`` one over the whole datetime range,
    and parses back to the same microsecond."""
    plain = (
        datetime.fromtimestamp(ts_us // 1_000_000, tz=UTC)
        .replace(microsecond=ts_us % 1_000_000)
        .isoformat(timespec="microseconds")
        .replace("+00:00", "Z")
    )
    assert format_ts(ts_us) == plain
    assert parse_ts(format_ts(ts_us)) == ts_us
