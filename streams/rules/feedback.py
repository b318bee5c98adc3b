"""The used/ignored rule (docs/rules.md, "Used / ignored"): pure functions.

Normalise a text: lowercase, split on white space, drop every character that is not
alphanumeric (``str.isalnum``) from each word. An observation's keywords are its distinct
normalised words longer than 4 characters; ``matched`` are those that are also normalised
words of the response. ``used`` iff ``matched / keywords > 0.30`` (strictly; compared in
integers, so exactly 0.30 is ``ignored`` with no float doubt); no keywords -> ``ignored``
with ratio 0.

Cost. A response is tokenised once per turn (:func:`response_words`), not once per
observation, and an observation's keywords are cached by content: real memory systems
inject the same observations into many sessions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

USED = "used"
IGNORED = "ignored"
#: used iff matched / keywords > USED_NUM / USED_DEN
USED_NUM, USED_DEN = 3, 10
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


@dataclass(frozen=True, slots=True)
class Feedback:
    signal: str
    match_ratio: float
    keyword_count: int
    matched_count: int


def judge_observation(content: str, response: frozenset[str]) -> Feedback:
    """The verdict on one observation's ``content`` given the response's words."""
    return judge_keywords(keywords(content), response)


def judge_keywords(kws: frozenset[str], response: frozenset[str]) -> Feedback:
    """The verdict given an observation's keywords (what the turn join keeps in state)."""
    if not kws:
        return Feedback(IGNORED, 0.0, 0, 0)
    matched = len(kws & response)
    used = matched * USED_DEN > len(kws) * USED_NUM
    return Feedback(USED if used else IGNORED, matched / len(kws), len(kws), matched)
