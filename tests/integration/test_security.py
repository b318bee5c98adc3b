"""Who may connect: TLS and SASL settings reach every client, secrets never reach a log,
and a broker that refuses us is retried at most once a second, backing off to 30 s.

TLS is verified against a real broker: the bundled Tansu cannot serve TLS itself (its
0.6.0 binary refuses ``--cert`` with ``--key``), so the test puts a TLS terminator (Python's
``ssl``, a certificate made in the test) in front of it, as a load balancer would. SASL on the wire (a login accepted or refused, the
worker, the sink and ``publish`` through it) is tests/integration/test_sasl.py, through a
stand-in that terminates SASL in front of Tansu; here, that the settings reach the clients
unchanged, and what a Tansu requiring authentication (it has no user) does to memdiag: a
refused login is said at once, a connection only closed is retried without a storm, and
no password reaches a log either way.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memdiag import kafka
from memdiag.broker import tansu_binary
from memdiag.settings import ConfigError, Settings

pytestmark = pytest.mark.integration

SECRET = "s3cr3t-Pa55word-do-not-log"  # a test secret that must never reach a log


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _certificates(where: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it (PEM files)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)

    def key() -> Any:
        return ec.generate_private_key(ec.SECP256R1())

    ca_key, server_key = key(), key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    paths = (where / f"{name}-ca.pem", where / f"{name}-server.pem", where / f"{name}-server.key")
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(server.public_bytes(pem))
    paths[2].write_bytes(
        server_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


#: A TLS terminator in front of a plaintext port, run as its own process (argv: listen port,
#: upstream port, certificate, key), as a load balancer terminating TLS would be.
TLS_FRONT = """
import asyncio, ssl, sys
port, upstream, cert, key = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
context.load_cert_chain(cert, key)

async def pipe(r, w):
    try:
        while data := await r.read(65536):
            w.write(data)
            await w.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        w.close()

async def serve(r, w):
    try:
        ur, uw = await asyncio.open_connection("127.0.0.1", upstream)
    except OSError:
        w.close()
        return
    await asyncio.gather(pipe(r, uw), pipe(ur, w))

async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", port, ssl=context)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""


def _wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {port}"
            time.sleep(0.05)


def _tansu(
    log: Any, port: int, *args: str, advertised: int | None = None
) -> subprocess.Popen[bytes]:
    """The bundled Tansu on ``port`` (memory storage), advertising ``advertised`` (default:
    the same port), with more ``args``; readiness is the caller's to check."""
    return subprocess.Popen(
        [
            tansu_binary(), "broker", *args,
            "--listener-url", f"tcp://127.0.0.1:{port}",
            "--advertised-listener-url", f"tcp://127.0.0.1:{advertised or port}",
            "--storage-engine", "memory://tansu/",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Tansu on a plaintext port, advertising the TLS front's port, and the front."""
    ca, cert, key = _certificates(tmp_path, "good")
    other_ca, _, _ = _certificates(tmp_path, "other")
    plain, front = _free_port(), _free_port()
    log = (tmp_path / "tansu.log").open("wb")
    proc = _tansu(log, plain, advertised=front)
    terminator = subprocess.Popen(
        [sys.executable, "-c", TLS_FRONT, str(front), str(plain), str(cert), str(key)]
    )
    try:
        _wait_port(plain)
        _wait_port(front)
        yield {"port": front, "ca": ca, "other_ca": other_ca, "plain": plain}
    finally:
        for p in (terminator, proc):
            p.kill()
            p.wait(10)
        log.close()


def _tls_settings(port: int, cafile: Path, **more: Any) -> Settings:
    return Settings.from_env(
        {},
        broker=f"kafka://127.0.0.1:{port}",
        kafka_security_protocol="SSL",
        kafka_ssl_cafile=str(cafile),
        topic_prefix=f"tls{port}.",
        **more,
    )


def test_tls_verified_against_the_ca(tls_broker: dict[str, Any]) -> None:
    settings = _tls_settings(tls_broker["port"], tls_broker["ca"])
    asyncio.run(kafka.wait_for_kafka(settings, "test", give_up_after=20))
    asyncio.run(kafka.ensure_topics(settings))  # a real exchange over TLS

    async def roundtrip() -> bytes:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        p = AIOKafkaProducer(**kafka.client_options(settings))
        await p.start()
        try:
            await p.send_and_wait(settings.topics.events, b'"over tls"', key=b"k")
        finally:
            await p.stop()
        c = AIOKafkaConsumer(
            settings.topics.events, **kafka.client_options(settings),
            auto_offset_reset="earliest", group_id=None,
        )  # fmt: skip
        await c.start()
        try:
            got = await c.getmany(timeout_ms=5000)
            return next(m.value for ms in got.values() for m in ms)
        finally:
            await c.stop()

    assert asyncio.run(roundtrip()) == b'"over tls"'


def test_a_wrong_ca_is_a_clear_error(tls_broker: dict[str, Any]) -> None:
    settings = _tls_settings(tls_broker["port"], tls_broker["other_ca"])
    with pytest.raises(kafka.KafkaUnavailable, match="TLS certificate did not verify"):
        asyncio.run(kafka.wait_for_kafka(settings, "test", give_up_after=3))


def test_plaintext_to_a_tls_port_fails_without_a_storm(tls_broker: dict[str, Any]) -> None:
    settings = Settings.from_env({}, broker=f"kafka://127.0.0.1:{tls_broker['port']}")
    with pytest.raises(kafka.KafkaUnavailable, match="MEMDIAG_BROKER"):
        asyncio.run(kafka.wait_for_kafka(settings, "test", give_up_after=3))


# -- SASL ---------------------------------------------------------------------------------------


def _sasl_settings(port: int, mechanism: str = "SCRAM-SHA-512", **more: Any) -> Settings:
    return Settings.from_env(
        {},
        broker=f"kafka://127.0.0.1:{port}",
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism=mechanism,
        kafka_sasl_username="memdiag",
        kafka_sasl_password=SECRET,
        **more,
    )


@pytest.fixture
def auth_broker(tmp_path: Path) -> Iterator[int]:
    """Tansu that requires client authentication (and has no user: it refuses everyone)."""
    port = _free_port()
    log = (tmp_path / "tansu.log").open("wb")
    proc = _tansu(log, port, "--authentication")
    try:
        _wait_port(port)
        yield port
    finally:
        proc.kill()
        proc.wait(10)
        log.close()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_refused_credentials_no_storm_and_no_secret_in_any_log(
    auth_broker: int,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    mechanism: str,
) -> None:
    """Tansu answers SCRAM for an unknown user with an error (``e=``): a refusal, said at
    once. It offers no PLAIN and only closes the connection: that could be a broker
    restarting, so it is retried, at most once a second, the delay doubling."""
    attempts: list[float] = []
    real = kafka.probe

    async def counted(settings: Settings, timeout: float = 10.0) -> None:
        attempts.append(time.monotonic())
        await real(settings, timeout)

    monkeypatch.setattr(kafka, "probe", counted)
    settings = _sasl_settings(auth_broker, mechanism)
    # everything aiokafka says at DEBUG, straight from its logger (memdiag keeps it from
    # propagating while it probes), and everything memdiag says
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep(logging.DEBUG)
    aiokafka_log = logging.getLogger("aiokafka")
    level = aiokafka_log.level
    aiokafka_log.setLevel(logging.DEBUG)
    for name in ("aiokafka", "memdiag"):
        logging.getLogger(name).addHandler(keep)
    caplog.set_level(logging.DEBUG)
    try:
        with pytest.raises(kafka.KafkaUnavailable) as failed:
            asyncio.run(kafka.wait_for_kafka(settings, "test", give_up_after=7.5))
    finally:
        for name in ("aiokafka", "memdiag"):
            logging.getLogger(name).removeHandler(keep)
        aiokafka_log.setLevel(level)
    gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
    if mechanism == "PLAIN":
        # at most one attempt a second, the delay doubling: each gap is at least its delay
        assert 2 <= len(attempts) <= 4, gaps
        assert all(g >= 0.95 * 2**i for i, g in enumerate(gaps)), gaps
        assert not isinstance(failed.value, kafka.LoginRefused)
    else:
        assert len(attempts) == 1 and isinstance(failed.value, kafka.LoginRefused)
        assert "refused the SASL SCRAM-SHA-512 login of user 'memdiag'" in str(failed.value)
    assert "memdiag" in str(failed.value) and SECRET not in str(failed.value)
    text = "\n".join(r.getMessage() for r in records + caplog.records) + repr(settings)
    assert SECRET not in text
    assert any(r.name.startswith("aiokafka") for r in records), "aiokafka said nothing"


def test_the_backoff_grows_to_thirty_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []

    async def fail(settings: Settings, timeout: float = 10.0) -> None:
        raise ConnectionRefusedError("refused")

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) >= 9:
            raise asyncio.CancelledError

    monkeypatch.setattr(kafka, "probe", fail)
    monkeypatch.setattr(kafka.asyncio, "sleep", sleep)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(kafka.wait_for_kafka(Settings(), "test"))
    assert sleeps == [1, 2, 4, 8, 16, 30, 30, 30, 30]


def test_settings_reach_every_client_unchanged(tmp_path: Path) -> None:
    """What each client is built with: aiokafka's options and Faust's credentials."""
    import faust

    from memdiag.streams.app import credentials

    secret_file = tmp_path / "password"
    secret_file.write_text(SECRET + "\n")
    ca, _, _ = _certificates(tmp_path, "ca")
    env = {
        "MEMDIAG_BROKER": "kafka://broker:9093",
        "MEMDIAG_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "MEMDIAG_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
        "MEMDIAG_KAFKA_SASL_USERNAME": "memdiag",
        "MEMDIAG_KAFKA_SASL_PASSWORD_FILE": str(secret_file),
        "MEMDIAG_KAFKA_SSL_CAFILE": str(ca),
    }
    s = Settings.from_env(env)
    options = kafka.client_options(s)
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "SCRAM-SHA-256"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("memdiag", SECRET)
    assert options["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    assert options["ssl_context"].check_hostname
    creds = credentials(s)
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.username, creds.password, creds.mechanism.value) == (
        "memdiag", SECRET, "SCRAM-SHA-256"
    )  # fmt: skip
    assert creds.protocol.value == "SASL_SSL" and creds.ssl_context is not None
    # a child process gets the file, not the secret, in its environment
    assert SECRET not in str(s.as_env()) and SECRET not in repr(s)
    assert Settings.from_env(s.as_env()).kafka_sasl_password == SECRET
    from aiokafka import AIOKafkaProducer

    async def build() -> None:
        producer = AIOKafkaProducer(**options)  # aiokafka accepts every option as given
        assert producer.client._sasl_mechanism == "SCRAM-SHA-256"
        assert producer.client._security_protocol == "SASL_SSL"
        await producer.stop()

    asyncio.run(build())
    plain = Settings.from_env({})
    assert kafka.client_options(plain) == {
        "bootstrap_servers": "localhost:9092", "security_protocol": "PLAINTEXT"
    }  # fmt: skip
    assert credentials(plain) is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MEMDIAG_KAFKA_SECURITY_PROTOCOL": "TLS"}, "use one of PLAINTEXT, SSL"),
        ({"MEMDIAG_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "needs MEMDIAG_KAFKA_SASL_USERNAME"),
        (
            {
                "MEMDIAG_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "MEMDIAG_KAFKA_SASL_MECHANISM": "GSSAPI",
                "MEMDIAG_KAFKA_SASL_USERNAME": "u",
                "MEMDIAG_KAFKA_SASL_PASSWORD": "p",
            },
            "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512",
        ),  # fmt: skip
        (
            {"MEMDIAG_KAFKA_SECURITY_PROTOCOL": "SSL", "MEMDIAG_KAFKA_SSL_CAFILE": "/nope.pem"},
            "no such file",
        ),
        ({"MEMDIAG_KAFKA_SASL_PASSWORD_FILE": "/nope"}, "cannot read it"),
    ],
)
def test_wrong_security_settings_are_refused_at_start(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env)


def test_a_missing_broker_is_waited_for_with_one_clear_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = _free_port()
    settings = Settings.from_env({}, broker=f"kafka://127.0.0.1:{port}")
    caplog.set_level(logging.WARNING, logger="memdiag.kafka")

    async def later() -> float:
        waiting = asyncio.ensure_future(kafka.wait_for_kafka(settings, "memdiag sink"))
        await asyncio.sleep(2.5)
        assert not waiting.done()
        from memdiag.broker import EmbeddedBroker

        broker = await asyncio.to_thread(EmbeddedBroker(port=port).start)  # it comes up
        try:
            t0 = time.monotonic()
            await asyncio.wait_for(waiting, 30)
            return time.monotonic() - t0
        finally:
            broker.stop()

    assert asyncio.run(later()) < 10  # started within the backoff once the broker came
    lines = [r.getMessage() for r in caplog.records if r.name == "memdiag.kafka"]
    assert len(lines) == 1 and "memdiag sink waits for Kafka" in lines[0]
    assert f"MEMDIAG_BROKER=kafka://127.0.0.1:{port}" in lines[0]
