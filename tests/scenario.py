"""A generated multi-session scenario that is really out of order (the event-time suite).

Hundreds of sessions spread over hours of event time, interleaved. The list it returns is
the *arrival* order (the order a file or a live producer publishes them in), and it differs
from event time on purpose:

- some events arrive far later than their ``ts`` (further than the turn TTL);
- some injections arrive after their session's outcome;
- some sessions report two outcomes, some none, some never search;
- some sessions span more event time than the turn TTL;
- some events are redelivered (the same event twice);
- observations are shared across sessions, and some stale ones make sessions fail, so
  misleading observations and weight steps happen, in an order the arrival scrambles.

Ties. A third of the sessions put many of their events on one instant: searches (a
followup's predecessor), a turn's two responses, two injections of a turn sharing a memory
(first-seen order), two outcomes (the last one). Their event ids count without padding,
some from 95, so their byte order differs from the order they were made in (``-99`` after
``-100``, ``-9`` after ``-10``): the contract takes equal ``ts`` in ``event_id`` byte order,
and the arrival order here is the order they were made in. Deterministic for a seed.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

T0 = datetime(2026, 11, 20, 6, 0, tzinfo=UTC)
WORDS = (
    "token refresh rotation cookie signing vault secret deploy rollback canary index rebuild "
    "query planner connection pool migration invoice webhook retry bundle hydration reranker "
    "embedding recall threshold latency budget schema version parser lexer cache eviction"
).split()


def _ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _sentence(r: random.Random, n: int) -> str:
    return " ".join(r.choice(WORDS) for _ in range(n))


def observations(r: random.Random, n: int) -> list[dict[str, str]]:
    return [
        {"id": f"obs_{i:03d}", "content": f"{_sentence(r, 8)}. Remember {_sentence(r, 5)}."}
        for i in range(n)
    ]


def generate(sessions: int = 300, seed: int = 11, agents: int = 0) -> list[dict[str, Any]]:
    """The scenario's events in arrival order (redeliveries included); with ``agents``, the
    recall pipeline events of that many agents interleaved (:func:`memory_events`)."""
    r = random.Random(seed)
    pool = observations(r, 60)
    stale = {o["id"] for o in pool[:6]}  # injecting one of these makes a session fail
    events: list[tuple[datetime, dict[str, Any]]] = []
    outcomes_of: dict[str, list[dict[str, Any]]] = {}
    for s in range(sessions):
        sid = f"ses_{s:04d}"
        agent = f"agent-{s % 5}"
        t = T0 + timedelta(seconds=r.uniform(0, 4 * 3600))
        scope = {"session_id": sid, "agent_id": agent, "org_id": f"org_{s % 3}"}
        ties = r.random() < 0.33  # many events on one instant, ids in another byte order
        n = r.choice([0, 95]) if ties else 0

        def add(
            kind: str,
            at: datetime,
            sid: str = sid,
            scope: dict = scope,
            ties: bool = ties,
            **fields: Any,
        ) -> dict[str, Any]:
            nonlocal n
            n += 1
            eid = f"{sid}-{n}" if ties else f"{sid}-{n:02d}"
            event = {"kind": kind, "event_id": eid, "ts": _ts(at), **scope, **fields}
            events.append((at, event))
            return event

        def step(seconds: float, ties: bool = ties) -> timedelta:
            """The time to the next event: none at all, often, in a session of ties."""
            if ties and r.random() < 0.4:
                return timedelta(0)
            return timedelta(seconds=seconds, microseconds=r.randint(1, 999))

        searches_on = r.random() > 0.1  # one session in ten never asks its memory
        used_stale = False
        query = _sentence(r, 3)
        for turn in range(r.randint(1, 4)):
            if r.random() < 0.25:
                t += timedelta(seconds=r.uniform(3700, 9000))  # a pause longer than the TTL
            if searches_on:
                for _ in range(r.randint(1, 3)):
                    t += step(r.uniform(1, 50))
                    roll = r.random()
                    if roll > 0.2:
                        query = _sentence(r, 3)  # else a retry of the same query
                    ids = [o["id"] for o in r.sample(pool, 3)] if roll < 0.93 else []
                    add(
                        "search",
                        t,
                        query=query,
                        result_ids=ids,
                        source="viewer" if 0.88 < roll < 0.93 else "agent",
                    )
            t += step(r.uniform(1, 5))
            injected = r.sample(pool, r.randint(1, 4))
            if r.random() < 0.3:
                injected[0] = r.choice(pool[:6])
            used_stale |= any(o["id"] in stale for o in injected)
            add(
                "injection",
                t,
                turn_id=f"t{turn}",
                observations=injected,
                graph_entity_ids=[f"node_{r.randrange(20)}"],
                graph_edge_keys=[
                    # the seed's spelling in some sessions: the same edge, the same key
                    {"sourceId": "node_a", "targetId": f"node_{turn}", "relationshipName": "USES"}
                    if s % 4 == 1
                    else {
                        "source_id": "node_a",
                        "target_id": f"node_{turn}",
                        "relationship": "USES",
                    }
                ],
            )
            if ties and r.random() < 0.3:  # a second injection at the same instant
                more = r.sample(pool, 2) + injected[:1]  # one memory of the first again
                add("injection", t, turn_id=f"t{turn}", observations=more,
                    graph_entity_ids=[f"node_{r.randrange(20)}"])  # fmt: skip
                injected = injected + more[:2]
            t += step(r.uniform(2, 60))
            parts = [o["content"] for o in injected if r.random() < 0.5] + [_sentence(r, 6)]
            add("response", t, turn_id=f"t{turn}", text=" ".join(parts))
            if ties and r.random() < 0.3:  # a second response at the same instant
                parts = [o["content"] for o in injected if r.random() < 0.5] + [_sentence(r, 6)]
                add("response", t, turn_id=f"t{turn}", text=" ".join(parts))
        if r.random() < 0.08:
            continue  # no outcome: the session stays open
        for _ in range(2 if r.random() < (0.3 if ties else 0.12) else 1):
            t += step(r.uniform(5, 600))
            failed = r.random() < (0.85 if used_stale else 0.25)
            result = r.choice(["rejected", "rework"]) if failed else "accepted"
            runner = r.choice(["pytest", "vitest", "edit"])
            outcome = add(
                "session_outcome",
                t,
                outcome=result,
                tool_calls=[{"tool": runner, "file": "src/a.py", "success": not failed}],
                files_modified=[] if r.random() < 0.1 else ["src/a.py"],
                errors=(
                    [
                        {
                            "message": r.choice(["lint failed", "it broke", "timeout"]),
                            "tool": runner,
                            "recoverable": False,
                        }
                    ]
                    if failed and r.random() < 0.6
                    else []
                ),
            )
            outcomes_of.setdefault(sid, []).append(outcome)
    events.sort(key=lambda te: te[0])
    arrival = _Order([e for _, e in events])
    by_id = {e["event_id"] for _, e in events}
    injections_of: dict[str, list[dict[str, Any]]] = {}
    for _, e in events:
        if e["kind"] == "injection":
            injections_of.setdefault(e["session_id"], []).append(e)

    def move_later(event: dict[str, Any], at_least: int, at_most: int) -> None:
        i = arrival.remove(event)
        arrival.insert(min(len(arrival), i + r.randint(at_least, at_most)), event)

    # late arrivals: moved well past the turn TTL (about 60 events per hour of event time)
    for event in r.sample(arrival.items(), len(arrival) // 12):
        move_later(event, 20, 400)
    # injections that arrive after their session's outcome
    for sid, outs in outcomes_of.items():
        if r.random() < 0.15:
            injections = arrival.in_order(injections_of.get(sid, []))
            if injections:
                late = r.choice(injections)
                arrival.remove(late)
                arrival.insert(arrival.index(outs[-1]) + 1 + r.randint(0, 30), late)
    # redeliveries
    for event in r.sample(arrival.items(), len(arrival) // 30):
        arrival.insert(r.randint(arrival.index(event) + 1, len(arrival)), dict(event))
    out = arrival.items()
    assert len(by_id) == len({e["event_id"] for e in out})
    if agents:
        for event in memory_events(random.Random(seed + 1), agents):
            out.insert(r.randint(0, len(out)), event)
    return out


class _Order:
    """The arrival order as a list would keep it (``index``, ``insert``, ``remove`` by
    position), each step in O(log n) instead of O(n): every event holds an exact fractional
    key, and the keys are kept sorted. An event is found by identity: each one placed here is
    an object of its own (a redelivery is a copy, placed after its original)."""

    def __init__(self, events: list[dict[str, Any]]):
        from sortedcontainers import SortedList

        self._keys = SortedList(Fraction(i) for i in range(len(events)))
        self._event = {Fraction(i): e for i, e in enumerate(events)}
        self._key = {id(e): Fraction(i) for i, e in enumerate(events)}

    def __len__(self) -> int:
        return len(self._keys)

    def items(self) -> list[dict[str, Any]]:
        return [self._event[k] for k in self._keys]

    def index(self, event: dict[str, Any]) -> int:
        return int(self._keys.index(self._key[id(event)]))

    def in_order(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``events`` (all placed) in their arrival order."""
        return sorted(events, key=lambda e: self._key[id(e)])

    def remove(self, event: dict[str, Any]) -> int:
        """Take ``event`` out; the position it had."""
        key = self._key.pop(id(event))
        i = int(self._keys.index(key))
        del self._keys[i]
        del self._event[key]
        return i

    def insert(self, i: int, event: dict[str, Any]) -> None:
        keys = self._keys
        if not keys:
            key = Fraction(0)
        elif i >= len(keys):
            key = keys[-1] + 1
        elif i <= 0:
            key = keys[0] - 1
        else:
            key = (keys[i - 1] + keys[i]) / 2
        keys.add(key)
        self._event[key] = event
        self._key[id(event)] = key


def memory_events(r: random.Random, agents: int) -> list[dict[str, Any]]:
    """The recall pipeline events of ``agents`` agents, in an arrival order of their own:
    indexes in time, late (past the 600 s deadline), before their write and never; probes
    (some twice), probes made from a task (``query_source`` task, from a random generator of
    their own so the rest stays as it was: they find their memory less often than the name
    probes, the query-formulation gap), ambient contexts (the latest counts), agents that
    break, redeliveries."""
    out: list[tuple[datetime, dict[str, Any]]] = []
    tasks = random.Random(str(r.getstate()[1][:4]))  # seeded by r's state, drawing nothing
    for a in range(agents):
        agent = f"mem-agent-{a}"
        stops = r.choice([None, None, 8, 0])  # healthy, healthy, stops halfway, never indexed
        n = 0

        def add(kind: str, at: datetime, agent: str = agent, **fields: Any) -> None:
            nonlocal n
            n += 1
            out.append((at, {"kind": kind, "event_id": f"{agent}-{n:03d}", "ts": _ts(at),
                             "agent_id": agent, **fields}))  # fmt: skip

        t = T0
        for m in range(16):
            mid = f"{agent}-ep-{m:02d}"
            t += timedelta(seconds=r.uniform(30, 900), microseconds=r.randint(1, 999))
            add("memory_written", t, memory_id=mid, name=f"episode {_sentence(r, 2)}")
            if stops is None or m < stops:
                roll = r.random()
                if roll < 0.75:
                    delay = r.uniform(0.5, 120)
                elif roll < 0.85:
                    delay = r.uniform(600, 2400)  # late: it counted as unindexed
                elif roll < 0.95:
                    delay = -r.uniform(0.5, 5)  # the index event's ts before the write's
                else:
                    delay = None  # this one never indexed
                if delay is not None:
                    add("memory_indexed", t + timedelta(seconds=delay), memory_id=mid)
            for _ in range(r.choice([0, 1, 1, 2])):
                ids = [f"{agent}-ep-{k:02d}" for k in r.sample(range(16), 4)]
                if r.random() < 0.6:
                    ids[r.randrange(4)] = mid
                scores = sorted((round(r.uniform(0.1, 0.9), 2) for _ in ids), reverse=True)
                add("recall_probe", t + timedelta(seconds=r.uniform(60, 9000)), memory_id=mid,
                    result_ids=ids, scores=scores if r.random() < 0.8 else None)  # fmt: skip
            for i in range(tasks.choice([0, 0, 1, 2])):
                ids = [f"{agent}-ep-{k:02d}" for k in tasks.sample(range(16), 4)]
                if tasks.random() < 0.3:
                    ids[tasks.randrange(4)] = mid
                else:
                    ids = [x for x in ids if x != mid]
                at = t + timedelta(seconds=tasks.uniform(60, 9000))
                out.append((at, {"kind": "recall_probe", "event_id": f"{mid}-task-{i}",
                                 "ts": _ts(at), "agent_id": agent, "memory_id": mid,
                                 "result_ids": ids, "query_source": "task"}))  # fmt: skip
        for _ in range(2):
            ids = [f"{agent}-ep-{k:02d}" for k in r.sample(range(20), 6)]  # some never written
            add("ambient_context", t + timedelta(seconds=r.uniform(0, 3600)),
                session_id=f"ambient-{agent}", memory_ids=ids)  # fmt: skip
    out.sort(key=lambda te: te[0])
    arrival = [e for _, e in out]
    for event in r.sample(arrival, len(arrival) // 8):  # late arrivals
        i = arrival.index(event)
        arrival.insert(min(len(arrival), i + r.randint(5, 60)), arrival.pop(i))
    for event in r.sample(arrival, len(arrival) // 20):  # redeliveries
        arrival.insert(r.randint(arrival.index(event) + 1, len(arrival)), dict(event))
    for e in arrival:  # no None scores on the wire: absent
        if "scores" in e and e["scores"] is None:
            del e["scores"]
    return arrival


def future_events(events: list[dict[str, Any]], n: int = 5, seed: int = 5) -> list[dict[str, Any]]:
    """A few events from a host whose clock is in 2099, for existing sessions."""
    r = random.Random(seed)
    out = []
    for i, base in enumerate(r.sample([e for e in events if e["kind"] == "search"], n)):
        event = dict(base, event_id=f"future-{i}", ts="2099-01-01T00:00:00.000Z")
        out.append(event)
    return out
