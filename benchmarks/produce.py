"""The worker's producer path against aiokafka's ``send``, in one process, on the embedded
broker: CPU per record to queue and deliver.

    .venv/bin/python benchmarks/produce.py [--records 60000] [--rounds 3] [--rows 1]

The records are what single-event traffic makes: a row of about 400 bytes a record, keyed by
1,000 sessions over 4 partitions. With ``--rows N``, what batched traffic makes: each record a
JSON array of N such rows (a message's rows for one session, as the sender packs them),
``--records`` rows in all; the figures are then CPU per row. The baseline is aiokafka's
``send`` (a future a record) and waiting for every future; memdiag's is
:class:`memdiag.streams.produce.Batches` (its batch API: a record appended to its partition's
open batch, one future a batch), flushed every 1,000 records as the sender does after each
output, and waiting for its batches. The producer is configured as the worker's (512 KiB
batches, 8 MiB requests, acks all). Rounds alternate; best and median of each.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from aiokafka import AIOKafkaProducer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memdiag.broker import EmbeddedBroker  # noqa: E402
from memdiag.kafka import DefaultPartitioner, ensure_topics  # noqa: E402
from memdiag.settings import Settings  # noqa: E402
from memdiag.streams.produce import Batches  # noqa: E402

ROW = b'{"kind":"search",' + b"x" * 383


async def rounds(
    settings: Settings, n: int, count: int, value: bytes, rows: int
) -> dict[str, list[float]]:
    """CPU µs a row of ``n`` records of ``value`` (``rows`` rows each), ``count`` rounds."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks=-1,
                                linger_ms=5, max_batch_size=512 * 1024,
                                max_request_size=8 << 20)  # fmt: skip
    await producer.start()
    topic = settings.topics.diagnostics
    keys = [b"ses_%05d" % (i % 1000) for i in range(n)]
    out: dict[str, list[float]] = {"send": [], "batches": []}
    try:
        await producer.send_and_wait(topic, value, key=keys[0])  # metadata, connection
        for _ in range(count):
            start = time.process_time()
            futures = [await producer.send(topic, value, key=k) for k in keys]
            await asyncio.gather(*futures)
            out["send"].append((time.process_time() - start) / (n * rows) * 1e6)
            batches = Batches(lambda: producer, DefaultPartitioner())
            start = time.process_time()
            sent = []
            for i, k in enumerate(keys, 1):
                await batches.add(topic, k, value)
                if i % 1000 == 0:
                    sent += await batches.flush()
            sent += await batches.flush()
            await asyncio.gather(*sent)
            out["batches"].append((time.process_time() - start) / (n * rows) * 1e6)
    finally:
        await producer.stop()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1,
                        help="rows a record, as a JSON array (1: one row, not an array)")
    args = parser.parse_args()
    rows = max(1, args.rows)
    value = ROW if rows == 1 else b"[" + b",".join([ROW] * rows) + b"]"
    records = max(1, args.records // rows)
    with EmbeddedBroker() as broker:
        settings = Settings.from_env({}, broker=broker.url, topic_prefix="produce.",
                                     app_id="produce")  # fmt: skip
        asyncio.run(ensure_topics(settings))
        got = asyncio.run(rounds(settings, records, args.rounds, value, rows))
    base, ours = got["send"], got["batches"]
    what = "record" if rows == 1 else "row"
    print(f"{records:,} records of {len(value):,} bytes ({rows} rows each), {args.rounds} "
          f"rounds; CPU µs a {what}, queued and delivered (best / median)")  # fmt: skip
    print(f"  aiokafka send        {min(base):6.2f} / {statistics.median(base):.2f}")
    print(f"  memdiag Batches      {min(ours):6.2f} / {statistics.median(ours):.2f}")
    print(f"  send ÷ Batches       {statistics.median(base) / statistics.median(ours):6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
