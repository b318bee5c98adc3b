"""``memdiag calibrate``: how well do memdiag's live proxies predict failed sessions?

The followup counter stands in for "the first results did not satisfy"; nobody has measured
it against outcomes. memdiag has both, so this measures, per session with an outcome:

- precision and recall of "at least one followup" as a predictor of a failed session, and of
  "at least one ignored memory" and "never searched", each with a percentile bootstrap
  interval that resamples sessions (seeded: the same data gives the same interval);
- the ROC AUC of the followup rate (followups per agent search), over the sessions that
  searched: a session without an agent search has no rate, and is reported apart as the
  "never searched" group;
- all of it for several followup windows, recomputed from ``searches.disjoint_new_query``
  and ``gap_seconds`` (a followup under window W is a disjoint new query at most W after its
  predecessor), with how often each window has the best AUC across the resamples.

Correlation only: a proxy that predicts failures does not cause them, sessions of one agent
are not independent, and a small sample gives wide intervals (docs in the README).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import duckdb
import numpy as np

from memdiag.analytics.queries import rows

WINDOWS = (10.0, 30.0, 60.0, 120.0)
CAVEATS = (
    "correlation, not cause: a proxy that flags failed sessions does not make them fail",
    "sessions are not independent within an agent (or a task): resampling sessions gives "
    "intervals too narrow when a few agents dominate; --by agent resamples whole agents",
    "a small sample gives wide intervals: read the interval, not the point",
    "followups overcount genuine query refinement; 'ignored' is a keyword proxy",
)
MIN_CLUSTERS = 20  # fewer resampled units than this: say the intervals are unreliable
_CHUNK = 4_000_000  # elements of a resample-count matrix per chunk (32 MB of int64)


@dataclass(frozen=True, slots=True)
class Sessions:
    """The sessions measured, as arrays (one entry per session)."""

    failed: np.ndarray  # bool
    agent_searches: np.ndarray  # int
    gaps: list[list[float]]  # gaps of the session's disjoint new queries
    ignored: np.ndarray  # bool: >= 1 memory ignored in every evaluated turn
    unknown: int  # evaluated searches whose disjoint_new_query predates the column
    agent: np.ndarray  # int: the session's agent (a session without agent_id is its own)

    def __len__(self) -> int:
        return len(self.failed)

    def followups(self, window: float) -> np.ndarray:
        return np.array([sum(g <= window for g in gs) for gs in self.gaps], dtype=np.int64)


def load(
    con: duckdb.DuckDBPyConnection,
    org: str | None = None,
    project: str | None = None,
    since: datetime | None = None,
) -> Sessions:
    found = rows(con, "calibration_sessions", org_id=org, project_id=project, since=since)
    return Sessions(
        failed=np.array([r["failed"] for r in found], dtype=bool),
        agent_searches=np.array([r["agent_searches"] for r in found], dtype=np.int64),
        gaps=[list(r["gaps"]) for r in found],
        ignored=np.array([r["ignored"] for r in found], dtype=bool),
        unknown=sum(r["unknown"] for r in found),
        agent=_clusters([r["agent_id"] or f"\0{r['session_id']}" for r in found]),
    )


def _clusters(labels: list[str]) -> np.ndarray:
    index: dict[str, int] = {}
    return np.array([index.setdefault(x, len(index)) for x in labels], dtype=np.int64)


# -- statistics (pure) --------------------------------------------------------------------


def resample_counts(
    n: int, resamples: int, seed: int, clusters: np.ndarray | None = None
) -> list[np.ndarray]:
    """How often each of ``n`` sessions is drawn in each resample (rows), in chunks; the
    same ``seed`` gives the same draws, so every predictor sees the same resamples. With
    ``clusters`` (a cluster index per session), whole clusters are drawn, with all their
    sessions."""
    if clusters is not None:
        k = int(clusters.max()) + 1 if len(clusters) else 0
        return [c[:, clusters] for c in resample_counts(k, resamples, seed)]
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK // max(n, 1))
    out = []
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        idx = rng.integers(0, n, size=(size, n))
        counts = np.zeros((size, n), dtype=np.int64)
        np.add.at(counts, (np.repeat(np.arange(size), n), idx.ravel()), 1)
        out.append(counts)
    return out


def auc(scores: np.ndarray, positive: np.ndarray, weights: np.ndarray | None = None) -> Any:
    """ROC AUC of ``scores`` for ``positive`` (ties count one half): the chance that a
    random positive scores above a random negative. ``weights`` (one row per resample, or
    one vector) count each item that often. ``nan`` where a class is absent."""
    order = np.argsort(scores, kind="stable")
    s = scores[order]
    pos = positive[order].astype(np.float64)
    w = np.ones((1, len(s))) if weights is None else np.atleast_2d(weights)[:, order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]]) if len(s) else np.array([], int)
    p = np.add.reduceat(w * pos, starts, axis=1) if len(s) else np.zeros((len(w), 0))
    q = np.add.reduceat(w * (1 - pos), starts, axis=1) if len(s) else np.zeros((len(w), 0))
    below = np.cumsum(q, axis=1) - q
    total_p, total_q = p.sum(axis=1), q.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        result = (p * (below + 0.5 * q)).sum(axis=1) / (total_p * total_q)
    return result if weights is not None and np.ndim(weights) == 2 else float(result[0])


def _interval(values: np.ndarray, level: float) -> dict[str, Any]:
    finite = values[np.isfinite(values)]
    if len(finite) == 0:
        return {"low": None, "high": None, "undefined_resamples": int(len(values))}
    alpha = (1 - level) / 2
    low, high = np.quantile(finite, [alpha, 1 - alpha])
    return {
        "low": float(low),
        "high": float(high),
        "undefined_resamples": int(len(values) - len(finite)),
    }


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1), np.nan)


def binary(
    name: str,
    flag: np.ndarray,
    failed: np.ndarray,
    counts: list[np.ndarray],
    level: float,
) -> dict[str, Any]:
    """Precision, recall and lift of ``flag`` as a predictor of ``failed``, with
    bootstrap intervals over ``counts``."""
    tp_v = (flag & failed).astype(np.int64)
    fl_v = flag.astype(np.int64)
    fa_v = failed.astype(np.int64)
    tp, flagged, positives = int(tp_v.sum()), int(fl_v.sum()), int(fa_v.sum())
    n = len(flag)
    precision = tp / flagged if flagged else None
    recall = tp / positives if positives else None
    base = positives / n if n else None
    boot_p = np.concatenate([_ratio(c @ tp_v, c @ fl_v) for c in counts]) if counts else None
    boot_r = np.concatenate([_ratio(c @ tp_v, c @ fa_v) for c in counts]) if counts else None
    return {
        "predictor": name,
        "sessions": n,
        "flagged": flagged,
        "failed_flagged": tp,
        "precision": precision,
        "precision_ci": None if boot_p is None else _interval(boot_p, level),
        "recall": recall,
        "recall_ci": None if boot_r is None else _interval(boot_r, level),
        "lift": precision / base if precision is not None and base else None,
        "f1": 2 * precision * recall / (precision + recall)
        if precision is not None and recall is not None and precision + recall > 0
        else None,
    }


def calibrate(
    sessions: Sessions,
    windows: tuple[float, ...] = WINDOWS,
    stream_window: float = 30.0,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    by: str = "session",
) -> dict[str, Any]:
    """The calibration of the proxies on ``sessions`` (see the module's docstring).
    ``by``: what the bootstrap resamples, ``session`` or ``agent`` (all of an agent's
    sessions together: wider, more honest intervals when sessions of an agent are alike)."""
    if by not in ("session", "agent"):
        raise ValueError(f"by={by!r}: resample by 'session' or 'agent'")
    n = len(sessions)
    failed = sessions.failed
    searched = sessions.agent_searches > 0
    clusters = sessions.agent if by == "agent" else None
    counts = resample_counts(n, resamples, seed, clusters) if n and resamples else []
    windows = tuple(sorted(set(windows) | {stream_window}))
    by_window = []
    boot_aucs = []
    for w in windows:
        f = sessions.followups(w)
        row = binary(f"≥ 1 followup ({w:g} s)", f > 0, failed, counts, level)
        rate = f[searched] / sessions.agent_searches[searched]
        point = auc(rate, failed[searched])
        boot = (
            np.concatenate([auc(rate, failed[searched], c[:, searched]) for c in counts])
            if counts
            else np.array([])
        )
        boot_aucs.append(boot)
        by_window.append(
            {
                "window_seconds": w,
                "stream": w == stream_window,
                **row,
                "followups": int(f.sum()),
                "rate_auc": None if np.isnan(point) else point,
                "rate_auc_ci": _interval(boot, level) if counts else None,
            }
        )
    if counts and by_window:
        stack = np.vstack(boot_aucs)
        defined = np.all(np.isfinite(stack), axis=0)
        best = np.argmax(np.where(np.isfinite(stack), stack, -1), axis=0)[defined]
        for i, row in enumerate(by_window):
            row["p_best"] = float(np.mean(best == i)) if best.size else None
    points = [
        (r["rate_auc"], -abs(r["window_seconds"] - stream_window), i)
        for i, r in enumerate(by_window)
        if r["rate_auc"] is not None
    ]
    best_window = by_window[max(points)[2]]["window_seconds"] if points else None
    stream = next(r for r in by_window if r["stream"])
    notes = []
    groups = n if clusters is None else int(len(np.unique(clusters)))
    if groups < MIN_CLUSTERS:
        notes.append(
            f"only {groups} {by}s to resample: a bootstrap over so few is unreliable (its "
            "intervals can come out too narrow)"
        )
    never = binary("never searched", ~searched, failed, counts, level)
    return {
        "population": {
            "sessions": n,
            "failed": int(failed.sum()),
            "base_rate": float(failed.mean()) if n else None,
            "searched": int(searched.sum()),
            "never_searched": int((~searched).sum()),
            "failed_never_searched": int((failed & ~searched).sum()),
            "failure_rate_searched": float(failed[searched].mean()) if searched.any() else None,
            "failure_rate_never_searched": float(failed[~searched].mean())
            if (~searched).any()
            else None,
            "unknown_verdicts": sessions.unknown,
        },
        "predictors": [
            {k: stream[k] for k in never},  # the predictors' own columns
            binary("≥ 1 ignored memory", sessions.ignored, failed, counts, level),
            never,
        ],
        "rate_auc": {
            "window_seconds": stream_window,
            "sessions": int(searched.sum()),
            "auc": stream["rate_auc"],
            "ci": stream["rate_auc_ci"],
        },
        "windows": by_window,
        "best_window_seconds": best_window,
        "bootstrap": {
            "resamples": resamples,
            "seed": seed,
            "level": level,
            "unit": by,
            "clusters": groups,
        },
        "notes": notes,
        "caveats": list(CAVEATS),
    }


def stream_check(con: duckdb.DuckDBPyConnection, window: float) -> dict[str, int]:
    """How many stored verdicts the recomputation at ``window`` reproduces: all of them
    when the worker ran with that window."""
    return rows(con, "calibration_check", window=window)[0]
