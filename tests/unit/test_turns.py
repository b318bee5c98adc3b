"""The turn join: either order, one verdict per distinct observation, TTL, redelivery."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from streams.feedback import judge_observation, response_words
from streams.turns import INJECTION, RESPONSE, Turns

OBS = [
    ("obs_7", "Access tokens expire after 15 minutes; the refresh endpoint rotates them."),
    ("obs_9", "Session cookies are signed with the HMAC secret from vault."),
]
TEXT = (
    "The access tokens expire after 15 minutes, so the client calls the refresh endpoint, "
    "which rotates them."
)
TTL = 3600 * 1_000_000


def signals(joined) -> dict[str, str]:
    return {f.observation_id: f.feedback.signal for f in joined.feedback}


def test_injection_then_response() -> None:
    t = Turns()
    assert t.add_injection("e1", 10, "t1", OBS).feedback == ()
    joined = t.add_response("e2", 20, "t1", TEXT)
    assert signals(joined) == {"obs_7": "used", "obs_9": "ignored"}
    assert joined.fresh and all(f.ts_us == 20 for f in joined.feedback)


def test_response_then_injection_gives_the_same_verdicts() -> None:
    a, b = Turns(), Turns()
    a.add_injection("e1", 10, "t1", OBS)
    first = a.add_response("e2", 20, "t1", TEXT)
    b.add_response("e2", 20, "t1", TEXT)
    second = b.add_injection("e1", 10, "t1", OBS)
    assert [f.feedback for f in first.feedback] == [f.feedback for f in second.feedback]
    assert second.feedback[0].ts_us == 20  # the later half's time either way


def test_duplicate_observations_in_one_injection_get_one_verdict() -> None:
    t = Turns()
    t.add_injection("e1", 10, "t1", [OBS[0], OBS[0], OBS[1], ("obs_7", "other text entirely")])
    joined = t.add_response("e2", 20, "t1", TEXT)
    assert [f.observation_id for f in joined.feedback] == ["obs_7", "obs_9"]
    assert joined.feedback[0].feedback.signal == "used"  # the first content wins


def test_two_injections_of_a_turn_merge_before_the_response() -> None:
    t = Turns()
    t.add_injection("e1", 10, "t1", [OBS[0]])
    t.add_injection("e3", 12, "t1", [OBS[1], OBS[0]])
    joined = t.add_response("e2", 20, "t1", TEXT)
    assert signals(joined) == {"obs_7": "used", "obs_9": "ignored"}


def test_redelivered_half_re_emits_the_same_feedback_without_counting() -> None:
    t = Turns()
    t.add_injection("e1", 10, "t1", OBS)
    first = t.add_response("e2", 20, "t1", TEXT)
    for again in (t.add_response("e2", 20, "t1", TEXT), t.add_injection("e1", 10, "t1", OBS)):
        assert again.feedback == first.feedback and not again.fresh


def test_redelivered_half_before_the_join_changes_nothing() -> None:
    t = Turns()
    t.add_injection("e1", 10, "t1", OBS)
    assert t.add_injection("e1", 10, "t1", OBS).feedback == ()
    assert len(t.add_response("e2", 20, "t1", TEXT).feedback) == 2


def test_a_late_injection_for_a_judged_turn_is_reported_not_judged() -> None:
    t = Turns()
    t.add_injection("e1", 10, "t1", [OBS[0]])
    t.add_response("e2", 20, "t1", TEXT)
    late = t.add_injection("e3", 30, "t1", [OBS[0], OBS[1]])
    assert late.feedback == () and late.late_observations == 1


def test_a_second_response_keeps_the_first() -> None:
    t = Turns()
    t.add_response("e2", 20, "t1", TEXT)
    assert t.add_response("e4", 25, "t1", "nothing relevant here").feedback == ()
    assert signals(t.add_injection("e1", 10, "t1", OBS))["obs_7"] == "used"


def test_turns_are_independent() -> None:
    t = Turns()
    t.add_injection("e1", 10, "t1", OBS)
    assert t.add_response("e2", 20, "t2", TEXT).feedback == ()
    assert sorted(h for _, h, _ in t.pending()) == [INJECTION, RESPONSE]


def test_unmatched_halves_expire_after_the_ttl_and_are_reported() -> None:
    t = Turns()
    t.add_injection("e1", 0, "t1", OBS)
    t.add_response("e2", 100, "t2", TEXT)
    t.add_injection("e3", 0, "t3", OBS)
    t.add_response("e4", 5, "t3", TEXT)  # joined: done turns expire silently
    assert t.next_expiry(TTL) == TTL
    assert t.expire(TTL, TTL) == []  # exactly TTL old: still kept
    assert sorted(t.expire(TTL + 1, TTL)) == [("t1", INJECTION)]
    assert t.expire(TTL + 101, TTL) == [("t2", RESPONSE)]
    assert len(t) == 0


def test_state_round_trips_and_keeps_no_raw_text() -> None:
    import orjson

    t = Turns()
    t.add_injection("e1", 10, "t1", OBS)
    t.add_response("e2", 20, "t2", TEXT)
    raw = orjson.dumps(t.to_state())
    assert b"Access tokens" not in raw and b"The access" not in raw
    again = Turns.from_state(orjson.loads(raw))
    assert signals(again.add_response("e5", 30, "t1", TEXT)) == {
        "obs_7": "used",
        "obs_9": "ignored",
    }


contents = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.text(max_size=80)), max_size=6
)


@given(contents, st.text(max_size=200), st.booleans())
def test_join_equals_the_detector_in_either_order(obs, text, response_first) -> None:
    t = Turns()
    if response_first:
        t.add_response("r", 2, "t", text)
        joined = t.add_injection("i", 1, "t", obs)
    else:
        t.add_injection("i", 1, "t", obs)
        joined = t.add_response("r", 2, "t", text)
    words = response_words(text)
    first: dict[str, str] = {}
    for obs_id, content in obs:
        first.setdefault(obs_id, content)
    assert {f.observation_id: f.feedback for f in joined.feedback} == {
        o: judge_observation(c, words) for o, c in first.items()
    }
