"""A small agent runtime that publishes memdiag's events, typed end to end.

`mypy --strict` passes on it against the installed wheel (tests/unit/test_packaging.py), so
it is also the check that `memdiag.client` and `memdiag.events` are typed for a producer.

    MEMDIAG_BROKER=kafka://127.0.0.1:9092 python examples/runtime/typed_runtime.py
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from memdiag.client import FlushTimeout, Publisher, PublisherStats
from memdiag.events import (
    InjectionEvent,
    Observation,
    ResponseEvent,
    SearchEvent,
    SessionOutcomeEvent,
)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def event_id() -> str:
    return uuid.uuid4().hex


def one_session(publisher: Publisher, session_id: str) -> None:
    memories: list[Observation] = [
        {"id": "obs_auth_rotation", "content": "Rotate the signing key before the token expires"},
    ]
    search: SearchEvent = {
        "kind": "search", "event_id": event_id(), "ts": now(), "session_id": session_id,
        "agent_id": "coder", "query": "token rotation", "result_ids": [m["id"] for m in memories],
    }  # fmt: skip
    injection: InjectionEvent = {
        "kind": "injection", "event_id": event_id(), "ts": now(), "session_id": session_id,
        "agent_id": "coder", "turn_id": "t1", "observations": memories,
    }  # fmt: skip
    response: ResponseEvent = {
        "kind": "response", "event_id": event_id(), "ts": now(), "session_id": session_id,
        "agent_id": "coder", "turn_id": "t1",
        "text": "I will rotate the signing key before the token expires.",
    }  # fmt: skip
    outcome: SessionOutcomeEvent = {
        "kind": "session_outcome", "event_id": event_id(), "ts": now(),
        "session_id": session_id, "agent_id": "coder", "outcome": "rework",
        "tool_calls": [{"tool": "ruff", "success": False}],
        "files_modified": ["auth/keys.py"],
        "errors": [{"message": "E501 Line too long", "tool": "ruff", "recoverable": True}],
    }  # fmt: skip
    for event in (search, injection, response, outcome):
        kept: bool = publisher.publish(event)
        if not kept:
            print("the publisher's buffer is full: an event was dropped (counted in stats)")


def main() -> None:
    # wait_for_broker=None: start at once, keep events until the broker answers
    with Publisher(wait_for_broker=None) as publisher:
        one_session(publisher, f"session-{event_id()[:8]}")
        try:
            publisher.flush(timeout=10)
        except FlushTimeout as late:
            print(f"{late.held} events wait for the broker: {late}")
        stats: PublisherStats = publisher.stats()
        print(f"{stats.delivered} of {stats.events} events delivered, {stats.dropped} dropped")


if __name__ == "__main__":
    main()
