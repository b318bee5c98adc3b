"""``memdiag serve``: the live, read-only view of the DuckDB file (contract section 10).

Starlette, served by uvicorn. Every page answers from a snapshot of the file
(:mod:`memdiag.analytics.snapshot`), refreshed when the sink has written, so the view never
stands in the sink's way. Pages are made of sections (:mod:`memdiag.serve.pages`); a page's
script (``static/live.js``) listens on ``/events`` (server-sent events, one per new
snapshot) and fetches the page's sections again, unless paused.

Safe by default: it binds 127.0.0.1 and refuses requests whose ``Host`` is not a loopback
name (a DNS-rebinding page cannot read it); any other address needs ``MEMDIAG_SERVE_TOKEN``,
checked in constant time on every request (``Authorization: Bearer T``, or once ``?token=T``,
then an HttpOnly cookie). Every response carries a Content-Security-Policy without
``unsafe-inline``: the pages run only their own script.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request, cookie_parser
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memdiag.analytics.db import DatabaseError
from memdiag.analytics.lookup import NotFound
from memdiag.analytics.snapshot import READY, Snapshots
from memdiag.contract import pages as paths
from memdiag.serve import pages
from memdiag.views import html as h
from memdiag.views.html import e

log = logging.getLogger("memdiag.serve")

#: every response's Content-Security-Policy: nothing but the page's own files and requests
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),  # a ?token= never leaves in a Referer
    (b"x-frame-options", b"DENY"),
]
COOKIE = "memdiag_token"
#: how often the file is checked for a new flush (a copy is taken at most every --refresh)
TICK_SECONDS = 0.25
#: pages answered from one snapshot are kept, so many open pages cost one query each
CACHE_PAGES = 128


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost."""
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def same_path(scope: Scope) -> str:
    """The request's own path, as it came (percent-encoded), for a redirect to itself: never
    another host (leading slashes and backslashes collapse to one slash)."""
    raw = scope.get("raw_path") or scope["path"].encode("utf-8")
    path = raw.decode("latin-1").split("?", 1)[0]
    return "/" + path.lstrip("/\\")


def host_name(header: str) -> str:
    """The name of a ``Host`` header, without its port (``[::1]:8765`` -> ``::1``)."""
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """ASGI middleware: the security headers on every response, the Host check on a loopback
    binding, and the token when one is set."""

    def __init__(self, app: ASGIApp, token: str, loopback: bool):
        self.app = app
        self.token = token.encode()
        self.loopback = loopback
        # the cookie holds a digest of the token, never the token (and any token fits in it)
        self.cookie = hashlib.sha256(b"memdiag serve\0" + self.token).hexdigest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if self.loopback:
            if not is_loopback(host_name(headers.get("host", ""))):
                await _plain(
                    secured,
                    421,
                    "memdiag serve answers on this machine only: open "
                    "it as http://127.0.0.1 or http://localhost (bind another address "
                    "with MEMDIAG_SERVE_TOKEN to serve others)",
                )
                return
        if self.token:
            pairs = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
            given = dict(pairs).get("token")
            if given is not None and self._ok(given):  # once: the cookie, then the clean URL
                rest = urlencode([(k, v) for k, v in pairs if k != "token"])
                where = same_path(scope) + (f"?{rest}" if rest else "")
                secure = "; Secure" if scope.get("scheme") == "https" else ""
                # Lax: a link clicked in a chat or an alert (another site) brings it along; the
                # view is read-only, every request a GET
                cookie_text = f"{COOKIE}={self.cookie}; HttpOnly; SameSite=Lax; Path=/{secure}"
                headers_out = [
                    (b"location", where.encode("latin-1")),
                    (b"set-cookie", cookie_text.encode()),
                    (b"cache-control", b"no-store"),
                    (b"content-length", b"0"),
                ]
                await secured(
                    {"type": "http.response.start", "status": 303, "headers": headers_out}
                )
                await secured({"type": "http.response.body", "body": b""})
                return
            bearer = headers.get("authorization", "")
            # Starlette's parser, as browsers read cookies: another tool's malformed cookie
            # on the same host (cookies ignore ports) never hides ours
            cookie = cookie_parser(headers.get("cookie", "")).get(COOKIE, "")
            ok = (bearer.startswith("Bearer ") and self._ok(bearer[7:])) or (
                bool(cookie) and hmac.compare_digest(cookie.encode(), self.cookie.encode())
            )
            if not ok:
                await _plain(
                    secured,
                    401,
                    "this memdiag serve asks for its token: open the link you were given (it "
                    "ends in ?token=...), or send Authorization: Bearer TOKEN",
                    [(b"www-authenticate", b"Bearer")],
                )
                return
        await self.app(scope, receive, secured)

    def _ok(self, given: str) -> bool:
        return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self.token)


async def _plain(
    send: Callable[[Message], Awaitable[None]],
    status: int,
    text: str,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = h.page("memdiag serve", f'<p class="error-page">{e(text)}</p>', head=_HEAD).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/html; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                *(extra or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


_HEAD = (
    '<link rel="stylesheet" href="/static/memdiag.css">'
    '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">'
    '<script src="/static/live.js" defer></script>'
)

_NAV = (
    '<nav class="top"><a class="brand" href="/">memdiag</a><a href="/">overview</a>'
    '<a href="/runs">runs</a><a href="/dead-letters">dead letters</a>'
    '<form class="go" method="get" action="/go"><input name="id" aria-label="go to an id" '
    'placeholder="session, memory or agent id"></form>'
    '<span class="live"><span id="live-status" data-version="{version}">{state}</span>'
    '<button id="pause" type="button" aria-pressed="false">pause</button></span></nav>'
)


class Hub:
    """The latest snapshot version, for the server-sent events to wait on."""

    def __init__(self) -> None:
        self.version = 0
        self._changed = asyncio.Event()

    def publish(self, version: int) -> None:
        self.version = version
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self, seen: int, timeout: float) -> int:
        if self.version != seen:
            return self.version
        changed = self._changed
        try:
            await asyncio.wait_for(changed.wait(), timeout)
        except TimeoutError:
            pass
        return self.version


def create_app(
    db: str,
    token: str = "",
    loopback: bool = True,
    policy: str | None = None,
    refresh: float = 1.0,
    stream_window: float = 30.0,
) -> ASGIApp:
    """The view of the DuckDB file at ``db``: gate verdicts under ``policy`` (the bundled one
    by default), a new snapshot at most every ``refresh`` seconds; ``stream_window``: the
    worker's followup window (what calibrate's caveats are computed at)."""
    from memdiag.analytics.gate import bundled_policy

    policy_file = policy or str(bundled_policy())
    policy_name = "the bundled policy" if policy is None else f"policy {Path(policy).name}"
    snapshots = Snapshots(db, min_interval=refresh)
    caveats = pages.Caveats(stream_window)
    hub = Hub()
    cache: OrderedDict[tuple[Any, ...], tuple[pages.Page, float]] = OrderedDict()
    newest: dict[int, Any] = {}

    async def refresher() -> None:
        while True:
            try:
                changed = await asyncio.to_thread(snapshots.refresh)
            except Exception:  # noqa: BLE001 - the view stays up; the next tick tries again
                log.exception("could not take a snapshot of %s", db)
                changed = False
            if changed:
                with cache_lock:
                    cache.clear()
                hub.publish(
                    snapshots.version if snapshots.state == READY else -snapshots.version - 1
                )
            await asyncio.sleep(TICK_SECONDS)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            await asyncio.to_thread(snapshots.refresh)
        except Exception:  # noqa: BLE001 - the view starts anyway; its pages say what is wrong
            log.exception("could not take a first snapshot of %s", db)
        hub.publish(snapshots.version)
        task = asyncio.create_task(refresher())
        try:
            yield
        finally:
            task.cancel()
            snapshots.close()

    cache_lock = threading.Lock()  # the cache is read in worker threads, cleared in the loop
    building: dict[tuple[Any, ...], threading.Lock] = {}

    def answer(
        key: tuple[Any, ...], build: Callable[[Any], pages.Page]
    ) -> tuple[pages.Page, float, bool, int]:
        """The page, its server time, whether the cache had it, and the version of the snapshot
        it was read from. Pages already answered from that snapshot come from the cache; a
        page many ask at once is built once (the others wait for it)."""
        t0 = time.perf_counter()
        try:
            with snapshots.reading() as (version, cur):
                full = (version, *key)
                with cache_lock:
                    hit = cache.get(full)
                    if hit is not None:
                        cache.move_to_end(full)
                        return hit[0], hit[1], True, version
                    one = building.setdefault(full, threading.Lock())
                with one:
                    with cache_lock:
                        hit = cache.get(full)
                    if hit is not None:  # another request built it meanwhile
                        return hit[0], hit[1], True, version
                    try:
                        page = build(cur)
                    except NotFound as exc:
                        page = not_found(exc)
                    except ValueError as exc:  # a bad filter (--since, say)
                        page = pages.Page(
                            "memdiag: that cannot be read",
                            "",
                            [("error", "Bad request", f'<p class="error-page">{e(exc)}</p>')],
                            status=400,
                        )
                    except BaseException:
                        with cache_lock:  # a page that failed leaves no lock behind
                            building.pop(full, None)
                        raise
                    ms = (time.perf_counter() - t0) * 1000
                    with cache_lock:
                        cache[full] = (page, ms)
                        while len(cache) > CACHE_PAGES:
                            cache.popitem(last=False)
                        building.pop(full, None)
        except DatabaseError as exc:
            return unavailable(str(exc)), (time.perf_counter() - t0) * 1000, False, -1
        return page, ms, False, version

    async def render(request: Request, build: Callable[[Any], pages.Page]) -> Response:
        if snapshots.state != READY:
            page, ms, cached, version = unavailable(snapshots.detail), 0.0, False, -1
        else:
            key = (request.url.path, _query(request))
            page, ms, cached, version = await run_in_threadpool(answer, key, build)
        timing = {
            "server-timing": f"page;dur={ms:.1f}" + (';desc="cached"' if cached else ""),
            "cache-control": "no-store",
        }
        if request.query_params.get("partial"):
            return JSONResponse(
                {
                    "version": version,  # the snapshot it was read from, not the newest
                    "status": page.status,
                    "meta": page.meta,
                    "sections": {s[0]: s[2] for s in page.sections},
                },
                status_code=200,
                headers=timing,
            )
        body = page.top + "".join(
            h.section(title, body, id=sid) for sid, title, body in page.sections
        )
        nav = _NAV.format(version=version, state="live")
        return HTMLResponse(
            h.page(page.title, body, page.meta, head=_HEAD, top=nav),
            status_code=page.status,
            headers=timing,
        )

    def not_found(exc: NotFound) -> pages.Page:
        kind = exc.kind or "id"

        def link(value: str) -> str | None:
            if kind in ("org", "project"):
                return f"/?{urlencode({kind: value})}"
            if kind == "run":
                return paths.runs_path(value, None)
            if kind == "memory":  # a memory of one agent's recall pipeline
                return paths.memory_path(value, exc.agent)
            to: dict[str, Callable[[str], str]] = {
                "session": paths.session_path,
                "observation": paths.memory_path,
                "recall_memory": paths.memory_path,
                "agent": paths.agent_path,
                "memory_agent": paths.agent_path,
            }
            return to[kind](value) if kind in to else None

        items = "".join(f"<li>{h.a(link(c), c)}</li>" for c in exc.closest)
        known = f" (of {exc.known:,} known)" if exc.known else ""
        body = f'<p class="error-page">{e(exc)}</p>' + (
            f"<p>The closest{known}:</p><ul>{items}</ul>" if items else ""
        )
        return pages.Page("memdiag: not found", "", [("error", "Not found", body)], status=404)

    def unavailable(detail: str) -> pages.Page:
        what = (
            f"<p>{e(detail)}.</p><p>Make one with <code>memdiag run --input events.jsonl --db "
            f"{e(db)}</code> (or <code>memdiag demo</code>), or start <code>memdiag sink</code> "
            f"with <code>MEMDIAG_DUCKDB_PATH={e(db)}</code>. This page shows it as soon as it "
            "is there.</p>"
        )
        if "older memdiag" in detail or "lacks part" in detail:
            what = (
                f"<p>{e(detail)}.</p><p>The file was written by an older memdiag: start "
                f"<code>memdiag sink</code> on it once (<code>MEMDIAG_DUCKDB_PATH={e(db)}"
                "</code>) and it is upgraded; this page shows it then.</p>"
            )
        return pages.Page(
            "memdiag: no data yet", "", [("error", "Nothing to show yet", what)], status=503
        )

    async def overview(request: Request) -> Response:
        q = _query(request)
        return await render(request, lambda cur: pages.overview(cur, dict(q), caveats))

    async def session(request: Request) -> Response:
        sid = request.path_params["session_id"]
        return await render(request, lambda cur: pages.session(cur, sid))

    async def memory(request: Request) -> Response:
        mid, q = request.path_params["memory_id"], _query(request)
        return await render(request, lambda cur: pages.memory(cur, mid, dict(q)))

    async def agent(request: Request) -> Response:
        aid = request.path_params["agent_id"]
        return await render(request, lambda cur: pages.agent(cur, aid))

    async def runs(request: Request) -> Response:
        q = _query(request)
        return await render(request, lambda cur: pages.runs(cur, dict(q), policy_file, policy_name))

    async def dead_letters(request: Request) -> Response:
        return await render(request, pages.dead_letters)

    async def go(request: Request) -> Response:
        """The search box: the page of a session, memory, agent, run or run group of that
        id."""
        from starlette.responses import RedirectResponse

        from memdiag.analytics.lookup import lookup

        wanted = (request.query_params.get("id") or "").strip()
        if not wanted or snapshots.state != READY:
            return RedirectResponse("/", status_code=303)

        def where(cur: Any) -> str:
            for kind, path in (
                ("session", paths.session_path),
                ("observation", paths.memory_path),
                ("recall_memory", paths.memory_path),
                ("agent", paths.agent_path),
                ("run", lambda r: paths.runs_path(r, None)),
                ("run_group", lambda g: "/runs?" + urlencode({"baseline_group": g})),
            ):
                if lookup(cur, kind, wanted)[0]:
                    return path(wanted)
            return paths.session_path(wanted)  # its 404 lists the closest sessions

        def find() -> str:
            with snapshots.cursor() as cur:
                return where(cur)

        return RedirectResponse(await run_in_threadpool(find), status_code=303)

    async def healthz(request: Request) -> Response:
        version = snapshots.version
        if version not in newest and snapshots.state == READY:

            def read() -> Any:
                from memdiag.analytics.status import newest_event

                with snapshots.cursor() as cur:
                    return newest_event(cur)

            newest.clear()
            newest[version] = await run_in_threadpool(read)
        when = newest.get(version) if snapshots.state == READY else None
        snap = snapshots.current
        return JSONResponse(
            {
                "db": str(Path(db)),
                "newest_event": None if when is None else when.isoformat(),
                "state": snapshots.state,
                "detail": snapshots.detail or None,
                "snapshot": None
                if snap is None
                else {
                    "version": snap.version,
                    "age_seconds": round(time.time() - snap.taken_at, 3),
                    "copy_ms": round(snap.copy_seconds * 1000, 3),
                    "bytes": snap.bytes,
                    "copies": snapshots.copies,
                    "deferred": snapshots.busy,
                },
            },
            headers={"cache-control": "no-store"},
        )

    async def events(request: Request) -> Response:
        async def stream() -> Any:
            seen = None
            while True:
                version = await hub.wait(seen if seen is not None else -(10**9), 15.0)
                if await request.is_disconnected():
                    return
                if version != seen:
                    seen = version
                    yield f"event: update\ndata: {json.dumps({'version': version})}\n\n"
                else:
                    yield ": still here\n\n"

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        kinds = {
            "memdiag.css": "text/css; charset=utf-8",
            "live.js": "text/javascript; charset=utf-8",
            "favicon.svg": "image/svg+xml",
        }
        if name not in kinds:
            return Response("not found", status_code=404, media_type="text/plain")
        text = resources.files("memdiag.views").joinpath("static", name).read_text("utf-8")
        return Response(text, media_type=kinds[name], headers={"cache-control": "no-cache"})

    async def nowhere(request: Request) -> Response:
        body = (
            '<p class="error-page">No such page.</p><p>The pages: <a href="/">the overview</a>'
            ", /sessions/SESSION_ID, /memories/MEMORY_ID (?agent=AGENT for a recall "
            'memory), /agents/AGENT_ID, <a href="/runs">/runs</a>, '
            '<a href="/dead-letters">/dead-letters</a>, <a href="/healthz">/healthz</a>.</p>'
        )
        nav = _NAV.format(version=snapshots.version, state="live")
        return HTMLResponse(
            h.page("memdiag: no such page", body, head=_HEAD, top=nav), status_code=404
        )

    app = Starlette(
        routes=[
            Route("/", overview),
            Route("/sessions/{session_id:path}", session),
            Route("/memories/{memory_id:path}", memory),
            Route("/agents/{agent_id:path}", agent),
            Route("/runs", runs),
            Route("/dead-letters", dead_letters),
            Route("/go", go),
            Route("/healthz", healthz),
            Route("/events", events),
            Route("/static/{name}", static),
            Route("/{rest:path}", nowhere),
        ],
        lifespan=lifespan,
    )
    app.state.snapshots = snapshots
    return Guard(app, token, loopback)


def _query(request: Request) -> tuple[tuple[str, str], ...]:
    """The page's own query (what its URL says), without the live script's ``partial``."""
    return tuple(sorted((k, v) for k, v in request.query_params.items() if k != "partial"))
