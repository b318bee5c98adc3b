"""Same events, same results, however they arrive: the determinism suite (the event-time
issue), through the real broker, with long-lived ``memdiag worker`` and ``memdiag sink``.

One generated scenario (``tests.scenario``: hundreds of sessions over hours of event time,
interleaved, late events beyond the turn TTL, injections after their outcome, sessions with
several outcomes, redeliveries; and the recall pipelines of six agents, on ``memory``) is
fed in eight ways. Every way must give the tables of the
independent in-order reference (``tests.reference``), on the contract's columns; so all eight
give the same tables. Events from the future are the one exception: they are dead letters.
Two of the ways (unkeyed, and a backlog) run the semantic used/ignored rule against the
reference under it; ``tests/unit/test_sessions.py`` runs both rules in any arrival order,
batched and with crashes, in process.

This suite is also the proof that memdiag scales out by adding workers: two workers share
the partitions, one leaves halfway, and two are killed and restarted under load.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from memdiag import semantic as sm
from memdiag.client import Publisher
from memdiag.schemas.decode import parse_ts
from memdiag.settings import Settings
from tests.compare import (
    Snapshot,
    differences,
    feedback_by_minute,
    from_duckdb,
    from_reference,
    net_feedback,
)
from tests.integration.conftest import Pipeline
from tests.reference import reference
from tests.scenario import future_events, generate

pytestmark = pytest.mark.integration

SESSIONS = 250
#: agents whose recall pipeline events are interleaved with the sessions'
AGENTS = 6
#: events a second for the live modes: the scenario takes about 15 s to publish
LIVE_RATE = 200.0
#: events a second while processes are killed: publishing spans the restarts
KILL_RATE = 25.0
#: the verdicts one checkpoint counts, at most, at KILL_RATE (13 events a 0.5 s commit) or
#: while a restarted worker catches up on what came while it was down
MAX_VERDICTS_PER_CHECKPOINT = 60
#: the restarts under live traffic: 8 SIGKILLs and 2 graceful restarts at full size (`make
#: chaos`: MEMDIAG_CHAOS=full), 2 and 1 in `make test` (the sink's kill and a worker's
#: among them; tests/chaos kills more), on a scenario of its own that its publishing spans
#: at the same rate (the kills then land as they do at full size)
FULL = os.environ.get("MEMDIAG_CHAOS") == "full"
KILLS, TERMS, KILL_SESSIONS = (8, 2, SESSIONS) if FULL else (2, 1, 52)


@pytest.fixture(scope="module")
def scenario() -> list[dict[str, Any]]:
    return generate(sessions=SESSIONS, seed=21, agents=AGENTS)


@pytest.fixture(scope="module")
def expected(scenario: list[dict[str, Any]]) -> Snapshot:
    return from_reference(reference(scenario))


@pytest.fixture(scope="module")
def semantic_expected(scenario: list[dict[str, Any]]) -> Snapshot:
    """The reference under MEMDIAG_DETECTOR=semantic (the model's similarity, its default
    threshold)."""
    embed = sm.embedder()
    threshold = Settings().similarity_threshold
    return from_reference(
        reference(scenario, similar=lambda m, r: sm.similarity(embed(m), embed(r)),
                  threshold=threshold)
    )  # fmt: skip


def tables(p: Pipeline) -> Snapshot:
    return from_duckdb(p.query)


def dead_letters(p: Pipeline) -> list[tuple[str, str]]:
    return sorted(p.query("SELECT reason, payload FROM dead_letters"))


def rollups(p: Pipeline) -> dict[tuple[Any, int], int]:
    """The counter topic's last rollup of each (counter, attributes, minute): its total."""
    latest: dict[tuple[Any, int], int] = {}
    for _, v in p.consume(p.settings.topics.counters):
        if v.get("type") == "rollup":
            key = (v["name"], tuple(sorted((v.get("attributes") or {}).items())))
            latest[(key, parse_ts(v["minute"]))] = v["value"]
    return latest


def ignored_share(by_signal: dict[tuple[str, int], int]) -> float:
    ignored = sum(n for (signal, _), n in by_signal.items() if signal == "ignored")
    return ignored / sum(by_signal.values())


def check(p: Pipeline, expected: Snapshot, counters: bool = True) -> None:
    """The tables are the reference's; and (``counters``: no process was killed) the counter
    topic's verdicts net of those taken back are DuckDB's, minute by minute, so the
    ``ignored_share`` alert reads what the table holds."""
    got = tables(p)
    assert differences(expected, got) == []
    if counters:
        assert net_feedback(rollups(p)) == feedback_by_minute(got)


def test_single_events_in_file_order(
    pipeline: Pipeline, scenario: list, expected: Snapshot
) -> None:
    pipeline.start()
    pipeline.publish_events(scenario, keyed=True)
    pipeline.drain(timeout=180)
    check(pipeline, expected)
    assert dead_letters(pipeline) == []


def test_through_the_python_publisher(
    pipeline: Pipeline, scenario: list, expected: Snapshot
) -> None:
    """``memdiag.client.Publisher``, as a runtime uses it: validated, keyed and batched per
    session within its linger."""
    pipeline.start()
    with Publisher(settings=pipeline.settings, linger_ms=20) as publisher:
        for e in scenario:
            publisher.publish(e)
    pipeline.drain(timeout=180)
    check(pipeline, expected)
    assert dead_letters(pipeline) == []


def test_unkeyed_round_robin_over_partitions_under_the_semantic_rule(
    semantic_pipeline: Pipeline, scenario: list, semantic_expected: Snapshot
) -> None:
    """Two of the eight ways run MEMDIAG_DETECTOR=semantic (the others the default keyword
    rule): a turn's halves on different partitions reach the same session and are judged
    with the similarity, as the reference judges them in order."""
    p = semantic_pipeline
    p.start()
    p.publish_events(scenario, keyed=False)
    p.drain(timeout=180)
    check(p, semantic_expected)
    assert p.query("SELECT DISTINCT detector FROM retrieval_feedback") == [("semantic",)]


def test_a_backlog_published_before_the_worker_starts_under_the_semantic_rule(
    semantic_pipeline: Pipeline, scenario: list, semantic_expected: Snapshot
) -> None:
    """A backlog arrives in batches of many sessions: the semantic rule judges them as the
    reference does."""
    p = semantic_pipeline
    p.publish_events(scenario, keyed=True)
    p.start()
    p.drain(timeout=180)
    check(p, semantic_expected)


def test_future_dated_events_are_dead_letters_and_change_nothing(
    pipeline: Pipeline, scenario: list, expected: Snapshot
) -> None:
    future = future_events(scenario, n=6)
    mixed = list(scenario)
    r = random.Random(3)
    for e in future:
        mixed.insert(r.randrange(len(mixed)), e)
    pipeline.start()
    pipeline.publish_events(mixed, keyed=True)
    pipeline.drain(timeout=180)
    check(pipeline, expected)
    dead = dead_letters(pipeline)
    assert [reason for reason, _ in dead] == ["bad_ts"] * len(future)
    assert {orjson.loads(payload)["event_id"] for _, payload in dead} == {
        e["event_id"] for e in future
    }


def assigned_partitions(log: Path) -> list[list[int]]:
    """Every assignment a worker's log shows (a restarted worker appends to its log)."""
    found = re.findall(r"assigned partitions \[([0-9, ]*)\] of \S+events", log.read_text())
    return [[int(x) for x in a.split(",") if x.strip()] for a in found]


def _shared(p: Pipeline, name: str, timeout: float = 90.0) -> None:
    """Wait until ``name`` holds some of the partitions: the group has split them."""
    deadline = time.monotonic() + timeout
    while True:
        log = p.workdir / f"{name}.log"
        assignments = assigned_partitions(log) if log.exists() else []
        if assignments and assignments[-1]:
            return
        assert time.monotonic() < deadline, f"{name} never had a partition: {assignments}"
        p.children[name].check_alive()
        time.sleep(0.1)


def test_scaled_out_one_worker_leaves_halfway(
    pipeline: Pipeline, scenario: list, expected: Snapshot
) -> None:
    pipeline.start("worker", "worker2", "sink")
    _shared(pipeline, "worker2")  # a join under load can take longer than the first half
    half = len(scenario) // 2
    pipeline.publish_events(scenario[:half], keyed=True, rate=LIVE_RATE)
    pipeline.terminate("worker2")  # scale in: its partitions move to the other worker
    pipeline.publish_events(scenario[half:], keyed=True, rate=LIVE_RATE)
    pipeline.drain(timeout=180)
    check(pipeline, expected)
    first = assigned_partitions(pipeline.workdir / "worker.log")
    second = assigned_partitions(pipeline.workdir / "worker2.log")
    assert second and any(second[-1]), "worker2 never had a partition"
    assert sorted(first[-1]) == list(range(pipeline.settings.events_partitions))


def _count(path: Path, pattern: str) -> int:
    return len(re.findall(pattern, path.read_text())) if path.exists() else 0


#: what a process logs once it is back at work after a restart
READY = {"worker": r"memdiag worker ready", "sink": r"sink assigned"}


def _restarted(p: Pipeline, name: str, before: int, timeout: float = 60.0) -> None:
    """Wait until ``name`` (restarted) has logged that it is at work again."""
    pattern = READY["sink" if name == "sink" else "worker"]
    deadline = time.monotonic() + timeout
    while _count(p.workdir / f"{name}.log", pattern) <= before:
        assert time.monotonic() < deadline, f"{name} did not come back:\n{p.children[name].tail()}"
        p.children[name].check_alive()
        time.sleep(0.1)


def _took_over(p: Pipeline, name: str, before: int, timeout: float = 60.0) -> None:
    """Wait until ``name`` has been assigned every partition (after ``before`` assignments):
    a scale-in really moved the leaver's partitions to it."""
    every = list(range(p.settings.events_partitions))
    deadline = time.monotonic() + timeout
    while True:
        assignments = assigned_partitions(p.workdir / f"{name}.log")
        if len(assignments) > before and every in (sorted(a) for a in assignments[before:]):
            return
        assert time.monotonic() < deadline, f"{name} never took every partition: {assignments}"
        p.children[name].check_alive()
        time.sleep(0.1)


@pytest.mark.chaos
def test_scaled_out_under_kills(pipeline: Pipeline, scenario: list, expected: Snapshot) -> None:
    """Two workers and the sink while the scenario is published at a live rate: KILLS
    SIGKILLs of a worker or the sink, each restarted at once, and TERMS graceful restarts of
    a worker (it leaves, the other worker takes all its partitions, then it comes back and
    takes half). Each kill waits until the last victim is at work again, so every kill lands
    on a working process."""
    if not FULL:  # a scenario of its own, as long to publish as the restarts take
        scenario = generate(sessions=KILL_SESSIONS, seed=21, agents=2)
        expected = from_reference(reference(scenario))
    pipeline.start("worker", "worker2", "sink")
    publisher = threading.Thread(
        target=pipeline.publish_events, args=(scenario,), kwargs={"rate": KILL_RATE}
    )
    publisher.start()
    r = random.Random(8)
    plan = ["kill"] * KILLS + ["term"] * TERMS
    r.shuffle(plan)
    kills: list[str] = []
    try:
        for how in plan:
            victim = r.choice(["worker", "worker2", "sink"] if how == "kill" else ["worker"])
            pattern = READY["sink" if victim == "sink" else "worker"]
            before = _count(pipeline.workdir / f"{victim}.log", pattern)
            if how == "kill":
                pipeline.kill(victim)
            else:
                taken = len(assigned_partitions(pipeline.workdir / "worker2.log"))
                pipeline.terminate(victim)
                _took_over(pipeline, "worker2", taken)
            pipeline.start(victim)
            kills.append(f"{how} {victim}")
            _restarted(pipeline, victim, before)
            time.sleep(r.uniform(0.2, 1.5))
    finally:
        publisher.join()
    assert sum(k.startswith("kill") for k in kills) >= KILLS
    pipeline.drain(timeout=300)
    check(pipeline, expected, counters=False)
    # a killed worker's increments since its last commit may be sent again (the counter topic
    # is at least once): the net verdicts stay within one checkpoint's a kill of the table's
    net, table = net_feedback(rollups(pipeline)), feedback_by_minute(tables(pipeline))
    off = sum(abs(net.get(k, 0) - table.get(k, 0)) for k in net.keys() | table.keys())
    worker_kills = sum(k.startswith("kill worker") for k in kills)
    print(f"verdicts off after {worker_kills} worker kills: {off} of {sum(table.values())}")
    assert off <= worker_kills * MAX_VERDICTS_PER_CHECKPOINT
    assert abs(ignored_share(net) - ignored_share(table)) < 0.02
    assert dead_letters(pipeline) == []
    # partitions really moved between the two workers
    history = {
        name: assigned_partitions(pipeline.workdir / f"{name}.log")
        for name in ("worker", "worker2")
    }
    owners: dict[int, set[str]] = {}
    for name, assignments in history.items():
        for assignment in assignments:
            for partition in assignment:
                owners.setdefault(partition, set()).add(name)
    assert any(len(o) == 2 for o in owners.values()), (kills, history)


def test_memdiag_run_batched_per_session(
    broker_url: str, tmp_path: Path, scenario: list, expected: Snapshot
) -> None:
    """``memdiag run`` on the scenario's file: batches per session, its own pipeline."""
    path = tmp_path / "scenario.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(e) for e in scenario) + b"\n")
    db = tmp_path / "run.duckdb"
    run = f"r{os.getpid()}{int(time.time() * 1000) % 100000}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMDIAG_")}
    env.update(
        MEMDIAG_BROKER=broker_url,
        MEMDIAG_TOPIC_PREFIX=f"{run}.",
        MEMDIAG_APP_ID=f"{run}-worker",
        MEMDIAG_SINK_GROUP=f"{run}-sink",
    )
    result = subprocess.run(
        [sys.executable, "-m", "memdiag.cli", "run", "--input", str(path), "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        got = from_duckdb(lambda sql: con.execute(sql).fetchall())
    finally:
        con.close()
    assert differences(expected, got) == []
