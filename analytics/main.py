"""``memdiag sink``: the long-running DuckDB sink process.

It stops on SIGTERM or SIGINT within ``MEMDIAG_SHUTDOWN_TIMEOUT_SECONDS``
(:class:`memdiag.procs.Shutdown`): it writes what it holds to DuckDB, commits, and says so.
When the broker is gone it writes all the same (DuckDB is local) but commits nothing more,
and exits with status 75 (:data:`memdiag.procs.EXIT_UNCOMMITTED`): those messages come again
on the next start. A second signal, or the deadline, exits at once the same way.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from memdiag.analytics.consumer import SinkFatal, SinkRunner
from memdiag.kafka import ensure_topics, wait_for_kafka
from memdiag.procs import Shutdown, tune_gc
from memdiag.settings import Settings

log = logging.getLogger("memdiag.sink")

WHO = "memdiag sink"


def main(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
    )
    logging.getLogger("aiokafka").setLevel(max(logging.WARNING, logging.getLogger().level))
    tune_gc()
    runner = SinkRunner(settings)
    shutdown = Shutdown(WHO, settings.shutdown_timeout_seconds, log, runner.stopped)
    try:
        asyncio.run(_run(runner, shutdown, settings))
    except SinkFatal as exc:  # an error memdiag explains: status 1, as every command's
        log.critical("%s", exc)
        raise SystemExit(1) from None
    text, status = runner.stopped()
    if runner.broker_gone:
        log.warning("%s stopped without the broker, %.1fs after %s%s %s Exit status %d.",
                    WHO, shutdown.elapsed(), shutdown.signal_name or "the stop",
                    ": it committed nothing more." if status else ".", text,
                    status)  # fmt: skip
    else:
        log.info("%s stopped. %s Exit status %d.", WHO, text, status)
    if status:
        raise SystemExit(status)


async def _run(runner: SinkRunner, shutdown: Shutdown, settings: Settings) -> None:
    await runner.open_file()  # an unwritable file stops the sink before it waits for Kafka
    await wait_for_kafka(settings, WHO)
    await ensure_topics(settings)
    loop = asyncio.get_running_loop()

    def signalled(signum: int) -> None:
        shutdown.signalled(signum)  # a second signal exits here
        runner.stop(shutdown.deadline)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, signalled, sig)
    await runner.run()
