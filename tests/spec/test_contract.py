"""The project's own reference (docs/, tests/data) says what the product contract says:
tables, views, macros, topics, counters, commands and the example events."""

from __future__ import annotations

import re

from memdiag.contract import COUNTER_HELP
from tests.spec import CONTRACT, ROOT, SHARED

TEXT = CONTRACT.read_text() if CONTRACT.is_file() else ""
DOCS = ROOT / "docs"

#: What the contract names for work still open, with its issue; each lands with its tests
#: and leaves this list (a test below fails while a built name is still here).
NOT_BUILT_YET: dict[str, str] = {}


def signatures(text: str) -> dict[str, list[str]]:
    return {
        name: [c.strip().strip('"').split(":=")[0].strip() for c in cols.split(",")]
        for name, cols in re.findall(r"`([a-z_]+)\(([^)]*)\)`", text)
    }


def test_the_docs_have_every_column_the_contract_names() -> None:
    """Tables (and the pipeline's view) may have more columns than the contract names, in
    its order; the two views of section 5 exactly its columns."""
    contract = {
        **signatures(TEXT.split("## 5.", 1)[1].split("\n## ", 1)[0]),
        **signatures(TEXT.split("## 9.", 1)[1].split("\n## ", 1)[0]),  # recall pipeline
    }
    docs = signatures((DOCS / "tables.md").read_text())
    assert contract, "no table in section 5 of the contract"
    for name, cols in contract.items():
        if name in NOT_BUILT_YET:
            continue
        assert name in docs, f"{name} is in the contract, not in docs/tables.md"
        cols = [c for c in cols if f"{name}.{c}" not in NOT_BUILT_YET]
        if name in ("followup_rate", "observation_feedback_stats"):
            assert docs[name] == cols, name
        else:
            assert [c for c in docs[name] if c in cols] == cols, name


def test_the_docs_list_the_contract_topics_with_their_keys() -> None:
    row = re.compile(r"^\| `(memdiag\.[a-z]+)` \| ([^|]+) \|", re.M)
    contract = dict(row.findall(TEXT.split("## 1.", 1)[1].split("\n## ", 1)[0]))
    docs = dict(row.findall((DOCS / "topics.md").read_text()))
    assert contract and {t: docs.get(t) for t in contract} == contract


def test_every_contract_counter_is_defined() -> None:
    names = set(re.findall(r"`((?:agentmemory|memdiag)\.[a-z_.]+_total)(?:\{[^}]*\})?`", TEXT))
    assert len(names) >= 8, names
    missing = names - set(COUNTER_HELP) - set(NOT_BUILT_YET)
    assert not missing


def test_every_contract_command_is_documented() -> None:
    commands = set(re.findall(r"`(memdiag [a-z-]+(?: [a-z-]+)?)", TEXT))
    docs = (DOCS / "commands.md").read_text()
    missing = [
        c
        for c in sorted(commands)
        if f"`{c}`" not in docs
        and f"`{c.rsplit(' ', 1)[0]}`" not in docs
        and c not in NOT_BUILT_YET
    ]
    assert not missing


def test_the_example_events_are_the_contract_examples() -> None:
    copy = ROOT / "tests" / "data" / "contract_example.jsonl"
    assert copy.read_text() == (SHARED / "examples" / "events.jsonl").read_text()


def test_what_is_not_built_yet_is_named_by_the_contract_and_absent_from_the_docs() -> None:
    """The list shrinks as work lands: a name the docs already carry is built, and leaves it."""
    docs = "\n".join(p.read_text() for p in DOCS.glob("*.md"))
    for name in NOT_BUILT_YET:
        word = name.rsplit(".", 1)[-1].split(" ")[-1]
        assert word in TEXT, f"{name}: the contract does not name {word}"
        if name.startswith("memdiag "):
            assert f"`{name}`" not in docs, f"{name} is documented: take it off NOT_BUILT_YET"
        else:
            assert f"`{word}`" not in docs and f"{word}(" not in docs, (
                f"{name} is in docs/: take it off NOT_BUILT_YET"
            )
