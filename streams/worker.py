"""``memdiag worker``: the long-running stream processor.

Creates the topics it needs (explicit partition counts), then runs the Faust worker. Logs
go to stderr at ``MEMDIAG_LOG_LEVEL`` (info by default: at debug, aiokafka's records alone
cost about 12% of throughput).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from memdiag.kafka import client_options, ensure_topics, wait_for_kafka
from memdiag.procs import tune_gc
from memdiag.settings import Settings

log = logging.getLogger("memdiag.worker")


def main(settings: Settings) -> None:
    started = time.monotonic()
    asyncio.run(wait_for_kafka(settings, "memdiag worker"))
    asyncio.run(ensure_topics(settings))
    import faust

    from memdiag.streams import compat
    from memdiag.streams.app import create_app
    from memdiag.streams.telemetry import install_meter_provider

    compat.check()  # before anything of Faust's runs: one line if the version is not ours
    compat.patch_highwaters(client_options(settings))
    compat.patch_fetch_wait(settings.fetch_max_wait_ms)
    _, exporting = install_meter_provider("memdiag-worker")
    app = create_app(settings).app
    if exporting:
        # Faust's own metrics (messages, commits, send latency...) beside memdiag's
        from faust.sensors.otel import OpenTelemetryMonitor

        app.monitor = OpenTelemetryMonitor(service_name="memdiag-worker")

    @app.on_rebalance_complete.connect  # type: ignore[arg-type]  # mode types receivers oddly
    async def _log_ready(sender: Any, *args: Any, signal: Any = None, **kwargs: Any) -> None:
        log.info("memdiag worker start-to-ready %.2fs", time.monotonic() - started)

    worker = faust.Worker(
        app,
        loglevel=settings.log_level,
        quiet=True,
        redirect_stdouts=False,
        override_logging=True,
    )
    tune_gc()
    worker.execute_from_commandline()
