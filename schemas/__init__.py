"""Event contracts: one JSON Schema (2020-12) file per input event kind, plus Python models.

The schema files are the contract for producers in any language. :func:`load_schema`
reads one; :mod:`memdiag.schemas.decode` compiles each once and validates every message at the edge.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

SESSION_KINDS = ("search", "injection", "response", "session_outcome")
JUDGEMENT_KINDS = ("judgement",)
#: the recall pipeline's events, on ``memdiag.memory`` keyed by ``agent_id``
MEMORY_KINDS = ("memory_written", "memory_indexed", "recall_probe", "ambient_context")
EVENT_KINDS = SESSION_KINDS + JUDGEMENT_KINDS + MEMORY_KINDS


@cache
def load_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema of one event kind (or of another document memdiag defines)."""
    text = resources.files(__name__).joinpath(f"{kind}.schema.json").read_text("utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema
