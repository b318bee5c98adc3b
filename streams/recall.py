"""Recall pipeline health (docs/rules.md, "Recall pipeline health"): written, indexed, recalled.

Pure code: no Faust, no Kafka. One :class:`Agent` holds what memdiag knows of one agent's
memory pipeline; the stage (``memdiag.streams.memory``) loads it from the state store, feeds
it the agent's events and writes back what changed.

The rules, all in event time (the agent's own events, never their arrival order):

- A memory's ``written_at`` is its first ``memory_written`` in event time, its
  ``indexed_at`` its first ``memory_indexed``, whatever the store. The two join in either
  order: an index event for a memory not written (yet) is kept.
- The agent's clock is the newest ``ts`` of its memory events. A written memory is
  ``indexed`` once an index event names it; otherwise ``unindexed`` when the clock minus
  ``written_at`` exceeds the deadline (in whole milliseconds), else ``pending``.
- A memory *ever* counted as unindexed follows from ``indexed_at - written_at`` once it is
  indexed (over the deadline: it was), from the status otherwise. It is counted once in
  ``memdiag.unindexed_memory_total{agent_id}``, in the minute of the agent's clock that
  showed it (so a live alert sees it in its window).
- Break: the agent has an unindexed memory and no ``memory_indexed`` (of any memory) since
  the oldest unindexed one was written. ``pipeline_break`` when that starts to hold,
  ``pipeline_recovered`` when it stops.
- Probes: a hit iff the memory is in the first ``k`` results with a score of at least the
  threshold (scores absent: rank alone). Ties in ``ts`` between two events of one kind for
  one memory (two writes, two probes, two ambient contexts of the agent) go to the greater
  ``event_id`` for "latest" and the smaller for "first", so the result never depends on
  which arrived first.

Redelivery. Every rule is a minimum, a maximum or a latest-by-``(ts, event_id)``, so an event
applied twice changes nothing; the records an event is responsible for are sent again with
their current values (the sink upserts them): its memory's row, the rows its ``ts`` turned
unindexed (each kept with the clock that turned it), and the break or recovery it made
(kept with its ``ts``). So a crash between the state write and the sends loses nothing. A
crash that lands only part of a batch's state writes is healed as the batch comes again
(:class:`Backlog`).

State, apart by key: the agent's head under ``m:<agent_id>`` (clock, deadline, last index,
latest ambient context, the break, one summary line per backlog chunk); its not-indexed
memories in chunks under ``mx:<len>:<agent_id><n>``; one small record per memory under
``mm:<len>:<agent_id><memory_id>``. A batch writes the chunks and the memories it touched,
then the head; never the whole agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from memdiag.contract import (
    INDEXED,
    NOT_WRITTEN,
    PENDING,
    PIPELINE_BREAK,
    PIPELINE_RECOVERED,
    UNINDEXED,
    UNINDEXED_MEMORIES,
)
from memdiag.contract.envelope import Output, StateStore
from memdiag.schemas.models import (
    AmbientContext,
    MemoryEvent,
    MemoryIndexed,
    MemoryWritten,
    RecallProbe,
    format_ts,
)

HEAD = "m:"
MEMORY = "mm:"


def head_key(agent_id: str) -> str:
    return HEAD + agent_id


def memory_key(agent_id: str, memory_id: str) -> str:
    """Unambiguous for any two ids (the agent id's length first)."""
    return f"{MEMORY}{len(agent_id)}:{agent_id}{memory_id}"


# -- the rules, pure ------------------------------------------------------------------------


def probe_verdict(
    memory_id: str,
    result_ids: Sequence[str],
    scores: Sequence[float] | None,
    k: int,
    threshold: float,
) -> tuple[bool, int | None, float | None]:
    """(hit, 1-based rank of ``memory_id`` in the results or None, its score or None)."""
    try:
        i = list(result_ids).index(memory_id)
    except ValueError:
        return False, None, None
    score = None if scores is None else scores[i]
    hit = i < k and (score is None or score >= threshold)
    return hit, i + 1, score


def ms(ts_us: int) -> int:
    """Whole milliseconds of an event time (the deadline's resolution)."""
    return ts_us // 1000


def status(written_us: int | None, indexed_us: int | None, clock_us: int, deadline_ms: int) -> str:
    """A memory's status at the agent's clock."""
    if written_us is None:
        return NOT_WRITTEN
    if indexed_us is not None:
        return INDEXED
    return UNINDEXED if ms(clock_us) - ms(written_us) > deadline_ms else PENDING


def ever_unindexed(
    written_us: int | None, indexed_us: int | None, clock_us: int, deadline_ms: int
) -> bool:
    """Whether the memory counted as unindexed at some point of its agent's event time."""
    if written_us is None:
        return False
    if indexed_us is not None:
        return ms(indexed_us) - ms(written_us) > deadline_ms
    return ms(clock_us) - ms(written_us) > deadline_ms


def break_since(oldest_unindexed_us: int | None, last_indexed_us: int | None) -> int | None:
    """The break rule: the ``written_at`` of the oldest unindexed memory when no index event
    came since it was written, else None."""
    if oldest_unindexed_us is None:
        return None
    if last_indexed_us is not None and last_indexed_us >= oldest_unindexed_us:
        return None
    return oldest_unindexed_us


def _later(a: list[Any] | None, ts_us: int, event_id: str) -> bool:
    """Whether (ts, event_id) comes after the kept [ts, event_id, ...] (or none is kept)."""
    return a is None or (ts_us, event_id) > (a[0], a[1])


def _earlier(a: list[Any] | None, ts_us: int, event_id: str) -> bool:
    return a is None or (ts_us, event_id) < (a[0], a[1])


#: Not-indexed memories per backlog chunk: a write rewrites one chunk, never the backlog.
CHUNK = 128
BACKLOG = "mx:"

# A chunk's summary in the head: [unindexed, pending, oldest unindexed written_us, oldest
# pending written_us, first turned_us, last turned_us, least written_us, most written_us]
U, P, MIN_U, MIN_P, FIRST_T, LAST_T, LO, HI = range(8)


class Backlog:
    """An agent's written, not indexed memories, ``[written_us, memory_id, turned_us]`` each
    (``turned_us``: the agent's clock when it turned unindexed; 0 while pending), in chunks
    of at most :data:`CHUNK` under their own keys (``mx:<len>:<agent_id><chunk>``).

    The head keeps one summary per chunk (:data:`U` ...), so an agent whose indexer died
    weeks ago costs a chunk or two and its summaries per event, not its whole backlog. An
    entry is found by its ``written_us`` (the chunks whose range holds it), so nothing else
    points into a chunk: new entries go to the open chunk, and a chunk that falls under a
    quarter full is merged into it.

    Self-healing. The state is several keys, written head last; if a crash lands only some
    of a batch's writes, the batch comes again as redeliveries. Every chunk read is
    summarised again from its content, an entry is added only where none is, and the oldest
    unindexed entry is checked against its chunk before a break is said to hold, so a
    partial write leaves neither a duplicate nor a stale summary behind.
    """

    def __init__(self, agent_id: str, state: dict[str, Any] | None):
        state = state or {}
        self.agent_id = agent_id
        self.summaries: dict[int, list[Any]] = {int(k): v for k, v in state.get("s", {}).items()}
        self.open: int = state.get("o", 0)
        self.next: int = state.get("n", 1)
        self.chunks: dict[int, list[list[Any]]] = {}
        self.dirty: set[int] = set()
        self.store: StateStore | None = None
        self.clock = 0  # the agent's clock (set by it): no entry turned after it

    def state(self) -> dict[str, Any]:
        return {"o": self.open, "n": self.next, "s": {str(k): v for k, v in self.summaries.items()}}

    def key(self, cid: int) -> str:
        return f"{BACKLOG}{len(self.agent_id)}:{self.agent_id}{cid}"

    def _chunk(self, cid: int) -> list[list[Any]]:
        chunk = self.chunks.get(cid)
        if chunk is None:
            raw = None if self.store is None else self.store.get(self.key(cid))
            chunk = self.chunks[cid] = orjson.loads(raw) if raw is not None else []
            for entry in chunk:  # turned by a batch whose head (and clock) was lost: not yet
                if entry[2] > self.clock:
                    entry[2] = 0
            self._summarise(cid, changed=False)  # heals a summary a lost head left stale
        return chunk

    def find(self, written_us: int, memory_id: str) -> tuple[int, int] | None:
        """(chunk, index) of ``memory_id``'s entry written at ``written_us``."""
        for cid in [c for c, s in self.summaries.items() if s[LO] <= written_us <= s[HI]]:
            for i, e in enumerate(self._chunk(cid)):
                if e[1] == memory_id and e[0] == written_us:
                    return cid, i
        return None

    def add(self, written_us: int, memory_id: str, turned_us: int) -> None:
        """Add an entry, unless it is there (a redelivery after a partial write)."""
        self._chunk(self.open)  # a crash may have landed it with entries its summary lacks
        if self.find(written_us, memory_id) is not None:
            return
        if len(self._chunk(self.open)) >= CHUNK:
            self._roll()
        self._chunk(self.open).append([written_us, memory_id, turned_us])
        self._summarise(self.open)

    def _roll(self) -> None:
        """A new open chunk. Whatever its key holds is from a batch whose head was lost
        (its events come again): it starts empty."""
        self.open, self.next = self.next, self.next + 1
        self.chunks[self.open] = []
        self.dirty.add(self.open)

    def remove(self, written_us: int, memory_id: str) -> list[Any] | None:
        """Remove ``memory_id``'s entry written at ``written_us``, if there; the entry."""
        self._chunk(self.open)  # as in add
        found = self.find(written_us, memory_id)
        if found is None:
            return None
        cid, i = found
        entry = self.chunks[cid].pop(i)
        self._summarise(cid)
        if cid != self.open and len(self.chunks[cid]) < CHUNK // 4:
            self._merge(cid)
        return entry

    def _merge(self, cid: int) -> None:
        """Move a sparse chunk's entries to the open chunk (rolling it over when full)."""
        entries, self.chunks[cid] = self.chunks[cid], []
        self._summarise(cid)
        for entry in entries:
            if len(self._chunk(self.open)) >= CHUNK:
                self._summarise(self.open)
                self._roll()
            self._chunk(self.open).append(entry)
        self._summarise(self.open)

    def settle(self, horizon_ms: int, clock_us: int) -> list[list[Any]]:
        """Pending entries written before ``horizon_ms`` turn unindexed at ``clock_us``; the
        entries that turned, oldest first."""
        turned: list[list[Any]] = []
        for cid, s in list(self.summaries.items()):
            if s[MIN_P] is not None and ms(s[MIN_P]) < horizon_ms:
                for entry in self._chunk(cid):
                    if not entry[2] and ms(entry[0]) < horizon_ms:
                        entry[2] = clock_us
                        turned.append(entry)
                self._summarise(cid)
        return sorted(turned)

    def rebase(self, horizon_ms: int, clock_us: int) -> list[str]:
        """Every entry's status again under another deadline (the setting changed); the
        memories whose status changed."""
        changed: list[str] = []
        for cid in list(self.summaries):
            for entry in self._chunk(cid):
                unindexed = ms(entry[0]) < horizon_ms
                if unindexed != bool(entry[2]):
                    entry[2] = clock_us if unindexed else 0
                    changed.append(entry[1])
            self._summarise(cid)
        return sorted(changed)

    def turned_at(self, ts_us: int) -> list[str]:
        """The memories that turned unindexed when the clock reached ``ts_us``."""
        out: list[str] = []
        for cid, s in list(self.summaries.items()):
            if s[FIRST_T] is not None and s[FIRST_T] <= ts_us <= s[LAST_T]:
                out += [e[1] for e in self._chunk(cid) if e[2] == ts_us]
        return sorted(out)

    def oldest_unindexed_us(self) -> int | None:
        """The ``written_us`` of the oldest unindexed entry, by the summaries alone."""
        return min((s[MIN_U] for s in self.summaries.values() if s[MIN_U] is not None),
                   default=None)  # fmt: skip

    def oldest_unindexed(self) -> tuple[int, str] | None:
        """(written_us, memory_id) of the oldest unindexed entry (ties: the smaller id),
        checked against its chunks (reading a chunk corrects a stale summary)."""
        while (oldest := self.oldest_unindexed_us()) is not None:
            holding = [c for c, s in self.summaries.items() if s[MIN_U] == oldest]
            entries = []
            for c in holding:
                entries += [e for e in self._chunk(c) if e[2] and e[0] == oldest]
                self._summarise(c, changed=False)  # stale (a lost head): correct it, look again
            if entries:
                entry = min(entries)
                return entry[0], entry[1]
        return None

    def counts(self) -> tuple[int, int]:
        """(unindexed, pending)."""
        return (sum(s[U] for s in self.summaries.values()),
                sum(s[P] for s in self.summaries.values()))  # fmt: skip

    def _summarise(self, cid: int, changed: bool = True) -> None:
        chunk = self.chunks[cid]
        if not chunk:
            summary = None
        else:
            turned = [e for e in chunk if e[2]]
            pending = [e[0] for e in chunk if not e[2]]
            summary = [
                len(turned),
                len(pending),
                min((e[0] for e in turned), default=None),
                min(pending, default=None),
                min((e[2] for e in turned), default=None),
                max((e[2] for e in turned), default=None),
                min(e[0] for e in chunk),
                max(e[0] for e in chunk),
            ]
        if summary != self.summaries.get(cid):
            if summary is None:
                self.summaries.pop(cid, None)
            else:
                self.summaries[cid] = summary
            changed = True
        if changed:
            self.dirty.add(cid)

    def save(self, store: StateStore, partition: int) -> None:
        for cid in sorted(self.dirty):
            chunk = self.chunks[cid]
            if chunk:
                store.put(self.key(cid), orjson.dumps(chunk), partition)
            else:
                store.delete(self.key(cid), partition)
        self.dirty.clear()


# -- one agent ------------------------------------------------------------------------------


class Memory:
    """One memory's record: its first write and first index in event time."""

    __slots__ = ("memory_id", "written", "indexed", "counted", "dirty")

    def __init__(self, memory_id: str, rec: dict[str, Any] | None = None):
        self.memory_id = memory_id
        rec = rec or {}
        self.written: list[Any] | None = rec.get("w")  # [ts_us, event_id, name, store]
        self.indexed: list[Any] | None = rec.get("i")  # [ts_us, event_id, store]
        self.counted: bool = rec.get("x", False)  # counted in unindexed_memory_total
        self.dirty = False

    @property
    def written_us(self) -> int | None:
        return None if self.written is None else self.written[0]

    @property
    def indexed_us(self) -> int | None:
        return None if self.indexed is None else self.indexed[0]

    def state(self) -> dict[str, Any]:
        rec: dict[str, Any] = {}
        if self.written is not None:
            rec["w"] = self.written
        if self.indexed is not None:
            rec["i"] = self.indexed
        if self.counted:
            rec["x"] = True
        return rec


class Agent:
    """One agent's recall pipeline, as far as its events say."""

    def __init__(self, agent_id: str, partition: int, deadline_ms: int, head: dict[str, Any]):
        self.agent_id = agent_id
        self.partition = partition
        self.deadline_ms = deadline_ms
        self.clock: int = head.get("c", 0)
        self.last_indexed: int | None = head.get("li")
        self.ambient: list[Any] | None = head.get("a")  # [ts_us, event_id, session_id, ids]
        #: the written memories not indexed, pending and unindexed
        self.backlog = Backlog(agent_id, head.get("bl"))
        #: the break while it holds, and the last recovery: [since_us, the ts of the event
        #: that made it, broken at (clock), oldest memory id, unindexed then] (+ recovered at)
        self.broken: list[Any] | None = head.get("br")
        self.recovered: list[Any] | None = head.get("rc")
        #: MEMDIAG_INDEX_DEADLINE_SECONDS changed since the backlog was sorted: sort it again
        self._rebase = head.get("d", deadline_ms) != deadline_ms
        self.memories: dict[str, Memory] = {}

    @classmethod
    def load(cls, agent_id: str, partition: int, deadline_ms: int, store: StateStore) -> Agent:
        raw = store.get(head_key(agent_id))
        head = orjson.loads(raw) if raw is not None else {}
        agent = cls(agent_id, head.get("p", partition), deadline_ms, head)
        agent.backlog.store, agent.backlog.clock = store, agent.clock
        return agent

    def head(self) -> dict[str, Any]:
        head: dict[str, Any] = {"p": self.partition, "c": self.clock, "d": self.deadline_ms}
        for key, value in (
            ("li", self.last_indexed),
            ("a", self.ambient),
            ("br", self.broken),
            ("rc", self.recovered),
        ):
            if value:
                head[key] = value
        if self.backlog.summaries or self.backlog.next > 1:
            head["bl"] = self.backlog.state()
        return head

    def save(self, store: StateStore) -> None:
        """The backlog's chunks and the memories first, the head last (see :class:`Backlog`)."""
        self.backlog.save(store, self.partition)
        for memory in self.memories.values():
            if memory.dirty:
                key = memory_key(self.agent_id, memory.memory_id)
                store.put(key, orjson.dumps(memory.state()), self.partition)
                memory.dirty = False
        store.put(head_key(self.agent_id), orjson.dumps(self.head()), self.partition)

    def memory(self, memory_id: str, store: StateStore) -> Memory:
        known = self.memories.get(memory_id)
        if known is None:
            raw = store.get(memory_key(self.agent_id, memory_id))
            known = Memory(memory_id, orjson.loads(raw) if raw is not None else None)
            self.memories[memory_id] = known
        return known

    # -- events -----------------------------------------------------------------------------

    def apply(self, event: MemoryEvent, store: StateStore, out: Output) -> None:
        """Apply one validated event and send what it changed (or, for an event seen before,
        what it is responsible for, with current values)."""
        ts = event.ts_us
        if self._rebase:
            self._rebase = False
            for memory_id in self.backlog.rebase(self._horizon_ms(), self.clock):
                self._send_row(self.memory(memory_id, store), out)
        advanced = ts > self.clock
        if advanced:
            self.clock = ts
        self.backlog.clock = self.clock
        if isinstance(event, MemoryWritten):
            m = self.memory(event.memory_id, store)
            old_w = m.written_us
            if _earlier(m.written, ts, event.event_id):
                m.written = [ts, event.event_id, event.name, event.store]
                m.dirty = True
            self._place(m, old_w, out)
        elif isinstance(event, MemoryIndexed):
            m = self.memory(event.memory_id, store)
            if _earlier(m.indexed, ts, event.event_id):
                m.indexed = [ts, event.event_id, event.store]
                m.dirty = True
            if self.last_indexed is None or ts > self.last_indexed:
                self.last_indexed = ts
            self._place(m, m.written_us, out)
        elif isinstance(event, RecallProbe):
            out.diagnostic(self.agent_id, self._probe_row(event))
        elif isinstance(event, AmbientContext) and _later(self.ambient, ts, event.event_id):
            self.ambient = [ts, event.event_id, event.session_id, list(event.memory_ids)]
        if advanced:
            self.backlog.settle(self._horizon_ms(), self.clock)
        # the rows this ts turned unindexed: now, or again for a redelivery (also when a
        # crash landed the turned chunk but not the head that moved the clock)
        for memory_id in self.backlog.turned_at(ts):
            self._send_row(self.memory(memory_id, store), out)
        self._check_break(ts, out)
        out.ts_us = max(out.ts_us, ts)

    def _horizon_ms(self) -> int:
        """A memory written before this (whole ms) and not indexed is unindexed."""
        return ms(self.clock) - self.deadline_ms

    def _place(self, m: Memory, old_w: int | None, out: Output) -> None:
        """Make the backlog hold ``m`` exactly while it is written and not indexed (whatever
        a partial write before a crash left there), and send its row."""
        w = m.written_us
        turned = 0
        if old_w is not None and old_w != w:  # an earlier write came: the entry moves
            entry = self.backlog.remove(old_w, m.memory_id)
            turned = entry[2] if entry else 0
        st = status(w, m.indexed_us, self.clock, self.deadline_ms)
        if w is not None and st in (PENDING, UNINDEXED):
            self.backlog.add(w, m.memory_id, (turned or self.clock) if st == UNINDEXED else 0)
        elif w is not None:
            self.backlog.remove(w, m.memory_id)
        self._send_row(m, out)

    def _send_row(self, m: Memory, out: Output) -> None:
        """``m``'s row; and, once, its increment of ``unindexed_memory_total``, in the minute
        of the agent's clock that showed it (when the alert can still see it)."""
        if not m.counted and ever_unindexed(
            m.written_us, m.indexed_us, self.clock, self.deadline_ms
        ):
            m.counted = m.dirty = True
            out.count(UNINDEXED_MEMORIES, at_us=self.clock, agent_id=self.agent_id)
        out.diagnostic(self.agent_id, self._row(m))

    # -- the break --------------------------------------------------------------------------

    def current_break(self) -> int | None:
        """The break rule now: the oldest unindexed write, if nothing was indexed since. The
        summaries say; a break is checked against the chunk that holds its memory."""
        since = break_since(self.backlog.oldest_unindexed_us(), self.last_indexed)
        if since is None:
            return None
        oldest = self.backlog.oldest_unindexed()
        return break_since(oldest[0] if oldest else None, self.last_indexed)

    def _check_break(self, ts: int, out: Output) -> None:
        """Raise ``pipeline_break`` when the rule starts to hold, ``pipeline_recovered`` when
        it stops; again when the event that did it comes again (a redelivery). An episode
        keeps the ``since`` it was raised with (a late write may move the oldest unindexed
        memory earlier while it holds: the summary says so)."""
        since = self.current_break()
        if since is not None and self.broken is None:
            oldest = self.backlog.oldest_unindexed()
            unindexed = self.backlog.counts()[0]
            self.broken = [since, ts, self.clock, oldest[1] if oldest else None, unindexed]
            out.diagnostic(self.agent_id, self._break_record(PIPELINE_BREAK, self.broken))
        elif since is None and self.broken is not None:
            self.recovered = [self.broken[0], ts, *self.broken[2:], self.clock]
            self.broken = None
            out.diagnostic(self.agent_id, self._break_record(PIPELINE_RECOVERED, self.recovered))
        else:
            for kind, held in ((PIPELINE_BREAK, self.broken), (PIPELINE_RECOVERED, self.recovered)):
                if held is not None and held[1] == ts:
                    out.diagnostic(self.agent_id, self._break_record(kind, held))

    # -- records ----------------------------------------------------------------------------

    def _break_record(self, kind: str, held: list[Any]) -> dict[str, Any]:
        """A transition, whole: a recovery says the break it ends, so either record alone
        rebuilds the episode's row."""
        since_us, _, broken_at, oldest_id, unindexed = held[:5]
        return {
            "kind": kind,
            "agent_id": self.agent_id,
            "since": format_ts(since_us),
            "ts": format_ts(held[5] if kind == PIPELINE_RECOVERED else broken_at),
            "broken_at": format_ts(broken_at),
            "oldest_memory_id": oldest_id,
            "unindexed": unindexed,
            "last_indexed_at": None if self.last_indexed is None else format_ts(self.last_indexed),
        }

    def _row(self, m: Memory) -> dict[str, Any]:
        w, i = m.written_us, m.indexed_us
        written = m.written or [None, None, None, None]
        indexed = m.indexed or [None, None, None]
        return {
            "kind": "memory_pipeline",
            "agent_id": self.agent_id,
            "memory_id": m.memory_id,
            "name": written[2],
            "store": written[3],
            "written_at": None if w is None else format_ts(w),
            "indexed_at": None if i is None else format_ts(i),
            "indexed_store": indexed[2],
            "status": status(w, i, self.clock, self.deadline_ms),
            "index_delay_seconds": None if w is None or i is None else (ms(i) - ms(w)) / 1000,
            "ever_unindexed": ever_unindexed(w, i, self.clock, self.deadline_ms),
            "write_event_id": written[1],
            "index_event_id": indexed[1],
        }

    def _probe_row(self, p: RecallProbe) -> dict[str, Any]:
        hit, rank, score = probe_verdict(p.memory_id, p.result_ids, p.scores, p.k, p.threshold)
        return {
            "kind": "recall_probe",
            "event_id": p.event_id,
            "agent_id": self.agent_id,
            "memory_id": p.memory_id,
            "hit": hit,
            "rank": rank,
            "score": score,
            "k": p.k,
            "threshold": p.threshold,
            "result_count": len(p.result_ids),
            "ts": format_ts(p.ts_us),
        }

    def summary(self) -> dict[str, Any]:
        """The agent as it stands (``pipeline_agents``): what the memories' rows do not say.
        ``pending`` and ``unindexed`` are the backlog's; the view counts the rows."""
        ambient = self.ambient
        since = self.current_break()
        unindexed, pending = self.backlog.counts()
        return {
            "kind": "pipeline_agent",
            "agent_id": self.agent_id,
            "clock": format_ts(self.clock) if self.clock else None,
            "last_indexed_at": None if self.last_indexed is None else format_ts(self.last_indexed),
            "ambient_at": None if ambient is None else format_ts(ambient[0]),
            "ambient_session_id": None if ambient is None else ambient[2],
            "ambient_memory_ids": None if ambient is None else ambient[3],
            "broken_since": None if since is None else format_ts(since),
            "pending": pending,
            "unindexed": unindexed,
            "deadline_seconds": self.deadline_ms / 1000,
        }
