"""The stages' caches of decoded state: plain dicts in least-recently-used order."""

from __future__ import annotations

from typing import TypeVar

V = TypeVar("V")


def remember(cache: dict[str, V], key: str, value: V, size: int) -> None:
    """Put ``value`` last (most recently used), dropping the least recently used entry if the
    cache already holds ``size``."""
    cache.pop(key, None)
    if len(cache) >= size:
        cache.pop(next(iter(cache)))
    cache[key] = value
