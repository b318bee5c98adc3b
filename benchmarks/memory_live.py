"""What holds the real worker's memory at its peak: ``memdiag worker`` under tracemalloc.

    .venv/bin/python benchmarks/memory_live.py [--sessions 20000]

The scale benchmark's first step (``benchmarks/scale.py``: the generated scenario published
as live runtimes do, then the real worker on one embedded broker, RocksDB state), with the
worker run by ``benchmarks/traced_worker.py``: tracemalloc on from its start, and the
allocation sites written each time the Python heap reaches a new high. Prints the worker's
peak RSS (``VmHWM``), the traced peak (the Python heap: what RocksDB, aiokafka's C parts and
the allocator's slack hold is the difference) and the sites at that peak, by line and by
file. tracemalloc slows the worker about twofold: the rate here is not the worker's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from pipeline import publish, stop, wait_for_log  # noqa: E402
from scale import messages, peak_rss_mb  # noqa: E402

from memdiag.broker import EmbeddedBroker  # noqa: E402
from memdiag.kafka import ensure_topics, wait_drained  # noqa: E402
from memdiag.runner import spawn_child  # noqa: E402
from memdiag.settings import Settings  # noqa: E402
from tests.scenario import generate  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--sessions", type=int, default=20_000)
    args = parser.parse_args()
    events = generate(sessions=args.sessions, seed=5)
    msgs = messages(events)
    with tempfile.TemporaryDirectory(prefix="memdiag-memlive-") as d, EmbeddedBroker() as broker:
        workdir = Path(d)
        app = f"memlive-{uuid.uuid4().hex[:8]}"
        settings = Settings.from_env().with_(
            broker=broker.url, kafka_security_protocol="PLAINTEXT", app_id=app,
            topic_prefix=f"t{app[-8:]}", state_dir=str(workdir / "state"),
            session_keep_hours=24 * 365, session_timeout_seconds=2.0,
            heartbeat_interval_seconds=0.5,
        )  # fmt: skip
        asyncio.run(ensure_topics(settings))
        out = workdir / "peak.txt"
        os.environ.update(PYTHONPATH=str(ROOT / "benchmarks"), MEMDIAG_TRACE_OUT=str(out))
        worker = spawn_child("worker", "worker", settings, workdir, module="traced_worker")
        try:
            wait_for_log(worker.log_path, "start-to-ready", timeout=180)
            asyncio.run(publish(settings, msgs))
            started = time.monotonic()
            topics = [settings.topics.events, settings.topics.observation_steps,
                      settings.topics.session_verdicts]  # fmt: skip
            lag = asyncio.run(wait_drained(settings, settings.app_id, topics, 3600, 1.0))
            assert lag.drained, f"still {lag.behind} behind"
            took = time.monotonic() - started
            time.sleep(3)  # one more sample
            rss = peak_rss_mb(worker.proc.pid)
        finally:
            stop(worker.proc)
            worker.log_file.close()
        print(f"{args.sessions:,} sessions, {len(events):,} events in {took:.0f} s under "
              f"tracemalloc; the worker's peak RSS {rss:.0f} MB")  # fmt: skip
        print(out.read_text() if out.exists() else "no sample was written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
