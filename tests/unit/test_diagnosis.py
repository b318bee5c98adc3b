"""Failure categories, the misleading rule, the EMA weight and the observation owner."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memdiag.contract import CATEGORIES
from memdiag.streams.rules.diagnosis import (
    TEST_RUNNERS,
    ema_step,
    failure_category,
    is_misleading,
)
from memdiag.streams.rules.ledger import Entry, Ledger

EDITED = ["src/a.py"]


@pytest.mark.parametrize(
    ("tools", "errors", "files", "expected"),
    [
        ([("vitest", False)], [], EDITED, "test_failure"),
        ([("Go Test", False)], [], EDITED, "test_failure"),  # space -> _
        ([("playwright-test", False)], [], EDITED, "test_failure"),  # - -> _
        ([("PyTest", False)], [], EDITED, "test_failure"),
        ([("pytest", True)], [], EDITED, "other"),  # a passing test run is no failure
        ([("pytest-cov", False)], [], EDITED, "other"),  # not a runner of the list
        ([], ["ESLint found 3 problems"], EDITED, "style"),
        ([], ["could not FORMAT file"], EDITED, "style"),
        ([], ["prettier check failed"], EDITED, "style"),
        ([], ["this broke the build"], EDITED, "regression"),
        ([], ["worked previously"], EDITED, "regression"),
        ([], ["Regression in parser"], EDITED, "regression"),
        ([], [], [], "incomplete"),
        ([], ["timeout"], EDITED, "wrong_approach"),
        ([("edit", False)], [], EDITED, "other"),
    ],
)
def test_each_rule(tools, errors, files, expected) -> None:
    assert failure_category(tools, errors, files) == expected


@pytest.mark.parametrize(
    ("tools", "errors", "files", "expected"),
    [
        # test_failure beats everything below it
        ([("jest", False)], ["lint failed", "it broke"], [], "test_failure"),
        # style beats regression, incomplete, wrong_approach
        ([], ["lint broke previously"], [], "style"),
        ([], ["it broke", "eslint"], [], "style"),
        # regression beats incomplete and wrong_approach
        ([], ["broke"], [], "regression"),
        # incomplete beats wrong_approach
        ([], ["timeout"], [], "incomplete"),
    ],
)
def test_priority_clashes_take_the_first_rule(tools, errors, files, expected) -> None:
    assert failure_category(tools, errors, files) == expected


def test_every_listed_runner_is_a_test_failure() -> None:
    for runner in TEST_RUNNERS:
        assert failure_category([(runner.upper(), False)], [], EDITED) == "test_failure"


@given(
    st.lists(st.tuples(st.text(max_size=20), st.booleans()), max_size=5),
    st.lists(st.text(max_size=40), max_size=5),
    st.lists(st.text(max_size=10), max_size=3),
)
def test_always_one_of_the_six_rule_categories(tools, errors, files) -> None:
    assert failure_category(tools, errors, files) in CATEGORIES[:6]


def test_misleading_needs_three_failures_and_no_success() -> None:
    assert not is_misleading(2, 0)
    assert is_misleading(3, 0)
    assert not is_misleading(10, 1)


def test_ema_steps() -> None:
    assert ema_step(1.0, True, False, 0.1, 0.2) == (0.1, 1.0, False)
    alpha, w, aggressive = ema_step(1.0, False, False, 0.1, 0.2)
    assert (alpha, aggressive) == (0.2, False) and w == pytest.approx(0.8)
    alpha, w, aggressive = ema_step(0.64, False, True, 0.1, 0.2)
    assert (alpha, aggressive) == (0.4, True) and w == pytest.approx(0.384)
    assert ema_step(0.5, False, True, 0.1, 0.7)[:2] == (1.0, 0.0)  # min(1, 2 * 0.7)
    alpha, w, _ = ema_step(0.5, True, False, 0.1, 0.2)
    assert w == pytest.approx(0.55)


def entry(i: int, outcome: str = "rejected", ts: int | None = None, seq: int = 0) -> Entry:
    return Entry(i if ts is None else ts, f"s{i}", f"o{i}-{seq}", outcome)


def test_the_ledger_goes_aggressive_when_the_observation_becomes_misleading() -> None:
    ledger = Ledger(0.1, 0.2)
    changes = [ledger.apply(entry(i)) for i in range(4)]
    steps = [c.steps[0] for c in changes]
    assert [s.alpha for s in steps] == [0.2, 0.2, 0.4, 0.4]
    assert [s.aggressive for s in steps] == [False, False, True, True]
    assert [c.became_misleading for c in changes] == [False, False, True, False]
    assert [round(s.new_weight, 6) for s in steps] == [0.8, 0.64, 0.384, 0.2304]
    assert [s.position for s in steps] == [1, 2, 3, 4]
    assert steps[2].previous_weight == pytest.approx(0.64)
    assert [len(c.verdicts) for c in changes] == [1, 1, 1, 1]


def test_one_accepted_session_ends_misleading_for_good() -> None:
    ledger = Ledger(0.1, 0.2)
    for i in range(3):
        ledger.apply(entry(i, "rework"))
    assert ledger.misleading
    [step] = ledger.apply(entry(9, "accepted")).steps
    assert not step.misleading and step.alpha == 0.1 and not step.aggressive
    [later] = ledger.apply(entry(10)).steps
    assert not later.misleading and later.alpha == 0.2


def test_a_late_accepted_session_recomputes_every_step_after_it_and_clears_verdicts() -> None:
    ledger = Ledger(0.1, 0.2)
    for i in (1, 2, 3, 4):
        ledger.apply(entry(i))
    change = ledger.apply(entry(0, "accepted"))  # first in outcome order
    assert [s.session_id for s in change.steps] == ["s0", "s1", "s2", "s3", "s4"]
    # s3 and s4 were misleading; now nobody is: the sessions whose answer changed are told
    assert [(s.session_id, s.misleading) for s in change.verdicts] == [
        ("s3", False), ("s4", False)
    ]  # fmt: skip
    assert not ledger.misleading and ledger.version == 5


def test_a_step_that_comes_again_changes_nothing_and_sends_nothing() -> None:
    ledger = Ledger(0.1, 0.2)
    ledger.apply(entry(1))
    ledger.apply(entry(2, "accepted"))
    state = ledger.to_state()
    again = ledger.apply(entry(1))
    assert not again.fresh and ledger.to_state() == state
    assert again.steps == [] and again.verdicts == []


def test_a_sessions_newer_outcome_moves_its_step_and_an_older_one_is_ignored() -> None:
    ledger = Ledger(0.1, 0.2)
    ledger.apply(entry(1, ts=10))
    ledger.apply(entry(2, ts=20))
    moved = ledger.apply(Entry(30, "s1", "o1-later", "accepted"))  # s1's last outcome
    assert [(s.session_id, s.position) for s in moved.steps] == [("s2", 1), ("s1", 2)]
    assert ledger.current is not None and ledger.current.outcome == "accepted"
    stale = ledger.apply(Entry(10, "s1", "o1-0", "rejected"))
    assert not stale.fresh and ledger.current.session_id == "s1"


def test_a_session_older_than_the_kept_window_is_late() -> None:
    ledger = Ledger(0.1, 0.2)
    for i in range(Ledger.MAX_ENTRIES + 5):
        ledger.apply(entry(i + 100))
    assert len(ledger.entries) == Ledger.MAX_ENTRIES
    assert ledger.checkpoint.position == 5
    late = ledger.apply(entry(1))
    assert late.late and not late.fresh
    assert ledger.apply(entry(100_000)).steps[0].position == Ledger.MAX_ENTRIES + 6


def fold(entries: list[Entry]) -> list[tuple]:
    """An independent fold of the rule over entries sorted by (ts, session)."""
    failed = accepted = 0
    w = 1.0
    out = []
    for e in sorted(entries, key=lambda e: (e.ts_us, e.session_id)):
        ok = e.outcome == "accepted"
        accepted += ok
        failed += not ok
        misleading = failed >= 3 and accepted == 0
        alpha = 0.1 if ok else (0.4 if misleading else 0.2)
        new = w + alpha * ((1.0 if ok else 0.0) - w)
        out.append((e.session_id, e.outcome, round(new, 9), misleading))
        w = new
    return out


@given(
    st.lists(
        st.tuples(
            st.integers(0, 12), st.integers(0, 50), st.sampled_from(["accepted", "rejected"])
        ),
        min_size=1,
        max_size=25,
    ),
    st.randoms(use_true_random=False),
)
def test_any_order_of_outcomes_and_redeliveries_gives_the_in_order_steps(raw: list, rnd) -> None:
    """Each session's last outcome (by ts, then event_id in byte order: ``e10`` before
    ``e9``) stands, in any arrival order."""
    arrivals = [Entry(ts, f"s{sid}", f"e{n}", outcome) for n, (sid, ts, outcome) in enumerate(raw)]
    last: dict[str, Entry] = {}
    for e in arrivals:
        key = (e.ts_us, e.outcome_event_id.encode())
        known = last.get(e.session_id)
        if known is None or key > (known.ts_us, known.outcome_event_id.encode()):
            last[e.session_id] = e
    shuffled = arrivals + rnd.sample(arrivals, len(arrivals) // 2)  # with redeliveries
    rnd.shuffle(shuffled)
    ledger = Ledger(0.1, 0.2)
    sent: dict[str, tuple] = {}
    for e in shuffled:
        for step in ledger.apply(e).steps:
            sent[step.session_id] = (step.session_id, step.outcome, round(step.new_weight, 9),
                                     step.misleading)  # fmt: skip
        ledger = Ledger.from_state(ledger.to_state(), 0.1, 0.2)  # and through the state
    expected = fold(list(last.values()))
    assert [sent[s[0]] for s in expected] == expected
