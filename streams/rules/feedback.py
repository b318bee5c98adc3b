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
    KEYWORD,
    MIN_KEYWORD_LEN,
    SEMANTIC,
    USED,
    USED_DEN,
    USED_NUM,
    is_used,
    keywords,
    normalise_words,
    response_words,
)


class Feedback(msgspec.Struct, frozen=True, gc=False):
    signal: str
    match_ratio: float
    keyword_count: int
    matched_count: int
    #: the similarity of memory and response (MEMDIAG_DETECTOR=semantic); None: not measured
    similarity: float | None = None
    detector: str = KEYWORD


def judge_observation(content: str, response: frozenset[str]) -> Feedback:
    """The verdict on one observation's ``content`` given the response's words."""
    return judge_keywords(keywords(content), response)


def judge_keywords(kws: frozenset[str], response: frozenset[str]) -> Feedback:
    """The verdict given an observation's keywords (what the turn join keeps in state)."""
    if not kws:
        return Feedback(IGNORED, 0.0, 0, 0)
    matched = len(kws & response)
    used = is_used(matched, len(kws))
    return Feedback(USED if used else IGNORED, matched / len(kws), len(kws), matched)


def judge(
    kws: frozenset[str],
    response: frozenset[str],
    memory_vectors: bytes | None,
    response_vectors: bytes | None,
    threshold: float | None,
    sim: float | None = None,
) -> Feedback:
    """The verdict under either detector: the keyword rule's, and under
    MEMDIAG_DETECTOR=semantic (``threshold`` set) when both halves were embedded, ``used``
    also when their similarity reaches ``threshold`` (contract section 3). Pure: the vectors
    are stored, so a late half or a replay judges again without the model. Under keyword
    (``threshold`` None) stored vectors are never read: a log written under semantic gives
    keyword verdicts, and a worker without numpy never needs it. ``sim``: their similarity,
    when the caller measured it already (``memdiag.semantic.similarities``, a turn's
    memories in one product)."""
    feedback = judge_keywords(kws, response)
    if threshold is None or memory_vectors is None or response_vectors is None:
        return feedback
    if sim is None:
        from memdiag.semantic import similarity

        sim = similarity(memory_vectors, response_vectors)
    used = feedback.signal == USED or sim >= threshold
    return msgspec.structs.replace(
        feedback, signal=USED if used else IGNORED, similarity=sim, detector=SEMANTIC
    )
