"""The two stages after a session outcome: observation owners, and the gather.

Why two more stages. Whether an observation is misleading depends on every session it was
injected into, and those sessions live on every partition of ``events``. So the session
stage sends one *step* per injected observation to an internal topic keyed by
``observation_id``: whichever worker owns that partition is the one owner of the
observation, however the work is partitioned, and sees every session's outcome for it.

:class:`ObservationOwner` applies the step (counts, EMA weight; ``streams.diagnosis``),
sends the weight update to ``weights`` and, for a failed session, its verdict (misleading
or not, after counting this session) back to an internal topic keyed by ``session_id``.
:class:`Gatherer` collects a failed session's draft diagnostic and its observations'
verdicts, in any order, and emits the ``session_diagnostic`` once all have arrived, with
``misleading_observation_ids`` in injected order.

Redelivery. A redelivered step is recognised by the owner (``ObservationState.recent``)
and re-sends the same weight update and verdict. A completed gather is remembered for the
turn TTL, so a redelivered draft or verdict re-emits the same diagnostic; a gather still
incomplete after that long (a verdict lost to a bug) emits what it has, with the missing
verdicts as not misleading, rather than losing the diagnostic.

Pure code apart from the state store: no Faust, no Kafka.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from memdiag.settings import Settings
from schemas.models import format_ts
from streams.diagnosis import ACCEPTED, ObservationState
from streams.processor import (
    MISLEADING,
    ExpiryIndex,
    InMessage,
    Output,
    StateStore,
)

log = logging.getLogger("memdiag.worker")


def _records(msg: InMessage) -> list[dict[str, Any]]:
    """An internal message: one JSON array of records, written by memdiag itself."""
    doc = orjson.loads(msg.value or b"[]")
    if not isinstance(doc, list):
        raise ValueError("an internal message must be a JSON array")
    return doc


class ObservationOwner:
    """Per observation: failed and accepted session counts and the weight."""

    def __init__(self, settings: Settings):
        self._alpha_success = settings.alpha_success
        self._alpha_failure = settings.alpha_failure

    def process(self, msg: InMessage, store: StateStore) -> Output:
        out = Output()
        by_observation: dict[str, list[dict[str, Any]]] = {}
        for rec in _records(msg):
            by_observation.setdefault(rec["observation_id"], []).append(rec)
        for obs_id, recs in by_observation.items():
            raw = store.get(obs_id)
            state = ObservationState.from_state(orjson.loads(raw) if raw is not None else None)
            for rec in recs:
                step, fresh = state.apply(
                    obs_id,
                    rec["session_id"] + "\0" + rec["outcome_event_id"],
                    rec["outcome"],
                    rec["ts_us"],
                    self._alpha_success,
                    self._alpha_failure,
                )
                session_id = rec["session_id"]
                out.weights.setdefault(obs_id, []).append(
                    {
                        "kind": "observation_weight",
                        "observation_id": obs_id,
                        "weight": step.new_weight,
                        "previous_weight": step.previous_weight,
                        "alpha": step.alpha,
                        "aggressive": step.aggressive,
                        "misleading": step.misleading,
                        "session_id": session_id,
                        "outcome_event_id": rec["outcome_event_id"],
                        "outcome": step.outcome,
                        "failed_sessions": step.failed_sessions,
                        "accepted_sessions": step.accepted_sessions,
                        "step": step.seq,
                        "ts": format_ts(step.ts_us),
                    }
                )
                if step.outcome != ACCEPTED:
                    out.verdicts.setdefault(session_id, []).append(
                        {
                            "kind": "verdict",
                            "session_id": session_id,
                            "outcome_event_id": rec["outcome_event_id"],
                            "observation_id": obs_id,
                            "misleading": step.misleading,
                            "ts_us": step.ts_us,
                        }
                    )
                if fresh and step.became_misleading:
                    out.counts[(MISLEADING, ())] += 1
            store[obs_id] = orjson.dumps(state.to_state())
            out.ts_us = max(out.ts_us, max(r["ts_us"] for r in recs))
        return out


class Gatherer:
    """Per session: a failed session's draft and its observations' verdicts.

    State per session: ``{"p": partition, "g": {outcome_event_id: [ts_us, draft | None,
    {observation_id: misleading}, final | None]}}``.
    """

    def __init__(self, settings: Settings):
        self._ttl_us = settings.turn_ttl_us
        self._expiry = ExpiryIndex()

    def partitions_changed(self) -> None:
        self._expiry.clear()

    def process(self, msg: InMessage, store: StateStore) -> Output:
        out = Output()
        index = self._index(msg.partition, store)
        for rec in _records(msg):
            session_id = rec["session_id"]
            raw = store.get(session_id)
            entry: dict[str, Any] = (
                orjson.loads(raw) if raw is not None else {"p": msg.partition, "g": {}}
            )
            gather: list[Any] = entry["g"].setdefault(
                rec["outcome_event_id"], [rec["ts_us"], None, {}, None]
            )
            if rec["kind"] == "draft":
                gather[1] = rec["draft"]
            else:
                gather[2][rec["observation_id"]] = rec["misleading"]
            if gather[3] is not None:
                out.diagnostic(session_id, gather[3])  # redelivered: the same diagnostic again
            elif gather[1] is not None and all(
                o in gather[2] for o in gather[1]["injected_observation_ids"]
            ):
                final = _final(gather[1], gather[2])
                gather[3] = final
                out.diagnostic(session_id, final)
            store[session_id] = orjson.dumps(entry)
            index[session_id] = _deadline(entry, self._ttl_us)
            self._expiry.advance(msg.partition, rec["ts_us"])
            out.ts_us = max(out.ts_us, rec["ts_us"])
        self._sweep(msg.partition, store, out)
        return out

    def _index(self, partition: int, store: StateStore) -> dict[str, int]:
        index = self._expiry.deadlines.get(partition)
        if index is None:
            index = {}
            for session_id, raw in list(store.items()):
                entry = orjson.loads(raw)
                if entry.get("p") == partition and entry.get("g"):
                    index[session_id] = _deadline(entry, self._ttl_us)
            self._expiry.deadlines[partition] = index
        return index

    def _sweep(self, partition: int, store: StateStore, out: Output) -> None:
        sweep = self._expiry.sweep(partition)
        if sweep is None:
            return
        due, index, watermark = sweep
        for session_id in due:
            raw = store.get(session_id)
            index.pop(session_id, None)
            if raw is None:
                continue
            entry = orjson.loads(raw)
            gathers = entry["g"]
            for outcome_id in list(gathers):
                ts_us, draft, verdicts, final = gathers[outcome_id]
                if ts_us + self._ttl_us > watermark:
                    continue
                if final is None and draft is not None:
                    log.warning(
                        "session %s: %d of %d verdicts after the turn TTL; emitting its "
                        "diagnostic with the missing ones counted as not misleading",
                        session_id,
                        len(verdicts),
                        len(draft["injected_observation_ids"]),
                    )
                    out.diagnostic(session_id, _final(draft, verdicts))
                elif draft is None:
                    log.warning(
                        "session %s: verdicts for outcome %s but no draft after the turn "
                        "TTL; dropped",
                        session_id,
                        outcome_id,
                    )
                del gathers[outcome_id]
            if gathers:
                store[session_id] = orjson.dumps(entry)
                index[session_id] = _deadline(entry, self._ttl_us)
            else:
                del store[session_id]


def _final(draft: dict[str, Any], verdicts: dict[str, bool]) -> dict[str, Any]:
    final = dict(draft)
    final["misleading_observation_ids"] = [
        o for o in draft["injected_observation_ids"] if verdicts.get(o)
    ]
    return final


def _deadline(entry: dict[str, Any], ttl_us: int) -> int:
    return min(g[0] for g in entry["g"].values()) + ttl_us
