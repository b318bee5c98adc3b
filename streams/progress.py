"""Where a stage stands on each of its partitions in one consumer generation: which record
comes next, what is durable, what is committed. Pure bookkeeping, no Kafka: the batch runner
(:mod:`memdiag.streams.batches`) feeds it the records in the order the fetcher delivers
them, whatever that order is, and processes only what it admits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: What :meth:`Progress.admit` says of a record.
PROCESS, BEHIND, AHEAD, FOREIGN = "process", "behind", "ahead", "foreign"


@dataclass
class Progress:
    """Where a stage stands on each of its partitions in one consumer generation: pure
    bookkeeping, no Kafka.

    ``next``: the offset to process next; records are processed in offset order from the
    committed offset, each exactly once per generation. ``durable``: everything before it
    is durable (safe to commit). ``committed``: what was last committed.
    """

    generation: int | None = None
    next: dict[Any, int] = field(default_factory=dict)
    durable: dict[Any, int] = field(default_factory=dict)
    committed: dict[Any, int] = field(default_factory=dict)

    def start(self, generation: int, bases: Mapping[Any, int]) -> None:
        """A new generation: each partition starts at its committed offset."""
        self.generation = generation
        self.next = dict(bases)
        self.durable = dict(bases)
        self.committed = dict(bases)

    def admit(self, tp: Any, offset: int) -> str:
        """PROCESS the record at ``offset`` (the next in order), or skip it: BEHIND (already
        processed in this generation: a duplicate after a seek), AHEAD (a record before it
        is missing: seek back and wait for it), FOREIGN (not a partition of this stage in
        this generation)."""
        expected = self.next.get(tp)
        if expected is None:
            return FOREIGN
        if offset == expected:
            self.next[tp] = offset + 1
            return PROCESS
        return BEHIND if offset < expected else AHEAD

    def skip_to(self, tp: Any, offset: int) -> None:
        """The records before ``offset`` do not exist (the broker says so): go on from it.
        They count as durable: there is nothing of them to lose."""
        if tp in self.next and offset > self.next[tp]:
            if self.durable[tp] == self.next[tp]:
                self.durable[tp] = offset
            self.next[tp] = offset

    def done(self, generation: int, ends: Mapping[Any, int]) -> None:
        """The records before ``ends[tp]`` are durable (batches finish in offset order)."""
        if generation != self.generation:
            return  # a batch of a generation since replaced: its offsets are not ours
        for tp, end in ends.items():
            if tp in self.durable and end > self.durable[tp]:
                self.durable[tp] = end

    def to_commit(self) -> dict[Any, int]:
        """The offsets that moved since the last commit."""
        return {tp: o for tp, o in self.durable.items() if self.committed.get(tp) != o}

    def committed_to(self, offsets: Mapping[Any, int]) -> None:
        for tp, o in offsets.items():
            if tp in self.committed:
                self.committed[tp] = max(self.committed[tp], o)
