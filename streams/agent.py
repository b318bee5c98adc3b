"""One agent's recall pipeline (docs/rules.md, "Recall pipeline health"): written, indexed,
recalled.

Pure code: no Faust, no Kafka. One :class:`Agent` holds what memdiag knows of one agent's
memory pipeline; the recall stage (``memdiag.streams.stages.recall``) loads it from the state
store, feeds it the agent's events and writes back what changed. The rules themselves are
:mod:`memdiag.streams.rules.recall`.

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
  which arrived first. Each probe counts in ``memdiag.recall_probe_total{agent_id, hit}``,
  in the minute of its own ``ts``, whatever its ``query_source`` (contract section 9: "each
  probe"); SRR and the miss reasons count ``name`` probes only, in DuckDB.
- Every probe and every ambient context is also sent as a row of its own (a function of the
  event alone), for the trends: SRR and ATR over time and against the memory count.

Redelivery. Every rule is a minimum, a maximum or a latest-by-``(ts, event_id)``, so an
event applied twice changes nothing.

State, apart by key: the agent's head under ``m:<agent_id>``; one small record per memory
under ``mm:<len>:<agent_id><memory_id>``; and for each written memory not yet indexed, its
``written_at`` under ``mb:<len>:<agent_id><memory_id>`` (the backlog, read back into a sorted
list when the agent is loaded). A batch writes the memories it touched, their backlog keys
and the head: never the whole agent. Crash safety is the worker's checkpoint's
(:mod:`memdiag.streams.checkpoint`), not this module's.
"""

from __future__ import annotations

from typing import Any

import orjson
from sortedcontainers import SortedList

from memdiag.contract import (
    PIPELINE_BREAK,
    PIPELINE_RECOVERED,
    RECALL_PROBES,
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
from memdiag.streams.rules.recall import (
    break_since,
    earlier,
    ever_unindexed,
    later,
    ms,
    probe_verdict,
    status,
)

HEAD = "m:"
MEMORY = "mm:"
BACKLOG = "mb:"


def head_key(agent_id: str) -> str:
    return HEAD + agent_id


def memory_key(agent_id: str, memory_id: str) -> str:
    """Unambiguous for any two ids (the agent id's length first)."""
    return f"{MEMORY}{len(agent_id)}:{agent_id}{memory_id}"


def backlog_prefix(agent_id: str) -> str:
    """The agent's backlog keys: this and the memory id."""
    return f"{BACKLOG}{len(agent_id)}:{agent_id}"


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
    """One agent's recall pipeline, as far as its events say.

    The head (``m:<agent_id>``) holds the clock, the deadline it ran with, the last index,
    the latest ambient context, and the break that holds (an episode number, its ``since``,
    when it was raised, its oldest memory and the unindexed count then). Each memory has its
    record (``mm:``); each written memory not indexed has a backlog key (``mb:``, its
    ``written_at``), read back into a sorted list when the agent is loaded: a memory is
    unindexed exactly when it is in the backlog and written before the agent's horizon
    (clock minus deadline), so the list's order answers every question the break rule asks."""

    def __init__(self, agent_id: str, partition: int, deadline_ms: int, head: dict[str, Any],
                 backlog: SortedList) -> None:  # fmt: skip
        self.agent_id = agent_id
        self.partition = partition
        self.deadline_ms = deadline_ms
        self.clock: int = head.get("c", 0)
        #: the deadline the rows sent so far were computed with
        self.ran_with: int = head.get("d", deadline_ms)
        self.last_indexed: int | None = head.get("li")
        self.ambient: list[Any] | None = head.get("a")  # [ts_us, event_id, session_id, ids]
        #: the break while it holds: [episode, since_us, broken at (clock), oldest memory
        #: id, unindexed then]
        self.broken: list[Any] | None = head.get("br")
        self.episodes: int = head.get("en", 0)
        #: the written memories not indexed, as (written_us, memory_id)
        self.backlog = backlog
        self._backlog_changed: dict[str, int | None] = {}  # memory id -> written_us or None
        self.memories: dict[str, Memory] = {}  # read in this batch
        self._head = self.head()

    @classmethod
    def load(cls, agent_id: str, partition: int, deadline_ms: int, store: StateStore) -> Agent:
        raw = store.get(head_key(agent_id), partition)
        head = orjson.loads(raw) if raw is not None else {}
        prefix = backlog_prefix(agent_id)
        backlog = SortedList(
            (orjson.loads(value), key[len(prefix) :])
            for key, value in store.items(prefix, partition)
        )
        return cls(agent_id, head.get("p", partition), deadline_ms, head, backlog)

    def head(self) -> dict[str, Any]:
        head: dict[str, Any] = {"p": self.partition, "c": self.clock, "d": self.deadline_ms}
        for key, value in (
            ("li", self.last_indexed),
            ("a", self.ambient),
            ("br", self.broken),
            ("en", self.episodes),
        ):
            if value:
                head[key] = value
        return head

    def save(self, store: StateStore) -> None:
        """What the batch changed: memory records, backlog keys, the head."""
        for memory in self.memories.values():
            if memory.dirty:
                key = memory_key(self.agent_id, memory.memory_id)
                store.put(key, orjson.dumps(memory.state()), self.partition)
                memory.dirty = False
        prefix = backlog_prefix(self.agent_id)
        for memory_id, written in self._backlog_changed.items():
            if written is None:
                store.delete(prefix + memory_id, self.partition)
            else:
                store.put(prefix + memory_id, str(written).encode(), self.partition)
        self._backlog_changed.clear()
        self.memories.clear()
        head = self.head()
        if head != self._head:
            store.put(head_key(self.agent_id), orjson.dumps(head), self.partition)
            self._head = head

    def memory(self, memory_id: str, store: StateStore) -> Memory:
        known = self.memories.get(memory_id)
        if known is None:
            raw = store.get(memory_key(self.agent_id, memory_id), self.partition)
            rec = orjson.loads(raw) if raw is not None else None
            known = self.memories[memory_id] = Memory(memory_id, rec)
        return known

    # -- the backlog ------------------------------------------------------------------------

    def _horizon_us(self, clock: int | None = None, deadline_ms: int | None = None) -> int:
        """A memory of the backlog written before this is unindexed (whole milliseconds)."""
        c = self.clock if clock is None else clock
        d = self.deadline_ms if deadline_ms is None else deadline_ms
        return (ms(c) - d) * 1000

    def _backlog_put(self, written_us: int, memory_id: str) -> None:
        self.backlog.add((written_us, memory_id))
        self._backlog_changed[memory_id] = written_us

    def _backlog_remove(self, written_us: int, memory_id: str) -> None:
        self.backlog.discard((written_us, memory_id))
        self._backlog_changed[memory_id] = None

    def _between(self, lo_us: int, hi_us: int) -> list[str]:
        """The backlog's memories written in [lo, hi)."""
        b = self.backlog
        return [m for _, m in b.islice(b.bisect_left((lo_us, "")), b.bisect_left((hi_us, "")))]

    def counts(self) -> tuple[int, int]:
        """(unindexed, pending) memories of the backlog."""
        unindexed = self.backlog.bisect_left((self._horizon_us(), ""))
        return unindexed, len(self.backlog) - unindexed

    def oldest_unindexed(self) -> tuple[int, str] | None:
        if self.backlog and self.backlog[0][0] < self._horizon_us():
            written, memory_id = self.backlog[0]
            return written, memory_id
        return None

    # -- events -----------------------------------------------------------------------------

    def apply(self, event: MemoryEvent, out: Output, store: StateStore) -> None:
        """Apply one validated event and send what it changed. An event applied twice
        changes nothing (every rule is a minimum, a maximum or a latest-by-``(ts,
        event_id)``)."""
        ts, eid = event.ts_us, event.event_id
        if self.ran_with != self.deadline_ms:
            # MEMDIAG_INDEX_DEADLINE_SECONDS changed: the memories whose status it changes
            old, new = self._horizon_us(deadline_ms=self.ran_with), self._horizon_us()
            for memory_id in self._between(min(old, new), max(old, new)):
                self._send_row(self.memory(memory_id, store), out)
            self.ran_with = self.deadline_ms
        before = self._horizon_us()
        if ts > self.clock:
            self.clock = ts
        if isinstance(event, MemoryWritten):
            m = self.memory(event.memory_id, store)
            old_w = m.written_us
            if earlier(m.written, ts, eid):
                m.written = [ts, eid, event.name, event.store]
                m.dirty = True
            self._place(m, old_w, out)
        elif isinstance(event, MemoryIndexed):
            m = self.memory(event.memory_id, store)
            if earlier(m.indexed, ts, eid):
                m.indexed = [ts, eid, event.store]
                m.dirty = True
            if self.last_indexed is None or ts > self.last_indexed:
                self.last_indexed = ts
            self._place(m, m.written_us, out)
        elif isinstance(event, RecallProbe):
            row = self._probe_row(event)
            out.diagnostic(self.agent_id, row)
            out.count(RECALL_PROBES, at_us=ts, agent_id=self.agent_id,
                      hit="true" if row["hit"] else "false")  # fmt: skip
        elif isinstance(event, AmbientContext):
            out.diagnostic(self.agent_id, self._ambient_row(event))
            if later(self.ambient, ts, eid):
                self.ambient = [ts, eid, event.session_id, list(event.memory_ids)]
        after = self._horizon_us()
        if after > before:  # the clock moved: memories it turned unindexed
            for memory_id in self._between(before, after):
                self._send_row(self.memory(memory_id, store), out)
        self._check_break(out)
        out.ts_us = max(out.ts_us, ts)

    def _place(self, m: Memory, old_w: int | None, out: Output) -> None:
        """Make the backlog hold ``m`` exactly while it is written and not indexed, and send
        its row."""
        w = m.written_us
        if old_w is not None and old_w != w:  # an earlier write came: the entry moves
            self._backlog_remove(old_w, m.memory_id)
        if w is not None and m.indexed is None:
            if (w, m.memory_id) not in self.backlog:
                self._backlog_put(w, m.memory_id)
        elif w is not None and (w, m.memory_id) in self.backlog:
            self._backlog_remove(w, m.memory_id)
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
        """The break rule now: the oldest unindexed write, if nothing was indexed since."""
        oldest = self.oldest_unindexed()
        return break_since(None if oldest is None else oldest[0], self.last_indexed)

    def _check_break(self, out: Output) -> None:
        """Raise ``pipeline_break`` (a new episode) when the rule starts to hold and
        ``pipeline_recovered`` when it stops. An episode keeps the ``since`` it was raised
        with (a late write may move the oldest unindexed memory earlier while it holds: the
        agent's summary says so)."""
        raised = None
        since = self.current_break()
        if since is not None and self.broken is None:
            oldest = self.oldest_unindexed()
            self.episodes += 1
            self.broken = [self.episodes, since, self.clock, oldest[1] if oldest else None,
                           self.counts()[0]]  # fmt: skip
            raised = [PIPELINE_BREAK, *self.broken, None]
        elif since is None and self.broken is not None:
            raised = [PIPELINE_RECOVERED, *self.broken, self.clock]
            self.broken = None
        if raised is not None:
            out.diagnostic(self.agent_id, self._transition_record(raised))

    # -- records ----------------------------------------------------------------------------

    def _transition_record(self, t: list[Any]) -> dict[str, Any]:
        """A transition, whole: a recovery says the break it ends, so either record alone
        makes the episode's row."""
        kind, episode, since_us, broken_at, oldest_id, unindexed, recovered_at = t
        return {
            "kind": kind,
            "agent_id": self.agent_id,
            "episode": episode,
            "since": format_ts(since_us),
            "ts": format_ts(broken_at if recovered_at is None else recovered_at),
            "broken_at": format_ts(broken_at),
            "recovered_at": None if recovered_at is None else format_ts(recovered_at),
            "oldest_memory_id": oldest_id,
            "unindexed": unindexed,
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
        hit, rank, score = probe_verdict(p.memory_id, p.result_ids, p.scores, int(p.k), p.threshold)
        return {
            "kind": "recall_probe",
            "event_id": p.event_id,
            "agent_id": self.agent_id,
            "memory_id": p.memory_id,
            "query_source": p.query_source,
            "hit": hit,
            "rank": rank,
            "score": score,
            "k": p.k,
            "threshold": p.threshold,
            "result_count": len(p.result_ids),
            "top_ids": list(p.result_ids[: int(p.k)]),  # what `aliased` reads (miss_reason)
            "ts": format_ts(p.ts_us),
        }

    def _ambient_row(self, a: AmbientContext) -> dict[str, Any]:
        """Every ambient context, kept for the trends (ATR over time and memory count); the
        latest one is also the agent's summary's."""
        return {
            "kind": "ambient_context",
            "event_id": a.event_id,
            "agent_id": self.agent_id,
            "session_id": a.session_id,
            "memory_ids": list(a.memory_ids),
            "ts": format_ts(a.ts_us),
        }

    def summary(self) -> dict[str, Any]:
        """The agent as it stands (``pipeline_agents``): what the memories' rows do not say.
        ``pending`` and ``unindexed`` are the backlog's; the view counts the rows."""
        ambient = self.ambient
        since = self.current_break()
        unindexed, pending = self.counts()
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
