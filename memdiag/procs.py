"""Child processes that die with their parent (no orphans, even on SIGKILL of the parent),
and the garbage collector of the long-running ones."""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import IO, Any

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
