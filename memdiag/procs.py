"""Child processes that die with their parent (no orphans, even on SIGKILL of the parent)."""

from __future__ import annotations

import ctypes
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
