"""Charts as inline SVG, drawn here: the report and the live pages show the same ones.

Each is a few hundred bytes to a few kilobytes of SVG, drawn in well under a millisecond, with
no script and no style attribute (colours are SVG presentation attributes, so the pages' strict
Content-Security-Policy holds). Every bar carries its number, every point its count in a
tooltip, and series that would overlap (several agents at 100%) are drawn as small multiples,
one row each, on one shared axis.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

#: the palette (colour-blind safe enough to tell used from ignored, reader from retrieval)
USED, IGNORED = "#2a9d8f", "#e76f51"
READER, RETRIEVAL, CORRECT, OTHER = "#f4a261", "#e63946", "#2a9d8f", "#adb5bd"
BAR = "#457b9d"
INK, MUTED, GRID = "#1d3557", "#6c757d", "#dee2e6"

CHAR = 6.6  # the width of a character at the charts' 11px font, for laying out labels


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _n(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _svg(width: float, height: float, body: str, label: str) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {_n(width)} {_n(height)}" width="{_n(width)}" '
        f'height="{_n(height)}" role="img" aria-label="{_e(label)}" '
        f'font-family="system-ui, sans-serif" font-size="11" fill="{INK}">'
        f"<title>{_e(label)}</title>{body}</svg>"
    )


def hbars(
    items: Sequence[tuple[str, float, str]], title: str, colour: str = BAR, width: int = 560
) -> str:
    """Horizontal bars: (label, value, the number written after the bar)."""
    if not items:
        return ""
    label_w = min(max(len(label) for label, _, _ in items) * CHAR + 8, width * 0.45)
    text_w = max(len(text) for _, _, text in items) * CHAR + 8
    room = max(width - label_w - text_w, 40)
    top = max((v for _, v, _ in items), default=0) or 1
    row, parts = 20, []
    for i, (label, value, text) in enumerate(items):
        y = i * row
        w = room * value / top
        parts.append(
            _label(label_w - 6, y + 14, label, label_w)
            + f'<rect x="{_n(label_w)}" y="{y + 4}" width="{_n(max(w, 0.5))}" height="13" '
            f'fill="{colour}"><title>{_e(label)}: {_e(text)}</title></rect>'
            f'<text x="{_n(label_w + w + 4)}" y="{y + 14}">{_e(text)}</text>'
        )
    return _svg(width, row * len(items) + 4, "".join(parts), title)


@dataclass(frozen=True)
class Segment:
    value: float
    colour: str
    name: str


def stacked_hbars(
    rows: Sequence[tuple[str, Sequence[Segment]]], title: str, width: int = 560
) -> str:
    """One stacked bar a row, each segment with its number inside (or in its tooltip when it
    is too narrow), and a legend below."""
    if not rows:
        return ""
    label_w = min(max(len(label) for label, _ in rows) * CHAR + 8, width * 0.4)
    room = width - label_w - 8
    top = max(sum(s.value for s in segs) for _, segs in rows) or 1
    row, parts = 24, []
    for i, (label, segs) in enumerate(rows):
        y = i * row
        parts.append(_label(label_w - 6, y + 16, label, label_w))
        x = label_w
        for s in segs:
            w = room * s.value / top
            if w <= 0:
                continue
            tip = f"{label}: {s.name} {_n(s.value)}"
            parts.append(
                f'<rect x="{_n(x)}" y="{y + 3}" width="{_n(w)}" height="17" fill="{s.colour}">'
                f"<title>{_e(tip)}</title></rect>"
            )
            text = _n(s.value)
            if w >= len(text) * CHAR + 4:
                parts.append(
                    f'<text x="{_n(x + w / 2)}" y="{y + 15}" text-anchor="middle" '
                    f'fill="#fff">{_e(text)}</text>'
                )
            x += w
    legend_y = row * len(rows) + 12
    lx = label_w
    seen: dict[str, str] = {}
    for _, segs in rows:
        for s in segs:
            seen.setdefault(s.name, s.colour)
    for name, colour in seen.items():
        parts.append(
            f'<rect x="{_n(lx)}" y="{legend_y - 9}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{_n(lx + 14)}" y="{legend_y}">{_e(name)}</text>'
        )
        lx += 14 + len(name) * CHAR + 14
    return _svg(width, legend_y + 6, "".join(parts), title)


@dataclass(frozen=True)
class Point:
    x: float  # seconds since the epoch, or a position
    y: float | None  # 0..1; None: nothing to say there
    n: int = 0  # how many it is of (a rate's denominator): in its tooltip
    label: str = ""  # what the tooltip says of x


def small_multiples(
    series: Sequence[tuple[str, Sequence[Point], str]],
    title: str,
    x_labels: Sequence[tuple[float, str]] = (),
    min_n: int = 0,
    width: int = 560,
    colour: str = BAR,
) -> str:
    """One row per series (label, points, the text after it: its latest value), all on one
    x axis and each on 0..100%: lines that would hide each other at 100% stay apart. A
    point of fewer than ``min_n`` is drawn hollow (too few to read), and each says its count
    in its tooltip."""
    points = [p for _, ps, _ in series for p in ps]
    if not points:
        return ""
    label_w = min(max(len(s[0]) for s in series) * CHAR + 8, width * 0.3)
    text_w = max(len(s[2]) for s in series) * CHAR + 10
    x0, x1 = min(p.x for p in points), max(p.x for p in points)
    plot_l, plot_r = label_w, width - text_w
    span = (x1 - x0) or 1.0

    def sx(x: float) -> float:
        return plot_l + (plot_r - plot_l) * ((x - x0) / span if x1 > x0 else 0.5)

    row, parts = 34, []
    for i, (label, ps, last) in enumerate(series):
        top, bottom = i * row + 4, i * row + row - 6
        parts.append(
            f'<line x1="{_n(plot_l)}" x2="{_n(plot_r)}" y1="{bottom}" y2="{bottom}" '
            f'stroke="{GRID}"/>'
            f'<line x1="{_n(plot_l)}" x2="{_n(plot_r)}" y1="{top}" y2="{top}" stroke="{GRID}" '
            'stroke-dasharray="2 3"/>'
            + _label(label_w - 6, top + 15, label, label_w)
            + f'<text x="{_n(plot_r + 6)}" y="{top + 15}">{_e(last)}</text>'
        )

        def sy(y: float, top: int = top, bottom: int = bottom) -> float:
            return bottom - (bottom - top) * max(0.0, min(1.0, y))

        known = [p for p in ps if p.y is not None]
        path: list[str] = []
        for p in known:
            if p.n >= min_n:
                path.append(f"{'M' if not path else 'L'}{_n(sx(p.x))},{_n(sy(p.y or 0))}")
        if len(path) > 1:
            parts.append(
                f'<path d="{" ".join(path)}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
            )
        for p in known:
            tip = f"{label} · {p.label}: {(p.y or 0):.1%}" + (f" of {p.n:,}" if p.n else "")
            hollow = p.n < min_n
            fill = "#fff" if hollow else colour
            parts.append(
                f'<circle cx="{_n(sx(p.x))}" cy="{_n(sy(p.y or 0))}" r="2.6" fill="{fill}" '
                f'stroke="{colour}"><title>{_e(tip + (" (too few)" if hollow else ""))}</title>'
                "</circle>"
            )
    axis_y = row * len(series) + 2
    for x, text in x_labels:
        parts.append(
            f'<text x="{_n(sx(x))}" y="{axis_y + 10}" text-anchor="middle" '
            f'fill="{MUTED}">{_e(text)}</text>'
        )
    return _svg(width, axis_y + (16 if x_labels else 2), "".join(parts), title)


def line(
    points: Sequence[Point],
    title: str,
    y_max: float = 1.0,
    width: int = 560,
    height: int = 120,
    colour: str = BAR,
    x_labels: Sequence[tuple[float, str]] = (),
) -> str:
    """One series on 0..``y_max`` (a weight or a strength over its steps)."""
    known = [p for p in points if p.y is not None]
    if not known:
        return ""
    left, right, top, bottom = 34, width - 8, 8, height - 18
    x0, x1 = min(p.x for p in known), max(p.x for p in known)
    span = (x1 - x0) or 1.0

    def sx(x: float) -> float:
        return left + (right - left) * ((x - x0) / span if x1 > x0 else 0.5)

    def sy(y: float) -> float:
        return bottom - (bottom - top) * max(0.0, min(1.0, y / y_max))

    parts = []
    for frac in (0.0, 0.5, 1.0):
        y = sy(frac * y_max)
        parts.append(
            f'<line x1="{left}" x2="{right}" y1="{_n(y)}" y2="{_n(y)}" '
            f'stroke="{GRID}"/><text x="{left - 4}" y="{_n(y + 4)}" text-anchor="end" '
            f'fill="{MUTED}">{_n(frac * y_max)}</text>'
        )
    d = " ".join(
        f"{'M' if i == 0 else 'L'}{_n(sx(p.x))},{_n(sy(p.y or 0))}" for i, p in enumerate(known)
    )
    parts.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
    for p in known:
        parts.append(
            f'<circle cx="{_n(sx(p.x))}" cy="{_n(sy(p.y or 0))}" r="2.4" '
            f'fill="{colour}"><title>{_e(p.label)}: {(p.y or 0):.3f}</title></circle>'
        )
    for x, text in x_labels:
        parts.append(
            f'<text x="{_n(sx(x))}" y="{height - 4}" text-anchor="middle" '
            f'fill="{MUTED}">{_e(text)}</text>'
        )
    return _svg(width, height, "".join(parts), title)


def time_ticks(first: float, last: float, count: int = 5) -> list[tuple[float, str]]:
    """A few evenly spaced labels for a time axis (UTC), by the span: times, or dates."""
    if last <= first:
        return [(first, datetime.fromtimestamp(first, UTC).strftime("%m-%d %H:%M"))]
    fmt = (
        "%H:%M"
        if last - first <= 86_400
        else "%m-%d %H:%M"
        if last - first <= 7 * 86_400
        else "%Y-%m-%d"
    )
    step = (last - first) / (count - 1)
    return [
        (first + i * step, datetime.fromtimestamp(first + i * step, UTC).strftime(fmt))
        for i in range(count)
    ]


def _label(x: float, y: float, text: str, room: float) -> str:
    """A label ending at ``x``, clipped to ``room`` pixels; the whole of it in its tooltip."""
    return (
        f'<text x="{_n(x)}" y="{_n(y)}" text-anchor="end">{_e(_clip(text, room))}'
        f"<title>{_e(text)}</title></text>"
    )


def _clip(text: str, room: float) -> str:
    """A label that fits ``room`` pixels; the whole of it is in its tooltip."""
    most = max(int(room / CHAR) - 1, 4)
    return text if len(text) <= most else text[: most - 1] + "…"
