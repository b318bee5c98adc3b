"""Recall pipeline events for tests: one builder per kind, and five agents shaped like the
recall paper (its table's four: healthy, never indexed, indexing stops halfway, repetitive
names: one daily note a day, so a probe's misses are aliased; and its query-formulation
failure: self-authored rules their names find and a task's words do not)."""

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
          agent: str = "a1", source: str | None = None) -> dict:  # fmt: skip
    """A recall probe; ``source`` its ``query_source`` (absent: a name probe, the default)."""
    e: dict[str, Any] = {"kind": "recall_probe", "event_id": eid, "ts": at(s), "agent_id": agent,
                         "memory_id": mid, "result_ids": ids}  # fmt: skip
    if scores is not None:
        e["scores"] = scores
    if source is not None:
        e["query_source"] = source
    return e


def task_probe(eid: str, s: float, mid: str, ids: list[str], scores: list[float] | None = None,
               agent: str = "a1") -> dict:  # fmt: skip
    """A probe whose query was made from a task the memory should serve."""
    return probe(eid, s, mid, ids, scores, agent, source="task")


def ambient(eid: str, s: float, ids: list[str], agent: str = "a1") -> dict:
    return {"kind": "ambient_context", "event_id": eid, "ts": at(s), "agent_id": agent,
            "session_id": "ses_1", "memory_ids": ids}  # fmt: skip


def paper_agents() -> list[dict[str, Any]]:
    """Five agents shaped like the paper, and the truths they should show: its table's four,
    and ``clinical``, whose five rules are each found by a probe made from its name (one
    explicitly ``name``) and one of five by a probe made from a clinical presentation (c0's
    first task probe missed, its latest hit; the others' task probes miss)."""
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
    rules = ("gout-urate-target", "af-anticoagulation", "hyperkalaemia-ecg", "sepsis-lactate",
             "dka-potassium")  # fmt: skip
    others = [f"c{n}" for n in range(5)]
    for n, rule in enumerate(rules):
        mid, instead = f"c{n}", [o for o in others if o != f"c{n}"][:3]
        events += [written(f"c-w{n}", n * 60, mid, "clinical", f"{rule}-rule.md"),
                   indexed(f"c-i{n}", n * 60 + 2, mid, "clinical"),
                   probe(f"c-p{n}", 3000 + n, mid, [mid, *instead], [0.82, 0.4, 0.3, 0.2],
                         "clinical", source="name" if n == 0 else None),
                   task_probe(f"c-t{n}", 3100 + n, mid, [*instead, mid],
                              [0.7, 0.6, 0.5, 0.3], "clinical")]  # fmt: skip
    events.append(task_probe("c-t0-again", 3200, "c0", ["c0", "c1"], [0.66, 0.5], "clinical"))
    return events
