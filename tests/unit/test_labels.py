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


# -- calibrate on the user's own data: what the semantic rule changes ----------------------


def _turns(tmp_path: Path, pairs: list[tuple[str, str]]) -> Path:
    """An events file of one turn per (memory, response) pair, in the order given."""
    lines = []
    for i, (memory, response) in enumerate(pairs):
        base = {"ts": f"2026-11-21T10:{i // 60:02d}:{i % 60:02d}Z", "session_id": f"s{i:03d}",
                "turn_id": "t1"}  # fmt: skip
        lines.append({**base, "kind": "injection", "event_id": f"i{i}",
                      "observations": [{"id": f"o{i}", "content": memory}]})  # fmt: skip
        lines.append({**base, "kind": "response", "event_id": f"r{i}", "text": response})
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_the_semantic_reading_of_an_events_file_counts_what_it_turns(tmp_path: Path) -> None:
    """Each pair keeps its keyword verdict; the similarity turns an ignored one into used at
    the threshold and at each other one; the figures are an independent count's."""
    import numpy as np

    from memdiag.analytics.readings import semantic_reading

    rows = [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]
    pairs = [(r["memory"], r["response"]) for r in rows]
    score = {pair: (i * 37 % 100) / 100 for i, pair in enumerate(pairs)}  # any function
    got = semantic_reading(_turns(tmp_path, pairs), 0.19, lambda m, r: score[(m, r)])
    by_words = [lb.keyword_used(m, r) for m, r in pairs]
    ignored = [score[p] for p, used in zip(pairs, by_words, strict=True) if not used]
    assert got["judged"] == len(pairs) and got["used_keyword"] == sum(by_words)
    assert got["ignored_to_used"] == sum(s >= 0.19 for s in ignored)
    assert got["used_semantic"] == got["used_keyword"] + got["ignored_to_used"]
    assert {a["threshold"]: a["ignored_to_used"] for a in got["at_thresholds"]} == {
        t: sum(s >= t for s in ignored) for t in (0.1, 0.15, 0.19, 0.25, 0.3, 0.4, 0.5)
    }
    dist = got["similarity"]["keyword_ignored"]
    assert dist["n"] == len(ignored) and dist["min"] == min(ignored)
    assert dist["median"] == pytest.approx(float(np.median(ignored)))
    sims = [e["similarity"] for e in got["examples"]]
    assert sims == sorted(sims) and sims[0] == min(s for s in ignored if s >= 0.19)
    assert got["skipped"] == {"not_json": 0, "bad_ts": 0, "unpaired_turns": 0}


def test_calibrate_events_reads_the_file_with_the_semantic_rule(tmp_path: Path) -> None:
    """The command, on memdiag's own labelled pairs as an events file: the paraphrases the
    keyword rule calls ignored are the flips; without the model, the rest still answers."""
    import subprocess
    import sys

    from tests.unit.test_sessions import into_duckdb, session

    db = tmp_path / "d.duckdb"
    into_duckdb(db, *(session(f"s{i}", "accepted", ["a"]) for i in range(3)))
    rows = [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]
    events = _turns(tmp_path, [(r["memory"], r["response"]) for r in rows])

    def run(*env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "memdiag.cli", "calibrate", "--db", str(db), "--events",
             str(events), "--resamples", "0", "--json"],
            capture_output=True, text=True, timeout=120,
            env={"PATH": "/usr/bin:/bin", **dict(e.split("=", 1) for e in env)},
        )  # fmt: skip

    done = run()
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout)["semantic_reading"]
    assert r["threshold"] == 0.19 and r["model"]["package"] == "wordllama"
    kw = {k: sum(lb.keyword_used(x["memory"], x["response"]) for x in rows if x["kind"] == k)
          for k in ("paraphrase",)}  # fmt: skip
    assert kw == {"paraphrase": 0} and r["judged"] == 96
    assert r["ignored_to_used"] >= 15  # the 16 paraphrases but p017, and topical pairs
    higher = json.loads(run("MEMDIAG_SIMILARITY_THRESHOLD=0.5").stdout)["semantic_reading"]
    assert higher["threshold"] == 0.5 and higher["ignored_to_used"] < r["ignored_to_used"]
    assert json.loads(done.stdout)["semantic"] is None  # the worker ran the keyword rule


def test_without_the_model_the_reading_says_what_to_install(monkeypatch, tmp_path: Path) -> None:
    """Not installed: what to install (not a word of MEMDIAG_DETECTOR, which a keyword user
    never set); installed but refused at load (another version's weights): why."""
    from memdiag import semantic
    from memdiag.views import questions

    events = str(_turns(tmp_path, [("a", "b")]))
    monkeypatch.setattr(semantic, "installed", lambda: False)
    got = questions._semantic_reading(events, 0.19)
    assert got["unavailable"].endswith("pip install 'memdiag[semantic]'")
    assert "MEMDIAG_DETECTOR" not in got["unavailable"]

    def refused(*args: object) -> None:
        raise semantic.ModelMissing("x.safetensors is not the file memdiag was tested with")

    monkeypatch.setattr(semantic, "installed", lambda: True)
    monkeypatch.setattr(semantic, "embedder", refused)
    got = questions._semantic_reading(events, 0.19)
    assert got == {"unavailable": "x.safetensors is not the file memdiag was tested with"}


def test_calibrate_says_when_its_filters_leave_no_semantic_verdict(tmp_path: Path) -> None:
    """Org a's sessions were judged under the semantic rule, org b's under the keyword rule:
    calibrate --org b says none of the file's semantic verdicts are b's."""
    import subprocess
    import sys

    from tests.unit.test_sessions import SEMANTIC, Worker, into_duckdb, session

    def of(org: str, n: int) -> list:
        return [
            {**e, "org_id": org}
            for i in range(n)
            for e in session(f"{org}{i}", "rework", [f"m{i}"])
        ]

    db = tmp_path / "d.duckdb"
    sink = into_duckdb(db, of("a", 3), settings=SEMANTIC)
    w = Worker()
    w.publish(of("b", 3))
    sink.write([*w.records, *w.weights])

    def calibrate(*args: str) -> dict:
        done = subprocess.run(
            [sys.executable, "-m", "memdiag.cli", "calibrate", "--db", str(db), "--resamples",
             "0", "--json", *args],
            capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert calibrate("--org", "b")["semantic"] == {"verdicts": 0, "in_file": 3}
    assert calibrate("--org", "a")["semantic"]["verdicts"] == 3
    text = subprocess.run(
        [sys.executable, "-m", "memdiag.cli", "calibrate", "--db", str(db), "--resamples", "0",
         "--org", "b"], capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    ).stdout  # fmt: skip
    assert "with these filters (3 in the file)" in text


def test_calibrate_on_semantic_verdicts_in_duckdb(tmp_path: Path) -> None:
    """Verdicts the worker gave under MEMDIAG_DETECTOR=semantic: how many the similarity
    alone made used, and the similarity of each signal and rule, as a recount of the rows
    with the explain's rule (memdiag.analytics.explain.verdict_rule) and numpy gives."""
    import duckdb
    import numpy as np

    from memdiag.analytics.calibrate import semantic_verdicts
    from memdiag.analytics.explain import verdict_rule
    from tests.unit.test_sessions import SEMANTIC, into_duckdb

    rows = [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]
    events = [json.loads(line) for line in _turns(tmp_path, [(r["memory"], r["response"])
                                                              for r in rows]).read_text().split("\n") if line]  # fmt: skip
    db = tmp_path / "s.duckdb"
    into_duckdb(db, events, settings=SEMANTIC)
    with duckdb.connect(str(db), read_only=True) as con:
        got = semantic_verdicts(con)
        stored = [
            dict(zip(("signal", "similarity", "matched_count", "keyword_count", "detector"), r,
                     strict=True))
            for r in con.execute("SELECT signal, similarity, matched_count, keyword_count, "
                                 "detector FROM retrieval_feedback").fetchall()
        ]  # fmt: skip
        assert semantic_verdicts(con, org="nobody") is None
    assert got is not None and got["verdicts"] == len(stored) == 96
    rules = [verdict_rule(v) for v in stored]
    assert got["ignored_to_used"] == rules.count("similarity") >= 15
    assert got["used_by_keyword"] == rules.count("keyword")
    assert got["ignored"] == rules.count("neither")
    for rule, d in got["similarity_by_rule"].items():
        sims = [v["similarity"] for v, r in zip(stored, rules, strict=True) if r == rule]
        assert d["n"] == len(sims) and d["max"] == max(sims)
        assert d["p25"] == pytest.approx(float(np.percentile(sims, 25)), abs=1e-6)
    assert got["similarity"]["ignored"]["max"] < 0.19 <= got["similarity"]["used"]["min"]
