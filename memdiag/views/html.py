"""The answers as HTML fragments: what the static report, ``explain --html`` and the live
pages of ``memdiag serve`` all show, written once.

Every value is escaped here (:func:`e`); ids become links only through :class:`Links`, so the
static report (links within the page) and the live view (a page per session, memory and
agent) share every fragment. No fragment has a script or a ``style`` attribute: the live
pages' Content-Security-Policy allows neither.

Rows carry ``data-key`` (their id) and collapsible rows are ``<details data-key>``: the live
pages mark new rows and keep open ones open across an update by those keys.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from memdiag.contract import (
    CATEGORIES,
    FOLLOWUP_CAVEAT,
    MISLEADING_CAVEAT,
    USED_CAVEAT,
)
from memdiag.contract import pages as paths
from memdiag.contract.words import SEMANTIC
from memdiag.views import charts


def e(value: object) -> str:
    """Escaped text, safe in an element and in a quoted attribute."""
    return html.escape("" if value is None else str(value), quote=True)


def _none(*_: Any) -> str | None:
    return None


@dataclass(frozen=True)
class Links:
    """Where an id links to, or None for plain text."""

    session: Callable[[str], str | None] = _none
    memory: Callable[[str, str | None], str | None] = _none
    agent: Callable[[str], str | None] = _none
    runs: Callable[[str | None, str | None], str | None] = _none


#: the live view: every id has its page
LIVE = Links(
    session=paths.session_path,
    memory=paths.memory_path,
    agent=paths.agent_path,
    runs=paths.runs_path,
)
#: no links (a page on its own)
PLAIN = Links()


def a(href: str | None, text: object, cls: str | None = None) -> str:
    """A link to ``href`` reading ``text`` (escaped); plain text without an href."""
    c = f' class="{e(cls)}"' if cls else ""
    if not href:
        return f"<span{c}>{e(text)}</span>" if cls else e(text)
    return f'<a href="{e(href)}"{c}>{e(text)}</a>'


def fmt(v: Any) -> str:
    """A cell's text: — for nothing, times in UTC to the second, floats to 3 places."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, datetime):
        return v.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(v)


def pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}%}"


def td(v: Any, html_text: str | None = None) -> str:
    """A cell: numbers right-aligned; ``html_text`` (already escaped) instead of ``v``'s text."""
    numeric = isinstance(v, int | float) and not isinstance(v, bool)
    text = html_text if html_text is not None else e(fmt(v))
    if numeric:
        return f'<td class="n">{text}</td>'
    return f'<td class="t">{text}</td>' if isinstance(v, datetime) else f"<td>{text}</td>"


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    keys: Sequence[str] | None = None,
    numeric: Sequence[int] = (),
    cls: str = "",
) -> str:
    """A table of ready cells (``td``): its rows keyed ``data-key`` when ``keys`` are given."""
    head = "".join(
        f'<th class="n">{e(h)}</th>' if i in numeric else f"<th>{e(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = []
    for i, cells in enumerate(rows):
        key = f' data-key="{e(keys[i])}"' if keys is not None else ""
        body.append(f"<tr{key}>{''.join(cells)}</tr>")
    c = f' class="{e(cls)}"' if cls else ""
    return (
        f'<div class="scroll"><table{c}><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def note(text: str) -> str:
    """A note under a figure (``text`` is HTML)."""
    return f'<p class="note">{text}</p>'


def shown(count: int, total: int, what: str, how: str) -> str:
    """ "10 of 218 failed sessions shown: ...", only when the list was cut (``how`` is HTML)."""
    if total <= count:
        return ""
    return f'<p class="cut">{count:,} of {total:,} {e(what)} shown: {how}</p>'


def section(title: str, body: str, id: str | None = None, live: str | None = None) -> str:
    """A titled section; ``live``: the URL its body is refreshed from."""
    attrs = f' id="{e(id)}"' if id else ""
    if live:
        attrs += f' data-live="{e(live)}"'
    return f'<section{attrs}><h2>{e(title)}</h2><div class="body">{body}</div></section>'


# -- the overview: status cards, failures, misleading, dead weight, dead letters ------------


def cards(st: dict[str, Any], links: Links) -> str:
    """The status cards: followups, used share, sessions and failures, misleading, pipeline
    health, recall falls, dead letters, freshness."""
    fu, fb = st["followup"], st["feedback"]
    judged = fb["used"] + fb["ignored"]
    sessions = st["sessions"]
    total = sum(sessions.values())
    failed = total - sessions.get("accepted", 0)
    proxies = st.get("proxies") or {}
    p = st.get("pipeline")
    dead = sum(d["dead_letters"] for d in st["dead_letters"])
    tiles = [
        (
            "followup rate",
            pct(fu["rate"]),
            f"of {fu['agent_searches']:,} agent searches",
            _proxy(proxies.get("followups")),
            None,
        ),
        (
            "memories used",
            pct(fb["used_share"]),
            f"of {judged:,} judged injections",
            _proxy(proxies.get("ignored")),
            None,
        ),
        (
            "sessions failed",
            pct(failed / total if total else None),
            f"{failed:,} of {total:,} sessions",
            "",
            None,
        ),
        (
            "misleading memories",
            f"{st['misleading']['count']:,}",
            "≥ 3 failed sessions, none accepted",
            "co-occurrence, not cause",
            "#misleading",
        ),
    ]
    if p is None:
        tiles.append(("memory pipeline", "—", "this file predates it", "", None))
    elif not p["agents"]:
        tiles.append(("memory pipeline", "—", "no memory events", "", None))
    else:
        broken = p["broken"]
        first = broken[0]["agent_id"] if broken else None
        tiles.append(
            (
                "pipelines broken",
                f"{len(broken)} of {p['agents']}",
                ", ".join(b["agent_id"] for b in broken[:3]) or "every agent indexing",
                "",
                links.agent(first) if first else None,
            )
        )
        f = p.get("recall_fell")
        if f is not None:
            fell = f["agents"]
            sub = (
                ", ".join(a["agent_id"] for a in fell[:3])
                if fell
                else f"{f['checked']} of {f['probing_agents']} probing agents judged"
            )
            tiles.append(
                (
                    "recall fell",
                    f"{len(fell)}",
                    sub,
                    "",
                    links.agent(fell[0]["agent_id"]) if fell else None,
                )
            )
    tiles.append(
        (
            "dead letters",
            f"{dead:,}",
            ", ".join(f"{d['reason']} {d['dead_letters']}" for d in st["dead_letters"][:3])
            + (f", {len(st['dead_letters']) - 3} more" if len(st["dead_letters"]) > 3 else "")
            or "none",
            "",
            "/dead-letters" if links is LIVE and dead else None,
        )
    )
    newest = st["freshness"]["newest_event"]
    tiles.append(
        (
            "newest event",
            newest.astimezone(UTC).strftime("%H:%M:%S") if newest else "—",
            newest.astimezone(UTC).strftime("%Y-%m-%d UTC") if newest else "no events",
            "",
            None,
        )
    )
    out = []
    for label, value, sub, warn, href in tiles:
        w = f'<div class="warn">{e(warn)}</div>' if warn else ""
        v = a(href, value) if href else e(value)
        out.append(
            f'<div class="tile" data-key="{e(label)}"><div class="label">{e(label)}</div>'
            f'<div class="value">{v}</div><div class="sub">{e(sub)}</div>{w}</div>'
        )
    return f'<div class="tiles">{"".join(out)}</div>'


def _proxy(p: dict[str, Any] | None) -> str:
    """A proxy ``calibrate`` finds uninformative on this file, said beside it."""
    if not p or p.get("informative", True):
        return ""
    return str(p["words"])


def failure_distribution(rows: list[dict[str, Any]]) -> str:
    total = sum(r["sessions"] for r in rows)
    bars = charts.hbars(
        [
            (
                r["failure_category"],
                r["sessions"],
                f"{r['sessions']:,} ({r['sessions'] / total:.0%})" if total else "0",
            )
            for r in rows
        ],
        "Failed sessions by category",
    )
    return bars + note(
        f"{total:,} failed sessions (rejected or rework) by the first rule that holds "
        f"({', '.join(CATEGORIES[:-1])}; unknown: a category this version does not give)."
    )


def misleading(m: dict[str, Any], links: Links) -> str:
    """Misleading memories (with the failed session each was last in) and the graph's."""
    top = m["top"]
    if not top:
        body = "<p>None: no memory is in 3 or more failed sessions and no accepted one.</p>"
    else:
        body = table(
            [
                "memory",
                "failed sessions",
                "accepted sessions",
                "weight now",
                "latest failed session",
            ],
            [
                [
                    td(None, a(links.memory(r["observation_id"], None), r["observation_id"])),
                    td(r["fail_count"]),
                    td(r["success_count"]),
                    td(r["weight"]),
                    td(
                        None,
                        a(
                            links.session(r["latest_failed_session_id"]),
                            r["latest_failed_session_id"],
                        )
                        if r.get("latest_failed_session_id")
                        else "—",
                    ),
                ]
                for r in top
            ],
            keys=[r["observation_id"] for r in top],
            numeric=(1, 2, 3),
        )
        body += shown(
            len(top), m["count"], "misleading memories", "<code>memdiag query misleading</code>"
        )
    graph = m.get("graph") or []
    if graph:
        body += "<h3>Knowledge graph</h3>" + table(
            ["kind", "entity, or edge source|target|relationship", "failed sessions", "weight now"],
            [
                [td(g["kind"]), td(g["id"]), td(g["failed_sessions"]), td(g["weight"])]
                for g in graph
            ],
            keys=[f"{g['kind']}:{g['id']}" for g in graph],
            numeric=(2, 3),
        )
        body += shown(
            len(graph),
            m.get("graph_count", len(graph)),
            "graph entities and edges",
            "<code>memdiag query misleading --graph</code>",
        )
    return body + note(
        f"In 3 or more failed sessions and no accepted one. {e(MISLEADING_CAVEAT[0].upper())}"
        f"{e(MISLEADING_CAVEAT[1:])}. Their weights go back to the memory system, doubled "
        "down (<code>memdiag.weights</code>, <code>memdiag.graph_weights</code>)."
    )


def dead_weight(u: dict[str, Any], links: Links) -> str:
    top = u["top"]
    if not top:
        return (
            f"<p>None: every memory judged in {u['min_injections']} or more turns was "
            "used in at least one.</p>"
        )
    body = table(
        ["memory", "judged turns", "sessions", "strength", "weight", "last judged (UTC)"],
        [
            [
                td(None, a(links.memory(r["observation_id"], None), r["observation_id"])),
                td(r["judged_turns"]),
                td(r["sessions"]),
                td(r["strength"]),
                td(r["weight"]),
                td(r["last_judged_at"]),
            ]
            for r in top
        ],
        keys=[r["observation_id"] for r in top],
        numeric=(1, 2, 3, 4),
    )
    return (
        body
        + shown(
            len(top),
            u.get("count", len(top)),
            "dead-weight memories",
            "<code>memdiag query unused-memories</code>",
        )
        + note(
            f"Judged in {u['min_injections']} or more turns and used in none: candidates to prune "
            f"or demote. Strength is the EMA of the verdicts; {e(USED_CAVEAT)}."
        )
    )


def dead_letter_counts(rows: list[dict[str, Any]], links: Links) -> str:
    if not rows:
        return "<p>None: every input was processed.</p>"
    more = (
        a("/dead-letters", "samples and what to do")
        if links is LIVE
        else ("<code>memdiag query dead-letters</code>")
    )
    return table(
        ["reason", "dead letters", "newest (UTC)"],
        [[td(r["reason"]), td(r["dead_letters"]), td(r["latest"])] for r in rows],
        keys=[r["reason"] for r in rows],
        numeric=(1,),
    ) + note(f"Inputs memdiag could not process, by reason: {more}.")


def failed_sessions(rows: Any, links: Links, more: str = "") -> str:
    """The newest failed sessions, each linking to its story."""
    if not rows:
        return "<p>No failed session.</p>"
    body = table(
        [
            "session",
            "agent",
            "outcome",
            "category",
            "searches",
            "followups",
            "ignored",
            "misleading",
            "ended (UTC)",
        ],
        [
            [
                td(None, a(links.session(r["session_id"]), r["session_id"])),
                td(
                    None,
                    a(links.agent(r["agent_id"]) if r["agent_id"] else None, r["agent_id"] or "—"),
                ),
                td(r["outcome"]),
                td(r["failure_category"] or "unknown"),
                td(r["search_count"]),
                td(r["followup_count"]),
                td(r["ignored"]),
                td(r["misleading"]),
                td(r["ts"]),
            ]
            for r in rows
        ],
        keys=[r["session_id"] for r in rows],
        numeric=(4, 5, 6, 7),
    )
    total = getattr(rows, "total", len(rows))
    return body + shown(
        len(rows),
        total,
        "failed sessions",
        more or "<code>memdiag query failed-sessions --limit N</code>",
    )


# -- a session: what `explain` says ---------------------------------------------------------


def anchor(session_id: str) -> str:
    """A fragment id for a session: any session id, safe in a URL and an attribute."""
    import hashlib

    return "session-" + hashlib.blake2b(session_id.encode("utf-8"), digest_size=8).hexdigest()


def explain(ex: dict[str, Any], links: Links) -> str:
    """One session's story as a timeline: its searches, its turns with each memory used or
    ignored, the outcome and the rule that decided it, the pipeline break it ended in, and
    the weight step it gave each memory."""
    from memdiag.analytics.explain import (
        pipeline_down,
        plural,
        search_summary,
        timeline,
        turn_summary,
        verdict_text,
    )

    o = ex["outcome"]
    agent = ex["agent_id"]
    scope = " · ".join(
        ([f"agent {a(links.agent(agent), agent)}"] if agent else [])
        + [f"{k.removesuffix('_id')} {e(ex[k])}" for k in ("org_id", "project_id") if ex[k]]
    )
    if o is None:
        verdict = (
            '<span class="pending">no outcome yet</span>: the session is open, or its '
            "outcome is late (this page updates when it comes)"
        )
    elif o["failed"]:
        verdict = (
            f'<span class="failed">{e(o["outcome"])}</span> · '
            f"<b>{e(o['failure_category'] or 'unknown')}</b> — {e(o['rule'] or '')}"
        )
    else:
        verdict = f'<span class="accepted">{e(o["outcome"])}</span>'
    parts = [
        f'<p class="verdict">{verdict}</p>',
        f'<p class="meta">{scope}</p>' if scope else "",
        f"<p>{e(search_summary(ex))} · {e(turn_summary(ex))}</p>",
    ]
    if ex["never_searched"]:
        parts.append(
            '<p class="failed"><b>Never searched</b>: the agent did not ask its memory '
            "in this session.</p>"
        )
    if ex["dead_letters"]:
        dead = ex["dead_letters"]
        newest = f", the newest {len(dead)}" if dead[0]["in_all"] > len(dead) else ""
        items = "".join(
            f"<li><b>{e(d['reason'])}</b> "
            f"{e(' '.join(x for x in (d['event_kind'], d['event_id']) if x) or 'a message')}: "
            f"{e(d['detail'])}</li>"
            for d in dead
        )
        count = plural(dead[0]["in_all"], "input")
        parts.append(
            f'<p class="failed"><b>{e(count)} of this session not taken</b> '
            f"(dead letters{newest}):</p><ul>{items}</ul>"
        )
    down = pipeline_down(ex)
    if down is not None:
        href = links.agent(agent) if agent else None
        parts.append(f'<p class="failed"><b>{a(href, down[0])}</b>{e(down[1])}</p>')
    trs = []
    for item in timeline(ex):
        at = f'<td class="n">+{item["at"]:,.1f} s</td>'
        if item["kind"] == "search":
            s = item["search"]
            query = f" <code>{e(repr(s['query']))}</code>" if s["query"] is not None else ""
            cls = ' class="followup"' if s["is_followup"] else ""
            n = s["result_count"]
            trs.append(
                f'<tr data-key="search:{e(s["event_id"])}">{at}<td>search '
                f"{e(s['event_id'])}</td><td{cls}>{n} result{'s' if n != 1 else ''} · "
                f"{e(s['verdict'])}{query}</td></tr>"
            )
        elif item["kind"] == "turn":
            t = item["turn"]
            trs.append(
                f'<tr data-key="turn:{e(t["turn_id"])}">{at}<td>turn {e(t["turn_id"])}'
                f"</td><td>{len(t['memories'])} memories: {t['used']} used, "
                f"{t['ignored']} ignored</td></tr>"
            )
            for m in t["memories"]:
                strength = ""
                if m.get("strength") is not None:
                    strength = (
                        f' <span class="dim">· strength {m["previous_strength"]:.3f} → '
                        f"{m['strength']:.3f}</span>"
                    )
                trs.append(
                    f'<tr class="sub-row" data-key="verdict:{e(t["turn_id"])}:'
                    f'{e(m["observation_id"])}"><td></td>'
                    f"<td>{a(links.memory(m['observation_id'], None), m['observation_id'])}</td>"
                    f'<td><span class="{e(m["signal"])}">{e(m["signal"])}</span> '
                    f"{e(verdict_text(m))}{strength}</td></tr>"
                )
        else:
            oc = item["outcome"]
            cat = f" · {e(oc['failure_category'] or 'unknown')}" if oc["failed"] else ""
            trs.append(
                f'<tr data-key="outcome">{at}<td>outcome {e(oc["event_id"])}</td>'
                f"<td>{e(oc['outcome'])}{cat}</td></tr>"
            )
    parts.append(
        '<div class="scroll"><table class="timeline"><thead><tr><th class="n">at</th>'
        f"<th>event</th><th>what</th></tr></thead><tbody>{''.join(trs)}</tbody>"
        "</table></div>"
    )

    def ids(label: str, values: list[str]) -> None:
        if values:
            parts.append(
                f"<p>{e(label)}: " + ", ".join(a(links.memory(x, None), x) for x in values) + "</p>"
            )

    ids("Injected but never judged (their turn had no response)", ex["unjudged_memories"])
    if o is not None:
        ids("Ignored in every evaluated turn", o["ignored_observation_ids"] or [])
        ids("Reported helpful by the runtime", o["helpful_observation_ids"] or [])
    if o is not None and o["failed"]:
        calls = "; ".join(
            e(c["tool"] + (f" {c['file']}" if c["file"] else ""))
            + (" ok" if c["success"] else ' <span class="failed">failed</span>')
            for c in o["tool_calls"] or []
        )
        if calls:
            parts.append(f"<p>Tool calls: {calls}</p>")
        errors = "".join(f"<li>{e(x['tool'])}: {e(x['message'])}</li>" for x in o["errors"] or [])
        if errors:
            parts.append(f"<p>Errors (the evidence the category rests on):</p><ul>{errors}</ul>")
        if o["files_modified"] is not None:
            files = ", ".join(e(f) for f in o["files_modified"]) or "none"
            parts.append(f"<p>Files modified: {files}</p>")
    if ex["weights"]:
        rows = []
        for w in ex["weights"]:
            mis = "<b class=failed>yes</b>" if w["misleading"] else "no"
            if w["misleading"] and w["misleading_now"] is False:
                mis += " (no longer)"
            rows.append(
                [
                    td(None, a(links.memory(w["observation_id"], None), w["observation_id"])),
                    td(None, mis),
                    td(w["previous_weight"]),
                    td(w["new_weight"]),
                    td(w["alpha"], f"{w['alpha']:g}" + (" (doubled)" if w["aggressive"] else "")),
                    td(w["weight_now"]),
                ]
            )
        parts.append(
            "<h3>The weight step of each memory (misleading first)</h3>"
            + table(
                ["memory", "misleading", "before", "after", "alpha", "weight now"],
                rows,
                keys=[w["observation_id"] for w in ex["weights"]],
                numeric=(2, 3, 4, 5),
            )
        )
        if any(w["misleading"] for w in ex["weights"]):
            parts.append(note(f"Misleading: {e(MISLEADING_CAVEAT)}."))
    return "".join(parts)


# -- a memory -------------------------------------------------------------------------------


def _similarity(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def memory(m: dict[str, Any], links: Links) -> str:
    """One memory: its counts, weight and strength over time, misleading or dead weight, its
    verdicts and the sessions it was in; with an agent, its recall story too."""
    parts = []
    st = m["stats"]
    if st is not None:
        badges = []
        if st["misleading"]:
            badges.append(
                '<span class="badge failed">misleading</span> '
                f'<span class="dim">{e(MISLEADING_CAVEAT)}</span>'
            )
        if st["dead_weight"]:
            badges.append(
                '<span class="badge warn">dead weight</span> <span class="dim">judged '
                "in 5 or more turns, used in none</span>"
            )
        parts.append("".join(f"<p>{b}</p>" for b in badges))
        judged = st["used"] + st["ignored"]
        facts = [
            ("used", f"{st['used']:,} of {judged:,} judged turns ({pct(st['used_share'])})"),
            (
                "weight",
                "—"
                if st["weight"] is None
                else f"{st['weight']:.3f} after {st['failed_sessions']} failed and "
                f"{st['accepted_sessions']} accepted sessions",
            ),
            (
                "strength",
                "—"
                if st["strength"] is None
                else f"{st['strength']:.3f} after {st['strength_steps']:,} judged turns",
            ),
        ]
        parts.append(
            '<dl class="facts">'
            + "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in facts)
            + "</dl>"
        )
        steps = m["steps"]
        # the steps come thinned for the chart (queries.observation_steps), placed by number
        wpoints = [
            charts.Point(s["n"], s["new_weight"], label=f"{s['session_id']} ({s['outcome']})")
            for s in steps["weight"]
        ]
        spoints = [
            charts.Point(
                s["n"], s["strength"], label=f"{s['session_id']} {s['turn_id']} ({s['signal']})"
            )
            for s in steps["strength"]
        ]
        if wpoints:
            parts.append(
                "<h3>Weight over its sessions (in outcome order)</h3>"
                + charts.line(wpoints, "Weight after each session")
            )
        if spoints:
            parts.append(
                "<h3>Strength over its judged turns</h3>"
                + charts.line(spoints, "Strength after each judged turn", colour=charts.USED)
            )
        total = steps["weight_total"]
        sessions = [s for s in reversed(steps["weight"]) if s["n"] > total - 50]
        if sessions:
            parts.append(
                "<h3>The sessions it was in (the newest first)</h3>"
                + table(
                    [
                        "session",
                        "outcome",
                        "category",
                        "weight before",
                        "after",
                        "alpha",
                        "outcome at (UTC)",
                    ],
                    [
                        [
                            td(None, a(links.session(s["session_id"]), s["session_id"])),
                            td(None, _outcome(s["outcome"])),
                            td(
                                s["failure_category"]
                                or ("—" if s["outcome"] == "accepted" else "unknown")
                            ),
                            td(s["previous_weight"]),
                            td(s["new_weight"]),
                            td(
                                s["alpha"],
                                f"{s['alpha']:g}" + (" (doubled)" if s["aggressive"] else ""),
                            ),
                            td(s["ts"]),
                        ]
                        for s in sessions
                    ],
                    keys=[s["session_id"] for s in sessions],
                    numeric=(3, 4, 5),
                )
                + shown(
                    len(sessions),
                    total,
                    "sessions",
                    "its weight history in DuckDB: <code>observation_weight_history</code>",
                )
            )
        from memdiag.analytics.explain import verdict_rule

        history = m["history"]
        semantic = any(h.get("detector") == SEMANTIC for h in history)
        if history:
            parts.append(
                "<h3>Its verdicts (the newest first)</h3>"
                + table(
                    [
                        "judged at (UTC)",
                        "session",
                        "turn",
                        "verdict",
                        "ratio",
                        "matched of keywords",
                        *(["similarity", "rule"] if semantic else []),
                        "session outcome",
                    ],
                    [
                        [
                            td(h["ts"]),
                            td(None, a(links.session(h["session_id"]), h["session_id"])),
                            td(h["turn_id"]),
                            td(None, f'<span class="{e(h["signal"])}">{e(h["signal"])}</span>'),
                            td(h["match_ratio"], f"{h['match_ratio']:.2f}"),
                            td(h["matched_count"], f"{h['matched_count']} of {h['keyword_count']}"),
                            *(
                                [
                                    td(h["similarity"], _similarity(h["similarity"])),
                                    td(verdict_rule(h)),
                                ]
                                if semantic
                                else []
                            ),
                            td(
                                (h["outcome"] or "open")
                                + (f" · {h['failure_category']}" if h["failure_category"] else "")
                            ),
                        ]
                        for h in history
                    ],
                    keys=[f"{h['session_id']}:{h['turn_id']}" for h in history],
                    numeric=(4, 5, 6) if semantic else (4, 5),
                )
                + shown(
                    len(history),
                    getattr(history, "total", len(history)),
                    "verdicts",
                    "<code>memdiag query observation-history ID --limit N</code>",
                )
            )
    recall = m.get("recall")
    if recall is not None:
        parts.append(
            "<h3>Its recall (agent "
            f"{a(links.agent(recall['agent_id']), recall['agent_id'])})</h3>"
            + explain_memory(recall, links)
        )
    elif m.get("recall_agents"):
        parts.append(
            "<p>Also a memory of the recall pipeline of: "
            + ", ".join(a(links.memory(m["id"], ag), ag) for ag in m["recall_agents"])
            + "</p>"
        )
    return "".join(parts)


def explain_memory(ex: dict[str, Any], links: Links) -> str:
    """One memory of an agent's recall pipeline: its record, whether a path reaches it, its
    probes with why each missed and what came back instead."""
    m = ex["memory"]
    parts = []
    if m is None:
        parts.append("<p>No memory_written or memory_indexed of it: only probed.</p>")
    else:
        status = m["status"]
        cls = {"indexed": "accepted", "unindexed": "failed", "pending": "pending"}.get(status, "")
        line = (
            f'<span class="{cls}">{e(status)}</span> · written {e(fmt(m["written_at"]))} · '
            f"indexed {e(fmt(m['indexed_at']))}"
        )
        if m["index_delay_seconds"] is not None:
            line += f" ({m['index_delay_seconds']:,.1f} s later)"
        if m["name"]:
            line += f" · name <code>{e(m['name'])}</code> (key <code>{e(m['name_key'])}</code>)"
        parts.append(f"<p>{line}</p>")
        if ex["unreachable"]:
            parts.append(
                '<p class="failed"><b>Unreachable</b>: past the index deadline unindexed '
                "and not in the latest ambient context; no path brings it back.</p>"
            )
        if m["look_alikes"]:
            parts.append(
                f"<p>{m['look_alikes']} other memories of the agent are look-alikes of its "
                "name (the same name key, or half the tokens): they can alias it.</p>"
            )
        if m["broken_since"] is not None:
            parts.append(
                f'<p class="failed">The agent\'s pipeline is broken since '
                f"{e(fmt(m['broken_since']))} UTC.</p>"
            )
    latest, task = ex["latest"], ex.get("latest_task")
    if latest is None and task is None:
        parts.append("<p>Never probed: publish recall_probe events to see whether it is found.</p>")
        return "".join(parts)
    if latest is None:
        parts.append("<p>No probe made from its name: only task probes (SRR counts none).</p>")
    elif latest["hit"]:
        parts.append('<p>Latest probe by its name: <span class="accepted">hit</span>.</p>')
    else:
        parts.append(
            f'<p>Latest probe by its name: <span class="failed">missed</span>, '
            f"<b>{e(latest['miss_reason'])}</b>: look at {e(latest['look_at'])}.</p>"
        )
    if task is not None and task["hit"]:
        parts.append('<p>Latest probe by a task: <span class="accepted">hit</span>.</p>')
    elif task is not None:
        parts.append(
            '<p>Latest probe by a task: <span class="failed">missed</span>'
            + (f": look at {e(task['look_at'])}." if task["look_at"] else ".")
            + "</p>"
        )
    rows = []
    for p in ex["probes"]:
        tops = []
        for t in p["top"]:
            label = a(links.memory(t["memory_id"], ex["agent_id"]), t["memory_id"])
            if t["name"]:
                label += f' <span class="dim">{e(t["name"])}</span>'
            if t["is_target"]:
                label = f"<b>{label}</b>"
            elif t["look_alike"]:
                label = f'<span class="warn">{label} (look-alike)</span>'
            tops.append(label)
        verdict = (
            '<span class="accepted">hit</span>'
            if p["hit"]
            else f'<span class="failed">{e(p["miss_reason"] or "missed")}</span>'
        )
        rows.append(
            [
                td(p["ts"]),
                td(p["query_source"]),
                td(None, verdict),
                td(p["rank"]),
                td(p["score"], "—" if p["score"] is None else f"{p['score']:.2f}"),
                td(None, ", ".join(tops) or "none kept"),
            ]
        )
    ps = ex["probe_summary"]
    return (
        "".join(parts)
        + table(
            [
                "probed at (UTC)",
                "query from",
                "verdict",
                "rank",
                "score",
                "what came back (first k)",
            ],
            rows,
            keys=[str(p["event_id"]) for p in ex["probes"]],
            numeric=(3, 4),
        )
        + note(
            "Query from: the memory's name (what SRR counts, with why it missed) or a task it "
            "should serve (a miss there is the query-formulation gap, no reason given)."
        )
        + shown(
            ps["shown"],
            ps.get("total", ps["shown"]),
            "probes",
            "<code>memdiag explain-memory ID --agent A --limit N</code>",
        )
    )


# -- the recall pipeline --------------------------------------------------------------------


def pipeline_table(agents: list[dict[str, Any]], links: Links) -> str:
    """Pipeline health per agent, broken first: coverage, recall, why probes missed."""
    rows = []
    for r in agents:
        state = '<b class="failed">broken</b>' if r["broken"] else "ok"
        if not r["broken"] and r["semantic_recall_rate"] == 0:
            state = '<b class="failed">recalls nothing</b>'
        misses = (
            f"{r['not_indexed_misses']} / {r['below_threshold_misses']} / "
            f"{r['aliased_misses']} / {r['outranked_misses']}"
            if r["missed"]
            else "none"
        )
        rows.append(
            [
                td(None, a(links.agent(r["agent_id"]), r["agent_id"])),
                td(None, state),
                td(r["written"]),
                td(r["indexed"]),
                td(r["unindexed"]),
                td(r["pipeline_coverage"], pct(r["pipeline_coverage"], 0)),
                td(r["semantic_recall_rate"], pct(r["semantic_recall_rate"], 0)),
                td(r["probed"]),
                td(None, e(misses)),
                td(r["ambient_trigger_rate"], pct(r["ambient_trigger_rate"], 0)),
                td(r["unreachable"]),
                td(r["broken_since"]),
            ]
        )
    return table(
        [
            "agent",
            "state",
            "written",
            "indexed",
            "unindexed",
            "PC",
            "SRR",
            "probed",
            "misses: not indexed / below thr. / aliased / outranked",
            "ATR",
            "unreachable",
            "broken since (UTC)",
        ],
        rows,
        keys=[r["agent_id"] for r in agents],
        numeric=(2, 3, 4, 5, 6, 7, 9, 10),
        cls="wide",
    ) + note(
        "PC (pipeline coverage): indexed over written. SRR (semantic recall rate): probed "
        "memories their own name's probe found in its top k above its threshold (probes made "
        "from a task are not in it). ATR (ambient trigger "
        "rate): written memories in the latest ambient context (the trends' ATR is the mean "
        "over a bucket's contexts instead, so the two differ). Broken: a memory missed its "
        "index deadline and nothing was indexed since; an agent that never reports indexing "
        "shows as broken. PC misses an indexer that acknowledges but stores garbage: SRR "
        "catches it (an agent recalling nothing is marked so). Unreachable: past the deadline "
        "and not in the latest ambient context."
    )


def query_sources(agents: list[dict[str, Any]], links: Links) -> str:
    """The agents with task probes: their recall beside SRR, and the gap (the recall paper's
    query-formulation failure); nothing when no agent has task probes."""
    rows = [
        [
            td(None, a(links.agent(r["agent_id"]), r["agent_id"])),
            td(r["probed"]),
            td(r["semantic_recall_rate"], pct(r["semantic_recall_rate"], 0)),
            td(r["task_probed"]),
            td(r["task_recall_rate"], pct(r["task_recall_rate"], 0)),
            td(r["query_formulation_gap"], gap_text(r["query_formulation_gap"])),
        ]
        for r in agents
        if r.get("task_probed")
    ]
    if not rows:
        return ""
    return (
        "<h3>Recall by query source: names against tasks</h3>"
        + table(
            ["agent", "probed by name", "SRR", "probed by task", "task recall", "gap"],
            rows,
            keys=[r["agent_id"] for r in agents if r.get("task_probed")],
            numeric=(1, 2, 3, 4, 5),
        )
        + note(
            "A probe's query is made from the memory's name (SRR, the table above) or from the "
            "text of a task the memory should serve (task recall), each memory by its latest "
            "probe of that source. A memory its name finds and its tasks do not is the recall "
            "paper's query-formulation failure: the pipeline works, the query does not reach "
            "it. The gap is SRR minus task recall, in points."
        )
    )


def gap_text(gap: float | None) -> str:
    """SRR minus task recall, in percentage points (escaped)."""
    return "n/a" if gap is None else e(f"{gap * 100:+.0f} pts")


def recall_fell(p: dict[str, Any] | None, links: Links) -> str:
    """The agents whose recall fell from their previous window, or whose probes stopped."""
    from memdiag.analytics.status import span_text

    f = (p or {}).get("recall_fell")
    if not f or not (f["agents"] or f["stopped_probing"]):
        return ""
    window = span_text(f["window_seconds"])
    items = "".join(
        f"<li><b>{a(links.agent(x['agent_id']), x['agent_id'])}</b>: "
        f"{pct(x['previous_semantic_recall_rate'])} ({x['previous_probed']} probed) → "
        f"{pct(x['semantic_recall_rate'])} ({x['probed']} probed), as of "
        f"{e(fmt(x['window_end']))} UTC</li>"
        for x in f["agents"]
    ) + "".join(
        f"<li><b>{a(links.agent(x['agent_id']), x['agent_id'])}</b>: probes stopped "
        f"({x['previous_probed']} probed the {e(window)} before, none since)</li>"
        for x in f["stopped_probing"]
    )
    return (
        f'<p class="failed">Recall fell (by more than {f["drop_points"]:g} points and '
        f"{f['min_z']:g} standard errors), or its probes stopped: the last {e(window)} "
        f"against the {e(window)} before.</p><ul>{items}</ul>"
    )


def recall_trend_chart(
    rows: list[dict[str, Any]], key: str, title: str, by_count: bool, order: Sequence[str] = ()
) -> str:
    """SRR or ATR (``key``) per agent, small multiples: over time, or over the memory count
    (each bucket one step along)."""
    agents: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        agents.setdefault(r["agent_id"], []).append(r)
    names = [x for x in order if x in agents] + sorted(x for x in agents if x not in order)
    count = {"semantic_recall_rate": "probed", "task_recall_rate": "task_probed"}.get(
        key, "ambient_contexts"
    )
    series = []
    ticks: dict[float, str] = {}
    for name in names:
        pts = []
        for r in agents[name]:
            if by_count:
                x = float(int(r["memory_count_to"]).bit_length())
                lo, hi = r["memory_count_from"], r["memory_count_to"]
                label = f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,} memories"
                ticks[x] = f"≤{hi:,}"
            else:
                x = r["bucket_start"].timestamp()
                label = r["bucket_start"].astimezone(UTC).strftime("%Y-%m-%d %H:%M")
            pts.append(charts.Point(x, r[key], r[count], label))
        last = next((p for p in reversed(pts) if p.y is not None), None)
        series.append((name, pts, pct(last.y if last else None)))
    if by_count:
        x_labels = sorted(ticks.items())
    else:
        xs = [p.x for _, pts, _ in series for p in pts]
        x_labels = charts.time_ticks(min(xs), max(xs)) if xs else []
    # a rate of fewer than 3 probes is hollow; every ambient context is a whole figure
    return charts.small_multiples(
        series, title, x_labels, min_n=1 if count == "ambient_contexts" else 3
    )


def break_spans(spans: list[dict[str, Any]], links: Links, agent: str) -> str:
    if not spans:
        return "<p>No break: every memory was indexed within the deadline.</p>"
    return table(
        [
            "down since (UTC)",
            "until (UTC)",
            "first missed memory",
            "memories waiting",
            "sessions ended",
            "of which failed",
        ],
        [
            [
                td(s["since"]),
                td(None, e(fmt(s["until"])) if s["until"] else '<b class="failed">still down</b>'),
                td(None, a(links.memory(s["first_memory_id"], agent), s["first_memory_id"])),
                td(s["memories"]),
                td(s["sessions"]),
                td(s["failed_sessions"]),
            ]
            for s in spans
        ],
        keys=[str(s["since"]) for s in spans],
        numeric=(3, 4, 5),
    )


def unindexed(rows: Any, links: Links, agent: str) -> str:
    """An agent's unindexed memories, the unreachable ones (no path brings them back) marked."""
    if not rows:
        return "<p>None: every written memory is indexed, or still within its deadline.</p>"
    gone = sum(1 for r in rows if r["unreachable"])
    return table(
        ["memory", "name", "written (UTC)", "store", "reachable"],
        [[td(None, a(links.memory(r["memory_id"], agent), r["memory_id"])), td(r["name"]),
          td(r["written_at"]), td(r["store"]),
          td(None, '<b class="failed">no path</b>' if r["unreachable"]
             else "in the ambient context")] for r in rows],
        keys=[r["memory_id"] for r in rows],
    ) + shown(len(rows), getattr(rows, "total", len(rows)), "unindexed memories",
              "<code>SELECT * FROM memory_pipeline WHERE status = 'unindexed'</code>") + note(
        f"Past the index deadline and never indexed; {gone} of them not in the latest ambient "
        "context either: no path brings those back (unreachable)."
    )  # fmt: skip


def sessions_in_breaks(rows: Any, links: Links) -> str:
    if not rows:
        return "<p>No session ended while this agent's pipeline was down.</p>"
    return table(
        ["session", "outcome", "category", "outcome at (UTC)", "in the break since (UTC)"],
        [
            [
                td(None, a(links.session(r["session_id"]), r["session_id"])),
                td(
                    None,
                    f'<span class="{"failed" if r["failed"] else "accepted"}">{e(r["outcome"])}'
                    "</span>",
                ),
                td(r["failure_category"] or "—"),
                td(r["ts"]),
                td(r["break_since"]),
            ]
            for r in rows
        ],
        keys=[r["session_id"] for r in rows],
    ) + shown(
        len(rows), getattr(rows, "total", len(rows)), "sessions", "<code>memdiag breaks</code>"
    )


def breaks_table(r: dict[str, Any], links: Links) -> str:
    """Sessions during pipeline breaks against sessions while healthy (``memdiag breaks``)."""
    from memdiag.analytics.breaks import difference_text, side_text

    if not r["placed"]:
        return note(
            "No session can be placed against its agent's pipeline: sessions need an "
            "agent_id whose agent sends memory events."
        )

    def row(name: str, x: dict[str, Any], href: str | None) -> list[str]:
        diff = difference_text(x) + (" (too few)" if x["too_few"] else "")
        return [
            td(None, a(href, name)),
            td(None, e(side_text(x["broken"]))),
            td(None, e(side_text(x["healthy"]))),
            td(None, e(diff)),
        ]

    apart = r["apart"]
    return table(
        ["agent", "failed during breaks", "failed while healthy", "difference, points [95% CI]"],
        [row("all agents", r["overall"], None)]
        + [row(x["agent_id"], x, links.agent(x["agent_id"])) for x in r["agents"]],
        keys=["all agents", *(x["agent_id"] for x in r["agents"])],
    ) + note(
        f"{r['placed']} of {r['sessions']} sessions placed by their agent and outcome time "
        f"against the spans their agent's pipeline was down ({apart['no_agent_id']} name no "
        f"agent and {apart['no_memory_events']} are of agents without memory events: counted "
        f"apart). Bootstrap interval, each side resampled apart; too few: under "
        f"{r['min_sessions']} sessions on a side. Correlation, not cause."
    )


# -- benchmark runs -------------------------------------------------------------------------

_PROVENANCE = (
    ("suite_id", "suite"),
    ("suite_version", "version"),
    ("suite_checksum", "suite checksum"),
    ("fixture_checksum", "fixtures"),
    ("config_fingerprint", "config"),
    ("git_head", "git"),
    ("service_version", "service"),
    ("run_group_id", "group"),
)


def runs(rows: Any, links: Links) -> str:
    if not rows:
        return "<p>No benchmark judgements: publish judgement events to memdiag.judgements.</p>"
    body = table(
        [
            "run",
            "judged",
            "questions",
            "conditions",
            "repeats",
            "re-judged",
            "accuracy",
            "mean score",
            "last judged (UTC)",
            "provenance",
        ],
        [
            [
                td(None, a(links.runs(r["run_id"], None), r["run_id"])),
                td(r["judgements"]),
                td(r["questions"]),
                td(r["conditions"]),
                td(r["repeats"]),
                td(r["rejudged"]),
                td(r["accuracy"], pct(r["accuracy"])),
                td(r["mean_score"]),
                td(r["last_at"]),
                td(
                    None,
                    " · ".join(
                        f"{e(label)} <code>{e(r[k])}</code>" for k, label in _PROVENANCE if r[k]
                    )
                    or "none given",
                ),
            ]
            for r in rows
        ],
        keys=[r["run_id"] for r in rows],
        numeric=(1, 2, 4, 5, 6, 7),
        cls="wide",
    )
    return body + shown(
        len(rows), getattr(rows, "total", len(rows)), "runs", "<code>memdiag runs --limit N</code>"
    )


def runs_chart(rows: list[dict[str, Any]]) -> str:
    """Reader against retrieval failures per run, with the numbers on the bars."""
    return charts.stacked_hbars(
        [
            (
                r["run_id"],
                [
                    charts.Segment(
                        round(r["accuracy"] * r["judgements"]), charts.CORRECT, "correct"
                    ),
                    charts.Segment(
                        r["reader_failures"], charts.READER, "reader failure (evidence in context)"
                    ),
                    charts.Segment(r["retrieval_failures"], charts.RETRIEVAL, "retrieval failure"),
                    charts.Segment(r["unattributed"], charts.OTHER, "unattributed"),
                ],
            )
            for r in rows
        ],
        "Benchmark runs: reader vs retrieval failures",
    )


def _paired_row(name: str, p: dict[str, Any]) -> list[str]:
    from memdiag.analytics.metrics import fmt as mfmt

    u, ci = p["unit"], p["ci"]
    return [
        td(name),
        td(None, e(mfmt(u, p["baseline_mean"], bare=True))),
        td(None, e(mfmt(u, p["candidate_mean"], bare=True))),
        td(None, e(mfmt(u, p["delta"], True, bare=True))),
        td(
            None,
            "—"  # --resamples 0: no interval
            if ci is None
            else e(
                f"[{mfmt(u, ci['low'], True, bare=True)}, {mfmt(u, ci['high'], True, bare=True)}]"
            ),
        ),
        td(p["pairs"]),
    ]


def side_name(s: dict[str, Any]) -> str:
    """A side of a comparison: its run, or its run group with the runs that are its repeats."""
    if s.get("run_id") is None and s.get("run_group_id") is not None:
        runs = s.get("runs") or []
        who = (f"group <code>{e(s['run_group_id'])}</code> ({len(runs)} run"
               f"{'s' if len(runs) != 1 else ''}: {e(', '.join(runs))})")  # fmt: skip
    else:
        who = e(s.get("run_id"))
    return who + (e(f" [{s['condition']}]") if s.get("condition") else "")


POSITIONAL = {"by_gold_rank": "best gold rank", "by_context_length": "context length (ids)"}
_BURIED_NOTE = (
    "Answers whose gold evidence was all in the context, by where it sat: each is correct or a "
    "reader failure. A rate that falls with the rank, or with the length, is evidence the "
    'reader was given and missed (docs/rules.md, "Buried evidence").'
)


def _rate(b: dict[str, Any]) -> str:
    return "—" if b["correct_rate"] is None else f"{pct(b['correct_rate'], 0)} of {b['answers']:,}"


def positional_compared(pos: dict[str, Any]) -> str:
    """Buried evidence, baseline against candidate per bucket (``compare``)."""
    parts = []
    for name, label in POSITIONAL.items():
        rows = pos[name]
        if not any(r["baseline"]["answers"] or r["candidate"]["answers"] for r in rows):
            continue
        body = [
            [
                td(r["bucket"]),
                td(None, e(_rate(r["baseline"]))),
                td(None, e(_rate(r["candidate"]))),
                td(
                    None,
                    "—"
                    if r["correct_rate_delta"] is None
                    else e(f"{r['correct_rate_delta'] * 100:+.1f} pts"),
                ),
                td(
                    None,
                    f"{r['baseline']['reader_failures']:,} → {r['candidate']['reader_failures']:,}",
                ),
            ]  # fmt: skip
            for r in rows
        ]
        parts.append(
            f"<h3>Buried evidence by {e(label)}</h3>"
            + table(
                [label, "baseline correct", "candidate correct", "Δ", "reader failures"],
                body,
                keys=[r["bucket"] for r in rows],
                numeric=(1, 2, 3, 4),
            )  # fmt: skip
        )
    return "".join(parts) + (note(_BURIED_NOTE) if parts else "")


def positional_runs(runs: list[dict[str, Any]]) -> str:
    """Buried evidence per run and condition (the report): the correct rate per bucket."""
    parts = []
    for name, label in POSITIONAL.items():
        if not any(b["answers"] for r in runs for b in r["positional"][name]):
            continue
        buckets = [b["bucket"] for b in runs[0]["positional"][name]]
        body = [
            [td(r["run_id"] + (f" [{r['condition']}]" if r["condition"] else ""))]
            + [td(None, e(_rate(b))) for b in r["positional"][name]]
            for r in runs
        ]
        keys = [f"{r['run_id']}|{r['condition']}" for r in runs]
        parts.append(
            f"<h3>Correct rate by {e(label)}</h3>"
            + table(["run", *buckets], body, keys=keys, numeric=tuple(range(1, len(buckets) + 1)))
        )
    return "".join(parts) + (note(_BURIED_NOTE) if parts else "")


def comparison(r: dict[str, Any]) -> str:
    """What ``compare`` says: the accuracies and delta with its interval, McNemar, the
    transition table, every paired metric."""
    b, c, ci, m = r["baseline"], r["candidate"], r["bootstrap_ci"], r["mcnemar"]
    interval = (
        "no interval (--resamples 0)"
        if ci is None
        else f"{ci['level']:.0%} interval {ci['low'] * 100:+.1f} to {ci['high'] * 100:+.1f} "
        f"(paired bootstrap over questions, {ci['resamples']:,} resamples, seed {ci['seed']})"
    )
    parts = [
        f'<p class="verdict">{e(r["verdict"])}</p>',
        '<dl class="facts">',
        f"<dt>baseline</dt><dd>{side_name(b)}: accuracy {pct(b['accuracy'])}</dd>",
        f"<dt>candidate</dt><dd>{side_name(c)}: accuracy {pct(c['accuracy'])}</dd>",
        f"<dt>delta</dt><dd>{r['delta'] * 100:+.1f} points, {e(interval)}</dd>",
        f"<dt>McNemar</dt><dd>exact p = {m['p_value']:.3g}, questions not repeats "
        f"({m['right_to_wrong']} right→wrong, {m['wrong_to_right']} wrong→right, "
        f"{m['ties']} tied and left out; {r['pairs']:,} pairs over {r['questions']:,} "
        "questions)</dd></dl>",
    ]
    states = r["transitions"]["states"]
    moved = r["transitions"]["baseline_to_candidate"]
    parts.append(
        "<h3>Where the answers moved (rows: baseline, columns: candidate)</h3>"
        + table(
            ["baseline ↓ / candidate →", *states],
            [
                [td(s)]
                + [td(moved[s][t], f"<b>{moved[s][t]}</b>" if s == t else None) for t in states]
                for s in states
            ],
            keys=list(states),
            numeric=tuple(range(1, len(states) + 1)),
        )
    )
    metrics = [(n, p) for n, p in r["metrics"].items() if p is not None]
    if metrics:
        parts.append(
            "<h3>Paired metrics: candidate − baseline</h3>"
            + table(
                ["metric", "baseline", "candidate", "delta", "95% interval", "pairs"],
                [_paired_row(n, p) for n, p in metrics],
                keys=[n for n, _ in metrics],
                numeric=(1, 2, 3, 5),
            )
            + note(
                "Fractions in %, their deltas in points; latency_ms in ms; the interval is "
                "over questions."
            )
        )
    parts.append(positional_compared(r["positional"]))
    un = r["unpaired"]
    for name, items in (("baseline", un["baseline_only"]), ("candidate", un["candidate_only"])):
        if items:
            listed = ", ".join(e(f"{i['question_id']}#{i['repeat_index']}") for i in items[:10])
            more = f" and {len(items) - 10} more" if len(items) > 10 else ""
            parts.append(f'<p class="warn">Only in the {name}: {listed}{more} — not compared.</p>')
    return "".join(parts)


def gate(v: Any, doctor: dict[str, Any] | None = None) -> str:
    """The gate's verdict under its policy, with what ``doctor`` found beside it."""
    from memdiag.analytics.gate import CANNOT_JUDGE, PASS, REGRESSION
    from memdiag.analytics.metrics import fmt as mfmt

    cls = {PASS: "accepted", REGRESSION: "failed"}.get(v.verdict, "pending")
    parts = [
        f'<p class="verdict"><span class="{cls}">{e(v.verdict.replace("_", " "))}</span> '
        f"(exit {v.status}): {e(v.reason)}</p>"
    ]
    if v.metrics:
        rows = []
        for mv in v.metrics:
            d = mv.as_dict()
            cells = (
                _paired_row(d["metric"], d)[:5]
                if mv.paired is not None
                else [td(d["metric"])] + [td(None, "—")] * 4
            )
            side = "≥ " if d["higher_is_better"] else "≤ "
            allowed = side + mfmt(d["unit"], d["limit"], True, bare=d["unit"] != "fraction")
            mark = {
                PASS: '<span class="accepted">pass</span>',
                REGRESSION: '<b class="failed">regression</b>',
                CANNOT_JUDGE: '<span class="pending">cannot judge</span>',
            }[mv.verdict]
            rows.append([*cells, td(None, e(allowed)), td(None, mark)])
        parts.append(
            table(
                ["metric", "baseline", "candidate", "delta", "95% interval", "allowed", "verdict"],
                rows,
                keys=[mv.rule.metric.name for mv in v.metrics],
                numeric=(1, 2, 3),
            )
        )
    quoted = [n.removeprefix("doctor: ") for n in v.notes if n.startswith("doctor: ")]
    for n in v.notes:
        if not n.startswith("doctor: "):
            parts.append(f'<p class="dim">note: {e(n)}</p>')
    if quoted and doctor is None:
        items = "".join(f"<li>{e(n)}</li>" for n in quoted)
        parts.append(f"<h3>What <code>memdiag doctor</code> found</h3><ul>{items}</ul>")
    if doctor is not None:
        found = [f for f in doctor["findings"] if f["level"] != "note"] or doctor["findings"]
        items = "".join(
            f"<li><b>{e(f['level'])}</b> {e(f['subject'])}: {e(f['message'])}</li>" for f in found
        )
        parts.append(
            "<h3>What <code>memdiag doctor</code> found</h3>"
            + (f"<ul>{items}</ul>" if items else "<p>Nothing weakens this comparison.</p>")
        )
    return "".join(parts)


def _outcome(outcome: str | None) -> str:
    if outcome is None:
        return '<span class="pending">open</span>'
    return f'<span class="{"accepted" if outcome == "accepted" else "failed"}">{e(outcome)}</span>'


def _more(sample: dict[str, Any]) -> str:
    """ "…" after a payload the page (or the dead letter) shows only the start of."""
    cut = sample["payload_truncated"] or len(sample["payload"] or "") >= 2000
    return "…" if cut else ""


# -- dead letters ---------------------------------------------------------------------------


def dead_letters(rows: list[dict[str, Any]]) -> str:
    """Dead letters by reason, each with what to do and its newest samples (the payloads are
    hostile input: escaped like everything else, and cut at 2,000 characters)."""
    if not rows:
        return "<p>No dead letters: every input was processed.</p>"
    parts = []
    for r in rows:
        samples = "".join(
            f'<li data-key="{e(s["dead_letter_id"])}"><div>{e(s["source"])}'
            f"{' · key ' + '<code>' + e(s['key']) + '</code>' if s['key'] else ''} · "
            f"{e(fmt(s['ts']))} UTC</div><div>{e(s['detail'])}</div>"
            f"<pre>{e(s['payload'])}{_more(s)}</pre></li>"
            for s in r["samples"]
        )
        parts.append(
            f'<details open data-key="{e(r["reason"])}"><summary><b>{e(r["reason"])}</b>: '
            f"{r['dead_letters']:,} (the newest {e(fmt(r['latest']))} UTC)</summary>"
            f'<p><b>What to do:</b> {e(r["advice"])}</p><ul class="samples">{samples}</ul>'
            + shown(
                len(r["samples"]),
                r["dead_letters"],
                "samples",
                "every one is in DuckDB's <code>dead_letters</code>",
            )
            + "</details>"
        )
    return "".join(parts)


# -- charts of the report -----------------------------------------------------------------


def followup_chart(points: list[dict[str, Any]], min_searches: int = 5) -> str:
    """The followup rate per time bucket, each point with its count; a bucket of fewer than
    ``min_searches`` agent searches is hollow, off the line (too few to read)."""
    if not points:
        return "<p>No agent searches.</p>"
    pts = [
        charts.Point(
            p["bucket"].timestamp(),
            p["rate"],
            p["agent_searches"],
            p["bucket"].astimezone(UTC).strftime("%Y-%m-%d %H:%M"),
        )
        for p in points
    ]
    total = sum(p["agent_searches"] for p in points)
    followups = sum(p["followups"] for p in points)
    svg = charts.small_multiples(
        [("followup rate", pts, f"{followups / total:.1%}" if total else "n/a")],
        "Followup rate over time (event time, UTC)",
        charts.time_ticks(pts[0].x, pts[-1].x),
        min_n=min_searches,
    )
    return svg + note(
        f"{followups:,} followups of {total:,} agent searches; each point says its "
        f"count; hollow points have fewer than {min_searches} searches. "
        f"{e(FOLLOWUP_CAVEAT[0].upper())}{e(FOLLOWUP_CAVEAT[1:])}."
    )


def feedback_chart(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p>No judged injection.</p>"
    return charts.stacked_hbars(
        [
            (
                r["observation_id"],
                [
                    charts.Segment(r["used"], charts.USED, "used"),
                    charts.Segment(r["ignored"], charts.IGNORED, "ignored"),
                ],
            )
            for r in rows
        ],
        f"Used and ignored, the {len(rows)} most judged memories",
    ) + note(f"{e(USED_CAVEAT[0].upper())}{e(USED_CAVEAT[1:])}.")


def coverage_chart(points: list[dict[str, Any]], order: Sequence[str]) -> str:
    """Pipeline coverage per agent over time (by when written), one row each."""
    agents: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        agents.setdefault(p["agent_id"], []).append(p)
    names = [x for x in order if x in agents] + sorted(x for x in agents if x not in order)
    series = []
    for name in names:
        pts = [
            charts.Point(
                p["bucket_start"].timestamp(),
                p["pipeline_coverage"],
                p.get("written", 0),
                p["bucket_start"].astimezone(UTC).strftime("%Y-%m-%d %H:%M"),
            )
            for p in agents[name]
        ]
        series.append((name, pts, pct(pts[-1].y if pts else None)))
    xs = [p.x for _, ps, _ in series for p in ps]
    return charts.small_multiples(
        series,
        "Pipeline coverage over time (by when written, UTC)",
        charts.time_ticks(min(xs), max(xs)) if xs else [],
    )


# -- pages ----------------------------------------------------------------------------------


def stylesheet() -> str:
    """The pages' one stylesheet (served by ``memdiag serve``, inlined in a static page)."""
    from importlib import resources

    return resources.files("memdiag.views").joinpath("static", "memdiag.css").read_text("utf-8")


def page(title: str, body: str, meta: str = "", head: str = "", top: str = "") -> str:
    """A whole page. Without ``head`` it stands alone (its stylesheet inlined: the static
    report, ``explain --html``); ``head`` links the live view's assets instead. ``meta`` and
    ``body`` are HTML; ``top`` goes above the title (the live view's navigation)."""
    from memdiag import __version__

    if not head:
        head = f"<style>{stylesheet()}</style>"
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)}</title>{head}</head><body>{top}<h1>{e(title)}</h1>"
        f'<p class="meta"><span class="page-meta">{meta}</span>{" · " if meta else ""}generated '
        f"{generated} · memdiag {e(__version__)}</p>{body}</body></html>\n"
    )
