"""A runtime publishing through ``memdiag.client.Publisher`` while its broker is killed (SIGKILL)
and restarted: Tansu on S3 storage (moto's server on loopback), so what the broker took
before it went survives it, as it does on Apache Kafka.

The publisher's buffer is kept small, so that the outage fills it and some events are
dropped. Then: every event the publisher did not report as dropped is in DuckDB exactly
once (the topic holds exactly their ids, and DuckDB equals the reference run of exactly
those events), and the publisher's count of dropped events equals the events ``publish``
returned ``False`` for.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from memdiag.broker import EmbeddedBroker, free_port
from memdiag.client import Publisher
from tests.chaos.test_chaos import _wait_ready, report
from tests.compare import differences, from_duckdb, from_reference
from tests.integration.conftest import Pipeline, pipeline_settings
from tests.reference import reference
from tests.scenario import generate

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

RATE = 150  # events a second, as a busy runtime sends them one by one
HELD = 300  # the publisher's buffer: about 2 s of the rate, so a 5 s outage drops some


def test_a_publisher_outlives_a_killed_and_restarted_broker(
    s3: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    events = generate(sessions=80, seed=53)
    port = free_port()
    broker = EmbeddedBroker(port=port, storage="s3://tansu/", env=s3).start()
    settings = pipeline_settings(broker.url, tmp_path, "outage")
    p = Pipeline(settings, tmp_path)
    kept: list[dict[str, Any]] = []
    refused = 0
    outage: dict[str, float] = {}
    try:
        p.start("worker", "sink")
        _wait_ready(p, "worker", 0)
        _wait_ready(p, "sink", 0)
        publisher = Publisher(settings=settings, linger_ms=20, max_held_events=HELD)
        failed: list[BaseException] = []

        def runtime() -> None:  # publishes at its pace, whatever the broker does
            nonlocal refused
            try:
                start = time.monotonic()
                for i, event in enumerate(events):
                    delay = start + i / RATE - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                    if publisher.publish(event):
                        kept.append(event)
                    else:
                        refused += 1
            except BaseException as exc:  # noqa: BLE001 - the test reads it
                failed.append(exc)

        with caplog.at_level(logging.WARNING, "memdiag.client"):
            publishing = threading.Thread(target=runtime)
            publishing.start()
            # the broker is killed and restarted from this thread: a child dies with the
            # thread that started it (PR_SET_PDEATHSIG)
            time.sleep(len(events) / RATE / 4)  # a quarter in
            assert broker._proc is not None
            broker._proc.kill()  # SIGKILL: no goodbye to anybody
            broker.stop()
            outage["killed"] = time.monotonic()
            time.sleep(5.0)
            broker = EmbeddedBroker(port=port, storage="s3://tansu/", env=s3).start()
            outage["back"] = time.monotonic()
            publishing.join()
            assert not failed, repr(failed[0])
            publisher.flush(timeout=120)  # the broker is back: everything kept goes
            stats = publisher.stats()
            publisher.close(timeout=10)
        assert refused > 0, "the outage should have filled the buffer"
        assert stats.dropped == refused  # exact: dropped only when publish said so
        assert stats.delivered == len(kept) == len(events) - refused
        # held 0: everything kept was delivered. Whether the outage also shows as failures
        # depends on timing: a send that was in flight when the broker died is retried by
        # aiokafka itself, and if the broker is back within its delivery timeout the send
        # succeeds and the publisher never sees it fail (seen: failures=0, every event
        # delivered). The warnings say the outage either way: a full buffer while nothing
        # is acknowledged is the broker away (tests/unit/test_client_outage.py).
        assert stats.held == 0
        away = [r for r in caplog.records if "has not taken events since" in r.getMessage()]
        assert len(away) == 1, [r.getMessage() for r in caplog.records]  # not a flood
        assert any("takes events again" in r.getMessage() for r in caplog.records)

        p.drain(timeout=180)
        # on the topic: every kept event (a resend may repeat one), and no dropped one
        on_topic = [
            e["event_id"]
            for _, value in p.consume(settings.topics.events)
            for e in (value if isinstance(value, list) else [value])
        ]
        assert set(on_topic) == {e["event_id"] for e in kept}
        # in DuckDB: exactly the rows of the kept events, each counted once
        assert differences(from_reference(reference(kept)), from_duckdb(p.query)) == []
        report(
            "publisher_outage",
            {"events": len(events), "kept": len(kept), "dropped": refused,
             "outage_s": round(outage["back"] - outage["killed"], 1),
             "failures": stats.failures},
        )  # fmt: skip
    finally:
        p.stop()
        broker.stop()
