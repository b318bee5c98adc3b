"""Recall trends (docs/rules.md, "Recall trends"): the memory-count buckets, the day rows and
the fall ``status`` flags, through the recall stage and the real sink. The views against the
independent reference in any arrival order are ``test_recall``'s
(``test_every_verdict_and_rate_of_the_views_in_any_order``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memdiag.analytics.sink import DuckDBSink
from memdiag.analytics.status import (
    RecallWatch,
    fall_z,
    pipeline_summary,
    recall_falls,
    recall_judgement,
    span_text,
)
from tests.recall_scenario import ambient, indexed, probe, written
from tests.reference import memory_count_bucket
from tests.unit.test_recall import Run

DAY = 86_400


def sink(path: Path, events: list[dict[str, Any]]) -> duckdb.DuckDBPyConnection:
    s = DuckDBSink(path)
    s.init()
    s.write(Run().send(events).records)
    return duckdb.connect(str(path), read_only=True)


def test_memory_count_buckets_are_powers_of_two() -> None:
    con = duckdb.connect()
    con.execute((Path(__file__).parents[2] / "analytics/sql/schema.sql").read_text())
    ns = [*range(0, 2100), *(2**k + d for k in range(11, 62) for d in (-1, 0, 1))]
    got = con.execute(
        "SELECT n, memory_count_bucket(n) FROM unnest($ns::BIGINT[]) AS t(n)", {"ns": ns}
    ).fetchall()
    assert {n: hi for n, hi in got} == {n: memory_count_bucket(n)[1] for n in ns}
    assert [memory_count_bucket(n) for n in (0, 1, 2, 3, 4, 5, 9)] == [
        (0, 0), (1, 1), (2, 2), (3, 4), (3, 4), (5, 8), (9, 16)]  # fmt: skip


@given(st.integers(0, 1 << 40))
def test_a_count_is_within_its_bucket(n: int) -> None:
    lo, hi = memory_count_bucket(n)
    assert lo <= n <= hi and (n <= 1 or hi == 2 * (lo - 1))


def agent_with_a_fall(before: tuple[int, int], after: tuple[int, int],
                      gap_days: float = 1.0) -> list[dict[str, Any]]:  # fmt: skip
    """Memories m0.. written and indexed at once; a sweep probing ``before[0]`` of them with
    ``before[1]`` hits, then, ``gap_days`` later, one probing ``after[0]`` with ``after[1]``
    hits. The agent's clock is the second sweep's last probe."""
    n = max(before[0], after[0])
    events = [e for i in range(n) for e in (written(f"w{i}", i, f"m{i}", name=f"note {i}"),
                                            indexed(f"i{i}", i + 1, f"m{i}"))]  # fmt: skip
    for sweep, (probed, hits) in enumerate((before, after)):
        t0 = 1000 + sweep * gap_days * DAY
        for i in range(probed):
            found = [f"m{i}"] if i < hits else ["m-other"]
            events.append(probe(f"p{sweep}-{i}", t0 + i, f"m{i}", found, [0.9]))
    return events


def falls(tmp_path: Path, events: list[dict[str, Any]], **watch: Any) -> list[dict[str, Any]]:
    """A file of its own each call: two scenarios' probes share event ids."""
    con = sink(tmp_path / f"f{len(list(tmp_path.iterdir()))}.duckdb", events)
    try:
        return recall_falls(con, RecallWatch(**watch))
    finally:
        con.close()


def test_a_fall_from_the_previous_window_is_flagged(tmp_path: Path) -> None:
    (fell,) = falls(tmp_path, agent_with_a_fall((20, 18), (20, 4)))
    assert (fell["agent_id"], fell["previous_probed"], fell["probed"]) == ("a1", 20, 20)
    assert fell["previous_semantic_recall_rate"] == 0.9 and fell["semantic_recall_rate"] == 0.2
    assert fell["change_points"] == pytest.approx(-70)


def test_a_fall_of_exactly_the_drop_is_not_flagged(tmp_path: Path) -> None:
    """More than the drop: 100% to 80% is 20 points, on the edge (decided on the counts, so
    float rounding never flips it); a drop of 19.9 flags it."""
    events = agent_with_a_fall((100, 100), (100, 80))
    assert falls(tmp_path, events) == []
    assert [f["agent_id"] for f in falls(tmp_path, events, drop_points=19.9)] == ["a1"]
    # 70% to 50%: 0.7 - 0.5 is 0.19999999999999996 in floats, and still exactly 20 points
    events = agent_with_a_fall((100, 70), (100, 50))
    assert falls(tmp_path, events) == []
    assert [f["agent_id"] for f in falls(tmp_path, events, drop_points=19.9)] == ["a1"]


def test_a_fall_within_the_noise_is_not_flagged(tmp_path: Path) -> None:
    """Ten probed memories a side: 90% to 50% is 40 points but under 2 standard errors
    (z 1.95); 90% to 30% is 3.0."""
    assert falls(tmp_path, agent_with_a_fall((10, 9), (10, 5))) == []
    (fell,) = falls(tmp_path, agent_with_a_fall((10, 9), (10, 3)))
    assert fell["z"] == pytest.approx(fall_z(3, 10, 9, 10)) and fell["z"] > 2.5
    assert fall_z(5, 10, 9, 10) == pytest.approx(1.952, abs=1e-3)
    assert fall_z(0, 10, 0, 10) == fall_z(10, 10, 10, 10) == 0.0  # no variance: no fall


def test_too_few_probes_or_no_previous_window_flag_nothing(tmp_path: Path) -> None:
    assert falls(tmp_path, agent_with_a_fall((9, 9), (20, 0))) == []  # 9 before: too few
    assert [f["agent_id"] for f in falls(tmp_path, agent_with_a_fall((9, 9), (20, 0)),
                                         min_probed=9)] == ["a1"]  # fmt: skip
    # two days apart: the window before the last day has no probe
    assert falls(tmp_path, agent_with_a_fall((20, 20), (20, 0), gap_days=2)) == []
    # the same two sweeps in a 3-day window: both in the last one, no fall
    assert falls(tmp_path, agent_with_a_fall((20, 20), (20, 0)), window_seconds=3 * DAY) == []


def test_an_agent_whose_probes_stopped_is_said_apart(tmp_path: Path) -> None:
    """Twenty probed the day before, then only a write: no probe in the last window. Not a
    fall (nothing to compare), but listed as stopped; the judged count says 0 of 1."""
    events = agent_with_a_fall((20, 20), (0, 0))
    events.append(written("late", 1000 + 1.5 * DAY, "m-late"))
    con = sink(tmp_path / "s.duckdb", events)
    try:
        j = recall_judgement(con, RecallWatch())
    finally:
        con.close()
    assert j["fell"] == [] and [a["agent_id"] for a in j["stopped"]] == ["a1"]
    assert (j["checked"], j["agents"]) == (0, 1)


def test_a_rise_is_not_a_fall(tmp_path: Path) -> None:
    assert falls(tmp_path, agent_with_a_fall((20, 2), (20, 20))) == []


def test_each_memorys_latest_probe_in_the_window_counts(tmp_path: Path) -> None:
    """A memory probed twice in the last window counts once, by its latest probe (ts, then
    event_id); its earlier miss does not."""
    events = agent_with_a_fall((10, 10), (10, 0))
    events += [probe(f"again-{i}", 1000 + DAY + 100 + i, f"m{i}", [f"m{i}"], [0.9])
               for i in range(10)]  # fmt: skip
    assert falls(tmp_path, events) == []


def test_the_status_summary_says_the_rule_it_used(tmp_path: Path) -> None:
    con = sink(tmp_path / "s.duckdb", agent_with_a_fall((20, 18), (20, 4)))
    try:
        watch = RecallWatch(window_seconds=DAY, drop_points=30, min_probed=5)
        p = pipeline_summary(con, watch)
    finally:
        con.close()
    assert p is not None
    fell = p["recall_fell"]
    assert (fell["window_seconds"], fell["drop_points"], fell["min_probed"]) == (DAY, 30, 5)
    assert [a["agent_id"] for a in fell["agents"]] == ["a1"]
    assert [span_text(s) for s in (90, 1800, 3600, DAY, 7 * DAY, 5400)] == [
        "90s", "30m", "1h", "1d", "1w", "90m"]  # fmt: skip


def test_days_and_memory_counts_of_a_growing_agent(tmp_path: Path) -> None:
    """Four memories a day for three days, each day's probes of all memories so far (one
    fewer hit each day), and an ambient context of the last two names at each day's end."""
    events: list[dict[str, Any]] = []
    for day in range(3):
        for j in range(4):
            i = day * 4 + j
            events += [
                written(f"w{i}", day * DAY + j, f"m{i}"),
                indexed(f"i{i}", day * DAY + j, f"m{i}"),
            ]
        so_far = (day + 1) * 4
        for i in range(so_far):
            hit = i >= day  # day 0: all; day 1: all but m0; day 2: all but m0, m1
            events.append(probe(f"p{day}-{i}", day * DAY + 100 + i, f"m{i}",
                                [f"m{i}"] if hit else ["m-other"], [0.9]))  # fmt: skip
        events.append(ambient(f"a{day}", day * DAY + 200, [f"m{so_far - 2}", f"m{so_far - 1}"]))
    con = sink(tmp_path / "d.duckdb", events)
    try:
        days = con.execute(
            "SELECT day, written, probed, hits, semantic_recall_rate, ambient_contexts, "
            "ambient_trigger_rate FROM recall_by_day ORDER BY day"
        ).fetchall()
        counts = con.execute(
            "SELECT memory_count_from, memory_count_to, probed, hits, ambient_trigger_rate "
            "FROM recall_by_memory_count ORDER BY memory_count_to"
        ).fetchall()
    finally:
        con.close()
    assert [d[1:] for d in days] == [
        (4, 4, 4, 1.0, 1, 0.5),
        (8, 8, 7, 7 / 8, 1, 0.25),
        (12, 12, 10, 10 / 12, 1, pytest.approx(2 / 12)),
    ]  # fmt: skip
    assert str(days[0][0]) == "2026-11-21"  # T0's UTC day
    con = duckdb.connect(str(tmp_path / "d.duckdb"), read_only=True)
    try:  # weeks start on Monday (T0 is a Saturday, so its week began on the 16th)
        weeks = con.execute("SELECT DISTINCT CAST(timezone('UTC', bucket_start) AS VARCHAR) "
                            "FROM recall_trend(bucket_seconds := 604800)").fetchall()  # fmt: skip
    finally:
        con.close()
    assert sorted(weeks) == [("2026-11-16 00:00:00",), ("2026-11-23 00:00:00",)]
    # at 4 memories (3-4); at 8 (5-8); at 12 (9-16)
    assert counts == [(3, 4, 4, 4, 0.5), (5, 8, 8, 7, 0.25), (9, 16, 12, 10, pytest.approx(2 / 12))]
