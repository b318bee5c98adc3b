"""The bundled demo sample is exactly what the script in the repo makes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bundled_sample_is_reproducible(tmp_path: Path) -> None:
    out = tmp_path / "sample.jsonl"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "make_sample.py"), str(out)],
        check=True,
        capture_output=True,
    )
    assert out.read_bytes() == (ROOT / "memdiag" / "data" / "sample.jsonl").read_bytes()
