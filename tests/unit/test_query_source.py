"""Where a probe's query came from (contract section 9, docs/rules.md "Recall pipeline
health"): ``query_source`` ``name`` (the default) or ``task``. SRR and the miss reasons are the name
probes'; the counter counts every probe; ``recall_by_query_source`` sets the two apart. Hand cases
through the recall stage and the real sink, each checked against the independent reference
(``tests.reference.pipeline_reference``) as well as by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest

from memdiag.analytics.memory import explain_memory
from memdiag.analytics.queries import pipeline_health, recall_by_query_source, rows
from memdiag.analytics.sink import DuckDBSink
from memdiag.contract import BAD_VALUE, RECALL_PROBES
from memdiag.schemas import MEMORY_KINDS
from memdiag.schemas.decode import Decoder
from memdiag.schemas.models import RecallProbe, from_dict, to_dict
from tests.compare import _r
from tests.recall_scenario import indexed, paper_agents, probe, task_probe, written
from tests.reference import pipeline_reference
from tests.unit.test_recall import PUBLISHED_MS, Run

#: the columns of pipeline_health a task probe must never move
HEALTH = ("probed", "missed", "semantic_recall_rate", "not_indexed_misses",
          "below_threshold_misses", "aliased_misses", "outranked_misses", "aliasing_rate")  # fmt: skip


def load(path: Path, events: list[dict[str, Any]]) -> duckdb.DuckDBPyConnection:
    """The events through the recall stage (in order) and the real sink; a connection."""
    sink = DuckDBSink(path)
    sink.init()
    sink.write(Run().send(events).records)
    return duckdb.connect(str(path), read_only=True)


def view(con: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], tuple[Any, ...]]:
    return {
        (a, s): (p, h, _r(r))
        for a, s, p, h, r in con.execute("SELECT * FROM recall_by_query_source").fetchall()
    }


def reference_view(events: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[Any, ...]]:
    ref = pipeline_reference(events)["recall_by_query_source"]
    return {k: (r["probed"], r["hits"], _r(r["recall_rate"])) for k, r in ref.items()}


def health(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[Any, ...]]:
    cols = ", ".join(HEALTH)
    found = con.execute(f"SELECT agent_id, {cols} FROM pipeline_health").fetchall()  # noqa: S608
    return {r[0]: r[1:] for r in found}


def reasons(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[str, str | None]]:
    return {
        r[0]: (r[1], r[2])
        for r in con.execute(
            "SELECT event_id, query_source, miss_reason FROM recall_probes"
        ).fetchall()
    }


# -- the edge ------------------------------------------------------------------------------


def test_the_source_defaults_to_name_and_round_trips() -> None:
    base = probe("p1", 0, "m1", ["m1"])
    assert from_dict(base).query_source == "name"  # type: ignore[union-attr]
    assert "query_source" not in to_dict(from_dict(base))  # the default is left out
    task = from_dict({**base, "query_source": "task"})
    assert isinstance(task, RecallProbe) and task.query_source == "task"
    assert from_dict(to_dict(task)) == task


@pytest.mark.parametrize("value", ["title", "Name", "", 3, None, ["task"]])
def test_any_other_source_is_a_bad_value_that_says_which(value: Any) -> None:
    decoder = Decoder(MEMORY_KINDS, "memdiag.memory", 1 << 20, 300_000_000)
    bad = {**probe("p1", 0, "m1", ["m1"]), "query_source": value}
    good = probe("p2", 0, "m1", ["m1"])
    out = decoder.decode(orjson.dumps([bad, good]), PUBLISHED_MS)
    [rejected] = out.rejected
    assert rejected.reason == BAD_VALUE and rejected.index == 0
    assert "query_source" in rejected.detail and "name" in rejected.detail, rejected.detail
    assert "task" in rejected.detail  # what to send instead
    assert [a.event.event_id for a in out.accepted] == ["p2"]  # the rest of the batch goes on


def test_a_bad_source_is_dead_lettered_by_the_stage() -> None:
    r = Run().send([written("w1", 0, "m1"), {**probe("p1", 5, "m1", ["m1"]),
                                             "query_source": "title"}])  # fmt: skip
    [dead] = r.deadletters
    assert dead["reason"] == BAD_VALUE and "query_source" in dead["detail"]
    assert r.probes == {} and r.counts[(RECALL_PROBES, (("agent_id", "a1"), ("hit", "true")))] == 0


# -- the worker ----------------------------------------------------------------------------


def test_the_probe_row_carries_its_source_and_every_probe_counts() -> None:
    """Contract section 9: "each probe counts in recall_probe_total"; SRR and the miss
    reasons, in DuckDB, are the name probes'."""
    r = Run().send([written("w1", 0, "m1"), indexed("i1", 1, "m1"),
                    probe("p1", 60, "m1", ["m1"]),  # a name probe by default: a hit
                    probe("p2", 61, "m1", ["x"], source="name"),  # said name: a miss
                    task_probe("t1", 62, "m1", ["x", "y", "z", "m1"]),  # a task's miss
                    task_probe("t2", 63, "m1", ["m1"])])  # fmt: skip
    assert {e: p["query_source"] for e, p in r.probes.items()} == {
        "p1": "name", "p2": "name", "t1": "task", "t2": "task"}  # fmt: skip
    assert {k: v for k, v in r.counts.items() if k[0] == RECALL_PROBES} == {
        (RECALL_PROBES, (("agent_id", "a1"), ("hit", "true"))): 2,  # p1, t2
        (RECALL_PROBES, (("agent_id", "a1"), ("hit", "false"))): 2,  # p2, t1
    }


# -- DuckDB: SRR, the reasons, the view ----------------------------------------------------

#: two agents' memories and their name probes: hits, a look-alike's miss, an unindexed miss
BASE = [
    written("w1", 0, "m1", name="daily-2026-11-01.md"), indexed("i1", 1, "m1"),
    written("w2", 0, "m2", name="daily-2026-11-02.md"), indexed("i2", 1, "m2"),
    written("w3", 0, "m3", name="deploy-rollback.md"),  # never indexed
    probe("p1", 100, "m1", ["m1"]),
    probe("p2", 100, "m2", ["m1", "x", "y", "m2"]),  # aliased by m1
    probe("p3", 100, "m3", ["m1"]),  # not indexed
    written("bw1", 0, "b1", "b"), indexed("bi1", 1, "b1", "b"),
    probe("bp1", 100, "b1", ["b1"], agent="b"),
]  # fmt: skip


def test_a_task_probe_never_changes_srr_or_the_miss_reasons(tmp_path: Path) -> None:
    """Task probes of every kind (misses and hits, before and after the name probes, of
    memories probed by name and of one probed only by a task) leave pipeline_health's SRR,
    its misses and their reasons as they were; each task probe has no reason."""
    tasks = [
        task_probe("t1", 50, "m1", ["x"]),  # before its name probe, a miss
        task_probe("t2", 200, "m1", ["x"]),  # after it: the latest probe of m1, a miss
        task_probe("t3", 200, "m2", ["m2"]),  # a hit where the name missed
        task_probe("t4", 300, "m3", ["x"]),  # the unindexed one
        task_probe("t5", 300, "m4", ["m4"]),  # probed by a task only
        task_probe("bt1", 300, "b1", ["x"], agent="b"),
    ]
    before = load(tmp_path / "before.duckdb", BASE)
    after = load(tmp_path / "after.duckdb", BASE + tasks)
    assert health(after) == health(before)
    assert health(before)["a1"] == (3, 2, pytest.approx(1 / 3), 1, 0, 1, 0, pytest.approx(1 / 3))
    got = reasons(after)
    names = {e: got[e] for e in ("p1", "p2", "p3", "bp1")}
    assert names == reasons(before) == {"p1": ("name", None), "p2": ("name", "aliased"),
                                        "p3": ("name", "not_indexed"), "bp1": ("name", None)}  # fmt: skip
    assert {e: r for e, r in got.items() if e not in names} == {
        t["event_id"]: ("task", None) for t in tasks}  # fmt: skip
    # as the independent reference says, and the agent's missed count (explain-memory's)
    ref = pipeline_reference(BASE + tasks)
    for agent, h in ref["pipeline_health"].items():
        assert health(after)[agent][:2] == (h["probed"], h["missed"])
    assert rows(after, "agent_missed_count", agent_id="a1") == [{"missed": 2}]


def test_a_memory_probed_both_ways_counts_once_in_each(tmp_path: Path) -> None:
    events = BASE + [
        task_probe("t1", 150, "m1", ["m1"]),
        task_probe("t1b", 160, "m1", ["m1"]),  # twice by a task: still one memory
        task_probe("t2", 150, "m2", ["x"]),
        task_probe("bt1", 150, "b1", ["x"], agent="b"),
    ]
    con = load(tmp_path / "v.duckdb", events)
    assert (
        view(con)
        == reference_view(events)
        == {
            ("a1", "name"): (3, 1, _r(1 / 3)),
            ("a1", "task"): (2, 1, 0.5),
            ("b", "name"): (1, 1, 1.0),
            ("b", "task"): (1, 0, 0.0),
        }
    )
    # the name row is SRR
    assert (
        con.execute(
            "SELECT h.agent_id FROM pipeline_health h JOIN recall_by_query_source q "
            "ON q.agent_id = h.agent_id AND q.query_source = 'name' "
            "WHERE q.recall_rate IS DISTINCT FROM h.semantic_recall_rate"
        ).fetchall()
        == []
    )


def test_the_latest_probe_is_per_memory_and_source(tmp_path: Path) -> None:
    """A later probe of the other source never replaces a memory's latest of this one; two
    probes with one ts are ordered by event_id, as for the name probes."""
    events = [
        written("w1", 0, "m1"), indexed("i1", 1, "m1"),
        written("w2", 0, "m2"), indexed("i2", 1, "m2"),
        probe("n1", 100, "m1", ["m1"]),  # m1 by name: hit (its latest name probe)
        task_probe("t1", 200, "m1", ["x"]),  # later, by a task: a miss
        task_probe("t2a", 100, "m2", ["m2"]),  # m2 by a task: a hit, then ...
        probe("n2", 150, "m2", ["x"]),  # ... by name: a miss
        task_probe("t2c", 300, "m2", ["m2"]),  # ts tie: t2c > t2b in event_id, a hit
        task_probe("t2b", 300, "m2", ["x"]),
    ]  # fmt: skip
    con = load(tmp_path / "l.duckdb", events)
    assert (
        view(con)
        == reference_view(events)
        == {
            ("a1", "name"): (2, 1, 0.5),  # m1 hit, m2 missed
            ("a1", "task"): (2, 1, 0.5),  # m1 missed, m2 hit (t2c)
        }
    )
    # in any arrival order: the rows are the same (the view reads the events, not the order)
    reordered = load(tmp_path / "r.duckdb", events[::-1])
    assert view(reordered) == view(con)
    h = pipeline_health(con)[0]
    assert (h["semantic_recall_rate"], h["task_probed"], h["task_hits"]) == (0.5, 2, 1)
    assert (h["task_recall_rate"], h["query_formulation_gap"]) == (0.5, 0.0)
    assert (h["probed_both_ways"], h["found_by_name_only"]) == (2, 1)  # m1


def test_the_gap_is_over_the_memories_probed_both_ways(tmp_path: Path) -> None:
    """Ten memories probed by name, five found; only those five probed by task, all found.
    The two rates differ (50% against 100%) but nothing the names find do the tasks miss:
    no query-formulation failure (the rates' difference would say -50 points)."""
    events = [probe(f"n{i}", 100 + i, f"m{i}", [f"m{i}"] if i < 5 else ["x"]) for i in range(10)]
    events += [task_probe(f"t{i}", 200 + i, f"m{i}", [f"m{i}"]) for i in range(5)]
    h = pipeline_health(load(tmp_path / "g.duckdb", events))[0]
    assert (h["semantic_recall_rate"], h["task_recall_rate"]) == (0.5, 1.0)
    assert (h["probed_both_ways"], h["found_by_name_only"], h["query_formulation_gap"]) == (5, 0, 0.0)


def test_the_paper_agents_query_formulation_gap(tmp_path: Path) -> None:
    """The clinical agent: its five rules found by their names, one by a clinical
    presentation (its latest task probe; its first missed)."""
    events = paper_agents()
    con = load(tmp_path / "p.duckdb", events)
    got = view(con)
    assert got == reference_view(events)
    assert (got[("clinical", "name")], got[("clinical", "task")]) == ((5, 5, 1.0), (5, 1, 0.2))
    assert not any(s == "task" for a, s in got if a != "clinical")
    [h] = pipeline_health(con, "clinical")
    assert (h["semantic_recall_rate"], h["missed"], h["task_recall_rate"]) == (1.0, 0, 0.2)
    assert h["query_formulation_gap"] == pytest.approx(0.8)
    assert pipeline_health(con, "healthy")[0]["task_recall_rate"] is None
    assert pipeline_health(con, "healthy")[0]["query_formulation_gap"] is None
    # explain-memory: the verdict is the latest name probe; the latest task probe apart
    c1 = explain_memory(con, "clinical", "c1")
    assert [(p["event_id"], p["query_source"], p["hit"], p["miss_reason"]) for p in c1["probes"]] == [
        ("c-t1", "task", False, None), ("c-p1", "name", True, None)]  # fmt: skip
    assert c1["latest"]["hit"] is True and c1["latest_task"]["hit"] is False
    assert "query-formulation" in c1["latest_task"]["look_at"]
    assert c1["probe_summary"]["misses"] == {} and c1["probe_summary"]["task_probes"] == 1
    # the latest of each source is shown also past --limit
    c0 = explain_memory(con, "clinical", "c0", limit=1)
    assert [p["event_id"] for p in c0["probes"]] == ["c-t0-again", "c-p0"]
    assert (c0["latest"]["hit"], c0["latest_task"]["hit"], c0["probe_summary"]["total"]) == (
        True, True, 3)  # fmt: skip


# -- files and workers from before query_source ---------------------------------------------

#: recall_probe_events as a sink before query_source made it
OLD_PROBES = """
CREATE TABLE recall_probe_events (
    agent_id VARCHAR NOT NULL, memory_id VARCHAR NOT NULL, hit BOOLEAN NOT NULL, rank INTEGER,
    ts TIMESTAMPTZ NOT NULL, event_id VARCHAR PRIMARY KEY, score DOUBLE, k INTEGER,
    threshold DOUBLE, result_count INTEGER, ingested_at TIMESTAMPTZ, top_ids VARCHAR[])
"""


def test_an_older_file_and_an_older_workers_rows_are_name_probes(tmp_path: Path) -> None:
    """A file whose recall_probe_events predates the column: the sink's upgrade gives its rows
    `name`, so SRR reads as before; a reader that cannot upgrade it (read-only) reads them so
    too. A record from a worker older than the column (none in it) is a name probe."""
    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    con.execute(OLD_PROBES)
    con.execute(
        "INSERT INTO recall_probe_events (agent_id, memory_id, hit, rank, ts, event_id) VALUES "
        "('a1', 'm1', true, 1, TIMESTAMPTZ '2026-11-21 09:00:00+00', 'old-1'), "
        "('a1', 'm2', false, NULL, TIMESTAMPTZ '2026-11-21 09:00:00+00', 'old-2')"
    )
    con.close()
    ro = duckdb.connect(str(path), read_only=True)
    try:  # read-only: the column read as its older rows' value
        assert rows(ro, "agent_missed_count", agent_id="a1") == [{"missed": 1}]
        assert recall_by_query_source(ro) == []  # no view yet: nothing apart from SRR
    finally:
        ro.close()
    sink = DuckDBSink(path)
    sink.init()  # the upgrade
    record = Run().send([probe("new-1", 10, "m3", ["m3"])]).records
    older = [{k: v for k, v in r.items() if k != "query_source"} for r in record]
    sink.write(older)
    con = duckdb.connect(str(path), read_only=True)
    assert dict(con.execute("SELECT event_id, query_source FROM recall_probe_events").fetchall()) == {
        "old-1": "name", "old-2": "name", "new-1": "name"}  # fmt: skip
    assert view(con) == {("a1", "name"): (3, 2, _r(2 / 3))}
    assert con.execute("SELECT semantic_recall_rate FROM pipeline_health").fetchall() == [
        (pytest.approx(2 / 3),)]  # fmt: skip
