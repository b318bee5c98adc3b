"""The process entry points' side of OpenTelemetry: building the SDK ``MeterProvider``.

Only entry points call :func:`install_meter_provider`; domain code uses the API. The
exporter is chosen by the standard ``OTEL_METRICS_EXPORTER`` variable: ``none`` (the
default here: counters still go to the counter topic), ``console``, or ``otlp`` (configured
by the standard ``OTEL_EXPORTER_OTLP_*`` variables, if the exporter package is installed).
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
    names = [n.strip() for n in os.environ.get("OTEL_METRICS_EXPORTER", "none").split(",")]
    readers: list[MetricReader] = []
    for name in names:
        if name in ("", "none"):
            continue
        if name == "console":
            readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter()))
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
            log.warning("unknown OTEL_METRICS_EXPORTER %r ignored (use console or otlp)", name)
    return readers


def install_meter_provider(service_name: str) -> MeterProvider:
    provider = MeterProvider(
        metric_readers=_readers(),
        resource=Resource.create({"service.name": service_name}),
    )
    metrics.set_meter_provider(provider)
    return provider
