"""Benchmark judgements through the real broker: attribution, redelivery, bad input."""

from __future__ import annotations

import pytest

from tests.integration.conftest import Pipeline

pytestmark = pytest.mark.integration


def judgement(run: str, q: str, correct: bool, gold: list[str], retrieved: list[str], **kw) -> dict:
    return {
        "kind": "judgement",
        "event_id": f"{run}-{q}-{kw.get('repeat_index', 0)}-{kw.get('condition', '')}",
        "ts": "2026-11-21T10:00:00.000Z",
        "run_id": run,
        "question_id": q,
        "judge_correct": correct,
        "gold_evidence_ids": gold,
        "retrieved_context_ids": retrieved,
        **kw,
    }


def test_judgements_are_attributed_and_counted_once(pipeline: Pipeline) -> None:
    pipeline.start()
    run = "run-a"
    batch = [
        judgement(run, "q-correct", True, ["g"], []),
        judgement(run, "q-no-gold", False, [], ["x"]),
        judgement(run, "q-reader", False, ["g1", "g2"], ["g2", "g1", "x"]),
        judgement(run, "q-retrieval", False, ["g1", "g2"], ["g1"], repeat_index=1),
        judgement(
            run, "q-reader", True, ["g"], ["g"], condition="other", latency_ms=12.5, tokens=7
        ),
    ]
    topic = pipeline.settings.topics.judgements
    pipeline.publish(
        [(run.encode(), batch), (run.encode(), batch[2])], topic=topic
    )  # q-reader twice
    pipeline.publish([(b"run-b", b'{"kind": "judgement", "event_id": "bad"}')], topic=topic)
    pipeline.drain()
    rows = pipeline.query(
        "SELECT question_id, condition, repeat_index, failure_mode, gold_retrieved "
        "FROM judgements ORDER BY ALL"
    )
    assert rows == [
        ("q-correct", "", 0, None, 0),
        ("q-no-gold", "", 0, "unattributed", 0),
        ("q-reader", "", 0, "reader_failure", 2),
        ("q-reader", "other", 0, None, 1),
        ("q-retrieval", "", 1, "retrieval_failure", 1),
    ]
    assert pipeline.query("SELECT reason FROM dead_letters") == [("missing_field",)]
    before = pipeline.snapshot()
    pipeline.publish([(run.encode(), batch)], topic=topic)  # a replay
    pipeline.drain()
    assert pipeline.snapshot() == before


def test_groups_hygiene_and_buried_evidence_through_the_broker(
    pipeline: Pipeline, tmp_path, capsys
) -> None:
    """#37 end to end: each repeat its own run of a run group, labels and splits, a
    no-memory control that saw memories, tokens on one side only, and evidence the
    candidate ranks higher; compare, gate and doctor read them from DuckDB."""
    import json

    from memdiag.cli import main

    pipeline.start()
    buried = [f"x{i}" for i in range(7)] + ["g"] + [f"y{i}" for i in range(4)]  # rank 8 of 12
    events = []
    for rep in range(2):
        for q in range(40):
            qid = f"q{q:02d}"
            common = {
                "repeat_index": 0,
                "suite_checksum": "suite-1",
                "fixture_checksum": "fixtures-1",
                "label_status": "reviewed" if q >= 4 else "unreviewed",
                "split": "held_out" if q < 36 else "dev",
                "ts": f"2026-11-21T1{rep}:00:{q:02d}Z",
            }
            events.append(judgement(f"base-r{rep}", qid, q % 2 == 0, ["g"], buried,
                                    run_group_id="nightly-base", tokens=900, **common))  # fmt: skip
            events.append(judgement(f"cand-r{rep}", qid, q % 10 != 0, ["g"], ["g", *buried[:7]],
                                    run_group_id="nightly-cand", **common))  # fmt: skip
            # the candidate again, on other fixtures
            events.append(judgement(f"refix-r{rep}", qid, q % 10 != 0, ["g"], ["g", *buried[:7]],
                                    run_group_id="nightly-refix",
                                    **{**common, "fixture_checksum": "fixtures-2"}))  # fmt: skip
    for e in events:
        e["event_id"] = f"{e['run_id']}-{e['question_id']}"
    control = [
        judgement("ctrl", f"q{q:02d}", False, ["g"], ["g"] if q < 2 else [], condition="no-memory")
        for q in range(10)
    ]
    topic = pipeline.settings.topics.judgements
    pipeline.publish([(e["run_id"].encode(), e) for e in events + control], topic=topic)
    pipeline.drain()
    db = ["--db", str(pipeline.settings.duckdb_path)]
    sides = ["--baseline-group", "nightly-base", "--candidate-group", "nightly-cand"]

    assert main(["compare", *db, *sides, "--json", "--resamples", "500"]) == 0
    c = json.loads(capsys.readouterr().out)
    assert c["baseline"]["runs"] == ["base-r0", "base-r1"] and c["pairs"] == 80
    assert (c["mcnemar"]["wrong_to_right"], c["mcnemar"]["right_to_wrong"]) == (20, 4)
    rank = {b["bucket"]: b for b in c["positional"]["by_gold_rank"]}
    assert (
        rank["4-10"]["baseline"]["answers"] == 80
        and rank["4-10"]["baseline"]["correct_rate"] == 0.5
    )
    assert rank["1"]["candidate"]["answers"] == 80 and rank["1"]["candidate"]["correct_rate"] == 0.9

    assert main(["doctor", *db, *sides, "--json"]) == 1
    found = {f["check"] for f in json.loads(capsys.readouterr().out)["findings"]}
    assert {"run_group", "tokens_one_side", "unreviewed_labels", "mixed_splits"} <= found
    assert main(["doctor", *db, "--run", "ctrl", "--json"]) == 1
    found = {f["check"] for f in json.loads(capsys.readouterr().out)["findings"]}
    assert "no_memory_has_context" in found

    policy = tmp_path / "policy.toml"
    policy.write_text(
        '[sample]\nmin_questions = 30\nmin_repeats = 2\nrequire_reviewed = true\nsplit = "held_out"\n'
        "[metrics.accuracy]\nmax_regression = 0.02\n"
    )
    assert main(["gate", *db, *sides, "--policy", str(policy), "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["sample"]["questions"] == 32  # 40 - 4 dev - 4 unreviewed
    assert v["sample"]["left_out"]["unreviewed_questions"] == 4
    refix = ["--baseline-group", "nightly-base", "--candidate-group", "nightly-refix"]
    assert main(["gate", *db, *refix, "--policy", str(policy), "--json"]) == 2
    assert "different fixture_checksum" in json.loads(capsys.readouterr().out)["reason"]
    assert main(["doctor", *db, *refix, "--json"]) == 1
    found = {f["check"] for f in json.loads(capsys.readouterr().out)["findings"]}
    assert "fixture_differs" in found
    policy.write_text(policy.read_text() + "[metrics.tokens]\nmax_regression = 100\n")
    assert main(["gate", *db, *sides, "--policy", str(policy), "--json"]) == 2
    assert "carry it on one side only" in json.loads(capsys.readouterr().out)["reason"]
