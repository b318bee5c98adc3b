"""The one runner of the analyst's questions: it opens the DuckDB file read-only, asks the
question, closes the file, and prints the answer as JSON or for the terminal; errors come out
the same way for every question, and the exit status is the question's.

Exits: 0 answered; 1 an error memdiag explains (an unknown id, with the closest known ones;
an unreadable file); 2 a usage error. Under ``--json`` an error is a JSON object on stdout
too (``{"error": ..., "message": ...}``), so a script reads every exit the same way.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.markup import escape

from memdiag.analytics.db import DatabaseError
from memdiag.analytics.lookup import NeedsCondition, NotFound, data_span
from memdiag.analytics.queries import Rows
from memdiag.cli.common import (
    REPORT_EXTRA,
    err,
    open_db,
    print_json,
    require_report_extra,
    settings_of,
)
from memdiag.cli.render import BEFORE, print_answer
from memdiag.settings import ConfigError
from memdiag.views.questions import NoSessions, Question, Usage


def _error(exc: Exception) -> tuple[int, dict[str, Any]]:
    """An error's exit status and its JSON."""
    if isinstance(exc, NeedsCondition):  # the arguments must say which condition
        return 2, {"error": "usage", "message": str(exc)}
    if isinstance(exc, NotFound):
        return 1, exc.as_dict()
    if isinstance(exc, NoSessions):
        return 1, {"error": "no_data", "message": str(exc)}
    if isinstance(exc, Usage):
        return 2, {"error": "usage", "message": str(exc)}
    if isinstance(exc, ConfigError):
        return 2, {"error": "configuration", "message": f"configuration error: {exc}"}
    if isinstance(exc, ModuleNotFoundError):
        if exc.name not in REPORT_EXTRA:
            raise exc
        return 1, {
            "error": "missing_extra",
            "message": f"this command needs {exc.name}, which "
            "the worker's install leaves out: pip install 'memdiag[report]'",
        }
    return 1, {"error": "database", "message": str(exc)}


def _fail(args: argparse.Namespace, status: int, error: dict[str, Any]) -> int:
    """An error, the same for every question: one line on stderr, or JSON on stdout."""
    if getattr(args, "json", False):
        print_json({"status": status, **error})
    else:
        err.print(f"[red]error:[/red] {escape(error['message'])}", soft_wrap=True)
    return status


def answer(q: Question, args: argparse.Namespace) -> int:
    """Ask ``q`` with the command line's ``args``; print the answer; its exit status."""
    con = None
    span = None
    try:
        if q.needs_report:
            require_report_extra()
        settings = settings_of(args)
        values = q.values(vars(args))
        context = {
            "db": settings.duckdb_path,
            "stream_window": settings.followup_window_seconds,
            "similarity_threshold": settings.similarity_threshold,
            "connect": lambda: open_db(args),
        }
        if q.needs_db is None or q.needs_db(values):
            con = open_db(args)
        result = q.answer(con, context, **values)
        if values.get("since") is not None and q.empty is not None and q.empty(result):
            span = data_span(con) if con is not None else None
    except (NotFound, NoSessions, Usage, DatabaseError, ConfigError, ModuleNotFoundError) as exc:
        status, error = _error(exc)
        status = q.error_exit if q.error_exit is not None else status
        if q.on_error is None:
            return _fail(args, status, error)
        result = q.on_error(error["message"])  # the question's own answer to it
    finally:
        if con is not None:
            con.close()
    before = BEFORE.get(q.name)
    if before is not None:
        result = before(result, args)
    print_answer(q.name, result, args)
    if span is not None:
        first, last = span
        err.print(
            f"nothing since {escape(str(args.since))}: the data spans "
            + (f"{first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC" if first else "no events")
        )
    if getattr(args, "json", False) and isinstance(result, Rows) and result.cut:
        err.print(f"{len(result):,} of {result.total:,} rows (--limit N for more)")
    return q.status(result) if q.status is not None else 0
