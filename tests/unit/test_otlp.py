"""OpenTelemetry spans in (docs/spans.md): the OTLP edge, the span mapping as pure functions,
the trace stage's walks and outcomes, span turns in the session, and the equivalence the issue
asks for: spans split into records any way, in any order, keyed or not, as otlp_proto or
otlp_json, with crashes, give the tables the independent reference gives for the equivalent
hand-written events (the in-memory worker; through the broker: tests/integration)."""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from memdiag.contract import (
    BAD_TS,
    BAD_VALUE,
    FEEDBACK,
    MISSING_FIELD,
    NOT_OTLP,
    SEARCH_CALLS,
    SESSION_OUTCOMES,
    TOO_LARGE,
    UNJUDGED_TURNS,
)
from memdiag.contract.envelope import DictStore, InMessage
from memdiag.schemas import otlp
from memdiag.settings import Settings
from memdiag.streams.rules import spans as sp
from memdiag.streams.rules.feedback import keywords
from memdiag.streams.stages.sessions import SessionStage
from memdiag.streams.stages.spans import SpanStage
from memdiag.streams.stages.traces import TraceStage
from memdiag.streams.trace import HEAD as TRACE_HEAD
from memdiag.streams.trace import Trace
from tests.compare import differences, from_records, from_reference
from tests.inmemory import World
from tests.otel_scenario import conversations, otlp_json, records
from tests.reference import reference
from tests.sizes import examples

SETTINGS = Settings(events_partitions=4)
T0 = 1_795_251_600_000_000_000  # ns
PUBLISHED_MS = 1_795_260_000_000


def ns(seconds: float) -> int:
    return T0 + int(seconds * 1e9)


class Agent:
    """A toy agent's tracer, and what it exported."""

    def __init__(self, **resource: Any):
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": "toy", **resource}))
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = provider.get_tracer("toy")

    def span(self, name: str, start: float, end: float, parent: Any = None, **attrs: Any) -> Any:
        ctx = trace_api.set_span_in_context(parent) if parent is not None else None
        s = self.tracer.start_span(name, context=ctx, start_time=ns(start), attributes=attrs)
        if end is not None:
            s.end(end_time=ns(end))
        return s

    @property
    def spans(self) -> list[Any]:
        return list(self.exporter.get_finished_spans())


def key(s: Any) -> str:
    c = s.get_span_context()
    return f"{c.trace_id:032x}:{c.span_id:016x}"


class Pipe:
    """The three stages over one dict store, in memory: records in, session records out."""

    def __init__(self) -> None:
        self.store = DictStore()
        self.spans = SpanStage(SETTINGS, lambda k: 0)
        self.traces = TraceStage(SETTINGS, lambda k: 0)
        self.sessions = SessionStage(SETTINGS, lambda k: 0)
        self.deadletters: list[dict[str, Any]] = []
        self.records: list[dict[str, Any]] = []
        self.span_events: list[dict[str, Any]] = []
        self.memory: list[dict[str, Any]] = []
        self.counts: dict[Any, int] = {}
        self.offset = 0

    def send(self, *raws: bytes, published_ms: int = PUBLISHED_MS) -> Pipe:
        msgs = []
        for raw in raws:
            msgs.append(InMessage(SETTINGS.topics.otlp_spans, 0, self.offset, None, raw,
                                  published_ms))  # fmt: skip
            self.offset += 1
        out = self.spans.process(msgs)
        self._take(out)
        tmsgs = [InMessage(SETTINGS.topics.otlp_traces, p, i, None, orjson.dumps(r),
                           published_ms) for i, (p, r) in enumerate(out.traces)]  # fmt: skip
        out2 = self.traces.process(tmsgs, self.store)
        self._take(out2)
        for _, events, _ in out2.reroute_memory:
            self.memory += events
        smsgs = []
        for i, (partition, r) in enumerate(out2.span_events):
            self.span_events += r
            smsgs.append(InMessage(SETTINGS.topics.span_events, partition, i, None,
                                   orjson.dumps(r), published_ms))  # fmt: skip
        self._take(self.sessions.process(smsgs, self.store))
        self.sessions.settle(self.store)  # a checkpoint a send, as the runner settles it
        return self

    def _take(self, out: Any) -> None:
        self.deadletters += [r for _, r in out.deadletters]
        for sent in out.diagnostics.values():
            self.records += sent
        for k, v in out.counts.items():
            self.counts[k] = self.counts.get(k, 0) + v

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]

    def counted(self, name: str, **attrs: str) -> int:
        return self.counts.get((name, tuple(sorted(attrs.items()))), 0)


# -- the edge --------------------------------------------------------------------------------


def test_otlp_proto_and_json_decode_to_the_same_spans() -> None:
    a = Agent()
    root = a.span("invoke_agent", 0, None, **{"gen_ai.operation.name": "invoke_agent"})
    a.span("chat", 1, 2, root, **{"gen_ai.operation.name": "chat", "n": 3, "f": 0.5, "b": True,
                                  "l": ["x", "y"]})  # fmt: skip
    root.end(end_time=ns(3))
    proto = encode_spans(a.spans).SerializeToString()
    by_proto = otlp.decode(proto)
    by_json = otlp.decode(otlp_json(a.spans))  # hex ids, enums as integers: the Collector's
    assert (by_proto.encoding, by_json.encoding) == (otlp.PROTO, otlp.JSON)
    assert by_proto.traces == by_json.traces
    [chat] = [s.span for s in otlp.spans(by_json.traces) if s.span.name == "chat"]
    assert otlp.hex_id(chat.parent_span_id) == key(root).split(":")[1]
    assert otlp.attributes(chat.attributes) == {
        "gen_ai.operation.name": "chat", "n": 3, "f": 0.5, "b": True, "l": ["x", "y"]
    }  # fmt: skip
    # protobuf's own JSON (base64 ids, as MessageToJson writes it) reads the same
    from google.protobuf import json_format

    canonical = json_format.MessageToJson(encode_spans(a.spans)).encode()
    assert otlp.decode(canonical).traces == by_proto.traces


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"", "empty"),
        (b'{"resourceSpans": 3}', "not an OTLP TracesData"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": 7}]}]}]}', "does not fit"),
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe garbage \x00\x01", "otlp_proto"),
    ],
)
def test_a_record_that_is_no_otlp_says_why(raw: bytes, says: str) -> None:
    with pytest.raises(otlp.NotOtlp, match=says):
        otlp.decode(raw)


# -- the mapping, pure --------------------------------------------------------------------------


def read(attrs: dict[str, Any], resource: dict[str, Any] | None = None, error: bool = False,
         exceptions: list[dict[str, Any]] | None = None, parent: str = "",
         status_message: str = "") -> tuple[Any, Any]:  # fmt: skip
    return sp.read_span("t" * 32, "s" * 16, parent, 10, 20, attrs, resource or {},
                        error, exceptions or [], status_message)  # fmt: skip


def test_searches_by_each_convention() -> None:
    records = json.dumps([{"id": "m1", "content": "Billing retries backoff", "score": 0.9},
                          {"content": {"pref": "vegetarian meals"}}, {"score": 0.1}])  # fmt: skip
    rec, problem = read({"gen_ai.operation.name": "search_memory", "gen_ai.memory.records": records,
                         "gen_ai.memory.query.text": "billing"})  # fmt: skip
    assert problem is None and rec["role"] == sp.SEARCH and rec["q"] == "billing"
    content_id = sp.content_id('{"pref":"vegetarian meals"}')
    assert rec["ids"] == ["m1", content_id]  # a record without id: known by its content
    assert rec["docs"] == [["m1", sorted(keywords("Billing retries backoff"))],
                           [content_id, sorted(keywords('{"pref":"vegetarian meals"}'))]]  # fmt: skip
    # retrieval: documents are {id, score}; no content, nothing to inject
    rec, _ = read({"gen_ai.operation.name": "retrieval", "gen_ai.retrieval.query.text": "q",
                   "gen_ai.retrieval.documents": [{"id": "d1"}, {"id": "d2", "score": 0.3}]})  # fmt: skip
    assert rec["ids"] == ["d1", "d2"] and "docs" not in rec
    # OpenInference: flattened documents, integer ids
    rec, _ = read({"openinference.span.kind": "RETRIEVER", "input.value": "refunds",
                   "retrieval.documents.1.document.id": 7,
                   "retrieval.documents.1.document.content": "stripe refund webhook",
                   "retrieval.documents.0.document.id": "a"})  # fmt: skip
    assert rec["ids"] == ["a", "7"] and rec["docs"] == [["7", ["refund", "stripe", "webhook"]]]


def test_an_openinference_document_without_an_id_takes_the_id_of_its_metadata() -> None:
    """OpenInference's LangChain instrumentation writes a Document's metadata as a JSON
    string and never ``document.id``."""
    rec, problem = read({"openinference.span.kind": "RETRIEVER", "input.value": "deploys",
        "retrieval.documents.0.document.content": "canary deploys need approval",
        "retrieval.documents.0.document.metadata": '{"id": "m1", "source": "memories"}',
        "retrieval.documents.1.document.content": "rollback the release",
        "retrieval.documents.1.document.metadata": {"id": 42},  # structured, an integer
        "retrieval.documents.2.document.id": "own",  # its own id wins over metadata
        "retrieval.documents.2.document.metadata": '{"id": "other"}',
        "retrieval.documents.3.document.content": "index rebuild",
        "retrieval.documents.3.document.metadata": "not json {",  # the app's: not refused
        "retrieval.documents.4.document.content": "cache eviction",
        "retrieval.documents.4.document.metadata": '["id", "x"]',  # no object: no id
    })  # fmt: skip
    assert problem is None
    assert rec["ids"] == ["m1", "42", "own", sp.content_id("index rebuild"),
                          sp.content_id("cache eviction")]  # fmt: skip
    assert [d[0] for d in rec["docs"]] == ["m1", "42", rec["ids"][3], rec["ids"][4]]


def test_memdiag_source_viewer_marks_a_humans_search() -> None:
    search = {"gen_ai.operation.name": "search_memory", "gen_ai.memory.query.text": "q"}
    rec, problem = read({**search, "memdiag.source": "viewer"})
    assert problem is None and rec["src"] == "viewer"
    rec, _ = read(search, resource={"memdiag.source": "viewer"})  # on its resource
    assert rec["src"] == "viewer"
    rec, _ = read({**search, "memdiag.source": "agent"}, resource={"memdiag.source": "viewer"})
    assert "src" not in rec  # the span's own wins
    rec, problem = read(search, resource={"memdiag.source": "backend"})
    assert problem is None and "src" not in rec  # a resource's own word for it: not memdiag's
    records = json.dumps([{"id": "m1", "content": "billing retries backoff"}])
    rec, _ = read({**search, "memdiag.source": "viewer", "gen_ai.memory.records": records})
    assert rec["ids"] == ["m1"] and "docs" not in rec  # injects nothing: nothing kept for it
    rec, problem = read({**search, "memdiag.source": "human"})
    assert (
        problem is not None and problem.reason == BAD_VALUE and "memdiag.source" in problem.detail
    )
    assert "role" not in rec  # a link
    rec, _ = read({"gen_ai.operation.name": "chat", "memdiag.source": "viewer"})
    assert "src" not in rec  # only searches have a source


def test_turns_read_the_text_parts_or_say_why_not() -> None:
    messages = [{"role": "assistant", "parts": [{"type": "text", "content": "Adding Backoff"},
                                                 {"type": "tool_call", "name": "x"},
                                                 {"type": "text", "content": "and jitter!"}]}]  # fmt: skip
    rec, _ = read({"gen_ai.operation.name": "chat", "gen_ai.output.messages": json.dumps(messages)})
    assert rec["role"] == sp.TURN and rec["words"] == ["adding", "backoff", "jitter"]
    tool_only = [{"role": "assistant", "parts": [{"type": "tool_call", "name": "x"}]}]
    rec, _ = read({"gen_ai.operation.name": "chat", "gen_ai.output.messages": tool_only})
    assert rec["why"] == sp.NO_TEXT  # structured attribute value, tool calls only
    rec, _ = read({"gen_ai.operation.name": "text_completion"})
    assert rec["why"] == sp.NO_OUTPUT_MESSAGES  # capture is opt-in
    rec, _ = read({"openinference.span.kind": "LLM",
                   "llm.output_messages.0.message.contents.0.message_content.type": "text",
                   "llm.output_messages.0.message.contents.0.message_content.text": "Rotate tokens"})  # fmt: skip
    assert rec["words"] == ["rotate", "tokens"]


def test_agents_tools_and_writes() -> None:
    rec, problem = read({"gen_ai.operation.name": "invoke_agent", "memdiag.outcome": "rework",
                         "gen_ai.agent.name": "coder", "gen_ai.conversation.id": "c1"})  # fmt: skip
    assert problem is None and rec["outcome"] == "rework" and rec["sid"] == "c1"
    assert rec["ag"] == "coder"
    rec, _ = read({"gen_ai.operation.name": "invoke_agent"})
    assert rec["role"] == sp.AGENT and "outcome" not in rec  # no outcome: a link
    rec, _ = read({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "pytest",
                   "memdiag.file": "t.py"}, error=True,
                  exceptions=[{"exception.type": "AssertionError", "exception.message": "2 failed"}])  # fmt: skip
    assert (rec["tool"], rec["ok"], rec["file"], rec["err"]) == (
        "pytest",
        False,
        "t.py",
        ["2 failed"],
    )
    rec, _ = read({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "x"}, error=True)
    assert rec["ok"] is False and "err" not in rec  # failed, with nothing said: no error
    # opentelemetry-util-genai: status ERROR with its description and error.type, no event
    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "eslint",
            "error.type": "LintError"}  # fmt: skip
    rec, _ = read(tool, error=True, status_message="eslint: 3 lint errors")
    assert (rec["ok"], rec["err"]) == (False, ["eslint: 3 lint errors"])
    rec, _ = read(tool, error=True)
    assert rec["err"] == ["LintError"]  # no description: the error's type
    rec, _ = read(tool, error=True, status_message="x",
                  exceptions=[{"exception.message": "from the event"}])  # fmt: skip
    assert rec["err"] == ["from the event"]  # an exception event says it best
    rec, _ = read(tool, status_message="not an error")
    assert rec["ok"] is True and "err" not in rec  # error.type on a span not in ERROR
    rec, _ = read({"openinference.span.kind": "TOOL", "tool.name": "grep"})
    assert (rec["tool"], rec["ok"]) == ("grep", True)
    rec, _ = read({"gen_ai.operation.name": "create_memory", "gen_ai.memory.record.id": "m9",
                   "gen_ai.memory.store.id": "ms1"})  # fmt: skip
    assert (rec["role"], rec["mids"], rec["store"]) == (sp.WRITE, ["m9"], "ms1")
    rec, _ = read({"gen_ai.operation.name": "upsert_memory",
                   "gen_ai.memory.records": json.dumps([{"id": "a", "content": "x"}, {"id": "b"}])})  # fmt: skip
    assert rec["mids"] == ["a", "b"]
    rec, problem = read({"gen_ai.operation.name": "create_memory",
                         "gen_ai.memory.record.id": "m9"}, error=True)  # fmt: skip
    assert problem is None and "role" not in rec  # a failed write wrote nothing: a link


@pytest.mark.parametrize(
    ("attrs", "reason", "says"),
    [
        ({"gen_ai.operation.name": "search_memory", "gen_ai.memory.records": "[{oops"},
         BAD_VALUE, "gen_ai.memory.records is not valid JSON"),
        ({"gen_ai.operation.name": "retrieval", "gen_ai.retrieval.documents": '{"id": 1}'},
         BAD_VALUE, "must be a JSON array"),
        ({"gen_ai.operation.name": "chat", "gen_ai.output.messages": "no"},
         BAD_VALUE, "gen_ai.output.messages is not valid JSON"),
        ({"gen_ai.operation.name": "invoke_agent", "memdiag.outcome": "done"},
         BAD_VALUE, "memdiag.outcome is 'done'"),
        ({"gen_ai.operation.name": "execute_tool"}, MISSING_FIELD, "gen_ai.tool.name"),
        ({"gen_ai.operation.name": "create_memory"}, MISSING_FIELD, "gen_ai.memory.record.id"),
    ],
)  # fmt: skip
def test_a_span_that_cannot_be_read_says_why_and_stays_a_link(
    attrs: dict[str, Any], reason: str, says: str
) -> None:
    rec, problem = read({**attrs, "gen_ai.conversation.id": "c"}, parent="p" * 16)
    assert problem is not None and problem.reason == reason and says in problem.detail
    assert "role" not in rec and (rec["p"], rec["sid"]) == ("p" * 16, "c")  # still a link


@given(st.text(max_size=200))
def test_keywords_of_keywords_are_the_keywords(text: str) -> None:
    """The trace stage sends keywords, the session reads them as a runtime's content would be
    read: a content made of its own keywords has the same keywords."""
    assert keywords(" ".join(sorted(keywords(text)))) == keywords(text)


# -- the span stage: bad input ----------------------------------------------------------------


def test_bad_records_and_spans_are_dead_lettered_and_the_rest_goes_on() -> None:
    a = Agent()
    root = a.span("invoke_agent", 0, None, **{"gen_ai.operation.name": "invoke_agent",
                                               "gen_ai.conversation.id": "c1"})  # fmt: skip
    a.span("search_memory", 1, 2, root, **{"gen_ai.operation.name": "search_memory",
                                            "gen_ai.memory.records": "[{broken"})  # fmt: skip
    a.span("search_memory", 3, 4, root, **{"gen_ai.operation.name": "search_memory",
                                            "gen_ai.memory.records": '[{"id": "m1"}]'})  # fmt: skip
    a.span("chat", 5, 6, root, **{"gen_ai.operation.name": "chat",
                                  "gen_ai.output.messages": "x" * 2_000_000})  # fmt: skip
    a.span("late clock", 7, 10**7, root)  # ends months after it was published
    root.end(end_time=ns(8))
    p = Pipe().send(b"not otlp at all", encode_spans(a.spans).SerializeToString())
    reasons = sorted(d["reason"] for d in p.deadletters)
    assert reasons == sorted([NOT_OTLP, BAD_VALUE, TOO_LARGE, BAD_TS])
    details = {d["reason"]: d for d in p.deadletters}
    assert "gen_ai.memory.records is not valid JSON" in details[BAD_VALUE]["detail"]
    assert details[BAD_VALUE]["batch_index"] >= 0 and '"traceId"' in details[BAD_VALUE]["payload"]
    assert "MEMDIAG_MAX_CLOCK_SKEW_SECONDS" in details[BAD_TS]["detail"]
    # the readable search went on, to its session
    assert [r["result_ids"] for r in p.span_events if r["kind"] == "search"] == [["m1"]]


# -- the trace stage ------------------------------------------------------------------------------


def test_a_search_takes_its_session_and_agent_from_its_ancestors_in_any_order() -> None:
    a = Agent(**{"memdiag.org_id": "acme"})
    root = a.span("invoke_agent", 0, None, **{"gen_ai.operation.name": "invoke_agent",
                                               "gen_ai.agent.name": "coder",
                                               "gen_ai.conversation.id": "c1"})  # fmt: skip
    step = a.span("step", 1, None, root)
    search = a.span("search_memory", 2, 3, step, **{"gen_ai.operation.name": "search_memory",
                                                     "gen_ai.memory.query.text": "q",
                                                     "gen_ai.memory.records": '[{"id": "m1"}]'})  # fmt: skip
    step.end(end_time=ns(4))
    root.end(end_time=ns(5))
    by_id = {key(s): s for s in a.spans}
    for order in ([search, step, root], [root, step, search], [step, search, root]):
        p = Pipe()
        sent_after = []
        for s in order:
            p.send(encode_spans([by_id[key(s)]]).SerializeToString())
            sent_after.append(len(p.span_events))
        [event] = p.span_events
        assert (event["session_id"], event["agent_id"], event["org_id"]) == ("c1", "coder", "acme")
        assert event["event_id"] == f"{key(search)}:search"
        assert sent_after == [0, 0, 1]  # when the last span between it and its session came


def test_a_span_whose_ancestors_name_no_session_is_dead_lettered() -> None:
    a = Agent()
    root = a.span("handler", 0, None)
    a.span("search_memory", 1, 2, root, **{"gen_ai.operation.name": "search_memory"})
    root.end(end_time=ns(3))
    p = Pipe().send(encode_spans(a.spans).SerializeToString())
    [d] = p.deadletters
    assert d["reason"] == MISSING_FIELD and "gen_ai.conversation.id" in d["detail"]
    assert p.span_events == []


def test_a_span_waits_for_a_missing_parent_until_its_trace_is_forgotten() -> None:
    a = Agent()
    root = a.span("invoke_agent", 0, None, **{"gen_ai.conversation.id": "c1"})
    a.span("search_memory", 1, 2, root, **{"gen_ai.operation.name": "search_memory"})
    root.end(end_time=ns(3))  # never sent: its service does not export to memdiag
    [search] = [s for s in a.spans if s.name == "search_memory"]
    p = Pipe().send(encode_spans([search]).SerializeToString())
    assert p.span_events == [] and p.deadletters == []

    def later(minutes: float) -> None:
        other = Agent()  # the trace stage's clock runs on publish time: another trace, later
        other.span("chat", 10, 11, **{"gen_ai.operation.name": "chat",
                                      "gen_ai.conversation.id": "c2"})  # fmt: skip
        p.send(encode_spans(other.spans).SerializeToString(),
               published_ms=PUBLISHED_MS + SETTINGS.keep_ms + int(minutes * 60_000))  # fmt: skip

    head = "t:" + key(root).split(":")[0]
    assert head in p.store.data
    later(1)
    [d] = p.deadletters
    assert d["reason"] == MISSING_FIELD and "did not come" in d["detail"]
    assert key(root).split(":")[1] in d["detail"]
    assert p.counted("memdiag.dead_letter_total", reason=MISSING_FIELD) == 1
    # forgotten with its dead letters, in one checkpoint: nothing of it is left
    assert head not in p.store.data and not [k for k in p.store.data if k.startswith("tc:")]
    later(3)
    assert [x["dead_letter_id"] for x in p.deadletters] == [d["dead_letter_id"]]


def a_search_waiting_for_its_agent() -> tuple[Pipe, Any, InMessage]:
    """A search sent without its agent span (which names the conversation): the pipe it
    waits in, the agent span, and the trace stage's end-of-input marker."""
    a = Agent()
    root = a.span("invoke_agent", 0, None, **{"gen_ai.conversation.id": "c1"})
    a.span("search_memory", 1, 2, root, **{"gen_ai.operation.name": "search_memory"})
    root.end(end_time=ns(3))
    [search] = [s for s in a.spans if s.name == "search_memory"]
    p = Pipe().send(encode_spans([search]).SerializeToString())
    end = InMessage(SETTINGS.topics.otlp_traces, 0, 99, None, b'[{"end": true}]', PUBLISHED_MS)
    return p, root, end


def test_the_end_of_memdiag_runs_input_dead_letters_what_still_waits() -> None:
    p, root, end = a_search_waiting_for_its_agent()
    out = p.traces.process([end], p.store)
    [(_, d)] = out.deadletters
    assert d["reason"] == MISSING_FIELD and "the input ended" in d["detail"]


def test_an_outcome_takes_its_tools_and_a_late_tool_amends_it() -> None:
    a = Agent()
    root = a.span("invoke_agent", 0, None, **{"gen_ai.operation.name": "invoke_agent",
                                               "gen_ai.conversation.id": "c1",
                                               "memdiag.outcome": "rejected"})  # fmt: skip
    a.span("execute_tool edit", 1, 2, root, **{"gen_ai.operation.name": "execute_tool",
                                                       "gen_ai.tool.name": "edit_file",
                                                       "memdiag.file": "a.py"})  # fmt: skip
    step = a.span("step", 3, None, root)
    test = a.tracer.start_span("execute_tool pytest", context=trace_api.set_span_in_context(step),
                               start_time=ns(3.5), attributes={"gen_ai.operation.name": "execute_tool",
                                                               "gen_ai.tool.name": "pytest"})  # fmt: skip
    test.record_exception(AssertionError("2 tests failed"), timestamp=ns(3.8))
    test.set_status(Status(StatusCode.ERROR))
    test.end(end_time=ns(4))
    step.end(end_time=ns(4.5))
    root.end(end_time=ns(5))
    by = {s.name: s for s in a.spans}
    p = Pipe().send(encode_spans([by["invoke_agent"], by["execute_tool edit"]]).SerializeToString())
    [first] = [r for r in p.span_events if r["kind"] == "session_outcome"]
    assert first["revision"] == 1 and first["files_modified"] == ["a.py"]
    assert first["tool_calls"] == [{"tool": "edit_file", "success": True, "file": "a.py"}]
    p.send(encode_spans([by["execute_tool pytest"]]).SerializeToString())  # under a missing step
    assert len([r for r in p.span_events if r["kind"] == "session_outcome"]) == 1
    p.send(encode_spans([by["step"]]).SerializeToString())  # the link comes: the test joins
    outcomes = [r for r in p.span_events if r["kind"] == "session_outcome"]
    last = outcomes[-1]
    assert last["revision"] == 2 and [t["tool"] for t in last["tool_calls"]] == [
        "edit_file",
        "pytest",
    ]
    assert last["errors"] == [{"message": "2 tests failed", "tool": "pytest", "recoverable": False}]
    # counted once, with the category it had first; the diagnostic is the amended one
    assert p.counted(SESSION_OUTCOMES, outcome="rejected", failure_category="other") == 1
    assert p.counted(SESSION_OUTCOMES, outcome="rejected", failure_category="test_failure") == 0
    diagnostics = p.of("session_diagnostic")
    assert [d["failure_category"] for d in diagnostics] == ["other", "test_failure"]
    assert diagnostics[-1]["files_modified"] == ["a.py"]


def test_memory_writes_go_to_memory_with_their_agent() -> None:
    a = Agent()
    root = a.span("invoke_agent", 0, None, **{"gen_ai.operation.name": "invoke_agent",
                                               "gen_ai.agent.id": "archivist"})  # fmt: skip
    a.span("create_memory", 1, 2, root, **{"gen_ai.operation.name": "create_memory",
                                            "gen_ai.memory.record.id": "ep-1",
                                            "gen_ai.memory.store.id": "episodes"})  # fmt: skip
    a.span("upsert_memory", 3, 4, **{"gen_ai.operation.name": "upsert_memory",
                                     "gen_ai.memory.record.id": "ep-2"})  # fmt: skip
    root.end(end_time=ns(5))
    p = Pipe().send(encode_spans(a.spans).SerializeToString())
    [written] = p.memory
    assert (written["kind"], written["agent_id"], written["memory_id"], written["store"]) == (
        "memory_written", "archivist", "ep-1", "episodes")  # fmt: skip
    assert written["ts"].startswith("2026-11-21T09:00:02")  # its span's end
    [d] = p.deadletters  # the other write names no agent, nor does any ancestor (a root)
    assert d["reason"] == MISSING_FIELD and "agent" in d["detail"]


# -- span turns in the session ----------------------------------------------------------------------


def conversation() -> tuple[Agent, dict[str, Any]]:
    """Two turns: a search before each; the second chat's output uses the second search."""
    a = Agent()
    c = {"gen_ai.conversation.id": "c1"}
    root = a.span("invoke_agent", 0, None, **{"gen_ai.operation.name": "invoke_agent", **c,
                                               "memdiag.outcome": "accepted"})  # fmt: skip

    def search(t: float, mems: list[tuple[str, str]]) -> Any:
        return a.span("search_memory", t, t + 0.5, root, **{
            "gen_ai.operation.name": "search_memory", "gen_ai.memory.query.text": f"q{t}",
            "gen_ai.memory.records": json.dumps([{"id": i, "content": t_} for i, t_ in mems])})  # fmt: skip

    def chat(t: float, text: str | None) -> Any:
        attrs: dict[str, Any] = {"gen_ai.operation.name": "chat", **c}
        if text is not None:
            attrs["gen_ai.output.messages"] = json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": text}]}]
            )
        return a.span("chat", t, t + 1, root, **attrs)

    spans = {
        "s1": search(1, [("m1", "postgres vacuum replica failover")]),
        "c1": chat(2, "we vacuum postgres nightly"),
        "s2": search(4, [("m2", "stripe refund webhook"), ("m1", "postgres vacuum replica")]),
        "c2": chat(5, "refund through the stripe webhook"),
        "c3": chat(7, None),  # no retrieval since c2: injects nothing, not judged
    }
    root.end(end_time=ns(9))
    spans["root"] = root
    return a, spans


def feedback(p: Pipe) -> dict[tuple[str, str], str]:
    rows: dict[tuple[str, str], str] = {}
    for r in p.of("retrieval_feedback"):
        k = (r["turn_id"], r["observation_id"])
        if r.get("retracted"):
            rows.pop(k, None)
        else:
            rows[k] = r["signal"]
    return rows


def test_a_viewer_search_from_spans_is_counted_never_judged_and_injects_nothing() -> None:
    a, s = conversation()
    root = s["root"]
    # a human's search just before c2, in the same conversation, returning m3 with content
    a.span("search_memory", 4.5, 4.6, root, **{
        "gen_ai.operation.name": "search_memory", "gen_ai.memory.query.text": "who did this",
        "memdiag.source": "viewer",
        "gen_ai.memory.records": json.dumps([{"id": "m3", "content": "refund stripe webhook"}])})  # fmt: skip
    p = Pipe().send(encode_spans(a.spans).SerializeToString())
    searches = [r for r in p.span_events if r.get("kind") == "search"]
    assert sorted(r["source"] for r in searches) == ["agent", "agent", "viewer"]
    assert p.counted(SEARCH_CALLS, source="viewer") == 1
    assert (key(s["c2"]), "m3") not in feedback(p)  # not in the agent's context
    d = p.of("session_diagnostic")[-1]
    assert "m3" not in d["injected_observation_ids"] and d["search_count"] == 2


def test_a_turn_injects_the_retrievals_since_the_turn_before() -> None:
    a, s = conversation()
    p = Pipe().send(encode_spans(a.spans).SerializeToString())
    assert feedback(p) == {
        (key(s["c1"]), "m1"): "used",
        (key(s["c2"]), "m2"): "used",
        (key(s["c2"]), "m1"): "ignored",
    }
    assert p.counted(UNJUDGED_TURNS, reason="no_output_messages") == 0  # c3 injected nothing


def test_a_late_chat_takes_its_retrievals_from_the_turn_after_it() -> None:
    """c1 comes last: s1 was part of c2's injection meanwhile; it moves to c1, and c2's
    verdict on m1 is corrected (it is c2's own s2 result), the rows the in-order ones."""
    a, s = conversation()
    by = {k: v for k, v in s.items()}
    order = ["root", "s1", "s2", "c2", "c3", "c1"]
    p = Pipe()
    for name in order:
        p.send(encode_spans([by[name]]).SerializeToString())
    in_order = Pipe().send(encode_spans(a.spans).SerializeToString())
    assert feedback(p) == feedback(in_order)
    retracted = [r for r in p.of("retrieval_feedback") if r.get("retracted")]
    assert retracted == []  # m1 stayed in c2 (s2 has it too): corrected, never retracted
    # and a retrieval that moves away entirely is retracted
    order = ["root", "s1", "c2", "c1"]
    p = Pipe()
    for name in order:
        p.send(encode_spans([by[name]]).SerializeToString())
    assert any(r.get("retracted") and r["turn_id"] == key(s["c2"]) and r["observation_id"] == "m1"
               for r in p.of("retrieval_feedback"))  # fmt: skip
    assert feedback(p) == {(key(s["c1"]), "m1"): "used"}


def test_a_late_retrieval_joins_its_turn_and_unjudged_turns_are_counted() -> None:
    a = Agent()
    c = {"gen_ai.conversation.id": "c1"}
    root = a.span("invoke_agent", 0, None, **{"gen_ai.operation.name": "invoke_agent", **c})
    s1 = a.span("search_memory", 1, 2, root, **{
        "gen_ai.operation.name": "search_memory",
        "gen_ai.memory.records": json.dumps([{"id": "m1", "content": "vacuum postgres"}])})  # fmt: skip
    chat = a.span("chat", 3, 4, root, **{"gen_ai.operation.name": "chat", **c})  # uncaptured
    root.end(end_time=ns(5))
    p = Pipe().send(encode_spans([chat, root]).SerializeToString())
    assert p.counted(UNJUDGED_TURNS, reason="no_output_messages") == 0  # nothing injected yet
    p.send(encode_spans([s1]).SerializeToString())
    assert p.counted(UNJUDGED_TURNS, reason="no_output_messages") == 1
    assert feedback(p) == {} and p.counted(FEEDBACK, signal="used") == 0
    session = p.sessions.states.load("c1", 0, p.store)
    assert session is not None and session.injected_observation_ids() == ["m1"]
    assert session.turns[key(chat)].pending_half() is None  # never counted unmatched


# -- same spans, same tables: the equivalence -------------------------------------------


def tables_of_spans(spans: list[Any], seed: int, encoding: str, by_trace: bool,
                    crash_rate: float, max_spans: int, settings: Settings = SETTINGS) -> Any:  # fmt: skip
    rng = random.Random(seed)
    world = World(settings, seed=seed, crash_rate=crash_rate)
    world.publish_spans(records(spans, rng, encoding, by_trace=by_trace, max_spans=max_spans))
    world.run()
    return world


@settings(max_examples=25, deadline=None)
@given(
    scenario=st.integers(0, 10_000),
    seed=st.integers(0, 10_000),
    encoding=st.sampled_from(["otlp_proto", "otlp_json"]),
    by_trace=st.booleans(),
    crash_rate=st.sampled_from([0.0, 0.0, 0.15]),
    max_spans=st.sampled_from([1, 3, 20]),
    semantic=st.booleans(),
)
def test_spans_give_the_tables_of_the_equivalent_events(
    scenario: int,
    seed: int,
    encoding: str,
    by_trace: bool,
    crash_rate: float,
    max_spans: int,
    semantic: bool,
) -> None:
    """Under either used/ignored rule: under the semantic one, the span stage embeds the
    search results and the chat output, and the similarity is the one the events get."""
    spans, events = conversations(8, seed=scenario)
    if semantic:
        from memdiag import semantic as sm

        embed = sm.embedder()
        similar = lambda m, r: sm.similarity(embed(m, True), embed(r, False))  # noqa: E731
        expected = from_reference(reference(events, similar=similar, threshold=0.19))
        settings_ = dataclasses.replace(SETTINGS, detector="semantic", similarity_threshold=0.19)
    else:
        expected, settings_ = from_reference(reference(events)), SETTINGS
    world = tables_of_spans(spans, seed, encoding, by_trace, crash_rate, max_spans, settings_)
    got = from_records(world.tables)
    assert differences(expected, got) == []
    assert world.tables.dead_letters == []
    if semantic:  # the turns were judged by the similarity, not only the words
        assert {r["detector"] for r in world.tables.feedback.values()} <= {"semantic"}


# -- hostile input ---------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),  # fmt: skip
    max_leaves=12,
)
attribute_names = st.sampled_from([
    sp.OPERATION, sp.CONVERSATION, sp.SESSION, sp.AGENT_ID, sp.AGENT_NAME, sp.OUTCOME, sp.FILE,
    sp.TOOL_NAME, sp.MEMORY_QUERY, sp.MEMORY_RECORDS, sp.MEMORY_RECORD_ID, sp.RETRIEVAL_QUERY,
    sp.RETRIEVAL_DOCUMENTS, sp.OUTPUT_MESSAGES, sp.OI_KIND, sp.OI_INPUT, sp.OI_TOOL_NAME,
    "retrieval.documents.0.document.id", "retrieval.documents.0.document.content",
    "llm.output_messages.0.message.content", sp.RECOVERABLE,
])  # fmt: skip
operations = st.sampled_from(["search_memory", "retrieval", "chat", "invoke_agent",
                              "execute_tool", "create_memory", "upsert_memory", "x"])  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(attribute_names, json_values | st.text(max_size=60), max_size=8),
       operations, st.booleans())  # fmt: skip
def test_any_attributes_give_a_record_or_a_reason(
    attrs: dict[str, Any], operation: str, error: bool
) -> None:
    attrs = {sp.OPERATION: operation, **attrs}
    rec, problem = read(attrs, error=error, exceptions=[{"exception.message": attrs.get("x")}])
    assert rec["t"] == "t" * 32 and rec["s"] == "s" * 16
    assert problem is None or (problem.reason in (BAD_VALUE, MISSING_FIELD) and problem.detail)
    orjson.dumps(rec)  # it travels as JSON


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300) | st.builds(
    lambda raw, at, byte: raw[:at] + bytes([byte]) + raw[at + 1 :],
    st.just(encode_spans(conversations(1, seed=3)[0]).SerializeToString()),
    st.integers(0, 400), st.integers(0, 255)))  # fmt: skip
def test_any_bytes_never_stop_the_span_stage(raw: bytes) -> None:
    out = SpanStage(SETTINGS, lambda k: 0).process(
        [InMessage(SETTINGS.topics.otlp_spans, 0, 0, None, raw, PUBLISHED_MS)]
    )
    for _, d in out.deadletters:
        assert d["reason"] in (NOT_OTLP, BAD_VALUE, MISSING_FIELD, BAD_TS, TOO_LARGE)
        assert d["detail"]
    for _, sent in out.traces:
        orjson.dumps(sent)


def test_an_id_over_its_limit_is_refused_where_the_span_was() -> None:
    a = Agent()
    root = a.span("invoke_agent", 0, None, **{"gen_ai.operation.name": "invoke_agent",
                                               "gen_ai.conversation.id": "c" * 300})  # fmt: skip
    a.span("search_memory", 1, 2, root, **{"gen_ai.operation.name": "search_memory",
                                            "gen_ai.memory.records": '[{"id": "m1"}]'})  # fmt: skip
    root.end(end_time=ns(3))
    p = Pipe().send(encode_spans(a.spans).SerializeToString())
    [d] = p.deadletters
    assert d["reason"] == "id_too_long"
    assert "session_id" in d["detail"] and d["topic"] == SETTINGS.topics.otlp_spans
    assert p.span_events == []


def test_searches_that_come_after_their_chat_extend_its_turn_without_a_rebuild(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spans as a BatchSpanProcessor exports them (as they end): a chat names its
    conversation and goes to its session at once, its searches wait for their agent span,
    which ends last. Each search only adds to a judged turn: the session never rebuilds,
    and the rows are those of the in-order events."""
    from memdiag.streams.session import session as session_module

    rebuilds = []
    real = session_module.Session._rebuild

    def counting(self: Any, out: Any) -> None:
        rebuilds.append(len(self.records))
        real(self, out)

    monkeypatch.setattr(session_module.Session, "_rebuild", counting)
    p = Pipe()
    expected: dict[tuple[str, str], str] = {}
    for run in range(30):
        a = Agent()
        base = run * 100
        root = a.span("invoke_agent", base, None, **{"gen_ai.operation.name": "invoke_agent",
                                                      "gen_ai.conversation.id": "c1"})  # fmt: skip
        searches = [a.span("search_memory", base + 1 + k, base + 1.5 + k, root, **{
            "gen_ai.operation.name": "search_memory",
            "gen_ai.memory.records": json.dumps([{"id": f"m{run}-{k}",
                                                  "content": "vacuum postgres replica"}])})
            for k in range(2)]  # fmt: skip
        chat = a.span("chat", base + 5, base + 6, root, **{
            "gen_ai.operation.name": "chat", "gen_ai.conversation.id": "c1",
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                {"type": "text", "content": "vacuum the replica"}]}])})  # fmt: skip
        root.end(end_time=ns(base + 7))
        for spans in (searches, [chat], [root]):  # as they end
            p.send(encode_spans(spans).SerializeToString())
        expected.update({(key(chat), f"m{run}-{k}"): "used" for k in range(2)})
    assert rebuilds == [] and feedback(p) == expected
    session = p.sessions.states.load("c1", 0, p.store)
    assert session is not None
    assert session.injected_observation_ids() == [f"m{r}-{k}" for r in range(30) for k in range(2)]


def test_a_search_in_another_service_finds_the_conversation_through_its_remote_parent() -> None:
    """The agent's service calls a memory service over HTTP: the search's parent is a server
    span whose parent is remote (the agent's client span). Both services export to memdiag:
    the search takes the agent's conversation, whatever order the spans come in."""
    agent = Agent(**{"service.name": "agent"})
    memory = Agent(**{"service.name": "memory-service"})
    root = agent.span("invoke_agent", 0, None, **{"gen_ai.operation.name": "invoke_agent",
                                                   "gen_ai.agent.name": "coder",
                                                   "gen_ai.conversation.id": "c1"})  # fmt: skip
    client = agent.span("POST /search", 1, None, root)
    remote = trace_api.NonRecordingSpan(trace_api.SpanContext(
        client.get_span_context().trace_id, client.get_span_context().span_id, is_remote=True,
        trace_flags=trace_api.TraceFlags(1)))  # fmt: skip
    server = memory.span("POST /search", 1.1, None, remote)
    search = memory.span("search_memory", 1.2, 1.3, server, **{
        "gen_ai.operation.name": "search_memory",
        "gen_ai.memory.records": '[{"id": "m1", "content": "vacuum postgres"}]'})  # fmt: skip
    server.end(end_time=ns(1.4))
    client.end(end_time=ns(1.5))
    root.end(end_time=ns(2))
    for order in (memory.spans + agent.spans, agent.spans + memory.spans):
        p = Pipe()
        for s in order:
            p.send(encode_spans([s]).SerializeToString())
        [event] = [e for e in p.span_events if e["kind"] == "search"]
        assert (event["session_id"], event["agent_id"]) == ("c1", "coder")
        assert event["event_id"] == f"{key(search)}:search" and p.deadletters == []


def test_a_given_up_span_is_never_sent_and_counted_once() -> None:
    p, root, end = a_search_waiting_for_its_agent()
    for _ in range(2):  # the end marker, and its redelivery
        p._take(p.traces.process([end], p.store))
    p.send(encode_spans([root]).SerializeToString())  # its ancestor comes after all
    assert p.counted("memdiag.dead_letter_total", reason=MISSING_FIELD) == 1
    assert [e for e in p.span_events if e["kind"] == "search"] == []  # given up: never sent


def test_spans_released_together_go_to_their_session_in_the_order_they_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only the agent span names the conversation (its chats do not): every span of a run
    waits for it and is released at once, in the order they started, so the session gets
    its turns in order and never rebuilds."""
    from memdiag.streams.session import session as session_module

    rebuilds = []
    real = session_module.Session._rebuild
    monkeypatch.setattr(session_module.Session, "_rebuild",
                        lambda self, out: (rebuilds.append(1), real(self, out))[1])  # fmt: skip
    p = Pipe()
    for run in range(10):
        a = Agent()
        base = run * 100
        root = a.span("invoke_agent", base, None, **{"gen_ai.operation.name": "invoke_agent",
                                                      "gen_ai.conversation.id": "c1"})  # fmt: skip
        for k in range(3):
            a.span(
                "search_memory",
                base + 10 * k + 1,
                base + 10 * k + 2,
                root,
                **{
                    "gen_ai.operation.name": "search_memory",
                    "gen_ai.memory.records": json.dumps(
                        [{"id": f"m{run}{k}", "content": "vacuum x"}]
                    ),
                },
            )
            a.span("chat", base + 10 * k + 3, base + 10 * k + 4, root, **{
                "gen_ai.operation.name": "chat",
                "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                    {"type": "text", "content": "vacuum"}]}])})  # fmt: skip
        root.end(end_time=ns(base + 50))
        p.send(encode_spans(a.spans).SerializeToString())
    assert rebuilds == [] and len(feedback(p)) == 30


def test_a_trace_log_chunk_stays_under_its_bytes() -> None:
    """Chunks close before a record that would take them over CHUNK_BYTES (a record alone
    may be larger: it is one span, at most MEMDIAG_MAX_EVENT_BYTES)."""
    from memdiag.streams import trace as traces

    a = Agent()
    root = a.span("invoke_agent", 0, None, **{"gen_ai.conversation.id": "c1"})
    words = " ".join(f"word{i:06d}" for i in range(9000))  # ~100 KB of keywords a span
    for k in range(12):
        a.span("search_memory", 1 + k, 1.5 + k, root, **{
            "gen_ai.operation.name": "search_memory",
            "gen_ai.memory.records": json.dumps([{"id": f"m{k}", "content": words}])})  # fmt: skip
    root.end(end_time=ns(20))
    p = Pipe()
    for s in a.spans:
        p.send(encode_spans([s]).SerializeToString())
    chunks = [v for k, v in p.store.data.items() if k.startswith(traces.CHUNK_PREFIX)]
    assert chunks and all(len(v) <= traces.CHUNK_BYTES for v in chunks)


# -- forgetting traces: in processing time, right after the record that makes it due --------

HOUR_MS = 3_600_000
_KEEP_1H = dataclasses.replace(SETTINGS, session_keep_hours=1.0)


def _waiting_traces(n: int) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    """``n`` traces, each as the trace stage takes it: a search that waits for its agent span
    (which names the conversation), and that agent span."""
    spans = SpanStage(_KEEP_1H, lambda _: 0)
    traces = []
    for i in range(n):
        a = Agent()
        root = a.span("invoke_agent", 0, None, **{"gen_ai.conversation.id": f"c{i}"})
        a.span("search_memory", 1, 2, root, **{"gen_ai.operation.name": "search_memory"})
        root.end(end_time=ns(3))
        search, agent = sorted(a.spans, key=lambda s: s.name != "search_memory")
        msg = [InMessage(SETTINGS.topics.otlp_spans, 0, 0, None,
                         encode_spans([s]).SerializeToString(), PUBLISHED_MS)
               for s in (search, agent)]  # fmt: skip
        [(_, first)], [(_, second)] = (spans.process([m]).traces for m in msg)
        traces.append((first, second))
    return traces


def _trace_run(
    msgs: list[InMessage], sizes: random.Random | None
) -> tuple[list[Any], list[Any], dict[str, bytes]]:
    """The trace stage over ``msgs`` in batches of 1 (``sizes`` None) or of 1 to 6: what it
    dead-letters, what it sends the sessions, and its store."""
    stage = TraceStage(_KEEP_1H, lambda _: 0, wall_ms=lambda: PUBLISHED_MS + 100 * HOUR_MS)
    store = DictStore()
    dead: list[Any] = []
    sent: list[Any] = []
    i = 0
    while i < len(msgs):
        n = 1 if sizes is None else sizes.randint(1, 6)
        out = stage.process(msgs[i : i + n], store)
        i += n
        dead += sorted((d["reason"], d["dead_letter_id"]) for _, d in out.deadletters)
        sent += [r["event_id"] for _, records in out.span_events for r in records]
    return sorted(dead), sorted(sent), store.data


def test_a_trace_idle_for_the_keep_time_gives_up_what_waits_and_a_late_span_starts_anew() -> None:
    """A search waits for its agent span; other traffic moves the partition's clock past
    the keep time: the trace is forgotten and its search dead-lettered. The agent span that
    comes after finds nothing to release."""
    [(search, agent), (other, _)] = _waiting_traces(2)
    t = PUBLISHED_MS
    msgs = [InMessage(SETTINGS.topics.otlp_traces, 0, i, None, orjson.dumps(r), ms)
            for i, (r, ms) in enumerate([(search, t), (other, t + 2 * HOUR_MS),
                                         (agent, t + 2 * HOUR_MS + 1)])]  # fmt: skip
    dead, sent, store = _trace_run(msgs, None)
    assert [reason for reason, _ in dead] == [MISSING_FIELD]
    assert sent == []  # the search was given up: never sent, even with its agent come
    # the agent span started the trace anew: its log holds that span alone
    trace_id = agent[0]["t"]
    trace = Trace.restore(trace_id, orjson.loads(store[TRACE_HEAD + trace_id]), DictStore(store))
    assert [rec["s"] for rec in trace.log] == [agent[0]["s"]]


@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.booleans(), st.integers(0, 150)),
             min_size=2, max_size=16),
    st.randoms(use_true_random=False),
)  # fmt: skip
def test_where_a_batch_ends_decides_no_traces_fate(
    plan: list[tuple[int, bool, int]], rnd: random.Random
) -> None:
    """Three traces' searches and agent spans, minutes apart around the keep time (1 h):
    whether an agent span comes before its trace is forgotten is decided by the records
    alone, as if each were a batch of its own, never by where a batch ends."""
    traces = _waiting_traces(3)
    msgs = [
        InMessage(SETTINGS.topics.otlp_traces, 0, i, None,
                  orjson.dumps(traces[who][1 if is_agent else 0]), PUBLISHED_MS + minute * 60_000 + i)
        for i, (who, is_agent, minute) in enumerate(sorted(plan, key=lambda p: p[2]))
    ]  # fmt: skip
    assert _trace_run(msgs, rnd) == _trace_run(msgs, None)
