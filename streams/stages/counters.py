"""The counter topic (docs/topics.md): every increment, and a rollup per minute.

Two shapes on ``memdiag.counters``, both keyed by the counter name (JSON Schema:
``schemas/counter.schema.json``):

- ``increment``: what one processed message added to one counter (one attribute set),
  with the event time of that message: ``{"type": "increment", "name", "value",
  "attributes", "ts"}``.
- ``rollup``: the running total of one counter (one attribute set) in one minute of
  event time, re-sent with each increment that lands in it: ``{"type": "rollup", "name",
  "attributes", "minute", "value", "ts"}``. An alerting system keeps the last rollup per
  (name, attributes, minute) and reads rates without keeping any state of its own.

Increments are per message, not per event: a batch of 500 searches sends one increment of
500. Counters may overcount on redelivery (their help texts say so); DuckDB does not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import orjson

from memdiag.contract.envelope import MINUTE_US, CounterKey, InMessage, Output, StateStore
from memdiag.schemas.decode import parse_ts
from memdiag.schemas.models import format_ts

#: Minutes of event time a rollup is kept open for late increments.
KEEP_MINUTES = 60

log = logging.getLogger("memdiag.worker")


def increments(counts: Mapping[CounterKey, int], ts_us: int) -> list[tuple[str, dict[str, Any]]]:
    """(key, record) for each counter a message touched."""
    ts = format_ts(ts_us)
    return [
        (
            name,
            {
                "type": "increment",
                "name": name,
                "value": value,
                "attributes": dict(attrs),
                "ts": ts,
            },
        )
        for (name, attrs), value in counts.items()
        if value
    ]


def minute_of(ts_us: int) -> int:
    return ts_us - ts_us % MINUTE_US


class CounterStage:
    """Per counter and attribute set: totals per minute of event time (the one owner of
    each counter name is the partition of ``counters`` the name hashes to)."""

    #: At most one warning about malformed increments this often (seconds).
    WARN_EVERY_SECONDS = 60.0

    def __init__(self) -> None:
        self.skipped = 0
        self._warned_at: float | None = None

    def reset(self) -> None:
        pass  # nothing kept between batches

    def _skip(self, msg: InMessage) -> None:
        """A malformed increment (not memdiag's): skipped, and said once a minute at most."""
        self.skipped += 1
        now = time.monotonic()
        if self._warned_at is None or now - self._warned_at >= self.WARN_EVERY_SECONDS:
            self._warned_at = now
            log.warning(
                "counters: skipped a malformed increment at %s/%d/%d (%d so far): not memdiag's, "
                "see schemas/counter.schema.json", msg.topic, msg.partition, msg.offset,
                self.skipped,
            )  # fmt: skip

    def process(self, msgs: list[InMessage], store: StateStore) -> Output:
        out = Output()
        for msg in msgs:
            try:
                self._one(msg, store, out)
            except Exception:  # noqa: BLE001 - one bad increment never stops the batch: the
                # runner would retry the batch message by message and add the others twice
                log.warning("counters: increment at %s/%d/%d left out", msg.topic,
                            msg.partition, msg.offset, exc_info=True)  # fmt: skip
        return out

    def _one(self, msg: InMessage, store: StateStore, out: Output) -> None:
        try:
            doc = orjson.loads(msg.value or b"null")
        except orjson.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict) or doc.get("type") != "increment":
            return  # a rollup (ours), or a foreign message: nothing to add up
        name, attributes, value, ts = (
            doc.get("name"), doc.get("attributes") or {}, doc.get("value"), doc.get("ts")
        )  # fmt: skip
        ts_us = parse_ts(ts) if isinstance(ts, str) else None
        if (
            not isinstance(name, str)
            or not isinstance(attributes, dict)
            or not isinstance(value, int)
            or isinstance(value, bool)
            or value < 1
            or ts_us is None
        ):
            self._skip(msg)
            return
        key = name + "\0" + orjson.dumps(attributes, option=orjson.OPT_SORT_KEYS).decode()
        raw = store.get(key, msg.partition)
        minutes: dict[str, int] = orjson.loads(raw) if raw is not None else {}
        minute = minute_of(ts_us)
        total = minutes.get(str(minute), 0) + value
        minutes[str(minute)] = total
        newest = max(int(m) for m in minutes)
        minutes = {m: v for m, v in minutes.items() if int(m) > newest - KEEP_MINUTES * MINUTE_US}
        store.put(key, orjson.dumps(minutes), msg.partition)
        out.counter_messages.append(
            (
                name,
                {
                    "type": "rollup",
                    "name": name,
                    "attributes": attributes,
                    "minute": format_ts(minute),
                    "value": total,
                    "ts": ts,
                },
            )
        )
