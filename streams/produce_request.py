"""aiokafka's produce request, encoded with one copy of its record batches instead of six.

aiokafka encodes a request field by field, each level joining its children into new bytes:
a record batch is copied by ``Bytes.encode`` (its length prefixed by concatenation), by the
join of its partition, of the partition array, of its topic, of the topic array and of the
request. The worker's produce requests hold up to megabytes of record batches (a batched
catch-up's rows and changelog values), and each copy of a block over the mmap threshold the
worker fixes (1 MB, :func:`memdiag.procs.tune_malloc`; it was 128 KB when this was measured)
is a fresh mapping, faulted in page by page: a request of 1.2 MB took 9-11 ms to encode on
this machine, 2,350 page faults, where the same bytes joined once take 3 ms and 880 faults.

The connection then copied the whole request twice more: aiokafka's
``AIOKafkaConnection.send`` puts the header in front (``header.encode() +
request_struct.encode()``) and then the size (``size + message``), two concatenations of
megabytes (on the batched benchmark 176 MB of fresh mappings in 4.5 s, two fifths of the
worker's large blocks). So :func:`encode` gives an :class:`Unjoined`: the parts, joined only
when the size goes in front, header included, in one copy. It is as long as its bytes and
``bytes()`` gives them; anything else aiokafka might do with it fails loudly (a writer takes
no ``Unjoined``), and :func:`same_bytes` runs aiokafka's own ``send`` on a sample at start.

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


class Unjoined:
    """A request's bytes as parts, joined once the connection has put its header and then
    the size in front (see the module docstring): ``header + unjoined`` is another
    ``Unjoined``, ``size + that`` the bytes."""

    __slots__ = ("_parts", "_size", "_headed")

    def __init__(self, parts: list[Any], size: int, headed: bool = False):
        self._parts = parts
        self._size = size
        self._headed = headed

    def __len__(self) -> int:
        return self._size

    def __radd__(self, left: Any) -> Any:
        if not isinstance(left, bytes):
            return NotImplemented
        if self._headed:  # the size: the whole request, copied once
            return b"".join([left, *self._parts])
        return Unjoined([left, *self._parts], self._size + len(left), headed=True)

    def __bytes__(self) -> bytes:
        return b"".join(self._parts)

    def __repr__(self) -> str:
        return f"<Unjoined {self._size} bytes in {len(self._parts)} parts>"


def encode(self: Any) -> Unjoined:
    """A ProduceRequest v3-v7 struct's bytes, its record batches copied once (when the
    connection joins them: :class:`Unjoined`)."""
    fields = self.__dict__
    topics = fields["topics"]
    parts: list[Any] = [
        _string(fields["transactional_id"]),
        _ACKS_TIMEOUT(fields["required_acks"], fields["timeout"]),
    ]
    append = parts.append
    if topics is None:
        append(_INT32(-1))
        return _unjoined(parts)
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
    return _unjoined(parts)


def _unjoined(parts: list[Any]) -> Unjoined:
    # a memoryview's bytes, whatever its format (aiokafka's batches are bytearrays)
    size = sum(p.nbytes if type(p) is memoryview else len(p) for p in parts)
    return Unjoined(parts, size)


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
    topic, an empty batch), and where aiokafka's connection writes other bytes for it than
    for its own request (:func:`sent_by_aiokafka`); empty when they agree for every version
    aiokafka has here."""
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
            if bytes(fast(*args).encode()) != original(*args).encode():
                problems.append(f"{original.__name__} encodes differently")
    try:
        ours = sent_by_aiokafka(ProduceRequest(None, -1, 30_000, topics))
        theirs = sent_by_aiokafka(produce.ProduceRequest(None, -1, 30_000, topics))
    except Exception as exc:  # noqa: BLE001 - whatever changed in aiokafka's connection
        problems.append(f"aiokafka's connection does not send memdiag's request ({exc!r})")
    else:
        if ours != theirs:
            problems.append("aiokafka's connection sends memdiag's request as other bytes")
    return problems


class _Writer:
    """What a connection's ``send`` writes (in place of the stream writer)."""

    def __init__(self) -> None:
        self.written: list[Any] = []

    def write(self, data: Any) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):  # as a transport says
            raise TypeError(f"data argument must be a bytes-like object, not {type(data)}")
        self.written.append(bytes(data))

    def drain(self) -> None:
        return None


def sent_by_aiokafka(request: Any, version: int = 7) -> bytes:
    """The bytes aiokafka's own ``AIOKafkaConnection.send`` writes for ``request`` (at
    ``version``, correlation id 1), on a connection that is not connected: its writer is a
    list (the attributes ``send`` reads are set here; a renamed one raises)."""
    from aiokafka.conn import AIOKafkaConnection

    conn = AIOKafkaConnection.__new__(AIOKafkaConnection)
    writer = _Writer()
    attributes = {"_writer": writer, "_versions": {request.API_KEY: (version, version)},
                  "_correlation_id": 0, "_client_id": "memdiag", "_host": "sample",
                  "_port": 9092}  # fmt: skip
    for name, value in attributes.items():
        setattr(conn, name, value)
    conn.send(request, expect_response=False)
    if len(writer.written) != 1:
        raise RuntimeError(f"the connection wrote {len(writer.written)} times, not once")
    return writer.written[0]
