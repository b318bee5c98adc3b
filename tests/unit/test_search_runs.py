"""A run of one session's searches taken in one call (``Session.ingest_searches``, which the
session stage uses for a message's consecutive searches of one session) against the same
events taken one by one (``Session.ingest``): the same log, rows, counts, steps and derived
state, on every order of arrival, with redeliveries, reused ids, ties, late searches beyond
the retention, viewer and empty searches, and the turns and outcomes that send a search the
general way."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any
from unittest.mock import patch

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memdiag.contract import BAD_TS, LATE_EVENT, REUSED_EVENT_ID
from memdiag.contract.envelope import DictStore, InMessage, Output
from memdiag.schemas.models import Search, SessionEvent, from_dict
from memdiag.settings import Settings
from memdiag.streams.session.records import encode
from memdiag.streams.session.session import Config, Session
from memdiag.streams.stages.sessions import SessionStage
from tests.sizes import examples

MINUTE_US = 60_000_000
#: a short retention and window, so searches fall beyond them; a short turn TTL, so halves
#: wait past it
CONFIG = Config(window_us=2 * MINUTE_US, retention_us=10 * MINUTE_US, turn_ttl_us=5 * MINUTE_US)
T0 = "2026-11-21T10:"

KINDS = ["search"] * 6 + ["injection", "response", "outcome", "again"]


def _ts(seconds: int) -> str:
    """``seconds`` after 10:00 on the day; -1: the epoch itself (an event time of 0 µs,
    which the counters take as no time)."""
    if seconds < 0:
        return "1970-01-01T00:00:00Z"
    return f"{T0}{seconds // 60:02d}:{seconds % 60:02d}Z"


def _event(rng: random.Random, kind: str, eid: str, seconds: int) -> dict[str, Any]:
    base: dict[str, Any] = {"event_id": eid, "ts": _ts(seconds), "session_id": "s"}
    agent = rng.choice(["a1", "a2", None])
    if agent is not None:  # the session's scopes: some events name none
        base["agent_id"] = agent
    if kind == "search":
        ids = rng.sample(["o1", "o2", "o3", "o4"], rng.choice([0, 1, 2]))
        return {**base, "kind": "search", "query": rng.choice(["q1", "q2", " Q1", "q3"]),
                "result_ids": ids, "source": rng.choice(["agent", "agent", "viewer"])}  # fmt: skip
    if kind == "injection":
        obs = [{"id": o, "content": f"memory {o} about deployment"} for o in ("o1", "o2")]
        return {**base, "kind": "injection", "turn_id": rng.choice(["t1", "t2"]),
                "observations": obs}  # fmt: skip
    if kind == "response":
        return {**base, "kind": "response", "turn_id": rng.choice(["t1", "t2"]),
                "text": rng.choice(["memory about deployment", "unrelated"])}  # fmt: skip
    return {**base, "kind": "session_outcome", "outcome": rng.choice(["accepted", "rejected"]),
            "tool_calls": [], "files_modified": ["a.py"], "errors": []}  # fmt: skip


def _events(seed: int, n: int) -> list[SessionEvent]:
    """``n`` events of one session, in a random order of arrival: most of them searches,
    ids from a small pool (reused for other content), some sent again as they were."""
    rng = random.Random(seed)
    made: list[dict[str, Any]] = []
    for _ in range(n):
        kind = rng.choice(KINDS)
        if kind == "again" and made:
            made.append(rng.choice(made))  # a redelivery
            continue
        eid = f"e{rng.randrange(n)}"  # a pool of ids: some reused by other events
        seconds = -1 if rng.random() < 0.03 else rng.randrange(40 * 60)
        made.append(_event(rng, "search" if kind == "again" else kind, eid, seconds))
    return [from_dict(e) for e in made]  # type: ignore[misc]


def _state(s: Session) -> tuple[Any, ...]:
    """What a session derives from its log, beside the log itself."""
    return (
        encode(s.records),
        s._seq_of,
        s._first_seq,
        s.clock,
        s.history.entries,
        s.history.evaluated,
        s.history.followups,
        s.empty_agent_searches,
        s.outcome_seq,
        s.scopes,
        sorted(s._pending_turns),
        s.diagnostic() if s.closed else None,
    )


def _run(events: list[SessionEvent], cuts: list[int], together: bool) -> tuple[Any, ...]:
    """Every event into one session, in messages cut at ``cuts``; in each message a run of
    consecutive searches taken in one call (``together``) or each by ``ingest``."""
    s = Session("s", 0, CONFIG)
    outs: list[Output] = []
    differing: list[tuple[int, tuple[str, ...]]] = []
    bounds = [0, *sorted(set(cuts)), len(events)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        out = Output()
        i = lo
        while i < hi:
            j = i
            while together and j < hi and type(events[j]) is Search:
                j += 1
            if j > i:
                run = [e for e in events[i:j] if isinstance(e, Search)]
                found, newest = s.ingest_searches(run, 1_000, out)
                differing += [(i + pos, d) for pos, d in found]
                applied = [e.ts_us for pos, e in enumerate(run) if pos not in dict(found)]
                assert newest == max(applied, default=0)
                i = j
                continue
            d = s.ingest(events[i], 1_000, out)
            if d:
                differing.append((i, d))
            i += 1
        outs.append(out)
    return outs, differing, _state(s)


@settings(max_examples=examples(300), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(st.integers(0, 1_000_000), st.integers(1, 40), st.lists(st.integers(0, 40), max_size=6))
def test_a_run_of_searches_gives_what_each_search_one_by_one_gives(
    seed: int, n: int, cuts: list[int]
) -> None:
    events = _events(seed, n)
    cuts = [c for c in cuts if c < n]
    assert _run(events, cuts, together=True) == _run(events, cuts, together=False)


def _way(s: Session, e: Search) -> str:
    """The way ``ingest_searches`` takes a search, read off the session before it."""
    if e.event_id in s._seq_of:
        return "known"  # a redelivery or a reused id: ingest
    if s.outcome_seq is not None:
        return "closed"  # ingest: the session diagnostic is sent again
    if s._pending_turns:
        return "waiting"  # ingest: a half may pass the turn TTL
    if e.source != "agent" or not e.result_ids:
        return "unevaluated"
    ts = e.ts_us
    if ts < max(s.clock, ts) - CONFIG.retention_us:
        return "late"  # _search: beyond the retention
    entries = s.history.entries
    if entries and (ts, e.event_id) <= entries[-1].order:
        return "before"  # _search: its successor corrected
    return "usual"


def test_the_generated_events_take_every_way_a_search_can_go() -> None:
    """The property above is not vacuous: its events reach the loop's usual search and
    each way to the general one."""
    reached: dict[str, int] = {}
    for seed in range(300):
        s = Session("s", 0, CONFIG)
        for e in _events(seed, 30):
            if isinstance(e, Search):
                way = _way(s, e)
                reached[way] = reached.get(way, 0) + 1
                s.ingest_searches([e], 1_000, Output())
            else:
                s.ingest(e, 1_000, Output())
    ways = {"known", "closed", "waiting", "unevaluated", "late", "before", "usual"}
    assert set(reached) == ways, reached


# -- the stage: runs against one by one ------------------------------------------------------

#: where each session's state lives: s4 on another partition (its events re-routed)
_PARTITION = {"s1": 0, "s2": 0, "s3": 0, "s4": 1}
#: every message published after every event (none is from the future)
_PUBLISHED_MS = 1_795_392_000_000  # 2026-11-22T...


def _one_by_one(
    self: Session, events: list[Search], published_ms: int, out: Output
) -> tuple[list[tuple[int, tuple[str, ...]]], int]:
    """What ``ingest_searches`` must equal: ``ingest`` of each search in turn."""
    differing = []
    newest = 0
    for pos, event in enumerate(events):
        differs = self.ingest(event, published_ms, out)
        if differs:
            differing.append((pos, differs))
        else:
            newest = max(newest, event.ts_us)
    return differing, newest


def _stage_messages(seed: int) -> list[list[InMessage]]:
    """Batches of messages, each an array of events of four sessions (s3 forgotten, s4 on
    another partition), searches mostly, ids reused and events sent again."""
    rng = random.Random(seed)
    pool = rng.randrange(5, 60)
    made: list[dict[str, Any]] = []
    batches, offset = [], 0
    for _ in range(rng.randrange(1, 5)):
        batch = []
        for _ in range(rng.randrange(1, 4)):
            events = []
            for _ in range(rng.randrange(1, 12)):
                if made and rng.random() < 0.1:
                    events.append(dict(rng.choice(made)))  # a redelivery
                    continue
                kind = rng.choice(KINDS[:-1])
                seconds = -1 if rng.random() < 0.03 else rng.randrange(40 * 60)
                event = _event(rng, kind, f"e{rng.randrange(pool)}", seconds)
                event["session_id"] = rng.choice(["s1", "s1", "s2", "s3", "s4"])
                events.append(event)
            made += events
            batch.append(InMessage(SETTINGS.topics.events, 0, offset, None,
                                   orjson.dumps(events), _PUBLISHED_MS + offset))  # fmt: skip
            offset += 1
        batches.append(batch)
    return batches


def _stage(batches: list[list[InMessage]], settings: Settings) -> tuple[Any, ...]:
    """The session stage over ``batches``: every output (re-routed events as bytes), the
    state it writes and each held session's processing time."""
    stage = SessionStage(settings, _PARTITION.__getitem__)
    load = stage.states.load
    stage.states.load = lambda sid, p, store: None if sid == "s3" else load(sid, p, store)  # type: ignore[method-assign]
    store = DictStore()
    outs = []
    for batch in batches:
        out = stage.process(batch, store)
        out.reroute = [(k, orjson.dumps(v), t) for k, v, t in out.reroute]
        outs.append(out)
    seen = {sid: s.last_seen_ms for sid, s in stage._held.items()}
    stage.settle(store)
    return outs, store.data, seen


SETTINGS = Settings()


class _NotASearch:
    """In the stage's place of ``Search``: no event is one, so the stage makes no run and
    takes every event through its one-by-one way."""


@settings(max_examples=examples(150), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(st.integers(0, 1_000_000), st.booleans())
def test_the_stage_gives_with_runs_what_it_gives_one_by_one(seed: int, store_text: bool) -> None:
    """The stage's runs against its one-by-one way (every event through ``ingest``): runs
    closed by another session, another kind or a re-routed event, forgotten sessions, dead
    letters in order, ``last_seen_ms`` and ``ts_us``; with and without
    MEMDIAG_STORE_TEXT. And the runs with ``ingest_searches`` against the runs with
    ``ingest`` of each search."""
    batches = _stage_messages(seed)
    config = SETTINGS.with_(store_text=store_text)
    with_runs = _stage(batches, config)
    with patch("memdiag.streams.stages.sessions.Search", _NotASearch):
        assert _stage(batches, config) == with_runs
    with patch.object(Session, "ingest_searches", _one_by_one):
        assert _stage(batches, config) == with_runs


def test_the_stage_messages_reach_every_way() -> None:
    """The property above is not vacuous: its messages make rows, re-routes, reused-id and
    late-event dead letters (and no event is refused as from the future)."""
    reached: Counter[str] = Counter()
    for seed in range(60):
        outs, _, _ = _stage(_stage_messages(seed), SETTINGS)
        for out in outs:
            reached["rows"] += sum(map(len, out.diagnostics.values()))
            reached["rerouted"] += len(out.reroute)
            reached.update(d["reason"] for _, d in out.deadletters)
    assert {"rows", "rerouted", REUSED_EVENT_ID, LATE_EVENT} <= set(reached), reached
    assert BAD_TS not in reached, reached
