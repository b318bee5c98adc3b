"""Hostile input, generated: what a broken or malicious producer publishes.

Each item says what the worker must do with it: ``reason`` is the dead-letter reason it must
get (exactly one dead letter each), or ``None`` for input that looks hostile but is valid
(SQL in an id, an escaped NUL in a query, deep nesting in an ignored field) and must be
processed like any other event. Used by the unit fuzz (the in-memory worker) and by the
chaos suite (a real broker).
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson

from tests.scenario import generate

MIB = 1024 * 1024


@dataclass(frozen=True)
class Whole:
    """A whole message's bytes."""

    payload: bytes
    reason: str


@dataclass(frozen=True)
class Element:
    """A JSON value that can stand alone or sit in a batch among valid events."""

    value: Any
    reason: str | None


def _search(sid: str, eid: str, **over: Any) -> dict[str, Any]:
    e = {
        "kind": "search",
        "event_id": eid,
        "ts": "2026-11-20T07:00:00.000Z",
        "session_id": sid,
        "query": "auth flow",
        "result_ids": ["o1"],
    }
    e.update(over)
    return {k: v for k, v in e.items() if v is not ...}


def _nest(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def whole_messages(r: random.Random, n: int) -> list[Whole]:
    """Messages that are no JSON event at all."""
    makers = [
        lambda i: Whole(
            b'{"kind":"search","event_id":"t' + str(i).encode() + b'","ts":', "not_json"
        ),
        lambda i: Whole(b"\xff\xfe\xfa" + str(i).encode(), "not_json"),  # invalid UTF-8
        lambda i: Whole(b"[" * (1100 + i % 50) + b"]" * (1100 + i % 50), "not_json"),  # > 1024
        lambda i: Whole(b'{"kind":"search","n":1e400,"i":' + str(i).encode() + b"}", "not_json"),
        lambda i: Whole(b'{"kind":"search","n":NaN,"i":' + str(i).encode() + b"}", "not_json"),
        lambda i: Whole(
            b'{"kind":"search","query":"a\x00b","i":' + str(i).encode() + b"}", "not_json"
        ),
        lambda i: Whole(b" " * (MIB + 10) + str(i).encode(), "too_large"),
        lambda i: Whole(str(i).encode(), "not_an_event"),
        lambda i: Whole(b"", "not_json"),
    ]
    return [r.choice(makers)(i) for i in range(n)]


def elements(r: random.Random, n: int, prefix: str = "h") -> list[Element]:
    """Values that are bad events (each with its reason), or valid ones that look hostile."""
    sid = f"{prefix}-ses"

    def make(i: int) -> Element:
        eid = f"{prefix}-{i}"
        # distinct event times: equal ones keep their arrival order, which the mixing shuffles
        ts = f"2026-11-20T07:{i // 60 % 60:02d}:{i % 60:02d}.{i // 3600 % 1000:03d}Z"
        choice = r.randrange(19)
        if choice == 0:
            return Element([[_nest(300 + i % 500)]], "not_an_event")  # deep; alone, a batch of one
        if choice == 1:
            return Element(
                _search(sid, eid, failure_context=...)
                | {
                    "kind": "session_outcome",
                    "outcome": "rejected",
                    "tool_calls": [],
                    "files_modified": [],
                    "errors": [],
                    "failure_context": _nest(100 + i % 150),
                },
                "bad_value",
            )
        if choice == 2:
            return Element(_search(sid, eid, result_ids="o1"), "wrong_type")
        if choice == 3:
            return Element(_search(sid, eid, session_id=5), "wrong_type")
        if choice == 4:
            return Element(_search(sid, eid, ts="2026-02-30T10:00:00Z"), "bad_ts")
        if choice == 5:
            return Element(_search(sid, eid, ts="2031-01-01T00:00:00Z"), "bad_ts")  # future
        if choice == 6:
            return Element(_search(sid, eid, query=...), "missing_field")
        if choice == 7:
            return Element(_search(sid, "x" * 129), "id_too_long")
        if choice == 8:
            return Element(_search(sid, eid, kind="drop_table"), "unknown_kind")
        if choice == 9:
            return Element(_search(sid, eid, ts=1e308), "wrong_type")
        if choice == 10:
            return Element(_search(sid, eid, query="x" * (MIB + 1)), "too_large")
        if choice == 11:
            return Element("'; DROP TABLE searches; --", "not_an_event")
        if choice == 12:  # valid: SQL in ids
            sql = _search(f"{sid}'); DROP TABLE searches;--", f"{eid}' OR 1=1 --", ts=ts)
            return Element(sql, None)
        if choice == 13:  # valid: an escaped NUL in the query
            return Element(_search(f"{sid}-nul", eid, query="auth\u0000flow", ts=ts), None)
        if choice == 14:  # valid: deep nesting in an unknown (ignored) field
            return Element(_search(f"{sid}-deep", eid, extra=_nest(200 + i % 300), ts=ts), None)
        if choice == 15:  # an enum's value nested deep: its detail must not repr it
            return Element(_search(sid, eid, source=_nest(900 + i % 100)), "bad_value")
        if choice == 16:  # RFC 3339, but before year 1 in UTC
            return Element(_search(sid, eid, ts="0001-01-01T00:00:00+01:00"), "bad_ts")
        if choice == 17:  # a kind nested deep
            return Element(_search(sid, eid, kind=_nest(600)), "wrong_type")
        return Element(_search(sid, eid, source="admin"), "bad_value")

    return [make(i) for i in range(n)]


def encode(value: Any) -> bytes:
    """JSON bytes of an element, however deep (orjson stops at 254 levels)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        import json
        import sys

        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20_000))
        try:
            return json.dumps(value, separators=(",", ":")).encode()
        finally:
            sys.setrecursionlimit(limit)


def mixed(
    seed: int, n: int, sessions: int = 40
) -> tuple[list[tuple[str | None, Any]], list[dict], Counter[str]]:
    """A clean scenario with ``n`` hostile inputs mixed in: alone, as whole messages, or as
    elements of batches beside valid events. Returns the messages, the valid events and the
    dead-letter reasons expected."""
    r = random.Random(seed)
    clean = generate(sessions=sessions, seed=seed)
    bad = whole_messages(r, n // 3) + elements(r, n - n // 3, prefix=f"h{seed}")
    r.shuffle(bad)
    valid = list(clean)
    expected: Counter[str] = Counter()
    messages: list[tuple[str | None, Any]] = []
    pending = list(clean)
    for item in bad:
        if isinstance(item, Whole):
            messages.append((None, item.payload))
            expected[item.reason] += 1
            continue
        if item.reason is None:
            valid.append(item.value)
        else:
            expected[item.reason] += 1
        if r.random() < 0.4 and pending:  # inside a batch, beside a few valid events
            batch = [pending.pop() for _ in range(min(len(pending), r.randint(1, 3)))]
            key = r.choice([None, batch[0]["session_id"]])  # keyed by a valid event's session
            batch.insert(r.randrange(len(batch) + 1), item.value)
            messages.append((key, batch))
        else:
            key = item.value.get("session_id") if isinstance(item.value, dict) else None
            messages.append((key if isinstance(key, str) else None, item.value))
    messages += [(e["session_id"], e) for e in pending]
    r.shuffle(messages)
    return messages, valid, expected
