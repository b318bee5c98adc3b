"""The memdiag command as a user runs it: a subprocess, a file, an exit code, a DuckDB file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

pytestmark = pytest.mark.e2e

#: the contract's example events, as the project keeps them (tests/data)
EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "contract_example.jsonl"


def memdiag(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMDIAG_")}
    return subprocess.run(
        [sys.executable, "-m", "memdiag.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**clean, **(env or {})},
    )


@pytest.fixture
def small_file(tmp_path: Path) -> Path:
    lines = [
        '{"kind":"search","event_id":"e1","ts":"2026-11-21T09:30:00Z","session_id":"s1","query":"auth flow","result_ids":["o1"]}',
        '{"kind":"search","event_id":"e2","ts":"2026-11-21T09:30:30Z","session_id":"s1","query":"token expiry","result_ids":["o2"]}',
        '{"kind":"search","event_id":"e3","ts":"2026-11-21T09:30:31Z","session_id":"s1","query":"auth","result_ids":["o1"],"source":"viewer"}',
        "not json",
        '{"kind":"search","event_id":"f1","ts":"2026-11-21T09:30:00Z","session_id":"s2","query":"q","result_ids":[]}',
    ]
    lines += [line for line in EXAMPLES.read_text().splitlines() if '"judgement"' not in line]
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_run_processes_a_file_into_duckdb(small_file: Path, tmp_path: Path) -> None:
    db = tmp_path / "out.duckdb"
    result = memdiag("run", "--input", str(small_file), "--db", str(db), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["searches"] == 4 + 3  # the examples' ev-0001..ev-0003
    assert report["followups"] == 1 + 1  # e1 -> e2 (30 s, inclusive), ev-0001 -> ev-0002
    assert report["dead_letters"] == 1 and report["dead_letters_by_reason"] == {"not_json": 1}
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute(
            "SELECT is_followup, prev_event_id, gap_seconds FROM searches WHERE event_id = 'e2'"
        ).fetchall() == [(True, "e1", 30.0)]
        assert con.execute(
            "SELECT is_followup, prev_event_id FROM searches WHERE event_id = 'ev-0002'"
        ).fetchall() == [(True, "ev-0001")]
    finally:
        con.close()


def test_run_prints_a_readable_summary(small_file: Path, tmp_path: Path) -> None:
    result = memdiag("run", "--input", str(small_file), "--db", str(tmp_path / "o.duckdb"))
    assert result.returncode == 0, result.stderr
    assert "followup rate" in result.stdout and "dead letters" in result.stdout
    assert "every event is in" in result.stderr


def test_help_explains_every_command() -> None:
    result = memdiag("--help")
    assert result.returncode == 0
    for command in ("run", "demo", "worker", "sink", "publish"):
        assert command in result.stdout
    run_help = memdiag("run", "--help")
    assert (
        "--input" in run_help.stdout and "--db" in run_help.stdout and "--json" in run_help.stdout
    )


def test_missing_input_is_a_clear_error(tmp_path: Path) -> None:
    result = memdiag(
        "run", "--input", str(tmp_path / "nope.jsonl"), "--db", str(tmp_path / "x.duckdb")
    )
    assert result.returncode == 1
    assert "no such input file" in result.stderr
    said = memdiag("run", "--input", str(tmp_path / "nope.jsonl"), "--json")
    assert json.loads(said.stdout)["error"] == "path"  # a path the user gave, not the broker


def test_a_file_of_no_events_gives_an_empty_database(tmp_path: Path) -> None:
    """Not "no DuckDB file" after "every event is in": the tables exist, with nothing in."""
    empty, db = tmp_path / "empty.jsonl", tmp_path / "e.duckdb"
    empty.write_text("")
    result = memdiag("run", "--input", str(empty), "--db", str(db), "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["events"] == 0
    status = memdiag("status", "--db", str(db), "--json")
    assert status.returncode == 0, status.stderr


def test_bad_configuration_is_refused_at_start(small_file: Path, tmp_path: Path) -> None:
    result = memdiag(
        "run",
        "--input",
        str(small_file),
        env={"AGENTMEMORY_FOLLOWUP_WINDOW_SECONDS": "90000"},
    )
    assert result.returncode == 2
    assert "MEMDIAG_RECENT_SEARCH_RETENTION_HOURS" in result.stderr


def test_query_commands_answer_from_the_run(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[1] / "data" / "contract_example.jsonl"
    db = tmp_path / "q.duckdb"
    assert memdiag("run", "--input", str(example), "--db", str(db), "--quiet").returncode == 0
    stats = memdiag("query", "observation-stats", "obs_7", "--db", str(db), "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["used"] == 1
    history = json.loads(
        memdiag("query", "observation-history", "obs_9", "--db", str(db), "--json").stdout
    )
    assert [(h["session_id"], h["signal"]) for h in history] == [("ses_abc", "ignored")]
    dist = json.loads(
        memdiag(
            "query", "failure-distribution", "--org", "org_123", "--db", str(db), "--json"
        ).stdout
    )
    assert {d["failure_category"]: d["sessions"] for d in dist}["test_failure"] == 1
    misleading = memdiag("query", "misleading", "--since", "2026-11-01", "--db", str(db), "--json")
    assert misleading.returncode == 0 and json.loads(misleading.stdout) == []
    table = memdiag("query", "failure-distribution", "--db", str(db))
    assert "test_failure" in table.stdout and "unknown" in table.stdout
    bad = memdiag("query", "misleading", "--since", "last tuesday", "--db", str(db))
    assert bad.returncode == 2 and "duration back from now" in bad.stderr
    # a mistyped reason is a usage error naming what the file holds, never "all processed"
    typo = memdiag("query", "dead-letters", "--reason", "bad-ts", "--db", str(db))
    assert typo.returncode == 2 and "'bad-ts' is no dead-letter reason" in typo.stderr
    none = memdiag("query", "dead-letters", "--reason", "late_event", "--db", str(db))
    assert none.returncode == 0 and "no dead letters with reason late_event" in none.stdout


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """`memdiag demo` once for the module: its DuckDB file, its report and its output."""
    where = tmp_path_factory.mktemp("demo")
    db, page = where / "demo.duckdb", where / "demo.html"
    result = memdiag("demo", "--db", str(db), "--report", str(page), "--quiet", timeout=180)
    assert result.returncode == 0, result.stderr
    return db, page, result.stdout


def test_scores_and_compare_on_the_bundled_sample(
    demo: tuple[Path, Path, str], tmp_path: Path
) -> None:
    """The demo's two benchmark runs: scores.json valid against its schema, and a paired
    comparison that says the candidate is better and where the failures moved."""
    import jsonschema

    from memdiag.schemas import load_schema

    db, page, stdout = demo
    # the demo ends with the status screen and the report's path
    assert "followup rate" in stdout and "misleading memories" in stdout
    assert f"report: {page}" in stdout.replace("\n", "") and page.exists()
    st = json.loads(memdiag("status", "--db", str(db), "--json").stdout)
    assert [r["run_id"] for r in st["runs"]] == ["longmem-rerank", "longmem-baseline"]
    assert st["misleading"]["count"] >= 3 and st["freshness"]["newest_event"].startswith(
        "2026-11-21"
    )

    out = tmp_path / "scores.json"
    scores = memdiag(
        "report", "scores", "--run-id", "longmem-rerank", "--out", str(out), "--db", str(db)
    )
    assert scores.returncode == 0, scores.stderr
    assert "reader fail" in scores.stdout and out.exists()
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, load_schema("scores"))
    cond = doc["conditions"][0]
    assert cond["questions"] == 150 and cond["judgements"] == 300
    total = (
        cond["correct"]
        + cond["reader_failure_with_evidence"]
        + cond["retrieval_failure"]
        + cond["unattributed"]
    )
    assert total == pytest.approx(150)

    cmp = memdiag(
        "compare",
        "--baseline",
        "longmem-baseline",
        "--candidate",
        "longmem-rerank",
        "--db",
        str(db),
        "--json",
    )
    assert cmp.returncode == 0, cmp.stderr
    r = json.loads(cmp.stdout)
    assert r["delta"] > 0 and r["mcnemar"]["p_value"] < 0.05 and r["bootstrap_ci"]["low"] > 0
    assert r["verdict"].startswith("candidate is better")
    assert r["failure_mode_change"]["retrieval_failure"] < 0
    text = memdiag(
        "compare",
        "--baseline",
        "longmem-baseline",
        "--candidate",
        "longmem-rerank",
        "--db",
        str(db),
    )
    assert "McNemar" in text.stdout and "where the answers moved" in text.stdout

    missing = memdiag("report", "scores", "--run-id", "nope", "--db", str(db))
    assert missing.returncode == 1 and "longmem-rerank" in missing.stderr


def test_the_bundled_sample_gates_with_the_bundled_policy(
    demo: tuple[Path, Path, str], tmp_path: Path
) -> None:
    """The demo's runs carry provenance and graded scores, the demo suggests the gate, and
    the bundled policy passes the reranker and fails the way back."""
    db, _, stdout = demo
    assert "memdiag gate --baseline longmem-baseline --candidate longmem-rerank" in " ".join(
        stdout.split()
    )
    policy = str(Path(__file__).resolve().parents[2] / "memdiag" / "data" / "gate.toml")
    runs = json.loads(memdiag("runs", "--db", str(db), "--json").stdout)
    assert {r["suite_checksum"] for r in runs} == {"sha256:7d1e4c0b9a"}
    assert {r["config_fingerprint"] for r in runs} == {"cfg-hybrid-k8", "cfg-hybrid-k8-rerank"}
    doc = json.loads(
        memdiag("report", "scores", "--run-id", "longmem-rerank", "--db", str(db), "--json").stdout
    )
    metrics = doc["conditions"][0]["metrics"]
    assert 0 < metrics["score"]["mean"] < 1 and metrics["recall_at_5"]["questions"] == 144
    assert metrics["recall_at_1"]["mean"] <= metrics["recall_at_5"]["mean"]
    md = tmp_path / "gate.md"
    ok = memdiag("gate", "--baseline", "longmem-baseline", "--candidate", "longmem-rerank",
                 "--policy", policy, "--db", str(db), "--json", "--markdown", str(md))  # fmt: skip
    verdict = json.loads(ok.stdout)
    assert ok.returncode == 0 and verdict["verdict"] == "pass", verdict["reason"]
    assert [m["metric"] for m in verdict["metrics"]] == [
        "accuracy", "recall_at_5", "score", "latency_ms", "tokens"
    ]  # fmt: skip
    assert md.read_text().startswith("## memdiag gate: pass (exit 0)")
    back = memdiag("gate", "--baseline", "longmem-rerank", "--candidate", "longmem-baseline",
                   "--policy", policy, "--db", str(db))  # fmt: skip
    assert back.returncode == 1 and back.stdout.strip().splitlines()[-1].startswith("regression")
    usage = memdiag("gate", "--policy", policy, "--db", str(db), "--json")
    assert (
        usage.returncode == 2
        and "--baseline (or --baseline-group G) and --candidate (or --candidate-group G) required"
        in usage.stdout
    )


def test_explain_a_failed_session_of_the_bundled_sample(demo: tuple[Path, Path, str]) -> None:
    db, page, _ = demo
    result = memdiag("explain", "ses_0064", "--db", str(db), "--json")
    assert result.returncode == 0, result.stderr
    ex = json.loads(result.stdout)
    assert ex["outcome"]["outcome"] == "rejected" and ex["outcome"]["failure_category"] == "style"
    assert ex["outcome"]["rule"] == "error 'eslint: 3 problems' mentions 'eslint'"
    assert [s["is_followup"] for s in ex["searches"]] == [False, True, True]
    assert ex["searches"][1]["verdict"].startswith("followup of ev-000539, 25.355 s later")
    assert [len(t["memories"]) for t in ex["turns"]] == [4, 4, 2]
    misleading = [w["observation_id"] for w in ex["weights"] if w["misleading"]]
    assert (
        misleading
        == ex["outcome"]["misleading_observation_ids"]
        == [
            "obs_billing_03",
            "obs_billing_04",
        ]
    )
    with duckdb.connect(str(db), read_only=True) as con:
        [(never,)] = con.execute(
            "SELECT min(session_id) FROM session_diagnostics "
            "WHERE search_count = 0 AND outcome <> 'accepted'"
        ).fetchall()
    text = memdiag("explain", never, "--db", str(db))
    assert text.returncode == 0 and "never searched" in text.stdout
    # the demo's report links its latest failed sessions to their explanations
    from memdiag.views.html import anchor

    doc = page.read_text()
    assert "Latest failed sessions" in doc and doc.count("<details id=") >= 10
    [(latest,)] = (
        duckdb.connect(str(db), read_only=True)
        .execute(
            "SELECT session_id FROM session_diagnostics WHERE outcome <> 'accepted' "
            "ORDER BY ts DESC LIMIT 1"
        )
        .fetchall()
    )
    assert f'href="#{anchor(latest)}"' in doc and f'id="{anchor(latest)}"' in doc


def test_calibrate_on_the_bundled_sample(demo: tuple[Path, Path, str]) -> None:
    db, _, _ = demo
    result = memdiag("calibrate", "--db", str(db), "--json", "--resamples", "500")
    assert result.returncode == 0, result.stderr
    r = json.loads(result.stdout)
    # 300 coding sessions (150 fail) and 120 of two memory agents (68 fail, 22 in a break)
    assert r["population"]["sessions"] == 420 and r["population"]["failed"] == 218
    assert [w["window_seconds"] for w in r["windows"]] == [10, 30, 60, 120]
    # at the stream's window, the recomputation is the stream's verdict on every row
    check = r["stream_check"]
    assert (check["window_seconds"], check["checked"], check["disagree"]) == (30.0, 1114, 0)
    assert check["window_at_least"] <= 30 < check["window_below"]
    with duckdb.connect(str(db), read_only=True) as con:
        [(followups, sessions_with)] = con.execute(
            "SELECT count(*), count(DISTINCT session_id) FROM searches s "
            "JOIN session_diagnostics USING (session_id) WHERE s.is_followup"
        ).fetchall()
    stream = next(w for w in r["windows"] if w["stream"])
    assert (stream["followups"], stream["flagged"]) == (followups, sessions_with)
    for w in r["windows"]:
        ci = w["rate_auc_ci"]
        assert 0 <= ci["low"] <= w["rate_auc"] <= ci["high"] <= 1
    text = memdiag("calibrate", "--db", str(db), "--resamples", "200")
    assert "the followup window" in text.stdout and "caveats" in text.stdout


def test_publish_without_a_broker_is_one_clear_line(small_file: Path) -> None:
    result = memdiag("publish", str(small_file), env={"MEMDIAG_BROKER": "kafka://127.0.0.1:9"})
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "error:" in result.stderr and "MEMDIAG_BROKER=kafka://127.0.0.1:9" in result.stderr
    # under --json, the same error as one JSON object on stdout too
    env = {"MEMDIAG_BROKER": "kafka://127.0.0.1:9"}
    said = memdiag("publish", str(small_file), "--json", env=env)
    assert said.returncode == 1 and said.stderr.startswith("error:")
    answer = json.loads(said.stdout)
    assert (answer["status"], answer["error"]) == (1, "broker")
    assert "MEMDIAG_BROKER=kafka://127.0.0.1:9" in answer["message"]
    bad = memdiag("run", "--input", str(small_file), "--json", env={"MEMDIAG_COMMIT_BYTES": "x"})
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"] == "configuration"


def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly(
    demo: tuple[Path, Path, str],
) -> None:
    """`memdiag query dead-letters | head -c 0`: the reader is gone before the first write.
    Exit 0, nothing on stderr (no traceback, no "Exception ignored")."""
    db = str(demo[0])
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMDIAG_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "memdiag.cli", "query", "dead-letters", "--db", db, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean,
    )
    assert proc.stdout is not None
    proc.stdout.close()
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0 and stderr == b""


def test_pipeline_health_on_the_bundled_sample(demo: tuple[Path, Path, str]) -> None:
    """The demo's six memory agents: the broken two in `status` and in the report, the
    paper's shapes in `query pipeline-health`, the trends: recall decaying as the
    repetitive agent's memory grows, and the swapped embedder's fall flagged by `status`; and
    the clinical rules its names find and its presentations do not (the query-formulation
    gap)."""
    db, page, stdout = demo
    assert "memory pipeline" in stdout and "2 of 6 agents broken" in stdout
    assert "cold-notes" in stdout and "migrated-indexer" in stdout
    html = page.read_text()
    assert "Recall pipeline" in html and html.count('<b class="failed">broken</b>') == 2
    # an agent whose recall is 0% is not "ok"
    assert html.count('<b class="failed">recalls nothing</b>') == 1  # swapped-embedder
    rows = json.loads(memdiag("query", "pipeline-health", "--db", str(db), "--json").stdout)
    health = {r["agent_id"]: r for r in rows}
    assert [r["agent_id"] for r in rows][:2] == ["cold-notes", "migrated-indexer"]  # broken first
    assert health["cold-notes"]["pipeline_coverage"] == 0.0 and health["cold-notes"]["broken"]
    assert health["migrated-indexer"]["pipeline_coverage"] == pytest.approx(18 / 30)
    assert health["archivist"]["pipeline_coverage"] == 1.0
    assert health["archivist"]["semantic_recall_rate"] > 0.9
    assert health["proving-medqa"]["semantic_recall_rate"] < 0.5
    assert health["proving-medqa"]["ambient_trigger_rate"] == pytest.approx(10 / 72)
    # the repetitive names agent: its misses are its look-alikes; no agent of unique names
    assert health["proving-medqa"]["aliased_misses"] == health["proving-medqa"]["missed"] > 20
    assert health["archivist"]["aliased_misses"] == 0
    assert "aliased" in html and "Sessions during pipeline breaks" in html
    breaks = json.loads(memdiag("breaks", "--db", str(db), "--json").stdout)
    agent = next(a for a in breaks["agents"] if a["agent_id"] == "migrated-indexer")
    assert agent["difference_ci"]["low"] > 0 and not agent["too_few"]  # fails more in its break
    assert agent["breaks"] and agent["breaks"][0]["until"] is None
    em = memdiag("explain-memory", "ep-proving-medqa-004", "--agent", "proving-medqa",
                 "--db", str(db), "--json")  # fmt: skip
    assert json.loads(em.stdout)["latest"]["miss_reason"] == "aliased"
    one = memdiag("query", "pipeline-health", "--agent", "archivist", "--db", str(db))
    assert one.returncode == 0 and "archivist" in one.stdout and "cold-notes" not in one.stdout
    none = memdiag("query", "pipeline-health", "--agent", "nobody", "--db", str(db))
    assert none.returncode == 1 and "no such agent with memory events 'nobody'" in none.stderr
    assert "closest known (5 of 6)" in none.stderr  # five named, of the six agents
    st = json.loads(memdiag("status", "--db", str(db), "--json").stdout)["pipeline"]
    assert [b["agent_id"] for b in st["broken"]] == ["cold-notes", "migrated-indexer"]
    assert st["worst_coverage"]["agent_id"] == "cold-notes"
    # the trends: an embedder swap keeps coverage at 100% and takes recall to zero
    assert health["swapped-embedder"]["pipeline_coverage"] == 1.0
    assert health["swapped-embedder"]["semantic_recall_rate"] == 0.0
    assert st["recall_fell"]["agents"] == []  # all of it within the default 24h window
    hourly = json.loads(memdiag("status", "--db", str(db), "--json", "--recall-window", "1h")
                        .stdout)["pipeline"]["recall_fell"]  # fmt: skip
    assert [a["agent_id"] for a in hourly["agents"]] == ["swapped-embedder"]
    assert hourly["agents"][0]["previous_semantic_recall_rate"] > 0.8
    said = memdiag("status", "--db", str(db), "--recall-window", "1h").stdout
    said = " ".join(said.replace("│", " ").split())  # the panel's wrapped lines, as one
    assert "fell for 1 agent: swapped-embedder 89.7% → 0.0%" in said, said
    bad = memdiag("status", "--db", str(db), "--recall-window", "0h")
    assert bad.returncode == 2 and "--recall-window" in bad.stderr
    by_count = json.loads(memdiag("query", "recall-trend", "--by", "memory-count", "--agent",
                                  "proving-medqa", "--db", str(db), "--json").stdout)  # fmt: skip
    srr = [r["semantic_recall_rate"] for r in by_count]
    assert len(srr) >= 4 and srr[0] > 0.9 > 0.5 > srr[-1]  # decays as memory grows
    atr = [r["ambient_trigger_rate"] for r in by_count]
    assert atr == sorted(atr, reverse=True)  # ten names of ever more memories
    hours = memdiag("query", "recall-trend", "--by", "hour", "--db", str(db))
    assert hours.returncode == 0 and "swapped-embedder: recall by hour" in hours.stdout
    assert "Recall (SRR) by hour" in html and "Recall (SRR) by memory count" in html
    # the query-formulation gap: every rule found by its name, one in five by a presentation
    rules = health["clinical-rules"]
    assert (rules["semantic_recall_rate"], rules["probed"], rules["missed"]) == (1.0, 10, 0)
    assert (rules["task_probed"], rules["task_hits"]) == (10, 2)
    assert rules["query_formulation_gap"] == pytest.approx(0.8)
    assert all(r["task_probed"] == 0 for a, r in health.items() if a != "clinical-rules")
    assert "Recall by query source" in html and "task recall by hour" in html
    gap = memdiag("query", "pipeline-health", "--agent", "clinical-rules", "--db", str(db))
    assert "task recall" in gap.stdout and "+80 pts" in gap.stdout


def test_the_readme_otel_example_runs_as_written(tmp_path: Path) -> None:
    """README, "OpenTelemetry spans in": the toy agent and the commands after it, exactly as
    the README has them, from a checkout's root (its .venv)."""
    import re

    root = Path(__file__).resolve().parents[2]
    text = (root / "README.md").read_text()
    section = text.split("## OpenTelemetry spans in", 1)[1].split("\n## ", 1)[0]
    python = re.search(r"```python\n(.*?)```", section, re.S)
    shell = re.search(r"```sh\n(.*?)```", section, re.S)
    assert python and shell and "toy_agent.py" in shell.group(1)
    (tmp_path / "toy_agent.py").write_text(python.group(1))
    (tmp_path / ".venv").symlink_to(root / ".venv")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMDIAG_")}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", shell.group(1)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**clean, "COLUMNS": "120"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for said in ("rejected 1", "test_failure", "50.0% of 2 injected-and-answered",
                 "session conv-42 · agent coder", "mem-1", "used", "mem-2", "ignored"):  # fmt: skip
        assert said in out, said


def test_run_dead_letters_a_span_whose_ancestor_never_comes(tmp_path: Path) -> None:
    """A search whose conversation is on a parent span the file does not have: when the
    input ends, it is a dead letter with its reason, not silently nothing."""
    from tests.otel_scenario import otlp_json
    from tests.unit.test_otlp import Agent

    a = Agent()
    root = a.span("invoke_agent", 0, None, **{"gen_ai.conversation.id": "c1"})
    a.span("search_memory", 1, 2, root, **{"gen_ai.operation.name": "search_memory"})
    [search] = [s for s in a.spans if s.name == "search_memory"]  # the root never ends
    path = tmp_path / "spans.jsonl"
    path.write_bytes(otlp_json([search]) + b"\n")
    db = tmp_path / "spans.duckdb"
    done = memdiag("run", "--input", str(path), "--db", str(db), "--json", timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["span_records"] == 1 and report["dead_letters_by_reason"] == {"missing_field": 1}
    with duckdb.connect(str(db), read_only=True) as con:
        [(reason, detail)] = con.execute("SELECT reason, detail FROM dead_letters").fetchall()
    assert reason == "missing_field" and "the input ended" in detail
