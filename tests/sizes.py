"""How hard the slowest property tests look. ``make test`` runs each at its everyday number
of examples; ``make chaos`` (``MEMDIAG_CHAOS=full``) at four times it, with the full-size
fault runs. Hypothesis draws new examples on every run, so the everyday size still
explores, run after run."""

from __future__ import annotations

import os

FULL = os.environ.get("MEMDIAG_CHAOS") == "full"


def examples(n: int) -> int:
    """``n`` examples, four times as many under ``make chaos``."""
    return n * 4 if FULL else n
