from __future__ import annotations

import os

# Tests never export telemetry, whatever the developer's shell says.
os.environ.setdefault("OTEL_METRICS_EXPORTER", "none")


def pytest_report_header(config: object) -> str:
    from tests.spec import CONTRACT

    if CONTRACT.is_file():
        return f"tests/spec: against {CONTRACT}"
    return (
        f"tests/spec: skipped, no product contract at {CONTRACT} (MEMDIAG_CONTRACT to point at one)"
    )
