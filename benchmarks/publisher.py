"""The runtime publisher (``memdiag.client``) against a bare aiokafka producer, in one run.

    .venv/bin/python benchmarks/publisher.py [--events 60000] [--sessions 1000]

One embedded broker, the pipeline benchmark's events, each contender publishing them all and
waiting for the broker's acknowledgements:

- baseline: a bare ``AIOKafkaProducer``, one message per event, keyed by session, no
  validation (what a runtime writes by hand);
- ``AsyncPublisher``: validation with the worker's compiled schemas, batching per session
  within its linger (50 ms);
- ``Publisher``: the same from blocking code (a thread hop per event).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from pipeline import make_events  # noqa: E402

from memdiag.broker import EmbeddedBroker  # noqa: E402
from memdiag.client import AsyncPublisher, Publisher  # noqa: E402
from memdiag.kafka import ensure_topics  # noqa: E402
from memdiag.settings import Settings  # noqa: E402


async def bare(settings: Settings, events: list[dict[str, Any]]) -> float:
    p = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all", linger_ms=5,
                         max_batch_size=1024 * 1024)  # fmt: skip
    await p.start()
    try:
        start = time.monotonic()
        pending = []
        for e in events:
            pending.append(
                await p.send(settings.topics.events, orjson.dumps(e), key=e["session_id"].encode())
            )
        await asyncio.gather(*pending)
        return time.monotonic() - start
    finally:
        await p.stop()


async def async_publisher(settings: Settings, events: list[dict[str, Any]]) -> float:
    async with AsyncPublisher(settings=settings) as p:
        start = time.monotonic()
        for e in events:
            await p.publish(e)
        await p.flush()
        return time.monotonic() - start


def sync_publisher(settings: Settings, events: list[dict[str, Any]]) -> float:
    with Publisher(settings=settings) as p:
        start = time.monotonic()
        for e in events:
            p.publish(e)
        p.flush()
        return time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--sessions", type=int, default=1000)
    args = parser.parse_args()
    events = make_events(args.events, args.sessions)
    with EmbeddedBroker() as broker:
        rates = {}
        for name, run in (
            ("bare aiokafka producer", lambda s: asyncio.run(bare(s, events))),
            ("AsyncPublisher", lambda s: asyncio.run(async_publisher(s, events))),
            ("Publisher (blocking)", lambda s: sync_publisher(s, events)),
        ):
            settings = Settings.from_env({}, broker=broker.url, topic_prefix=f"p{len(rates)}.")
            asyncio.run(ensure_topics(settings))
            rates[name] = args.events / run(settings)
    base = rates["bare aiokafka producer"]
    print(f"{args.events:,} search events over {args.sessions:,} sessions, one Tansu broker")
    print(f"{'contender':<26}{'events/s':>10}{'÷ bare':>9}")
    for name, rate in rates.items():
        print(f"{name:<26}{rate:>10,.0f}{rate / base:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
