"""The pages of ``memdiag serve``: what each one asks (:mod:`memdiag.views.questions`) and the
fragments it shows (:mod:`memdiag.views.html`), as named sections the page updates one by
one. No HTTP here: :mod:`memdiag.serve.app` serves these."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import duckdb

from memdiag.contract import pages as paths
from memdiag.views import html as h
from memdiag.views import questions as qs
from memdiag.views.html import LIVE, e


@dataclass
class Page:
    """A page: its title, a line under it, and its sections (id, title, HTML), each updated on
    its own when the data changes; ``status`` its HTTP status."""

    title: str
    meta: str = ""
    sections: list[tuple[str, str, str]] = field(default_factory=list)
    status: int = 200
    top: str = ""  # above the sections, not updated (a form)


class Caveats:
    """What calibrate says of the live proxies, per filter, computed at most once a minute:
    it costs more than the rest of the overview, and it moves slowly."""

    def __init__(self, stream_window: float = 30.0, ttl: float = 60.0):
        self.stream_window, self.ttl = stream_window, ttl
        self._got: dict[tuple[Any, ...], tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def __call__(self, con: duckdb.DuckDBPyConnection, key: Any = None, **where: Any) -> Any:
        """``where``: the filters; ``key``: what names them (the URL's text: a relative
        --since is a new time at each call, its text is not)."""
        from memdiag.analytics.status import proxy_strength

        key = key if key is not None else tuple(sorted(where.items()))
        now = time.monotonic()
        with self._lock:
            hit = self._got.get(key)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        value = proxy_strength(con, self.stream_window, **where)
        with self._lock:
            if len(self._got) > 256:
                self._got.clear()
            self._got[key] = (now, value)
        return value


def overview(con: duckdb.DuckDBPyConnection, q: Mapping[str, str],
             caveats: Caveats | None = None) -> Page:  # fmt: skip
    # the filters, read as the command line reads --org, --project and --since
    given = qs.STATUS.read(q, ("org", "project", "since"))
    org, project, since = given["org"], given["project"], given["since"]
    since_text = q.get("since") or None
    text_key = (org, project, since_text)

    def strength(con: duckdb.DuckDBPyConnection, **where: Any) -> Any:
        return caveats(con, key=text_key, **where) if caveats is not None else None

    st = qs.overview(con, org, project, since, proxies=strength if caveats else None)
    filters = [
        f"{k} {v}" for k, v in (("org", org), ("project", project), ("since", since_text)) if v
    ]
    meta = ("filtered to " + ", ".join(e(f) for f in filters)) if filters else "all sessions"
    form = (
        '<form class="filters" method="get" action="/">'
        + "".join(
            f'<label>{label}<input name="{name}" value="{e(value or "")}" '
            f'placeholder="{e(hint)}"></label>'
            for name, label, value, hint in (
                ("org", "org", org, "org_id"),
                ("project", "project", project, "project_id"),
                ("since", "since", since_text, "24h, 7d, 2026-11-21"),
            )
        )
        + '<button type="submit">apply</button> <a href="/">clear</a></form>'
    )
    more = f"/?{urlencode({k: v for k, v in q.items() if v})}" if q else "/"
    return Page(
        "memdiag",
        meta,
        [
            ("cards", "Status", h.cards(st, LIVE)),
            (
                "failed-sessions",
                "Latest failed sessions",
                h.failed_sessions(
                    st["failed_sessions"],
                    LIVE,
                    "<code>memdiag query failed-sessions --limit N</code>",
                ),
            ),
            ("failures", "Failure distribution", h.failure_distribution(st["failure_categories"])),
            (
                "misleading",
                "Misleading memories and graph entities",
                h.misleading(st["misleading"], LIVE),
            ),
            (
                "dead-weight",
                "Dead weight: memories never used",
                h.dead_weight(st["unused_memories"], LIVE),
            ),
            (
                "dead-letters",
                "Dead letters by reason",
                h.dead_letter_counts(st["dead_letters"], LIVE),
            ),
        ],
        top=form
        + (f'<p class="dim">This page: <a href="{e(more)}">{e(more)}</a></p>' if filters else ""),
    )


def session(con: duckdb.DuckDBPyConnection, session_id: str) -> Page:
    ex = qs.EXPLAIN.answer(con, {}, session_id=session_id)
    o = ex["outcome"]
    meta = (
        "open: this page updates as its events arrive"
        if o is None
        else (
            f"{e(o['outcome'])}"
            + (f" · {e(o['failure_category'] or 'unknown')}" if o["failed"] else "")
        )
    )
    return Page(f"session {session_id}", meta, [("session", "What happened", h.explain(ex, LIVE))])


def memory(con: duckdb.DuckDBPyConnection, memory_id: str, q: Mapping[str, str]) -> Page:
    m = qs.memory_page(con, memory_id, q.get("agent") or None)
    st = m["stats"]
    meta = []
    if st is not None:
        meta.append(f"used in {st['used']:,} of {st['used'] + st['ignored']:,} judged turns")
    if m["recall"] is not None:
        owner = m["recall"]["agent_id"]
        meta.append(f"a memory of agent {h.a(paths.agent_path(owner), owner)}")
    return Page(
        f"memory {memory_id}", " · ".join(meta), [("memory", "Its story", h.memory(m, LIVE))]
    )


def agent(con: duckdb.DuckDBPyConnection, agent_id: str) -> Page:
    from memdiag.views.report import recall_trends

    p = qs.agent_page(con, agent_id)
    if not p["memory_events"]:
        return Page(
            f"agent {agent_id}",
            "no memory events from this agent (memdiag.memory): no recall pipeline to show",
            [
                (
                    "failed-sessions",
                    "Latest failed sessions (all agents)",
                    h.failed_sessions(p["failed_sessions"], LIVE),
                )
            ],
        )
    hl = p["health"]
    state = (
        "broken"
        if hl["broken"]
        else ("recalls nothing" if hl["semantic_recall_rate"] == 0 else "ok")
    )
    fell = {
        "recall_fell": {
            "window_seconds": 86_400.0,
            "drop_points": 20.0,
            "min_z": 2.0,
            "agents": p["recall_fell"],
            "stopped_probing": p["stopped_probing"],
        }
    }
    return Page(
        f"agent {agent_id}",
        f"recall pipeline: {e(state)}",
        [
            (
                "health",
                "Pipeline health",
                h.pipeline_table([hl], LIVE)
                + h.query_sources([hl], LIVE)
                + h.recall_fell(fell, LIVE),
            ),
            (
                "trends",
                "Recall over time and memory count",
                recall_trends(con, [agent_id], agent_id),
            ),
            ("breaks", "When its pipeline was down", h.break_spans(p["breaks"], LIVE, agent_id)),
            ("unindexed", "Unindexed memories", h.unindexed(p["unindexed"], LIVE, agent_id)),
            (
                "sessions-in-breaks",
                "Sessions that ended during its breaks",
                h.sessions_in_breaks(p["sessions_during_breaks"], LIVE),
            ),
        ],
    )


def runs(
    con: duckdb.DuckDBPyConnection, q: Mapping[str, str], policy: str, policy_name: str
) -> Page:
    keys = ("baseline", "candidate", "baseline_condition", "candidate_condition",
            "baseline_group", "candidate_group")  # fmt: skip
    b, c, bc, cc, bg, cg = (q.get(k) or None for k in keys)
    p = qs.runs_page(con, b, c, bc, cc, policy, bg, cg)
    ids = [r["run_id"] for r in p["runs"]]
    groups = sorted({r["run_group_id"] for r in p["runs"] if r.get("run_group_id")})

    def select(name: str, chosen: str | None, among: list[str] = ids) -> str:
        options = "".join(
            f'<option value="{e(i)}"{" selected" if i == chosen else ""}>{e(i)}</option>'
            for i in among
        )
        return (
            f'<label>{name}<select name="{name}"><option value=""></option>{options}'
            "</select></label>"
        )

    def text(name: str, value: str | None) -> str:
        return (
            f'<label>{name.replace("_", " ")}<input name="{name}" value="{e(value or "")}" '
            'placeholder="(the only one)"></label>'
        )

    form = (
        '<form class="filters" method="get" action="/runs">'
        + select("baseline", b)
        + select("candidate", c)
        + (
            select("baseline_group", bg, groups) + select("candidate_group", cg, groups)
            if groups
            else ""
        )  # fmt: skip
        + text("baseline_condition", bc)
        + text("candidate_condition", cc)
        + '<button type="submit">compare</button></form>'
    )
    sections = [("runs", "Benchmark runs", h.runs(p["runs"], LIVE))]
    if p["comparison"] is not None:
        sections.append(("compare", "compare: paired by question", h.comparison(p["comparison"])))
    if p["error"]:
        sections.append(("compare", "compare", f'<p class="failed">{e(p["error"])}</p>'))
    if p["verdict"] is not None:
        sections.append(("gate", f"gate, under {policy_name}", h.gate(p["verdict"])))
    return Page(
        "benchmark runs",
        f"{len(ids):,} runs"
        + (
            f" · {e(b or 'group ' + (bg or ''))} → {e(c or 'group ' + (cg or ''))}"
            if (b or bg) and (c or cg)
            else ""
        ),  # fmt: skip
        sections,
        # a comparison refused (a run against itself, a condition to choose): the user's
        # request, said on the page
        status=400 if p["error"] else 200,
        top=form,
    )


def dead_letters(con: duckdb.DuckDBPyConnection) -> Page:
    rows = qs.DEAD_LETTERS.answer(con, {}, reason=None, samples=5)
    total = sum(r["dead_letters"] for r in rows)
    return Page(
        "dead letters",
        f"{total:,} inputs memdiag could not process",
        [("dead-letters", "By reason", h.dead_letters(rows))],
    )
