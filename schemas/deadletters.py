"""Dead letters (the ``memdiag.deadletter`` topic and the ``dead_letters`` table): what a
stage sends for an input it cannot apply, built in one place for every stage and the sink.
A bad input never vanishes and never stops a stage: it becomes one of these, with a reason
(``memdiag.contract``) and a detail a person can act on."""

from __future__ import annotations

import hashlib
from typing import Any

from memdiag.contract import DEAD_LETTERS, PROCESSING_ERROR
from memdiag.contract.envelope import InMessage, Output
from memdiag.schemas.decode import Rejected
from memdiag.schemas.models import format_ts
from memdiag.settings import Settings


def failed_output(msg: InMessage, exc: BaseException, settings: Settings) -> Output:
    """The output for a message whose processing raised: it is dead-lettered whole
    (``processing_error``), so the agent goes on and the message does not vanish."""
    out = Output()
    detail = (
        f"the worker failed on this message ({type(exc).__name__}: {exc}); it was not "
        "processed. This is a memdiag bug: report it with this payload"
    )
    payload = msg.value or b""
    rejected = Rejected(0, PROCESSING_ERROR, detail, payload)
    where = (msg.partition, msg.offset, "message", digest(payload))
    add_dead_letter(out, msg, rejected, settings, identity=where)
    return out


def add_dead_letter(
    out: Output,
    msg: InMessage,
    rejected: Rejected,
    settings: Settings,
    identity: tuple[object, ...] | None = None,
    count: bool = True,
) -> None:
    """Send ``rejected`` (from ``msg``) to the dead-letter topic, and count it (unless it is
    sent again: ``count``). ``identity``: see :func:`dead_letter_id` (by default, where the
    input was)."""
    record = dead_letter_record(msg, rejected, settings, identity)
    out.deadletters.append((msg.key, record))
    if count:
        out.count(DEAD_LETTERS, reason=rejected.reason)


def dead_letter_id(topic: str, prefix: str, *where: object) -> str:
    """The identity of a dead letter: its source topic (without the prefix) and where in it
    the bad input was, so a replay (the same offsets again) lands on the same row, and two
    bad inputs are two rows even when their bytes are equal (two elements of one batch, or
    the same broken line published twice).

    ``where`` is ``(partition, offset, index, digest)`` for an input refused as it came
    (``index``: its position in a batch message; ``digest``: of its bytes, so a topic that
    starts its offsets over, such as the embedded broker's on every ``memdiag run``, does
    not overwrite older rows), ``("event", event_id)`` for a valid event that could not be
    applied (its id is the idempotency key: a re-delivery is the same event), and
    ``(partition, offset, "message", digest)`` for a whole message the stage failed on.
    """
    base = topic[len(prefix) :] if topic.startswith(prefix) else topic
    text = "\0".join([base, *(str(w) for w in where)])
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def digest(payload: bytes) -> str:
    return hashlib.blake2b(payload, digest_size=12).hexdigest()


def dead_letter_record(
    msg: InMessage,
    rejected: Rejected,
    settings: Settings,
    identity: tuple[object, ...] | None = None,
) -> dict[str, Any]:
    limit = settings.deadletter_payload_bytes
    payload = rejected.payload
    where = identity or (msg.partition, msg.offset, rejected.index, digest(payload))
    return {
        "dead_letter_id": dead_letter_id(msg.topic, settings.topic_prefix, *where),
        "topic": msg.topic,
        "partition": msg.partition,
        "offset": msg.offset,
        "batch_index": rejected.index,
        "key": msg.key.decode("utf-8", "replace") if msg.key is not None else None,
        "reason": rejected.reason,
        "detail": rejected.detail,
        "payload": payload[:limit].decode("utf-8", "replace"),
        "payload_bytes": len(payload),
        "payload_truncated": len(payload) > limit,
        "ts": format_ts((msg.timestamp_ms or 0) * 1000),
    }
