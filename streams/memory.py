"""The recall pipeline stage: ``memory`` messages in, memory rows, probes and breaks out.

No Faust, no Kafka. Input: ``memory``, keyed by ``agent_id`` and co-partitioned with
``events``, so the agents' state lives in the worker's one state table (keys ``m:``,
``mx:`` and ``mm:``, :mod:`memdiag.streams.recall`). Per batch, each event is decoded and
validated once and applied to its :class:`memdiag.streams.recall.Agent`; each touched agent
is written once, after the whole batch (the memories and backlog nodes that changed, then
its head), and its summary (``pipeline_agent``) is sent once.

Partitioning, as for sessions: an event that arrives on another partition than its
``agent_id``'s (published without a key, or in a batch keyed by something else) is put back
on ``memory`` keyed by its ``agent_id``, with its original Kafka timestamp, and applied when
it arrives there. The rules are in event time, so the detour changes nothing.

An agent's state is never forgotten: it is a few dozen bytes a memory, and an agent's
pipeline health is a question about its whole history. A batch costs an agent its head, the
memories it named and the backlog nodes on their paths (a tree of 128 memories a leaf): an
agent whose indexer died weeks ago is not rewritten whole per event.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from memdiag.contract.envelope import InMessage, Output, StateStore
from memdiag.schemas import MEMORY_KINDS
from memdiag.schemas.deadletters import add_dead_letter
from memdiag.schemas.decode import Decoder
from memdiag.schemas.models import MemoryEvent
from memdiag.settings import Settings
from memdiag.streams.backlog import NodeCache
from memdiag.streams.recall import Agent


class MemoryStage:
    """The recall pipeline stage's logic; one per worker process."""

    def __init__(self, settings: Settings, partition_of: Callable[[str], int]):
        self.settings = settings
        self._partition_of = partition_of
        self._deadline_ms = settings.index_deadline_ms
        self._decoder = Decoder(
            MEMORY_KINDS, settings.topics.memory, settings.max_event_bytes, settings.max_skew_us
        )
        self._nodes = NodeCache()  # decoded backlog nodes, across batches
        # the runner's batches, as an agent keeps what its last few sent: each call is one,
        # but the calls of a batch retried a message at a time (one_batch) are one
        self._batch = f"{os.getpid():x}.{time.monotonic_ns():x}"
        self._batches = 0
        self._one_batch: bool | None = None  # None: each call is a batch

    @contextmanager
    def one_batch(self) -> Iterator[None]:
        """The ``process`` calls inside are one batch of the runner (retried by message)."""
        self._one_batch = False
        try:
            yield
        finally:
            self._one_batch = None

    def partitions_changed(self) -> None:
        self._nodes.clear()

    def process(self, msgs: list[InMessage], store: StateStore) -> Output:
        if not self._one_batch:
            self._batches += 1
            if self._one_batch is False:
                self._one_batch = True
        try:
            return self._process(msgs, store)
        except BaseException:
            self._nodes.clear()  # a node may have changed in place and not moved
            raise

    def _process(self, msgs: list[InMessage], store: StateStore) -> Output:
        out = Output()
        agents: dict[str, Agent] = {}
        for msg in msgs:
            if msg.timestamp_ms is not None:
                out.timestamp_ms = max(out.timestamp_ms or 0, msg.timestamp_ms)
            decoded = self._decoder.decode(msg.value, msg.timestamp_ms)
            for rejected in decoded.rejected:
                add_dead_letter(out, msg, rejected, self.settings)
            rerouted: dict[str, list[dict[str, Any]]] = {}
            for acc in decoded.accepted:
                event: MemoryEvent = acc.event  # type: ignore[assignment]
                agent_id = event.agent_id
                if self._partition_of(agent_id) != msg.partition:
                    rerouted.setdefault(agent_id, []).append(acc.reroutable())
                    continue
                agent = agents.get(agent_id)
                if agent is None:
                    agent = Agent.load(agent_id, msg.partition, self._deadline_ms, store,
                                       self._nodes, f"{self._batch}.{self._batches}")  # fmt: skip
                    agents[agent_id] = agent
                agent.apply(event, out, msg.offset)
            for agent_id, raws in rerouted.items():
                out.reroute_memory.append((agent_id, raws, msg.timestamp_ms))
        for agent in agents.values():
            agent.save(store)
            out.diagnostic(agent.agent_id, agent.summary())
        return out
