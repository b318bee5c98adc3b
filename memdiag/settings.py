"""The one settings object: every knob memdiag reads from the environment, in one place.

Each field documents its environment variable and its default. Nothing here connects to
anything; building a ``Settings`` only reads ``os.environ`` (or the mapping you pass).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from memdiag.contract.words import DETECTORS


class ConfigError(ValueError):
    """A setting is invalid; the message names the variable and what to do."""


@dataclass(frozen=True, slots=True)
class Topics:
    """Topic names, all derived from one prefix (docs/topics.md)."""

    prefix: str

    @property
    def events(self) -> str:
        return f"{self.prefix}events"

    @property
    def judgements(self) -> str:
        return f"{self.prefix}judgements"

    @property
    def diagnostics(self) -> str:
        return f"{self.prefix}diagnostics"

    @property
    def weights(self) -> str:
        return f"{self.prefix}weights"

    @property
    def graph_weights(self) -> str:
        """Graph entity and edge weights, keyed ``entity:ID`` or
        ``edge:SOURCE|TARGET|RELATIONSHIP``, for a graph-backed memory system to apply."""
        return f"{self.prefix}graph_weights"

    @property
    def counters(self) -> str:
        return f"{self.prefix}counters"

    @property
    def deadletter(self) -> str:
        return f"{self.prefix}deadletter"

    @property
    def memory(self) -> str:
        """The recall pipeline's events (written, indexed, probes, ambient context), keyed
        by agent_id."""
        return f"{self.prefix}memory"

    @property
    def otlp_spans(self) -> str:
        """OpenTelemetry spans, as the Collector's Kafka exporter writes them (one OTLP
        TracesData a record, otlp_proto or otlp_json), keyed by trace id or not at all."""
        return f"{self.prefix}otlp_spans"

    @property
    def otlp_traces(self) -> str:
        """Internal: the spans of one trace (memdiag's span records), keyed by trace id."""
        return f"{self.prefix}internal.otlp-traces"

    @property
    def span_events(self) -> str:
        """Internal: what spans say of one session (searches, turns, outcomes), keyed by
        session id, for the session stage."""
        return f"{self.prefix}internal.span-events"

    @property
    def observation_steps(self) -> str:
        """Internal: one session outcome's step for one observation, keyed by observation id."""
        return f"{self.prefix}internal.observation-steps"

    @property
    def session_verdicts(self) -> str:
        """Internal: a session's draft diagnostic and its observations' verdicts, keyed by
        session id, gathered into the final ``session_diagnostic``."""
        return f"{self.prefix}internal.session-verdicts"

    def all(self) -> tuple[str, ...]:
        return (
            self.events,
            self.judgements,
            self.memory,
            self.otlp_spans,
            self.diagnostics,
            self.weights,
            self.graph_weights,
            self.counters,
            self.deadletter,
        )


def setting(env: str, default: Any, doc: str, *, secret: bool = False) -> Any:
    """One setting, declared once: its environment variable, its default and what it does
    (docs/configuration.md is written from these). A secret is never shown (``repr``)."""
    return field(default=default, repr=not secret, metadata={"env": env, "doc": doc,
                                                              "secret": secret})  # fmt: skip


#: the smallest MEMDIAG_MAX_OUTPUT_BYTES: a trimmed row keeps its ids and counts whole
MIN_OUTPUT_BYTES = 16 * 1024

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True, slots=True)
class Settings:
    """All of memdiag's configuration. Build it with :meth:`from_env`."""

    broker: str = setting(
        "MEMDIAG_BROKER",
        "kafka://localhost:9092",
        "Kafka bootstrap URL(s), ``kafka://host:port`` (several joined by ``;`` or ``,``). "
        "``memdiag run``/``demo`` start an embedded broker when it is unset.",
    )
    topic_prefix: str = setting("MEMDIAG_TOPIC_PREFIX", "memdiag.", "prefixes every topic name.")
    app_id: str = setting(
        "MEMDIAG_APP_ID",
        "memdiag-worker",
        "the Faust app id. It names the worker's consumer group and its changelog topics, so "
        "it must stay stable across deployments of one pipeline.",
    )
    sink_group: str = setting(
        "MEMDIAG_SINK_GROUP", "memdiag-sink", "the DuckDB sink's consumer group."
    )
    duckdb_path: str = setting(
        "MEMDIAG_DUCKDB_PATH", "memdiag.duckdb", "the analyst's DuckDB file."
    )
    duckdb_storage_version: str = setting(
        "MEMDIAG_DUCKDB_STORAGE_VERSION",
        "v1.4.0",
        "the DuckDB storage version a new file is written in. ``v1.4.0`` (the default) opens "
        "in every DuckDB client from 1.4 on (the CLI, notebooks, DBeaver); ``latest`` is this "
        "DuckDB's own, which older clients cannot open.",
    )
    followup_window_seconds: float = setting(
        "AGENTMEMORY_FOLLOWUP_WINDOW_SECONDS",
        30.0,
        "a search this close (inclusive) after the previous one with other results is a "
        "followup. Longer overcounts, shorter undercounts.",
    )
    recent_search_retention_hours: float = setting(
        "MEMDIAG_RECENT_SEARCH_RETENTION_HOURS",
        24.0,
        "how long (event time) a session's searches are remembered. Must be at least the "
        "followup window.",
    )
    turn_ttl_seconds: float = setting(
        "MEMDIAG_TURN_TTL_SECONDS",
        3600.0,
        "an injection or response whose partner has not arrived when its session's own clock "
        "(its newest ``ts``) is this much later is counted once "
        "(``memdiag.unmatched_turn_total``). It is kept, and joins if its partner comes "
        "later.",
    )
    session_keep_hours: float = setting(
        "MEMDIAG_SESSION_KEEP_HOURS",
        24.0,
        "a session's state is kept this long in processing time (the Kafka timestamps of its "
        "partition, never other sessions' ``ts``) after its last event; an event for it after "
        "that is dead-lettered as ``late_event`` and counted in ``memdiag.late_event_total``. "
        "Also how long a step waits for a verdict, at most.",
    )
    index_deadline_seconds: float = setting(
        "MEMDIAG_INDEX_DEADLINE_SECONDS",
        600.0,
        "a written memory not indexed this long after it was written, by its agent's own "
        "clock (the newest ``ts`` of the agent's memory events, in whole milliseconds), is "
        "``unindexed``.",
    )
    max_clock_skew_seconds: float = setting(
        "MEMDIAG_MAX_CLOCK_SKEW_SECONDS",
        300.0,
        "an event whose ``ts`` is further than this ahead of its Kafka record's timestamp is "
        'dead-lettered (``bad_ts``, "in the future").',
    )
    alpha_success: float = setting(
        "MEMDIAG_ALPHA_SUCCESS",
        0.1,
        "EMA step of an observation's weight towards 1 per accepted session.",
    )
    alpha_failure: float = setting(
        "MEMDIAG_ALPHA_FAILURE",
        0.2,
        "EMA step towards 0 per failed session; doubled (at most 1) once the observation is "
        "misleading.",
    )
    alpha_used: float = setting(
        "MEMDIAG_ALPHA_USED",
        0.2,
        "EMA step of an observation's strength towards 1 per turn whose response used it "
        '(strong evidence: docs/rules.md, "Strength").',
    )
    alpha_ignored: float = setting(
        "MEMDIAG_ALPHA_IGNORED",
        0.05,
        "EMA step of an observation's strength towards 0 per turn that ignored it (weak "
        "evidence: a paraphrase reads as ignored): 14 in a row halve it.",
    )
    max_event_bytes: int = setting(
        "MEMDIAG_MAX_EVENT_BYTES",
        1024 * 1024,
        "an event larger than this is dead-lettered (``too_large``).",
    )
    deadletter_payload_bytes: int = setting(
        "MEMDIAG_DEADLETTER_PAYLOAD_BYTES",
        64 * 1024,
        "how much of a bad payload a dead letter keeps.",
    )
    max_output_bytes: int = setting(
        "MEMDIAG_MAX_OUTPUT_BYTES",
        1_000_000,
        "a row the worker sends for DuckDB (a session diagnostic, a judgement) larger than "
        "this is trimmed to fit, its largest lists and texts first; a session diagnostic says "
        "so in its ``failure_context``, and the worker logs each (docs/topics.md). Keep it "
        "under the broker's ``message.max.bytes`` (Apache Kafka: 1,048,588) and the topics' "
        "``max.message.bytes``, which refuse a larger record.",
    )
    store_text: bool = setting(
        "MEMDIAG_STORE_TEXT", False, "``1`` keeps raw query and response texts in DuckDB."
    )
    detector: str = setting(
        "MEMDIAG_DETECTOR",
        "keyword",
        "the used/ignored rule: ``keyword`` (the contract's words rule), or ``semantic``: also "
        "``used`` when the similarity of memory and response reaches "
        "MEMDIAG_SIMILARITY_THRESHOLD (needs ``pip install 'memdiag[semantic]'``; "
        'docs/rules.md, "The semantic rule").',
    )
    similarity_threshold: float = setting(
        "MEMDIAG_SIMILARITY_THRESHOLD",
        0.19,
        "under MEMDIAG_DETECTOR=semantic, the similarity (0 to 1) at which a memory counts as "
        "``used`` whatever its words: the best F1 on memdiag's labelled pairs "
        "(``memdiag calibrate --labels``).",
    )
    events_partitions: int = setting(
        "MEMDIAG_EVENTS_PARTITIONS", 4, "partitions of ``events`` (and of the worker's changelog)."
    )
    judgements_partitions: int = setting(
        "MEMDIAG_JUDGEMENTS_PARTITIONS", 2, "partitions of ``judgements``."
    )
    diagnostics_partitions: int = setting(
        "MEMDIAG_DIAGNOSTICS_PARTITIONS", 4, "partitions of ``diagnostics``."
    )
    aux_partitions: int = setting(
        "MEMDIAG_AUX_PARTITIONS",
        1,
        "partitions of ``weights``, ``graph_weights``, ``counters`` and ``deadletter``.",
    )
    replication_factor: int = setting(
        "MEMDIAG_REPLICATION_FACTOR", 1, "replication of the topics memdiag creates."
    )
    session_timeout_seconds: float = setting(
        "MEMDIAG_SESSION_TIMEOUT_SECONDS",
        6.0,
        "consumer-group session timeout. Short on purpose: Tansu answers a JoinGroup after "
        "half of it, and a dead member holds a restart this long.",
    )
    heartbeat_interval_seconds: float = setting(
        "MEMDIAG_HEARTBEAT_INTERVAL_SECONDS", 1.0, "consumer heartbeat interval."
    )
    commit_interval_seconds: float = setting(
        "MEMDIAG_COMMIT_INTERVAL_SECONDS",
        1.0,
        "how often the worker commits a checkpoint (its state, its outputs, then its "
        "offsets). A crash repeats at most this much work.",
    )
    commit_idle_seconds: float = setting(
        "MEMDIAG_COMMIT_IDLE_SECONDS",
        0.1,
        "a checkpoint also commits once no record has come for this long (and a quarter of "
        "the interval has passed since the last commit): a burst or a catch-up commits when "
        "its last record is done (its offsets, its changelog and its counters go out then), "
        "not up to an interval later. Traffic that pauses often commits at most four times "
        "an interval; after a failed checkpoint, only at the interval until one commits. "
        "0: only the interval and MEMDIAG_COMMIT_BYTES make it commit.",
    )
    heap_trim_seconds: float = setting(
        "MEMDIAG_HEAP_TRIM_SECONDS",
        0.1,
        "the worker gives its heap's free pages back to the system after a commit (glibc's "
        "malloc_trim; glibc only), at most once this often: the large blocks of a "
        "checkpoint's batches and requests, reused from the heap between commits. A trim "
        "takes a millisecond or two, the event loop waiting; one over 50 ms is logged. "
        "0: never (the heap then keeps what it freed until it reuses it).",
    )
    commit_bytes: int = setting(
        "MEMDIAG_COMMIT_BYTES",
        16 * 1024 * 1024,
        "a checkpoint commits early once the state values written since the last commit pass "
        "this many bytes (each write counted; checked after each batch), with the sessions "
        "held to be written at the commit counted as the bytes of the events applied to them, "
        "as Quix's ``commit_every`` counts messages: a catch-up then holds about this much "
        "state between two commits at most, whatever the interval.",
    )
    state_dir: str = setting(
        "MEMDIAG_STATE_DIR",
        "memdiag-state",
        "where the worker keeps its local state (a RocksDB database per changelog partition, "
        "under a folder named for MEMDIAG_APP_ID). Keep it across restarts (a volume): a "
        "restart then reads only the changelog's tail. Lost, it is rebuilt from the "
        "changelog.",
    )
    state_store: str = setting(
        "MEMDIAG_STATE_STORE",
        "rocksdb",
        "``rocksdb`` (on disk: memory stays bounded) or ``memory`` (every start replays the "
        "whole changelog; state must fit in memory).",
    )
    state_cache_mb: int = setting(
        "MEMDIAG_STATE_CACHE_MB",
        32,
        "the RocksDB block cache, one for all of a worker's partitions.",
    )
    state_write_buffers_mb: int = setting(
        "MEMDIAG_STATE_WRITE_BUFFERS_MB",
        16,
        "RocksDB's write buffers (memtables), one bound for all of a worker's databases: past "
        "about 90% of it, the database being written flushes. Without it each database (one "
        "per partition of each table) could hold 4 MB.",
    )
    session_cache: int = setting(
        "MEMDIAG_SESSION_CACHE",
        5_000,
        "most sessions a worker keeps decoded in memory (the least recently written go first; "
        "the store holds them all), within MEMDIAG_DECODED_CACHE_MB.",
    )
    decoded_cache_mb: int = setting(
        "MEMDIAG_DECODED_CACHE_MB",
        32,
        "the bytes of decoded state a worker keeps in memory between batches, for all its "
        "stages (sessions, ledgers, strengths, and under MEMDIAG_DETECTOR=semantic the "
        "memories' vectors): one budget, the least recently used evicted first, whatever its "
        "stage. A decoded object is about ten times its stored size (vectors: once). The "
        "worker's memory grows with it, not with the sessions it keeps (beside it: at most "
        "16 MB of memories' keywords, by content).",
    )
    changelog_compaction_lag_hours: float = setting(
        "MEMDIAG_CHANGELOG_COMPACTION_LAG_HOURS",
        24.0,
        "``min.compaction.lag.ms`` of the worker's changelogs. A worker that crashes leaves "
        "changelog records its commit never covered; the committed value behind each must "
        "outlive the crash until a worker restarts and writes it again. Longer than any "
        "outage you expect (the log keeps this much history uncompacted).",
    )
    fetch_max_wait_ms: int = setting(
        "MEMDIAG_FETCH_MAX_WAIT_MS",
        100,
        "how long a fetch of the worker, the sink and ``memdiag alert`` waits at the broker "
        "for new records. Apache Kafka answers as soon as a record arrives; Tansu waits the "
        "time out, so on Tansu this bounds each hop's latency (Faust's own is 1,500 ms, "
        "aiokafka's 500 ms).",
    )
    sink_batch_rows: int = setting(
        "MEMDIAG_SINK_BATCH_ROWS", 20_000, "the sink writes at least every this many records..."
    )
    sink_batch_seconds: float = setting(
        "MEMDIAG_SINK_BATCH_SECONDS", 0.5, "...or every this many seconds, whichever comes first."
    )
    shutdown_timeout_seconds: float = setting(
        "MEMDIAG_SHUTDOWN_TIMEOUT_SECONDS",
        8.0,
        "how long the worker and the sink may take to stop after SIGTERM or Ctrl-C. They "
        "commit what they processed (the sink writes what it holds to DuckDB first); when "
        "the broker is gone they commit nothing more, say so and exit with status 75, and "
        "what they could not commit comes again on the next start. A second signal stops "
        "them at once. Keep it under the grace period of what stops them (Docker's 10 s).",
    )
    log_level: str = setting(
        "MEMDIAG_LOG_LEVEL", "info", "log level of the long-running processes."
    )
    kafka_security_protocol: str = setting(
        "MEMDIAG_KAFKA_SECURITY_PROTOCOL",
        "PLAINTEXT",
        "how every memdiag process (worker, sink, publish, alert, the runtime publisher) "
        "talks to the broker: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.",
    )
    kafka_sasl_mechanism: str = setting(
        "MEMDIAG_KAFKA_SASL_MECHANISM",
        "PLAIN",
        "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (SASL_* only).",
    )
    kafka_sasl_username: str = setting("MEMDIAG_KAFKA_SASL_USERNAME", "", "the SASL user.")
    kafka_sasl_password: str = setting(
        "MEMDIAG_KAFKA_SASL_PASSWORD",
        "",
        "the SASL password (never logged; prefer the file).",
        secret=True,
    )
    kafka_sasl_password_file: str = setting(
        "MEMDIAG_KAFKA_SASL_PASSWORD_FILE",
        "",
        "a file holding the SASL password (a mounted secret; a trailing newline is ignored). "
        "Read at start; wins over MEMDIAG_KAFKA_SASL_PASSWORD.",
    )
    kafka_ssl_cafile: str = setting(
        "MEMDIAG_KAFKA_SSL_CAFILE",
        "",
        "the CA bundle (PEM) that verifies the broker's certificate (SSL, SASL_SSL); empty: "
        "the system's trusted CAs.",
    )
    kafka_ssl_certfile: str = setting(
        "MEMDIAG_KAFKA_SSL_CERTFILE", "", "a client certificate (PEM), for brokers that want one."
    )
    kafka_ssl_keyfile: str = setting(
        "MEMDIAG_KAFKA_SSL_KEYFILE", "", "the client certificate's private key (PEM)."
    )
    kafka_ssl_check_hostname: bool = setting(
        "MEMDIAG_KAFKA_SSL_CHECK_HOSTNAME",
        True,
        "``0`` skips checking that the broker's certificate names the host connected to (the "
        "chain is still verified).",
    )

    serve_token: str = setting(
        "MEMDIAG_SERVE_TOKEN",
        "",
        "the token ``memdiag serve`` asks of every request (``Authorization: Bearer T``, or "
        "once ``?token=T``, then a cookie). Required to bind any address but a loopback one; "
        "checked on loopback too when set.",
        secret=True,
    )
    serve_url: str = setting(
        "MEMDIAG_SERVE_URL",
        "",
        "where people reach ``memdiag serve`` (e.g. ``https://memdiag.internal:8765``). When "
        "set, firing alerts, ``status`` and ``explain`` link the page that shows the cause.",
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, (var, kind) in ENV.items():
            raw = env.get(var)
            if raw is None or raw == "":
                continue
            values[name] = _parse(var, kind, raw)
        values.update(overrides)
        secret_file = values.get("kafka_sasl_password_file")
        if secret_file:
            try:
                with open(secret_file, encoding="utf-8") as f:
                    text = f.read()
            except OSError as exc:
                raise ConfigError(
                    f"MEMDIAG_KAFKA_SASL_PASSWORD_FILE={secret_file}: cannot read it "
                    f"({exc.strerror})"
                ) from None
            values["kafka_sasl_password"] = text.rstrip("\r\n")
        settings = cls(**values)
        settings.validate()
        return settings

    def with_(self, **changes: Any) -> Settings:
        new = replace(self, **changes)
        new.validate()
        return new

    def validate(self) -> None:
        """Reject configurations that would give wrong answers, before anything starts."""
        if self.followup_window_seconds < 0:
            raise ConfigError(
                "AGENTMEMORY_FOLLOWUP_WINDOW_SECONDS must be >= 0, "
                f"got {self.followup_window_seconds}"
            )
        if self.followup_window_seconds > self.recent_search_retention_hours * 3600:
            raise ConfigError(
                f"AGENTMEMORY_FOLLOWUP_WINDOW_SECONDS ({self.followup_window_seconds:g}) is "
                "longer than MEMDIAG_RECENT_SEARCH_RETENTION_HOURS "
                f"({self.recent_search_retention_hours:g} h): searches would be forgotten "
                "before their window closes. Raise the retention or shorten the window."
            )
        if not 0 < self.turn_ttl_seconds <= self.recent_search_retention_hours * 3600:
            raise ConfigError(
                f"MEMDIAG_TURN_TTL_SECONDS ({self.turn_ttl_seconds:g}) must be > 0 and at most "
                f"MEMDIAG_RECENT_SEARCH_RETENTION_HOURS ({self.recent_search_retention_hours:g} "
                "h), which is how long a session's state is kept"
            )
        if not self.session_keep_hours > 0:
            raise ConfigError(
                f"MEMDIAG_SESSION_KEEP_HOURS must be > 0, got {self.session_keep_hours:g}"
            )
        if not self.index_deadline_seconds > 0:
            raise ConfigError(
                f"MEMDIAG_INDEX_DEADLINE_SECONDS must be > 0, got {self.index_deadline_seconds:g}"
            )
        if not self.max_clock_skew_seconds >= 0:
            raise ConfigError(
                f"MEMDIAG_MAX_CLOCK_SKEW_SECONDS must be >= 0, got {self.max_clock_skew_seconds:g}"
            )
        for name in ("alpha_success", "alpha_failure", "alpha_used", "alpha_ignored"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(f"{ENV[name][0]} must be in (0, 1], got {getattr(self, name)}")
        for name in (
            "events_partitions",
            "judgements_partitions",
            "diagnostics_partitions",
            "aux_partitions",
            "replication_factor",
            "max_event_bytes",
            "deadletter_payload_bytes",
            "sink_batch_rows",
            "fetch_max_wait_ms",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{ENV[name][0]} must be >= 1, got {getattr(self, name)}")
        if self.duckdb_storage_version != "latest" and not re.fullmatch(
            r"v\d+\.\d+\.\d+", self.duckdb_storage_version
        ):
            raise ConfigError(
                "MEMDIAG_DUCKDB_STORAGE_VERSION must be a DuckDB version like v1.4.0, or "
                f"latest; got {self.duckdb_storage_version!r}"
            )
        for name, value in (("MEMDIAG_STATE_CACHE_MB", self.state_cache_mb),
                            ("MEMDIAG_STATE_WRITE_BUFFERS_MB", self.state_write_buffers_mb),
                            ("MEMDIAG_SESSION_CACHE", self.session_cache),
                            ("MEMDIAG_DECODED_CACHE_MB", self.decoded_cache_mb)):  # fmt: skip
            if value < 1:
                raise ConfigError(f"{name} must be at least 1, got {value}")
        if self.max_output_bytes < MIN_OUTPUT_BYTES:
            raise ConfigError(
                f"MEMDIAG_MAX_OUTPUT_BYTES must be at least {MIN_OUTPUT_BYTES:,} (a row keeps "
                f"its ids and counts whole), got {self.max_output_bytes:,}"
            )
        if self.detector not in DETECTORS:
            raise ConfigError(f"MEMDIAG_DETECTOR={self.detector!r}: use {' or '.join(DETECTORS)}")
        if not 0.0 <= self.similarity_threshold <= 1.0:
            raise ConfigError(
                f"MEMDIAG_SIMILARITY_THRESHOLD={self.similarity_threshold:g}: a similarity "
                "is between 0 and 1"
            )
        if self.state_store not in ("rocksdb", "memory"):
            raise ConfigError(f"MEMDIAG_STATE_STORE={self.state_store!r}: use rocksdb or memory")
        if not self.changelog_compaction_lag_hours >= 0:
            raise ConfigError(
                "MEMDIAG_CHANGELOG_COMPACTION_LAG_HOURS must be >= 0, got "
                f"{self.changelog_compaction_lag_hours:g}"
            )
        if not self.commit_bytes > 0:
            raise ConfigError(f"MEMDIAG_COMMIT_BYTES must be > 0, got {self.commit_bytes}")
        if not self.commit_idle_seconds >= 0:
            raise ConfigError(
                "MEMDIAG_COMMIT_IDLE_SECONDS must be >= 0 (0: off), got "
                f"{self.commit_idle_seconds:g}"
            )
        if not self.heap_trim_seconds >= 0:
            raise ConfigError(
                f"MEMDIAG_HEAP_TRIM_SECONDS must be >= 0 (0: off), got {self.heap_trim_seconds:g}"
            )
        if not self.commit_interval_seconds > 0:
            raise ConfigError(
                f"MEMDIAG_COMMIT_INTERVAL_SECONDS must be > 0, got {self.commit_interval_seconds:g}"
            )
        if not self.shutdown_timeout_seconds > 0:
            raise ConfigError(
                "MEMDIAG_SHUTDOWN_TIMEOUT_SECONDS must be > 0, got "
                f"{self.shutdown_timeout_seconds:g}"
            )
        if not self.topic_prefix or any(c.isspace() for c in self.topic_prefix):
            raise ConfigError("MEMDIAG_TOPIC_PREFIX must be non-empty and without spaces")
        self._validate_security()

    def _validate_security(self) -> None:
        protocol = self.kafka_security_protocol
        if protocol not in SECURITY_PROTOCOLS:
            raise ConfigError(
                f"MEMDIAG_KAFKA_SECURITY_PROTOCOL={protocol!r}: use one of "
                f"{', '.join(SECURITY_PROTOCOLS)}"
            )
        if protocol.startswith("SASL_"):
            if self.kafka_sasl_mechanism not in SASL_MECHANISMS:
                raise ConfigError(
                    f"MEMDIAG_KAFKA_SASL_MECHANISM={self.kafka_sasl_mechanism!r}: use one of "
                    f"{', '.join(SASL_MECHANISMS)}"
                )
            if not self.kafka_sasl_username or not self.kafka_sasl_password:
                raise ConfigError(
                    f"MEMDIAG_KAFKA_SECURITY_PROTOCOL={protocol} needs "
                    "MEMDIAG_KAFKA_SASL_USERNAME and MEMDIAG_KAFKA_SASL_PASSWORD (or "
                    "MEMDIAG_KAFKA_SASL_PASSWORD_FILE)"
                )
        if protocol in ("SSL", "SASL_SSL"):
            for name in ("kafka_ssl_cafile", "kafka_ssl_certfile", "kafka_ssl_keyfile"):
                path = getattr(self, name)
                if path and not os.path.isfile(path):
                    raise ConfigError(f"{ENV[name][0]}={path}: no such file")
            if bool(self.kafka_ssl_certfile) != bool(self.kafka_ssl_keyfile):
                raise ConfigError(
                    "MEMDIAG_KAFKA_SSL_CERTFILE and MEMDIAG_KAFKA_SSL_KEYFILE go together"
                )
            import ssl  # the files must load, not only exist: a bad PEM is refused at start

            try:
                context = ssl.create_default_context(cafile=self.kafka_ssl_cafile or None)
                if self.kafka_ssl_certfile:
                    context.load_cert_chain(self.kafka_ssl_certfile, self.kafka_ssl_keyfile)
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise ConfigError(
                    "MEMDIAG_KAFKA_SSL_CAFILE/_CERTFILE/_KEYFILE do not load as PEM "
                    f"certificates and key: {exc}"
                ) from None

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix)

    @property
    def bootstrap_servers(self) -> str:
        """The broker URL(s) as aiokafka wants them: ``host:port[,host:port]``."""
        return bootstrap_servers(self.broker)

    @property
    def followup_window_us(self) -> int:
        return round(self.followup_window_seconds * 1_000_000)

    @property
    def turn_ttl_us(self) -> int:
        return round(self.turn_ttl_seconds * 1_000_000)

    @property
    def keep_ms(self) -> int:
        return round(self.session_keep_hours * 3600 * 1000)

    @property
    def index_deadline_ms(self) -> int:
        return round(self.index_deadline_seconds * 1000)

    @property
    def max_skew_us(self) -> int:
        return round(self.max_clock_skew_seconds * 1_000_000)

    @property
    def retention_us(self) -> int:
        return round(self.recent_search_retention_hours * 3600 * 1_000_000)

    def as_env(self) -> dict[str, str]:
        """The environment that rebuilds these settings in a child process."""
        out: dict[str, str] = {}
        for f in fields(self):
            var, kind = ENV[f.name]
            value = getattr(self, f.name)
            if f.name == "kafka_sasl_password" and self.kafka_sasl_password_file:
                continue  # the child reads the file itself: the secret stays out of its env
            out[var] = ("1" if value else "0") if kind == "bool" else str(value)
        return out


#: field name -> (environment variable, parser: str, int, float, bool or secret), in the
#: order of the fields (the documentation's order), from each field's own declaration
ENV: dict[str, tuple[str, str]] = {
    f.name: (f.metadata["env"], "secret" if f.metadata["secret"] else str(f.type))
    for f in fields(Settings)
}


def bootstrap_servers(url: str) -> str:
    hosts = []
    for part in url.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        if "://" in part:
            part = part.split("://", 1)[1]
        hosts.append(part.rstrip("/"))
    if not hosts:
        raise ConfigError(f"MEMDIAG_BROKER has no host: {url!r}")
    return ",".join(hosts)


def _parse(var: str, kind: str, raw: str) -> Any:
    if kind == "secret":
        return raw
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind == "bool":
            lowered = raw.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
    except ValueError:
        raise ConfigError(f"{var}={raw!r} is not a valid {kind}") from None
    return raw
