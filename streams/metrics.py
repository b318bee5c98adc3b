"""Counters (docs/topics.md), created through the OpenTelemetry API.

Domain code only adds to these; the process entry point decides whether an SDK
``MeterProvider`` (and which exporter) backs them. Each help text says what the number
over- or under-counts, because an alert on a proxy metric is only as good as its caveat.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics

from memdiag.contract import COUNTER_ATTRIBUTES, COUNTER_HELP

UNITS = {name: "{event}" for name in COUNTER_HELP}

#: Most distinct attribute sets a counter exports per collection; ``run_id`` is the only
#: open-ended attribute, and a long-lived worker sees an unbounded number of runs.
CARDINALITY_LIMIT = 200


def views() -> list[Any]:
    """SDK Views: an attribute allowlist and a cardinality cap per counter (entry points)."""
    from opentelemetry.sdk.metrics.view import View

    return [
        View(
            instrument_name=name,
            attribute_keys=set(keys),
            aggregation_cardinality_limit=CARDINALITY_LIMIT,
        )
        for name, keys in COUNTER_ATTRIBUTES.items()
    ]


class Counters:
    """The process's counters, created once from a meter."""

    def __init__(self, meter: metrics.Meter | None = None):
        meter = meter or metrics.get_meter("memdiag")
        self._counters = {
            name: meter.create_counter(name, unit=UNITS[name], description=text)
            for name, text in COUNTER_HELP.items()
        }

    def add_all(self, counts: Mapping[tuple[str, tuple[tuple[str, str], ...]], int]) -> None:
        for (name, attrs), value in counts.items():
            counter = self._counters.get(name)
            if counter is not None and value:
                counter.add(value, dict(attrs))

    def names(self) -> list[str]:
        return list(self._counters)


def attributes(**attrs: Any) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in attrs.items()))
