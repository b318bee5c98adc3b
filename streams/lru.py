"""The stages' caches of decoded state, under one byte budget (``MEMDIAG_DECODED_CACHE_MB``).

A decoded object is about ten times its encoding (measured by
``benchmarks/memory_breakdown.py``: a session 29 KB for 2.7 KB stored, a ledger 56 KB for
5.5 KB, a strength 75 KB for 8.6 KB), so counting entries bounded nothing: 5,000 sessions and
1,000 each of ledgers, graph ledgers and strengths could hold half a gigabyte. Every cache is a
:class:`Cache` of one :class:`Budget`: each entry weighs :data:`DECODED_PER_ENCODED` times its
encoded bytes, and a put that takes the budget past its bytes evicts the least recently used
entries of *any* cache until it fits. The busy keys of every stage stay; the budget holds.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from functools import lru_cache
from typing import Generic, TypeVar

V = TypeVar("V")

#: a decoded object's bytes per byte of its encoding (``benchmarks/memory_breakdown.py``)
DECODED_PER_ENCODED = 10


def remember(cache: dict[str, V], key: str, value: V, size: int) -> None:
    """Put ``value`` last (most recently used), dropping the least recently used entry if the
    cache already holds ``size``. (For the small caches a count bounds well enough.)"""
    cache.pop(key, None)
    if len(cache) >= size:
        cache.pop(next(iter(cache)))
    cache[key] = value


class Budget:
    """Bytes shared by several caches, in one least-recently-used order across them."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.used = 0
        #: (cache, key) -> weight, the least recently used first
        self._order: OrderedDict[tuple[int, str], int] = OrderedDict()
        #: a cache gone (its stage dropped, in tests) leaves its entries to be evicted
        self._caches: weakref.WeakValueDictionary[int, Cache[object]] = (
            weakref.WeakValueDictionary()
        )
        self._next = 0

    def cache(self, name: str, max_entries: int | None = None) -> Cache[V]:
        c: Cache[V] = Cache(self, name, self._next, max_entries)
        self._caches[c.index] = c  # type: ignore[assignment]
        self._next += 1
        return c

    def _touch(self, slot: tuple[int, str]) -> None:
        self._order.move_to_end(slot)

    def _add(self, slot: tuple[int, str], weight: int) -> None:
        old = self._order.pop(slot, None)
        if old is not None:
            self.used -= old
        self._order[slot] = weight
        self.used += weight
        while self.used > self.max_bytes and len(self._order) > 1:
            (index, key), w = self._order.popitem(last=False)
            self.used -= w
            evicted = self._caches.get(index)
            if evicted is not None:
                evicted._values.pop(key, None)
                evicted._weights.pop(key, None)

    def _remove(self, slot: tuple[int, str]) -> None:
        w = self._order.pop(slot, None)
        if w is not None:
            self.used -= w


@lru_cache(maxsize=4)
def shared_budget(max_bytes: int) -> Budget:
    """The process's budget of ``max_bytes`` (``MEMDIAG_DECODED_CACHE_MB``): every stage of a
    worker takes its caches from it."""
    return Budget(max_bytes)


class Cache(Generic[V]):
    """One stage's decoded objects by key, in a :class:`Budget`."""

    def __init__(self, budget: Budget, name: str, index: int, max_entries: int | None = None):
        self.budget, self.name, self.index = budget, name, index
        self.max_entries = max_entries
        self._values: dict[str, V] = {}  # in the order last put
        self._weights: dict[str, int] = {}

    def get(self, key: str) -> V | None:
        value = self._values.get(key)
        if value is not None:
            self.budget._touch((self.index, key))
        return value

    def put(self, key: str, value: V, encoded_bytes: int | None = None, raw_bytes: int = 0) -> None:
        """Keep ``value`` as the most recently used; it weighs ``encoded_bytes`` times
        :data:`DECODED_PER_ENCODED` (None: what it weighed before, or one encoded KB), but
        ``raw_bytes`` of them (bytes values, held decoded as they are stored: a session's
        vectors) only once."""
        if encoded_bytes is None:
            weight = self._weights.get(key, 1024 * DECODED_PER_ENCODED)
        else:
            raw = min(raw_bytes, encoded_bytes)
            weight = max(1, encoded_bytes - raw) * DECODED_PER_ENCODED + raw
        self._values.pop(key, None)
        if self.max_entries is not None and len(self._values) >= self.max_entries:
            self.pop(next(iter(self._values)))  # the least recently put of this cache
        self._values[key] = value
        self._weights[key] = weight
        self.budget._add((self.index, key), weight)

    def pop(self, key: str) -> V | None:
        self._weights.pop(key, None)
        self.budget._remove((self.index, key))
        return self._values.pop(key, None)

    def clear(self) -> None:
        for key in self._values:
            self.budget._remove((self.index, key))
        self._values.clear()
        self._weights.clear()

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: str) -> bool:
        return key in self._values
