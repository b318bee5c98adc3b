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

import msgspec

from memdiag.contract.words import (  # noqa: F401 - the rule's words, re-exported here
    IGNORED,
    MIN_KEYWORD_LEN,
    USED,
    USED_DEN,
    USED_NUM,
    keywords,
    normalise_words,
    response_words,
)


class Feedback(msgspec.Struct, frozen=True, gc=False):
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
