"""An existing changelog with too short a compaction lag is said at the worker's start
(#38): the lag is set when the worker creates a changelog, and was never checked after."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from memdiag.kafka import client_options, short_compaction_lags
from memdiag.settings import Settings

pytestmark = pytest.mark.integration


def test_a_changelog_with_a_short_lag_is_said(broker_url: str) -> None:
    settings = Settings(broker=broker_url)
    run = uuid.uuid4().hex[:8]
    short, ok, default = (f"{run}-{n}-changelog" for n in ("short", "ok", "default"))
    day = 86_400_000

    async def go() -> list[str]:
        admin = AIOKafkaAdminClient(**client_options(settings))
        await admin.start()
        try:
            await admin.create_topics([
                NewTopic(short, 1, 1, topic_configs={"cleanup.policy": "compact",
                                                     "min.compaction.lag.ms": "60000"}),
                NewTopic(ok, 1, 1, topic_configs={"cleanup.policy": "compact",
                                                  "min.compaction.lag.ms": str(day)}),
                NewTopic(default, 1, 1, topic_configs={"cleanup.policy": "compact"}),
            ])  # fmt: skip
        finally:
            await admin.close()
        wanted = {short: day, ok: day, default: day, f"{run}-absent-changelog": day}
        return await short_compaction_lags(settings, wanted)

    said = asyncio.run(go())
    assert len(said) == 2, said
    assert said[0].startswith(f"changelog {default} has min.compaction.lag.ms the broker's default")
    assert f"changelog {short} has min.compaction.lag.ms 60,000 ms" in said[1]
    assert f"--entity-name {short} --add-config min.compaction.lag.ms={day}" in said[1]
