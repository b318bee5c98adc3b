"""Where the session stage keeps its sessions: their keys in the state store, the decoded
sessions it keeps in memory, and forgetting the idle ones in processing time.

State keys (one table shared with the other stages, apart by prefix): ``s:<session_id>``
the head (log tail, scopes, verdicts); ``c:<session_id>\\0<n>`` sealed log chunks;
``z:<session_id>`` tombstones.

Forgetting a session is the one thing decided by time rather than by events:
``MEMDIAG_SESSION_KEEP_HOURS`` after its last event, measured on its partition's Kafka
timestamps (capped by the wall clock). A forgotten session leaves a tombstone for
:data:`TOMBSTONE_FACTOR` times as long (see :mod:`memdiag.streams.processor`).
"""

from __future__ import annotations

import orjson

from memdiag.contract.envelope import Output, StateStore
from memdiag.streams.session import Config, Session

HEAD, CHUNK_PREFIX, TOMBSTONE = "s:", "c:", "z:"

#: A forgotten session's tombstone outlives it this many times MEMDIAG_SESSION_KEEP_HOURS.
TOMBSTONE_FACTOR = 7

#: How far a partition's processing clock must move between two sweeps, at most (ms).
SWEEP_EVERY_MS = 60_000


def chunk_key(session_id: str, index: int) -> str:
    return f"{CHUNK_PREFIX}{session_id}\0{index}"


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


class SessionStates:
    """The sessions of the partitions a worker owns: loaded from and written to the store,
    decoded sessions cached, idle ones forgotten."""

    #: Most decoded sessions kept in memory (the store holds them all).
    CACHE_SIZE = 50_000

    def __init__(self, config: Config, keep_ms: int):
        self._config = config
        self._keep_ms = keep_ms
        self.clocks = Clocks(min(SWEEP_EVERY_MS, max(1, keep_ms // 4)))
        # session_id -> the session as last written: current until the runner resets the
        # stage (a checkpoint rolled back, partitions moved), which clears it
        self._cache: dict[str, Session] = {}

    def clear(self) -> None:
        """After a rebalance: the expiry index is rebuilt from the store, sessions decoded."""
        self.clocks.clear()
        self._cache.clear()

    def forget_decoded(self) -> None:
        self._cache.clear()

    def load(
        self, session_id: str, partition: int, store: StateStore, create: bool = True
    ) -> Session | None:
        cached = self._cache.get(session_id)
        if cached is not None:
            return cached
        raw = store.get(HEAD + session_id, partition)
        if raw is None:
            if not create or store.get(TOMBSTONE + session_id, partition) is not None:
                return None
            return Session(session_id, partition, self._config)
        head = orjson.loads(raw)
        chunks = []
        for i in range(head["n"]):
            chunk = store.get(chunk_key(session_id, i), partition)
            if chunk is None:
                raise RuntimeError(f"session {session_id}: log chunk {i} is missing")
            chunks.append(orjson.loads(chunk))
        return Session.restore(session_id, head, chunks, self._config)

    def write(self, session: Session, store: StateStore) -> None:
        while (sealed := session.seal()) is not None:
            index, chunk = sealed
            store.put(chunk_key(session.session_id, index), orjson.dumps(chunk), session.partition)
        store.put(HEAD + session.session_id, orjson.dumps(session.header()), session.partition)
        cache = self._cache
        cache.pop(session.session_id, None)  # least recently written first
        if len(cache) >= self.CACHE_SIZE:
            cache.pop(next(iter(cache)))
        cache[session.session_id] = session
        self._expiry(session.partition, store)[session.session_id] = session.last_seen_ms

    def _expiry(self, partition: int, store: StateStore) -> dict[str, int]:
        index = self.clocks.expiry.get(partition)
        if index is None:
            index = self.clocks.expiry[partition] = expiry_index(store, partition, HEAD, TOMBSTONE)
        return index

    def sweep(self, partition: int, store: StateStore, out: Output) -> None:
        """Forget the sessions of ``partition`` idle for MEMDIAG_SESSION_KEEP_HOURS of its
        processing time (leaving a tombstone), and the tombstones that have served."""
        if not self.clocks.due(partition):
            return
        now = self.clocks.now.get(partition, 0)
        index = self._expiry(partition, store)
        keep = self._keep_ms
        for key, last_seen in list(index.items()):
            if key.startswith(TOMBSTONE):
                if last_seen < now - keep * TOMBSTONE_FACTOR:
                    store.delete(key, partition)
                    del index[key]
                continue
            if last_seen >= now - keep:
                continue
            session = self.load(key, partition, store, create=False)
            del index[key]
            self._cache.pop(key, None)
            if session is None:
                continue
            session.flush_incomplete(out)
            for i in range(session.sealed // session.chunk):
                store.delete(chunk_key(key, i), partition)
            store.delete(HEAD + key, partition)
            store.put(TOMBSTONE + key, orjson.dumps([partition, now]), partition)
            index[TOMBSTONE + key] = now
