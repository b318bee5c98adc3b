"""``memdiag broker``: the embedded broker `memdiag run` uses, kept running with memdiag's
topics, for developing a runtime against memdiag (README, "Developing a runtime against
memdiag")."""

from __future__ import annotations

import argparse
import asyncio
import errno
import ipaddress
import shlex
import signal
import socket
import sys
import threading
from typing import Any

from rich.markup import escape

from memdiag.cli.common import err, settings_of

#: Kafka's own port, and what MEMDIAG_BROKER means when it is unset
DEFAULT_PORT = 9092


def port_taken(host: str, port: int) -> bool:
    """Whether something already listens on ``host:port``. ``SO_REUSEADDR`` as Tansu binds,
    so a connection closed a moment ago (TIME_WAIT) does not count as taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _taken(host: str, port: int) -> int:
    err.print(
        f"[red]error:[/red] port {port} on {escape(host)} is taken (another Kafka broker, or "
        f"a `memdiag broker` still running?). Stop it, or start this one on another port: "
        f"memdiag broker --port {port + 1} (--port 0 takes any free port)."
    )
    return 2


def cmd_broker(args: argparse.Namespace) -> int:
    from memdiag.broker import BrokerError, EmbeddedBroker
    from memdiag.kafka import ensure_topics, topic_partitions

    host, port = args.host, args.port
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 - refused, not bound
        shown = escape(host) or '""'
        err.print(
            f"[red]error:[/red] --host {shown} listens everywhere, but a Kafka "
            "broker must also tell clients one address to come back to: give the address "
            "they reach this machine at (e.g. its LAN address), or 127.0.0.1 (the default)."
        )
        return 2
    if not 0 <= port <= 65535:
        err.print(f"[red]error:[/red] --port {port} is not a TCP port (0-65535)")
        return 2
    try:
        if port and port_taken(host, port):
            return _taken(host, port)
    except OSError as exc:
        err.print(f"[red]error:[/red] cannot listen on {escape(host)}:{port}: {exc.strerror}")
        return 2
    settings = settings_of(args)
    broker = EmbeddedBroker(port=port or None, host=host)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            broker.start()
        except BrokerError:
            if port and port_taken(host, port):  # taken between the check and the start
                return _taken(host, port)
            raise
        try:
            # the embedded broker is local and plaintext, whatever MEMDIAG_KAFKA_* say
            local = settings.with_(broker=broker.url, kafka_security_protocol="PLAINTEXT")
            asyncio.run(ensure_topics(local))
            _announce(broker.url, host, len(topic_partitions(local)), local.topic_prefix)
            while not stop.wait(0.5):
                code = broker.poll()
                if code is not None:
                    err.print(f"[red]error:[/red] the broker exited by itself (code {code})")
                    tail = broker.log_tail()
                    if tail:
                        err.print(escape(tail), soft_wrap=True)
                    return 1
        finally:
            broker.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    err.print("memdiag broker: stopped; its topics and events are gone")
    return 0


def _announce(url: str, host: str, topics: int, prefix: str) -> None:
    """The export line alone on stdout (a script reads it), the notes on stderr."""
    sys.stdout.write(f"export MEMDIAG_BROKER={shlex.quote(url)}\n")
    sys.stdout.flush()
    err.print(
        f"memdiag broker: Tansu at [bold]{url}[/bold], with memdiag's {topics} topics "
        f"({escape(prefix)}*). It keeps everything in memory only: its topics and events "
        "are lost when it stops. Ctrl-C stops it."
    )
    if not _is_loopback(host):
        err.print(
            f"[yellow]note:[/yellow] {escape(host)} is not a loopback address, and this broker "
            "has no authentication: anyone who reaches it reads and writes every topic."
        )
    err.print(
        "[dim]next, in other terminals with that export: memdiag worker · memdiag sink · "
        "your runtime publishing (memdiag.client.Publisher) · memdiag status · "
        "memdiag serve[/dim]"
    )


def add_broker(add: Any) -> None:
    """The `broker` command's parser."""
    p = add(
        "broker",
        "run a local Kafka broker with memdiag's topics, to develop a runtime against",
        "Starts the embedded broker (Tansu, the one `memdiag run` uses), creates memdiag's\n"
        "topics on it, prints the line to export, e.g.\n\n"
        "    export MEMDIAG_BROKER=kafka://127.0.0.1:9092\n\n"
        "and runs until Ctrl-C or SIGTERM, then stops the broker. Export that line in the\n"
        "terminals of `memdiag worker`, `memdiag sink`, your runtime (memdiag.client.Publisher\n"
        "reads it through Settings.from_env()) and `memdiag status`.\n\n"
        "It keeps everything in memory only: topics and events are lost when it stops. For a\n"
        "broker that keeps data, point MEMDIAG_BROKER at a Kafka of your own (docker/).\n"
        "A taken port is an error (exit 2) that says so; --port 0 takes any free port.\n"
        "There is no authentication: it binds 127.0.0.1 unless --host says otherwise.",
    )
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port to listen on (default {DEFAULT_PORT}, Kafka's; 0: any free port)",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on and advertise to clients (default 127.0.0.1; another "
        "exposes an unauthenticated broker)",
    )
    p.set_defaults(func=cmd_broker)
