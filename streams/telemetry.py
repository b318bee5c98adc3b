"""The process entry points' side of OpenTelemetry: building the SDK ``MeterProvider``.

Only entry points call :func:`install_meter_provider`; domain code uses the API. The
exporter is chosen by the standard ``OTEL_METRICS_EXPORTER`` variable, comma-separated:

- unset, or ``none``: no export (the counters still go to the ``counters`` topic). The
  OpenTelemetry specification defaults to ``otlp``; memdiag does not, as docs/topics.md
  promises: a worker started with only ``MEMDIAG_BROKER`` has no collector to talk to, and
  would log a failed export every interval. It says once, at start, how to turn export on;
- ``otlp``: OTLP over HTTP, configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables
  (``http://localhost:4318`` by default). A collector that is away is logged at its first
  failed export and then at most once every :data:`QUIET_SECONDS`, with how many failures
  were not logged meanwhile;
- ``console``: printed every ``OTEL_METRIC_EXPORT_INTERVAL`` ms (60000 by default);
- ``prometheus``: a scrape endpoint on ``OTEL_EXPORTER_PROMETHEUS_HOST``:
  ``OTEL_EXPORTER_PROMETHEUS_PORT`` (``localhost``:``9464`` by default).

Views (``memdiag.streams.metrics.views``) keep each counter to its own attributes and cap their
cardinality, so an unbounded attribute (``run_id``) cannot grow the exporter's memory.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

log = logging.getLogger("memdiag.telemetry")

#: a failing OTLP export is logged once, then at most once in this many seconds
QUIET_SECONDS = 600.0
#: the logger the OTLP/HTTP metric exporter (and its HTTP client) log failures to
OTLP_LOGGER = "opentelemetry.exporter.otlp.proto.http.metric_exporter"


class Quieter(logging.Filter):
    """Lets a logger's warnings through once per ``every`` seconds: the first at once, the
    next with how many were held back meanwhile. A collector that is down for an hour is
    then a few lines, not one every export interval (and every retry of it)."""

    def __init__(self, every: float = QUIET_SECONDS, clock: Any = time.monotonic):
        super().__init__()
        self.every, self.clock = every, clock
        self.last: float | None = None
        self.held = 0
        self._lock = threading.Lock()  # the exporter's thread and the shutdown's

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        with self._lock:
            now = self.clock()
            if self.last is not None and now - self.last < self.every:
                self.held += 1
                return False
            if self.held and self.last is not None:
                said = record.getMessage()  # formatted once here: the count goes after it
                record.msg = (
                    f"{said} ({self.held} more not logged in the last {now - self.last:.0f} s)"
                )
                record.args = None
            self.last, self.held = now, 0
            return True


def _readers() -> list[MetricReader]:
    given = os.environ.get("OTEL_METRICS_EXPORTER")
    if given is None:
        log.info(
            "OpenTelemetry export off (OTEL_METRICS_EXPORTER unset): the counters go to the "
            "counters topic only; set OTEL_METRICS_EXPORTER=otlp, console or prometheus to "
            "export them"
        )
        return []
    names = [n.strip() for n in given.split(",")]
    readers: list[MetricReader] = []
    for name in names:
        if name in ("", "none"):
            continue
        if name == "console":
            readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
        elif name == "prometheus":
            reader = _prometheus()
            if reader is not None:
                readers.append(reader)
        elif name == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                    OTLPMetricExporter,
                )
            except ImportError:
                log.warning(
                    "OTEL_METRICS_EXPORTER=otlp but opentelemetry-exporter-otlp-proto-http is "
                    "not installed; pip install it to export over OTLP"
                )
                continue
            quiet = logging.getLogger(OTLP_LOGGER)
            if not any(isinstance(f, Quieter) for f in quiet.filters):
                quiet.addFilter(Quieter())
            readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
        else:
            log.warning(
                "unknown OTEL_METRICS_EXPORTER %r ignored (use console, otlp or prometheus)", name
            )
    return readers


def _prometheus() -> MetricReader | None:
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server
    except ImportError:
        log.warning(
            "OTEL_METRICS_EXPORTER=prometheus but opentelemetry-exporter-prometheus is not "
            "installed; pip install it to serve /metrics"
        )
        return None
    host = os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "localhost")
    port = int(os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464"))
    start_http_server(port, addr=host)
    log.info("prometheus metrics on http://%s:%d/metrics", host, port)
    return PrometheusMetricReader()


def install_meter_provider(service_name: str) -> tuple[MeterProvider, bool]:
    """Build and install the global provider; also say whether anything exports it."""
    from memdiag.streams.metrics import views

    readers = _readers()
    provider = MeterProvider(
        metric_readers=readers,
        resource=Resource.create({"service.name": service_name}),
        views=views(),
    )
    metrics.set_meter_provider(provider)
    return provider, bool(readers)
