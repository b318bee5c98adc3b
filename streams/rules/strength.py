"""An observation's *strength*: an EMA of its used/ignored verdicts (docs/rules.md,
"Strength"): pure code.

Each judged (session, turn) of the observation takes one step, toward 1 when ``used``
(``MEMDIAG_ALPHA_USED``) and toward 0 when ``ignored`` (``MEMDIAG_ALPHA_IGNORED``), from 1.0
(a memory nobody judged is not demoted). The steps are taken in the order of the turns' time:
the later of the injection's and the response's ``ts``, ties by that later event's
``event_id``, then by session and turn (contract section 10). So strength is a function of the
verdicts, never of when they arrived:

- a verdict that arrives late is inserted where it belongs and every step after it is taken
  again (:meth:`Strength.apply` returns the steps whose values changed);
- a verdict that changes (a late earlier response) moves or changes its step;
- a verdict taken back (a late span moved the memory out of its turn) takes its step back:
  the steps after it are taken again, and the caller deletes its history row.

It is not the outcome weight (:mod:`memdiag.streams.rules.ledger`): the weight moves once per
session, on whether the session failed; strength moves once per judged turn, on whether the
response used the memory, whatever the session's outcome.

Stale messages. The session stage sends each change of a verdict with ``seq``, the length of
the session's log when it sent it: it only grows, and a replay sends the same. The owner keeps
the newest ``seq`` per (session, turn), taken-back ones included, and ignores a lower one: a
message a worker sent before it lost the partition, arriving after its successor's, changes
nothing.

Bounded state, as the ledger: the last :attr:`Strength.MAX_ENTRIES` verdicts in order, the
older ones folded into a start (strength and counts). A verdict older than that start, arriving
later, cannot be placed exactly: it is not applied, and the caller counts it
(``memdiag.late_event_total{reason="observation_window"}``).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

import msgspec

#: a memory's strength before any verdict
START = 1.0

Order = tuple[int, str, str, str]  # (ts, tie event id, session id, turn id)


class Verdict(msgspec.Struct, frozen=True, gc=False):
    """One judged turn of the observation, as its owner keeps it."""

    ts_us: int  # the turn's time: the later of its injection's and its response's ts
    tie: str  # the event id of that later event
    session_id: str
    turn_id: str
    used: bool

    @property
    def order(self) -> Order:
        return (self.ts_us, self.tie, self.session_id, self.turn_id)

    @property
    def key(self) -> tuple[str, str]:
        return (self.session_id, self.turn_id)


class StrengthStep(msgspec.Struct, frozen=True, gc=False):
    """One EMA step of the observation's strength, from one judged turn."""

    session_id: str
    turn_id: str
    used: bool
    alpha: float
    previous: float
    strength: float
    position: int  # 1-based: the observation's n-th verdict in turn order
    used_turns: int  # used verdicts up to and with this one
    ts_us: int

    @property
    def key(self) -> tuple[str, str]:
        return (self.session_id, self.turn_id)


@dataclass(frozen=True, slots=True)
class Folded:
    """The folded-away start: where the first kept step starts from."""

    strength: float = START
    position: int = 0
    used_turns: int = 0
    boundary: Order | None = None  # order of the newest folded verdict


@dataclass(slots=True)
class StrengthChange:
    """What one verdict message did."""

    steps: list[StrengthStep] = field(default_factory=list)  # changed or new, in order
    retracted: list[tuple[str, str]] = field(default_factory=list)  # (session, turn) gone
    fresh: bool = False  # the state changed
    late: bool = False  # older than the folded start: not applied


def ema(
    strength: float, used: bool, alpha_used: float, alpha_ignored: float
) -> tuple[float, float]:
    """(alpha, new strength) of one verdict."""
    if used:
        return alpha_used, strength + alpha_used * (1.0 - strength)
    return alpha_ignored, strength - alpha_ignored * strength


class Strength:
    """See the module docstring. ``version`` grows with every change: every record sent
    carries it, so the memory system and the sink keep the newest current value."""

    MAX_ENTRIES = 256

    def __init__(
        self,
        alpha_used: float,
        alpha_ignored: float,
        folded: Folded | None = None,
        entries: list[Verdict] | None = None,
        version: int = 0,
        seqs: dict[tuple[str, str], int] | None = None,
    ):
        self._alpha_used = alpha_used
        self._alpha_ignored = alpha_ignored
        self.folded = folded or Folded()
        self.entries: list[Verdict] = entries or []
        self.version = version
        self._orders = [e.order for e in self.entries]
        self._by_key = {e.key: e for e in self.entries}
        self.steps: list[StrengthStep] = []
        #: (session, turn) -> the newest seq applied, for the kept verdicts and tombstones
        self.seqs: dict[tuple[str, str], int] = dict(seqs or {})
        self._recompute(0)

    @property
    def current(self) -> float:
        return self.steps[-1].strength if self.steps else self.folded.strength

    @property
    def judged_turns(self) -> int:
        return self.steps[-1].position if self.steps else self.folded.position

    @property
    def used_turns(self) -> int:
        return self.steps[-1].used_turns if self.steps else self.folded.used_turns

    #: take-backs whose ``seq`` is kept (the newest ones): a stale verdict of their key must
    #: not come back
    MAX_TOMBSTONES = 256

    def apply(
        self,
        key: tuple[str, str],
        verdict: Verdict | None,
        seq: int = 0,
        taken_back: Order | None = None,
    ) -> StrengthChange:
        """The verdict of one (session, turn) is now ``verdict`` (None: taken back; then
        ``taken_back`` is the order the verdict had), as the session knew it at ``seq``."""
        known = self.seqs.get(key)
        if known is not None and seq < known:
            return StrengthChange()  # stale: sent before a message already applied
        moved = known != seq
        self.seqs[key] = seq
        existing = self._by_key.get(key)
        if verdict is None:
            self.seqs.pop(key)  # a tombstone: the newest last, the oldest dropped
            self.seqs[key] = seq
            if len(self.seqs) > len(self._by_key) + self.MAX_TOMBSTONES:
                for old in [k for k in self.seqs if k not in self._by_key][:1]:
                    del self.seqs[old]
        if existing == verdict:
            boundary = self.folded.boundary
            if (verdict is None and taken_back is not None and boundary is not None
                    and taken_back <= boundary):  # fmt: skip
                return StrengthChange(fresh=moved, late=True)  # folded in: cannot come out
            # the same again (a redelivery), or nothing to take back; a newer seq is kept
            return StrengthChange(fresh=moved)
        late = False
        boundary = self.folded.boundary
        if verdict is not None and boundary is not None and verdict.order <= boundary:
            if existing is None:
                return StrengthChange(late=True)
            late, verdict = True, None  # moved before the folded start: its step taken back
        start = len(self.entries)
        if existing is not None:
            start = bisect_left(self._orders, existing.order)
            del self.entries[start]
            del self._orders[start]
            del self._by_key[key]
        if verdict is not None:
            at = bisect_left(self._orders, verdict.order)
            self.entries.insert(at, verdict)
            self._orders.insert(at, verdict.order)
            self._by_key[key] = verdict
            start = min(start, at)
        before = {s.key: s for s in self.steps[start:]}
        del self.steps[start:]
        self._recompute(start)
        self.version += 1
        change = StrengthChange(fresh=True, late=late)
        for step in self.steps[start:]:
            if before.get(step.key) != step:
                change.steps.append(step)
        if verdict is None:
            change.retracted.append(key)
        self._fold()
        return change

    def _recompute(self, start: int) -> None:
        if start > 0:
            prev = self.steps[start - 1]
            strength, position, used_turns = prev.strength, prev.position, prev.used_turns
        else:
            f = self.folded
            strength, position, used_turns = f.strength, f.position, f.used_turns
        for v in self.entries[start:]:
            alpha, new = ema(strength, v.used, self._alpha_used, self._alpha_ignored)
            position += 1
            used_turns += v.used
            self.steps.append(StrengthStep(v.session_id, v.turn_id, v.used, alpha, strength, new,
                                           position, used_turns, v.ts_us))  # fmt: skip
            strength = new

    def _fold(self) -> None:
        excess = len(self.entries) - self.MAX_ENTRIES
        if excess <= 0:
            return
        last = self.steps[excess - 1]
        self.folded = Folded(last.strength, last.position, last.used_turns,
                             self.entries[excess - 1].order)  # fmt: skip
        for gone in self.entries[:excess]:
            del self._by_key[gone.key]
            self.seqs.pop(gone.key, None)  # older than the start: refused as late anyway
        del self.entries[:excess]
        del self._orders[:excess]
        del self.steps[:excess]

    # -- serialisation (compact JSON) ---------------------------------------------------------

    def to_state(self) -> list[Any]:
        f = self.folded
        return [
            self.version,
            [
                f.strength,
                f.position,
                f.used_turns,
                None if f.boundary is None else list(f.boundary),
            ],
            [[e.ts_us, e.tie, e.session_id, e.turn_id, e.used] for e in self.entries],
            [[k[0], k[1], v] for k, v in self.seqs.items()],
        ]

    @classmethod
    def from_state(
        cls, state: list[Any] | None, alpha_used: float, alpha_ignored: float
    ) -> Strength:
        if not state:
            return cls(alpha_used, alpha_ignored)
        version, f, entries, *rest = state
        seqs = {(k0, k1): v for k0, k1, v in rest[0]} if rest else {}
        boundary = None if f[3] is None else (f[3][0], f[3][1], f[3][2], f[3][3])
        return cls(
            alpha_used,
            alpha_ignored,
            Folded(f[0], f[1], f[2], boundary),
            [Verdict(*e) for e in entries],
            version,
            seqs,
        )
