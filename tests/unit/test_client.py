"""``memdiag.client``: validation before sending, routing and keys, batching per key within
the linger, flush and close. A fake producer records what would go to Kafka. What happens
when the broker goes away is in test_client_outage.py."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from memdiag.client import AsyncPublisher, EventRejected, Publisher
from memdiag.settings import Settings

SETTINGS = Settings.from_env({}, topic_prefix="u.")


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, Any]] = []

    async def send(self, topic: str, value: bytes, key: bytes) -> asyncio.Future[None]:
        self.sent.append((topic, key, orjson.loads(value)))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def search(i: int, session: str = "s1") -> dict[str, Any]:
    return {"kind": "search", "event_id": f"{session}-{i}", "ts": "2026-11-21T09:30:00Z",
            "session_id": session, "query": "q", "result_ids": ["a"]}  # fmt: skip


def judgement() -> dict[str, Any]:
    return {"kind": "judgement", "event_id": "j1", "ts": "2026-11-21T09:30:00Z", "run_id": "r1",
            "question_id": "q1", "judge_correct": False, "gold_evidence_ids": ["m"],
            "retrieved_context_ids": ["m"]}  # fmt: skip


async def publisher(**kw: Any) -> tuple[AsyncPublisher, FakeProducer]:
    fake = FakeProducer()
    p = AsyncPublisher(settings=SETTINGS, producer=fake, **kw)
    await p.start()
    return p, fake


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        ({"kind": "nope", "event_id": "x", "ts": "2026-11-21T09:30:00Z"}, "unknown_kind"),
        ({k: v for k, v in search(1).items() if k != "session_id"}, "missing_field"),
        ({**search(1), "ts": "yesterday"}, "bad_ts"),
        ({**search(1), "ts": "2099-01-01T00:00:00Z"}, "bad_ts"),  # in the future
        ({**search(1), "result_ids": "a"}, "wrong_type"),
    ],
)
async def test_a_bad_event_raises_with_the_reason_and_sends_nothing(
    event: dict[str, Any], reason: str
) -> None:
    p, fake = await publisher()
    with pytest.raises(EventRejected) as caught:
        await p.publish(event)
    assert caught.value.reason == reason
    assert caught.value.detail
    await p.close()
    assert fake.sent == []


async def test_events_of_one_session_go_together_in_order_keyed_by_session() -> None:
    p, fake = await publisher(linger_ms=100)
    for i in range(3):
        await p.publish(search(i))
    await p.publish(search(0, "s2"))
    await p.publish(judgement())
    await p.flush()
    by_key = {(t, k): v for t, k, v in fake.sent}
    assert by_key[("u.events", b"s1")] == [search(0), search(1), search(2)]
    assert by_key[("u.events", b"s2")] == search(0, "s2")  # alone: a plain object
    assert by_key[("u.judgements", b"r1")] == judgement()
    await p.close()


async def test_the_linger_sends_without_a_flush() -> None:
    p, fake = await publisher(linger_ms=10)
    await p.publish(search(0))
    for _ in range(100):
        if fake.sent:
            break
        await asyncio.sleep(0.01)
    assert fake.sent == [("u.events", b"s1", search(0))]
    await p.close()


async def test_a_full_batch_goes_at_once() -> None:
    p, fake = await publisher(linger_ms=100, max_batch_events=2)
    for i in range(5):
        await p.publish(search(i))
    for _ in range(5):  # well within the 100 ms linger
        await asyncio.sleep(0.001)
    assert [len(v) for _, _, v in fake.sent] == [2, 2]
    await p.close()
    assert fake.sent[-1][2] == search(4)


async def test_close_sends_what_is_queued() -> None:
    p, fake = await publisher(linger_ms=100)
    await p.publish(search(0))
    await p.close()
    assert len(fake.sent) == 1


async def test_a_closed_publisher_refuses_events() -> None:
    p, _ = await publisher()
    await p.close()
    with pytest.raises(RuntimeError, match="closed"):
        await p.publish(search(0))


def test_the_linger_is_bounded() -> None:
    with pytest.raises(ValueError, match="linger_ms"):
        AsyncPublisher(settings=SETTINGS, producer=FakeProducer(), linger_ms=500)


async def test_the_order_of_a_sessions_events_is_kept_across_batches() -> None:
    p, fake = await publisher(linger_ms=5, max_batch_events=3)
    for i in range(10):
        await p.publish(search(i))
        if i % 4 == 0:
            await asyncio.sleep(0.01)  # some batches close by the linger, some by the cap
    await p.close()
    got = [e for _, _, v in fake.sent for e in (v if isinstance(v, list) else [v])]
    assert got == [search(i) for i in range(10)]


def test_the_blocking_publisher_keeps_order_from_several_threads() -> None:
    import threading

    fake = FakeProducer()
    with Publisher(settings=SETTINGS, producer=fake, linger_ms=10) as p:

        def session(name: str) -> None:
            for i in range(200):
                p.publish(search(i, name))

        threads = [threading.Thread(target=session, args=(f"s{t}",)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for t in range(4):
        key = f"s{t}".encode()
        got = [e for _, k, v in fake.sent if k == key for e in (v if isinstance(v, list) else [v])]
        assert got == [search(i, f"s{t}") for i in range(200)]


def test_the_blocking_publisher_validates_and_sends_on_close() -> None:
    fake = FakeProducer()
    with Publisher(settings=SETTINGS, producer=fake, linger_ms=100) as p:
        p.publish(search(0))
        p.publish(search(1))
        with pytest.raises(EventRejected):
            p.publish({"kind": "search"})
    assert fake.sent == [("u.events", b"s1", [search(0), search(1)])]
