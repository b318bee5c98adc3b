"""`memdiag broker` as a developer runs it (#36, item 5): a subprocess that prints the line
to export, takes events on memdiag's topics, and stops cleanly on SIGTERM; a taken port is
a clear error."""

from __future__ import annotations

import asyncio
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from memdiag.broker import free_port
from memdiag.client import Publisher
from memdiag.kafka import topic_partitions
from memdiag.settings import Settings

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXPORT = re.compile(r"^export MEMDIAG_BROKER=(kafka://(127\.0\.0\.1:(\d+)))$")


def clean_env(**more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMDIAG_")}
    return {**env, **more}


def broker(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "memdiag.cli", "broker", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )


def first_line(proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The first line of its stdout, or fail with what it said, without hanging."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        _, stderr = proc.communicate(timeout=10)
        pytest.fail(f"memdiag broker printed no export line: {stderr}")
    return line.rstrip("\n")


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def events_on(settings: Settings, session_ids: set[str]) -> list[dict[str, Any]]:
    """Every event of these sessions on the events topic, read from its start (a message is
    one event or a batch: a JSON array)."""
    consumer = AIOKafkaConsumer(
        settings.topics.events,
        bootstrap_servers=settings.bootstrap_servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    found: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    value = orjson.loads(record.value)
                    for event in value if isinstance(value, list) else [value]:
                        assert record.key == event["session_id"].encode()
                        found.append(event)
            if {e["session_id"] for e in found} >= session_ids:
                break
    finally:
        await consumer.stop()
    return [e for e in found if e["session_id"] in session_ids]


async def topics_of(settings: Settings) -> dict[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers)
    await admin.start()
    try:
        names = [n for n in await admin.list_topics() if n.startswith(settings.topic_prefix)]
        described = await admin.describe_topics(names)
        return {d["topic"]: len(d["partitions"]) for d in described}
    finally:
        await admin.close()


def readme_runtime() -> str:
    """The runtime of README's "Developing a runtime against memdiag", as it is written."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Developing a runtime against memdiag", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found, "no runtime in the README's section"
    return found.group(1)


def test_the_broker_takes_events_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    with broker("--port", str(port)) as proc:
        try:
            line = first_line(proc)
            match = EXPORT.match(line)
            assert match and int(match.group(3)) == port, line
            settings = Settings.from_env({}, broker=match.group(1))

            # memdiag's topics, with the partitions the worker wants
            assert asyncio.run(topics_of(settings)) == topic_partitions(settings)

            # one event through memdiag's client, read back from the events topic
            event = {
                "kind": "search",
                "event_id": "e-broker-1",
                "ts": datetime.now(UTC).isoformat(),
                "session_id": "s-broker",
                "query": "auth token",
                "result_ids": ["obs_7"],
            }
            with Publisher(match.group(2)) as publisher:
                publisher.publish(event)
            assert asyncio.run(events_on(settings, {"s-broker"})) == [event]

            # the README's runtime, run as written with the export line's broker
            (tmp_path / "runtime.py").write_text(readme_runtime())
            done = subprocess.run(
                [sys.executable, "runtime.py"],
                cwd=tmp_path,
                env=clean_env(MEMDIAG_BROKER=match.group(1)),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            published = asyncio.run(events_on(settings, {"dev-1"}))
            assert [e["kind"] for e in published] == ["injection", "response", "session_outcome"]
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        try:
            _, stderr = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail("memdiag broker did not stop within 15 s of SIGTERM")
    assert proc.returncode == 0, stderr
    assert "in memory only" in stderr and "stopped" in stderr
    assert not listening(port), "the broker still listens after memdiag broker exited"


def test_a_taken_port_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with broker("--port", str(port)) as proc:
            stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 2, stderr
    assert stdout == ""  # no export line for a broker that is not there
    assert f"port {port} on 127.0.0.1 is taken" in stderr
    assert f"--port {port + 1}" in stderr


def test_a_wildcard_host_is_refused_before_anything_starts() -> None:
    with broker("--host", "0.0.0.0", "--port", "0") as proc:  # noqa: S104
        stdout, stderr = proc.communicate(timeout=30)
    assert (proc.returncode, stdout) == (2, "")
    assert "listens everywhere" in stderr and "127.0.0.1" in stderr
