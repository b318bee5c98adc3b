"""Recall pipeline events for tests: one builder per kind, and four agents shaped like the
recall paper's table (healthy, never indexed, indexing stops halfway, repetitive names: one
daily note a day, so a probe's misses are aliased)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

T0 = datetime(2026, 11, 21, 9, 0, tzinfo=UTC)


def at(seconds: float) -> str:
    return (
        (T0 + timedelta(seconds=seconds)).isoformat(timespec="microseconds").replace("+00:00", "Z")
    )


def written(eid: str, s: float, mid: str, agent: str = "a1", name: str | None = None) -> dict:
    e = {"kind": "memory_written", "event_id": eid, "ts": at(s), "agent_id": agent,
         "memory_id": mid}  # fmt: skip
    if name is not None:
        e["name"] = name
    return e


def indexed(eid: str, s: float, mid: str, agent: str = "a1") -> dict:
    return {"kind": "memory_indexed", "event_id": eid, "ts": at(s), "agent_id": agent,
            "memory_id": mid, "store": "chroma"}  # fmt: skip


def probe(eid: str, s: float, mid: str, ids: list[str], scores: list[float] | None = None,
          agent: str = "a1") -> dict:  # fmt: skip
    e: dict[str, Any] = {"kind": "recall_probe", "event_id": eid, "ts": at(s), "agent_id": agent,
                         "memory_id": mid, "result_ids": ids}  # fmt: skip
    if scores is not None:
        e["scores"] = scores
    return e


def ambient(eid: str, s: float, ids: list[str], agent: str = "a1") -> dict:
    return {"kind": "ambient_context", "event_id": eid, "ts": at(s), "agent_id": agent,
            "session_id": "ses_1", "memory_ids": ids}  # fmt: skip


def paper_agents() -> list[dict[str, Any]]:
    """Four agents shaped like the paper's table, and the truths they should show."""
    events: list[dict[str, Any]] = []
    for n in range(10):  # healthy: every write indexed within seconds, every probe a hit
        events += [written(f"h-w{n}", n * 60, f"h{n}", "healthy"),
                   indexed(f"h-i{n}", n * 60 + 3, f"h{n}", "healthy"),
                   probe(f"h-p{n}", 3000 + n, f"h{n}", [f"h{n}"], [0.8], "healthy")]  # fmt: skip
        events.append(written(f"n-w{n}", n * 60, f"n{n}", "never"))  # never indexed
        events.append(written(f"s-w{n}", n * 60, f"s{n}", "stops"))  # stops halfway
        if n < 5:
            events.append(indexed(f"s-i{n}", n * 60 + 2, f"s{n}", "stops"))
        events += [written(f"r-w{n}", n * 60, f"r{n}", "repetitive", f"daily-2026-11-{n + 1:02d}.md"),
                   indexed(f"r-i{n}", n * 60 + 1, f"r{n}", "repetitive"),
                   probe(f"r-p{n}", 3000 + n, f"r{n}", ["r0", "r1", "r2"],
                         [0.5, 0.45, 0.4], "repetitive")]  # fmt: skip
    for agent in ("healthy", "never", "stops", "repetitive"):
        events.append(written(f"{agent}-late", 3600, f"{agent}-late", agent))
        events.append(ambient(f"{agent}-amb", 3601, [f"{agent[0]}8", f"{agent[0]}9"], agent))
    return events
