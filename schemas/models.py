"""Python models of the input events (docs/events.md).

The JSON Schema files beside this module are the contract; these dataclasses are what the
worker's logic sees after the edge has validated a message. Event time is kept as integer
microseconds since the epoch (``ts_us``): exact, cheap to compare, and free of float error
at the window boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ts_to_us(dt: datetime) -> int:
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def us_to_datetime(ts_us: int) -> datetime:
    return datetime.fromtimestamp(ts_us // 1_000_000, tz=UTC).replace(microsecond=ts_us % 1_000_000)


def format_ts(ts_us: int) -> str:
    """RFC 3339 in UTC with microseconds, the form memdiag writes everywhere. The whole
    seconds are formatted once and remembered: the worker stamps every row it sends."""
    seconds, micros = divmod(ts_us, 1_000_000)
    return f"{_format_second(seconds)}.{micros:06d}Z"


@lru_cache(maxsize=8192)
def _format_second(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).replace(tzinfo=None).isoformat()


@dataclass(frozen=True, slots=True)
class SessionScope:
    session_id: str
    agent_id: str | None = None
    org_id: str | None = None
    project_id: str | None = None


@dataclass(frozen=True, slots=True)
class Search:
    event_id: str
    ts_us: int
    scope: SessionScope
    query: str
    result_ids: tuple[str, ...]
    source: str = "agent"
    kind: str = field(default="search", init=False)

    @property
    def session_id(self) -> str:
        return self.scope.session_id


@dataclass(frozen=True, slots=True)
class Observation:
    id: str
    content: str


@dataclass(frozen=True, slots=True)
class EdgeKey:
    source_id: str
    target_id: str
    relationship: str


@dataclass(frozen=True, slots=True)
class Injection:
    event_id: str
    ts_us: int
    scope: SessionScope
    turn_id: str
    observations: tuple[Observation, ...]
    graph_entity_ids: tuple[str, ...] = ()
    graph_edge_keys: tuple[EdgeKey, ...] = ()
    kind: str = field(default="injection", init=False)

    @property
    def session_id(self) -> str:
        return self.scope.session_id


@dataclass(frozen=True, slots=True)
class Response:
    event_id: str
    ts_us: int
    scope: SessionScope
    turn_id: str
    text: str
    kind: str = field(default="response", init=False)

    @property
    def session_id(self) -> str:
        return self.scope.session_id


@dataclass(frozen=True, slots=True)
class ToolCall:
    tool: str
    success: bool
    file: str | None = None


@dataclass(frozen=True, slots=True)
class SessionError:
    message: str
    tool: str
    recoverable: bool


@dataclass(frozen=True, slots=True)
class SessionOutcome:
    event_id: str
    ts_us: int
    scope: SessionScope
    outcome: str
    tool_calls: tuple[ToolCall, ...]
    #: None: the outcome cannot know its files (the ``incomplete`` rule does not apply)
    files_modified: tuple[str, ...] | None
    errors: tuple[SessionError, ...]
    helpful_observation_ids: tuple[str, ...] = ()
    failure_context: Any = None
    #: memdiag's own amendments (outcomes from spans): a higher revision of the same
    #: ``event_id`` takes the place of the one before; 0 for every published event
    revision: int = 0
    kind: str = field(default="session_outcome", init=False)

    @property
    def session_id(self) -> str:
        return self.scope.session_id


@dataclass(frozen=True, slots=True)
class Judgement:
    event_id: str
    ts_us: int
    run_id: str
    question_id: str
    judge_correct: bool
    gold_evidence_ids: tuple[str, ...]
    retrieved_context_ids: tuple[str, ...]
    condition: str = ""
    repeat_index: int = 0
    latency_ms: float | None = None
    tokens: int | None = None
    kind: str = field(default="judgement", init=False)


@dataclass(frozen=True, slots=True)
class MemoryWritten:
    event_id: str
    ts_us: int
    agent_id: str
    memory_id: str
    name: str | None = None
    store: str | None = None
    kind: str = field(default="memory_written", init=False)


@dataclass(frozen=True, slots=True)
class MemoryIndexed:
    event_id: str
    ts_us: int
    agent_id: str
    memory_id: str
    store: str | None = None
    kind: str = field(default="memory_indexed", init=False)


#: A recall probe's defaults (docs/events.md): the top 3, a cosine similarity of 0.35.
PROBE_K = 3
PROBE_THRESHOLD = 0.35


@dataclass(frozen=True, slots=True)
class RecallProbe:
    event_id: str
    ts_us: int
    agent_id: str
    memory_id: str
    result_ids: tuple[str, ...]
    scores: tuple[float, ...] | None = None
    k: int = PROBE_K
    threshold: float = PROBE_THRESHOLD
    kind: str = field(default="recall_probe", init=False)


@dataclass(frozen=True, slots=True)
class AmbientContext:
    event_id: str
    ts_us: int
    agent_id: str
    session_id: str
    memory_ids: tuple[str, ...]
    kind: str = field(default="ambient_context", init=False)


SessionEvent = Search | Injection | Response | SessionOutcome
MemoryEvent = MemoryWritten | MemoryIndexed | RecallProbe | AmbientContext
Event = SessionEvent | Judgement | MemoryEvent


def _scope(d: dict[str, Any]) -> SessionScope:
    return SessionScope(d["session_id"], d.get("agent_id"), d.get("org_id"), d.get("project_id"))


def from_dict(d: dict[str, Any], ts_us: int) -> Event:
    """Build the model of a dict the schema has already accepted."""
    kind = d["kind"]
    if kind == "search":
        return Search(
            d["event_id"],
            ts_us,
            _scope(d),
            d["query"],
            tuple(d["result_ids"]),
            d.get("source", "agent"),
        )
    if kind == "injection":
        return Injection(
            d["event_id"],
            ts_us,
            _scope(d),
            d["turn_id"],
            tuple(Observation(o["id"], o["content"]) for o in d["observations"]),
            tuple(d.get("graph_entity_ids") or ()),
            tuple(
                EdgeKey(e["source_id"], e["target_id"], e["relationship"])
                for e in d.get("graph_edge_keys") or ()
            ),
        )
    if kind == "response":
        return Response(d["event_id"], ts_us, _scope(d), d["turn_id"], d["text"])
    if kind == "session_outcome":
        return SessionOutcome(
            d["event_id"],
            ts_us,
            _scope(d),
            d["outcome"],
            tuple(ToolCall(t["tool"], t["success"], t.get("file")) for t in d["tool_calls"]),
            None if d.get("files_modified") is None else tuple(d["files_modified"]),
            tuple(SessionError(e["message"], e["tool"], e["recoverable"]) for e in d["errors"]),
            tuple(d.get("helpful_observation_ids") or ()),
            d.get("failure_context"),
        )
    if kind == "judgement":
        return Judgement(
            d["event_id"],
            ts_us,
            d["run_id"],
            d["question_id"],
            d["judge_correct"],
            tuple(d["gold_evidence_ids"]),
            tuple(d["retrieved_context_ids"]),
            d.get("condition", ""),
            d.get("repeat_index", 0),
            d.get("latency_ms"),
            d.get("tokens"),
        )
    if kind == "memory_written":
        return MemoryWritten(
            d["event_id"], ts_us, d["agent_id"], d["memory_id"], d.get("name"), d.get("store")
        )
    if kind == "memory_indexed":
        return MemoryIndexed(d["event_id"], ts_us, d["agent_id"], d["memory_id"], d.get("store"))
    if kind == "recall_probe":
        scores = d.get("scores")
        return RecallProbe(
            d["event_id"],
            ts_us,
            d["agent_id"],
            d["memory_id"],
            tuple(d["result_ids"]),
            None if scores is None else tuple(float(x) for x in scores),
            d.get("k", PROBE_K),
            float(d.get("threshold", PROBE_THRESHOLD)),
        )
    if kind == "ambient_context":
        return AmbientContext(
            d["event_id"], ts_us, d["agent_id"], d["session_id"], tuple(d["memory_ids"])
        )
    raise ValueError(f"unknown kind {kind!r}")


def _memory_dict(event: MemoryEvent, out: dict[str, Any]) -> dict[str, Any]:
    out["agent_id"] = event.agent_id
    if isinstance(event, AmbientContext):
        out.update(session_id=event.session_id, memory_ids=list(event.memory_ids))
        return out
    out["memory_id"] = event.memory_id
    if isinstance(event, MemoryWritten):
        for name in ("name", "store"):
            if getattr(event, name) is not None:
                out[name] = getattr(event, name)
    elif isinstance(event, MemoryIndexed):
        if event.store is not None:
            out["store"] = event.store
    else:
        out.update(result_ids=list(event.result_ids), k=event.k, threshold=event.threshold)
        if event.scores is not None:
            out["scores"] = list(event.scores)
    return out


def to_dict(event: Event) -> dict[str, Any]:
    """The wire form of a model (the inverse of :func:`from_dict`)."""
    out: dict[str, Any] = {"kind": event.kind, "event_id": event.event_id}
    out["ts"] = format_ts(event.ts_us)
    if isinstance(event, Judgement):
        out.update(
            run_id=event.run_id,
            question_id=event.question_id,
            condition=event.condition,
            repeat_index=event.repeat_index,
            judge_correct=event.judge_correct,
            gold_evidence_ids=list(event.gold_evidence_ids),
            retrieved_context_ids=list(event.retrieved_context_ids),
        )
        if event.latency_ms is not None:
            out["latency_ms"] = event.latency_ms
        if event.tokens is not None:
            out["tokens"] = event.tokens
        return out
    if isinstance(event, MemoryWritten | MemoryIndexed | RecallProbe | AmbientContext):
        return _memory_dict(event, out)
    scope = event.scope
    out["session_id"] = scope.session_id
    for name in ("agent_id", "org_id", "project_id"):
        value = getattr(scope, name)
        if value is not None:
            out[name] = value
    if isinstance(event, Search):
        out.update(query=event.query, result_ids=list(event.result_ids), source=event.source)
    elif isinstance(event, Injection):
        out.update(
            turn_id=event.turn_id,
            observations=[{"id": o.id, "content": o.content} for o in event.observations],
            graph_entity_ids=list(event.graph_entity_ids),
            graph_edge_keys=[
                {"source_id": e.source_id, "target_id": e.target_id, "relationship": e.relationship}
                for e in event.graph_edge_keys
            ],
        )
    elif isinstance(event, Response):
        out.update(turn_id=event.turn_id, text=event.text)
    else:
        out.update(
            outcome=event.outcome,
            tool_calls=[
                {"tool": t.tool, "success": t.success, **({"file": t.file} if t.file else {})}
                for t in event.tool_calls
            ],
            errors=[
                {"message": e.message, "tool": e.tool, "recoverable": e.recoverable}
                for e in event.errors
            ],
            helpful_observation_ids=list(event.helpful_observation_ids),
        )
        if event.files_modified is not None:
            out["files_modified"] = list(event.files_modified)
        if event.failure_context is not None:
            out["failure_context"] = event.failure_context
    return out
