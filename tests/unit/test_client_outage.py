"""``memdiag.client`` on the broker's worst day: a broker down at start, one that goes away
and comes back, a full buffer, a message the broker can never take, bounded flush and close,
and one warning a minute instead of a flood. A fake producer plays the broker; the real one
(killed and restarted under a publishing runtime) is tests/chaos/test_publisher_outage.py."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
import warnings
from typing import Any

import orjson
import pytest
from aiokafka.errors import KafkaConnectionError, MessageSizeTooLargeError

from memdiag import client
from memdiag.client import (
    AsyncPublisher,
    BrokerUnavailable,
    FlushTimeout,
    Publisher,
    PublishFailed,
)
from memdiag.settings import Settings

SETTINGS = Settings.from_env({}, topic_prefix="u.")


def search(i: int, session: str = "s1") -> dict[str, Any]:
    return {"kind": "search", "event_id": f"{session}-{i}", "ts": "2026-11-21T09:30:00Z",
            "session_id": session, "query": "q", "result_ids": ["a"]}  # fmt: skip


class Broker:
    """A producer whose broker can go away: while ``away``, every delivery fails after
    ``fail_after`` seconds, as aiokafka's do (NodeNotReadyError after its request timeout).
    ``taken`` holds every event the broker acknowledged, in order, once per delivery."""

    def __init__(self, fail_after: float = 0.0, error: type[Exception] = KafkaConnectionError):
        self.away = False
        self.slow = False  # deliveries wait until this is False again
        self.fail_after = fail_after
        self.error = error
        self.taken: list[dict[str, Any]] = []
        self.attempts = 0

    async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[None]:
        self.attempts += 1
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        away = self.away

        async def settle() -> None:
            if away:
                await asyncio.sleep(self.fail_after)
                done.set_exception(self.error("broker gone"))
                return
            while self.slow:
                await asyncio.sleep(0.01)
            events = orjson.loads(value)
            self.taken.extend(events if isinstance(events, list) else [events])
            done.set_result(None)

        asyncio.ensure_future(settle())
        return done


async def started(broker: Broker, **kw: Any) -> AsyncPublisher:
    kw.setdefault("linger_ms", 1)
    return await AsyncPublisher(settings=SETTINGS, producer=broker, **kw).start()


def ids(events: list[dict[str, Any]]) -> list[str]:
    return sorted(e["event_id"] for e in events)


async def test_a_broker_that_goes_away_and_comes_back_loses_nothing_and_sends_each_once() -> None:
    broker = Broker()
    p = await started(broker)
    for i in range(5):
        assert await p.publish(search(i))
    await p.flush(timeout=5)
    broker.away = True
    for i in range(5, 40):
        assert await p.publish(search(i, f"s{i % 7}"))
    with pytest.raises(FlushTimeout) as late:
        await p.flush(timeout=0.5)
    assert late.value.held == 35 and late.value.dropped == 0
    assert "kept and sent when it takes them" in str(late.value)
    s = p.stats()
    assert s.broker_away_since is not None and "broker gone" in (s.last_error or "")
    assert s.failures >= 1 and s.held == 35
    broker.away = False
    await p.flush(timeout=10)
    s = p.stats()
    assert s.broker_away_since is None
    assert (s.events, s.delivered, s.held, s.dropped) == (40, 40, 0, 0)
    expected = ids([search(i) for i in range(5)] + [search(i, f"s{i % 7}") for i in range(5, 40)])
    assert ids(broker.taken) == expected  # each once: a failed delivery is not half-taken
    await p.close(timeout=5)


async def test_while_away_one_message_at_a_time_is_tried_with_a_growing_pause() -> None:
    broker = Broker()
    p = await started(broker)
    broker.away = True
    for i in range(50):
        await p.publish(search(i, f"s{i}"))  # 50 keys: 50 messages
    await asyncio.sleep(1.0)
    # the first wave went before the broker was known to be away; then a probe at a time,
    # 0.1 + 0.2 + 0.4 s apart: not 50 messages again and again
    first_wave = 50
    assert broker.attempts - first_wave <= 4
    broker.away = False
    await p.flush(timeout=10)
    assert p.stats().delivered == 50
    await p.close()


async def test_a_full_buffer_drops_at_once_while_the_broker_is_away_and_counts_exactly() -> None:
    broker = Broker()
    p = await started(broker, max_held_events=5)
    broker.away = True
    await p.publish(search(0))
    await asyncio.sleep(0.1)  # the broker is known to be away
    kept = [await p.publish(search(i)) for i in range(1, 9)]
    assert kept == [True] * 4 + [False] * 4
    s = p.stats()
    assert (s.events, s.held, s.dropped) == (5, 5, 4)
    broker.away = False
    await p.flush(timeout=10)
    assert ids(broker.taken) == ids([search(i) for i in range(5)])
    await p.close()


async def test_a_full_buffer_waits_for_a_slow_broker_then_drops() -> None:
    broker = Broker()
    broker.slow = True
    p = await started(broker, max_held_events=2, max_block_seconds=0.3)
    assert await p.publish(search(0)) and await p.publish(search(1))
    t0 = time.monotonic()
    assert not await p.publish(search(2))  # waited for room, none came
    assert time.monotonic() - t0 >= 0.25
    asyncio.get_running_loop().call_later(0.1, setattr, broker, "slow", False)
    assert await p.publish(search(3))  # room came within the wait
    await p.flush(timeout=5)
    s = p.stats()
    assert (s.delivered, s.dropped) == (3, 1)
    await p.close()


async def test_a_message_the_broker_can_never_take_is_dropped_not_retried() -> None:
    broker = Broker(error=MessageSizeTooLargeError)
    p = await started(broker)
    broker.away = True
    await p.publish(search(0))
    await p.publish(search(1))
    await p.flush(timeout=5)  # nothing kept: both dropped
    s = p.stats()
    assert (s.dropped, s.held, s.delivered) == (2, 0, 0)
    assert broker.attempts == 1  # one message of two events
    await p.close()


async def test_close_returns_within_its_timeout_and_counts_what_it_could_not_send(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = Broker(fail_after=0.2)
    p = await started(broker)
    broker.away = True
    for i in range(7):
        await p.publish(search(i))
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, "memdiag.client"):
        await p.close(timeout=0.5)
    assert time.monotonic() - t0 < 2.0
    s = p.stats()
    assert (s.dropped + s.unconfirmed, s.delivered, s.held) == (7, 0, 0)
    assert f"closed with {s.dropped} events never sent, counted as dropped" in caplog.text
    assert f"{s.unconfirmed} sent but not acknowledged (they may have arrived)" in caplog.text
    with pytest.raises(RuntimeError, match="closed"):
        await p.publish(search(8))


async def test_one_warning_a_minute_while_away_and_one_when_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = Broker()
    p = await started(broker)
    broker.away = True
    with caplog.at_level(logging.WARNING, "memdiag.client"):
        for i in range(30):
            await p.publish(search(i, f"s{i}"))
            await asyncio.sleep(0.02)
        await asyncio.sleep(1.0)  # several probes fail meanwhile
        away = [r for r in caplog.records if "has not taken events since" in r.getMessage()]
        assert len(away) == 1
        assert "Check that the broker runs" in away[0].getMessage()
        broker.away = False
        await p.flush(timeout=10)
    back = [r for r in caplog.records if "takes events again" in r.getMessage()]
    assert len(back) == 1 and "sending the" in back[0].getMessage()
    await p.close()


def test_aiokafka_lines_about_the_publisher_are_held_to_one_a_minute() -> None:
    """A dead broker makes aiokafka log 'Unable connect to node' about 20 times a second;
    the publisher's own tasks carry it in their context, other clients' lines pass."""
    p = AsyncPublisher(settings=SETTINGS, producer=Broker())
    client._install_quieter()
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep(logging.ERROR)
    conn = logging.getLogger("aiokafka.conn")
    conn.addHandler(handler)
    try:
        token = client._OWNER.set(p)
        for _ in range(50):
            conn.error("Unable connect to node with id %s: %s", 1, "refused")
        client._OWNER.reset(token)
        for _ in range(3):  # another client's lines in the same process are not touched
            conn.error("Unable connect to node with id %s: %s", 2, "refused")
    finally:
        conn.removeHandler(handler)
    assert seen.count("Unable connect to node with id 1: refused") == 1
    assert seen.count("Unable connect to node with id 2: refused") == 3
    assert list(p._said)[-1] == "Unable connect to node with id 1: refused"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_broker_down_at_start_is_our_error_and_leaves_nothing_open() -> None:
    port = _closed_port()
    before = {t.name for t in threading.enumerate()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(BrokerUnavailable) as err:
            Publisher(f"kafka://127.0.0.1:{port}", settings=None)
        import gc

        gc.collect()
    message = str(err.value)
    assert f"127.0.0.1:{port}" in message and "MEMDIAG_BROKER" in message
    assert "wait_for_broker" in message  # what to do when it only starts later
    assert {t.name for t in threading.enumerate()} - before == set()  # the loop thread ended
    assert not [w for w in caught if "Unclosed" in str(w.message)]


async def test_wait_for_broker_retries_then_says_how_long() -> None:
    port = _closed_port()
    t0 = time.monotonic()
    with pytest.raises(BrokerUnavailable, match=r"retried for 0\.5 s"):
        await AsyncPublisher(f"127.0.0.1:{port}", wait_for_broker=0.5).start()
    assert 0.3 <= time.monotonic() - t0 < 3


async def test_without_waiting_it_starts_at_once_and_keeps_events_until_the_broker_comes() -> None:
    port = _closed_port()
    p = await AsyncPublisher(f"127.0.0.1:{port}", wait_for_broker=None, linger_ms=1).start()
    assert await p.publish(search(0))
    await asyncio.sleep(0.3)
    s = p.stats()
    assert s.held == 1 and s.broker_away_since is not None
    assert "KafkaConnectionError" in (s.last_error or "")  # what failed, in words
    assert not (s.last_error or "").startswith("KafkaConnectionError: KafkaConnectionError")
    t0 = time.monotonic()
    await p.close(timeout=0.5)
    assert time.monotonic() - t0 < 3
    assert p.stats().dropped == 1


def test_the_blocking_publisher_flush_and_close_are_bounded() -> None:
    broker = Broker(fail_after=0.05)
    with Publisher(settings=SETTINGS, producer=broker, linger_ms=1) as p:
        broker.away = True
        p.publish(search(0))
        t0 = time.monotonic()
        with pytest.raises(FlushTimeout):
            p.flush(timeout=0.3)
        assert time.monotonic() - t0 < 2
        assert isinstance(FlushTimeout("x", 0, 0), PublishFailed)  # older code catches that
        broker.away = False
        p.flush(timeout=10)
        assert p.stats().delivered == 1


def test_the_blocking_publisher_counts_drops_exactly_from_several_threads() -> None:
    broker = Broker()
    with Publisher(settings=SETTINGS, producer=broker, linger_ms=1, max_held_events=100) as p:
        broker.away = True
        p.publish(search(0))
        time.sleep(0.2)  # known away
        results: list[bool] = []
        lock = threading.Lock()

        def runtime(t: int) -> None:
            for i in range(100):
                kept = p.publish(search(i, f"t{t}"))
                with lock:
                    results.append(kept)

        threads = [threading.Thread(target=runtime, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results.count(True) == 99
        assert p.stats().dropped == results.count(False) == 301
        broker.away = False
        p.flush(timeout=10)
    assert len(broker.taken) == 100 and p.stats().delivered == 100


@pytest.mark.parametrize("bad", ["not a dict", 42, None, ["a", "list"]])
def test_something_not_a_mapping_is_a_type_error(bad: Any) -> None:
    with Publisher(settings=SETTINGS, producer=Broker()) as p:
        with pytest.raises(TypeError, match="an event is a mapping"):
            p.publish(bad)


def test_the_broker_may_be_given_as_memdiag_broker_spells_it() -> None:
    p = AsyncPublisher("kafka://broker-1:9092,kafka://broker-2:9093", producer=Broker())
    assert p.settings.bootstrap_servers == "broker-1:9092,broker-2:9093"


async def test_a_keys_events_keep_their_order_through_an_outage() -> None:
    broker = Broker(fail_after=0.01)
    p = await started(broker, max_batch_events=1)  # one message per event
    broker.away = True
    for i in range(8):
        await p.publish(search(i))
    await asyncio.sleep(0.3)  # all failed at least once, and were put back
    broker.away = False
    await p.flush(timeout=10)
    assert [e["event_id"] for e in broker.taken] == [f"s1-{i}" for i in range(8)]
    await p.close()


async def test_a_message_that_can_never_go_does_not_hold_up_the_others() -> None:
    """A topic that does not exist fails every send of its messages; the others still go."""

    class OneTopicMissing(Broker):
        async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[None]:
            self.away = topic == "u.judgements"
            return await super().send(topic, value, key)

    broker = OneTopicMissing()
    p = await started(broker)
    await p.publish({"kind": "judgement", "event_id": "j1", "ts": "2026-11-21T09:30:00Z",
                     "run_id": "r1", "question_id": "q1", "judge_correct": True,
                     "gold_evidence_ids": [], "retrieved_context_ids": []})  # fmt: skip
    await asyncio.sleep(0.05)
    for i in range(5):
        await p.publish(search(i, f"s{i}"))
    with pytest.raises(FlushTimeout) as late:
        await p.flush(timeout=2)
    assert late.value.held == 1  # the judgement, still kept
    assert ids(broker.taken) == ids([search(i, f"s{i}") for i in range(5)])
    await p.close(timeout=0.5)


async def test_a_broker_that_comes_and_goes_is_said_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = Broker()
    p = await started(broker)
    with caplog.at_level(logging.WARNING, "memdiag.client"):
        for i in range(20):
            broker.away = i % 2 == 0
            await p.publish(search(i, f"s{i}"))
            await asyncio.sleep(0.12)
        broker.away = False
        await p.flush(timeout=10)
    said = [r.getMessage() for r in caplog.records]
    assert sum("has not taken events since" in m for m in said) == 1, said
    assert sum("takes events again" in m for m in said) == 1, said
    await p.close()


def test_close_while_threads_publish_loses_nothing_it_took() -> None:
    """Every publish that returned True is delivered, or counted by close; a publish after
    close began is refused. Many rounds, as the race is narrow."""
    for _ in range(30):
        broker = Broker()
        p = Publisher(settings=SETTINGS, producer=broker, linger_ms=1)
        took = [0, 0, 0]
        started_ = threading.Barrier(4)

        def runtime(t: int, p: Publisher, took: list[int], started_: threading.Barrier) -> None:
            started_.wait()
            for i in range(10_000):
                try:
                    if p.publish(search(i, f"t{t}")):
                        took[t] += 1
                except RuntimeError:
                    return

        threads = [threading.Thread(target=runtime, args=(t, p, took, started_)) for t in range(3)]
        for t in threads:
            t.start()
        started_.wait()
        time.sleep(0.01)
        p.close(timeout=5)
        for t in threads:
            t.join()
        s = p.stats()
        assert s.events == sum(took)
        assert s.delivered + s.dropped + s.unconfirmed == sum(took), s
        assert s.held == 0 and len(broker.taken) == s.delivered


async def test_a_broker_that_only_stops_acknowledging_is_said_away_when_events_drop(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker killed and back within aiokafka's request timeout: no delivery fails, they
    only stall, and a full buffer drops events meanwhile. The warnings say the broker is
    away (not "the buffer is full"), once, and once that it is back when a delivery comes
    (the chaos test's outage met this timing: no failure, and neither warning)."""
    monkeypatch.setattr(client, "STALL_SECONDS", 0.2)
    broker = Broker()
    broker.slow = True
    p = await started(broker, max_held_events=2)
    with caplog.at_level(logging.WARNING, "memdiag.client"):
        assert await p.publish(search(0)) and await p.publish(search(1))
        await asyncio.sleep(0.3)  # nothing acknowledged for longer than the stall
        t0 = time.monotonic()
        assert not await p.publish(search(2))  # dropped at once: the broker is away
        assert not await p.publish(search(3))
        assert time.monotonic() - t0 < 0.2
        away_since = p.stats().broker_away_since
        # away since the last acknowledgement (the first send's start), not since the drop
        assert away_since is not None and time.time() - away_since >= 0.2
        broker.slow = False
        await p.flush(timeout=5)
    said = [r.getMessage() for r in caplog.records]
    away = [m for m in said if "has not taken events since" in m]
    assert len(away) == 1 and "no acknowledgement for" in away[0], said
    assert "1 dropped so far" in away[0]
    assert sum("takes events again" in m for m in said) == 1, said
    assert not any("the buffer is full" in m for m in said), said
    s = p.stats()
    assert (s.delivered, s.dropped, s.held, s.failures) == (2, 2, 0, 0)
    assert s.broker_away_since is None
    await p.close()


def test_the_blocking_publisher_says_a_stalled_broker_away_too(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client, "STALL_SECONDS", 0.2)
    broker = Broker()
    broker.slow = True
    with caplog.at_level(logging.WARNING, "memdiag.client"):
        p = Publisher(settings=SETTINGS, producer=broker, linger_ms=1, max_held_events=1)
        assert p.publish(search(0))
        time.sleep(0.3)
        assert not p.publish(search(1))
        deadline = time.monotonic() + 5
        while p.stats().broker_away_since is None and time.monotonic() < deadline:
            time.sleep(0.01)  # the drop is said on the publisher's loop
        assert p.stats().broker_away_since is not None
        broker.slow = False
        p.flush(timeout=5)
        p.close(timeout=5)
    said = [r.getMessage() for r in caplog.records]
    assert sum("has not taken events since" in m for m in said) == 1, said
    assert sum("takes events again" in m for m in said) == 1, said
    s = p.stats()
    assert (s.delivered, s.dropped) == (1, 1)


async def test_a_stalled_broker_says_the_minutes_warning_while_drops_go_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Away for want of acknowledgements, no delivery failing: the drops that follow still
    bring the warning each time it is due, with their count."""
    monkeypatch.setattr(client, "STALL_SECONDS", 0.2)
    monkeypatch.setattr(client, "WARN_EVERY_SECONDS", 0.1)
    broker = Broker()
    broker.slow = True
    p = await started(broker, max_held_events=1)
    with caplog.at_level(logging.WARNING, "memdiag.client"):
        assert await p.publish(search(0))
        await asyncio.sleep(0.3)
        assert not await p.publish(search(1))  # away, said
        await asyncio.sleep(0.15)  # the next warning is due
        assert not await p.publish(search(2))
        away = [r.getMessage() for r in caplog.records if "has not taken events" in r.getMessage()]
        assert len(away) == 2, away
        assert "1 dropped so far" in away[0] and "2 dropped so far" in away[1], away
        assert "no acknowledgement for over 0.2 s while messages waited" in away[1]
        broker.slow = False
        await p.flush(timeout=5)
    await p.close()


class HeldSends:
    """A producer whose deliveries the test settles by hand (``futures``, in send order)."""

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[None]] = []
        self.values: list[bytes] = []

    async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        self.values.append(value)
        return future


async def test_an_acknowledgement_of_a_message_sent_before_a_failure_does_not_say_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two messages in flight; the second fails (its broker died), then the first is
    acknowledged (another broker of the cluster, or a reply already on its way). That says
    nothing of the broker that failed: still away since the failure, still one probe at a
    time, and back only when a probe goes."""
    broker = HeldSends()
    p = await started(broker)
    with caplog.at_level(logging.WARNING, "memdiag.client"):
        assert await p.publish(search(0, "a")) and await p.publish(search(1, "b"))
        while len(broker.futures) < 2:
            await asyncio.sleep(0.005)
        broker.futures[1].set_exception(KafkaConnectionError("broker gone"))
        await asyncio.sleep(0.01)
        away_since = p.stats().broker_away_since
        assert away_since is not None
        for i in range(2, 6):  # kept meanwhile
            assert await p.publish(search(i, f"k{i}"))
        await asyncio.sleep(0.02)
        broker.futures[0].set_result(None)  # the late acknowledgement
        deadline = time.monotonic() + 5
        while len(broker.futures) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # the loop sends its probe
        await asyncio.sleep(0.05)  # and nothing more
        assert p.stats().broker_away_since == away_since
        # one probe at a time: the failed message, alone
        assert len(broker.futures) == 3 and b'"b-1"' in broker.values[2]
        broker.futures[2].set_result(None)  # the probe goes: back
        deadline = time.monotonic() + 5
        while len(broker.futures) < 7 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert p.stats().broker_away_since is None
        for f in broker.futures[3:]:
            f.set_result(None)
        await p.flush(timeout=5)
    said = [r.getMessage() for r in caplog.records]
    assert sum("takes events again" in m for m in said) == 1, said
    s = p.stats()
    assert (s.delivered, s.dropped, s.held) == (6, 0, 0), s
    await p.close()


async def test_a_stalled_broker_that_refuses_a_message_for_good_is_back_and_the_drop_said(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Away for a stall, then the broker answers a message it can never take: it is there
    (back), and the warning names that drop, not the broker away."""
    monkeypatch.setattr(client, "STALL_SECONDS", 0.2)
    broker = HeldSends()
    p = await started(broker, max_held_events=2)
    with caplog.at_level(logging.WARNING, "memdiag.client"):
        assert await p.publish(search(0, "a")) and await p.publish(search(1, "b"))
        await asyncio.sleep(0.3)
        assert not await p.publish(search(2, "c"))  # dropped: away for the stall
        assert p.stats().broker_away_since is not None
        broker.futures[0].set_exception(MessageSizeTooLargeError("too large"))
        await asyncio.sleep(0.01)
        assert p.stats().broker_away_since is None
        broker.futures[1].set_result(None)
        await p.flush(timeout=5)
    said = [r.getMessage() for r in caplog.records]
    assert any("can never take this message" in m for m in said), said
    s = p.stats()
    assert (s.delivered, s.dropped, s.held) == (1, 2, 0), s
    await p.close()


async def test_after_a_stall_the_first_acknowledgement_lets_the_outbox_go_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Away for a stall with two messages in flight and one kept: when the first is
    acknowledged the broker is back, and the kept one goes before the other settles."""
    monkeypatch.setattr(client, "STALL_SECONDS", 0.2)
    broker = HeldSends()
    p = await started(broker, max_held_events=3)
    assert await p.publish(search(0, "a")) and await p.publish(search(1, "b"))
    while len(broker.futures) < 2:
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.3)
    assert await p.publish(search(2, "c"))  # room for it: kept, not sent (away is not known)
    assert not await p.publish(search(3, "d"))  # full: away for the stall
    assert p.stats().broker_away_since is not None
    await asyncio.sleep(0.05)  # the kept one reaches the outbox; the sender waits, away
    assert len(broker.futures) == 2 and len(p._outbox) == 1
    broker.futures[0].set_result(None)
    deadline = time.monotonic() + 5
    while len(broker.futures) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert p.stats().broker_away_since is None
    assert len(broker.futures) == 3 and b'"c-2"' in broker.values[2]
    assert not broker.futures[1].done()  # sent while the second still waits
    for f in broker.futures[1:]:
        f.set_result(None)
    await p.flush(timeout=5)
    s = p.stats()
    assert (s.delivered, s.dropped, s.held) == (3, 1, 0), s
    await p.close()


def test_close_never_counts_an_event_whose_publish_it_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runtime's thread takes room for an event just as close begins: the event is either
    kept and sent (publish returned True) or refused and not counted, never counted as
    dropped by close and then refused too (the race of the threads test, made to happen)."""
    broker = Broker()
    p = Publisher(settings=SETTINGS, producer=broker, linger_ms=1)
    took_room, go_on = threading.Event(), threading.Event()
    real_take = client._Room.take

    def take(self: Any, size: int) -> bool:
        ok = real_take(self, size)
        if threading.current_thread().name == "runtime":
            took_room.set()
            go_on.wait(5)
        return ok

    monkeypatch.setattr(client._Room, "take", take)
    result: list[object] = []

    def runtime() -> None:
        try:
            result.append(p.publish(search(0)))
        except RuntimeError as exc:
            result.append(exc)

    publishing = threading.Thread(target=runtime, name="runtime")
    publishing.start()
    assert took_room.wait(5)
    # a short close: its flush runs out while the room is taken, and it counts what is held
    closing = threading.Thread(target=p.close, kwargs={"timeout": 0.2})
    closing.start()
    time.sleep(0.6)  # close does what it can before the publish goes on
    go_on.set()
    publishing.join(5)
    closing.join(10)
    s = p.stats()
    took = 1 if result == [True] else 0
    assert s.events == took and s.held == 0, (result, s)
    assert s.delivered + s.dropped + s.unconfirmed == took, (result, s)
    assert len(broker.taken) == s.delivered


async def test_a_keys_messages_failing_one_after_another_go_again_in_their_order() -> None:
    """One key, three messages in flight, their deliveries failing oldest first a moment
    apart (as one partition's batches do): each failure is put back in its order among
    those put back before it, and the three go again in the order they were made."""
    broker = HeldSends()
    p = await started(broker, max_batch_events=1)
    for i in range(3):
        assert await p.publish(search(i, "s1"))
    while len(broker.futures) < 3:
        await asyncio.sleep(0.005)
    for f in broker.futures[:3]:
        f.set_exception(KafkaConnectionError("broker gone"))
        await asyncio.sleep(0.01)
    delivered: list[str] = []
    deadline = time.monotonic() + 10
    while p.stats().held and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
        for k, f in enumerate(broker.futures):
            if not f.done():
                delivered.append(orjson.loads(broker.values[k])["event_id"])
                f.set_result(None)
    assert delivered == ["s1-0", "s1-1", "s1-2"]
    await p.close()
