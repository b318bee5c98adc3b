"""``memdiag reset-offsets`` without a broker: its assignor (every partition to itself, a
valid empty assignment to any other member, Faust's for a Faust worker), its member metadata
(a Faust leader reads it), its refusals and its arguments. Through the broker:
tests/integration/test_replay.py."""

from __future__ import annotations

import asyncio
import json
import zlib
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from faust.assignor.client_assignment import ClientAssignment, ClientMetadata
from faust.assignor.partition_assignor import PartitionAssignor

from memdiag.cli import main
from memdiag.cli import reset as command


def cluster(**partitions: int) -> Any:
    return SimpleNamespace(partitions_for_topic=lambda t: set(range(partitions.get(t, 0))))


def faust_worker(url: str) -> ConsumerProtocolMemberMetadata:
    client = ClientMetadata(assignment=ClientAssignment(actives={}, standbys={}), url=url,
                            changelog_distribution={})  # fmt: skip
    return ConsumerProtocolMemberMetadata(4, ["events", "state-changelog"], client.dumps())


def test_the_command_takes_every_partition_and_leaves_a_worker_a_valid_empty_share() -> None:
    marker = command._marker(faust=True)
    assignor, others = command._alone("faust", True, marker)
    me = assignor.metadata({"events", "counters"})
    assignments = assignor.assign(
        cluster(events=4, counters=2),
        {"me": me, "worker": faust_worker("http://worker:6066")},
    )
    assert sorted(assignments["me"].assignment) == [("counters", [0, 1]), ("events", [0, 1, 2, 3])]
    assert others == ["worker"]
    theirs = assignments["worker"]
    assert theirs.assignment == [] and theirs.version == 4
    # what a Faust worker checks on its assignment: it decodes, names its url, assigns nothing
    told = ClientMetadata.loads(zlib.decompress(theirs.user_data))
    assert told.url == "http://worker:6066" and told.assignment.actives == {}


def test_a_faust_leader_reads_the_commands_member_as_a_client() -> None:
    """A live worker that leads the group decodes every member's metadata as Faust's: the
    command's must decode, or the worker's assignment would fail."""
    metadata = ConsumerProtocolMemberMetadata(4, ["events"], command._marker(faust=True))
    client = PartitionAssignor._get_client_metadata(metadata)
    assert client.url.startswith("memdiag-reset-offsets://")


def test_the_sinks_group_gets_plain_assignments() -> None:
    marker = command._marker(faust=False)
    assignor, others = command._alone("roundrobin", False, marker)
    assert assignor.name == "roundrobin"
    sink = ConsumerProtocolMemberMetadata(0, ["diagnostics"], b"")
    got = assignor.assign(cluster(diagnostics=3), {"me": assignor.metadata(["diagnostics"]),
                                                   "sink": sink})  # fmt: skip
    assert got["me"].assignment == [("diagnostics", [0, 1, 2])]
    assert got["sink"].assignment == [] and got["sink"].user_data == b"" and others == ["sink"]


def test_a_group_whose_broker_names_its_members_protocol_is_refused_without_joining(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker that says what the members run (Apache Kafka) is believed: the command waits
    for them to leave, then refuses, and never joins (a join would rebalance the workers)."""
    from memdiag.settings import Settings

    described = command.Description("Stable", "faust", ["m-1 (worker at 10.0.0.2)"])

    async def describe(settings: Any, group: str) -> command.Description:
        return described

    async def join(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("joined a group with live members")

    monkeypatch.setattr(command, "describe", describe)
    monkeypatch.setattr(command, "join", join)
    target = command.Target(earliest=True)
    with pytest.raises(command.Refused, match="1 member.*m-1.*Stop every worker"):
        asyncio.run(command.reset_group(Settings(), "worker", target, False, 0.0, print))


def test_the_target_and_its_refusals_on_the_command_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["reset-offsets", "--to-datetime", "yesterday", "--json"]) == 2
    said = json.loads(capsys.readouterr().out)
    assert said["status"] == "refused" and "--to-datetime 'yesterday'" in said["reason"]
    with pytest.raises(SystemExit):
        main(["reset-offsets"])  # one of the two targets is required
    assert "--to-earliest" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["reset-offsets", "--to-earliest", "--to-datetime", "1h"])
    at = command._target(SimpleNamespace(to_earliest=False, to_datetime="2026-11-21T09:30:00Z"))
    assert at.ms == 1_795_253_400_000 and not at.earliest
