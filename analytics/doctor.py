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

from memdiag.analytics.lookup import lookup
from memdiag.analytics.queries import upgraded
from memdiag.analytics.scores import Side

#: fewer distinct questions than this make a paired interval too wide to gate on
MIN_QUESTIONS = 30
#: the names of a no-memory control condition (seed 002: its answers must have no context)
NO_MEMORY = ("no-memory", "no_memory")
#: the filter of one side: a run or a run group, and its condition (None: all of them)
WHERE = (
    "($run IS NULL OR run_id = $run) AND ($group IS NULL OR run_group_id = $group) "
    "AND ($condition IS NULL OR condition = $condition)"
)
#: an answer that carries a token count (metrics.total_tokens is not None)
CARRIES_TOKENS = "(tokens IS NOT NULL OR (input_tokens IS NOT NULL AND output_tokens IS NOT NULL))"


def _filtered(con: duckdb.DuckDBPyConnection, query: str) -> str:
    """``query`` with its side's filter (``:where:``) and the token test (``:tokens:``), reading
    the columns a file older than them lacks as its rows have them (NULL)."""
    return upgraded(con, query.replace(":where:", WHERE).replace(":tokens:", CARRIES_TOKENS))


WEAK, REFUSE, NOTE = "weak", "refuse", "note"


@dataclass(frozen=True)
class Finding:
    level: str
    check: str
    subject: str  # the run (and condition) it is about
    message: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


Who = Side | tuple[str, str | None]


def _side(who: Who) -> Side:
    """A side, also from the (run, condition) pair older callers give."""
    return who if isinstance(who, Side) else Side(who[0], None, who[1])


def _params(s: Side) -> dict[str, Any]:
    """The parameters of every query's filter (:data:`WHERE`)."""
    return {"run": s.run, "group": s.group, "condition": s.condition}


def check_run(
    con: duckdb.DuckDBPyConnection,
    run: Who | str,
    condition: str | None = None,
    min_questions: int = MIN_QUESTIONS,
) -> list[Finding]:
    """The findings about one side: a run or a run group, one condition of it or all."""
    s = _side((run, condition) if isinstance(run, str) else run)
    who, params = s.label, _params(s)
    n, questions, no_gold, unattributed, no_context, runs = con.execute(
        _filtered(
            con,
            "SELECT count(*), count(DISTINCT question_id), "
            "count(*) FILTER (WHERE len(gold_evidence_ids) = 0), "
            "count(*) FILTER (WHERE failure_mode = 'unattributed'), "
            "count(*) FILTER (WHERE len(retrieved_context_ids) = 0), count(DISTINCT run_id) "
            "FROM judgements WHERE :where:",
        ),
        params,
    ).fetchone()  # type: ignore[misc]
    if n == 0:
        kind, given = ("run", s.run) if s.run is not None else ("run_group", s.group)
        found, _, closest = lookup(con, kind, given or "")
        hint = (
            f"no such {'run' if kind == 'run' else 'run group'}; the closest known: "
            + ", ".join(closest)
            if not found and closest
            else "check the run id (or group) and condition (memdiag runs lists them)"
        )
        return [Finding(REFUSE, "no_data", who, f"no judgement: {hint}")]
    out: list[Finding] = []
    if s.group is not None:
        out.append(Finding(NOTE, "run_group", who,
                           f"{runs} runs in the group: their answers are the group's repeats, "
                           "numbered per question in the order the runs started (a run's own "
                           "repeats each count)"))  # fmt: skip
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
        _filtered(
            con,
            "SELECT count(*) FILTER (WHERE n_right > 0 AND n_right < n), count(*) FROM ("
            "SELECT question_id, condition, count(*) AS n, "
            "count(*) FILTER (WHERE judge_correct) AS n_right FROM judgements "
            "WHERE :where: GROUP BY ALL HAVING count(*) > 1)",
        ),
        params,
    ).fetchone()  # type: ignore[misc]
    if noisy:
        out.append(Finding(WEAK, "repeats_disagree", who,
                           f"the repeats of {noisy} of {repeated} repeated questions disagree: "
                           "the system or the judge is noisy there; compare means over "
                           "repeats, and run more repeats"))  # fmt: skip
    mixed = con.execute(
        _filtered(
            con,
            "SELECT count(DISTINCT suite_checksum), count(DISTINCT config_fingerprint), "
            "count(DISTINCT fixture_checksum) FROM judgements WHERE :where:",
        ),
        params,
    ).fetchone()
    one = "one run" if s.group is None else "one group"
    if mixed is not None and mixed[0] > 1:
        out.append(Finding(REFUSE, "mixed_suite", who,
                           f"{mixed[0]} suite checksums within {one}: it answered different "
                           "suites; split it"))  # fmt: skip
    if mixed is not None and mixed[2] > 1:
        out.append(Finding(REFUSE, "mixed_fixture", who,
                           f"{mixed[2]} fixture checksums within {one}: its answers saw "
                           "different memories; split it"))  # fmt: skip
    if mixed is not None and mixed[1] > 1:
        out.append(Finding(WEAK, "mixed_config", who,
                           f"{mixed[1]} config fingerprints within {one}: it mixes "
                           "configurations"))  # fmt: skip
    out += _hygiene(con, s, params)
    rejudged = con.execute(
        _filtered(
            con,
            "SELECT count(*), coalesce(sum(n), 0) FROM (SELECT count(*) AS n "
            "FROM judgement_artifacts WHERE :where: "
            "GROUP BY run_id, question_id, condition, repeat_index HAVING count(*) > 1)",
        ),
        params,
    ).fetchone()
    if rejudged is not None and rejudged[0]:
        answers, judgements = rejudged
        out.append(Finding(NOTE, "rejudged", who,
                           f"{answers} answer{'s were' if answers > 1 else ' was'} judged "
                           f"more than once ({judgements} "
                           "judgements of them): the latest judgement of each counts "
                           "(judgement_artifacts keeps them all)"))  # fmt: skip
    return out


def _hygiene(con: duckdb.DuckDBPyConnection, s: Side, params: dict[str, Any]) -> list[Finding]:
    """Seed 002's evaluation hygiene: a no-memory control that saw memories, labels nobody
    reviewed, a side that mixes splits."""
    out: list[Finding] = []
    for condition, answers, with_context in con.execute(
        _filtered(
            con,
            "SELECT condition, count(*), count(*) FILTER (WHERE len(retrieved_context_ids) > 0) "
            "FROM judgements WHERE :where: AND lower(condition) IN ('no-memory', 'no_memory') "
            "GROUP BY condition ORDER BY condition",
        ),
        params,
    ).fetchall():
        if with_context:
            out.append(Finding(REFUSE, "no_memory_has_context", s.label,
                               f"{with_context} of {answers} answers of the {condition!r} "
                               "condition name retrieved context: a no-memory control that saw "
                               "memories fails the item (seed 002); fix the harness, or rename "
                               "the condition"))  # fmt: skip
    labelled, questions, unreviewed = con.execute(
        _filtered(
            con,
            "SELECT count(*) FILTER (WHERE label_status IS NOT NULL), count(DISTINCT question_id), "
            "count(DISTINCT question_id) FILTER (WHERE label_status IS DISTINCT FROM 'reviewed') "
            "FROM judgements WHERE :where:",
        ),
        params,
    ).fetchone()  # type: ignore[misc]
    if labelled and unreviewed:
        out.append(Finding(NOTE, "unreviewed_labels", s.label,
                           f"{unreviewed} of {questions} questions have a gold label nobody "
                           "reviewed (label_status unreviewed or absent): a policy with "
                           "[sample] require_reviewed = true leaves them out"))  # fmt: skip
    splits = con.execute(
        _filtered(
            con,
            "SELECT coalesce(split, '(none)'), count(*) FROM judgements "
            "WHERE :where: GROUP BY ALL ORDER BY 2 DESC, 1",
        ),
        params,
    ).fetchall()
    if len(splits) > 1:
        out.append(Finding(NOTE, "mixed_splits", s.label,
                           "answers of several splits ("
                           + ", ".join(f"{name} {n}" for name, n in splits)
                           + "): a policy's [sample] split counts one of them"))  # fmt: skip
    return out


def check_pair(con: duckdb.DuckDBPyConnection, baseline: Who, candidate: Who) -> list[Finding]:
    """What differs between the two sides of a comparison."""
    sa, sb = _side(baseline), _side(candidate)
    a, b = sa.label, sb.label
    out: list[Finding] = []

    def questions(s: Side) -> set[str]:
        rows = con.execute(
            _filtered(con, "SELECT DISTINCT question_id FROM judgements WHERE :where:"),
            _params(s),
        ).fetchall()
        return {r[0] for r in rows}

    qa, qb = questions(sa), questions(sb)
    for side, only, other in ((a, qa - qb, b), (b, qb - qa, a)):
        if only:
            sample = ", ".join(sorted(only)[:5]) + (" …" if len(only) > 5 else "")
            out.append(Finding(WEAK, "unpaired_questions", side,
                               f"{len(only)} question{'s have' if len(only) > 1 else ' has'} "
                               f"no pair in {other} ({sample}): "
                               "they are left out of the comparison"))  # fmt: skip

    def provenance(s: Side) -> tuple[Any, ...]:
        row = con.execute(
            _filtered(
                con,
                "SELECT any_value(suite_checksum), any_value(config_fingerprint), "
                "any_value(fixture_checksum), count(*), count(*) FILTER (WHERE :tokens:) "
                "FROM judgements WHERE :where:",
            ),
            _params(s),
        ).fetchone()
        return row if row is not None else (None, None, None, 0, 0)

    (ua, ca, fa, _, _), (ub, cb, fb, _, _) = provenance(sa), provenance(sb)

    def runs(s: Side) -> set[str]:
        rows = con.execute(_filtered(con, "SELECT DISTINCT run_id FROM judgements WHERE :where:"),
                           _params(s)).fetchall()  # fmt: skip
        return {r[0] for r in rows}

    shared = runs(sa) & runs(sb)
    if shared:
        listed = ", ".join(sorted(shared)[:5]) + (" …" if len(shared) > 5 else "")
        out.append(Finding(WEAK, "sides_overlap", f"{a} vs {b}",
                           f"{len(shared)} runs are on both sides ({listed}): their "
                           "answers are compared with themselves; name sides that share no "
                           "run"))  # fmt: skip
    if ua is not None and ub is not None and ua != ub:
        out.append(Finding(REFUSE, "suite_differs", f"{a} vs {b}",
                           f"suite checksums differ ({ua} vs {ub}): the runs answered "
                           "different suites and cannot be compared"))  # fmt: skip
    elif ua is None or ub is None:
        out.append(Finding(NOTE, "no_suite_checksum", f"{a} vs {b}",
                           "no suite_checksum on one side: that both answered the same suite "
                           "cannot be checked"))  # fmt: skip
    if fa is not None and fb is not None and fa != fb:
        out.append(Finding(REFUSE, "fixture_differs", f"{a} vs {b}",
                           f"fixture checksums differ ({fa} vs {fb}): the runs loaded different "
                           "memories; the gate refuses them unless the policy says "
                           '[provenance] same_fixture = "note"'))  # fmt: skip
    one_sided = _tokens_one_side(con, sa, sb)
    if one_sided:
        said = "; ".join(f"{name}: {n} of {of} paired answers" for name, (n, of) in
                         one_sided.items())  # fmt: skip
        out.append(Finding(WEAK, "tokens_one_side", f"{a} vs {b}",
                           f"token counts on one side of a pair only ({said}): the gate "
                           "cannot judge those metrics; send one set of token fields on "
                           "both sides"))  # fmt: skip
    if ca is not None and ca == cb:
        out.append(Finding(NOTE, "same_config", f"{a} vs {b}",
                           f"both sides have config fingerprint {ca}: is this the change you "
                           "meant to test?"))  # fmt: skip
    return out


def _tokens_one_side(
    con: duckdb.DuckDBPyConnection, a: Side, b: Side
) -> dict[str, tuple[int, int]]:
    """Per token metric, the paired answers that carry it on one side only, of all the pairs
    (paired as compare and the gate pair them; a side of several conditions by condition too),
    where the gate cannot judge that metric."""
    from memdiag.analytics.metrics import METRICS
    from memdiag.analytics.scores import load, load_group

    def answers(s: Side) -> dict[tuple[str, str, int], Any]:
        judged = load(con, s.run) if s.run is not None else load_group(con, s.group or "")
        return {(j.condition if s.condition is None else "", j.question_id, j.repeat_index): j
                for j in judged if s.condition is None or j.condition == s.condition}  # fmt: skip

    try:
        left, right = answers(a), answers(b)
    except LookupError:  # no judgement of a side: said by its own finding
        return {}
    if len({k[0] for k in left}) == 1 and len({k[0] for k in right}) == 1:  # one condition each
        left = {("", q, r): j for (_, q, r), j in left.items()}
        right = {("", q, r): j for (_, q, r), j in right.items()}
    keys = left.keys() & right.keys()
    out = {}
    for name in ("tokens", "input_tokens", "output_tokens"):
        value = METRICS[name].value
        n = sum((value(left[k]) is None) != (value(right[k]) is None) for k in keys)
        if n:
            out[name] = (n, len(keys))
    return out


def doctor(
    con: duckdb.DuckDBPyConnection,
    baseline: Who,
    candidate: Who | None = None,
    min_questions: int = MIN_QUESTIONS,
) -> list[Finding]:
    """Every finding about one side, or two and their pairing; ``refuse`` ones first. A side
    is a :class:`Side` (a run or a run group) or a (run, condition) pair."""
    findings = check_run(con, _side(baseline), min_questions=min_questions)
    if candidate is not None:
        findings += check_run(con, _side(candidate), min_questions=min_questions)
        if all(f.check != "no_data" for f in findings):
            findings += check_pair(con, baseline, candidate)
    order = {REFUSE: 0, WEAK: 1, NOTE: 2}
    return sorted(findings, key=lambda f: order[f.level])
