"""``memdiag serve`` through an ASGI test client: every page and fragment, hostile ids and
text (every dead-letter sample is hostile input), the 404 pages, a missing or older file, the
token rule, the security headers, and the snapshot that never makes the sink wait."""

from __future__ import annotations

import html
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import quote

import duckdb
import pytest
from starlette.testclient import TestClient

from memdiag.analytics.db import connect
from memdiag.analytics.snapshot import MISSING, NOT_DUCKDB, READY, Snapshots
from memdiag.serve.app import CSP, create_app, host_name, is_loopback, same_path
from tests.recall_scenario import ambient, indexed, probe, written
from tests.unit.test_explain import HOSTILE, story
from tests.unit.test_judgements import judgement
from tests.unit.test_recall import Run
from tests.unit.test_sessions import into_duckdb, session

XSS = '"><img src=x onerror=alert(1)><script>alert(2)</script>'
OBS = f"obs{XSS}"  # an injected memory's id
AGENT = f"agent<script>{XSS}"  # an agent of the recall pipeline
RUN_A, RUN_B = "run-<a>", "run-<b>"
PAYLOAD = f'{{"kind": "search", "query": "</pre>{XSS}"}}'


def hostile_sessions() -> list[list[dict[str, Any]]]:
    """The explain story (a hostile session id) and three failed sessions with a hostile memory:
    misleading; the org is hostile too."""
    out = [story(HOSTILE)]
    for i in range(3):
        events = session(f"bad-{i}", "rework", [OBS, "plain"], ts=f"2026-11-21T08:0{i}:00Z")
        for e in events:
            e["org_id"] = f"org{XSS}"
            e["agent_id"] = AGENT
        out.append(events)
    out.append(session("ok-1", "accepted", ["plain"], ts="2026-11-21T08:10:00Z"))
    return out


def recall_events() -> list[dict[str, Any]]:
    """An agent whose indexing stopped (a break) and whose probes miss: a look-alike too; and
    two probes made from a task (one finds its memory, one does not)."""
    events: list[dict[str, Any]] = []
    for n in range(6):
        events.append(written(f"w{n}", n * 60, f"m{n}{XSS}", AGENT, f"note-{n}.md"))
        if n < 3:
            events.append(indexed(f"i{n}", n * 60 + 2, f"m{n}{XSS}", AGENT))
    events += [probe(f"p{n}", 2000 + n, f"m{n}{XSS}", [f"m{(n + 1) % 6}{XSS}"], [0.9], AGENT)
               for n in range(6)]  # fmt: skip
    events.append(ambient("amb", 2100, [f"m0{XSS}"], AGENT))
    events += [probe("t0", 2050, f"m0{XSS}", [f"m0{XSS}"], [0.9], AGENT, source="task"),
               probe("t2", 2052, f"m2{XSS}", [f"m5{XSS}"], [0.9], AGENT, source="task")]  # fmt: skip
    return events


def build(path: Path) -> Path:
    sink = into_duckdb(path, *hostile_sessions())
    sink.write(Run().send(recall_events()).records)
    sink.write([judgement(run, f"q{i}", (i + k) % 3 == 0, retrieved=() if i % 4 == 1 else ("g",))
                for k, run in enumerate((RUN_A, RUN_B)) for i in range(12)])  # fmt: skip
    with duckdb.connect(str(path)) as con:
        for i in range(4):
            con.execute(
                "INSERT INTO dead_letters VALUES (?, 'memdiag.events', 0, ?, 0, ?, ?, ?, ?, ?, "
                "false, '2026-11-21T10:00:00Z', ?)",
                [f"d{i}", i, f"key{XSS}", "not_json" if i else f"reason{XSS}", f"detail{XSS}",
                 PAYLOAD, len(PAYLOAD), f"key{XSS}"],
            )  # fmt: skip
    return path


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("serve") / "serve.duckdb")


@pytest.fixture
def client(db: Path) -> Iterator[TestClient]:
    with TestClient(create_app(str(db)), base_url="http://127.0.0.1:8765") as c:
        yield c


def pages() -> list[tuple[str, str]]:
    """Each page, and a hostile value it shows (escaped)."""
    return [
        ("/", OBS),
        (f"/?org={quote('org' + XSS)}", OBS),
        (f"/sessions/{quote(HOSTILE, safe='')}", HOSTILE),
        (f"/memories/{quote(OBS, safe='')}", OBS),
        (f"/memories/{quote('m2' + XSS, safe='')}?agent={quote(AGENT)}", AGENT),
        (f"/agents/{quote(AGENT, safe='')}", "m3" + XSS),
        ("/runs", RUN_A),
        (f"/runs?baseline={quote(RUN_A)}&candidate={quote(RUN_B)}", RUN_B),
        ("/dead-letters", PAYLOAD),
    ]


class Elements(HTMLParser):
    """Every element and attribute of a page, as a browser's parser sees them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.script_text = ""
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.script_text += data


def safe(html: str) -> None:
    """Nothing of the hostile input became markup: no element it named (img), no event
    handler or inline style on any element, and the one script is the page's own file."""
    parsed = Elements()
    parsed.feed(html)
    names = {tag for tag, _ in parsed.tags}
    assert "img" not in names and "iframe" not in names, names
    scripts = [attrs for tag, attrs in parsed.tags if tag == "script"]
    assert scripts in ([], [{"src": "/static/live.js", "defer": None}]), scripts
    assert parsed.script_text == ""  # no inline script
    for tag, attrs in parsed.tags:
        assert not [a for a in attrs if a.startswith("on")], (tag, attrs)
        assert "style" not in attrs, (tag, attrs)  # the CSP refuses inline styles
        for a in ("href", "src", "action"):
            assert not (attrs.get(a) or "").lower().startswith("javascript:"), (tag, attrs)


def test_every_page_answers_and_escapes_everything(client: TestClient, db: Path) -> None:
    for url, shown in pages():
        r = client.get(url)
        assert r.status_code == 200, (url, r.text[:2000])
        safe(r.text)
        assert html.escape(shown, quote=True) in r.text, (url, shown)
        assert r.headers["content-security-policy"] == CSP
        assert r.headers["x-content-type-options"] == "nosniff"
        assert "page;dur=" in r.headers["server-timing"]
    overview = client.get("/").text
    for part in ("misleading memories", "Latest failed sessions", "Dead letters by reason",
                 "Failure distribution", "dead weight"):  # fmt: skip
        assert part.lower() in overview.lower(), part
    # the misleading memory links to its page, its latest failed session to its own
    assert f'href="/memories/{quote(OBS, safe="")}"' in overview.replace("&amp;", "&")
    session = client.get(f"/sessions/{quote(HOSTILE, safe='')}").text
    assert "test runner PyTest failed" in session and "keywords matched" in session
    assert 'href="/memories/stale"' in session
    dead = client.get("/dead-letters").text
    assert "What to do:" in dead and "&lt;/pre&gt;" in dead and "not_json" in dead
    agent = client.get(f"/agents/{quote(AGENT, safe='')}").text
    assert "Recall by query source" in agent and "task recall by" in agent  # the gap, its trend
    runs = client.get(f"/runs?baseline={quote(RUN_A)}&candidate={quote(RUN_B)}").text
    assert "Where the answers moved" in runs and "gate, under the bundled policy" in runs
    assert "memdiag doctor" in runs


def test_sections_come_alone_for_the_live_script(client: TestClient) -> None:
    r = client.get("/?partial=1")
    doc = r.json()
    assert r.status_code == 200 and doc["status"] == 200 and doc["version"] >= 1
    assert set(doc["sections"]) == {"cards", "failed-sessions", "failures", "misleading",
                                    "dead-weight", "dead-letters"}  # fmt: skip
    for fragment in doc["sections"].values():
        safe(fragment)
    # the rows the script marks as new and keeps open carry their keys
    assert 'data-key="bad-2"' in doc["sections"]["failed-sessions"]
    missing = client.get("/sessions/nope?partial=1").json()
    assert missing["status"] == 404 and "no such session" in missing["sections"]["error"]


def test_unknown_ids_are_404_pages_that_say_what_exists(client: TestClient) -> None:
    for url, says, closest in (
        ("/sessions/bad-9", "no such session &#x27;bad-9&#x27;", "/sessions/bad-2"),
        ("/memories/plan", "no such memory &#x27;plan&#x27;", "/memories/plain"),
        ("/agents/agnt", "no such agent &#x27;agnt&#x27;", "/agents/"),
        (f"/?org={quote('org<x')}", "no such org", "/?org="),
        ("/runs?baseline=run-a&candidate=run-b", "no such run", "/runs?baseline="),
    ):
        r = client.get(url)
        assert r.status_code == 404, url
        assert says in r.text and f'href="{closest}' in r.text, (url, r.text[-1500:])
        safe(r.text)
    r = client.get("/no/such/page")
    assert r.status_code == 404 and "/dead-letters" in r.text
    bad = client.get("/?since=yesterday")
    assert bad.status_code == 400 and "--since &#x27;yesterday&#x27;" in bad.text
    itself = client.get(f"/runs?baseline={quote(RUN_A)}&candidate={quote(RUN_A)}")
    assert itself.status_code == 400 and 'class="failed"' in itself.text  # refused, said
    assert "Benchmark runs" in itself.text  # the page, to choose again
    for value in ("3000000d", "99999999999d"):  # beyond a date: refused, not a 500
        bad = client.get(f"/?since={value}")
        assert bad.status_code == 400 and "at most ten years back" in bad.text, value


def test_healthz(client: TestClient, db: Path) -> None:
    h = client.get("/healthz").json()
    assert h["db"] == str(db) and h["state"] == READY
    assert h["newest_event"].startswith("2026-11-21T")
    assert h["snapshot"]["version"] >= 1 and h["snapshot"]["bytes"] > 0


def test_a_missing_file_says_what_to_run_then_shows_it(tmp_path: Path, db: Path) -> None:
    path = tmp_path / "later.duckdb"
    app = create_app(str(path))
    with TestClient(app, base_url="http://127.0.0.1") as c:
        r = c.get("/")
        assert r.status_code == 503 and "memdiag run --input" in r.text and "memdiag sink" in r.text
        assert c.get("/healthz").json()["state"] == MISSING
        shutil.copy(db, tmp_path / "whole.tmp")
        (tmp_path / "whole.tmp").rename(path)  # it appears whole, as a sink's first flush
        deadline = time.monotonic() + 10
        while c.get("/healthz").json()["state"] != READY:  # the view's own tick finds it
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert c.get("/").status_code == 200


def test_a_file_that_is_not_duckdb_or_older_says_so(tmp_path: Path, db: Path) -> None:
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"not a database " * 100)
    with TestClient(create_app(str(junk)), base_url="http://127.0.0.1") as c:
        r = c.get("/sessions/x")
        assert r.status_code == 503 and "not a DuckDB file" in r.text
        # the page names the user's file, never the view's private copy of it
        assert ".duckdb" not in r.text.replace(str(junk), "") and "/v1.duckdb" not in r.text
        assert c.get("/healthz").json()["state"] == NOT_DUCKDB
    old = tmp_path / "old.duckdb"
    shutil.copy(db, old)
    with duckdb.connect(str(old)) as con:
        con.execute("DROP VIEW pipeline_health")
    with TestClient(create_app(str(old)), base_url="http://127.0.0.1") as c:
        r = c.get(f"/agents/{quote(AGENT, safe='')}")
        assert r.status_code == 503 and "older memdiag" in r.text and "memdiag sink" in r.text


def test_the_token_rule(db: Path) -> None:
    token = "s3cret-token_with;odd=chars"
    app = create_app(str(db), token=token, loopback=False)
    with TestClient(app, base_url="http://memdiag.example:8765", follow_redirects=False) as c:
        assert c.get("/").status_code == 401
        assert c.get("/healthz").status_code == 401
        assert c.get("/", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert c.get("/", headers={"Authorization": f"Bearer {token}"}).status_code == 200
        r = c.get(f"/sessions/bad-1?x=1&token={quote(token)}")
        assert r.status_code == 303 and r.headers["location"] == "/sessions/bad-1?x=1"
        cookie = r.headers["set-cookie"]
        # Lax: a link clicked in a chat or an alert (another site) keeps the cookie
        assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and token not in cookie
        assert c.get("/sessions/bad-1").status_code == 200  # the cookie, from now on
        # another tool's malformed cookie on the same host never hides this one
        value = cookie.split(";")[0].split("=", 1)[1]
        odd = {"Cookie": f'x=a\\b; other="un closed; memdiag_token={value}'}
        assert c.get("/sessions/bad-1", headers=odd).status_code == 200
        # the redirect keeps the path as it came, encoded, and never leaves the host
        for asked, kept in ((f"/sessions/a%3Fb?token={quote(token)}", "/sessions/a%3Fb"),
                            (f"/sessions/%E4%B8%AD?token={quote(token)}", "/sessions/%E4%B8%AD"),
                            (f"/%5Cevil.example?token={quote(token)}", "/%5Cevil.example")):
            r = c.get(asked)
            assert r.status_code == 303 and r.headers["location"] == kept, (asked, r.headers)
        c.cookies.clear()
        assert c.get(f"/?token={quote(token)}x").status_code == 401
        assert c.get("/", headers={"Cookie": "memdiag_token=" + "0" * 64}).status_code == 401
    # a path a client sends as //host/... (no test client sends it so) stays on this host
    assert same_path({"raw_path": b"//evil.example/x", "path": "//evil.example/x"}) == (
        "/evil.example/x")
    assert same_path({"raw_path": b"/\\evil.example", "path": "/\\evil.example"}) == (
        "/evil.example")


def test_a_loopback_binding_answers_loopback_names_only(client: TestClient) -> None:
    assert client.get("/healthz", headers={"Host": "localhost:8765"}).status_code == 200
    assert client.get("/healthz", headers={"Host": "[::1]:8765"}).status_code == 200
    r = client.get("/healthz", headers={"Host": "evil.example:8765"})  # DNS rebinding
    assert r.status_code == 421 and "MEMDIAG_SERVE_TOKEN" in r.text
    assert (host_name("[::1]:80"), host_name("a:1"), host_name("::1")) == ("::1", "a", "::1")
    everywhere = "0.0.0.0"  # noqa: S104 - what is refused
    assert is_loopback("127.0.0.2") and is_loopback("localhost") and not is_loopback(everywhere)


def test_the_command_refuses_another_address_without_a_token(db: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    everywhere = "0.0.0.0"  # noqa: S104 - what is refused
    r = subprocess.run([sys.executable, "-m", "memdiag.cli", "serve", "--db", str(db), "--host",
                        everywhere], capture_output=True, text=True, timeout=60, env=env)  # fmt: skip
    assert r.returncode == 2 and "MEMDIAG_SERVE_TOKEN" in r.stderr and "Traceback" not in r.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_server_sent_events_say_when_the_sink_wrote(db: Path, tmp_path: Path) -> None:
    """Through a real uvicorn: the first event says the version the page was made from, and
    a write to the file gives the next one within a couple of seconds."""
    import http.client

    import uvicorn

    path = tmp_path / "live.duckdb"
    shutil.copy(db, path)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(str(path), refresh=0.2), host="127.0.0.1",
                                           port=port, log_level="error"))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if server.started:
                break
            time.sleep(0.05)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/events")
        stream = conn.getresponse()
        assert stream.status == 200 and stream.getheader("content-type").startswith(
            "text/event-stream"
        )

        def next_version() -> int:
            while True:
                line = stream.readline().decode()
                if line.startswith("data: "):
                    return int(json.loads(line[6:])["version"])

        first = next_version()
        # the sink's write, from another process as the sink makes it (POSIX locks never
        # conflict within one process)
        subprocess.run([sys.executable, "-c", "import sys; from memdiag.analytics.db import "
                        "connect; c = connect(sys.argv[1]); c.execute(\"UPDATE dead_letters "
                        "SET detail = detail || ' (again)'\"); c.close()", str(path)],
                       check=True, timeout=60)  # fmt: skip
        t0 = time.monotonic()
        assert next_version() == first + 1 and time.monotonic() - t0 < 2.0
        conn.close()
    finally:
        server.should_exit = True
        thread.join(10)


def test_the_snapshot_never_waits_for_the_sink(db: Path, tmp_path: Path) -> None:
    """While another process writes the file, a refresh is put off at once (not waited for)
    and the pages keep the snapshot they have; once it lets go, the next tick copies."""
    path = tmp_path / "busy.duckdb"
    shutil.copy(db, path)
    snaps = Snapshots(path, min_interval=0)
    try:
        assert snaps.refresh() and snaps.version == 1
        holder = subprocess.Popen(
            [sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
             "c.execute('CREATE TABLE IF NOT EXISTS t (x INT)'); print('holding', flush=True); "
             "sys.stdin.readline()", str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        t0 = time.perf_counter()
        assert snaps.refresh() is False and snaps.busy >= 1
        assert time.perf_counter() - t0 < 0.1  # never waits
        with snaps.cursor() as cur:  # the old snapshot still answers
            assert cur.execute("SELECT count(*) FROM session_diagnostics").fetchone()[0] > 0
        holder.communicate("go\n", timeout=30)
        assert snaps.refresh() and snaps.version == 2
        with snaps.cursor() as cur:
            assert cur.execute("SELECT count(*) FROM t").fetchone() == (0,)
    finally:
        snaps.close()


def test_a_snapshot_in_use_outlives_its_replacement(db: Path, tmp_path: Path) -> None:
    path = tmp_path / "swap.duckdb"
    shutil.copy(db, path)
    snaps = Snapshots(path, min_interval=0)
    try:
        snaps.refresh()
        first = snaps.current
        assert first is not None
        with snaps.cursor() as cur:
            with connect(path) as con:
                con.execute("CREATE TABLE t2 (x INT)")
            assert snaps.refresh() and snaps.version == 2
            # the page that was reading the first snapshot reads on
            assert cur.execute("SELECT count(*) FROM searches").fetchone()[0] > 0
            assert first.path.exists()
        assert not first.path.exists()  # closed and deleted with its last reader
    finally:
        snaps.close()


def test_the_sink_says_once_when_another_process_holds_the_file(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An analyst's `duckdb -readonly` holding the file: the writer says so after a few
    seconds, once, with what to do; it never gives up silently."""
    from memdiag.analytics import db as dbmod

    path = tmp_path / "held.duckdb"
    shutil.copy(db, path)
    monkeypatch.setattr(dbmod, "LOCK_WARN_SECONDS", 0.3)
    reader = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1], "
         "read_only=True); print('reading', flush=True); sys.stdin.readline()", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    said: list[str] = []
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "reading"
        threading.Timer(1.0, lambda: reader.communicate("done\n", timeout=30)).start()
        con = dbmod.connect(path, timeout=20, warn=said.append)
        con.close()
    finally:
        if reader.poll() is None:
            reader.kill()
    assert len(said) == 1, said
    assert (
        "another process" in said[0] and "memdiag serve" in said[0] and "no row is lost" in said[0]
    )


def test_memdiag_run_relays_the_sinks_lock_warning_once(tmp_path: Path) -> None:
    """`memdiag run` keeps its children's logs in files: the sink's word that another process
    holds the file reaches the person running it, once, without the log's prefix."""
    from memdiag.runner import Child

    log_path = tmp_path / "sink.log"
    log = log_path.open("ab")
    child = Child("sink", subprocess.Popen(["true"]), log_path, log)
    child.proc.wait()
    log.write(b"[2026-11-25 10:00:00,000] [1] [INFO] memdiag.sink: started\n"
              b"[2026-11-25 10:00:03,000] [1] [WARNING] memdiag.db: waiting 3s for another "
              b"process to let go of x.duckdb (/usr/bin/duckdb (PID 7)): close it\n"
              b"[2026-11-25 10:00:03,000] [1] [WARNING] aiokafka: something else\n"
              b"[2026-11-25 10:00:04,000] [1] [WARNING] memdiag.db: half a li")  # fmt: skip
    assert child.new_warnings() == [
        "waiting 3s for another process to let go of x.duckdb (/usr/bin/duckdb (PID 7)): close it"
    ]
    assert child.new_warnings() == []  # said once
    log.write(b"ne\n")
    assert child.new_warnings() == ["half a line"]
    log.close()


def test_the_overviews_light_pipeline_figures_are_the_full_ones(db: Path) -> None:
    """The cards read the broken agents without the whole pipeline_health view: the same
    agents, in the same order, with the same counts."""
    from memdiag.analytics.status import pipeline_summary

    with duckdb.connect(str(db), read_only=True) as con:
        full, light = pipeline_summary(con), pipeline_summary(con, light=True)
    assert full is not None and light is not None
    assert light["broken"] == full["broken"] and light["broken"]
    assert light["agents"] == full["agents"] and light["recall_fell"] == full["recall_fell"]
    assert light["worst_coverage"] is None and full["worst_coverage"] is not None


def test_the_caveats_are_kept_a_minute(db: Path) -> None:
    from memdiag.serve.pages import Caveats

    calls: list[Any] = []
    caveats = Caveats(ttl=60)
    with duckdb.connect(str(db), read_only=True) as con:
        import memdiag.analytics.status as status_module

        real = status_module.proxy_strength

        def counting(*a: Any, **k: Any) -> Any:
            calls.append(k)
            return real(*a, **k)

        status_module.proxy_strength = counting  # type: ignore[assignment]
        try:
            first = caveats(con, org=None, project=None, since=None)
            assert caveats(con, org=None, project=None, since=None) == first
            caveats(con, org="x", project=None, since=None)
        finally:
            status_module.proxy_strength = real  # type: ignore[assignment]
    assert len(calls) == 2  # once per filter within the minute


def test_the_search_box_goes_to_each_kind_of_id(db: Path, tmp_path: Path) -> None:
    """/go?id=...: a session, a memory, an agent, a run, a run group (its runs compared from
    it); an unknown id goes to the session 404, which lists the closest sessions."""
    grouped = shutil.copy(db, tmp_path / "grouped.duckdb")
    with duckdb.connect(str(grouped)) as con:
        con.execute("UPDATE judgements SET run_group_id = 'nightly <1>' WHERE run_id = ?", [RUN_A])
    with TestClient(create_app(str(grouped)), base_url="http://127.0.0.1:8765",
                    follow_redirects=False) as c:  # fmt: skip
        for wanted, page in (
            (HOSTILE, f"/sessions/{quote(HOSTILE, safe='')}"),
            (OBS, f"/memories/{quote(OBS, safe='')}"),
            (RUN_A, f"/runs?baseline={quote(RUN_A, safe='')}"),
            ("nightly <1>", "/runs?baseline_group=nightly+%3C1%3E"),
            ("no-such-id", "/sessions/no-such-id"),
        ):
            r = c.get("/go", params={"id": wanted})
            assert r.status_code == 303 and r.headers["location"] == page, (wanted, r.headers)
        assert c.get("/runs?baseline_group=nightly+%3C1%3E").status_code == 200
