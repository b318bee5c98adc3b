"""What a recall pipeline event costs the worker, against a session event in the same run.

    .venv/bin/python benchmarks/memory.py [--events 40000] [--agents 200] [--runs 3]

Two measures, each a ratio against the session stage's search events, the baseline, measured
in this same process:

- **stage**: the stage logic alone (decode, rules, state encode, outputs) over a dict store,
  in microseconds per event: single-event messages (live traffic) and messages of 500.
- **worker**: the real ``memdiag worker`` on one embedded broker (Tansu), one event per
  Kafka message keyed by ``agent_id`` on ``memdiag.memory`` against the same number of
  search events keyed by ``session_id`` on ``memdiag.events``; events per second from the
  stage's first record to its consumer group's commit of the end of the topic.

The memory events: ``--agents`` agents writing episodes, nine in ten indexed seconds later
(the rest go unindexed past the deadline and break some agents), a third probed, an
ambient context every twenty writes, each agent's events in event-time order.

- **backlog**: one agent whose indexer died, with 1,000 to 100,000 memories never indexed:
  microseconds per single-event write at that size, the writes in event-time order and
  shuffled (a backfill, several producers), against the same baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline as pb  # noqa: E402  (benchmarks/pipeline.py: the session events and helpers)

from memdiag.broker import EmbeddedBroker  # noqa: E402
from memdiag.contract.envelope import DictStore, InMessage  # noqa: E402
from memdiag.kafka import ensure_topics  # noqa: E402
from memdiag.runner import spawn_child  # noqa: E402
from memdiag.settings import Settings  # noqa: E402
from memdiag.streams.stages.recall import RecallStage  # noqa: E402
from memdiag.streams.stages.sessions import SessionStage  # noqa: E402

PUBLISHED_MS = 4_102_444_800_000  # every event's Kafka timestamp: none is in the future


def memory_events(n: int, agents: int, seed: int = 7) -> list[dict[str, Any]]:
    r = random.Random(seed)
    clock = [1_795_000_000.0 + r.random() * 3600 for _ in range(agents)]
    written = [0] * agents
    events: list[dict[str, Any]] = []

    def ts(a: int) -> str:
        clock[a] += r.uniform(1, 90)
        return _iso(clock[a])

    while len(events) < n:
        a = r.randrange(agents)
        agent, m = f"agent-{a:04d}", written[a]
        written[a] += 1
        mid = f"ep-{a:04d}-{m:05d}"
        base = {"agent_id": agent, "memory_id": mid}
        events.append({**base, "kind": "memory_written", "event_id": f"w-{mid}", "ts": ts(a),
                       "name": f"episode {' '.join(r.sample(pb.WORDS, 3))}", "store": "files"})  # fmt: skip
        if r.random() < 0.9:
            events.append({**base, "kind": "memory_indexed", "event_id": f"i-{mid}",
                           "ts": ts(a), "store": "chroma"})  # fmt: skip
        if r.random() < 0.33:
            ids = [f"ep-{a:04d}-{r.randrange(m + 1):05d}" for _ in range(4)]
            events.append({**base, "kind": "recall_probe", "event_id": f"p-{mid}", "ts": ts(a),
                           "result_ids": ids, "scores": [0.8, 0.6, 0.4, 0.2]})  # fmt: skip
        if m % 20 == 19:
            recent = [f"ep-{a:04d}-{k:05d}" for k in range(max(0, m - 9), m + 1)]
            events.append({"kind": "ambient_context", "event_id": f"a-{mid}", "ts": ts(a),
                           "agent_id": agent, "session_id": f"s-{mid}", "memory_ids": recent})  # fmt: skip
    return events[:n]


def _iso(seconds: float) -> str:
    from datetime import UTC, datetime

    return (
        datetime.fromtimestamp(seconds, tz=UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


# -- the stage alone --------------------------------------------------------------------------


def stage_us(stage: Any, events: list[dict[str, Any]], topic: str, per_message: int) -> float:
    """Microseconds per event of ``stage.process`` over a fresh dict store."""
    raws = [orjson.dumps(e) for e in events]
    if per_message > 1:
        raws = [
            b"[" + b",".join(raws[i : i + per_message]) + b"]"
            for i in range(0, len(raws), per_message)
        ]
    msgs = [InMessage(topic, 0, i, None, raw, PUBLISHED_MS) for i, raw in enumerate(raws)]
    store = DictStore()
    start = time.perf_counter()
    every = max(1, 10_000 // per_message)  # about a second of events, as the runner
    for n, msg in enumerate(msgs, 1):  # settles the stages before each commit
        stage.process([msg], store)
        if n % every == 0:
            stage.settle(store)
    stage.settle(store)
    return (time.perf_counter() - start) / len(events) * 1e6


def measure_stages(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings.from_env({})
    memory = memory_events(args.events, args.agents)
    searches = pb.make_events(args.events, args.agents * 5)
    out: dict[str, Any] = {}
    for label, per in (("single", 1), ("batched", 500)):
        mem, ses = [], []
        for _ in range(args.runs):
            mem.append(stage_us(RecallStage(settings, lambda _: 0), memory,
                                settings.topics.memory, per))  # fmt: skip
            ses.append(stage_us(SessionStage(settings, lambda _: 0), searches,
                                settings.topics.events, per))  # fmt: skip
        out[label] = {"memory_us": statistics.median(mem), "search_us": statistics.median(ses)}
    return out


def backlog_us(size: int, shuffled: bool, timed: int = 1000) -> float:
    """µs per single-event write for one agent with ``size`` memories never indexed (built
    in messages of 500, then ``timed`` more timed one a message)."""
    settings = Settings.from_env({})
    stage = RecallStage(settings, lambda _: 0)
    seconds = list(range(size + timed))
    if shuffled:
        random.Random(size).shuffle(seconds)
    raws = [orjson.dumps({"kind": "memory_written", "event_id": f"w{i}", "ts": _iso(1.795e9 + s),
                          "agent_id": "orphaned", "memory_id": f"ep-{i:06d}"})
            for i, s in enumerate(seconds)]  # fmt: skip
    store = DictStore()
    topic = settings.topics.memory
    for i in range(0, size, 500):
        batch = b"[" + b",".join(raws[i : min(i + 500, size)]) + b"]"
        stage.process([InMessage(topic, 0, i, None, batch, PUBLISHED_MS)], store)
    start = time.perf_counter()
    for i in range(size, size + timed):
        stage.process([InMessage(topic, 0, i, None, raws[i], PUBLISHED_MS)], store)
    return (time.perf_counter() - start) / timed * 1e6


def measure_backlog(sizes: list[int]) -> list[dict[str, Any]]:
    return [{"size": n, "in_order_us": backlog_us(n, False), "shuffled_us": backlog_us(n, True)}
            for n in sizes]  # fmt: skip


# -- through the worker -----------------------------------------------------------------------


def first_records(log_path: Path, stage: str) -> float:
    for line in log_path.read_text("utf-8", "replace").splitlines():
        if f"{stage}: first records at " in line:
            return float(line.rsplit(" at ", 1)[1].split()[0])
    raise AssertionError(f"the worker's {stage} stage never took a record: see {log_path}")


async def publish_single(settings: Settings, topic: str, key: str, events: list[dict]) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, linger_ms=5, acks="all")
    await p.start()
    try:
        pending = [await p.send(topic, orjson.dumps(e), key=e[key].encode()) for e in events]
        await asyncio.gather(*pending)
    finally:
        await p.stop()


def worker_rate(broker: EmbeddedBroker, workdir: Path, events: list[dict], memory: bool) -> float:
    prefix = f"m{uuid.uuid4().hex[:6]}."
    settings = Settings.from_env({}, broker=broker.url, topic_prefix=prefix,
                                 app_id=f"bench-{prefix[:-1]}")  # fmt: skip
    asyncio.run(ensure_topics(settings))
    topic = settings.topics.memory if memory else settings.topics.events
    asyncio.run(publish_single(settings, topic, "agent_id" if memory else "session_id", events))
    worker = spawn_child(f"worker-{settings.app_id}", "worker", settings, workdir)
    try:
        pb.wait_for_log(worker.log_path, "start-to-ready")
        done = pb.drained(settings, settings.app_id, topic)
    finally:
        pb.stop(worker.proc)
        worker.log_file.close()
    return len(events) / (done - first_records(worker.log_path, "memory" if memory else "sessions"))


def measure_worker(args: argparse.Namespace) -> dict[str, Any]:
    memory = memory_events(args.events, args.agents)
    searches = pb.make_events(args.events, args.agents * 5)
    workdir = Path(tempfile.mkdtemp(prefix="memdiag-bench-memory-"))
    mem, ses = [], []
    try:
        with EmbeddedBroker() as broker:
            for run in range(args.runs):
                for is_memory in (True, False) if run % 2 == 0 else (False, True):
                    rate = worker_rate(broker, workdir, memory if is_memory else searches,
                                       is_memory)  # fmt: skip
                    (mem if is_memory else ses).append(rate)
                    print(f"  run {run + 1} {'memory' if is_memory else 'search'}: "
                          f"{rate:,.0f} events/s", file=sys.stderr)  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {"memory_per_s": statistics.median(mem), "search_per_s": statistics.median(ses),
            "memory_runs": [round(x) for x in mem], "search_runs": [round(x) for x in ses]}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=40_000)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-worker", action="store_true", help="the stage alone")
    args = parser.parse_args()
    stages = measure_stages(args)
    print(f"{args.events:,} events; {args.agents} agents (memory) / {args.agents * 5} sessions "
          f"(search); median of {args.runs} runs")  # fmt: skip
    print(
        f"\n{'stage alone':<14}{'memory µs/event':>17}{'search µs/event':>17}{'memory ÷ search':>17}"
    )
    for label, r in stages.items():
        print(f"{label:<14}{r['memory_us']:>17.1f}{r['search_us']:>17.1f}"
              f"{r['memory_us'] / r['search_us']:>17.2f}")  # fmt: skip
    search_us = stages["single"]["search_us"]
    print(f"\n{'one broken agent':<18}{'in order µs/write':>19}{'shuffled µs/write':>19}"
          f"{'shuffled ÷ search':>19}")  # fmt: skip
    for r in measure_backlog([1_000, 10_000, 100_000]):
        print(f"{r['size']:>8,} unindexed{r['in_order_us']:>19.1f}{r['shuffled_us']:>19.1f}"
              f"{r['shuffled_us'] / search_us:>19.2f}")  # fmt: skip
    if not args.no_worker:
        w = measure_worker(args)
        print(f"\n{'worker, single events':<24}{'memory events/s':>17}{'search events/s':>17}"
              f"{'memory ÷ search':>17}")  # fmt: skip
        print(f"{'':<24}{w['memory_per_s']:>17,.0f}{w['search_per_s']:>17,.0f}"
              f"{w['memory_per_s'] / w['search_per_s']:>17.2f}")  # fmt: skip
        print(f"  per event: memory {1e6 / w['memory_per_s']:.0f} µs, "
              f"search {1e6 / w['search_per_s']:.0f} µs (runs: memory {w['memory_runs']}, "
              f"search {w['search_runs']})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
