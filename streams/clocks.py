"""Processing time, per partition: the one thing the session and trace stages decide by
time rather than by events is when to forget an idle session or trace
(``MEMDIAG_SESSION_KEEP_HOURS``). Each partition's clock is the newest Kafka timestamp of its
records, capped by the wall clock, so a worker that was down and catches up forgets nothing
whose events are still in its backlog, and a producer with a clock in the future cannot age
anybody. Pure code: no Faust, no Kafka.
"""

from __future__ import annotations

import orjson

from memdiag.contract.envelope import StateStore

#: How far a partition's processing clock must move between two sweeps, at most (ms).
SWEEP_EVERY_MS = 60_000


def expiry_index(
    store: StateStore, partition: int, head: str, tombstone: str | None = None
) -> dict[str, int]:
    """What expires when on ``partition``, read back from the store after a rebalance: each
    head's id (its key after the ``head`` prefix) and its last-seen time in ms (``"l"``), and
    each tombstone's whole key and when it was laid."""
    index: dict[str, int] = {}
    for key, raw in store.items(head, partition):
        value = orjson.loads(raw)
        if value.get("p") == partition:
            index[key[len(head) :]] = value["l"]
    if tombstone is not None:
        for key, raw in store.items(tombstone, partition):
            stone = orjson.loads(raw)
            if stone[0] == partition:
                index[key] = stone[1]
    return index


class Clocks:
    """Per partition: the processing-time clock (newest Kafka timestamp, capped by the wall
    clock) and an index of what expires when, rebuilt from the store after a rebalance."""

    def __init__(self, sweep_every_ms: int = SWEEP_EVERY_MS) -> None:
        self.sweep_every_ms = sweep_every_ms
        self.now: dict[int, int] = {}
        self.expiry: dict[int, dict[str, int]] = {}  # partition -> key -> last seen (ms)
        self._last_sweep: dict[int, int] = {}

    def clear(self) -> None:
        """Back to a start: a rollback (a failed checkpoint) or a rebalance is a restart from
        the committed offsets, and the clock is a function of the records processed since.
        A clock kept across a rollback would sweep the rerun with the dropped checkpoint's
        newest time, and forget sessions whose later events are still to come again (#38)."""
        self.now.clear()
        self.expiry.clear()
        self._last_sweep.clear()

    def advance(self, partition: int, timestamp_ms: int | None, wall_ms: int) -> int:
        now = self.now.get(partition, 0)
        if timestamp_ms is not None and timestamp_ms > now:
            now = self.now[partition] = min(timestamp_ms, wall_ms)
        return now

    def due(self, partition: int) -> bool:
        now = self.now.get(partition, 0)
        if now - self._last_sweep.get(partition, 0) < self.sweep_every_ms:
            return False
        self._last_sweep[partition] = now
        return True
