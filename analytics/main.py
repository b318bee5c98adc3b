"""``memdiag sink``: the long-running DuckDB sink process."""

from __future__ import annotations

import asyncio
import logging
import signal

from memdiag.analytics.consumer import SinkFatal, SinkRunner
from memdiag.kafka import ensure_topics, wait_for_kafka
from memdiag.procs import tune_gc
from memdiag.settings import Settings


def main(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
    )
    logging.getLogger("aiokafka").setLevel(max(logging.WARNING, logging.getLogger().level))
    tune_gc()
    try:
        asyncio.run(_run(settings))
    except SinkFatal as exc:
        logging.getLogger("memdiag.sink").critical("%s", exc)
        raise SystemExit(3) from None


async def _run(settings: Settings) -> None:
    runner = SinkRunner(settings)
    await runner.open_file()  # an unwritable file stops the sink before it waits for Kafka
    await wait_for_kafka(settings, "memdiag sink")
    await ensure_topics(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, runner.stop)
    await runner.run()
