"""The recall pipeline stage: ``memory`` messages in, memory rows, probes and breaks out.

No Faust, no Kafka. Input: ``memory``, keyed by ``agent_id`` and co-partitioned with
``events``, so the agents' state lives in the worker's one state table (keys ``m:``,
``mx:`` and ``mm:``, :mod:`memdiag.streams.agent`). Per batch, each event is decoded and
validated once and applied to its :class:`memdiag.streams.agent.Agent`; each touched agent
is written once, after the whole batch (the memories and backlog nodes that changed, then
its head), and its summary (``pipeline_agent``) is sent once. (A batch: what the runner hands
the stage in one call, at most about 2 MiB of input, ``StageSpec.piece_bytes``.)

Partitioning, as for sessions: an event that arrives on another partition than its
``agent_id``'s (published without a key, or in a batch keyed by something else) is put back
on ``memory`` keyed by its ``agent_id``, with its original Kafka timestamp, and applied when
it arrives there. The rules are in event time, so the detour changes nothing.

An agent's state is never forgotten: it is a few dozen bytes a memory, and an agent's
pipeline health is a question about its whole history. Decoded agents (their heads and
backlogs) are kept across batches, :data:`RecallStage.CACHE_SIZE` at most; a batch reads
only the memories it names.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from memdiag.contract.envelope import InMessage, Output, StateStore
from memdiag.schemas import MEMORY_KINDS
from memdiag.schemas.deadletters import add_dead_letter
from memdiag.schemas.decode import Decoder
from memdiag.schemas.models import MemoryEvent
from memdiag.settings import Settings
from memdiag.streams.agent import Agent


class RecallStage:
    """The recall pipeline stage's logic; one per worker process."""

    #: Most decoded agents kept between batches (the store holds them all).
    CACHE_SIZE = 1024

    def __init__(self, settings: Settings, partition_of: Callable[[str], int]):
        self.settings = settings
        self._partition_of = partition_of
        self._deadline_ms = settings.index_deadline_ms
        self._decoder = Decoder(
            MEMORY_KINDS, settings.topics.memory, settings.max_event_bytes, settings.max_skew_us
        )
        self._agents: OrderedDict[str, Agent] = OrderedDict()

    held_bytes = 0

    def settle(self, store: StateStore) -> None:
        """Nothing held: every batch writes what it changed."""

    def reset(self) -> None:
        self._agents.clear()

    def process(self, msgs: list[InMessage], store: StateStore) -> Output:
        try:
            return self._process(msgs, store)
        except BaseException:
            self._agents.clear()  # an agent may have changed and not been written
            raise

    def _agent(self, agent_id: str, partition: int, store: StateStore) -> Agent:
        agents = self._agents
        agent = agents.get(agent_id)
        if agent is None:
            agent = Agent.load(agent_id, partition, self._deadline_ms, store)
            agents[agent_id] = agent
            if len(agents) > self.CACHE_SIZE:
                agents.popitem(last=False)
        else:
            agents.move_to_end(agent_id)
        return agent

    def _process(self, msgs: list[InMessage], store: StateStore) -> Output:
        out = Output()
        touched: dict[str, Agent] = {}
        for msg in msgs:
            if msg.timestamp_ms is not None:
                out.timestamp_ms = max(out.timestamp_ms or 0, msg.timestamp_ms)
            decoded = self._decoder.decode(msg.value, msg.timestamp_ms)
            for rejected in decoded.rejected:
                add_dead_letter(out, msg, rejected, self.settings)
            rerouted: dict[str, list[Any]] = {}
            for acc in decoded.accepted:
                event: MemoryEvent = acc.event  # type: ignore[assignment]
                agent_id = event.agent_id
                if self._partition_of(agent_id) != msg.partition:
                    rerouted.setdefault(agent_id, []).append(acc.reroutable())
                    continue
                agent = touched.get(agent_id)
                if agent is None:
                    agent = touched[agent_id] = self._agent(agent_id, msg.partition, store)
                agent.apply(event, out, store)
            for agent_id, raws in rerouted.items():
                out.reroute_memory.append((agent_id, raws, msg.timestamp_ms))
        for agent in touched.values():
            agent.save(store)
            out.diagnostic(agent.agent_id, agent.summary())
        return out
