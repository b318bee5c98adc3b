"""Capture the spans of REAL instrumentation libraries, over fake models, as test data.

Run with the capture venv's python (``make capture-spans``: its own venv, the pins of
``requirements.txt``); never imported by the suite. Two toy agents, no network:

* ``langchain_openinference``: LangChain (``langchain-core``) instrumented by OpenInference's
  ``openinference-instrumentation-langchain``: a ``RunnableLambda`` named ``support_agent``
  (OpenInference makes any run whose name holds "agent" an ``AGENT`` span), a retriever
  returning ``Document``s whose memory id is only in their metadata, ``FakeListChatModel``
  and ``@tool`` tools, one failing. The app adds what the library has no notion of: the
  session (``using_session``) and ``memdiag.outcome`` on the agent's span (through
  OpenInference's ``get_current_span()``, while it runs).
* ``openai_v2_util_genai``: the ``openai`` client instrumented by
  ``opentelemetry-instrumentation-openai-v2`` against a local ``http.server`` stand-in of the
  chat-completions API; the agent run (``invoke_agent``), its tool calls (``execute_tool``,
  one failing) and one ``retrieval`` are recorded through ``opentelemetry-util-genai``'s own
  API (``handler.invoke_local_agent``, ``handler.tool``, ``handler.retrieval``); the memory
  client's ``search_memory`` spans (one of them a human's, ``memdiag.source=viewer``) are the
  app's own, as no library emits them.

Writes ``tests/data/real_spans/<name>.jsonl`` (OTLP/JSON ``TracesData``, one batch a line, as
the Collector's ``file`` exporter writes them: hex ids, enums as integers) and
``tests/data/real_spans/expected.json``: what memdiag must derive, built from what the toy
agents did (the log below), by the contract's rules, never from the spans.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# before any instrumentation is imported: they read these once
os.environ["OTEL_SEMCONV_STABILITY_OPT_IN"] = "gen_ai_latest_experimental"
os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "SPAN_ONLY"
os.environ["OPENINFERENCE_ENABLE_GENAI_SEMCONV"] = "false"  # OpenInference's own names only
os.environ["LANGSMITH_TRACING"] = "false"
os.environ.pop("LANGCHAIN_TRACING_V2", None)
os.environ.pop("OPENAI_BASE_URL", None)
os.environ["NO_PROXY"] = "127.0.0.1,localhost"

from google.protobuf import json_format  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "real_spans"
FOLLOWUP_GAP_S = 0.3  # between a search and its followup
SPANS_PER_LINE = 4

# -- what the agents did (the truth expected.json comes from) -------------------------------

LOG: list[dict[str, Any]] = []  # searches, turns, outcomes, in the order they happened


def _log(kind: str, **fields: Any) -> None:
    LOG.append({"kind": kind, "t": time.monotonic(), **fields})


def _provider(service: str) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create(
            {
                "service.name": service,
                "memdiag.org_id": "org_real",
                "memdiag.project_id": "proj_real",
            }
        )
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


class LintError(Exception):
    """What a linter tool raises."""


# -- 1. LangChain + OpenInference ----------------------------------------------------------

LC_MEMORIES = {
    "lc-m1": "Payment retries use exponential backoff with jitter, capped at five attempts.",
    "lc-m2": "Frontend deploys go through the staging bundle before production.",
    "lc-m3": "Stripe webhooks are verified with the signing secret before processing.",
    "lc-m4": "Webhook handlers must be idempotent: store the event identifier first.",
    "lc-m5": "The frontend uses eslint with the airbnb config and prettier formatting.",
    "lc-m6": "Database migrations run nightly against the replica cluster.",
}
LC_SEARCHES = {  # query -> the memory ids the store returns
    "how do we retry failed payments": ["lc-m1", "lc-m2"],
    "stripe webhook signature check": ["lc-m3"],
    "stripe webhook duplicate events": ["lc-m3", "lc-m4"],
    "lint setup for the frontend": ["lc-m5", "lc-m6"],
}


def capture_langchain() -> list[ReadableSpan]:
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables import RunnableLambda
    from langchain_core.tools import tool
    from openinference.instrumentation import using_session
    from openinference.instrumentation.langchain import LangChainInstrumentor, get_current_span

    provider, exporter = _provider("lc-support-agent")
    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=provider)

    class MemoryRetriever(BaseRetriever):
        """The memory store: fixed documents per query; the id only in the metadata."""

        def _get_relevant_documents(
            self, query: str, *, run_manager: CallbackManagerForRetrieverRun
        ) -> list[Document]:
            return [
                Document(page_content=LC_MEMORIES[i], metadata={"id": i, "source": "memories"})
                for i in LC_SEARCHES[query]
            ]

    retriever = MemoryRetriever()

    @tool
    def pytest(path: str) -> str:
        """Run the test suite under a path."""
        return f"12 passed in {path}"

    @tool
    def run_linter(path: str) -> str:
        """Run eslint on a path."""
        raise LintError(f"eslint: 3 lint errors in {path} (no-unused-vars)")

    def search(session: str, query: str) -> list[Any]:
        docs = retriever.invoke(query)
        _log("search", session=session, query=query, source="agent",
             results=[(d.metadata["id"], d.page_content) for d in docs])  # fmt: skip
        return docs

    def chat(session: str, model: Any, docs: list[Any], question: str) -> str:
        context = "\n".join(d.page_content for d in docs)
        answer = model.invoke(
            [SystemMessage(content=f"Memories:\n{context}"), HumanMessage(content=question)]
        ).content
        _log("turn", session=session, response=answer)
        return answer

    def run_tool(session: str, t: Any, path: str) -> bool:
        try:
            t.invoke({"path": path})
            _log("tool", session=session, tool=t.name, ok=True, error=None)
            return True
        except LintError as e:
            _log("tool", session=session, tool=t.name, ok=False, error=str(e))
            return False

    def s1(inputs: dict[str, Any]) -> str:
        session = inputs["session"]
        model = FakeListChatModel(responses=[
            "Retry the payment with exponential backoff and jitter, capped at five attempts, "
            "and verify Stripe webhooks with the signing secret before processing them.",
            "Make the webhook handlers idempotent: store the event identifier first and skip "
            "duplicates.",
        ])  # fmt: skip
        docs = search(session, "how do we retry failed payments")
        time.sleep(FOLLOWUP_GAP_S)
        docs += search(session, "stripe webhook signature check")  # a followup
        chat(session, model, docs, "Why are payments charged twice?")
        time.sleep(0.1)
        # shares lc-m3 with the search before: not a followup
        docs = search(session, "stripe webhook duplicate events")
        chat(session, model, docs, "How do we ignore duplicate webhook deliveries?")
        ok = run_tool(session, pytest, "tests/payments")
        outcome = "accepted" if ok else "rework"
        get_current_span().set_attribute("memdiag.outcome", outcome)
        _log("outcome", session=session, outcome=outcome)
        return outcome

    def s2(inputs: dict[str, Any]) -> str:
        session = inputs["session"]
        model = FakeListChatModel(responses=[
            "The frontend uses eslint with the airbnb config; run prettier formatting before "
            "committing.",
        ])  # fmt: skip
        docs = search(session, "lint setup for the frontend")
        chat(session, model, docs, "How do I fix the lint job?")
        run_tool(session, pytest, "tests/frontend")
        ok = run_tool(session, run_linter, "src/app.ts")
        outcome = "accepted" if ok else "rejected"
        get_current_span().set_attribute("memdiag.outcome", outcome)
        _log("outcome", session=session, outcome=outcome)
        return outcome

    for session, body in (("lc-s1", s1), ("lc-s2", s2)):
        agent = RunnableLambda(body).with_config(run_name="support_agent")
        with using_session(session):
            agent.invoke({"session": session})
        time.sleep(0.1)
    instrumentor.uninstrument()
    provider.shutdown()
    return list(exporter.get_finished_spans())


# -- 2. openai + opentelemetry-instrumentation-openai-v2 + opentelemetry-util-genai -------

OA_MEMORIES = {
    "oa-m1": "The payment test suite mocks the gateway client with a frozen clock.",
    "oa-m2": "Release notes are drafted every Friday by the platform team.",
    "oa-m3": "Database fixtures roll back each transaction after every pytest case.",
    "oa-m4": "Slow tests are marked with the integration marker and skipped locally.",
    "oa-m5": "Imports are sorted by isort and checked by the eslint import plugin.",
    "oa-m6": "Kubernetes manifests live in the deploy repository.",
    "oa-m9": "Customer escalations go to the support rotation channel.",
}
# the stand-in model: the last user message -> (text, tool calls, finish reason)
OA_REPLIES: dict[str, tuple[str | None, list[dict[str, Any]], str]] = {
    "Why does the payment test time out?": (
        "The payment suite mocks the gateway client with a frozen clock, and database "
        "fixtures roll back every transaction after each pytest case.", [], "stop"),
    "Run the payment tests.": (
        None, [{"id": "call_pytest_1", "name": "pytest",
                "arguments": {"path": "tests/payments"}}], "tool_calls"),
    "Which tests are too slow for a local run?": (
        "Mark the slow tests with the integration marker so they are skipped locally.", [],
        "stop"),
    "How should imports be ordered?": (
        "Imports are sorted by isort and checked by the eslint import plugin, so fix the "
        "order.", [], "stop"),
    "Lint the app.": (
        None, [{"id": "call_lint_1", "name": "run_linter",
                "arguments": {"path": "src/app.ts"}}], "tool_calls"),
}  # fmt: skip


class _StandIn(BaseHTTPRequestHandler):
    """``POST /v1/chat/completions``: the scripted reply to the last user message."""

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        last = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
        text, calls, finish = OA_REPLIES[last]
        n = list(OA_REPLIES).index(last)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                for c in calls
            ]  # fmt: skip
        reply = json.dumps({
            "id": f"chatcmpl-standin-{n}", "object": "chat.completion",
            "created": 1_790_000_000, "model": "gpt-4o-mini-2024-07-18",
            "system_fingerprint": "fp_standin",
            "choices": [{"index": 0, "message": message, "finish_reason": finish,
                         "logprobs": None}],
            "usage": {"prompt_tokens": 40 + n, "completion_tokens": 20 + n,
                      "total_tokens": 60 + 2 * n},
        }).encode()  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


def _serve() -> ThreadingHTTPServer:
    # a fixed port, so server.port is the same in every capture; any free one if taken
    for port in (18765, 0):
        try:
            server = ThreadingHTTPServer(("127.0.0.1", port), _StandIn)
        except OSError:
            continue
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server
    raise RuntimeError("no port for the stand-in")


def capture_openai() -> list[ReadableSpan]:
    import openai
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.util.genai.handler import TelemetryHandler

    provider, exporter = _provider("oa-coding-agent")
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    handler = TelemetryHandler(tracer_provider=provider)
    tracer = provider.get_tracer("memory-client", "1.0.0")
    server = _serve()
    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{server.server_address[1]}/v1",
        api_key="sk-standin",
        max_retries=0,
    )

    def search_memory(session: str, query: str, ids: list[str], viewer: bool = False) -> None:
        """The app's memory client: the convention's search_memory span."""
        records = [{"id": i, "content": OA_MEMORIES[i]} for i in ids]
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "search_memory",
            "gen_ai.memory.store.id": "memories",
            "gen_ai.memory.query.text": query,
            "gen_ai.memory.records": json.dumps(records),
        }
        if viewer:  # a support console's search of this conversation's memory
            attrs["memdiag.source"] = "viewer"
            attrs["gen_ai.conversation.id"] = session
        with tracer.start_as_current_span("search_memory memories", attributes=attrs):
            pass
        _log("search", session=session, query=query, source="viewer" if viewer else "agent",
             results=[(r["id"], r["content"]) for r in records])  # fmt: skip

    def retrieval(session: str, query: str, ids: list[str]) -> None:
        """util-genai's retrieval, its documents with their content."""
        docs = [{"id": i, "score": round(0.92 - 0.1 * k, 2), "content": OA_MEMORIES[i]}
                for k, i in enumerate(ids)]  # fmt: skip
        with handler.retrieval(data_source_id="memories") as inv:
            inv.query_text = query
            inv.documents = docs
        _log("search", session=session, query=query, source="agent",
             results=[(d["id"], d["content"]) for d in docs])  # fmt: skip

    def chat(session: str, question: str) -> Any:
        reply = (
            client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[
                    {"role": "system", "content": "You are a coding agent."},
                    {"role": "user", "content": question},
                ],  # fmt: skip
            )
            .choices[0]
            .message
        )
        _log("turn", session=session, response=reply.content)  # None: tool calls only
        return reply

    def run_tool(session: str, call: Any) -> bool:
        name = call.function.name
        args = json.loads(call.function.arguments)
        with handler.tool(name, tool_call_id=call.id, tool_type="function") as inv:
            inv.arguments = args
            try:
                if name == "run_linter":
                    raise LintError(f"eslint: 2 lint errors in {args['path']} (import/order)")
                inv.tool_result = "12 passed"
            except LintError as e:
                inv.fail(e)  # util-genai's own failed tool call
                _log("tool", session=session, tool=name, ok=False, error=str(e))
                return False
        _log("tool", session=session, tool=name, ok=True, error=None)
        return True

    def agent(session: str, steps: Any) -> None:
        inv = handler.invoke_local_agent(agent_name="coder", request_model="gpt-4o-mini")
        inv.conversation_id = session
        ok = steps(session)
        outcome = "accepted" if ok else "rejected"
        inv.attributes["memdiag.outcome"] = outcome
        _log("outcome", session=session, outcome=outcome)
        inv.stop()

    def s1(session: str) -> bool:
        search_memory(session, "flaky payment test timeout", ["oa-m1", "oa-m2"])
        # a person's search in between: never a predecessor, injects nothing
        search_memory(session, "payment test fixtures", ["oa-m3", "oa-m9"], viewer=True)
        time.sleep(FOLLOWUP_GAP_S)
        search_memory(session, "pytest fixture database rollback", ["oa-m3"])  # followup
        chat(session, "Why does the payment test time out?")
        call = chat(session, "Run the payment tests.").tool_calls[0]  # tool calls only
        ok = run_tool(session, call)
        time.sleep(0.1)
        # the same query as two searches before, a shared id: not a followup
        retrieval(session, "pytest fixture database rollback", ["oa-m3", "oa-m4"])
        chat(session, "Which tests are too slow for a local run?")
        return ok

    def s2(session: str) -> bool:
        search_memory(session, "eslint import order rules", ["oa-m5", "oa-m6"])
        chat(session, "How should imports be ordered?")
        call = chat(session, "Lint the app.").tool_calls[0]
        return run_tool(session, call)

    try:
        agent("oa-s1", s1)
        time.sleep(0.1)
        agent("oa-s2", s2)
    finally:
        server.shutdown()
        server.server_close()
    instrumentor.uninstrument()
    provider.shutdown()
    return list(exporter.get_finished_spans())


# -- OTLP/JSON, as the Collector's file exporter writes it ----------------------------------


def otlp_json_line(spans: list[ReadableSpan]) -> str:
    doc = json_format.MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for rs in doc.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for span in ss.get("spans", ()):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64decode(span[key]).hex()
                for link in span.get("links", ()):
                    for key in ("traceId", "spanId"):
                        if link.get(key):
                            link[key] = base64.b64decode(link[key]).hex()
    return json.dumps(doc, sort_keys=True)


def write_spans(name: str, spans: list[ReadableSpan]) -> Path:
    """In the order they ended (children first, the agent's span last), a few a line."""
    path = OUT / f"{name}.jsonl"
    with path.open("w") as f:
        for i in range(0, len(spans), SPANS_PER_LINE):
            f.write(otlp_json_line(spans[i : i + SPANS_PER_LINE]) + "\n")
    return path


# -- the expected derivation, from LOG by the contract's rules (section 3) ------------------


def _words(text: str) -> set[str]:
    out = set()
    for w in text.lower().split():
        w = re.sub(r"[^0-9a-z]", "", w)
        if w:
            out.add(w)
    return out


def _signal(memory: str, response: str) -> str:
    keywords = {w for w in _words(memory) if len(w) > 4}
    if not keywords:
        return "ignored"
    return "used" if len(keywords & _words(response)) / len(keywords) > 0.30 else "ignored"


STYLE = re.compile(r"lint|format|prettier|eslint", re.I)
REGRESSION = re.compile(r"regression|broke|previously", re.I)
TEST_RUNNERS = {"jest", "vitest", "pytest", "go_test", "mocha", "jasmine", "karma", "ava",
                "cargo_test", "rspec", "minitest", "phpunit", "junit", "unittest", "nose2",
                "playwright_test", "cypress"}  # fmt: skip


def _category(tools: list[dict[str, Any]]) -> str:
    failed = [t for t in tools if not t["ok"]]
    errors = [t["error"] for t in failed if t["error"]]
    if any(re.sub(r"[- ]", "_", t["tool"].lower()) in TEST_RUNNERS for t in failed):
        return "test_failure"
    if any(STYLE.search(e) for e in errors):
        return "style"
    if any(REGRESSION.search(e) for e in errors):
        return "regression"
    # incomplete: never, the tools name no file (memdiag.file), so files_modified is absent
    return "wrong_approach" if errors else "other"


def expected(log: list[dict[str, Any]]) -> dict[str, Any]:
    by_source: dict[str, int] = {}
    searches: list[dict[str, Any]] = []
    feedback: list[dict[str, Any]] = []
    sessions: dict[str, dict[str, Any]] = {}
    state: dict[str, dict[str, Any]] = {}
    for e in log:
        s = e["session"]
        st = state.setdefault(s, {"prev": None, "pending": [], "turns": 0, "tools": [],
                                  "verdicts": {}})  # fmt: skip
        row = sessions.setdefault(s, {"outcome": None, "failure_category": None,
                                      "injected_observation_ids": [], "search_count": 0,
                                      "followup_count": 0})  # fmt: skip
        if e["kind"] == "search":
            by_source[e["source"]] = by_source.get(e["source"], 0) + 1
            item = {"session_id": s, "query": e["query"], "source": e["source"],
                    "result_ids": [r[0] for r in e["results"]]}  # fmt: skip
            if e["source"] == "viewer":
                item["followup"] = None  # never judged, never a predecessor
            else:
                row["search_count"] += 1
                prev = st["prev"]
                ids = {r[0] for r in e["results"]}
                follow = bool(
                    ids and prev is not None
                    and e["t"] - prev["t"] <= 30
                    and e["query"].strip().lower() != prev["query"].strip().lower()
                    and not ids & {r[0] for r in prev["results"]}
                )  # fmt: skip
                item["followup"] = follow
                row["followup_count"] += follow
                if ids:
                    st["prev"] = e
                st["pending"] += e["results"]
            searches.append(item)
        elif e["kind"] == "turn":
            injected = dict(st["pending"])  # each memory once, in the order of the searches
            st["pending"] = []
            for mid in injected:
                if mid not in row["injected_observation_ids"]:
                    row["injected_observation_ids"].append(mid)
            if e["response"] is not None:  # tool calls only: injects, unjudged
                for mid, content in injected.items():
                    signal = _signal(content, e["response"])
                    st["verdicts"].setdefault(mid, []).append(signal)
                    feedback.append({"session_id": s, "turn": st["turns"],
                                     "observation_id": mid, "signal": signal})  # fmt: skip
            st["turns"] += 1
        elif e["kind"] == "tool":
            st["tools"].append(e)
        elif e["kind"] == "outcome":
            row["outcome"] = e["outcome"]
            row["tool_calls"] = [{"tool": t["tool"], "success": t["ok"]} for t in st["tools"]]
            row["errors"] = [{"message": t["error"], "tool": t["tool"], "recoverable": False}
                             for t in st["tools"] if t["error"]]  # fmt: skip
            if e["outcome"] != "accepted":
                row["failure_category"] = _category(st["tools"])
    for s, row in sessions.items():
        verdicts = state[s]["verdicts"]
        row["ignored_observation_ids"] = [
            m for m in row["injected_observation_ids"]
            if verdicts.get(m) and all(v == "ignored" for v in verdicts[m])
        ]  # fmt: skip
    return {"searches": {"by_source": by_source, "list": searches}, "feedback": feedback,
            "sessions": sessions}  # fmt: skip


# the design: what each scenario was written to show (a library change that alters it fails)
DESIGN = {
    "langchain_openinference": {
        "followups": [("lc-s1", "stripe webhook signature check")],
        "outcomes": {"lc-s1": ("accepted", None), "lc-s2": ("rejected", "style")},
        "used": {("lc-s1", 0, "lc-m1"), ("lc-s1", 0, "lc-m3"), ("lc-s1", 1, "lc-m4"),
                 ("lc-s2", 0, "lc-m5")},
        "ignored": {("lc-s1", 0, "lc-m2"), ("lc-s1", 1, "lc-m3"), ("lc-s2", 0, "lc-m6")},
    },
    "openai_v2_util_genai": {
        "followups": [("oa-s1", "pytest fixture database rollback")],
        "outcomes": {"oa-s1": ("accepted", None), "oa-s2": ("rejected", "style")},
        "used": {("oa-s1", 0, "oa-m1"), ("oa-s1", 0, "oa-m3"), ("oa-s1", 2, "oa-m4"),
                 ("oa-s2", 0, "oa-m5")},
        "ignored": {("oa-s1", 0, "oa-m2"), ("oa-s1", 2, "oa-m3"), ("oa-s2", 0, "oa-m6")},
    },
}  # fmt: skip


def _check(name: str, exp: dict[str, Any]) -> None:
    design = DESIGN[name]
    follow = [(x["session_id"], x["query"]) for x in exp["searches"]["list"] if x["followup"]]
    assert follow == design["followups"], (name, follow)
    outcomes = {s: (r["outcome"], r["failure_category"]) for s, r in exp["sessions"].items()}
    assert outcomes == design["outcomes"], (name, outcomes)
    for signal in ("used", "ignored"):
        got = {(f["session_id"], f["turn"], f["observation_id"])
               for f in exp["feedback"] if f["signal"] == signal}  # fmt: skip
        assert got == design[signal], (name, signal, got)


NOTES = {
    "about": "What memdiag must derive from each file of this folder, built by "
    "tests/real_libraries/capture.py from what its toy agents did (not from memdiag), by "
    "the contract's rules. All of a file's searches of a session are within 30 s of each "
    "other (a followup's gap is 0.3 s).",
    "searches": "by_source: search events by source. list: every search in the order it "
    "started, known by (session_id, query); followup: true/false for the agent's searches, "
    "null for a viewer's (never judged). event ids and ts cannot be known here: they are "
    "trace:span ids and the clock's times of the capture.",
    "feedback": "one row per judged memory per turn: turn is the turn's 0-based order "
    "in its session (by its chat/LLM span's start), counting the turns that cannot be judged "
    "(tool calls only: openai_v2 oa-s1 turn 1, oa-s2 turn 1, which inject nothing here).",
    "sessions": "outcome and failure_category from memdiag.outcome and the failed tools; "
    "injected_observation_ids in first-seen order; search_count and followup_count count "
    "the agent's searches only; ignored_observation_ids: injected memories judged ignored "
    "in every judged turn; tool_calls (in the order they started) and errors: the outcome's, "
    "an OpenInference TOOL's error from its exception event, a util-genai execute_tool's "
    "from its ERROR status description (it records no exception event). No session has files_modified (no tool span names memdiag.file), "
    "so 'incomplete' never applies. Agent ids: openai_v2 sessions have agent 'coder' "
    "(gen_ai.agent.name on util-genai's invoke_agent span); LangChain sessions have none "
    "(OpenInference writes no agent name, the resource has none).",
}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"_notes": NOTES}
    for name, capture in (("langchain_openinference", capture_langchain),
                          ("openai_v2_util_genai", capture_openai)):  # fmt: skip
        LOG.clear()
        spans = capture()
        path = write_spans(name, spans)
        exp = expected(LOG)
        _check(name, exp)
        result[name] = exp
        print(f"{path.relative_to(ROOT)}: {len(spans)} spans")
    (OUT / "expected.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{(OUT / 'expected.json').relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
