"""memdiag.events (the TypedDicts a producer's type checker reads) agrees with the JSON
Schemas, which are the contract: the same events, the same fields, the same required ones,
nested objects included."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import pytest

from memdiag import events
from memdiag.schemas import JUDGEMENT_KINDS, MEMORY_KINDS, SESSION_KINDS
from memdiag.schemas.models import EDGE_FIELD_SPELLINGS

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def _typed_dicts() -> dict[str, Any]:
    """kind -> its TypedDict, from the union ``events.Event``."""
    found = {}
    for td in get_args(events.Event):
        (kind,) = get_args(get_type_hints(td)["kind"])
        found[kind] = td
    return found


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref:
        assert ref.startswith("#/$defs/"), ref
        return _resolve(schema, schema["$defs"][ref.split("/")[-1]])
    return node


def _compare(schema: dict[str, Any], node: dict[str, Any], td: Any, where: str) -> None:
    node = _resolve(schema, node)
    props = node.get("properties", {})
    hints = get_type_hints(td)
    if td is events.EdgeKey:  # the canonical spellings; each required in one spelling or another
        required = set()
        for group in node["allOf"]:
            (canonical,) = {o["required"][0] for o in group["anyOf"]} & set(EDGE_FIELD_SPELLINGS)
            required.add(canonical)
        props = {k: v for k, v in props.items() if k in EDGE_FIELD_SPELLINGS}
    else:
        required = set(node.get("required", []))
    assert set(hints) == set(props), f"{where}: {set(hints) ^ set(props)}"
    assert set(td.__required_keys__) == required, where
    for name, hint in hints.items():
        prop = _resolve(schema, props[name])
        inner = hint
        if get_origin(inner) is list:
            assert prop.get("type") == "array", f"{where}.{name}"
            (inner,) = get_args(inner)
            prop = _resolve(schema, prop.get("items", {}))
        if typing.is_typeddict(inner):
            _compare(schema, prop, inner, f"{where}.{name}")


def test_every_event_kind_has_its_typed_dict() -> None:
    inputs = set(SESSION_KINDS) | set(JUDGEMENT_KINDS) | set(MEMORY_KINDS)
    assert set(_typed_dicts()) == inputs
    for kind in inputs:
        assert (SCHEMAS / f"{kind}.schema.json").exists(), kind


@pytest.mark.parametrize("kind", sorted(_typed_dicts()))
def test_the_typed_dict_has_the_schemas_fields_and_required_ones(kind: str) -> None:
    schema = json.loads((SCHEMAS / f"{kind}.schema.json").read_text())
    _compare(schema, schema, _typed_dicts()[kind], kind)
