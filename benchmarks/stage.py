"""The session stage alone, in this process: CPU per event, against the peers' rule.

    .venv/bin/python benchmarks/stage.py [--events 60000] [--sessions 1000] [--rounds 5]

``make bench`` times whole processes through a broker, and on this machine their CPU per
event drifts by up to 2x between hours (README, "Where memdiag stands"). This takes the
broker, the producer and the fetch out: the pipeline benchmark's events and messages
(``benchmarks/pipeline.py``), handed to the worker's session stage
(:class:`memdiag.streams.stages.sessions.SessionStage`, a dict for its store) in batches of
1,000 messages as the runner hands them, settled every 10 batches as the runner settles it
before each commit, every diagnostic encoded as the worker's sender encodes it. The
baseline, in the same process and alternating with it round by round, is what the peers do
per message in that benchmark: ``orjson.loads``, the followup rule of
each event over a dict, ``orjson.dumps`` of the verdicts. The ratio stage ÷ baseline moves
much less than either figure: it is the figure to judge a change of the stage by.

``--opcodes`` counts instead of timing: the Python bytecodes an event of the stage and of
the baseline, and the stage's largest functions (exact, whatever the machine's speed).

Both with CPython's default collector thresholds replaced by the worker's
(:func:`memdiag.procs.tune_gc`). Best and median of ``--rounds`` rounds, each mode.

The batches mix every partition's messages, as live traffic does: with single events of
1,000 interleaved sessions, the sessions outgrow the decoded-state budget
(``MEMDIAG_DECODED_CACHE_MB``, read from the environment), and a session evicted is decoded
again and replayed from its log when it next comes. Held between two write-backs (a settle,
or every ``WRITE_BACK_AT`` sessions decoded), it is decoded at most once between them
(before the stage held them, once a batch): single mode's median was 64 us an event at
32 MB and 57 at 256 MB on 27 Nov 2026. (The old code measured 130-170 at 32 MB that day,
and 64-72 at 256 MB, on this script without settles; this docstring's older figures, 88
and 46, were another hour's.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from types import FrameType
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipeline import followup, make_events, messages  # noqa: E402

from memdiag.contract.envelope import DictStore, InMessage  # noqa: E402
from memdiag.kafka import partition_for  # noqa: E402
from memdiag.procs import tune_gc  # noqa: E402
from memdiag.settings import Settings  # noqa: E402
from memdiag.streams.sender import _messages  # noqa: E402
from memdiag.streams.stages.sessions import SessionStage  # noqa: E402

PARTITIONS = 4
BATCH = 1000  # messages a call, as the runner's MAX_BATCH
#: batches between two settles (the held sessions written), as the worker settles before each
#: commit: a second of single events, at about 10,000 a second
SETTLE_EVERY = 10
PUBLISHED_MS = 1_795_000_000_000 + 10_000_000  # after every event: none is "from the future"


@lru_cache(maxsize=16_384)
def partition_of(session_id: str) -> int:
    """As the worker's (``memdiag.streams.wiring``): remembered per session."""
    return partition_for(session_id.encode("utf-8"), PARTITIONS)


def stage_round(msgs: list[InMessage]) -> float:
    """Seconds of CPU for the session stage over every message, outputs encoded."""
    stage = SessionStage(Settings.from_env(), partition_of)
    store = DictStore()
    start = time.process_time()
    for n, i in enumerate(range(0, len(msgs), BATCH), 1):
        out = stage.process(msgs[i : i + BATCH], store)
        for records in out.diagnostics.values():
            _messages(records, orjson.dumps, 1_000_000, "diagnostics", None)
        if n % SETTLE_EVERY == 0:
            stage.settle(store)
    stage.settle(store)
    return time.process_time() - start


def baseline_round(msgs: list[InMessage]) -> float:
    """Seconds of CPU for the peers' work per message: decode, the rule, encode."""
    last: dict[str, Any] = {}
    start = time.process_time()
    for msg in msgs:
        doc = orjson.loads(msg.value or b"[]")
        evs = doc if isinstance(doc, list) else [doc]
        orjson.dumps([[e["event_id"], followup(last, e)] for e in evs])
    return time.process_time() - start


def opcodes(run: Callable[[list[InMessage]], float], msgs: list[InMessage]) -> Counter[str]:
    """Python bytecodes executed by one round, by function (a trace function that asks for
    every opcode: slow, but exact, and the machine's speed does not enter). Native code
    (msgspec, orjson, dict and list methods) counts as the one call that reaches it. The
    round's own loop counts too: the baseline's is its work."""
    counts: Counter[str] = Counter()
    root = f"{Path(__file__).resolve().parents[1]}/"

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            counts[f"{code.co_filename.removeprefix(root)}:{code.co_name}"] += 1
        return trace

    run(msgs)  # the caches warm, as in the timed rounds
    sys.settrace(trace)
    try:
        run(msgs)
    finally:
        sys.settrace(None)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--sessions", type=int, default=1_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--opcodes", action="store_true",
        help="count the Python bytecodes an event, stage and baseline, instead of timing them "
        "(exact; --events 6000 --sessions 100 keeps the shape of the default and is enough)",
    )  # fmt: skip
    args = parser.parse_args()
    tune_gc()
    events = make_events(args.events, args.sessions)
    if args.opcodes:
        for mode in ("single", "batched"):
            msgs = [
                InMessage("events", partition_for(key, PARTITIONS), i, key, value, PUBLISHED_MS)
                for i, (key, value) in enumerate(messages(events, mode))
            ]
            stage_ops = opcodes(stage_round, msgs)
            base_ops = opcodes(baseline_round, msgs)
            n = args.events
            print(f"{mode}: stage {sum(stage_ops.values()) / n:,.0f} bytecodes an event, "
                  f"baseline {sum(base_ops.values()) / n:,.0f}; the stage's largest:")  # fmt: skip
            for name, count in stage_ops.most_common(15):
                print(f"  {count / n:8.1f}  {name}")
        return 0
    budget = Settings.from_env().decoded_cache_mb
    print(f"{args.events:,} search events over {args.sessions:,} sessions, {args.rounds} "
          f"rounds a mode, alternating, decoded-state budget {budget} MB; "
          "CPU µs an event (best / median)")  # fmt: skip
    print(f"{'mode':<9}{'stage':>16}{'baseline':>16}{'stage ÷ baseline':>20}")
    for mode in ("single", "batched"):
        msgs = [
            InMessage("events", partition_for(key, PARTITIONS), i, key, value, PUBLISHED_MS)
            for i, (key, value) in enumerate(messages(events, mode))
        ]
        stage: list[float] = []
        base: list[float] = []
        ratios: list[float] = []
        for _ in range(args.rounds):
            stage.append(stage_round(msgs) / args.events * 1e6)
            base.append(baseline_round(msgs) / args.events * 1e6)
            ratios.append(stage[-1] / base[-1])
        print(f"{mode:<9}{min(stage):>8.1f} / {statistics.median(stage):<5.1f}"
              f"{min(base):>8.1f} / {statistics.median(base):<5.1f}"
              f"{statistics.median(ratios):>15.2f}")  # fmt: skip
    print("stage ÷ baseline: the median of the rounds' own ratios")
    return 0


if __name__ == "__main__":
    sys.exit(main())
