"""Recall pipeline health (docs/rules.md): the rules as pure functions, the stage over a dict
store, and the same tables from the same events in any order, batching, duplicates and
killed workers (the whole worker in memory, ``tests.inmemory.World``), against the
independent reference (``tests.reference.pipeline_reference``)."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.analytics.sink import DuckDBSink
from memdiag.contract import (
    INDEXED,
    NOT_WRITTEN,
    PENDING,
    PIPELINE_BREAK,
    PIPELINE_RECOVERED,
    RECALL_PROBES,
    UNINDEXED,
    UNINDEXED_MEMORIES,
)
from memdiag.contract.envelope import DictStore, InMessage
from memdiag.settings import Settings
from memdiag.streams.agent import break_since, ever_unindexed, probe_verdict, status
from memdiag.streams.stages.recall import RecallStage
from tests.compare import differences, from_duckdb, from_reference
from tests.inmemory import World
from tests.recall_scenario import ambient, at, indexed, paper_agents, probe, written
from tests.reference import parse, pipeline_reference
from tests.sizes import examples

TOPIC = "memdiag.memory"
#: the Kafka timestamp of every message: far after every ts, so none is "in the future"
PUBLISHED_MS = 4_102_444_800_000
DEADLINE_MS = 600_000


class Run:
    """The stage over a dict store; the records it sent, folded as the sink folds them."""

    def __init__(self, deadline_s: float = 600.0):
        self.stage = RecallStage(Settings(index_deadline_seconds=deadline_s), lambda a: 0)
        self.store = DictStore()
        self.memories: dict[tuple[str, str], dict[str, Any]] = {}
        self.probes: dict[str, dict[str, Any]] = {}
        self.agents: dict[str, dict[str, Any]] = {}
        self.contexts: dict[str, dict[str, Any]] = {}
        self.transitions: list[dict[str, Any]] = []
        self.episodes: dict[tuple[str, str], dict[str, Any]] = {}
        self.counts: Counter[Any] = Counter()
        self.minutes: Counter[tuple[str, int]] = Counter()  # (counter, minute µs) -> value
        self.deadletters: list[dict[str, Any]] = []
        self.records: list[dict[str, Any]] = []
        self.offset = 0

    def send(self, *batches: list[dict[str, Any]]) -> Run:
        """Each batch is one stage batch; each event its own message."""
        for batch in batches:
            msgs = []
            for e in batch:
                msgs.append(InMessage(TOPIC, 0, self.offset, None, orjson.dumps(e), PUBLISHED_MS))
                self.offset += 1
            self._deliver(msgs)
        return self

    def _deliver(self, msgs: list[InMessage]) -> None:
        if msgs:
            out = self.stage.process(msgs, self.store)
            self.counts.update(out.counts)
            for (key, minute), (value, _) in out.by_minute.items():
                self.minutes[(key[0], minute)] += value
            self.deadletters += [r for _, r in out.deadletters]
            for records in out.diagnostics.values():
                for r in records:
                    self.records.append(r)
                    if r["kind"] == "memory_pipeline":
                        self.memories[(r["agent_id"], r["memory_id"])] = r
                    elif r["kind"] == "recall_probe":
                        self.probes[r["event_id"]] = r
                    elif r["kind"] == "pipeline_agent":
                        self.agents[r["agent_id"]] = r
                    elif r["kind"] == "ambient_context":
                        self.contexts[r["event_id"]] = r
                    else:
                        self.transitions.append(r)
                        self._episode(r)

    def _episode(self, r: dict[str, Any]) -> None:
        """``pipeline_breaks`` as the sink folds the transitions: a break sets all but
        ``recovered_at``, a recovery sets all."""
        row = self.episodes.setdefault((r["agent_id"], r["episode"]), {})
        row.update(since=r["since"], broken_at=r["broken_at"], oldest=r["oldest_memory_id"],
                   unindexed=r["unindexed"])  # fmt: skip
        if r["kind"] == PIPELINE_RECOVERED:
            row["recovered_at"] = r["recovered_at"]

    def rows_of(self, agent: str) -> list[dict[str, Any]]:
        return [m for (a, _), m in self.memories.items() if a == agent]

    def unindexed_counted(self, agent: str = "a1") -> int:
        return self.counts[(UNINDEXED_MEMORIES, (("agent_id", agent),))]


def us(ts: str | None) -> int | None:
    return None if ts is None else parse(ts)


# -- the rules, pure ----------------------------------------------------------------------


def test_a_probe_hits_in_the_first_k_at_or_above_the_threshold() -> None:
    ids = ["x", "m", "y", "z"]
    assert probe_verdict("m", ids, [0.9, 0.52, 0.4, 0.3], 3, 0.35) == (True, 2, 0.52)
    assert probe_verdict("m", ids, [0.9, 0.35, 0.4, 0.3], 3, 0.35) == (True, 2, 0.35)
    assert probe_verdict("m", ids, [0.9, 0.34, 0.4, 0.3], 3, 0.35) == (False, 2, 0.34)
    assert probe_verdict("z", ids, [0.9, 0.8, 0.7, 0.6], 3, 0.35) == (False, 4, 0.6)
    assert probe_verdict("z", ids, None, 4, 0.35) == (True, 4, None)  # rank alone
    assert probe_verdict("q", ids, None, 3, 0.35) == (False, None, None)
    assert probe_verdict("m", [], None, 3, 0.35) == (False, None, None)


def test_the_deadline_is_exceeded_in_whole_milliseconds() -> None:
    w = parse(at(0))
    assert status(w, None, w + DEADLINE_MS * 1000, DEADLINE_MS) == PENDING  # exactly: not over
    assert status(w, None, w + DEADLINE_MS * 1000 + 999, DEADLINE_MS) == PENDING  # same ms
    assert status(w, None, w + (DEADLINE_MS + 1) * 1000, DEADLINE_MS) == UNINDEXED
    assert status(w, w + 10**9, w + 10**12, DEADLINE_MS) == INDEXED  # indexed late: indexed
    assert status(None, w, w, DEADLINE_MS) == NOT_WRITTEN
    # ever unindexed follows from indexed_at - written_at, not from when the index came
    assert not ever_unindexed(w, w + DEADLINE_MS * 1000, w + 10**12, DEADLINE_MS)
    assert ever_unindexed(w, w + (DEADLINE_MS + 1) * 1000, w + 10**12, DEADLINE_MS)
    assert not ever_unindexed(None, w, w, DEADLINE_MS)


def test_the_break_rule() -> None:
    assert break_since(None, None) is None
    assert break_since(100, None) == 100  # never indexed anything
    assert break_since(100, 99) == 100  # nothing indexed since the oldest unindexed write
    assert break_since(100, 100) is None  # an index since: the indexer runs, this one missed


# -- the stage ----------------------------------------------------------------------------


def test_the_contract_example() -> None:
    events = [
        written("mw-0001", 0, "ep-boot", name="cold-start-bootstrap"),
        indexed("mi-0001", 31.5, "ep-boot"),
        probe("rp-0001", 3600, "ep-boot", ["ep-deploy", "ep-boot"], [0.61, 0.52]),
        ambient("ac-0001", 3900, ["ep-boot", "ep-deploy"]),
    ]
    r = Run().send(events)
    row = r.memories[("a1", "ep-boot")]
    assert row["status"] == INDEXED and row["index_delay_seconds"] == 31.5
    assert r.probes["rp-0001"]["hit"] and r.probes["rp-0001"]["rank"] == 2
    assert r.agents["a1"]["ambient_memory_ids"] == ["ep-boot", "ep-deploy"]
    assert r.unindexed_counted() == 0 and r.transitions == [] and r.deadletters == []


@pytest.mark.parametrize("order", ["write first", "index first"])
def test_write_and_index_join_in_either_order(order: str) -> None:
    w, i = written("w1", 0, "m1"), indexed("i1", 5, "m1")
    r = Run().send([w]) if order == "write first" else Run().send([i])
    first = r.memories[("a1", "m1")]["status"]
    assert first == (PENDING if order == "write first" else NOT_WRITTEN)
    r.send([i] if order == "write first" else [w])
    row = r.memories[("a1", "m1")]
    assert row["status"] == INDEXED and row["index_delay_seconds"] == 5.0
    assert [m["status"] for m in r.rows_of("a1")] == [INDEXED]
    assert (r.agents["a1"]["pending"], r.agents["a1"]["unindexed"]) == (0, 0)


def test_the_deadline_boundary_through_the_stage() -> None:
    r = Run().send([written("w1", 0, "m1"), written("w2", 600, "m2")])
    assert r.memories[("a1", "m1")]["status"] == PENDING  # 600.000 s: not over
    r.send([written("w3", 600.001, "m3")])
    assert r.memories[("a1", "m1")]["status"] == UNINDEXED  # 600.001 s: over
    assert r.memories[("a1", "m2")]["status"] == PENDING
    assert r.unindexed_counted() == 1
    assert r.agents["a1"]["unindexed"] == 1 and r.agents["a1"]["pending"] == 2
    # the increment is in the minute of the agent's clock that showed it (the alert's now)
    assert r.minutes == Counter({(UNINDEXED_MEMORIES, parse(at(600))): 1})


def test_a_late_in_time_index_clears_the_status_but_not_the_counter() -> None:
    r = Run().send([written("w1", 0, "m1"), written("w2", 700, "m2")])
    assert r.memories[("a1", "m1")]["status"] == UNINDEXED and r.unindexed_counted() == 1
    r.send([indexed("i1", 30, "m1")])  # it was indexed in time; the event came late
    row = r.memories[("a1", "m1")]
    assert row["status"] == INDEXED and row["ever_unindexed"] is False
    assert r.unindexed_counted() == 1  # an increment is never taken back (the help text says)


def test_an_index_over_the_deadline_counts_once_in_any_order() -> None:
    events = [written("w1", 0, "m1"), indexed("i1", 700, "m1"), written("w2", 800, "m2")]
    for order in (events, events[::-1], [events[1], events[0], events[2]]):
        r = Run().send(*[[e] for e in order])
        assert r.memories[("a1", "m1")]["ever_unindexed"] is True
        assert r.unindexed_counted() == 1


def test_events_published_twice_change_nothing() -> None:
    events = [written("w2", -10, "m2"), indexed("i2", -5, "m2"), written("w1", 0, "m1"),
              written("w3", 700, "m3"), probe("p1", 710, "m2", ["m2"])]  # fmt: skip
    r = Run().send(events)
    before = (dict(r.memories), dict(r.probes), dict(r.agents), Counter(r.counts))
    state = dict(r.store.data)
    r.send(events)  # the whole batch published again
    r.send(events[::-1])
    # every count but the probes' (a probe published again counts again, as its help says)
    probes = (RECALL_PROBES, (("agent_id", "a1"), ("hit", "true")))
    assert before[3].pop(probes) == 1 and r.counts.pop(probes) == 3
    assert (r.memories, r.probes, r.agents, r.counts) == before
    assert r.store.data == state
    assert [t["kind"] for t in r.transitions] == [PIPELINE_BREAK]  # raised once


def test_each_probe_counts_once_by_agent_and_hit_in_its_minute() -> None:
    r = Run().send([written("w1", 0, "m1"), indexed("i1", 1, "m1"),
                    probe("p1", 90, "m1", ["m1"]), probe("p2", 150, "m1", ["m2", "m1"], [0.9, 0.1]),
                    probe("p3", 155, "m1", ["m9"], agent="a2")])  # fmt: skip
    assert {k: v for k, v in r.counts.items() if k[0] == RECALL_PROBES} == {
        (RECALL_PROBES, (("agent_id", "a1"), ("hit", "true"))): 1,
        (RECALL_PROBES, (("agent_id", "a1"), ("hit", "false"))): 1,  # below the threshold
        (RECALL_PROBES, (("agent_id", "a2"), ("hit", "false"))): 1,
    }
    assert {m for (name, m) in r.minutes if name == RECALL_PROBES} == {
        parse(at(60)),
        parse(at(120)),  # each in the minute of its own ts
    }


def test_an_agent_that_breaks_and_recovers() -> None:
    r = Run().send([written(f"w{n}", n * 60, f"m{n}") for n in range(5)])
    r.send([indexed(f"i{n}", n * 60 + 5, f"m{n}") for n in range(2)])  # m0, m1 indexed
    r.send([written("w9", 1000, "m9")])  # m2 (120 s) is past the deadline, no index since
    kinds = [t["kind"] for t in r.transitions]
    assert kinds == [PIPELINE_BREAK]
    brk = r.transitions[0]
    assert brk["oldest_memory_id"] == "m2" and us(brk["since"]) == parse(at(120))
    assert us(r.agents["a1"]["broken_since"]) == parse(at(120))
    # the indexer comes back: one index event after the oldest unindexed write recovers it
    r.send([indexed("i9", 1010, "m9")])
    assert [t["kind"] for t in r.transitions] == [PIPELINE_BREAK, PIPELINE_RECOVERED]
    assert r.transitions[1]["since"] == brk["since"]
    assert r.agents["a1"]["broken_since"] is None
    assert r.memories[("a1", "m2")]["status"] == UNINDEXED  # still missed: PC shows it


def test_an_agent_that_never_reports_indexing_is_broken() -> None:
    r = Run().send([written(f"w{n}", n * 300, f"m{n}") for n in range(6)])
    assert us(r.agents["a1"]["broken_since"]) == parse(at(0))
    assert r.unindexed_counted() == 3  # m0..m2 are more than 600 s behind the clock (1500 s)


def test_bad_memory_events_are_dead_lettered_and_the_rest_applied() -> None:
    bad_scores = probe("p1", 5, "m1", ["m1", "m2"], [0.9])
    session_event = {"kind": "search", "event_id": "s1", "ts": at(1), "session_id": "x",
                     "query": "q", "result_ids": []}  # fmt: skip
    no_agent = {**written("w0", 1, "m0")}
    del no_agent["agent_id"]
    r = Run().send([bad_scores, session_event, no_agent, written("w1", 0, "m1")])
    reasons = sorted(d["reason"] for d in r.deadletters)
    assert reasons == ["bad_value", "missing_field", "unknown_kind"]
    details = " ".join(d["detail"] for d in r.deadletters)
    assert "one score per result" in details and "memory" in details
    assert r.memories[("a1", "m1")]["status"] == PENDING


def test_an_event_on_another_agents_partition_is_rerouted() -> None:
    stage = RecallStage(Settings(), lambda agent: 1 if agent == "a2" else 0)
    store = DictStore()
    e = written("w1", 0, "m1", agent="a2")
    out = stage.process([InMessage(TOPIC, 0, 0, None, orjson.dumps([e]), PUBLISHED_MS)], store)
    [(agent, raws, published)] = out.reroute_memory
    assert (agent, orjson.loads(orjson.dumps(raws)), published) == ("a2", [e], PUBLISHED_MS)
    assert out.diagnostics == {} and store.data == {}


# -- same events, same tables, however they arrive ------------------------------------------

AGENTS = ("a1", "a2")
MEMORIES = tuple(f"m{i}" for i in range(8))


NAMES = st.sampled_from([None, "", "2026-11-01", "daily-2026-11-01.md", "Daily 02.md",
                         "ΟΔΟΣ-1", "οδος 2", "plan-a", "Plan B", "日記-3"])  # fmt: skip


@st.composite
def memory_events(draw: Any) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 25))
    events = []
    for i in range(n):
        agent = draw(st.sampled_from(AGENTS))
        mid = draw(st.sampled_from(MEMORIES))
        # ties and the 600 s boundary both happen; and some near the next midnight (the day
        # trend)
        s = draw(st.integers(0, 40)) * 37.5 + draw(st.sampled_from([0, 0, 0, 54_000 - 750]))
        kind = draw(st.sampled_from(["w", "w", "i", "p", "a"]))
        eid = f"e{i:02d}"
        if kind == "w":
            # names that share a key (aliasing), that do not, and that have none
            events.append(written(eid, s, mid, agent, name=draw(NAMES)))
        elif kind == "i":
            events.append(indexed(eid, s, mid, agent))
        elif kind == "p":
            ids = draw(st.lists(st.sampled_from(MEMORIES), max_size=5, unique=True))
            scores = draw(st.one_of(st.none(), st.lists(st.sampled_from([0.2, 0.35, 0.6]),
                                                        min_size=len(ids), max_size=len(ids))))  # fmt: skip
            # absent (a name probe), said name, or a task probe (counted apart from SRR)
            source = draw(st.sampled_from([None, None, "name", "task", "task"]))
            events.append(probe(eid, s, mid, ids, scores, agent, source))
        else:
            ids = draw(st.lists(st.sampled_from(MEMORIES), max_size=4, unique=True))
            events.append(ambient(eid, s, ids, agent))
    return events


def batches_of(events: list[dict[str, Any]], rnd: random.Random) -> list[list[dict[str, Any]]]:
    order = events[:]
    rnd.shuffle(order)
    if order and rnd.random() < 0.3:  # some redelivered
        order += rnd.sample(order, k=rnd.randint(1, len(order)))
    out, i = [], 0
    while i < len(order):
        n = rnd.randint(1, 4)
        out.append(order[i : i + n])
        i += n
    return out


def check_against_reference(r: Run, events: list[dict[str, Any]]) -> None:
    ref = pipeline_reference(events)
    have = {
        k: {"name": m["name"], "written_at": us(m["written_at"]),
            "indexed_at": us(m["indexed_at"]), "status": m["status"]}
        for k, m in r.memories.items()
    }  # fmt: skip
    assert have == ref["memory_pipeline"]
    assert {
        eid: {"agent_id": p["agent_id"], "memory_id": p["memory_id"], "hit": p["hit"],
              "rank": p["rank"], "ts": us(p["ts"]), "query_source": p["query_source"]}
        for eid, p in r.probes.items()
    } == {eid: {k: p[k] for k in ("agent_id", "memory_id", "hit", "rank", "ts", "query_source")}
          for eid, p in ref["recall_probes"].items()}  # fmt: skip
    # the worker sends each probe's first k results: the view's `aliased` reads them
    assert {eid: p["top_ids"] for eid, p in r.probes.items()} == {
        eid: p["top"] for eid, p in ref["recall_probes"].items()
    }
    # every ambient context, as sent (the trends read them all)
    assert {eid: (c["agent_id"], c["memory_ids"], us(c["ts"])) for eid, c in r.contexts.items()} == {
        p["event_id"]: (p["agent_id"], p["memory_ids"], p["ts"])
        for p in ref["trend_points"] if p["kind"] == "ambient"
    }  # fmt: skip
    for agent, h in ref["pipeline_health"].items():
        s = r.agents[agent]
        assert (s["pending"], s["unindexed"]) == (h["pending"], h["unindexed"])
        assert us(s["last_indexed_at"]) == h["last_indexed_at"]
        assert us(s["broken_since"]) == h["broken_since"]


@settings(max_examples=150, deadline=None)
@given(memory_events(), st.randoms(use_true_random=False))
def test_the_same_events_give_the_same_tables_in_any_order(
    events: list[dict[str, Any]], rnd: random.Random
) -> None:
    in_order = Run().send(sorted(events, key=lambda e: (e["ts"], e["event_id"])))
    check_against_reference(in_order, events)
    for _ in range(3):
        check_against_reference(Run().send(*batches_of(events, rnd)), events)
    # each probe counts once in recall_probe_total by its verdict, name and task alike
    named = Counter(
        (e["agent_id"], "true" if in_order.probes[e["event_id"]]["hit"] else "false")
        for e in events
        if e["kind"] == "recall_probe"
    )
    assert {
        tuple(v for _, v in attrs): n
        for (name, attrs), n in in_order.counts.items()
        if name == RECALL_PROBES
    } == dict(named)
    # in event-time order the counter is exact: each memory that ever was unindexed, once
    for agent in AGENTS:
        expected = sum(
            1 for (a, _), m in in_order.memories.items() if a == agent and m["ever_unindexed"]
        )
        assert in_order.unindexed_counted(agent) == expected


def snapshot(r: Run) -> tuple[Any, ...]:
    agents = {a: (s["clock"], s["broken_since"], s["pending"], s["unindexed"],
                  s["last_indexed_at"], s["ambient_memory_ids"]) for a, s in r.agents.items()}  # fmt: skip
    return r.memories, r.probes, agents, r.episodes


def world_run(events: list[dict[str, Any]], rnd: random.Random, crash_rate: float) -> Run:
    """The events through the whole worker in memory (unkeyed, so some are re-routed), with
    workers killed at random points of their checkpoints; the sink's rows as a :class:`Run`."""
    w = World(Settings(), seed=rnd.randrange(1 << 30), crash_rate=crash_rate)
    order = events[:]
    rnd.shuffle(order)
    for e in order:
        w.append(w.memory, e["agent_id"] if rnd.random() < 0.5 else None, e, PUBLISHED_MS)
    w.run(max_batch=rnd.choice([1, 3, 10]))
    r = Run()
    for (kind, *_), record in w.tables.recall.items():
        if kind == "memory_pipeline":
            r.memories[(record["agent_id"], record["memory_id"])] = record
        elif kind == "recall_probe":
            r.probes[record["event_id"]] = record
        elif kind == "pipeline_agent":
            r.agents[record["agent_id"]] = record
        elif kind == "ambient_context":
            r.contexts[record["event_id"]] = record
    return r


@settings(max_examples=100, deadline=None)
@given(memory_events(), st.randoms(use_true_random=False))
def test_killed_workers_give_the_same_tables(
    events: list[dict[str, Any]], rnd: random.Random
) -> None:
    """Workers killed between batches and at every step of their checkpoints: the rows and
    summaries of the reference (the state comes back as of the committed offsets, the rest
    is processed again)."""
    check_against_reference(world_run(events, rnd, 0.3), events)


# -- through the real sink: the view --------------------------------------------------------


def health_from_duckdb(path: Path, records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    sink = DuckDBSink(path)
    sink.init()
    sink.write(records)
    con = duckdb.connect(str(path), read_only=True)
    try:
        cur = con.execute("SELECT * FROM pipeline_health ORDER BY agent_id")
        names = [d[0] for d in cur.description]
        return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}
    finally:
        con.close()


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_the_view_matches_the_reference(tmp_path: Path, seed: int | None) -> None:
    events = paper_agents()
    if seed is None:
        r = Run().send(events)
    else:
        r = Run().send(*batches_of(events, random.Random(seed)))
    got = health_from_duckdb(tmp_path / "p.duckdb", r.records)
    ref = pipeline_reference(events)["pipeline_health"]
    assert set(got) == set(ref)
    for agent, h in ref.items():
        g = got[agent]
        for col in ("written", "indexed", "pending", "unindexed", "broken", "probed", "missed",
                    "not_indexed_misses", "below_threshold_misses", "aliased_misses",
                    "outranked_misses", "unreachable"):  # fmt: skip
            assert g[col] == h[col], (agent, col)
        for col in ("pipeline_coverage", "semantic_recall_rate", "ambient_trigger_rate",
                    "aliasing_rate", "unreachable_share"):  # fmt: skip
            assert g[col] == pytest.approx(h[col]), (agent, col)
        for col in ("last_written_at", "last_indexed_at", "broken_since"):
            want = h[col]
            assert (None if g[col] is None else int(g[col].timestamp() * 1e6)) == want
    # the shapes of the paper's table
    assert got["healthy"]["pipeline_coverage"] == pytest.approx(10 / 11)  # the late one pends
    assert got["never"]["pipeline_coverage"] == 0.0 and got["never"]["broken"]
    assert got["stops"]["pipeline_coverage"] == pytest.approx(5 / 11) and got["stops"]["broken"]
    assert got["repetitive"]["semantic_recall_rate"] == pytest.approx(0.3)
    assert got["healthy"]["ambient_trigger_rate"] == pytest.approx(2 / 11)
    # the repetitive agent loses its other seven to their look-alikes (names share a key)
    assert (got["repetitive"]["aliased_misses"], got["repetitive"]["missed"]) == (7, 7)
    assert got["repetitive"]["aliasing_rate"] == pytest.approx(0.7)
    # never indexed: all ten past the deadline are unreachable but the two in the ambient
    assert (got["never"]["unreachable"], got["healthy"]["unreachable"]) == (8, 0)
    assert got["never"]["unreachable_share"] == pytest.approx(8 / 11)
    spans = pipeline_snapshot(tmp_path / "s.duckdb", r.records)["pipeline_break_spans"]
    assert spans == {("never", parse(at(0))): (None, "n0", 10),  # the late ones still pend
                     ("stops", parse(at(300))): (None, "s5", 5)}  # fmt: skip


def test_a_new_deadline_sorts_the_backlog_again() -> None:
    """MEMDIAG_INDEX_DEADLINE_SECONDS raised: memories unindexed under the old deadline that
    are within the new one are pending again, their rows re-sent, the break gone."""
    r = Run().send([written("w1", 0, "m1"), written("w2", 900, "m2")])
    assert r.memories[("a1", "m1")]["status"] == UNINDEXED and r.agents["a1"]["broken_since"]
    r.stage = RecallStage(Settings(index_deadline_seconds=1200), lambda a: 0)
    sent = len(r.records)
    r.send([written("w3", 950, "m3")])
    assert {x.get("memory_id") for x in r.records[sent:] if x["kind"] == "memory_pipeline"} == {
        "m1", "m3"}  # fmt: skip
    assert r.memories[("a1", "m1")]["status"] == PENDING
    assert (r.agents["a1"]["unindexed"], r.agents["a1"]["pending"]) == (0, 3)
    assert r.agents["a1"]["broken_since"] is None
    assert [t["kind"] for t in r.transitions] == [PIPELINE_BREAK, PIPELINE_RECOVERED]


def test_the_head_stays_small_as_a_broken_agent_goes_on() -> None:
    """3,000 single-event batches of a broken agent, each turning one memory unindexed: the
    head holds none of them (each not-indexed memory has a small key of its own)."""
    r = Run()
    for n in range(3000):
        r.send([written(f"w{n}", n * 10, f"m{n:05d}")])
    head = r.store.data["m:a1"]
    assert len(head) < 300, len(head)
    assert sum(k.startswith("mb:") for k in r.store.data) == 3000
    assert r.agents["a1"]["unindexed"] == 3000 - 61  # the last 600 s pending
    r.send([indexed(f"i{n}", 30_000 + n, f"m{n:05d}") for n in range(3000)])
    assert not any(k.startswith("mb:") for k in r.store.data)  # indexed: out of the backlog


PIPELINE_VIEWS = ("memory_pipeline", "recall_probes", "pipeline_health", "recall_by_query_source",
                  "pipeline_break_spans", "recall_trend", "recall_by_day",
                  "recall_by_memory_count", "recall_change")  # fmt: skip


def pipeline_snapshot(path: Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    sink = DuckDBSink(path)
    sink.init()
    sink.write(records)
    con = duckdb.connect(str(path), read_only=True)
    try:
        snap = from_duckdb(lambda q: con.execute(q).fetchall())
    finally:
        con.close()
    return {t: snap[t] for t in PIPELINE_VIEWS}


@pytest.mark.chaos
@settings(max_examples=examples(25), deadline=None)
@given(memory_events(), st.randoms(use_true_random=False))
def test_every_verdict_and_rate_of_the_views_in_any_order(
    tmp_path_factory: pytest.TempPathFactory, events: list[dict[str, Any]], rnd: random.Random
) -> None:
    """Generated agents through the recall stage in a random batching and order (with
    redeliveries) and the real sink: every column of the views (miss reasons, the split,
    aliasing, unreachable, the break spans) is the independent reference's."""
    ref = from_reference({**{k: {} for k in EMPTY_SESSION_TABLES}, **pipeline_reference(events)})
    want = {t: ref[t] for t in PIPELINE_VIEWS}
    got = pipeline_snapshot(tmp_path_factory.mktemp("v") / "v.duckdb",
                            Run().send(*batches_of(events, rnd)).records)  # fmt: skip
    assert differences(want, got) == []


EMPTY_SESSION_TABLES = ("searches", "retrieval_feedback", "session_diagnostics",
                        "observation_weight_history", "observation_weights",
                        "observation_strength", "observation_strength_history",
                        "graph_weights", "graph_weight_history")  # fmt: skip
