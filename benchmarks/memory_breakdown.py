"""Where the worker's memory goes, by what holds it: tracemalloc over the worker's stages.

    .venv/bin/python benchmarks/memory_breakdown.py [--sessions 20000] [--agents 0]

The generated scenario of the determinism suite (``tests/scenario.py``) goes through the
worker's own runner, checkpoint and stages in memory (``tests/inmemory.py``: no broker, no
Faust), with tracemalloc on. Then each thing that keeps memory between batches is emptied
in turn, and the memory it held is what tracemalloc's total drops by:

- the stages' caches of decoded state (sessions, ledgers, graph ledgers, strengths, traces,
  recall agents), each with its count of entries and bytes per entry;
- the process-wide caches (an observation's keywords, by content);
- the table's values (the in-memory world keeps them in a dict; the worker keeps them in
  RocksDB, off the Python heap, so they are shown apart and not part of the worker's total).

The rest is the interpreter, the modules and what tracemalloc cannot attribute. The ratio
column says each part against the decoded sessions' cache, the baseline of this same run.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memdiag.settings import Settings  # noqa: E402
from memdiag.streams.rules import feedback  # noqa: E402
from tests.inmemory import World  # noqa: E402
from tests.scenario import generate  # noqa: E402


def held(empty: Callable[[], None]) -> int:
    """Bytes tracemalloc's total drops by when ``empty`` runs."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    empty()
    gc.collect()
    return before - tracemalloc.get_traced_memory()[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--agents", type=int, default=0)
    args = parser.parse_args()
    events = generate(sessions=args.sessions, seed=5, agents=args.agents)
    print(f"{args.sessions:,} sessions, {len(events):,} events", flush=True)
    tracemalloc.start(1)
    world = World(Settings())
    world.publish(events)
    started = time.perf_counter()
    world.run(max_batch=500)
    print(f"processed in {time.perf_counter() - started:.0f} s (tracemalloc on)", flush=True)
    # what the sink's side of the world keeps is not the worker's: forget it first
    world.tables = type(world.tables)()
    world.records.clear()
    world.weights.clear()
    world.strengths.clear()
    world.graph_weights.clear()
    world.logs.clear()
    world.changelog_appends.clear()
    gc.collect()
    total = tracemalloc.get_traced_memory()[0]
    s, o, t, r = world.processor.states, world.owner, world.trace_stage, world.recall_stage
    parts: list[tuple[str, int, int]] = []
    #: what the decoded-state budget (streams/lru.py) counts each cache at
    budgeted: dict[str, int] = {}

    def part(name: str, entries: int, empty: Callable[[], None]) -> None:
        parts.append((name, entries, held(empty)))

    for name, cache in (("decoded sessions", s._cache), ("decoded ledgers", o._cache),
                        ("decoded graph ledgers", o._graph_cache),
                        ("strengths", o._strengths)):  # fmt: skip
        budgeted[name] = sum(cache._weights.values())
        part(name, len(cache), cache.clear)
    part("traces", len(t._cache), t._cache.clear)
    agents = getattr(r, "_agents", {})
    part("recall agents", len(agents), agents.clear)
    part(
        "keywords by content",
        feedback.keywords.cache_info().currsize,
        feedback.keywords.cache_clear,
    )
    encoded: dict[str, list[int]] = {}
    for b in world.table.backends.values():
        for key, value in b.data.items():
            kind = key.split(b":", 1)[0].decode() + ":"
            encoded.setdefault(kind, [0, 0])
            encoded[kind][0] += 1
            encoded[kind][1] += len(value)
    print("encoded state by key prefix: " + ", ".join(
        f"{k} {n:,} x {size / n:,.0f} B" for k, (n, size) in sorted(encoded.items())))  # fmt: skip
    values = sum(len(b.data) for b in world.table.backends.values())
    part("table values (RocksDB in the worker)", values,
         lambda: [b.data.clear() for b in world.table.backends.values()])  # fmt: skip
    base = parts[0][2] or 1
    print(f"\n{'held by':<40}{'entries':>10}{'MB':>10}{'B/entry':>10}{'ratio':>8}"
          f"{'budgeted':>10}")  # fmt: skip
    for name, entries, size in parts:
        per = size / entries if entries else 0
        counted = f"{budgeted[name] / 1e6:>10.1f}" if name in budgeted else ""
        print(f"{name:<40}{entries:>10,}{size / 1e6:>10.1f}{per:>10,.0f}{size / base:>8.2f}"
              f"{counted}")  # fmt: skip
    rest = total - sum(size for _, _, size in parts)
    print(f"{'the rest (interpreter, modules, ...)':<40}{'':>10}{rest / 1e6:>10.1f}")
    print(f"{'traced in all':<40}{'':>10}{total / 1e6:>10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
