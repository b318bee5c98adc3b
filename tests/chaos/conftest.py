"""The reliability suite shares the integration suite's broker and pipeline; ``s3`` serves
Tansu's storage for the tests that restart the broker."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from memdiag.broker import free_port
from tests.integration.conftest import broker_url, pipeline

__all__ = ["broker_url", "pipeline", "s3"]


@pytest.fixture
def s3() -> Iterator[dict[str, str]]:
    """moto's S3 server on loopback, with a bucket for Tansu."""
    pytest.importorskip("moto", reason="moto (the test extra) serves S3 for Tansu")
    import boto3

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "memdiag",
        "AWS_SECRET_ACCESS_KEY": "memdiag",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT": endpoint,
        "AWS_ALLOW_HTTP": "true",
    }
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                boto3.client(
                    "s3",
                    endpoint_url=endpoint,
                    aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                    aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                    region_name=env["AWS_DEFAULT_REGION"],
                ).create_bucket(Bucket="tansu")
                break
            except Exception:  # noqa: BLE001 - the server is still starting
                assert time.monotonic() < deadline, "moto's server did not start"
                time.sleep(0.2)
        yield env
    finally:
        proc.kill()
        proc.wait(10)
