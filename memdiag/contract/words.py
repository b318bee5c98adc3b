"""The words of the used/ignored rule (contract section 3), shared by the worker's verdict
(:mod:`memdiag.streams.rules.feedback`) and the offline readings of ``memdiag calibrate``.

Normalise a text: lowercase, split on white space, drop every character that is not
alphanumeric (``str.isalnum``) from each word. An observation's keywords are its distinct
normalised words longer than 4 characters. ``used`` iff ``matched / keywords > 0.30``
(strictly; compared in integers). Pure functions; this module imports nothing of the project.
"""

from __future__ import annotations

from functools import lru_cache

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


@lru_cache(maxsize=100_000)
def keywords(content: str) -> frozenset[str]:
    """Distinct normalised words longer than 4 characters (cached by content)."""
    return frozenset(w for w in normalise_words(content) if len(w) >= MIN_KEYWORD_LEN)
