"""tests/spec compares the project's docs and data with the product contract it was built
from (see ``tests/spec/__init__.py``). Without it nothing here is collected; the header of
the run says so (tests/conftest.py)."""

from __future__ import annotations

from tests.spec import CONTRACT

if not CONTRACT.is_file():
    collect_ignore_glob = ["test_*.py"]
