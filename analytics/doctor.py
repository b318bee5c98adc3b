"""``memdiag doctor``: what would make a comparison of benchmark runs weak, before it is made.

Each check reads the judgements that count (``judgements``: the latest per answer) and, for
re-judged answers, ``judgement_artifacts``. A finding says what is wrong, how much of the run
it touches, and what to do; its ``level`` is ``weak`` (the comparison would be unreliable),
``refuse`` (it would compare different things) or ``note`` (worth knowing, harmless).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import duckdb

#: fewer distinct questions than this make a paired interval too wide to gate on
MIN_QUESTIONS = 30

WEAK, REFUSE, NOTE = "weak", "refuse", "note"


@dataclass(frozen=True)
class Finding:
    level: str
    check: str
    subject: str  # the run (and condition) it is about
    message: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _label(run: str, condition: str | None) -> str:
    return run if condition is None else f"{run} [{condition}]"


def _params(run: str, condition: str | None) -> dict[str, Any]:
    """The parameters of every query's filter: the run, and its condition (None: all)."""
    return {"run": run, "condition": condition}


def check_run(
    con: duckdb.DuckDBPyConnection,
    run: str,
    condition: str | None = None,
    min_questions: int = MIN_QUESTIONS,
) -> list[Finding]:
    """The findings about one run (one condition of it, or all of them)."""
    who, params = _label(run, condition), _params(run, condition)
    n, questions, no_gold, unattributed, no_context = con.execute(
        "SELECT count(*), count(DISTINCT question_id), "
        "count(*) FILTER (WHERE len(gold_evidence_ids) = 0), "
        "count(*) FILTER (WHERE failure_mode = 'unattributed'), "
        "count(*) FILTER (WHERE len(retrieved_context_ids) = 0) FROM judgements "
        "WHERE run_id = $run "
        "AND ($condition IS NULL OR condition = $condition)",
        params,
    ).fetchone()  # type: ignore[misc]
    if n == 0:
        return [Finding(REFUSE, "no_data", who, "no judgement: check the run id and condition "
                        "(memdiag runs lists them)")]  # fmt: skip
    out: list[Finding] = []
    if questions < min_questions:
        out.append(Finding(WEAK, "too_few_items", who,
                           f"{questions} questions: a paired interval over fewer than "
                           f"{min_questions} is too wide to judge a regression; run more "
                           "questions"))  # fmt: skip
    if no_gold:
        out.append(Finding(WEAK, "missing_gold", who,
                           f"{no_gold} of {n} judgements name no gold evidence: Recall@k and "
                           "the reader/retrieval split leave them out; add "
                           "gold_evidence_ids"))  # fmt: skip
    if unattributed:
        out.append(Finding(NOTE, "unattributed", who,
                           f"{unattributed} wrong answers are unattributed (no gold evidence to "
                           "tell a reader failure from a retrieval failure)"))  # fmt: skip
    if no_context and no_context == n:
        out.append(Finding(WEAK, "no_context", who,
                           "no judgement names its retrieved context: recall cannot be "
                           "measured; send retrieved_context_ids in rank order"))  # fmt: skip
    noisy, repeated = con.execute(
        "SELECT count(*) FILTER (WHERE n_right > 0 AND n_right < n), count(*) FROM ("
        "SELECT question_id, condition, count(*) AS n, "
        "count(*) FILTER (WHERE judge_correct) AS n_right FROM judgements "
        "WHERE run_id = $run "
        "AND ($condition IS NULL OR condition = $condition) GROUP BY ALL HAVING count(*) > 1)",
        params,
    ).fetchone()  # type: ignore[misc]
    if noisy:
        out.append(Finding(WEAK, "repeats_disagree", who,
                           f"the repeats of {noisy} of {repeated} repeated questions disagree: "
                           "the system or the judge is noisy there; compare means over "
                           "repeats, and run more repeats"))  # fmt: skip
    mixed = con.execute(
        "SELECT count(DISTINCT suite_checksum), count(DISTINCT config_fingerprint) "
        "FROM judgements WHERE run_id = $run "
        "AND ($condition IS NULL OR condition = $condition)",
        params,
    ).fetchone()
    if mixed is not None and mixed[0] > 1:
        out.append(Finding(REFUSE, "mixed_suite", who,
                           f"{mixed[0]} suite checksums within one run: it answered different "
                           "suites; split it"))  # fmt: skip
    if mixed is not None and mixed[1] > 1:
        out.append(Finding(WEAK, "mixed_config", who,
                           f"{mixed[1]} config fingerprints within one run: it mixes "
                           "configurations"))  # fmt: skip
    rejudged = con.execute(
        "SELECT count(*) FROM judgement_artifacts WHERE run_id = $run "
        "AND ($condition IS NULL OR condition = $condition)",
        params,
    ).fetchone()
    if rejudged is not None and rejudged[0] > n:
        out.append(Finding(NOTE, "rejudged", who,
                           f"{rejudged[0] - n} answers were judged again: the latest judgement "
                           "of each counts (judgement_artifacts keeps them all)"))  # fmt: skip
    return out


def check_pair(
    con: duckdb.DuckDBPyConnection,
    baseline: tuple[str, str | None],
    candidate: tuple[str, str | None],
) -> list[Finding]:
    """What differs between the two sides of a comparison."""
    a, b = _label(*baseline), _label(*candidate)
    out: list[Finding] = []

    def questions(side: tuple[str, str | None]) -> set[str]:
        rows = con.execute(
            "SELECT DISTINCT question_id FROM judgements WHERE run_id = $run "
            "AND ($condition IS NULL OR condition = $condition)",
            _params(*side),
        ).fetchall()
        return {r[0] for r in rows}

    qa, qb = questions(baseline), questions(candidate)
    for side, only, other in ((a, qa - qb, b), (b, qb - qa, a)):
        if only:
            sample = ", ".join(sorted(only)[:5]) + (" …" if len(only) > 5 else "")
            out.append(Finding(WEAK, "unpaired_questions", side,
                               f"{len(only)} questions have no pair in {other} ({sample}): "
                               "they are left out of the comparison"))  # fmt: skip

    def provenance(side: tuple[str, str | None]) -> tuple[Any, ...]:
        row = con.execute(
            "SELECT any_value(suite_checksum), any_value(config_fingerprint) "
            "FROM judgements WHERE run_id = $run "
            "AND ($condition IS NULL OR condition = $condition)",
            _params(*side),
        ).fetchone()
        return row if row is not None else (None, None)

    (sa, ca), (sb, cb) = provenance(baseline), provenance(candidate)
    if sa is not None and sb is not None and sa != sb:
        out.append(Finding(REFUSE, "suite_differs", f"{a} vs {b}",
                           f"suite checksums differ ({sa} vs {sb}): the runs answered "
                           "different suites and cannot be compared"))  # fmt: skip
    elif sa is None or sb is None:
        out.append(Finding(NOTE, "no_suite_checksum", f"{a} vs {b}",
                           "no suite_checksum on one side: that both answered the same suite "
                           "cannot be checked"))  # fmt: skip
    if ca is not None and ca == cb:
        out.append(Finding(NOTE, "same_config", f"{a} vs {b}",
                           f"both sides have config fingerprint {ca}: is this the change you "
                           "meant to test?"))  # fmt: skip
    return out


def doctor(
    con: duckdb.DuckDBPyConnection,
    baseline: tuple[str, str | None],
    candidate: tuple[str, str | None] | None = None,
    min_questions: int = MIN_QUESTIONS,
) -> list[Finding]:
    """Every finding about one run, or two and their pairing; ``refuse`` ones first."""
    findings = check_run(con, *baseline, min_questions=min_questions)
    if candidate is not None:
        findings += check_run(con, *candidate, min_questions=min_questions)
        if all(f.check != "no_data" for f in findings):
            findings += check_pair(con, baseline, candidate)
    order = {REFUSE: 0, WEAK: 1, NOTE: 2}
    return sorted(findings, key=lambda f: order[f.level])
