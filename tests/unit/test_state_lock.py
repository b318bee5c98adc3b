"""A partition's state database that another process on this machine still holds
(``memdiag.streams.store.open_rocks``): two workers with one MEMDIAG_STATE_DIR, a partition
moving from one to the other, the new owner told before the old one has closed it (found by
``make chaos``: the new owner crashed on RocksDB's lock)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memdiag.streams.store import open_rocks

#: holds the database at argv[1] until its standard input closes
HOLD = """
import sys
from pathlib import Path
from memdiag.streams.store import RocksBackend
backend = RocksBackend(Path(sys.argv[1]))
print("held", flush=True)
sys.stdin.read()
backend.close()
"""


def holder(path: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
    return proc


def test_a_database_another_process_holds_is_waited_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state-v2-0"
    proc = holder(path)
    assert proc.stdin is not None
    stdin = proc.stdin

    async def go() -> float:
        asyncio.get_running_loop().call_later(0.5, stdin.close)  # the old owner closes it
        started = time.monotonic()
        backend = await open_rocks(path, 1 << 20, 1 << 20, wait_seconds=20)
        backend.write({b"k": b"v"}, 1)
        assert backend.get(b"k") == b"v"
        backend.close()
        return time.monotonic() - started

    caplog.set_level("INFO", logger="memdiag.worker")
    waited = asyncio.run(go())
    assert proc.wait(10) == 0
    proc.stdout.close()  # type: ignore[union-attr]
    assert waited >= 0.4  # it waited for the holder, and did not raise
    assert "still held by another process" in caplog.text


def test_one_held_past_the_wait_fails_saying_what_to_look_for(tmp_path: Path) -> None:
    path = tmp_path / "state-v2-0"
    proc = holder(path)
    assert proc.stdin is not None
    try:
        with pytest.raises(RuntimeError, match="same MEMDIAG_STATE_DIR and MEMDIAG_APP_ID"):
            asyncio.run(open_rocks(path, 1 << 20, 1 << 20, wait_seconds=0.5))
    finally:
        proc.stdin.close()
        proc.wait(10)
        proc.stdout.close()  # type: ignore[union-attr]
