"""``memdiag publish``'s file publisher when the broker stops answering: one clear error that
says how far it got, every delivery's outcome collected (no "Future exception was never
retrieved"), the producer stopped."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError

from memdiag import publish
from memdiag.kafka import KafkaUnavailable
from memdiag.settings import Settings


class HungBroker:
    """A producer whose broker acknowledges the first ``answered`` messages, then none: the
    later deliveries fail with a timeout, and a send after ``refuse_after`` raises at once."""

    def __init__(self, answered: int, refuse_after: int) -> None:
        self.answered, self.refuse_after = answered, refuse_after
        self.sent = 0
        self.stopped = False

    def __call__(self, **_: Any) -> HungBroker:
        return self

    async def start(self) -> None:
        pass

    async def send(self, topic: str, value: bytes, key: bytes | None) -> asyncio.Future[Any]:
        if self.sent >= self.refuse_after:
            raise KafkaTimeoutError("no metadata within 30000 ms")
        self.sent += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.sent <= self.answered:
            future.set_result(None)
        else:
            future.set_exception(KafkaTimeoutError("request timed out"))
        return future

    async def flush(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True


def events_file(tmp_path: Path, sessions: int, each: int) -> Path:
    path = tmp_path / "events.jsonl"
    with path.open("wb") as f:
        for s in range(sessions):
            for n in range(each):
                f.write(
                    orjson.dumps(
                        {
                            "kind": "search",
                            "event_id": f"e{s}-{n}",
                            "session_id": f"s{s}",
                            "query": "q",
                            "ts": "2026-11-20T10:00:00Z",
                            "result_ids": [],
                        }
                    )
                    + b"\n"
                )
    return path


@pytest.mark.parametrize("refuse_after", [4, 100], ids=["send refused", "deliveries failed"])
def test_a_hung_broker_is_one_clear_error_that_says_how_far_it_got(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refuse_after: int
) -> None:
    broker = HungBroker(answered=2, refuse_after=refuse_after)
    monkeypatch.setattr(publish, "AIOKafkaProducer", broker)
    unretrieved: list[Any] = []
    path = events_file(tmp_path, sessions=6, each=3)  # one message a session: 3 lines each

    async def go() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: unretrieved.append(ctx))
        await publish.publish_file(path, Settings(), batch_size=3)

    with pytest.raises(KafkaUnavailable) as caught:
        asyncio.run(go())
    gc.collect()  # a future whose error nobody read says so when it is collected
    message = str(caught.value)
    assert "stopped acknowledging" in message and "KafkaTimeoutError" in message
    assert "after 6 of the " in message  # two messages of three lines were acknowledged
    assert "again is safe" in message
    assert broker.stopped
    assert unretrieved == []


class SmallBroker(HungBroker):
    """A broker with a ``message.max.bytes``, behind a producer that packs what is sent
    together into one batch per topic (up to ``max_batch``, as aiokafka's ``max_batch_size``)
    until the sender waits: the broker judges the batch, and refuses every message of a batch
    over its limit. The producer refuses a message over ``max_request`` when it is sent."""

    def __init__(self, max_bytes: int, max_request: int = 10**9,
                 max_batch: int = 1024 * 1024) -> None:  # fmt: skip
        super().__init__(answered=10**9, refuse_after=10**9)
        self.max_bytes, self.max_request, self.max_batch = max_bytes, max_request, max_batch
        self.messages: list[tuple[str, bytes]] = []
        self.batches: list[list[tuple[str, bytes, asyncio.Future[Any]]]] = []
        self.open: dict[str, list[tuple[str, bytes, asyncio.Future[Any]]]] = {}

    async def send(self, topic: str, value: bytes, key: bytes | None) -> asyncio.Future[Any]:
        if len(value) > self.max_request:
            raise MessageSizeTooLargeError(f"the message is {len(value)} bytes")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        batch = self.open.get(topic)
        if batch and sum(len(v) for _, v, _ in batch) + len(value) > self.max_batch:
            self.batches.append(self.open.pop(topic))
        if not self.open and not self.batches:
            loop.call_soon(self.deliver)  # once the sender waits
        self.open.setdefault(topic, []).append((topic, value, future))
        return future

    def deliver(self) -> None:
        for batch in [*self.batches, *self.open.values()]:
            refused = sum(len(v) for _, v, _ in batch) > self.max_bytes
            for topic, value, future in batch:
                if refused:
                    future.set_exception(MessageSizeTooLargeError())
                else:
                    self.messages.append((topic, value))
                    future.set_result(None)
        self.batches.clear()
        self.open.clear()


def test_lines_refused_together_go_again_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker that takes 512 KB a message, and one session of 600 events of 1.5 KB: the
    900 KB message is refused, and its lines, each well under the limit, are taken one at a
    time (sent together again, the producer would pack them into one refused batch)."""
    broker = SmallBroker(512 * 1024)
    monkeypatch.setattr(publish, "AIOKafkaProducer", broker)
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(
        orjson.dumps({"kind": "response", "event_id": f"e{n}", "session_id": "s0",
                      "turn_id": "t", "ts": "2026-11-20T10:00:00Z", "text": "x" * 1_400})
        + b"\n" for n in range(600)))  # fmt: skip
    stats = asyncio.run(publish.publish_file(path, Settings(), batch_size=600))
    assert stats.too_large == 0 and stats.acknowledged == 600 and stats.events == 600
    assert stats.messages == 600  # acknowledged: each line alone
    events = [e for _, v in broker.messages for e in orjson.loads(v)]
    assert sorted(e["event_id"] for e in events) == sorted(f"e{n}" for n in range(600))


def big_lines_file(tmp_path: Path) -> tuple[Path, list[bytes]]:
    """Two sessions of three events each; the second event of s0 carries 100 KB, on line 3
    (a blank line before it)."""
    lines = []
    for s in range(2):
        for n in range(3):
            event = {"kind": "response", "event_id": f"e{s}-{n}", "session_id": f"s{s}",
                     "turn_id": "t", "ts": "2026-11-20T10:00:00Z",
                     "text": "x" * (100_000 if (s, n) == (0, 1) else 10)}  # fmt: skip
            lines.append(orjson.dumps(event))
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n\n".join(lines[:2]) + b"\n" + b"\n".join(lines[2:]) + b"\n")
    return path, lines


@pytest.mark.parametrize("where", ["broker", "producer"])
def test_a_line_too_large_for_one_message_is_dead_lettered_and_the_rest_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The broker refuses the batch holding the big line: its lines go again one by one, and
    the big one, refused alone, is dead-lettered (``too_large``) in its place. Over the
    producer's own max_request_size, the same without a round trip."""
    broker = SmallBroker(80_000) if where == "broker" else SmallBroker(10**9, max_request=80_000)
    monkeypatch.setattr(publish, "AIOKafkaProducer", broker)
    path, lines = big_lines_file(tmp_path)
    settings = Settings()
    stats = asyncio.run(publish.publish_file(path, settings, batch_size=3))
    assert stats.too_large == 1 and stats.acknowledged == 6 and stats.lines == 6
    assert stats.events == 5  # the dead-lettered line is not among the published
    events = [e for t, v in broker.messages if t == settings.topics.events
              for e in orjson.loads(v)]  # fmt: skip
    assert sorted(e["event_id"] for e in events) == ["e0-0", "e0-2", "e1-0", "e1-1", "e1-2"]
    (letter,) = [orjson.loads(v) for t, v in broker.messages if t == settings.topics.deadletter]
    assert letter["reason"] == "too_large" and letter["key"] == "s0"
    assert letter["payload_bytes"] == len(lines[1]) and letter["topic"] == settings.topics.events
    assert "line 3 of the published file" in letter["detail"]  # a blank line before it
    assert lines[1].decode().startswith(letter["payload"])
    # publishing the file again is the same dead letter (one row in DuckDB)
    again = SmallBroker(broker.max_bytes, broker.max_request)
    monkeypatch.setattr(publish, "AIOKafkaProducer", again)
    asyncio.run(publish.publish_file(path, settings, batch_size=3))
    (second,) = [orjson.loads(v) for t, v in again.messages if t == settings.topics.deadletter]
    assert second["dead_letter_id"] == letter["dead_letter_id"]


def test_a_broker_that_refuses_even_the_dead_letter_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class TooLarge(HungBroker):
        async def send(self, topic: str, value: bytes, key: bytes | None) -> asyncio.Future[Any]:
            raise MessageSizeTooLargeError("the message is 2000000 bytes")

    monkeypatch.setattr(publish, "AIOKafkaProducer", TooLarge(0, 0))
    with pytest.raises(KafkaUnavailable, match="refused a message as too large.*dead letter"):
        asyncio.run(publish.publish_file(events_file(tmp_path, 1, 1), Settings()))


def test_an_unkeyed_line_dead_lettered_is_not_counted_as_sent_to_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = SmallBroker(80_000)
    monkeypatch.setattr(publish, "AIOKafkaProducer", broker)
    path = tmp_path / "e.jsonl"
    path.write_bytes(orjson.dumps({"kind": "response", "text": "x" * 100_000}) + b"\n")
    stats = asyncio.run(publish.publish_file(path, Settings()))
    assert (stats.too_large, stats.unkeyed_lines, stats.events) == (1, 0, 0)
