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

Graph entities and edges injected in a session take the same steps (the same ledger, the
same alphas, doubled once misleading; state key ``g:entity:ID`` or ``g:edge:S|T|R``): their
weights go to ``graph_weights``, keyed ``entity:ID`` or ``edge:S|T|R``; no session waits for
an answer about them.

The session stage also sends the owner each change of a *verdict* (used or ignored in one
turn, or taken back): the owner keeps the observation's
:class:`memdiag.streams.rules.strength.Strength` (state key ``os:<observation_id>``) and sends
every strength step whose values changed to ``weights`` as ``"kind": "strength"`` (and a
retraction for a step taken back).
"""

from __future__ import annotations

from typing import Any

import orjson

from memdiag.contract import LATE_EVENTS, LATE_OBSERVATION_WINDOW, MISLEADING
from memdiag.contract.envelope import InMessage, Output, StateStore
from memdiag.schemas.models import format_ts
from memdiag.settings import Settings
from memdiag.streams.lru import Cache, shared_budget
from memdiag.streams.rules.ledger import Entry, Ledger, Step
from memdiag.streams.rules.strength import Strength, StrengthStep, Verdict

PREFIX = "o:"
GRAPH_PREFIX = "g:"  # a graph entity's or edge's ledger: g:entity:ID, g:edge:S|T|R
STRENGTH_PREFIX = "os:"  # (sessions are "s:")


class ObservationStage:
    """The observation stage's logic."""

    #: Most decoded ledgers kept between batches (the store holds them all). A ledger read
    #: back is decoded and its steps computed again, so the busy ones stay here.
    CACHE_SIZE = 1_000

    def __init__(self, settings: Settings):
        self._alpha_success = settings.alpha_success
        self._alpha_failure = settings.alpha_failure
        self._alpha_used = settings.alpha_used
        self._alpha_ignored = settings.alpha_ignored
        # observation id -> its ledger (its strength) as last written: current until the
        # runner resets the stage (a checkpoint rolled back, partitions moved). All in the
        # worker's one budget of decoded state (MEMDIAG_DECODED_CACHE_MB), each at most
        # CACHE_SIZE entries
        budget = shared_budget(settings.decoded_cache_mb << 20)
        self._cache: Cache[Ledger] = budget.cache("ledgers", self.CACHE_SIZE)
        self._graph_cache: Cache[Ledger] = budget.cache("graph ledgers", self.CACHE_SIZE)
        self._strengths: Cache[Strength] = budget.cache("strengths", self.CACHE_SIZE)
        #: the stored bytes of what this batch loaded from the store (its cache weight)
        self._loaded: dict[str, int] = {}

    held_bytes = 0

    def settle(self, store: StateStore) -> None:
        """Nothing held: every batch writes what it changed."""

    def reset(self) -> None:
        self._cache.clear()
        self._graph_cache.clear()
        self._strengths.clear()
        self._loaded.clear()

    def process(self, msgs: list[InMessage], store: StateStore) -> Output:
        try:
            return self._process(msgs, store)
        except BaseException:
            self.reset()  # a ledger may have changed and not been written
            raise

    def _cache_of(self, state_key: str) -> Cache[Ledger]:
        return self._graph_cache if state_key.startswith(GRAPH_PREFIX) else self._cache

    def _load(self, state_key: str, partition: int, store: StateStore) -> Ledger:
        ledger = self._cache_of(state_key).get(state_key)
        if ledger is None:
            raw = store.get(state_key, partition)
            self._loaded[state_key] = len(raw) if raw is not None else 0
            ledger = Ledger.from_state(
                orjson.loads(raw) if raw is not None else None,
                self._alpha_success,
                self._alpha_failure,
            )
        return ledger

    def _load_strength(self, obs_id: str, partition: int, store: StateStore) -> Strength:
        strength = self._strengths.get(obs_id)
        if strength is None:
            raw = store.get(STRENGTH_PREFIX + obs_id, partition)
            self._loaded[STRENGTH_PREFIX + obs_id] = len(raw) if raw is not None else 0
            strength = Strength.from_state(
                orjson.loads(raw) if raw is not None else None,
                self._alpha_used,
                self._alpha_ignored,
            )
        return strength

    def _process(self, msgs: list[InMessage], store: StateStore) -> Output:
        out = Output()
        # state key (o:ID, g:KEY) -> (ledger, partition, changed)
        ledgers: dict[str, tuple[Ledger, int, bool]] = {}
        strengths: dict[str, tuple[Strength, int, bool]] = {}
        # the steps this batch changed, the newest per (observation, session): a step that
        # changes twice in one batch is sent once, with its last values; the same for
        # strength steps, per (observation, session, turn), and for a graph entity's or
        # edge's, per (its key, session). Their records are made once, at the end of the
        # batch (a late session changes every later step, up to 256 a session): each carries
        # the observation's version and current values as of the batch's end, as the newest
        # of its records would. (A batch: what the runner hands the stage in one call, at
        # most about 2 MiB of input, memdiag.streams.runner.StageSpec.piece_bytes)
        weights: dict[str, dict[Any, Step]] = {}
        strength_steps: dict[str, dict[Any, StrengthStep | tuple[str, str]]] = {}
        graph_weights: dict[str, dict[str, Step]] = {}
        for msg in msgs:
            if msg.timestamp_ms is not None:
                out.timestamp_ms = max(out.timestamp_ms or 0, msg.timestamp_ms)
            for rec in _records(msg):
                obs_id = rec["observation_id"]
                kind = rec.get("type")
                if kind == "verdict":
                    self._verdict(rec, msg.partition, store, strengths, strength_steps, out)
                    continue
                graph = kind == "graph"  # a graph entity or edge: obs_id is its key
                state_key = (GRAPH_PREFIX if graph else PREFIX) + obs_id
                known = ledgers.get(state_key)
                if known is None:
                    known = (self._load(state_key, msg.partition, store), msg.partition, False)
                ledger = known[0]
                entry = Entry(
                    rec["ts_us"],
                    rec["session_id"],
                    rec["outcome_event_id"],
                    rec["outcome"],
                )
                change = ledger.apply(entry)
                ledgers[state_key] = (ledger, msg.partition, known[2] or change.fresh)
                if change.late:
                    out.count(LATE_EVENTS, at_us=entry.ts_us, reason=LATE_OBSERVATION_WINDOW)
                if graph:  # its weights for the memory system; no session waits for it
                    if change.steps:
                        sent_graph = graph_weights.setdefault(obs_id, {})
                        for step in change.steps:
                            sent_graph.pop(step.session_id, None)  # the newest goes last
                            sent_graph[step.session_id] = step
                    out.ts_us = max(out.ts_us, entry.ts_us)
                    continue
                if change.steps:
                    sent = weights.setdefault(obs_id, {})
                    for step in change.steps:
                        sent.pop(step.session_id, None)  # the newest goes last
                        sent[step.session_id] = step
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
            ledger = ledgers[PREFIX + obs_id][0]
            for step in sent.values():
                out.weight(obs_id, weight_record(obs_id, step, ledger))
        for obs_id, moved in strength_steps.items():
            strength = strengths[obs_id][0]
            for s in moved.values():
                out.weight(obs_id, strength_retracted(obs_id, s, strength) if isinstance(s, tuple)
                           else strength_record(obs_id, s, strength))  # fmt: skip
        for graph_key, sent_graph in graph_weights.items():
            ledger = ledgers[GRAPH_PREFIX + graph_key][0]
            for step in sent_graph.values():
                out.graph_weight(graph_key, weight_record(graph_key, step, ledger, graph=True))
        loaded, self._loaded = self._loaded, {}
        for state_key, (ledger, partition, changed) in ledgers.items():
            size = loaded.get(state_key)
            if changed:
                raw = orjson.dumps(ledger.to_state())
                store.put(state_key, raw, partition)
                size = len(raw)
            self._cache_of(state_key).put(state_key, ledger, size)
        for obs_id, (strength, partition, changed) in strengths.items():
            size = loaded.get(STRENGTH_PREFIX + obs_id)
            if changed:
                raw = orjson.dumps(strength.to_state())
                store.put(STRENGTH_PREFIX + obs_id, raw, partition)
                size = len(raw)
            self._strengths.put(obs_id, strength, size)
        return out

    def _verdict(
        self,
        rec: dict[str, Any],
        partition: int,
        store: StateStore,
        strengths: dict[str, tuple[Strength, int, bool]],
        moved: dict[str, dict[Any, StrengthStep | tuple[str, str]]],
        out: Output,
    ) -> None:
        """A verdict of one turn changed (or was taken back): the strength steps it moves."""
        obs_id = rec["observation_id"]
        known = strengths.get(obs_id)
        if known is None:
            known = (self._load_strength(obs_id, partition, store), partition, False)
        strength = known[0]
        key = (rec["session_id"], rec["turn_id"])
        used = rec.get("used")
        verdict = None if used is None else Verdict(rec["ts_us"], rec["tie"], *key, used)
        was = rec.get("was")
        taken_back = None if was is None else (was[0], was[1], *key)
        change = strength.apply(key, verdict, rec.get("seq", 0), taken_back)
        strengths[obs_id] = (strength, partition, known[2] or change.fresh)
        if change.late:
            at = verdict.ts_us if verdict is not None else (was[0] if was else out.ts_us)
            out.count(LATE_EVENTS, at_us=at, reason=LATE_OBSERVATION_WINDOW)
        if not change.steps and not change.retracted:
            return
        sent = moved.setdefault(obs_id, {})
        for step in change.steps:
            sent.pop(step.key, None)  # the newest goes last
            sent[step.key] = step
        for gone in change.retracted:
            sent.pop(gone, None)
            sent[gone] = gone


def weight_record(obs_id: str, step: Step, ledger: Ledger, graph: bool = False) -> dict[str, Any]:
    """One step, for the memory system and the history table. ``current_*`` is the
    observation's state after its newest step (what to apply); ``version`` orders them.
    ``graph``: the step of a graph entity or edge (``obs_id`` is its key, ``entity:ID`` or
    ``edge:S|T|R``), for ``graph_weights``."""
    current = ledger.current or step
    head: dict[str, Any] = (
        {
            "kind": "graph_weight",
            "id": obs_id,
            "graph_kind": obs_id.split(":", 1)[0],
            "graph_id": obs_id.split(":", 1)[1],
        }  # fmt: skip
        if graph
        else {"kind": "observation_weight", "observation_id": obs_id}
    )
    return {
        **head,
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


def _strength_current(strength: Strength) -> dict[str, Any]:
    """The observation's strength after its newest step: what the memory system applies."""
    steps = strength.steps
    return {
        "version": strength.version,
        "current_strength": strength.current,
        "current_step": strength.judged_turns,
        "current_used_turns": strength.used_turns,
        "updated_at": format_ts(steps[-1].ts_us) if steps else None,
    }


def strength_record(obs_id: str, step: StrengthStep, strength: Strength) -> dict[str, Any]:
    """One strength step, for the memory system and the history table."""
    return {
        "kind": "strength",
        "observation_id": obs_id,
        "session_id": step.session_id,
        "turn_id": step.turn_id,
        "retracted": False,
        "signal": "used" if step.used else "ignored",
        "alpha": step.alpha,
        "previous_strength": step.previous,
        "strength": step.strength,
        "step": step.position,
        "ts": format_ts(step.ts_us),
        **_strength_current(strength),
    }


def strength_retracted(obs_id: str, key: tuple[str, str], strength: Strength) -> dict[str, Any]:
    """A strength step taken back (its verdict was): the sink deletes its history row; the
    current value is the observation's after its newest remaining step."""
    return {
        "kind": "strength",
        "observation_id": obs_id,
        "session_id": key[0],
        "turn_id": key[1],
        "retracted": True,
        **_strength_current(strength),
    }


def _records(msg: InMessage) -> list[dict[str, Any]]:
    """An internal message: one JSON array of records, written by memdiag itself."""
    doc = orjson.loads(msg.value or b"[]")
    if not isinstance(doc, list):
        raise ValueError("an internal message must be a JSON array")
    return doc
