"""``memdiag calibrate``: how well do memdiag's live proxies predict failed sessions?

The followup counter stands in for "the first results did not satisfy"; nobody has measured
it against outcomes. memdiag has both, so this measures, per session with an outcome:

- followups per session (count, and rate per agent search), failed against accepted;
- precision, recall and lift of "at least one followup" as a predictor of a failed session,
  over the sessions that searched (one that never searched cannot have a followup), and of
  "at least one ignored memory" and "never searched" over every session, each with a
  percentile bootstrap interval that resamples sessions, or whole agents (seeded: the same
  data gives the same interval);
- the ROC AUC of the followup rate over the sessions that searched (a session without an
  agent search has no rate: it is in the "never searched" group, reported apart);
- all of it for several followup windows, recomputed from ``searches.disjoint_new_query``
  and ``gap_seconds`` (a followup under window W is a disjoint new query at most W after its
  predecessor), with the share of resamples in which each window has the best AUC.

Sessions with a judged search written before memdiag stored ``disjoint_new_query`` have no
verdict under other windows: they are left out, and counted. Correlation only: a proxy that
predicts failures does not cause them, sessions of one agent are not independent, and a
small sample gives wide intervals (the README says how to read it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
MIN_CLUSTERS = 20  # fewer resampled units than this: the intervals are unreliable
_CHUNK = 2_000_000  # resample-count cells per chunk (int32: 8 MB)


@dataclass(frozen=True, slots=True)
class Sessions:
    """The sessions measured, as arrays (one entry per session)."""

    failed: np.ndarray  # bool
    agent_searches: np.ndarray  # int
    gaps: list[list[float]]  # gaps of the session's disjoint new queries
    ignored: np.ndarray  # bool: >= 1 memory ignored in every evaluated turn
    agent: np.ndarray  # int: the session's agent (a session without agent_id is its own)
    unknown: int = 0  # sessions left out: a judged search without disjoint_new_query

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
    known = [r for r in found if not r["unknown"]]
    return Sessions(
        failed=np.array([r["failed"] for r in known], dtype=bool),
        agent_searches=np.array([r["agent_searches"] for r in known], dtype=np.int64),
        gaps=[list(r["gaps"]) for r in known],
        ignored=np.array([r["ignored"] for r in known], dtype=bool),
        agent=_clusters([r["agent_id"] or f"\0{r['session_id']}" for r in known]),
        unknown=len(found) - len(known),
    )


def _clusters(labels: list[str]) -> np.ndarray:
    index: dict[str, int] = {}
    return np.array([index.setdefault(x, len(index)) for x in labels], dtype=np.int64)


# -- statistics (pure) --------------------------------------------------------------------


def resample_counts(
    n: int, resamples: int, seed: int, clusters: np.ndarray | None = None
) -> Iterator[np.ndarray]:
    """How often each of ``n`` sessions is drawn in each resample (one row per resample),
    chunk by chunk, so memory stays bounded. The same ``seed`` gives the same draws: every
    statistic that iterates again sees the same resamples. With ``clusters`` (a cluster
    index per session), whole clusters are drawn, each with all its sessions."""
    k = n if clusters is None else (int(clusters.max()) + 1 if len(clusters) else 0)
    if k == 0 or resamples <= 0:
        return
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK // max(n, k))
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        idx = rng.integers(0, k, size=(size, k))
        flat = (idx + (np.arange(size) * k)[:, None]).ravel()
        counts = np.bincount(flat, minlength=size * k).reshape(size, k).astype(np.int32)
        yield counts if clusters is None else counts[:, clusters]


def auc(scores: np.ndarray, positive: np.ndarray, weights: np.ndarray | None = None) -> Any:
    """ROC AUC of ``scores`` for ``positive`` (ties count one half): the chance that a
    random positive scores above a random negative. ``weights`` (one row per resample)
    count each item that often. ``nan`` where a class is absent."""
    order = np.argsort(scores, kind="stable")
    s = scores[order]
    pos = positive[order].astype(np.float64)
    w = np.ones((1, len(s))) if weights is None else np.atleast_2d(weights)[:, order]
    if len(s) == 0:
        result = np.full(len(w), np.nan)
    else:
        starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
        p = np.add.reduceat(w * pos, starts, axis=1)
        q = np.add.reduceat(w * (1 - pos), starts, axis=1)
        below = np.cumsum(q, axis=1) - q
        with np.errstate(invalid="ignore", divide="ignore"):
            result = (p * (below + 0.5 * q)).sum(axis=1) / (p.sum(axis=1) * q.sum(axis=1))
    return result if weights is not None and np.ndim(weights) == 2 else float(result[0])


def interval(values: np.ndarray, level: float) -> dict[str, Any] | None:
    """Percentile interval of the defined (finite) bootstrap values; ``None`` without any."""
    if len(values) == 0:
        return None
    finite = values[np.isfinite(values)]
    undefined = int(len(values) - len(finite))
    if len(finite) == 0:
        return {"low": None, "high": None, "undefined_resamples": undefined}
    alpha = (1 - level) / 2
    low, high = np.quantile(finite, [alpha, 1 - alpha])
    return {"low": float(low), "high": float(high), "undefined_resamples": undefined}


def _ratio(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1), np.nan)


Draws = Callable[[], Iterator[np.ndarray]]


def binary(
    name: str,
    flag: np.ndarray,
    failed: np.ndarray,
    draws: Draws,
    level: float,
    population: str = "sessions",
    mask: np.ndarray | None = None,
) -> dict[str, Any]:
    """Precision, recall and lift of ``flag`` as a predictor of ``failed`` over the sessions
    of ``mask`` (all by default), with bootstrap intervals over ``draws()``."""
    mask = np.ones(len(flag), dtype=bool) if mask is None else mask
    tp_v = (flag & failed & mask).astype(np.int64)
    fl_v = (flag & mask).astype(np.int64)
    fa_v = (failed & mask).astype(np.int64)
    tp, flagged, positives, n = int(tp_v.sum()), int(fl_v.sum()), int(fa_v.sum()), int(mask.sum())
    precision = tp / flagged if flagged else None
    recall = tp / positives if positives else None
    base = positives / n if n else None
    boot_p, boot_r = [], []
    for c in draws():
        tp_b = c @ tp_v
        boot_p.append(_ratio(tp_b, c @ fl_v))
        boot_r.append(_ratio(tp_b, c @ fa_v))
    return {
        "predictor": name,
        "population": population,
        "sessions": n,
        "failed": positives,
        "flagged": flagged,
        "failed_flagged": tp,
        "precision": precision,
        "precision_ci": interval(np.concatenate(boot_p), level) if boot_p else None,
        "recall": recall,
        "recall_ci": interval(np.concatenate(boot_r), level) if boot_r else None,
        "lift": precision / base if precision is not None and base else None,
    }


def _summary(values: np.ndarray) -> dict[str, Any]:
    if len(values) == 0:
        return {"sessions": 0, "mean": None, "median": None}
    return {
        "sessions": int(len(values)),
        "mean": float(values.mean()),
        "median": float(np.median(values)),
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
    if resamples < 0:
        raise ValueError("resamples must be >= 0")
    n = len(sessions)
    failed = sessions.failed
    searched = sessions.agent_searches > 0
    clusters = sessions.agent if by == "agent" else None

    def draws() -> Iterator[np.ndarray]:
        return resample_counts(n, resamples, seed, clusters)

    windows = tuple(sorted(set(windows) | {stream_window}))
    rate_of = {}
    by_window = []
    boot_aucs = []
    for w in windows:
        f = sessions.followups(w)
        rate = f[searched] / sessions.agent_searches[searched]
        rate_of[w] = (f, rate)
        point = auc(rate, failed[searched])
        boot = [auc(rate, failed[searched], c[:, searched]) for c in draws()]
        aucs = np.concatenate(boot) if boot else np.array([])
        boot_aucs.append(aucs)
        row = binary(
            f"≥ 1 followup ({w:g} s)", f > 0, failed, draws, level, "sessions that searched",
            searched,
        )  # fmt: skip
        by_window.append(
            {
                "window_seconds": w,
                "stream": w == stream_window,
                **row,
                "followups": int(f.sum()),
                "rate_auc": None if np.isnan(point) else point,
                "rate_auc_ci": interval(aucs, level),
                "p_best": None,
            }
        )
    if resamples and n:
        stack = np.vstack(boot_aucs)  # windows x resamples
        defined = np.all(np.isfinite(stack), axis=0)
        if defined.any():
            top = stack[:, defined]
            best = top == top.max(axis=0)  # ties share the resample
            share = (best / best.sum(axis=0)).mean(axis=1)
            for row, p in zip(by_window, share, strict=True):
                row["p_best"] = float(p)
    points = [
        (r["rate_auc"], -abs(r["window_seconds"] - stream_window), i)
        for i, r in enumerate(by_window)
        if r["rate_auc"] is not None
    ]
    best_window = by_window[max(points)[2]]["window_seconds"] if points else None
    stream = next(r for r in by_window if r["stream"])
    groups = {}
    f, rate = rate_of[stream_window]
    for name, mask in (("failed", failed), ("accepted", ~failed)):
        groups[name] = {
            "sessions": int(mask.sum()),
            "never_searched": int((mask & ~searched).sum()),
            "followups": _summary(f[mask & searched].astype(np.float64)),
            "rate": _summary(rate[mask[searched]]),
        }
    groups_count = n if clusters is None else int(len(np.unique(clusters)))
    notes = []
    if sessions.unknown:
        notes.append(
            f"{sessions.unknown:,} sessions left out: their searches were judged before "
            "memdiag stored disjoint_new_query, so no other window can be recomputed for them "
            "(re-run their events through memdiag to include them)"
        )
    if resamples and groups_count < MIN_CLUSTERS:
        notes.append(
            f"only {groups_count} {by}s to resample: a bootstrap over so few is unreliable "
            "(its intervals can come out too narrow)"
        )
    result = {
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
            "left_out_unknown": sessions.unknown,
        },
        "groups": groups,
        "predictors": [
            {
                k: stream[k]
                for k in (
                    "predictor",
                    "population",
                    "sessions",
                    "failed",
                    "flagged",
                    "failed_flagged",
                    "precision",
                    "precision_ci",
                    "recall",
                    "recall_ci",
                    "lift",
                )
            },  # fmt: skip
            binary("≥ 1 ignored memory", sessions.ignored, failed, draws, level),
            binary("never searched", ~searched, failed, draws, level),
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
            "clusters": groups_count,
        },
        "notes": notes,
        "caveats": list(CAVEATS),
    }
    result["verdict"] = verdict(result)
    return result


def verdict(r: dict[str, Any]) -> str:
    """The window table in one sentence."""
    rows_ = [w for w in r["windows"] if w["rate_auc"] is not None]
    if not rows_:
        return "too few failed or accepted sessions that searched to measure the followup rate"
    if not r["bootstrap"]["resamples"]:
        return (
            "no intervals (--resamples 0): the point estimates alone cannot tell the windows apart"
        )
    cis = [w["rate_auc_ci"] for w in rows_]
    if any(ci is None or ci["low"] is None for ci in cis):
        return "the resamples rarely hold both outcomes: too few sessions for intervals"
    above = [w for w in rows_ if w["rate_auc_ci"]["low"] > 0.5]
    below = [w for w in rows_ if w["rate_auc_ci"]["high"] < 0.5]
    few = r["bootstrap"]["clusters"] < MIN_CLUSTERS
    caution = " (unreliable: too few to resample, see the notes)" if few else ""
    if above:
        best = max(
            above,
            key=lambda w: (
                w["rate_auc"],
                -abs(w["window_seconds"] - r["rate_auc"]["window_seconds"]),
            ),
        )
        p_best = best["p_best"] or 0
        return (
            f"the followup rate predicts failures better than chance at "
            f"{_seconds(above)}; best on this data: "
            f"{best['window_seconds']:g} s (AUC {best['rate_auc']:.3f}, best in {p_best:.0%} of "
            f"the resamples){caution}"
        )
    if below:
        return (
            "a higher followup rate goes with accepted sessions at "
            f"{_seconds(below)}: here followups look "
            f"like healthy refinement, not unsatisfying results{caution}"
        )
    return (
        "on this data no window's followup rate predicts failures better than chance (every "
        f"AUC interval contains 0.5){caution}"
    )


def _seconds(windows: list[dict[str, Any]]) -> str:
    return ", ".join(f"{w['window_seconds']:g} s" for w in windows)


def stream_check(
    con: duckdb.DuckDBPyConnection,
    window: float,
    org: str | None = None,
    project: str | None = None,
    since: datetime | None = None,
) -> dict[str, Any]:
    """How many stored verdicts the recomputation at ``window`` reproduces (all of them
    when the worker ran with that window), and the window lengths the stored verdicts are
    consistent with: ``[window_at_least, window_below)``."""
    return rows(
        con, "calibration_check", window=window, org_id=org, project_id=project, since=since
    )[0]


#: A proxy is called uninformative on a file when it is this close to chance: the followup
#: rate's AUC within 0.05 of 0.5, or an ignored memory's lift within 0.1 of 1, over at least
#: MIN_EACH failed and MIN_EACH accepted sessions (fewer: not judged).
CHANCE_AUC, CHANCE_LIFT, MIN_EACH = 0.05, 0.10, 20


def proxies(
    con: duckdb.DuckDBPyConnection,
    stream_window: float = 30.0,
    org: str | None = None,
    project: str | None = None,
    since: datetime | None = None,
) -> dict[str, Any]:
    """How much the two live proxies say on this file, as ``calibrate`` measures them (its
    point estimates, no resampling): what ``status``, the report and the view say beside each
    proxy when it is no better than chance here. Empty when too few sessions to judge."""
    sessions = load(con, org, project, since)
    failed = int(sessions.failed.sum())
    if failed < MIN_EACH or len(sessions) - failed < MIN_EACH:
        return {}
    r = calibrate(sessions, (stream_window,), stream_window, resamples=0)
    auc_ = r["rate_auc"]["auc"]
    ignored = next(p for p in r["predictors"] if p["predictor"].startswith("≥ 1 ignored"))
    lift = ignored["lift"]
    out: dict[str, Any] = {}
    if auc_ is not None:
        out["followups"] = {
            "auc": auc_,
            "informative": abs(auc_ - 0.5) >= CHANCE_AUC,
            "words": "on this data the followup rate barely tells failed sessions apart: "
            f"AUC {auc_:.2f}, says memdiag calibrate",
        }
    if lift is not None:
        out["ignored"] = {
            "lift": lift,
            "informative": abs(lift - 1) >= CHANCE_LIFT,
            "words": "on this data an ignored memory barely predicts a failed session: lift "
            f"{lift:.2f}, says memdiag calibrate",
        }
    return out


# -- the semantic rule's verdicts (MEMDIAG_DETECTOR=semantic) ------------------------------

#: The quantiles a similarity distribution is summarised by (linear interpolation, as
#: DuckDB's quantile_cont and numpy's default percentile).
QUANTILES = (("p10", 0.1), ("p25", 0.25), ("median", 0.5), ("p75", 0.75), ("p90", 0.9))


def spread(
    n: int, low: float | None, quantiles: list[float] | None, high: float | None
) -> dict[str, Any]:
    """A distribution's summary: how many, min, the :data:`QUANTILES`, max (6 places)."""
    out: dict[str, Any] = {"n": n, "min": None if low is None else round(low, 6)}
    for i, (name, _) in enumerate(QUANTILES):
        out[name] = None if quantiles is None else round(quantiles[i], 6)
    out["max"] = None if high is None else round(high, 6)
    return out


def _rule(r: dict[str, Any]) -> str:
    """The rule that made a group of verdicts (``memdiag.analytics.explain.verdict_rule``)."""
    if r["keyword_used"]:
        return "keyword"
    return "similarity" if r["signal"] == "used" else "neither"


def semantic_verdicts(
    con: duckdb.DuckDBPyConnection,
    org: str | None = None,
    project: str | None = None,
    since: datetime | None = None,
) -> dict[str, Any] | None:
    """What the semantic rule did to the stored verdicts (those with ``detector =
    'semantic'``; None without any): how many it turned from the keyword rule's ``ignored``
    to ``used`` (a used verdict the stored counts do not give), and the similarity's
    distribution for each signal and each rule that made a verdict."""
    found = rows(con, "calibration_semantic", org_id=org, project_id=project, since=since)
    if not found:
        return None

    def of(r: dict[str, Any]) -> dict[str, Any]:
        return spread(r["scored"], r["min"], r["quantiles"], r["max"])

    totals = {r["signal"]: r for r in found if r["total"]}
    rules = {_rule(r): r for r in found if not r["total"]}
    verdicts = sum(r["verdicts"] for r in totals.values())
    flipped = rules["similarity"]["verdicts"] if "similarity" in rules else 0
    return {
        "verdicts": verdicts,
        "used": totals["used"]["verdicts"] if "used" in totals else 0,
        "ignored": totals["ignored"]["verdicts"] if "ignored" in totals else 0,
        "used_by_keyword": rules["keyword"]["verdicts"] if "keyword" in rules else 0,
        "ignored_to_used": flipped,
        "flipped_share": flipped / verdicts,
        "similarity": {signal: of(r) for signal, r in totals.items()},
        "similarity_by_rule": {rule: of(r) for rule, r in rules.items()},
    }
