"""Failure categories, the misleading rule, the EMA weight and the observation owner."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.diagnosis import (
    CATEGORIES,
    TEST_RUNNERS,
    ObservationState,
    ema_step,
    failure_category,
    is_misleading,
)

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


def test_owner_goes_aggressive_when_the_observation_becomes_misleading() -> None:
    state = ObservationState()
    steps = [state.apply("o", f"s{i}", "rejected", i, 0.1, 0.2)[0] for i in range(4)]
    assert [s.alpha for s in steps] == [0.2, 0.2, 0.4, 0.4]
    assert [s.aggressive for s in steps] == [False, False, True, True]
    assert [s.became_misleading for s in steps] == [False, False, True, False]
    assert [round(s.new_weight, 6) for s in steps] == [0.8, 0.64, 0.384, 0.2304]
    assert [s.seq for s in steps] == [1, 2, 3, 4]
    assert steps[2].previous_weight == pytest.approx(0.64)


def test_one_accepted_session_ends_misleading_for_good() -> None:
    state = ObservationState()
    for i in range(3):
        state.apply("o", f"f{i}", "rework", i, 0.1, 0.2)
    assert state.misleading
    step, _ = state.apply("o", "ok", "accepted", 9, 0.1, 0.2)
    assert not step.misleading and step.alpha == 0.1 and not step.aggressive
    later, _ = state.apply("o", "f9", "rejected", 10, 0.1, 0.2)
    assert not later.misleading and later.alpha == 0.2


def test_a_redelivered_outcome_re_emits_its_step_instead_of_taking_another() -> None:
    state = ObservationState()
    first, fresh = state.apply("o", "s1", "rejected", 1, 0.1, 0.2)
    state.apply("o", "s2", "accepted", 2, 0.1, 0.2)
    again, fresh_again = state.apply("o", "s1", "rejected", 1, 0.1, 0.2)
    assert fresh and not fresh_again and again == first
    assert (state.failed, state.accepted, state.seq) == (1, 1, 2)


def test_state_round_trips() -> None:
    import orjson

    state = ObservationState()
    for i in range(70):
        state.apply("o", f"s{i}", "rejected" if i % 3 else "accepted", i, 0.1, 0.2)
    again = ObservationState.from_state(orjson.loads(orjson.dumps(state.to_state())))
    assert again.to_state() == state.to_state()
    assert len(again.recent) == ObservationState.RECENT
