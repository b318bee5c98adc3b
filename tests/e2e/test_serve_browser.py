"""``memdiag serve`` in a real browser (Debian's Chromium, driven by Playwright), while
``memdiag run`` writes the file in the background: a new failed session appears without a
reload, a paused page does not move while another tab follows, a closed row stays closed, the
window stays on what the reader scrolled to, the filters survive clicking down to a session
and a memory and back, the agent and runs pages open, and no page has a console error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import Console, browser
from tests.recall_scenario import indexed, probe, written
from tests.unit.test_serve import free_port
from tests.unit.test_sessions import session

pytestmark = pytest.mark.e2e
AGENT = "indexer-7"


def failed(sid: str, org: str, ts: str, memory: str = "obs_stale") -> list[dict[str, Any]]:
    events = session(sid, "rejected", [memory, "obs_fine"], ts=ts)
    for e in events:
        e["org_id"], e["agent_id"] = org, AGENT
    return events


def judged(run: str, i: int, correct: bool) -> dict[str, Any]:
    return {"kind": "judgement", "event_id": f"{run}-{i}", "ts": "2026-11-21T10:00:00Z",
            "run_id": run, "question_id": f"q{i}", "judge_correct": correct,
            "gold_evidence_ids": ["g"], "retrieved_context_ids": ["g"] if i % 3 else []}  # fmt: skip


def first_file() -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for i in range(8):
        org = "org_a" if i % 2 == 0 else "org_b"
        events += failed(f"ses-{i}", org, f"2026-11-21T09:{i:02d}:00Z")
        ok = session(f"ok-{i}", "accepted", ["obs_fine"], ts=f"2026-11-21T09:{i:02d}:30Z")
        for e in ok:
            e["org_id"] = org
        events += ok
    for n in range(4):  # an agent whose indexing stops halfway
        events.append(written(f"w{n}", n * 60, f"m{n}", AGENT, f"note-{n}.md"))
        if n < 2:
            events.append(indexed(f"i{n}", n * 60 + 2, f"m{n}", AGENT))
        events.append(probe(f"p{n}", 1000 + n, f"m{n}", [f"m{n}"], [0.9], AGENT))
    events += [judged("base", i, i % 2 == 0) for i in range(10)]
    events += [judged("cand", i, i % 3 != 1) for i in range(10)]
    return events


def write(path: Path, events: list[dict[str, Any]], extra: str = "") -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in events) + extra)
    return path


def memdiag_run(source: Path, db: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("MEMDIAG_BROKER", None)  # the embedded broker, as a newcomer runs it
    return subprocess.Popen(
        [sys.executable, "-m", "memdiag.cli", "run", "--input", str(source), "--db", str(db),
         "--quiet", "--append"],  # each file adds sessions of its own to the live one
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def finish(proc: subprocess.Popen[str]) -> None:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err


def until(page: Any, js: str, timeout: float = 30) -> None:
    """Wait until ``js`` holds on the page (polled from here: the page's CSP refuses the
    string evaluation Playwright's own wait_for_function uses, as it should)."""
    deadline = time.monotonic() + timeout
    while not page.evaluate(js):
        assert time.monotonic() < deadline, f"not within {timeout}s: {js}"
        time.sleep(0.1)


def health(base: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{base}/healthz", timeout=10) as r:  # noqa: S310 - loopback
        return dict(json.loads(r.read()))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path]]:
    d = tmp_path_factory.mktemp("browser")
    db = d / "live.duckdb"
    finish(memdiag_run(write(d / "first.jsonl", first_file(), extra="not json at all\n"), db))
    port = free_port()
    log = (d / "serve.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "memdiag.cli", "serve", "--db", str(db), "--port", str(port),
         "--refresh", "0.3s"],
        stdout=log, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if health(base)["state"] == "ready":
                    break
            except OSError:
                pass
            assert server.poll() is None, (d / "serve.log").read_text()
            assert time.monotonic() < deadline, "memdiag serve not ready in 60 s"
            time.sleep(0.1)
        yield base, db, d
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_the_live_view_in_chromium(served: tuple[str, Path, Path]) -> None:
    base, db, d = served
    with browser() as b:
        page = b.new_page(viewport={"width": 1280, "height": 800})
        console = Console(page)
        page.goto(base + "/")
        # the filters, as a person sets them: kept in the URL
        page.fill("input[name=org]", "org_a")
        page.click("form.filters button[type=submit]")
        page.wait_for_url("**/?org=org_a*")
        assert page.locator('#failed-sessions tr[data-key="ses-0"]').count() == 1
        assert page.locator('#failed-sessions tr[data-key="ses-1"]').count() == 0  # org_b
        page.evaluate("window.__same_page = true")

        # a new failed session appears without a reload, marked new
        run = memdiag_run(write(d / "second.jsonl", failed("ses-new", "org_a",
                                                             "2026-11-21T11:00:00Z")), db)  # fmt: skip
        page.wait_for_selector('#failed-sessions tr[data-key="ses-new"]', timeout=120_000)
        assert page.evaluate("window.__same_page") is True
        assert "new" in (
            page.get_attribute('#failed-sessions tr[data-key="ses-new"]', "class") or ""
        )
        finish(run)

        # paused: nothing moves while the sink writes, and the page says updates wait
        # a second tab on the dead letters, whose reader closes one reason
        dead = b.new_page(viewport={"width": 1280, "height": 800})
        Console(dead, console.errors)  # one list of errors for both tabs
        dead.goto(base + "/dead-letters")
        summary = 'details[data-key="not_json"] summary'
        assert "not_json: 1 " in dead.inner_text(summary)
        dead.click(summary)
        page.click("#pause")
        rows = "[...document.querySelectorAll('#failed-sessions tr[data-key]')].map(r => r.dataset.key + '|' + r.textContent)"
        before = page.evaluate(rows)
        version = health(base)["snapshot"]["version"]
        third = failed("ses-paused", "org_a", "2026-11-21T12:00:00Z")
        run = memdiag_run(write(d / "third.jsonl", third, extra="still not json\n"), db)
        finish(run)
        deadline = time.monotonic() + 30
        while health(base)["snapshot"]["version"] == version and time.monotonic() < deadline:
            time.sleep(0.2)
        until(page, "document.getElementById('live-status').textContent.includes('waiting')")
        time.sleep(1.0)
        assert page.evaluate(rows) == before  # (the marks of new rows may fade meanwhile)
        assert page.locator('tr[data-key="ses-paused"]').count() == 0
        # the other tab, live: a closed row stayed closed, the new sample is there
        until(dead, f"document.querySelector('{summary}').textContent.includes('not_json: 2 ')",
              30)  # fmt: skip
        assert dead.evaluate(f"document.querySelector('{summary}').parentElement.open") is False
        dead.close()
        # the reader scrolled down to the dead letters; the update above keeps them in place
        page.evaluate("document.getElementById('dead-letters').scrollIntoView()")
        top = "document.getElementById('dead-letters').getBoundingClientRect().top"
        where = page.evaluate(top)
        assert page.evaluate("window.scrollY") > 300  # the new row comes in above the window
        # resume (a click that does not scroll the window): the waiting update comes at once
        page.evaluate("document.getElementById('pause').click()")
        page.wait_for_selector('#failed-sessions tr[data-key="ses-paused"]', timeout=30_000)
        assert page.evaluate("window.__same_page") is True
        assert abs(page.evaluate(top) - where) < 3, (where, page.evaluate(top))

        # down to a session, a memory, and back: the filters are still there
        page.click('#failed-sessions tr[data-key="ses-paused"] a[href^="/sessions/"]')
        page.wait_for_url("**/sessions/ses-paused")
        assert "What happened" in page.content()
        page.click('a[href="/memories/obs_stale"] >> nth=0')
        page.wait_for_url("**/memories/obs_stale")
        assert page.locator("svg.chart").count() >= 1  # its weight over time
        page.go_back()
        page.go_back()
        page.wait_for_url("**/?org=org_a*")
        assert page.input_value("input[name=org]") == "org_a"

        # an agent's recall page, and a comparison of two runs
        page.goto(f"{base}/agents/{AGENT}")
        assert "When its pipeline was down" in page.content()
        assert "Unindexed memories" in page.content()
        page.goto(base + "/runs")
        page.select_option("select[name=baseline]", "base")
        page.select_option("select[name=candidate]", "cand")
        page.click("form.filters button[type=submit]")
        page.wait_for_url("**/runs?baseline=base&candidate=cand*")
        assert "Where the answers moved" in page.content() and "gate, under" in page.content()

        for url in ("/", "/sessions/ses-new", "/memories/obs_stale", f"/agents/{AGENT}",
                    "/runs?baseline=base&candidate=cand", "/dead-letters"):  # fmt: skip
            page.goto(base + url)
            page.wait_for_load_state("networkidle")
        assert console.errors == []
