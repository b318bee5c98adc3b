"""The batch runner's offset bookkeeping (``memdiag.streams.batches.Progress``): whatever the fetcher
drops, repeats or delivers from a stale position, each record is processed once, in offset
order, and no offset is committed before everything below it is durable.

The fetcher here misbehaves the way faust-streaming's did across rebalances: it drops
records it had fetched, and a seek takes effect only after the records already in flight
have been delivered.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.streams.progress import AHEAD, BEHIND, FOREIGN, PROCESS, Progress

TP = ("events", 0)


def test_in_order_records_are_processed_and_committed_once_durable() -> None:
    p = Progress()
    p.start(1, {TP: 10})
    assert [p.admit(TP, o) for o in (10, 11, 12)] == [PROCESS] * 3
    assert p.to_commit() == {}  # nothing durable yet
    p.done(1, {TP: 12})
    assert p.to_commit() == {TP: 12}
    p.committed_to({TP: 12})
    assert p.to_commit() == {}


def test_a_hole_stops_processing_until_the_missing_record_comes() -> None:
    p = Progress()
    p.start(1, {TP: 10})
    assert p.admit(TP, 12) == AHEAD  # 10 and 11 were dropped on the way
    assert p.admit(TP, 10) == PROCESS
    assert p.admit(TP, 10) == BEHIND  # delivered again after a seek
    assert p.admit(TP, 11) == PROCESS


def test_other_partitions_and_old_generations_are_not_ours() -> None:
    p = Progress()
    p.start(2, {TP: 0})
    assert p.admit(("events", 1), 0) == FOREIGN
    p.done(1, {TP: 5})  # a batch of generation 1 finishing late
    assert p.to_commit() == {}


def test_a_new_generation_starts_from_its_committed_offsets() -> None:
    p = Progress()
    p.start(1, {TP: 0})
    for o in range(5):
        p.admit(TP, o)
    p.done(1, {TP: 5})
    p.start(2, {TP: 3})  # another worker committed 3 meanwhile: 3 and 4 come again
    assert p.admit(TP, 3) == PROCESS
    assert p.to_commit() == {}


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 60),
    base=st.integers(0, 20),
    faults=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), max_size=80),
)
def test_any_misbehaving_fetcher_gives_each_record_once_in_order(
    n: int, base: int, faults: list[tuple[int, int]]
) -> None:
    """A fetcher that drops records (0), repeats from an older position (1), or lets a
    seek wait behind records already in flight (2, with up to 5 of them)."""
    end = base + n
    p = Progress()
    p.start(7, {TP: base})
    processed: list[int] = []
    position = base
    in_flight: list[int] = []  # fetched before the last seek, still to be delivered
    pending_seek: int | None = None
    faults_left = list(faults)
    for _ in range(20 * (n + len(faults)) + 100):
        if not in_flight and pending_seek is not None:
            position, pending_seek = pending_seek, None
        if in_flight:
            offset = in_flight.pop(0)
        elif position < end:
            fault, size = faults_left.pop(0) if faults_left else (3, 0)
            if fault == 0:
                position += 1  # dropped: fetched, never delivered
                continue
            if fault == 1:
                position = max(base, position - size)
            if fault == 2:
                in_flight = list(range(position, min(end, position + size)))
                position += len(in_flight)
                continue
            offset = position
            position += 1
        else:
            if processed and processed[-1] == end - 1:
                break
            if pending_seek is None:
                pending_seek = p.next[TP]
            continue
        verdict = p.admit(TP, offset)
        if verdict == PROCESS:
            processed.append(offset)
            p.done(7, {TP: offset + 1})
        elif verdict == AHEAD and pending_seek is None:
            pending_seek = p.next[TP]  # the runner seeks back to the hole
        committed = p.to_commit().get(TP, p.committed[TP])
        assert committed <= p.next[TP]
        p.committed_to(p.to_commit())
    assert processed == list(range(base, end))
    assert p.committed[TP] == end


def test_records_the_broker_says_do_not_exist_are_skipped() -> None:
    """Transaction markers or deleted records leave real holes: the runner asks the broker
    and goes on from the first record there is."""
    p = Progress()
    p.start(1, {TP: 0})
    assert p.admit(TP, 0) == PROCESS
    p.done(1, {TP: 1})
    assert p.admit(TP, 3) == AHEAD  # 1 and 2 are commit markers
    p.skip_to(TP, 3)
    assert p.admit(TP, 3) == PROCESS
    assert p.to_commit() == {TP: 3}  # nothing of 1 and 2 to lose
    p.skip_to(TP, 2)  # never backwards
    assert p.next[TP] == 4
