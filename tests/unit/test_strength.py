"""An observation's strength as a pure function of its verdicts (memdiag.streams.rules.strength)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.streams.rules.strength import START, Strength, Verdict, ema

A_USED, A_IGNORED = 0.2, 0.05


def fold(verdicts: list[Verdict]) -> list[tuple[str, str, bool, float]]:
    """An independent fold: sorted by (ts, tie bytes, session, turn), one EMA step each."""
    out, s = [], START
    for v in sorted(verdicts, key=lambda v: (v.ts_us, v.tie.encode(), v.session_id, v.turn_id)):
        s = s + (A_USED * (1 - s) if v.used else -A_IGNORED * s)
        out.append((v.session_id, v.turn_id, v.used, round(s, 12)))
    return out


def steps_of(strength: Strength) -> list[tuple[str, str, bool, float]]:
    return [(s.session_id, s.turn_id, s.used, round(s.strength, 12)) for s in strength.steps]


def test_a_used_verdict_moves_toward_1_and_an_ignored_one_toward_0() -> None:
    assert ema(0.5, True, A_USED, A_IGNORED) == (A_USED, pytest.approx(0.6))
    assert ema(0.5, False, A_USED, A_IGNORED) == (A_IGNORED, pytest.approx(0.475))
    s = Strength(A_USED, A_IGNORED)
    assert s.current == START == 1.0  # a memory nobody judged is not demoted
    for i in range(14):
        s.apply(("s", f"t{i}"), Verdict(i, f"e{i}", "s", f"t{i}", False))
    assert s.current == pytest.approx(0.95**14) and s.current < 0.5  # 14 ignored halve it
    assert (s.judged_turns, s.used_turns) == (14, 0)


def test_a_late_verdict_is_inserted_in_turn_order_and_the_steps_after_it_taken_again() -> None:
    s = Strength(A_USED, A_IGNORED)
    s.apply(("a", "t1"), Verdict(10, "x", "a", "t1", False))
    s.apply(("b", "t1"), Verdict(30, "y", "b", "t1", False))
    change = s.apply(("c", "t1"), Verdict(20, "z", "c", "t1", True))
    assert [(st.key, st.position) for st in change.steps] == [(("c", "t1"), 2), (("b", "t1"), 3)]
    assert [st.session_id for st in s.steps] == ["a", "c", "b"]


def test_equal_turn_times_order_by_the_later_events_id_in_byte_order() -> None:
    s = Strength(A_USED, A_IGNORED)
    s.apply(("a", "t"), Verdict(5, "e-99", "a", "t", True))
    s.apply(("b", "t"), Verdict(5, "e-100", "b", "t", False))
    assert [st.session_id for st in s.steps] == ["b", "a"]  # "e-100" < "e-99"


def test_a_verdict_taken_back_takes_its_step_back_and_a_changed_one_moves() -> None:
    s = Strength(A_USED, A_IGNORED)
    s.apply(("a", "t1"), Verdict(10, "x", "a", "t1", False))
    s.apply(("b", "t1"), Verdict(20, "y", "b", "t1", True))
    change = s.apply(("a", "t1"), None)
    assert change.retracted == [("a", "t1")] and [st.key for st in change.steps] == [("b", "t1")]
    assert s.current == pytest.approx(1.0)  # used from 1.0 stays 1.0
    change = s.apply(("b", "t1"), Verdict(5, "w", "b", "t1", False))  # corrected, earlier
    assert change.retracted == [] and s.current == pytest.approx(0.95)
    assert not s.apply(("b", "t1"), Verdict(5, "w", "b", "t1", False)).fresh  # redelivered
    nothing = s.apply(("zz", "t"), None)  # nothing to take back (its tombstone is kept)
    assert nothing.steps == [] and nothing.retracted == [] and not nothing.late


def test_a_message_older_than_one_applied_changes_nothing() -> None:
    """A worker that lost the partition may deliver its verdict after its successor's
    take-back: the lower seq loses, also through the state."""
    s = Strength(A_USED, A_IGNORED)
    key = ("a", "t1")
    s.apply(key, Verdict(10, "x", *key, True), seq=3)
    s.apply(key, None, seq=5, taken_back=(10, "x", *key))
    s = Strength.from_state(s.to_state(), A_USED, A_IGNORED)
    stale = s.apply(key, Verdict(10, "x", *key, True), seq=3)
    assert not stale.fresh and s.steps == [] and s.current == START
    assert s.apply(key, Verdict(12, "y", *key, False), seq=6).steps  # a newer one counts


def test_a_verdict_older_than_the_folded_start_is_late() -> None:
    s = Strength(A_USED, A_IGNORED)
    for i in range(Strength.MAX_ENTRIES + 3):
        s.apply((f"s{i}", "t"), Verdict(100 + i, "e", f"s{i}", "t", i % 3 == 0))
    assert len(s.entries) == Strength.MAX_ENTRIES and s.judged_turns == Strength.MAX_ENTRIES + 3
    assert s.apply(("old", "t"), Verdict(1, "e", "old", "t", True)).late
    # a kept verdict corrected to before the start: its step taken back, counted late
    kept = s.entries[0]
    change = s.apply(kept.key, Verdict(1, "e", kept.session_id, "t", kept.used))
    assert change.late and change.retracted == [kept.key]
    # a verdict folded into the start cannot be taken back: late, and counted so
    folded = s.apply(("s0", "t"), None, taken_back=(100, "e", "s0", "t"))
    assert folded.late and folded.steps == [] and folded.retracted == []


verdict_lists = st.lists(
    st.tuples(
        st.integers(0, 3),  # session
        st.integers(0, 2),  # turn
        st.integers(0, 6),  # few distinct turn times: ties
        st.sampled_from(["e-9", "e-10", "e-99", "e-100"]),  # ties by these ids' bytes
        st.booleans(),
    ),
    max_size=20,
)


@settings(max_examples=200)
@given(verdict_lists, st.randoms(use_true_random=False))
def test_any_order_of_verdicts_corrections_and_take_backs_gives_the_in_order_steps(
    raw: list, rnd: random.Random
) -> None:
    """Messages for one (session, turn) keep their order (one partition sends them); across
    keys they interleave in any way. The last verdict of each key stands, or none if its last
    message takes it back."""
    per_key: dict[tuple[str, str], list[Verdict | None]] = {}
    for sess, turn, ts, tie, used in raw:
        key = (f"s{sess}", f"t{turn}")
        per_key.setdefault(key, []).append(Verdict(ts, tie, *key, used))
        if rnd.random() < 0.2:
            per_key[key].append(None)  # taken back (maybe judged again after)
    queues = {k: list(enumerate(v)) for k, v in per_key.items()}
    s = Strength(A_USED, A_IGNORED)
    while queues:
        key = rnd.choice(sorted(queues))
        seq, verdict = queues[key].pop(0)
        s.apply(key, verdict, seq)
        if rnd.random() < 0.2 and seq:  # a stale message arriving late: changes nothing
            assert not s.apply(key, per_key[key][seq - 1], seq - 1).fresh
        if not queues[key]:
            del queues[key]
        if rnd.random() < 0.3:
            s = Strength.from_state(s.to_state(), A_USED, A_IGNORED)  # and through the state
    standing = [v[-1] for v in per_key.values() if v[-1] is not None]
    assert steps_of(s) == fold(standing)
    assert s.current == pytest.approx(fold(standing)[-1][3] if standing else START)
