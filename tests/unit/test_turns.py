"""The turn join: either order, one verdict per distinct observation, first response in event
time, and the same verdicts for any arrival order of a turn's halves."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from memdiag import semantic as sm
from memdiag.streams.rules.feedback import (
    MIN_KEYWORD_LEN,
    judge_observation,
    keywords,
    normalise_words,
)
from memdiag.streams.rules.turns import INJECTION, RESPONSE, Turn

OBS = [
    ("obs_7", "Access tokens expire after 15 minutes; the refresh endpoint rotates them."),
    ("obs_9", "Session cookies are signed with the HMAC secret from vault."),
]
TEXT = (
    "The access tokens expire after 15 minutes, so the client calls the refresh endpoint, "
    "which rotates them."
)


def words(text: str) -> frozenset[str]:
    return frozenset(w for w in normalise_words(text) if len(w) >= MIN_KEYWORD_LEN)


def kws(
    observations: list[tuple[str, str]], embed=None
) -> list[tuple[str, frozenset[str], bytes | None]]:
    return [(o, keywords(c), None if embed is None else embed(c)) for o, c in observations]


def signals(turn: Turn) -> dict[str, str]:
    return {o: j.feedback.signal for o, j in turn.judged.items()}


def test_injection_then_response() -> None:
    t = Turn()
    assert t.add_injection(10, "e0", 0, kws(OBS)) == []
    assert t.pending_half() == INJECTION
    changes = t.add_response(20, "e1", 0, words(TEXT))
    assert [(o, before) for o, before, _ in changes] == [("obs_7", None), ("obs_9", None)]
    assert signals(t) == {"obs_7": "used", "obs_9": "ignored"}
    assert all(j.ts_us == 20 for j in t.judged.values()) and t.pending_half() is None


def test_response_then_injection_gives_the_same_verdicts() -> None:
    a, b = Turn(), Turn()
    a.add_injection(10, "e0", 0, kws(OBS))
    a.add_response(20, "e1", 0, words(TEXT))
    b.add_response(20, "e1", 0, words(TEXT))
    assert b.pending_half() == RESPONSE
    b.add_injection(10, "e0", 0, kws(OBS))
    assert a.judged == b.judged  # the later half's time either way


def test_the_verdict_equals_the_rule_on_the_texts() -> None:
    t = Turn()
    t.add_injection(10, "e0", 0, kws(OBS))
    t.add_response(20, "e1", 0, words(TEXT))
    for obs_id, content in OBS:
        assert t.judged[obs_id].feedback == judge_observation(
            content, frozenset(normalise_words(TEXT))
        )


def test_duplicate_observations_get_one_verdict_with_the_first_content_in_event_time() -> None:
    t = Turn()
    t.add_injection(12, "e1", 0, [(OBS[0][0], keywords("other text entirely unrelated"), None)])
    t.add_injection(10, "e0", 0, kws([OBS[0], OBS[0], OBS[1]]))  # earlier: its content wins
    t.add_response(20, "e2", 0, words(TEXT))
    assert signals(t) == {"obs_7": "used", "obs_9": "ignored"}


def test_an_injection_after_the_response_is_judged_against_it() -> None:
    t = Turn()
    t.add_response(20, "e0", 0, words(TEXT))
    t.add_injection(30, "e1", 0, kws(OBS[:1]))
    t.add_injection(40, "e2", 0, kws(OBS[1:]))
    assert signals(t) == {"obs_7": "used", "obs_9": "ignored"}
    assert t.judged["obs_9"].ts_us == 40


def test_an_earlier_response_arriving_late_replaces_the_turns_response() -> None:
    t = Turn()
    t.add_injection(10, "e0", 0, kws(OBS))
    t.add_response(30, "e1", 0, words("nothing relevant at all"))
    assert signals(t) == {"obs_7": "ignored", "obs_9": "ignored"}
    changes = t.add_response(20, "e2", 0, words(TEXT))  # earlier in event time
    assert [o for o, _, _ in changes] == ["obs_7", "obs_9"]  # obs_9: same signal, new ts
    assert signals(t) == {"obs_7": "used", "obs_9": "ignored"}
    assert t.judged["obs_9"].ts_us == 20
    assert t.add_response(40, "e3", 0, words(TEXT)) == []  # a later second response is ignored


turn_events = st.lists(  # few distinct times: halves share them, their event ids decide
    st.tuples(st.booleans(), st.integers(0, 6), st.sampled_from(range(len(OBS) + 2))),
    min_size=1,
    max_size=9,
)


@given(turn_events, st.randoms(use_true_random=False), st.booleans())
def test_any_arrival_order_gives_the_same_verdicts(
    events: list, rnd: random.Random, semantic: bool
) -> None:
    """Under either detector (semantic: the similarity is read from the stored vectors)."""
    texts = [TEXT, "nothing here", "session cookies signed secret vault", "tokens rotate"]
    embed = sm.embedder() if semantic else None

    def build(order: list) -> dict:
        t = Turn(0.3)
        for eid, (is_response, ts, i) in order:
            text = texts[i % len(texts)]
            if is_response:
                t.add_response(ts, eid, 0, words(text), None if embed is None else embed(text))
            else:
                t.add_injection(ts, eid, 0, kws([OBS[i % 2]], embed))
        return t.judged

    named = [(f"e-{n}", e) for n, e in enumerate(events)]  # e-10 before e-9
    shuffled = list(named)
    rnd.shuffle(shuffled)
    assert build(shuffled) == build(sorted(named, key=lambda n: (n[1][1], n[0].encode())))


def test_of_two_responses_at_one_instant_the_smaller_event_id_is_the_turns() -> None:
    for first, second in (("e-100", "e-99"), ("e-99", "e-100")):
        t = Turn()
        t.add_injection(10, "e-1", 0, kws(OBS))
        t.add_response(20, first, 0, words(TEXT if first == "e-100" else "nothing at all"))
        t.add_response(20, second, 0, words(TEXT if second == "e-100" else "nothing at all"))
        assert signals(t) == {"obs_7": "used", "obs_9": "ignored"}


PARAPHRASE = ("obs_k", "Rotate the signing key before the token expires.")
SAID = "The auth token's signing secret must be rolled ahead of expiry."


def test_the_semantic_rule_finds_a_paraphrase_the_words_miss() -> None:
    """Contract section 3: ``used`` iff the keyword rule says so or the similarity reaches
    the threshold; the row says which rule and the similarity."""
    embed = sm.embedder()
    for threshold, signal in ((0.19, "used"), (0.6, "ignored")):
        t = Turn(threshold)
        t.add_injection(10, "e0", 0, kws([PARAPHRASE, OBS[1]], embed))
        t.add_response(20, "e1", 0, words(SAID), embed(SAID))
        fb = t.judged["obs_k"].feedback
        assert (fb.signal, fb.detector, fb.match_ratio) == (signal, "semantic", 0.2)  # signing
        assert fb.similarity == sm.similarity(embed(PARAPHRASE[1]), embed(SAID)) == 0.56858
        # the cookie memory shares the topic (a signed secret), not the use: 0.34, used at
        # 0.19 (docs/rules.md says why a static embedding scores the topic)
        other = t.judged["obs_9"].feedback
        assert (other.similarity, other.signal) == (0.34444, signal)
    # a words match (the keyword rule's used) stays used at any threshold
    t = Turn(1.0)
    t.add_injection(10, "e0", 0, kws(OBS[:1], embed))
    t.add_response(20, "e1", 0, words(TEXT), embed(TEXT))
    assert t.judged["obs_7"].feedback.signal == "used"


def test_a_half_without_vectors_is_judged_by_the_keyword_rule() -> None:
    """A response from a worker that ran the keyword rule (no vectors in its log), or a
    turn from spans, is a keyword verdict with no similarity, whatever the other half has."""
    embed = sm.embedder()
    t = Turn(0.19)
    t.add_injection(10, "e0", 0, kws([PARAPHRASE], embed))
    t.add_response(20, "e1", 0, words(SAID), None)
    fb = t.judged["obs_k"].feedback
    assert (fb.signal, fb.detector, fb.similarity) == ("ignored", "keyword", None)  # 1 of 5


def test_under_the_keyword_rule_stored_vectors_are_never_read() -> None:
    """A log written under semantic, read by a worker that runs the keyword rule (threshold
    None): keyword verdicts, no similarity (and no numpy needed)."""
    embed = sm.embedder()
    t = Turn(None)
    t.add_injection(10, "e0", 0, kws([PARAPHRASE], embed))
    t.add_response(20, "e1", 0, words(SAID), embed(SAID, False))
    fb = t.judged["obs_k"].feedback
    assert (fb.signal, fb.detector, fb.similarity) == ("ignored", "keyword", None)
