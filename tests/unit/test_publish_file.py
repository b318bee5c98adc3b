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


def test_a_message_the_broker_refuses_as_too_large_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class TooLarge(HungBroker):
        async def send(self, topic: str, value: bytes, key: bytes | None) -> asyncio.Future[Any]:
            raise MessageSizeTooLargeError("the message is 2000000 bytes")

    monkeypatch.setattr(publish, "AIOKafkaProducer", TooLarge(0, 0))
    with pytest.raises(KafkaUnavailable, match="refused a message as too large.*trim or remove"):
        asyncio.run(publish.publish_file(events_file(tmp_path, 1, 1), Settings()))
