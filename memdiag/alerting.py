"""``memdiag alert``: the counter topic in, alerts out (stdout and an optional webhook)."""

from __future__ import annotations

import asyncio
import http.client
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from memdiag.alert import Alert, Evaluator, Rule
from memdiag.kafka import client_options, wait_for_kafka
from memdiag.schemas.decode import parse_ts
from memdiag.settings import Settings

log = logging.getLogger("memdiag.alert")


def post(url: str, alert: Alert, timeout: float = 5.0, serve_url: str = "") -> None:
    request = urllib.request.Request(  # noqa: S310 - the user's own webhook URL
        url,
        data=orjson.dumps(alert.as_dict(serve_url)),
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
    await wait_for_kafka(settings, "memdiag alert", give_up_after=10.0)
    consumer = AIOKafkaConsumer(
        **client_options(settings),
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
            await _emit(alert, show, webhook, settings.serve_url)
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
                    await _emit(alert, show, webhook, settings.serve_url)
            else:
                idle += 0.5
                if stop_after_idle is not None and idle >= stop_after_idle:
                    return
    finally:
        await consumer.stop()


async def _emit(
    alert: Alert, show: Callable[[Alert], None], webhook: str | None, serve_url: str
) -> None:
    show(alert)
    if webhook:
        await deliver(webhook, alert, serve_url=serve_url)


#: seconds between the attempts of a webhook POST that failed (5 attempts, ~15 s in all)
RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0)


def redacted(url: str) -> str:
    """A webhook URL for a log line: its query string and any user or password (often a
    token) left out."""
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition("@")[2]  # as written: a port, IPv6 brackets kept
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


def check_webhook(url: str) -> str | None:
    """Why ``url`` cannot be a webhook (a problem to refuse at start), or None."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError as exc:
        return f"--webhook {redacted(url)!r}: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"--webhook {redacted(url)!r}: give an http:// or https:// URL with a host"
    return None


def retryable(exc: BaseException) -> bool:
    """A refused connection, a time-out, 408, 429 or a 5xx may pass on a retry; another 4xx
    (a wrong URL, a rejected body) will not."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in (408, 429) or exc.code >= 500
    if isinstance(exc, http.client.InvalidURL | ValueError):
        return False  # a URL that cannot work: no retry makes it work
    return isinstance(exc, OSError | http.client.HTTPException)


async def deliver(
    url: str, alert: Alert, delays: tuple[float, ...] = RETRY_DELAYS, serve_url: str = ""
) -> bool:
    """POST ``alert``, retrying with backoff; on giving up, log the whole alert that was
    dropped (stdout has it too). Returns whether it was delivered."""
    for attempt in range(len(delays) + 1):
        try:
            await asyncio.to_thread(post, url, alert, 5.0, serve_url)
            return True
        except (OSError, http.client.HTTPException, ValueError) as exc:  # HTTPError: OSError
            if not retryable(exc) or attempt == len(delays):
                log.error(
                    "alert dropped after %d attempt%s: webhook %s failed (%s): %s",
                    attempt + 1,
                    "" if attempt == 0 else "s",
                    redacted(url),
                    exc,
                    orjson.dumps(alert.as_dict(serve_url)).decode(),
                )
                return False
            log.warning(
                "webhook %s failed (%s); retry %d of %d in %.0fs",
                redacted(url),
                exc,
                attempt + 1,
                len(delays),
                delays[attempt],
            )
            await asyncio.sleep(delays[attempt])
    return False


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
