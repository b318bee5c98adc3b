"""The benchmark scores file (``memdiag report scores``) and the paired comparison
(``memdiag compare``), both read from the ``judgements`` table.

Repeats are folded per question: a question judged ``n`` times counts as one question, with
each outcome weighted ``1/n``. So ``correct`` is the expected number of questions answered
correctly (fractional when repeats disagree), ``accuracy = correct / questions``, and the
failure modes add up with ``correct`` to ``questions``. The spread of the repeats is shown
beside it (accuracy per repeat index, and how many questions' repeats disagree).

Each metric of :mod:`memdiag.analytics.metrics` (Recall@k, MRR, the graded score, latency,
tokens) comes per condition with its mean and intervals, and paired between conditions
(``report scores``) or runs (``compare``) with a paired interval over questions.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import duckdb
import numpy as np

from memdiag import __version__
from memdiag.analytics import positional
from memdiag.analytics.lookup import NeedsCondition, SameSides, UnknownRun, lookup
from memdiag.analytics.metrics import (
    METRICS,
    as_dicts,
    full_repeats,
    paired_all,
    summary,
    total_tokens,
)
from memdiag.analytics.queries import upgraded
from memdiag.analytics.stats import SignTest, describe_deltas, sign_test_by_question
from memdiag.contract import FAILURE_MODES, READER_FAILURE, RETRIEVAL_FAILURE, UNATTRIBUTED

SCORES_SCHEMA = "https://memdiag.dev/schemas/scores.schema.json"
#: the condition ``report scores`` pairs the others against when none is named
BASELINE = "baseline"
CORRECT = "correct"
#: The states a paired judgement moves between, in the transition table's order.
STATES = (CORRECT, READER_FAILURE, RETRIEVAL_FAILURE, UNATTRIBUTED)


@dataclass(frozen=True, slots=True)
class Judged:
    condition: str
    question_id: str
    repeat_index: int
    correct: bool
    failure_mode: str | None
    ts: datetime
    latency_ms: float | None
    tokens: int | None
    gold_evidence_ids: list[str]
    retrieved_context_ids: list[str]  # in rank order
    score: float | None
    input_tokens: int | None
    output_tokens: int | None
    suite_checksum: str | None
    config_fingerprint: str | None
    fixture_checksum: str | None
    label_status: str | None
    split: str | None
    run_id: str

    @property
    def state(self) -> str:
        return CORRECT if self.correct else (self.failure_mode or UNATTRIBUTED)


_COLUMNS = (
    "condition, question_id, repeat_index, judge_correct, failure_mode, ts, latency_ms, tokens, "
    "gold_evidence_ids, retrieved_context_ids, score, input_tokens, output_tokens, "
    "suite_checksum, config_fingerprint, fixture_checksum, label_status, split, run_id"
)


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a comparison: a run, or every run of a run group (``run_group_id``), and
    optionally one condition of it."""

    run: str | None = None
    group: str | None = None
    condition: str | None = None

    def __post_init__(self) -> None:
        if (self.run is None) == (self.group is None):
            raise ValueError("a side is a run or a run group, not both and not neither")

    @property
    def name(self) -> str:
        """How a sentence names it: ``run 'r1'`` or ``group 'nightly'``."""
        return f"run {self.run!r}" if self.run is not None else f"group {self.group!r}"

    @property
    def label(self) -> str:
        """How a table names it: ``r1``, ``group:nightly``, with ``[condition]`` when one."""
        who = self.run if self.run is not None else f"group:{self.group}"
        return who if self.condition is None else f"{who} [{self.condition}]"


def side(run: str | Side | None, group: str | None = None, condition: str | None = None) -> Side:
    """A :class:`Side` from what a caller names (a run id, a group, or a side already)."""
    if isinstance(run, Side):
        return run
    return Side(run, group, condition)


def load(con: duckdb.DuckDBPyConnection, run_id: str) -> list[Judged]:
    rows = con.execute(
        upgraded(
            con,
            f"SELECT {_COLUMNS} FROM judgements WHERE run_id = $run "  # noqa: S608
            "ORDER BY condition, question_id, repeat_index",
        ),  # fmt: skip
        {"run": run_id},
    ).fetchall()
    if not rows:
        raise _unknown(con, "run", run_id, "no judgements of it", "; it has no judgements")
    return [Judged(*r) for r in rows]


def _unknown(
    con: duckdb.DuckDBPyConnection, kind: str, value: str, said: str, none: str
) -> UnknownRun:
    """No judgement of a run (``kind`` ``run``) or a run group: the closest ids of that kind,
    or ``none`` when there are none."""
    _, known, closest = lookup(con, kind, value)
    of = f"{len(closest)} of {known:,}" if known > len(closest) else f"all {known:,}"
    noun = "runs" if kind == "run" else "groups"
    hint = f"; the closest {noun} ({of}): {', '.join(closest)}" if known else none
    name = "run" if kind == "run" else "run group"
    return UnknownRun(f"no such {name} {value!r}: {said}{hint}", kind=kind, id=value,
                      closest=closest, known=known)  # fmt: skip


def load_group(con: duckdb.DuckDBPyConnection, group: str) -> list[Judged]:
    """Every judgement of every run of ``group``, each run one repeat (contract section 7).

    Seed 002 keeps each repeat of a suite as its own immutable run sharing a
    ``run_group_id``. Here the runs are put in order (by their first judgement's ``ts``,
    ties by ``run_id``) and, per condition and question, the answers numbered again in that
    order (a run's own repeats in their ``repeat_index`` order): the group's repeat 0 of a
    question is its answer in the first run, and so on. Pairing two groups then pairs the
    first runs' answers, the second runs', ...; a question some run skipped has fewer
    repeats, as a run would."""
    rows = con.execute(
        upgraded(
            con,
            f"SELECT {_COLUMNS}, min(ts) OVER (PARTITION BY run_id) AS run_start "  # noqa: S608
            "FROM judgements WHERE run_group_id = $group "
            "ORDER BY condition, question_id, run_start, run_id, repeat_index",
        ),  # fmt: skip
        {"group": group},
    ).fetchall()
    if not rows:
        raise _unknown(con, "run_group", group, "no judgement names it",
                       "; no judgement carries a run_group_id")  # fmt: skip
    out: list[Judged] = []
    seen: dict[tuple[str, str], int] = defaultdict(int)
    for r in rows:
        j = Judged(*r[:-1])
        key = (j.condition, j.question_id)
        out.append(dataclasses.replace(j, repeat_index=seen[key]))
        seen[key] += 1
    return out


def load_side(con: duckdb.DuckDBPyConnection, s: Side) -> list[Judged]:
    """The judgements of one side, its condition chosen (:func:`pick_condition`)."""
    judged = load(con, s.run) if s.run is not None else load_group(con, s.group or "")
    return pick_condition(judged, s, s.condition)


def runs_of(judged: list[Judged]) -> list[str]:
    """The runs a side's judgements come from, in their order (a group's repeats)."""
    return list(dict.fromkeys(j.run_id for j in judged))


def _fold(judged: list[Judged], resamples: int, seed: int) -> dict[str, Any]:
    by_question: dict[str, list[Judged]] = defaultdict(list)
    for j in judged:
        by_question[j.question_id].append(j)
    per_question = []
    totals = dict.fromkeys((CORRECT, *FAILURE_MODES), 0.0)
    by_repeat: dict[int, list[bool]] = defaultdict(list)
    asked: dict[int, set[str]] = defaultdict(set)
    unstable = 0
    for qid, js in sorted(by_question.items()):
        n = len(js)
        counts = dict.fromkeys((CORRECT, *FAILURE_MODES), 0)
        for j in js:
            counts[j.state] += 1
            by_repeat[j.repeat_index].append(j.correct)
            asked[j.repeat_index].add(qid)
        for k, v in counts.items():
            totals[k] += v / n
        unstable += 0 < counts[CORRECT] < n
        per_question.append(
            {"question_id": qid, "repeats": n, **counts, "accuracy": counts[CORRECT] / n}
        )
    questions = len(by_question)
    repeat_accuracy = {str(r): sum(v) / len(v) for r, v in sorted(by_repeat.items())}
    # the spread is over the repeats that answered every question (a repeat of a few
    # questions has their difficulty in its mean): with fewer than two, none was measured
    full = full_repeats(asked, set(by_question))
    accs = [repeat_accuracy[str(r)] for r in full] or [totals[CORRECT] / questions]
    latencies = [j.latency_ms for j in judged if j.latency_ms is not None]
    # tokens as the metric counts them: input + output where both are given, else tokens
    tokens = [int(t) for j in judged if (t := total_tokens(j)) is not None]
    return {
        "questions": questions,
        "judgements": len(judged),
        "repeats": {
            "min": min(len(v) for v in by_question.values()),
            "max": max(len(v) for v in by_question.values()),
        },
        "correct": round(totals[CORRECT], 6),
        "accuracy": round(totals[CORRECT] / questions, 6),
        "reader_failure_with_evidence": round(totals[READER_FAILURE], 6),
        "retrieval_failure": round(totals[RETRIEVAL_FAILURE], 6),
        "unattributed": round(totals[UNATTRIBUTED], 6),
        "spread": {
            "accuracy_by_repeat": repeat_accuracy,
            "min": min(accs),
            "max": max(accs),
            "stdev": statistics.stdev(accs) if len(full) > 1 else 0.0,
            "repeats_used": full,
            "questions_with_disagreeing_repeats": unstable,
        },
        "latency_ms": (
            {
                "mean": statistics.fmean(latencies),
                "p50": float(np.percentile(latencies, 50)),
                "p95": float(np.percentile(latencies, 95)),
            }
            if latencies
            else None
        ),
        "tokens": {"mean": statistics.fmean(tokens), "total": sum(tokens)} if tokens else None,
        "metrics": {
            name: summary(m, [(j.question_id, j.repeat_index, j) for j in judged], resamples, seed)
            for name, m in METRICS.items()
        },
        "positional": positional.as_dict(positional.positional(judged)),
        "per_question": per_question,
    }


def scores(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    db_path: str = "",
    baseline_condition: str | None = None,
    resamples: int = 10_000,
    seed: int = 0,
) -> dict[str, Any]:
    """The scores file of one run: per condition, the conditions paired against a baseline
    condition (``baseline_condition``, else one named ``baseline`` if the run has it), then
    provenance."""
    judged = load(con, run_id)
    by_condition: dict[str, list[Judged]] = defaultdict(list)
    for j in judged:
        by_condition[j.condition].append(j)
    if baseline_condition is not None and baseline_condition not in by_condition:
        raise UnknownRun(
            f"run {run_id!r} has no condition {baseline_condition!r}; it has "
            f"{', '.join(map(repr, sorted(by_condition)))}"
        )
    if baseline_condition is None and BASELINE in by_condition:
        baseline_condition = BASELINE
    comparisons = []
    if baseline_condition is not None:
        base = {(j.question_id, j.repeat_index): j for j in by_condition[baseline_condition]}
        for cond, js in sorted(by_condition.items()):
            if cond == baseline_condition:
                continue
            cand = {(j.question_id, j.repeat_index): j for j in js}
            comparisons.append(
                {
                    "baseline_condition": baseline_condition,
                    "candidate_condition": cond,
                    "pairs": len(base.keys() & cand.keys()),
                    "questions": len({q for q, _ in base.keys() & cand.keys()}),
                    "metrics": as_dicts(paired_all(base, cand, resamples, seed)),
                }
            )
    return {
        "$schema": SCORES_SCHEMA,
        "run_id": run_id,
        "conditions": [
            {"condition": c, **_fold(js, resamples, seed)} for c, js in sorted(by_condition.items())
        ],
        "comparisons": comparisons,
        "provenance": {
            "judgements": len(judged),
            "first_event_ts": min(j.ts for j in judged).astimezone(UTC).isoformat(),
            "last_event_ts": max(j.ts for j in judged).astimezone(UTC).isoformat(),
            "memdiag_version": __version__,
            "source": db_path,
            "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        },
    }


# -- paired comparison --------------------------------------------------------------------


def pick_condition(judged: list[Judged], who: str | Side, condition: str | None) -> list[Judged]:
    name = who.name if isinstance(who, Side) else f"run {who!r}"
    conditions = sorted({j.condition for j in judged})
    if condition is None:
        if len(conditions) > 1:
            raise NeedsCondition(
                f"{name} has several conditions ({', '.join(map(repr, conditions))}): "
                "choose one with --baseline-condition / --candidate-condition"
            )
        return judged
    chosen = [j for j in judged if j.condition == condition]
    if not chosen:
        raise UnknownRun(
            f"{name} has no condition {condition!r}; it has {', '.join(map(repr, conditions))}"
        )
    return chosen


def side_dict(s: Side, judged: list[Judged]) -> dict[str, Any]:
    """A side as compare, gate and the pages print it: what it is, and the runs in it."""
    return {
        "run_id": s.run,
        "run_group_id": s.group,
        "runs": runs_of(judged),
        "condition": judged[0].condition if s.condition is None and judged else s.condition,
        "label": s.label,
    }


def compare(
    con: duckdb.DuckDBPyConnection,
    baseline: str | Side,
    candidate: str | Side,
    baseline_condition: str | None = None,
    candidate_condition: str | None = None,
    resamples: int = 10_000,
    seed: int = 0,
    alpha: float = 0.05,
) -> dict[str, Any]:
    """Pair the two sides' judgements by (question_id, repeat_index) and compare them. A side
    is a run id or a :class:`Side` (a run or a run group; its condition is then its own)."""
    b_side = side(baseline, condition=baseline_condition)
    c_side = side(candidate, condition=candidate_condition)
    b_judged, c_judged = load_side(con, b_side), load_side(con, c_side)
    same_sides(b_side, b_judged, c_side, c_judged)
    base = {(j.question_id, j.repeat_index): j for j in b_judged}
    cand = {(j.question_id, j.repeat_index): j for j in c_judged}
    keys = sorted(base.keys() & cand.keys())
    if not keys:
        raise UnknownRun(
            f"{b_side.name} and {c_side.name} share no (question_id, repeat_index): nothing to pair"
        )
    # McNemar with repeats: one sign per question, from its paired repeats (contract 7)
    by_question: dict[str, tuple[list[bool], list[bool]]] = defaultdict(lambda: ([], []))
    for k in keys:
        by_question[k[0]][0].append(base[k].correct)
        by_question[k[0]][1].append(cand[k].correct)
    sign = sign_test_by_question(by_question)
    metrics = paired_all(base, cand, resamples, seed)
    accuracy = metrics["accuracy"]
    if accuracy is None:  # every answer has an accuracy and keys is not empty: never
        raise RuntimeError("no paired accuracy")
    # every question weighs the same, however many repeats it has (as scores.json folds)
    base_acc, cand_acc, delta = accuracy.baseline_mean, accuracy.candidate_mean, accuracy.delta
    interval = accuracy.ci

    states = [s for s in STATES if s != UNATTRIBUTED] + (
        [UNATTRIBUTED] if any(UNATTRIBUTED in (base[k].state, cand[k].state) for k in keys) else []
    )
    table = {s: dict.fromkeys(states, 0) for s in states}
    for k in keys:
        table[base[k].state][cand[k].state] += 1

    def deltas(name: str) -> dict[str, float | int] | None:
        """The metric's paired delta (its mean: every question weighs the same, as the
        metrics' table says) and the median of its per-pair differences."""
        paired, value = metrics[name], METRICS[name].value
        values = [
            float(c) - float(b)
            for k in keys
            if (c := value(cand[k])) is not None and (b := value(base[k])) is not None
        ]
        described = describe_deltas(values)
        if described is None or paired is None:
            return None
        return {**described, "mean": paired.delta}

    p = sign.p_value
    significant, disagreement = _significance(sign, interval.low, interval.high, alpha, delta)
    moved = {
        "reader_failure": sum(row[READER_FAILURE] for row in table.values())
        - sum(table[READER_FAILURE].values()),
        "retrieval_failure": sum(row[RETRIEVAL_FAILURE] for row in table.values())
        - sum(table[RETRIEVAL_FAILURE].values()),
    }
    return {
        "baseline": {**side_dict(b_side, b_judged), "accuracy": base_acc},
        "candidate": {**side_dict(c_side, c_judged), "accuracy": cand_acc},
        "pairs": len(keys),
        "questions": accuracy.questions,
        "delta": delta,
        "mcnemar": {
            "right_to_wrong": sign.right_to_wrong,
            "wrong_to_right": sign.wrong_to_right,
            "ties": sign.ties,
            "p_value": p,
            "unit": "question (the sign of its change in share of right repeats; ties left out)",
        },
        "significant": significant,
        "significance_note": disagreement,
        "bootstrap_ci": {
            "low": interval.low,
            "high": interval.high,
            "level": interval.level,
            "resamples": interval.resamples,
            "seed": interval.seed,
            "unit": "question (its repeats resampled together)",
        }
        if interval.computed
        else None,
        "transitions": {"states": states, "baseline_to_candidate": table},
        "failure_mode_change": moved,
        "metrics": as_dicts(metrics),
        "latency_ms_delta": deltas("latency_ms"),
        "tokens_delta": deltas("tokens"),
        "positional": positional.compared(b_judged, c_judged),
        "unpaired": {
            "baseline_only": [
                {"question_id": q, "repeat_index": r} for q, r in sorted(base.keys() - cand.keys())
            ],
            "candidate_only": [
                {"question_id": q, "repeat_index": r} for q, r in sorted(cand.keys() - base.keys())
            ],
        },
        "verdict": _verdict(delta, p, significant, disagreement, moved, alpha),
    }


def same_sides(b_side: Side, base: list[Judged], c_side: Side, cand: list[Judged]) -> None:
    """:class:`SameSides` when the two sides are one run (or group) and one condition, or
    share runs under one condition: the answers would be compared with themselves."""
    if not base or not cand or base[0].condition != cand[0].condition:
        return
    if (b_side.run, b_side.group) == (c_side.run, c_side.group):
        kind, given = ("run", b_side.run) if b_side.run is not None else ("run group", b_side.group)
        raise SameSides(
            f"the baseline and the candidate are one {kind} ({given!r}) and one condition: "
            f"name two, or two conditions of the {kind}"
        )
    shared = set(runs_of(base)) & set(runs_of(cand))
    if shared:
        listed = ", ".join(repr(r) for r in sorted(shared)[:5]) + (" …" if len(shared) > 5 else "")
        raise SameSides(
            f"{len(shared)} run(s) are on both sides under one condition ({listed}): their "
            "answers would be compared with themselves. Name sides that share no run (a run "
            "group used as a side is a configuration's repeats: the baseline's runs belong "
            "in a group of their own)"
        )


def _significance(
    sign: SignTest, low: float, high: float, alpha: float, delta: float
) -> tuple[bool, str | None]:
    """Significant iff the sign test over questions and the paired interval over questions
    both say so, in the same direction; else None, or why the two disagree."""
    up, down = sign.wrong_to_right, sign.right_to_wrong
    by_test = (up > down) - (up < down)
    test_says = sign.p_value < alpha
    by_mean = (delta > 0) - (delta < 0)
    if low != low:  # NaN: no interval was asked for (--resamples 0)
        if test_says and by_mean == by_test:
            return True, "no interval was computed (--resamples 0): the sign test alone"
        if test_says:
            return False, (
                "the sign test and the mean point opposite ways: more questions got "
                f"{'better' if by_test > 0 else 'worse'}, but the mean moved the other way; "
                "no interval was computed (--resamples 0)"
            )
        return False, (
            f"sign test p = {sign.p_value:.3g} >= {alpha:g}; no interval was computed "
            "(--resamples 0)"
        )
    by_interval = 1 if low > 0 else (-1 if high < 0 else 0)
    if test_says and by_interval == by_test:
        return True, None
    if test_says and by_interval == 0:
        return False, (
            f"the sign test finds a difference, p = {sign.p_value:.3g} < {alpha:g}, but the "
            "interval spans 0: more questions moved one way, yet the mean change is uncertain"
        )
    if test_says:
        return False, (
            "the sign test and the interval point opposite ways: more questions got "
            f"{'better' if by_test > 0 else 'worse'}, but the mean moved the other way"
        )
    if by_interval != 0:
        return False, (
            f"the interval excludes 0 but the sign test does not, p = {sign.p_value:.3g} >= "
            f"{alpha:g}: too few questions changed for the test, however far their shares moved"
        )
    return False, None


def _verdict(
    delta: float, p: float, significant: bool, disagreement: str | None, moved: dict[str, int],
    alpha: float,
) -> str:  # fmt: skip
    if significant:
        head = f"candidate is {'better' if delta > 0 else 'worse'}" + (
            f" ({disagreement})" if disagreement else ""
        )
    elif disagreement:
        head = f"no significant difference ({disagreement})"
    else:
        head = f"no significant difference (sign test p = {p:.3g} >= {alpha:g}, interval spans 0)"
    notes = []
    r, t = moved["reader_failure"], moved["retrieval_failure"]
    if r > 0 > t:
        notes.append(
            f"{-t} fewer retrieval failures but {r} more reader failures: part of the gain is "
            "evidence the reader now has and still gets wrong"
        )
    elif t > 0 > r:
        notes.append(f"{-r} fewer reader failures but {t} more retrieval failures")
    return head + ("; " + "; ".join(notes) if notes else "")
