"""Agents instrumented with the OpenTelemetry SDK, their real spans, and the section-2 events
a runtime would have published for the same sessions (the equivalence the OTLP issue asks
for), built apart from memdiag's mapping: from what each toy agent did, not from its spans.

:func:`conversations` runs toy agents under a real ``TracerProvider`` with an
``InMemorySpanExporter``: each conversation is one to three agent invocations (a trace
each, sharing ``gen_ai.conversation.id``), with memory searches (``search_memory``,
``retrieval`` with content, OpenInference ``RETRIEVER``), chat turns (with text, with tool
calls only, without captured output), tool calls (some failing, some with ``memdiag.file``,
some under an intermediate span) and an outcome on the last invocation. :func:`records`
encodes the spans with the OTLP exporter's own encoder into the bytes the Collector's Kafka
exporter writes, split and ordered as asked, as ``otlp_proto`` or ``otlp_json``.
"""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from memdiag.schemas.models import format_ts

T0_US = 1_795_251_600_000_000  # 2026-11-21T09:00:00Z

WORDS = (
    "billing retries exponential backoff jitter invoice ledger refund webhook stripe "
    "frontend deploy bundle webpack router cache session cookie token rotation secret "
    "database migration index vacuum replica failover postgres schema column constraint "
    "search ranking embedding vector cosine recall precision reranker chunking overlap"
).split()


@dataclass
class Memory:
    id: str
    content: str


@dataclass
class Episode:
    """What one toy agent did, in the order it did it (the truth the events come from)."""

    spans: list[ReadableSpan] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)


def _hex(n: int, width: int) -> str:
    return f"{n:0{width}x}"


def _ns(us: int) -> int:
    return us * 1000


class _Toy:
    """One provider for all the toy agents, so resources and ids are real."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.exporter = InMemorySpanExporter()
        self.providers: dict[tuple[str, str], TracerProvider] = {}
        self.memories = [
            Memory(f"mem-{i:03d}", " ".join(self.rng.sample(WORDS, 6))) for i in range(40)
        ]

    def tracer(self, org: str, agent_in_resource: str | None) -> trace_api.Tracer:
        key = (org, agent_in_resource or "")
        provider = self.providers.get(key)
        if provider is None:
            attrs: dict[str, Any] = {"service.name": "toy-agent", "memdiag.org_id": org}
            if agent_in_resource:
                attrs["gen_ai.agent.name"] = agent_in_resource
            provider = TracerProvider(resource=Resource.create(attrs))
            provider.add_span_processor(SimpleSpanProcessor(self.exporter))
            self.providers[key] = provider
        return provider.get_tracer("toy-agent")


def _ids(span: Any) -> tuple[str, str]:
    ctx = span.get_span_context()
    return _hex(ctx.trace_id, 32), _hex(ctx.span_id, 16)


def conversations(
    n: int, seed: int = 0, prefix: str = "conv", files_known: bool = False
) -> tuple[list[ReadableSpan], list[dict[str, Any]]]:
    """``n`` conversations of toy agents (sessions ``<prefix>-000``...): their finished spans,
    and the equivalent events. ``files_known``: every outcome's tools name a file (an
    ``edit_file`` is added where none does), so every equivalent outcome has the
    ``files_modified`` a published one must have; otherwise some outcomes cannot know their
    files, which only spans can say."""
    toy = _Toy(seed)
    events: list[dict[str, Any]] = []
    for c in range(n):
        events += _conversation(toy, c, prefix, files_known)
    spans = list(toy.exporter.get_finished_spans())
    toy.rng.shuffle(spans)  # the exporter's order means nothing: records() decides
    return spans, events


def _conversation(toy: _Toy, c: int, prefix: str, files_known: bool) -> list[dict[str, Any]]:
    rng = toy.rng
    session = f"{prefix}-{c:03d}"
    agent = f"agent-{c % 3}"
    org = "acme" if c % 2 else "globex"
    tracer = toy.tracer(org, agent if c % 4 == 3 else None)
    scope = {"session_id": session, "org_id": org}
    clock = T0_US + c * 3_600_000_000
    events: list[dict[str, Any]] = []
    retrieved: list[list[Any]] = []  # [[ts, trace:span, [Memory]]] since the last turn
    invocations = rng.randint(1, 3)
    for inv in range(invocations):
        last = inv == invocations - 1
        outcome = rng.choice(["accepted", "rejected", "rework"]) if last else None
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent,
            "gen_ai.conversation.id": session,
        }
        if outcome:
            attrs["memdiag.outcome"] = outcome
        root = tracer.start_span(f"invoke_agent {agent}", start_time=_ns(clock), attributes=attrs)
        root_ctx = trace_api.set_span_in_context(root)
        clock += 1_000_000
        tools: list[dict[str, Any]] = []
        for _step in range(rng.randint(1, 4)):
            what = rng.choice(["search", "search", "turn", "turn", "tool"])
            if what == "search":
                # the first results may not satisfy: another search soon after (a followup)
                for _ in range(1 if rng.random() < 0.5 else 2):
                    clock = _search(toy, tracer, root_ctx, clock, scope, agent, events,
                                    retrieved, tools)  # fmt: skip
            elif what == "turn":
                # a chat span names its conversation but not its agent: only its resource may
                turn_scope = {**scope, "agent_id": agent} if c % 4 == 3 else scope
                clock = _turn(toy, tracer, root_ctx, clock, turn_scope, events, retrieved)
            else:
                clock = _tool(toy, tracer, root_ctx, clock, tools)
        if outcome:
            clock = _tool(toy, tracer, root_ctx, clock, tools, force_test=rng.random() < 0.4)
            if files_known and not any(t["file"] for t in tools):
                clock = _tool(toy, tracer, root_ctx, clock, tools, name="edit_file")
        root.end(end_time=_ns(clock))
        trace_id, span_id = _ids(root)
        if outcome:
            tools.sort(key=lambda t: (t["start"], t["span"]))
            e: dict[str, Any] = {
                "kind": "session_outcome",
                "event_id": f"{trace_id}:{span_id}:session_outcome",
                "ts": format_ts(clock),
                **scope,
                "agent_id": agent,
                "outcome": outcome,
                "tool_calls": [
                    {
                        "tool": t["tool"],
                        "success": t["ok"],
                        **({"file": t["file"]} if t["file"] else {}),
                    }
                    for t in tools
                ],  # fmt: skip
                "errors": [
                    {"message": m, "tool": t["tool"], "recoverable": False}
                    for t in tools
                    for m in t["errors"]
                ],  # fmt: skip
            }
            if any(t["file"] for t in tools):
                e["files_modified"] = list(dict.fromkeys(
                    t["file"] for t in tools if t["ok"] and t["file"]))  # fmt: skip
            events.append(e)
        clock += 5_000_000
    return events


def _search(toy: _Toy, tracer: Any, ctx: Any, clock: int, scope: dict[str, Any], agent: str,
            events: list[dict[str, Any]], retrieved: list[list[Any]],
            tools: list[dict[str, Any]]) -> int:  # fmt: skip
    rng = toy.rng
    hits = rng.sample(toy.memories, 0 if rng.random() < 0.15 else rng.randint(1, 4))
    style = rng.choice(["search_memory", "search_memory", "retrieval", "openinference"])
    query = " ".join(rng.sample(WORDS, 3))
    if style == "search_memory":
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "search_memory",
            "gen_ai.memory.query.text": query,
            "gen_ai.memory.records": json.dumps(
                [{"id": m.id, "content": m.content, "score": 0.9} for m in hits]
            ),
        }
    elif style == "retrieval":  # documents carry content only as an extra property
        attrs = {
            "gen_ai.operation.name": "retrieval",
            "gen_ai.retrieval.query.text": query,
            "gen_ai.retrieval.documents": json.dumps([{"id": m.id, "score": 0.5} for m in hits]),
        }
    else:
        attrs = {"openinference.span.kind": "RETRIEVER", "input.value": query}
        for i, m in enumerate(hits):
            attrs[f"retrieval.documents.{i}.document.id"] = m.id
            attrs[f"retrieval.documents.{i}.document.content"] = m.content
            attrs[f"retrieval.documents.{i}.document.score"] = 0.7
    parent = ctx
    middle = None
    if rng.random() < 0.3:  # under a tool call of the framework's: a link in between
        middle = tracer.start_span(
            "execute_tool search_memory",
            context=ctx,
            start_time=_ns(clock),
            attributes={  # fmt: skip
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "memory_search",
            },
        )
        parent = trace_api.set_span_in_context(middle)
    span = tracer.start_span(style, context=parent, start_time=_ns(clock), attributes=attrs)
    span.end(end_time=_ns(clock + 200_000))
    if middle is not None:
        middle.end(end_time=_ns(clock + 300_000))
        tools.append({"tool": "memory_search", "ok": True, "file": None, "errors": [],
                      "start": clock, "span": _ids(middle)[1]})  # fmt: skip
    trace_id, span_id = _ids(span)
    events.append({"kind": "search", "event_id": f"{trace_id}:{span_id}:search",
                   "ts": format_ts(clock), **scope, "agent_id": agent, "query": query,
                   "result_ids": [m.id for m in hits], "source": "agent"})  # fmt: skip
    if style != "retrieval" and hits:
        retrieved.append([clock, f"{trace_id}:{span_id}", hits])
    return clock + rng.randint(500_000, 4_000_000)


def _turn(toy: _Toy, tracer: Any, ctx: Any, clock: int, scope: dict[str, Any],
          events: list[dict[str, Any]], retrieved: list[list[Any]]) -> int:  # fmt: skip
    rng = toy.rng
    injected: list[Memory] = []
    seen: set[str] = set()
    for _, _, hits in sorted(retrieved, key=lambda r: (r[0], r[1])):
        for m in hits:
            if m.id not in seen:
                seen.add(m.id)
                injected.append(m)
    retrieved.clear()
    # the answer reuses some injected memories' words: used or ignored, both happen
    words = [w for m in injected if rng.random() < 0.5 for w in m.content.split()[:4]]
    words += rng.sample(WORDS, 5)
    text = " ".join(words)
    form = rng.choice(["text", "text", "text", "tool_calls", "uncaptured", "openinference"])
    if form == "openinference":
        attrs: dict[str, Any] = {"openinference.span.kind": "LLM",
                                 "llm.output_messages.0.message.role": "assistant",
                                 "llm.output_messages.0.message.content": text,
                                 "session.id": scope["session_id"]}  # fmt: skip
    else:
        attrs = {"gen_ai.operation.name": "chat", "gen_ai.conversation.id": scope["session_id"]}
        if form == "text":
            attrs["gen_ai.output.messages"] = json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": text}],
                  "finish_reason": "stop"}])  # fmt: skip
        elif form == "tool_calls":
            attrs["gen_ai.output.messages"] = json.dumps(
                [{"role": "assistant", "parts": [{"type": "tool_call", "id": "c1",
                                                  "name": "read_file", "arguments": {}}]}])  # fmt: skip
    end = clock + rng.randint(1_000_000, 3_000_000)
    span = tracer.start_span("chat", context=ctx, start_time=_ns(clock), attributes=attrs)
    span.end(end_time=_ns(end))
    trace_id, span_id = _ids(span)
    key = f"{trace_id}:{span_id}"
    if injected:
        events.append({"kind": "injection", "event_id": f"{key}:injection",
                       "ts": format_ts(clock), **scope, "turn_id": key,
                       "observations": [{"id": m.id, "content": m.content} for m in injected]})  # fmt: skip
        if form in ("text", "openinference"):
            events.append({"kind": "response", "event_id": f"{key}:response",
                           "ts": format_ts(end), **scope, "turn_id": key, "text": text})  # fmt: skip
    return end + rng.randint(200_000, 2_000_000)


def _tool(toy: _Toy, tracer: Any, ctx: Any, clock: int, tools: list[dict[str, Any]],
          force_test: bool = False, name: str | None = None) -> int:  # fmt: skip
    rng = toy.rng
    if name is None:
        name = "pytest" if force_test else rng.choice(["edit_file", "read_file", "pytest",
                                                       "eslint"])  # fmt: skip
    ok = not force_test and rng.random() < 0.7
    file = f"src/{rng.choice(WORDS)}.py" if name == "edit_file" else None
    parent = ctx
    step = None
    if rng.random() < 0.3:  # a framework's step span between the agent and the tool
        step = tracer.start_span("step", context=ctx, start_time=_ns(clock))
        parent = trace_api.set_span_in_context(step)
    attrs: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
    if file:
        attrs["memdiag.file"] = file
    span = tracer.start_span(f"execute_tool {name}", context=parent, start_time=_ns(clock),
                             attributes=attrs)  # fmt: skip
    errors = []
    if not ok:
        message = {"pytest": "3 tests failed", "eslint": "eslint: 2 problems"}.get(
            name, f"{name} broke the build"
        )
        span.record_exception(RuntimeError(message), timestamp=_ns(clock + 100_000))
        span.set_status(Status(StatusCode.ERROR, message))
        errors.append(message)
    end = clock + rng.randint(100_000, 900_000)
    span.end(end_time=_ns(end))
    if step is not None:
        step.end(end_time=_ns(end + 10_000))
    trace_id, span_id = _ids(span)
    tools.append({"tool": name, "ok": ok, "file": file, "errors": errors, "start": clock,
                  "span": span_id})  # fmt: skip
    return end + 100_000


# -- the bytes the Collector's Kafka exporter writes ---------------------------------------


def otlp_json(spans: list[ReadableSpan]) -> bytes:
    """OTLP/JSON as the Collector writes it: hex ids, enums as integers."""
    doc = json_format.MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for rs in doc.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for span in ss.get("spans", ()):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(doc).encode()


def records(
    spans: list[ReadableSpan],
    rng: random.Random,
    encoding: str = "otlp_proto",
    by_trace: bool = False,
    max_spans: int = 8,
) -> list[tuple[str | None, bytes]]:
    """The spans as Collector records: split in records of 1 to ``max_spans`` spans (by
    trace when ``by_trace``, keyed by its hex id, as ``partition_traces_by_id`` does), in a
    random order; each (key, bytes)."""
    groups: list[list[ReadableSpan]] = []
    if by_trace:
        traces: dict[int, list[ReadableSpan]] = {}
        for s in spans:
            traces.setdefault(s.context.trace_id, []).append(s)
        for members in traces.values():
            groups += _cut(members, rng, max_spans)
    else:
        groups = _cut(spans, rng, max_spans)
    rng.shuffle(groups)
    out = []
    for group in groups:
        raw = (encode_spans(group).SerializeToString() if encoding == "otlp_proto"
               else otlp_json(group))  # fmt: skip
        key = _hex(group[0].context.trace_id, 32) if by_trace else None
        out.append((key, raw))
    return out


def _cut(spans: list[ReadableSpan], rng: random.Random, most: int) -> list[list[ReadableSpan]]:
    spans = spans[:]
    rng.shuffle(spans)
    out, i = [], 0
    while i < len(spans):
        n = rng.randint(1, most)
        out.append(spans[i : i + n])
        i += n
    return out
