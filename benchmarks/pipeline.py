"""Pipeline benchmark: memdiag end to end, against a bare aiokafka loop and Quix Streams.

    .venv/bin/python benchmarks/pipeline.py [--events 200000] [--sessions 1000] [--no-quix]

One embedded broker (Tansu) and one data set for every contender, in one process run:

1. memdiag end to end: ``memdiag publish``'s batching -> worker (Faust, state durable in its
   changelog) -> sink -> DuckDB. Events per second from the first publish to the last row
   in DuckDB, and p50/p99 latency from publish (the input message's Kafka timestamp) to row
   (``ingested_at``), read from DuckDB itself.
2. memdiag worker stage: a fresh worker over the same backlog, from ready to drained.
3. Ceiling: a bare aiokafka consume-and-produce loop doing the same followup rule over a
   dict (no validation, no durable state): the most a Python Kafka client does here.
4. Peer: Quix Streams doing the same rule with its durable (changelog-backed) state.

Ratios are against the bare loop and Quix, measured here, now, on the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analytics.db import connect  # noqa: E402
from memdiag.broker import EmbeddedBroker  # noqa: E402
from memdiag.kafka import ensure_topics, true_end_offsets, wait_drained  # noqa: E402
from memdiag.publish import publish_file  # noqa: E402
from memdiag.runner import sink_inputs, spawn_child, worker_inputs  # noqa: E402
from memdiag.settings import Settings  # noqa: E402
from streams.followup import Remembered, is_evaluated, judge, query_key  # noqa: E402

WORDS = (
    "auth token refresh cookie vault deploy rollback canary index query pool migration "
    "invoice webhook retry bundle hydration reranker embedding recall"
).split()


def make_events(path: Path, n: int, sessions: int, seed: int = 7) -> None:
    """About 300-byte search events over ``sessions`` interleaved sessions."""
    r = random.Random(seed)
    t0 = 1_795_000_000.0
    clock = [t0 + r.random() * 3600 for _ in range(sessions)]
    last_query = [" ".join(r.sample(WORDS, 3)) for _ in range(sessions)]
    with path.open("w") as f:
        for i in range(n):
            s = r.randrange(sessions)
            clock[s] += r.uniform(1, 45)
            roll = r.random()
            if roll < 0.15:
                query = last_query[s]  # a retry
            else:
                query = " ".join(r.sample(WORDS, 3))
            last_query[s] = query
            ids = [] if roll > 0.95 else [f"obs_{r.randrange(50_000):05d}" for _ in range(4)]
            ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(clock[s]))
            event = {
                "kind": "search",
                "event_id": f"ev-{i:08d}",
                "ts": f"{ts}.{i % 1000:03d}Z",
                "session_id": f"ses_{s:05d}",
                "agent_id": "agent-bench",
                "org_id": "org_bench",
                "project_id": "proj_bench",
                "query": query,
                "result_ids": ids,
                "source": "viewer" if 0.90 < roll <= 0.95 else "agent",
            }
            f.write(json.dumps(event, separators=(",", ":")) + "\n")


def wait_for_log(path: Path, needle: str, timeout: float = 60) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text("utf-8", "replace"):
            return time.monotonic()
        time.sleep(0.02)
    raise TimeoutError(f"{needle!r} not in {path} after {timeout}s")


def memdiag_end_to_end(settings: Settings, data: Path, n: int, workdir: Path) -> dict:
    asyncio.run(ensure_topics(settings))
    worker = spawn_child("worker", "worker", settings, workdir)
    sink = spawn_child("sink", "sink", settings, workdir)
    try:
        started = time.monotonic()
        ready = wait_for_log(worker.log_path, "start-to-ready")
        wait_for_log(sink.log_path, "sink assigned")
        worker_ready_s = ready - started
        t0_wall = time.time()
        t0 = time.monotonic()
        asyncio.run(publish_file(data, settings))
        published = time.monotonic() - t0
        lag = asyncio.run(
            wait_drained(settings, settings.app_id, worker_inputs(settings), 600, 0.05)
        )
        assert lag.drained
        lag = asyncio.run(
            wait_drained(settings, settings.sink_group, sink_inputs(settings), 600, 0.05)
        )
        assert lag.drained
    finally:
        for child in (sink, worker):
            child.proc.terminate()
            child.proc.wait(20)
            child.log_file.close()
    con = connect(settings.duckdb_path, read_only=True)
    try:
        rows, last, p50, p99 = con.execute(
            "SELECT count(*), epoch(max(ingested_at)), "
            "quantile_cont(epoch(ingested_at) - epoch(published_at), 0.5), "
            "quantile_cont(epoch(ingested_at) - epoch(published_at), 0.99) FROM searches"
        ).fetchone()
    finally:
        con.close()
    assert rows == n, f"{rows} rows for {n} events"
    seconds = last - t0_wall
    return {
        "events_per_s": n / seconds,
        "seconds": seconds,
        "publish_s": published,
        "p50_ms": p50 * 1000,
        "p99_ms": p99 * 1000,
        "worker_ready_s": worker_ready_s,
    }


def memdiag_worker_stage(settings: Settings, n: int, workdir: Path) -> dict:
    fresh = settings.with_(app_id=f"{settings.app_id}-again")
    worker = spawn_child("worker2", "worker", fresh, workdir)
    try:
        started = time.monotonic()
        ready = wait_for_log(worker.log_path, "start-to-ready")
        lag = asyncio.run(wait_drained(fresh, fresh.app_id, worker_inputs(fresh), 600, 0.05))
        assert lag.drained
        done = time.monotonic()
    finally:
        worker.proc.terminate()
        worker.proc.wait(20)
        worker.log_file.close()
    return {"events_per_s": n / (done - ready), "seconds": done - ready, "ready_s": ready - started}


async def _backlog(settings: Settings) -> tuple[list[TopicPartition], dict[TopicPartition, int]]:
    c = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers)
    await c.start()
    try:
        tps = [TopicPartition(settings.topics.events, p) for p in range(settings.events_partitions)]
        ends = await true_end_offsets(settings.bootstrap_servers, tps, await c.end_offsets(tps))
    finally:
        await c.stop()
    return tps, ends


def followup_over_dict(last: dict, events: list) -> list:
    """The contract's followup rule, last search per session in a dict: the ceiling's work."""
    out = []
    for e in events:
        ids = e["result_ids"]
        if not is_evaluated(e.get("source", "agent"), ids):
            out.append((e["event_id"], False))
            continue
        ts = int(time.mktime(time.strptime(e["ts"][:19], "%Y-%m-%dT%H:%M:%S"))) * 1_000_000
        cur = Remembered(ts, 0, e["event_id"], query_key(e["query"]), tuple(ids))
        v = judge(last.get(e["session_id"]), cur, 30_000_000, 86_400_000_000)
        last[e["session_id"]] = cur
        out.append((e["event_id"], v.is_followup))
    return out


def bare_loop(settings: Settings, n: int) -> dict:
    async def go() -> dict:
        tps, ends = await _backlog(settings)
        c = AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap_servers,
            enable_auto_commit=False,
            fetch_max_bytes=64 * 1024 * 1024,
            max_partition_fetch_bytes=16 * 1024 * 1024,
        )
        p = AIOKafkaProducer(
            bootstrap_servers=settings.bootstrap_servers,
            linger_ms=5,
            max_batch_size=1024 * 1024,
            max_request_size=8 * 1024 * 1024,
        )
        await c.start()
        await p.start()
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        state: dict = {}
        seen = 0
        t0 = None
        out_topic = f"{settings.topic_prefix}bare-out"
        try:
            while seen < n:
                batches = await c.getmany(timeout_ms=200, max_records=5000)
                if t0 is None and batches:
                    t0 = time.monotonic()
                for records in batches.values():
                    for m in records:
                        events = orjson.loads(m.value)
                        events = events if isinstance(events, list) else [events]
                        seen += len(events)
                        verdicts = followup_over_dict(state, events)
                        await p.send(out_topic, orjson.dumps(verdicts), key=m.key)
            await p.flush()
            done = time.monotonic()
        finally:
            await c.stop()
            await p.stop()
        assert seen == n, (seen, n)
        return {"events_per_s": n / (done - t0), "seconds": done - t0}

    return asyncio.run(go())


def quix(settings: Settings, n: int, workdir: Path) -> dict:
    from quixstreams import Application

    state_dir = workdir / "quix-state"
    app = Application(
        broker_address=settings.bootstrap_servers,
        consumer_group=f"quix-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        state_dir=str(state_dir),
        consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
        loglevel="WARNING",
    )
    topic = app.topic(settings.topics.events, value_deserializer="bytes", key_deserializer="str")
    out = app.topic(f"{settings.topic_prefix}quix-out", value_serializer="bytes")
    marks: dict = {"seen": 0, "t0": None, "done": None}

    def rule(value: bytes, state) -> bytes:  # noqa: ANN001
        if marks["t0"] is None:
            marks["t0"] = time.monotonic()
        events = orjson.loads(value)
        events = events if isinstance(events, list) else [events]
        raw = state.get("last")
        last = {} if raw is None else {events[0]["session_id"]: Remembered(*raw[:4], tuple(raw[4]))}
        verdicts = followup_over_dict(last, events)
        remembered = last.get(events[0]["session_id"])
        if remembered is not None:
            state.set(
                "last",
                [
                    remembered.ts_us,
                    remembered.seq,
                    remembered.event_id,
                    remembered.query_key,
                    list(remembered.result_ids),
                ],
            )
        marks["seen"] += len(events)
        if marks["seen"] >= n:
            marks["done"] = time.monotonic()
            app.stop()
        return orjson.dumps(verdicts)

    sdf = app.dataframe(topic)
    sdf = sdf.apply(rule, stateful=True)
    sdf.to_topic(out)
    app.run()
    return {
        "events_per_s": n / (marks["done"] - marks["t0"]),
        "seconds": marks["done"] - marks["t0"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--no-quix", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="memdiag-bench-"))
    try:
        data = workdir / "events.jsonl"
        make_events(data, args.events, args.sessions)
        size = data.stat().st_size
        print(
            f"{args.events:,} events, {args.sessions:,} sessions, {size / args.events:.0f} bytes/event",
            file=sys.stderr,
        )
        with EmbeddedBroker() as broker:
            run = uuid.uuid4().hex[:6]
            settings = Settings.from_env(
                {},
                broker=broker.url,
                topic_prefix=f"bench{run}.",
                app_id=f"bench-{run}",
                sink_group=f"bench-sink-{run}",
                duckdb_path=str(workdir / "bench.duckdb"),
            )
            results = {
                "memdiag_end_to_end": memdiag_end_to_end(settings, data, args.events, workdir)
            }
            print("memdiag end to end done", file=sys.stderr)
            results["memdiag_worker_stage"] = memdiag_worker_stage(settings, args.events, workdir)
            print("memdiag worker stage done", file=sys.stderr)
            results["bare_aiokafka_loop"] = bare_loop(settings, args.events)
            print("bare loop done", file=sys.stderr)
            if not args.no_quix:
                results["quix_streams"] = quix(settings, args.events, workdir)
                print("quix done", file=sys.stderr)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    e2e = results["memdiag_end_to_end"]
    stage = results["memdiag_worker_stage"]
    bare = results["bare_aiokafka_loop"]
    ratios = {
        "end_to_end_vs_bare_loop": e2e["events_per_s"] / bare["events_per_s"],
        "worker_stage_vs_bare_loop": stage["events_per_s"] / bare["events_per_s"],
    }
    if "quix_streams" in results:
        q = results["quix_streams"]
        ratios["end_to_end_vs_quix"] = e2e["events_per_s"] / q["events_per_s"]
        ratios["worker_stage_vs_quix"] = stage["events_per_s"] / q["events_per_s"]
    if args.json:
        print(json.dumps({"events": args.events, "results": results, "ratios": ratios}, indent=2))
        return 0
    print(f"\n{'contender':<24}{'events/s':>12}{'seconds':>10}")
    for name, r in results.items():
        print(f"{name:<24}{r['events_per_s']:>12,.0f}{r['seconds']:>10.2f}")
    print(
        f"\nmemdiag end to end: publish -> row latency p50 {e2e['p50_ms']:.0f} ms, "
        f"p99 {e2e['p99_ms']:.0f} ms; worker start-to-ready {e2e['worker_ready_s']:.2f} s"
    )
    for name, value in ratios.items():
        print(f"ratio {name:<28} {value:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
