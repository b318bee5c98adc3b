"""One vocabulary: the names the stages and the SQL share are memdiag.contract's, spelled
the same everywhere they must be spelled out (SQL cannot import them)."""

from __future__ import annotations

import re
from pathlib import Path

from memdiag.contract import (
    ACCEPTED,
    CATEGORIES,
    FAILED_OUTCOMES,
    FAILURE_MODES,
    INPUT_REASONS,
    LATE_EVENT,
    REUSED_EVENT_ID,
)
from memdiag.schemas.decode import REASONS

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
    outcomes, modes = [], []
    for path in SQL.glob("*.sql"):
        text = path.read_text()
        outcomes += re.findall(r"outcome = '(\w+)'", text)
        modes += re.findall(r"failure_mode = '(\w+)'", text)
    assert outcomes and set(outcomes) == {ACCEPTED}
    assert sorted(set(modes)) == sorted(FAILURE_MODES)


def test_the_decoder_gives_the_input_reasons_but_the_session_stages() -> None:
    assert (*REASONS, LATE_EVENT, REUSED_EVENT_ID) == INPUT_REASONS


def test_the_counter_schema_names_every_counter() -> None:
    from memdiag.contract import COUNTER_HELP
    from memdiag.schemas import load_schema

    names = load_schema("counter")["$defs"]["name"]["enum"]
    assert sorted(names) == sorted(COUNTER_HELP)
