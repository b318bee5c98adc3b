"""The reliability suite shares the integration suite's broker and pipeline."""

from tests.integration.conftest import broker_url, pipeline

__all__ = ["broker_url", "pipeline"]
