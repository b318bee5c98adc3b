"""``memdiag calibrate --labels``: both used/ignored rules scored on labelled pairs, and the
threshold chosen on the tune pairs only (memdiag.analytics.labels, issue #39)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memdiag.analytics import labels as lb
from memdiag.cli import main

PAIRS = Path(__file__).parents[1] / "data" / "used_pairs.jsonl"


def write(tmp_path: Path, rows: list[object]) -> Path:
    path = tmp_path / "labels.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_scores_by_hand() -> None:
    assert lb.scores(3, 1, 2, 4) == {"precision": 0.75, "recall": 0.6, "f1": 6 / 9,
                                     "tp": 3, "fp": 1, "fn": 2, "tn": 4}  # fmt: skip
    assert lb.scores(0, 0, 0, 5)["f1"] is None  # nothing used, nothing said used
    assert lb.scores(0, 2, 0, 5)["f1"] == 0.0 and lb.scores(0, 2, 0, 5)["recall"] is None


def test_the_keyword_rule_is_the_contracts() -> None:
    # keywords: rotate, signing, before, token, expires: 2 of 5 (40%) > 30%
    assert lb.keyword_used("Rotate the signing key before the token expires",
                           "the signing token was new")  # fmt: skip
    # 1 of 5 (20%)
    assert not lb.keyword_used("Rotate the signing key before the token expires", "a token")
    assert not lb.keyword_used("a b c", "a b c")  # no keyword: ignored


def test_the_threshold_is_chosen_on_the_tune_pairs_only(tmp_path: Path) -> None:
    """A hand case: the similarity is given per response. On tune, 0.50 to 0.60 separate
    perfectly and the higher end wins the tie; test pairs never move the choice."""
    sims = {"u1": 0.7, "u2": 0.6, "n1": 0.5, "n2": 0.2, "t1": 0.55, "t2": 0.99}
    rows = [
        {"memory": "zz", "response": "u1", "used": True},  # split defaults to tune
        {"memory": "zz", "response": "u2", "used": True, "split": "tune"},
        {"memory": "zz", "response": "n1", "used": False, "split": "tune"},
        {"memory": "zz", "response": "n2", "used": False, "split": "tune"},
        {"memory": "zz", "response": "t1", "used": True, "split": "test"},
        {"memory": "zz", "response": "t2", "used": False, "split": "test"},
    ]
    r = lb.evaluate(lb.load(write(tmp_path, rows)), lambda m, resp: sims[resp])
    assert r["threshold"] == 0.6 and r["tune"]["semantic"]["f1"] == 1.0
    assert r["tune"]["keyword"]["tp"] == 0 and r["tune"]["keyword"]["fn"] == 2
    assert r["test"]["semantic"] == lb.scores(0, 1, 1, 0)  # 0.55 missed, 0.99 said used
    assert [s["threshold"] for s in r["sweep"]][:3] == [0.0, 0.01, 0.02]
    assert len(r["sweep"]) == 101
    assert r["pairs_scored"][0] == {"id": "line 1", "kind": None, "split": "tune", "used": True,
                                    "keyword": False, "similarity": 0.7}  # fmt: skip


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("not json", "labels.jsonl:2: not JSON"),
        ("[1, 2]", "labels.jsonl:2: expected a JSON object a line"),
        ('{"memory": "m", "response": "r"}', "labels.jsonl:2: 'used' must be a bool"),
        ('{"memory": 1, "response": "r", "used": true}', "'memory' must be a str"),
        ('{"memory": "m", "response": "r", "used": true, "split": "dev"}',
         "'split' must be 'tune' or 'test', not 'dev'"),
    ],
)  # fmt: skip
def test_a_bad_line_is_named_with_why(tmp_path: Path, line: str, words: str) -> None:
    path = tmp_path / "labels.jsonl"
    path.write_text('{"memory": "m", "response": "r", "used": true}\n' + line + "\n")
    with pytest.raises(lb.LabelsError, match=words):
        lb.load(path)


def test_an_empty_or_missing_file_is_said(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(lb.LabelsError, match="holds no labelled pair"):
        lb.load(tmp_path / "empty.jsonl")
    with pytest.raises(lb.LabelsError, match="cannot read the labels file"):
        lb.load(tmp_path / "missing.jsonl")


def test_calibrate_labels_on_memdiags_own_pairs(capsys, tmp_path: Path) -> None:
    """The command, no database: the figures of issue #39's note, pinned (the model and the
    arithmetic are exact)."""
    assert main(["calibrate", "--labels", str(PAIRS), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    lab = r["labels"]
    assert (lab["pairs"], lab["tune_pairs"], lab["test_pairs"]) == (96, 48, 48)
    assert lab["threshold"] == 0.19
    assert round(lab["test"]["keyword"]["f1"], 3) == 0.514
    assert round(lab["test"]["semantic"]["f1"], 3) == 0.754
    kinds = {k["kind"]: k for k in lab["kinds"]}
    assert (kinds["paraphrase"]["keyword_right"], kinds["paraphrase"]["semantic_right"]) == (0, 15)
    assert kinds["topical"]["semantic_right"] == 1  # the model scores topic, not use
    assert main(["calibrate", "--labels", str(PAIRS)]) == 0
    out = capsys.readouterr().out
    assert "suggested MEMDIAG_SIMILARITY_THRESHOLD=0.19" in out and "semantic (>= 0.19)" in out
    assert main(["calibrate", "--labels", str(tmp_path / "none.jsonl")]) == 2
    assert "cannot read the labels file" in capsys.readouterr().err


def test_test_pairs_alone_cannot_choose_a_threshold(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, [{"memory": "m", "response": "r", "used": True, "split": "test"}])
    with pytest.raises(lb.LabelsError, match="every pair is a test pair"):
        lb.evaluate(lb.load(path), lambda m, r: 0.5)
    assert main(["calibrate", "--labels", str(PAIRS), "--events", str(path)]) == 2
    assert "--labels scores labelled pairs" in capsys.readouterr().err
