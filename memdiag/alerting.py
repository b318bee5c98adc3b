"""``memdiag alert``: the counter topic in, alerts out (stdout and an optional webhook)."""

from __future__ import annotations

import asyncio
import logging
import urllib.request
from collections.abc import Callable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from memdiag.alert import Alert, Evaluator, Rule
from memdiag.schemas.decode import parse_ts
from memdiag.settings import Settings

log = logging.getLogger("memdiag.alert")


def post(url: str, alert: Alert, timeout: float = 5.0) -> None:
    request = urllib.request.Request(  # noqa: S310 - the user's own webhook URL
        url,
        data=orjson.dumps(alert.as_dict()),
        headers={"Content-Type": "application/json", "User-Agent": "memdiag-alert"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
        response.read()


async def watch(
    settings: Settings,
    rules: list[Rule],
    show: Callable[[Alert], None],
    webhook: str | None = None,
    from_beginning: bool = False,
    stop_after_idle: float | None = None,
) -> None:
    evaluator = Evaluator(rules)
    topic = settings.topics.counters
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.bootstrap_servers,
        enable_auto_commit=False,
        fetch_max_wait_ms=settings.fetch_max_wait_ms,
    )
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            await consumer._client.force_metadata_update()  # noqa: SLF001 - aiokafka has no public call
            parts = consumer.partitions_for_topic(topic) or {0}
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        backlog: list[Alert] = []
        if from_beginning:
            # The backlog first, whole, then its alerts minute by minute in event time.
            await consumer.seek_to_beginning(*tps)
            while batches := await consumer.getmany(timeout_ms=1000, max_records=50_000):
                for records in batches.values():
                    for m in records:
                        doc = _rollup(m.value)
                        if doc is not None:
                            evaluator.add(*doc)
            backlog = evaluator.replay()
        else:
            await consumer.seek_to_end(*tps)
        for alert in backlog:
            await _emit(alert, show, webhook)
        idle = 0.0
        while True:
            batches = await consumer.getmany(timeout_ms=500, max_records=5000)
            got = False
            alerts: list[Alert] = []
            for records in batches.values():
                for m in records:
                    got = True
                    alerts += _add(evaluator, m.value)
            if got:
                idle = 0.0
                alerts += evaluator.evaluate()
                for alert in alerts:
                    await _emit(alert, show, webhook)
            else:
                idle += 0.5
                if stop_after_idle is not None and idle >= stop_after_idle:
                    return
    finally:
        await consumer.stop()


async def _emit(alert: Alert, show: Callable[[Alert], None], webhook: str | None) -> None:
    show(alert)
    if webhook:
        try:
            await asyncio.to_thread(post, webhook, alert)
        except OSError as exc:
            log.warning("webhook %s failed: %s", webhook, exc)


def _rollup(raw: bytes | None) -> tuple[dict[str, Any], int] | None:
    try:
        doc = orjson.loads(raw or b"null")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("type") != "rollup":
        return None
    minute = parse_ts(str(doc.get("minute", "")))
    if minute is None or "name" not in doc or "value" not in doc:
        return None
    return doc, minute


def _add(evaluator: Evaluator, raw: bytes | None) -> list[Alert]:
    """Add one live rollup. When it opens a new minute, the rules are evaluated first on
    the minutes before it."""
    rollup = _rollup(raw)
    if rollup is None:
        return []
    alerts = evaluator.evaluate() if evaluator.now_us and rollup[1] > evaluator.now_us else []
    evaluator.add(*rollup)
    return alerts
