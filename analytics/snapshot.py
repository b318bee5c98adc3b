"""A reader's own copy of the DuckDB file, so that readers never stand in the sink's way.

DuckDB lets one process write a file, or any number read it, never both: a reader that holds
the file open while the sink wants to flush makes the sink wait (:mod:`memdiag.analytics.db`).
``memdiag serve`` answers every page from a snapshot instead. When the file changed (its
size or modification time, or its write-ahead log's), it takes the file's shared lock without
waiting (the lock DuckDB's own readers take), copies the file and its log, and lets go. The
sink can therefore wait at most one copy (milliseconds: a kernel-side copy of a file in the
page cache), at most once per ``min_interval``, however many pages are open or how slow
their queries are. When the sink holds the file, the copy is simply tried again at the next
tick, and pages keep answering from the snapshot they have.

Pages read the snapshot through cursors of one read-only connection; a snapshot replaced
while a page still reads it is closed and deleted when the last reader is done.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from memdiag.analytics.db import DatabaseError

log = logging.getLogger("memdiag.snapshot")

#: the states of the file a view reads
READY, MISSING, NOT_DUCKDB = "ready", "missing", "not_duckdb"


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def copy_file(source_fd: int, target: Path) -> int:
    """Copy the file open at ``source_fd`` (from its start) to ``target``, in the kernel where
    it can: ``copy_file_range`` (a reflink on filesystems that have them), else ``sendfile``.
    The bytes copied."""
    size = os.fstat(source_fd).st_size
    with open(target, "wb") as out:
        done = 0
        try:
            while done < size:
                n = os.copy_file_range(source_fd, out.fileno(), size - done, done, done)
                if n == 0:
                    break
                done += n
        except OSError as exc:  # another filesystem, or no copy_file_range: copy in user space
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            os.lseek(source_fd, done, os.SEEK_SET)
            with os.fdopen(os.dup(source_fd), "rb") as src:
                src.seek(done)
                shutil.copyfileobj(src, out, 1 << 20)
            done = size
    return done


@dataclass
class Snapshot:
    """One copy of the file, read through cursors of one read-only connection."""

    version: int
    path: Path
    con: duckdb.DuckDBPyConnection
    taken_at: float  # time.time() when copied
    copy_seconds: float
    bytes: int
    users: int = 0
    retired: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        try:
            self.con.close()
        finally:
            for p in (self.path, Path(f"{self.path}.wal")):
                p.unlink(missing_ok=True)


class Snapshots:
    """The latest snapshot of the DuckDB file at ``path``, refreshed by :meth:`refresh`."""

    def __init__(self, path: str | Path, min_interval: float = 1.0, directory: str | None = None):
        self.path = Path(path)
        self.min_interval = min_interval
        # in memory where the machine has it; mkdtemp makes the folder ours alone (0700)
        shm = "/dev/shm"  # noqa: S108 - a private mkdtemp folder inside it
        base = directory or (shm if os.access(shm, os.W_OK) else None)
        self._dir = Path(tempfile.mkdtemp(prefix="memdiag-serve-", dir=base))
        self._lock = threading.Lock()
        self._current: Snapshot | None = None
        self._stamp: tuple[Any, ...] | None = None
        self._last_copy = 0.0
        self.version = 0
        self.state = MISSING
        self.detail = ""
        #: copies taken, and copies put off because the sink held the file
        self.copies = 0
        self.busy = 0

    def _stamps(self) -> tuple[Any, ...] | None:
        main = _stamp(self.path)
        return None if main is None else (main, _stamp(Path(f"{self.path}.wal")))

    def refresh(self, now: float | None = None) -> bool:
        """Take a new snapshot if the file changed and the last copy is ``min_interval`` old;
        True when one was taken (or the file's state changed). Never waits for the sink."""
        now = time.monotonic() if now is None else now
        stamps = self._stamps()
        if stamps is None:
            changed = self.state != MISSING
            self.state, self.detail = MISSING, f"no DuckDB file at {self.path}"
            if changed:
                self._swap(None)
            return changed
        if stamps == self._stamp and self.state != MISSING:
            return False
        if now - self._last_copy < self.min_interval and self._current is not None:
            return False
        taken = self._copy(stamps)
        self._last_copy = now
        return taken

    def _copy(self, stamps: tuple[Any, ...]) -> bool:
        target = self._dir / f"v{self.version + 1}.duckdb"
        t0 = time.perf_counter()
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            try:
                # DuckDB's readers take this lock; the sink's write lock excludes it
                fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    self.busy += 1  # the sink is writing: try again at the next tick
                    return False
                raise
            stamps = self._stamps() or stamps  # as locked: nothing moves it now
            size = copy_file(fd, target)
            wal = Path(f"{self.path}.wal")
            if wal.exists():  # a log a crash left: the copy replays it on opening
                with open(wal, "rb") as w:
                    copy_file(w.fileno(), Path(f"{target}.wal"))
        finally:
            os.close(fd)  # lets go of the lock
        seconds = time.perf_counter() - t0
        try:
            con = duckdb.connect(
                str(target), read_only=True, config={"python_enable_replacements": False}
            )
        except duckdb.Error as exc:
            for p in (target, Path(f"{target}.wal")):
                p.unlink(missing_ok=True)
            self._stamp = stamps
            self.state = NOT_DUCKDB
            self.detail = (
                f"{self.path} is not a DuckDB file memdiag can read ({str(exc).splitlines()[0]})"
            )
            self._swap(None)
            return True
        self.version += 1
        self._stamp = stamps
        self.state, self.detail = READY, ""
        self.copies += 1
        self._swap(Snapshot(self.version, target, con, time.time(), seconds, size))
        return True

    def _swap(self, new: Snapshot | None) -> None:
        with self._lock:
            old, self._current = self._current, new
            if old is not None:
                old.retired = True
                if old.users == 0:
                    old.close()

    @property
    def current(self) -> Snapshot | None:
        return self._current

    @contextmanager
    def cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor on the current snapshot (:class:`DatabaseError` when there is none)."""
        with self._lock:
            snap = self._current
            if snap is None:
                raise DatabaseError(self.detail or f"no DuckDB file at {self.path}")
            snap.users += 1
        cur = snap.con.cursor()
        try:
            yield cur
        finally:
            cur.close()
            with self._lock:
                snap.users -= 1
                if snap.retired and snap.users == 0:
                    snap.close()

    def close(self) -> None:
        self._swap(None)
        shutil.rmtree(self._dir, ignore_errors=True)
