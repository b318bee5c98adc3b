"""A stage takes a batch in pieces (``memdiag.streams.runner.in_pieces``, ``StageSpec.piece_bytes``):
each piece processed and its outputs sent before the next, so what a stage makes of one batch
is never all in memory at once. Pieces change nothing in the results, also when a stage
raises on a message of a later piece."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memdiag.contract import PROCESSING_ERROR
from memdiag.contract.envelope import InMessage
from memdiag.settings import Settings
from memdiag.streams import runner as runner_module
from memdiag.streams.runner import in_pieces
from tests.compare import differences, from_records, from_reference
from tests.inmemory import World
from tests.reference import reference
from tests.scenario import generate

SETTINGS = Settings()


def size(msgs: list[InMessage]) -> int:
    return sum(len(m.value or b"") for m in msgs)


@given(st.lists(st.one_of(st.none(), st.integers(0, 60)), max_size=40), st.integers(1, 150))
def test_pieces_cut_in_order_at_the_message_that_reaches_the_bound(
    sizes: list[int | None], most: int
) -> None:
    msgs = [InMessage("t", 0, i, None, None if n is None else b"x" * n, 0)
            for i, n in enumerate(sizes)]  # fmt: skip
    got = in_pieces(msgs, most)
    assert [m for piece in got for m in piece] == msgs
    assert all(got[:-1])  # only a batch of nothing is one empty piece
    for piece in got[:-1]:
        assert size(piece) >= most > size(piece[:-1])  # ends with the message that reaches it
    assert size(got[-1][:-1]) < most
    assert in_pieces(msgs, None) == [msgs]


def spy(world: World) -> list[list[InMessage]]:
    """The session stage's calls, each with the messages it was given."""
    calls: list[list[InMessage]] = []
    process = world.processor.process

    def recorded(msgs: list[InMessage], store: Any) -> Any:
        calls.append(list(msgs))
        return process(msgs, store)

    world.processor.process = recorded  # type: ignore[method-assign]
    return calls


def test_a_stage_takes_its_batches_in_pieces_and_the_tables_are_the_same() -> None:
    events = generate(sessions=30, seed=5)
    tables = {}
    for piece_bytes in (None, 4000):
        world = World(SETTINGS, seed=2, piece_bytes=piece_bytes)
        calls = spy(world)
        world.publish(events, batch=5)
        world.run(max_batch=60)
        tables[piece_bytes] = from_records(world.tables)
        largest = max(size(c[:-1]) for c in calls)
        if piece_bytes is None:
            assert largest >= 4000  # batches that the pieces below cut
        else:
            assert largest < piece_bytes
    assert differences(tables[4000], tables[None]) == []
    assert differences(tables[4000], from_reference(reference(events))) == []


def test_a_message_that_raises_in_a_later_piece_is_dead_lettered_and_the_rest_are_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pieces before the one that raised were sent; the batch is rolled back and taken
    again one message at a time: only the message that raises is dead-lettered, and what the
    earlier pieces sent is the same when it is sent again."""
    events = generate(sessions=30, seed=6)
    world = World(SETTINGS, seed=3, piece_bytes=4000)
    world.publish(events, batch=5)
    poison = next(tp for tp in world.logs if tp[0] == world.events and len(world.logs[tp]) > 8)
    poisoned = world.logs[poison][6]
    where = (*poison, 6)
    cut: list[list[list[InMessage]]] = []

    def recorded(msgs: list[InMessage], most_bytes: int | None) -> list[list[InMessage]]:
        cut.append(in_pieces(msgs, most_bytes))
        return cut[-1]

    monkeypatch.setattr(runner_module, "in_pieces", recorded)
    process = world.processor.process

    def raising(msgs: list[InMessage], store: Any) -> Any:
        if any((m.topic, m.partition, m.offset) == where for m in msgs):
            raise RuntimeError("a bug on this message")
        return process(msgs, store)

    world.processor.process = raising  # type: ignore[method-assign]
    world.run(max_batch=60)
    # the case under test: it raised in a piece after the first of its batch
    assert any(
        (m.topic, m.partition, m.offset) == where for batch in cut for p in batch[1:] for m in p
    )
    letters = world.tables.dead_letters
    assert [d["reason"] for d in letters] == [PROCESSING_ERROR]
    lost = {e["event_id"] for e in orjson.loads(poisoned.value)}
    kept = [e for e in events if e["event_id"] not in lost]
    assert differences(from_records(world.tables), from_reference(reference(kept))) == []
