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
        "Turns whose injection or response (by half) was still without its partner when the "
        "session's own clock passed it by MEMDIAG_TURN_TTL_SECONDS. The half is kept and "
        "still joins if its partner comes later, so this overcounts slow partners; a TTL "
        "shorter than real turns overcounts."
    ),
    "memdiag.late_event_total": (
        "Events too late to be applied exactly, by reason: session_forgotten (its session "
        "was idle longer than MEMDIAG_SESSION_KEEP_HOURS of processing time and forgotten: "
        "the event is dead-lettered as late_event), beyond_retention (an agent search older "
        "than the search retention behind its session's newest event: written, not judged), "
        "observation_window (a session outcome older than every step an observation still "
        "keeps in order: its weight does not take it). A redelivered event may count again."
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
    "agentmemory.reader_failure_with_evidence_total": (
        "Wrong benchmark answers whose gold evidence was all in the retrieved context (the "
        "reader failed), by run. Undercounts reader failures on questions without gold "
        "evidence (unattributed); a re-judged or redelivered answer may be counted again."
    ),
    "agentmemory.retrieval_failure_total": (
        "Wrong benchmark answers with some gold evidence missing from the context (retrieval "
        "failed), by run. Overcounts when the gold list names more evidence than the answer "
        "needs; a re-judged or redelivered answer may be counted again."
    ),
    "memdiag.dead_letter_total": (
        "Input events sent to the dead-letter topic, by reason. A redelivered bad message "
        "may be counted again; the dead_letters table holds each bad input once."
    ),
}

UNITS = {name: "{event}" for name in HELP}

#: The attributes each counter may carry; anything else is dropped by a View.
ATTRIBUTES: dict[str, frozenset[str]] = {
    "agentmemory.smart_search.calls_total": frozenset({"source"}),
    "agentmemory.smart_search.followup_within_window_total": frozenset(),
    "agentmemory.retrieval_feedback_total": frozenset({"signal"}),
    "memdiag.unmatched_turn_total": frozenset({"half"}),
    "memdiag.late_event_total": frozenset({"reason"}),
    "agentmemory.session_outcome_total": frozenset({"outcome", "failure_category"}),
    "agentmemory.misleading_observation_total": frozenset(),
    "agentmemory.reader_failure_with_evidence_total": frozenset({"run_id"}),
    "agentmemory.retrieval_failure_total": frozenset({"run_id"}),
    "memdiag.dead_letter_total": frozenset({"reason"}),
}

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
        for name, keys in ATTRIBUTES.items()
    ]


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
