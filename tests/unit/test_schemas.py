"""The JSON Schema files: valid 2020-12 schemas, the Python models round-trip through them,
and the compiled fast validator agrees with the reference implementation."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import fastjsonschema
import jsonschema
import msgspec
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from memdiag.schemas import EVENT_KINDS, load_schema
from memdiag.schemas.decode import Decoder, models_decoder, parse_ts
from memdiag.schemas.models import (
    MODELS,
    TS_PATTERN,
    EdgeKey,
    Injection,
    Judgement,
    Observation,
    Response,
    Search,
    SessionError,
    SessionOutcome,
    ToolCall,
    format_ts,
    from_dict,
    iso_to_us,
    to_dict,
    ts_to_us,
    ts_us_of,
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
ts = st.integers(min_value=0, max_value=4_102_444_800_000_000).map(format_ts)  # up to 2100
idlist = st.lists(ident, max_size=4).map(tuple)


def session_event(cls: type, **fields: st.SearchStrategy) -> st.SearchStrategy:
    return st.builds(cls, event_id=ident, ts=ts, session_id=ident, agent_id=opt, org_id=opt,
                     project_id=opt, **fields)  # fmt: skip


events = st.one_of(
    session_event(
        Search, query=text, result_ids=idlist, source=st.sampled_from(["agent", "viewer"])
    ),  # fmt: skip
    session_event(
        Injection,
        turn_id=ident,
        observations=st.lists(st.builds(Observation, id=ident, content=text), max_size=3).map(
            tuple
        ),
        graph_entity_ids=idlist,
        graph_edge_keys=st.lists(
            st.builds(EdgeKey, source_id=text, target_id=text, relationship=text), max_size=2
        ).map(tuple),
    ),
    session_event(Response, turn_id=ident, text=text),
    session_event(
        SessionOutcome,
        outcome=st.sampled_from(["accepted", "rejected", "rework"]),
        tool_calls=st.lists(
            st.builds(ToolCall, tool=text, success=st.booleans(), file=st.none() | ident),
            max_size=3,
        ).map(tuple),
        files_modified=idlist,
        errors=st.lists(
            st.builds(SessionError, message=text, tool=text, recoverable=st.booleans()),
            max_size=2,
        ).map(tuple),
        helpful_observation_ids=idlist,
        failure_context=st.none() | text,
    ),
    st.builds(
        Judgement,
        event_id=ident,
        ts=ts,
        run_id=ident,
        question_id=ident,
        judge_correct=st.booleans(),
        gold_evidence_ids=idlist,
        retrieved_context_ids=idlist,
        condition=text,
        repeat_index=st.integers(min_value=0, max_value=50),
        latency_ms=st.none() | st.floats(min_value=0, max_value=1e6),
        tokens=st.none() | st.integers(min_value=0, max_value=10**6),
    ),
)


@given(events)
def test_models_round_trip_through_the_schema(event) -> None:
    wire = json.loads(json.dumps(to_dict(event)))
    jsonschema.validate(wire, load_schema(event.kind))
    fastjsonschema.compile(load_schema(event.kind))(wire)
    assert parse_ts(wire["ts"]) == event.ts_us
    assert from_dict(wire) == event


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


# -- the models (msgspec) against the schema files ------------------------------------------

#: Values that go across the schemas' types and constraints (integral floats, long strings,
#: nulls, times of every shape).
edge_values = st.one_of(
    json_values,
    st.sampled_from([1.0, 3.0, -1, 0, 2_147_483_648, 10_001, 9_223_372_036_854_775_808, 1.5,
                     "", "x" * 129, "x" * 257, "x" * 1025, "agent", "viewer", "accepted",
                     "2026-11-21T09:30:00Z", "2026-11-21 09:30:00Z", "2026-11-21T09:30:00+0000",
                     "2026-11-21T09:30:00.1234567z", "2026-13-01T00:00:00Z", [], [""], [1],
                     [{"id": "o", "content": "c"}], [{"id": ""}], {}, True, None]),
)  # fmt: skip


@settings(max_examples=400)
@given(events, st.sampled_from(["drop", "replace", "add", "nested"]), st.data())
def test_the_models_accept_exactly_what_the_schemas_accept(event, how: str, data) -> None:
    """The decoder's one-pass models and the JSON Schema files (the producers' contract,
    read by the reference validator) accept and refuse the same events."""
    wire = json.loads(json.dumps(to_dict(event)))
    key = data.draw(st.sampled_from(sorted(wire)))
    if how == "drop":
        del wire[key]
    elif how == "replace":
        wire[key] = data.draw(edge_values)
    elif how == "add":
        wire[data.draw(st.text(max_size=8))] = data.draw(edge_values)  # unknown: ignored
    else:
        nested = [
            k for k, v in wire.items() if isinstance(v, list) and v and isinstance(v[0], dict)
        ]
        if nested:
            item = wire[data.draw(st.sampled_from(nested))][0]
            item[data.draw(st.sampled_from(sorted(item)))] = data.draw(edge_values)
    try:
        raw = json.dumps(wire, allow_nan=False).encode()
    except ValueError:  # an infinity or NaN drawn: no JSON has one
        assume(False)
    schema_says = jsonschema.Draft202012Validator(load_schema(event.kind)).is_valid(wire)
    try:
        models_decoder([event.kind]).decode(raw)
        model_says = True
    except msgspec.ValidationError:
        model_says = False
    assert model_says == schema_says, wire


@pytest.mark.parametrize("kind", EVENT_KINDS)
def test_each_model_has_the_schemas_fields_and_required_ones(kind: str) -> None:
    schema = load_schema(kind)
    info = msgspec.inspect.type_info(MODELS[kind])
    assert {f.encode_name for f in info.fields} | {"kind"} == set(schema["properties"])
    required = {f.encode_name for f in info.fields if f.required} | {"kind"}
    assert required == set(schema["required"])


@settings(max_examples=300)
@given(events)
def test_the_decoder_takes_a_valid_event_whole_or_in_a_batch(event) -> None:
    wire = json.dumps(to_dict(event)).encode()
    decoder = Decoder(EVENT_KINDS, "memdiag.events", 1 << 20)
    one = decoder.decode(wire)
    batch = decoder.decode(b"[" + wire + b"," + wire + b"]")
    assert [a.event for a in one.accepted] == [event] and not one.rejected
    assert [a.event for a in batch.accepted] == [event, event] and not batch.rejected


def reference_iso_to_us(value: str) -> int | None:
    """The plain reading, with Python's parser: what memdiag's fast one must equal."""
    try:
        dt = datetime.fromisoformat(value.replace("z", "Z").replace("t", "T"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        return None
    us = ts_to_us(dt)
    low, high = ts_to_us(datetime(1, 1, 1, tzinfo=UTC)), ts_to_us(
        datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC))  # fmt: skip
    return us if low <= us <= high else None


two = st.integers(0, 99).map(lambda n: f"{n:02d}")


@settings(max_examples=2000)
@given(
    st.sampled_from(["0000", "0001", "1970", "2026", "9999"]) | st.integers(0, 9999).map(
        lambda n: f"{n:04d}"),
    two, two, two, two, two,
    st.just("") | st.text("0123456789", min_size=1, max_size=12).map(
        lambda d: "." + d),
    st.sampled_from(["Z", "z", "+00:00", "-00:00"]) | st.tuples(st.sampled_from("+-"), two,
                                                                two).map("{0[0]}{0[1]}:{0[2]}".format),
    st.sampled_from("Tt"),
)  # fmt: skip
def test_the_fast_time_parser_reads_what_pythons_reads(
    y: str, mo: str, d: str, h: str, mi: str, se: str, frac: str, zone: str, t: str
) -> None:
    """Fractions beyond the microsecond cut off, offsets of Python's reading, the years 1 to
    9999 in UTC: every string of the schemas' ts pattern, the same microsecond or refusal."""
    value = f"{y}-{mo}-{d}{t}{h}:{mi}:{se}{frac}{zone}"
    assume(re.fullmatch(TS_PATTERN, value))
    expected = reference_iso_to_us(value)
    assert iso_to_us(value) == expected
    # and the models' reading (Python's parser first, on what the pattern lets through)
    ts_us_of.cache_clear()
    if expected is None:
        with pytest.raises(ValueError):
            ts_us_of(value)
    else:
        assert ts_us_of(value) == expected


def test_a_failure_context_json_cannot_carry_is_a_dead_letter_with_what_to_do() -> None:
    """An integer past 64 bits is JSON msgspec reads but orjson cannot write again: kept, it
    would stop the worker at every send of the session's diagnostic."""
    outcome = (
        b'{"kind":"session_outcome","event_id":"o1","ts":"2026-11-20T10:00:00Z",'
        b'"session_id":"s1","outcome":"rejected","files_modified":[],"tool_calls":[],"errors":[],'
        b'"failure_context":{"n":123456789012345678901234567890}}'
    )
    decoded = Decoder(["session_outcome"], "memdiag.events", 1 << 20).decode(outcome)
    assert not decoded.accepted
    [rejected] = decoded.rejected
    assert rejected.reason == "bad_value" and "64 bits" in rejected.detail
