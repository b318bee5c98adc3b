"""memdiag's shared vocabulary: the names two or more stages agree on, defined once.

Counter names (CONTRACT section 4), dead-letter reasons (section 6), outcomes, failure
categories and failure modes (section 3). This module imports nothing of the project, so
every layer can import it.
"""

from __future__ import annotations

# -- counters (OpenTelemetry names; each increment is also sent on memdiag.counters) ------

SEARCH_CALLS = "agentmemory.smart_search.calls_total"
FOLLOWUPS = "agentmemory.smart_search.followup_within_window_total"
FEEDBACK = "agentmemory.retrieval_feedback_total"
SESSION_OUTCOMES = "agentmemory.session_outcome_total"
MISLEADING = "agentmemory.misleading_observation_total"
READER_FAILURES = "agentmemory.reader_failure_with_evidence_total"
RETRIEVAL_FAILURES = "agentmemory.retrieval_failure_total"
DEAD_LETTERS = "memdiag.dead_letter_total"
UNMATCHED_TURNS = "memdiag.unmatched_turn_total"
LATE_EVENTS = "memdiag.late_event_total"

# -- why an event arrived too late to be applied exactly (late_event_total{reason}) -------

#: an event for a session whose state was already forgotten (no event for
#: MEMDIAG_SESSION_KEEP_HOURS of processing time): dead-lettered, never applied
LATE_SESSION_FORGOTTEN = "session_forgotten"
#: an agent search more than the search retention behind its session's newest event: it is
#: written and counted, but not judged (its predecessor is no longer remembered)
LATE_BEYOND_RETENTION = "beyond_retention"
#: a session outcome older than every step an observation still keeps in order: the
#: observation's weight and counts do not take it
LATE_OBSERVATION_WINDOW = "observation_window"

# -- dead-letter reasons (the `reason` column and dead_letter_total{reason}) -------------

TOO_LARGE = "too_large"
NOT_JSON = "not_json"
NOT_AN_EVENT = "not_an_event"
UNKNOWN_KIND = "unknown_kind"
MISSING_FIELD = "missing_field"
WRONG_TYPE = "wrong_type"
BAD_VALUE = "bad_value"
BAD_TS = "bad_ts"
ID_TOO_LONG = "id_too_long"
#: a valid event that arrived after its session was forgotten (see LATE_SESSION_FORGOTTEN)
LATE_EVENT = "late_event"
#: the worker raised on a message: a memdiag bug, never bad input
PROCESSING_ERROR = "processing_error"
#: a record the worker produced but DuckDB refused (a bug or a foreign producer)
SINK_REJECTED = "sink_rejected"

#: reasons that describe the input itself (what a producer must fix)
INPUT_REASONS = (
    TOO_LARGE,
    NOT_JSON,
    NOT_AN_EVENT,
    UNKNOWN_KIND,
    MISSING_FIELD,
    WRONG_TYPE,
    BAD_VALUE,
    BAD_TS,
    ID_TOO_LONG,
    LATE_EVENT,
)

# -- outcomes, categories, failure modes ---------------------------------------------------

ACCEPTED = "accepted"
FAILED_OUTCOMES = frozenset({"rejected", "rework"})

#: Every category the distribution reports, in the contract's order. ``unknown`` is never
#: produced by the rule; it counts failed sessions whose category is missing or foreign.
CATEGORIES = (
    "test_failure",
    "style",
    "regression",
    "incomplete",
    "wrong_approach",
    "other",
    "unknown",
)

READER_FAILURE = "reader_failure"
RETRIEVAL_FAILURE = "retrieval_failure"
UNATTRIBUTED = "unattributed"
FAILURE_MODES = (READER_FAILURE, RETRIEVAL_FAILURE, UNATTRIBUTED)
