"""Counters (CONTRACT section 4), created through the OpenTelemetry API.

Domain code only adds to these; the process entry point decides whether an SDK
``MeterProvider`` (and which exporter) backs them. Each help text says what the number
over- or under-counts, because an alert on a proxy metric is only as good as its caveat.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import metrics

HELP: dict[str, str] = {
    "agentmemory.smart_search.calls_total": (
        "Memory searches seen, by source (agent or viewer). Counts every search event, "
        "empty results included; a redelivered event may be counted again."
    ),
    "agentmemory.smart_search.followup_within_window_total": (
        "Agent searches that followed another within AGENTMEMORY_FOLLOWUP_WINDOW_SECONDS with "
        "a different query and no result in common: a live proxy for 'the first results did "
        "not satisfy'. Overcounts genuine query refinement; a long window overcounts, a short "
        "one undercounts."
    ),
    "agentmemory.retrieval_feedback_total": (
        "Injected observations judged per evaluated turn, by signal (used or ignored): the "
        "response shares more than 30% of the observation's long words. A keyword proxy: "
        "overcounts 'used' when the agent repeats words without relying on the memory, "
        "undercounts it when the agent paraphrases; short observations without keywords "
        "always count as ignored."
    ),
    "memdiag.unmatched_turn_total": (
        "Injections or responses (by half) whose partner did not arrive within "
        "MEMDIAG_TURN_TTL_SECONDS of event time, so their observations were never judged. A "
        "TTL shorter than real turns overcounts; an injection for a turn already judged "
        "counts as an unmatched injection."
    ),
    "agentmemory.session_outcome_total": (
        "Session outcomes, by outcome and failure category (empty for accepted). Each "
        "outcome event counts once; a session reported with two outcomes counts twice."
    ),
    "agentmemory.misleading_observation_total": (
        "Observations that became misleading (in 3 or more failed sessions and no accepted "
        "one), counted once, when that happens. Undercounts memories that mislead in "
        "sessions that also succeed sometimes; a fresh state (new app id) counts again."
    ),
    "memdiag.dead_letter_total": (
        "Input events sent to the dead-letter topic, by reason. A redelivered bad message "
        "may be counted again; the dead_letters table holds each bad input once."
    ),
}

UNITS = {name: "{event}" for name in HELP}


class Counters:
    """The process's counters, created once from a meter."""

    def __init__(self, meter: metrics.Meter | None = None):
        meter = meter or metrics.get_meter("memdiag")
        self._counters = {
            name: meter.create_counter(name, unit=UNITS[name], description=text)
            for name, text in HELP.items()
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
