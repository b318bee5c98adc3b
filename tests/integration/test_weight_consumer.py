"""The memory system's side, through the real broker: a consumer written from
docs/memory-system.md's prose alone (:class:`tests.unit.test_weight_messages.ProseConsumer`)
reads ``memdiag.weights`` and ``memdiag.graph_weights`` as the worker wrote them, across a late
session and a retraction, and ends holding exactly what the sink wrote to DuckDB's
``observation_weights``, ``observation_strength`` and ``graph_weights``: in the delivered
order, with redeliveries and duplicates, and with the keys interleaved otherwise."""

from __future__ import annotations

import random

import jsonschema
import orjson
import pytest

from memdiag.analytics.db import connect
from memdiag.schemas import load_schema
from tests.integration.conftest import Pipeline
from tests.unit.test_weight_messages import (
    DELIVERIES,
    SCHEMA_OF,
    Message,
    PerKeyConsumer,
    ProseConsumer,
    check_coverage,
    duckdb_tables,
    held,
    scenario,
)

pytestmark = pytest.mark.integration


def test_a_consumer_written_from_the_docs_ends_with_duckdbs_weights(pipeline: Pipeline) -> None:
    topics = pipeline.settings.topics
    pipeline.start()
    for step in scenario():  # each step processed and written before the next is published
        if step.events:
            pipeline.publish_events(step.events)
        if step.spans:
            pipeline.publish([(None, raw) for raw in step.spans], topic=topics.otlp_spans)
        pipeline.drain()

    messages = []
    for topic in (topics.weights, topics.graph_weights):
        for key, doc in pipeline.consume(topic):
            assert key is not None  # every message has its key
            messages.append(Message(topic, key, orjson.dumps(doc)))
    check_coverage(messages)  # late re-sends, a retraction, aggressive steps, entity and edge
    validators = {n: jsonschema.Draft202012Validator(load_schema(n))
                  for n in ("weight", "graph_weight")}  # fmt: skip
    for msg in messages:
        validators[SCHEMA_OF[msg.doc["kind"]]].validate(msg.doc)

    con = connect(pipeline.settings.duckdb_path, read_only=True)
    try:
        tables = duckdb_tables(con)
    finally:
        con.close()
    assert all(tables.values())
    for delivery in DELIVERIES:
        for seed in range(10):
            consumer = ProseConsumer()
            for msg in delivery(messages, random.Random(seed)):
                consumer.apply(msg)
            assert held(consumer) == tables, (delivery.__name__, seed)

    old = PerKeyConsumer()  # the rule the page said before: per key alone
    for msg in messages:
        old.apply(msg)
    assert held(old) != tables
