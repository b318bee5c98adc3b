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

#: Hours of event time, behind a counter's newest minute, that its minutes stay open for
#: late increments: a verdict taken back is booked in the minute it was counted in, and a
#: late event in its own. An increment for a minute older than that is not rolled up (its
#: rollup would restart from nothing and say less than was counted); it stays on the topic.
KEEP_HOURS = 48
KEEP_US = KEEP_HOURS * 3_600_000_000

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
        self.too_old = 0
        self._warned_at: float | None = None
        self._old_warned_at: float | None = None

    held_bytes = 0

    def settle(self, store: StateStore) -> None:
        """Nothing held: every batch writes what it changed."""

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

    def _too_old(self, name: str, minute: int) -> None:
        """An increment for a minute already closed: said once a minute at most."""
        self.too_old += 1
        now = time.monotonic()
        if self._old_warned_at is None or now - self._old_warned_at >= self.WARN_EVERY_SECONDS:
            self._old_warned_at = now
            log.warning(
                "counters: an increment of %s for %s, more than %d h of event time before the "
                "counter's newest minute, is not in the rollups (%d so far)", name,
                format_ts(minute), KEEP_HOURS, self.too_old,
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
        minute = minute_of(ts_us)
        total = _add(store, key, minute, value, msg.partition)
        if total is None:
            self._too_old(name, minute)
            return
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


def _add(store: StateStore, key: str, minute: int, value: int, partition: int) -> int | None:
    """Add ``value`` to the total of ``key`` (a counter and attribute set) in ``minute``; the
    new total, or None for a minute more than :data:`KEEP_HOURS` behind the newest one.

    State: ``key`` holds the minutes kept, sorted; ``key \\0 minute`` each one's total. An
    increment reads and writes its minute's total, and the list only when a minute is new
    (then the minutes that fell out of the window are deleted with it)."""
    raw = store.get(key, partition)
    kept: list[int] = []
    if raw is not None:
        found = orjson.loads(raw)
        if isinstance(found, dict):  # before 2026-11: every minute's total in one value
            kept = sorted(int(m) for m in found)
            for m, total in found.items():
                store.put(f"{key}\0{m}", orjson.dumps(total), partition)
            store.put(key, orjson.dumps(kept), partition)
        else:
            kept = found
    if kept and minute <= kept[-1] - KEEP_US:
        return None
    at = f"{key}\0{minute}"
    before = store.get(at, partition) if kept else None
    total = (orjson.loads(before) if before is not None else 0) + value
    store.put(at, orjson.dumps(total), partition)
    if before is None:  # a new minute
        kept = sorted({*kept, minute})
        horizon = kept[-1] - KEEP_US
        while kept[0] <= horizon:
            store.delete(f"{key}\0{kept.pop(0)}", partition)
        store.put(key, orjson.dumps(kept), partition)
    return total
