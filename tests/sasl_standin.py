"""A Kafka broker's SASL front door, for the tests: no broker we can run checks credentials.

The bundled Tansu keeps no users (its memory store loses them, and its SCRAM exchange fails
with aiokafka), and no Apache Kafka can be fetched here. :class:`SaslStandin` is a proxy that
terminates SASL as a Kafka broker does, then pipes the authenticated connection to a real
broker behind it (:class:`SaslBroker`: Tansu advertising the stand-in's address, so every
connection a client opens after Metadata comes through it too).

What it speaks before a connection is authenticated, as Apache Kafka does:

- ApiVersions (18), any version: forwarded to the broker behind it, the answer patched to
  advertise what the stand-in itself speaks of 17 and 36 (v0-v2 plain, v3+ flexible: compact
  array and tagged fields; the response header is always v0). Without a broker behind it
  (``upstream=None``: the unit tests) it answers itself.
- SaslHandshake (17) v0-v1: the mechanism, or UNSUPPORTED_SASL_MECHANISM (33) and a close.
  After v0 the tokens come as raw size-prefixed frames (Kafka before 1.0); after v1 in:
- SaslAuthenticate (36) v0-v2 (v2 flexible): PLAIN (``authzid NUL user NUL password``), or
  SCRAM-SHA-256/512 in two rounds, checked by ``scramp``. A wrong credential gets
  SASL_AUTHENTICATION_FAILED (58) with Kafka's message, then the connection is closed.
- anything else: the connection is closed (Kafka does the same).

It counts, per mechanism, the exchanges begun (``attempts``), passed and refused, so a test
can tell one refused login from a retry storm. It never logs or keeps a token.
"""

from __future__ import annotations

import asyncio
import hmac
import io
import socket
import struct
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from scramp import ScramException, ScramMechanism

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
UNSUPPORTED_SASL_MECHANISM, UNSUPPORTED_VERSION, SASL_AUTHENTICATION_FAILED = 33, 35, 58

#: Kafka's own refusals (SaslServerAuthenticator, ScramSaslServer, PlainSaslServer)
PLAIN_REFUSED = "Authentication failed: Invalid username or password"
SCRAM_REFUSED = (
    "Authentication failed during authentication due to invalid credentials with SASL mechanism {}"
)


# -- the wire ---------------------------------------------------------------------------------


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_uvarint(buf: io.BytesIO) -> int:
    n = shift = 0
    while True:
        (byte,) = buf.read(1)
        n |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return n
        shift += 7


def read_tagged(buf: io.BytesIO) -> bytes:
    """A tagged-field section, kept as its raw bytes."""
    start = buf.tell()
    for _ in range(read_uvarint(buf)):
        read_uvarint(buf)  # the tag
        buf.read(read_uvarint(buf))
    end = buf.tell()
    buf.seek(start)
    return buf.read(end - start)


def flexible(api_key: int, version: int) -> bool:
    """Whether this request (and its response) uses the flexible encoding (KIP-482), for the
    three APIs the stand-in reads."""
    return (api_key == API_VERSIONS and version >= 3) or (
        api_key == SASL_AUTHENTICATE and version >= 2
    )


@dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: bytes  # after the header (its tagged fields too, on a flexible one)


def parse_request(payload: bytes) -> Request:
    buf = io.BytesIO(payload)
    api_key, api_version, correlation_id, n = struct.unpack(">hhih", buf.read(10))
    client_id = None if n < 0 else buf.read(n).decode("utf-8", "replace")
    if flexible(api_key, api_version):
        read_tagged(buf)
    return Request(api_key, api_version, correlation_id, client_id, buf.read())


@dataclass
class ApiVersions:
    """An ApiVersions response (after its correlation id): what a test patches or builds."""

    error_code: int
    keys: list[tuple[int, int, int, bytes]]  # (api key, min, max, its tagged fields)
    tail: bytes = b""  # throttle_time_ms, and on v3+ the response's tagged fields, as they came
    compact: bool = False  # v3+: a compact array, each entry with tagged fields

    @classmethod
    def decode(cls, version: int, body: bytes) -> ApiVersions:
        buf = io.BytesIO(body)
        (error_code,) = struct.unpack(">h", buf.read(2))
        # a broker that does not know the version asked answers in v0's encoding
        compact = version >= 3 and error_code != UNSUPPORTED_VERSION
        keys = []
        count = read_uvarint(buf) - 1 if compact else struct.unpack(">i", buf.read(4))[0]
        for _ in range(max(0, count)):
            key, low, high = struct.unpack(">hhh", buf.read(6))
            keys.append((key, low, high, read_tagged(buf) if compact else b""))
        return cls(error_code, keys, buf.read(), compact)

    @classmethod
    def build(cls, version: int, ranges: dict[int, tuple[int, int]]) -> ApiVersions:
        compact = version >= 3
        keys = [(k, lo, hi, b"\x00" if compact else b"") for k, (lo, hi) in sorted(ranges.items())]
        tail = b"" if version == 0 else struct.pack(">i", 0) + (b"\x00" if compact else b"")
        return cls(0, keys, tail, compact)

    def encode(self) -> bytes:
        out = [struct.pack(">h", self.error_code)]
        out.append(
            uvarint(len(self.keys) + 1) if self.compact else struct.pack(">i", len(self.keys))
        )
        out.extend(struct.pack(">hhh", k, lo, hi) + tags for k, lo, hi, tags in self.keys)
        out.append(self.tail)
        return b"".join(out)

    def ranges(self) -> dict[int, tuple[int, int]]:
        return {k: (lo, hi) for k, lo, hi, _ in self.keys}

    def advertise(self, ranges: dict[int, tuple[int, int]]) -> ApiVersions:
        """These ranges instead of the broker's (added where it has none), keys in order."""
        tags = b"\x00" if self.compact else b""
        kept = {k: (k, lo, hi, t) for k, lo, hi, t in self.keys}
        for k, (lo, hi) in ranges.items():
            kept[k] = (k, lo, hi, kept[k][3] if k in kept else tags)
        return ApiVersions(self.error_code, sorted(kept.values()), self.tail, self.compact)


def _string(text: str | None, compact: bool = False) -> bytes:
    if text is None:
        return b"\x00" if compact else struct.pack(">h", -1)
    raw = text.encode()
    return (uvarint(len(raw) + 1) if compact else struct.pack(">h", len(raw))) + raw


def _bytes(raw: bytes, compact: bool = False) -> bytes:
    return (uvarint(len(raw) + 1) if compact else struct.pack(">i", len(raw))) + raw


def handshake_response(correlation_id: int, error_code: int, mechanisms: Iterable[str]) -> bytes:
    names = list(mechanisms)
    return frame(
        struct.pack(">ihi", correlation_id, error_code, len(names))
        + b"".join(_string(m) for m in names)
    )


def authenticate_response(
    request: Request, error_code: int, message: str | None, auth_bytes: bytes
) -> bytes:
    v = request.api_version
    compact = v >= 2
    out = struct.pack(">i", request.correlation_id) + (b"\x00" if compact else b"")  # header
    out += struct.pack(">h", error_code) + _string(message, compact) + _bytes(auth_bytes, compact)
    if v >= 1:
        out += struct.pack(">q", 0)  # session_lifetime_ms: no re-authentication asked
    if compact:
        out += b"\x00"
    return frame(out)


def authenticate_bytes(request: Request) -> bytes:
    buf = io.BytesIO(request.body)
    if request.api_version >= 2:
        return buf.read(read_uvarint(buf) - 1)
    (n,) = struct.unpack(">i", buf.read(4))
    return buf.read(n)


# -- the exchanges ----------------------------------------------------------------------------


class Refused(Exception):
    """The credential is wrong; the message is what the client is told."""


class _Plain:
    def __init__(self, users: dict[str, str]):
        self.users = users

    def step(self, token: bytes) -> tuple[bytes, bool]:
        """(the answer, whether the exchange is done)."""
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise Refused(PLAIN_REFUSED)
        authzid, user, password = (p.decode("utf-8", "replace") for p in parts)
        known = self.users.get(user)
        if authzid not in ("", user) or known is None:
            raise Refused(PLAIN_REFUSED)
        if not hmac.compare_digest(known.encode(), password.encode()):
            raise Refused(PLAIN_REFUSED)
        return b"", True


class _Scram:
    def __init__(self, mechanism: str, auth_info: dict[str, tuple[Any, ...]]):
        self.refused = SCRAM_REFUSED.format(mechanism)

        def auth_fn(user: str) -> tuple[Any, ...]:
            if user not in auth_info:
                raise ScramException("unknown user")
            return auth_info[user]

        self.server = ScramMechanism(mechanism).make_server(auth_fn)
        self.round = 0

    def step(self, token: bytes) -> tuple[bytes, bool]:
        self.round += 1
        try:
            if self.round == 1:
                self.server.set_client_first(token.decode("utf-8"))
                return self.server.get_server_first().encode(), False
            if self.round == 2:
                self.server.set_client_final(token.decode("utf-8"))
                return self.server.get_server_final().encode(), True
        except (ScramException, UnicodeDecodeError):
            raise Refused(self.refused) from None
        raise Refused(self.refused)


@dataclass
class Counts:
    """What the stand-in saw, per mechanism: exchanges begun, passed, refused."""

    connections: int = 0
    attempts: Counter[str] = field(default_factory=Counter)
    successes: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    unsupported: Counter[str] = field(default_factory=Counter)  # mechanisms refused
    unauthenticated: Counter[int] = field(default_factory=Counter)  # api keys: closed


class SaslStandin:
    """The SASL-terminating proxy, on ``127.0.0.1:port`` (a free one by default), served
    from a thread of its own so a test's processes and its own clients can both use it.

    ``users``: user -> password, for every enabled mechanism. ``upstream``: the broker
    behind it (``None``: none; ApiVersions is answered by the stand-in and an authenticated
    connection is closed at its first request). ``handshake``, ``authenticate``: the
    versions of 17 and 36 it advertises (``handshake=(0, 0)`` makes a client send raw
    tokens)."""

    def __init__(
        self,
        users: dict[str, str],
        upstream: tuple[str, int] | None = None,
        mechanisms: Iterable[str] = MECHANISMS,
        handshake: tuple[int, int] = (0, 1),
        authenticate: tuple[int, int] = (0, 2),
        port: int = 0,
    ):
        self.users = dict(users)
        self.upstream = upstream
        self.mechanisms = tuple(mechanisms)
        self.ranges = {SASL_HANDSHAKE: handshake, SASL_AUTHENTICATE: authenticate}
        self.host, self.port = "127.0.0.1", port
        self.counts = Counts()
        self._lock = threading.Lock()
        # salted once: 4096 iterations, Kafka's minimum
        self._scram = {
            m: {u: ScramMechanism(m).make_auth_info(p, iteration_count=4096)
                for u, p in self.users.items()}
            for m in self.mechanisms if m.startswith("SCRAM-")
        }  # fmt: skip
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._error: BaseException | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"kafka://{self.bootstrap}"

    # -- counts, for the tests ---------------------------------------------------------------

    def snapshot(self) -> Counts:
        with self._lock:
            c = self.counts
            return Counts(
                c.connections, Counter(c.attempts), Counter(c.successes), Counter(c.failures),
                Counter(c.unsupported), Counter(c.unauthenticated),
            )  # fmt: skip

    def reset(self) -> None:
        with self._lock:
            self.counts = Counts()

    def _count(self, what: str, key: Any) -> None:
        with self._lock:
            getattr(self.counts, what)[key] += 1

    # -- life -------------------------------------------------------------------------------

    def start(self) -> SaslStandin:
        self._thread = threading.Thread(target=self._main, name="sasl-standin", daemon=True)
        self._thread.start()
        if not self._ready.wait(10) or self._error is not None:
            raise RuntimeError(f"the SASL stand-in did not start: {self._error}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> SaslStandin:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - said by start()
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._count_connection()
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            upstream = await self._converse(reader, writer)
            if upstream is not None:
                await asyncio.gather(_pipe(reader, upstream[1]), _pipe(upstream[0], writer))
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            for w in (writer, upstream[1] if upstream else None):
                if w is not None:
                    w.close()
            self._tasks.discard(task)

    def _count_connection(self) -> None:
        with self._lock:
            self.counts.connections += 1

    async def _converse(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The connection until it is authenticated: then the broker behind it (opened), or
        ``None`` to close it."""
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                payload = await _read_frame(reader)
                request = parse_request(payload)
                if request.api_key == API_VERSIONS:
                    upstream = upstream or await self._open_upstream()
                    writer.write(await self._api_versions(request, payload, upstream))
                elif request.api_key == SASL_HANDSHAKE and self._speaks(request):
                    passed = await self._authenticate(request, reader, writer)
                    if not passed or self.upstream is None:
                        break
                    return upstream or await self._open_upstream()
                else:
                    self._count("unauthenticated", request.api_key)
                    break
                await writer.drain()
        except BaseException:
            if upstream is not None:
                upstream[1].close()
            raise
        if upstream is not None:
            upstream[1].close()
        return None

    def _speaks(self, request: Request) -> bool:
        """Whether the request is in the range advertised for it (a version outside it is
        refused as Kafka refuses one: the connection is closed)."""
        low, high = self.ranges[request.api_key]
        return low <= request.api_version <= high

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        if self.upstream is None:
            return None
        return await asyncio.open_connection(*self.upstream)

    async def _api_versions(
        self,
        request: Request,
        payload: bytes,
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None,
    ) -> bytes:
        if upstream is None:
            answer = ApiVersions.build(request.api_version, {API_VERSIONS: (0, 3), **self.ranges})
            return frame(struct.pack(">i", request.correlation_id) + answer.encode())
        up_reader, up_writer = upstream
        up_writer.write(frame(payload))  # as it came
        await up_writer.drain()
        answer = await _read_frame(up_reader)
        head, body = answer[:4], answer[4:]  # ApiVersions' response header is always v0
        patched = ApiVersions.decode(request.api_version, body).advertise(self.ranges)
        return frame(head + patched.encode())

    async def _authenticate(
        self, handshake: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        mechanism = io.BytesIO(handshake.body)
        (n,) = struct.unpack(">h", mechanism.read(2))
        name = mechanism.read(n).decode("utf-8", "replace")
        if name not in self.mechanisms:
            self._count("unsupported", name)
            writer.write(
                handshake_response(handshake.correlation_id, UNSUPPORTED_SASL_MECHANISM,
                                   self.mechanisms)
            )  # fmt: skip
            await writer.drain()
            return False
        writer.write(handshake_response(handshake.correlation_id, 0, self.mechanisms))
        await writer.drain()
        self._count("attempts", name)
        exchange: _Plain | _Scram = (
            _Plain(self.users) if name == "PLAIN" else _Scram(name, self._scram[name])
        )
        raw = handshake.api_version == 0  # Kafka before 1.0: tokens without a header
        while True:
            payload = await _read_frame(reader)
            request = None if raw else parse_request(payload)
            if request is not None and not (
                request.api_key == SASL_AUTHENTICATE and self._speaks(request)
            ):
                self._count("unauthenticated", request.api_key)
                self._count("failures", name)
                return False
            token = payload if request is None else authenticate_bytes(request)
            try:
                answer, done = exchange.step(token)
            except Refused as refused:
                self._count("failures", name)
                if request is not None:  # raw tokens: Kafka just closes the connection
                    writer.write(
                        authenticate_response(request, SASL_AUTHENTICATION_FAILED,
                                              str(refused), b"")
                    )  # fmt: skip
                    await writer.drain()
                return False
            writer.write(
                frame(answer) if request is None
                else authenticate_response(request, 0, None, answer)
            )  # fmt: skip
            await writer.drain()
            if done:
                self._count("successes", name)
                return True


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (n,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(n)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


# -- a broker behind it -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SaslBroker:
    """The bundled Tansu (memory storage) behind a :class:`SaslStandin`: Tansu listens on a
    port of its own and advertises the stand-in's, so a client reaches the broker only
    through the stand-in, for the bootstrap and for every connection after it."""

    def __init__(self, users: dict[str, str], log: Path, **standin: Any):
        self.tansu_port = free_port()
        self.standin = SaslStandin(users, upstream=("127.0.0.1", self.tansu_port), **standin)
        self.log = log
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.standin.url

    def start(self) -> SaslBroker:
        from memdiag import procs
        from memdiag.broker import tansu_binary

        self.standin.start()
        with self.log.open("wb") as log:
            self._proc = procs.spawn(
                [
                    tansu_binary(), "broker",
                    "--listener-url", f"tcp://127.0.0.1:{self.tansu_port}",
                    "--advertised-listener-url", f"tcp://{self.standin.bootstrap}",
                    "--storage-engine", "memory://tansu/",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.tansu_port), 0.5).close()
                return self
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"Tansu did not start: {self.log.read_text()}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self._proc is not None:
            from memdiag import procs

            procs.stop(self._proc)
            self._proc = None
        self.standin.stop()

    def __enter__(self) -> SaslBroker:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
