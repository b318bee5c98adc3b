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
unindexed (each kept with the clock that turned it), and the break or recovery it raised
(kept with the event's id). So a crash between the state writes and the sends loses nothing.

Crashes inside a save. A batch's writes for an agent are its backlog's new nodes (copy on
write: :mod:`memdiag.streams.backlog`), the memories it changed (each with its undo:
:class:`Memory`), then the head, which is the commit: whatever part of the writes a crash
lands, the agent reads as it was before the batch or after it, never in between, and the
batch comes again.

State, apart by key: the agent's head under ``m:<agent_id>``; its backlog's nodes under
``mx:<len>:<agent_id><n>`` (none while the backlog fits in the head); one small record per
memory under ``mm:<len>:<agent_id><memory_id>``. A batch writes the memories it touched, the
backlog nodes on their paths and the head: never the whole agent.
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
from memdiag.streams.backlog import Backlog, NodeCache

HEAD = "m:"
MEMORY = "mm:"
BACKLOG = "mx:"


def head_key(agent_id: str) -> str:
    return HEAD + agent_id


def memory_key(agent_id: str, memory_id: str) -> str:
    """Unambiguous for any two ids (the agent id's length first)."""
    return f"{MEMORY}{len(agent_id)}:{agent_id}{memory_id}"


def backlog_prefix(agent_id: str) -> str:
    """The keys of the agent's backlog nodes: this and the node's number."""
    return f"{BACKLOG}{len(agent_id)}:{agent_id}"


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


#: An agent's batches whose outputs it can send again (a crash can lose the outputs of the
#: runner's batches in flight, four at most, after their state landed): the events whose
#: clock turned memories unindexed, the transitions each raised, the event that sorted the
#: backlog again.
BATCHES_KEPT = 4
KEPT_PER_BATCH = 4096
RESORTED = "mr:"


def resorted_key(agent_id: str) -> str:
    """The memories the last re-sort of the agent's backlog changed (``[event id, ids]``)."""
    return f"{RESORTED}{len(agent_id)}:{agent_id}"


class Memory:
    """One memory's record: its first write and first index in event time.

    Undo. A record is written before its agent's head, with the head's next epoch and the
    record as the head before knew it (``base``): a record whose epoch is ahead of the head's
    is from a batch whose head was lost in a crash, and reads as its ``base`` (the batch
    comes again)."""

    __slots__ = ("memory_id", "written", "indexed", "counted", "base", "dirty")

    def __init__(self, memory_id: str, rec: dict[str, Any] | None = None):
        self.memory_id = memory_id
        rec = rec or {}
        self.written: list[Any] | None = rec.get("w")  # [ts_us, event_id, name, store]
        self.indexed: list[Any] | None = rec.get("i")  # [ts_us, event_id, store]
        self.counted: bool = rec.get("x", False)  # counted in unindexed_memory_total
        self.base: dict[str, Any] | None = self.facts() if rec else None
        self.dirty = False

    @classmethod
    def read(cls, memory_id: str, raw: bytes | None, epoch: int) -> Memory:
        rec = orjson.loads(raw) if raw is not None else None
        if rec is not None and rec.get("e", 0) > epoch:  # written by a batch whose head was lost
            rec = rec.get("p")
        return cls(memory_id, rec)

    @property
    def written_us(self) -> int | None:
        return None if self.written is None else self.written[0]

    @property
    def indexed_us(self) -> int | None:
        return None if self.indexed is None else self.indexed[0]

    def facts(self) -> dict[str, Any]:
        rec: dict[str, Any] = {}
        if self.written is not None:
            rec["w"] = self.written
        if self.indexed is not None:
            rec["i"] = self.indexed
        if self.counted:
            rec["x"] = True
        return rec

    def state(self, epoch: int) -> dict[str, Any]:
        """The record to write in the batch that makes the head's ``epoch``."""
        return {**self.facts(), "e": epoch, "p": self.base}


class Agent:
    """One agent's recall pipeline, as far as its events say.

    The head (``m:<agent_id>``) holds the clock, the deadline it ran with, the last index,
    the latest ambient context, the break that holds (an episode number, its ``since``, when
    it was raised, its oldest memory and the unindexed count then), what the agent's last
    :data:`BATCHES_KEPT` batches would send again for a redelivery, the backlog's root, and
    its epoch: one more than the greatest offset of ``memory`` the batch applied (at least
    one more than the last epoch). A redelivery cut into other batches gives each part the
    epoch of its own last offset: only the part that ends where the lost batch ended reaches
    the epoch the lost batch's memory records carry, and that part writes them again."""

    def __init__(
        self,
        agent_id: str,
        partition: int,
        deadline_ms: int,
        head: dict[str, Any],
        store: StateStore,
        cache: NodeCache | None = None,
        batch_id: str = "",
        raw: bytes | None = None,
    ):
        """``raw``: the stored bytes ``head`` was read from, if it was."""
        self.agent_id = agent_id
        self.partition = partition
        self.deadline_ms = deadline_ms
        self.store = store
        # to save nothing when a batch changed nothing
        self._loaded = raw if raw is not None else orjson.dumps(head)
        self.epoch: int = head.get("e", 0)
        self.clock: int = head.get("c", 0)
        self.last_indexed: int | None = head.get("li")
        self.ambient: list[Any] | None = head.get("a")  # [ts_us, event_id, session_id, ids]
        #: the written memories not indexed, pending and unindexed
        self.backlog = Backlog(backlog_prefix(agent_id), head.get("bl"), store, cache)
        #: the break while it holds: [episode, since_us, broken at (clock), oldest memory
        #: id, unindexed then]
        self.broken: list[Any] | None = head.get("br")
        self.episodes: int = head.get("en", 0)
        #: what the runner's last batches did, to send again: each {"b": the batch's id,
        #: "t": [[the event whose clock turned memories unindexed, that clock]], "x":
        #: [transitions: [the event that raised it, kind, episode, since_us, broken at,
        #: oldest memory id, unindexed, recovered at or None]], "r": [the event that sorted
        #: the backlog again (its memories: under resorted_key)]}
        self.recent: list[dict[str, Any]] = head.get("rb", [])
        self.batch: dict[str, Any] = {"b": batch_id}  # this batch's, the same way
        self._resorted: list[Any] | None = None  # [event id, memory ids], this batch
        self._offset = 0  # the greatest offset applied in this batch, plus one
        # what a redelivered event finds: by its id
        self._again_of: dict[str, list[list[Any]]] = {}
        for done in self.recent:
            self._index(done)
        #: MEMDIAG_INDEX_DEADLINE_SECONDS changed since the backlog was sorted: sort it again
        self._resort = head.get("d", deadline_ms) != deadline_ms
        self.memories: dict[str, Memory] = {}

    @classmethod
    def load(
        cls,
        agent_id: str,
        partition: int,
        deadline_ms: int,
        store: StateStore,
        cache: NodeCache | None = None,
        batch_id: str = "",
    ) -> Agent:
        raw = store.get(head_key(agent_id))
        head = orjson.loads(raw) if raw is not None else {}
        return cls(agent_id, head.get("p", partition), deadline_ms, head, store, cache, batch_id,
                   raw)  # fmt: skip

    def head(self) -> dict[str, Any]:
        head: dict[str, Any] = {"p": self.partition, "c": self.clock, "d": self.deadline_ms,
                                "e": self.epoch, "bl": self.backlog.state()}  # fmt: skip
        for key, value in (
            ("li", self.last_indexed),
            ("a", self.ambient),
            ("br", self.broken),
            ("en", self.episodes),
            ("rb", self._recent()),
        ):
            if value:
                head[key] = value
        return head

    def save(self, store: StateStore) -> None:
        """The backlog's new nodes and the changed memories (with their undo) first, the head
        last: the head is the batch's commit (see :class:`Memory`, :mod:`backlog`). A batch
        that changed nothing (redeliveries) writes nothing."""
        dirty = [m for m in self.memories.values() if m.dirty]
        if not dirty and not self.backlog.changed and orjson.dumps(self.head()) == self._loaded:
            return
        epoch = max(self.epoch + 1, self._offset)
        self.backlog.save_nodes(store, self.partition)
        for memory in dirty:
            key = memory_key(self.agent_id, memory.memory_id)
            store.put(key, orjson.dumps(memory.state(epoch)), self.partition)
            memory.base, memory.dirty = memory.facts(), False
        if self._resorted is not None:
            store.put(resorted_key(self.agent_id), orjson.dumps(self._resorted), self.partition)
            self._resorted = None
        self.epoch = epoch
        self.recent, self.batch = self._recent(), {"b": self.batch["b"]}
        self._loaded = orjson.dumps(self.head())
        store.put(head_key(self.agent_id), self._loaded, self.partition)

    def _recent(self) -> list[dict[str, Any]]:
        """The kept batches with this one's (merged into the last if it is the same batch:
        a retried batch saves an agent once a message)."""
        if len(self.batch) == 1:  # nothing but its id
            return self.recent
        recent = list(self.recent)
        if recent and recent[-1].get("b") == self.batch["b"]:
            last = dict(recent.pop())
            for key in ("t", "x"):
                if key in self.batch:  # bounded as a batch is (the runner's 2,000 messages)
                    last[key] = [*last.get(key, ()), *self.batch[key]][-KEPT_PER_BATCH:]
            if "r" in self.batch:
                last["r"] = self.batch["r"]
            recent.append(last)
        else:
            recent.append(self.batch)
        return recent[-BATCHES_KEPT:]

    def memory(self, memory_id: str) -> Memory:
        known = self.memories.get(memory_id)
        if known is None:
            raw = self.store.get(memory_key(self.agent_id, memory_id))
            known = self.memories[memory_id] = Memory.read(memory_id, raw, self.epoch)
        return known

    # -- events -----------------------------------------------------------------------------

    def apply(self, event: MemoryEvent, out: Output, offset: int = 0) -> None:
        """Apply one validated event (from ``memory``'s ``offset``) and send what it changed
        (or, for an event seen before, what it is responsible for, with current values)."""
        ts, eid = event.ts_us, event.event_id
        self._offset = max(self._offset, offset + 1)
        if self._resort:
            self._resort = False
            changed = self.backlog.resort(self._horizon_ms() * 1000, self.clock)
            self._resorted = [eid, changed]
            self.batch["r"] = eid
            for memory_id in changed:
                self._send_row(self.memory(memory_id), out)
        else:
            self._again(eid, out)
        advanced = ts > self.clock
        if advanced:
            self.clock = ts
        if isinstance(event, MemoryWritten):
            m = self.memory(event.memory_id)
            old_w = m.written_us
            if _earlier(m.written, ts, eid):
                m.written = [ts, eid, event.name, event.store]
                m.dirty = True
            self._place(m, old_w, out)
        elif isinstance(event, MemoryIndexed):
            m = self.memory(event.memory_id)
            if _earlier(m.indexed, ts, eid):
                m.indexed = [ts, eid, event.store]
                m.dirty = True
            if self.last_indexed is None or ts > self.last_indexed:
                self.last_indexed = ts
            self._place(m, m.written_us, out)
        elif isinstance(event, RecallProbe):
            out.diagnostic(self.agent_id, self._probe_row(event))
        elif isinstance(event, AmbientContext) and _later(self.ambient, ts, eid):
            self.ambient = [ts, eid, event.session_id, list(event.memory_ids)]
        if advanced:
            turned = self.backlog.turn(self._horizon_ms() * 1000, self.clock)
            if turned:
                self.batch.setdefault("t", []).append([eid, ts])
            for _, memory_id, _ in turned:
                self._send_row(self.memory(memory_id), out)
        self._check_break(eid, out)
        out.ts_us = max(out.ts_us, ts)

    def _index(self, done: dict[str, Any]) -> None:
        for t in done.get("t", ()):
            self._again_of.setdefault(t[0], []).append(t)
        for t in done.get("x", ()):
            self._again_of.setdefault(t[0], []).append(t)
        if "r" in done:
            self._again_of.setdefault(done["r"], []).append([done["r"]])

    def _again(self, eid: str, out: Output) -> None:
        """For an event the agent's last batches applied: send again what it did."""
        for done in self._again_of.get(eid, ()):
            if len(done) == 2:  # its clock turned memories unindexed: [event, clock]
                for memory_id in self.backlog.turned_at(done[1]):
                    self._send_row(self.memory(memory_id), out)
            elif len(done) == 1:  # it sorted the backlog again
                raw = self.store.get(resorted_key(self.agent_id))
                resorted = orjson.loads(raw) if raw is not None else None
                if resorted is not None and resorted[0] == eid:
                    for memory_id in resorted[1]:
                        self._send_row(self.memory(memory_id), out)
            else:
                out.diagnostic(self.agent_id, self._transition_record(done))

    def _horizon_ms(self) -> int:
        """A memory written before this (whole ms) and not indexed is unindexed."""
        return ms(self.clock) - self.deadline_ms

    def _place(self, m: Memory, old_w: int | None, out: Output) -> None:
        """Make the backlog hold ``m`` exactly while it is written and not indexed, and send
        its row."""
        w = m.written_us
        turned = 0
        if old_w is not None and old_w != w:  # an earlier write came: the entry moves
            entry = self.backlog.remove((old_w, m.memory_id))
            turned = entry[2] if entry else 0
        st = status(w, m.indexed_us, self.clock, self.deadline_ms)
        if w is not None and st in (PENDING, UNINDEXED):
            self.backlog.add([w, m.memory_id, (turned or self.clock) if st == UNINDEXED else 0])
        elif w is not None:
            self.backlog.remove((w, m.memory_id))
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
        oldest = self.backlog.oldest_unindexed()
        return break_since(None if oldest is None else oldest[0], self.last_indexed)

    def _check_break(self, eid: str, out: Output) -> None:
        """Raise ``pipeline_break`` (a new episode) when the rule starts to hold and
        ``pipeline_recovered`` when it stops, each remembered with the event that raised it.
        An episode keeps the ``since`` it was raised with (a late write may move the oldest
        unindexed memory earlier while it holds: the agent's summary says so)."""
        raised = None
        since = self.current_break()
        if since is not None and self.broken is None:
            oldest = self.backlog.oldest_unindexed()
            self.episodes += 1
            self.broken = [self.episodes, since, self.clock, oldest[1] if oldest else None,
                           self.backlog.counts()[0]]  # fmt: skip
            raised = [eid, PIPELINE_BREAK, *self.broken, None]
        elif since is None and self.broken is not None:
            raised = [eid, PIPELINE_RECOVERED, *self.broken, self.clock]
            self.broken = None
        if raised is not None:
            self.batch.setdefault("x", []).append(raised)
            out.diagnostic(self.agent_id, self._transition_record(raised))

    # -- records ----------------------------------------------------------------------------

    def _transition_record(self, t: list[Any]) -> dict[str, Any]:
        """A transition, whole: a recovery says the break it ends, so either record alone
        makes the episode's row."""
        _, kind, episode, since_us, broken_at, oldest_id, unindexed, recovered_at = t
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
