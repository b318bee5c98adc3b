"""SASL on the wire: memdiag's clients, the worker, the sink and ``memdiag publish`` log in
with the settings a user writes, and a wrong password stops each of them once, with one line.

No broker we can run checks credentials (the bundled Tansu keeps no users, no Apache Kafka
can be fetched here), so a stand-in terminates SASL in front of a real Tansu, as Kafka's
own authenticator would: tests/sasl_standin.py. Tansu advertises the stand-in's address, so
every connection a client opens (bootstrap, partition leaders, group coordinator) logs in
through it. With ``MEMDIAG_TEST_BROKER`` and ``MEMDIAG_TEST_SASL_USERNAME`` /
``MEMDIAG_TEST_SASL_PASSWORD`` (``MEMDIAG_TEST_SASL_MECHANISM``, default SCRAM-SHA-512;
``MEMDIAG_TEST_SASL_PROTOCOL``, default SASL_PLAINTEXT; ``MEMDIAG_TEST_SSL_CAFILE``) the
same checks run against that broker too.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from memdiag import kafka, procs
from memdiag.runner import spawn_child
from memdiag.settings import Settings
from tests.integration.conftest import Pipeline
from tests.sasl_standin import MECHANISMS, SaslBroker, SaslStandin

pytestmark = pytest.mark.integration

USER = "memdiag"
SECRET = "s3cr3t-Pa55word-do-not-log"  # the right one: never in any output
WRONG = "wr0ng-Pa55word-do-not-log"  # nor the wrong one


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslBroker]:
    log = tmp_path_factory.mktemp("sasl") / "tansu.log"
    with SaslBroker({USER: SECRET}, log) as broker:
        yield broker


@pytest.fixture
def standin(sasl_broker: SaslBroker) -> SaslStandin:
    sasl_broker.standin.reset()
    return sasl_broker.standin


def sasl_settings(
    url: str, workdir: Path, mechanism: str, password: str, label: str = "sasl", **more: Any
) -> Settings:
    """A pipeline of its own (uuid names) on ``url``, logging in as a user would set it:
    the password in a file (a mounted secret)."""
    run = uuid.uuid4().hex[:10]
    secret = workdir / f"password-{run}"
    secret.write_text(password + "\n")
    return Settings.from_env(
        {
            "MEMDIAG_BROKER": url,
            "MEMDIAG_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "MEMDIAG_KAFKA_SASL_MECHANISM": mechanism,
            "MEMDIAG_KAFKA_SASL_USERNAME": USER,
            "MEMDIAG_KAFKA_SASL_PASSWORD_FILE": str(secret),
        },
        topic_prefix=f"t{run}.",
        app_id=f"memdiag-{label}-{run}",
        sink_group=f"memdiag-{label}-sink-{run}",
        duckdb_path=str(workdir / "memdiag.duckdb"),
        state_dir=str(workdir / "state"),
        sink_batch_seconds=0.2,
        commit_interval_seconds=0.5,
        # one worker on a loopback broker: as `memdiag run` does, a quick group join
        session_timeout_seconds=2.0,
        heartbeat_interval_seconds=0.5,
        **more,
    )


async def roundtrip(settings: Settings) -> list[bytes]:
    """memdiag's own client options: topics created, one record produced, then read back by
    a consumer group (its coordinator is one more connection, one more login)."""
    await kafka.ensure_topics(settings)
    options = kafka.client_options(settings)
    producer = AIOKafkaProducer(**options, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(settings.topics.events, b'"over sasl"', key=b"k")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        settings.topics.events, **options, group_id=f"{settings.app_id}-read",
        auto_offset_reset="earliest",
        session_timeout_ms=int(settings.session_timeout_seconds * 1000),
        heartbeat_interval_ms=int(settings.heartbeat_interval_seconds * 1000),
    )  # fmt: skip
    await consumer.start()
    try:
        got = await consumer.getmany(timeout_ms=10_000)
        await consumer.commit()
        return [m.value for ms in got.values() for m in ms]
    finally:
        await consumer.stop()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_memdiags_clients_log_in_with_each_mechanism(
    standin: SaslStandin, sasl_broker: SaslBroker, tmp_path: Path, mechanism: str
) -> None:
    settings = sasl_settings(sasl_broker.url, tmp_path, mechanism, SECRET)
    asyncio.run(kafka.wait_for_kafka(settings, "test", give_up_after=10))
    assert asyncio.run(roundtrip(settings)) == [b'"over sasl"']
    seen = standin.snapshot()
    assert set(seen.attempts) == {mechanism} and not seen.failures and not seen.unauthenticated
    # every connection logged in: the bootstrap's, the leader's and the coordinator's
    assert seen.successes[mechanism] == seen.connections >= 3


def events(sid: str) -> list[dict[str, Any]]:
    """Two searches 12 s apart (a followup), and one after the window."""
    return [
        {"kind": "search", "event_id": f"{sid}-{n}", "session_id": sid, "ts": ts,
         "query": q, "result_ids": ids}
        for n, ts, q, ids in (
            ("a", "2026-11-21T09:30:00.000Z", "auth flow", ["o1", "o2"]),
            ("b", "2026-11-21T09:30:12.250Z", "auth token expiry", ["o7"]),
            ("c", "2026-11-21T09:31:30.000Z", "vault secret", ["o9"]),
        )
    ]  # fmt: skip


def publish_command(settings: Settings, path: Path) -> list[str]:
    return [sys.executable, "-m", "memdiag.cli", "publish", str(path)]


def child_env(settings: Settings) -> dict[str, str]:
    env = {**os.environ, **settings.as_env()}
    assert SECRET not in str(env) and WRONG not in str(env)  # the file's name, not the secret
    return env


def test_publish_worker_and_sink_through_scram_sha_512_into_duckdb(
    standin: SaslStandin, sasl_broker: SaslBroker, tmp_path: Path
) -> None:
    settings = sasl_settings(sasl_broker.url, tmp_path, "SCRAM-SHA-512", SECRET)
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for s in ("s1", "s2") for e in events(s)))
    pipeline = Pipeline(settings, tmp_path)
    pipeline.start("worker", "sink")
    try:
        published = subprocess.run(
            publish_command(settings, path), env=child_env(settings), capture_output=True,
            timeout=60,
        )  # fmt: skip
        said = published.stdout.decode() + published.stderr.decode()
        assert published.returncode == 0, said
        assert "published 6 events" in said
        pipeline.drain(timeout=60)
        rows = pipeline.query("SELECT event_id, is_followup FROM searches ORDER BY event_id")
        assert rows == [
            ("s1-a", False), ("s1-b", True), ("s1-c", False),
            ("s2-a", False), ("s2-b", True), ("s2-c", False),
        ]  # fmt: skip
    finally:
        logs = {name: child.log_path for name, child in pipeline.children.items()}
        pipeline.stop()
    seen = standin.snapshot()
    assert set(seen.attempts) == {"SCRAM-SHA-512"}
    assert not seen.failures and not seen.unauthenticated, seen
    assert seen.successes["SCRAM-SHA-512"] == seen.connections >= 6, seen
    for name, log in logs.items():
        text = log.read_text("utf-8", "replace")
        assert SECRET not in text, name
    assert SECRET not in said


def test_a_wrong_password_stops_worker_sink_publish_and_alert_once_with_one_line(
    standin: SaslStandin, sasl_broker: SaslBroker, tmp_path: Path
) -> None:
    settings = sasl_settings(sasl_broker.url, tmp_path, "SCRAM-SHA-512", WRONG)
    path = tmp_path / "events.jsonl"
    path.write_bytes(orjson.dumps(events("s1")[0]) + b"\n")
    rules = tmp_path / "rules.txt"
    rules.write_text("followup_rate > 0.3 for 5m\n")
    started = time.monotonic()
    children = [
        spawn_child("worker", "worker", settings, tmp_path),
        spawn_child("sink", "sink", settings, tmp_path),
        spawn_child("publish", f"publish {path}", settings, tmp_path),
        spawn_child("alert", f"alert --rules {rules} --quiet", settings, tmp_path),
    ]
    try:
        codes = {c.name: c.proc.wait(30) for c in children}
    finally:
        for child in children:
            procs.stop(child.proc)
            child.log_file.close()
    seconds = time.monotonic() - started
    wanted = (
        "error: the broker refused the SASL SCRAM-SHA-512 login of user 'memdiag' "
        f"(MEMDIAG_BROKER={sasl_broker.url}; [Error 58] SaslAuthenticationFailed: "
        "Authentication failed during authentication due to invalid credentials with SASL "
        "mechanism SCRAM-SHA-512): check MEMDIAG_KAFKA_SASL_USERNAME, the password "
        f"(MEMDIAG_KAFKA_SASL_PASSWORD_FILE={settings.kafka_sasl_password_file}) and "
        "MEMDIAG_KAFKA_SASL_MECHANISM (the broker must enable it for this user)"
    )
    for child in children:
        text = child.log_path.read_text("utf-8", "replace")
        assert codes[child.name] == 1, f"{child.name}:\n{text}"
        assert text.splitlines() == [wanted], f"{child.name}:\n{text}"
        assert WRONG not in text and SECRET not in text
    seen = standin.snapshot()
    # one login each, refused once: no retry, no storm
    assert seen.attempts == {"SCRAM-SHA-512": 4} and seen.failures == seen.attempts, seen
    assert not seen.successes
    assert seconds < 30, seconds  # at once, not after a backoff


# -- a real broker ---------------------------------------------------------------------------


@pytest.fixture
def real_sasl_broker() -> dict[str, str]:
    url = os.environ.get("MEMDIAG_TEST_BROKER")
    user = os.environ.get("MEMDIAG_TEST_SASL_USERNAME")
    password = os.environ.get("MEMDIAG_TEST_SASL_PASSWORD")
    if not (url and user and password):
        pytest.skip(
            "no broker with SASL: set MEMDIAG_TEST_BROKER, MEMDIAG_TEST_SASL_USERNAME and "
            "MEMDIAG_TEST_SASL_PASSWORD (MEMDIAG_TEST_SASL_MECHANISM, _PROTOCOL, "
            "MEMDIAG_TEST_SSL_CAFILE)"
        )
    return {
        "MEMDIAG_BROKER": url if "://" in url else f"kafka://{url}",
        "MEMDIAG_KAFKA_SECURITY_PROTOCOL": os.environ.get(
            "MEMDIAG_TEST_SASL_PROTOCOL", "SASL_PLAINTEXT"
        ),
        "MEMDIAG_KAFKA_SASL_MECHANISM": os.environ.get(
            "MEMDIAG_TEST_SASL_MECHANISM", "SCRAM-SHA-512"
        ),
        "MEMDIAG_KAFKA_SASL_USERNAME": user,
        "MEMDIAG_KAFKA_SASL_PASSWORD": password,
        "MEMDIAG_KAFKA_SSL_CAFILE": os.environ.get("MEMDIAG_TEST_SSL_CAFILE", ""),
    }


def test_a_real_broker_with_sasl(real_sasl_broker: dict[str, str]) -> None:
    run = uuid.uuid4().hex[:10]
    settings = Settings.from_env(real_sasl_broker, topic_prefix=f"t{run}.", app_id=f"sasl-{run}")
    asyncio.run(kafka.wait_for_kafka(settings, "test", give_up_after=20))
    assert asyncio.run(roundtrip(settings)) == [b'"over sasl"']
    wrong = "not-" + settings.kafka_sasl_password
    refused = settings.with_(kafka_sasl_password=wrong)
    started = time.monotonic()
    with pytest.raises(kafka.LoginRefused) as failed:
        asyncio.run(kafka.wait_for_kafka(refused, "test"))  # no give_up_after: not retried
    assert time.monotonic() - started < 15
    message = str(failed.value)
    assert f"login of user {settings.kafka_sasl_username!r}" in message
    assert wrong not in message and settings.kafka_sasl_password not in message
