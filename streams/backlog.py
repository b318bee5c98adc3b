"""An agent's written, not-indexed memories (the recall stage's backlog): a copy-on-write B+
tree in the state store. Pure code: no Faust, no Kafka.

Entries are ``[written_us, memory_id, turned_us]`` (``turned_us``: the agent's clock when the
memory turned unindexed; 0 while it is pending), kept in ``(written_us, memory_id)`` order.
A leaf holds up to :data:`LEAF` entries, an inner node up to :data:`FANOUT` children, each
child by its summary (the ``S_*`` fields)::

    [node id, least key's written_us, its memory_id, length,
     unindexed, pending, oldest unindexed written_us, oldest pending written_us,
     first turned_us, last turned_us]

so the counts, the oldest unindexed memory, the pending memories past a deadline and the
memories turned at a given clock are found by descending only where the summaries point.
Every operation costs the nodes on one path (a few KB), whatever the backlog's size and
whatever order the writes come in. The root lives in the agent's head: a leaf while the
backlog is small, so a healthy agent has no other key at all.

Copy on write. A node a batch changes is written under a new id (an id allocated in the same
batch is reused), never over the node it replaces, and only the head points to the tree. The
head is written after the nodes, so a crash that lands part of a batch's writes leaves the
head and every node it points to as they were (plus nodes nothing points to, overwritten when
the batch comes again): the batch is applied again to an intact tree. The nodes a batch
replaced are deleted at the agent's next save, once no head points to them.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable
from typing import Any

import orjson

from memdiag.contract.envelope import StateStore

#: Entries per leaf, children per inner node.
LEAF = 128
FANOUT = 32

Entry = list[Any]  # [written_us, memory_id, turned_us]
Summary = list[Any]
Key = tuple[int, str]

S_ID, S_LO_W, S_LO_ID, S_LEN, S_U, S_P, S_MIN_U, S_MIN_P, S_T_LO, S_T_HI = range(10)


def entry_key(e: Entry) -> Key:
    return (e[0], e[1])


def _summary_key(s: Summary) -> Key:
    return (s[S_LO_W], s[S_LO_ID])


def leaf_summary(nid: int, entries: list[Entry]) -> Summary:
    turned = [e for e in entries if e[2]]
    t = [e[2] for e in turned]
    first_pending = next((e[0] for e in entries if not e[2]), None)  # in written order: the oldest
    first = entries[0]
    return [nid, first[0], first[1], len(entries), len(turned), len(entries) - len(turned),
            turned[0][0] if turned else None, first_pending,
            min(t) if t else None, max(t) if t else None]  # fmt: skip


def inner_summary(nid: int, children: list[Summary]) -> Summary:
    first = children[0]
    min_u = [s[S_MIN_U] for s in children if s[S_MIN_U] is not None]
    min_p = [s[S_MIN_P] for s in children if s[S_MIN_P] is not None]
    t_lo = [s[S_T_LO] for s in children if s[S_T_LO] is not None]
    t_hi = [s[S_T_HI] for s in children if s[S_T_HI] is not None]
    return [nid, first[S_LO_W], first[S_LO_ID], len(children),
            sum([s[S_U] for s in children]), sum([s[S_P] for s in children]),
            min(min_u) if min_u else None, min(min_p) if min_p else None,
            min(t_lo) if t_lo else None, max(t_hi) if t_hi else None]  # fmt: skip


class NodeCache:
    """Decoded nodes across batches, by key, each with the very bytes it was decoded from: the
    store hands back the object written, so identity proves an entry current (a recovery or
    a rebalance brings new objects, decoded again). Nodes are never rewritten under their id,
    but a batch changes a loaded node in place before it moves it to a new one: a batch that
    fails must :meth:`clear` it."""

    SIZE = 4096

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[bytes, list[Any]]] = {}

    def get(self, key: str, raw: bytes) -> list[Any] | None:
        hit = self._nodes.get(key)
        return hit[1] if hit is not None and hit[0] is raw else None

    def put(self, key: str, raw: bytes, node: list[Any]) -> None:
        if len(self._nodes) >= self.SIZE and key not in self._nodes:
            self._nodes.pop(next(iter(self._nodes)))  # the oldest
        self._nodes[key] = (raw, node)

    def drop(self, key: str) -> None:
        self._nodes.pop(key, None)

    def clear(self) -> None:
        self._nodes.clear()


def _route(children: list[Summary], key: Key) -> int:
    """The child a key belongs to: the last whose least key is at most it (or the first)."""
    return max(bisect_right(children, key, key=_summary_key) - 1, 0)


class Backlog:
    """The tree of one agent; ``state`` is what :meth:`state` gave, read back from the
    agent's head (the backlog owns it: it changes the root in place)."""

    def __init__(
        self,
        node_prefix: str,
        state: dict[str, Any] | None,
        store: StateStore,
        cache: NodeCache | None = None,
    ):
        state = state or {}
        self.prefix = node_prefix
        self.store = store
        self.cache = cache or NodeCache()
        self.root: list[Any] = state.get("r", [])  # entries (height 0) or child summaries
        self.height: int = state.get("h", 0)
        self.next: int = state.get("n", 1)
        #: nodes the previous batch replaced: deleted at this batch's save
        self.replaced_before: list[int] = state.get("d", [])
        self._nodes: dict[int, list[Any]] = {}  # loaded, or made in this batch
        self._fresh: set[int] = set()  # allocated in this batch: written at the save
        self._replaced: list[int] = []  # replaced in this batch

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"r": self.root}
        if self.height:
            state["h"] = self.height
        if self.next > 1:
            state["n"] = self.next
        if self._replaced:
            state["d"] = self._replaced
        return state

    def key(self, nid: int) -> str:
        return f"{self.prefix}{nid}"

    # -- reading ----------------------------------------------------------------------------

    def _load(self, nid: int) -> list[Any]:
        node = self._nodes.get(nid)
        if node is None:
            key = self.key(nid)
            raw = self.store.get(key)
            if raw is None:
                raise RuntimeError(f"backlog node {key!r} is missing from the state")
            node = self.cache.get(key, raw)
            if node is None:
                node = orjson.loads(raw)
                self.cache.put(key, raw, node)
            self._nodes[nid] = node
        return node

    def find(self, key: Key) -> Entry | None:
        node, height = self.root, self.height
        while height:
            if not node:
                return None
            node, height = self._load(node[_route(node, key)][S_ID]), height - 1
        i = bisect_left(node, key, key=entry_key)
        return node[i] if i < len(node) and entry_key(node[i]) == key else None

    def counts(self) -> tuple[int, int]:
        """(unindexed, pending)."""
        if self.height == 0:
            u = sum(1 for e in self.root if e[2])
            return u, len(self.root) - u
        return sum(s[S_U] for s in self.root), sum(s[S_P] for s in self.root)

    def oldest_unindexed(self) -> Entry | None:
        """The oldest unindexed entry (ties in ``written_us``: the smaller memory id)."""
        node, height = self.root, self.height
        while height:
            best = min((s[S_MIN_U] for s in node if s[S_MIN_U] is not None), default=None)
            if best is None:
                return None
            node = self._load(next(s for s in node if s[S_MIN_U] == best)[S_ID])
            height -= 1
        return next((e for e in node if e[2]), None)

    def turned_at(self, ts_us: int) -> list[str]:
        """The memories that turned unindexed when the agent's clock reached ``ts_us``."""
        out: list[str] = []

        def visit(node: list[Any], height: int) -> None:
            if height == 0:
                out.extend(e[1] for e in node if e[2] and e[2] == ts_us)
                return
            for s in node:
                if s[S_T_LO] is not None and s[S_T_LO] <= ts_us <= s[S_T_HI]:
                    visit(self._load(s[S_ID]), height - 1)

        visit(self.root, self.height)
        return sorted(out)

    # -- changing ---------------------------------------------------------------------------

    def add(self, entry: Entry) -> bool:
        """Insert ``entry`` unless one with its key is there; whether it was inserted."""
        if self.find(entry_key(entry)) is not None:
            return False
        self._change_leaf(entry_key(entry), lambda leaf: insort(leaf, entry, key=entry_key))
        return True

    def remove(self, key: Key) -> Entry | None:
        """Remove the entry with ``key``, if there is one; the entry."""
        if self.find(key) is None:
            return None
        removed: list[Entry] = []

        def take(leaf: list[Entry]) -> None:
            removed.append(leaf.pop(bisect_left(leaf, key, key=entry_key)))

        self._change_leaf(key, take)
        return removed[0]

    def turn(self, before_us: int, clock_us: int) -> list[Entry]:
        """Pending entries written before ``before_us`` turn unindexed at ``clock_us``; the
        entries that turned, in key order."""
        turned: list[Entry] = []

        def change(leaf: list[Entry]) -> bool:
            n = len(turned)
            for e in leaf:
                if e[0] >= before_us:
                    break
                if not e[2]:
                    e[2] = clock_us
                    turned.append(e)
            return len(turned) > n

        self._walk(lambda s: s[S_MIN_P] is not None and s[S_MIN_P] < before_us, change)
        return turned

    def resort(self, before_us: int, clock_us: int) -> list[str]:
        """Every entry's status again, for another deadline: unindexed iff written before
        ``before_us``. The memories whose status changed (visits the whole tree)."""
        changed: list[str] = []

        def change(leaf: list[Entry]) -> bool:
            n = len(changed)
            for e in leaf:
                if (e[0] < before_us) != bool(e[2]):
                    e[2] = clock_us if e[0] < before_us else 0
                    changed.append(e[1])
            return len(changed) > n

        self._walk(lambda s: True, change)
        return sorted(changed)

    # -- copy on write ----------------------------------------------------------------------

    def _alloc(self) -> int:
        nid, self.next = self.next, self.next + 1
        self._fresh.add(nid)
        return nid

    def _rehome(self, nid: int) -> int:
        """The node ``nid`` (loaded, and changed in place) moves to an id of this batch."""
        if nid in self._fresh:
            return nid
        node = self._nodes.pop(nid)
        self._replaced.append(nid)
        self.cache.drop(self.key(nid))
        new = self._alloc()
        self._nodes[new] = node
        return new

    def _discard(self, nid: int) -> None:
        """Drop a node of this batch's (``_rehome`` has replaced its original already)."""
        self._nodes.pop(nid, None)
        self._fresh.discard(nid)

    def _summaries(self, nid: int, node: list[Any], height: int) -> list[Summary]:
        """What replaces node ``nid`` in its parent: nothing (empty), its summary, or two
        (too long: split in halves)."""
        if not node:
            self._discard(nid)
            return []
        summary = leaf_summary if height == 0 else inner_summary
        if len(node) <= (LEAF if height == 0 else FANOUT):
            self._nodes[nid] = node
            return [summary(nid, node)]
        half = len(node) // 2
        other = self._alloc()
        self._nodes[nid], self._nodes[other] = node[:half], node[half:]
        return [summary(nid, node[:half]), summary(other, node[half:])]

    def _change_leaf(self, key: Key, change: Callable[[list[Entry]], Any]) -> None:
        """Apply ``change`` to the leaf ``key`` belongs to; split, merge and summarise back
        up to the root, every node on the path rehomed."""

        def down(node: list[Summary], height: int) -> None:
            i = _route(node, key)
            child = self._load(node[i][S_ID])
            if height == 1:
                change(child)
            else:
                down(child, height - 1)
            nid = self._rehome(node[i][S_ID])
            node[i : i + 1] = self._summaries(nid, child, height - 1)
            self._merge_small(node, i, height)

        if self.height == 0:
            change(self.root)
        else:
            down(self.root, self.height)
        self._fix_root()

    def _merge_small(self, node: list[Summary], i: int, height: int) -> None:
        """Merge child ``i`` of ``node`` with a neighbour when it fell under a quarter full
        (split again in halves if the two are too long together)."""
        if i >= len(node) or len(node) < 2:
            return
        if node[i][S_LEN] >= max(2, (LEAF if height == 1 else FANOUT) // 4):
            return
        a = i if i + 1 < len(node) else i - 1
        first = self._load(node[a][S_ID])
        second = self._load(node[a + 1][S_ID])
        merged = first + second
        keep = self._rehome(node[a][S_ID])
        self._discard(self._rehome(node[a + 1][S_ID]))
        node[a : a + 2] = self._summaries(keep, merged, height - 1)

    def _fix_root(self) -> None:
        while len(self.root) > (LEAF if self.height == 0 else FANOUT):  # one level more
            half = len(self.root) // 2
            summary = leaf_summary if self.height == 0 else inner_summary
            a, b = self._alloc(), self._alloc()
            self._nodes[a], self._nodes[b] = self.root[:half], self.root[half:]
            self.root = [summary(a, self.root[:half]), summary(b, self.root[half:])]
            self.height += 1
        while self.height and len(self.root) <= 1:  # one child (or none): one level less
            if not self.root:
                self.height = 0
                break
            nid = self.root[0][S_ID]
            node = self._load(nid)
            self._discard(self._rehome(nid))
            self.root = node
            self.height -= 1

    def _walk(
        self, admits: Callable[[Summary], bool], change: Callable[[list[Entry]], bool]
    ) -> None:
        """Apply ``change`` (changes a leaf's entries in place, but never their keys or their
        number; says whether it changed any) to every leaf under a summary ``admits``."""

        def visit(node: list[Any], height: int) -> bool:
            if height == 0:
                return change(node)
            changed = False
            for i, s in enumerate(node):
                if admits(s):
                    child = self._load(s[S_ID])
                    if visit(child, height - 1):
                        nid = self._rehome(s[S_ID])
                        node[i] = (leaf_summary if height == 1 else inner_summary)(nid, child)
                        changed = True
            return changed

        visit(self.root, self.height)

    # -- persistence ------------------------------------------------------------------------

    @property
    def changed(self) -> bool:
        """Whether this batch changed the tree (or has replaced nodes left to delete)."""
        return bool(self._fresh or self._replaced or self.replaced_before)

    def save_nodes(self, store: StateStore, partition: int) -> None:
        """Before the head: this batch's nodes, and the deletion of those the previous batch
        replaced (no head points to them any more). The head then carries :meth:`state`."""
        for nid in sorted(self._fresh):
            key, raw = self.key(nid), orjson.dumps(self._nodes[nid])
            store.put(key, raw, partition)
            self.cache.put(key, raw, self._nodes[nid])
        for nid in self.replaced_before:
            store.delete(self.key(nid), partition)
        self._fresh.clear()

    def all_entries(self) -> list[Entry]:
        """Every entry, in key order (tests and checks: visits the whole tree)."""
        out: list[Entry] = []

        def visit(node: list[Any], height: int) -> None:
            if height == 0:
                out.extend(node)
                return
            for s in node:
                visit(self._load(s[S_ID]), height - 1)

        visit(self.root, self.height)
        return out
