"""``memdiag serve``: the live view of the DuckDB file, in a browser."""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket

from rich.markup import escape

from memdiag.cli.common import err, settings_of, whole_number

#: what the `serve` extra installs
SERVE_EXTRA = ("starlette", "uvicorn")


def cmd_serve(args: argparse.Namespace) -> int:
    from memdiag.analytics.queries import parse_duration

    missing = [m for m in SERVE_EXTRA if importlib.util.find_spec(m) is None]
    if missing:
        err.print(
            f"[red]error:[/red] memdiag serve needs {', '.join(missing)}, which this "
            "install leaves out: pip install 'memdiag\\[serve]'"
        )
        return 2
    from memdiag.serve.app import create_app, is_loopback

    settings = settings_of(args)
    token = settings.serve_token
    loopback = is_loopback(args.host)
    if not loopback and not token:
        err.print(
            f"[red]error:[/red] memdiag serve binds {escape(args.host)}, which is not a "
            "loopback address: anyone who reaches it would read your diagnostics. Set "
            "MEMDIAG_SERVE_TOKEN to a long random secret (e.g. `export MEMDIAG_SERVE_TOKEN=$("
            "python -c 'import secrets; print(secrets.token_urlsafe(32))')`) and share the "
            "link with ?token=..., or bind 127.0.0.1 (the default)."
        )
        return 2
    try:
        refresh = parse_duration(args.refresh, "--refresh")
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        return 2
    if args.policy:
        from memdiag.analytics.gate import PolicyError, load_policy

        try:
            load_policy(args.policy)
        except (PolicyError, OSError) as exc:
            err.print(f"[red]error:[/red] --policy {escape(args.policy)}: {escape(str(exc))}")
            return 2
    host = f"[{args.host}]" if ":" in args.host else args.host
    where = f"http://{host}:{args.port}/"
    taken = _cannot_listen(args.host, args.port)
    if taken:
        err.print(f"[red]error:[/red] cannot listen on {escape(where)}: {escape(taken)}. Is "
                  "memdiag serve running there already? Pick another with --port.")  # fmt: skip
        return 2
    import uvicorn

    if args.nice:
        os.nice(args.nice)  # a reader: on a shared machine, the pipeline goes first
    db = settings.duckdb_path
    app = create_app(db, token=token, loopback=loopback, policy=args.policy, refresh=refresh,
                     stream_window=settings.followup_window_seconds)  # fmt: skip
    err.print(
        f"memdiag serve: {escape(db)} at [bold]{where}[/bold]"
        + (" (token required: append ?token=... once)" if token else "")
        + " · Ctrl-C stops it"
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=2,
        access_log=args.log_level == "debug",
    )
    return 0


def _cannot_listen(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on (taken, not this machine's), or None; asked
    before the server starts, which would say it in a log line after its banner."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return str(exc)
    # every address the name gives, as asyncio's create_server (uvicorn's) binds them all
    for family, kind, proto, _, address in dict.fromkeys(infos):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio does
            try:
                probe.bind(address)
            except OSError as exc:
                return exc.strerror or str(exc)
    return None


def add_serve(add: object) -> None:
    """The `serve` command's parser."""
    p = add(  # type: ignore[operator]
        "serve",
        "a live view of the DuckDB file in your browser: status, sessions, memories, agents, runs",
        "Serves the live, read-only view of the DuckDB file: the overview (/, with ?org=,\n"
        "?project= and ?since= kept in the URL), each session (/sessions/ID), memory\n"
        "(/memories/ID, ?agent= for a recall memory), agent (/agents/ID), the benchmark runs\n"
        "with compare and gate (/runs) and the dead letters (/dead-letters); /healthz for\n"
        "probes. Pages update by themselves when the sink writes (pause them with the\n"
        "button). It reads a snapshot of the file, so it never makes the sink wait.\n\n"
        "It binds 127.0.0.1 by default. Any other address needs MEMDIAG_SERVE_TOKEN: every\n"
        "request must then carry it (Authorization: Bearer T, or ?token=T once, then a\n"
        "cookie). MEMDIAG_SERVE_URL (where people reach it) makes alerts, status and explain\n"
        "print links to its pages.",
    )
    p.add_argument("--db", metavar="PATH", help="DuckDB file (default MEMDIAG_DUCKDB_PATH)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; another needs MEMDIAG_SERVE_TOKEN)",
    )
    p.add_argument(
        "--port", type=whole_number(1, 65535, "a port"), default=8765, help="port (default 8765)"
    )
    p.add_argument(
        "--policy",
        metavar="FILE",
        help="the gate policy the runs page judges by (default: the bundled one)",
    )
    p.add_argument(
        "--refresh",
        default="1s",
        metavar="DURATION",
        help="take a new snapshot of the file at most this often (default 1s)",
    )
    p.add_argument(
        "--nice",
        type=int,
        default=10,
        metavar="N",
        help="run at this lower CPU priority (default 10; 0: as started), so that on a "
        "machine it shares with the worker and the sink, they go first",
    )
    p.add_argument(
        "--log-level",
        default="warning",
        choices=("critical", "error", "warning", "info", "debug"),
        help="the server's log level (default warning; debug logs each request)",
    )
    p.set_defaults(func=cmd_serve)
