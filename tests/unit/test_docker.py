"""No Docker engine runs here, so the compose file is checked against the code instead."""

from __future__ import annotations

from pathlib import Path

import yaml

from memdiag.settings import ENV, Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
KNOWN = {var for var, _ in ENV.values()}
DELIBERATE = {  # values that differ from the code's defaults on purpose, and why
    "MEMDIAG_BROKER": "the kafka service",
    "MEMDIAG_DUCKDB_PATH": "the sink's volume",
}


def test_services() -> None:
    services = COMPOSE["services"]
    assert set(services) == {"kafka", "worker", "sink"}
    assert services["worker"]["command"] == ["worker"]
    assert services["sink"]["command"] == ["sink"]
    assert services["kafka"]["image"].startswith("apache/kafka:")


def test_kafka_runs_in_kraft_mode_and_accepts_memdiag_batches() -> None:
    env = COMPOSE["services"]["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert "KAFKA_ZOOKEEPER_CONNECT" not in env
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # memdiag creates its topics
    assert int(env["KAFKA_MESSAGE_MAX_BYTES"]) >= 8 * 1024 * 1024  # producer_max_request_size


def test_memdiag_settings_agree_with_the_code() -> None:
    for name in ("worker", "sink"):
        env = {k: str(v) for k, v in COMPOSE["services"][name]["environment"].items()}
        unknown = {k for k in env if k.startswith(("MEMDIAG_", "AGENTMEMORY_"))} - KNOWN
        assert not unknown, f"{name}: variables the code does not read: {unknown}"
        settings = Settings.from_env(env)  # valid as a whole
        assert settings.bootstrap_servers == "kafka:9092"
        kafka_listener = COMPOSE["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
        assert "INTERNAL://kafka:9092" in kafka_listener
        defaults = Settings()
        for field, (var, _) in ENV.items():
            if var in env and var not in DELIBERATE:
                assert getattr(settings, field) == getattr(defaults, field), (
                    f"{var}={env[var]} differs from the code's default"
                )


def test_both_processes_share_one_configuration() -> None:
    services = COMPOSE["services"]
    assert services["worker"]["environment"] == services["sink"]["environment"]


def test_dockerfile_installs_the_packages_the_compose_runs() -> None:
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    for package in ("memdiag", "streams", "schemas", "analytics"):
        assert f"COPY {package} ./{package}" in dockerfile
    assert 'ENTRYPOINT ["memdiag"]' in dockerfile


def test_the_sasl_overlay_is_a_valid_memdiag_configuration(tmp_path) -> None:
    overlay = yaml.safe_load((ROOT / "docker" / "compose.sasl.yaml").read_text())
    secret = tmp_path / "kafka_password"
    secret.write_text("pw\n")
    for name in ("worker", "sink"):
        env = {
            **{k: str(v) for k, v in COMPOSE["services"][name]["environment"].items()},
            **{k: str(v) for k, v in overlay["services"][name]["environment"].items()},
        }
        assert env["MEMDIAG_KAFKA_SASL_PASSWORD_FILE"] == "/run/secrets/kafka_password"
        assert "kafka_password" in overlay["services"][name]["secrets"]
        env["MEMDIAG_KAFKA_SASL_PASSWORD_FILE"] = str(secret)
        settings = Settings.from_env(env)
        assert settings.kafka_security_protocol == "SASL_PLAINTEXT"
        assert settings.kafka_sasl_password == "pw"
    kafka_env = overlay["services"]["kafka"]["environment"]
    assert kafka_env["KAFKA_SASL_ENABLED_MECHANISMS"] == env["MEMDIAG_KAFKA_SASL_MECHANISM"]
    assert "INTERNAL:SASL_PLAINTEXT" in kafka_env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
