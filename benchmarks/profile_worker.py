"""Profile the real ``memdiag worker`` on live single-event traffic with py-spy.

    .venv/bin/python benchmarks/profile_worker.py [--events 60000] [--mode single|batched|spans]

Publishes the pipeline benchmark's events to an embedded broker, starts the worker, and has
py-spy sample it (subprocesses and idle time included) from ready until drained. Prints the
top functions by own time and by total time, and writes the raw collapsed stacks (for a
flame graph) next to them.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from pipeline import (  # noqa: E402
    drained,
    make_events,
    messages,
    publish,
    span_records,
    stop,
    wait_for_log,
)

from memdiag.broker import EmbeddedBroker  # noqa: E402
from memdiag.kafka import ensure_topics  # noqa: E402
from memdiag.runner import spawn_child  # noqa: E402
from memdiag.settings import Settings  # noqa: E402


def summarise(collapsed: Path, top: int = 25) -> str:
    """Own and total time per function from py-spy's collapsed stacks."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        samples += n
        frames = [f.split(" (")[0] + " " + f.split("/")[-1].rstrip(")") for f in stack.split(";")]
        own[frames[-1]] += n
        for f in set(frames):
            total[f] += n
    out = [f"{samples} samples", "", "own time:"]
    out += [f"  {100 * n / samples:5.1f}%  {f}" for f, n in own.most_common(top)]
    out += ["", "total time:"]
    out += [f"  {100 * n / samples:5.1f}%  {f}" for f, n in total.most_common(top)]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--mode", choices=["single", "batched", "spans"], default="single")
    parser.add_argument("--out", type=Path, default=Path("profile-worker.txt"))
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="memdiag-profile-"))
    with EmbeddedBroker() as broker:
        settings = Settings.from_env({}, broker=broker.url, topic_prefix="prof.",
                                     app_id="profile-worker")  # fmt: skip
        asyncio.run(ensure_topics(settings))
        events = make_events(args.events, args.sessions)
        if args.mode == "spans":
            records, ids = span_records(events)
            count = len(ids)
            asyncio.run(publish(settings, records, topic=settings.topics.otlp_spans))
        else:
            count = args.events
            asyncio.run(publish(settings, messages(events, args.mode)))
        worker = spawn_child("worker", "worker", settings, workdir)
        try:
            wait_for_log(worker.log_path, "start-to-ready")
            collapsed = args.out.with_suffix(".collapsed")
            spy = subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                 str(worker.proc.pid), "--format", "raw", "--idle", "--rate", "250",
                 "--output", str(collapsed)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            started = time.time()
            t = settings.topics
            stages = (
                [t.otlp_spans, t.otlp_traces, t.span_events] if args.mode == "spans" else [t.events]
            )
            for topic in stages:
                done = drained(settings, settings.app_id, topic)
            spy.send_signal(2)  # SIGINT: py-spy writes its file and exits
            spy.wait(30)
        finally:
            stop(worker.proc)
            worker.log_file.close()
    unit = "spans" if args.mode == "spans" else "events"
    report = f"{count / (done - started):,.0f} {unit}/s while sampled\n" + summarise(collapsed)
    args.out.write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
