"""Why a recall probe missed (`recall_probes.miss_reason`, contract section 9): the view,
case by case by hand, and against the reference's rule on generated agents. The
determinism suite checks it through the worker in every arrival order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.analytics.db import init_schema
from tests.reference import _miss_reason, _name_key

T0 = datetime(2026, 11, 24, 9, 0, tzinfo=UTC)


@pytest.fixture
def con() -> duckdb.DuckDBPyConnection:
    c = duckdb.connect(":memory:")
    init_schema(c)
    return c


def memory(con: duckdb.DuckDBPyConnection, mid: str, name: str | None, indexed: int | None) -> None:
    con.execute(
        "INSERT INTO memory_pipeline (agent_id, memory_id, name, written_at, indexed_at, status) "
        "VALUES ('a', ?, ?, ?, ?, 'indexed')",
        [mid, name, T0, None if indexed is None else T0 + timedelta(seconds=indexed)],
    )


def probe(
    con: duckdb.DuckDBPyConnection, eid: str, mid: str, top: list[str], at: int = 100,
    hit: bool = False, rank: int | None = None, k: int = 3,
) -> None:  # fmt: skip
    con.execute(
        "INSERT INTO recall_probe_events (event_id, agent_id, memory_id, hit, rank, ts, k, "
        "threshold, result_count, top_ids) VALUES (?, 'a', ?, ?, ?, ?, ?, 0.35, ?, ?)",
        [eid, mid, hit, rank, T0 + timedelta(seconds=at), k, len(top), top],
    )


def reasons(con: duckdb.DuckDBPyConnection) -> dict[str, str | None]:
    return dict(con.execute("SELECT event_id, miss_reason FROM recall_probes").fetchall())


def test_each_reason_by_hand(con: duckdb.DuckDBPyConnection) -> None:
    memory(con, "d1", "daily-2026-11-01.md", indexed=10)
    memory(con, "d2", "daily-2026-11-02.md", indexed=10)
    memory(con, "late", "notes.md", indexed=200)  # indexed after the probe
    memory(con, "x", "release-plan", indexed=10)
    memory(con, "nameless", None, indexed=10)
    memory(con, "digits", "2026-11-01", indexed=10)
    memory(con, "d3", "2026-11-03", indexed=10)
    probe(con, "hit", "d1", ["d1"], hit=True, rank=1)
    probe(con, "unindexed", "late", ["d1"])
    probe(con, "ghost", "never-written", ["d1"])  # no row at all: not indexed
    probe(con, "low", "x", ["d2", "x"], rank=2)  # in the first k, scored below
    probe(con, "alias", "d1", ["d2", "x", "nameless"], rank=7)
    probe(con, "alias-beyond-k", "d1", ["x", "nameless", "late", "d2"], k=3)
    probe(con, "plain", "x", ["d1", "d2"])
    probe(con, "no-name", "nameless", ["x"])
    probe(con, "no-letters", "digits", ["d3"])  # both keys empty: never aliased
    assert reasons(con) == {
        "hit": None,
        "unindexed": "not_indexed",
        "ghost": "not_indexed",
        "low": "below_threshold",
        "alias": "aliased",
        "alias-beyond-k": "outranked",
        "plain": "outranked",
        "no-name": "outranked",
        "no-letters": "outranked",
    }


def test_a_late_write_or_index_changes_the_reason(con: duckdb.DuckDBPyConnection) -> None:
    memory(con, "d1", "daily-01.md", indexed=10)
    probe(con, "p", "d1", ["other"])
    assert reasons(con) == {"p": "outranked"}
    memory(con, "other", "daily-02.md", indexed=None)  # its write arrives late: a look-alike
    assert reasons(con) == {"p": "aliased"}
    con.execute("UPDATE memory_pipeline SET indexed_at = ? WHERE memory_id = 'd1'",
                [T0 + timedelta(seconds=150)])  # fmt: skip
    assert reasons(con) == {"p": "not_indexed"}  # its first index came after the probe


def test_the_name_key_is_the_contracts(con: duckdb.DuckDBPyConnection) -> None:
    for name in ("daily-2026-11-01.md", "Über_Notiz 3", "日記-1", "", "123", "task#42: Deploy",
                 "ΟΔΟΣ-A", "ΟΔΟΣA", "οδος", "İstanbul", "ǅungla"):  # fmt: skip
        key = con.execute("SELECT name_key(?)", [name]).fetchone()
        assert key is not None and key[0] == _name_key(name), name
    assert _name_key("daily-2026-11-01.md") == _name_key("daily-2026-11-02.md") == "dailymd"
    # a sigma is one letter wherever it stands in the word
    assert _name_key("ΟΔΟΣ-A") == _name_key("ΟΔΟΣA") == _name_key("οδοσ a") == "οδοσa"


_SCHEMA = duckdb.connect()
_SCHEMA.execute((Path(__file__).parents[2] / "analytics/sql/schema.sql").read_text())


@settings(max_examples=60)
@given(st.lists(st.text(alphabet=st.characters(max_codepoint=0xFFFF,
                                               exclude_categories=("Cs",)), max_size=12),
                max_size=40))  # fmt: skip
def test_any_name_keys_as_the_reference_says(names: list[str]) -> None:
    """Any text of the Basic Multilingual Plane (beyond it, DuckDB's regex library knows
    letters of a newer Unicode than Python 3.11's: a version skew, not a rule)."""
    got = _SCHEMA.execute(
        "SELECT name_key(CAST($n AS VARCHAR[])[i]) FROM range(1, $k + 1) AS t(i) ORDER BY i",
        {"n": names, "k": len(names)},
    ).fetchall()
    assert [k for (k,) in got] == [_name_key(n) for n in names]


NAMES = st.sampled_from([None, "daily-01.md", "daily-02.md", "weekly-1", "plan", "2026"])


@settings(max_examples=60, deadline=None)
@given(
    memories=st.dictionaries(
        st.sampled_from("abcdef"), st.tuples(NAMES, st.one_of(st.none(), st.integers(0, 200))),
        max_size=6,
    ),
    probes=st.lists(
        st.tuples(st.sampled_from("abcdefg"), st.lists(st.sampled_from("abcdefg"), max_size=5),
                  st.integers(0, 200), st.integers(1, 4), st.booleans()),
        max_size=8,
    ),
)  # fmt: skip
def test_the_view_is_the_reference_rule(memories: dict, probes: list) -> None:
    con = duckdb.connect(":memory:")
    init_schema(con)
    for mid, (name, indexed) in memories.items():
        memory(con, mid, name, indexed)
    expected = {}
    for n, (mid, results, at, k, scored_low) in enumerate(probes):
        rank = results.index(mid) + 1 if mid in results else None
        in_top = rank is not None and rank <= k
        hit = in_top and not scored_low
        probe(con, str(n), mid, results[:k], at=at, hit=hit, rank=rank, k=k)
        written = {m: (0, name) for m, (name, _) in memories.items()}
        indexed = {m: i for m, (_, i) in memories.items() if i is not None}
        ts = at * 1_000_000
        expected[str(n)] = _miss_reason(
            {"hit": hit, "memory_id": mid, "ts": ts, "in_top": in_top, "top": results[:k]},
            written,
            {m: i * 1_000_000 for m, i in indexed.items()},
        )
    assert reasons(con) == expected
