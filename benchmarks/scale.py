"""Scale: the worker's memory and its restarts against the number of sessions it keeps.

    .venv/bin/python benchmarks/scale.py [--sizes 300,5000,20000] [--store rocksdb|memory]

For each size, on one embedded broker (Tansu), with the generated scenario of the
determinism suite (``tests/scenario.py``: searches, injections, responses, outcomes; every
session kept, none forgotten):

1. **process**: the real ``memdiag worker`` takes every session, published as live
   runtimes do (one event a message, keyed, in event-time order); seconds from its
   first record until every stage has committed the end of its input, and the worker's
   peak RSS (``VmHWM``: the high-water mark of its resident memory, every thread).
   The consumer-group session timeout is 2 s, as ``memdiag run`` sets it on the embedded
   broker (Tansu answers a join after half of it; the default of 6 s adds 2 s to each
   restart below).
2. **restart, local state kept**: the worker is stopped (SIGTERM) and started again on the
   same state folder, one new event waiting: seconds from the start of the process to its
   first record, and the changelog records its recovery read.
3. **rebuild, a fresh machine**: the same with the state folder deleted: the whole changelog
   is read again.

The baseline is the smallest size, measured in this same run: the ratios say how memory and
restart time grow with the sessions kept. ``MEMDIAG_DECODED_CACHE_MB`` bounds the decoded
state in memory (sessions, ledgers, strengths: one budget) and ``MEMDIAG_STATE_CACHE_MB``
RocksDB's block cache; past them the worker's memory should grow far less than the sessions
it keeps. Every ``MEMDIAG_*`` variable set when this runs reaches the workers (to compare a
setting: ``MEMDIAG_DECODED_CACHE_MB=16 .venv/bin/python benchmarks/scale.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from pipeline import publish, stop, wait_for_log  # noqa: E402

from memdiag.broker import EmbeddedBroker  # noqa: E402
from memdiag.kafka import ensure_topics  # noqa: E402
from memdiag.runner import spawn_child, wait_worker  # noqa: E402
from memdiag.settings import Settings  # noqa: E402
from tests.scenario import generate  # noqa: E402


def messages(events: list[dict[str, Any]]) -> list[tuple[bytes | None, bytes]]:
    """Live traffic: one event a message, keyed by its session, in the order of event time
    (a fleet's sessions interleaved, as they happen)."""
    ordered = sorted(events, key=lambda e: (e["ts"], e["event_id"]))
    return [(e["session_id"].encode(), orjson.dumps(e)) for e in ordered]


def extra_event(tag: str) -> list[tuple[bytes | None, bytes]]:
    """One new search, so that a restarted worker has a record to take."""
    e = {
        "kind": "memory_search", "event_id": f"scale-{tag}", "session_id": f"scale-{tag}",
        "ts": "2026-11-20T12:00:00Z", "query": "one more", "result_ids": ["m1"],
        "source": "agent",
    }  # fmt: skip
    return [(e["session_id"].encode(), orjson.dumps(e))]


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def first_record(log_path: Path) -> float:
    wait_for_log(log_path, "runner: first records at", timeout=300)
    text = log_path.read_text("utf-8", "replace")
    return float(re.findall(r"runner: first records at ([0-9.]+)", text)[-1])


def recovered(log_path: Path) -> int:
    """Changelog records the worker's recovery read (applied or skipped), from its log."""
    text = log_path.read_text("utf-8", "replace")
    return sum(
        int(a) + int(s)
        for a, s in re.findall(r"(\d+) changelog records applied, (\d+) skipped", text)
    )


def start(settings: Settings, workdir: Path, name: str) -> tuple[Any, float]:
    spawned = time.time()
    return spawn_child(name, "worker", settings, workdir), spawned


def measure(sessions: int, store: str, workdir: Path) -> dict[str, Any]:
    events = generate(sessions=sessions, seed=5)
    msgs = messages(events)
    with EmbeddedBroker() as broker:
        app = f"scale-{uuid.uuid4().hex[:8]}"
        settings = Settings.from_env().with_(
            broker=broker.url, kafka_security_protocol="PLAINTEXT", app_id=app,
            topic_prefix=f"t{app[-8:]}", state_store=store, state_dir=str(workdir / "state"),
            session_keep_hours=24 * 365,
            # as memdiag run on the embedded broker: Tansu answers a group join after half
            # the session timeout (on Apache Kafka at once), and a restart pays it
            session_timeout_seconds=2.0, heartbeat_interval_seconds=0.5,
        )  # fmt: skip
        asyncio.run(ensure_topics(settings))
        worker, _ = start(settings, workdir, f"{app}-1")
        try:
            wait_for_log(worker.log_path, "start-to-ready", timeout=120)
            asyncio.run(publish(settings, msgs))
            lag = asyncio.run(wait_worker(settings, 900))
            assert lag.drained, f"the worker is still {lag.behind} behind"
            done = time.time()
            took = done - first_record(worker.log_path)
            rss = peak_rss_mb(worker.proc.pid)
        finally:
            stop(worker.proc)
            worker.log_file.close()
        timings: dict[str, Any] = {}
        for phase in ("restart", "rebuild"):
            if phase == "rebuild":
                shutil.rmtree(workdir / "state", ignore_errors=True)
            asyncio.run(publish(settings, extra_event(f"{app}-{phase}")))
            worker, spawned = start(settings, workdir, f"{app}-{phase}")
            try:
                timings[phase] = {
                    "first_record_s": round(first_record(worker.log_path) - spawned, 2),
                    "changelog_records_read": recovered(worker.log_path),
                    "peak_rss_mb": round(peak_rss_mb(worker.proc.pid)),
                }
            finally:
                stop(worker.proc)
                worker.log_file.close()
    return {
        "sessions": sessions,
        "events": len(events),
        "process_s": round(took, 1),
        "events_per_s": round(len(events) / took),
        "peak_rss_mb": round(rss),
        **timings,
    }


def render(rows: list[dict[str, Any]], store: str) -> str:
    base = rows[0]
    out = [
        f"state store: {store}; baseline: {base['sessions']:,} sessions, this run",
        "",
        f"{'sessions':>8} {'events':>8} {'process':>8} {'ev/s':>7} {'peak RSS':>9} "
        f"{'÷ base':>7} {'restart':>8} {'read':>7} {'rebuild':>8} {'read':>7} {'RSS':>5}",
    ]
    for r in rows:
        out.append(
            f"{r['sessions']:>8,} {r['events']:>8,} {r['process_s']:>7}s "
            f"{r['events_per_s']:>7,} {r['peak_rss_mb']:>6} MB "
            f"{r['peak_rss_mb'] / base['peak_rss_mb']:>6.2f}x "
            f"{r['restart']['first_record_s']:>7}s {r['restart']['changelog_records_read']:>7,} "
            f"{r['rebuild']['first_record_s']:>7}s {r['rebuild']['changelog_records_read']:>7,} "
            f"{r['rebuild']['peak_rss_mb']:>5}"
        )
    out += [
        "",
        "process: first record to every stage committed; peak RSS: the worker's VmHWM.",
        "restart: a new worker on the kept state folder, from its start to its first record,",
        "and the changelog records its recovery read; rebuild: the same with no local state",
        "(RSS: the rebuilt worker's peak).",
    ]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--sizes", default="300,5000,20000",
                        help="numbers of sessions, comma-separated (default 300,5000,20000)")  # fmt: skip
    parser.add_argument("--store", choices=["rocksdb", "memory"], default="rocksdb")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        print(f"· {n:,} sessions ...", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="memdiag-scale-") as d:
            rows.append(measure(n, args.store, Path(d)))
        print(f"  {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    print(json.dumps(rows, indent=2) if args.json else render(rows, args.store))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
