"""Opening the DuckDB file, for the sink (read-write) and for everyone else (read-only).

DuckDB lets one process hold a file for writing and no other process open it meanwhile,
not even read-only. The sink therefore holds the file only while it flushes a batch (a
few milliseconds to a few hundred), and closes it in between. Readers (``memdiag status``,
``memdiag query``, an analyst's ``duckdb -readonly``) open it between flushes; both sides
retry briefly when they meet the other's lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb

log = logging.getLogger("memdiag.db")

#: after this long waiting on another process's lock, a writer says so (once a wait)
LOCK_WARN_SECONDS = 3.0


class DatabaseError(RuntimeError):
    """The DuckDB file cannot be used; the message says what to do."""


def schema_missing(con: duckdb.DuckDBPyConnection, exc: Exception) -> DatabaseError:
    """The error for a file without part of memdiag's schema: an older memdiag's (which the
    sink upgrades), or one memdiag never wrote (no table of its own at all)."""
    first = str(exc).splitlines()[0]
    try:
        ours = con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name IN "
            "('searches', 'session_diagnostics', 'dead_letters', 'judgements')"
        ).fetchone()
    except duckdb.Error:
        ours = None
    if ours is not None and ours[0] == 0:
        return DatabaseError(
            f"this DuckDB file holds none of memdiag's tables ({first}): point --db at the "
            "file memdiag's sink writes (MEMDIAG_DUCKDB_PATH), or `memdiag run` into it"
        )
    return DatabaseError(
        f"this DuckDB file lacks part of memdiag's schema ({first}); it was written by an "
        "older memdiag: start `memdiag sink` on it once to upgrade it"
    )


@cache
def sql(name: str) -> str:
    """A statement from ``analytics/sql/NAME.sql``."""
    return resources.files(__package__).joinpath("sql", f"{name}.sql").read_text("utf-8")


def _is_lock_error(exc: Exception) -> bool:
    """DuckDB's own words for another process holding the file (not any "lock" in a path)."""
    text = str(exc)
    return "Could not set lock on file" in text or "Conflicting lock is held" in text


#: The storage version memdiag creates DuckDB files in (MEMDIAG_DUCKDB_STORAGE_VERSION):
#: the oldest that the DuckDB clients analysts use (1.4 and later: the CLI, notebooks,
#: DBeaver) read. DuckDB 2.0 writes version 2.0 by default, which no 1.x client opens.
STORAGE_VERSION = "v1.4.0"


def _lock_holder(exc: Exception) -> str:
    """DuckDB's words for who holds the lock ("... held in /usr/bin/duckdb (PID 4242)")."""
    text = str(exc)
    if " held in " in text:
        return " (" + text.split(" held in ", 1)[1].split(")", 1)[0] + ")"
    return ""


def lock_warning(path: str, read_only: bool, waited: float, exc: Exception) -> str:
    """What a process waiting on another's lock of ``path`` says, once."""
    if read_only:
        holder = _lock_holder(exc)
        return f"waiting {waited:.0f}s for the memdiag sink to finish writing {path}{holder}"
    return (
        f"waiting {waited:.0f}s for another process to let go of {path}{_lock_holder(exc)}: "
        "DuckDB lets one process write a file or others read it, never both. Until it lets go, "
        "nothing new reaches DuckDB (the sink keeps its batch and retries; no row is lost). "
        "Close the DuckDB client that holds it open, or have it open and close the file per "
        "query; `memdiag serve` reads a snapshot and never holds the file"
    )


def connect(
    path: str | Path,
    read_only: bool = False,
    timeout: float = 30.0,
    storage_version: str = STORAGE_VERSION,
    warn: Callable[[str], None] | None = None,
) -> duckdb.DuckDBPyConnection:
    """Open ``path``, waiting up to ``timeout`` seconds for another process's lock. A file
    created here is written in ``storage_version`` (``latest``: this DuckDB's own); an
    existing file keeps the version it has. A wait past :data:`LOCK_WARN_SECONDS` is said
    once, through ``warn`` (the log's warning by default)."""
    path = str(path)
    if not path:  # DuckDB would open an in-memory database, gone with the process
        raise DatabaseError("no DuckDB file given: pass --db PATH or set MEMDIAG_DUCKDB_PATH")
    if read_only and path != ":memory:" and not Path(path).exists():
        raise DatabaseError(
            f"no DuckDB file at {path}: run `memdiag run --input FILE` or start "
            "`memdiag sink`, or pass --db PATH"
        )
    start = time.monotonic()
    deadline = start + timeout
    delay = 0.01
    warned = False
    # A table the file lacks is a CatalogException, never a Python variable of that name
    # (DuckDB's replacement scans: a missing view `pipeline_health` found the function).
    config: dict[str, Any] = {"python_enable_replacements": False}
    if not read_only and storage_version != "latest":
        config["storage_compatibility_version"] = storage_version
    not_a_database = DatabaseError(
        f"{path} is not a DuckDB database file (memdiag's is written by `memdiag run`, "
        "`memdiag demo` or `memdiag sink`; events go to `memdiag run --input`): check --db "
        "or MEMDIAG_DUCKDB_PATH"
    )
    while True:
        try:
            con = duckdb.connect(path, read_only=read_only, config=config)
        except duckdb.CatalogException as exc:
            # a path DuckDB takes for another kind of file (a .json, a .jsonl: it would read
            # it as a table of an in-memory database, which read-only cannot launch)
            raise not_a_database from exc
        except duckdb.IOException as exc:
            if "not a valid DuckDB database file" in str(exc):
                raise DatabaseError(
                    f"{path} is not a valid DuckDB database file (memdiag's is written by "
                    "`memdiag run`, `memdiag demo` or `memdiag sink`): check --db or "
                    "MEMDIAG_DUCKDB_PATH"
                ) from exc
            now = time.monotonic()
            if not _is_lock_error(exc) or now > deadline:
                if _is_lock_error(exc):
                    raise DatabaseError(
                        f"{path} stayed locked by another process for {timeout:.0f}s "
                        f"(a DuckDB client holding it open?{_lock_holder(exc)}): close it and "
                        "retry"
                    ) from exc
                raise
            if not warned and now - start >= LOCK_WARN_SECONDS:
                warned = True
                (warn or log.warning)(lock_warning(path, read_only, now - start, exc))
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
            continue
        if not path.startswith(":memory:") and _in_memory(con):
            # the same for writing: DuckDB launched an in-memory database over the file (its
            # tables would vanish with the process, and nothing memdiag wrote would be kept)
            con.close()
            raise not_a_database
        return con


def _in_memory(con: duckdb.DuckDBPyConnection) -> bool:
    """The connection's database has no file (a path DuckDB took for a file to read)."""
    row = con.execute(
        "SELECT path IS NULL FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchone()
    return bool(row and row[0])


def storage_version(con: duckdb.DuckDBPyConnection) -> str | None:
    """The storage version of the connection's main database file, e.g. ``v1.4.0+``."""
    row = con.execute(
        "SELECT tags['storage_version'] FROM duckdb_databases() "
        "WHERE database_name = current_database()"
    ).fetchone()
    return None if row is None else row[0]


def _rekey(con: duckdb.DuckDBPyConnection, table: str, key: tuple[str, ...]) -> None:
    """Give an existing ``table`` the primary key ``key``, if it has another: DuckDB cannot
    change a key in place, so the table is copied under it (its NOT NULL constraints and
    column defaults kept) and takes the old one's place. Nothing if the table does not
    exist yet or has the key."""
    found = con.execute(
        "SELECT constraint_column_names FROM duckdb_constraints() "
        "WHERE table_name = ? AND constraint_type = 'PRIMARY KEY'",
        [table],
    ).fetchone()
    if found is None or tuple(found[0]) == key:
        return
    not_null = [
        cols[0]
        for (cols,) in con.execute(
            "SELECT constraint_column_names FROM duckdb_constraints() "
            "WHERE table_name = ? AND constraint_type = 'NOT NULL'",
            [table],
        ).fetchall()
    ]
    defaults = con.execute(
        "SELECT column_name, column_default FROM duckdb_columns() "
        "WHERE table_name = ? AND column_default IS NOT NULL",
        [table],
    ).fetchall()
    log.info("%s: keying it by %s (a file from an older memdiag)", table, ", ".join(key))
    new = f"{table}__rekeyed"
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(f"CREATE TABLE {new} AS SELECT * FROM {table}")  # noqa: S608 - our tables
        for column in not_null:
            con.execute(f'ALTER TABLE {new} ALTER COLUMN "{column}" SET NOT NULL')
        for column, default in defaults:
            con.execute(f'ALTER TABLE {new} ALTER COLUMN "{column}" SET DEFAULT {default}')
        con.execute(f"ALTER TABLE {new} ADD PRIMARY KEY ({', '.join(key)})")
        con.execute(f"DROP TABLE {table}")
        con.execute(f"ALTER TABLE {new} RENAME TO {table}")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


#: A dead letter's session, as the sink writes ``dead_letters.session_id``: what its payload
#: names, else its key on the events topic (a keyed producer keys by session; another topic's
#: key is a run or an agent); NULL where neither says
DEAD_LETTER_SESSION = (
    "COALESCE(TRY(json_extract_string(payload, '$.session_id')), "
    "CASE WHEN ends_with(topic, 'events') THEN key END)"
)


def init_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create (or upgrade) memdiag's schema; idempotent."""
    key = con.execute(
        "SELECT constraint_column_names FROM duckdb_constraints() "
        "WHERE table_name = 'observation_weight_history' AND constraint_type = 'PRIMARY KEY'"
    ).fetchone()
    if key is not None and len(key[0]) == 3:  # keyed by outcome event too: upgrade it
        con.execute(sql("migrate_weight_history"))
    old_probes = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'recall_probes'"
    ).fetchone()
    if old_probes and old_probes[0]:  # a file from before miss_reason: the view takes the name
        con.execute("DROP VIEW IF EXISTS pipeline_health")
        con.execute("ALTER TABLE recall_probes RENAME TO recall_probe_events")
    # Files from before event ids were scoped to their session, run or agent
    _rekey(con, "searches", ("session_id", "event_id"))
    _rekey(con, "judgement_artifacts", ("run_id", "event_id"))
    _rekey(con, "recall_probe_events", ("agent_id", "event_id"))
    _rekey(con, "ambient_contexts", ("agent_id", "event_id"))
    # A file from before dead_letters.session_id: the column added and filled once, as the
    # sink fills it
    old_dead = con.execute(
        "SELECT count(*) FROM duckdb_tables() t WHERE table_name = 'dead_letters' AND NOT EXISTS "
        "(SELECT 1 FROM duckdb_columns() c WHERE c.table_name = 'dead_letters' "
        "AND c.column_name = 'session_id' AND c.database_name = t.database_name) "
        "AND database_name = current_database()"
    ).fetchone()
    if old_dead and old_dead[0]:
        con.execute("ALTER TABLE dead_letters ADD COLUMN session_id VARCHAR")
        con.execute(f"UPDATE dead_letters SET session_id = {DEAD_LETTER_SESSION}")  # noqa: S608 - a constant
    con.execute(sql("schema"))
    # A file from before observation_outcome_days: fill it once from the sessions.
    empty = con.execute("SELECT count(*) = 0 FROM observation_outcome_days").fetchone()
    if empty and empty[0]:
        has_sessions = con.execute("SELECT count(*) > 0 FROM session_diagnostics").fetchone()
        if has_sessions and has_sessions[0]:
            con.execute(sql("rebuild_observation_outcome_days"))
