"""The Python publisher for agent runtimes: validate, route, key and batch events.

    from memdiag.client import Publisher

    with Publisher("localhost:9092") as memdiag:       # or Publisher(settings=...)
        memdiag.publish({"kind": "search", "event_id": "e1", "ts": "...", ...})

:class:`AsyncPublisher` is the same for asyncio code (``await publisher.publish(event)``).

- **Validation.** Every event is checked against the JSON Schemas with the worker's own
  compiled validators before it is sent; a bad one raises :class:`EventRejected` with the
  reason and a detail that says what to fix, and nothing is sent. (The worker still judges
  everything it receives: this only moves the error to where it can be fixed.)
- **Routing and keys** as the contract says: session events to ``events`` keyed by
  ``session_id``, judgements to ``judgements`` keyed by ``run_id``, the recall pipeline's
  events to ``memory`` keyed by ``agent_id``.
- **Batching**, like OpenTelemetry's ``BatchSpanProcessor``: events of one key wait at most
  ``linger_ms`` (default 50, at most 100) and go as one message (a JSON array), at most
  ``max_batch_events`` events and ``max_batch_bytes`` bytes. The order of one key's events
  is kept.
- **Flush and close.** :meth:`flush` sends everything and waits for the broker's
  acknowledgement (``acks=all``), and raises :class:`PublishFailed` if the broker did not
  take something; :meth:`close` flushes. Interpreter exit closes a :class:`Publisher` that
  is still open, as a last resort (at most 30 s; at exit Python may already refuse the
  connection a first send needs): close it, or use ``with``.

What a crash loses: the events of the last ``linger_ms`` not yet handed to the producer, and
whatever the producer had not yet had acknowledged. Call :meth:`flush` where the runtime
needs a guarantee (for example before it reports a session's outcome to a user); a
redelivered event is harmless, since the worker counts each ``event_id`` once.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer

from memdiag.contract import UNKNOWN_KIND
from memdiag.kafka import client_options
from memdiag.schemas import JUDGEMENT_KINDS, MEMORY_KINDS, SESSION_KINDS
from memdiag.schemas.decode import Decoder
from memdiag.settings import Settings

#: The longest an event waits in the publisher for others of its key.
MAX_LINGER_MS = 100
#: Messages waiting for the producer at most; publishing waits beyond (backpressure).
MAX_OUTBOX = 10_000
#: How long the blocking publisher's close (and so interpreter exit) waits for the broker.
CLOSE_TIMEOUT_SECONDS = 30.0


class EventRejected(ValueError):
    """An event the worker would dead-letter: ``reason`` is the dead-letter reason."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class PublishFailed(RuntimeError):
    """The broker did not take some events (the cause is chained); they may be lost."""


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
        producer: Any = None,
    ):
        if not 0 <= linger_ms <= MAX_LINGER_MS:
            raise ValueError(f"linger_ms must be between 0 and {MAX_LINGER_MS}, not {linger_ms}")
        if settings is None:
            overrides = {} if bootstrap_servers is None else {"broker": bootstrap_servers}
            settings = Settings.from_env(None, **overrides)
        self.settings = settings
        self.linger = linger_ms / 1000
        self.max_batch_events = max_batch_events
        self.max_batch_bytes = max_batch_bytes
        topics = settings.topics
        self._routes = {kind: (topics.events, "session_id") for kind in SESSION_KINDS}
        self._routes.update({kind: (topics.judgements, "run_id") for kind in JUDGEMENT_KINDS})
        self._routes.update({kind: (topics.memory, "agent_id") for kind in MEMORY_KINDS})
        self._decoders = {
            topics.events: Decoder(
                SESSION_KINDS, topics.events, settings.max_event_bytes, settings.max_skew_us
            ),
            topics.judgements: Decoder(
                JUDGEMENT_KINDS, topics.judgements, settings.max_event_bytes, settings.max_skew_us
            ),
            topics.memory: Decoder(
                MEMORY_KINDS, topics.memory, settings.max_event_bytes, settings.max_skew_us
            ),
        }
        self._producer = producer
        self._own_producer = producer is None
        # (topic, key) -> (encoded events, their bytes, when the first one came)
        self._buffers: dict[tuple[str, bytes], tuple[list[bytes], int, float]] = {}
        self._pending: set[asyncio.Future[Any]] = set()  # sent, not yet acknowledged
        self._failed: BaseException | None = None  # the first send or delivery that failed
        self._closing = False
        self._outbox: deque[tuple[str, bytes, bytes]] = deque()
        self._timer: asyncio.Task[None] | None = None
        self._send_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # something is buffered
        self._has_mail = asyncio.Event()  # something is in the outbox
        self._idle = asyncio.Event()  # the sender has nothing in hand
        self._idle.set()
        self._room = asyncio.Event()  # the outbox has room
        self.events = 0
        self.messages = 0

    async def start(self) -> AsyncPublisher:
        if self._producer is None:
            self._producer = AIOKafkaProducer(
                **client_options(self.settings),
                acks="all",
                linger_ms=5,
                max_batch_size=1024 * 1024,
                max_request_size=8 * 1024 * 1024,
            )
        if self._own_producer:
            await self._producer.start()
        self._timer = asyncio.ensure_future(self._linger_loop())
        self._send_task = asyncio.ensure_future(self._sender())
        return self

    async def __aenter__(self) -> AsyncPublisher:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def route(self, event: Mapping[str, Any]) -> tuple[str, bytes, bytes]:
        """(topic, key, encoded event) for a valid event; raises :class:`EventRejected`."""
        kind = event.get("kind")
        route = self._routes.get(kind) if isinstance(kind, str) else None
        if route is None:
            raise EventRejected(
                UNKNOWN_KIND,
                f"kind {kind!r} is not one of {', '.join(sorted(self._routes))}",
            )
        topic, key_field = route
        raw = orjson.dumps(event)
        decoded = self._decoders[topic].decode(raw, time.time_ns() // 1_000_000)
        if decoded.rejected:
            r = decoded.rejected[0]
            raise EventRejected(r.reason, r.detail)
        return topic, str(event[key_field]).encode("utf-8"), raw

    async def publish(self, event: Mapping[str, Any]) -> None:
        """Validate and queue one event (sent within ``linger_ms``)."""
        self._check()
        topic, key, raw = self.route(event)
        self.add(topic, key, raw)
        if len(self._outbox) >= MAX_OUTBOX:
            await self.wait_room()

    def add(self, topic: str, key: bytes, raw: bytes) -> None:
        """Queue one validated, encoded event. Synchronous, so the events of a key stay in
        the order they were added, whoever adds them."""
        k = (topic, key)
        buffered = self._buffers.get(k)
        if buffered is not None and buffered[1] + len(raw) + 1 > self.max_batch_bytes:
            self._ready(k)
            buffered = None
        lines, size, since = buffered or ([], 0, time.monotonic())
        lines.append(raw)
        self._buffers[k] = (lines, size + len(raw) + 1, since)
        self.events += 1
        if len(lines) >= self.max_batch_events:
            self._ready(k)
        elif len(self._buffers) == 1:
            self._wake.set()

    def _ready(self, k: tuple[str, bytes]) -> None:
        """Move a key's buffer to the outbox, which one task sends in order."""
        lines = self._buffers.pop(k)[0]
        value = lines[0] if len(lines) == 1 else b"[" + b",".join(lines) + b"]"
        self._outbox.append((k[0], k[1], value))
        self._has_mail.set()

    async def _sender(self) -> None:
        try:
            while True:
                if not self._outbox:
                    self._idle.set()
                    self._room.set()
                    self._has_mail.clear()
                    await self._has_mail.wait()
                    continue
                self._idle.clear()
                topic, key, value = self._outbox.popleft()
                future = await self._producer.send(topic, value=value, key=key)
                self._pending.add(future)
                future.add_done_callback(self._delivered)
                self.messages += 1
                if len(self._outbox) < MAX_OUTBOX // 2:
                    self._room.set()
                while len(self._pending) >= 5_000 and self._failed is None:
                    await asyncio.wait(list(self._pending), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - kept, and raised to whoever waits
            self._failed = self._failed or exc
        finally:
            self._idle.set()
            self._room.set()

    def _delivered(self, future: asyncio.Future[Any]) -> None:
        self._pending.discard(future)
        if not future.cancelled() and future.exception() is not None and self._failed is None:
            self._failed = future.exception()

    def _check(self) -> None:
        if self._timer is None or self._closing:
            raise RuntimeError("the publisher is closed (or was never started)")
        if self._failed is not None:
            raise PublishFailed(
                f"an earlier send failed: {self._failed!r}; events since may be lost"
            ) from self._failed

    async def wait_room(self) -> None:
        """Wait until the outbox has room again (backpressure on a slow broker)."""
        self._room.clear()
        if len(self._outbox) >= MAX_OUTBOX // 2 and self._failed is None:
            await self._room.wait()

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

    async def flush(self) -> None:
        """Send every queued event and wait until the broker has acknowledged all of them
        (including those another caller sent meanwhile); raises :class:`PublishFailed` if
        any send or delivery failed."""
        for k in list(self._buffers):
            self._ready(k)
        while (self._outbox or not self._idle.is_set()) and self._failed is None:
            await self._idle.wait()
            await asyncio.sleep(0)
        if self._pending:
            await asyncio.wait(list(self._pending))
        if self._failed is not None:
            raise PublishFailed(f"a send failed: {self._failed!r}") from self._failed

    async def close(self) -> None:
        if self._timer is None:
            return
        self._closing = True  # what comes now would not be flushed: refuse it
        try:
            await self.flush()
        finally:
            for task in (self._timer, self._send_task):
                if task is not None:
                    task.cancel()
            self._timer = self._send_task = None
            if self._own_producer and self._producer is not None:
                await self._producer.stop()


class Publisher:
    """A blocking :class:`AsyncPublisher` for code without an event loop: it runs one in a
    thread of its own. Thread-safe; flushed at interpreter exit if still open."""

    def __init__(self, bootstrap_servers: str | None = None, **kwargs: Any):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="memdiag-publisher", daemon=True
        )
        self._thread.start()
        self._inner = self._call(self._make(bootstrap_servers, kwargs))
        self._lock = threading.Lock()
        self._closed = False
        atexit.register(self.close)  # what is queued at exit is still sent

    async def _make(self, bootstrap_servers: str | None, kwargs: dict[str, Any]) -> AsyncPublisher:
        return await AsyncPublisher(bootstrap_servers, **kwargs).start()

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def publish(self, event: Mapping[str, Any]) -> None:
        """Validate and queue one event; raises :class:`EventRejected` for a bad one.
        Validation runs in the caller's thread; the event joins the loop's queue without a
        round trip, in the order of the calls."""
        inner = self._inner
        if self._closed:
            raise RuntimeError("the publisher is closed")
        inner._check()
        with self._lock:  # the decoder keeps per-call state
            topic, key, raw = inner.route(event)
            self._loop.call_soon_threadsafe(inner.add, topic, key, raw)
        if len(inner._outbox) >= MAX_OUTBOX:
            self._call(inner.wait_room())

    def flush(self) -> None:
        self._call(self._inner.flush())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            self._call(self._inner.close(), CLOSE_TIMEOUT_SECONDS)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
