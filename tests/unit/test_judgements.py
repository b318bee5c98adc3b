"""Benchmark mode: the failure-mode rule, the worker's judgement records, the statistics,
scores.json and the paired comparison."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest

from memdiag.analytics import scores as sc
from memdiag.analytics.sink import DuckDBSink
from memdiag.analytics.stats import (
    SignTest,
    mcnemar_exact,
    paired_bootstrap_ci,
    sign_test_by_question,
)
from memdiag.contract import READER_FAILURES, RETRIEVAL_FAILURES, REUSED_EVENT_ID
from memdiag.contract.envelope import InMessage
from memdiag.schemas import load_schema
from memdiag.settings import Settings
from memdiag.streams.rules.diagnosis import failure_mode
from memdiag.streams.stages.judgements import JudgementStage

# -- the rule -----------------------------------------------------------------------------


def test_correct_has_no_failure_mode() -> None:
    assert failure_mode(True, [], []) is None
    assert failure_mode(True, ["g"], []) is None


def test_gold_empty_is_unattributed() -> None:
    assert failure_mode(False, [], ["a", "b"]) == "unattributed"


def test_gold_equal_to_retrieved_is_a_reader_failure() -> None:
    assert failure_mode(False, ["a", "b"], ["b", "a"]) == "reader_failure"
    assert failure_mode(False, ["a"], ["a", "x", "y"]) == "reader_failure"  # subset


def test_gold_partly_retrieved_is_a_retrieval_failure() -> None:
    assert failure_mode(False, ["a", "b"], ["a"]) == "retrieval_failure"
    assert failure_mode(False, ["a"], []) == "retrieval_failure"


@given(st.booleans(), st.sets(st.sampled_from("abcde")), st.sets(st.sampled_from("abcde")))
def test_the_rule_is_total_and_matches_the_contract(correct, gold, retrieved) -> None:
    mode = failure_mode(correct, sorted(gold), sorted(retrieved))
    if correct:
        assert mode is None
    elif not gold:
        assert mode == "unattributed"
    else:
        assert mode == ("reader_failure" if gold <= retrieved else "retrieval_failure")


# -- the worker ---------------------------------------------------------------------------

EXAMPLE = {
    "kind": "judgement",
    "event_id": "ev-0007",
    "ts": "2026-11-21T10:00:00.000Z",
    "run_id": "longmem-2026-11-21-full",
    "question_id": "q042",
    "condition": "full-memory",
    "repeat_index": 0,
    "judge_correct": False,
    "gold_evidence_ids": ["obs_7"],
    "retrieved_context_ids": ["obs_7", "obs_9"],
    "latency_ms": 2140,
    "tokens": 1830,
}


#: when the messages below were published: after their events' ts
PUBLISHED_MS = 1_795_400_000_000  # 2026-11-22


def msg(value: object, key: bytes = b"run") -> InMessage:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return InMessage("memdiag.judgements", 0, 1, key, raw, PUBLISHED_MS)


def test_the_contract_example_is_a_reader_failure() -> None:
    out = JudgementStage(Settings()).process([msg(EXAMPLE)])
    [record] = out.diagnostics["longmem-2026-11-21-full"]
    assert record["failure_mode"] == "reader_failure" and record["gold_retrieved"] == 1
    assert out.counts[(READER_FAILURES, (("run_id", "longmem-2026-11-21-full"),))] == 1


PROVENANCE = {
    "run_group_id": "nightly-2026-11-21",
    "suite_id": "longmem",
    "suite_version": "3",
    "suite_checksum": "sha256:ab12",
    "fixture_checksum": "sha256:cd34",
    "config_fingerprint": "reranker=v2",
    "git_head": "0b578cd",
    "service_version": "1.4.0",
    "label_status": "reviewed",
    "split": "held_out",
}


def test_the_score_token_split_and_provenance_reach_duckdb(tmp_path: Path) -> None:
    """Contract section 2: optional fields a gate and `memdiag runs` read, as they came."""
    full = {**EXAMPLE, **PROVENANCE, "score": 0.5, "input_tokens": 1500.0, "output_tokens": 330,
            "duration_ms": 61_000}  # fmt: skip
    jsonschema.validate(full, load_schema("judgement"))
    out = JudgementStage(Settings()).process([msg(full)])
    [record] = out.diagnostics["longmem-2026-11-21-full"]
    assert out.deadletters == []
    assert (record["score"], record["input_tokens"], record["output_tokens"]) == (0.5, 1500, 330)
    assert {k: record[k] for k in PROVENANCE} == PROVENANCE
    sink = DuckDBSink(tmp_path / "p.duckdb")
    sink.init()
    sink.write([record])
    names = ", ".join(PROVENANCE)
    with duckdb.connect(sink.path, read_only=True) as con:
        row = con.execute(
            f"SELECT score, input_tokens, output_tokens, duration_ms, {names} FROM judgements"
        ).fetchone()
    assert row == (0.5, 1500, 330, 61_000.0, *PROVENANCE.values())
    # without them: NULL, and a bad one is a dead letter that says which field
    for bad, field in (({"score": 1.5}, "score"), ({"input_tokens": -1}, "input_tokens"),
                       ({"git_head": "x" * 300}, "git_head"),
                       ({"label_status": "approved"}, "label_status"),
                       ({"split": 3}, "split")):  # fmt: skip
        out = JudgementStage(Settings()).process([msg({**EXAMPLE, **bad})])
        [(_, dead)] = out.deadletters
        assert field in dead["detail"], dead["detail"]
    out = JudgementStage(Settings()).process([msg({**EXAMPLE, "label_status": "approved"})])
    assert out.deadletters[0][1]["reason"] == "bad_value"


def test_defaults_and_bad_judgements() -> None:
    minimal = {k: v for k, v in EXAMPLE.items() if k not in ("condition", "repeat_index")}
    minimal["gold_evidence_ids"] = ["obs_1"]
    bad = {**EXAMPLE, "event_id": "bad", "judge_correct": "no"}
    out = JudgementStage(Settings()).process([msg([minimal, bad])])
    [record] = out.diagnostics["longmem-2026-11-21-full"]
    assert (record["condition"], record["repeat_index"]) == ("", 0)
    assert record["failure_mode"] == "retrieval_failure"
    assert out.counts[(RETRIEVAL_FAILURES, (("run_id", "longmem-2026-11-21-full"),))] == 1
    [(_, dead)] = out.deadletters
    assert dead["reason"] == "wrong_type" and "judge_correct" in dead["detail"]


def test_a_session_event_on_the_judgements_topic_is_dead_lettered() -> None:
    out = JudgementStage(Settings()).process(
        [
            msg(
                {
                    "kind": "search",
                    "event_id": "e",
                    "ts": EXAMPLE["ts"],
                    "session_id": "s",
                    "query": "q",
                    "result_ids": [],
                }
            )
        ]
    )
    assert out.deadletters[0][1]["reason"] == "unknown_kind"


# -- statistics ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "b,c", [(0, 0), (0, 5), (5, 0), (3, 7), (10, 10), (1, 30), (25, 40), (120, 95)]
)
def test_mcnemar_equals_scipy_binomtest(b: int, c: int) -> None:
    expected = 1.0 if b + c == 0 else binomtest(min(b, c), b + c, 0.5).pvalue
    assert mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_known_value() -> None:
    # 1 vs 9 discordant pairs: 2 * (C(10,0) + C(10,1)) / 2**10
    assert mcnemar_exact(1, 9) == pytest.approx(22 / 1024)


def test_bootstrap_is_seeded_and_covers_the_observed_delta() -> None:
    rng = np.random.default_rng(1)
    base = rng.integers(0, 2, 300).astype(float)
    cand = np.clip(base + (rng.random(300) < 0.15), 0, 1)
    a = paired_bootstrap_ci(base, cand, 2000, seed=7)
    b = paired_bootstrap_ci(base, cand, 2000, seed=7)
    assert a == b
    observed = (cand.sum() - base.sum()) / 300
    assert a.low < observed < a.high and a.low > 0


def test_bootstrap_of_identical_runs_is_zero() -> None:
    x = np.array([1.0, 0.0, 2.0])
    ci = paired_bootstrap_ci(x, x, 500)
    assert (ci.low, ci.high) == (0.0, 0.0)


# -- scores.json and compare, from DuckDB -------------------------------------------------


def judgement(run, q, correct, gold=("g",), retrieved=("g",), repeat=0, condition="", **kw):
    mode = failure_mode(correct, gold, retrieved)
    return {
        "kind": "judgement",
        "event_id": f"{run}-{condition}-{q}-{repeat}",
        "run_id": run,
        "question_id": q,
        "condition": condition,
        "repeat_index": repeat,
        "judge_correct": correct,
        "failure_mode": mode,
        "gold_evidence_ids": list(gold),
        "retrieved_context_ids": list(retrieved),
        "gold_retrieved": len(set(gold) & set(retrieved)),
        "latency_ms": kw.get("latency_ms"),
        "tokens": kw.get("tokens"),
        "ts": kw.get("ts", "2026-11-21T10:00:00Z"),
    }


@pytest.fixture
def db(tmp_path: Path) -> DuckDBSink:
    sink = DuckDBSink(tmp_path / "j.duckdb")
    sink.init()
    return sink


def test_duplicate_judgement_redelivered_is_one_row(db: DuckDBSink) -> None:
    j = judgement("r", "q1", False, retrieved=())
    db.write([j])
    db.write([j, j])
    with duckdb.connect(db.path, read_only=True) as con:
        assert con.execute(
            "SELECT count(*), any_value(failure_mode) FROM judgements"
        ).fetchone() == (
            1,
            "retrieval_failure",
        )


@pytest.mark.parametrize("how", ["together", "one by one", "isolating"])
def test_a_judgement_reusing_an_event_id_is_dead_lettered_and_the_first_stays(
    tmp_path: Path, how: str
) -> None:
    """event_id is the idempotency key: a judgement under a taken id with other content is
    not a redelivery. The first written stays in both tables; the other is a dead letter,
    once, however often it comes."""
    first = judgement("r", "q1", False, retrieved=())
    other = judgement("r", "q1", True)
    third = {**judgement("r", "q2", True), "event_id": first["event_id"]}
    sink = DuckDBSink(tmp_path / "j.duckdb", topic_prefix="p.")
    sink.init()
    published = [first, other, third, other, first]
    if how == "together":
        sink.write(published)
    elif how == "one by one":
        for record in published:
            sink.write([record])
    else:  # the path a batch DuckDB refused takes: record by record
        for record in published:
            sink.add(record)
        sink.flush_isolating(lambda r, e: pytest.fail(f"refused {r}: {e}"))
    sink.write(published)  # redelivered: nothing more
    with duckdb.connect(sink.path, read_only=True) as con:
        kept = "SELECT event_id, question_id, judge_correct FROM {}"
        for table in ("judgements", "judgement_artifacts"):
            assert con.execute(kept.format(table)).fetchall() == [(first["event_id"], "q1", False)]
        dead = con.execute(
            "SELECT topic, reason, detail, payload FROM dead_letters ORDER BY detail"
        ).fetchall()
    assert [(t, r) for t, r, _, _ in dead] == [("p.judgements", REUSED_EVENT_ID)] * 2
    assert "another judgement, which differs in judge_correct, retrieved_context_ids, " in dead[0][2]
    run = first["run_id"]
    assert all(f"was already taken in run {run!r} by another judgement" in d for _, _, d, _ in dead)
    assert "differs in question_id, judge_correct, retrieved_context_ids, " in dead[1][2]
    assert {json.loads(p)["question_id"] for _, _, _, p in dead} == {"q1", "q2"}


def test_two_runs_judgements_under_one_id_are_two_judgements(db: DuckDBSink) -> None:
    """A harness that numbers each run's judgements gives two runs one id: each run keeps
    its own, whichever comes first (a `memdiag run` of both gives the same tables)."""
    base = {**judgement("base", "q1", True), "event_id": "j-1"}
    cand = {**judgement("cand", "q9", False, retrieved=()), "event_id": "j-1"}
    db.write([cand, base])
    db.write([base, cand])
    with duckdb.connect(db.path, read_only=True) as con:
        for table in ("judgements", "judgement_artifacts"):
            assert con.execute(
                f"SELECT run_id, question_id FROM {table} ORDER BY 1"  # noqa: S608
            ).fetchall() == [("base", "q1"), ("cand", "q9")]
        assert con.execute("SELECT count(*) FROM dead_letters").fetchone() == (0,)


def test_a_judgement_again_with_a_field_its_first_row_lacks_is_the_same_judgement(
    db: DuckDBSink,
) -> None:
    """A row written by an older memdiag lacks the fields added since; a replay by this one
    carries them: the same event, not a reused id (and the answer's row gains them)."""
    first = judgement("r", "q1", True)
    db.write([first])
    db.write([{**first, "split": "test", "latency_ms": 12.5}])
    with duckdb.connect(db.path, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM dead_letters").fetchone() == (0,)
        assert con.execute("SELECT split, latency_ms FROM judgements").fetchall() == [
            ("test", 12.5)
        ]


@pytest.mark.parametrize("together", [True, False])
def test_a_rejudged_answer_is_a_second_artifact_and_the_latest_counts(
    tmp_path: Path, together: bool
) -> None:
    """Judgements are never overwritten (contract section 2): both stay in
    judgement_artifacts; `judgements` holds the latest ts, ties by event_id, in any order."""
    first = {**judgement("r", "q1", False, retrieved=()), "event_id": "e-1"}
    later = {**judgement("r", "q1", True, ts="2026-11-21T11:00:00Z"), "event_id": "e-0"}
    tie = {**judgement("r", "q1", False, ts="2026-11-21T11:00:00Z"), "event_id": "e-2"}
    for order in ([first, later, tie], [tie, later, first], [later, first, tie]):
        sink = DuckDBSink(tmp_path / f"{together}-{order[0]['event_id']}.duckdb")
        sink.init()
        if together:
            sink.write(order)
        else:
            for record in order:
                sink.write([record])
        sink.write(order)  # redelivered: nothing more
        with duckdb.connect(sink.path, read_only=True) as con:
            assert con.execute("SELECT event_id, judge_correct FROM judgements").fetchall() == [
                ("e-2", False)  # 11:00 twice: the larger event id
            ]
            artifacts = con.execute("SELECT event_id FROM judgement_artifacts ORDER BY 1")
            assert artifacts.fetchall() == [("e-0",), ("e-1",), ("e-2",)]


def test_scores_fold_repeats_and_split_failures(db: DuckDBSink) -> None:
    db.write(
        [
            # q1: right in both repeats; q2: reader failure then right; q3: retrieval failure twice
            judgement("r", "q1", True, repeat=0, latency_ms=100, tokens=10),
            judgement("r", "q1", True, repeat=1, latency_ms=300, tokens=30),
            judgement("r", "q2", False, repeat=0),
            judgement("r", "q2", True, repeat=1),
            judgement("r", "q3", False, retrieved=(), repeat=0),
            judgement("r", "q3", False, retrieved=(), repeat=1, ts="2026-11-21T11:00:00Z"),
            # q4: no gold
            judgement("r", "q4", False, gold=(), repeat=0),
            judgement("r", "q4", False, gold=(), repeat=1),
            # another condition in the same run
            judgement("r", "q1", False, condition="no-memory", retrieved=()),
        ]
    )
    with duckdb.connect(db.path, read_only=True) as con:
        report = sc.scores(con, "r", db.path)
    jsonschema.validate(report, load_schema("scores"))
    conds = {c["condition"]: c for c in report["conditions"]}
    assert list(conds) == ["", "no-memory"]
    full = conds[""]
    assert (full["questions"], full["judgements"]) == (4, 8)
    assert full["correct"] == 1.5 and full["accuracy"] == 0.375
    assert full["reader_failure_with_evidence"] == 0.5
    assert full["retrieval_failure"] == 1.0 and full["unattributed"] == 1.0
    assert (
        full["correct"]
        + full["reader_failure_with_evidence"]
        + full["retrieval_failure"]
        + full["unattributed"]
        == 4
    )
    assert full["spread"]["accuracy_by_repeat"] == {"0": 0.25, "1": 0.5}
    assert full["spread"]["questions_with_disagreeing_repeats"] == 1
    assert full["latency_ms"]["mean"] == 200 and full["tokens"]["total"] == 40
    assert (
        conds["no-memory"]["retrieval_failure"] == 1.0 and conds["no-memory"]["latency_ms"] is None
    )
    prov = report["provenance"]
    assert prov["judgements"] == 9
    assert prov["first_event_ts"].startswith("2026-11-21T10:00:00")
    assert prov["last_event_ts"].startswith("2026-11-21T11:00:00")


def test_unknown_run_lists_the_known_ones(db: DuckDBSink) -> None:
    db.write([judgement("run-a", "q", True)])
    with (
        duckdb.connect(db.path, read_only=True) as con,
        pytest.raises(sc.UnknownRun, match="run-a"),
    ):
        sc.scores(con, "run-b")


def test_compare_pairs_by_question_and_repeat(db: DuckDBSink) -> None:
    rows = []
    # 40 questions x 2 repeats. The candidate fixes retrieval on q0-q14 (right now), but on
    # q15-q19 the evidence it now retrieves is misread (retrieval -> reader failure).
    for q in range(40):
        for rep in range(2):
            qid = f"q{q:02d}"
            if q < 20:
                rows.append(
                    judgement(
                        "base", qid, False, retrieved=(), repeat=rep, latency_ms=100, tokens=50
                    )
                )
                if q < 15:
                    rows.append(judgement("cand", qid, True, repeat=rep, latency_ms=120, tokens=70))
                else:
                    rows.append(
                        judgement("cand", qid, False, repeat=rep, latency_ms=120, tokens=70)
                    )
            else:
                rows.append(judgement("base", qid, True, repeat=rep))
                rows.append(judgement("cand", qid, True, repeat=rep))
    rows.append(judgement("base", "only-in-base", True))
    rows.append(judgement("cand", "q00", True, repeat=5))  # a repeat the baseline lacks
    db.write(rows)
    with duckdb.connect(db.path, read_only=True) as con:
        r = sc.compare(con, "base", "cand", resamples=2000)
    assert r["pairs"] == 80 and r["questions"] == 40
    assert r["baseline"]["accuracy"] == 0.5 and r["candidate"]["accuracy"] == pytest.approx(70 / 80)
    # questions, not repeats: q0-q14 moved (30 pairs, 15 questions), the other 25 tie
    assert (r["mcnemar"]["right_to_wrong"], r["mcnemar"]["wrong_to_right"]) == (0, 15)
    assert r["mcnemar"]["ties"] == 25
    assert r["mcnemar"]["p_value"] == pytest.approx(binomtest(0, 15, 0.5).pvalue)
    assert r["significant"] is True and r["significance_note"] is None
    assert 0 < r["bootstrap_ci"]["low"] < r["delta"] < r["bootstrap_ci"]["high"]
    t = r["transitions"]["baseline_to_candidate"]
    assert t["retrieval_failure"] == {"correct": 30, "reader_failure": 10, "retrieval_failure": 0}
    assert t["correct"]["correct"] == 40
    assert r["failure_mode_change"] == {"reader_failure": 10, "retrieval_failure": -40}
    assert r["latency_ms_delta"] == {"pairs": 40, "mean": 20.0, "median": 20.0}
    assert r["tokens_delta"]["mean"] == 20.0
    assert r["unpaired"]["baseline_only"] == [{"question_id": "only-in-base", "repeat_index": 0}]
    assert r["unpaired"]["candidate_only"] == [{"question_id": "q00", "repeat_index": 5}]
    assert r["verdict"].startswith("candidate is better")
    assert "10 more reader failures" in r["verdict"]


def test_compare_needs_a_condition_when_a_run_has_several(db: DuckDBSink) -> None:
    db.write(
        [
            judgement("r", "q1", True, condition="full"),
            judgement("r", "q1", False, condition="none", retrieved=()),
        ]
    )
    with duckdb.connect(db.path, read_only=True) as con:
        with pytest.raises(sc.UnknownRun, match="several conditions"):
            sc.compare(con, "r", "r")
        r = sc.compare(con, "r", "r", "none", "full", resamples=200)
    assert r["delta"] == 1.0 and r["mcnemar"]["wrong_to_right"] == 1
    assert r["verdict"].startswith("no significant difference")
    # one question: its interval is [1, 1], the sign test p = 1; the verdict says why
    assert r["significant"] is False
    assert "the interval excludes 0 but the sign test does not" in r["verdict"]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=60))
def test_mcnemar_counts_are_the_discordant_pairs(pairs) -> None:
    b = sum(x and not y for x, y in pairs)
    c = sum(y and not x for x, y in pairs)
    assert mcnemar_exact(b, c) == pytest.approx(
        binomtest(min(b, c), b + c).pvalue if b + c else 1.0
    )


def test_runs_list_size_accuracy_rejudged_answers_and_provenance(
    db: DuckDBSink, capsys: pytest.CaptureFixture[str]
) -> None:
    from memdiag.analytics import queries
    from memdiag.cli import main

    base = {k: v for k, v in PROVENANCE.items()}
    records = [
        {**judgement("base", "q1", True), **base},
        {**judgement("base", "q2", False), **base},
        {**judgement("base", "q2", True, ts="2026-11-21T10:30:00Z"), **base, "event_id": "rj"},
        {**judgement("cand", "q1", True, ts="2026-11-21T12:00:00Z"), **base,
         "config_fingerprint": "reranker=v3"},
        {**judgement("cand", "q2", True, ts="2026-11-21T12:00:00Z", condition="x"), **base,
         "config_fingerprint": "reranker=v4"},
    ]  # fmt: skip
    db.write(records)
    with duckdb.connect(db.path, read_only=True) as con:
        runs = {r["run_id"]: r for r in queries.runs(con)}
    assert list(runs) == ["cand", "base"]  # newest first
    b, c = runs["base"], runs["cand"]
    assert (b["judgements"], b["questions"], b["rejudged"], b["accuracy"]) == (2, 2, 1, 1.0)
    assert b["suite_checksum"] == "sha256:ab12" and b["git_head"] == "0b578cd"
    assert c["config_fingerprint"] == "reranker=v3, reranker=v4"  # mixed within the run
    assert c["conditions"] == "x" and c["repeats"] == 1
    assert main(["runs", "--db", db.path, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [r["run_id"] for r in printed] == ["cand", "base"]
    assert main(["runs", "--db", db.path]) == 0
    assert "sha256:ab12" in capsys.readouterr().out


def test_doctor_says_what_would_make_a_comparison_weak(
    db: DuckDBSink, capsys: pytest.CaptureFixture[str]
) -> None:
    from memdiag.analytics.doctor import doctor
    from memdiag.cli import main

    def run(name: str, checksum: str, questions: int, **kw: object) -> list[dict]:
        out = []
        for i in range(questions):
            for r in (0, 1):
                correct = i % 3 != 0 or (name == "b" and i == 3 and r == 1)  # b: q3 disagrees
                out.append({**judgement(name, f"q{i}", correct, repeat=r, **kw),
                            **PROVENANCE, "suite_checksum": checksum,
                            "config_fingerprint": f"cfg-{name}"})  # fmt: skip
        return out

    db.write(run("a", "s1", 40) + run("b", "s1", 40) + run("c", "s2", 5, gold=()))
    with duckdb.connect(db.path, read_only=True) as con:
        checks = {f.check for f in doctor(con, ("a", None), ("b", None))}
        assert checks == {"repeats_disagree"}  # b's q3: one repeat right, one wrong
        found = {f.check: f for f in doctor(con, ("a", None), ("c", None))}
        assert {"too_few_items", "missing_gold", "unattributed", "unpaired_questions",
                "suite_differs"} <= set(found)  # fmt: skip
        assert found["suite_differs"].level == "refuse"
        (unknown,) = doctor(con, ("zzz", None))
        assert unknown.check == "no_data"
        assert unknown.message == "no judgement: no such run; the closest known: a, b, c"
        (no_condition,) = doctor(con, ("a", "nope"))  # a known run, without that condition
        assert "check the run id (or group) and condition" in no_condition.message
    assert main(["doctor", "--db", db.path, "--baseline", "a", "--candidate", "b"]) == 1
    assert main(["doctor", "--db", db.path, "--run", "a"]) == 0
    assert "nothing weakens" in capsys.readouterr().out
    assert main(["doctor", "--db", db.path, "--run", "zzz", "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["status"] == 2
    assert main(["doctor", "--db", db.path, "--candidate", "b"]) == 2  # needs a baseline


# -- McNemar with repeats: questions, not repeats (contract section 7) ---------------------

T, F = True, False


def test_sign_test_by_hand_three_questions_two_repeats() -> None:
    # shares (baseline -> candidate): 0 -> 1, 1/2 -> 1, 1/2 -> 1: three questions better
    qs = {"q1": ([F, F], [T, T]), "q2": ([T, F], [T, T]), "q3": ([F, T], [T, T])}
    got = sign_test_by_question(qs)
    # two-sided exact sign test, n = 3 signs, k = 0 against: 2 * C(3, 0) / 2**3
    assert got == SignTest(right_to_wrong=0, wrong_to_right=3, ties=0, p_value=2 * 1 / 8)
    # the pair count would have said 4 discordant pairs, 2 * 1 / 16
    assert mcnemar_exact(0, 4) == 2 / 16
    # one of them the other way: 2 * (C(3, 0) + C(3, 1)) / 8 = 1
    qs["q2"] = ([T, T], [F, T])
    assert sign_test_by_question(qs) == SignTest(1, 2, 0, 1.0)


def test_repeats_do_not_multiply_the_evidence(db: DuckDBSink) -> None:
    """The same 5 discordant questions repeated 4 times: 20 discordant pairs (p ~ 2e-6 as
    independent pairs), but 5 questions: p = 2 / 2**5 = 0.0625, not significant."""
    rows = []
    for q in range(20):
        for rep in range(4):
            qid = f"q{q:02d}"
            better = q < 5
            rows.append(judgement("base", qid, not better, retrieved=() if better else ("g",),
                                  repeat=rep))  # fmt: skip
            rows.append(judgement("cand", qid, True, repeat=rep))
    db.write(rows)
    assert mcnemar_exact(0, 20) < 1e-5  # what counting pairs claimed
    with duckdb.connect(db.path, read_only=True) as con:
        r = sc.compare(con, "base", "cand", resamples=2000)
    m = r["mcnemar"]
    assert (m["right_to_wrong"], m["wrong_to_right"], m["ties"]) == (0, 5, 15)
    assert m["p_value"] == 0.0625 == binomtest(0, 5, 0.5).pvalue
    assert r["pairs"] == 80 and r["questions"] == 20
    # the interval over questions excludes 0 (a resample needs one of the 5 to move), the
    # sign test does not: not significant, and the verdict says which disagrees
    assert r["bootstrap_ci"]["low"] > 0
    assert r["significant"] is False
    assert r["verdict"].startswith("no significant difference (the interval excludes 0 but the "
                                   "sign test does not, p = 0.0625 >= 0.05: too few")  # fmt: skip


def test_questions_whose_shares_are_equal_are_left_out() -> None:
    moved = {f"m{i}": ([F], [T]) for i in range(6)}
    ties = {
        "same": ([T, F], [F, T]),  # 1/2 and 1/2, different repeats right
        "scaled": ([T, F], [T, T, F, F]),  # 1/2 and 2/4: exact fractions tie
        "thirds": ([T, T, F], [T, F, T]),
        "all-right": ([T, T], [T, T]),
        "all-wrong": ([F], [F]),
    }
    alone = sign_test_by_question(moved)
    both = sign_test_by_question({**moved, **ties})
    assert (both.right_to_wrong, both.wrong_to_right, both.ties) == (0, 6, 5)
    assert both.p_value == alone.p_value == pytest.approx(2 / 64)
    assert sign_test_by_question(ties) == SignTest(0, 0, 5, 1.0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=60))
def test_one_repeat_each_is_classic_exact_mcnemar(pairs: list[tuple[bool, bool]]) -> None:
    got = sign_test_by_question({f"q{i}": ([b], [c]) for i, (b, c) in enumerate(pairs)})
    b = sum(x and not y for x, y in pairs)
    c = sum(y and not x for x, y in pairs)
    assert (got.right_to_wrong, got.wrong_to_right) == (b, c)
    assert got.ties == len(pairs) - b - c
    assert got.p_value == mcnemar_exact(b, c)
    assert got.p_value == pytest.approx(binomtest(min(b, c), b + c).pvalue if b + c else 1.0)


REPEATS = st.lists(st.booleans(), min_size=1, max_size=5)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(REPEATS, REPEATS), min_size=1, max_size=40))
def test_sign_test_equals_an_independent_one(
    questions: list[tuple[list[bool], list[bool]]],
) -> None:
    """Against shares compared by cross-multiplication and scipy's binomial test."""
    signs = [sum(c) * len(b) - sum(b) * len(c) for b, c in questions]
    down, up = sum(s < 0 for s in signs), sum(s > 0 for s in signs)
    got = sign_test_by_question({f"q{i}": q for i, q in enumerate(questions)})
    assert (got.right_to_wrong, got.wrong_to_right, got.ties) == (down, up, signs.count(0))
    want = binomtest(min(down, up), down + up, 0.5).pvalue if down + up else 1.0
    assert got.p_value == pytest.approx(want, rel=1e-12)


NAN = float("nan")


@pytest.mark.parametrize(
    "test,low,high,significant,note",
    [
        (SignTest(0, 15, 3, 6e-5), 0.1, 0.4, True, None),  # both say better
        (SignTest(15, 0, 3, 6e-5), -0.4, -0.1, True, None),  # both say worse
        (SignTest(0, 15, 3, 6e-5), -0.02, 0.3, False, "but the interval spans 0"),
        (SignTest(0, 15, 3, 6e-5), -0.3, -0.1, False, "point opposite ways"),
        (SignTest(0, 5, 15, 0.0625), 0.05, 0.4, False, "the interval excludes 0 but the sign"),
        (SignTest(2, 3, 15, 1.0), -0.1, 0.1, False, None),  # both say nothing: no note
        # --resamples 0: the sign test alone, and only when the mean moved its way
        (SignTest(0, 15, 3, 6e-5), NAN, NAN, True, "the sign test alone"),
        (SignTest(20, 3, 0, 5e-4), NAN, NAN, False, "point opposite ways"),  # mean +0.04
        (SignTest(2, 3, 15, 1.0), NAN, NAN, False, "no interval was computed"),
    ],
)
def test_significant_only_when_the_test_and_the_interval_agree(
    test: SignTest, low: float, high: float, significant: bool, note: str | None
) -> None:
    delta = (low + high) / 2 if low == low else 0.043  # the interval's middle, or a mean
    got, why = sc._significance(test, low, high, 0.05, delta)
    assert got is significant
    assert (why is None) if note is None else (why is not None and note in why)


def test_every_figure_of_a_run_weighs_its_questions_the_same(
    db: DuckDBSink, capsys: pytest.CaptureFixture[str]
) -> None:
    """Uneven repeats (q1 three times, right; q2 once, wrong) and one answer judged three
    times: the scores file, `runs`, `status`, `compare` and `gate`'s explanation give one
    accuracy for a run (each question counts once: 50%, not the 75% of its answers), the
    latency delta's mean is the metric's, and "re-judged" counts answers, not judgements."""
    from memdiag.analytics import queries
    from memdiag.analytics.doctor import doctor
    from memdiag.analytics.status import status

    rows = [{**judgement("a", "q1", True, repeat=r, latency_ms=100.0), "score": 1.0}
            for r in range(3)]  # fmt: skip
    rows.append({**judgement("a", "q2", False, latency_ms=300.0), "score": 0.0})
    rows += [judgement("b", "q1", True, repeat=r, latency_ms=100.0) for r in range(3)]
    rows.append(judgement("b", "q2", True, latency_ms=100.0))
    rows += [{**judgement("b", "q2", True, latency_ms=100.0), "event_id": f"again-{n}",
              "ts": f"2026-11-21T10:0{n}:00Z"} for n in (1, 2)]  # fmt: skip
    db.write(rows)
    with duckdb.connect(db.path, read_only=True) as con:
        scores = sc.scores(con, "a", resamples=200)
        runs = {r["run_id"]: r for r in queries.runs(con)}
        recent = {r["run_id"]: r for r in status(con)["runs"]}
        r = sc.compare(con, "a", "b", resamples=200)
        findings = doctor(con, sc.side("a"), sc.side("b"))
    assert scores["conditions"][0]["accuracy"] == 0.5
    assert scores["conditions"][0]["metrics"]["accuracy"]["mean"] == 0.5
    assert runs["a"]["accuracy"] == 0.5 and recent["a"]["accuracy"] == 0.5
    assert runs["a"]["mean_score"] == 0.5 == scores["conditions"][0]["metrics"]["score"]["mean"]
    assert r["baseline"]["accuracy"] == 0.5 and r["delta"] == 0.5
    # latency: q1 moves 0 ms, q2 -200 ms; the mean over questions is -100 (per pair: -50)
    assert r["metrics"]["latency_ms"]["delta"] == -100.0
    assert r["latency_ms_delta"] == {"pairs": 4, "mean": -100.0, "median": 0.0}
    assert runs["b"]["rejudged"] == 1  # one answer, judged three times
    rejudged = [f.message for f in findings if f.check == "rejudged"]
    assert rejudged == ["1 answer was judged more than once (3 judgements of them): the "
                        "latest judgement of each counts (judgement_artifacts keeps them all)"]


def test_without_an_interval_the_verdict_names_no_interval(db: DuckDBSink) -> None:
    """--resamples 0: the verdict rests on the sign test and says so, significant or not
    (it said "interval spans 0" of an interval it never computed)."""
    rows = [judgement("a", f"q{i}", i % 2 == 0) for i in range(10)]
    rows += [judgement("b", f"q{i}", i % 3 == 0) for i in range(10)]
    db.write(rows)
    with duckdb.connect(db.path, read_only=True) as con:
        r = sc.compare(con, "a", "b", resamples=0)
    assert r["bootstrap_ci"] is None and r["significant"] is False
    assert r["significance_note"] == (f"sign test p = {r['mcnemar']['p_value']:.3g} >= 0.05; no "
                                      "interval was computed (--resamples 0)")
    assert "interval spans" not in r["verdict"] and "--resamples 0" in r["verdict"]


def test_compare_refuses_a_run_compared_with_itself(
    db: DuckDBSink, capsys: pytest.CaptureFixture[str]
) -> None:
    """As gate does: one run and one condition on both sides is a usage error (exit 2), not
    a comparison whose every delta is 0."""
    from memdiag.cli import main

    db.write([judgement("a", f"q{i}", i % 2 == 0) for i in range(6)])
    assert main(["compare", "--db", db.path, "--baseline", "a", "--candidate", "a"]) == 2
    assert "are one run ('a') and one condition" in " ".join(capsys.readouterr().err.split())
    assert main(["compare", "--db", db.path, "--baseline", "a", "--candidate", "a",
                 "--json"]) == 2  # fmt: skip
    said = json.loads(capsys.readouterr().out)
    assert said["error"] == "usage" and "compared with themselves" not in said["message"]


def test_the_rerun_spread_leaves_out_a_repeat_of_a_few_questions(db: DuckDBSink) -> None:
    """Ten questions answered twice (repeat 0 all right, repeat 1 all wrong but one) and one
    of them a third time: the spread is that of repeats 0 and 1; repeat 2, one question,
    measures that question, not a rerun."""
    rows = [judgement("a", f"q{i}", True, repeat=0) for i in range(10)]
    rows += [judgement("a", f"q{i}", i == 0, repeat=1) for i in range(10)]
    rows.append(judgement("a", "q0", True, repeat=2))
    db.write(rows)
    with duckdb.connect(db.path, read_only=True) as con:
        (c,) = sc.scores(con, "a", resamples=100)["conditions"]
    two = float(np.std([1.0, 0.1], ddof=1))
    assert c["spread"]["stdev"] == pytest.approx(two)
    assert c["metrics"]["accuracy"]["stdev_across_repeats"] == pytest.approx(two)
    assert c["spread"]["accuracy_by_repeat"] == {"0": 1.0, "1": 0.1, "2": 1.0}
    assert c["spread"]["repeats_used"] == [0, 1] and c["spread"]["min"] == pytest.approx(0.1)
    assert c["metrics"]["accuracy"]["repeats_in_spread"] == 2


def test_no_rerun_spread_when_no_two_repeats_answered_every_question(db: DuckDBSink) -> None:
    """q1 only in repeat 0 (right), q2 only in repeat 1 (wrong): no repeat answered both, so
    nothing measured a rerun; min, max and stdev agree on that (the table shows "—")."""
    db.write([judgement("a", "q1", True, repeat=0), judgement("a", "q2", False, repeat=1)])
    with duckdb.connect(db.path, read_only=True) as con:
        (c,) = sc.scores(con, "a", resamples=100)["conditions"]
    assert c["spread"]["repeats_used"] == [] and c["spread"]["stdev"] == 0.0
    assert c["spread"]["min"] == c["spread"]["max"] == c["accuracy"] == 0.5
    assert c["metrics"]["accuracy"]["repeats_in_spread"] == 0
