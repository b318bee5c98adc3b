"""What memdiag sends a memory system (``memdiag.weights``, ``memdiag.graph_weights``),
checked from the outside: every message matches its JSON Schema, one (kind, key, version)
carries one state, and a consumer written from docs/memory-system.md's prose alone ends
holding what DuckDB holds, across a late session and a retraction, however the messages are
delivered. The messages are the worker's own (its stages, runner and checkpoint in memory:
:class:`tests.inmemory.World`); through the broker: tests/integration/test_weight_consumer.py.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import duckdb
import jsonschema
import orjson
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from memdiag.analytics.db import init_schema
from memdiag.analytics.sink import DuckDBSink
from memdiag.schemas import load_schema
from memdiag.schemas.models import iso_to_us
from memdiag.settings import Settings
from tests.inmemory import Tables, World
from tests.unit.test_otlp import Agent, ns

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "memory-system.md"
SETTINGS = Settings(events_partitions=4)
WEIGHTS, GRAPH_WEIGHTS = SETTINGS.topics.weights, SETTINGS.topics.graph_weights
#: the message kinds the weight topics carry -> their schema
SCHEMA_OF = {"observation_weight": "weight", "strength": "weight", "graph_weight": "graph_weight"}


class Message(NamedTuple):
    """A message as a consumer gets it from Kafka."""

    topic: str
    key: bytes
    value: bytes

    @property
    def doc(self) -> dict[str, Any]:
        return orjson.loads(self.value)  # type: ignore[no-any-return]


# -- the consumer, from the docs' prose ---------------------------------------------------------


class ProseConsumer:
    """A memory system's consumer of both weight topics, written from docs/memory-system.md
    alone. The rules it follows, quoted (``test_the_consumer_quotes_the_docs`` checks that the
    page still says them):

    - "per (`kind`, key), apply a message only if its `version` is higher than the one you
      applied."
    - "The key is the Kafka key (`observation_id` on `memdiag.weights`; `id` on
      `memdiag.graph_weights`). Never add messages up."
    - "A strength message with `current_step` 0 says that no verdict of the memory stands any
      more (each was taken back). Forget its strength: the memory is back to 1.0, as
      if never judged. DuckDB deletes its `observation_strength` row. Keep its `version` all
      the same."
    - "Ignore a field you do not know; more may come. Ignore a message whose `kind` you do
      not know."
    - "A `current_*` field is the column of the same name without `current_` in the
      current-state table" (and the "Fields" tables: `updated_at`, `version`, and on
      `memdiag.graph_weights` `graph_kind` and `graph_id`, keep their names).

    What it holds is what the docs say DuckDB holds: one row per key, by column name.
    """

    RULES = (
        "per (`kind`, key), apply a message only if its `version` is higher than the one you "
        "applied.",
        "The key is the Kafka key (`observation_id` on `memdiag.weights`; `id` on "
        "`memdiag.graph_weights`). Never add messages up.",
        "A strength message with `current_step` 0 says that no verdict of the memory stands any "
        "more (each was taken back). Forget its strength: the memory is back to 1.0, as "
        "if never judged. DuckDB deletes its `observation_strength` row. Keep its `version` all "
        "the same.",
        "Ignore a field you do not know; more may come. Ignore a message whose `kind` you do "
        "not know.",
        "A `current_*` field is the column of the same name without `current_` in the "
        "current-state table",
    )
    KINDS = ("observation_weight", "strength", "graph_weight")

    def __init__(self) -> None:
        self.applied: dict[tuple[str, str], int] = {}  # (kind, key) -> version applied
        self.observation_weights: dict[str, dict[str, Any]] = {}
        self.observation_strength: dict[str, dict[str, Any]] = {}
        self.graph_weights: dict[str, dict[str, Any]] = {}

    def counter(self, kind: str, key: str) -> tuple[str, str]:
        """Whose version a message carries."""
        return (kind, key)

    def apply(self, msg: Message) -> None:
        m = orjson.loads(msg.value)
        kind, key = m.get("kind"), msg.key.decode()
        if kind not in self.KINDS:
            return
        counter = self.counter(kind, key)
        if m["version"] <= self.applied.get(counter, 0):
            return
        self.applied[counter] = m["version"]
        current = {k.removeprefix("current_"): v for k, v in m.items() if k.startswith("current_")}
        row = {**current, "updated_at": m["updated_at"], "version": m["version"]}
        if kind == "strength":
            if m["current_step"] == 0:
                self.observation_strength.pop(key, None)
            else:
                self.observation_strength[key] = row
        elif kind == "observation_weight":
            self.observation_weights[key] = row
        else:
            self.graph_weights[key] = {"graph_kind": m["graph_kind"], "graph_id": m["graph_id"],
                                       **row}  # fmt: skip

    def tables(self) -> dict[str, dict[str, dict[str, Any]]]:
        return {
            "observation_weights": self.observation_weights,
            "observation_strength": self.observation_strength,
            "graph_weights": self.graph_weights,
        }


class PerKeyConsumer(ProseConsumer):
    """The rule docs/memory-system.md said before: "per key, apply a message only if its
    version is higher". Strength and weight share a key and count versions apart, so it
    drops updates: kept to show the scenario tells the two rules apart."""

    def counter(self, kind: str, key: str) -> tuple[str, str]:
        return ("", key)


def duckdb_tables(con: duckdb.DuckDBPyConnection) -> dict[str, dict[str, dict[str, Any]]]:
    """The three current-state tables as the sink wrote them, one row per key, by column."""

    def rows(sql: str) -> dict[str, dict[str, Any]]:
        cursor = con.execute(sql)
        names = [d[0] for d in cursor.description]
        return {r[0]: dict(zip(names[1:], r[1:], strict=True)) for r in cursor.fetchall()}

    return {
        "observation_weights": rows(
            "SELECT observation_id, weight, epoch_us(updated_at) AS updated_at, step, "
            "failed_sessions, accepted_sessions, misleading, version FROM observation_weights"
        ),
        "observation_strength": rows(
            "SELECT observation_id, strength, epoch_us(updated_at) AS updated_at, step, "
            "used_turns, version FROM observation_strength"
        ),
        "graph_weights": rows(
            "SELECT id, graph_kind, graph_id, weight, epoch_us(updated_at) AS updated_at, step, "
            "failed_sessions, accepted_sessions, misleading, version FROM graph_weights"
        ),
    }


def held(consumer: ProseConsumer) -> dict[str, dict[str, dict[str, Any]]]:
    """What the consumer holds, timestamps as DuckDB's ``epoch_us``."""
    return {
        table: {k: {**row, "updated_at": iso_to_us(row["updated_at"])} for k, row in rows.items()}
        for table, rows in consumer.tables().items()
    }


# -- deliveries ---------------------------------------------------------------------------------


def in_order(msgs: list[Message], rng: random.Random) -> list[Message]:
    return list(msgs)


def redelivered(msgs: list[Message], rng: random.Random) -> list[Message]:
    """As a consumer restarted before its commit gets them: now and then back to an earlier
    offset, every message after it again; and single duplicates."""
    out: list[Message] = []
    i = 0
    while i < len(msgs):
        out.append(msgs[i])
        if rng.random() < 0.1:
            out.append(msgs[i])
        if rng.random() < 0.05:
            i = max(0, i - rng.randint(1, 12))
        i += 1
    return out


def across_keys(msgs: list[Message], rng: random.Random) -> list[Message]:
    """Each (topic, key) in its own order, the keys interleaved at random (as partitions of
    more than one key arrive), with duplicates."""
    queues: dict[tuple[str, bytes], list[Message]] = {}
    for m in msgs:
        queues.setdefault((m.topic, m.key), []).append(m)
    out: list[Message] = []
    while queues:
        k = rng.choice(sorted(queues))
        out.append(queues[k].pop(0))
        if rng.random() < 0.1:
            out.append(out[-1])
        if not queues[k]:
            del queues[k]
    return out


def any_order(msgs: list[Message], rng: random.Random) -> list[Message]:
    """Beyond what Kafka does (one key's messages out of order too): the version rule alone
    still ends at the newest state of each (kind, key)."""
    out = msgs + rng.sample(msgs, len(msgs) // 4)
    rng.shuffle(out)
    return out


DELIVERIES = (in_order, redelivered, across_keys, any_order)


# -- the scenario -------------------------------------------------------------------------------

M1 = {"id": "m1", "content": "postgres vacuum replica failover"}
GONE = {"id": "gone", "content": "kubernetes ingress annotations"}  # in one turn, taken back
STALE = {"id": "stale", "content": "deploys freeze every friday afternoon"}
USES_M1 = "we vacuum postgres replica nightly"
IGNORES = "the refund went through stripe"
EDGE = {"source_id": "auth", "target_id": "tokens", "relationship": "ROTATES"}


def conversation() -> dict[str, Any]:
    """A conversation at 09:00, reported as OpenTelemetry spans (docs/spans.md): s1 retrieves
    m1 and ``gone``; chat c1 was not captured (no output messages: it is not judged); chat c2
    answers without them. Until c1 comes, s1's memories are c2's and judged ignored there;
    when it comes they move to c1, and c2's verdicts are taken back."""
    agent = Agent()
    conv = {"gen_ai.conversation.id": "conv-1"}
    root = agent.span("invoke_agent", 0, None, **conv, **{
        "gen_ai.operation.name": "invoke_agent", "memdiag.outcome": "accepted"})  # fmt: skip
    s1 = agent.span("search_memory", 1, 1.5, root, **{
        "gen_ai.operation.name": "search_memory", "gen_ai.memory.query.text": "vacuum",
        "gen_ai.memory.records": json.dumps([M1, GONE])})  # fmt: skip
    c1 = agent.span("chat", 2, 3, root, **conv, **{"gen_ai.operation.name": "chat"})
    answer = [{"role": "assistant", "parts": [{"type": "text", "content": IGNORES}]}]
    c2 = agent.span("chat", 5, 6, root, **conv, **{
        "gen_ai.operation.name": "chat", "gen_ai.output.messages": json.dumps(answer)})  # fmt: skip
    root.end(end_time=ns(9))
    return {"root": root, "s1": s1, "c1": c1, "c2": c2}


def session(sid: str, hour: int, minute: int, result: str, turns: list[tuple[list[dict], str]],
            entities: list[str], edges: list[dict[str, str]]) -> list[dict[str, Any]]:  # fmt: skip
    """A session: a turn a minute from HOUR:MINUTE (the first injects the graph ids), then
    its outcome ten minutes in."""

    def ts(m: int) -> str:
        return f"2026-11-21T{hour:02d}:{minute + m:02d}:00.000Z"

    events: list[dict[str, Any]] = []
    for i, (observations, text) in enumerate(turns):
        base = {"session_id": sid, "turn_id": f"t{i + 1}", "ts": ts(i), "org_id": "org_1"}
        graph = {"graph_entity_ids": entities, "graph_edge_keys": edges} if i == 0 else {}
        events += [
            {
                **base,
                "kind": "injection",
                "event_id": f"{sid}-i{i}",
                "observations": observations,
                **graph,
            },
            {**base, "kind": "response", "event_id": f"{sid}-r{i}", "text": text},
        ]
    events.append({"kind": "session_outcome", "event_id": f"{sid}-o", "ts": ts(10),
                   "session_id": sid, "org_id": "org_1", "outcome": result,
                   "tool_calls": [{"tool": "pytest", "success": result == "accepted"}],
                   "files_modified": ["a.py"], "errors": []})  # fmt: skip
    return events


class Step(NamedTuple):
    """What to publish next, then let the worker process: events, or OTLP span records."""

    events: list[dict[str, Any]]
    spans: list[bytes]


def scenario() -> list[Step]:
    """One memory, ``m1``, takes outcome steps and verdicts from plain sessions and from a
    conversation reported as spans; a late session and a late span move its steps; a late
    span takes a verdict back (``gone``'s only one, too); ``stale`` (and graph entity
    ``legacy``) becomes misleading (aggressive steps) and a late accepted session clears it."""
    spans = conversation()

    def span_records(*names: str) -> list[bytes]:
        return [encode_spans([spans[n]]).SerializeToString() for n in names]

    a = session("ses-a", 10, 0, "accepted", [([M1], USES_M1)], ["auth"], [EDGE])
    b = session("ses-b", 11, 0, "rejected", [([M1], IGNORES)] * 2, ["auth"], [EDGE])
    c = session("ses-c", 10, 30, "accepted", [([M1], USES_M1)], ["auth", "tokens"], [EDGE])
    failed = [
        e
        for i, sid in enumerate(("ses-d", "ses-e", "ses-f"))
        for e in session(sid, 12, 10 * i, "rejected", [([M1, STALE], IGNORES)], ["legacy"], [])
    ]
    g = session("ses-g", 11, 30, "accepted", [([STALE], IGNORES)], ["legacy"], [])
    return [
        Step(a + b, []),
        # a conversation at 09:00 whose outcome and c2 verdict come after A's and B's: late
        Step([], span_records("root", "s1", "c2")),
        # a late session: its outcome (10:40) lands between A's and B's
        Step(c, []),
        # c1 comes last: s1 was c1's retrieval, so c2's verdicts are taken back; gone has
        # no verdict left
        Step([], span_records("c1")),
        Step(failed, []),  # stale and legacy: misleading at the third, aggressive steps
        Step(g, []),  # a late accepted session: stale and legacy no longer misleading
    ]


class Recorder(Tables):
    """The sink's tables, and every weight message in the order the worker sent it."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[Message] = []

    def add(self, record: dict[str, Any]) -> None:
        super().add(record)
        kind = record["kind"]
        if kind in ("observation_weight", "strength"):
            self.sent.append(Message(WEIGHTS, record["observation_id"].encode(),
                                     orjson.dumps(record)))  # fmt: skip
        elif kind == "graph_weight":
            self.sent.append(Message(GRAPH_WEIGHTS, record["id"].encode(), orjson.dumps(record)))


class Run(NamedTuple):
    messages: list[Message]  # both weight topics, as sent
    duckdb: dict[str, dict[str, dict[str, Any]]]  # the sink's current-state tables


def run_scenario(tmp_path: Path, seed: int = 0, crash_rate: float = 0.0) -> Run:
    """The scenario through the worker in memory (each step processed before the next), its
    records through the real sink into DuckDB."""
    world = World(SETTINGS, seed=seed, crash_rate=crash_rate)
    world.tables = recorder = Recorder()
    for step in scenario():
        world.publish(step.events)
        world.publish_spans([(None, raw) for raw in step.spans])
        world.run()
    sink = DuckDBSink(tmp_path / f"weights-{seed}.duckdb")
    sink.init()
    sink.write([*world.records, *(m.doc for m in recorder.sent)])
    with duckdb.connect(sink.path, read_only=True) as con:
        return Run(recorder.sent, duckdb_tables(con))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_scenario(tmp_path_factory.mktemp("weights"))


def check_coverage(msgs: list[Message]) -> None:
    """The scenario does what it says: late re-sends, a retraction, aggressive steps, an
    entity and an edge, strength and weight on one key."""
    docs = [m.doc for m in msgs]
    kinds = {d["kind"] for d in docs}
    assert kinds == {"observation_weight", "strength", "graph_weight"}
    assert any(d["kind"] == "strength" and d["retracted"] for d in docs)
    assert any(d["kind"] == "strength" and d["current_step"] == 0 for d in docs)  # gone
    assert any(d["kind"] == "observation_weight" and d["aggressive"] for d in docs)
    assert any(d["kind"] == "graph_weight" and d["aggressive"] for d in docs)
    assert {d["graph_kind"] for d in docs if d["kind"] == "graph_weight"} == {"entity", "edge"}

    def resent(kind: str, step_key: tuple[str, ...]) -> bool:
        seen: dict[tuple[Any, ...], set[int]] = {}
        for d in docs:
            if d["kind"] == kind and not d.get("retracted"):
                seen.setdefault(tuple(d[k] for k in step_key), set()).add(d["version"])
        return any(len(v) > 1 for v in seen.values())

    assert resent("observation_weight", ("observation_id", "session_id"))  # a late session
    assert resent("strength", ("observation_id", "session_id", "turn_id"))  # a late verdict
    assert resent("graph_weight", ("id", "session_id"))
    m1 = {d["kind"] for d in docs if d.get("observation_id") == "m1"}
    assert m1 == {"observation_weight", "strength"}


# -- the schemas --------------------------------------------------------------------------------


def _objects(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if "properties" in node:
            yield node
        for value in node.values():
            yield from _objects(value)
    elif isinstance(node, list):
        for value in node:
            yield from _objects(value)


@pytest.mark.parametrize("name", ["weight", "graph_weight"])
def test_the_schemas_are_2020_12_and_describe_every_property(name: str) -> None:
    schema = load_schema(name)  # from the package, as the wheel ships it ("*.json")
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["description"]
    for obj in _objects(schema):
        for prop, spec in obj["properties"].items():
            assert spec.get("description"), f"{name}: {prop} has no description"
        assert obj.get("additionalProperties", True) is True  # consumers ignore new fields


def _shapes(name: str) -> dict[tuple[str, bool | None], dict[str, Any]]:
    """(kind, retracted) -> (required, every property) of each message shape."""
    schema = load_schema(name)
    if name == "graph_weight":
        return {("graph_weight", None): schema}
    defs = schema["$defs"]
    common = defs["strength_current"]["properties"]

    def shape(d: str) -> dict[str, Any]:
        spec = defs[d]
        props = {**(common if "$ref" in spec else {}), **spec["properties"]}
        return {"required": spec["required"], "properties": props}

    return {("observation_weight", None): shape("observation_weight"),
            ("strength", False): shape("strength"),
            ("strength", True): shape("strength_retracted")}  # fmt: skip


def test_every_message_matches_its_schema_and_names_exactly_its_fields(run: Run) -> None:
    check_coverage(run.messages)
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    validators = {n: jsonschema.Draft202012Validator(load_schema(n), format_checker=checker)
                  for n in ("weight", "graph_weight")}  # fmt: skip
    shapes = {**_shapes("weight"), **_shapes("graph_weight")}
    for msg in run.messages:
        doc = msg.doc
        name = SCHEMA_OF[doc["kind"]]
        assert (msg.topic == GRAPH_WEIGHTS) == (name == "graph_weight")
        validators[name].validate(doc)
        shape = shapes[(doc["kind"], doc.get("retracted"))]
        # required: what is always there; properties: every field memdiag sends, documented
        assert set(shape["required"]) <= set(doc) <= set(shape["properties"]), doc
        assert msg.key.decode() == doc.get("observation_id", doc.get("id"))
    # a future field is allowed; a missing version, a wrong kind or a weight above 1 are not
    doc = next(m.doc for m in run.messages if m.doc["kind"] == "strength")
    validators["weight"].validate({**doc, "confidence": 0.5})
    for bad in ({k: v for k, v in doc.items() if k != "version"}, {**doc, "kind": "weight"},
                {**doc, "current_strength": 1.5}):  # fmt: skip
        assert not validators["weight"].is_valid(bad)
    graph = next(m.doc for m in run.messages if m.doc["kind"] == "graph_weight")
    assert not validators["graph_weight"].is_valid({**graph, "graph_kind": "node"})


def test_one_kind_key_and_version_carry_one_state(run: Run) -> None:
    """Contract section 1: `version` grows, per (kind, key), with every change of the
    `current_*` values; two messages with one (kind, key, version) carry the same values."""
    state: dict[tuple[str, bytes, int], dict[str, Any]] = {}
    last: dict[tuple[str, bytes], int] = {}
    for msg in run.messages:
        doc = msg.doc
        current = {k: v for k, v in doc.items() if k.startswith("current_") or k == "updated_at"}
        kind_key = (doc["kind"], msg.key)
        assert state.setdefault((*kind_key, doc["version"]), current) == current, doc
        assert doc["version"] >= last.get(kind_key, 0)  # one owner sends a key's in order
        last[kind_key] = doc["version"]


# -- the consumer -------------------------------------------------------------------------------


def test_the_consumer_quotes_the_docs() -> None:
    text = " ".join(DOC.read_text().split())
    for rule in ProseConsumer.RULES:
        assert " ".join(rule.split()) in text, rule
    assert "per key, apply a message only if" not in text  # the old rule is gone


@pytest.mark.parametrize("delivery", DELIVERIES, ids=lambda d: d.__name__)
def test_a_consumer_written_from_the_docs_holds_what_duckdb_holds(run: Run, delivery: Any) -> None:
    for seed in range(20):
        consumer = ProseConsumer()
        for msg in delivery(run.messages, random.Random(seed)):
            consumer.apply(msg)
        assert held(consumer) == run.duckdb, (delivery.__name__, seed)
    assert all(run.duckdb.values())  # every table has rows to compare


@pytest.mark.parametrize("seed", range(4))
def test_the_same_through_a_worker_that_crashes(tmp_path: Path, seed: int) -> None:
    """Killed at random (between batches, at each step of its checkpoint), the worker
    re-sends what it had sent: the consumer still ends with DuckDB's tables."""
    crashed = run_scenario(tmp_path, seed=seed, crash_rate=0.2)
    check_coverage(crashed.messages)
    for delivery in DELIVERIES:
        consumer = ProseConsumer()
        for msg in delivery(crashed.messages, random.Random(seed)):
            consumer.apply(msg)
        assert held(consumer) == crashed.duckdb, delivery.__name__


def test_the_old_per_key_rule_loses_updates(run: Run) -> None:
    """The scenario tells the rules apart: keyed by observation alone, weight and strength
    versions shadow each other and the consumer ends with stale values."""
    consumer = PerKeyConsumer()
    for msg in run.messages:
        consumer.apply(msg)
    assert held(consumer) != run.duckdb


def test_unknown_kinds_and_fields_are_ignored(run: Run) -> None:
    consumer = ProseConsumer()
    for msg in run.messages:
        doc = {**msg.doc, "a_future_field": [1, 2]}
        consumer.apply(msg._replace(value=orjson.dumps(doc)))
        future = {"kind": "a_future_kind", "version": 10**9}
        consumer.apply(msg._replace(value=orjson.dumps(future)))
    assert held(consumer) == run.duckdb


def test_the_docs_name_every_field_memdiag_sends(run: Run) -> None:
    """docs/memory-system.md's "Fields" tables name every field of both topics."""
    text = DOC.read_text().split("## Fields", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| `([a-z_]+)`(?:, `([a-z_]+)`)?", text, re.M))
    documented = {f for pair in named for f in pair if f}
    sent = {k for m in run.messages for k in m.doc}
    assert sent <= documented, sent - documented
    for field in ("current_used_turns", "current_failed_sessions", "aggressive",
                  "outcome_event_id"):  # fmt: skip
        assert field in documented


def test_a_file_from_before_graph_kind_gets_it_from_kind() -> None:
    """DuckDB's graph tables take the topic's name, `graph_kind`; `kind` stays (deprecated).
    A file made before has the column added and filled at the sink's start."""
    con = duckdb.connect(":memory:")
    con.execute(
        "CREATE TABLE graph_weights (id VARCHAR PRIMARY KEY, kind VARCHAR NOT NULL, "
        "graph_id VARCHAR NOT NULL, weight DOUBLE NOT NULL, updated_at TIMESTAMPTZ NOT NULL, "
        "step BIGINT NOT NULL, failed_sessions INTEGER NOT NULL, "
        "accepted_sessions INTEGER NOT NULL, misleading BOOLEAN NOT NULL, "
        "version BIGINT NOT NULL)"
    )
    con.execute(
        "INSERT INTO graph_weights VALUES ('edge:a|b|R', 'edge', 'a|b|R', 0.8, "
        "'2026-11-21T10:00:00Z', 1, 1, 0, false, 1)"
    )
    init_schema(con)
    init_schema(con)  # idempotent
    assert con.execute("SELECT kind, graph_kind FROM graph_weights").fetchall() == [
        ("edge", "edge")
    ]


def test_a_batch_sends_each_graph_step_once_with_its_last_values() -> None:
    """A graph entity injected in many sessions (a hot one) whose steps arrive late, newest
    first: each late step changes every later one. Before, each change went out as it came,
    up to the ledger's 256 steps a late session (at 20,000 sessions the worker sent millions
    of messages and held them until its commit); now, as for observations, one record per
    (key, session) a batch, the last, which is what processing them in order gives."""
    from memdiag.contract.envelope import DictStore, InMessage
    from memdiag.streams.stages.observations import ObservationStage

    steps = [
        {"type": "graph", "observation_id": "entity:hot", "ts_us": 1_795_000_000_000_000 + i,
         "session_id": f"s{i:02d}", "outcome_event_id": f"o{i}",
         "outcome": "rejected" if i % 3 else "accepted"}
        for i in range(40)
    ]  # fmt: skip

    def run(order: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        stage, store = ObservationStage(SETTINGS), DictStore()
        msgs = [InMessage("steps", 0, n, b"entity:hot", orjson.dumps([rec]))
                for n, rec in enumerate(order)]  # fmt: skip
        sent = stage.process(msgs, store).graph_weights["entity:hot"]
        assert len(sent) == len({r["session_id"] for r in sent})
        return {r["session_id"]: r for r in sent}

    late_first = run(steps[::-1])
    assert len(late_first) == 40
    in_order = run(steps)
    drop = ("version", "current_weight", "current_step", "current_failed_sessions",
            "current_accepted_sessions", "current_misleading", "updated_at")  # fmt: skip
    for sid, record in in_order.items():
        assert {k: v for k, v in late_first[sid].items() if k not in drop} == {
            k: v for k, v in record.items() if k not in drop
        }, sid
