"""``tune_malloc``: a long-running process keeps glibc's mmap threshold fixed (at 1 MB), so
a large block freed does not send the next ones of its size to the heap, while a record
batch or a socket read (under it) is reused from the heap rather than mapped afresh; and
``heap_trimmer`` gives the heap's free pages back."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from typing import Any

import orjson
import pytest

from memdiag import procs
from memdiag.procs import MALLOC_MMAP_THRESHOLD, MALLOC_TRIM_THRESHOLD, glibc


def _glibc_233() -> bool:
    if not glibc():
        return False
    major, _, minor = platform.libc_ver()[1].partition(".")
    return (int(major), int(minor or 0)) >= (2, 33)  # mallinfo2 came with 2.33


pytestmark = pytest.mark.skipif(not _glibc_233(), reason="glibc's thresholds (mallinfo2: 2.33+)")

# In a fresh interpreter: allocate and free a block twice the size of one the heap's free
# space cannot hold (glibc maps it, and on its free raises its threshold past that size
# unless the threshold is fixed), then allocate that one, and say whether it was mapped on
# its own (mallinfo2's hblkhd: the bytes in mapped blocks). glibc asks the threshold only of
# a block nothing free can hold, hence the size (at least ``argv[2]`` bytes); Python's
# allocator hands such blocks to malloc.
PROBE = textwrap.dedent(
    """
    import ctypes, json, sys
    from memdiag.procs import tune_malloc

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    said = tune_malloc() if sys.argv[1] == "tune" else ""
    n = max(int(sys.argv[2]), libc.mallinfo2().fordblks + 256 * 1024)
    if 2 * n > 32 << 20 or n > int(sys.argv[3]):  # past glibc's largest dynamic threshold, or
        # past the size the test is about: no premise to test
        print(json.dumps({"skip": n}))
        raise SystemExit(0)
    big = bytearray(2 * n)
    del big
    before = libc.mallinfo2().hblkhd
    block = bytearray(n)
    mapped = libc.mallinfo2().hblkhd - before >= n
    print(json.dumps({"said": said, "mapped": mapped}))
    """
)

#: what would change the allocator under the probe
_NOT_INHERITED = ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                  "PYTHONMALLOC", "PYTHONTRACEMALLOC", "PYTHONDEVMODE", "LD_PRELOAD")  # fmt: skip


def probe(mode: str, size: int = MALLOC_MMAP_THRESHOLD + (256 << 10), under: int = 1 << 40,
          **env: str) -> dict[str, Any]:  # fmt: skip
    """The probe in a fresh interpreter, its block at least ``size`` bytes (skipped if the
    heap's free space makes it ``under`` bytes or more)."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode, str(size), str(under - 1)],
        env={k: v for k, v in os.environ.items() if k not in _NOT_INHERITED} | env,
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    found: dict[str, Any] = orjson.loads(out.stdout)
    if "skip" in found:
        pytest.skip(f"the heap already has about {found['skip'] >> 20} MB free")
    return found


def test_without_it_glibc_raises_the_threshold_after_a_large_free() -> None:
    # the premise: glibc's dynamic threshold sends the next large block to the heap
    assert probe("plain") == {"said": "", "mapped": False}


SAID = "glibc's mmap threshold fixed at 1 MB, its trim threshold at 2 MB"


def test_tuned_a_block_over_the_threshold_is_mapped_whatever_was_freed_before() -> None:
    assert (MALLOC_MMAP_THRESHOLD, MALLOC_TRIM_THRESHOLD) == (1 << 20, 2 << 20)
    assert probe("tune") == {"said": SAID, "mapped": True}


def test_tuned_a_block_under_the_threshold_comes_from_the_heap() -> None:
    # a record batch's 512 KB: glibc's initial 128 KB would map it afresh (and fault it in
    # page by page) each time
    assert probe("tune", size=512 << 10, under=MALLOC_MMAP_THRESHOLD) == {
        "said": SAID,
        "mapped": False,
    }


def test_the_operators_thresholds_win() -> None:
    said = "glibc's thresholds as the environment sets them"
    # a fixed threshold of the operator's (glibc's largest): the probe's blocks are under it
    tunables = "glibc.malloc.mmap_threshold=33554432"
    assert probe("tune", GLIBC_TUNABLES=tunables) == {"said": said, "mapped": False}
    # the operator's 128 KB: a megabyte is mapped
    tunables = "glibc.malloc.mmap_threshold=131072"
    assert probe("tune", size=1 << 20, GLIBC_TUNABLES=tunables) == {"said": said, "mapped": True}
    assert probe("tune", MALLOC_TRIM_THRESHOLD_="1048576")["said"] == said


# In a fresh interpreter, tuned: 48 blocks of 512 KB from the heap, each followed by a small
# block that stays (so that freeing them leaves holes inside the heap, which glibc's free
# gives back only at its top), all freed; the anonymous memory resident before and after
# the trimmer runs.
TRIM = textwrap.dedent(
    """
    import json
    from memdiag.procs import heap_trimmer, tune_malloc

    def anon_kb():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1])

    tune_malloc()
    trim = heap_trimmer(every=3600)
    big, kept = [], []
    for i in range(48):
        block = bytearray(512 << 10)
        block[::4096] = b"x" * len(block[::4096])  # every page touched: resident
        big.append(block)
        kept.append(bytes(2048))  # a malloc block (over Python's 512 bytes) after it
    del big, block
    freed = anon_kb()
    trim()
    trimmed = anon_kb()
    print(json.dumps({"freed": freed, "trimmed": trimmed}))
    """
)


def test_the_trimmer_gives_back_the_free_pages_inside_the_heap() -> None:
    out = subprocess.run(
        [sys.executable, "-c", TRIM],
        env={k: v for k, v in os.environ.items() if k not in _NOT_INHERITED},
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    found = orjson.loads(out.stdout)
    # about 24 MB were resident in the holes; the trim gives nearly all of them back
    assert found["freed"] - found["trimmed"] >= 20 << 10, found


def test_the_trimmer_trims_at_most_once_an_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    now = [100.0]

    class Libc:
        @staticmethod
        def malloc_trim(pad: int) -> int:
            calls.append(pad)
            return 1

    monkeypatch.setattr(procs.ctypes, "CDLL", lambda name: Libc())
    monkeypatch.setattr(procs.time, "monotonic", lambda: now[0])
    trim = procs.heap_trimmer(every=1.0)
    assert trim is not None
    trim()  # the first: at once
    now[0] += 0.5
    trim()  # half a second later: not again
    now[0] += 0.5
    trim()
    assert calls == [0, 0]


def test_a_slow_trim_is_logged_once_a_minute(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    now = [100.0]

    class Libc:  # a trim of 80 ms
        @staticmethod
        def malloc_trim(pad: int) -> int:
            now[0] += 0.08
            return 1

    monkeypatch.setattr(procs.ctypes, "CDLL", lambda name: Libc())
    monkeypatch.setattr(procs.time, "monotonic", lambda: now[0])
    trim = procs.heap_trimmer(every=0.1)
    assert trim is not None
    with caplog.at_level("WARNING", logger="memdiag.procs"):
        for _ in range(10):
            now[0] += 1.0
            trim()
        said = [r.getMessage() for r in caplog.records]
        assert said == [
            "the heap's trim took 80 ms (the event loop waited); MEMDIAG_HEAP_TRIM_SECONDS "
            "sets how often it runs, 0 never"
        ]
        now[0] += 60.0
        trim()
        assert len(caplog.records) == 2
