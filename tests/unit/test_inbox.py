"""The runner's inbox hands out batches bounded by records and by bytes, and never reorders a
partition's records."""

from __future__ import annotations

from typing import NamedTuple

from hypothesis import given
from hypothesis import strategies as st

from memdiag.streams.runner import Inbox


class Rec(NamedTuple):
    offset: int
    value: bytes | None


runs = st.lists(
    st.tuples(st.integers(0, 2), st.lists(st.integers(0, 50), min_size=1, max_size=12)),
    max_size=10,
)


@given(runs, st.integers(1, 8), st.integers(1, 120), st.integers(1, 40))
def test_batches_are_bounded_and_keep_every_partitions_order(
    fetched: list[tuple[int, list[int]]], most: int, most_bytes: int, limit: int
) -> None:
    inbox = Inbox(limit=limit)
    inbox.room.set()  # as the runner starts it
    sent: dict[int, list[Rec]] = {}
    offset = 0
    for tp, sizes in fetched:
        recs = []
        for n in sizes:
            recs.append(Rec(offset, b"x" * n if n else None))
            offset += 1
        sent.setdefault(tp, []).extend(recs)
        inbox.put(1, tp, recs)
        assert inbox.room.is_set() == (inbox.size < limit)
    got: dict[int, list[Rec]] = {}
    while inbox.runs:
        before = inbox.size
        batch = inbox.take(most, most_bytes)
        records = [r for _, _, rs in batch for r in rs]
        assert 1 <= len(records) <= most
        # the bytes bound is passed by the last record taken at most
        taken_bytes = sum(len(r.value or b"") for r in records)
        assert sum(len(r.value or b"") for r in records[:-1]) < most_bytes
        # and a batch is as large as the bounds allow
        assert len(records) == most or taken_bytes >= most_bytes or not inbox.runs
        assert inbox.size == before - len(records)
        assert inbox.room.is_set() == (inbox.size < limit)
        for _, tp, rs in batch:
            assert rs, "no empty run is handed out"
            got.setdefault(tp, []).extend(rs)
    assert got == sent
    assert inbox.size == 0 and not inbox.arrived.is_set() and inbox.room.is_set()
