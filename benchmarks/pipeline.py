"""Pipeline benchmark: the memdiag worker against Quix Streams and a bare aiokafka loop.

    .venv/bin/python benchmarks/pipeline.py [--events 60000] [--sessions 1000] [--runs 3]

One embedded broker (Tansu) and one data set, every contender in this one run:

- **single** (the headline): one event per Kafka message, keyed by ``session_id``, as agent
  runtimes publish live;
- **batched**: what ``memdiag publish`` sends, arrays of up to 500 events of one session.
- **spans** (memdiag alone: the peers take no OTLP): the same searches as OpenTelemetry
  ``search_memory`` spans, in records of 200 spans as the Collector's Kafka exporter writes
  them (``otlp_proto``, unkeyed), through the worker's three stages (spans, traces,
  sessions); spans per second from its first record to the commit of the last stage.

Contenders, each over the same backlog of messages, each in its own process:

1. ``memdiag worker``: the real worker (state durable in its changelog).
2. Quix Streams: the same followup rule over its durable (changelog-backed) state, writing
   state once per message.
3. A bare aiokafka consume-and-produce loop: the same rule over a dict, no durability.

Fairness. Every contender gets the same messages, parses ``ts`` with the same function
(peers) or memdiag's own decoder, unpacks the same arrays, writes its state once per touched
session per message, and produces one output message per input message. Every clock stops
at the same point, seen from outside: the contender's consumer group has committed the end
of the input (each flushes its output before it commits). Quix and memdiag commit every
second; ``quix-5s`` is Quix at its own default, a commit every 5 s (its clock then includes
up to 5 s of waiting for the last commit); the bare loop also commits as soon as it has seen
every event, which favours it.
Every clock starts when the contender takes its first record. Every contender's verdicts
are checked against a reference. Each figure is the median of ``--runs`` runs, with the
spread (min-max); contenders rotate their order per run. Beside the ratio of the medians,
the ratio run by run (the median of each run's memdiag over the peer): this machine's speed
drifts for minutes at a time, and the contenders of one run meet the same drift.

Beside the rates, each contender's CPU time per event: the whole process (every thread,
user and system, read from its CPU-time clock to the nanosecond) from when it is ready
(memdiag) or has its first record (peers) until the input is drained, and memdiag's CPU over
each peer's, run by run (``CPU ÷``). On two cores shared with the broker and the publisher, the rates move
with whatever else runs; the CPU a process spends per event moves much less.

With ``--bound``, one more line for single and batched messages, ``no-rules``: the worker
with its session logic switched off (``benchmarks/norules.py``), everything around that
logic still done, on a copy of the input under a topic prefix of its own (no topic shared
with the real worker: its counters topic would be another input). A bound, not a
contender: the real worker's distance from it is what the session logic costs. It joins the
rotation, so the other contenders' places in it differ from a run without it.

Then the latency: the worker and the sink (to DuckDB) run while single events are published
at a steady rate, half the worker's median single-event capacity; p50/p99 from publish (the
message's Kafka timestamp) to the row in DuckDB (``ingested_at``).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

ROOT = Path(__file__).resolve().parents[1]

from memdiag.analytics.db import connect  # noqa: E402
from memdiag.broker import EmbeddedBroker  # noqa: E402
from memdiag.kafka import (  # noqa: E402
    client_options,
    ensure_topics,
    true_end_offsets,
    wait_drained,
)
from memdiag.runner import Child, spawn_child  # noqa: E402
from memdiag.schemas.decode import parse_ts  # noqa: E402
from memdiag.settings import Settings  # noqa: E402

WORDS = (
    "auth token refresh cookie vault deploy rollback canary index query pool migration "
    "invoice webhook retry bundle hydration reranker embedding recall"
).split()
WINDOW_US = 30_000_000
RETENTION_US = 24 * 3600 * 1_000_000
BATCH = 500


# -- data and the rule ------------------------------------------------------------------------


def make_events(n: int, sessions: int, seed: int = 7) -> list[dict[str, Any]]:
    """About 300-byte search events over ``sessions`` interleaved sessions, each session's
    in event-time order (so arrival order and event time agree for every contender)."""
    r = random.Random(seed)
    t0 = 1_795_000_000.0
    clock = [t0 + r.random() * 3600 for _ in range(sessions)]
    last_query = [" ".join(r.sample(WORDS, 3)) for _ in range(sessions)]
    events = []
    for i in range(n):
        s = r.randrange(sessions)
        clock[s] += r.uniform(1, 45)
        roll = r.random()
        query = last_query[s] if roll < 0.15 else " ".join(r.sample(WORDS, 3))  # a retry
        last_query[s] = query
        ids = [] if roll > 0.95 else [f"obs_{r.randrange(50_000):05d}" for _ in range(4)]
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(clock[s]))
        events.append(
            {
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
        )
    return events


def messages(events: list[dict[str, Any]], mode: str) -> list[tuple[bytes, bytes]]:
    """The messages of a mode: one event each, or arrays of up to 500 of one session."""
    if mode == "single":
        return [(e["session_id"].encode(), orjson.dumps(e)) for e in events]
    out: list[tuple[bytes, bytes]] = []
    open_: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        batch = open_.setdefault(e["session_id"], [])
        batch.append(e)
        if len(batch) == BATCH:
            out.append((e["session_id"].encode(), orjson.dumps(open_.pop(e["session_id"]))))
    out += [(sid.encode(), orjson.dumps(b)) for sid, b in open_.items()]
    return out


def followup(last: dict[str, Any], e: dict[str, Any]) -> bool:
    """The contract's followup rule against the session's last evaluated search (``last``:
    session -> (ts_us, normalised query, result set)); the peers' whole per-event work."""
    ids = e["result_ids"]
    if e.get("source", "agent") != "agent" or not ids:
        return False
    ts = parse_ts(e["ts"])
    assert ts is not None
    query = e["query"].strip().lower()
    prev = last.get(e["session_id"])
    last[e["session_id"]] = (ts, query, ids)
    if prev is None or ts - prev[0] > RETENTION_US:
        return False
    return ts - prev[0] <= WINDOW_US and query != prev[1] and not set(ids) & set(prev[2])


def reference(events: list[dict[str, Any]]) -> dict[str, bool]:
    last: dict[str, Any] = {}
    return {e["event_id"]: followup(last, e) for e in events}


# -- the peers, each a child process -------------------------------------------------------


def child_bare(bootstrap: str, topic: str, out_topic: str, group: str, n: int, mark: str) -> None:
    async def go() -> None:
        c = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            enable_auto_commit=False,
            fetch_max_bytes=64 * 1024 * 1024,
            max_partition_fetch_bytes=16 * 1024 * 1024,
        )
        p = AIOKafkaProducer(
            bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=1024 * 1024, acks="all"
        )
        await c.start()
        await p.start()
        parts = c.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, i) for i in sorted(parts)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        state: dict[str, Any] = {}
        seen = 0
        last_commit = time.monotonic()
        try:
            while seen < n:
                batches = await c.getmany(timeout_ms=200, max_records=5000)
                if batches and not Path(mark).exists():
                    Path(mark).write_text(repr(time.time()))
                for records in batches.values():
                    for m in records:
                        doc = orjson.loads(m.value)
                        evs = doc if isinstance(doc, list) else [doc]
                        verdicts = [[e["event_id"], followup(state, e)] for e in evs]
                        seen += len(evs)
                        await p.send(out_topic, orjson.dumps(verdicts), key=m.key)
                if time.monotonic() - last_commit >= 1.0:
                    await p.flush()
                    await c.commit()
                    last_commit = time.monotonic()
            await p.flush()
            await c.commit()
        finally:
            await c.stop()
            await p.stop()

    asyncio.run(go())


def child_quix(
    bootstrap: str, topic: str, out_topic: str, group: str, mark: str, commit_interval: float
) -> None:
    from quixstreams import Application

    state_dir = tempfile.mkdtemp(prefix="quix-state-")
    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        state_dir=state_dir,
        commit_interval=commit_interval,
        consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
        loglevel="WARNING",
    )
    source = app.topic(topic, value_deserializer="bytes", key_deserializer="str")
    out = app.topic(out_topic, value_serializer="bytes")
    marked = [False]

    def rule(value: bytes, state: Any) -> bytes:
        if not marked[0]:
            Path(mark).write_text(repr(time.time()))
            marked[0] = True
        doc = orjson.loads(value)
        evs = doc if isinstance(doc, list) else [doc]
        raw = state.get("last")
        last = {} if raw is None else {evs[0]["session_id"]: raw}
        verdicts = [[e["event_id"], followup(last, e)] for e in evs]
        state.set("last", list(last[evs[0]["session_id"]]) if last else None)
        return orjson.dumps(verdicts)

    app.dataframe(source).apply(rule, stateful=True).to_topic(out)
    app.run()


# -- measuring -------------------------------------------------------------------------------


def wait_for_log(path: Path, needle: str, timeout: float = 90) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text("utf-8", "replace"):
            return time.monotonic()
        time.sleep(0.02)
    raise TimeoutError(f"{needle!r} not in {path} after {timeout}s")


def wait_for_mark(path: Path, timeout: float = 90) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return float(path.read_text())
        time.sleep(0.01)
    raise TimeoutError(f"no first message after {timeout}s")


def drained(settings: Settings, group: str, topic: str, timeout: float = 900) -> float:
    """When ``group`` has committed the end of ``topic`` (wall clock), polled every 20 ms.

    The topic is whole when this is called: the input is published before any contender
    starts, and a stage's output topic is whole once the stage before it has committed its
    input (it flushes before it commits). So its true end offsets are read once, here, and
    each poll reads only the group's committed offsets. Reading the ends at every poll, as
    :func:`memdiag.kafka.wait_drained` does, costs Tansu's fetch to the end
    (:func:`memdiag.kafka.true_end_offsets`, 0.3 s or more): every clock stopped that much
    late, which flattered the slower contender. (The read stays in the span stages' clock
    for their second and third topics, which are whole only once the stage before them has
    drained.)"""
    return asyncio.run(_committed_to_end(settings, group, topic, timeout))


async def _committed_to_end(settings: Settings, group: str, topic: str, timeout: float) -> float:
    options = client_options(settings)
    consumer = AIOKafkaConsumer(**options, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        if not consumer.partitions_for_topic(topic):
            await consumer.topics()  # the metadata of every topic (bootstrap asked for none)
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        assert tps, f"no partitions for {topic}"
        ends = await true_end_offsets(options, tps, await consumer.end_offsets(tps))
        deadline = time.monotonic() + timeout
        while True:
            committed = {tp: (await consumer.committed(tp)) or 0 for tp in tps}
            if all(committed[tp] >= ends[tp] for tp in tps):
                return time.time()
            behind = sum(max(0, ends[tp] - committed[tp]) for tp in tps)
            assert time.monotonic() < deadline, f"{group} still {behind} behind"
            await asyncio.sleep(0.02)
    finally:
        await consumer.stop()


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def first_batch(log_path: Path) -> float:
    """When the worker's session stage took its first records (wall clock), as it logs
    them. The peers' clocks start at their first record too."""
    for line in log_path.read_text("utf-8", "replace").splitlines():
        if "runner: first records at " in line:
            return float(line.rsplit(" at ", 1)[1].split()[0])
    raise AssertionError(f"the worker never took a record: see {log_path}")


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far: user and system, all of its threads, to the nanosecond
    (its CPU-time clock, ``clock_getcpuclockid``); where that clock cannot be had, in the
    ticks of ``/proc/PID/stat`` (10 ms here: a peer's 0.27 s on the batched input is 27 of
    them, so one moved a run's CPU ratio by 4 %)."""
    clock = ctypes.c_int()
    if _LIBC is not None and _LIBC.clock_getcpuclockid(pid, ctypes.byref(clock)) == 0:
        try:
            return time.clock_gettime(clock.value)
        except OSError:
            pass
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


try:
    _LIBC: Any = ctypes.CDLL(None)
    _LIBC.clock_getcpuclockid.argtypes = (ctypes.c_int, ctypes.POINTER(ctypes.c_int))
except (OSError, AttributeError):
    _LIBC = None


def run_memdiag(settings: Settings, workdir: Path, bound: bool = False) -> tuple[float, float]:
    """Seconds from the first record until drained, and the worker's CPU seconds.
    ``bound``: the worker with its session logic switched off (``benchmarks/norules.py``)."""
    worker = (_spawn_norules(settings, workdir) if bound
              else spawn_child(f"worker-{settings.app_id}", "worker", settings, workdir))  # fmt: skip
    try:
        wait_for_log(worker.log_path, "start-to-ready")
        cpu = cpu_seconds(worker.proc.pid)
        done = drained(settings, settings.app_id, settings.topics.events)
        cpu = cpu_seconds(worker.proc.pid) - cpu
    finally:
        stop(worker.proc)
        worker.log_file.close()
    return done - first_batch(worker.log_path), cpu


def _spawn_norules(settings: Settings, workdir: Path) -> Child:
    """``norules worker`` as :func:`spawn_child` starts ``memdiag worker``, this folder on its
    import path (as ``benchmarks/memory_live.py`` starts its traced worker); only its."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(ROOT / "benchmarks")
    try:
        return spawn_child(f"norules-{settings.app_id}", "worker", settings, workdir,
                           module="norules")  # fmt: skip
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before


def run_peer(kind: str, settings: Settings, n: int, workdir: Path) -> tuple[float, float]:
    run = uuid.uuid4().hex[:6]
    group, mark = f"{kind}-{run}", workdir / f"{kind}-{run}.mark"
    out_topic = f"{settings.topic_prefix}{kind}-out"
    args = [sys.executable, __file__, f"--child-{kind}", settings.bootstrap_servers,
            settings.topics.events, out_topic, group, str(n), str(mark)]  # fmt: skip
    log = (workdir / f"{kind}-{run}.log").open("wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        first = wait_for_mark(mark)
        cpu = cpu_seconds(proc.pid)
        done = drained(settings, group, settings.topics.events)
        cpu = cpu_seconds(proc.pid) - cpu
    finally:
        stop(proc)
        log.close()
    return done - first, cpu


SPANS_A_RECORD = 200


def span_records(events: list[dict[str, Any]]) -> tuple[list[tuple[bytes | None, bytes]],
                                                        dict[str, str]]:  # fmt: skip
    """The search events as ``search_memory`` spans, one trace a session, in OTLP records of
    :data:`SPANS_A_RECORD` spans; and the span events' ids -> the events' ids."""
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, TracesData

    def kv(key: str, value: str) -> KeyValue:
        return KeyValue(key=key, value=AnyValue(string_value=value))

    records: list[tuple[bytes | None, bytes]] = []
    ids: dict[str, str] = {}
    for start in range(0, len(events), SPANS_A_RECORD):
        scope = ScopeSpans()
        for n, e in enumerate(events[start : start + SPANS_A_RECORD], start):
            trace_id = uuid.uuid5(uuid.NAMESPACE_OID, e["session_id"]).bytes
            span_id = (n + 1).to_bytes(8, "big")
            ts_ns = parse_ts(e["ts"]) * 1000  # type: ignore[operator]
            results = [{"id": r, "content": f"memory {r}"} for r in e["result_ids"]]
            attrs = [kv("gen_ai.operation.name", "search_memory"),
                     kv("gen_ai.conversation.id", e["session_id"]),
                     kv("gen_ai.memory.query.text", e["query"]),
                     kv("gen_ai.memory.records", json.dumps(results))]  # fmt: skip
            if e["source"] == "viewer":
                continue  # a span knows no viewer searches
            scope.spans.append(Span(trace_id=trace_id, span_id=span_id, name="search_memory",
                                    start_time_unix_nano=ts_ns, end_time_unix_nano=ts_ns + 10**6,
                                    attributes=attrs))  # fmt: skip
            ids[f"{trace_id.hex()}:{span_id.hex()}:search"] = e["event_id"]
        data = TracesData(resource_spans=[ResourceSpans(scope_spans=[scope])])
        records.append((None, data.SerializeToString()))
    return records, ids


def run_memdiag_spans(settings: Settings, workdir: Path) -> float:
    worker = spawn_child(f"worker-{settings.app_id}", "worker", settings, workdir)
    try:
        wait_for_log(worker.log_path, "start-to-ready")
        t = settings.topics
        for topic in (t.otlp_spans, t.otlp_traces, t.span_events):  # each feeds the next
            done = drained(settings, settings.app_id, topic)
    finally:
        stop(worker.proc)
        worker.log_file.close()
    for line in worker.log_path.read_text("utf-8", "replace").splitlines():
        if "runner: first records at " in line:
            return done - float(line.rsplit(" at ", 1)[1].split()[0])
    raise AssertionError(f"the worker's span stage never took a record: see {worker.log_path}")


async def publish(
    settings: Settings, msgs: list[tuple[bytes | None, bytes]], rate: float = 0,
    topic: str | None = None,
) -> None:  # fmt: skip
    """Publish ``msgs`` to ``events`` (or ``topic``): as fast as the broker takes them, or at
    ``rate`` a second (in small steps, as a live runtime does)."""
    p = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, linger_ms=5, acks="all",
                         max_batch_size=1024 * 1024, max_request_size=8 * 1024 * 1024)  # fmt: skip
    await p.start()
    try:
        pending = []
        start = time.monotonic()
        for i, (key, value) in enumerate(msgs):
            if rate and i % 20 == 0:
                ahead = start + i / rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
            pending.append(await p.send(topic or settings.topics.events, value, key=key))
            if len(pending) >= 5000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await p.stop()


def outputs(settings: Settings, topic: str) -> dict[str, bool]:
    """The last verdict per event id on a contender's output topic."""

    async def go() -> dict[str, bool]:
        c = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers)
        await c.start()
        try:
            parts = c.partitions_for_topic(topic) or set()
            if not parts:
                await c._client.force_metadata_update()
                parts = c.partitions_for_topic(topic) or set()
            tps = [TopicPartition(topic, i) for i in sorted(parts)]
            c.assign(tps)
            await c.seek_to_beginning(*tps)
            got: dict[str, bool] = {}
            while batches := await c.getmany(timeout_ms=1500, max_records=20_000):
                for records in batches.values():
                    for m in records:
                        for item in orjson.loads(m.value):
                            if isinstance(item, list):
                                got[item[0]] = item[1]
                            elif item.get("kind") == "search":
                                got[item["event_id"]] = item["is_followup"]
            return got
        finally:
            await c.stop()

    return asyncio.run(go())


def measure(args: argparse.Namespace, broker: EmbeddedBroker, workdir: Path) -> dict[str, Any]:
    events = make_events(args.events, args.sessions)
    expected = reference(events)
    results: dict[str, Any] = {"events": args.events, "sessions": args.sessions, "modes": {}}
    contenders = ["memdiag", "quix", "quix-5s", "bare"] if not args.no_quix else ["memdiag", "bare"]
    if args.bound:
        contenders.append("no-rules")
    for mode in ("single", "batched"):
        msgs = messages(events, mode)
        seconds: dict[str, list[float]] = {c: [] for c in contenders}
        cpus: dict[str, list[float]] = {c: [] for c in contenders}
        for run in range(args.runs):
            prefix = f"b{uuid.uuid4().hex[:6]}."
            settings = Settings.from_env({}, broker=broker.url, topic_prefix=prefix,
                                         app_id=f"bench-{prefix[:-1]}")  # fmt: skip
            asyncio.run(ensure_topics(settings))
            asyncio.run(publish(settings, msgs))
            order = contenders[run % len(contenders) :] + contenders[: run % len(contenders)]
            for c in order:
                if c == "no-rules":  # topics, consumer group and state of its own
                    bound = Settings.from_env({}, broker=broker.url, topic_prefix=f"n{prefix}",
                                              app_id=f"bound-{prefix[:-1]}")  # fmt: skip
                    asyncio.run(ensure_topics(bound))
                    asyncio.run(publish(bound, msgs))
                    took, cpu = run_memdiag(bound, workdir, bound=True)
                elif c == "memdiag":
                    took, cpu = run_memdiag(settings, workdir)
                else:
                    took, cpu = run_peer(c, settings, args.events, workdir)
                seconds[c].append(took)
                cpus[c].append(cpu)
                print(f"  {mode} run {run + 1} {c}: {args.events / took:,.0f} events/s, "
                      f"{cpu / args.events * 1e6:,.1f} CPU µs/event", file=sys.stderr)  # fmt: skip
            if run == 0:
                for c, topic in (("memdiag", settings.topics.diagnostics),
                                 ("quix", f"{prefix}quix-out"), ("quix-5s", f"{prefix}quix-5s-out"),
                                 ("bare", f"{prefix}bare-out")):  # fmt: skip
                    if c in contenders:
                        got = outputs(settings, topic)
                        wrong = sum(got.get(k) != v for k, v in expected.items())
                        assert wrong == 0, (
                            f"{c} ({mode}): {wrong} verdicts differ from the reference"
                        )
        results["modes"][mode] = {
            "messages": len(msgs),
            "contenders": {c: _summary(args.events, s, cpus[c]) for c, s in seconds.items()},
        }
    records, span_ids = span_records(events)
    spans = len(span_ids)
    took: list[float] = []
    for run in range(args.runs):
        prefix = f"s{uuid.uuid4().hex[:6]}."
        settings = Settings.from_env({}, broker=broker.url, topic_prefix=prefix,
                                     app_id=f"bench-{prefix[:-1]}")  # fmt: skip
        asyncio.run(ensure_topics(settings))
        asyncio.run(publish(settings, records, topic=settings.topics.otlp_spans))
        took.append(run_memdiag_spans(settings, workdir))
        print(f"  spans run {run + 1} memdiag: {spans / took[-1]:,.0f} spans/s", file=sys.stderr)
        if run == 0:
            got = {span_ids[k]: v for k, v in outputs(settings, settings.topics.diagnostics).items()
                   if k in span_ids}  # fmt: skip
            mapped = set(span_ids.values())
            agent = {k: v for k, v in expected.items() if k in mapped}
            wrong = sum(got.get(k) != v for k, v in agent.items())
            assert wrong == 0, f"memdiag (spans): {wrong} verdicts differ from the reference"
    results["modes"]["spans"] = {"messages": len(records),
                                 "contenders": {"memdiag": _summary(spans, took)}}  # fmt: skip
    if not args.no_latency:
        capacity = results["modes"]["single"]["contenders"]["memdiag"]["events_per_s"]
        results["latency"] = latency(events, capacity / 2, args.latency_seconds, broker, workdir)
    return results


def _summary(n: int, seconds: list[float], cpus: list[float] | None = None) -> dict[str, Any]:
    rates = sorted(n / s for s in seconds)
    summary = {
        "events_per_s": statistics.median(rates),
        "min": rates[0],
        "max": rates[-1],
        "runs": [round(r) for r in rates],
        #: the rates in the order of the runs (a run's contenders ran one after another)
        "by_run": [n / s for s in seconds],
    }
    if cpus:
        summary["cpu_us_per_event"] = statistics.median(c / n * 1e6 for c in cpus)
        #: in the order of the runs, as ``by_run``
        summary["cpu_by_run"] = [c / n * 1e6 for c in cpus]
    return summary


def paired(memdiag: dict[str, Any], peer: dict[str, Any]) -> float:
    """The median, over the runs, of memdiag's rate over the peer's in the same run: this
    machine's speed drifts for minutes at a time (the same worker on the same input has
    taken 1.6 s and 2.8 s of CPU), and a run's contenders meet the same drift."""
    return statistics.median(m / p for m, p in zip(memdiag["by_run"], peer["by_run"], strict=True))


def paired_cpu(memdiag: dict[str, Any], peer: dict[str, Any]) -> float | None:
    """The median, over the runs, of memdiag's CPU an event over the peer's in the same run
    (None: either has no CPU measured, or a run measured none)."""
    mine, theirs = memdiag.get("cpu_by_run"), peer.get("cpu_by_run")
    if not mine or not theirs:
        return None
    ratios = [m / p for m, p in zip(mine, theirs, strict=True) if p > 0]
    return statistics.median(ratios) if ratios else None


def latency(
    events: list[dict[str, Any]], rate: float, seconds: float, broker: EmbeddedBroker,
    workdir: Path,
) -> dict[str, Any]:  # fmt: skip
    """Worker and sink running, single events published at ``rate`` for ``seconds``."""
    n = min(len(events), int(rate * seconds))
    prefix = f"lat{uuid.uuid4().hex[:6]}."
    settings = Settings.from_env({}, broker=broker.url, topic_prefix=prefix,
                                 app_id=f"bench-{prefix[:-1]}", sink_group=f"sink-{prefix[:-1]}",
                                 duckdb_path=str(workdir / f"{prefix}duckdb"))  # fmt: skip
    asyncio.run(ensure_topics(settings))
    worker = spawn_child("lat-worker", "worker", settings, workdir)
    sink = spawn_child("lat-sink", "sink", settings, workdir)
    try:
        wait_for_log(worker.log_path, "start-to-ready")
        wait_for_log(sink.log_path, "sink assigned")
        # live traffic: the events in arrival order, stamped now
        asyncio.run(publish(settings, messages(events[:n], "single"), rate))
        drained(settings, settings.app_id, settings.topics.events)
        assert asyncio.run(wait_drained(settings, settings.sink_group,
                                        [settings.topics.diagnostics], 300, 0.05)).drained  # fmt: skip
    finally:
        for child in (sink, worker):
            stop(child.proc)
            child.log_file.close()
    con = connect(settings.duckdb_path, read_only=True)
    try:
        rows, p50, p99, worst = con.execute(
            "SELECT count(*), quantile_cont(s, 0.5), quantile_cont(s, 0.99), max(s) FROM ("
            "SELECT epoch(ingested_at) - epoch(published_at) AS s FROM searches)"
        ).fetchone()
    finally:
        con.close()
    assert rows == n, f"{rows} rows for {n} events"
    return {"rate": rate, "events": n, "p50_ms": p50 * 1000, "p99_ms": p99 * 1000,
            "max_ms": worst * 1000}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--no-quix", action="store_true")
    parser.add_argument("--no-latency", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--bound", action="store_true",
        help="also run the worker with its session logic switched off (benchmarks/norules.py):"
        " what the rest of the worker costs, a bound rather than a contender",
    )  # fmt: skip
    if len(sys.argv) > 1 and sys.argv[1].startswith("--child-"):
        kind, rest = sys.argv[1][len("--child-") :], sys.argv[2:]
        if kind == "bare":
            child_bare(rest[0], rest[1], rest[2], rest[3], int(rest[4]), rest[5])
        else:  # quix: commits every second, as memdiag; quix-5s: Quix's default interval
            child_quix(rest[0], rest[1], rest[2], rest[3], rest[5], 5.0 if "5s" in kind else 1.0)
        return 0
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="memdiag-bench-"))
    try:
        with EmbeddedBroker() as broker:
            results = measure(args, broker, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(render(results))
    return 0


def render(results: dict[str, Any]) -> str:
    """The table, and what its columns mean, in 80 columns."""
    lines = textwrap.wrap(
        f"{results['events']:,} search events over {results['sessions']:,} sessions, "
        "4 partitions, one Tansu broker; median of runs (min-max)", 80
    )  # fmt: skip
    lines += [
        "",
        f"{'mode':<8}{'contender':<10}{'events/s':>9}{'spread':>17}{'rate ÷':>8}{'by run':>8}"
        f"{'CPU µs':>8}{'CPU ÷':>7}",
    ]
    for mode, m in results["modes"].items():
        mine = m["contenders"]["memdiag"]
        for c, r in m["contenders"].items():
            ratio = "" if c == "memdiag" else f"{mine['events_per_s'] / r['events_per_s']:.2f}"
            by_run = "" if c == "memdiag" or "by_run" not in r else f"{paired(mine, r):.2f}"
            if mode == "spans":  # spans/s, against memdiag's own single events
                single = results["modes"]["single"]["contenders"]["memdiag"]["events_per_s"]
                ratio = f"{r['events_per_s'] / single:.2f}*"
            spread = f"{r['min']:,.0f}-{r['max']:,.0f}"
            cpu = f"{r['cpu_us_per_event']:,.1f}" if "cpu_us_per_event" in r else ""
            cpu_ratio = None if c == "memdiag" else paired_cpu(mine, r)
            cpu_by_run = "" if cpu_ratio is None else f"{cpu_ratio:.2f}"
            lines.append(
                f"{mode:<8}{c:<10}{r['events_per_s']:>9,.0f}{spread:>17}{ratio:>8}{by_run:>8}"
                f"{cpu:>8}{cpu_by_run:>7}"
            )
    notes = [
        "rate ÷: memdiag's rate over the contender's, of the medians; by run: the median of "
        "the runs' own ratios",
        "CPU µs: the CPU an event, all threads; CPU ÷: memdiag's over the contender's, the "
        "median of the runs' own",
    ]
    if "no-rules" in results["modes"]["single"]["contenders"]:
        notes.append("no-rules: memdiag with its session logic switched off, a bound (--bound)")
    if "spans" in results["modes"]:
        notes.append("* spans/s, against memdiag's own single events (a span takes three stages)")
    if "latency" in results:
        lat = results["latency"]
        notes += [
            "",
            f"publish -> DuckDB row at {lat['rate']:,.0f} events/s (half the worker's "
            f"single-event capacity), {lat['events']:,} events: p50 {lat['p50_ms']:,.0f} ms, "
            f"p99 {lat['p99_ms']:,.0f} ms, max {lat['max_ms']:,.0f} ms",
        ]
    for note in notes:
        lines += textwrap.wrap(note, 80, subsequent_indent="  ") or [""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
