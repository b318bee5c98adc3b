"""Where the product contract is: ``../shared/CONTRACT.md`` beside the checkout, or
``MEMDIAG_CONTRACT``. tests/spec runs only when it is there."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = Path(os.environ.get("MEMDIAG_CONTRACT") or ROOT.parent / "shared" / "CONTRACT.md")
SHARED = CONTRACT.parent
