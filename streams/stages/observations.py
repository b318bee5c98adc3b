"""The observation stage: one owner per observation, however the sessions are partitioned.

Whether an observation is misleading, and its weight, depend on every session it was
injected into, and those sessions live on every partition of ``events``. So the session
stage sends one *step* per injected observation to an internal topic keyed by
``observation_id``: whichever worker owns that partition is the one owner of the
observation, and sees every session's outcome for it.

The owner keeps the observation's :class:`memdiag.streams.rules.ledger.Ledger` (its sessions
in outcome order) and sends:

- every step whose values changed to ``weights`` (the memory system applies the current
  weight; the sink keeps the history, one row per observation and session);
- for each failed session whose answer changed, its verdict (misleading after counting this
  session?) back to the internal ``session-verdicts`` topic, keyed by session: the session
  corrects its ``misleading_observation_ids`` and sends its diagnostic again.

Every answer carries the ledger's ``version``, so whoever keeps answers keeps the newest,
whatever order they arrive in. State key: ``o:<observation_id>``.
"""

from __future__ import annotations

from typing import Any

import orjson

from memdiag.contract import LATE_EVENTS, LATE_OBSERVATION_WINDOW, MISLEADING
from memdiag.contract.envelope import InMessage, Output, StateStore
from memdiag.schemas.models import format_ts
from memdiag.settings import Settings
from memdiag.streams.lru import remember
from memdiag.streams.rules.ledger import Entry, Ledger, Step

PREFIX = "o:"


class ObservationStage:
    """The observation stage's logic."""

    #: Most decoded ledgers kept between batches (the store holds them all). A ledger read
    #: back is decoded and its steps computed again, so the busy ones stay here.
    CACHE_SIZE = 1_000

    def __init__(self, settings: Settings):
        self._alpha_success = settings.alpha_success
        self._alpha_failure = settings.alpha_failure
        # observation id -> its ledger as last written: current until the runner resets the
        # stage (a checkpoint rolled back, partitions moved)
        self._cache: dict[str, Ledger] = {}

    def reset(self) -> None:
        self._cache.clear()

    def process(self, msgs: list[InMessage], store: StateStore) -> Output:
        try:
            return self._process(msgs, store)
        except BaseException:
            self._cache.clear()  # a ledger may have changed and not been written
            raise

    def _load(self, obs_id: str, partition: int, store: StateStore) -> Ledger:
        ledger = self._cache.get(obs_id)
        if ledger is None:
            raw = store.get(PREFIX + obs_id, partition)
            ledger = Ledger.from_state(
                orjson.loads(raw) if raw is not None else None,
                self._alpha_success,
                self._alpha_failure,
            )
        return ledger

    def _process(self, msgs: list[InMessage], store: StateStore) -> Output:
        out = Output()
        ledgers: dict[str, tuple[Ledger, int, bool]] = {}  # id -> (ledger, partition, changed)
        # the weight records of this batch, the newest per (observation, session): a step
        # that changes twice in one batch is sent once, with its last values
        weights: dict[str, dict[str, dict[str, Any]]] = {}
        for msg in msgs:
            if msg.timestamp_ms is not None:
                out.timestamp_ms = max(out.timestamp_ms or 0, msg.timestamp_ms)
            for rec in _records(msg):
                obs_id = rec["observation_id"]
                known = ledgers.get(obs_id)
                if known is None:
                    known = (self._load(obs_id, msg.partition, store), msg.partition, False)
                ledger = known[0]
                entry = Entry(
                    rec["ts_us"],
                    rec["session_id"],
                    rec["outcome_event_id"],
                    rec["outcome"],
                )
                change = ledger.apply(entry)
                ledgers[obs_id] = (ledger, msg.partition, known[2] or change.fresh)
                if change.late:
                    out.count(LATE_EVENTS, at_us=entry.ts_us, reason=LATE_OBSERVATION_WINDOW)
                if change.steps:
                    sent = weights.setdefault(obs_id, {})
                    for step in change.steps:
                        sent.pop(step.session_id, None)  # the newest goes last
                        sent[step.session_id] = weight_record(obs_id, step, ledger)
                for step in change.verdicts:
                    out.verdict(
                        step.session_id,
                        {
                            "session_id": step.session_id,
                            "observation_id": obs_id,
                            "outcome_event_id": step.outcome_event_id,
                            "misleading": step.misleading,
                            "version": ledger.version,
                        },
                    )
                if change.became_misleading:
                    out.count(MISLEADING, at_us=entry.ts_us)
                out.ts_us = max(out.ts_us, entry.ts_us)
        for obs_id, sent in weights.items():
            for record in sent.values():
                out.weight(obs_id, record)
        for obs_id, (ledger, partition, changed) in ledgers.items():
            if changed:
                store.put(PREFIX + obs_id, orjson.dumps(ledger.to_state()), partition)
            remember(self._cache, obs_id, ledger, self.CACHE_SIZE)
        return out


def weight_record(obs_id: str, step: Step, ledger: Ledger) -> dict[str, Any]:
    """One step, for the memory system and the history table. ``current_*`` is the
    observation's state after its newest step (what to apply); ``version`` orders them."""
    current = ledger.current or step
    return {
        "kind": "observation_weight",
        "observation_id": obs_id,
        "session_id": step.session_id,
        "outcome_event_id": step.outcome_event_id,
        "outcome": step.outcome,
        "alpha": step.alpha,
        "previous_weight": step.previous_weight,
        "weight": step.new_weight,
        "aggressive": step.aggressive,
        "misleading": step.misleading,
        "failed_sessions": step.failed_sessions,
        "accepted_sessions": step.accepted_sessions,
        "step": step.position,
        "ts": format_ts(step.ts_us),
        "version": ledger.version,
        "current_weight": current.new_weight,
        "current_step": current.position,
        "current_failed_sessions": current.failed_sessions,
        "current_accepted_sessions": current.accepted_sessions,
        "current_misleading": current.misleading,
        "updated_at": format_ts(current.ts_us),
    }


def _records(msg: InMessage) -> list[dict[str, Any]]:
    """An internal message: one JSON array of records, written by memdiag itself."""
    doc = orjson.loads(msg.value or b"[]")
    if not isinstance(doc, list):
        raise ValueError("an internal message must be a JSON array")
    return doc
