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
  ``memdiag.unindexed_memory_total{agent_id}``, in the minute of event time its deadline
  passed.
- Break: the agent has an unindexed memory and no ``memory_indexed`` (of any memory) since
  the oldest unindexed one was written. ``pipeline_break`` when that starts to hold,
  ``pipeline_recovered`` when it stops.
- Probes: a hit iff the memory is in the first ``k`` results with a score of at least the
  threshold (scores absent: rank alone). Ties in ``ts`` between two events of one kind for
  one memory (two writes, two probes, two ambient contexts of the agent) go to the greater
  ``event_id``, so the result never depends on which arrived first.

Redelivery. Every rule is a minimum, a maximum or a latest-by-``(ts, event_id)``, so an event
applied twice changes nothing; the records an event is responsible for are sent again with
their current values (the sink upserts them): its memory's row, and the rows its ``ts``
turned unindexed (kept with the ``ts`` that turned them), so a crash between the state write
and the sends loses nothing.

State: the agent's head under ``m:<agent_id>`` (clock, last index, latest ambient context,
the pending and unindexed memories, counts, the break) and one small record per memory under
``mm:<len>:<agent_id><memory_id>``: a batch writes the head and the memories it touched,
never the whole agent.
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


class Backlog:
    """An agent's written, not indexed memories, ``[written_us, memory_id, turned_us]`` each
    (``turned_us``: the clock when it turned unindexed; 0 while pending), in chunks of
    :data:`CHUNK` under their own keys (``mx:<len>:<agent_id><chunk>``).

    The head keeps one summary per chunk, ``[unindexed, pending, oldest unindexed
    written_us, oldest pending written_us, first turned_us, last turned_us]``, so an agent
    whose indexer died weeks ago costs a chunk and its summaries per event, not its whole
    backlog. New entries go to the open chunk until it holds :data:`CHUNK`; an emptied chunk
    is deleted.
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

    def state(self) -> dict[str, Any]:
        return {"o": self.open, "n": self.next, "s": {str(k): v for k, v in self.summaries.items()}}

    def key(self, cid: int) -> str:
        return f"{BACKLOG}{len(self.agent_id)}:{self.agent_id}{cid}"

    def _chunk(self, cid: int) -> list[list[Any]]:
        chunk = self.chunks.get(cid)
        if chunk is None:
            raw = None if self.store is None else self.store.get(self.key(cid))
            chunk = self.chunks[cid] = orjson.loads(raw) if raw is not None else []
        return chunk

    def add(self, written_us: int, memory_id: str, turned_us: int) -> int:
        """Add an entry; the chunk it went to."""
        cid = self.open
        chunk = self._chunk(cid)
        if len(chunk) >= CHUNK:
            cid, self.open, self.next = self.next, self.next, self.next + 1
            chunk = self._chunk(cid)
        chunk.append([written_us, memory_id, turned_us])
        self._summarise(cid)
        return cid

    def remove(self, cid: int, memory_id: str) -> list[Any] | None:
        """Remove ``memory_id``'s entry from chunk ``cid``; the entry."""
        chunk = self._chunk(cid)
        for i, entry in enumerate(chunk):
            if entry[1] == memory_id:
                del chunk[i]
                self._summarise(cid)
                return entry
        return None

    def settle(self, horizon_ms: int, clock_us: int) -> list[list[Any]]:
        """Pending entries written before ``horizon_ms`` turn unindexed at ``clock_us``; the
        entries that turned, oldest first."""
        turned: list[list[Any]] = []
        for cid, s in list(self.summaries.items()):
            if s[3] is not None and ms(s[3]) < horizon_ms:
                for entry in self._chunk(cid):
                    if not entry[2] and ms(entry[0]) < horizon_ms:
                        entry[2] = clock_us
                        turned.append(entry)
                self._summarise(cid)
        return sorted(turned)

    def turned_at(self, ts_us: int) -> list[str]:
        """The memories that turned unindexed when the clock reached ``ts_us``."""
        out: list[str] = []
        for cid, s in self.summaries.items():
            if s[4] is not None and s[4] <= ts_us <= s[5]:
                out += [e[1] for e in self._chunk(cid) if e[2] == ts_us]
        return sorted(out)

    def oldest_unindexed_us(self) -> int | None:
        """The ``written_us`` of the oldest unindexed entry, from the summaries alone."""
        return min((s[2] for s in self.summaries.values() if s[2] is not None), default=None)

    def oldest_unindexed(self) -> tuple[int, str] | None:
        """(written_us, memory_id) of the oldest unindexed entry (ties: the smaller id)."""
        oldest = self.oldest_unindexed_us()
        if oldest is None:
            return None
        entry = min(
            e
            for cid, s in self.summaries.items()
            if s[2] == oldest
            for e in self._chunk(cid)
            if e[2] and e[0] == oldest
        )
        return entry[0], entry[1]

    def counts(self) -> tuple[int, int]:
        """(unindexed, pending)."""
        return (
            sum(s[0] for s in self.summaries.values()),
            sum(s[1] for s in self.summaries.values()),
        )

    def _summarise(self, cid: int) -> None:
        chunk = self._chunk(cid)
        self.dirty.add(cid)
        if not chunk:
            self.summaries.pop(cid, None)
            return
        turned = [e for e in chunk if e[2]]
        pending = [e[0] for e in chunk if not e[2]]
        self.summaries[cid] = [
            len(turned),
            len(pending),
            min((e[0] for e in turned), default=None),
            min(pending, default=None),
            min((e[2] for e in turned), default=None),
            max((e[2] for e in turned), default=None),
        ]

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

    __slots__ = ("memory_id", "written", "indexed", "counted", "chunk", "dirty")

    def __init__(self, memory_id: str, rec: dict[str, Any] | None = None):
        self.memory_id = memory_id
        rec = rec or {}
        self.written: list[Any] | None = rec.get("w")  # [ts_us, event_id, name, store]
        self.indexed: list[Any] | None = rec.get("i")  # [ts_us, event_id, store]
        self.counted: bool = rec.get("x", False)  # counted in unindexed_memory_total
        self.chunk: int | None = rec.get("c")  # its backlog chunk, while not indexed
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
        if self.chunk is not None:
            rec["c"] = self.chunk
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
        self.written: int = head.get("w", 0)  # written memories
        self.indexed: int = head.get("i", 0)  # written memories that are indexed
        #: the break, while it holds: [since_us, raised at (clock)]; the last recovery:
        #: [since_us, recovered at (clock)]
        self.broken: list[int] | None = head.get("br")
        self.recovered: list[int] | None = head.get("rc")
        self.memories: dict[str, Memory] = {}

    @classmethod
    def load(cls, agent_id: str, partition: int, deadline_ms: int, store: StateStore) -> Agent:
        raw = store.get(head_key(agent_id))
        head = orjson.loads(raw) if raw is not None else {}
        agent = cls(agent_id, head.get("p", partition), deadline_ms, head)
        agent.backlog.store = store
        return agent

    def head(self) -> dict[str, Any]:
        head: dict[str, Any] = {"p": self.partition, "c": self.clock, "w": self.written,
                                "i": self.indexed}  # fmt: skip
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
        advanced = ts > self.clock
        if advanced:
            self.clock = ts
        if isinstance(event, MemoryWritten):
            m = self.memory(event.memory_id, store)
            before = (m.written_us, m.indexed_us)
            if _earlier(m.written, ts, event.event_id):
                m.written = [ts, event.event_id, event.name, event.store]
                m.dirty = True
            self._place(m, before, out)
        elif isinstance(event, MemoryIndexed):
            m = self.memory(event.memory_id, store)
            before = (m.written_us, m.indexed_us)
            if _earlier(m.indexed, ts, event.event_id):
                m.indexed = [ts, event.event_id, event.store]
                m.dirty = True
            if self.last_indexed is None or ts > self.last_indexed:
                self.last_indexed = ts
            self._place(m, before, out)
        elif isinstance(event, RecallProbe):
            out.diagnostic(self.agent_id, self._probe_row(event))
        elif isinstance(event, AmbientContext) and _later(self.ambient, ts, event.event_id):
            self.ambient = [ts, event.event_id, event.session_id, list(event.memory_ids)]
        if advanced:
            self._settle(store, out)
        else:  # possibly a redelivery: the rows this ts turned unindexed, again
            for memory_id in self.backlog.turned_at(ts):
                out.diagnostic(self.agent_id, self._row(self.memory(memory_id, store)))
        self._check_break(ts, advanced, out)
        out.ts_us = max(out.ts_us, ts)

    def _place(self, m: Memory, before: tuple[int | None, int | None], out: Output) -> None:
        """Put ``m`` where its status says (in the backlog while not indexed), keep the
        counts, count it once if it ever was unindexed, and send its row."""
        old_w, old_i = before
        w, i = m.written_us, m.indexed_us
        if (w, i) != before:
            turned = 0
            if m.chunk is not None:
                entry = self.backlog.remove(m.chunk, m.memory_id)
                turned = entry[2] if entry else 0
                m.chunk = None
            self.written += (w is not None) - (old_w is not None)
            both = w is not None and i is not None
            self.indexed += both - (old_w is not None and old_i is not None)
            st = status(w, i, self.clock, self.deadline_ms)
            if w is not None and st in (PENDING, UNINDEXED):
                turned_us = (turned or self.clock) if st == UNINDEXED else 0
                m.chunk = self.backlog.add(w, m.memory_id, turned_us)
            m.dirty = True
        self._count(m, out)
        out.diagnostic(self.agent_id, self._row(m))

    def _settle(self, store: StateStore, out: Output) -> None:
        """The clock moved: pending memories past the deadline turn unindexed."""
        horizon_ms = ms(self.clock) - self.deadline_ms  # unindexed iff ms(written) < horizon
        for _, memory_id, _ in self.backlog.settle(horizon_ms, self.clock):
            m = self.memory(memory_id, store)
            self._count(m, out)
            out.diagnostic(self.agent_id, self._row(m))

    def _count(self, m: Memory, out: Output) -> None:
        """Count ``m`` once in ``unindexed_memory_total``, in the minute its deadline passed."""
        w = m.written_us
        if m.counted or w is None:
            return
        if ever_unindexed(w, m.indexed_us, self.clock, self.deadline_ms):
            m.counted = m.dirty = True
            passed_us = (ms(w) + self.deadline_ms + 1) * 1000
            out.count(UNINDEXED_MEMORIES, at_us=passed_us, agent_id=self.agent_id)

    # -- the break --------------------------------------------------------------------------

    def oldest_unindexed(self) -> tuple[int, str] | None:
        return self.backlog.oldest_unindexed()

    def current_break(self) -> int | None:
        """The break rule now: the oldest unindexed write, if nothing was indexed since."""
        return break_since(self.backlog.oldest_unindexed_us(), self.last_indexed)

    def _check_break(self, ts: int, advanced: bool, out: Output) -> None:
        """Raise ``pipeline_break`` when the rule starts to hold, ``pipeline_recovered`` when
        it stops. An episode keeps the ``since`` it was raised with (a late write may move
        the oldest unindexed memory earlier while it holds: the summary says so)."""
        since = self.current_break()
        if since is not None and self.broken is None:
            self.broken = [since, self.clock]
            out.diagnostic(self.agent_id, self._break_record(PIPELINE_BREAK, since, self.clock))
        elif since is None and self.broken is not None:
            self.recovered = [self.broken[0], self.clock]
            self.broken = None
            out.diagnostic(self.agent_id, self._break_record(PIPELINE_RECOVERED, *self.recovered))
        elif not advanced:  # a redelivery re-sends the transition its ts made
            for kind, held in ((PIPELINE_BREAK, self.broken), (PIPELINE_RECOVERED, self.recovered)):
                if held is not None and held[1] == ts:
                    out.diagnostic(self.agent_id, self._break_record(kind, *held))

    # -- records ----------------------------------------------------------------------------

    def _break_record(self, kind: str, since_us: int, at_us: int) -> dict[str, Any]:
        oldest = self.oldest_unindexed()
        return {
            "kind": kind,
            "agent_id": self.agent_id,
            "since": format_ts(since_us),
            "ts": format_ts(at_us),
            "unindexed": self.backlog.counts()[0],
            "oldest_memory_id": oldest[1] if oldest else None,
            "written": self.written,
            "indexed": self.indexed,
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
        """The agent as it stands (``pipeline_agents``): what the memories' rows do not say."""
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
            "written": self.written,
            "indexed": self.indexed,
            "pending": pending,
            "unindexed": unindexed,
            "deadline_seconds": self.deadline_ms / 1000,
        }
