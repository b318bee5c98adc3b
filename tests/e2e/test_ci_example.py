"""The README's worked CI example, run as GitHub Actions would run it: its YAML parsed, its
``run:`` steps executed in order by bash with a stand-in benchmark harness. A candidate that
holds up passes the gate (exit 0); one that regresses fails it (exit 1), and the verdict is
posted on the job's summary either way. This is also the e2e test of publish -> gate: the
judgements go through the embedded broker, the worker and the sink into DuckDB."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / "examples" / "github-actions" / "memdiag-gate.yml"
HARNESS = ROOT / "tests" / "data" / "ci" / "harness.py"
POLICY = ROOT / "memdiag" / "data" / "gate.toml"

RELEASED = "recall = 0.70\nreader = 0.85\n"
CANDIDATES = {
    # a reranker: finds the gold more often, costs 120 ms and 200 tokens
    "holds_up": "recall = 0.90\nreader = 0.85\nextra_ms = 120\nextra_tokens = 200\n",
    # a cheaper index that loses the evidence
    "regresses": "recall = 0.45\nreader = 0.85\n",
}


def steps() -> list[dict]:
    doc = yaml.safe_load(WORKFLOW.read_text())
    # YAML 1.1 reads the key `on` as True
    assert doc.get("on", doc.get(True)) == {"pull_request": None}
    (job,) = doc["jobs"].values()
    return job["steps"]


def test_the_readme_shows_the_workflow_as_it_is() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", readme, re.S)
    assert WORKFLOW.read_text() in blocks, "README's CI example differs from " + str(WORKFLOW)


def run_workflow(work: Path, candidate: str) -> list[tuple[str, int, str]]:
    """Each run: step as Actions runs it (bash -e, stop at the first failure but for
    `if: always()` steps and `continue-on-error` ones): (name, exit status, output)."""
    shutil.copy(HARNESS, work / "bench" / "harness.py")
    (work / "bench" / "released.toml").write_text(RELEASED)
    (work / "memory.toml").write_text(CANDIDATES[candidate])
    shutil.copy(POLICY, work / ".github" / "memdiag-gate.toml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMDIAG_")}
    env |= {
        "GITHUB_SHA": f"sha-{candidate}",
        "GITHUB_STEP_SUMMARY": str(work / "summary.md"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    }
    done: list[tuple[str, int, str]] = []
    failed = False
    for step in steps():
        if "run" not in step or step["name"].startswith("Install"):
            continue  # `uses:` steps, and the install this test's environment already has
        if failed and step.get("if") != "always()":
            continue
        p = subprocess.run(
            ["bash", "-e", "-c", step["run"]],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        done.append((step["name"], p.returncode, p.stdout + p.stderr))
        if p.returncode and not step.get("continue-on-error"):
            failed = True
    return done


@pytest.mark.parametrize(("candidate", "status"), [("holds_up", 0), ("regresses", 1)])
def test_the_worked_ci_example_gates_a_pull_request(
    tmp_path: Path, candidate: str, status: int
) -> None:
    for d in ("bench", ".github"):
        (tmp_path / d).mkdir()
    done = run_workflow(tmp_path, candidate)
    by_name = {name: (rc, out) for name, rc, out in done}
    gate = next(name for name in by_name if name.startswith("Gate"))
    rc, out = by_name[gate]
    assert rc == status, out
    for name, code, text in done:
        if name != gate and not name.startswith("What would"):
            assert code == 0, f"{name}: {text}"
    summary = (tmp_path / "summary.md").read_text()
    word = "pass" if status == 0 else "regression"
    assert summary.startswith(f"## memdiag gate: {word} (exit {status})")
    assert "| accuracy |" in summary and "| recall_at_5 |" in summary
    assert out.strip().splitlines()[-1].startswith(f"{word}")
