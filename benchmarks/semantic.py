"""The semantic rule's cost: the real worker with MEMDIAG_DETECTOR=semantic against the
keyword rule, in one run, on a mix where every turn injects five memories (issue #39).

    .venv/bin/python benchmarks/semantic.py [--sessions 1200] [--turns 6] [--runs 2]

One embedded broker (Tansu); per mode (single events, and arrays of a session's events as
``memdiag publish`` sends them) and per run, the same events are published under a fresh
topic prefix for each detector, and the worker (its own consumer group) is timed from its
first record until its group has committed the end of the input, as ``pipeline.py`` times
it; the detectors alternate which goes first. Each session: a search, an injection of five
memories and a response, ``--turns`` times, then its outcome. The memories come from a pool
of 2,000 one- or two-sentence notes, so a memory comes again as in a real memory system
(the worker remembers a memory's vectors by its content); a response is 2-4 sentences, one
of them often about a memory of its turn. Prints events/s and the worker's CPU per event,
and semantic over keyword: the target is >= 0.5x.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import shutil
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from pipeline import messages, publish, run_memdiag  # noqa: E402

from memdiag.broker import EmbeddedBroker  # noqa: E402
from memdiag.kafka import ensure_topics  # noqa: E402
from memdiag.settings import Settings  # noqa: E402

NOUNS = (
    "token key cache index query pool migration invoice webhook bundle deploy canary rollout "
    "schema replica cluster queue worker secret vault config flag build release branch test "
    "pipeline dashboard alert metric trace span endpoint client session cookie header"
).split()
VERBS = "rotate refresh rebuild restart pin bump retry drain flush purge sign verify".split()
MODIFIERS = "staging production nightly weekly legacy primary regional shared".split()


def sentence(r: random.Random) -> str:
    return (f"{r.choice(VERBS).capitalize()} the {r.choice(MODIFIERS)} {r.choice(NOUNS)} "
            f"before the {r.choice(NOUNS)} {r.choice(NOUNS)} {r.choice(VERBS)}s.")  # fmt: skip


def make_events(sessions: int, turns: int, seed: int = 11) -> list[dict[str, Any]]:
    r = random.Random(seed)
    pool = [" ".join(sentence(r) for _ in range(r.randint(1, 2))) for _ in range(2000)]
    events: list[dict[str, Any]] = []
    for s in range(sessions):
        sid = f"ses_{s:05d}"
        t0 = 1_795_000_000 + r.random() * 3600
        base = {"session_id": sid, "agent_id": "agent-bench"}
        for t in range(turns):
            ts = t0 + t * 30
            memories = r.sample(range(len(pool)), 5)
            said = [sentence(r) for _ in range(r.randint(1, 3))]
            if r.random() < 0.6:  # about one of its memories
                said.insert(
                    r.randrange(len(said) + 1), pool[r.choice(memories)].split(".")[0] + "."
                )
            stamp = _ts(ts)
            events += [
                {**base, "kind": "search", "event_id": f"{sid}-{t}-s", "ts": stamp(0),
                 "query": r.choice(NOUNS), "source": "agent",
                 "result_ids": [f"obs_{m:04d}" for m in memories]},
                {**base, "kind": "injection", "event_id": f"{sid}-{t}-i", "ts": stamp(1),
                 "turn_id": f"t{t}",
                 "observations": [{"id": f"obs_{m:04d}", "content": pool[m]} for m in memories]},
                {**base, "kind": "response", "event_id": f"{sid}-{t}-r", "ts": stamp(2),
                 "turn_id": f"t{t}", "text": " ".join(said)},
            ]  # fmt: skip
        events.append(
            {
                **base,
                "kind": "session_outcome",
                "event_id": f"{sid}-o",
                "ts": _ts(t0 + turns * 30)(0),
                "outcome": r.choice(["accepted", "rejected", "rework"]),
                "tool_calls": [],
                "files_modified": [],
                "errors": [],
            }  # fmt: skip
        )
    events.sort(key=lambda e: (e["ts"], e["event_id"]))  # sessions interleaved, as they run
    return events


def _ts(seconds: float) -> Any:
    import time

    def at(offset: int) -> str:
        whole = seconds + offset
        return (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
            + f".{int(whole % 1 * 1000):03d}Z"
        )

    return at


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--sessions", type=int, default=1200)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    events = make_events(args.sessions, args.turns)
    n = len(events)
    print(f"{n:,} events: {args.sessions:,} sessions of {args.turns} turns (5 memories each)",
          file=sys.stderr)  # fmt: skip
    workdir = Path(tempfile.mkdtemp(prefix="memdiag-semantic-bench-"))
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        with EmbeddedBroker() as broker:
            for mode in ("single", "batched"):
                msgs = messages(events, mode)
                for run in range(args.runs):
                    order = ("keyword", "semantic") if run % 2 == 0 else ("semantic", "keyword")
                    for detector in order:
                        prefix = f"s{uuid.uuid4().hex[:6]}."
                        settings = dataclasses.replace(
                            Settings.from_env(
                                {},
                                broker=broker.url,
                                topic_prefix=prefix,
                                app_id=f"bench-{prefix[:-1]}",
                            ),  # fmt: skip
                            detector=detector,
                        )
                        asyncio.run(ensure_topics(settings))
                        asyncio.run(publish(settings, msgs))
                        took, cpu = run_memdiag(settings, workdir)
                        results.setdefault((mode, detector), []).append((took, cpu))
                        print(f"  {mode} run {run + 1} {detector}: {n / took:,.0f} events/s, "
                              f"{cpu / n * 1e6:,.0f} CPU µs/event", file=sys.stderr)  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{n:,} events, every turn injecting 5 memories; median of {args.runs} runs\n")
    print(f"{'mode':8} {'detector':9} {'events/s':>9} {'CPU µs/event':>13} {'÷ keyword':>10}")
    for mode in ("single", "batched"):
        rate = {d: n / statistics.median(t for t, _ in results[(mode, d)])
                for d in ("keyword", "semantic")}  # fmt: skip
        for d in ("keyword", "semantic"):
            cpu = statistics.median(c for _, c in results[(mode, d)]) / n * 1e6
            ratio = "" if d == "keyword" else f"{rate[d] / rate['keyword']:.2f}"
            print(f"{mode:8} {d:9} {rate[d]:>9,.0f} {cpu:>13,.0f} {ratio:>10}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
