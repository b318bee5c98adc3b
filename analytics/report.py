"""``memdiag report html``: one self-contained page with the status figures as charts.

Charts are drawn with matplotlib and inlined as SVG, so the page needs no script, no
network and no other file: it can be mailed, attached to an incident or opened offline.
"""

from __future__ import annotations

import html
import io
from datetime import UTC, datetime
from typing import Any

import duckdb

from memdiag import __version__
from memdiag.analytics.status import feedback_per_observation, followup_over_time, status

USED, IGNORED = "#2a9d8f", "#e76f51"
READER, RETRIEVAL, CORRECT, OTHER = "#f4a261", "#e63946", "#2a9d8f", "#adb5bd"
BAR = "#457b9d"


def _svg(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog: the SVG sits inside HTML


def _figure(width: float = 6.4, height: float = 3.2) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "font.size": 9,
            "svg.fonttype": "none",
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    )
    return plt.subplots(figsize=(width, height))


def chart_failures(categories: list[dict[str, Any]]) -> str:
    fig, ax = _figure()
    names = [c["failure_category"] for c in categories]
    values = [c["sessions"] for c in categories]
    bars = ax.barh(names[::-1], values[::-1], color=BAR)
    ax.bar_label(bars, padding=3)
    ax.set_xlabel("failed sessions")
    ax.set_title("Failed sessions by category", loc="left")
    return _svg(fig)


def chart_followups(points: list[dict[str, Any]]) -> str:
    fig, ax = _figure()
    if points:
        xs = [p["bucket"] for p in points]
        ax.plot(xs, [p["rate"] * 100 for p in points], color=BAR, marker="o", markersize=3)
        ax.fill_between(xs, [p["rate"] * 100 for p in points], alpha=0.15, color=BAR)
        fig.autofmt_xdate()
    ax.set_ylabel("followups, % of agent searches")
    ax.set_title("Followup rate over time (event time, UTC)", loc="left")
    return _svg(fig)


def chart_feedback(rows: list[dict[str, Any]]) -> str:
    fig, ax = _figure(6.4, max(2.4, 0.22 * len(rows) + 0.8))
    names = [r["observation_id"] for r in rows][::-1]
    used = [r["used"] for r in rows][::-1]
    ignored = [r["ignored"] for r in rows][::-1]
    ax.barh(names, used, color=USED, label="used")
    ax.barh(names, ignored, left=used, color=IGNORED, label="ignored")
    ax.set_xlabel("evaluated turns")
    ax.legend(loc="lower right", frameon=False)
    ax.set_title(f"Used / ignored, the {len(rows)} most injected memories", loc="left")
    return _svg(fig)


def chart_runs(runs: list[dict[str, Any]]) -> str:
    fig, ax = _figure(6.4, max(2.0, 0.5 * len(runs) + 1.0))
    names = [r["run_id"] for r in runs][::-1]
    correct = [round(r["accuracy"] * r["judgements"]) for r in runs][::-1]
    reader = [r["reader_failures"] for r in runs][::-1]
    retrieval = [r["retrieval_failures"] for r in runs][::-1]
    other = [r["unattributed"] for r in runs][::-1]
    left = [0] * len(runs)
    for values, colour, label in (
        (correct, CORRECT, "correct"),
        (reader, READER, "reader failure (evidence in context)"),
        (retrieval, RETRIEVAL, "retrieval failure"),
        (other, OTHER, "unattributed"),
    ):
        ax.barh(names, values, left=left, color=colour, label=label)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_xlabel("judgements")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, frameon=False)
    ax.set_title("Benchmark runs: reader vs retrieval failures", loc="left")
    return _svg(fig)


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in columns)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(_fmt(r.get(key)))}</td>" for key, _ in columns)
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.3f}"
    if isinstance(v, datetime):
        return v.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(v)


def render(con: duckdb.DuckDBPyConnection, db_path: str) -> str:
    st = status(con, top=10, runs=10)
    fu, fb = st["followup"], st["feedback"]
    judged = fb["used"] + fb["ignored"]
    sessions = st["sessions"]
    total = sum(sessions.values())
    newest = st["freshness"]["newest_event"]

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.1%}"

    tiles = [
        ("followup rate", pct(fu["rate"]), f"of {fu['agent_searches']:,} agent searches"),
        ("memories used", pct(fb["used_share"]), f"of {judged:,} judged injections"),
        (
            "sessions failed",
            pct((total - sessions.get("accepted", 0)) / total if total else None),
            f"of {total:,} sessions",
        ),
        (
            "misleading memories",
            f"{st['misleading']['count']:,}",
            "≥ 3 failed sessions, none accepted",
        ),
        (
            "dead letters",
            f"{sum(d['dead_letters'] for d in st['dead_letters']):,}",
            ", ".join(f"{d['reason']} {d['dead_letters']}" for d in st["dead_letters"]) or "none",
        ),
    ]
    tile_html = "".join(
        f'<div class="tile"><div class="label">{html.escape(a)}</div>'
        f'<div class="value">{html.escape(b)}</div><div class="sub">{html.escape(c)}</div></div>'
        for a, b, c in tiles
    )
    sections = [
        ("Failed sessions", chart_failures(st["failure_categories"]), ""),
        (
            "Followups",
            chart_followups(followup_over_time(con)),
            f"<p class=note>{html.escape(fu['caveat'])}.</p>",
        ),
        (
            "Used and ignored memories",
            chart_feedback(feedback_per_observation(con)),
            f"<p class=note>{html.escape(fb['caveat'])}.</p>",
        ),
        (
            "Misleading memories",
            _table(
                st["misleading"]["top"],
                [
                    ("observation_id", "observation"),
                    ("fail_count", "failed sessions"),
                    ("success_count", "accepted sessions"),
                    ("weight", "weight now"),
                ],
            )
            if st["misleading"]["top"]
            else "<p>None: no memory is in 3 or more failed sessions and no accepted one.</p>",
            "",
        ),
        (
            "Benchmark runs",
            chart_runs(st["runs"]) if st["runs"] else "<p>No benchmark judgements.</p>",
            "<p class=note>A reader failure had all its gold evidence in the context and was "
            "still wrong: improve the reader. A retrieval failure never got the evidence.</p>",
        ),
    ]
    body = "".join(
        f'<section><h2>{html.escape(t)}</h2><div class="chart">{c}</div>{n}</section>'
        for t, c, n in sections
    )
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    fresh = newest.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if newest else "no events"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>memdiag report</title>
<style>
body {{ font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d3557;
       max-width: 1100px; margin: 2em auto; padding: 0 1em; background: #fff; }}
h1 {{ margin-bottom: 0.1em; }} .meta {{ color: #6c757d; margin-top: 0; }}
.tiles {{ display: grid; grid-template-columns: repeat(auto-fit, minmax(190px, 1fr)); gap: 12px; }}
.tile {{ border: 1px solid #dee2e6; border-radius: 8px; padding: 10px 14px; }}
.tile .label {{ color: #6c757d; font-size: 12px; text-transform: uppercase;
               letter-spacing: .04em; }}
.tile .value {{ font-size: 28px; font-weight: 600; }}
.tile .sub {{ color: #6c757d; font-size: 12px; }}
section {{ margin-top: 2em; }} .chart svg {{ max-width: 100%; height: auto; }}
table {{ border-collapse: collapse; }}
th, td {{ padding: 4px 12px; border-bottom: 1px solid #dee2e6; text-align: left; }}
td:not(:first-child) {{ text-align: right; }}
.note {{ color: #6c757d; font-size: 12px; max-width: 70ch; }}
</style></head><body>
<h1>memdiag report</h1>
<p class="meta">{html.escape(db_path)} · newest event {fresh} · generated {generated} ·
memdiag {__version__}</p>
<div class="tiles">{tile_html}</div>
{body}
</body></html>
"""
