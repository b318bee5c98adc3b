"""``memdiag explain-memory``: one memory's probes and what came back instead, on the paper's
agents through the recall stage and the real sink."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from memdiag.analytics.lookup import NotFound
from memdiag.analytics.memory import UnknownMemory, explain_memory
from memdiag.analytics.sink import DuckDBSink
from memdiag.cli import main
from tests.recall_scenario import paper_agents, probe
from tests.unit.test_recall import Run


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("em") / "m.duckdb"
    events = paper_agents()
    # one more probe of r5, earlier, that found it (the latest one misses)
    events.append(probe("r-p5-early", 2000, "r5", ["r5", "r1"], [0.9, 0.4], "repetitive"))
    sink = DuckDBSink(path)
    sink.init()
    sink.write(Run().send(events).records)
    return path


def test_an_aliased_memory_shows_its_look_alikes(db: Path) -> None:
    con = duckdb.connect(str(db), read_only=True)
    try:
        ex = explain_memory(con, "repetitive", "r5")
    finally:
        con.close()
    m = ex["memory"]
    assert (m["name"], m["name_key"], m["status"], m["look_alikes"]) == (
        "daily-2026-11-06.md", "dailymd", "indexed", 9
    )  # fmt: skip
    assert ex["unreachable"] is False
    assert [(p["event_id"], p["hit"], p["miss_reason"]) for p in ex["probes"]] == [
        ("r-p5", False, "aliased"), ("r-p5-early", True, None)
    ]  # fmt: skip
    latest = ex["probes"][0]
    assert latest["instead"] == ["r0", "r1", "r2"]
    assert [t["look_alike"] for t in latest["top"]] == [True, True, True]
    assert latest["top"][0]["name"] == "daily-2026-11-01.md"
    assert ex["latest"]["miss_reason"] == "aliased" and "names" in ex["latest"]["look_at"]
    assert ex["latest"]["look_alikes_above"] == ["r0", "r1", "r2"]
    assert ex["probe_summary"] == {"shown": 2, "total": 2, "hits": 1, "misses": {"aliased": 1},
                                   "task_probes": 0}  # fmt: skip
    assert ex["latest_task"] is None and {p["query_source"] for p in ex["probes"]} == {"name"}


def test_an_unreachable_memory_and_an_unknown_one(db: Path) -> None:
    con = duckdb.connect(str(db), read_only=True)
    try:
        never = explain_memory(con, "never", "n3")
        assert never["unreachable"] is True and never["latest"] is None
        assert explain_memory(con, "never", "n9")["unreachable"] is False  # in the ambient
        with pytest.raises(UnknownMemory, match="r5 \\(latest probe missed\\)"):
            explain_memory(con, "repetitive", "nope")
        with pytest.raises(NotFound, match="no such agent with memory events 'nobody'"):
            explain_memory(con, "nobody", "r5")
        # ids are the agent's own: another agent's r5 is not this one
        with pytest.raises(UnknownMemory):
            explain_memory(con, "healthy", "r5")
    finally:
        con.close()


def test_the_command(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain-memory", "r5", "--agent", "repetitive", "--db", str(db)]) == 0
    text = capsys.readouterr().out
    assert "aliased" in text and "look-alike" in text and "daily-2026-11-01.md" in text
    assert main(["explain-memory", "r5", "--agent", "repetitive", "--db", str(db), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["latest"]["miss_reason"] == "aliased"
    assert main(["explain-memory", "n3", "--agent", "never", "--db", str(db)]) == 0
    assert "unreachable" in capsys.readouterr().out
    assert main(["explain-memory", "zz", "--agent", "repetitive", "--db", str(db)]) == 1
    assert "no such memory 'zz' of agent 'repetitive'" in capsys.readouterr().err
