"""``memdiag.streams.compat``: what memdiag touches inside faust-streaming and aiokafka is
checked at start (one line naming the version when anything moved), and each touch does what
it says, seen from outside."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from memdiag.streams import compat


def test_the_installed_faust_has_every_name_memdiag_touches() -> None:
    compat.check()


@pytest.mark.parametrize(
    "where, name",
    [(w, n) for w, n, _ in compat._EXPECTED],
)
def test_a_missing_name_stops_the_worker_in_one_line_naming_the_version(
    monkeypatch: pytest.MonkeyPatch, where: str, name: str
) -> None:
    """Mutation check of the guard: each touched name, taken away in turn, is caught."""
    import faust

    module, _, cls_name = where.partition(":")
    cls = getattr(__import__(module, fromlist=[cls_name]), cls_name)
    # wherever it is defined: the class itself or a base (or a module, for a function)
    for owner in getattr(cls, "__mro__", (cls,)):
        if name in vars(owner):
            monkeypatch.delattr(owner, name)
    with pytest.raises(compat.IncompatibleFaust) as err:
        compat.check()
    message = str(err.value)
    assert "\n" not in message
    assert f"faust-streaming {faust.__version__}" in message and name in message


def test_a_changed_signature_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from faust.transport.consumer import Consumer

    async def _wait_next_records(self: Any, wait: float) -> Any: ...

    monkeypatch.setattr(Consumer, "_wait_next_records", _wait_next_records)
    with pytest.raises(compat.IncompatibleFaust, match="_wait_next_records"):
        compat.check()


def test_a_store_registry_without_memdiag_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    from faust import stores

    monkeypatch.setattr(stores, "by_url", lambda url: object)
    with pytest.raises(compat.IncompatibleFaust, match="memdiag://"):
        compat.check()


def test_the_worker_consumer_waits_at_the_broker_as_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aiokafka import AIOKafkaConsumer
    from faust.transport.drivers import aiokafka as driver

    from memdiag.settings import Settings
    from memdiag.streams.app import MAX_POLL_RECORDS, faust_app

    cls = driver.AIOKafkaConsumerThread
    monkeypatch.setattr(cls, "_create_worker_consumer", cls._create_worker_consumer)
    monkeypatch.setattr(compat, "_PATCHED", set())
    compat.patch_fetch_wait(123)
    compat.patch_fetch_wait(456)  # twice: the first one stands (one wrapper)
    app = faust_app(Settings.from_env({}, broker="kafka://127.0.0.1:1", app_id="compat-test"))
    thread = app.consumer._thread

    async def create() -> tuple[int, int, int]:  # aiokafka builds consumers in a running loop
        consumer = thread._create_worker_consumer(app.transport)
        await consumer.stop()
        # the attribute the patch sets is the one aiokafka's own argument sets
        plain = AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", fetch_max_wait_ms=7)
        await plain.stop()
        return (
            consumer._fetch_max_wait_ms,
            consumer._max_partition_fetch_bytes,
            plain._fetch_max_wait_ms,
            consumer._max_poll_records,
        )

    try:
        wait_ms, fetch_bytes, plain_ms, poll = thread.thread_loop.run_until_complete(create())
    finally:
        thread.thread_loop.close()
        app.loop.close()
    assert (wait_ms, plain_ms) == (123, 7)
    # the fetch and the poll the worker's memory is measured with (benchmarks/scale.py)
    assert fetch_bytes == app.conf.consumer_max_fetch_size == 2 * 1024 * 1024
    assert poll == app.conf.broker_max_poll_records == MAX_POLL_RECORDS == 2_000


class FakeConsumer:
    """What the bulk hook reads of Faust's consumer."""

    def __init__(self, fetched: dict[Any, list[Any]], generation: int = 3):
        self.fetched = fetched
        self.flow_active = True
        self.suspend_flow = asyncio.Event()
        self.app = type("App", (), {"consumer_generation_id": generation})()


async def test_the_stage_topics_go_to_the_runner_in_bulk_and_the_rest_to_faust(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from faust.transport.consumer import Consumer
    from faust.types import TP

    async def original(self: Any, timeout: float) -> Any:
        return dict(self.fetched), {TP("events", 0), TP("cl", 0)}

    monkeypatch.setattr(Consumer, "_wait_next_records", original)
    monkeypatch.setattr(compat, "_PATCHED", set())
    got: list[tuple[int, dict[Any, list[Any]]]] = []
    room = asyncio.Event()
    room.set()
    consumer = FakeConsumer({TP("events", 0): [1, 2], TP("cl", 0): [3]})
    compat.deliver_in_bulk(consumer.app, frozenset({"events"}),
                           lambda g, r: got.append((g, r)), room)  # fmt: skip
    records, active = await Consumer._wait_next_records(consumer, 1.0)  # type: ignore[arg-type]
    assert got == [(3, {TP("events", 0): [1, 2]})]
    assert records == {TP("cl", 0): [3]}  # the changelog: Faust's recovery reads it
    # the flow stopped while fetching (a rebalance): nothing goes anywhere
    consumer.flow_active = False
    records, _ = await Consumer._wait_next_records(consumer, 1.0)  # type: ignore[arg-type]
    assert records == {} and len(got) == 1


async def test_a_full_runner_holds_the_fetch_until_it_has_room_or_the_flow_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from faust.transport.consumer import Consumer
    from faust.types import TP

    fetched = []

    async def original(self: Any, timeout: float) -> Any:
        fetched.append(1)
        return {}, set()

    monkeypatch.setattr(Consumer, "_wait_next_records", original)
    monkeypatch.setattr(compat, "_PATCHED", set())
    room = asyncio.Event()
    consumer = FakeConsumer({TP("events", 0): [1]})
    compat.deliver_in_bulk(consumer.app, frozenset({"events"}), lambda g, r: None, room)
    task = asyncio.ensure_future(Consumer._wait_next_records(consumer, 1.0))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    assert not task.done() and not fetched
    room.set()
    await asyncio.wait_for(task, 1)
    assert fetched == [1]
    room.clear()
    task = asyncio.ensure_future(Consumer._wait_next_records(consumer, 1.0))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    consumer.suspend_flow.set()  # a rebalance must never wait for the runner
    await asyncio.wait_for(task, 1)


def test_faust_never_commits_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """#38: the checkpoint alone commits. Faust's commit timer is a mode task started by
    name; after no_faust_commits the worker's consumer (aiokafka's Consumer) runs one that
    returns at once, without a call to ``commit`` (before, it called it every interval)."""
    import asyncio

    from faust.transport.consumer import Consumer
    from faust.transport.drivers.aiokafka import Consumer as AIOKafkaConsumer
    from mode.services import ServiceTask

    monkeypatch.setattr(Consumer, "_commit_handler", vars(Consumer)["_commit_handler"])
    monkeypatch.setattr(compat, "_PATCHED", set())
    commits: list[object] = []

    class Fake:
        commit_interval = 0.0

        async def sleep(self, _: float) -> None:
            return None

        async def itertimer(self, *_: object, **__: object):  # Faust's timer: ticks forever
            for _ in range(3):
                yield 0.0

        async def commit(self) -> None:
            commits.append(1)

    asyncio.run(Consumer._commit_handler.fun(Fake()))  # Faust's own: commits each tick
    assert len(commits) == 3
    compat.no_faust_commits()
    task = AIOKafkaConsumer._commit_handler  # what mode's _get_tasks finds by name
    assert isinstance(task, ServiceTask)
    asyncio.run(task.fun(Fake()))
    assert len(commits) == 3  # no commit of Faust's any more
    assert "_commit_handler" in AIOKafkaConsumer._tasks[AIOKafkaConsumer._get_class_id()]
    compat.check()  # the patched class still passes the start check
