"""The runner's admission of records (``memdiag.streams.progress.Progress``): whatever the
fetcher drops, repeats or delivers from a stale position, each record is processed once, in
offset order, from the committed offset.

The fetcher here misbehaves the way faust-streaming's did across rebalances: it drops
records it had fetched, and a seek takes effect only after the records already in flight
have been delivered. Records come one at a time or in fetched runs (the bulk path).
"""

from __future__ import annotations

from typing import NamedTuple

from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.streams.progress import AHEAD, BEHIND, FOREIGN, PROCESS, Progress

TP = ("events", 0)


class R(NamedTuple):
    offset: int


def test_in_order_records_are_processed_once() -> None:
    p = Progress()
    p.start(1, {TP: 10})
    assert [p.admit(TP, o) for o in (10, 11, 12)] == [PROCESS] * 3
    assert p.admit(TP, 11) == BEHIND
    assert p.next[TP] == 13


def test_a_hole_stops_processing_until_the_missing_record_comes() -> None:
    p = Progress()
    p.start(1, {TP: 10})
    assert p.admit(TP, 12) == AHEAD  # 10 and 11 were dropped on the way
    assert p.admit(TP, 10) == PROCESS
    assert p.admit(TP, 10) == BEHIND  # delivered again after a seek
    assert p.admit(TP, 11) == PROCESS


def test_other_partitions_and_stopped_runners_are_not_ours() -> None:
    p = Progress()
    p.start(2, {TP: 0})
    assert p.admit(("events", 1), 0) == FOREIGN
    assert p.admit_run(("events", 1), [R(0)]) == (0, 0, FOREIGN)


def test_a_new_generation_starts_from_its_committed_offsets() -> None:
    p = Progress()
    p.start(1, {TP: 0})
    for o in range(5):
        p.admit(TP, o)
    p.start(2, {TP: 3})  # another worker committed 3 meanwhile: 3 and 4 come again
    assert p.admit(TP, 3) == PROCESS


def test_a_run_is_admitted_whole_when_it_is_exactly_the_next_records() -> None:
    p = Progress()
    p.start(1, {TP: 5})
    assert p.admit_run(TP, [R(o) for o in range(5, 9)]) == (0, 4, None)
    assert p.admit_run(TP, [R(o) for o in range(7, 12)]) == (2, 5, None)  # 7, 8 again
    assert p.admit_run(TP, [R(12), R(14)]) == (0, 1, AHEAD)  # 13 was dropped
    assert p.next[TP] == 13
    assert p.admit_run(TP, [R(20)]) == (0, 0, AHEAD)
    assert p.admit_run(TP, []) == (0, 0, None)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 60),
    base=st.integers(0, 20),
    faults=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), max_size=80),
    runs=st.booleans(),
)
def test_any_misbehaving_fetcher_gives_each_record_once_in_order(
    n: int, base: int, faults: list[tuple[int, int]], runs: bool
) -> None:
    """A fetcher that drops records (0), repeats from an older position (1), or lets a
    seek wait behind records already in flight (2, with up to 5 of them); the records come
    one at a time, or in runs of what was fetched together."""
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
            fetched = [in_flight.pop(0)]
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
            take = max(1, size) if runs else 1
            fetched = list(range(position, min(end, position + take)))
            position += len(fetched)
        else:
            if processed and processed[-1] == end - 1:
                break
            if pending_seek is None:
                pending_seek = p.next[TP]
            continue
        if runs:
            lo, hi, verdict = p.admit_run(TP, [R(o) for o in fetched])
            processed += fetched[lo:hi]
        else:
            verdict = p.admit(TP, fetched[0])
            if verdict == PROCESS:
                processed.append(fetched[0])
        if verdict == AHEAD and pending_seek is None:
            pending_seek = p.next[TP]  # the runner seeks back to the hole
    assert processed == list(range(base, end))


def test_records_the_broker_says_do_not_exist_are_skipped() -> None:
    """Transaction markers or deleted records leave real holes: the runner asks the broker
    and goes on from the first record there is."""
    p = Progress()
    p.start(1, {TP: 0})
    assert p.admit(TP, 0) == PROCESS
    assert p.admit(TP, 3) == AHEAD  # 1 and 2 are commit markers
    p.skip_to(TP, 3)
    assert p.admit(TP, 3) == PROCESS
    p.skip_to(TP, 2)  # never backwards
    assert p.next[TP] == 4


def test_stopping_takes_nothing_until_the_next_start() -> None:
    p = Progress()
    p.start(1, {TP: 0})
    p.stop()
    assert p.generation is None
    p.start(1, {TP: 0})
    assert p.admit(TP, 0) == PROCESS
