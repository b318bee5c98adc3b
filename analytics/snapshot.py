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
    """Copy the file open at ``source_fd`` (from its start) to ``target`` in the kernel:
    ``copy_file_range`` (a reflink on filesystems that have them), else ``sendfile`` (another
    filesystem, such as /dev/shm for a file on disk). Only ``source_fd`` reads the source:
    opening and closing another descriptor of it would let go of the process's lock on it
    (POSIX locks are the process's, per file). The bytes copied."""
    size = os.fstat(source_fd).st_size
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        done = 0
        ranged = True
        while done < size:
            if ranged:
                try:
                    n = os.copy_file_range(source_fd, out, size - done, done, done)
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP,
                                         errno.EINVAL):  # fmt: skip
                        raise
                    ranged = False
                    continue
            else:
                os.lseek(out, done, os.SEEK_SET)
                n = os.sendfile(out, source_fd, done, min(size - done, 1 << 30))
            if n == 0:
                break
            done += n
    finally:
        os.close(out)
    return done


def snapshot_dir(path: Path, directory: str | None = None) -> Path:
    """A private folder (0700) for the snapshots of ``path``: in memory (/dev/shm) where the
    machine has it and it has room for two copies, else the temporary folder. Folders an
    earlier view left (its process gone) are removed first."""
    shm = "/dev/shm"  # noqa: S108 - a private mkdtemp folder inside it
    need = 2 * (path.stat().st_size if path.exists() else 0) + (64 << 20)
    base = directory
    if base is None and os.access(shm, os.W_OK):
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize >= need:
            base = shm
    root = Path(base or tempfile.gettempdir())
    for old in root.glob("memdiag-serve-*"):
        try:
            pid = int((old / "pid").read_text())
            os.kill(pid, 0)  # alive: not ours to remove
        except ProcessLookupError:
            shutil.rmtree(old, ignore_errors=True)
        except (OSError, ValueError):
            pass
    made = Path(tempfile.mkdtemp(prefix="memdiag-serve-", dir=root))
    (made / "pid").write_text(str(os.getpid()))
    return made


_MEMORY_MB = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20
#: each snapshot's DuckDB instance (at most two live at once, one being replaced): a fifth of
#: the machine's memory each, so that the two never take what the sink needs
SNAPSHOT_CONFIG: dict[str, Any] = {
    "python_enable_replacements": False,
    "threads": max(1, min(4, os.cpu_count() or 1)),
    "memory_limit": f"{max(256, _MEMORY_MB // 5)}MB",
}


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
        self._dir = snapshot_dir(self.path, directory)
        self._lock = threading.Lock()
        self._current: Snapshot | None = None
        self._stamp: tuple[Any, ...] | None = None
        self._last_copy = 0.0
        self.version = 0
        self.state = MISSING
        self.detail = ""
        #: copies taken, copies put off because the sink held the file, copies that failed
        self.copies = 0
        self.busy = 0
        self.failed = 0
        self._said_at = -1e9

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
        try:
            taken = self._copy(stamps)
        except OSError as exc:  # no room, no permission: keep what we have, say so now and then
            self.failed += 1
            if now - self._said_at >= 60:
                log.warning("cannot take a snapshot of %s (%s); the pages show the one from "
                            "before, and the view tries again", self.path, exc)  # fmt: skip
                self._said_at = now
            if self._current is None:
                self.state, self.detail = NOT_DUCKDB, f"cannot copy {self.path}: {exc}"
            return False
        if taken:  # a copy put off (the sink was writing) is tried again at the next tick
            self._last_copy = now
        return taken

    def _copy(self, stamps: tuple[Any, ...]) -> bool:
        target = self._dir / f"v{self.version + 1}.duckdb"
        wal_target = Path(f"{target}.wal")
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
            try:
                size = copy_file(fd, target)
                wal = Path(f"{self.path}.wal")  # another file: its descriptor is not the lock's
                if wal.exists():  # a log a crash left: the copy replays it on opening
                    wal_fd = os.open(wal, os.O_RDONLY)
                    try:
                        copy_file(wal_fd, wal_target)
                    finally:
                        os.close(wal_fd)
            except BaseException:
                for p in (target, wal_target):
                    p.unlink(missing_ok=True)
                raise
        finally:
            os.close(fd)  # lets go of the lock, after the file and its log are copied
        seconds = time.perf_counter() - t0
        try:
            con = duckdb.connect(str(target), read_only=True, config=SNAPSHOT_CONFIG)
        except duckdb.Error as exc:
            for p in (target, wal_target):
                p.unlink(missing_ok=True)
            self._stamp = stamps
            # DuckDB names the file it opened, the copy: the user knows theirs
            said = str(exc).splitlines()[0].replace(str(target), str(self.path))
            detail = f"{self.path} is not a DuckDB file memdiag can read ({said})"
            if self._current is not None:  # it was one a moment ago: keep that, try again
                log.warning("a snapshot of %s did not open (%s); keeping the one before",
                            self.path, said)  # fmt: skip
                self._stamp = None  # the next change (or interval) tries again
                self._last_copy = time.monotonic()
                return False
            self.state, self.detail = NOT_DUCKDB, detail
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
    def reading(self) -> Iterator[tuple[int, duckdb.DuckDBPyConnection]]:
        """The current snapshot's version and a cursor on it, held until the block ends
        (:class:`DatabaseError` when there is none)."""
        with self._lock:
            snap = self._current
            if snap is None:
                raise DatabaseError(self.detail or f"no DuckDB file at {self.path}")
            snap.users += 1
        try:
            cur = snap.con.cursor()
            try:
                yield snap.version, cur
            finally:
                cur.close()
        finally:
            with self._lock:
                snap.users -= 1
                if snap.retired and snap.users == 0:
                    snap.close()

    @contextmanager
    def cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor on the current snapshot (:class:`DatabaseError` when there is none)."""
        with self.reading() as (_, cur):
            yield cur

    def close(self) -> None:
        self._swap(None)
        shutil.rmtree(self._dir, ignore_errors=True)
