"""``memdiag sink``: the long-running DuckDB sink process."""

from __future__ import annotations

import asyncio
import logging
import signal

from memdiag.analytics.consumer import SinkRunner
from memdiag.kafka import ensure_topics
from memdiag.procs import tune_gc
from memdiag.settings import Settings


def main(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
    )
    logging.getLogger("aiokafka").setLevel(max(logging.WARNING, logging.getLogger().level))
    tune_gc()
    asyncio.run(_run(settings))


async def _run(settings: Settings) -> None:
    await ensure_topics(settings)
    runner = SinkRunner(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, runner.stop)
    await runner.run()
