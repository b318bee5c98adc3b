"""What the seeds ask of benchmark comparisons (#37): run groups, evaluation hygiene and
positional decay, each against a hand case or an independent computation."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memdiag.analytics import gate as g
from memdiag.analytics import positional as pos
from memdiag.analytics import scores as sc
from memdiag.analytics.doctor import doctor
from memdiag.analytics.sink import DuckDBSink
from memdiag.cli import main
from memdiag.streams.rules.diagnosis import failure_mode


def record(run: str, q: str, correct: bool, gold=("g",), context=("g",), repeat=0,
           condition="", ts="2026-11-21T10:00:00Z", **extra: Any) -> dict[str, Any]:  # fmt: skip
    """A judgement as the worker hands it to the sink."""
    return {
        "kind": "judgement",
        "event_id": f"{run}|{condition}|{q}|{repeat}",
        "run_id": run,
        "question_id": q,
        "condition": condition,
        "repeat_index": repeat,
        "judge_correct": correct,
        "failure_mode": failure_mode(correct, gold, context),
        "gold_evidence_ids": list(gold),
        "retrieved_context_ids": list(context),
        "gold_retrieved": len(set(gold) & set(context)),
        "ts": ts,
        **extra,
    }


@pytest.fixture
def sink(tmp_path: Path) -> DuckDBSink:
    s = DuckDBSink(tmp_path / "seeds.duckdb")
    s.init()
    return s


def read(sink: DuckDBSink) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(sink.path, read_only=True)


# -- positional decay ---------------------------------------------------------------------


def test_the_best_gold_rank_by_hand() -> None:
    assert pos.best_gold_rank(["a"], ["a", "b"]) == 1
    assert pos.best_gold_rank(["b", "c"], ["x", "c", "y", "b"]) == 2  # the first gold id
    assert pos.best_gold_rank(["a", "z"], ["a", "b"]) is None  # some gold missing: retrieval's
    assert pos.best_gold_rank([], ["a"]) is None  # no gold: cannot be placed
    assert pos.best_gold_rank(["a"], []) is None


def test_buckets_by_hand() -> None:
    labels = [pos.bucket_of(r, pos.RANK_BUCKETS) for r in (1, 2, 3, 4, 10, 11, 500)]
    assert labels == ["1", "2-3", "2-3", "4-10", "4-10", ">10", ">10"]
    lengths = [pos.bucket_of(n, pos.LENGTH_BUCKETS) for n in (1, 5, 6, 10, 11, 20, 21, 50, 51)]
    assert lengths == ["1-5", "1-5", "6-10", "6-10", "11-20", "11-20", "21-50", "21-50", ">50"]


class Ans:
    def __init__(self, correct: bool, gold: list[str], context: list[str]):
        self.correct, self.gold_evidence_ids, self.retrieved_context_ids = correct, gold, context


def test_a_reader_that_decays_with_position_by_hand() -> None:
    """Rank 1 always right, rank 12 always wrong; a missing gold id and no gold left out."""
    ctx = [f"c{i}" for i in range(1, 16)]  # 15 ids: the 11-20 length bucket
    answers = [Ans(True, ["c1"], ctx)] * 3 + [Ans(False, ["c12"], ctx)] * 2
    answers += [Ans(True, ["c2"], ctx[:3]), Ans(False, ["c3"], ctx[:3])]  # rank 2-3, length 3
    answers += [Ans(False, ["zz"], ctx), Ans(False, [], ctx)]  # not the reader's: left out
    tables = pos.positional(answers)
    rank = {b.bucket: (b.answers, b.correct, b.reader_failures) for b in tables["by_gold_rank"]}
    assert rank == {"1": (3, 3, 0), "2-3": (2, 1, 1), "4-10": (0, 0, 0), ">10": (2, 0, 2)}
    length = {b.bucket: (b.answers, b.correct_rate) for b in tables["by_context_length"]}
    assert length["11-20"] == (5, 0.6) and length["1-5"] == (2, 0.5)
    assert length[">50"] == (0, None)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.booleans(),
            st.sets(st.integers(0, 30), max_size=3),
            st.lists(st.integers(0, 30), max_size=60, unique=True),
        ),
        max_size=40,
    )
)
def test_the_tables_match_an_independent_count(raw: list) -> None:
    answers = [Ans(c, [f"m{i}" for i in gold], [f"m{i}" for i in ctx]) for c, gold, ctx in raw]
    # independently: walk the context, note where each gold id is
    want_rank: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    want_len: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for a in answers:
        where = {cid: i + 1 for i, cid in enumerate(a.retrieved_context_ids)}
        if not a.gold_evidence_ids or any(x not in where for x in a.gold_evidence_ids):
            continue
        best = min(where[x] for x in a.gold_evidence_ids)
        r = "1" if best == 1 else "2-3" if best <= 3 else "4-10" if best <= 10 else ">10"
        n = len(a.retrieved_context_ids)
        length = (
            "1-5" if n <= 5 else "6-10" if n <= 10 else "11-20" if n <= 20
            else "21-50" if n <= 50 else ">50"
        )  # fmt: skip
        for table, key in ((want_rank, r), (want_len, length)):
            table[key][0] += 1
            table[key][1] += a.correct
    got = pos.positional(answers)
    for name, want in (("by_gold_rank", want_rank), ("by_context_length", want_len)):
        for b in got[name]:
            assert [b.answers, b.correct] == want.get(b.bucket, [0, 0])
    assert sum(b.answers for b in got["by_gold_rank"]) == sum(
        b.answers for b in got["by_context_length"]
    )


def test_scores_and_compare_show_where_the_reader_misses(sink: DuckDBSink) -> None:
    """The candidate reranks: the baseline's evidence at rank 8 is right half the time, the
    candidate's at rank 1 always: per bucket, each side's own."""
    long = [f"x{i}" for i in range(7)] + ["g"] + [f"y{i}" for i in range(4)]  # gold at 8, 12 ids
    rows = []
    for q in range(10):
        rows.append(record("base", f"q{q}", q % 2 == 0, context=long))
        rows.append(record("cand", f"q{q}", True, context=["g", *long[:7]]))  # rank 1, 8 ids
    sink.write(rows)
    with read(sink) as con:
        s = sc.scores(con, "base", resamples=100)
        c = sc.compare(con, "base", "cand", resamples=100)
    table = {b["bucket"]: b for b in s["conditions"][0]["positional"]["by_gold_rank"]}
    assert table["4-10"] == {"bucket": "4-10", "answers": 10, "correct": 5, "reader_failures": 5,
                             "correct_rate": 0.5}  # fmt: skip
    by_rank = {b["bucket"]: b for b in c["positional"]["by_gold_rank"]}
    assert by_rank["1"]["baseline"]["answers"] == 0 and by_rank["1"]["candidate"]["answers"] == 10
    assert by_rank["1"]["correct_rate_delta"] is None  # nothing on one side to compare
    by_len = {b["bucket"]: b for b in c["positional"]["by_context_length"]}
    assert by_len["11-20"]["baseline"]["correct_rate"] == 0.5
    assert by_len["6-10"]["candidate"]["correct_rate"] == 1.0


def test_the_buckets_are_shown_in_the_terminal_and_on_the_page(sink: DuckDBSink, capsys) -> None:
    """compare's tables and the report's, from the same numbers as the JSON."""
    import re

    from memdiag.views import html

    long = [f"x{i}" for i in range(7)] + ["g"] + [f"y{i}" for i in range(4)]
    sink.write([r for q in range(10) for r in (
        record("base", f"q{q}", q % 2 == 0, context=long),
        record("cand", f"q{q}", True, context=["g", *long[:7]]),
    )])  # fmt: skip
    assert main(["compare", "--db", str(sink.path), "--baseline", "base", "--candidate", "cand",
                 "--resamples", "0"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "buried evidence by best gold rank" in out and "buried evidence by context length" in out
    cells = lambda bucket: re.search(rf"│ {re.escape(bucket)} +│(.*)│\n", out)[1].split("│")  # noqa: E731
    assert [c.strip() for c in cells("4-10")] == ["50% of 10", "—", "—", "5 → 0"]
    assert [c.strip() for c in cells("1")] == ["—", "100% of 10", "—", "0 → 0"]
    with read(sink) as con:
        c = sc.compare(con, "base", "cand", resamples=0)
        s = sc.scores(con, "base", resamples=0)
    page = html.positional_compared(c["positional"])
    assert "Buried evidence by best gold rank" in page and "50% of 10" in page
    runs = [{"run_id": "base", "condition": cond["condition"], "positional": cond["positional"]}
            for cond in s["conditions"]]  # fmt: skip
    page = html.positional_runs(runs)
    assert "Correct rate by context length (ids)" in page and "50% of 10" in page
    empty = {**runs[0]["positional"]}
    for name in ("by_gold_rank", "by_context_length"):
        empty[name] = [{**b, "answers": 0} for b in empty[name]]
    assert html.positional_runs([{**runs[0], "positional": empty}]) == ""  # nothing to show


# -- run groups ---------------------------------------------------------------------------


def _outcomes(seed: int, questions: int, repeats: int, p: float) -> list[list[bool]]:
    rng = random.Random(seed)
    return [[rng.random() < p for _ in range(repeats)] for _ in range(questions)]


def test_a_group_of_runs_compares_as_one_run_of_repeats(sink: DuckDBSink) -> None:
    """Three runs of a group, each one repeat, give what one run with three repeats gives:
    the same sign test, accuracy and interval (the independent computation is the run)."""
    base, cand = _outcomes(1, 40, 3, 0.5), _outcomes(2, 40, 3, 0.7)
    rows = []
    for side, outcomes in (("b", base), ("c", cand)):
        for q, reps in enumerate(outcomes):
            for r, ok in enumerate(reps):
                # as a group: one run per repeat, started in order; as a run: repeat_index r
                ts = f"2026-11-21T1{r}:00:{q:02d}Z"
                rows.append(record(f"{side}-rep{r}", f"q{q:02d}", ok, ts=ts,
                                   run_group_id=f"group-{side}"))  # fmt: skip
                rows.append(record(f"{side}-all", f"q{q:02d}", ok, repeat=r, ts=ts))
    sink.write(rows)
    with read(sink) as con:
        grouped = sc.compare(con, sc.Side(group="group-b"), sc.Side(group="group-c"),
                             resamples=500)  # fmt: skip
        single = sc.compare(con, "b-all", "c-all", resamples=500)
        judged = sc.load_group(con, "group-b")
    for key in ("pairs", "questions", "delta", "mcnemar", "bootstrap_ci", "transitions",
                "significant", "metrics", "positional"):  # fmt: skip
        assert grouped[key] == single[key], key
    assert grouped["baseline"]["runs"] == ["b-rep0", "b-rep1", "b-rep2"]
    assert grouped["baseline"]["run_group_id"] == "group-b"
    assert grouped["baseline"]["run_id"] is None
    # repeat k of a question is its answer in the k-th run to start
    q0 = sorted((j.repeat_index, j.run_id) for j in judged if j.question_id == "q00")
    assert q0 == [(0, "b-rep0"), (1, "b-rep1"), (2, "b-rep2")]


def test_a_group_orders_its_runs_by_their_start_and_keeps_their_own_repeats(
    sink: DuckDBSink,
) -> None:
    rows = [
        record("late", "q", True, ts="2026-11-21T12:00:00Z", run_group_id="g"),
        record("early", "q", False, repeat=1, ts="2026-11-21T09:00:00Z", run_group_id="g"),
        record("early", "q", True, repeat=0, ts="2026-11-21T09:30:00Z", run_group_id="g"),
        record("early", "other", True, ts="2026-11-21T09:00:00Z", run_group_id="g"),
        record("elsewhere", "q", True, ts="2026-11-21T08:00:00Z", run_group_id="h"),
    ]
    sink.write(rows)
    with read(sink) as con:
        judged = sc.load_group(con, "g")
        with pytest.raises(sc.UnknownRun, match="no such run group 'gg'.*g, h"):
            sc.load_group(con, "gg")
    got = sorted((j.question_id, j.repeat_index, j.run_id, j.correct) for j in judged)
    assert got == [("other", 0, "early", True), ("q", 0, "early", True),
                   ("q", 1, "early", False), ("q", 2, "late", True)]  # fmt: skip


def test_the_commands_take_groups(sink: DuckDBSink, tmp_path: Path, capsys) -> None:
    rows = []
    for side, p in (("b", 0.4), ("c", 0.9)):
        for r, outcomes in enumerate(zip(*_outcomes(3, 60, 2, p), strict=True)):
            for q, ok in enumerate(outcomes):
                rows.append(record(f"{side}{r}", f"q{q:02d}", ok, run_group_id=f"G{side}",
                                   suite_checksum="s", ts=f"2026-11-21T1{r}:00:00Z"))  # fmt: skip
    sink.write(rows)
    db = ["--db", str(sink.path)]
    assert main(["compare", *db, "--baseline-group", "Gb", "--candidate-group", "Gc",
                 "--json", "--resamples", "300"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert (
        out["questions"] == 60 and out["pairs"] == 120 and out["baseline"]["runs"] == ["b0", "b1"]
    )
    policy = tmp_path / "p.toml"
    policy.write_text("[sample]\nmin_questions = 30\nmin_repeats = 2\n"
                      "[metrics.accuracy]\nmax_regression = 0.02\n")  # fmt: skip
    status = main(["gate", *db, "--baseline-group", "Gc", "--candidate-group", "Gb",
                   "--policy", str(policy), "--json"])  # fmt: skip
    verdict = json.loads(capsys.readouterr().out)
    assert status == 1 and verdict["verdict"] == "regression", verdict["reason"]
    assert verdict["baseline"]["run_group_id"] == "Gc" and verdict["sample"]["fewest_repeats"] == 2
    status = main(["doctor", *db, "--baseline-group", "Gb", "--candidate", "c0", "--json"])
    found = {f["check"]: f for f in json.loads(capsys.readouterr().out)["findings"]}
    assert "2 runs in the group" in found["run_group"]["message"]
    # a side named twice, or not at all, is a usage error that says what to give
    assert main(["compare", *db, "--baseline", "b0", "--baseline-group", "Gb",
                 "--candidate", "c0", "--json"]) == 2  # fmt: skip
    assert "not both" in capsys.readouterr().out
    assert main(["compare", *db, "--candidate", "c0"]) == 2
    assert "--baseline RUN or --baseline-group G is required" in capsys.readouterr().err
    status = main(["gate", *db, "--baseline-group", "nope", "--candidate-group", "Gb",
                   "--policy", str(policy), "--json"])  # fmt: skip
    assert (
        status == 2 and "no such run group 'nope'" in json.loads(capsys.readouterr().out)["reason"]
    )


def test_compare_with_no_resamples_gives_no_interval(sink: DuckDBSink, capsys) -> None:
    sink.write([record("a", f"q{i}", i % 2 == 0) for i in range(20)]
               + [record("b", f"q{i}", True) for i in range(20)])  # fmt: skip
    assert main(["compare", "--db", str(sink.path), "--baseline", "a", "--candidate", "b",
                 "--resamples", "0", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["bootstrap_ci"] is None and out["metrics"]["accuracy"]["ci"] is None
    assert out["mcnemar"]["wrong_to_right"] == 10 and out["significant"] is True
    assert "sign test alone" in out["significance_note"]
    assert main(["compare", "--db", str(sink.path), "--baseline", "a", "--candidate", "b",
                 "--resamples", "0"]) == 0  # fmt: skip
    assert "candidate is better" in capsys.readouterr().out


# -- hygiene ------------------------------------------------------------------------------


def _two(fixture_b: str | None = "fx1", fixture_c: str | None = "fx1", n: int = 40,
         **extra: Any) -> tuple[list[sc.Judged], list[sc.Judged]]:  # fmt: skip
    """Two equal runs as the gate reads them."""

    def j(run: str, q: int, fixture: str | None, **kw: Any) -> sc.Judged:
        fields = dict(condition="", question_id=f"q{q:02d}", repeat_index=0, correct=q % 3 > 0,
                      failure_mode=None, ts=None, latency_ms=None, tokens=None,
                      gold_evidence_ids=["g"], retrieved_context_ids=["g"], score=None,
                      input_tokens=None, output_tokens=None, suite_checksum="s",
                      config_fingerprint=None, fixture_checksum=fixture, label_status=None,
                      split=None, run_id=run)  # fmt: skip
        fields.update(kw)
        return sc.Judged(**fields)  # type: ignore[arg-type]

    base = [j("b", q, fixture_b, **extra.get("b", lambda q: {})(q)) for q in range(n)]
    cand = [j("c", q, fixture_c, **extra.get("c", lambda q: {})(q)) for q in range(n)]
    return base, cand


POLICY = "[sample]\nmin_questions = 20\n[metrics.accuracy]\nmax_regression = 0.1\n"


def test_a_different_fixture_refuses_by_default_and_notes_when_told() -> None:
    base, cand = _two("fx1", "fx2")
    v = g.judge(base, cand, g.parse_policy(POLICY), resamples=200)
    assert v.verdict == g.CANNOT_JUDGE and "different fixture_checksum" in v.reason
    assert 'same_fixture = "refuse"' in v.reason
    noted = g.parse_policy(POLICY + '[provenance]\nsame_fixture = "note"\n')
    v = g.judge(base, cand, noted, resamples=200)
    assert v.verdict == g.PASS and any("fixture_checksum" in n for n in v.notes)
    assert g.judge(*_two("fx1", "fx1"), g.parse_policy(POLICY), resamples=200).verdict == g.PASS
    assert g.judge(*_two(None, "fx1"), g.parse_policy(POLICY), resamples=200).verdict == g.PASS
    # a side that mixes fixtures refuses too
    mixed, cand = _two(b=lambda q: {"fixture_checksum": f"fx{q % 2}"})
    v = g.judge(mixed, cand, g.parse_policy(POLICY), resamples=200)
    assert v.verdict == g.CANNOT_JUDGE and "mixes fixture_checksums" in v.reason
    with pytest.raises(g.PolicyError, match="same_fixture must be one of refuse, note"):
        g.parse_policy(POLICY + '[provenance]\nsame_fixture = "maybe"\n')


def test_a_policy_can_count_reviewed_labels_and_one_split_only() -> None:
    # q00-q09 unreviewed on the candidate side only; q30-q39 are the dev split
    base, cand = _two(
        b=lambda q: {"label_status": "reviewed", "split": "dev" if q >= 30 else "held_out"},
        c=lambda q: {"label_status": "unreviewed" if q < 10 else "reviewed",
                     "split": "dev" if q >= 30 else "held_out"},
    )  # fmt: skip
    policy = g.parse_policy(POLICY.replace("min_questions = 20", "min_questions = 20\n"
                                           'require_reviewed = true\nsplit = "held_out"'))  # fmt: skip
    v = g.judge(base, cand, policy, resamples=200)
    assert v.verdict == g.PASS and v.sample["questions"] == 20  # 40 - 10 dev - 10 unreviewed
    assert v.sample["left_out"] == {"other_split": 20, "unreviewed_questions": 10,
                                    "unreviewed_answers": 20}  # fmt: skip
    assert any("unreviewed label" in n for n in v.notes)
    strict = g.parse_policy(
        POLICY.replace("min_questions = 20", "min_questions = 35\nrequire_reviewed = true")
    )
    v = g.judge(base, cand, strict, resamples=200)
    assert v.verdict == g.CANNOT_JUDGE and "30 paired questions, the policy needs 35" in v.reason
    assert g.judge(*_two(), strict, resamples=200).verdict == g.CANNOT_JUDGE  # no labels at all
    for bad, says in (("require_reviewed = 1", "true or false"), ('split = ""', "split")):
        with pytest.raises(g.PolicyError, match=says):
            g.parse_policy(POLICY.replace("min_questions = 20", f"min_questions = 20\n{bad}"))
    assert g.parse_policy(POLICY).as_dict()["same_fixture"] == "refuse"


def test_tokens_on_one_side_only_cannot_be_judged() -> None:
    policy = g.parse_policy(POLICY + "[metrics.tokens]\nmax_regression = 100\n")
    base, cand = _two(b=lambda q: {"tokens": 500}, c=lambda q: {"tokens": 400 if q else None})
    v = g.judge(base, cand, policy, resamples=200)
    [tokens] = [m for m in v.metrics if m.rule.metric.name == "tokens"]
    assert tokens.verdict == g.CANNOT_JUDGE and "1 of 40 paired answers" in tokens.why
    assert v.verdict == g.CANNOT_JUDGE
    base, cand = _two(b=lambda q: {"input_tokens": 300, "output_tokens": 200},
                      c=lambda q: {"tokens": 450})  # fmt: skip
    assert g.judge(base, cand, policy, resamples=200).verdict == g.PASS  # both carry a count


def test_doctor_finds_what_the_seed_asks(sink: DuckDBSink) -> None:
    rows = []
    for q in range(40):
        qid = f"q{q:02d}"
        rows.append(record("a", qid, True, fixture_checksum="fx1", tokens=100,
                           label_status="reviewed" if q else "unreviewed",
                           split="held_out" if q < 30 else "dev"))  # fmt: skip
        rows.append(record("b", qid, True, fixture_checksum="fx2"))
        rows.append(record("m", qid, False, condition="no-memory",
                           context=("g",) if q < 3 else (), fixture_checksum=f"f{q % 2}"))  # fmt: skip
    sink.write(rows)
    with read(sink) as con:
        pair = {f.check: f for f in doctor(con, ("a", None), ("b", None))}
        alone = {f.check: f for f in doctor(con, ("m", None))}
    assert (
        pair["fixture_differs"].level == "refuse"
        and "fx1 vs fx2" in pair["fixture_differs"].message
    )
    assert pair["tokens_one_side"].level == "weak"
    assert "(tokens: 40 of 40 paired answers)" in pair["tokens_one_side"].message
    assert pair["unreviewed_labels"].message.startswith("1 of 40 questions")
    assert "held_out 30, dev 10" in pair["mixed_splits"].message
    assert alone["no_memory_has_context"].level == "refuse"
    assert alone["no_memory_has_context"].message.startswith("3 of 40 answers of the 'no-memory'")
    assert alone["mixed_fixture"].level == "refuse"
    assert "unreviewed_labels" not in alone  # nobody sent label_status: nothing to say


@pytest.mark.parametrize(
    ("condition", "control"),
    [("no-memory", True), ("no_memory", True), ("No-Memory", True), ("NO_MEMORY", True),
     ("memory", False), ("no-memory-v2", False)],
)  # fmt: skip
def test_a_no_memory_control_is_known_by_either_spelling_in_any_case(
    sink: DuckDBSink, condition: str, control: bool
) -> None:
    sink.write([record("m", f"q{q:02d}", False, condition=condition,
                       context=("g",) if q < 2 else ()) for q in range(10)])  # fmt: skip
    with read(sink) as con:
        found = {f.check for f in doctor(con, ("m", None))}
    assert ("no_memory_has_context" in found) is control


# -- whole words against substrings (AgentOS parity) --------------------------------------


def test_both_readings_by_hand() -> None:
    from memdiag.analytics.readings import read_both

    # "deploy" stands only inside "deployment": a substring, not a word
    r = read_both("deploy steps: canary first", "the deployment failed at the canary")
    assert (r.used_words, r.used_substrings) == (False, True)  # 1/4 words, 2/4 substrings
    assert r.only_substring == ("deploy",)
    # a keyword normalised from punctuation is a word of "auth-token", not its substring
    r = read_both("rotate auth-token", "please rotate the auth-token")
    assert r.used_words and r.only_word == ("authtoken",) and r.used_substrings  # 2/2, 1/2
    r = read_both("rotate auth-token weekly please", "the auth-token: weekly rotation")
    assert (r.used_words, r.used_substrings) == (True, False)  # 2/4 words; 1/4 substrings
    assert read_both("", "anything").used_substrings is False  # no keywords: ignored both ways


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["deploy", "deployment", "state", "statement", "token", "rotate",
                              "rotation", "auth-token", "canary", "x"]), max_size=8),
    st.lists(st.sampled_from(["deploy", "deployment", "state", "statement", "token", "rotate",
                              "rotation", "auth-token", "canary", "x"]), max_size=12),
)  # fmt: skip
def test_the_readings_match_an_independent_count(memory: list, response: list) -> None:
    """Whole words: memdiag's own verdict (feedback.judge_observation); substrings: counted
    here with str.find over the lowercased text."""
    from memdiag.analytics.readings import read_both
    from memdiag.streams.rules.feedback import judge_observation, keywords, response_words

    content, text = " ".join(memory), " ".join(response)
    r = read_both(content, text)
    assert r.used_words == (judge_observation(content, response_words(text)).signal == "used")
    kws = keywords(content)
    found = sum(text.lower().find(k) >= 0 for k in kws)
    assert r.used_substrings == (bool(kws) and found / len(kws) > 0.3)


def test_calibrate_counts_the_flips_on_the_users_own_events(tmp_path: Path) -> None:
    """The texts of an events file, joined into turns as the stream joins them: the first
    response in event time, every injection, each distinct observation once with the content
    of its first injection."""
    from memdiag.analytics.readings import substring_flips

    def ev(kind: str, eid: str, turn: str, ts: str = "2026-11-21T10:00:00Z", **kw: Any) -> str:
        return json.dumps({"kind": kind, "event_id": eid, "ts": ts, "session_id": "s",
                           "turn_id": turn, **kw})  # fmt: skip

    lines = [
        ev("injection", "i1", "t1", observations=[
            {"id": "o1", "content": "deploy steps: canary first"},
            {"id": "o2", "content": "rotate auth-token weekly please"}]),
        ev("response", "r1", "t1", text="the deployment failed at the canary; auth-token: weekly rotation"),
        # later in event time (11:30Z), though its text sorts first: not the turn's response
        ev("response", "r0", "t1", ts="2026-11-21T09:30:00-02:00", text="deploy steps canary"),
        # a second injection counts; o1 again keeps its first content
        ev("injection", "i3", "t1", ts="2026-11-21T10:05:00Z", observations=[
            {"id": "o1", "content": "nothing alike here at all"},
            {"id": "o3", "content": "canary rollout"}]),
        ev("injection", "i2", "t2", observations=[{"id": "o1", "content": "deploy"}]),
        "not json",
        ev("response", "r9", "t1", ts="yesterday", text="unreadable time: skipped"),
        "",
    ]  # fmt: skip
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines))
    got = substring_flips(path)
    assert got["judged"] == 3 and got["skipped"] == {
        "not_json": 1,
        "bad_ts": 1,
        "unpaired_turns": 1,
    }
    assert (got["ignored_to_used"], got["used_to_ignored"]) == (1, 1)
    assert got["used_whole_words"] == 2 and got["used_substrings"] == 2  # o2, o3; o1, o3
    assert got["flipped_share"] == pytest.approx(2 / 3)
    assert [e["observation_id"] for e in got["examples"]] == ["o1", "o2"]
    assert got["examples"][0]["only_as_substring"] == ["deploy"]
    with pytest.raises(FileNotFoundError, match="cannot read the events file"):
        substring_flips(tmp_path / "missing.jsonl")


def test_doctor_pairs_answers_to_find_tokens_on_one_side(sink: DuckDBSink) -> None:
    """Both sides carry tokens on the same answers (and neither on the rest): nothing to say,
    and the gate judges; tokens on one side and input/output tokens on the other: the gate
    cannot judge input_tokens, and doctor says so."""
    rows = []
    for q in range(40):
        extra = {"tokens": 100} if q < 20 else {}
        rows.append(record("a", f"q{q:02d}", True, **extra))
        rows.append(record("b", f"q{q:02d}", True, **extra))
        rows.append(record("c", f"q{q:02d}", True, input_tokens=80, output_tokens=20))
    sink.write(rows)
    with read(sink) as con:
        same = {f.check for f in doctor(con, ("a", None), ("b", None))}
        mixed = {f.check: f for f in doctor(con, ("a", None), ("c", None))}
    assert "tokens_one_side" not in same
    message = mixed["tokens_one_side"].message
    assert "input_tokens: 40 of 40" in message and "output_tokens: 40 of 40" in message
    assert "(tokens: 20 of 40" in message  # c's total is input + output: a lacks 20


def test_doctor_says_when_the_sides_share_runs(sink: DuckDBSink) -> None:
    sink.write([record(r, f"q{q}", True, run_group_id="g") for r in ("r1", "r2")
                for q in range(3)])  # fmt: skip
    with read(sink) as con:
        found = {f.check: f for f in doctor(con, sc.Side(run="r1"), sc.Side(group="g"))}
    assert "1 runs are on both sides (r1)" in found["sides_overlap"].message


def test_a_file_from_before_the_hygiene_columns_still_reads(sink: DuckDBSink, capsys) -> None:
    """A reader opens files read-only: one written before label_status and split (an older
    sink) is read as its rows were, NULL, until a sink upgrades it."""
    sink.write([record(r, f"q{q:02d}", q % 2 == 0 or r == "b", fixture_checksum="f")
                for r in ("a", "b") for q in range(30)])  # fmt: skip
    with duckdb.connect(sink.path) as con:
        for column in ("label_status", "split"):
            con.execute(f"ALTER TABLE judgements DROP COLUMN {column}")
    db = ["--db", str(sink.path), "--json"]
    assert main(["compare", *db, "--baseline", "a", "--candidate", "b", "--resamples", "200"]) == 0
    assert json.loads(capsys.readouterr().out)["mcnemar"]["wrong_to_right"] == 15
    assert main(["report", "scores", *db, "--run-id", "a"]) == 0
    capsys.readouterr()
    assert main(["doctor", *db, "--baseline", "a", "--candidate", "b"]) in (0, 1)
    assert "findings" in json.loads(capsys.readouterr().out)
