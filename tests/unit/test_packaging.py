"""What `pip install memdiag` gets: one package, `memdiag`, with its data files; the worker's
install without the report extra, and a clear message where a report needs it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tracked_copy(target: Path) -> Path:
    """The files git tracks (and the generated ones beside them), so no build/ left over
    from an earlier build can leak into the wheel and nothing is written to the checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    for rel in listed:
        if (ROOT / rel).is_file():
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, target / rel)
    return target


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """memdiag's wheel, built once for this module from a copy of the tracked files."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    source = tracked_copy(tmp_path / "src")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = tmp_path.glob("memdiag-*.whl")
    return built


def test_the_wheel_holds_only_the_memdiag_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"memdiag"}
    for needed in (
        "memdiag/streams/wiring.py",
        "memdiag/schemas/search.schema.json",
        "memdiag/analytics/sql/schema.sql",
        "memdiag/data/sample.jsonl",
        "memdiag/data/gate.toml",  # the example policy `memdiag demo` suggests
        "memdiag/cli/__main__.py",
        "memdiag/contract/envelope.py",
        "memdiag/views/static/live.js",  # memdiag serve's assets: never from a CDN
        "memdiag/views/static/memdiag.css",
        "memdiag/views/static/favicon.svg",
        "memdiag/py.typed",  # a runtime's type checker reads memdiag.client's types
        "memdiag/events.py",
    ):
        assert needed in names, needed
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    requires = [line for line in text.splitlines() if line.startswith("Requires-Dist:")]

    def name(requirement: str) -> str:
        spec = requirement.split(":", 1)[1].strip()
        return re.split(r"[\s<>=!~;\[(]", spec, maxsplit=1)[0].lower()

    base = {name(r) for r in requires if "extra ==" not in r}
    assert "fastjsonschema" in base
    assert not base & {"numpy", "matplotlib", "jsonschema", "scipy"}, base
    report = {name(r) for r in requires if 'extra == "report"' in r}
    assert report == {"numpy"}, report  # the charts are memdiag's own SVG
    serve = {name(r) for r in requires if 'extra == "serve"' in r}
    assert serve == {"memdiag", "starlette", "uvicorn"}, serve


def test_a_runtime_type_checks_against_the_installed_wheel_under_mypy_strict(
    wheel: Path, tmp_path: Path
) -> None:
    """examples/runtime/typed_runtime.py imports the client and the event models; mypy
    --strict finds them typed in the installed package (py.typed), and catches an event
    with a misspelt kind or a missing field."""
    pytest.importorskip("mypy", reason="mypy (the dev extra) checks the types")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # as pip installs it, without its scripts
    sample = ROOT / "examples" / "runtime" / "typed_runtime.py"
    wrong = tmp_path / "wrong_runtime.py"
    wrong.write_text(
        "from memdiag.client import Publisher\n"
        "from memdiag.events import SearchEvent\n"
        'e: SearchEvent = {"kind": "serch", "event_id": "e", "ts": "t", "session_id": "s",\n'
        '                  "query": "q", "result_ids": []}\n'
        'f: SearchEvent = {"kind": "search", "event_id": "e", "ts": "t", "session_id": "s",\n'
        '                  "query": "q"}\n'
        "Publisher().publish(e)\n"
    )

    def mypy(path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
             "--cache-dir", str(tmp_path / "cache"), str(path)],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    ok = mypy(sample)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = mypy(wrong)
    assert bad.returncode == 1, bad.stdout
    assert "'serch'" in bad.stdout and '"result_ids"' in bad.stdout, bad.stdout
    (site / "memdiag" / "py.typed").unlink()  # and without the marker it would not be typed
    untyped = mypy(sample)
    assert "missing library stubs or py.typed marker" in untyped.stdout, untyped.stdout


def test_a_report_without_the_report_extra_says_what_to_install(tmp_path: Path) -> None:
    """In a fresh interpreter where numpy cannot be imported, as after `pip install memdiag`."""
    code = (
        "import sys; sys.modules['numpy'] = None\n"
        "from memdiag.cli import main\n"
        f"sys.exit(main(['report', 'scores', '--run-id', 'r', '--db', {str(tmp_path / 'x.duckdb')!r}]))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    said = " ".join(result.stderr.split())  # as the console wrapped it
    assert result.returncode == 1, result.stderr
    assert "needs numpy" in said and "pip install 'memdiag[report]'" in said, said
