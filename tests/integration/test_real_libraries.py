"""Spans from real instrumentation libraries, through the broker and the worker into DuckDB.

``tests/data/real_spans/`` holds what two libraries really wrote (``make capture-spans``
captures them again, in a venv of its own: ``tests/real_libraries/``):

- OpenInference's LangChain instrumentation over a fake chat model, a retriever whose
  documents carry their memory id only in ``document.metadata``, and tools (one raising a
  lint error);
- the official ``opentelemetry-instrumentation-openai-v2`` 2.4b0 with
  ``opentelemetry-util-genai`` 1.1b0 (``gen_ai_latest_experimental``, content ``SPAN_ONLY``)
  against a local stand-in of the OpenAI API: its failed tool call is status ``ERROR`` with a
  description and ``error.type``, and no exception event; a viewer's search
  (``memdiag.source``) beside the agent's.

``expected.json`` says what each agent did (written from the capture's own log, by the
contract's rules, not by memdiag). The records go out as the Collector's Kafka exporter
writes them: one file as ``otlp_json``, the other as ``otlp_proto``, unkeyed, in reverse
order, so a trace's spans come after their children.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from memdiag.schemas import otlp
from tests.integration.conftest import Pipeline, pipeline_settings

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parent.parent / "data" / "real_spans"
FILES = {"langchain_openinference": "otlp_json", "openai_v2_util_genai": "otlp_proto"}


def records(name: str, encoding: str) -> list[tuple[bytes | None, object]]:
    lines = [ln for ln in (DATA / f"{name}.jsonl").read_bytes().splitlines() if ln.strip()]
    if encoding == "otlp_proto":
        lines = [otlp.decode(ln).traces.SerializeToString() for ln in lines]
    return [(None, raw) for raw in reversed(lines)]


@pytest.fixture
def text_pipeline(broker_url: str, tmp_path: Path) -> Any:
    """A pipeline that keeps the queries (``MEMDIAG_STORE_TEXT``): searches are known by them."""
    settings = dataclasses.replace(pipeline_settings(broker_url, tmp_path), store_text=True)
    p = Pipeline(settings, tmp_path)
    try:
        yield p
    finally:
        p.stop()


def test_spans_of_real_libraries_give_what_their_agents_did(text_pipeline: Pipeline) -> None:
    p = text_pipeline
    expected = json.loads((DATA / "expected.json").read_text())
    p.start()
    for name, encoding in FILES.items():
        p.publish(records(name, encoding), topic=p.settings.topics.otlp_spans)
    p.drain(timeout=180)
    assert p.query("SELECT reason, detail FROM dead_letters") == []

    for name in FILES:
        want = expected[name]
        sessions = sorted(want["sessions"])
        ids = ", ".join(f"'{s}'" for s in sessions)
        # searches: in the order they started, with their source, results and verdict
        got_searches = p.query(
            "SELECT session_id, query, source, result_count, is_followup FROM searches "
            f"WHERE session_id IN ({ids}) ORDER BY session_id, ts, event_id"
        )
        want_searches = sorted(
            (
                (
                    s["session_id"],
                    s["query"],
                    s["source"],
                    len(s["result_ids"]),
                    bool(s["followup"]),
                )  # fmt: skip
                for s in want["searches"]["list"]
            ),
            key=lambda s: (s[0], [x["query"] for x in want["searches"]["list"]].index(s[1])),
        )
        assert got_searches == want_searches, name
        # verdicts: per session, each judged turn's {memory: signal}, in the turns' order
        rows = p.query(
            "SELECT session_id, turn_id, observation_id, signal, ts FROM retrieval_feedback "
            f"WHERE session_id IN ({ids})"
        )
        got_turns: dict[str, dict[str, tuple[Any, dict[str, str]]]] = {}
        for sid, turn, obs, signal, ts in rows:
            at, signals = got_turns.setdefault(sid, {}).setdefault(turn, (ts, {}))
            signals[obs] = signal
            got_turns[sid][turn] = (min(at, ts), signals)
        want_turns: dict[str, dict[int, dict[str, str]]] = {}
        for f in want["feedback"]:
            want_turns.setdefault(f["session_id"], {}).setdefault(f["turn"], {})[
                f["observation_id"]
            ] = f["signal"]
        for sid in sessions:
            got = [s for _, s in sorted(got_turns.get(sid, {}).values(), key=lambda t: t[0])]
            assert got == [want_turns[sid][t] for t in sorted(want_turns.get(sid, {}))], sid
        # the session diagnostics, tool calls and errors included
        diagnostics = p.query(
            "SELECT session_id, outcome, failure_category, injected_observation_ids, "
            "ignored_observation_ids, search_count, followup_count, tool_call_summary, "
            f"errors_encountered FROM session_diagnostics WHERE session_id IN ({ids}) "
            "ORDER BY session_id"
        )
        assert [d[0] for d in diagnostics] == sessions, name
        for (
            sid,
            outcome,
            category,
            injected,
            ignored,
            searches,
            followups,
            tools,
            errors,
        ) in diagnostics:
            w = want["sessions"][sid]
            assert (outcome, category, injected, ignored, searches, followups) == (
                w["outcome"], w["failure_category"], w["injected_observation_ids"],
                w["ignored_observation_ids"], w["search_count"], w["followup_count"],
            ), sid  # fmt: skip
            if outcome == "accepted":
                continue  # the light record: no tool calls, files or errors
            assert [(t["tool"], t["success"]) for t in tools] == [
                (t["tool"], t["success"]) for t in w["tool_calls"]
            ], sid
            assert [(e["message"], e["tool"], e["recoverable"]) for e in errors] == [
                (e["message"], e["tool"], e["recoverable"]) for e in w["errors"]
            ], sid
    # the memories were known by the ids the application gave them, never by a hash
    unnamed = p.query(
        "SELECT count(*) FROM retrieval_feedback WHERE observation_id LIKE 'content:%'"
    )
    assert unnamed == [(0,)]
