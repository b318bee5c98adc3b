"""The recall stage's backlog (``memdiag.streams.backlog``): a copy-on-write B+ tree in the
state store, checked against a sorted list under random operations, tiny nodes (every split,
merge and change of height happens), saves and reloads, and crashes that land any prefix of
a save's writes."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memdiag.contract.envelope import DictStore
from memdiag.streams import backlog
from memdiag.streams.backlog import (
    S_ID,
    S_LEN,
    Backlog,
    entry_key,
    inner_summary,
    leaf_summary,
)
from tests.inmemory import StagedStore

PREFIX = "mx:1:a"


class Model:
    """The backlog as a plain sorted list."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, str], int] = {}

    def add(self, w: int, mid: str, t: int) -> bool:
        if (w, mid) in self.entries:
            return False
        self.entries[(w, mid)] = t
        return True

    def remove(self, key: tuple[int, str]) -> list[Any] | None:
        t = self.entries.pop(key, None)
        return None if t is None else [key[0], key[1], t]

    def turn(self, before: int, clock: int) -> list[list[Any]]:
        out = []
        for (w, mid), t in sorted(self.entries.items()):
            if w < before and not t:
                self.entries[(w, mid)] = clock
                out.append([w, mid, clock])
        return out

    def resort(self, before: int, clock: int) -> list[str]:
        changed = []
        for (w, mid), t in sorted(self.entries.items()):
            if (w < before) != bool(t):
                self.entries[(w, mid)] = clock if w < before else 0
                changed.append(mid)
        return sorted(changed)

    def listed(self) -> list[list[Any]]:
        return [[w, mid, t] for (w, mid), t in sorted(self.entries.items())]


def check_structure(b: Backlog) -> None:
    """Every summary is its node's; every leaf at one depth; sizes within bounds."""
    depths: set[int] = set()

    def visit(node: list[Any], height: int, depth: int, root: bool) -> None:
        cap = backlog.LEAF if height == 0 else backlog.FANOUT
        assert len(node) <= cap
        if not root:
            assert node, "an empty node is never kept"
        if height == 0:
            depths.add(depth)
            assert node == sorted(node, key=entry_key)
            return
        for s in node:
            child = b._load(s[S_ID])
            summary = leaf_summary if height == 1 else inner_summary
            assert s == summary(s[S_ID], child)
            assert s[S_LEN] == len(child)
            visit(child, height - 1, depth + 1, False)

    visit(b.root, b.height, 0, True)
    assert len(depths) <= 1
    if b.height:
        assert len(b.root) >= 2, "a root with one child loses a level"


def check_against(b: Backlog, m: Model, probes: list[int]) -> None:
    assert b.all_entries() == m.listed()
    u = sum(1 for t in m.entries.values() if t)
    assert b.counts() == (u, len(m.entries) - u)
    oldest = next(([w, mid, t] for (w, mid), t in sorted(m.entries.items()) if t), None)
    assert b.oldest_unindexed() == oldest
    for ts in probes:
        assert b.turned_at(ts) == sorted(mid for (_, mid), t in m.entries.items() if t and t == ts)
    for (w, mid), t in list(m.entries.items())[:5]:
        assert b.find((w, mid)) == [w, mid, t]
    assert b.find((-1, "none")) is None
    check_structure(b)


ops = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "remove", "remove", "turn", "resort", "save"]),
        st.integers(0, 60),
        st.integers(0, 9),
    ),
    max_size=160,
)


@pytest.fixture(params=[(2, 2), (3, 2), (4, 3), (128, 64)], ids=lambda p: f"leaf{p[0]}-fan{p[1]}")
def sizes(request: pytest.FixtureRequest) -> Any:
    leaf, fanout = backlog.LEAF, backlog.FANOUT
    backlog.LEAF, backlog.FANOUT = request.param
    yield request.param
    backlog.LEAF, backlog.FANOUT = leaf, fanout


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=ops, rnd=st.randoms(use_true_random=False))
def test_the_tree_is_the_sorted_list_whatever_the_operations(
    sizes: Any, ops: list[tuple[str, int, int]], rnd: random.Random
) -> None:
    store = DictStore()
    b, m = Backlog(PREFIX, None, store), Model()
    clock = 1
    head: dict[str, Any] = b.state()
    for op, w, n in ops:
        mid = f"m{n}"
        if op == "add":
            t = rnd.choice([0, clock])
            assert b.add([w, mid, t]) == m.add(w, mid, t)
        elif op == "remove":
            key = rnd.choice(sorted(m.entries)) if m.entries and n < 7 else (w, mid)
            assert b.remove(key) == m.remove(key)
        elif op == "turn":
            clock += 1
            assert b.turn(w, clock) == m.turn(w, clock)
        elif op == "resort":
            clock += 1
            assert b.resort(w, clock) == m.resort(w, clock)
        else:  # a save, and a fresh Backlog read back from the store
            b.save_nodes(store, 0)
            head = orjson.loads(orjson.dumps(b.state()))
            b = Backlog(PREFIX, head, store)
        check_against(b, m, [clock, clock - 1])
    # after two saves nothing is kept that the head does not point to
    for _ in range(2):
        b.save_nodes(store, 0)
        b = Backlog(PREFIX, orjson.loads(orjson.dumps(b.state())), store)
    reachable = set()

    def visit(node: list[Any], height: int) -> None:
        for s in node if height else []:
            reachable.add(b.key(s[S_ID]))
            visit(b._load(s[S_ID]), height - 1)

    visit(b.root, b.height)
    assert set(store.data) == reachable


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=st.lists(ops, min_size=1, max_size=6), rnd=st.randoms(use_true_random=False))
def test_a_crash_inside_a_save_leaves_the_tree_of_the_last_head(
    sizes: Any, batches: list[list[tuple[str, int, int]]], rnd: random.Random
) -> None:
    """Batches of operations, each saved nodes first and head last; a crash lands any prefix
    of the nodes and loses the head: the tree read back is the previous one, whole, and the
    batch applied again gives what it would have."""
    store = DictStore()
    head: dict[str, Any] = {}
    m = Model()
    for batch in batches:
        for attempt in ("crash", "again") if rnd.random() < 0.6 else ("again",):
            before = dict(m.entries)
            b = Backlog(PREFIX, orjson.loads(orjson.dumps(head)), store)  # it owns its state
            clock = 100
            for op, w, n in batch:
                mid = f"m{n}"
                if op in ("add", "save"):
                    b.add([w, mid, 0]) and m.add(w, mid, 0)
                elif op == "remove":
                    b.remove((w, mid)) and m.remove((w, mid))
                else:
                    clock += 1
                    b.turn(w, clock)
                    m.turn(w, clock)
            if attempt == "crash":
                partial = StagedStore(store)
                b.save_nodes(partial, 0)
                partial.land(rnd.randint(0, len(partial.log)))
                m.entries = before  # the head is lost: as before the batch
                check_against(Backlog(PREFIX, orjson.loads(orjson.dumps(head)), store), m, [])
            else:
                b.save_nodes(store, 0)
                head = orjson.loads(orjson.dumps(b.state()))
                check_against(Backlog(PREFIX, head, store), m, [clock])


def test_a_large_backlog_costs_a_path_per_operation() -> None:
    """100,000 memories written in shuffled order: each add touches one path (the head's
    root stays at most FANOUT lines), whatever the order."""
    store = DictStore()
    state: dict[str, Any] | None = None
    ids = list(range(100_000))
    random.Random(7).shuffle(ids)
    for start in range(0, len(ids), 1000):
        b = Backlog(PREFIX, state, store)
        for i in ids[start : start + 1000]:
            b.add([i * 1000, f"m{i}", 0])
        b.save_nodes(store, 0)
        state = orjson.loads(orjson.dumps(b.state()))
    b = Backlog(PREFIX, state, store)
    b.save_nodes(store, 0)  # deletes what the last batch replaced
    b = Backlog(PREFIX, orjson.loads(orjson.dumps(b.state())), store)
    assert b.counts() == (0, 100_000) and b.height <= 3
    assert len(b.root) <= backlog.FANOUT and len(orjson.dumps(b.state())) < 4_000
    writes = store.writes
    b.add([12_345_678, "late", 0])
    b.save_nodes(store, 0)
    assert store.writes - writes <= 2 * b.height  # a leaf and an inner node, maybe split
    assert b.turn(50_000 * 1000, 1)[-1] == [49_999_000, "m49999", 1]
    assert b.counts() == (50_001, 50_000)  # "late" (12,345.678 s) turned too
    assert b.oldest_unindexed() == [0, "m0", 1]
