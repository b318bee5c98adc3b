"""The process entry points' side of OpenTelemetry: building the SDK ``MeterProvider``.

Only entry points call :func:`install_meter_provider`; domain code uses the API. The
exporter is chosen by the standard ``OTEL_METRICS_EXPORTER`` variable, comma-separated:

- ``otlp`` (the default, as the OpenTelemetry specification says): OTLP over HTTP,
  configured by the standard ``OTEL_EXPORTER_OTLP_*`` variables (``http://localhost:4318``
  by default). ``memdiag run`` and ``demo`` default their processes to ``none`` instead:
  a one-shot local run has no collector;
- ``none``: no export (the counters still go to the ``counters`` topic);
- ``console``: printed every ``OTEL_METRIC_EXPORT_INTERVAL`` ms (60000 by default);
- ``prometheus``: a scrape endpoint on ``OTEL_EXPORTER_PROMETHEUS_HOST``:
  ``OTEL_EXPORTER_PROMETHEUS_PORT`` (``localhost``:``9464`` by default).

Views (``memdiag.streams.metrics.views``) keep each counter to its own attributes and cap their
cardinality, so an unbounded attribute (``run_id``) cannot grow the exporter's memory.
"""

from __future__ import annotations

import logging
import os

from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

log = logging.getLogger("memdiag.telemetry")


def _readers() -> list[MetricReader]:
    names = [n.strip() for n in os.environ.get("OTEL_METRICS_EXPORTER", "otlp").split(",")]
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
