"""One vocabulary: the names the stages and the SQL share are memdiag.contract's, spelled
the same everywhere they must be spelled out (SQL cannot import them)."""

from __future__ import annotations

import re
from pathlib import Path

from memdiag.schemas.decode import REASONS

from memdiag.contract import (
    ACCEPTED,
    CATEGORIES,
    FAILED_OUTCOMES,
    FAILURE_MODES,
    INPUT_REASONS,
    LATE_EVENT,
)

SQL = Path(__file__).resolve().parents[2] / "analytics" / "sql"


def test_the_category_distribution_lists_the_contract_categories_in_order() -> None:
    text = (SQL / "schema.sql").read_text()
    macro = text.split("MACRO failure_category_distribution", 1)[1].split(";", 1)[0]
    values = re.findall(r"\('([a-z_]+)', (\d+)\)", macro)
    assert [v for v, _ in values] == list(CATEGORIES)
    assert [int(n) for _, n in values] == list(range(1, len(CATEGORIES) + 1))
    known = re.search(r"IN \(([^)]*)\)\s+THEN", macro)
    assert known is not None
    assert re.findall(r"'([a-z_]+)'", known.group(1)) == [c for c in CATEGORIES if c != "unknown"]
    failed = re.search(r"outcome IN \(([^)]*)\)", macro)
    assert failed is not None and set(re.findall(r"'(\w+)'", failed.group(1))) == FAILED_OUTCOMES


def test_every_outcome_and_failure_mode_the_sql_names_is_the_contracts() -> None:
    for path in SQL.glob("*.sql"):
        text = path.read_text()
        for outcome in re.findall(r"outcome = '(\w+)'", text):
            assert outcome == ACCEPTED, path.name
        for mode in re.findall(r"failure_mode = '(\w+)'", text):
            assert mode in FAILURE_MODES, path.name


def test_the_decoder_gives_the_input_reasons_but_late_event() -> None:
    assert (*REASONS, LATE_EVENT) == INPUT_REASONS

