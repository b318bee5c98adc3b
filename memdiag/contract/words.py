"""The words of the used/ignored rule (contract section 3), shared by the worker's verdict
(:mod:`memdiag.streams.rules.feedback`) and the offline readings of ``memdiag calibrate``.

Normalise a text: lowercase, split on white space, drop every character that is not
alphanumeric (``str.isalnum``) from each word. An observation's keywords are its distinct
normalised words longer than 4 characters. ``used`` iff ``matched / keywords > 0.30``
(strictly; compared in integers). Pure functions; this module imports nothing of the project.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

USED = "used"
IGNORED = "ignored"
#: which rule made a verdict (retrieval_feedback.detector): the words alone, or the words or
#: the similarity (MEMDIAG_DETECTOR=semantic, when both halves were embedded)
KEYWORD, SEMANTIC = "keyword", "semantic"
DETECTORS = (KEYWORD, SEMANTIC)
#: used iff matched / keywords > USED_NUM / USED_DEN
USED_NUM, USED_DEN = 3, 10


def is_used(matched: int, keyword_count: int) -> bool:
    """The keyword rule on counts: more than 30% of the keywords matched (in integers, so
    exactly 30% is not); no keywords is never used."""
    return keyword_count > 0 and matched * USED_DEN > keyword_count * USED_NUM


MIN_KEYWORD_LEN = 5  # "longer than 4 characters"


#: ASCII characters that are neither alphanumeric nor white space: deleting them in one C pass
#: (``str.translate``) and then splitting equals the per-word rule, for ASCII text.
_ASCII_PUNCT = {c: None for c in range(128) if not chr(c).isalnum() and not chr(c).isspace()}


def _clean(word: str) -> str:
    if word.isalnum():
        return word
    return "".join(c for c in word if c.isalnum())


def normalise_words(text: str) -> list[str]:
    """The contract's normalised words of ``text`` (empty words dropped)."""
    if text.isascii():
        return text.lower().translate(_ASCII_PUNCT).split()
    words = []
    for word in text.lower().split():
        cleaned = _clean(word)
        if cleaned:
            words.append(cleaned)
    return words


def response_words(text: str) -> frozenset[str]:
    """The set a response is matched against: computed once per turn."""
    return frozenset(normalise_words(text))


def _keywords(content: str) -> frozenset[str]:
    return frozenset(w for w in normalise_words(content) if len(w) >= MIN_KEYWORD_LEN)


#: The bytes of keyword sets :data:`keywords` remembers by content, about (memory systems
#: inject the same memories again and again): 16 MB.
KEYWORDS_CACHE_BYTES = 16 << 20
#: What a keyword costs in a remembered set (its string and the set's slot), and an entry
#: beside its content and keywords, about (measured with tracemalloc: 1.45 KB an entry of a
#: 110-character memory of 9 keywords).
_PER_KEYWORD, _PER_ENTRY = 100, 300


class CacheInfo(NamedTuple):
    currsize: int
    bytes: int


class KeywordCache:
    """:func:`keywords` by content, least recently used first out, within ``max_bytes``
    (it was an ``lru_cache`` of 100,000 contents: 145 MB of 110-character memories, and
    unbounded in bytes for long ones). A content weighing more than a 64th of the bound is
    not remembered. Thread-safe: a hit takes no lock."""

    def __init__(self, max_bytes: int = KEYWORDS_CACHE_BYTES):
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[frozenset[str], int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __call__(self, content: str) -> frozenset[str]:
        """Distinct normalised words longer than 4 characters."""
        found = self._entries.get(content)
        if found is not None:
            try:
                self._entries.move_to_end(content)
            except KeyError:  # another thread evicted it meanwhile
                pass
            return found[0]
        kws = _keywords(content)
        weight = len(content) + _PER_KEYWORD * len(kws) + _PER_ENTRY
        if weight > self.max_bytes // 64:
            return kws
        with self._lock:
            if content not in self._entries:
                self._entries[content] = (kws, weight)
                self._bytes += weight
                while self._bytes > self.max_bytes:
                    _, (_, gone) = self._entries.popitem(last=False)
                    self._bytes -= gone
        return kws

    def cache_info(self) -> CacheInfo:
        return CacheInfo(len(self._entries), self._bytes)

    def cache_clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0


#: An observation's keywords (contract section 3), remembered by content.
keywords = KeywordCache()
