"""The Python publisher for agent runtimes: validate, route, key, batch, and outlive the broker.

    from memdiag.client import Publisher

    with Publisher("kafka://localhost:9092") as memdiag:  # or Publisher(settings=...)
        memdiag.publish({"kind": "search", "event_id": "e1", "ts": "...", ...})

:class:`AsyncPublisher` is the same for asyncio code (``await publisher.publish(event)``).
:mod:`memdiag.events` has the events as ``TypedDict``s, for a type checker.

- **Validation.** Every event is checked against the JSON Schemas with the worker's own
  compiled validators before it is kept; a bad one raises :class:`EventRejected` with the
  reason and a detail that says what to fix. Something that is not a mapping raises
  ``TypeError``.
- **Routing and keys** as the contract says: session events to ``events`` keyed by
  ``session_id``, judgements to ``judgements`` keyed by ``run_id``, the recall pipeline's
  events to ``memory`` keyed by ``agent_id``.
- **Batching**, like OpenTelemetry's ``BatchSpanProcessor``: events of one key wait at most
  ``linger_ms`` (default 50, at most 100) and go as one message (a JSON array), at most
  ``max_batch_events`` events and ``max_batch_bytes`` bytes.
- **The broker's worst day.** A runtime must not stall on its diagnostics:

  - *A broker down at start*: :class:`BrokerUnavailable` names it and says what to check,
    and nothing is left open. ``wait_for_broker=S`` retries for ``S`` seconds first;
    ``wait_for_broker=None`` starts at once and connects in the background, keeping events
    meanwhile.
  - *A broker that goes away*: a send or delivery that fails is kept and sent again, one
    message at a time with a growing pause (0.1 s to 5 s) until the broker takes one; then
    everything kept goes. Nothing is given up while it is kept.
  - *A bounded buffer*: at most ``max_held_events`` events and ``max_held_bytes`` bytes are
    kept (batched, sending, or waiting for the broker's acknowledgement). When it is full,
    :meth:`~AsyncPublisher.publish` waits up to ``max_block_seconds`` for room while the
    broker is taking events (a broker slower than the runtime), and drops the event at once
    while it is not (a failed delivery, or no acknowledgement for 2 s while messages wait).
    A broker killed and back within aiokafka's request timeout fails no delivery: a drop
    while nothing is acknowledged marks it away, for the warnings below, and the next
    acknowledgement marks it back. (One that acknowledges less often than every 2 s while
    the buffer is full goes away and back so at each turn, its warnings still one a
    minute.) Away after a failed delivery, it is back only when a message sent after the
    failure goes: an acknowledgement of one sent before says nothing of the broker that failed.
    Every dropped event is counted in :meth:`~AsyncPublisher.stats` (``dropped``), exactly:
    ``publish`` returns ``False`` for it.
  - *One warning a minute*, on the ``memdiag.client`` logger, with the counts: when the
    broker goes, while it stays away, and when it is back. aiokafka's own lines about this
    publisher's connections are held to one a minute each (other clients in the process are
    not touched).
  - :meth:`~AsyncPublisher.flush` and :meth:`~AsyncPublisher.close` take a ``timeout``
    (default 30 s). A flush that runs out raises :class:`FlushTimeout` and keeps the events;
    a close that runs out counts what it never sent as dropped, and what it sent without an
    acknowledgement as ``unconfirmed`` (it may have arrived), and says so.

What a crash loses: whatever was kept and not yet acknowledged. Call :meth:`flush` where
the runtime needs a guarantee. A message is sent again when its acknowledgement did not
come, so the broker may hold an event twice: harmless, since the worker counts each
``event_id`` once.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import msgspec
import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    InvalidTopicError,
    MessageSizeTooLargeError,
    RecordTooLargeError,
    TopicAuthorizationFailedError,
)

from memdiag.contract import UNKNOWN_KIND
from memdiag.kafka import client_options, describe_failure, login_refused
from memdiag.schemas import JUDGEMENT_KINDS, MEMORY_KINDS, SESSION_KINDS
from memdiag.schemas.decode import Decoder
from memdiag.settings import Settings

if TYPE_CHECKING:
    from memdiag.events import Event

__all__ = [
    "AsyncPublisher",
    "BrokerUnavailable",
    "EventRejected",
    "FlushTimeout",
    "PublishFailed",
    "Publisher",
    "PublisherStats",
]

log = logging.getLogger("memdiag.client")

#: The longest an event waits in the publisher for others of its key.
MAX_LINGER_MS = 100
#: Messages handed to the producer and not yet acknowledged, at most.
MAX_IN_FLIGHT = 5_000
#: The default of ``flush`` and ``close`` (and so of interpreter exit).
DEFAULT_TIMEOUT_SECONDS = 30.0
#: How often the publisher says the broker is still away, and lets each line of aiokafka's
#: about this publisher through.
WARN_EVERY_SECONDS = 60.0
#: A broker that has acknowledged nothing for this long while messages wait for it is not
#: taking events: a full buffer drops at once instead of waiting for room.
STALL_SECONDS = 2.0
#: Retrying a broker that went away: the first pause, and the longest.
BACKOFF_SECONDS = (0.1, 5.0)
#: A message the broker can never take: counted as dropped at once, not retried.
_NEVER_TAKEN = (
    MessageSizeTooLargeError,
    RecordTooLargeError,
    InvalidTopicError,
    TopicAuthorizationFailedError,
)


class EventRejected(ValueError):
    """An event the worker would dead-letter: ``reason`` is the dead-letter reason."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class BrokerUnavailable(ConnectionError):
    """No broker answered at start (or within ``wait_for_broker``); the message names the
    broker and what to check. Nothing is left open."""


class PublishFailed(RuntimeError):
    """Events the broker has not acknowledged in time (see :class:`FlushTimeout`)."""


class FlushTimeout(PublishFailed, TimeoutError):
    """A flush that ran out of time. The events are still kept, and are sent when the broker
    takes them; ``held`` says how many, ``dropped`` how many were dropped so far."""

    def __init__(self, message: str, held: int, dropped: int):
        super().__init__(message)
        self.held = held
        self.dropped = dropped


@dataclass(frozen=True)
class PublisherStats:
    """What a publisher has done so far (:meth:`AsyncPublisher.stats`)."""

    #: events taken by ``publish`` (valid, and not dropped at once)
    events: int
    #: events the broker acknowledged
    delivered: int
    #: messages (one event or a batch) the broker acknowledged
    messages: int
    #: events kept now: batched, sending, or waiting for an acknowledgement
    held: int
    #: events dropped, never sent: a full buffer, a message the broker can never take, or
    #: still waiting to be sent when a close ran out of time
    dropped: int
    #: events sent and not acknowledged when a close ran out of time: they may have arrived
    unconfirmed: int
    #: sends or deliveries that failed (each message was kept and sent again)
    failures: int
    #: ``time.time()`` since when the broker has not taken events; ``None`` while it does
    broker_away_since: float | None
    #: the last failure, as a person reads it
    last_error: str | None


# The publisher whose work is running: set around the tasks it starts, so that aiokafka's
# tasks inherit it and a log filter can tell this publisher's lines from other clients'.
_OWNER: contextvars.ContextVar[AsyncPublisher | None] = contextvars.ContextVar(
    "memdiag_publisher", default=None
)
_quieter_lock = threading.Lock()
_quieter_installed = False


class _Quieter(logging.Filter):
    """Lets each of aiokafka's lines about a publisher's connections through once a minute
    (a dead broker gives about 20 a second), and keeps the last ones for our own message."""

    def filter(self, record: logging.LogRecord) -> bool:
        owner = _OWNER.get()
        if owner is None:
            return True
        return owner._let_through(record)


def _install_quieter() -> None:
    global _quieter_installed
    with _quieter_lock:
        if _quieter_installed:
            return
        quieter = _Quieter()
        names = {"aiokafka"} | {
            name for name in logging.Logger.manager.loggerDict if name.startswith("aiokafka.")
        }
        for name in sorted(names):  # a logger's filters do not see its children's records
            logging.getLogger(name).addFilter(quieter)
        _quieter_installed = True


class _Room:
    """The bounded buffer's gauge: events and bytes kept. Thread-safe, so the blocking
    publisher decides in the caller's thread, exactly, whether an event is kept."""

    def __init__(self, max_events: int, max_bytes: int):
        self.max_events, self.max_bytes = max_events, max_bytes
        self.events = 0
        self.bytes = 0
        self.cond = threading.Condition()

    def take(self, size: int) -> bool:
        with self.cond:
            if self.events + 1 > self.max_events or self.bytes + size > self.max_bytes:
                return False
            self.events += 1
            self.bytes += size
            return True

    def fits(self, size: int) -> bool:
        with self.cond:
            return self.events + 1 <= self.max_events and self.bytes + size <= self.max_bytes

    def give(self, events: int, size: int) -> None:
        with self.cond:
            self.events -= events
            self.bytes -= size
            self.cond.notify_all()


# (topic, key, value, events in it, their bytes, order of making): a message put back after a
# failure goes back in its order, so one key's events keep theirs
_Message = tuple[str, bytes, bytes, int, int, int]


def _made(message: _Message) -> int:
    return message[5]


class AsyncPublisher:
    """See the module docstring. Not thread-safe: use it from one event loop."""

    def __init__(
        self,
        bootstrap_servers: str | None = None,
        *,
        settings: Settings | None = None,
        linger_ms: float = 50.0,
        max_batch_events: int = 500,
        max_batch_bytes: int = 900 * 1024,
        max_held_events: int = 100_000,
        max_held_bytes: int = 64 * 1024 * 1024,
        max_block_seconds: float = 5.0,
        wait_for_broker: float | None = 0.0,
        request_timeout_ms: int = 5_000,
        producer: Any = None,
    ):
        """``bootstrap_servers``: ``host:port`` or ``kafka://host:port`` (several separated by
        commas), as ``MEMDIAG_BROKER``; without it and ``settings``, the ``MEMDIAG_*``
        environment (:meth:`memdiag.settings.Settings.from_env`) decides, security included.
        ``request_timeout_ms``: how long a send may wait for the broker before it counts as
        failed and is sent again. ``producer``: an aiokafka-like producer, for tests."""
        if not 0 <= linger_ms <= MAX_LINGER_MS:
            raise ValueError(f"linger_ms must be between 0 and {MAX_LINGER_MS}, not {linger_ms}")
        if max_held_events < 1 or max_held_bytes < 1:
            raise ValueError("max_held_events and max_held_bytes must be at least 1")
        if wait_for_broker is not None and wait_for_broker < 0:
            raise ValueError(f"wait_for_broker must be >= 0 or None, not {wait_for_broker}")
        if settings is None:
            overrides = {} if bootstrap_servers is None else {"broker": bootstrap_servers}
            settings = Settings.from_env(None, **overrides)
        self.settings = settings
        self.linger = linger_ms / 1000
        self.max_batch_events = max_batch_events
        self.max_batch_bytes = max_batch_bytes
        self.max_block_seconds = max_block_seconds
        self.wait_for_broker = wait_for_broker
        self.request_timeout = request_timeout_ms / 1000
        topics = settings.topics
        self._routes = {kind: (topics.events, "session_id") for kind in SESSION_KINDS}
        self._routes.update({kind: (topics.judgements, "run_id") for kind in JUDGEMENT_KINDS})
        self._routes.update({kind: (topics.memory, "agent_id") for kind in MEMORY_KINDS})
        self._decoders = {
            topic: Decoder(kinds, topic, settings.max_event_bytes, settings.max_skew_us)
            for topic, kinds in (
                (topics.events, SESSION_KINDS),
                (topics.judgements, JUDGEMENT_KINDS),
                (topics.memory, MEMORY_KINDS),
            )
        }
        self._producer = producer
        self._own_producer = producer is None
        self._room = _Room(max_held_events, max_held_bytes)
        # (topic, key) -> (encoded events, their bytes, when the first one came)
        self._buffers: dict[tuple[str, bytes], tuple[list[bytes], int, float]] = {}
        self._outbox: deque[_Message] = deque()  # ready, in the order they go
        self._retry: list[_Message] = []  # failed, to go back to the outbox's front in order
        self._made = 0  # messages made
        self._probe_failed: set[str] = set()  # topics whose try failed, while away
        self._in_flight: dict[asyncio.Future[Any], _Message] = {}
        self._started = False
        self._closing = False
        self._timer: asyncio.Task[None] | None = None
        self._send_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # something is buffered
        self._has_mail = asyncio.Event()  # something is in the outbox
        self._changed = asyncio.Event()  # an acknowledgement, a drop, or room
        self._lock = threading.Lock()  # the counters, shared with the blocking publisher
        self._stopping: asyncio.Future[Any] | None = None  # the producer's stop, at close
        self._events = self._delivered_events = self._messages = 0
        self._dropped = self._failures = self._unconfirmed = 0
        self._away_since: float | None = None  # time.time()
        #: away only because nothing was acknowledged (no delivery failed): the next
        #: acknowledgement, of any message, says it is back
        self._stalled = False
        self._last_error: str | None = None
        self._next_warning = 0.0  # time.monotonic(): the next 'away' warning may be said
        self._next_back = 0.0  # and the next 'back' one
        self._next_drop_warning = 0.0  # and the next 'dropped' one
        self._last_ack = 0.0  # time.monotonic() of the last acknowledgement
        self._dropped_said = 0
        self._quiet: dict[tuple[str, object], float] = {}  # aiokafka's lines, when let through
        self._said: deque[str] = deque(maxlen=5)  # aiokafka's last lines at WARNING or above

    # -- starting -----------------------------------------------------------------------

    async def start(self) -> AsyncPublisher:
        """Connect (see ``wait_for_broker``), then start sending. Raises
        :class:`BrokerUnavailable` when no broker answered in time."""
        _install_quieter()
        token = _OWNER.set(self)  # aiokafka's tasks, started below, inherit it
        try:
            if self._own_producer:
                if self.wait_for_broker is None:
                    client_options(self.settings)  # a bad setting raises here, not later
                    self._producer = None  # the sender connects in the background
                else:
                    self._producer = await self._connect(time.monotonic() + self.wait_for_broker)
            self._timer = asyncio.ensure_future(self._linger_loop())
            self._send_task = asyncio.ensure_future(self._sender())
        finally:
            _OWNER.reset(token)
        self._started = True
        return self

    def _new_producer(self) -> Any:
        return AIOKafkaProducer(
            **client_options(self.settings),
            acks="all",
            linger_ms=5,
            max_batch_size=1024 * 1024,
            max_request_size=8 * 1024 * 1024,
            request_timeout_ms=int(self.request_timeout * 1000),
        )

    async def _connect(self, deadline: float | None) -> Any:
        """A started producer; retries until ``deadline`` (``None``: one attempt, returning
        ``None`` on failure instead of raising)."""
        pause = BACKOFF_SECONDS[0]
        while True:
            producer = self._new_producer()  # a bad setting raises here
            try:
                await producer.start()
                return producer
            except BaseException as exc:  # noqa: BLE001 - said in our words, or kept for a retry
                await self._discard(producer)  # also when cancelled: nothing left open
                if not isinstance(exc, Exception):
                    raise
                self._note_error(exc)
                if deadline is None:
                    return None
                # a login the broker refused stays refused: said at once, not retried
                refused = login_refused(self.settings, exc, list(self._said))
                if refused or time.monotonic() >= deadline:
                    raise BrokerUnavailable(
                        "memdiag's publisher could not connect: "
                        + describe_failure(self.settings, exc, list(self._said))
                        + (
                            ""
                            if refused
                            else f" (retried for {self.wait_for_broker:g} s)"
                            if self.wait_for_broker
                            else "; pass wait_for_broker=SECONDS to wait for it, or None "
                            "to connect in the background"
                        )
                    ) from exc
                await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
                pause = min(pause * 2, BACKOFF_SECONDS[1])

    async def _discard(self, producer: Any) -> None:
        """Stop a producer that failed, so nothing is left open; never waits long."""
        try:
            await asyncio.wait_for(asyncio.shield(producer.stop()), self.request_timeout)
        except BaseException:  # noqa: BLE001 - already failed; this only closes what is left
            log.debug("stopping a failed producer", exc_info=True)

    async def __aenter__(self) -> AsyncPublisher:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- taking events ------------------------------------------------------------------

    def route(self, event: Event | Mapping[str, Any]) -> tuple[str, bytes, bytes]:
        """(topic, key, encoded event) for a valid event; raises :class:`EventRejected`, or
        ``TypeError`` for something that is not a mapping."""
        if isinstance(event, msgspec.Struct):
            event = msgspec.to_builtins(event)
        if not isinstance(event, Mapping):
            raise TypeError(
                f"an event is a mapping (a dict, or a memdiag.events TypedDict), "
                f"not {type(event).__name__}"
            )
        # a dict (a TypedDict is one) as it is; another mapping copied, for orjson
        data = cast("dict[str, Any]", event) if type(event) is dict else dict(event)
        kind = data.get("kind")
        route = self._routes.get(kind) if isinstance(kind, str) else None
        if route is None:
            raise EventRejected(
                UNKNOWN_KIND,
                f"kind {kind!r} is not one of {', '.join(sorted(self._routes))}",
            )
        topic, key_field = route
        try:
            raw = orjson.dumps(data)
        except TypeError as exc:
            raise TypeError(f"the event is not JSON: {exc}") from exc
        decoded = self._decoders[topic].decode(raw, time.time_ns() // 1_000_000)
        if decoded.rejected:
            r = decoded.rejected[0]
            raise EventRejected(r.reason, r.detail)
        return topic, str(data[key_field]).encode("utf-8"), raw

    async def publish(self, event: Event | Mapping[str, Any]) -> bool:
        """Validate and keep one event (sent within ``linger_ms``). ``False``: the buffer
        was full and the event is dropped (counted in :meth:`stats`)."""
        self._check()
        topic, key, raw = self.route(event)
        if not self._room.take(len(raw)):
            if not await self._wait_for_room(len(raw)):
                self._full(1)
                return False
            if self._closing:  # closed while it waited for room: it would not be sent
                self._room.give(1, len(raw))
                self._check()
        with self._lock:
            self._events += 1
        self.add(topic, key, raw)
        return True

    def _taking(self) -> bool:
        """Whether the broker takes events: not known away, and an acknowledgement within
        ``STALL_SECONDS`` while messages wait for one. A dead broker is known away when a
        delivery fails (after ``request_timeout_ms``), or when this says no and an event is
        dropped for want of room (:meth:`_full`)."""
        if self._away_since is not None:
            return False
        return not self._in_flight or time.monotonic() - self._last_ack < STALL_SECONDS

    async def _wait_for_room(self, size: int) -> bool:
        deadline = time.monotonic() + self.max_block_seconds
        while self._taking():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._changed.clear()
            if self._room.take(size):
                return True
            try:  # in slices: a broker that stops acknowledging is seen within one
                await asyncio.wait_for(self._changed.wait(), min(left, 0.1))
            except TimeoutError:
                pass
        return self._room.take(size)

    def add(self, topic: str, key: bytes, raw: bytes) -> None:
        """Queue one validated, encoded event whose room is taken. Synchronous, so the
        events of a key stay in the order they were added, whoever adds them."""
        k = (topic, key)
        buffered = self._buffers.get(k)
        if buffered is not None and buffered[1] + len(raw) + 1 > self.max_batch_bytes:
            self._ready(k)
            buffered = None
        lines, size, since = buffered or ([], 0, time.monotonic())
        lines.append(raw)
        self._buffers[k] = (lines, size + len(raw) + 1, since)
        if len(lines) >= self.max_batch_events:
            self._ready(k)
        elif len(self._buffers) == 1:
            self._wake.set()

    def _ready(self, k: tuple[str, bytes]) -> None:
        """Move a key's buffer to the outbox, which one task sends in order."""
        lines = self._buffers.pop(k)[0]
        value = lines[0] if len(lines) == 1 else b"[" + b",".join(lines) + b"]"
        self._made += 1
        self._outbox.append((k[0], k[1], value, len(lines), sum(map(len, lines)), self._made))
        self._has_mail.set()

    async def _linger_loop(self) -> None:
        while True:
            if not self._buffers:
                self._wake.clear()
                await self._wake.wait()
                continue
            oldest = min(since for _, _, since in self._buffers.values())
            wait = oldest + self.linger - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            now = time.monotonic()
            due = [k for k, (_, _, since) in self._buffers.items() if now - since >= self.linger]
            for k in due:
                self._ready(k)

    # -- sending ------------------------------------------------------------------------

    async def _sender(self) -> None:
        while True:
            try:
                await self._send_loop()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a bug of ours must not stop the sending
                self._note_error(exc)
                log.exception("memdiag publisher: the sender failed; it starts again")
                await asyncio.sleep(BACKOFF_SECONDS[1])

    async def _send_loop(self) -> None:
        pause = BACKOFF_SECONDS[0]
        while True:
            if self._producer is None:  # connecting in the background
                self._producer = await self._connect(None)
                if self._producer is None:
                    self._mark_away()
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, BACKOFF_SECONDS[1])
                    continue
                self._mark_back()
                pause = BACKOFF_SECONDS[0]
            self._requeue()
            if not self._outbox:
                self._has_mail.clear()
                await self._has_mail.wait()
                continue
            if self._away_since is not None:
                # the broker went away: let what is in flight settle, then try one message
                # at a time until the broker takes one. Each settled one is looked at: after a
                # stall, the first acknowledgement says the broker is back, and the outbox
                # goes on at once rather than after the slowest of the rest
                if self._in_flight:
                    await asyncio.wait(list(self._in_flight), return_when=asyncio.FIRST_COMPLETED)
                    await asyncio.sleep(0)  # their callbacks put the failed ones back
                    continue
                message = self._next_probe()
                future = await self._send(message)
                if future is not None:
                    await asyncio.wait([future])
                    await asyncio.sleep(0)  # its callback has run
                    if not future.cancelled() and future.exception() is None:
                        self._mark_back()
                        pause = BACKOFF_SECONDS[0]
                        continue
                self._probe_failed.add(message[0])
                self._warn_if_due()
                await asyncio.sleep(pause)
                pause = min(pause * 2, BACKOFF_SECONDS[1])
                continue
            await self._send(self._outbox.popleft())
            while len(self._in_flight) >= MAX_IN_FLIGHT and self._away_since is None:
                await asyncio.wait(list(self._in_flight), return_when=asyncio.FIRST_COMPLETED)

    def _next_probe(self) -> _Message:
        """The oldest message of a topic not yet tried in vain since the broker went away: a
        topic that does not exist does not hold up the others, and the messages of a key (all
        on one topic) still go in order."""
        for i, message in enumerate(self._outbox):
            if message[0] not in self._probe_failed:
                del self._outbox[i]
                return message
        self._probe_failed.clear()  # each failed once: round again
        return self._outbox.popleft()

    def _requeue(self) -> None:
        """Failed messages back into the outbox, in the order they were made among those
        already put back (failures come one after another: a later one, of a newer message,
        must not go before an older one put back earlier)."""
        if self._retry:
            merged = sorted([*self._retry, *self._outbox], key=_made)
            self._outbox.clear()
            self._outbox.extend(merged)
            self._retry.clear()

    async def _send(self, message: _Message) -> asyncio.Future[Any] | None:
        """Hand one message to the producer; ``None`` when that failed (the message is kept,
        or dropped if the broker can never take it)."""
        topic, key, value = message[:3]
        try:
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation
            async with asyncio.timeout(self.request_timeout):
                future: asyncio.Future[Any] = await self._producer.send(topic, value=value, key=key)
        except asyncio.CancelledError:
            self._outbox.appendleft(message)
            raise
        except Exception as exc:  # noqa: BLE001 - kept and sent again, or dropped and said
            self._failed(message, exc)
            return None
        if not self._in_flight:
            self._last_ack = time.monotonic()  # waiting starts now
        self._in_flight[future] = message
        future.add_done_callback(self._settled)
        return future

    def _settled(self, future: asyncio.Future[Any]) -> None:
        failure = None if future.cancelled() else future.exception()  # always read
        message = self._in_flight.pop(future, None)
        if message is None:
            return
        if future.cancelled():
            self._failed(message, asyncio.CancelledError("the send was cancelled"))
        elif failure is not None:
            self._failed(message, failure)
        else:
            self._last_ack = time.monotonic()
            with self._lock:
                self._delivered_events += message[3]
                self._messages += 1
            self._room.give(message[3], message[4])
            self._changed.set()
            if self._stalled:  # away for want of acknowledgements, and here is one
                self._mark_back()

    def _failed(self, message: _Message, exc: BaseException) -> None:
        with self._lock:
            self._failures += 1
        self._note_error(exc)
        if isinstance(exc, _NEVER_TAKEN):
            if self._stalled:  # the broker answered: it is there (the drop is said as such)
                self._mark_back()
            self._room.give(message[3], message[4])
            self._drop(message[3], f"the broker can never take this message ({exc!r})")
            return
        self._retry.append(message)
        self._has_mail.set()
        # a failed delivery: only a probe that goes says the broker is back (a message sent
        # before the failure and acknowledged after it says nothing of the broker that failed)
        self._stalled = False
        self._mark_away()

    # -- saying what happens ------------------------------------------------------------

    def _note_error(self, exc: BaseException) -> None:
        name, said = type(exc).__name__, str(exc)
        self._last_error = said if said.startswith(name) else f"{name}: {said}" if said else name

    def _full(self, events: int, counted: bool = False) -> None:
        """Events dropped for want of room. If that is because nothing was acknowledged for
        ``STALL_SECONDS`` while messages wait, the broker is away (it may die and come back
        within aiokafka's request timeout, and no delivery ever fails): the warning says
        so, and when it is back, rather than "the buffer is full"."""
        if self._away_since is None and self._in_flight:
            stalled = time.monotonic() - self._last_ack
            if stalled >= STALL_SECONDS:
                # true whenever it is read later (a warning a minute on), unlike the seconds
                self._last_error = (
                    f"no acknowledgement for over {STALL_SECONDS:g} s while messages waited"
                )
                self._away_since = time.time() - stalled  # since the last acknowledgement
                self._stalled = True
        self._drop(events, "the buffer is full", counted)  # the warning counts this drop

    def _drop(self, events: int, why: str, counted: bool = False) -> None:
        if not counted:
            with self._lock:
                self._dropped += events
        self._changed.set()
        if self._away_since is None:
            self._warn_if_due(f"dropped {events} event(s): {why}")
        else:  # while away, the minute's warning says it (due or not)
            self._warn_if_due()

    def _mark_away(self) -> None:
        if self._away_since is None:
            self._away_since = time.time()
            self._changed.set()  # a publisher waiting for room stops waiting
        self._warn_if_due()

    def _mark_back(self) -> None:
        if self._away_since is None:
            return
        away = time.time() - self._away_since
        self._away_since = None
        self._stalled = False
        self._probe_failed.clear()
        now = time.monotonic()
        if now < self._next_back:  # a broker that comes and goes: once a minute
            return
        self._next_back = now + WARN_EVERY_SECONDS
        s = self.stats()
        log.warning(
            "memdiag publisher: the broker at %s takes events again after %.0f s; sending the "
            "%d kept (%d dropped so far)", self.settings.bootstrap_servers, away, s.held,
            s.dropped,
        )  # fmt: skip

    def _warn_if_due(self, what: str | None = None) -> None:
        """The minute's warning: the broker away (with the counts), else ``what`` (a drop
        while the broker takes events). Each kind at most once a minute, apart."""
        now = time.monotonic()
        s = self.stats()
        if self._away_since is not None:
            if now < self._next_warning:
                return
            self._next_warning = now + WARN_EVERY_SECONDS
            new_drops = s.dropped - self._dropped_said
            self._dropped_said = s.dropped
            since = time.strftime("%H:%M:%S", time.localtime(self._away_since))
            log.warning(
                "memdiag publisher: the broker at %s has not taken events since %s (%s); "
                "%d kept and retried, %d dropped so far (%d since the last warning; the "
                "buffer keeps %d). Check that the broker runs and MEMDIAG_BROKER points at it",
                self.settings.bootstrap_servers, since, s.last_error, s.held, s.dropped,
                new_drops, self._room.max_events,
            )  # fmt: skip
        elif what is not None:
            if now < self._next_drop_warning:
                return
            self._next_drop_warning = now + WARN_EVERY_SECONDS
            self._dropped_said = s.dropped
            log.warning(
                "memdiag publisher: %s; %d dropped so far (said at most once a minute)",
                what, s.dropped,
            )  # fmt: skip

    def _let_through(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            self._said.append(record.getMessage())
        key = (record.name, record.msg)
        now = time.monotonic()
        if now < self._quiet.get(key, 0.0):
            return False
        self._quiet[key] = now + WARN_EVERY_SECONDS
        return True

    def stats(self) -> PublisherStats:
        """What this publisher has done so far; thread-safe."""
        with self._lock:
            return PublisherStats(
                events=self._events,
                delivered=self._delivered_events,
                messages=self._messages,
                held=self._room.events,
                dropped=self._dropped,
                unconfirmed=self._unconfirmed,
                failures=self._failures,
                broker_away_since=self._away_since,
                last_error=self._last_error,
            )

    @property
    def events(self) -> int:
        """Events taken by ``publish`` (kept for code written before :meth:`stats`)."""
        return self._events

    @property
    def messages(self) -> int:
        """Messages acknowledged (kept for code written before :meth:`stats`)."""
        return self._messages

    def _check(self) -> None:
        if not self._started or self._closing:
            raise RuntimeError("the publisher is closed (or was never started)")

    # -- flushing and closing -----------------------------------------------------------

    async def flush(self, timeout: float | None = DEFAULT_TIMEOUT_SECONDS) -> None:
        """Send every kept event and wait until the broker has acknowledged all of them (also
        those another caller published meanwhile). Raises :class:`FlushTimeout` after
        ``timeout`` seconds (``None``: no limit), with the events still kept."""
        for k in list(self._buffers):
            self._ready(k)
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._room.events > 0:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                s = self.stats()
                away = (
                    f"the broker at {self.settings.bootstrap_servers} has not taken events "
                    f"since {time.strftime('%H:%M:%S', time.localtime(s.broker_away_since))} "
                    f"({s.last_error})"
                    if s.broker_away_since is not None
                    else f"the broker at {self.settings.bootstrap_servers} is slow to acknowledge"
                )
                raise FlushTimeout(
                    f"flush ran out after {timeout:g} s with {s.held} events not yet "
                    f"acknowledged: {away}. They are kept and sent when it takes them; "
                    f"{s.dropped} dropped so far",
                    s.held,
                    s.dropped,
                )
            for k in list(self._buffers):  # published meanwhile
                self._ready(k)
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(left or 0.05, 0.05))
            except TimeoutError:
                pass

    async def close(self, timeout: float | None = DEFAULT_TIMEOUT_SECONDS) -> None:
        """Flush (for at most ``timeout`` seconds), then stop. What was never sent by then is
        counted as dropped; what was sent and not acknowledged as ``unconfirmed`` (it may
        have arrived). Both are said."""
        if not self._started or self._timer is None:
            return
        self._closing = True  # what comes now would not be flushed: refuse it
        start = time.monotonic()
        late: FlushTimeout | None = None
        try:
            await self.flush(timeout)
        except FlushTimeout as exc:
            late = exc
        finally:
            tasks = [t for t in (self._timer, self._send_task) if t is not None]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=1.0)
            self._timer = self._send_task = None
            self._requeue()
            unconfirmed = sum(m[3] for m in self._in_flight.values())
            self._in_flight.clear()  # what settles from now on is not counted twice
            if self._own_producer and self._producer is not None:
                # the producer sends what it holds for the time left, and lets go of its
                # connections in the background after that: its requests run out after
                # request_timeout_ms whatever happens
                stopping = asyncio.ensure_future(self._producer.stop())
                left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
                await asyncio.wait([stopping], timeout=left)
                self._stopping = stopping
        held = self._room.events
        if held:
            self._room.give(held, self._room.bytes)
            with self._lock:
                self._dropped += held - unconfirmed
                self._unconfirmed += unconfirmed
            away = (
                f"the broker at {self.settings.bootstrap_servers} has not taken events since "
                f"{time.strftime('%H:%M:%S', time.localtime(self._away_since))} "
                f"({self._last_error})"
                if self._away_since is not None
                else f"the broker at {self.settings.bootstrap_servers} did not acknowledge "
                "them in time"
            )
            log.warning(
                "memdiag publisher: closed with %d events never sent, counted as dropped (%d "
                "in all), and %d sent but not acknowledged (they may have arrived): %s",
                held - unconfirmed, self._dropped, unconfirmed, away,
            )  # fmt: skip
        del late


class Publisher:
    """A blocking :class:`AsyncPublisher` for code without an event loop: it runs one in a
    thread of its own. Thread-safe; closed at interpreter exit if still open. Takes the
    keyword arguments of :class:`AsyncPublisher`; raises :class:`BrokerUnavailable` as it
    does, with its thread stopped."""

    def __init__(self, bootstrap_servers: str | None = None, **kwargs: Any):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="memdiag-publisher", daemon=True
        )
        self._thread.start()
        self._closed = False
        try:
            self._inner: AsyncPublisher = self._call(self._make(bootstrap_servers, kwargs))
        except BaseException:
            self._closed = True
            self._stop_loop()
            raise
        self._lock = threading.Lock()
        self._incoming: list[tuple[str, bytes, bytes]] = []  # published, not yet on the loop
        self._handing = False  # a hand-over is scheduled on the loop
        atexit.register(self.close)  # what is kept at exit is still sent

    async def _make(self, bootstrap_servers: str | None, kwargs: dict[str, Any]) -> AsyncPublisher:
        return await AsyncPublisher(bootstrap_servers, **kwargs).start()

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def publish(self, event: Event | Mapping[str, Any]) -> bool:
        """Validate and keep one event; raises :class:`EventRejected` for a bad one, and
        ``TypeError`` for something that is not a mapping. ``False``: the buffer was full
        and the event is dropped (counted in :meth:`stats`). Validation runs in the caller's
        thread; the event joins the loop's queue without a round trip, in call order."""
        if self._closed:
            raise RuntimeError("the publisher is closed")
        inner = self._inner
        inner._check()
        with self._lock:  # the decoder keeps per-call state
            topic, key, raw = inner.route(event)
        deadline = time.monotonic() + inner.max_block_seconds
        while True:
            # the room is taken under the lock close takes, with the event handed over: close
            # never counts, as kept and not sent, an event whose publish it then refuses
            with self._lock:  # one wake-up of the loop for all that came meanwhile, in order
                if self._closed:  # close began meanwhile: it would not be sent, nor counted
                    raise RuntimeError("the publisher is closed")
                if inner._room.take(len(raw)):
                    with inner._lock:
                        inner._events += 1
                    self._incoming.append((topic, key, raw))
                    if not self._handing:
                        self._handing = True
                        self._loop.call_soon_threadsafe(self._hand_over)
                    return True
            if not self._room_may_come(inner, len(raw), deadline):
                break
        with inner._lock:  # counted here, so stats() is exact on return
            inner._dropped += 1
        try:
            self._loop.call_soon_threadsafe(inner._full, 1, True)
        except RuntimeError:  # closed meanwhile, the loop gone: the drop is counted, unsaid
            pass
        return False

    async def _hand_over_then_close(self, timeout: float | None) -> None:
        self._hand_over()  # whatever is still on its way to the loop
        await self._inner.close(timeout)
        if self._inner._stopping is not None:  # the loop stops next: let the producer finish
            await asyncio.wait([self._inner._stopping], timeout=1.0)

    def _hand_over(self) -> None:
        """On the loop: what the callers' threads published since the last hand-over."""
        with self._lock:
            incoming, self._incoming = self._incoming, []
            self._handing = False
        for topic, key, raw in incoming:
            self._inner.add(topic, key, raw)

    @staticmethod
    def _room_may_come(inner: AsyncPublisher, size: int, deadline: float) -> bool:
        """Wait, while the broker takes events and until ``deadline``, for room for
        ``size`` bytes; whether to try again to take it. Once the broker is not taking
        events, one more try (room freed meanwhile), then no."""
        room = inner._room
        with room.cond:
            if not room.fits(size):
                if not inner._taking():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                room.cond.wait(min(left, 0.1))
            return True

    def stats(self) -> PublisherStats:
        return self._inner.stats()

    def flush(self, timeout: float | None = DEFAULT_TIMEOUT_SECONDS) -> None:
        """As :meth:`AsyncPublisher.flush`: raises :class:`FlushTimeout` after ``timeout``."""
        self._call(self._inner.flush(timeout))

    def close(self, timeout: float | None = DEFAULT_TIMEOUT_SECONDS) -> None:
        """As :meth:`AsyncPublisher.close`; returns within ``timeout`` seconds and one more
        (the producer letting go of a broker that is gone)."""
        with self._lock:  # a publish either hands its event over before this, or is refused
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self.close)
        try:
            self._call(self._hand_over_then_close(timeout))
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        async def cancel_the_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.wait(tasks, timeout=1.0) if tasks else None

        try:
            self._call(cancel_the_rest(), 2.0)
        except Exception:  # noqa: BLE001 - stopping anyway
            log.debug("tasks left at close", exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
