"""Processing time, per partition: the one thing the session and trace stages decide by
time rather than by events is when to forget an idle session or trace
(``MEMDIAG_SESSION_KEEP_HOURS``). Each partition's clock is the newest Kafka timestamp of its
records, capped by the wall clock, so a worker that was down and catches up forgets nothing
whose events are still in its backlog, and a producer with a clock in the future cannot age
anybody. Pure code: no Faust, no Kafka.

Restarts. Which sessions (or traces) a sweep forgets decides whether a later event of one is
applied or dead-lettered as late, so a rerun must not sweep sooner than the first run did. A
partition's clock and the time of its last sweep are state, kept in the stage's table under
:func:`clock_key` and committed with it: a restart, a rollback or a rebalance takes them up
as the committed records left them (a clock started from nothing swept at the rerun's first
batch, with the rerun's time: an event the first run applied could then be late). A sweep
runs at most once :attr:`Clocks.sweep_every_ms` of the clock, right after the record that
makes it due (where a batch ends decides nothing), and looks only at what may have expired
(:class:`Expiry`). The records of the session stage's several topics still meet in fetch
order, which no rule fixes: that can decide an event that comes just past its session's
keep time.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator

import orjson

from memdiag.contract.envelope import StateStore

#: How far a partition's processing clock must move between two sweeps, at most (ms).
SWEEP_EVERY_MS = 60_000

#: Where a stage keeps a partition's clock and the time of its last sweep, ``[now_ms,
#: last_sweep_ms]``, in its table: this, the stage's name and the partition (no session, trace or
#: tombstone key starts with ``~``; the name and the partition keep them apart in one store,
#: as the tests' and benchmarks' one dict for every partition is)
CLOCK_KEY = "~clock:"


def clock_key(name: str, partition: int) -> str:
    return f"{CLOCK_KEY}{name}:{partition}"


def expiry_index(
    store: StateStore,
    partition: int,
    head: str,
    tombstone: str | None = None,
    whole_keys: bool = False,
) -> dict[str, int]:
    """What expires when on ``partition``, read back from the store after a rebalance: each
    head's id (its key after the ``head`` prefix; with ``whole_keys``, its whole key) and its
    last-seen time in ms (``"l"``), and each tombstone's whole key and when it was laid."""
    index: dict[str, int] = {}
    cut = 0 if whole_keys else len(head)
    for key, raw in store.items(head, partition):
        value = orjson.loads(raw)
        if value.get("p") == partition:
            index[key[cut:]] = value["l"]
    if tombstone is not None:
        for key, raw in store.items(tombstone, partition):
            stone = orjson.loads(raw)
            if stone[0] == partition:
                index[key] = stone[1]
    return index


class Expiry:
    """What expires when on one partition: an index of keys and the time each counts from
    (as written: a session's or a trace's last-seen time, a tombstone's laying), and a heap
    of ``(expires_ms, key)``, soonest first, one entry a key. An entry is checked when its
    time comes (:meth:`expired`): a key seen since is pushed again with its newer time. A
    sweep so looks only at what may have expired, not at every key of the partition."""

    __slots__ = ("index", "_due", "_expires")

    def __init__(self, index: dict[str, int], expires: Callable[[str, int], int]):
        self.index = index
        #: when a key that counts from a time expires
        self._expires = expires
        self._due = [(expires(key, at), key) for key, at in index.items()]
        heapq.heapify(self._due)

    def set(self, key: str, at_ms: int) -> None:
        """``key`` counts from ``at_ms`` (new to the index: it has its entry in the heap)."""
        if key not in self.index:
            heapq.heappush(self._due, (self._expires(key, at_ms), key))
        self.index[key] = at_ms

    def expired(self, now_ms: int, time_of: Callable[[str, int], int]) -> Iterator[str]:
        """The keys expired at ``now_ms``, soonest first, each taken out of the index as it
        is given. ``time_of(key, indexed)``: the time a key counts from now (a changed,
        unwritten one's own; else the indexed time). Keys may be set while this runs."""
        due, index = self._due, self.index
        while due and due[0][0] < now_ms:
            key = due[0][1]
            at = index.get(key)
            if at is None:  # taken out of the index since its entry was pushed
                heapq.heappop(due)
                continue
            expires = self._expires(key, time_of(key, at))
            if expires >= now_ms:  # seen since: due again later
                heapq.heapreplace(due, (expires, key))
                continue
            heapq.heappop(due)
            del index[key]
            yield key

    def entries(self) -> list[tuple[int, str]]:
        """The heap's entries (tests)."""
        return list(self._due)


class Clocks:
    """Per partition: the processing-time clock (newest Kafka timestamp, capped by the wall
    clock), the time of its last sweep, and an index of what expires when, rebuilt from the
    store after a rebalance."""

    def __init__(self, sweep_every_ms: int = SWEEP_EVERY_MS, name: str = "sessions") -> None:
        self.sweep_every_ms = sweep_every_ms
        self.name = name
        self.now: dict[int, int] = {}
        self.expiry: dict[int, Expiry] = {}  # partition -> what expires when
        self._last_sweep: dict[int, int] = {}
        self._changed: set[int] = set()  # partitions whose clock is not in the store yet

    def clear(self) -> None:
        """Back to a start: a rollback (a failed checkpoint) or a rebalance is a restart from
        the committed offsets, and the clocks are read back as that state has them (a clock
        kept across a rollback would sweep the rerun with the dropped checkpoint's newest
        time, #38; one started from nothing would sweep at the rerun's first batch)."""
        self.now.clear()
        self.expiry.clear()
        self._last_sweep.clear()
        self._changed.clear()

    def load(self, partition: int, store: StateStore) -> None:
        """The partition's clock as its state has it (once after each start)."""
        if partition in self._last_sweep:
            return
        raw = store.get(clock_key(self.name, partition), partition)
        now, last_sweep = orjson.loads(raw) if raw is not None else (0, 0)
        self.now[partition] = max(self.now.get(partition, 0), now)
        self._last_sweep[partition] = last_sweep

    def advance(
        self,
        partition: int,
        timestamp_ms: int | None,
        wall_ms: int,
        store: StateStore | None = None,
    ) -> int:
        """Move the clock to a record's timestamp (capped by the wall clock); with ``store``,
        the clock is first read back from the state, once after each start."""
        if store is not None and partition not in self._last_sweep:
            self.load(partition, store)
        now = self.now.get(partition, 0)
        if timestamp_ms is not None and timestamp_ms > now:
            capped = min(timestamp_ms, wall_ms)
            if capped > now:
                now = self.now[partition] = capped
                self._changed.add(partition)
        return now

    def due(self, partition: int) -> bool:
        now = self.now.get(partition, 0)
        if now - self._last_sweep.get(partition, 0) < self.sweep_every_ms:
            return False
        self._last_sweep[partition] = now
        self._changed.add(partition)
        return True

    def save(self, store: StateStore) -> None:
        """Write the clocks that moved since the last save into the state (with every
        write-back, so a commit holds the clocks its records moved)."""
        for partition in sorted(self._changed):
            value = [self.now.get(partition, 0), self._last_sweep.get(partition, 0)]
            store.put(clock_key(self.name, partition), orjson.dumps(value), partition)
        self._changed.clear()
