"""Where the runner stands on each of its partitions in one consumer generation: which record
comes next, and what is committed. Pure bookkeeping, no Kafka: the runner
(:mod:`memdiag.streams.runner`) feeds it the records in the order the fetcher delivers them,
whatever that order is, and processes only what it admits: each record once, in offset order,
from the committed offset on (faust-streaming's fetcher can deliver from a stale position
after a rebalance, and drop records it had fetched: docs/upstream)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

#: What :meth:`Progress.admit` says of a record.
PROCESS, BEHIND, AHEAD, FOREIGN = "process", "behind", "ahead", "foreign"


class HasOffset(Protocol):
    @property
    def offset(self) -> int: ...


@dataclass
class Progress:
    """``next``: per partition, the offset to process next; records are processed in offset
    order from the committed offset, each exactly once per generation. ``committed``: what
    was last committed."""

    generation: int | None = None
    next: dict[Any, int] = field(default_factory=dict)
    committed: dict[Any, int] = field(default_factory=dict)

    def start(self, generation: int | None, bases: Mapping[Any, int]) -> None:
        """A new generation (or a restart from the committed offsets after a failed
        checkpoint): each partition starts at its committed offset."""
        self.generation = generation
        self.next = dict(bases)
        self.committed = dict(bases)

    def stop(self) -> None:
        """Take nothing until the next :meth:`start` (a checkpoint failed, or a rebalance)."""
        self.generation = None

    def admit(self, tp: Any, offset: int) -> str:
        """PROCESS the record at ``offset`` (the next in order), or skip it: BEHIND (already
        processed in this generation: a duplicate after a seek), AHEAD (a record before it
        is missing: seek back and wait for it), FOREIGN (not a partition of the runner in
        this generation)."""
        expected = self.next.get(tp)
        if expected is None:
            return FOREIGN
        if offset == expected:
            self.next[tp] = offset + 1
            return PROCESS
        return BEHIND if offset < expected else AHEAD

    def admit_run(self, tp: Any, records: Sequence[HasOffset]) -> tuple[int, int, str | None]:
        """Admit a fetched run of one partition's records at once: the slice ``[lo, hi)`` of
        ``records`` to process, and AHEAD if a record is missing in or before the run (the
        rest waits for a seek back), FOREIGN if the partition is not the runner's, else None.
        The fetcher's runs are in offset order, usually exactly the next ones."""
        expected = self.next.get(tp)
        if expected is None:
            return 0, 0, FOREIGN
        n = len(records)
        if not n:
            return 0, 0, None
        first = records[0].offset
        if first == expected and records[-1].offset == first + n - 1:
            self.next[tp] = first + n  # the usual case: exactly the next ones, no gap
            return 0, n, None
        lo = 0
        while lo < n and records[lo].offset < expected:
            lo += 1  # delivered again after a seek
        hi = lo
        while hi < n and records[hi].offset == expected:
            expected += 1
            hi += 1
        self.next[tp] = expected
        return lo, hi, AHEAD if hi < n else None

    def skip_to(self, tp: Any, offset: int) -> None:
        """The records before ``offset`` do not exist (the broker says so: transaction
        markers, deleted records): go on from it."""
        if tp in self.next and offset > self.next[tp]:
            self.next[tp] = offset

    def committed_to(self, offsets: Mapping[Any, int]) -> None:
        for tp, o in offsets.items():
            if tp in self.committed:
                self.committed[tp] = max(self.committed[tp], o)
