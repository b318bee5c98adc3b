"""One observation's sessions in the order of their outcomes, and the weight steps that order
implies (docs/rules.md, "Misleading observation" and "Observation weights"): pure code.

Every session that injected the observation and has an outcome takes one step, from its
last outcome in event time. Steps apply in the order of those outcomes' ``ts`` (sessions
with equal ``ts`` by ``session_id``, so the order never depends on arrival). Each step:

- counts the session as failed or accepted;
- is misleading after it iff the observation is then in at least 3 failed sessions and in
  no accepted one;
- moves the weight by the EMA, aggressive (alpha doubled) when misleading after it.

A session that arrives late is inserted where its outcome belongs, and every step after it
is computed again: :meth:`Ledger.apply` returns the steps whose values changed (to re-send
to ``weights`` and the history table) and the failed sessions whose verdict changed (to
re-send to the session, which corrects its ``misleading_observation_ids``). A session whose
last outcome changes moves to its new place the same way; one that comes again (the same
outcome, or an older one) changes nothing and sends nothing.

Bounded state. The ledger keeps the last :attr:`Ledger.MAX_ENTRIES` sessions in order and
folds older ones into a checkpoint (counts and weight). A session older than the
checkpoint that arrives later cannot be placed exactly: it is not applied, and the caller
counts it (``memdiag.late_event_total{reason="observation_window"}``).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

import msgspec

from memdiag.contract import ACCEPTED
from memdiag.streams.rules.diagnosis import ema_step, is_misleading


class Entry(msgspec.Struct, frozen=True, gc=False):
    """A session's outcome, as one observation's ledger keeps it."""

    ts_us: int
    session_id: str
    outcome_event_id: str
    outcome: str

    @property
    def order(self) -> tuple[int, str]:
        return (self.ts_us, self.session_id)

    @property
    def revision(self) -> tuple[int, str]:
        """Which of two outcomes of one session is the newer: the later in event time,
        equal ``ts`` by ``event_id`` (the session's own rule for its last outcome)."""
        return (self.ts_us, self.outcome_event_id)


class Step(msgspec.Struct, frozen=True, gc=False):
    """One EMA step of the observation's weight, caused by one session."""

    session_id: str
    outcome_event_id: str
    outcome: str
    alpha: float
    previous_weight: float
    new_weight: float
    aggressive: bool
    misleading: bool  # after counting this session
    failed_sessions: int
    accepted_sessions: int
    position: int  # 1-based: the observation's n-th step in outcome order
    ts_us: int  # event time of the session's outcome

    @property
    def failed(self) -> bool:
        return self.outcome != ACCEPTED


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The folded-away start of the ledger: where its first kept step starts from."""

    failed: int = 0
    accepted: int = 0
    weight: float = 1.0
    position: int = 0
    boundary: tuple[int, str] | None = None  # order of the newest folded session


@dataclass(slots=True)
class Change:
    """What one step message did to the ledger."""

    steps: list[Step] = field(default_factory=list)  # to (re-)send, in order
    verdicts: list[Step] = field(default_factory=list)  # failed sessions to answer
    fresh: bool = False  # the ledger changed (False: a duplicate, or stale)
    late: bool = False  # older than the ledger's folded start: not applied
    became_misleading: bool = False


class Ledger:
    """See the module docstring. ``version`` grows with every change: an answer carries it,
    so whoever keeps answers keeps the newest."""

    MAX_ENTRIES = 256

    def __init__(
        self,
        alpha_success: float,
        alpha_failure: float,
        checkpoint: Checkpoint | None = None,
        entries: list[Entry] | None = None,
        version: int = 0,
    ):
        self._alpha_success = alpha_success
        self._alpha_failure = alpha_failure
        self.checkpoint = checkpoint or Checkpoint()
        self.entries: list[Entry] = entries or []
        self.version = version
        self._orders = [e.order for e in self.entries]
        self._by_session = {e.session_id: e for e in self.entries}
        self.steps: list[Step] = []
        self._recompute(0)

    @property
    def misleading(self) -> bool:
        if self.steps:
            return self.steps[-1].misleading
        return is_misleading(self.checkpoint.failed, self.checkpoint.accepted)

    @property
    def current(self) -> Step | None:
        """The newest step: it holds the observation's current weight and counts."""
        return self.steps[-1] if self.steps else None

    def apply(self, entry: Entry) -> Change:
        existing = self._by_session.get(entry.session_id)
        if existing is not None and existing.revision >= entry.revision:
            return Change()  # the same outcome again, or an older one: nothing changes
        if existing is None and self.checkpoint.boundary is not None:
            if entry.order <= self.checkpoint.boundary:
                return Change(late=True)
        was_misleading = self.misleading
        before = {s.session_id: s for s in self.steps}
        start = len(self.entries)
        if existing is not None:
            old = self._position(existing)
            del self.entries[old]
            del self._orders[old]
            del self.steps[old:]
            start = old
        new = bisect_left(self._orders, entry.order)
        self.entries.insert(new, entry)
        self._orders.insert(new, entry.order)
        self._by_session[entry.session_id] = entry
        start = min(start, new)
        del self.steps[start:]
        self._recompute(start)
        self.version += 1
        change = Change(fresh=True)
        for step in self.steps[start:]:
            previous = before.get(step.session_id)
            if previous == step:
                continue
            change.steps.append(step)
            if step.failed and (
                previous is None
                or previous.misleading != step.misleading
                or previous.outcome_event_id != step.outcome_event_id
            ):
                change.verdicts.append(step)
        change.became_misleading = self.misleading and not was_misleading
        self._fold()
        return change

    def _position(self, entry: Entry) -> int:
        return bisect_left(self._orders, entry.order)

    def _recompute(self, start: int) -> None:
        """Steps ``start`` onwards, from the step before (or the checkpoint)."""
        cp = self.checkpoint
        if start > 0:
            prev = self.steps[start - 1]
            failed, accepted = prev.failed_sessions, prev.accepted_sessions
            weight, position = prev.new_weight, prev.position
        else:
            failed, accepted, weight, position = cp.failed, cp.accepted, cp.weight, cp.position
        for entry in self.entries[start:]:
            accepted_now = entry.outcome == ACCEPTED
            if accepted_now:
                accepted += 1
            else:
                failed += 1
            misleading = is_misleading(failed, accepted)
            alpha, new_weight, aggressive = ema_step(
                weight, accepted_now, misleading, self._alpha_success, self._alpha_failure
            )
            position += 1
            self.steps.append(
                Step(
                    entry.session_id,
                    entry.outcome_event_id,
                    entry.outcome,
                    alpha,
                    weight,
                    new_weight,
                    aggressive,
                    misleading,
                    failed,
                    accepted,
                    position,
                    entry.ts_us,
                )
            )
            weight = new_weight

    def _fold(self) -> None:
        excess = len(self.entries) - self.MAX_ENTRIES
        if excess <= 0:
            return
        last = self.steps[excess - 1]
        self.checkpoint = Checkpoint(
            last.failed_sessions,
            last.accepted_sessions,
            last.new_weight,
            last.position,
            self.entries[excess - 1].order,
        )
        for gone in self.entries[:excess]:
            del self._by_session[gone.session_id]
        del self.entries[:excess]
        del self._orders[:excess]
        del self.steps[:excess]

    # -- serialisation (compact JSON) ---------------------------------------------------------

    def to_state(self) -> list[Any]:
        cp = self.checkpoint
        return [
            self.version,
            [cp.failed, cp.accepted, cp.weight, cp.position, cp.boundary],
            [[e.ts_us, e.session_id, e.outcome_event_id, e.outcome] for e in self.entries],
        ]

    @classmethod
    def from_state(
        cls, state: list[Any] | None, alpha_success: float, alpha_failure: float
    ) -> Ledger:
        if not state:
            return cls(alpha_success, alpha_failure)
        version, cp, entries = state
        boundary = None if cp[4] is None else (cp[4][0], cp[4][1])
        return cls(
            alpha_success,
            alpha_failure,
            Checkpoint(cp[0], cp[1], cp[2], cp[3], boundary),
            [Entry(*e[:4]) for e in entries],  # (a fifth field, an arrival seq, is old)
            version,
        )
