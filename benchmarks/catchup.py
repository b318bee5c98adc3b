"""A catch-up of a sparse backlog through the session stage: the cost of forgetting, as a
ratio against the same events published at once.

    .venv/bin/python benchmarks/catchup.py [--days 3] [--every 2] [--rounds 3]

A worker that was down catches up on days of traffic. Its processing clock is the Kafka
timestamps of the backlog, so while it catches up it forgets sessions as it would have live:
a sweep each minute of those timestamps (``memdiag.streams.session.states``), right after
the record that makes it due. The backlog here: one search every ``--every`` seconds over
``--days`` days, each of a new session (the sparse case: every session is forgotten, and its
tombstone kept seven days), a message each, in batches of 1,000 messages, settled every 10
batches, as the runner does. The baseline, in the same process and alternating with it, is
the same messages with one publish time (nothing is forgotten, one sweep). The ratio is what
forgetting costs a catch-up; CPU microseconds an event beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import orjson

from memdiag.contract.envelope import DictStore, InMessage
from memdiag.kafka import partition_for
from memdiag.procs import tune_gc
from memdiag.settings import Settings
from memdiag.streams.stages.sessions import SessionStage

PARTITIONS = 4
BATCH = 1000
SETTLE_EVERY = 10
T0_MS = 1_795_000_000_000


def backlog(days: float, every_s: float, at_once: bool) -> list[InMessage]:
    n = int(days * 86_400 / every_s)
    end_ms = T0_MS + int(n * every_s * 1000)
    msgs = []
    for i in range(n):
        ms = T0_MS + int(i * every_s * 1000)
        sid = f"ses_{i:08d}"
        event = {
            "kind": "search", "event_id": f"e{i}", "session_id": sid, "agent_id": "a",
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + "Z",
            "query": "where is the deploy runbook", "result_ids": ["obs_1", "obs_2"],
        }  # fmt: skip
        key = sid.encode()
        msgs.append(InMessage("events", partition_for(key, PARTITIONS), i, key,
                              orjson.dumps(event), end_ms if at_once else ms))  # fmt: skip
    return msgs


def one_round(msgs: list[InMessage], wall_ms: int) -> float:
    stage = SessionStage(Settings.from_env(), lambda s: partition_for(s.encode(), PARTITIONS),
                         wall_ms=lambda: wall_ms)  # fmt: skip
    store = DictStore()
    start = time.process_time()
    for n, i in enumerate(range(0, len(msgs), BATCH), 1):
        stage.process(msgs[i : i + BATCH], store)
        if n % SETTLE_EVERY == 0:
            stage.settle(store)
    stage.settle(store)
    return time.process_time() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=3.0)
    parser.add_argument("--every", type=float, default=2.0, help="seconds between two events")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tune_gc()
    sparse = backlog(args.days, args.every, at_once=False)
    burst = backlog(args.days, args.every, at_once=True)
    wall = T0_MS + int(args.days * 86_400_000) + 60_000
    n = len(sparse)
    times: dict[str, list[float]] = {"sparse": [], "at once": []}
    for _ in range(args.rounds):
        times["sparse"].append(one_round(sparse, wall) / n * 1e6)
        times["at once"].append(one_round(burst, wall) / n * 1e6)
    print(f"{n:,} events over {args.days:g} days, one every {args.every:g} s, each its own "
          f"session; CPU µs an event, median of {args.rounds}")  # fmt: skip
    for name, values in times.items():
        print(f"  {name:<8}{statistics.median(values):8.1f}")
    ratio = statistics.median(s / b for s, b in zip(times["sparse"], times["at once"], strict=True))
    print(f"  sparse ÷ at once: {ratio:.2f} (what forgetting costs a catch-up)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
