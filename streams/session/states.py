"""Where the session stage keeps its sessions: their keys in the state store, the decoded
sessions it keeps in memory, and forgetting the idle ones in processing time.

State keys (one table shared with the other stages, apart by prefix): ``s:<session_id>``
the head (log tail, scopes, verdicts); ``c:<session_id>\\0<n>`` sealed log chunks;
``z:<session_id>`` tombstones.

Forgetting a session is the one thing decided by time rather than by events:
``MEMDIAG_SESSION_KEEP_HOURS`` after its last event, measured on its partition's Kafka
timestamps (capped by the wall clock). A forgotten session leaves a tombstone for
:data:`TOMBSTONE_FACTOR` times as long (see :mod:`memdiag.streams.stages.sessions`).
"""

from __future__ import annotations

import msgspec
import orjson

from memdiag.contract.envelope import Output, StateStore
from memdiag.streams.clocks import SWEEP_EVERY_MS, Clocks, Expiry, expiry_index
from memdiag.streams.lru import Cache, shared_budget
from memdiag.streams.session.records import LogRecord, decode, encode
from memdiag.streams.session.session import CHUNK_MAX, Config, OwnerVerdict, Session

Scope = tuple[str | None, str | None, str | None]


class Head(msgspec.Struct, frozen=True):
    """A session's head in the store: what is not in sealed chunks."""

    p: int  # its partition
    l: int  # noqa: E741 - processing time of its last event (ms)
    n: int  # sealed chunks
    cs: int  # the fewest records a chunk seals (a chunk holds CHUNK_MAX at most)
    sc: list[Scope]  # its scopes
    t: list[LogRecord]  # the log's unsealed tail
    v: dict[
        str, tuple[str, bool, int]
    ] = {}  # the owners' verdicts: id -> (outcome, misleading, version)


_HEAD = msgspec.json.Decoder(Head)
_ENCODE = msgspec.json.Encoder()

HEAD, CHUNK_PREFIX, TOMBSTONE = "s:", "c:", "z:"

#: A forgotten session's tombstone outlives it this many times MEMDIAG_SESSION_KEEP_HOURS.
TOMBSTONE_FACTOR = 7


def chunk_key(session_id: str, index: int) -> str:
    return f"{CHUNK_PREFIX}{session_id}\0{index}"


class SessionStates:
    """The sessions of the partitions a worker owns: loaded from and written to the store,
    decoded sessions cached, idle ones forgotten."""

    def __init__(
        self, config: Config, keep_ms: int, cache_size: int = 5_000, cache_bytes: int = 64 << 20
    ):
        self._config = config
        #: most decoded sessions kept in memory (the store holds them all)
        self.cache_size = cache_size
        #: sessions decoded from the store so far (the cache did not hold them)
        self.decoded = 0
        self._keep_ms = keep_ms
        self.clocks = Clocks(min(SWEEP_EVERY_MS, max(1, keep_ms // 4)))
        # session_id -> the session as last written (or, while the stage holds it, as changed
        # since): current until the runner resets the stage (a checkpoint rolled back,
        # partitions moved), which clears it. Its bytes, as of each session's last write, are
        # the worker's one budget of decoded state (MEMDIAG_DECODED_CACHE_MB).
        self._cache: Cache[Session] = shared_budget(cache_bytes).cache("sessions", cache_size)

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
            # new: in the expiry index from now on, never written yet (its time is read from
            # the held session when its entry comes due: seen now at the earliest)
            self._expiry(partition, store).set(HEAD + session_id, self.clocks.now.get(partition, 0))
            return Session(session_id, partition, self._config)
        self.decoded += 1
        head = _HEAD.decode(raw)
        records: list[LogRecord] = []
        chunk_bytes = 0
        for i in range(head.n):
            chunk = store.get(chunk_key(session_id, i), partition)
            if chunk is None:
                raise RuntimeError(f"session {session_id}: log chunk {i} is missing")
            records += decode(chunk)
            chunk_bytes += len(chunk)
        session = Session(session_id, head.p, self._config)
        session.chunk = head.cs
        session.chunks = head.n
        session.chunk_bytes = chunk_bytes
        session.last_seen_ms = head.l
        for scope in head.sc:
            session.scope(*scope)
        session.sealed = len(records)
        session.replay(records + head.t)
        for obs_id, (eid, misleading, version) in head.v.items():
            session.verdicts[obs_id] = OwnerVerdict(eid, misleading, version)
        return session

    def write(self, session: Session, store: StateStore) -> None:
        """The session's new sealed chunks, and its head. Once the tail holds ``chunk``
        records, all of it is sealed, in chunks of at most :data:`CHUNK_MAX` records: one
        event a message seals a chunk every ``chunk`` events, a batch of one session's events
        seals them together. Chunks are read back by their count, whatever their sizes."""
        size, partition, records = session.chunk, session.partition, session.records
        while len(records) - session.sealed >= size:
            end = min(len(records), session.sealed + CHUNK_MAX)
            chunk = encode(records[session.sealed : end])
            store.put(chunk_key(session.session_id, session.chunks), chunk, partition)
            session.chunks += 1
            session.chunk_bytes += len(chunk)
            session.sealed = end
        head = Head(
            p=partition,
            l=session.last_seen_ms,
            n=session.chunks,
            cs=size,
            sc=session.scopes,
            t=records[session.sealed :],
            v={
                o: (v.outcome_event_id, v.misleading, v.version)
                for o, v in session.verdicts.items()
            },
        )
        encoded = _ENCODE.encode(head)
        store.put(HEAD + session.session_id, encoded, partition)
        self._cache.put(session.session_id, session, session.chunk_bytes + len(encoded),
                        session.vector_bytes)  # fmt: skip
        self._expiry(session.partition, store).set(HEAD + session.session_id, session.last_seen_ms)

    def _expiry(self, partition: int, store: StateStore) -> Expiry:
        """The partition's expiry index, by the store's keys: ``s:<id>`` a session, ``z:<id>``
        a tombstone (whole keys: a session may be called ``z:x``, and ``x``'s tombstone is
        ``z:x``)."""
        expiry = self.clocks.expiry.get(partition)
        if expiry is None:
            index = expiry_index(store, partition, HEAD, TOMBSTONE, whole_keys=True)
            expiry = self.clocks.expiry[partition] = Expiry(index, self._expires)
        return expiry

    def _expires(self, key: str, at_ms: int) -> int:
        """When a key of the expiry index expires: a session the keep time after it was last
        seen, a tombstone TOMBSTONE_FACTOR times the keep time after it was laid."""
        return at_ms + self._keep_ms * (TOMBSTONE_FACTOR if key.startswith(TOMBSTONE) else 1)

    def sweep(
        self,
        partition: int,
        store: StateStore,
        out: Output,
        held: dict[str, Session] | None = None,
    ) -> None:
        """Forget the sessions of ``partition`` idle for MEMDIAG_SESSION_KEEP_HOURS of its
        processing time (leaving a tombstone), and the tombstones that have served. The
        caller asks first whether a sweep is due (:meth:`Clocks.due`).

        ``held``: the sessions the stage holds unwritten (changed since they were written):
        their last-seen time is theirs, not the store's, and one forgotten is dropped from
        it (never written again). Only the entries whose time has come are looked at: a
        session seen since its entry was pushed goes back in the heap with its newer time."""
        now = self.clocks.now.get(partition, 0)
        expiry = self._expiry(partition, store)
        held = {} if held is None else held

        def time_of(key: str, indexed: int) -> int:
            session = held.get(key[len(HEAD) :]) if key.startswith(HEAD) else None
            return indexed if session is None else session.last_seen_ms

        for key in expiry.expired(now, time_of):
            if key.startswith(TOMBSTONE):
                store.delete(key, partition)
                continue
            sid = key[len(HEAD) :]
            session = held.pop(sid, None)
            if session is None:
                session = self.load(sid, partition, store, create=False)
            self._cache.pop(sid)
            if session is None:
                continue
            session.flush_incomplete(out)
            for i in range(session.chunks):
                store.delete(chunk_key(sid, i), partition)
            store.delete(key, partition)
            store.put(TOMBSTONE + sid, orjson.dumps([partition, now]), partition)
            expiry.set(TOMBSTONE + sid, now)
