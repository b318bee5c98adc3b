"""Child processes that die with their parent (no orphans, even on SIGKILL of the parent),
and the garbage collector and the bounded stop of the long-running ones."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import IO, Any, NoReturn

log = logging.getLogger("memdiag.procs")

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child, between fork and exec
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    os.setpgrp()  # Ctrl-C in the terminal goes to us; we stop the children in order


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    stdout: IO[Any] | int | None = None,
    stderr: IO[Any] | int | None = None,
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # noqa: S603 - argv is built by memdiag, never by input
        list(argv),
        env=dict(env) if env is not None else None,
        stdout=stdout,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        preexec_fn=_die_with_parent,  # noqa: PLW1509 - needed for PDEATHSIG
    )


def stop(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int | None:
    """SIGTERM, then SIGKILL after ``timeout``; returns the exit code."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(5)


#: Allocations between young collections of a long-running process (CPython's is 700).
GC_YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """For a long-running stream process, before its services start: move what exists to
    the permanent generation, and collect the young generation once 50,000 more container
    objects exist instead of 700.

    A stream process allocates a few short-lived objects per record, nearly all freed by
    reference counting, so CPython's default collected the young generation hundreds of
    times a second, each time walking the records still buffered: about a fifth of the
    worker's time on single-event traffic (``make profile``). Cycles are still collected,
    in larger steps: at most 50,000 more objects wait for it (their size is another matter:
    a cycle holding large values keeps them until then)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 10)


#: The allocator's thresholds the worker fixes at start (glibc only): a block of 1 MB or more
#: that the heap's free space cannot hold gets its own mapping, and the heap gives back what
#: is free at its top past 2 MB (twice the first, as glibc's own adjustment keeps them). Fixed,
#: they stay so; the heap's free space inside is given back after commits (:func:`heap_trimmer`).
MALLOC_MMAP_THRESHOLD = 1 << 20
MALLOC_TRIM_THRESHOLD = 2 << 20
_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3


def glibc() -> bool:
    """Whether this process runs on glibc (``mallopt``'s thresholds are glibc's)."""
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def tune_malloc() -> str:
    """Fix glibc's mmap and trim thresholds (:data:`MALLOC_MMAP_THRESHOLD`,
    :data:`MALLOC_TRIM_THRESHOLD`) for a long-running process, as early as it can: it
    returns what it did, for the process's log. It does nothing on another C library, nor
    when the operator set either threshold (``glibc.malloc.mmap_threshold`` or
    ``glibc.malloc.trim_threshold`` in ``GLIBC_TUNABLES``, or ``MALLOC_MMAP_THRESHOLD_``,
    ``MALLOC_TRIM_THRESHOLD_``): glibc then fixes both already, the one not set at its
    initial value.

    Why. glibc starts with both thresholds at 128 KB, and each time a mapped block larger
    than the mmap threshold is freed it raises that threshold to the block's size (up to
    32 MB) and the trim threshold to twice it. A stream process frees large blocks all the
    time (a fetch's records, a produce request and its copies, a checkpoint's encoded
    values, the record batches it fills), so within its first minute the thresholds have
    risen wherever its traffic took them, and the heap keeps up to twice the largest block
    free at its top: in ``benchmarks/scale.py`` the worker's resident memory crept up for
    the whole run (peaks of 273-283 MB at 20,000 sessions, 298-310 MB at 50,000).

    Fixed at glibc's initial 128 KB, they held memory level, but every block from 128 KB
    up was a fresh mapping, faulted in page by page and unmapped when freed: on batched
    traffic 730 MB mapped in 4.5 s, 0.9 page faults an event, about a tenth of the worker's
    CPU. Fixed at 1 MB, the record batches the worker fills (512 KB), the socket's reads and
    the smaller requests and fetches are the heap's again and reused where they were; what
    the heap then holds free between live blocks goes back to the system after commits
    (:func:`heap_trimmer`, which the worker installs whoever set the thresholds). Measured
    on 2026-11-29, rounds alternating in one run: on the batched benchmark 0.95x the CPU an
    event of 128 KB, where 4 MB gave 0.93x; at 20,000 sessions in ``benchmarks/scale.py`` a
    peak of 280 MB (282 at 128 KB), where 4 MB gave 300-317 MB (the heap held more free
    between trims than the pages it saved)."""
    if not glibc():
        return "not glibc: the C library's own thresholds"
    env = os.environ
    tunables = env.get("GLIBC_TUNABLES", "")
    if (
        "glibc.malloc.mmap_threshold" in tunables
        or "glibc.malloc.trim_threshold" in tunables
        or "MALLOC_MMAP_THRESHOLD_" in env
        or "MALLOC_TRIM_THRESHOLD_" in env
    ):
        return "glibc's thresholds as the environment sets them"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "glibc's dynamic thresholds (no mallopt found)"
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    if mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD) and mallopt(
        _M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD
    ):
        return (
            f"glibc's mmap threshold fixed at {MALLOC_MMAP_THRESHOLD >> 20} MB, its trim "
            f"threshold at {MALLOC_TRIM_THRESHOLD >> 20} MB"
        )
    return "glibc's dynamic thresholds (mallopt refused)"


#: a trim this long is logged (at most once a minute)
SLOW_TRIM_SECONDS = 0.05
SLOW_TRIM_SAID_EVERY = 60.0


def heap_trimmer(every: float = 0.1) -> Callable[[], None] | None:
    """A call that gives the heap's free pages back to the system (glibc's
    ``malloc_trim(0)``: the free space between live blocks too, not only at the top), at
    most once every ``every`` seconds; None where there is no glibc. The worker calls it
    after each commit (once the committed checkpoint is freed): the large blocks the
    checkpoints' batches freed are then free pages the next ones fault in again, once a
    trim instead of once a block. It takes 1-2 ms on the batched benchmark, the event loop
    waiting (ctypes lets the other threads run; glibc locks one arena at a time; one over
    :data:`SLOW_TRIM_SECONDS` is logged), so at most ten a second (the worker's default,
    ``MEMDIAG_HEAP_TRIM_SECONDS``) cost 2 % of a core at worst; the commits themselves
    come at most four times an interval but when a checkpoint's bytes make it commit. At
    20,000 sessions in ``benchmarks/scale.py`` the peak was 274 MB trimming after every
    commit, 284 at most every 0.25 s, 280-291 at most once a second (one run each; runs
    move by 10 MB)."""
    if not glibc():
        return None
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    malloc_trim.argtypes = (ctypes.c_size_t,)
    malloc_trim.restype = ctypes.c_int
    last = [-every]
    said = [-SLOW_TRIM_SAID_EVERY]

    def trim() -> None:
        now = time.monotonic()
        if now - last[0] >= every:
            last[0] = now
            malloc_trim(0)
            took = time.monotonic() - now
            if took >= SLOW_TRIM_SECONDS and now - said[0] >= SLOW_TRIM_SAID_EVERY:
                said[0] = now
                log.warning("the heap's trim took %.0f ms (the event loop waited); "
                            "MEMDIAG_HEAP_TRIM_SECONDS sets how often it runs, 0 never",
                            took * 1000)  # fmt: skip

    return trim


#: The exit status of a worker or sink that stopped with work it could not commit (the
#: broker was gone): BSD's EX_TEMPFAIL, "try again later". That work comes again on the next
#: start. 0 is a stop that committed everything it took.
EXIT_UNCOMMITTED = 75


class Shutdown:
    """The stop of a long-running process (``memdiag worker``, ``memdiag sink``) on SIGTERM
    or SIGINT, bounded. The first signal starts the stop: the process commits what it
    processed by :attr:`deadline` (``timeout`` seconds on), or commits nothing more when it
    cannot (the broker is gone) and says so. Past the deadline, or on a second signal, it
    exits at once with one line saying what is left uncommitted (``left()``: that text and
    the exit status), as a kill would leave it: nothing is committed that was not written,
    so a kill at any point is safe, and what was not committed comes again on the next start.
    """

    def __init__(
        self,
        who: str,
        timeout: float,
        log: logging.Logger,
        left: Callable[[], tuple[str, int]],
    ):
        self.who = who
        self.timeout = timeout
        self.log = log
        self.left = left
        #: time.monotonic() of the first signal, and the deadline it set for the process's
        #: own steps (the watchdog exits ``timeout`` after the signal, a moment later)
        self.started: float | None = None
        self.deadline: float | None = None
        self.signal_name = ""

    def signalled(self, signum: int) -> None:
        """A SIGTERM or SIGINT (from the event loop's handler). The first starts the stop
        (the caller then stops the process its own way); a second exits at once."""
        name = signal.Signals(signum).name
        if self.started is not None:
            self.exit(f"{self.who}: a second {name}: exiting at once, committing nothing more")
        self.started = time.monotonic()
        # the process's own steps end a little before the watchdog, to say it themselves
        self.deadline = self.started + self.timeout - min(1.0, self.timeout / 4)
        self.signal_name = name
        self.log.info(
            "%s: %s: stopping within %gs (MEMDIAG_SHUTDOWN_TIMEOUT_SECONDS); a second signal "
            "stops it at once", self.who, name, self.timeout,
        )  # fmt: skip
        watchdog = threading.Timer(self.timeout, self._overdue)
        watchdog.daemon = True
        watchdog.start()

    def elapsed(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    def _overdue(self) -> None:  # the watchdog's thread
        self.exit(
            f"{self.who}: not stopped {self.timeout:g}s after {self.signal_name} "
            "(MEMDIAG_SHUTDOWN_TIMEOUT_SECONDS): exiting now, committing nothing more"
        )

    def exit(self, why: str) -> NoReturn:
        """Log ``why`` and what is left uncommitted, then exit at once (no cleanup: as a
        kill would, which the process is safe against)."""
        for attempt in range(3):
            try:
                text, status = self.left()
                break
            except Exception as exc:  # noqa: BLE001 - read from another thread: try again
                text, status = f"(what is left could not be read: {exc!r})", EXIT_UNCOMMITTED
                time.sleep(0.01 * (attempt + 1))
        self.log.warning("%s. %s Exit status %d.", why, text, status)
        exit_now(status)


def exit_now(status: int) -> NoReturn:
    """Flush the logs and the standard streams, then ``os._exit``: nothing else runs (no
    ``finally``, no atexit, no thread joined)."""
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001, S110 - exiting: a handler that cannot flush is lost
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110
            pass
    os._exit(status)


async def settles(
    future: asyncio.Future[Any],
    deadline: float | None,
    answers: Callable[[float], Awaitable[bool]] | None = None,
) -> bool:
    """Whether ``future`` (a commit at a stop) is done by ``deadline`` (``time.monotonic()``;
    None: no deadline); False at once when, meanwhile, the broker does not answer
    (``answers(timeout)``, asked after half a second): what waits for it can never be done."""

    def left() -> float | None:
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    first = left()
    done, _ = await asyncio.wait({future}, timeout=0.5 if first is None else min(0.5, first))
    if done:
        return True
    probe = asyncio.ensure_future(answers(left() or 5.0)) if answers is not None else None
    waiting: set[asyncio.Future[Any]] = {future} if probe is None else {future, probe}
    try:
        while future not in done and left() != 0.0:
            done, _ = await asyncio.wait(
                waiting, timeout=left(), return_when=asyncio.FIRST_COMPLETED
            )
            if probe is not None and probe in done:
                if future not in done and not probe.result():
                    return False  # the broker is gone
                waiting.discard(probe)  # it answers: wait for the future, to the deadline
        return future in done
    finally:
        if probe is not None:
            probe.cancel()
