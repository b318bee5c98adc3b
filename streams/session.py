"""What a session's diagnostic is built from (CONTRACT section 3, "Session diagnostic").

:class:`SessionAggregate` folds a session's events, in arrival order, into what its
``session_diagnostic`` needs: the distinct injected observation ids, graph entity ids and
edge keys (first-seen order), the agent searches and followups, and each observation's
used/ignored verdicts over the evaluated turns. :func:`draft_diagnostic` turns it and a
``session_outcome`` into the record; only ``misleading_observation_ids`` is missing, as it
depends on other sessions (the observation owners answer it, see ``streams.processor``).

Redelivery. Every event a session folds is remembered by an 8-byte digest of its
``event_id``, so a redelivered or replayed event changes no count.

Pure code: no Faust, no Kafka.
"""

from __future__ import annotations

import hashlib
from typing import Any

from schemas.models import SessionOutcome, format_ts
from streams.diagnosis import ACCEPTED, failure_category
from streams.followup import SearchHistory


def digest(event_id: str) -> str:
    return hashlib.blake2b(event_id.encode("utf-8"), digest_size=8).hexdigest()


class SessionAggregate:
    """Search and followup counts are kept by the session's ``SearchHistory`` (which already
    recognises a redelivered search); this keeps only the agent searches it does not see,
    the ones that returned nothing."""

    __slots__ = ("observations", "entities", "edges", "empty_searches", "seen")

    def __init__(
        self,
        observations: dict[str, list[int]] | None = None,
        entities: list[str] | None = None,
        edges: list[list[str]] | None = None,
        empty_searches: list[str] | None = None,
        seen: list[str] | None = None,
    ):
        #: observation id -> [evaluated turns, turns judged used]; insertion = first seen
        self.observations: dict[str, list[int]] = observations or {}
        self.entities: dict[str, None] = dict.fromkeys(entities or ())
        self.edges: dict[tuple[str, str, str], None] = {
            (e[0], e[1], e[2]): None for e in (edges or ())
        }
        #: digests of agent searches without results (not evaluated, not remembered)
        self.empty_searches: set[str] = set(empty_searches or ())
        self.seen: set[str] = set(seen or ())  # digests of injection/response/outcome ids

    def first_time(self, event_id: str) -> bool:
        """True (and remember it) the first time an event is folded into the session."""
        d = digest(event_id)
        if d in self.seen:
            return False
        self.seen.add(d)
        return True

    def injection(
        self,
        observation_ids: list[str],
        entity_ids: tuple[str, ...],
        edges: list[tuple[str, str, str]],
    ) -> None:
        for obs_id in observation_ids:
            self.observations.setdefault(obs_id, [0, 0])
        self.entities.update(dict.fromkeys(entity_ids))
        self.edges.update(dict.fromkeys(edges))

    def feedback(self, observation_id: str, used: bool) -> None:
        counts = self.observations.setdefault(observation_id, [0, 0])
        counts[0] += 1
        counts[1] += int(used)

    def empty_search(self, event_id: str) -> None:
        self.empty_searches.add(digest(event_id))

    def ignored_observation_ids(self) -> list[str]:
        """Injected observations judged ``ignored`` in every evaluated turn (at least one)."""
        return [o for o, (evaluated, used) in self.observations.items() if evaluated and not used]

    def to_state(self) -> list[Any]:
        return [
            self.observations,
            list(self.entities),
            [list(e) for e in self.edges],
            list(self.empty_searches),
            list(self.seen),
        ]

    @classmethod
    def from_state(cls, state: list[Any] | None) -> SessionAggregate:
        if not state:
            return cls()
        return cls(*state)


def draft_diagnostic(
    agg: SessionAggregate, searches: SearchHistory, event: SessionOutcome
) -> dict[str, Any]:
    """The ``session_diagnostic`` record, ``misleading_observation_ids`` not yet known.

    ``accepted`` sessions get the light record: no tool calls, files or errors (NULL).
    """
    failed = event.outcome != ACCEPTED
    scope = event.scope
    record: dict[str, Any] = {
        "kind": "session_diagnostic",
        "event_id": event.event_id,
        "session_id": scope.session_id,
        "outcome": event.outcome,
        "failure_category": None,
        "failure_context": event.failure_context,
        "injected_observation_ids": list(agg.observations),
        "injected_graph_entity_ids": list(agg.entities),
        "injected_graph_edge_keys": [
            {"source_id": s, "target_id": t, "relationship": r} for s, t, r in agg.edges
        ],
        "tool_call_summary": None,
        "files_modified": None,
        "errors_encountered": None,
        "helpful_observation_ids": list(event.helpful_observation_ids),
        "misleading_observation_ids": [],
        "ignored_observation_ids": agg.ignored_observation_ids(),
        "search_count": searches.evaluated + len(agg.empty_searches),
        "followup_count": searches.followups,
        "ts": format_ts(event.ts_us),
        "agent_id": scope.agent_id,
        "org_id": scope.org_id,
        "project_id": scope.project_id,
    }
    if failed:
        record["failure_category"] = failure_category(
            ((c.tool, c.success) for c in event.tool_calls),
            [e.message for e in event.errors],
            event.files_modified,
        )
        record["tool_call_summary"] = [
            {"tool": c.tool, "file": c.file, "success": c.success} for c in event.tool_calls
        ]
        record["files_modified"] = list(event.files_modified)
        record["errors_encountered"] = [
            {"message": e.message, "tool": e.tool, "recoverable": e.recoverable}
            for e in event.errors
        ]
    return record
