"""Kafka plumbing shared by the commands: how to connect (security included), waiting for
the broker, topic creation and pipeline drain checks; and Kafka's default partitioner, which
the worker computes for every keyed event and every keyed output."""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    IllegalSaslStateError,
    SaslAuthenticationFailed,
    TopicAlreadyExistsError,
    UnsupportedSaslMechanismError,
)

from memdiag.settings import ConfigError, Settings

log = logging.getLogger("memdiag.kafka")


# -- Kafka's default partitioner ---------------------------------------------------------------

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """MurmurHash2 of ``data`` as Kafka's Java client computes it (``Utils.murmur2``, seed
    0x9747B28C), equal to aiokafka's ``murmur2`` for every input (a hypothesis test) in
    about half its time (a 40-byte key: 4.3 against 9.0 us here): the key's whole words
    are read in one ``struct`` call, and only the products are masked. The worker computes
    it for every keyed event (which partition holds its session) and every keyed output
    (aiokafka's producer)."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    words = length >> 2
    if words:
        for k in struct.unpack_from(f"<{words}I", data):
            k = (k * _M) & _MASK
            k ^= k >> 24
            h = ((h * _M) & _MASK) ^ ((k * _M) & _MASK)
    tail = words << 2
    rest = length - tail
    if rest >= 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives ``key`` among ``partitions``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class DefaultPartitioner:
    """aiokafka's ``DefaultPartitioner`` (a key's partition by :func:`murmur2`, a message
    without a key on a random available partition) with the faster hash: the worker's
    producer takes it (Faust's ``producer_partitioner``)."""

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return random.choice(available or all_partitions)  # noqa: S311 - not a secret
        return all_partitions[partition_for(key, len(all_partitions))]


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context of ``SSL`` and ``SASL_SSL``: the broker's certificate verified
    against ``MEMDIAG_KAFKA_SSL_CAFILE`` (or the system's CAs), its host name checked unless
    turned off, a client certificate when one is given."""
    if settings.kafka_security_protocol not in ("SSL", "SASL_SSL"):
        return None
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=settings.kafka_ssl_cafile or None
    )
    context.check_hostname = settings.kafka_ssl_check_hostname
    if settings.kafka_ssl_certfile:
        context.load_cert_chain(settings.kafka_ssl_certfile, settings.kafka_ssl_keyfile or None)
    return context


def client_options(settings: Settings) -> dict[str, Any]:
    """What every aiokafka client of memdiag is built with: where the broker is and how to
    talk to it (``MEMDIAG_KAFKA_*``, one place). The password is only ever passed here."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "security_protocol": settings.kafka_security_protocol,
    }
    context = ssl_context(settings)
    if context is not None:
        options["ssl_context"] = context
    if settings.kafka_security_protocol.startswith("SASL_"):
        options["sasl_mechanism"] = settings.kafka_sasl_mechanism
        options["sasl_plain_username"] = settings.kafka_sasl_username
        options["sasl_plain_password"] = settings.kafka_sasl_password
    return options


class _Said(logging.Handler):
    """What aiokafka logs while memdiag probes the broker: often the only place the cause
    is (a refused certificate, a failed SASL exchange), kept for one line of ours."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def describe_failure(settings: Settings, exc: BaseException, said: Iterable[str] = ()) -> str:
    """One line a person can act on, for a failed connection (never the password).
    ``said``: what the client logged meanwhile (often the only place the cause is)."""
    where = f"MEMDIAG_BROKER={settings.broker}"
    causes = [_cause(m) for m in dict.fromkeys(said)]  # each once, in order
    cause = "; ".join(causes) or (
        f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    )
    everything = f"{type(exc).__name__} {exc} {cause}"
    if isinstance(exc, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in everything:
        return (
            f"the broker's TLS certificate did not verify ({where}, MEMDIAG_KAFKA_SSL_CAFILE="
            f"{settings.kafka_ssl_cafile or '(system CAs)'}): {cause}"
        )
    if isinstance(exc, ssl.SSLError) or "SSL" in cause:
        return f"TLS failed with the broker ({where}): {cause}"
    refused = "Connect call failed" in everything or "Connection refused" in everything
    if settings.kafka_security_protocol.startswith("SASL_") and not refused and (
        "Authentication" in everything or "Sasl" in everything or "closed" in everything
        or isinstance(exc, KeyError)  # aiokafka's SCRAM client, on a refused exchange
    ):  # fmt: skip
        password = (
            f"MEMDIAG_KAFKA_SASL_PASSWORD_FILE={settings.kafka_sasl_password_file}"
            if settings.kafka_sasl_password_file
            else "MEMDIAG_KAFKA_SASL_PASSWORD"
        )
        return (
            f"the broker refused the SASL {settings.kafka_sasl_mechanism} login of user "
            f"{settings.kafka_sasl_username!r} ({where}; {cause}): check "
            f"MEMDIAG_KAFKA_SASL_USERNAME, the password ({password}) and "
            "MEMDIAG_KAFKA_SASL_MECHANISM (the broker must enable it for this user)"
        )
    return (
        f"no Kafka broker answered at {settings.bootstrap_servers} ({where}): {cause}; start "
        "it, or point MEMDIAG_BROKER at it"
    )


#: aiokafka's errors for a login the broker itself refused (SASL_AUTHENTICATION_FAILED, an
#: unsupported mechanism, an exchange out of order): the broker answered, so no retry mends it
_REFUSALS = (SaslAuthenticationFailed, UnsupportedSaslMechanismError, IllegalSaslStateError)


def login_refused(settings: Settings, exc: BaseException, said: Iterable[str] = ()) -> bool:
    """Whether a failed connection is the broker refusing memdiag's SASL credentials, not a
    broker away. aiokafka's bootstrap logs the refusal and raises a bare connection error,
    so what it said (``said``) is read too, by the errors' names. A connection merely
    closed during the exchange (Kafka before 1.0 refuses that way; so does a broker that
    restarts) is not taken for a refusal: that is retried."""
    if not settings.kafka_security_protocol.startswith("SASL_"):
        return False
    if isinstance(exc, _REFUSALS):
        return True
    if isinstance(exc, KeyError) and settings.kafka_sasl_mechanism.startswith("SCRAM-"):
        return True  # aiokafka's SCRAM client, on a server's ``e=`` answer instead of ``v=``
    text = " ".join([f"{type(exc).__name__}: {exc}", *said])
    return any(error.__name__ in text for error in _REFUSALS)


def _cause(message: str) -> str:
    """aiokafka's 'Unable connect to "host:port": [Errno 111] ...' without its prefix."""
    head, sep, rest = message.partition('": ')
    return rest if sep and head.startswith("Unable connect to") else message


class ProbeFailed(Exception):
    """A probe failed: ``error`` is what was raised, ``said`` what the client logged."""

    def __init__(self, error: BaseException, said: list[str]):
        super().__init__(str(error))
        self.error, self.said = error, said


async def probe(settings: Settings, timeout: float = 10.0) -> None:
    """One metadata request with memdiag's connection settings; raises :class:`ProbeFailed`.
    What aiokafka logs meanwhile (often the only place the cause is) is kept for the message,
    not shown: one line of ours says it instead."""
    options = client_options(settings)  # a bad setting raises here, before anything changes
    said = _Said()
    aiokafka_log = logging.getLogger("aiokafka")
    level, propagate = aiokafka_log.level, aiokafka_log.propagate
    aiokafka_log.addHandler(said)
    try:
        if aiokafka_log.getEffectiveLevel() > logging.WARNING:
            aiokafka_log.setLevel(logging.WARNING)  # whatever another caller left it at
        aiokafka_log.propagate = False
        admin = AIOKafkaAdminClient(**options, request_timeout_ms=int(timeout * 1000))
        try:
            await asyncio.wait_for(admin.start(), timeout)
            await asyncio.wait_for(admin.list_topics(), timeout)
        except Exception as exc:  # noqa: BLE001 - described by the caller, with what was said
            raise ProbeFailed(exc, said.messages) from exc
        finally:
            await admin.close()
    finally:
        aiokafka_log.removeHandler(said)
        aiokafka_log.setLevel(level)
        aiokafka_log.propagate = propagate


async def broker_answers(settings: Settings, timeout: float) -> bool:
    """Whether the broker answers a metadata request within ``timeout`` seconds (a stop
    asks it, to give up at once on a commit that can never be done)."""
    try:
        await probe(settings, timeout=max(0.1, timeout))
    except Exception:  # noqa: BLE001 - whatever the cause, it does not answer
        return False
    return True


async def wait_for_kafka(
    settings: Settings,
    who: str,
    first_delay: float = 1.0,
    max_delay: float = 30.0,
    say_every: float = 60.0,
    give_up_after: float | None = None,
) -> None:
    """Return once the broker answers, trying at most once a ``first_delay`` (1 s), the
    delay doubling to ``max_delay`` (30 s): a service started before its broker (compose,
    Kubernetes) waits instead of dying, and wrong credentials cause no retry storm. Logs one
    line at the first failure and then one a ``say_every`` (a minute), naming the setting to
    check. ``give_up_after``: a command's wait: silent, then :class:`KafkaUnavailable` (its
    message is the line) after that many seconds. A login the broker refuses is not waited
    for: :class:`LoginRefused` at once (a wrong password stays wrong; a process that exits
    says so once, where one that waited would say it once a minute, unread)."""
    started = time.monotonic()
    delay = first_delay
    said_at: float | None = None
    attempts = 0
    while True:
        attempts += 1
        try:
            await probe(settings)
            if said_at is not None:
                log.info("%s: the broker answers; starting", who)
            return
        except Exception as exc:  # noqa: BLE001 - each failure is described and retried
            error, said = (exc.error, exc.said) if isinstance(exc, ProbeFailed) else (exc, [])
            line = describe_failure(settings, error, said)
            if login_refused(settings, error, said):
                raise LoginRefused(line) from exc
            now = time.monotonic()
            if give_up_after is not None and now - started + delay > give_up_after:
                raise KafkaUnavailable(line) from exc
            if give_up_after is None and (said_at is None or now - said_at >= say_every):
                log.warning(
                    "%s waits for Kafka: %s (attempt %d; retrying every %.0fs at most)",
                    who,
                    line,
                    attempts,
                    max_delay,
                )
                said_at = now
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_delay)


class KafkaUnavailable(RuntimeError):
    """The broker could not be reached (or refused us); the message says what to check."""


class LoginRefused(KafkaUnavailable):
    """The broker refused memdiag's SASL login; the message names the user, the mechanism
    and the settings to check (never the password)."""


def topic_partitions(settings: Settings) -> dict[str, int]:
    t = settings.topics
    return {
        t.events: settings.events_partitions,
        t.judgements: settings.judgements_partitions,
        # co-partitioned with `events`: the recall pipeline's state lives in the same table
        t.memory: settings.events_partitions,
        t.diagnostics: settings.diagnostics_partitions,
        t.weights: settings.aux_partitions,
        t.graph_weights: settings.aux_partitions,
        t.counters: settings.aux_partitions,
        t.deadletter: settings.aux_partitions,
        # any width: the span stage keeps no state (as wide as `events`, to scale with it)
        t.otlp_spans: settings.events_partitions,
        # internal: as wide as `events`, so the observation and gather stages scale with it;
        # the trace and session stages keep state in the worker's table: co-partitioned
        t.observation_steps: settings.events_partitions,
        t.session_verdicts: settings.events_partitions,
        t.otlp_traces: settings.events_partitions,
        t.span_events: settings.events_partitions,
    }


async def ensure_topics(settings: Settings) -> None:
    """Create memdiag's topics with explicit partition counts; check existing ones.

    ``retention.ms``/``retention.bytes`` are set explicitly because some brokers (Tansu)
    describe only the settings a topic was created with.
    """
    wanted = topic_partitions(settings)
    admin = AIOKafkaAdminClient(**client_options(settings))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [
            NewTopic(
                name,
                num_partitions=n,
                replication_factor=settings.replication_factor,
                topic_configs={"retention.ms": "-1", "retention.bytes": "-1"},
            )
            for name, n in wanted.items()
            if name not in existing
        ]
        if new:
            try:
                await admin.create_topics(new)
            except TopicAlreadyExistsError:
                pass  # created concurrently by another process
        for name in (settings.topics.events, settings.topics.memory):
            if name not in existing:
                continue
            described = await admin.describe_topics([name])
            have = len(described[0]["partitions"])
            if have != settings.events_partitions:
                raise ConfigError(
                    f"topic {name} has {have} partitions but MEMDIAG_EVENTS_PARTITIONS="
                    f"{settings.events_partitions}; set MEMDIAG_EVENTS_PARTITIONS to the "
                    "partitions of memdiag's events topic and give its memory topic as many "
                    "(the worker's state is partitioned like both)"
                )
    finally:
        await admin.close()


async def short_compaction_lags(settings: Settings, wanted: dict[str, int]) -> list[str]:
    """For each existing topic of ``wanted`` (name -> the ``min.compaction.lag.ms`` it must
    have at least), a line saying it has less, and how to raise it. A changelog gets its lag
    when the worker creates it; one created before (by an older memdiag, by hand, with
    another MEMDIAG_CHANGELOG_COMPACTION_LAG_HOURS) is only checked here. A topic that does
    not describe the setting has the broker's default (Kafka's is 0: compact at once)."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(**client_options(settings))
    await admin.start()
    try:
        existing = set(await admin.list_topics()) & set(wanted)
        if not existing:
            return []
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in sorted(existing)]
        )
    finally:
        await admin.close()
    out = []
    for response in responses:
        for error, _, _, name, entries in response.resources:
            if error:
                continue  # a broker that cannot describe it: nothing to say
            have = {entry[0]: entry[1] for entry in entries}.get("min.compaction.lag.ms")
            need = wanted[name]
            if have is not None and int(have) >= need:
                continue
            said = "the broker's default" if have is None else f"{int(have):,} ms"
            out.append(
                f"changelog {name} has min.compaction.lag.ms {said}, less than the "
                f"{need:,} ms MEMDIAG_CHANGELOG_COMPACTION_LAG_HOURS asks: the cleaner may drop "
                "a committed value before a restarted worker writes it again; raise it "
                f"(kafka-configs --alter --entity-type topics --entity-name {name} "
                f"--add-config min.compaction.lag.ms={need})"
            )
    return out


async def true_end_offsets(
    options: dict[str, Any], tps: Iterable[TopicPartition], reported: dict[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """End offsets that are right even where ListOffsets is not (``options``: see
    :func:`client_options`).

    Tansu (the embedded broker) answers ListOffsets(latest) with the base offset of the
    partition's last record batch plus one, so a last batch of several records hides all
    but its first. Reading from ``reported - 1`` to the end gives the true end; on a broker
    that answers correctly (Apache Kafka) it reads one record and returns the same number.
    """
    tps = [tp for tp in tps if reported.get(tp, 0) > 0]
    ends = dict(reported)
    if not tps:
        return ends
    reader = AIOKafkaConsumer(**options, enable_auto_commit=False, group_id=None)
    await reader.start()
    try:
        reader.assign(tps)
        for tp in tps:
            reader.seek(tp, reported[tp] - 1)
        while True:  # the first fetch returns the last batch; an empty one means the end
            batches = await reader.getmany(*tps, timeout_ms=300)
            if not any(batches.values()):
                break
            for tp, records in batches.items():
                if records:
                    ends[tp] = max(ends[tp], records[-1].offset + 1)
    finally:
        await reader.stop()
    return ends


@dataclass(frozen=True, slots=True)
class Lag:
    group: str
    behind: int  # messages not yet committed by the group, over the topics asked about

    @property
    def drained(self) -> bool:
        return self.behind == 0


class LagProbe:
    """Reads how far a consumer group is behind the end of some topics.

    Committed offsets are read *before* end offsets. A worker flushes what it produced
    before it commits, so once ``committed == end`` with that order, everything the group
    consumed and everything it produced from that is in the log: the next stage can be
    checked. (The reverse order can miss a message produced between the two reads.)
    """

    def __init__(self, settings: Settings, group: str, topics: Iterable[str]):
        self.settings = settings
        self.group = group
        self.topics = list(topics)
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> LagProbe:
        self._consumer = AIOKafkaConsumer(
            **client_options(self.settings),
            group_id=self.group,
            enable_auto_commit=False,
        )
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    async def lag(self) -> Lag:
        consumer = self._consumer
        if consumer is None:
            raise RuntimeError("use LagProbe as an async context manager")
        tps: list[TopicPartition] = []
        for topic in self.topics:
            parts = consumer.partitions_for_topic(topic)
            if not parts:
                await consumer._client.force_metadata_update()
                parts = consumer.partitions_for_topic(topic) or set()
            tps.extend(TopicPartition(topic, p) for p in sorted(parts))
        if not tps:
            return Lag(self.group, 0)
        committed = {tp: (await consumer.committed(tp)) or 0 for tp in tps}
        ends = await consumer.end_offsets(tps)
        # Only a partition that looks drained can be fooled by a short ListOffsets answer:
        # read its true end; one that is visibly behind is behind either way.
        looks_drained = [tp for tp in tps if committed[tp] >= ends[tp]]
        if looks_drained:
            ends.update(await true_end_offsets(client_options(self.settings), looks_drained, ends))
        return Lag(self.group, sum(max(0, ends[tp] - committed[tp]) for tp in tps))


async def wait_drained(
    settings: Settings,
    group: str,
    topics: Iterable[str],
    timeout: float,
    poll: float = 0.2,
    on_poll: Callable[[Lag], None] | None = None,
) -> Lag:
    """Poll until ``group`` has committed everything in ``topics`` (or ``timeout``)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with LagProbe(settings, group, topics) as probe:
        while True:
            lag = await probe.lag()
            if on_poll is not None:
                on_poll(lag)
            if lag.drained or loop.time() > deadline:
                return lag
            await asyncio.sleep(poll)
