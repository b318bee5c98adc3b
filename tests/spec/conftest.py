"""tests/spec compares the project's docs and data with the product contract it was built
from, ``../shared/CONTRACT.md`` beside the checkout (or ``MEMDIAG_CONTRACT``). Without it,
nothing here is collected, and the header of the run says so."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = Path(os.environ.get("MEMDIAG_CONTRACT") or ROOT.parent / "shared" / "CONTRACT.md")
SHARED = CONTRACT.parent

if not CONTRACT.is_file():
    collect_ignore_glob = ["test_*.py"]


def pytest_report_header(config: pytest.Config) -> str:
    if CONTRACT.is_file():
        return f"tests/spec: against {CONTRACT}"
    return f"tests/spec: skipped, no contract at {CONTRACT} (set MEMDIAG_CONTRACT to run them)"
