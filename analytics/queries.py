"""The analyst's questions (``memdiag query ...``), answered from DuckDB.

Each function takes an open connection and returns plain data (lists of dicts), so the
command line prints it as a table or as JSON and tests check it directly. The SQL lives in
``analytics/sql/``; values are bound as parameters, never formatted into the text.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import duckdb

from memdiag.analytics.db import DEAD_LETTER_SESSION, DatabaseError, schema_missing, sql

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
#: the longest ``parse_duration`` takes: ten years
MAX_DURATION_SECONDS = 3650 * 86_400.0


def parse_since(value: str | None, now: datetime | None = None) -> datetime | None:
    """``--since``: an RFC 3339 / ISO date or date-time (UTC if no offset), or a duration
    back from now (``90m``, ``24h``, ``7d``, ``2w``)."""
    if value is None or value == "":
        return None
    match = _RELATIVE.match(value)
    if match:
        amount, unit = float(match.group(1)), match.group(2)
        if amount * _SECONDS[unit] > MAX_DURATION_SECONDS:  # before a timedelta overflows
            raise ValueError(
                f"--since {value!r}: at most ten years back (3650d); leave it out for everything"
            )
        return (now or datetime.now(UTC)) - timedelta(**{_UNITS[unit]: amount})
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"--since {value!r}: give a date or date-time (2026-11-21, "
            "2026-11-21T09:30:00Z) or a duration back from now (30m, 24h, 7d)"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def parse_duration(value: str, flag: str = "--window") -> float:
    """A duration (``90m``, ``24h``, ``7d``, ``2w``, ``30s``) in seconds, above zero."""
    match = _RELATIVE.match(value)
    seconds = 0.0
    if match:
        try:
            seconds = timedelta(**{_UNITS[match.group(2)]: float(match.group(1))}).total_seconds()
        except OverflowError:
            seconds = float("inf")
    if not 0 < seconds <= MAX_DURATION_SECONDS:
        raise ValueError(
            f"{flag} {value!r}: give a duration above zero and at most ten years (30m, 24h, 7d, 2w)"
        )
    return seconds


#: Columns added to a table after files were written without them: (table, column, type,
#: the value its older rows have). A reader opens files read-only and cannot upgrade them (the
#: sink does, on its next start), so until then it reads the column as the sink's upgrade
#: fills it: NULL (unknown), or what every older row was (a probe before ``query_source`` was
#: made from the memory's name, contract section 9).
ADDED_COLUMNS = (
    ("searches", "disjoint_new_query", "BOOLEAN", "NULL"),
    ("recall_probe_events", "query_source", "VARCHAR", "'name'"),
    # the views an older sink stored over that table, before the column (same value)
    ("recall_probes", "query_source", "VARCHAR", "'name'"),
    ("recall_trend_points", "query_source", "VARCHAR", "'name'"),
    ("recall_by_memory_count", "task_probed", "BIGINT", "0"),
    ("recall_by_memory_count", "task_hits", "BIGINT", "0"),
    ("recall_by_memory_count", "task_recall_rate", "DOUBLE", "NULL"),
    ("judgements", "label_status", "VARCHAR", "NULL"),
    ("judgements", "split", "VARCHAR", "NULL"),
    # every verdict before the semantic rule was the keyword rule's (contract section 3)
    ("retrieval_feedback", "similarity", "DOUBLE", "NULL"),
    ("retrieval_feedback", "detector", "VARCHAR", "'keyword'"),
    # what the sink's upgrade fills it with
    ("dead_letters", "session_id", "VARCHAR", DEAD_LETTER_SESSION),
)


#: Columns added to a table macro's result: (macro, ((column, type, older rows' value), ...)).
#: An older file's stored macro lacks them (it had only name probes: no task probe counted).
ADDED_MACRO_COLUMNS = (
    ("recall_trend", (("task_probed", "BIGINT", "0"), ("task_hits", "BIGINT", "0"),
                      ("task_recall_rate", "DOUBLE", "NULL"))),
)  # fmt: skip
#: ``FROM table``, and the alias that follows it on its line if any (``FROM retrieval_feedback
#: f``): the replacement keeps it, and a longer name that starts with the table's is not the
#: table. memdiag's SQL writes its keywords in capitals: a lowercase "from" is prose.
_FROM = {
    table: re.compile(
        rf"\bFROM {table}\b(?:[ \t]+(?:AS[ \t]+)?(?!(?:WHERE|JOIN|LEFT|RIGHT|INNER|FULL|CROSS|"
        r"NATURAL|POSITIONAL|ASOF|ANTI|SEMI|ON|USING|GROUP|ORDER|HAVING|WINDOW|QUALIFY|LIMIT|"
        r"OFFSET|UNION|EXCEPT|INTERSECT|SELECT|TABLESAMPLE|USING|PIVOT|UNPIVOT|AND|OR)\b)"
        r"([A-Za-z_]\w*))?"
    )
    for table, _, _, _ in ADDED_COLUMNS
}
_MACRO_CALL = {name: re.compile(rf"FROM ({name}\([^)]*\))") for name, _ in ADDED_MACRO_COLUMNS}


def _aliased(inner: str, table: str) -> Callable[[re.Match[str]], str]:
    """``FROM table [alias]`` read as ``FROM (inner) AS alias`` (the table's name without one)."""
    return lambda m: f"FROM ({inner}) AS {m.group(1) or table}"


def upgraded(con: duckdb.DuckDBPyConnection, text: str) -> str:
    """``text`` reading an added column as its older rows' value from a file that predates
    it."""
    for name, columns in ADDED_MACRO_COLUMNS:
        call = _MACRO_CALL[name].search(text)
        if call is None or not any(c in text for c, _, _ in columns):
            continue
        found = con.execute(
            "SELECT any_value(macro_definition) FROM duckdb_functions() WHERE function_name = $n "
            "AND database_name = current_database()",
            {"n": name},
        ).fetchone()
        if found and found[0] and columns[0][0] not in found[0]:
            added = ", ".join(f"CAST({value} AS {kind}) AS {c}" for c, kind, value in columns)
            inner = f"SELECT *, {added} FROM {call.group(1)}"  # noqa: S608 - constants
            text = text.replace(call.group(0), f"FROM ({inner}) AS {name}")
    for table, column, kind, value in ADDED_COLUMNS:
        if column in text and _FROM[table].search(text):
            found = con.execute(
                "SELECT count(*) FROM duckdb_columns() WHERE table_name = $t "
                "AND column_name = $c AND database_name = current_database()",
                {"t": table, "c": column},
            ).fetchone()
            if not found or not found[0]:
                inner = f"SELECT *, CAST({value} AS {kind}) AS {column} FROM {table}"  # noqa: S608 - names from ADDED_COLUMNS, a constant
                text = _FROM[table].sub(_aliased(inner, table), text)
    return text


def rows(con: duckdb.DuckDBPyConnection, name: str, **params: Any) -> list[dict[str, Any]]:
    """``analytics/sql/NAME.sql`` with ``params`` bound; each row as a dict."""
    try:
        cur = con.execute(upgraded(con, sql(name)), params)
    except (duckdb.CatalogException, duckdb.InvalidInputException, duckdb.BinderException) as exc:
        # a missing table, or (on a caller's own connection, where DuckDB looks for a Python
        # variable of a missing table's name) one that found something else of that name, or
        # a view an older sink stored without a column this version reads
        if isinstance(exc, duckdb.InvalidInputException) and "replacement scan" not in str(exc):
            raise
        if isinstance(exc, duckdb.BinderException) and "Referenced column" not in str(exc):
            raise
        raise schema_missing(con, exc) from exc
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


class Rows(list[dict[str, Any]]):
    """Rows of a list a ``LIMIT`` may have cut, and how many there are in all (``total``):
    what a shortened list says ("10 of 218"). JSON prints the rows."""

    def __init__(self, items: list[dict[str, Any]], total: int | None = None):
        super().__init__(items)
        self.total = len(items) if total is None else total

    @property
    def cut(self) -> bool:
        return self.total > len(self)


def counted(con: duckdb.DuckDBPyConnection, name: str, **params: Any) -> Rows:
    """``rows`` of a statement whose rows carry ``total`` (``count(*) OVER ()`` before its
    ``LIMIT``), that column taken off into :attr:`Rows.total`."""
    found = rows(con, name, **params)
    if not found and params.get("limit") == 0:  # none asked for: how many there are, still
        first = rows(con, name, **{**params, "limit": 1})
        total = first[0]["total"] if first else 0
    else:
        total = found[0]["total"] if found else 0
    for r in found:
        del r["total"]
    return Rows(found, total)


def observation_stats(con: duckdb.DuckDBPyConnection, observation_id: str) -> dict[str, Any]:
    """One observation's verdict counts, weight and strength, and whether it is misleading or
    dead weight; :class:`~memdiag.analytics.lookup.NotFound` for an id no session injected."""
    from memdiag.analytics.lookup import ensure_known
    from memdiag.analytics.status import UNUSED_MIN_INJECTIONS

    ensure_known(con, "observation", observation_id)
    row = rows(con, "observation_stats", observation_id=observation_id)[0]
    judged = row["used"] + row["ignored"]
    row["used_share"] = row["used"] / judged if judged else None
    # dead weight as `query unused-memories` says it by default: judged often, used never
    row["dead_weight"] = judged >= UNUSED_MIN_INJECTIONS and row["used"] == 0
    return row


def observation_history(
    con: duckdb.DuckDBPyConnection, observation_id: str, limit: int = 100
) -> Rows:
    """One observation's verdicts, the newest first, each with its session's outcome and the
    rule that made it (``memdiag.analytics.explain.verdict_rule``)."""
    from memdiag.analytics.explain import verdict_rule
    from memdiag.analytics.lookup import ensure_known

    ensure_known(con, "observation", observation_id)
    found = counted(con, "observation_history", observation_id=observation_id, limit=limit)
    for r in found:
        r["rule"] = verdict_rule(r)
    return found


def observation_steps(
    con: duckdb.DuckDBPyConnection, observation_id: str, points: int = 400, newest: int = 50
) -> dict[str, Any]:
    """One observation's weight and strength over time, for a chart: at most about ``points``
    of each kind of step, spread evenly (first and last kept), in their order; the weight's
    newest ``newest`` steps whole (its sessions, with their outcome and category), and how
    many steps of each there are (``weight_total``, ``strength_total``)."""
    weight = rows(con, "observation_weight_steps", observation_id=observation_id, points=points,
                  newest=newest)  # fmt: skip
    strength = rows(con, "observation_strength_steps", observation_id=observation_id,
                    points=points)  # fmt: skip
    return {
        "weight": weight,
        "strength": strength,
        "weight_total": weight[0]["total"] if weight else 0,
        "strength_total": strength[0]["total"] if strength else 0,
    }


def recall_agents_of(con: duckdb.DuckDBPyConnection, memory_id: str) -> list[str]:
    """The agents whose recall pipeline has a memory of this id."""
    return [r["agent_id"] for r in rows(con, "observation_recall_agents", memory_id=memory_id)]


def failed_sessions(
    con: duckdb.DuckDBPyConnection,
    org: str | None = None,
    project: str | None = None,
    since: datetime | None = None,
    limit: int = 10,
) -> Rows:
    """The newest failed sessions, optionally of one org or project, since a time."""
    return counted(con, "latest_failed_sessions", org_id=org, project_id=project, since=since,
                   limit=limit)  # fmt: skip


def dead_letters(
    con: duckdb.DuckDBPyConnection, reason: str | None = None, samples: int = 3
) -> list[dict[str, Any]]:
    """Dead letters by reason (the most first), each with its newest ``samples`` and what to
    do about it (``memdiag.contract.DEAD_LETTER_ADVICE``)."""
    from memdiag.contract import DEAD_LETTER_ADVICE

    found = rows(con, "dead_letter_samples", reason=reason, samples=samples)
    for r in found:
        r["advice"] = DEAD_LETTER_ADVICE.get(r["reason"], DEAD_LETTER_ADVICE[""])
        r["samples"] = r["samples"] or []
        for s in r["samples"]:
            s["source"] = dead_letter_source(s)
    return found


def dead_letter_source(s: dict[str, Any]) -> str:
    """Where a dead letter's input was: ``topic [partition] @offset``, or, for one made
    where no offset is known (by the sink, or by ``memdiag publish`` for a line the broker
    refused), the topic and who made it."""
    if s.get("partition") is None:
        return f"{s['topic']} (no offset: the sink's or publish's)"
    return f"{s['topic']} [{s['partition']}] @{s['offset']}"


def agent_breaks(con: duckdb.DuckDBPyConnection, agent: str) -> list[dict[str, Any]]:
    """When one agent's pipeline was down (``pipeline_break_spans``), the newest first, with
    the sessions that ended in each span."""
    return rows(con, "agent_break_spans", agent_id=agent)


def unindexed_memories(con: duckdb.DuckDBPyConnection, agent: str, limit: int = 100) -> Rows:
    """One agent's unindexed memories, the oldest first, each marked ``unreachable`` when the
    latest ambient context does not name it either."""
    return counted(con, "unindexed_memories", agent_id=agent, limit=limit)


def sessions_during_breaks(con: duckdb.DuckDBPyConnection, agent: str, limit: int = 50) -> Rows:
    """One agent's sessions whose outcome fell while its pipeline was down, the newest first."""
    return counted(con, "sessions_during_breaks", agent_id=agent, limit=limit)


def runs(con: duckdb.DuckDBPyConnection, limit: int = 50) -> Rows:
    """Benchmark runs, newest first, with their size, accuracy and provenance."""
    return counted(con, "runs", limit=limit)


def unused_memories(
    con: duckdb.DuckDBPyConnection,
    min_injections: int = 5,
    since: datetime | None = None,
    limit: int = 100,
) -> Rows:
    """Memories judged in at least ``min_injections`` turns and used in none (contract
    section 10): the candidates to prune or demote, with their strength."""
    return counted(con, "unused_memories", min_injections=min_injections, since=since,
                   limit=limit)  # fmt: skip


def failure_distribution(
    con: duckdb.DuckDBPyConnection,
    org: str | None = None,
    project: str | None = None,
    since: datetime | None = None,
) -> list[dict[str, Any]]:
    """Failed sessions per category, every category listed, each with its share of them."""
    found = rows(con, "failure_distribution", org_id=org, project_id=project, since=since)
    total = sum(r["sessions"] for r in found)
    for r in found:
        r["share"] = r["sessions"] / total if total else None
    return found


def misleading(
    con: duckdb.DuckDBPyConnection,
    org: str | None = None,
    since: datetime | None = None,
    limit: int = 100,
) -> Rows:
    """Observations in >= 3 failed sessions and no accepted one, the most failures first, with
    their weight and the failed session each was last in."""
    return counted(con, "misleading", org_id=org, since=since, limit=limit)


def misleading_graph(
    con: duckdb.DuckDBPyConnection,
    org: str | None = None,
    since: datetime | None = None,
    limit: int = 100,
) -> Rows:
    """Graph entities and edges in >= 3 failed sessions and no accepted one, with their
    weight now (``misleading_graph_entities`` / ``misleading_graph_edges``)."""
    return counted(con, "misleading_graph", org_id=org, since=since, limit=limit)


def pipeline_health(
    con: duckdb.DuckDBPyConnection, agent: str | None = None
) -> list[dict[str, Any]]:
    """The recall pipeline per agent (the ``pipeline_health`` view), broken agents first;
    each with the ids of its first :data:`UNINDEXED_IDS` unindexed memories, the oldest
    first (``unindexed`` says how many there are), and its task probes: their recall
    (``recall_by_query_source``) and the recall paper's query-formulation failure: over the
    memories probed both ways, the name probes' recall minus the task probes'
    (``query_formulation_gap``; None when no memory was probed both ways) and how many their
    name found and a task did not (``found_by_name_only``)."""
    found = rows(con, "pipeline_health", agent_id=agent)
    ids = {r["agent_id"]: r["memory_ids"]
           for r in rows(con, "unindexed_ids", agent_id=agent, limit=UNINDEXED_IDS)}  # fmt: skip
    task = {r["agent_id"]: r for r in recall_by_query_source(con, agent)
            if r["query_source"] == TASK_PROBE}  # fmt: skip
    gaps = {r["agent_id"]: r for r in rows(con, "query_formulation_gap", agent_id=agent)}
    for r in found:
        r["unindexed_memory_ids"] = ids.get(r["agent_id"], [])
        t = task.get(r["agent_id"])
        r["task_probed"] = 0 if t is None else t["probed"]
        r["task_hits"] = 0 if t is None else t["hits"]
        r["task_recall_rate"] = None if t is None else t["recall_rate"]
        gap = gaps.get(r["agent_id"])
        r["probed_both_ways"] = 0 if gap is None else gap["probed_both_ways"]
        r["found_by_name_only"] = 0 if gap is None else gap["found_by_name_only"]
        r["query_formulation_gap"] = None if gap is None else gap["gap"]
    return found


#: ``query_source`` of a probe made from a task the memory should serve (contract section 9)
TASK_PROBE = "task"


def recall_by_query_source(
    con: duckdb.DuckDBPyConnection, agent: str | None = None
) -> list[dict[str, Any]]:
    """Recall per agent and query source (the ``recall_by_query_source`` view); none from a
    file its sink has not upgraded yet (all its probes were name probes: SRR says it)."""
    try:
        return rows(con, "recall_by_query_source", agent_id=agent)
    except DatabaseError:
        return []


#: the unindexed memories pipeline health names per agent
UNINDEXED_IDS = 10


def pipeline_coverage_over_time(
    con: duckdb.DuckDBPyConnection, buckets: int = 24
) -> list[dict[str, Any]]:
    """Pipeline coverage per agent and bucket of ``written_at`` (the report's chart)."""
    return rows(con, "pipeline_coverage_over_time", buckets=buckets)


#: ``query recall-trend --by``: the time grains, in seconds
TREND_GRAINS = {"hour": 3600, "day": 86_400, "week": 7 * 86_400}
#: where the trend's time buckets are aligned (the ``recall_trend`` macro's): a Monday, 00:00
#: UTC, so days are UTC days and weeks start on Monday
TREND_ORIGIN = datetime(1970, 1, 5, tzinfo=UTC)


def recall_trend(
    con: duckdb.DuckDBPyConnection, by: str = "day", agent: str | None = None
) -> list[dict[str, Any]]:
    """SRR and ATR per agent and bucket: of time (``by`` a grain of :data:`TREND_GRAINS`,
    UTC) or of the agent's memory count (``by="memory-count"``)."""
    if by == "memory-count":
        return rows(con, "recall_by_memory_count", agent_id=agent)
    return rows(con, "recall_trend", bucket_seconds=TREND_GRAINS[by], agent_id=agent)
