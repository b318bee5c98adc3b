"""Benchmark metrics, their intervals and ``memdiag gate``: each checked against an
independent computation (by hand, by enumeration, or scipy), and the gate's three exit
statuses on generated runs."""

from __future__ import annotations

import itertools
import json
import random
import statistics
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats as sps

from memdiag.analytics import gate as g
from memdiag.analytics.metrics import (
    METRICS,
    Paired,
    fmt,
    paired,
    recall_at,
    reciprocal_rank,
    summary,
    total_tokens,
)
from memdiag.analytics.sink import DuckDBSink
from memdiag.analytics.stats import paired_bootstrap_ci
from memdiag.cli import main
from memdiag.streams.rules.diagnosis import failure_mode


@dataclass(frozen=True)
class A:
    """One judged answer, as a metric reads it (``scores.Judged`` has these and more)."""

    question_id: str = "q"
    repeat_index: int = 0
    correct: bool = True
    gold_evidence_ids: list[str] = field(default_factory=list)
    retrieved_context_ids: list[str] = field(default_factory=list)
    score: float | None = None
    latency_ms: float | None = None
    tokens: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    suite_checksum: str | None = "suite-1"
    config_fingerprint: str | None = None
    condition: str = ""
    fixture_checksum: str | None = None
    label_status: str | None = None
    split: str | None = None
    run_id: str = "r"


# -- each metric by hand ------------------------------------------------------------------


def test_recall_at_k_by_hand() -> None:
    gold, ctx = ["a", "b"], ["x", "a", "y", "z", "w", "b"]
    assert recall_at(1, gold, ctx) == 0.0
    assert recall_at(2, gold, ctx) == 0.5
    assert recall_at(5, gold, ctx) == 0.5
    assert recall_at(10, gold, ctx) == 1.0
    assert recall_at(5, ["a", "a"], ["a"]) == 1.0  # gold is a set
    assert recall_at(5, ["a", "b"], ["a", "a", "a", "a", "a", "b"]) == 0.5  # ranks, not ids
    assert recall_at(5, [], ["a"]) is None  # no gold: left out, not 0


def test_reciprocal_rank_by_hand() -> None:
    assert reciprocal_rank(["b"], ["x", "y", "b"]) == pytest.approx(1 / 3)
    assert reciprocal_rank(["b", "x"], ["x", "y", "b"]) == 1.0  # the first gold id counts
    assert reciprocal_rank(["b"], ["x"]) == 0.0
    assert reciprocal_rank([], ["x"]) is None


def test_tokens_are_input_plus_output_where_both_are_given() -> None:
    assert total_tokens(A(input_tokens=100, output_tokens=20, tokens=999)) == 120
    assert total_tokens(A(input_tokens=100, tokens=999)) == 999
    assert total_tokens(A()) is None


ids = st.lists(st.sampled_from("abcdefgh"), max_size=8)


@given(gold=ids, ctx=ids)
def test_recall_is_a_share_that_grows_with_k_and_mrr_agrees(gold: list, ctx: list) -> None:
    values = [recall_at(k, gold, ctx) for k in range(0, len(ctx) + 2)]
    rr = reciprocal_rank(gold, ctx)
    if not gold:
        assert set(values) == {None} and rr is None
        return
    assert all(0 <= v <= 1 for v in values)  # type: ignore[operator]
    assert values == sorted(values)  # type: ignore[type-var]
    assert values[-1] == len(set(gold) & set(ctx)) / len(set(gold))
    assert (rr > 0) == (values[-1] > 0)  # type: ignore[operator]
    if rr:
        rank = round(1 / rr)
        assert recall_at(rank - 1, gold, ctx) == 0 < recall_at(rank, gold, ctx)  # type: ignore[operator]


# -- means and intervals ------------------------------------------------------------------


def test_the_interval_is_the_exact_bootstrap_distribution_by_enumeration() -> None:
    """Five questions with 2-3 repeats each, folded to their means: every one of the 5^5
    equally likely resamples enumerated gives the exact bootstrap distribution of the mean
    delta; its 2.5% and 97.5% points are what the sampled interval finds, whatever the
    seed, and what `paired` finds from the answers themselves."""
    right = {"q1": ([1, 0], [0, 0]), "q2": ([1, 1, 0], [1, 1, 0]), "q3": ([0, 0, 1], [1, 0, 0]),
             "q4": ([0, 1], [0, 1]), "q5": ([1, 1, 0], [1, 0, 1])}  # fmt: skip
    base = np.array([np.mean(b) for b, _ in right.values()])
    cand = np.array([np.mean(c) for _, c in right.values()])
    values = np.array(
        [(cand[list(i)] - base[list(i)]).mean() for i in itertools.product(range(5), repeat=5)]
    )
    points = np.unique(values)
    cdf = np.array([(values <= v).mean() for v in points])
    i, j = np.searchsorted(cdf, 0.025), np.searchsorted(cdf, 0.975)
    # no step of the exact distribution near the cut: 10,000 draws find these points exactly
    assert min(0.025 - cdf[i - 1], cdf[i] - 0.025, 0.975 - cdf[j - 1], cdf[j] - 0.975) > 0.01
    low, high = points[i], points[j]
    assert (low, high) == pytest.approx((-0.3, 0.0))
    for seed in range(4):
        ci = paired_bootstrap_ci(base, cand, 10_000, seed)
        assert (ci.low, ci.high) == pytest.approx((low, high))
    answers = {
        side: {(q, r): A(correct=bool(v)) for q, sides in right.items()
               for r, v in enumerate(sides[side])}
        for side in (0, 1)
    }  # fmt: skip
    p = paired(METRICS["accuracy"], answers[0], answers[1])
    assert p is not None and (p.ci.low, p.ci.high) == pytest.approx((low, high))
    assert p.delta == pytest.approx(float((cand - base).mean()))


def test_with_one_repeat_the_interval_is_scipys_paired_bootstrap() -> None:
    rng = np.random.default_rng(11)
    b = rng.normal(0.5, 0.2, 400)
    c = b + rng.normal(0.03, 0.1, 400)
    p = paired(
        METRICS["score"],
        {(str(i), 0): A(score=float(x)) for i, x in enumerate(b)},
        {(str(i), 0): A(score=float(x)) for i, x in enumerate(c)},
    )
    assert p is not None and p.delta == pytest.approx(float((c - b).mean()))
    ref = sps.bootstrap(
        (c - b,), np.mean, n_resamples=10_000, method="percentile", random_state=5
    ).confidence_interval
    se = float((c - b).std(ddof=1) / np.sqrt(len(b)))
    assert p.ci.low == pytest.approx(ref.low, abs=0.1 * se)
    assert p.ci.high == pytest.approx(ref.high, abs=0.1 * se)


def test_repeats_of_one_question_are_not_independent_evidence() -> None:
    """60 questions judged 5 times, the repeats agreeing: resampling the 300 pairs as if
    independent (scipy) gives an interval about √5 narrower than the clustered one, which
    is as wide as with one repeat per question."""
    rng = random.Random(2)
    outcome = {q: (rng.random() < 0.5, rng.random() < 0.6) for q in range(60)}

    def side(i: int, repeats: int) -> dict:
        return {(str(q), r): A(correct=v[i]) for q, v in outcome.items() for r in range(repeats)}

    five = paired(METRICS["accuracy"], side(0, 5), side(1, 5))
    one = paired(METRICS["accuracy"], side(0, 1), side(1, 1))
    assert five is not None and one is not None and (five.pairs, five.questions) == (300, 60)
    deltas = np.array([float(c) - float(b) for b, c in outcome.values() for _ in range(5)])
    naive = sps.bootstrap(
        (deltas,), np.mean, n_resamples=10_000, method="percentile", random_state=1
    ).confidence_interval
    width = five.ci.high - five.ci.low
    assert width == pytest.approx(one.ci.high - one.ci.low)
    assert width > 1.8 * (naive.high - naive.low)


def test_every_question_weighs_the_same_however_many_repeats() -> None:
    """q1 right in both its repeats, q2 wrong in its one: accuracy is 1/2 (two questions),
    not 2/3 (three answers), as scores.json folds repeats."""
    answers = [("q1", 0, A(correct=True)), ("q1", 1, A(correct=True)),
               ("q2", 0, A(correct=False))]  # fmt: skip
    s = summary(METRICS["accuracy"], answers, resamples=500)
    assert s is not None and s["mean"] == 0.5 and s["answers"] == 3
    base = {(q, r): a for q, r, a in answers}
    cand = {(q, r): A(correct=True) for q, r, _ in answers}
    p = paired(METRICS["accuracy"], base, cand, resamples=500)
    assert p is not None and (p.baseline_mean, p.candidate_mean, p.delta) == (0.5, 1.0, 0.5)


def test_paired_means_leave_out_the_pairs_one_side_lacks() -> None:
    base = {
        ("q1", 0): A(score=0.2, latency_ms=100),
        ("q1", 1): A(score=0.4, latency_ms=None),
        ("q2", 0): A(score=None, latency_ms=300),
        ("q3", 0): A(score=1.0),  # no partner
    }
    cand = {
        ("q1", 0): A(score=0.6, latency_ms=150),
        ("q1", 1): A(score=0.4, latency_ms=90),
        ("q2", 0): A(score=0.9, latency_ms=200),
    }
    s = paired(METRICS["score"], base, cand)
    assert s is not None and (s.pairs, s.questions) == (2, 1)
    assert (s.baseline_mean, s.candidate_mean) == pytest.approx((0.3, 0.5))
    lat = paired(METRICS["latency_ms"], base, cand)
    assert lat is not None and (lat.pairs, lat.questions) == (2, 2)
    assert lat.delta == pytest.approx((150 + 200) / 2 - (100 + 300) / 2)
    assert paired(METRICS["recall_at_5"], base, cand) is None  # no gold anywhere


def test_a_condition_summary_by_hand() -> None:
    answers = [
        ("q1", 0, A(score=1.0)),
        ("q1", 1, A(score=0.5)),
        ("q2", 0, A(score=0.0)),
        ("q2", 1, A(score=None)),
    ]
    s = summary(METRICS["score"], answers, resamples=2000)
    assert s is not None
    # q1's mean 0.75 and q2's 0.0, each question weighing one
    assert s["mean"] == pytest.approx(0.375) and (s["answers"], s["questions"]) == (3, 2)
    # repeat 0 averages 0.5, repeat 1 0.5: no spread across repeats
    assert s["stdev_across_repeats"] == 0.0
    assert (s["ci"]["low"], s["ci"]["high"]) == (0.0, 0.75)  # a resample of q2s, of q1s
    assert summary(METRICS["latency_ms"], answers) is None


def test_a_condition_interval_and_spread_against_scipy_and_statistics() -> None:
    rng = np.random.default_rng(4)
    answers = [(f"q{q}", r, A(score=float(np.clip(rng.normal(0.6, 0.2), 0, 1))))
               for q in range(300) for r in range(3)]  # fmt: skip
    s = summary(METRICS["score"], answers)
    assert s is not None
    per_q = np.array([np.mean([a.score for q2, _, a in answers if q2 == f"q{q}"])
                      for q in range(300)])  # fmt: skip
    assert s["mean"] == pytest.approx(per_q.mean())
    ref = sps.bootstrap(
        (per_q,), np.mean, n_resamples=10_000, method="percentile", random_state=3
    ).confidence_interval
    se = float(per_q.std(ddof=1) / np.sqrt(300))
    assert s["ci"]["low"] == pytest.approx(ref.low, abs=0.1 * se)
    assert s["ci"]["high"] == pytest.approx(ref.high, abs=0.1 * se)
    by_repeat = [statistics.fmean(a.score for _, r2, a in answers if r2 == r) for r in range(3)]
    assert s["stdev_across_repeats"] == pytest.approx(statistics.stdev(by_repeat))


def test_values_for_people_never_show_minus_zero() -> None:
    assert fmt("fraction", -0.0004, True) == "0.0 pts"
    assert fmt("fraction", -0.02004, True, digits=3) == "-2.004 pts"
    assert fmt("fraction", 0.523) == "52.3%"
    assert fmt("ms", 129.34, True) == "+129.3 ms"
    assert fmt("tokens", 1605.3, bare=True) == "1,605.3"


def test_a_bound_just_past_the_limit_is_said_with_more_digits() -> None:
    from memdiag.analytics.stats import Interval

    rule = g.Rule(METRICS["accuracy"], 0.02)
    p = Paired(METRICS["accuracy"], 400, 200, 0.6, 0.61, Interval(-0.02004, 0.04, 0.95, 10, 0))
    mv = g._judge_metric(rule, p, 30)
    assert mv.verdict == g.REGRESSION
    assert "reaches -2.004 pts, -2.000 pts allowed (point estimate +1.0 pts" in mv.why
    assert "±3.0 pts wide on 200 questions: more questions narrow it" in mv.why


# -- the policy ---------------------------------------------------------------------------

GOOD = """
[sample]
min_questions = 30
min_repeats = 2

[metrics.accuracy]
max_regression = 0.02

[metrics.latency_ms]
max_regression = 250
"""


def test_a_policy_reads_and_explains_itself() -> None:
    p = g.parse_policy(GOOD, "gate.toml")
    assert (p.min_questions, p.min_repeats, p.same_config) == (30, 2, "note")
    assert [(r.metric.name, r.max_regression) for r in p.rules] == [
        ("accuracy", 0.02),
        ("latency_ms", 250.0),
    ]
    words = g.explain(p)
    assert "at least 30 distinct questions" in words and "2 paired repeats" in words
    assert "accuracy: fails when the interval's lower bound is below -2.0 pts" in words
    assert "latency_ms: fails when the interval's upper bound is above +250.0 ms" in words
    assert "suite_checksum" in words and "Exit 0 = pass, 1 = a judged regression" in words


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[sample\nmin_questions = 1", "not valid TOML"),
        ("[metrics.accuracy]\nmax_regression = 0.1", "needs [sample] min_questions"),
        ("[sample]\nmin_questions = 0\n[metrics.accuracy]\nmax_regression = 0.1", ">= 1"),
        ("[sample]\nmin_questions = true\n[metrics.accuracy]\nmax_regression = 0.1", ">= 1"),
        ("[sample]\nmin_questions = 5", "states no metric"),
        ("[sample]\nmin_questions = 5\n[metrics.acuracy]\nmax_regression = 0.1", "unknown metric"),
        ("[sample]\nmin_questions = 5\n[metrics.accuracy]\nmax_regresion = 0.1", "unknown key"),
        ("[sample]\nmin_questions = 5\n[metrics.accuracy]\nmax_regression = -1", "number >= 0"),
        ("[sample]\nmin_questions = 5\n[metrics.accuracy]\nmax_regression = 2", "fraction 0-1"),
        ("[sample]\nmin_questions = 5\n[metrics.tokens]\nmax_regression = inf", "finite number"),
        ("[sample]\nmin_questions = 5\n[metrics.tokens]\nmax_regression = nan", "finite number"),
        ("[sample]\nmin_questions = 5\nmin_question = 3\n[metrics.score]\nmax_regression = 0",
         "unknown key"),
        ("[sample]\nmin_questions = 5\n[metrics.score]\nmax_regression = 0\n[provenance]\n"
         "same_config = 'maybe'", "same_config must be"),
        ("[sample]\nmin_questions = 5\n[metric.score]\nmax_regression = 0", "unknown key"),
    ],
)  # fmt: skip
def test_a_bad_policy_says_what_to_change(text: str, says: str) -> None:
    with pytest.raises(g.PolicyError, match=None) as info:
        g.parse_policy(text)
    assert says in str(info.value)


# -- the gate on generated runs -----------------------------------------------------------


def run(
    accuracy: float,
    questions: int = 200,
    repeats: int = 2,
    seed: int = 0,
    latency: float = 1000.0,
    **kw: object,
) -> list[A]:
    """A run whose questions are answered right with probability ``accuracy`` (all its
    repeats alike: a question is hard or it is not)."""
    rng = random.Random(seed)
    out = []
    for q in range(questions):
        right = rng.random() < accuracy
        for rep in range(repeats):
            out.append(
                A(f"q{q:03d}", rep, right, ["g"], ["g"] if right else ["x"],
                  score=0.9 if right else 0.1, latency_ms=latency + rng.gauss(0, 50),
                  **kw)  # type: ignore[arg-type]
            )  # fmt: skip
    return out


POLICY = g.parse_policy(
    "[sample]\nmin_questions = 30\n[metrics.accuracy]\nmax_regression = 0.05\n"
    "[metrics.latency_ms]\nmax_regression = 100\n"
)


def judge(base: list[A], cand: list[A], policy: g.Policy = POLICY) -> g.Verdict:
    return g.judge(base, cand, policy)  # type: ignore[arg-type]


def test_a_candidate_at_least_as_good_passes() -> None:
    base = run(0.6, seed=1)
    cand = [
        A(a.question_id, a.repeat_index, True, a.gold_evidence_ids, ["g"],
          latency_ms=a.latency_ms)
        if a.question_id < "q020" else a for a in base
    ]  # fmt: skip
    v = judge(base, cand)
    assert (v.status, v.verdict) == (0, g.PASS), v.reason
    assert v.reason.startswith("pass: accuracy and latency_ms within the policy on 200")


def test_a_clear_regression_is_exit_1() -> None:
    v = judge(run(0.8, seed=1), run(0.5, seed=2))
    assert (v.status, v.verdict) == (1, g.REGRESSION)
    assert v.reason.startswith("regression (200 paired questions, 400 pairs): accuracy:")
    assert "latency_ms" not in v.reason  # it passed


def test_an_improving_point_estimate_with_a_wide_interval_fails() -> None:
    """The point estimate improves, but 40 questions cannot rule out a 5-point drop: the
    gate asks for evidence, and fails."""
    base = run(0.5, questions=40, seed=3)
    cand = run(0.5, questions=40, seed=4)
    v = judge(base, cand)
    acc = v.metrics[0].paired
    assert acc is not None and acc.delta > 0 and acc.ci.low < -0.05
    assert (v.status, v.verdict) == (1, g.REGRESSION), v.reason
    assert "point estimate +" in v.reason


def test_latency_regresses_on_the_upper_bound() -> None:
    base = run(0.6, seed=1)
    slower = [A(a.question_id, a.repeat_index, a.correct, a.gold_evidence_ids,
                a.retrieved_context_ids, latency_ms=(a.latency_ms or 0) + 76 + (
                    100 if a.question_id < "q040" else 0)) for a in base]  # fmt: skip
    v = judge(base, slower)
    lat = v.metrics[1]
    assert lat.rule.metric.name == "latency_ms" and lat.paired is not None
    assert lat.paired.delta < 100 < lat.paired.ci.high  # mean within, bound beyond
    assert v.status == 1 and "latency_ms: its 95% interval reaches +" in v.reason


@pytest.mark.parametrize(
    ("base", "cand", "says"),
    [
        (run(0.6, questions=20), run(0.6, questions=20), "20 paired questions, the policy needs 30"),
        (run(0.6), run(0.6, suite_checksum="suite-2"), "different suite_checksum"),
        (run(0.6)[:10] + run(0.6, suite_checksum="suite-2")[10:], run(0.6), "mixes suite_checksum"),
        (run(0.6), run(0.6, questions=0), "share no (question_id, repeat_index)"),
    ],
)  # fmt: skip
def test_cannot_judge_is_exit_2(base: list[A], cand: list[A], says: str) -> None:
    v = judge(base, cand)
    assert (v.status, v.verdict) == (2, g.CANNOT_JUDGE)
    assert says in v.reason and v.reason.startswith("cannot judge:")


def test_too_few_repeats_and_a_metric_nobody_sent() -> None:
    policy = g.parse_policy(
        "[sample]\nmin_questions = 30\nmin_repeats = 3\n[metrics.accuracy]\nmax_regression = 0.1"
    )
    v = judge(run(0.6), run(0.6), policy)
    assert v.status == 2 and "fewer than 3 paired repeats" in v.reason
    no_score = [A(a.question_id, a.repeat_index, a.correct, a.gold_evidence_ids) for a in run(0.6)]
    policy = g.parse_policy(
        "[sample]\nmin_questions = 30\n[metrics.score]\nmax_regression = 0.1\n"
        "[metrics.accuracy]\nmax_regression = 0.01"
    )
    v = judge(no_score, run(0.2, seed=9), policy)
    # accuracy regressed, but the gate could not judge the whole policy: 2, naming both
    assert v.status == 2
    assert "no paired answer carries score" in v.reason and "and regressed: accuracy" in v.reason


def test_a_metric_measured_on_too_few_questions_cannot_be_judged() -> None:
    base = [A(a.question_id, a.repeat_index, a.correct,
              a.gold_evidence_ids if a.question_id < "q010" else [],
              a.retrieved_context_ids) for a in run(0.6)]  # fmt: skip
    policy = g.parse_policy(
        "[sample]\nmin_questions = 30\n[metrics.recall_at_5]\nmax_regression = 0.1"
    )
    v = judge(base, base, policy)
    assert v.status == 2 and "recall_at_5 is measured on 10 paired questions" in v.reason


def test_provenance_the_same_config_is_a_note_or_a_refusal() -> None:
    base, cand = run(0.6, config_fingerprint="cfg-a"), run(0.6, config_fingerprint="cfg-a")
    v = judge(base, cand)
    assert v.status == 0 and any("config_fingerprint cfg-a" in n for n in v.notes)
    strict = g.parse_policy(
        GOOD.replace("min_repeats = 2", "") + '[provenance]\nsame_config = "refuse"'
    )
    v = judge(base, cand, strict)
    assert v.status == 2 and "not a different configuration" in v.reason
    v = judge(run(0.6, suite_checksum=None), run(0.6))
    assert v.status == 0 and any("baseline carries no suite_checksum" in n for n in v.notes)


# -- through DuckDB and the command -------------------------------------------------------


def row(run_id: str, a: A, n: int) -> dict:
    return {
        "kind": "judgement",
        "event_id": f"{run_id}-{a.question_id}-{a.repeat_index}-{n}",
        "run_id": run_id,
        "question_id": a.question_id,
        "condition": "full",
        "repeat_index": a.repeat_index,
        "judge_correct": a.correct,
        "failure_mode": failure_mode(a.correct, a.gold_evidence_ids, a.retrieved_context_ids),
        "gold_evidence_ids": a.gold_evidence_ids,
        "retrieved_context_ids": a.retrieved_context_ids,
        "gold_retrieved": len(set(a.gold_evidence_ids) & set(a.retrieved_context_ids)),
        "latency_ms": a.latency_ms,
        "score": a.score,
        "suite_checksum": a.suite_checksum,
        "ts": datetime(2026, 11, 21, 10, 0, n % 60, tzinfo=UTC).isoformat(),
    }


@pytest.fixture
def db(tmp_path: Path) -> Path:
    sink = DuckDBSink(tmp_path / "gate.duckdb")
    sink.init()
    rows = [row("base", a, n) for n, a in enumerate(run(0.6, seed=1))]
    rows += [row("good", a, n) for n, a in enumerate(run(0.8, seed=1))]
    rows += [row("bad", a, n) for n, a in enumerate(run(0.3, seed=2))]
    sink.write(rows)

    return tmp_path / "gate.duckdb"


def gate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(["gate", *args])
    return status, capsys.readouterr().out


def test_the_command_exits_0_1_2_with_one_line_reasons(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "gate.toml"
    policy.write_text(GOOD)
    common = ["--db", str(db), "--baseline", "base", "--policy", str(policy)]
    status, text = gate(
        capsys, *common, "--candidate", "good", "--markdown", str(tmp_path / "g.md")
    )
    assert status == 0 and text.strip().splitlines()[-1].startswith("pass: accuracy and")
    md = (tmp_path / "g.md").read_text()
    assert md.startswith("## memdiag gate: pass (exit 0)")
    row_ = next(line for line in md.splitlines() if line.startswith("| accuracy |"))
    assert row_.startswith("| accuracy | 62.0% | 81.5% | +19.5 pts |") and row_.endswith("| pass |")

    status, text = gate(capsys, *common, "--candidate", "bad", "--json")
    doc = json.loads(text)
    assert status == 1 and doc["status"] == 1 and doc["verdict"] == "regression"
    assert doc["reason"].startswith("regression") and doc["metrics"][0]["bound"] < -0.02

    for args, says in (
        (["--candidate", "nope"], "no such run 'nope': no judgements of it"),
        (["--candidate", "good", "--candidate-condition", "other"], "no condition 'other'"),
    ):
        status, text = gate(capsys, *common, *args, "--json")
        assert status == 2 and says in json.loads(text)["reason"]
    bad_policy = tmp_path / "bad.toml"
    bad_policy.write_text("[sample]\nmin_questions = 3")
    status, text = gate(capsys, "--db", str(db), "--baseline", "base", "--candidate", "good",
                        "--policy", str(bad_policy), "--json")  # fmt: skip
    assert status == 2 and json.loads(text)["verdict"] == "error"
    status, text = gate(capsys, "--db", str(tmp_path / "none.duckdb"), "--baseline", "base",
                        "--candidate", "good", "--policy", str(policy), "--json")  # fmt: skip
    assert status == 2 and "no DuckDB file" in json.loads(text)["reason"]
    with pytest.raises(SystemExit) as exit_:
        main(["gate", "--policy", str(policy), "--json", "--no-such-flag"])
    assert exit_.value.code == 2
    assert json.loads(capsys.readouterr().out)["verdict"] == "error"
    status, text = gate(capsys, "--policy", str(policy), "--explain")
    assert status == 0 and "This policy" in text and "accuracy: fails when" in text


def test_the_command_never_exits_1_but_for_a_regression(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = tmp_path / "gate.toml"
    policy.write_text(GOOD)
    common = ["--db", str(db), "--baseline", "base", "--candidate", "bad", "--policy", str(policy)]
    status, text = gate(capsys, *common, "--json", "--markdown", str(tmp_path / "no" / "g.md"))
    assert status == 2 and "cannot write" in json.loads(text)["reason"]
    latin = tmp_path / "latin.toml"
    latin.write_bytes(GOOD.encode() + b"# caf\xe9\n")
    status, text = gate(capsys, "--db", str(db), "--baseline", "base", "--candidate", "bad",
                        "--policy", str(latin), "--json")  # fmt: skip
    assert status == 2 and "not UTF-8" in json.loads(text)["reason"]
    status, text = gate(capsys, "--db", str(db), "--baseline", "base", "--candidate", "base",
                        "--policy", str(policy), "--json")  # fmt: skip
    assert status == 2 and "one run ('base') and one condition" in json.loads(text)["reason"]
    monkeypatch.setenv("MEMDIAG_TURN_TTL_SECONDS", "abc")
    status, text = gate(capsys, *common, "--json")
    assert status == 2 and json.loads(text)["verdict"] == "error"


def test_run_ids_that_look_like_markup_print(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sink = DuckDBSink(tmp_path / "m.duckdb")
    sink.init()
    sink.write([row("x[/y]-base", a, n) for n, a in enumerate(run(0.6, seed=1))]
               + [row("[bold]cand", a, n) for n, a in enumerate(run(0.8, seed=1))])  # fmt: skip
    policy = tmp_path / "gate.toml"
    policy.write_text(GOOD)
    status, text = gate(capsys, "--db", str(tmp_path / "m.duckdb"), "--baseline", "x[/y]-base",
                        "--candidate", "[bold]cand", "--policy", str(policy))  # fmt: skip
    assert status == 0 and "x[/y]-base [full] → [bold]cand [full]" in text


def test_a_run_on_both_sides_cannot_be_judged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A baseline run that is also in the candidate's run group (a sweep's group, say) would
    be compared with itself: every difference 0, a pass. The gate cannot judge that (exit 2),
    as it cannot judge a run against itself."""
    sink = DuckDBSink(tmp_path / "g.duckdb")
    sink.init()
    grouped = [
        {**row(name, a, n), "run_group_id": "sweep"}
        for name, rate, seed in (("base", 0.6, 1), ("worse", 0.3, 2))
        for n, a in enumerate(run(rate, seed=seed))
    ]
    sink.write(grouped)
    policy = tmp_path / "gate.toml"
    policy.write_text(GOOD)
    status, text = gate(capsys, "--db", str(tmp_path / "g.duckdb"), "--baseline", "base",
                        "--candidate-group", "sweep", "--policy", str(policy), "--json")  # fmt: skip
    doc = json.loads(text)
    assert status == 2 and doc["verdict"] != "pass", doc
    assert "1 run(s) are on both sides under one condition ('base')" in doc["reason"]
