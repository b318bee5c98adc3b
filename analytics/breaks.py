"""``memdiag breaks``: do sessions fail more while their agent's memory pipeline is down?

The recall paper's natural experiment, from the data memdiag already has: each session with
an outcome is joined, by its agent and the outcome's event time, to the spans during which
that agent's pipeline was down (the ``session_pipeline`` view over ``pipeline_break_spans``,
docs/rules.md "Sessions during breaks"). The failure rate of the sessions during a break is
compared with that of the sessions while healthy, overall and per agent, with a percentile
bootstrap interval of the difference: the two groups resampled apart (stratified), seeded,
so the same data gives the same interval; when a side is at 0% or 100% (a bootstrap has no
spread there), Newcombe's hybrid score interval instead. Sessions that name no agent, or
whose agent sent no memory events, cannot be placed: they are counted apart, never as
healthy.

Correlation only, as for ``calibrate``: a break often comes with other trouble (a deploy, an
outage), and sessions of one agent are not independent.
"""

from __future__ import annotations

import math
import zlib
from statistics import NormalDist
from typing import Any

import duckdb
import numpy as np

from memdiag.analytics.calibrate import interval
from memdiag.analytics.queries import rows

#: fewer sessions than this on either side: the comparison is shown, and said too small
MIN_SESSIONS = 20
LEVEL = 0.95
CAVEATS = (
    "correlation, not cause: a pipeline break often comes with other trouble (a deploy, an "
    "outage, a new task mix) that fails sessions by itself",
    "sessions of one agent are not independent, and breaks cluster in time: the interval "
    "resamples sessions and is too narrow when a few agents or one bad hour dominate",
    "a break is known by its events: an agent whose indexer acknowledges garbage is never "
    "'broken' here (see recall_probe_miss)",
    "a small sample gives wide intervals: read the interval, not the point",
)


def _rates(
    failed_b: np.ndarray, failed_h: np.ndarray, resamples: int, seed: int | list[int],
    level: float,
) -> dict[str, Any]:  # fmt: skip
    """Failure rates during breaks and while healthy, their difference and its interval."""
    nb, nh = len(failed_b), len(failed_h)
    rb = float(failed_b.mean()) if nb else None
    rh = float(failed_h.mean()) if nh else None
    result: dict[str, Any] = {
        "broken": {"sessions": nb, "failed": int(failed_b.sum()), "failure_rate": rb},
        "healthy": {"sessions": nh, "failed": int(failed_h.sum()), "failure_rate": rh},
        "difference": None if rb is None or rh is None else rb - rh,
        "difference_ci": None,
        "ratio": None if rb is None or not rh else rb / rh,
        "too_few": nb < MIN_SESSIONS or nh < MIN_SESSIONS,
    }
    if rb is not None and rh is not None and resamples > 0:
        fb, fh = result["broken"]["failed"], result["healthy"]["failed"]
        if fb in (0, nb) or fh in (0, nh):
            # a side at 0% or 100% never varies in a resample: its bootstrap interval would
            # have no width on that side. Newcombe's score interval has.
            result["difference_ci"] = {**newcombe(fb, nb, fh, nh, level), "method": "newcombe"}
        else:
            rng = np.random.default_rng(seed)
            # a resample's failure count on each side is binomial in the side's own rate
            diff: np.ndarray = rng.binomial(nb, rb, resamples) / nb
            diff -= rng.binomial(nh, rh, resamples) / nh
            found = interval(diff, level)
            result["difference_ci"] = None if found is None else {**found, "method": "bootstrap"}
    return result


def wilson(x: int, n: int, z: float) -> tuple[float, float]:
    """Wilson's score interval of the share ``x / n`` (``n`` > 0)."""
    p = x / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)


def newcombe(x1: int, n1: int, x2: int, n2: int, level: float) -> dict[str, float]:
    """Newcombe's hybrid score interval of ``x1/n1 - x2/n2`` (1998, method 10): each side's
    Wilson interval, combined; well-behaved at 0% and 100%, where a bootstrap has no spread."""
    z = NormalDist().inv_cdf(0.5 + level / 2)
    p1, p2 = x1 / n1, x2 / n2
    l1, u1 = wilson(x1, n1, z)
    l2, u2 = wilson(x2, n2, z)
    d = p1 - p2
    return {"low": d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2),
            "high": d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)}  # fmt: skip


def side_text(side: dict[str, Any]) -> str:
    """One side of a comparison: ``19/24 (79%)``."""
    rate = "n/a" if side["failure_rate"] is None else f"{side['failure_rate']:.0%}"
    return f"{side['failed']:,}/{side['sessions']:,} ({rate})"


def difference_text(r: dict[str, Any]) -> str:
    """A comparison's difference in points with its interval: ``+62 [+44, +79]``."""
    if r["difference"] is None:
        return "n/a"
    text = f"{r['difference'] * 100:+.0f}"
    ci = r["difference_ci"]
    if ci and ci["low"] is not None:
        text += f" [{ci['low'] * 100:+.0f}, {ci['high'] * 100:+.0f}]"
    return text


def break_impact(
    con: duckdb.DuckDBPyConnection, resamples: int = 10_000, seed: int = 0
) -> dict[str, Any]:
    """The comparison overall and per agent: the agents with sessions during a break
    first, the largest difference first. Each agent's resamples are seeded by the seed and
    its id, so another agent's sessions never move its interval."""
    sessions = rows(con, "session_pipeline")
    placed = [s for s in sessions if s["pipeline_state"] in ("broken", "healthy")]
    apart = {
        state: sum(1 for s in sessions if s["pipeline_state"] == state)
        for state in ("no_agent_id", "no_memory_events")
    }

    def split(group: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
        b = np.array([bool(s["failed"]) for s in group if s["pipeline_state"] == "broken"])
        h = np.array([bool(s["failed"]) for s in group if s["pipeline_state"] == "healthy"])
        return b.astype(bool), h.astype(bool)

    overall = _rates(*split(placed), resamples, seed, LEVEL)
    agents = []
    for agent in sorted({s["agent_id"] for s in placed}):
        mine = [s for s in placed if s["agent_id"] == agent]
        r = _rates(*split(mine), resamples, [seed, zlib.crc32(agent.encode())], LEVEL)
        spans = {(s["break_since"], s["break_until"]) for s in mine if s["break_since"]}
        # the spans its sessions fell in (a span without a session is not here)
        r["breaks"] = [{"since": a, "until": b} for a, b in sorted(spans, key=lambda x: x[0])]
        r["agent_id"] = agent
        agents.append(r)
    agents.sort(key=lambda r: (r["broken"]["sessions"] == 0, -(r["difference"] or 0),
                               r["agent_id"]))  # fmt: skip
    return {
        "sessions": len(sessions),
        "placed": len(placed),
        "apart": apart,
        "overall": overall,
        "agents": agents,
        "resamples": resamples,
        "seed": seed,
        "level": LEVEL,
        "min_sessions": MIN_SESSIONS,
        "caveats": list(CAVEATS),
    }
