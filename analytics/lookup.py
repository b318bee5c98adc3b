"""Unknown ids, said the same way everywhere: "no such org 'acme'", with the closest known ids
and how many there are.

Every question that takes an id (a session, an observation, an agent, an org, a project, a
run) checks it here before it answers, so an unknown one is an error (exit 1, a 404 page,
``{"error": ...}`` under ``--json``), never an empty table that reads as "nothing wrong".
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import duckdb

from memdiag.analytics.db import schema_missing, sql

#: what each kind of id is called in a sentence, and the SQL that lists them
#: (``analytics/sql/ids_KIND.sql``)
KINDS = {
    "org": "org",
    "project": "project",
    "agent": "agent",
    "memory_agent": "agent with memory events",
    "observation": "memory",
    "recall_memory": "memory of the recall pipeline",
    "session": "session",
    "run": "run",
    "run_group": "run group",
}

#: how many close ids an unknown one is offered
CLOSEST = 5


class NotFound(LookupError):
    """An id that is not in the DuckDB file. ``kind`` and ``id`` name it, ``closest`` the
    known ids nearest to it (of ``known`` in all); the message says all of it."""

    def __init__(
        self,
        message: str,
        kind: str | None = None,
        id: str | None = None,
        closest: list[str] | tuple[str, ...] = (),
        known: int | None = None,
        agent: str | None = None,
    ):
        super().__init__(message)
        self.kind = kind
        self.id = id
        self.closest = list(closest)
        self.known = known
        self.agent = agent  # the agent an id is of (memory ids are an agent's own)

    def as_dict(self) -> dict[str, Any]:
        """The error as ``--json`` prints it and the 404 page reads it."""
        return {
            "error": "not_found",
            "message": str(self),
            "kind": self.kind,
            "id": self.id,
            "closest": self.closest,
            "known": self.known,
            **({"agent": self.agent} if self.agent else {}),
        }


class UnknownRun(NotFound):
    """No judgement of that run (or condition): the message lists what there is."""


class NeedsCondition(UnknownRun):
    """The run has several conditions and none was chosen: a usage error."""


class SameSides(NeedsCondition):
    """Both sides of a comparison are one run and condition, or share runs under one
    condition: its answers would be compared with themselves (a usage error)."""


def lookup(con: duckdb.DuckDBPyConnection, kind: str, value: str) -> tuple[bool, int, list[str]]:
    """Whether ``value`` is a known id of ``kind``; when it is not, how many ids of that kind
    there are and the closest of them (most similar first): a known id costs one filtered
    look, only an unknown one the ranking of them all."""
    ids = sql("ids_" + kind)  # kind: a key of KINDS
    try:
        hit = con.execute(
            f"WITH ids AS ({ids}) SELECT EXISTS (SELECT 1 FROM ids WHERE id = $id)",  # noqa: S608 - a constant's SQL
            {"id": value},
        ).fetchone()
        if hit is not None and hit[0]:
            return True, 0, []
        row = con.execute(
            f"WITH ids AS ({ids}) {sql('lookup')}", {"id": value, "n": CLOSEST}
        ).fetchone()
    except duckdb.CatalogException as exc:
        raise schema_missing(con, exc) from exc
    _, known, closest = row if row is not None else (False, 0, [])
    return False, int(known or 0), list(closest or [])


def not_found(kind: str, value: str, known: int, closest: list[str]) -> NotFound:
    """The error for an unknown ``value`` of ``kind``: the closest ids, and how many there are."""
    name = KINDS[kind]
    if not known:
        message = f"no such {name} {value!r}: this DuckDB file has none"
    else:
        shown = ", ".join(closest)
        of = f"{len(closest)} of {known:,}" if known > len(closest) else f"all {known:,}"
        message = f"no such {name} {value!r}; the closest known ({of}): {shown}"
    return NotFound(message, kind=kind, id=value, closest=closest, known=known)


def ensure_known(con: duckdb.DuckDBPyConnection, kind: str, value: str | None) -> None:
    """Raise :class:`NotFound` unless ``value`` (when given) is a known id of ``kind``."""
    if value is None:
        return
    found, known, closest = lookup(con, kind, value)
    if not found:
        raise not_found(kind, value, known, closest)


def data_span(con: duckdb.DuckDBPyConnection) -> tuple[datetime | None, datetime | None]:
    """The event time the file's sessions, searches and verdicts span (first, last)."""
    row = con.execute(sql("data_span")).fetchone()
    return (None, None) if row is None else (row[0], row[1])
