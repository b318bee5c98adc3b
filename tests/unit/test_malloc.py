"""``tune_malloc``: a long-running process keeps glibc's mmap threshold fixed, so a large
block freed does not send the next ones of its size to the heap (where they fragment it)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from memdiag.procs import MALLOC_MMAP_THRESHOLD

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION")),
    reason="the thresholds are glibc's",
)

# In a fresh interpreter: free a 1 MB block (glibc then raises its threshold to 1 MB unless
# it is fixed), allocate 512 KB, and say whether that block was mapped on its own (mallinfo2's
# hblkhd: the bytes in mapped blocks). Python's allocator hands blocks over 512 bytes to malloc.
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
    tuned = tune_malloc() if sys.argv[1] == "tune" else False
    big = bytearray(1 << 20)
    del big
    before = libc.mallinfo2().hblkhd
    block = bytearray(512 * 1024)
    mapped = libc.mallinfo2().hblkhd - before >= 512 * 1024
    print(json.dumps({"tuned": tuned, "mapped": mapped}))
    """
)


def probe(mode: str, **env: str) -> dict[str, bool]:
    import orjson

    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        env={
            k: v
            for k, v in os.environ.items()
            if k not in ("GLIBC_TUNABLES", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
        }
        | env,
        capture_output=True,
        check=True,
        timeout=60,
    )
    return orjson.loads(out.stdout)


def test_without_it_glibc_raises_the_threshold_after_a_large_free() -> None:
    # the premise: glibc's dynamic threshold sends the next 512 KB block to the heap
    assert probe("plain") == {"tuned": False, "mapped": False}


def test_tuned_a_large_block_is_mapped_whatever_was_freed_before() -> None:
    assert probe("tune") == {"tuned": True, "mapped": True}
    assert MALLOC_MMAP_THRESHOLD <= 512 * 1024


def test_the_operators_glibc_tunables_win() -> None:
    tunables = "glibc.malloc.mmap_threshold=4194304"
    assert probe("tune", GLIBC_TUNABLES=tunables) == {"tuned": False, "mapped": False}
    assert probe("tune", MALLOC_TRIM_THRESHOLD_="1048576")["tuned"] is False
