"""docs/rules.md's replay, through the real broker: ``memdiag reset-offsets --to-earliest``
while the worker keeps its local RocksDB state, then the worker again. DuckDB stays exactly
as it was; the worker rebuilds the state it keeps ahead of the reset offsets (and says so),
so every rollup on the counters topic is the sum of the increments there: the replayed
records are counted again, once. And the command refuses while a worker runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from memdiag.schemas.decode import parse_ts
from memdiag.streams.stages.counters import minute_of
from tests.inmemory import partition_for
from tests.integration.conftest import Pipeline
from tests.scenario import generate

pytestmark = pytest.mark.integration


def reset_offsets(p: Pipeline, *args: str) -> tuple[int, dict[str, Any]]:
    """``memdiag reset-offsets ARGS --json`` with the pipeline's settings: (status, output)."""
    done = subprocess.run(
        [sys.executable, "-m", "memdiag.cli", "reset-offsets", *args, "--json", "--quiet"],
        env={**os.environ, **p.settings.as_env()},
        capture_output=True,
        timeout=180,
        check=False,
    )
    assert done.stdout, done.stderr.decode()
    return done.returncode, json.loads(done.stdout)


def counters(p: Pipeline) -> tuple[Counter[tuple[str, str, str]], dict[tuple[str, str, str], int]]:
    """The increments on the counters topic added up per (counter, attributes, minute), and
    each rollup's last value (one partition per counter name: its order is the log's)."""
    increments: Counter[tuple[str, str, str]] = Counter()
    rollups: dict[tuple[str, str, str], int] = {}
    for _, doc in p.consume(p.settings.topics.counters):
        attrs = orjson.dumps(doc["attributes"], option=orjson.OPT_SORT_KEYS).decode()
        if doc["type"] == "increment":
            minute = minute_of(parse_ts(doc["ts"]))  # type: ignore[arg-type]
            increments[(doc["name"], attrs, str(minute))] += doc["value"]
        else:
            rollups[(doc["name"], attrs, str(minute_of(parse_ts(doc["minute"]))))] = doc["value"]  # type: ignore[arg-type]
    return increments, rollups


def wait_ready(p: Pipeline, since: int) -> str:
    log = p.workdir / "worker.log"
    deadline = time.monotonic() + 90
    while "memdiag worker ready" not in (text := log.read_text()[since:]):
        assert time.monotonic() < deadline, p.children["worker"].tail()
        time.sleep(0.2)
    return text


def test_a_replay_from_the_earliest_over_kept_local_state(pipeline: Pipeline) -> None:
    assert pipeline.settings.state_store == "rocksdb"
    events = generate(sessions=150, seed=8)
    pipeline.start("worker", "sink")
    pipeline.publish_events(events, keyed=True)
    pipeline.drain(timeout=180)
    before = pipeline.snapshot()
    increments, rollups = counters(pipeline)
    assert rollups == dict(increments) and sum(increments.values()) > 0

    pipeline.terminate("worker")  # its local state stays in MEMDIAG_STATE_DIR
    status, done = reset_offsets(pipeline, "--to-earliest")
    assert status == 0, done
    (group,) = done["groups"]
    assert group["group"] == pipeline.settings.app_id
    assert all(p["after"] == p["target"] == 0 for p in group["partitions"])
    assert any(p["before"] for p in group["partitions"])

    since = len((pipeline.workdir / "worker.log").read_text())
    pipeline.start("worker")
    said = wait_ready(pipeline, since)
    assert "the local state covers records the group has not committed" in said, said[-3000:]
    pipeline.drain(timeout=240)

    assert pipeline.snapshot() == before
    again, rollups = counters(pipeline)
    # each rollup is the sum of the increments on the topic, and the replay counted every
    # record once more: twice the first run's, not more
    assert rollups == dict(again)
    assert again == Counter({k: 2 * v for k, v in increments.items()})


def test_the_reset_refuses_while_a_worker_runs_and_finds_a_point_in_time(
    pipeline: Pipeline,
) -> None:
    """Refused while the worker runs (nothing committed: it goes on), and while the sink runs
    for ``--sink``; with the worker stopped, ``--to-datetime`` finds each partition's first
    record at or after the time (Tansu answers ListOffsets by time wrongly: the records are
    read), and a partition that feeds the state goes back to a checkpoint's start."""
    first, second = generate(sessions=20, seed=9), generate(sessions=8, seed=10)
    pipeline.start("worker", "sink")
    pipeline.publish_events(first, keyed=True)
    pipeline.drain(timeout=120)
    status, said = reset_offsets(pipeline, "--to-earliest", "--wait", "2")
    assert status == 1 and said["status"] == "refused", said
    assert pipeline.settings.app_id in said["reason"] and "Stop every worker" in said["reason"]
    pipeline.children["worker"].check_alive()
    time.sleep(1.1)
    between = datetime.now(UTC)
    time.sleep(1.1)
    pipeline.publish_events(second, keyed=True)
    pipeline.drain(timeout=120)  # nothing was committed by the refused reset: it goes on

    pipeline.terminate("worker")
    status, said = reset_offsets(pipeline, "--to-datetime", between.isoformat(), "--dry-run")
    assert status == 0 and said["status"] == "dry-run", said
    partitions = pipeline.settings.events_partitions
    sent = Counter(partition_for(e["session_id"], partitions) for e in first)
    events = {p["partition"]: p for p in said["groups"][0]["partitions"]
              if p["topic"] == pipeline.settings.topics.events}  # fmt: skip
    assert {n: p["target"] for n, p in events.items()} == {n: sent[n] for n in range(partitions)}
    assert all(p["after"] <= p["target"] for p in said["groups"][0]["partitions"])
    assert all(p["before"] is not None and p["before"] >= p["target"] for p in events.values())
    status, said = reset_offsets(pipeline, "--to-earliest", "--sink", "--dry-run", "--wait", "2")
    assert status == 1 and pipeline.settings.sink_group in said["reason"], said
