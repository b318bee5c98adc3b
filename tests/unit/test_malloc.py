"""``tune_malloc``: a long-running process keeps glibc's mmap threshold fixed, so a large
block freed does not send the next ones of its size to the heap (where they fragment it)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap
from typing import Any

import orjson
import pytest

from memdiag.procs import MALLOC_MMAP_THRESHOLD, glibc


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
# a block nothing free can hold, hence the size; Python's allocator hands such blocks to malloc.
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
    n = max(512 * 1024, libc.mallinfo2().fordblks + 256 * 1024)
    if 2 * n > 32 << 20:  # past glibc's largest dynamic threshold: no premise to test
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


def probe(mode: str, **env: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
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


def test_tuned_a_large_block_is_mapped_whatever_was_freed_before() -> None:
    said = "glibc's mmap and trim thresholds fixed at 128 KB"
    assert probe("tune") == {"said": said, "mapped": True}
    assert MALLOC_MMAP_THRESHOLD == 128 * 1024


def test_the_operators_thresholds_win() -> None:
    said = "glibc's thresholds as the environment sets them"
    # a fixed threshold of the operator's (glibc's largest): the probe's blocks are under it
    tunables = "glibc.malloc.mmap_threshold=33554432"
    assert probe("tune", GLIBC_TUNABLES=tunables) == {"said": said, "mapped": False}
    assert probe("tune", MALLOC_TRIM_THRESHOLD_="1048576")["said"] == said
