"""What `pip install memdiag` gets: one package, `memdiag`, with its data files; the worker's
install without the report extra, and a clear message where a report needs it."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from memdiag.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_holds_only_the_memdiag_package(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("memdiag-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"memdiag"}
    for needed in (
        "memdiag/streams/agents.py",
        "memdiag/schemas/search.schema.json",
        "memdiag/analytics/sql/schema.sql",
        "memdiag/data/sample.jsonl",
        "memdiag/cli/__main__.py",
        "memdiag/contract/envelope.py",
    ):
        assert needed in names, needed
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    requires = [line for line in text.splitlines() if line.startswith("Requires-Dist:")]
    base = [r for r in requires if "extra ==" not in r]
    for heavy in ("numpy", "matplotlib", "jsonschema"):
        assert not any(heavy in r for r in base), heavy


def test_a_report_without_the_report_extra_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in list(sys.modules):
        if name in ("numpy", "memdiag.analytics.scores", "memdiag.analytics.stats"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "numpy", None)  # as if not installed
    code = main(["report", "scores", "--run-id", "r", "--db", str(tmp_path / "x.duckdb")])
    assert code == 1
    said = " ".join(capsys.readouterr().err.split())  # as the console wrapped it
    assert "needs numpy" in said and "pip install 'memdiag[report]'" in said
