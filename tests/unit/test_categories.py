"""The failure-category rule says which rule fired (``memdiag explain`` shows it)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memdiag.contract.categories import classify, failure_category

EDITED = ["src/a.py"]


@pytest.mark.parametrize(
    ("tools", "errors", "files", "category", "reason"),
    [
        ([("pytest", False)], [], EDITED, "test_failure", "test runner pytest failed"),
        (
            [("npm", False), ("Go Test", False)],
            ["lint"],
            [],
            "test_failure",
            "test runner Go Test failed",
        ),
        (
            [],
            ["x", "ESLint: 3 problems"],
            EDITED,
            "style",
            "error 'ESLint: 3 problems' mentions 'eslint'",
        ),
        (
            [],
            ["it broke the build"],
            EDITED,
            "regression",
            "error 'it broke the build' mentions 'broke'",
        ),
        ([("npm", False)], [], [], "incomplete", "no file was modified"),
        (
            [],
            ["TypeError: x is undefined", "again"],
            None,
            "wrong_approach",
            "2 errors and no failed test runner or linter, no style or regression error; "
            "the first: 'TypeError: x is undefined'",
        ),
        (
            [("ruff", True)],
            [],
            None,
            "other",
            "no rule holds: no failed test runner or linter, no error, files modified",
        ),
        (
            [("npm", False), ("Ruff", False)],
            ["E501 Line too long", "it broke"],
            EDITED,
            "style",
            "linter or formatter Ruff failed",
        ),
    ],
)
def test_the_reason_names_what_fired(tools, errors, files, category, reason) -> None:
    c = classify(tools, errors, files)
    assert (c.category, c.reason) == (category, reason)


def test_a_long_message_is_quoted_short_on_one_line() -> None:
    c = classify([], ["format\n" + "x" * 500], EDITED)
    assert c.category == "style" and "\n" not in c.reason and len(c.reason) < 120


@given(
    st.lists(st.tuples(st.sampled_from(["pytest", "npm", "Jest", "make"]), st.booleans())),
    st.lists(st.sampled_from(["lint", "broke", "boom", "", "Previously fine"])),
    st.one_of(st.none(), st.lists(st.just("f"), max_size=2)),
)
def test_the_category_is_the_workers(tools, errors, files) -> None:
    assert classify(tools, errors, files).category == failure_category(tools, errors, files)
