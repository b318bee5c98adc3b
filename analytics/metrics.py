"""Per-answer benchmark metrics, and their means and intervals: pure functions.

Every metric is a number per judged answer, or ``None`` where the answer cannot have it (no
gold evidence for Recall@k and MRR, no ``score`` or ``latency_ms`` sent). Every question
weighs the same, however many repeats it has (as ``scores.json`` folds accuracy): a mean is
the mean over questions of each question's mean over its answers that have the value; a
paired delta is the mean over questions of each question's mean delta over its
(question_id, repeat_index) pairs where both sides have the value; an interval resamples
*questions*, each with all its repeats, because repeats of one question are not independent
evidence.

- ``accuracy``: 1 when the judge said correct, else 0.
- ``recall_at_k`` (k = 1, 5, 10): ``|gold ∩ first k of the context| / |gold|``.
- ``mrr``: ``1 / rank`` of the first gold id in the context, 0 when none is there.
- ``score``: the judge's graded score in [0, 1].
- ``latency_ms``; ``input_tokens``, ``output_tokens``; ``tokens`` = input + output where both
  are given, else the judgement's ``tokens``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from memdiag.analytics.stats import Interval, paired_bootstrap_ci

RECALL_KS = (1, 5, 10)


class Answer(Protocol):
    """What a metric reads of one judged answer (``scores.Judged`` is one)."""

    @property
    def correct(self) -> bool: ...
    @property
    def gold_evidence_ids(self) -> Sequence[str]: ...
    @property
    def retrieved_context_ids(self) -> Sequence[str]: ...
    @property
    def score(self) -> float | None: ...
    @property
    def latency_ms(self) -> float | None: ...
    @property
    def tokens(self) -> int | None: ...
    @property
    def input_tokens(self) -> int | None: ...
    @property
    def output_tokens(self) -> int | None: ...


def recall_at(k: int, gold: Sequence[str], context: Sequence[str]) -> float | None:
    """Share of the gold evidence among the first ``k`` context ids; None without gold."""
    wanted = set(gold)
    if not wanted:
        return None
    return len(wanted.intersection(context[:k])) / len(wanted)


def reciprocal_rank(gold: Sequence[str], context: Sequence[str]) -> float | None:
    """``1 / rank`` (1-based) of the first gold id in the context, 0 if none; None without gold."""
    wanted = set(gold)
    if not wanted:
        return None
    for rank, cid in enumerate(context, start=1):
        if cid in wanted:
            return 1.0 / rank
    return 0.0


def total_tokens(a: Answer) -> float | None:
    if a.input_tokens is not None and a.output_tokens is not None:
        return float(a.input_tokens + a.output_tokens)
    return None if a.tokens is None else float(a.tokens)


def _opt(v: float | None) -> float | None:
    return None if v is None else float(v)


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    #: True: a drop is a regression (accuracy, recall, score); False: a rise is (cost, time)
    higher_is_better: bool
    unit: str  # "fraction" (0-1), "ms" or "tokens"
    value: Callable[[Answer], float | None]
    means: str  # one line, for --explain and the docs


def _recall(k: int) -> Callable[[Answer], float | None]:
    return lambda a: recall_at(k, a.gold_evidence_ids, a.retrieved_context_ids)


#: Every metric, in the order reports show them.
METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("accuracy", True, "fraction", lambda a: 1.0 if a.correct else 0.0,
               "the share of answers the judge marked correct"),
        *(
            Metric(f"recall_at_{k}", True, "fraction", _recall(k),
                   f"the share of the gold evidence among the first {k} ids of the retrieved "
                   "context; answers without gold evidence left out")
            for k in RECALL_KS
        ),
        Metric("mrr", True, "fraction",
               lambda a: reciprocal_rank(a.gold_evidence_ids, a.retrieved_context_ids),
               "1/rank of the first gold id in the retrieved context, 0 when none is there; "
               "answers without gold evidence left out"),
        Metric("score", True, "fraction", lambda a: _opt(a.score),
               "the judge's graded score, 0 to 1, over the answers that carry one"),
        Metric("latency_ms", False, "ms", lambda a: _opt(a.latency_ms),
               "the answer's latency_ms, over the answers that carry it"),
        Metric("tokens", False, "tokens", total_tokens,
               "input_tokens + output_tokens where both are given, else tokens"),
        Metric("input_tokens", False, "tokens", lambda a: _opt(a.input_tokens),
               "the answer's input_tokens, over the answers that carry them"),
        Metric("output_tokens", False, "tokens", lambda a: _opt(a.output_tokens),
               "the answer's output_tokens, over the answers that carry them"),
    )
}  # fmt: skip


def fmt(unit: str, v: float, signed: bool = False, bare: bool = False, digits: int = 1) -> str:
    """A value in a metric's unit for people: fractions as % (deltas as points); ``bare``
    leaves the unit out (a table names it once). A value that rounds to 0 shows no sign."""
    shown = round(v * 100 if unit == "fraction" else v, digits)
    if shown == 0:
        shown = 0.0  # neither "-0.0" nor "+0.0"
        text = f"{shown:.{digits}f}"
    elif signed:
        text = f"{shown:+,.{digits}f}"
    else:
        text = f"{shown:,.{digits}f}"
    if unit == "fraction":  # a value in %, always; a delta in points
        return text + "%" if not signed else text if bare else text + " pts"
    return text if bare else f"{text} {unit}"


def _interval_dict(ci: Interval) -> dict[str, Any] | None:
    if not ci.computed:  # --resamples 0: no interval, never NaN in JSON
        return None
    return {"low": ci.low, "high": ci.high, "level": ci.level, "resamples": ci.resamples,
            "seed": ci.seed}  # fmt: skip


def summary(
    metric: Metric,
    answers: Sequence[tuple[str, int, Answer]],
    resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, Any] | None:
    """One condition's mean of a metric over ``(question_id, repeat_index, answer)``.

    Beside the mean: how many answers and questions carry it, the sample standard deviation
    of the per-repeat means (how much a rerun moves it), and a bootstrap interval of the mean
    over questions. None when no answer carries the metric.
    """
    per_q: dict[str, list[float]] = defaultdict(list)
    per_repeat: dict[int, list[float]] = defaultdict(list)
    asked: dict[int, set[str]] = defaultdict(set)
    for qid, rep, a in answers:
        v = metric.value(a)
        if v is not None:
            per_q[qid].append(v)
            per_repeat[rep].append(v)
            asked[rep].add(qid)
    if not per_q:
        return None
    means = np.array([np.mean(v) for v in per_q.values()], dtype=np.float64)
    ci = paired_bootstrap_ci(np.zeros_like(means), means, resamples, seed)
    full = full_repeats(asked, set(per_q))
    return {
        "mean": float(means.mean()),
        "answers": sum(len(v) for v in per_q.values()),
        "questions": len(per_q),
        "stdev_across_repeats": repeat_stdev(per_repeat, full),
        "repeats_in_spread": len(full),
        "ci": _interval_dict(ci),
    }


def full_repeats(asked: Mapping[int, set[str]], questions: set[str]) -> list[int]:
    """The repeat indices that answered every question: only their means measure what a
    rerun moves a figure by (a repeat of a few questions has their difficulty in its mean,
    not the rerun's noise)."""
    return [r for r, qs in sorted(asked.items()) if qs >= questions]


def repeat_stdev(per_repeat: Mapping[int, Sequence[float]], repeats: Sequence[int]) -> float:
    """The sample standard deviation of the per-repeat means of ``repeats``; 0 with fewer
    than two (then nothing measured a rerun: ``repeats_in_spread`` says so)."""
    means = [float(np.mean(per_repeat[r])) for r in repeats]
    return float(np.std(means, ddof=1)) if len(means) > 1 else 0.0


@dataclass(frozen=True, slots=True)
class Paired:
    """One metric of two sides over their shared (question_id, repeat_index) keys."""

    metric: Metric
    pairs: int
    questions: int
    baseline_mean: float
    candidate_mean: float
    ci: Interval

    @property
    def delta(self) -> float:
        return self.candidate_mean - self.baseline_mean

    def as_dict(self) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "questions": self.questions,
            "baseline_mean": self.baseline_mean,
            "candidate_mean": self.candidate_mean,
            "delta": self.delta,
            "ci": _interval_dict(self.ci),
            "higher_is_better": self.metric.higher_is_better,
            "unit": self.metric.unit,
        }


def paired(
    metric: Metric,
    baseline: Mapping[tuple[str, int], Answer],
    candidate: Mapping[tuple[str, int], Answer],
    resamples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> Paired | None:
    """Candidate − baseline of a metric over the keys both sides have it for, every
    question weighing the same, with its paired bootstrap interval over questions. None when
    no pair has it on both sides."""
    per_q: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for key in sorted(baseline.keys() & candidate.keys()):
        b, c = metric.value(baseline[key]), metric.value(candidate[key])
        if b is None or c is None:
            continue
        row = per_q[key[0]]
        row[0] += b
        row[1] += c
        row[2] += 1
    if not per_q:
        return None
    arr = np.array(list(per_q.values()), dtype=np.float64)
    base, cand = arr[:, 0] / arr[:, 2], arr[:, 1] / arr[:, 2]  # each question's means
    return Paired(
        metric,
        int(arr[:, 2].sum()),
        len(per_q),
        float(base.mean()),
        float(cand.mean()),
        paired_bootstrap_ci(base, cand, resamples, seed, level),
    )


def paired_all(
    baseline: Mapping[tuple[str, int], Answer],
    candidate: Mapping[tuple[str, int], Answer],
    resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, Paired | None]:
    """Every metric of :data:`METRICS`, paired; None for a metric no pair carries."""
    return {name: paired(m, baseline, candidate, resamples, seed) for name, m in METRICS.items()}


def as_dicts(metrics: Mapping[str, Paired | None]) -> dict[str, dict[str, Any] | None]:
    """Paired metrics as JSON objects (``scores.json`` and ``compare --json``)."""
    return {name: None if p is None else p.as_dict() for name, p in metrics.items()}
