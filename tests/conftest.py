from __future__ import annotations

import os

# Tests never export telemetry, whatever the developer's shell says.
os.environ.setdefault("OTEL_METRICS_EXPORTER", "none")
