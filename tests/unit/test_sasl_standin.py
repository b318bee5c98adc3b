"""The SASL exchange as aiokafka drives it, against the stand-in alone (no broker behind it:
tests/integration/test_sasl.py puts Tansu there): right credentials pass, wrong ones are
refused on the wire with Kafka's error, for PLAIN and SCRAM-SHA-256/512, over SaslAuthenticate
(v0-v2) and over raw tokens (SaslHandshake v0). And memdiag's side: a refused login is said
once, at once, never retried, and never with the password."""

from __future__ import annotations

import asyncio
import io
import logging
import socket
import struct
from collections.abc import Iterator

import pytest
from aiokafka.conn import create_conn
from aiokafka.errors import (
    KafkaConnectionError,
    SaslAuthenticationFailed,
    UnsupportedSaslMechanismError,
)

from memdiag import kafka
from memdiag.client import AsyncPublisher, BrokerUnavailable
from memdiag.settings import Settings
from tests.sasl_standin import (
    API_VERSIONS,
    MECHANISMS,
    PLAIN_REFUSED,
    SASL_AUTHENTICATE,
    SASL_AUTHENTICATION_FAILED,
    SASL_HANDSHAKE,
    SCRAM_REFUSED,
    UNSUPPORTED_VERSION,
    ApiVersions,
    SaslStandin,
    frame,
    read_uvarint,
    uvarint,
)

USER, SECRET = "memdiag", "s3cr3t-Pa55word-do-not-log"


@pytest.fixture
def standin() -> Iterator[SaslStandin]:
    with SaslStandin({USER: SECRET, "other": "another-password"}) as s:
        yield s


async def _connect(port: int, mechanism: str, user: str, password: str) -> None:
    conn = await create_conn(
        "127.0.0.1", port, security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
        sasl_plain_username=user, sasl_plain_password=password, request_timeout_ms=5000,
    )  # fmt: skip
    conn.close()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_the_right_credentials_pass_and_wrong_ones_are_refused_on_the_wire(
    standin: SaslStandin, mechanism: str
) -> None:
    asyncio.run(_connect(standin.port, mechanism, USER, SECRET))
    asyncio.run(_connect(standin.port, mechanism, "other", "another-password"))
    wanted = PLAIN_REFUSED if mechanism == "PLAIN" else SCRAM_REFUSED.format(mechanism)
    for user, password in ((USER, "wrong"), ("nobody", SECRET), (USER, "")):
        with pytest.raises(SaslAuthenticationFailed) as refused:
            asyncio.run(_connect(standin.port, mechanism, user, password))
        assert refused.value.errno == SASL_AUTHENTICATION_FAILED
        assert str(refused.value) == f"[Error 58] SaslAuthenticationFailed: {wanted}"
    seen = standin.snapshot()
    assert (seen.attempts[mechanism], seen.successes[mechanism], seen.failures[mechanism]) == (
        5, 2, 3
    )  # fmt: skip
    assert seen.connections == 5 and not seen.unauthenticated


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_raw_tokens_after_a_v0_handshake(mechanism: str) -> None:
    """A broker that offers SaslHandshake v0 only gets the tokens without a Kafka header
    (Kafka before 1.0); a wrong one is answered by closing the connection."""
    with SaslStandin({USER: SECRET}, handshake=(0, 0)) as s:
        asyncio.run(_connect(s.port, mechanism, USER, SECRET))
        with pytest.raises(KafkaConnectionError, match="closed"):
            asyncio.run(_connect(s.port, mechanism, USER, "wrong"))
        seen = s.snapshot()
    assert (seen.attempts[mechanism], seen.successes[mechanism], seen.failures[mechanism]) == (
        2, 1, 1
    )  # fmt: skip


def test_a_mechanism_the_broker_does_not_enable_is_refused_at_the_handshake() -> None:
    with SaslStandin({USER: SECRET}, mechanisms=["PLAIN"]) as s:
        with pytest.raises(UnsupportedSaslMechanismError):
            asyncio.run(_connect(s.port, "SCRAM-SHA-512", USER, SECRET))
        seen = s.snapshot()
    assert seen.unsupported == {"SCRAM-SHA-512": 1} and not seen.attempts


def _request(api_key: int, version: int, correlation_id: int, body: bytes, tags: bool) -> bytes:
    head = struct.pack(">hhih", api_key, version, correlation_id, 4) + b"test"
    return frame(head + (b"\x00" if tags else b"") + body)


def _read(sock: socket.socket) -> bytes:
    (n,) = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))
    return sock.recv(n, socket.MSG_WAITALL)


@pytest.mark.parametrize("password", [SECRET, "wrong"], ids=["right", "wrong"])
def test_sasl_authenticate_v2_the_flexible_encoding(standin: SaslStandin, password: str) -> None:
    """aiokafka sends v1; the Java client sends v2 (compact bytes, tagged fields, response
    header v1). Spoken byte by byte here."""
    with socket.create_connection(("127.0.0.1", standin.port), 5) as sock:
        sock.sendall(_request(SASL_HANDSHAKE, 1, 1, struct.pack(">h", 5) + b"PLAIN", False))
        assert _read(sock)[:6] == struct.pack(">ih", 1, 0)
        token = f"\0{USER}\0{password}".encode()
        sock.sendall(
            _request(SASL_AUTHENTICATE, 2, 2, uvarint(len(token) + 1) + token + b"\0", True)
        )
        buf = io.BytesIO(_read(sock))
        correlation_id, tags, error = struct.unpack(">ibh", buf.read(7))
        message = buf.read(read_uvarint(buf) - 1).decode() if error else None
        assert (correlation_id, tags) == (2, 0)
        if password == SECRET:
            assert (error, message) == (0, None)
            assert buf.read() == b"\x00\x01" + struct.pack(">q", 0) + b"\x00"  # null, b""
        else:
            assert (error, message) == (SASL_AUTHENTICATION_FAILED, PLAIN_REFUSED)
            assert sock.recv(1) == b""  # then closed, as Kafka does


@pytest.mark.parametrize(
    ("api_key", "version", "body"),
    [
        (3, 1, struct.pack(">i", 0)),  # Metadata
        (SASL_HANDSHAKE, 2, struct.pack(">h", 5) + b"PLAIN"),  # a version it does not offer
    ],
)
def test_any_other_request_before_authentication_closes_the_connection(
    standin: SaslStandin, api_key: int, version: int, body: bytes
) -> None:
    with socket.create_connection(("127.0.0.1", standin.port), 5) as sock:
        sock.sendall(_request(api_key, version, 7, body, False))
        assert sock.recv(1) == b""
    seen = standin.snapshot()
    assert seen.unauthenticated == {api_key: 1} and not seen.attempts


# -- ApiVersions: what the stand-in advertises on top of the broker's answer -------------------


def test_api_versions_v0_is_patched_with_the_sasl_apis() -> None:
    broker = ApiVersions(0, [(0, 0, 9, b""), (3, 0, 12, b""), (36, 0, 1, b"")])
    body = broker.encode()
    assert body == struct.pack(">hi", 0, 3) + struct.pack(">hhh", 0, 0, 9) + struct.pack(
        ">hhh", 3, 0, 12) + struct.pack(">hhh", 36, 0, 1)  # fmt: skip
    patched = ApiVersions.decode(0, body).advertise({17: (0, 1), 36: (0, 2)})
    assert patched.ranges() == {0: (0, 9), 3: (0, 12), 17: (0, 1), 36: (0, 2)}
    assert ApiVersions.decode(0, patched.encode()) == patched


def test_api_versions_v3_keeps_its_compact_array_and_tagged_fields() -> None:
    entry_tag = b"\x01\x05\x02hi"  # one tagged field on an entry: tag 5, two bytes
    top_tags = b"\x01\x00\x03abc"  # and one on the response (SupportedFeatures and the like)
    body = (
        struct.pack(">h", 0) + uvarint(3)
        + struct.pack(">hhh", 1, 0, 17) + b"\x00"
        + struct.pack(">hhh", 18, 0, 4) + entry_tag
        + struct.pack(">i", 0) + top_tags
    )  # fmt: skip
    decoded = ApiVersions.decode(3, body)
    assert decoded.encode() == body  # byte for byte
    assert decoded.keys[1] == (18, 0, 4, entry_tag)
    patched = ApiVersions.decode(3, decoded.advertise({17: (0, 1), 36: (0, 2)}).encode())
    assert patched.ranges() == {1: (0, 17), 17: (0, 1), 18: (0, 4), 36: (0, 2)}
    assert patched.tail == struct.pack(">i", 0) + top_tags and patched.keys[2][3] == entry_tag


def test_an_unsupported_version_answer_is_read_in_v0_encoding() -> None:
    body = struct.pack(">hi", UNSUPPORTED_VERSION, 1) + struct.pack(">hhh", API_VERSIONS, 0, 3)
    decoded = ApiVersions.decode(9, body)
    assert not decoded.compact and decoded.ranges() == {API_VERSIONS: (0, 3)}


# -- memdiag against it: refused once, said once, no password ----------------------------------


def _settings(port: int, mechanism: str, password: str) -> Settings:
    return Settings.from_env(
        {},
        broker=f"kafka://127.0.0.1:{port}",
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism=mechanism,
        kafka_sasl_username=USER,
        kafka_sasl_password=password,
    )


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_refused_login_is_not_retried(
    standin: SaslStandin, mechanism: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "not-the-" + SECRET
    settings = _settings(standin.port, mechanism, wrong)
    with pytest.raises(kafka.LoginRefused) as refused:
        # a long-running process's wait (no give_up_after): it would back off forever
        asyncio.run(asyncio.wait_for(kafka.wait_for_kafka(settings, "memdiag worker"), 10))
    message = str(refused.value)
    assert message.startswith(f"the broker refused the SASL {mechanism} login of user 'memdiag'")
    assert "MEMDIAG_KAFKA_SASL_USERNAME" in message and "MEMDIAG_KAFKA_SASL_MECHANISM" in message
    assert "SaslAuthenticationFailed" in message and "\n" not in message
    seen = standin.snapshot()
    assert (seen.attempts[mechanism], seen.failures[mechanism]) == (1, 1)
    said = message + "\n".join(r.getMessage() for r in caplog.records)
    assert wrong not in said and SECRET not in said


def test_a_broker_that_only_closes_is_still_retried() -> None:
    """A connection closed mid-exchange (Kafka before 1.0 refuses that way, but so does a
    broker restarting) is not taken for a refusal: it is waited for, with the backoff."""
    with SaslStandin({USER: SECRET}, handshake=(0, 0)) as s:
        settings = _settings(s.port, "PLAIN", "wrong")
        with pytest.raises(kafka.KafkaUnavailable) as failed:
            asyncio.run(kafka.wait_for_kafka(settings, "memdiag publish", give_up_after=2.5))
        assert not isinstance(failed.value, kafka.LoginRefused)
        assert s.snapshot().attempts["PLAIN"] == 2  # at 0 s and 1 s


def test_the_runtime_publisher_says_a_refused_login_at_once(standin: SaslStandin) -> None:
    async def go() -> None:
        publisher = AsyncPublisher(
            settings=_settings(standin.port, "SCRAM-SHA-256", "wrong"), wait_for_broker=30
        )
        await asyncio.wait_for(publisher.start(), 10)

    with pytest.raises(BrokerUnavailable, match="refused the SASL SCRAM-SHA-256 login") as e:
        asyncio.run(go())
    assert "retried" not in str(e.value)
    assert standin.snapshot().failures["SCRAM-SHA-256"] == 1
