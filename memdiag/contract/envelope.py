"""What a stage's logic sees of Kafka, and what it hands back: no Faust, no Kafka here.

The worker's runner turns each record into an :class:`InMessage`, calls the stage's logic
with a :class:`StateStore` (its table as the checkpoint shows it; a dict in tests) and sends
the :class:`Output` it gets back. The logic never talks to the broker itself.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

MINUTE_US = 60 * 1_000_000

#: A counter increment's identity: its name and its attributes, a sorted tuple of pairs.
CounterKey = tuple[str, tuple[tuple[str, str], ...]]


def counter_key(name: str, **attributes: str) -> CounterKey:
    """A counter increment's identity, as :meth:`Output.count` makes it."""
    return (name, tuple(sorted(attributes.items())))


class InMessage(msgspec.Struct, frozen=True, gc=False):
    """What the worker needs to know of one Kafka message."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None


@dataclass(slots=True)
class Output:
    """Everything a batch of messages makes a stage send, grouped by destination and key."""

    diagnostics: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    deadletters: list[tuple[bytes | None, dict[str, Any]]] = field(default_factory=list)
    #: events to put back on ``events``, keyed by session id: (events as JSON values, or
    #: their bytes as ``orjson.Fragment``, the timestamp of the message they came in, so the
    #: publish time travels with them)
    reroute: list[tuple[str, list[Any], int | None]] = field(default_factory=list)
    #: the same for ``memory``, keyed by agent id
    reroute_memory: list[tuple[str, list[Any], int | None]] = field(default_factory=list)
    counts: Counter[CounterKey] = field(default_factory=Counter)
    #: the same increments by minute of event time, where the event is known:
    #: (counter, minute) -> [value, newest ts in µs]. The rest is stamped with ``ts_us``.
    by_minute: dict[tuple[CounterKey, int], list[int]] = field(default_factory=dict)
    #: internal, keyed by observation id: a session's step for each observation
    steps: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: internal, keyed by session id: observations' misleading verdicts for the session
    verdicts: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: keyed by observation id: weight updates for the memory system (``weights`` topic)
    weights: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: keyed ``entity:ID`` or ``edge:S|T|R``: graph weight updates (``graph_weights`` topic)
    graph_weights: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: internal, (partition, span records) for the trace stage: the records of the traces
    #: that live on that partition, one message each (or several, to keep them small)
    traces: list[tuple[int, list[dict[str, Any]]]] = field(default_factory=list)
    #: internal, (partition, records): what spans say of the sessions on that partition
    span_events: list[tuple[int, list[dict[str, Any]]]] = field(default_factory=list)
    #: keyed by counter name: messages for the ``counters`` topic besides the increments
    counter_messages: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    #: event time of the newest event handled (for the counter increments); 0: unknown
    ts_us: int = 0
    #: the newest Kafka timestamp of the messages handled: internal messages carry it on,
    #: so every stage's processing-time clock runs on publish time, not on lag
    timestamp_ms: int | None = None

    def diagnostic(self, key: str, record: dict[str, Any]) -> None:
        self.diagnostics.setdefault(key, []).append(record)

    def step(self, key: str, record: dict[str, Any]) -> None:
        self.steps.setdefault(key, []).append(record)

    def verdict(self, key: str, record: dict[str, Any]) -> None:
        self.verdicts.setdefault(key, []).append(record)

    def weight(self, key: str, record: dict[str, Any]) -> None:
        self.weights.setdefault(key, []).append(record)

    def graph_weight(self, key: str, record: dict[str, Any]) -> None:
        self.graph_weights.setdefault(key, []).append(record)

    def count(self, name: str, n: int = 1, at_us: int = 0, **attributes: str) -> None:
        """Add ``n`` to a counter; ``at_us``: the event time it belongs to, if known, so the
        counter topic's per-minute rollups put it in its own minute."""
        self.add((name, tuple(sorted(attributes.items()))), n, at_us)

    def add(self, key: CounterKey, n: int = 1, at_us: int = 0) -> None:
        """:meth:`count` with the key made once (:func:`counter_key`): for the hot paths."""
        self.counts[key] += n
        if at_us:
            minute = (key, at_us - at_us % MINUTE_US)
            bucket = self.by_minute.get(minute)
            if bucket is None:
                self.by_minute[minute] = [n, at_us]
            else:
                bucket[0] += n
                if at_us > bucket[1]:
                    bucket[1] = at_us

    def add_at(self, key: CounterKey, times: list[int]) -> None:
        """:meth:`add` of one at each event time of ``times``, in one call: a batch's run of
        events adds its counts so. A time of 0 is no time, as for :meth:`add`."""
        if not times:
            return
        self.counts[key] += len(times)
        by_minute = self.by_minute
        for at_us in times:
            if not at_us:
                continue  # 1970-01-01T00:00:00Z: counted in the output's minute (untimed)
            minute = (key, at_us - at_us % MINUTE_US)
            bucket = by_minute.get(minute)
            if bucket is None:
                by_minute[minute] = [1, at_us]
            else:
                bucket[0] += 1
                if at_us > bucket[1]:
                    bucket[1] = at_us

    def untimed_counts(self) -> Counter[CounterKey]:
        """The increments no event time was given for."""
        untimed = Counter(self.counts)
        for (key, _), (value, _) in self.by_minute.items():
            untimed[key] -= value
        return +untimed


class StateStore(Protocol):
    """Where a stage keeps its state: its table as the worker's checkpoint shows it
    (``memdiag.streams.checkpoint.StateView``), a :class:`DictStore` in tests. Every call
    names its partition: the writes of a batch span several partitions, and each goes to
    that partition's changelog."""

    def get(self, key: str, partition: int) -> bytes | None: ...

    def put(self, key: str, value: bytes, partition: int) -> None: ...

    def delete(self, key: str, partition: int) -> None: ...

    def items(self, prefix: str, partition: int) -> Iterable[tuple[str, bytes]]:
        """The keys of ``partition`` starting with ``prefix``, with their values."""
        ...


class DictStore:
    """A :class:`StateStore` over a plain dict (tests, benchmarks): one dict for every
    partition (the stages' keys are unique across partitions)."""

    def __init__(self, data: dict[str, bytes] | None = None):
        self.data: dict[str, bytes] = {} if data is None else data
        self.writes = 0

    def get(self, key: str, partition: int = 0) -> bytes | None:
        return self.data.get(key)

    def put(self, key: str, value: bytes, partition: int = 0) -> None:
        self.data[key] = value
        self.writes += 1

    def delete(self, key: str, partition: int = 0) -> None:
        self.data.pop(key, None)
        self.writes += 1

    def items(self, prefix: str, partition: int = 0) -> Iterable[tuple[str, bytes]]:
        return [(k, v) for k, v in self.data.items() if k.startswith(prefix)]

    def keys(self) -> Iterable[str]:
        return list(self.data)
