"""Positional decay: where in its context a reader starts to miss evidence it was given.

Seed 000 names the failure ("the context block was too long, ranking buried the relevant
entry") and the recall paper measures it (section 7.3). In benchmark mode memdiag knows,
per answer, the context in rank order and the gold evidence, so it can set the answers the
reader had everything for apart by *where* the evidence sat:

- by the best rank of a gold id in the context (1, 2–3, 4–10, past 10): a reader that
  decays with position answers rank-1 evidence right and rank-12 evidence wrong;
- by the length of the context (1–5, 6–10, 11–20, 21–50, past 50 ids): a reader that
  drowns answers short contexts right and long ones wrong, wherever the evidence is.

The answers counted are those with gold evidence, *all* of it in the context: the reader
had what it needed, so each is either correct or a ``reader_failure`` (an answer missing
some gold is a retrieval question, and one without gold cannot be placed). Each answer
counts once (repeats are answers); a bucket gives how many, how many were right, the
reader failures, and the correct-answer rate. Pure functions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import duckdb

#: (lowest, highest or None, label): the best gold rank's buckets (1-based ranks)
RANK_BUCKETS: tuple[tuple[int, int | None, str], ...] = (
    (1, 1, "1"),
    (2, 3, "2-3"),
    (4, 10, "4-10"),
    (11, None, ">10"),
)
#: the context length's buckets, in context ids
LENGTH_BUCKETS: tuple[tuple[int, int | None, str], ...] = (
    (1, 5, "1-5"),
    (6, 10, "6-10"),
    (11, 20, "11-20"),
    (21, 50, "21-50"),
    (51, None, ">50"),
)
UNIT = "answer with all its gold evidence in the context (each repeat an answer)"


class Placed(Protocol):
    @property
    def correct(self) -> bool: ...
    @property
    def gold_evidence_ids(self) -> Sequence[str]: ...
    @property
    def retrieved_context_ids(self) -> Sequence[str]: ...


def best_gold_rank(gold: Sequence[str], context: Sequence[str]) -> int | None:
    """The 1-based rank of the first gold id in the context, when *all* the gold is there;
    None when there is no gold or some of it is missing (not the reader's to miss)."""
    wanted = set(gold)
    if not wanted or not wanted.issubset(context):
        return None
    return next(rank for rank, cid in enumerate(context, start=1) if cid in wanted)


def bucket_of(value: int, buckets: Sequence[tuple[int, int | None, str]]) -> str:
    for low, high, label in buckets:
        if value >= low and (high is None or value <= high):
            return label
    raise ValueError(f"{value} is in no bucket")  # ranks and lengths are >= 1: never


@dataclass(frozen=True, slots=True)
class Bucket:
    bucket: str
    answers: int
    correct: int

    @property
    def reader_failures(self) -> int:
        return self.answers - self.correct

    @property
    def correct_rate(self) -> float | None:
        return self.correct / self.answers if self.answers else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "answers": self.answers,
            "correct": self.correct,
            "reader_failures": self.reader_failures,
            "correct_rate": self.correct_rate,
        }


def _table(
    placed: Iterable[tuple[int, bool]], buckets: Sequence[tuple[int, int | None, str]]
) -> list[Bucket]:
    counts = {label: [0, 0] for _, _, label in buckets}
    for value, correct in placed:
        row = counts[bucket_of(value, buckets)]
        row[0] += 1
        row[1] += correct
    return [Bucket(label, *counts[label]) for _, _, label in buckets]


def positional(answers: Iterable[Placed]) -> dict[str, list[Bucket]]:
    """Both tables over the answers the reader had all the gold evidence for."""
    given = [
        (rank, len(a.retrieved_context_ids), a.correct)
        for a in answers
        if (rank := best_gold_rank(a.gold_evidence_ids, a.retrieved_context_ids)) is not None
    ]
    return {
        "by_gold_rank": _table(((r, c) for r, _, c in given), RANK_BUCKETS),
        "by_context_length": _table(((n, c) for _, n, c in given), LENGTH_BUCKETS),
    }


def as_dict(tables: dict[str, list[Bucket]]) -> dict[str, Any]:
    return {"unit": UNIT, **{name: [b.as_dict() for b in rows] for name, rows in tables.items()}}


def compared(base: Iterable[Placed], cand: Iterable[Placed]) -> dict[str, Any]:
    """Baseline against candidate per bucket: each side's answers placed by its own context
    (a candidate that ranks the evidence higher moves answers to better buckets; the rates
    say whether the reader then gets them right). Not paired: a question may sit in a
    different bucket on each side."""
    b, c = positional(base), positional(cand)
    out: dict[str, Any] = {"unit": UNIT}
    for name in b:
        out[name] = [
            {
                "bucket": x.bucket,
                "baseline": x.as_dict(),
                "candidate": y.as_dict(),
                "correct_rate_delta": None
                if x.correct_rate is None or y.correct_rate is None
                else y.correct_rate - x.correct_rate,
            }
            for x, y in zip(b[name], c[name], strict=True)
        ]
    return out


class _Answer(NamedTuple):
    correct: bool
    gold_evidence_ids: list[str]
    retrieved_context_ids: list[str]


def by_run(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> list[dict[str, Any]]:
    """Both tables for each run and condition of ``run_ids`` (the report's benchmark section),
    from the judgements that count; a run without judgements is left out."""
    placed: dict[tuple[str, str], list[_Answer]] = defaultdict(list)
    for run_id, condition, correct, gold, context in con.execute(
        "SELECT run_id, condition, judge_correct, gold_evidence_ids, retrieved_context_ids "
        "FROM judgements WHERE list_contains($runs, run_id)",
        {"runs": list(run_ids)},
    ).fetchall():
        placed[(run_id, condition)].append(_Answer(correct, gold, context))
    order = {r: i for i, r in enumerate(run_ids)}
    return [
        {"run_id": run, "condition": condition, "positional": as_dict(positional(answers))}
        for (run, condition), answers in sorted(
            placed.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])
        )
    ]
