"""Typed input events, for a runtime that publishes with :mod:`memdiag.client`.

These are ``TypedDict``s: an event is still the plain ``dict`` the JSON Schemas describe
(``schemas/*.schema.json``, docs/events.md), and a type checker checks its fields where the
runtime builds it::

    from memdiag.events import SearchEvent

    event: SearchEvent = {
        "kind": "search", "event_id": "e1", "ts": "2026-11-21T09:30:00.250Z",
        "session_id": "s1", "query": "auth token rotation", "result_ids": ["obs_1"],
    }
    publisher.publish(event)

The JSON Schemas stay the contract: a test keeps these in agreement with them (every field,
and which are required). What a type cannot say (lengths, the ``ts`` pattern, a probe's
``k`` of at least 1) the publisher checks before it sends, with the worker's own validators.
"""

# no `from __future__ import annotations`: NotRequired must stay visible at run time, so that
# __required_keys__ is right (tests/unit/test_event_types.py compares it with the schemas)
from typing import Any, Literal, NotRequired, TypedDict

__all__ = [
    "AmbientContextEvent",
    "EdgeKey",
    "Event",
    "InjectionEvent",
    "JudgementEvent",
    "MemoryEvent",
    "MemoryIndexedEvent",
    "MemoryWrittenEvent",
    "Observation",
    "RecallProbeEvent",
    "ResponseEvent",
    "SearchEvent",
    "SessionError",
    "SessionEvent",
    "SessionOutcomeEvent",
    "ToolCall",
]


class _SessionFields(TypedDict):
    event_id: str
    """1–128 characters, unique: the idempotency key."""
    ts: str
    """Event time, RFC 3339 with an offset: ``2026-11-21T09:30:00.250Z``."""
    session_id: str
    agent_id: NotRequired[str]
    org_id: NotRequired[str]
    project_id: NotRequired[str]


class SearchEvent(_SessionFields):
    """A memory search (``memdiag.events``, keyed by ``session_id``)."""

    kind: Literal["search"]
    query: str
    result_ids: list[str]
    """The ids the search returned, in rank order; may be empty."""
    source: NotRequired[Literal["agent", "viewer"]]
    """``agent`` (the default) or ``viewer``: a person's search in a viewer UI."""


class Observation(TypedDict):
    id: str
    content: str


class EdgeKey(TypedDict):
    """A knowledge-graph edge; ``sourceId``/``targetId``/``relationshipName`` are accepted
    on the wire too (docs/events.md), this is the canonical spelling."""

    source_id: str
    target_id: str
    relationship: str


class InjectionEvent(_SessionFields):
    """Memories put into the agent's context for one turn."""

    kind: Literal["injection"]
    turn_id: str
    observations: list[Observation]
    graph_entity_ids: NotRequired[list[str]]
    graph_edge_keys: NotRequired[list[EdgeKey]]


class ResponseEvent(_SessionFields):
    """The agent's response of one turn (joined with its injection, in either order)."""

    kind: Literal["response"]
    turn_id: str
    text: str


class ToolCall(TypedDict):
    tool: str
    success: bool
    file: NotRequired[str]


class SessionError(TypedDict):
    message: str
    tool: str
    """The tool that raised it; ``""`` when no tool did (docs/events.md)."""
    recoverable: bool


class SessionOutcomeEvent(_SessionFields):
    """How the session ended: ``accepted``, or failed as ``rejected`` or ``rework``."""

    kind: Literal["session_outcome"]
    outcome: Literal["accepted", "rejected", "rework"]
    tool_calls: list[ToolCall]
    files_modified: list[str]
    """Empty on a failed session makes it ``incomplete`` (docs/rules.md)."""
    errors: list[SessionError]
    helpful_observation_ids: NotRequired[list[str]]
    failure_context: NotRequired[Any]


class JudgementEvent(TypedDict):
    """A benchmark judgement (``memdiag.judgements``, keyed by ``run_id``)."""

    kind: Literal["judgement"]
    event_id: str
    ts: str
    run_id: str
    question_id: str
    judge_correct: bool
    gold_evidence_ids: list[str]
    retrieved_context_ids: list[str]
    """The context the reader saw, in rank order."""
    condition: NotRequired[str]
    repeat_index: NotRequired[int]
    latency_ms: NotRequired[float]
    tokens: NotRequired[int]
    input_tokens: NotRequired[int]
    output_tokens: NotRequired[int]
    score: NotRequired[float]
    duration_ms: NotRequired[float]
    run_group_id: NotRequired[str]
    suite_id: NotRequired[str]
    suite_version: NotRequired[str]
    suite_checksum: NotRequired[str]
    fixture_checksum: NotRequired[str]
    config_fingerprint: NotRequired[str]
    git_head: NotRequired[str]
    service_version: NotRequired[str]
    label_status: NotRequired[Literal["reviewed", "unreviewed"]]
    """Has a person reviewed the question's gold label."""
    split: NotRequired[str]
    """Free text, e.g. ``held_out`` or ``dev``."""


class _MemoryFields(TypedDict):
    event_id: str
    ts: str
    agent_id: str


class MemoryWrittenEvent(_MemoryFields):
    """A memory written (``memdiag.memory``, keyed by ``agent_id``)."""

    kind: Literal["memory_written"]
    memory_id: str
    name: NotRequired[str]
    store: NotRequired[str]


class MemoryIndexedEvent(_MemoryFields):
    kind: Literal["memory_indexed"]
    memory_id: str
    store: NotRequired[str]


class RecallProbeEvent(_MemoryFields):
    """A recall probe: a query made from a memory, and what came back."""

    kind: Literal["recall_probe"]
    memory_id: str
    result_ids: list[str]
    scores: NotRequired[list[float]]
    k: NotRequired[int]
    threshold: NotRequired[float]
    query_source: NotRequired[Literal["name", "task"]]
    """Where the query came from: the memory's ``name`` (the default) or a ``task`` it should
    serve. SRR counts name probes only; ``recall_by_query_source`` sets the two apart."""


class AmbientContextEvent(_MemoryFields):
    kind: Literal["ambient_context"]
    session_id: str
    memory_ids: list[str]


SessionEvent = SearchEvent | InjectionEvent | ResponseEvent | SessionOutcomeEvent
MemoryEvent = MemoryWrittenEvent | MemoryIndexedEvent | RecallProbeEvent | AmbientContextEvent
#: Any event :meth:`memdiag.client.Publisher.publish` takes.
Event = SessionEvent | JudgementEvent | MemoryEvent
