"""The DuckDB sink: records from ``diagnostics`` and ``deadletter`` in, upserted rows out.

``add`` buffers a record, ``flush`` writes everything buffered in one transaction, ``write``
does both for a batch. Each table is written through Arrow and one ``INSERT ... SELECT``
with ``ON CONFLICT`` on its natural key, so a redelivered or replayed record changes
nothing. The file is opened per flush (see :mod:`memdiag.analytics.db`).
"""

from __future__ import annotations

import logging
import shlex
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from memdiag.analytics.db import STORAGE_VERSION, connect, init_schema, sql, storage_version
from memdiag.contract import REUSED_EVENT_ID
from memdiag.schemas.deadletters import dead_letter_id, digest

log = logging.getLogger("memdiag.sink")


#: What a bad record makes DuckDB or Arrow raise: the sink writes the batch record by
#: record and dead-letters the ones refused. Anything else (an I/O error, a full disk, a
#: corrupt or invalidated database) is about the file: the batch is kept and retried.
DATA_ERRORS: tuple[type[BaseException], ...] = (
    duckdb.ConstraintException,
    duckdb.ConversionException,
    duckdb.InvalidInputException,
    duckdb.TypeMismatchException,
    duckdb.OutOfRangeException,
    pa.ArrowException,
    KeyError,
    TypeError,
    ValueError,
    OverflowError,  # an integer beyond its column (int64)
)


@dataclass(frozen=True, slots=True)
class TableSpec:
    """How one kind of record becomes rows of one table."""

    statement: str  # analytics/sql/<statement>.sql, reading from the registered `batch`
    key: tuple[str, ...]  # natural key: within a batch, the last record per key wins
    schema: pa.Schema
    json_columns: tuple[str, ...] = ()  # free-form JSON values, stored as JSON text
    #: analytics/sql/<retract>.sql: deletes the rows of the records marked ``retracted``
    #: (the last record of a key decides, as for upserts)
    retract: str | None = None
    #: for a table keyed by ``event_id``: how another event under an id taken is told from
    #: the same event again (:func:`_write_reusable`)
    reuse: Reuse | None = None


@dataclass(frozen=True)
class Reuse:
    """Rows keyed by the id of the event they come from (within its run or agent: the
    spec's ``key``), where two records under one key that differ in ``columns`` come from
    two events (the producer reused the id): the first taken stays, the other is
    dead-lettered as ``reused_event_id``."""

    #: the table that holds the rows taken (the statement may write others besides)
    table: str
    #: the input topic the events came from (without the prefix): the dead letter's topic
    topic: str
    #: the columns that tell two events apart (where both records carry a value: a row
    #: written by an older memdiag lacks the columns added since); None: every column (a
    #: row is a function of its event alone)
    columns: tuple[str, ...] | None = None
    #: the batch's columns as the table stores them (``(column, SQL type)``), to compare them
    casts: tuple[tuple[str, str], ...] = ()
    #: columns not compared: one added with a default (an older row holds the default, not
    #: what its event said)
    ignore: tuple[str, ...] = ()


_SEARCH = pa.schema(
    [
        ("event_id", pa.string()),
        ("session_id", pa.string()),
        ("ts", pa.string()),
        ("source", pa.string()),
        ("result_count", pa.int32()),
        ("evaluated", pa.bool_()),
        ("is_followup", pa.bool_()),
        ("prev_event_id", pa.string()),
        ("gap_seconds", pa.float64()),
        ("disjoint_new_query", pa.bool_()),
        ("agent_id", pa.string()),
        ("org_id", pa.string()),
        ("project_id", pa.string()),
        ("query", pa.string()),
        ("published_at", pa.string()),
    ]
)
_FEEDBACK = pa.schema(
    [
        ("session_id", pa.string()),
        ("turn_id", pa.string()),
        ("observation_id", pa.string()),
        ("signal", pa.string()),
        ("match_ratio", pa.float64()),
        ("keyword_count", pa.int32()),
        ("matched_count", pa.int32()),
        ("ts", pa.string()),
        ("agent_id", pa.string()),
        ("org_id", pa.string()),
        ("project_id", pa.string()),
        ("similarity", pa.float64()),
        ("detector", pa.string()),
    ]
)
_IDS = pa.list_(pa.string())
_SESSION_DIAGNOSTIC = pa.schema(
    [
        ("session_id", pa.string()),
        ("event_id", pa.string()),
        ("outcome", pa.string()),
        ("failure_category", pa.string()),
        ("failure_context", pa.string()),
        ("injected_observation_ids", _IDS),
        ("injected_graph_entity_ids", _IDS),
        (
            "injected_graph_edge_keys",
            pa.list_(
                pa.struct(
                    [
                        ("source_id", pa.string()),
                        ("target_id", pa.string()),
                        ("relationship", pa.string()),
                    ]
                )
            ),
        ),
        (
            "tool_call_summary",
            pa.list_(
                pa.struct([("tool", pa.string()), ("file", pa.string()), ("success", pa.bool_())])
            ),
        ),
        ("files_modified", _IDS),
        (
            "errors_encountered",
            pa.list_(
                pa.struct(
                    [("message", pa.string()), ("tool", pa.string()), ("recoverable", pa.bool_())]
                )
            ),
        ),
        ("helpful_observation_ids", _IDS),
        ("misleading_observation_ids", _IDS),
        ("ignored_observation_ids", _IDS),
        ("search_count", pa.int32()),
        ("followup_count", pa.int32()),
        ("ts", pa.string()),
        ("agent_id", pa.string()),
        ("org_id", pa.string()),
        ("project_id", pa.string()),
    ]
)
_OBSERVATION_WEIGHT = pa.schema(
    [
        ("observation_id", pa.string()),
        ("session_id", pa.string()),
        ("outcome_event_id", pa.string()),
        ("outcome", pa.string()),
        ("alpha", pa.float64()),
        ("previous_weight", pa.float64()),
        ("weight", pa.float64()),
        ("aggressive", pa.bool_()),
        ("misleading", pa.bool_()),
        ("failed_sessions", pa.int32()),
        ("accepted_sessions", pa.int32()),
        ("step", pa.int64()),
        ("ts", pa.string()),
        ("version", pa.int64()),
        ("current_weight", pa.float64()),
        ("current_step", pa.int64()),
        ("current_failed_sessions", pa.int32()),
        ("current_accepted_sessions", pa.int32()),
        ("current_misleading", pa.bool_()),
        ("updated_at", pa.string()),
    ]
)
_STRENGTH = pa.schema(
    [
        ("observation_id", pa.string()),
        ("session_id", pa.string()),
        ("turn_id", pa.string()),
        ("retracted", pa.bool_()),  # a step taken back: its history row goes
        ("signal", pa.string()),
        ("alpha", pa.float64()),
        ("previous_strength", pa.float64()),
        ("strength", pa.float64()),
        ("step", pa.int64()),
        ("ts", pa.string()),
        ("version", pa.int64()),
        ("current_strength", pa.float64()),
        ("current_step", pa.int64()),
        ("current_used_turns", pa.int64()),
        ("updated_at", pa.string()),
    ]
)
#: a graph entity's or edge's step: an observation's weight record, named by its key
_GRAPH_WEIGHT = pa.schema(
    [("id", pa.string()), ("graph_kind", pa.string()), ("graph_id", pa.string())]
    + [f for f in _OBSERVATION_WEIGHT if f.name != "observation_id"]
)
_JUDGEMENT = pa.schema(
    [
        ("run_id", pa.string()),
        ("question_id", pa.string()),
        ("condition", pa.string()),
        ("repeat_index", pa.int32()),
        ("judge_correct", pa.bool_()),
        ("failure_mode", pa.string()),
        ("gold_evidence_ids", _IDS),
        ("retrieved_context_ids", _IDS),
        ("gold_retrieved", pa.int32()),
        ("latency_ms", pa.float64()),
        ("tokens", pa.int64()),
        ("input_tokens", pa.int64()),
        ("output_tokens", pa.int64()),
        ("score", pa.float64()),
        ("duration_ms", pa.float64()),
        ("run_group_id", pa.string()),
        ("suite_id", pa.string()),
        ("suite_version", pa.string()),
        ("suite_checksum", pa.string()),
        ("fixture_checksum", pa.string()),
        ("config_fingerprint", pa.string()),
        ("git_head", pa.string()),
        ("service_version", pa.string()),
        ("label_status", pa.string()),
        ("split", pa.string()),
        ("event_id", pa.string()),
        ("ts", pa.string()),
    ]
)
_DEAD_LETTER = pa.schema(
    [
        ("dead_letter_id", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("batch_index", pa.int32()),
        ("key", pa.string()),
        ("reason", pa.string()),
        ("detail", pa.string()),
        ("payload", pa.string()),
        ("payload_bytes", pa.int64()),
        ("payload_truncated", pa.bool_()),
        ("ts", pa.string()),
    ]
)
_MEMORY_PIPELINE = pa.schema(
    [
        ("agent_id", pa.string()),
        ("memory_id", pa.string()),
        ("name", pa.string()),
        ("written_at", pa.string()),
        ("indexed_at", pa.string()),
        ("status", pa.string()),
        ("store", pa.string()),
        ("indexed_store", pa.string()),
        ("index_delay_seconds", pa.float64()),
        ("ever_unindexed", pa.bool_()),
        ("write_event_id", pa.string()),
        ("index_event_id", pa.string()),
    ]
)
_RECALL_PROBE = pa.schema(
    [
        ("event_id", pa.string()),
        ("agent_id", pa.string()),
        ("memory_id", pa.string()),
        ("hit", pa.bool_()),
        ("rank", pa.int32()),
        ("ts", pa.string()),
        ("score", pa.float64()),
        ("k", pa.int32()),
        ("threshold", pa.float64()),
        ("result_count", pa.int32()),
        ("top_ids", pa.list_(pa.string())),
        ("query_source", pa.string()),
    ]
)
_AMBIENT_CONTEXT = pa.schema(
    [
        ("event_id", pa.string()),
        ("agent_id", pa.string()),
        ("session_id", pa.string()),
        ("memory_ids", _IDS),
        ("ts", pa.string()),
    ]
)
_PIPELINE_AGENT = pa.schema(
    [
        ("agent_id", pa.string()),
        ("clock", pa.string()),
        ("last_indexed_at", pa.string()),
        ("ambient_at", pa.string()),
        ("ambient_session_id", pa.string()),
        ("ambient_memory_ids", _IDS),
        ("broken_since", pa.string()),
        ("deadline_seconds", pa.float64()),
    ]
)
_PIPELINE_BREAK = pa.schema(
    [
        ("agent_id", pa.string()),
        ("episode", pa.int32()),
        ("since", pa.string()),
        ("broken_at", pa.string()),
        ("recovered_at", pa.string()),
        ("oldest_memory_id", pa.string()),
        ("unindexed", pa.int32()),
    ]
)

#: record kind -> how it is written. A corrected record is the whole record again, so
#: within a batch the last one of each key wins and nothing depends on the order of tables.
_TS = (("ts", "TIMESTAMPTZ"),)

SPECS: dict[str, TableSpec] = {
    # keyed by session too: two sessions' searches under one id are two searches (the
    # session stage tells another event under a taken id within a session)
    "search": TableSpec("upsert_searches", ("session_id", "event_id"), _SEARCH),
    "retrieval_feedback": TableSpec(
        "upsert_retrieval_feedback",
        ("session_id", "turn_id", "observation_id"),
        _FEEDBACK,
        retract="delete_retrieval_feedback",
    ),
    "session_diagnostic": TableSpec(
        "upsert_session_diagnostics",
        ("session_id",),
        _SESSION_DIAGNOSTIC,
        json_columns=("failure_context",),
    ),
    "observation_weight": TableSpec(
        "upsert_observation_weights",
        ("observation_id", "session_id"),
        _OBSERVATION_WEIGHT,
    ),
    "strength": TableSpec(
        "upsert_observation_strength",
        ("observation_id", "session_id", "turn_id"),
        _STRENGTH,
    ),
    "graph_weight": TableSpec("upsert_graph_weights", ("id", "session_id"), _GRAPH_WEIGHT),
    # every judgement is an artifact (keyed by its event); the statement keeps, per answer,
    # the one that counts (the latest ts, ties by event_id) in `judgements`
    "judgement": TableSpec(
        "upsert_judgements",
        ("run_id", "event_id"),
        _JUDGEMENT,
        reuse=Reuse("judgement_artifacts", "judgements", casts=_TS),
    ),
    "memory_pipeline": TableSpec(
        "upsert_memory_pipeline", ("agent_id", "memory_id"), _MEMORY_PIPELINE
    ),
    "recall_probe": TableSpec(
        "upsert_recall_probes",
        ("agent_id", "event_id"),
        _RECALL_PROBE,
        reuse=Reuse("recall_probe_events", "memory", casts=_TS, ignore=("query_source",)),
    ),
    "ambient_context": TableSpec(
        "upsert_ambient_contexts",
        ("agent_id", "event_id"),
        _AMBIENT_CONTEXT,
        reuse=Reuse("ambient_contexts", "memory", casts=_TS),
    ),
    "pipeline_agent": TableSpec("upsert_pipeline_agents", ("agent_id",), _PIPELINE_AGENT),
    "pipeline_break": TableSpec("upsert_pipeline_breaks", ("agent_id", "episode"), _PIPELINE_BREAK),
    "pipeline_recovered": TableSpec(
        "upsert_pipeline_recoveries", ("agent_id", "episode"), _PIPELINE_BREAK
    ),
    "dead_letter": TableSpec("insert_dead_letters", ("dead_letter_id",), _DEAD_LETTER),
}


#: where an event_id is unique, by the key column that scopes it (the spec's key)
_SCOPES = {"run_id": "run", "agent_id": "agent"}


def _within(kind: str, record: dict[str, Any]) -> str:
    """Where the id was taken, as the table's key scopes it: " in run 'r1'"."""
    scoped = [f"{_SCOPES[c]} {record.get(c)!r}" for c in SPECS[kind].key if c in _SCOPES]
    return f" in {' and '.join(scoped)}" if scoped else ""


class DuckDBSink:
    def __init__(
        self,
        path: str | Path,
        lock_timeout: float = 60.0,
        storage_version: str = STORAGE_VERSION,
        topic_prefix: str = "memdiag.",
        payload_bytes: int = 64 * 1024,
    ):
        """``topic_prefix`` and ``payload_bytes`` (MEMDIAG_TOPIC_PREFIX,
        MEMDIAG_DEADLETTER_PAYLOAD_BYTES): for the dead letters the sink makes itself."""
        self.path = str(path)
        self.topic_prefix = topic_prefix
        self.payload_bytes = payload_bytes
        self.lock_timeout = lock_timeout
        self.storage_version = storage_version
        self._buffers: dict[str, list[dict[str, Any]]] = {kind: [] for kind in SPECS}
        self._pending = 0
        self.rows_written = 0
        self.rows_rejected = 0
        self.unknown_kinds: dict[str, int] = {}
        #: told, once a wait, when another process's lock keeps the file more than a few
        #: seconds (the log's warning when None)
        self.on_lock_wait: Callable[[str], None] | None = None
        #: the last flush: seconds in all, and of them waiting for the file (another process's
        #: lock): what `memdiag serve`'s benchmark compares with and without the view open
        self.last_flush_seconds = 0.0
        self.last_wait_seconds = 0.0

    def _connect(self) -> duckdb.DuckDBPyConnection:
        t0 = time.perf_counter()
        try:
            return self._open()
        finally:
            self.last_wait_seconds = time.perf_counter() - t0

    def _open(self) -> duckdb.DuckDBPyConnection:
        return connect(self.path, timeout=self.lock_timeout, storage_version=self.storage_version,
                       warn=self.on_lock_wait)  # fmt: skip

    def init(self) -> None:
        con = self._connect()
        try:
            init_schema(con)
            self._check_storage_version(con)
        finally:
            con.close()

    def _check_storage_version(self, con: Any) -> None:
        """A file made before memdiag chose its storage version (or by another tool) keeps
        its own: say so once, with how to get a file the 1.x clients open."""
        have = storage_version(con)
        want = self.storage_version
        if want == "latest" or have is None or _version(have) <= _version(want):
            return
        log.warning(
            "%s is in DuckDB storage version %s, which clients older than it cannot open "
            "(MEMDIAG_DUCKDB_STORAGE_VERSION=%s applies to new files). To convert it, stop the "
            "sink and run: %s ; then replace the file with %s",
            self.path, have, want, *conversion(self.path, want),
        )  # fmt: skip

    @property
    def pending(self) -> int:
        return self._pending

    def add(self, record: dict[str, Any]) -> None:
        buffer = self._buffers.get(record.get("kind", ""))
        if buffer is None:
            kind = str(record.get("kind"))
            if kind not in self.unknown_kinds:  # once a kind: a newer worker than this sink
                log.warning("the sink has no table for diagnostic kind %r and skips it: a "
                            "worker newer than the sink? Upgrade the sink first, then replay "
                            "memdiag.diagnostics to keep them", kind)  # fmt: skip
            self.unknown_kinds[kind] = self.unknown_kinds.get(kind, 0) + 1
            return
        buffer.append(record)
        self._pending += 1

    def write(self, records: Iterable[dict[str, Any]]) -> int:
        for record in records:
            self.add(record)
        return self.flush()

    def flush(self) -> int:
        """Write everything buffered in one transaction; on error nothing is written and
        the buffer is kept, so the caller may retry (and must not commit offsets)."""
        if not self._pending:
            return 0
        t0 = time.perf_counter()
        con = self._connect()
        try:
            con.execute("BEGIN TRANSACTION")
            written = 0
            reused: list[dict[str, Any]] = []
            for kind, spec in SPECS.items():
                records = self._buffers[kind]
                if records and spec.reuse:
                    n, taken = _write_reusable(con, spec, records)
                    written += n
                    reused += [self._reused(kind, r, fields) for r, fields in taken]
                elif records:
                    written += _write_table(con, spec, records)
            if reused:
                written += _write_table(con, SPECS["dead_letter"], reused)
            con.execute("COMMIT")
        except BaseException:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:
                pass
            raise
        finally:
            con.close()
        self._clear()
        self.rows_written += written
        self.last_flush_seconds = time.perf_counter() - t0
        return written

    def _reused(self, kind: str, record: dict[str, Any], fields: list[str]) -> dict[str, Any]:
        """The dead letter of a record under an ``event_id`` taken by another event (the
        one taken first stays): its payload is the record as the worker made it (what the
        event was, the source offset, are not known here)."""
        reuse = SPECS[kind].reuse
        topic = f"{self.topic_prefix}{reuse.topic if reuse else kind}"
        payload = orjson.dumps(record)
        # its identity: what tells the event apart (where only some columns do, a row sent
        # again with the others changed is the same reuse)
        names = _compared(SPECS[kind]) if reuse and reuse.columns else None
        what = orjson.dumps({n: record.get(n) for n in names}) if names else payload
        event_id = record.get("event_id")
        limit = self.payload_bytes
        return {
            "kind": "dead_letter",
            # the same reuse written again (a redelivery) is the same row
            "dead_letter_id": dead_letter_id(
                topic, self.topic_prefix, "event", event_id, digest(what)
            ),
            "topic": topic,
            "partition": None,
            "offset": None,
            "batch_index": None,
            "key": None,
            "reason": REUSED_EVENT_ID,
            "detail": f"event_id {event_id!r} was already taken{_within(kind, record)} by "
            f"another {kind}, which differs in {', '.join(fields)}; this one was not written "
            "(the one taken first stays). "
            "event_id is the idempotency key: give every distinct event its own. The payload "
            f"is the {kind} as the worker read it from its event",
            "payload": payload[:limit].decode("utf-8", "replace"),
            "payload_bytes": len(payload),
            "payload_truncated": len(payload) > limit,
            "ts": record.get("ts"),
        }

    def flush_isolating(self, reject: Callable[[dict[str, Any], str], dict[str, Any]]) -> int:
        """Write the buffer record by record, after :meth:`flush` failed on bad data.

        Each record gets its own transaction; one DuckDB (or Arrow) refuses becomes the
        dead-letter record ``reject(record, error)`` instead, so a single malformed record
        can neither stall the sink nor take good records down with it. Slow, and only
        used on that failure path.
        """
        con = self._connect()
        written = 0
        rejected: list[dict[str, Any]] = []
        reused: list[dict[str, Any]] = []
        try:
            for kind, spec in SPECS.items():
                for record in self._buffers[kind]:
                    con.execute("BEGIN TRANSACTION")
                    try:
                        if spec.reuse:
                            n, taken = _write_reusable(con, spec, [record])
                        else:
                            n, taken = _write_table(con, spec, [record]), []
                        con.execute("COMMIT")
                        written += n
                        reused += [self._reused(kind, r, fields) for r, fields in taken]
                    except DATA_ERRORS as exc:
                        con.execute("ROLLBACK")
                        rejected.append(reject(record, f"{type(exc).__name__}: {exc}"))
                    except BaseException:  # the file, not the record: nothing is cleared
                        try:
                            con.execute("ROLLBACK")
                        except duckdb.Error:
                            pass
                        raise
            if rejected or reused:
                con.execute("BEGIN TRANSACTION")
                written += _write_table(con, SPECS["dead_letter"], [*rejected, *reused])
                con.execute("COMMIT")
        finally:
            con.close()
        self._clear()
        self.rows_written += written
        self.rows_rejected += len(rejected)
        return written

    def _clear(self) -> None:
        for buffer in self._buffers.values():
            buffer.clear()
        self._pending = 0


def _write_reusable(
    con: duckdb.DuckDBPyConnection, spec: TableSpec, records: list[dict[str, Any]]
) -> tuple[int, list[tuple[dict[str, Any], list[str]]]]:
    """Write the records of a table keyed by event ids (:class:`Reuse`): the rows written,
    and the records of another event under a key taken (not written), each with the columns
    it differs in from the one taken: the row the table holds, else the batch's first
    record of that key."""
    names = _compared(spec)
    stored = _stored_differences(con, spec, names, records)
    taken: dict[Any, dict[str, Any]] = {}
    kept: list[dict[str, Any]] = []
    reused: list[tuple[dict[str, Any], list[str]]] = []
    for i, r in enumerate(records):
        if i in stored:  # the table holds its key
            differ = stored[i]
        else:
            first = taken.setdefault(tuple(r[c] for c in spec.key), r)
            differ = [n for n in names if _differ(r.get(n), first.get(n))]
        if differ:
            reused.append((r, differ))
        else:
            kept.append(r)
    return (_write_table(con, spec, kept) if kept else 0), reused


def _compared(spec: TableSpec) -> list[str]:
    """The columns that tell two events under one key apart (:class:`Reuse`)."""
    reuse = spec.reuse
    if reuse is None:
        raise ValueError(f"{spec.statement}: not a table keyed by event ids")
    return [
        n
        for n in (reuse.columns or spec.schema.names)
        if n not in spec.key and n not in reuse.ignore
    ]


def _stored_differences(
    con: duckdb.DuckDBPyConnection,
    spec: TableSpec,
    names: list[str],
    records: list[dict[str, Any]],
) -> dict[int, list[str]]:
    """For each record whose key the table holds: its index, and the columns of ``names``
    in which it differs from that row (none: the same event)."""
    reuse = spec.reuse
    if reuse is None:
        raise ValueError(f"{spec.statement}: not a table keyed by event ids")
    cast = dict(reuse.casts)

    def quoted(name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    def ours(name: str) -> str:
        return f"CAST(b.{quoted(name)} AS {cast[name]})" if name in cast else f"b.{quoted(name)}"

    columns = {name: [r.get(name) for r in records] for name in spec.schema.names}
    columns["__i"] = list(range(len(records)))
    batch = pa.Table.from_pydict(columns, schema=spec.schema.append(pa.field("__i", pa.int64())))
    checks = ", ".join(  # NULL <> x is NULL: a field one of them lacks is no difference
        f"CASE WHEN {ours(n)} <> s.{quoted(n)} THEN '{n}' END" for n in names
    )
    # the spec's own names, never input
    on = " AND ".join(f"s.{quoted(c)} = b.{quoted(c)}" for c in spec.key)
    found = f"list_filter([{checks}], lambda x: x IS NOT NULL)"
    query = f"SELECT b.__i, {found} FROM batch b JOIN {reuse.table} s ON {on}"  # noqa: S608
    con.register("batch", batch)
    try:
        return dict(con.execute(query).fetchall())
    finally:
        con.unregister("batch")


def _differ(a: Any, b: Any) -> bool:
    """Two values of a field, both carried, that differ (a row written by an older memdiag,
    or a record of a field it did not know, lacks the field: no difference)."""
    return a is not None and b is not None and a != b


def _write_table(
    con: duckdb.DuckDBPyConnection,
    spec: TableSpec,
    records: list[dict[str, Any]],
) -> int:
    # ON CONFLICT cannot touch one row twice in a statement: keep the last record per key
    # (the newest: records arrive in partition order, and a key never spans partitions).
    if len(spec.key) == 1:
        k = spec.key[0]
        latest = {r[k]: r for r in records}
    else:
        latest = {tuple(r[c] for c in spec.key): r for r in records}
    rows = list(latest.values())
    gone = [r for r in rows if r.get("retracted")] if spec.retract else []
    if gone and spec.retract is not None:
        rows = [r for r in rows if not r.get("retracted")]
        key_schema = pa.schema([spec.schema.field(c) for c in spec.key])
        keys = pa.Table.from_pydict({c: [r[c] for r in gone] for c in spec.key}, key_schema)
        con.register("batch", keys)
        try:
            con.execute(sql(spec.retract))
        finally:
            con.unregister("batch")
    if rows:
        columns = {name: [r.get(name) for r in rows] for name in spec.schema.names}
        for name in spec.json_columns:
            columns[name] = [None if v is None else orjson.dumps(v).decode() for v in columns[name]]
        batch = pa.Table.from_pydict(columns, schema=spec.schema)
        con.register("batch", batch)
        try:
            con.execute(sql(spec.statement))
        finally:
            con.unregister("batch")
    return len(rows) + len(gone)


def _version(text: str) -> tuple[int, ...]:
    """``v1.4.0+`` -> (1, 4, 0)."""
    return tuple(int(part) for part in text.strip("v+").split(".") if part.isdigit())


def conversion(path: str, version: str) -> tuple[str, str]:
    """A shell command that copies the DuckDB file at ``path`` into a new file beside it,
    written in storage version ``version``, and that new file's path."""
    source = Path(path).resolve()
    target = source.with_name(f"{source.stem}.{version}{source.suffix}")

    def literal(p: Path) -> str:
        return "'" + str(p).replace("'", "''") + "'"

    statement = (
        f"ATTACH {literal(target)} AS new (STORAGE_VERSION '{version}'); "
        f"ATTACH {literal(source)} AS old (READ_ONLY); COPY FROM DATABASE old TO new"
    )
    code = f"import duckdb; duckdb.connect().execute({statement!r})"
    return shlex.join([sys.executable, "-c", code]), str(target)
