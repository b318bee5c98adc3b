"""``BatchRunner``'s hold on a rebalance: Faust's ``wait_empty`` lets a revocation go ahead
once the consumer's unacked messages are gone. The runner keeps one message of each batch
there from admission (before anything awaits) until the batch's outputs are delivered, and
lets go of it when the delivery fails too.

The runner is built around fakes of the Faust app and consumer: these tests are about the
order of the runner's own steps, which no broker makes reproducible."""

from __future__ import annotations

import asyncio
import weakref
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import pytest

from memdiag.contract.envelope import InMessage, Output
from memdiag.streams.batches import BatchRunner
from memdiag.streams.progress import Progress

TOPIC = "events"


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


class Message:
    def __init__(self, offset: int, generation: int = 1):
        self.topic, self.partition, self.offset = TOPIC, 0, offset
        self.tp = TP(TOPIC, 0)
        self.key, self.value, self.timestamp = b"s", b"{}", 1.0
        self.generation_id = generation


class Event:
    def __init__(self, message: Message):
        self.message = message
        self.acked = False

    def ack(self) -> bool:
        self.acked = True
        return True


@dataclass
class Consumer:
    _unacked_messages: weakref.WeakSet[Any] = field(default_factory=weakref.WeakSet)
    _waiting_for_ack: asyncio.Future[Any] | None = None


class FlowControl:
    def is_active(self) -> bool:
        return True


@dataclass
class App:
    consumer: Consumer = field(default_factory=Consumer)
    consumer_generation_id: int = 1
    flow_control: FlowControl = field(default_factory=FlowControl)
    producer: Any = None


class Offsets:
    """Records what the consumer held while the runner sought back."""

    def __init__(self, app: App):
        self.app = app
        self.unacked_at_seek: list[int] = []

    async def seek(self, offsets: dict[Any, int]) -> None:
        await asyncio.sleep(0)  # a rebalance's wait_empty could look now
        self.unacked_at_seek.append(len(self.app.consumer._unacked_messages))

    def assignment(self) -> set[Any]:
        return {TP(TOPIC, 0)}

    async def commit(self, offsets: dict[Any, int]) -> bool:
        return True


class Stage:
    def process(self, msgs: list[InMessage], store: Any) -> Output:
        return Output()


class Sender:
    def __init__(self) -> None:
        self.deliveries: list[asyncio.Future[Any]] = []

    async def send(self, out: Output) -> list[asyncio.Future[Any]]:
        future = asyncio.get_running_loop().create_future()
        self.deliveries.append(future)
        return [future]


def runner() -> tuple[BatchRunner, App, Offsets, Sender]:
    r = BatchRunner.__new__(BatchRunner)
    app, sender = App(), Sender()
    offsets = Offsets(app)
    r.app, r.name, r.stage, r.store, r.sender = app, "test", Stage(), None, sender  # type: ignore[assignment]
    r.on_failure = lambda msg, exc: Output()
    r.commit_interval, r.offsets = 1.0, offsets  # type: ignore[assignment]
    r.progress = Progress()
    r.progress.start(1, {TP(TOPIC, 0): 0})
    r._holes, r._in_flight, r._last_commit = {}, deque(), 0.0
    r.processed, r.skipped = 0, Counter()
    return r, app, offsets, sender


async def test_the_batch_holds_a_rebalance_from_admission_to_delivery() -> None:
    r, app, offsets, sender = runner()
    # offset 1 is missing: offset 2 makes the runner seek back before it processes offset 0
    events = [Event(Message(0)), Event(Message(2))]
    await r._handle(events)  # type: ignore[arg-type]
    assert offsets.unacked_at_seek == [1], "the seek awaited with nothing holding a rebalance"
    assert len(app.consumer._unacked_messages) == 1  # delivery pending: still held
    sender.deliveries[0].set_result(None)
    await r.wait_idle()
    assert len(app.consumer._unacked_messages) == 0
    assert events[0].acked
    assert r.progress.committed[TP(TOPIC, 0)] == 1


async def test_a_failed_delivery_lets_go_of_the_rebalance_and_commits_nothing() -> None:
    r, app, _, sender = runner()
    waiting = asyncio.get_running_loop().create_future()
    app.consumer._waiting_for_ack = waiting
    await r._handle([Event(Message(0)), Event(Message(1))])  # type: ignore[arg-type]
    sender.deliveries[0].set_exception(OSError("broker said no"))
    with pytest.raises(OSError, match="broker said no"):
        await r.wait_idle()
    assert len(app.consumer._unacked_messages) == 0
    assert waiting.done(), "a waiting rebalance is told at once"
    assert r.progress.committed[TP(TOPIC, 0)] == 0


async def test_giving_up_waiting_does_not_cancel_the_delivery() -> None:
    r, app, _, sender = runner()
    await r._handle([Event(Message(0))])  # type: ignore[arg-type]
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(r.wait_idle(), 0.01)  # as on_revoked gives up
    assert not r._in_flight[0].cancelled()
    sender.deliveries[0].set_result(None)
    await r.wait_idle()
    assert len(app.consumer._unacked_messages) == 0
    assert r.progress.committed[TP(TOPIC, 0)] == 1
