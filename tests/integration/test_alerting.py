"""A followup spike through the real broker: on the counter topic, and as an alert that
fires and then resolves (``memdiag alert`` as a user runs it)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tests.integration.conftest import Pipeline

pytestmark = pytest.mark.integration


def traffic() -> list[dict]:
    """20 minutes, 6 agent searches a minute; minutes 5-7 are all followups (new query,
    new results, 5 s apart), the rest retries of one query (never followups).

    Sessions on several partitions: the worker catches them up interleaved, so the rollups
    arrive out of event-time order; the alert still replays the backlog minute by minute."""
    events = []
    for minute in range(20):
        spike = 5 <= minute < 8
        for i in range(6):
            second = i * 5
            events.append(
                {
                    "kind": "search",
                    "event_id": f"m{minute}-{i}",
                    "ts": f"2026-11-21T10:{minute:02d}:{second:02d}Z",
                    "session_id": f"ses-{minute % 4}",  # several partitions, interleaved
                    "query": f"q-{minute}-{i}" if spike else "the same question",
                    "result_ids": [f"o-{minute}-{i}"] if spike else ["o-same"],
                }
            )
    return events


class Hook(BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Hook.received.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_followup_spike_fires_an_alert_that_then_resolves(pipeline: Pipeline) -> None:
    pipeline.start()
    events = traffic()
    pipeline.publish([(e["session_id"].encode(), e) for e in events])
    pipeline.drain()

    # in status: the rate, and the spike in the rate over time
    from memdiag.analytics.db import connect
    from memdiag.analytics.status import followup_over_time, status

    con = connect(pipeline.settings.duckdb_path, read_only=True)
    try:
        st = status(con)
        series = followup_over_time(con, buckets=20)
    finally:
        con.close()
    assert (st["followup"]["agent_searches"], st["followup"]["followups"]) == (120, 15)
    peaks = [p["bucket"].strftime("%H:%M") for p in series if p["rate"] > 0.5]
    assert peaks and all("10:04" <= t <= "10:08" for t in peaks), peaks  # buckets of ~58 s

    rollups = [
        v
        for k, v in pipeline.consume(pipeline.settings.topics.counters)
        if v["type"] == "rollup" and v["name"].endswith("followup_within_window_total")
    ]
    last = {}
    for r in rollups:
        last[r["minute"]] = r["value"]
    # each spike minute's first search is 35 s after the one before: outside the window
    assert {m[11:16]: v for m, v in last.items()} == {"10:05": 5, "10:06": 5, "10:07": 5}

    server = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "memdiag.cli",
                "alert",
                "--rule",
                "followup_rate > 0.3 for 5m",
                "--from-beginning",
                "--stop-after-idle",
                "3",
                "--json",
                "--quiet",
                "--webhook",
                f"http://127.0.0.1:{server.server_port}/hook",
            ],
            env={**pipeline.settings.as_env(), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 0, result.stderr
    alerts = [json.loads(line) for line in result.stdout.splitlines()]
    assert [a["state"] for a in alerts] == ["firing", "resolved"]
    assert alerts[0]["value"] > 0.3 and alerts[1]["value"] <= 0.3
    assert alerts[0]["at"] < alerts[1]["at"]
    assert [a["state"] for a in Hook.received] == ["firing", "resolved"]
