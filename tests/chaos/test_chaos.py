"""The reliability suite (``make chaos``; a short version runs in ``make test``).

- **Kill -9**: a scenario of every event kind published at a live rate while two workers
  and the sink are SIGKILLed at random and restarted, some kills landing while the victim
  is still recovering. DuckDB must equal a clean run exactly.
- **Hostile input**: thousands of generated hostile inputs (``tests.hostile``) mixed into a
  clean scenario through the real broker: one dead letter each, with an input reason, and
  the valid results exactly those of the valid events.
- **Broker restart**: Tansu on S3 storage (moto's server on loopback) so topics, offsets and
  changelogs survive, restarted mid-run: the worker and the sink resume by themselves.

``MEMDIAG_CHAOS=full`` runs the full sizes (20 kills, 5,000 hostile inputs, 300 sessions;
``make test``: 3 kills, 600 inputs, 60 sessions);
``MEMDIAG_CHAOS_REPORT=FILE`` writes what happened (kills, recovery times, reasons) as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from memdiag.contract import PROCESSING_ERROR
from memdiag.settings import Settings
from tests.compare import differences, from_duckdb, from_reference
from tests.hostile import encode, mixed
from tests.integration.conftest import Pipeline, pipeline_settings
from tests.integration.test_event_time import READY, _count
from tests.reference import reference
from tests.scenario import generate

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

FULL = os.environ.get("MEMDIAG_CHAOS") == "full"
KILLS = 20 if FULL else 3
FUZZ = 5000 if FULL else 600
SESSIONS = 300 if FULL else 60
#: seconds a kill takes, from the kill to the victim at work again (about 13 s here): the
#: publishing rate is set so that publishing outlasts the kills
SECONDS_PER_KILL = 18.0  # with room for a slower machine
RECOVERY = r"\^---Recovery\]"  # Faust's recovery has begun


def report(name: str, data: dict[str, Any]) -> None:
    path = os.environ.get("MEMDIAG_CHAOS_REPORT")
    if not path:
        return
    target = Path(path)
    doc = json.loads(target.read_text()) if target.exists() else {}
    doc[name] = data
    target.write_text(json.dumps(doc, indent=2))


def judgements(n: int, seed: int) -> list[dict[str, Any]]:
    """Benchmark judgements of every failure mode."""
    r = random.Random(seed)
    out = []
    for i in range(n):
        gold = [f"g{i}"] if r.random() < 0.8 else []
        retrieved = gold + ["x"] if r.random() < 0.5 else ["x"]
        out.append(
            {
                "kind": "judgement",
                "event_id": f"j{seed}-{i}",
                "ts": f"2026-11-20T08:{i % 60:02d}:{i % 59:02d}Z",
                "run_id": f"run-{i % 3}",
                "question_id": f"q{i}",
                "judge_correct": r.random() < 0.5,
                "gold_evidence_ids": gold,
                "retrieved_context_ids": retrieved,
            }
        )
    return out


def failure_mode(j: dict[str, Any]) -> str | None:
    if j["judge_correct"]:
        return None
    if not j["gold_evidence_ids"]:
        return "unattributed"
    return (
        "reader_failure"
        if set(j["gold_evidence_ids"]) <= set(j["retrieved_context_ids"])
        else "retrieval_failure"
    )


async def _publish(
    settings: Settings, messages: list[tuple[str, bytes | None, bytes]], rate: float = 0.0
) -> None:
    """(topic, key, value) messages, one each, at ``rate`` a second (0: at once)."""
    p = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers,
        acks="all",
        linger_ms=2,
        max_request_size=8 * 1024 * 1024,
    )
    await p.start()
    try:
        start = time.monotonic()
        pending = []
        for i, (topic, key, value) in enumerate(messages):
            if rate and i % 10 == 0:
                ahead = start + i / rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
            pending.append(await p.send(topic, value, key=key))
        await asyncio.gather(*pending)
    finally:
        await p.stop()


def live_messages(settings: Settings, events: list[dict], judged: list[dict]) -> list:
    """Session events one a message, keyed or not (as runtimes do), judgements among them."""
    r = random.Random(5)
    t = settings.topics
    out = [
        (t.events, e["session_id"].encode() if r.random() < 0.7 else None, orjson.dumps(e))
        for e in events
    ]
    for j in judged:
        out.insert(r.randrange(len(out) + 1), (t.judgements, j["run_id"].encode(), orjson.dumps(j)))
    return out


def check_judgements(p: Pipeline, judged: list[dict]) -> None:
    got = {
        (row[0], row[1]): row[2]
        for row in p.query("SELECT run_id, question_id, failure_mode FROM judgements")
    }
    assert got == {(j["run_id"], j["question_id"]): failure_mode(j) for j in judged}


def _wait_ready(p: Pipeline, name: str, before: int, timeout: float = 90.0) -> float:
    """Seconds until ``name`` (restarted) logs that it is at work again."""
    pattern = READY["sink" if name == "sink" else "worker"]
    start = time.monotonic()
    while _count(p.workdir / f"{name}.log", pattern) <= before:
        assert time.monotonic() - start < timeout, (
            f"{name} did not come back:\n{p.children[name].tail()}"
        )
        p.children[name].check_alive()
        time.sleep(0.05)
    return time.monotonic() - start


def test_kill_9_at_random_under_live_traffic(pipeline: Pipeline) -> None:
    events = generate(sessions=SESSIONS, seed=31)
    judged = judgements(90, seed=31)
    expected = from_reference(reference(events))
    pipeline.start("worker", "worker2", "sink")
    messages = live_messages(pipeline.settings, events, judged)
    rate = len(messages) / (KILLS * SECONDS_PER_KILL)
    publisher = threading.Thread(
        target=lambda: asyncio.run(_publish(pipeline.settings, messages, rate))
    )
    publisher.start()
    # the short run's seed kills the sink, and a worker again while it recovers
    r = random.Random(13 if FULL else 20)
    kills: list[dict[str, Any]] = []
    try:
        while len(kills) < KILLS:
            victim = r.choice(["worker", "worker2", "sink"])
            log = pipeline.workdir / f"{victim}.log"
            before = _count(log, READY["sink" if victim == "sink" else "worker"])
            live = publisher.is_alive()
            pipeline.kill(victim)
            pipeline.start(victim)
            during_recovery = victim != "sink" and len(kills) + 1 < KILLS and r.random() < 0.3
            if during_recovery:  # kill it again once its state recovery has begun
                recovering = _count(log, RECOVERY)
                deadline = time.monotonic() + 60
                while _count(log, RECOVERY) <= recovering and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert _count(log, RECOVERY) > recovering, "the victim never began recovering"
                kills.append({"victim": victim, "live": live, "during_recovery": False,
                              "recovery_s": None})  # fmt: skip
                live = publisher.is_alive()
                before = _count(log, READY["sink" if victim == "sink" else "worker"])
                pipeline.kill(victim)
                pipeline.start(victim)
            recovery = _wait_ready(pipeline, victim, before)
            kills.append({"victim": victim, "live": live, "during_recovery": during_recovery,
                          "recovery_s": recovery})  # fmt: skip
            time.sleep(r.uniform(0.2, 1.5))
    finally:
        publisher.join()
    # the kills landed while events were being published
    assert sum(k["live"] for k in kills) >= 0.75 * len(kills), kills
    pipeline.drain(timeout=300)
    assert differences(expected, from_duckdb(pipeline.query)) == []
    check_judgements(pipeline, judged)
    assert pipeline.query("SELECT count(*) FROM dead_letters") == [(0,)]
    times = sorted(k["recovery_s"] for k in kills if k["recovery_s"] is not None)
    report(
        "kill_9",
        {
            "kills": len(kills),
            "under_live_traffic": sum(k["live"] for k in kills),
            "during_recovery": sum(k["during_recovery"] for k in kills),
            "by_victim": Counter(k["victim"] for k in kills),
            "events": len(events),
            "judgements": len(judged),
            "recovery_seconds": {
                "median": times[len(times) // 2],
                "max": times[-1],
                "all": [round(t, 2) for t in times],
                "by_victim": {
                    v: sorted(
                        round(k["recovery_s"], 2)
                        for k in kills
                        if k["victim"] == v and k["recovery_s"] is not None
                    )
                    for v in ("worker", "worker2", "sink")
                },  # fmt: skip
            },
        },
    )


def test_hostile_input_through_the_broker(pipeline: Pipeline) -> None:
    messages, valid, expected = mixed(seed=7, n=FUZZ, sessions=40)
    t = pipeline.settings.topics
    pipeline.start("worker", "sink")
    asyncio.run(
        _publish(
            pipeline.settings,
            [
                (t.events, key.encode() if isinstance(key, str) else None,
                 value if isinstance(value, bytes) else encode(value))
                for key, value in messages
            ],
        )
    )  # fmt: skip
    pipeline.drain(timeout=300)
    reasons = Counter(dict(pipeline.query("SELECT reason, count(*) FROM dead_letters GROUP BY 1")))
    assert PROCESSING_ERROR not in reasons
    assert reasons == expected
    assert differences(from_reference(reference(valid)), from_duckdb(pipeline.query)) == []
    for name in ("worker", "sink"):
        pipeline.children[name].check_alive()
    odd = sum(1 for v in valid if str(v.get("event_id", "")).startswith("h7-"))
    report(
        "hostile",
        {
            "hostile_inputs": sum(expected.values()) + odd,
            "bad": sum(expected.values()),
            "valid_but_hostile_looking": odd,
            "dead_letters_by_reason": dict(reasons),
        },
    )


# -- broker restart ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_pipeline_resumes_after_a_broker_restart(s3: dict[str, str], tmp_path: Path) -> None:
    from memdiag.broker import EmbeddedBroker

    events = generate(sessions=SESSIONS // 2, seed=41)
    expected = from_reference(reference(events))
    port = _free_port()
    broker = EmbeddedBroker(port=port, storage="s3://tansu/", env=s3).start()
    settings = pipeline_settings(broker.url, tmp_path, "restart")
    p = Pipeline(settings, tmp_path)
    t = settings.topics
    msgs = [(t.events, e["session_id"].encode(), orjson.dumps(e)) for e in events]
    half = len(msgs) // 2
    restarted_at = None
    try:
        p.start("worker", "sink")
        # both at work before the broker goes: a process still starting when it goes (its
        # first connection refused) is another case than a broker lost mid-run
        _wait_ready(p, "worker", 0)
        _wait_ready(p, "sink", 0)
        asyncio.run(_publish(settings, msgs[:half], rate=200))
        time.sleep(1.0)  # work in flight
        broker.stop()  # the broker goes away mid-run...
        time.sleep(3.0)
        broker = EmbeddedBroker(port=port, storage="s3://tansu/", env=s3).start()  # ...and back
        restarted_at = time.monotonic()
        asyncio.run(_publish(settings, msgs[half:], rate=200))
        p.drain(timeout=300)
        for name in ("worker", "sink"):
            p.children[name].check_alive()  # nobody restarted them
        assert differences(expected, from_duckdb(p.query)) == []
        report(
            "broker_restart",
            {"events": len(events), "drained_after_s": round(time.monotonic() - restarted_at, 1)},
        )
    finally:
        p.stop()
        broker.stop()
