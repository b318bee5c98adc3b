"""``memdiag worker`` under tracemalloc, for ``benchmarks/memory_live.py``.

    PYTHONPATH=benchmarks python -m traced_worker worker

A daemon thread samples the traced memory every ``MEMDIAG_TRACE_EVERY`` seconds (2); each
time it passes its highest so far, it writes what holds it, by source line and by file, to
``MEMDIAG_TRACE_OUT``: the allocation sites of the peak the Python heap reached, with the
process's RSS and what RocksDB says it holds at that moment.
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
import time
import tracemalloc


def _outside() -> str:
    """What the process holds beside the Python heap: its RSS, and RocksDB's own count."""
    from memdiag.streams.store import rocks_memory

    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    rocks = rocks_memory()
    return (f"RSS {rss / 1e3:.1f} MB, RocksDB block cache {rocks['block_cache'] / 1e6:.1f} MB, "
            f"write buffers {rocks['write_buffers'] / 1e6:.1f} MB")  # fmt: skip


def _sampler(out: str, every: float) -> None:
    highest = 0
    while True:
        time.sleep(every)
        current, _ = tracemalloc.get_traced_memory()
        if current <= highest:
            continue
        highest = current
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)]
        )
        lines = [f"traced {current / 1e6:.1f} MB at {time.time():.0f}; {_outside()}", "",
                 "by line:"]  # fmt: skip
        lines += [f"  {s.size / 1e6:8.1f} MB {s.count:>9,}  {s.traceback}"
                  for s in snapshot.statistics("lineno")[:30]]  # fmt: skip
        lines += ["", "by file:"]
        lines += [f"  {s.size / 1e6:8.1f} MB {s.count:>9,}  {s.traceback}"
                  for s in snapshot.statistics("filename")[:20]]  # fmt: skip
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.replace(tmp, out)


def main() -> None:
    tracemalloc.start(1)
    out = os.environ["MEMDIAG_TRACE_OUT"]
    every = float(os.environ.get("MEMDIAG_TRACE_EVERY", "2"))
    threading.Thread(target=_sampler, args=(out, every), daemon=True).start()
    sys.argv = ["memdiag", *sys.argv[1:]]
    runpy.run_module("memdiag.cli", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
