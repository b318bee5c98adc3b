"""``memdiag worker``: the long-running stream processor.

Creates the topics it needs (explicit partition counts), then runs the Faust worker. Logs
go to stderr at ``MEMDIAG_LOG_LEVEL`` (info by default: at debug, aiokafka's records alone
cost about 12% of throughput).

It stops on SIGTERM or SIGINT within ``MEMDIAG_SHUTDOWN_TIMEOUT_SECONDS``
(:class:`memdiag.procs.Shutdown`): the runner commits what it processed (its last
checkpoint), then Faust stops. When the broker is gone the runner commits nothing more and
the worker exits at once, with one line saying what is left uncommitted, and status 75
(:data:`memdiag.procs.EXIT_UNCOMMITTED`); those records are processed again on the next
start. A second signal, or the deadline, exits at once the same way.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import TYPE_CHECKING, Any

from memdiag.kafka import client_options, ensure_topics, short_compaction_lags, wait_for_kafka
from memdiag.procs import EXIT_UNCOMMITTED, Shutdown, exit_now, tune_gc
from memdiag.settings import Settings

if TYPE_CHECKING:
    from memdiag.streams.runner import Stopped

log = logging.getLogger("memdiag.worker")

WHO = "memdiag worker"


def main(settings: Settings, allocator: str = "") -> None:
    """The worker; ``allocator``: what :func:`memdiag.procs.tune_malloc` did, logged once
    the worker is ready (the caller tunes the allocator before anything allocates much)."""
    started = time.monotonic()
    asyncio.run(wait_for_kafka(settings, WHO))
    asyncio.run(ensure_topics(settings))
    import faust

    from memdiag.streams import compat
    from memdiag.streams.app import create_app
    from memdiag.streams.runner import Runner
    from memdiag.streams.telemetry import install_meter_provider

    compat.check()  # before anything of Faust's runs: one line if the version is not ours
    compat.patch_highwaters(client_options(settings))
    compat.patch_fetch_wait(settings.fetch_max_wait_ms)
    compat.no_faust_commits()
    compat.patch_produce_encoding()
    from memdiag.streams.app import changelog_lags

    for line in asyncio.run(short_compaction_lags(settings, changelog_lags(settings))):
        log.warning("%s", line)
    _, exporting = install_meter_provider("memdiag-worker")
    wiring = create_app(settings)
    app, runner = wiring.app, wiring.runner
    assert isinstance(runner, Runner)  # noqa: S101 - create_app wires one
    if exporting:
        # Faust's own metrics (messages, commits, send latency...) beside memdiag's
        from faust.sensors.otel import OpenTelemetryMonitor

        app.monitor = OpenTelemetryMonitor(service_name="memdiag-worker")

    @app.on_rebalance_complete.connect  # type: ignore[arg-type]  # mode types receivers oddly
    async def _log_ready(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        nonlocal allocator
        log.info("memdiag worker start-to-ready %.2fs", time.monotonic() - started)
        if allocator:  # once: the first rebalance
            trimmed = runner.after_commit is not None  # memdiag.procs.heap_trimmer
            log.info("memdiag worker allocator: %s%s", allocator,
                     "; the heap's free pages given back after commits, at most every "
                     f"{settings.heap_trim_seconds:g} s" if trimmed else "")  # fmt: skip
            allocator = ""

    def left() -> tuple[str, int]:
        stopped = runner.where()
        if stopped.committed:
            return "Everything it processed is committed.", 0
        return stopped.uncommitted(), EXIT_UNCOMMITTED

    shutdown = Shutdown(WHO, settings.shutdown_timeout_seconds, log, left)
    runner.on_stopped = lambda stopped: _stopped(shutdown, stopped)

    class Worker(faust.Worker):
        """Faust's worker, its stop on SIGTERM and SIGINT bounded (compat pins the two
        handlers: mode's, which Faust's extend, start its stop)."""

        def _on_sigterm(self) -> None:
            self._memdiag_signal(signal.SIGTERM)
            super()._on_sigterm()

        def _on_sigint(self) -> None:
            self._memdiag_signal(signal.SIGINT)
            super()._on_sigint()

        def _memdiag_signal(self, signum: int) -> None:
            shutdown.signalled(signum)  # a second signal exits here
            runner.stop_deadline = shutdown.deadline

    worker = Worker(
        app,
        loglevel=settings.log_level,
        quiet=True,
        redirect_stdouts=False,
        override_logging=True,
    )
    tune_gc()
    worker.execute_from_commandline()


def _stopped(shutdown: Shutdown, stopped: Stopped) -> None:
    """The runner's stop is done (Faust then stops its services)."""
    if stopped.broker_gone:
        # all that is left waits for the broker (the producer's flush, leaving the group):
        # nothing of it can complete, so exit now
        status = 0 if stopped.committed else EXIT_UNCOMMITTED
        log.warning(
            "%s stopped without the broker, %.1fs after %s: %s Exit status %d.",
            WHO, shutdown.elapsed(), shutdown.signal_name or "the stop",
            f"it committed nothing more. {stopped.uncommitted()}" if status else
            "everything it processed was committed before the broker went "
            f"({stopped.checkpoints} checkpoints by this run).", status,
        )  # fmt: skip
        exit_now(status)
    if stopped.committed:
        log.info(
            "%s stopping: everything it processed is committed (%d checkpoints by this run)",
            WHO, stopped.checkpoints,
        )  # fmt: skip
    else:  # its last commit failed (a rebalance refused it): the next owner takes them
        log.warning("%s stopping: %s", WHO, stopped.uncommitted())
