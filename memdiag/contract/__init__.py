"""memdiag's shared vocabulary: the names two or more stages agree on, defined once.

Counter names and help texts, dead-letter reasons (docs/topics.md), outcomes, failure
categories and failure modes (docs/rules.md), the caveats of the two proxies; the envelope a
stage's logic works on is :mod:`memdiag.contract.envelope`. This package imports nothing
of the project, so every layer can import it.
"""

from __future__ import annotations

# -- counters (OpenTelemetry names; each increment is also sent on memdiag.counters) ------

SEARCH_CALLS = "agentmemory.smart_search.calls_total"
FOLLOWUPS = "agentmemory.smart_search.followup_within_window_total"
FEEDBACK = "agentmemory.retrieval_feedback_total"
FEEDBACK_RETRACTED = "agentmemory.retrieval_feedback_retracted_total"
SESSION_OUTCOMES = "agentmemory.session_outcome_total"
MISLEADING = "agentmemory.misleading_observation_total"
READER_FAILURES = "agentmemory.reader_failure_with_evidence_total"
RETRIEVAL_FAILURES = "agentmemory.retrieval_failure_total"
DEAD_LETTERS = "memdiag.dead_letter_total"
UNMATCHED_TURNS = "memdiag.unmatched_turn_total"
LATE_EVENTS = "memdiag.late_event_total"
UNINDEXED_MEMORIES = "memdiag.unindexed_memory_total"
RECALL_PROBES = "memdiag.recall_probe_total"
UNJUDGED_TURNS = "memdiag.unjudged_turn_total"

# -- what each counter says, and what it over- or under-counts --------------------------
# Its OpenTelemetry description. An alert on a proxy metric is only as good as its caveat.

#: The description of each counter (its OpenTelemetry help text).
COUNTER_HELP: dict[str, str] = {
    SEARCH_CALLS: (
        "Memory searches seen, by source (agent or viewer). Counts every search event, "
        "empty results included; a redelivered event may be counted again."
    ),
    FOLLOWUPS: (
        "Agent searches that followed another within AGENTMEMORY_FOLLOWUP_WINDOW_SECONDS with "
        "a different query and no result in common: a live proxy for 'the first results did "
        "not satisfy'. Overcounts genuine query refinement; a long window overcounts, a short "
        "one undercounts."
    ),
    FEEDBACK: (
        "Injected observations judged per evaluated turn, by signal (used or ignored): the "
        "response shares more than 30% of the observation's long words. A keyword proxy: "
        "overcounts 'used' when the agent repeats words without relying on the memory, "
        "undercounts it when the agent paraphrases; short observations without keywords "
        "always count as ignored."
    ),
    FEEDBACK_RETRACTED: (
        "Verdicts counted in retrieval_feedback_total and taken back since, by the signal "
        "taken back: a late response earlier in event time that changes a verdict, a late "
        "span that moves a memory out of a turn. Each is booked in the minute of event time "
        "of the verdict it takes back, so retrieval_feedback_total minus this counter, over "
        "any window, is the verdicts that stand (what DuckDB's retrieval_feedback holds); "
        "ignored_share is computed so. A verdict that changes counts the new one in "
        "retrieval_feedback_total."
    ),
    UNMATCHED_TURNS: (
        "Turns whose injection or response (by half) was still without its partner when the "
        "session's own clock passed it by MEMDIAG_TURN_TTL_SECONDS. The half is kept and "
        "still joins if its partner comes later, so this overcounts slow partners; a TTL "
        "shorter than real turns overcounts."
    ),
    LATE_EVENTS: (
        "Events too late to be applied exactly, by reason: session_forgotten (its session "
        "was idle longer than MEMDIAG_SESSION_KEEP_HOURS of processing time and forgotten: "
        "the event is dead-lettered as late_event), beyond_retention (an agent search older "
        "than the search retention behind its session's newest event: written, not judged), "
        "observation_window (a session outcome older than every step an observation still "
        "keeps in order: its weight does not take it). A redelivered event may count again."
    ),
    SESSION_OUTCOMES: (
        "Session outcomes, by outcome and failure category (empty for accepted). Each "
        "outcome event counts once; a session reported with two outcomes counts twice."
    ),
    MISLEADING: (
        "Observations that became misleading (in 3 or more failed sessions and no accepted "
        "one), counted once, when that happens. Undercounts memories that mislead in "
        "sessions that also succeed sometimes; a fresh state (new app id) counts again."
    ),
    READER_FAILURES: (
        "Wrong benchmark answers whose gold evidence was all in the retrieved context (the "
        "reader failed), by run. Undercounts reader failures on questions without gold "
        "evidence (unattributed); a re-judged or redelivered answer may be counted again."
    ),
    RETRIEVAL_FAILURES: (
        "Wrong benchmark answers with some gold evidence missing from the context (retrieval "
        "failed), by run. Overcounts when the gold list names more evidence than the answer "
        "needs; a re-judged or redelivered answer may be counted again."
    ),
    DEAD_LETTERS: (
        "Input events sent to the dead-letter topic, by reason. A redelivered bad message "
        "may be counted again; the dead_letters table holds each bad input once."
    ),
    UNINDEXED_MEMORIES: (
        "Memories written and not indexed within MEMDIAG_INDEX_DEADLINE_SECONDS of the "
        "agent's own event time, by agent, counted once per memory when that shows. "
        "Misses an indexer that acknowledges but stores garbage (a vector of the wrong "
        "dimension, an empty document): that memory counts as indexed; recall probes "
        "(semantic_recall_rate) catch it. Misses, until the agent's next memory event, the "
        "last memories of an agent that goes quiet: the deadline runs on its own events. "
        "Overcounts a memory whose in-time index event arrived after the agent's clock had "
        "passed its deadline. An agent that never reports indexing counts every memory. Each "
        "increment is in the minute of the agent's event time that showed it."
    ),
    RECALL_PROBES: (
        "Recall probes, by agent and hit (true or false): the probed memory in the first k "
        "results at or above the threshold. Each probe counts once, name and task probes alike "
        "(recall_by_query_source sets them apart), in the minute of its own event time, "
        "whatever its memory's other probes said (pipeline_health's SRR counts each memory's "
        "latest name probe only); a redelivered probe may count again. A miss's "
        "reason (not indexed, aliased...) is in DuckDB's recall_probes, not here: a late "
        "write can change it."
    ),
    UNJUDGED_TURNS: (
        "Turns from OpenTelemetry spans (a chat or LLM span) that injected memories but "
        "cannot be judged, by reason: no_output_messages (the span has no "
        "gen_ai.output.messages: content capture is opt-in and off) or no_text (the model "
        "answered with tool calls only). Their memories count as injected; no used or "
        "ignored verdict is made for them. Counted once per turn, when its session first "
        "sees it; a turn that gets its memories later (a late retrieval span) counts then."
    ),
}

#: The attributes each counter may carry; anything else is dropped by a View.
COUNTER_ATTRIBUTES: dict[str, frozenset[str]] = {
    SEARCH_CALLS: frozenset({"source"}),
    FOLLOWUPS: frozenset(),
    FEEDBACK: frozenset({"signal"}),
    FEEDBACK_RETRACTED: frozenset({"signal"}),
    UNMATCHED_TURNS: frozenset({"half"}),
    LATE_EVENTS: frozenset({"reason"}),
    SESSION_OUTCOMES: frozenset({"outcome", "failure_category"}),
    MISLEADING: frozenset(),
    READER_FAILURES: frozenset({"run_id"}),
    RETRIEVAL_FAILURES: frozenset({"run_id"}),
    DEAD_LETTERS: frozenset({"reason"}),
    UNINDEXED_MEMORIES: frozenset({"agent_id"}),
    RECALL_PROBES: frozenset({"agent_id", "hit"}),
    UNJUDGED_TURNS: frozenset({"reason"}),
}

#: The two proxies' caveats, as the status screen, the run summary and the report show them.
FOLLOWUP_CAVEAT = (
    "a live proxy for 'the first results did not satisfy': it also counts genuine query "
    "refinement; a longer AGENTMEMORY_FOLLOWUP_WINDOW_SECONDS counts more, a shorter fewer"
)
USED_CAVEAT = (
    "keyword overlap: a response that paraphrases a memory counts it ignored, one that "
    "repeats its words without relying on it counts it used"
)
MISLEADING_CAVEAT = (
    "co-occurrence with failure, not cause: a memory injected where the task was hard fails "
    "with it; read the sessions behind it before removing it"
)

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

#: the key, in a row trimmed to fit one Kafka message (MEMDIAG_MAX_OUTPUT_BYTES), of what was
#: trimmed: a session diagnostic's ``failure_context`` holds it (docs/topics.md)
TRUNCATED = "memdiag_truncated"

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
#: a memdiag.otlp_spans record that is no OTLP TracesData (otlp_proto or otlp_json)
NOT_OTLP = "not_otlp"
#: a valid event that arrived after its session was forgotten (see LATE_SESSION_FORGOTTEN)
LATE_EVENT = "late_event"
#: a valid event whose ``event_id`` its session already holds for an event with other content
#: (the idempotency key reused): the one taken first stays, this one is not applied
REUSED_EVENT_ID = "reused_event_id"
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
    NOT_OTLP,
    LATE_EVENT,
    REUSED_EVENT_ID,
)

#: What to do about each dead-letter reason ("" for a reason this version does not know):
#: the dead-letters page and ``memdiag query dead-letters`` say it beside the samples.
DEAD_LETTER_ADVICE = {
    TOO_LARGE: "the producer sent an event over MEMDIAG_MAX_EVENT_BYTES: trim what it carries "
    "(long texts, big id lists), or raise the limit if such events are meant",
    NOT_JSON: "the producer wrote something that is not UTF-8 JSON (a log line, a truncated "
    "write, NaN): fix its serialiser; the payload shows the bytes",
    NOT_AN_EVENT: "the message is JSON but neither an event object nor an array of them: send "
    "one event or a JSON array of events per message",
    UNKNOWN_KIND: "`kind` is none memdiag knows (a typo, or a producer newer than memdiag): "
    "see docs/events.md for the kinds",
    MISSING_FIELD: "a required field is missing: the detail names it; docs/events.md lists "
    "each kind's fields",
    WRONG_TYPE: "a field has the wrong JSON type (a number as a string, say): the detail "
    "names the field and the type it needs",
    BAD_VALUE: "a field's value is out of its range or set (an unknown outcome, a `|` in a "
    "graph edge field): the detail says which",
    BAD_TS: "`ts` is not RFC 3339 with an offset, or lies further in the future than "
    "MEMDIAG_MAX_CLOCK_SKEW_SECONDS: check the producer's clock and its timestamp format",
    ID_TOO_LONG: "an id is longer than the contract allows (event_id 128, session_id 256 "
    "characters): shorten or hash it at the producer",
    NOT_OTLP: "a record on memdiag.otlp_spans is no OTLP TracesData: point only the "
    "Collector's Kafka exporter (otlp_proto or otlp_json) at that topic",
    LATE_EVENT: "the event came after its session was forgotten (MEMDIAG_SESSION_KEEP_HOURS "
    "of processing time): find what delayed it (a stuck producer, a replay of old data), or "
    "keep sessions longer",
    REUSED_EVENT_ID: "the producer gave two different events one event_id (the idempotency "
    "key: memdiag keeps the first it took and takes the other for a redelivery unless its "
    "content differs, as here): give every event its own id (a UUID, or a hash of the "
    "event); the detail names the fields that differ",
    PROCESSING_ERROR: "memdiag failed on this input: a memdiag bug. Report it with the payload "
    "(the event is not processed until a fixed worker replays it)",
    SINK_REJECTED: "DuckDB refused a record the worker produced (a bug, or a foreign producer "
    "on memdiag.diagnostics): report it with the payload",
    "": "a reason this memdiag does not know (a newer worker?): see docs/topics.md",
}

# -- outcomes, categories, failure modes ---------------------------------------------------

ACCEPTED = "accepted"
FAILED_OUTCOMES = frozenset({"rejected", "rework"})

#: The failure categories the rule gives (docs/rules.md), first match wins in this order.
TEST_FAILURE = "test_failure"
STYLE = "style"
REGRESSION = "regression"
INCOMPLETE = "incomplete"
WRONG_APPROACH = "wrong_approach"
OTHER = "other"
#: never given by the rule: the distribution counts failed sessions whose category is
#: missing or foreign under it
UNKNOWN = "unknown"

#: Every category the distribution reports, in its order.
CATEGORIES = (TEST_FAILURE, STYLE, REGRESSION, INCOMPLETE, WRONG_APPROACH, OTHER, UNKNOWN)

READER_FAILURE = "reader_failure"
RETRIEVAL_FAILURE = "retrieval_failure"
UNATTRIBUTED = "unattributed"
FAILURE_MODES = (READER_FAILURE, RETRIEVAL_FAILURE, UNATTRIBUTED)

# -- recall pipeline health (docs/rules.md, "Recall pipeline health") ----------------------

#: A written memory's status in ``memory_pipeline``.
INDEXED = "indexed"  # a memory_indexed event names it
PENDING = "pending"  # not indexed, within the deadline of the agent's clock
UNINDEXED = "unindexed"  # not indexed, past the deadline
#: a memory_indexed event came and no memory_written (yet): kept, to join the write
NOT_WRITTEN = "not_written"
MEMORY_STATUSES = (INDEXED, PENDING, UNINDEXED, NOT_WRITTEN)

#: The diagnostics the recall pipeline stage sends (field ``kind``).
PIPELINE_BREAK = "pipeline_break"
PIPELINE_RECOVERED = "pipeline_recovered"
