"""The JSON Schema files: valid 2020-12 schemas, the Python models round-trip through them,
and the compiled fast validator agrees with the reference implementation."""

from __future__ import annotations

import itertools
import json
import re
import typing
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
    EDGE_FIELD_PATTERN,
    EDGE_FIELD_SPELLINGS,
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
    written_ts,
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
#: an edge key's fields: any text but '|', which separates them in the key (contract section 10)
edge_text = st.text(st.characters(codec="utf-8", exclude_characters="|"), max_size=20)
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
            st.builds(EdgeKey, source_id=edge_text, target_id=edge_text, relationship=edge_text),
            max_size=2,
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


#: times as runtimes write them (UTC, capital T and Z, with 0, 3 or 6 digits), and any other
#: shape the schemas' pattern takes
written = st.one_of(
    st.builds(
        lambda ts_us, digits: format_ts(ts_us)[: 20 + digits] + "Z" if digits else
        format_ts(ts_us)[:19] + "Z",
        st.integers(min_value=-62_135_596_800_000_000, max_value=253_402_300_799_999_999),
        st.sampled_from([0, 1, 2, 3, 4, 5, 6]),
    ),
    st.from_regex(TS_PATTERN, fullmatch=True),
)


@settings(max_examples=1000)
@given(written)
def test_a_rows_time_taken_from_the_events_text_is_the_formatted_one(ts: str) -> None:
    """The search row's ``ts`` comes from the event's text where it can (its milliseconds
    padded, say): the same string as formatting the time the decoder read from it."""
    try:
        ts_us = ts_us_of(ts)
    except ValueError:  # not a real date-time: the decoder refuses it
        return
    assert written_ts(ts, ts_us) == format_ts(ts_us)


@pytest.mark.parametrize("ts, written", [
    ("2026-11-21T09:30:00.123456Z", "2026-11-21T09:30:00.123456Z"),
    ("2026-11-21T09:30:00.123Z", "2026-11-21T09:30:00.123000Z"),
    ("2026-11-21T09:30:00Z", "2026-11-21T09:30:00.000000Z"),
    ("2026-11-21t09:30:00.123z", "2026-11-21T09:30:00.123000Z"),
    ("2026-11-21T10:30:00.123+01:00", "2026-11-21T09:30:00.123000Z"),
    ("2026-11-21T09:30:00.1234567Z", "2026-11-21T09:30:00.123456Z"),
    ("2026-11-21T09:30:00.12Z", "2026-11-21T09:30:00.120000Z"),
])  # fmt: skip
def test_a_rows_time_is_the_events_text_only_where_it_is_already_written_so(
    ts: str, written: str
) -> None:
    assert written_ts(ts, ts_us_of(ts)) == written
    assert (written_ts(ts, ts_us_of(ts)) is ts) is (ts == written)


def test_hour_24_is_refused_whatever_pythons_parser_takes() -> None:
    # RFC 3339's hours are 00-23; Python 3.14's fromisoformat reads 24:00 as the next day
    for ts in ("2026-11-21T24:00:00Z", "2026-11-21T24:00:00.000Z", "2026-11-21t24:00:00z"):
        with pytest.raises(ValueError, match="not an RFC 3339 date-time"):
            ts_us_of(ts)


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


# -- graph edge keys: every spelling of each field, one canonical key (contract section 10) --

INJECTION = {
    "kind": "injection",
    "event_id": "inj-1",
    "ts": "2026-11-21T09:30:00Z",
    "session_id": "s1",
    "turn_id": "t1",
    "observations": [{"id": "o1", "content": "c"}],
}
SPELLINGS = list(EDGE_FIELD_SPELLINGS.values())  # source, target, relationship
CANONICAL = EdgeKey(source_id="node_a", target_id="node_b", relationship="DEPENDS_ON")


def decode_edges(*edges: dict) -> tuple[str, str] | tuple[EdgeKey, ...]:
    """The event's edge keys, as the decoder takes them, or (reason, detail) of its refusal;
    the same verdict whole and in a batch, and through the models' slow path (a dict)."""
    event = {**INJECTION, "graph_edge_keys": list(edges)}
    decoder = Decoder(["injection"], "memdiag.events", 1 << 20)
    one = decoder.decode(json.dumps(event).encode())
    batch = decoder.decode(json.dumps([event]).encode())
    assert [(r.reason, r.detail) for r in one.rejected] == [
        (r.reason, r.detail) for r in batch.rejected
    ]
    if one.rejected:
        assert not one.accepted
        [rejected] = one.rejected
        with pytest.raises(msgspec.ValidationError):
            from_dict(event)
        return rejected.reason, rejected.detail
    [accepted] = one.accepted
    assert [a.event for a in batch.accepted] == [accepted.event] == [from_dict(event)]
    return accepted.event.graph_edge_keys  # type: ignore[union-attr]


@pytest.mark.parametrize(("source", "target", "relationship"), list(itertools.product(*SPELLINGS)))
def test_each_spelling_of_an_edge_decodes_to_the_one_canonical_key(
    source: str, target: str, relationship: str
) -> None:
    edge = {source: "node_a", target: "node_b", relationship: "DEPENDS_ON"}
    jsonschema.validate({**INJECTION, "graph_edge_keys": [edge]}, load_schema("injection"))
    [key] = decode_edges(edge)
    assert key == CANONICAL and hash(key) == hash(CANONICAL)
    assert (key.source_id, key.target_id, key.relationship) == ("node_a", "node_b", "DEPENDS_ON")
    # the other spellings are folded away: the key writes (and shows) the canonical names only
    assert msgspec.json.decode(msgspec.json.encode(key)) == {
        "source_id": "node_a", "target_id": "node_b", "relationship": "DEPENDS_ON"}  # fmt: skip
    assert repr(key) == repr(CANONICAL)


def test_spellings_of_one_field_that_agree_are_one_field() -> None:
    edge = {"source_id": "node_a", "sourceId": "node_a", "targetId": "node_b",
            "relationship": "DEPENDS_ON", "relationshipName": "DEPENDS_ON",
            "relationship_name": "DEPENDS_ON", "extra": 1}  # fmt: skip
    assert decode_edges(edge, {"sourceId": "x", "target_id": "y", "relationship_name": ""}) == (
        CANONICAL, EdgeKey(source_id="x", target_id="y", relationship=""))  # fmt: skip


@pytest.mark.parametrize(
    ("edge", "words"),
    [
        ({"source_id": "node_a", "sourceId": "node_z", "target_id": "b", "relationship": "r"},
         ["source_id", "sourceId", "'node_a'", "'node_z'", "graph_edge_keys[0]"]),
        ({"source_id": "a", "target_id": "node_b", "targetId": "", "relationship": "r"},
         ["target_id", "targetId", "'node_b'", "''"]),
        ({"source_id": "a", "target_id": "b", "relationshipName": "USES",
          "relationship_name": "uses"},
         ["relationshipName", "relationship_name", "'USES'", "'uses'"]),
        ({"source_id": "a", "target_id": "b", "relationship": "r", "relationship_name": "r",
          "relationshipName": "R"}, ["relationship", "relationshipName", "'r'", "'R'"]),
    ],
)  # fmt: skip
def test_spellings_of_one_field_that_disagree_are_a_bad_value(edge: dict, words: list) -> None:
    reason, detail = decode_edges(edge)
    assert reason == "bad_value" and "disagree" in detail
    for word in words:
        assert word in detail, detail


def test_a_disagreement_shows_long_values_truncated() -> None:
    reason, detail = decode_edges(
        {"sourceId": "a" * 5000, "source_id": "b" * 5000, "target_id": "t", "relationship": "r"}
    )
    assert reason == "bad_value" and "sourceId" in detail and "source_id" in detail
    assert len(detail) < 500


@pytest.mark.parametrize("spelling", sorted(itertools.chain(*SPELLINGS)))
def test_a_bar_in_an_edge_field_is_a_bad_value(spelling: str) -> None:
    edge = {"source_id": "a", "target_id": "b", "relationship": "r", spelling: "x|y"}
    if spelling not in ("source_id", "target_id", "relationship"):
        canonical = next(s[0] for s in SPELLINGS if spelling in s)
        edge[canonical] = "x|y"  # the two spellings agree: the bar alone is the fault
    reason, detail = decode_edges(edge)
    assert reason == "bad_value"
    assert "'x|y'" in detail and "'|'" in detail and "source|target|relationship" in detail


def test_a_bar_in_an_entity_id_is_fine() -> None:
    event = {**INJECTION, "graph_entity_ids": ["a|b"]}
    decoded = Decoder(["injection"], "memdiag.events", 1 << 20).decode(json.dumps(event).encode())
    assert not decoded.rejected and decoded.accepted[0].event.graph_entity_ids == ("a|b",)


@pytest.mark.parametrize(
    ("edge", "words"),
    [
        ({"target_id": "b", "relationship": "r"}, ["'source_id'", "'sourceId'"]),
        ({"sourceId": "a", "relationship": "r"}, ["'target_id'", "'targetId'"]),
        ({"sourceId": "a", "targetId": "b", "relation": "r"},
         ["'relationship'", "'relationshipName'", "'relationship_name'"]),
        ({}, ["'source_id'"]),
    ],
)  # fmt: skip
def test_an_edge_field_in_no_spelling_is_a_missing_field(edge: dict, words: list) -> None:
    reason, detail = decode_edges({"source_id": "a", "target_id": "b", "relationship": "r"}, edge)
    assert reason == "missing_field" and "graph_edge_keys[1]" in detail
    for word in words:
        assert word in detail, detail


@pytest.mark.parametrize("spelling", sorted(itertools.chain(*SPELLINGS)))
@pytest.mark.parametrize("value", [None, 7, ["a"], {"a": "b"}, True])
def test_an_edge_field_not_a_string_is_a_wrong_type(spelling: str, value) -> None:
    edge = {"source_id": "a", "target_id": "b", "relationship": "r", spelling: value}
    reason, detail = decode_edges(edge)
    assert reason == "wrong_type" and f"graph_edge_keys[0].{spelling} must be a string" in detail


def test_the_models_edge_key_has_the_schemas_spellings() -> None:
    items = load_schema("injection")["properties"]["graph_edge_keys"]["items"]
    fields = {f.encode_name for f in msgspec.inspect.type_info(EdgeKey).fields}
    assert fields == set(items["properties"]) == set(itertools.chain(*SPELLINGS))
    assert [tuple(a["required"][0] for a in rule["anyOf"]) for rule in items["allOf"]] == SPELLINGS
    assert all(spec["type"] == "string" and spec["pattern"] == EDGE_FIELD_PATTERN
               and spec["description"] for spec in items["properties"].values())  # fmt: skip


@settings(max_examples=300)
@given(
    st.tuples(edge_text, edge_text, edge_text),
    st.tuples(*(st.sets(st.sampled_from(s), min_size=1) for s in SPELLINGS)),
)
def test_any_choice_of_spellings_is_the_same_canonical_key(values: tuple, chosen: tuple) -> None:
    """Whichever spellings a producer picks for each field (one or several, agreeing), the
    schema takes the edge and the decoder gives the one canonical key."""
    edge = {spelling: value for value, names in zip(values, chosen, strict=True)
            for spelling in sorted(names)}  # fmt: skip
    assert jsonschema.Draft202012Validator(load_schema("injection")).is_valid(
        {**INJECTION, "graph_edge_keys": [edge]}
    )
    source, target, relationship = values
    assert decode_edges(edge) == (
        EdgeKey(source_id=source, target_id=target, relationship=relationship),
    )


def test_only_outcomes_are_tracked_by_the_collector_and_their_cycles_are_collected() -> None:
    """Events and log records are untracked (gc=False: acyclic by their fields), but for
    outcomes: their ``failure_context`` is any object, and one pointing back at its outcome
    must still be collected."""
    import gc
    import weakref

    from memdiag.schemas.models import MODELS, SessionOutcome
    from memdiag.streams.session.records import LogRecord, OutcomeRec

    tracked = {kind for kind, model in MODELS.items() if model.__struct_config__.gc}
    assert tracked == {"session_outcome"}
    records = {rec.__name__ for rec in typing.get_args(LogRecord) if rec.__struct_config__.gc}
    assert records == {"OutcomeRec"}

    class Context(dict):  # a dict that a weak reference can watch
        pass

    for make in (
        lambda ctx: SessionOutcome(event_id="o", ts="2026-11-27T10:00:00Z", session_id="s",
                                   outcome="rejected", tool_calls=(), files_modified=(),
                                   errors=(), failure_context=ctx),
        lambda ctx: OutcomeRec("o", 1, "rejected", (), (), (), None, ctx, 0, 0),
    ):  # fmt: skip
        ctx = Context()
        ctx["back"] = make(ctx)  # a cycle through the outcome
        gone = weakref.ref(ctx)
        del ctx
        gc.collect()
        assert gone() is None
