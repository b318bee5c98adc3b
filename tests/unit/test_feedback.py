"""The used/ignored rule as a pure function (issue 3, the detector part)."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from memdiag.streams.rules.feedback import (
    IGNORED,
    USED,
    judge_observation,
    keywords,
    normalise_words,
    response_words,
)

OBS_7 = "Access tokens expire after 15 minutes; the refresh endpoint rotates them."
OBS_9 = "Session cookies are signed with the HMAC secret from vault."
RESPONSE = (
    "The access tokens expire after 15 minutes, so the client calls the refresh endpoint, "
    "which rotates them."
)


def test_contract_example() -> None:
    words = response_words(RESPONSE)
    assert judge_observation(OBS_7, words).signal == USED
    assert judge_observation(OBS_9, words).signal == IGNORED


def test_normalisation() -> None:
    assert normalise_words("Hello, WORLD!  cold-start résumé 42nd --") == [
        "hello",
        "world",
        "coldstart",
        "résumé",
        "42nd",
    ]


def test_keywords_are_distinct_and_longer_than_four() -> None:
    assert keywords("tokens Tokens token tok12 four! fives") == {
        "tokens",
        "token",
        "tok12",
        "fives",
    }


def test_unicode_letters_and_digits_are_kept() -> None:
    assert judge_observation("Résumé parsing", response_words("RÉSUMÉ!")).matched_count == 1
    assert keywords("version 12345 v2") == {"version", "12345"}


def test_hyphenated_words_join() -> None:
    fb = judge_observation("cold-start latency", response_words("coldstart"))
    assert fb.matched_count == 1 and fb.keyword_count == 2


def test_exactly_030_is_ignored_and_just_above_is_used() -> None:
    content = " ".join(f"kword{i}" for i in range(10))
    three = response_words("kword0 kword1 kword2")
    four = response_words("kword0 kword1 kword2 kword3")
    assert judge_observation(content, three) == judge_observation(content, three)
    assert judge_observation(content, three).signal == IGNORED
    assert judge_observation(content, three).match_ratio == 0.3
    assert judge_observation(content, four).signal == USED


def test_no_keywords_is_ignored_with_ratio_zero() -> None:
    fb = judge_observation("a the of it is", response_words("a the of it is"))
    assert (fb.signal, fb.match_ratio, fb.keyword_count, fb.matched_count) == (IGNORED, 0.0, 0, 0)


words = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)


@given(st.lists(words, max_size=20), st.lists(words, max_size=40))
def test_verdict_matches_the_contract_definition(obs: list[str], resp: list[str]) -> None:
    content, response = " ".join(obs), " ".join(resp)

    def norm(text: str) -> list[str]:
        return ["".join(c for c in w if c.isalnum()) for w in text.lower().split()]

    kws = {w for w in norm(content) if len(w) > 4}
    matched = kws & set(norm(response))
    fb = judge_observation(content, response_words(response))
    assert fb.keyword_count == len(kws) and fb.matched_count == len(matched)
    expected = USED if kws and Fraction(len(matched), len(kws)) > Fraction(3, 10) else IGNORED
    assert fb.signal == expected


@given(st.text(), st.text())
def test_never_raises(content: str, response: str) -> None:
    fb = judge_observation(content, response_words(response))
    assert 0.0 <= fb.match_ratio <= 1.0


@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=200))
def test_ascii_fast_path_equals_the_per_word_rule(text: str) -> None:
    reference = [
        w for w in ("".join(c for c in w if c.isalnum()) for w in text.lower().split()) if w
    ]
    assert normalise_words(text) == reference


# -- the keyword cache: bounded in bytes, not in contents (#38) ------------------------------


@given(st.lists(st.text(max_size=200), max_size=60), st.integers(2_000, 40_000))
def test_the_keyword_cache_gives_the_rules_keywords_within_its_bytes(
    contents: list[str], max_bytes: int
) -> None:
    """Whatever it holds, it answers what the rule computes, and what it holds stays within
    its bytes (the lru_cache of 100,000 contents it replaces could hold 145 MB)."""
    from memdiag.contract.words import KeywordCache, _keywords

    cache = KeywordCache(max_bytes)
    for content in contents + contents[::-1]:
        assert cache(content) == _keywords(content)
        assert cache.cache_info().bytes <= max_bytes


def test_the_keyword_cache_keeps_the_recently_used_and_not_a_huge_content() -> None:
    from memdiag.contract.words import KeywordCache

    cache = KeywordCache(64 * 1024)
    cache("alpha bravo charlie deltas")
    for i in range(400):
        cache("alpha bravo charlie deltas")  # used again: the newest each time
        cache(f"memory number {i} about deployment pipelines")
    assert "alpha bravo charlie deltas" in cache._entries
    assert "memory number 0 about deployment pipelines" not in cache._entries
    assert cache.cache_info().bytes <= 64 * 1024
    huge = " ".join(f"word{i:05d}" for i in range(2_000))
    assert len(cache(huge)) == 2_000 and huge not in cache._entries
    cache.cache_clear()
    assert cache.cache_info() == (0, 0)
