"""What every command shares: the consoles, settings from the flags, progress, JSON."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from memdiag.settings import Settings

#: off a terminal (a pipe, a file, a CI log), the width when COLUMNS does not say: wide, so
#: that lines are not folded for a width nobody reads at; nothing is ever cut either way
PIPE_WIDTH = 200


def _width(stream: Any) -> int | None:
    if os.environ.get("COLUMNS") or (hasattr(stream, "isatty") and stream.isatty()):
        return None  # Rich's own: the terminal's, or COLUMNS
    return PIPE_WIDTH


# emoji=False: ids are users' text, and rich would turn "group:x:" into an emoji
out = Console(highlight=False, emoji=False, width=_width(sys.stdout))
err = Console(stderr=True, highlight=False, emoji=False, width=_width(sys.stderr))


#: What the `report` extra installs: the reports' charts and statistics only.
REPORT_EXTRA = frozenset({"numpy"})


def require_report_extra() -> None:
    """Fail before any work when the report extra is missing (``main`` says what to do)."""
    for name in sorted(REPORT_EXTRA):
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def whole_number(low: int, high: int | None = None, what: str = "a whole number") -> Any:
    """An argparse ``type``: a whole number from ``low`` to ``high`` (no bound: None)."""

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {value!r}") from None
        if n < low or (high is not None and n > high):
            bounds = f"at least {low}" if high is None else f"{what} is {low} to {high}"
            raise argparse.ArgumentTypeError(f"{bounds}, not {n}")
        return n

    return parse


def settings_of(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    if getattr(args, "db", None):
        overrides["duckdb_path"] = args.db
    return Settings.from_env(**overrides)


def notifier(args: argparse.Namespace) -> Any:
    def say(text: str) -> None:
        if not getattr(args, "quiet", False):
            err.print(f"[dim]·[/dim] {text}")

    return say


class FileProgress:
    """A progress bar over a file's bytes on stderr; silent with --quiet or off a terminal."""

    def __init__(self, args: argparse.Namespace, label: str):
        self._bar: Progress | None = None
        if not getattr(args, "quiet", False) and err.is_terminal:
            self._bar = Progress(
                TextColumn(f"[bold]{label}[/bold]"),
                BarColumn(),
                DownloadColumn(),
                TimeRemainingColumn(),
                console=err,
                transient=True,
            )
        self._task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None:
            return
        if self._task is None:
            self._task = self._bar.add_task("", total=total)
        self._bar.update(self._task, completed=done)

    def __enter__(self) -> FileProgress:
        if self._bar is not None:
            self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def json_default(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.astimezone(UTC).isoformat()
    return str(v)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=json_default) + "\n")


def open_db(args: argparse.Namespace) -> Any:
    from memdiag.analytics.db import connect

    return connect(settings_of(args).duckdb_path, read_only=True)
