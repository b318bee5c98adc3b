"""aiokafka's produce request, encoded with one copy of its record batches instead of six.

aiokafka encodes a request field by field, each level joining its children into new bytes:
a record batch is copied by ``Bytes.encode`` (its length prefixed by concatenation), by the
join of its partition, of the partition array, of its topic, of the topic array and of the
request. The worker's produce requests hold up to megabytes of record batches (a batched
catch-up's rows and changelog values), and with the mmap threshold the worker fixes at 128 KB
(:func:`memdiag.procs.tune_malloc`) each copy of a large block is a fresh mapping, faulted
in page by page: a request of 1.2 MB took 9-11 ms to encode on this machine, 2,350 page
faults, where the same bytes joined once take 3 ms and 880 faults (the connection still
copies the request twice when it puts the header and the size in front).

:class:`ProduceRequest` is aiokafka's, but its versions 3 to 7 (the ones with a
``transactional_id``: Kafka 0.11 and later; an older broker gets aiokafka's own) build
structs whose ``encode`` collects the small fields and the batches' buffers in one list and
joins it once. The structs keep aiokafka's class names, so its logs read the same. The
bytes are the same, field for field: :func:`same_bytes` checks it on a sample before
:func:`memdiag.streams.compat.patch_produce_encoding` puts it in aiokafka's producer sender,
and ``tests/unit/test_produce_request.py`` on drawn requests.
"""

from __future__ import annotations

import struct
from typing import Any

from aiokafka.protocol import produce

_INT16 = struct.Struct(">h").pack
_INT32 = struct.Struct(">i").pack
_ACKS_TIMEOUT = struct.Struct(">hi").pack
_PARTITION_SIZE = struct.Struct(">ii").pack

#: The schema the encoder writes: aiokafka's ProduceRequest v3 to v7, field names in order.
FIELDS = ("transactional_id", "required_acks", "timeout", "topics")


def _string(value: str | None) -> bytes:
    if value is None:
        return _INT16(-1)
    data = str(value).encode("utf-8")  # str(): as aiokafka's String (an enum's name, say)
    return _INT16(len(data)) + data


def encode(self: Any) -> bytes:
    """A ProduceRequest v3-v7 struct's bytes, its record batches copied once."""
    fields = self.__dict__
    topics = fields["topics"]
    parts: list[Any] = [
        _string(fields["transactional_id"]),
        _ACKS_TIMEOUT(fields["required_acks"], fields["timeout"]),
    ]
    append = parts.append
    if topics is None:
        append(_INT32(-1))
        return b"".join(parts)
    append(_INT32(len(topics)))
    for topic, partitions in topics:
        append(_string(topic))
        if partitions is None:
            append(_INT32(-1))
            continue
        append(_INT32(len(partitions)))
        for partition, records in partitions:
            if records is None:
                append(_PARTITION_SIZE(partition, -1))
            else:
                append(_PARTITION_SIZE(partition, len(records)))
                append(records)
    return b"".join(parts)


def _fast(cls: type[Any]) -> type[Any]:
    return type(cls.__name__, (cls,), {"encode": encode, "__module__": __name__})


#: aiokafka's struct class -> the same with :func:`encode` (versions 3 to 7)
FAST: dict[type[Any], type[Any]] = {
    cls: _fast(cls)
    for cls in produce.ProduceRequest._CLASSES
    if 3 <= cls.API_VERSION <= 7 and tuple(cls.SCHEMA.names) == FIELDS
}


class ProduceRequest(produce.ProduceRequest):
    """aiokafka's produce request; versions 3 to 7 encode with :func:`encode`."""

    def build(self, request_struct_class: type[Any]) -> Any:
        return super().build(FAST.get(request_struct_class, request_struct_class))


def same_bytes() -> list[str]:
    """Where :func:`encode` and aiokafka's encoding differ on a sample request (a
    transactional id or none, a topic with two partitions, a topic with none, a non-ASCII
    topic, an empty batch); empty when they agree for every version aiokafka has here."""
    topics = [
        ("memdiag.diagnostics", [(0, b"\x00\x01" * 40), (3, b"")]),
        ("memdiag.\u00e9v\u00e9nements", [(1, memoryview(b"batch")), (2, bytearray(b"built"))]),
        ("empty", []),
    ]
    problems = []
    if len(FAST) != 5:
        problems.append(f"ProduceRequest versions 3 to 7 with fields {FIELDS}: {len(FAST)} of 5")
    for original, fast in FAST.items():
        for transactional_id in (None, "memdiag-tx"):
            args = (transactional_id, -1, 30_000, topics)
            if fast(*args).encode() != original(*args).encode():
                problems.append(f"{original.__name__} encodes differently")
    return problems
