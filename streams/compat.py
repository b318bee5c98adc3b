"""Everything memdiag touches inside faust-streaming and aiokafka, in one place, checked.

:func:`check` runs before the worker starts: every private name below must exist with the
signature memdiag was written against, or the worker stops with one line naming the
faust-streaming version (``pyproject.toml`` pins the tested one). The touches:

- **Bulk delivery** (:func:`deliver_in_bulk`, ``Consumer._wait_next_records``). The stage
  topics' fetched records go to the runner a partition's run at a time; Faust's fetch loop
  handles only the rest (the changelogs, during recovery). Faust's per-record path (a message
  object, a conductor callback, an event and a queue per record, then four tasks for the
  delivery) was a third of the worker's time on single-event traffic.
- **The fetch wait** (:func:`patch_fetch_wait`, ``AIOKafkaConsumerThread.
  _create_worker_consumer`` and aiokafka's ``_fetch_max_wait_ms``). Faust hard-codes
  1,500 ms; Tansu holds an empty fetch that long even when records arrive meanwhile.
- **True end offsets at recovery** (:func:`patch_highwaters`, ``AIOKafkaConsumerThread.
  _highwaters``). Tansu answers ListOffsets(latest) with the base offset of a partition's
  last record batch plus one, so Faust's recovery stopped short of a last batch of several
  records. The patch reads the true end (:func:`memdiag.kafka.true_end_offsets`). Faust
  calls it only when it recovers a table, once per changelog partition; on Apache Kafka,
  where the answer is right, the cost is one fetch of one record per changelog partition
  at each recovery, nothing while records flow.
- **The committed offsets and the commit** (:class:`FaustKafka`): the consumer thread's
  aiokafka consumer, its coordinator's ``fetch_committed_offsets`` (one OffsetFetch for all
  partitions) and ``commit`` (one OffsetCommit), through ``call_thread``. Where nothing is
  committed, the runner starts where the tables' recovery says
  (:func:`memdiag.streams.tables.start_positions`); each commit tells the tables what it
  covers (:meth:`memdiag.streams.tables.CheckpointStore.committing`).
- **The store** (:mod:`memdiag.streams.tables`): Faust's ``Store`` interface, registered in
  its store registry.
- **No commit of Faust's own** (:func:`no_faust_commits`, ``Consumer._commit_handler``, a
  mode ``ServiceTask``). The checkpoint commits the offsets; Faust's timer called
  ``Consumer.commit`` every interval anyway, and it did nothing only because memdiag acks no
  message through Faust. The task is replaced by one that returns at once, so no other
  commit than the checkpoint's can ever be sent.
- **The producer** (:mod:`memdiag.streams.produce`): Faust's ``Producer._ensure_producer``,
  the started aiokafka producer, whose public batch API (``create_batch``, ``send_batch``,
  ``partitions_for``) every record of the worker's goes through, in batches it fills itself.
- **The produce requests' encoding** (:func:`patch_produce_encoding`, the module global
  ``ProduceRequest`` of ``aiokafka.producer.sender``). aiokafka copies each record batch six
  times as it encodes a request; :mod:`memdiag.streams.produce_request` copies it once, and
  gives the same bytes (checked on a sample here, on drawn requests in the tests).
- **The signals** (:mod:`memdiag.streams.worker`): ``Worker._on_sigterm`` and ``_on_sigint``,
  the handlers mode installs, extended to bound the stop (``MEMDIAG_SHUTDOWN_TIMEOUT_SECONDS``)
  and to exit at once on a second signal.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError
from aiokafka.structs import OffsetAndMetadata

from memdiag.kafka import DefaultPartitioner, true_end_offsets
from memdiag.streams.checkpoint import RECORD_LIMIT, TP, CommitRefused
from memdiag.streams.produce import Batches

log = logging.getLogger("memdiag.worker")


class IncompatibleFaust(RuntimeError):
    """The installed faust-streaming (or aiokafka) is not the one memdiag touches."""


#: (where, name, the parameters memdiag calls it with)
_EXPECTED: list[tuple[str, str, tuple[str, ...]]] = [
    ("faust.transport.consumer:Consumer", "_wait_next_records", ("self", "timeout")),
    ("faust.transport.consumer:Consumer", "seek_wait", ("self", "partitions")),
    ("faust.transport.consumer:Consumer", "earliest_offsets", ("self", "partitions")),
    ("faust.transport.consumer:Consumer", "highwaters", ("self", "partitions")),
    ("faust.transport.drivers.aiokafka:AIOKafkaConsumerThread", "_highwaters",
     ("self", "partitions")),
    ("faust.transport.drivers.aiokafka:AIOKafkaConsumerThread", "_create_worker_consumer",
     ("self", "transport")),
    ("faust.transport.drivers.aiokafka:AIOKafkaConsumerThread", "_ensure_consumer", ("self",)),
    ("faust.transport.drivers.aiokafka:AIOKafkaConsumerThread", "call_thread",
     ("self", "fun", "args", "kwargs")),
    ("faust.stores.base:Store", "apply_changelog_batch",
     ("self", "batch", "to_key", "to_value")),
    ("faust.stores.base:Store", "persisted_offset", ("self", "tp")),
    ("faust.stores.base:Store", "on_rebalance",
     ("self", "assigned", "revoked", "newly_assigned", "generation_id")),
    ("faust.stores.base:Store", "on_recovery_completed", ("self", "active_tps", "standby_tps")),
    ("aiokafka.consumer.group_coordinator:GroupCoordinator", "fetch_committed_offsets",
     ("self", "partitions")),
    ("aiokafka:AIOKafkaConsumer", "commit", ("self", "offsets")),
    # the started aiokafka producer, whose batch API the worker's records go through
    # (memdiag.streams.produce)
    ("faust.transport.drivers.aiokafka:Producer", "_ensure_producer", ("self",)),
    ("aiokafka:AIOKafkaProducer", "create_batch", ("self",)),
    ("aiokafka:AIOKafkaProducer", "send_batch", ("self", "batch", "topic", "partition")),
    ("aiokafka:AIOKafkaProducer", "partitions_for", ("self", "topic")),
    # a module's function: the probe of holes in a log (a gap of transaction markers)
    ("faust.transport.drivers:aiokafka", "credentials_to_aiokafka_auth",
     ("credentials", "ssl_context")),
    # the worker's signal handlers (mode installs them; memdiag's worker extends them)
    ("faust.worker:Worker", "_on_sigterm", ("self",)),
    ("faust.worker:Worker", "_on_sigint", ("self",)),
]  # fmt: skip
#: Instance attributes memdiag reads (checked on the running objects by their users):
#: ``AIOKafkaConsumerThread._consumer``/``Consumer._thread``, ``AIOKafkaConsumer._coordinator``,
#: ``Consumer.flow_active``, ``Consumer.suspend_flow`` (an event) and
#: ``Consumer.in_transaction``.


def check() -> None:
    """Fail with one line if a private name memdiag touches is missing or changed."""
    import faust

    problems = []
    for where, name, params in _EXPECTED:
        module, _, cls_name = where.partition(":")
        try:
            cls = getattr(__import__(module, fromlist=[cls_name]), cls_name)
            fn = getattr(cls, name)
            have = tuple(inspect.signature(fn).parameters)
        except (ImportError, AttributeError, TypeError, ValueError):
            problems.append(f"{cls_name}.{name} is missing")
            continue
        if have[: len(params)] != params:
            problems.append(f"{cls_name}.{name}{have} is not {params}")
    from faust import stores

    from memdiag.streams.tables import SCHEME, CheckpointStore

    try:
        if stores.by_url(f"{SCHEME}://state") is not CheckpointStore:
            problems.append(f"Faust's store registry does not give {SCHEME}:// to memdiag")
    except Exception as exc:  # noqa: BLE001 - whatever the registry raises, say it
        problems.append(f"Faust's store registry has no {SCHEME}:// ({exc})")
    from faust.transport.consumer import Consumer
    from mode.services import ServiceTask

    if not isinstance(vars(Consumer).get("_commit_handler"), ServiceTask):
        problems.append("Consumer._commit_handler is not a mode ServiceTask")
    try:  # aiokafka's produce request, as memdiag.streams.produce_request encodes it
        from aiokafka.producer import sender
        from aiokafka.protocol import produce

        from memdiag.streams import produce_request

        if getattr(sender, "ProduceRequest", None) not in (
            produce.ProduceRequest,
            produce_request.ProduceRequest,
        ):
            problems.append("aiokafka's producer sender builds no ProduceRequest of its own")
        problems += produce_request.same_bytes()
    except Exception as exc:  # noqa: BLE001 - whatever changed in aiokafka, say it
        problems.append(f"aiokafka's ProduceRequest is not the one memdiag encodes ({exc!r})")
    if problems:
        import aiokafka

        raise IncompatibleFaust(
            f"faust-streaming {faust.__version__} (aiokafka {aiokafka.__version__}) is not "
            f"the version memdiag was built against (pyproject.toml pins it): "
            f"{'; '.join(problems)}"
        )


_PATCHED: set[str] = set()


def patch_highwaters(options: dict[str, Any]) -> None:
    """``options``: :func:`memdiag.kafka.client_options`. See the module docstring."""
    if "highwaters" in _PATCHED:
        return
    from faust.transport.drivers import aiokafka as driver

    original = driver.AIOKafkaConsumerThread._highwaters

    async def _highwaters(self: Any, partitions: list[Any]) -> Mapping[Any, int]:
        if self.consumer.in_transaction:
            return await original(self, partitions)
        consumer = self._ensure_consumer()
        reported = await consumer.end_offsets(partitions)
        tps = {TopicPartition(tp.topic, tp.partition): tp for tp in partitions}
        fixed = await true_end_offsets(
            options,
            list(tps),
            {TopicPartition(tp.topic, tp.partition): off for tp, off in reported.items()},
        )
        return {tps[tp]: off for tp, off in fixed.items()}

    driver.AIOKafkaConsumerThread._highwaters = _highwaters  # type: ignore[method-assign]
    _PATCHED.add("highwaters")


def patch_fetch_wait(ms: int) -> None:
    """Make the worker's consumer wait at most ``ms`` for records at the broker
    (``MEMDIAG_FETCH_MAX_WAIT_MS``). See the module docstring."""
    if "fetch_wait" in _PATCHED:
        return
    from faust.transport.drivers import aiokafka as driver

    cls = driver.AIOKafkaConsumerThread
    original = cls._create_worker_consumer

    def _create_worker_consumer(self: Any, transport: Any) -> Any:
        consumer = original(self, transport)
        if not hasattr(consumer, "_fetch_max_wait_ms"):
            raise IncompatibleFaust(
                "this aiokafka keeps its fetch wait elsewhere: update "
                "memdiag.streams.compat.patch_fetch_wait"
            )
        consumer._fetch_max_wait_ms = ms  # read when the consumer starts its fetcher
        return consumer

    cls._create_worker_consumer = _create_worker_consumer  # type: ignore[method-assign]
    _PATCHED.add("fetch_wait")


async def _no_commit_handler(consumer: Any) -> None:
    """Faust's commit timer, turned off: the checkpoint alone commits (see the module
    docstring)."""
    return None


def no_faust_commits() -> None:
    """Replace Faust's commit timer (``Consumer._commit_handler``) by one that returns at
    once. mode starts a service's tasks by name (``getattr(service, name).fun(service)``), so
    the class attribute is what every consumer of the worker runs."""
    if "commits" in _PATCHED:
        return
    from faust.transport.consumer import Consumer
    from mode.services import ServiceTask

    Consumer._commit_handler = ServiceTask(_no_commit_handler)  # type: ignore[method-assign]
    _PATCHED.add("commits")


def patch_produce_encoding() -> None:
    """Have aiokafka's producer build :class:`memdiag.streams.produce_request.ProduceRequest`
    (see the module docstring); :func:`check` made sure it encodes the same bytes."""
    if "produce" in _PATCHED:
        return
    from aiokafka.producer import sender

    from memdiag.streams.produce_request import ProduceRequest

    sender.ProduceRequest = ProduceRequest
    _PATCHED.add("produce")


#: The attribute of the Faust app that names the bulk receiver: (topics, deliver, room).
BULK = "_memdiag_bulk"

Deliver = Callable[[int, Mapping[Any, list[Any]]], None]


def deliver_in_bulk(
    app: Any, topics: frozenset[str], deliver: Deliver, room: asyncio.Event
) -> None:
    """Hand the fetched records of ``topics`` to ``deliver(generation, {tp: records})``
    instead of Faust's per-record path; wait for ``room`` (with the flow still on) before
    fetching more. See the module docstring."""
    setattr(app, BULK, (topics, deliver, room))
    if "bulk" in _PATCHED:
        return
    from faust.transport.consumer import Consumer

    original = Consumer._wait_next_records

    async def _wait_next_records(self: Any, timeout: float) -> Any:
        bulk = getattr(self.app, BULK, None)
        if bulk is not None:
            mine, hand_over, space = bulk
            if not space.is_set():
                await _wait_for_room(self, space)
        records, active = await original(self, timeout)
        if not records or bulk is None:
            return records, active
        if not self.flow_active:
            return {}, active  # the flow stopped while fetching: a rebalance began
        ours = {tp: r for tp, r in records.items() if tp.topic in mine}
        if ours:
            hand_over(self.app.consumer_generation_id, ours)
            if len(ours) == len(records):
                return {}, active
            records = {tp: r for tp, r in records.items() if tp.topic not in mine}
        return records, active

    Consumer._wait_next_records = _wait_next_records  # type: ignore[method-assign]
    _PATCHED.add("bulk")


async def _wait_for_room(consumer: Any, room: asyncio.Event) -> None:
    """Wait until the runner has room, or the flow stops (a rebalance must not wait)."""
    waiters = [asyncio.ensure_future(room.wait()), asyncio.ensure_future(
        consumer.suspend_flow.wait())]  # fmt: skip
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()


def producer_batches(app: Any) -> Batches:
    """Records in batches, through the app's producer (started after the wiring), keyed
    ones on the partition of the partitioner the app gives its producer
    (:class:`memdiag.kafka.DefaultPartitioner`, Kafka's)."""
    conf = getattr(app, "conf", None)
    partitioner = getattr(conf, "producer_partitioner", None) or DefaultPartitioner()
    return Batches(lambda: app.producer._ensure_producer(), partitioner)


class FaustKafka:
    """The Kafka calls of the runner and the checkpoint, on the worker's Faust app."""

    #: A commit, or a look-up of the committed offsets, that has not returned by then is
    #: given up (the group coordinator can hold one through a rebalance).
    TIMEOUT_SECONDS = 15.0

    def __init__(self, app: Any, batches: Batches | None = None):
        self.app = app
        #: the worker's records, in batches it fills itself (the sender's too)
        self.batches = batches or producer_batches(app)
        self._probe: AIOKafkaConsumer | None = None
        #: the longest changelog value sent as one record (the producer takes 8 MiB; a
        #: broker at its defaults takes 1 MiB)
        self.record_limit = RECORD_LIMIT

    def generation(self) -> int:
        return int(self.app.consumer_generation_id)

    def flowing(self) -> bool:
        return bool(self.app.flow_control.is_active())

    def assignment(self) -> set[Any]:
        return set(self.app.consumer.assignment())

    def _thread(self) -> tuple[Any, AIOKafkaConsumer]:
        thread = self.app.consumer._thread
        return thread, thread._ensure_consumer()

    async def committed(self, tps: list[Any]) -> dict[Any, int]:
        """One OffsetFetch for every partition (aiokafka's ``committed`` asks one by one)."""
        if not tps:
            return {}
        thread, consumer = self._thread()
        atps = [TopicPartition(tp[0], tp[1]) for tp in tps]
        found = await asyncio.wait_for(
            thread.call_thread(consumer._coordinator.fetch_committed_offsets, atps),
            self.TIMEOUT_SECONDS,
        )
        out = {}
        for tp, atp in zip(tps, atps, strict=True):
            meta = found.get(atp)
            if meta is not None and meta.offset >= 0:
                out[tp] = meta.offset
        return out

    async def bases(self, tps: list[Any]) -> dict[Any, int]:
        """Each partition's committed offset; where none is committed, the position the
        tables' recovery took from the local state, or else the log start (also when
        retention deleted the records since)."""
        from memdiag.streams.tables import start_positions

        earliest = await self.app.consumer.earliest_offsets(*tps)
        committed = await self.committed(tps)
        derived = start_positions(self.app)
        bases = {}
        for tp in tps:
            start = earliest.get(tp) or 0
            done = committed.get(tp, derived.get((tp.topic, tp.partition)))
            bases[tp] = start if done is None or done < start else done
        return bases

    async def seek(self, offsets: Mapping[Any, int]) -> None:
        await self.app.consumer.seek_wait(offsets)

    async def send(
        self, topic: str, key: bytes, value: bytes | None, partition: int,
        headers: list[tuple[str, bytes]] | None,
    ) -> asyncio.Future[Any]:  # fmt: skip
        future = await self.batches.add(topic, key, value, partition, None, headers, want=True)
        assert future is not None  # noqa: S101 - want=True
        return future

    async def flush(self) -> list[asyncio.Future[Any]]:
        return await self.batches.flush()

    def discard(self) -> None:
        self.batches.discard()

    async def commit(self, offsets: Mapping[TP, int]) -> None:
        from memdiag.streams.tables import checkpoint_stores

        for store in checkpoint_stores(self.app):
            store.committing(offsets)  # what the values the checkpoint writes next cover
        thread, consumer = self._thread()
        request = {
            TopicPartition(tp[0], tp[1]): OffsetAndMetadata(offset, "")
            for tp, offset in offsets.items()
        }
        # Never abandoned: the commit goes on in the consumer's thread (aiokafka retries it),
        # and one that lands after its caller gave up would leave the local state behind the
        # committed offsets. Its own outcome is the only sure answer: wait for it.
        call = asyncio.ensure_future(thread.call_thread(consumer.commit, request))
        waited = 0.0
        while not (await asyncio.wait({call}, timeout=self.TIMEOUT_SECONDS))[0]:
            waited += self.TIMEOUT_SECONDS
            log.warning("a commit has not returned after %.0f s; waiting for it (the broker "
                        "may be away: its outcome decides the state)", waited)  # fmt: skip
        try:
            call.result()
        except (CommitFailedError, IllegalStateError) as exc:
            raise CommitRefused(str(exc)) from exc

    async def first_offset(self, tp: Any, offset: int) -> int | None:
        """The offset of the first record at or after ``offset`` in the log, asked of the
        broker directly (outside the group): a hole the fetcher keeps skipping is real when
        this is past it. None: the log ends before ``offset``, or no answer in time."""
        if self._probe is None:
            from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

            servers = [f"{u.host}:{u.port}" for u in self.app.conf.broker]
            auth = credentials_to_aiokafka_auth(
                self.app.conf.broker_credentials, self.app.conf.ssl_context
            )
            self._probe = AIOKafkaConsumer(
                bootstrap_servers=servers, group_id=None, enable_auto_commit=False, **auth
            )
            await self._probe.start()
        probe = self._probe
        atp = TopicPartition(tp.topic, tp.partition)
        probe.assign([atp])
        probe.seek(atp, offset)
        records = await probe.getmany(atp, timeout_ms=2000, max_records=1)
        got = records.get(atp)
        if got:
            return int(got[0].offset)
        end = (await probe.end_offsets([atp]))[atp]
        return int(end) if end > offset else None

    async def close(self) -> None:
        if self._probe is not None:
            await self._probe.stop()
            self._probe = None


async def changelog_covers(
    app: Any, wanted: Mapping[tuple[str, int], int]
) -> dict[tuple[str, int], Mapping[str, int] | None]:
    """The source offsets the changelog records at ``wanted`` ({(topic, partition): offset})
    cover (:data:`memdiag.streams.store.OFFSETS_HEADER`), read outside the group; None where
    the record names none; absent where no record came in time. A record compacted away
    gives the next one's: offsets at least as new, so a check against them can only be
    stricter."""
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    from memdiag.streams.store import covers_of

    servers = [f"{u.host}:{u.port}" for u in app.conf.broker]
    auth = credentials_to_aiokafka_auth(app.conf.broker_credentials, app.conf.ssl_context)
    reader = AIOKafkaConsumer(
        bootstrap_servers=servers, group_id=None, enable_auto_commit=False, **auth
    )
    await reader.start()
    out: dict[tuple[str, int], Mapping[str, int] | None] = {}
    try:
        tps = {TopicPartition(topic, p): offset for (topic, p), offset in wanted.items()}
        reader.assign(list(tps))
        for atp, offset in tps.items():
            reader.seek(atp, offset)
        left = set(tps)
        deadline = asyncio.get_running_loop().time() + FaustKafka.TIMEOUT_SECONDS
        while left and asyncio.get_running_loop().time() < deadline:
            batches = await reader.getmany(*left, timeout_ms=1000, max_records=1)
            for atp, records in batches.items():
                if records and atp in left:
                    left.discard(atp)
                    out[(atp.topic, atp.partition)] = covers_of(records[0].headers)
    finally:
        await reader.stop()
    return out
