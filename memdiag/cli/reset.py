"""``memdiag reset-offsets``: move the worker group's committed offsets back for a replay
(docs/rules.md, "Crash safety: one checkpoint"), and the sink's with ``--sink``.

What it takes care of, beyond committing offsets:

- **Only with no worker running.** The broker's DescribeGroups says whether the group has
  members; a broker that names no protocol for them (Tansu keeps listing a member after it
  left) is not taken at its word: the command joins the group, and a member it finds there,
  or a partition it is not given, means a worker runs. Either way it commits nothing.
- **Tansu's rules for a commit.** Tansu takes an OffsetCommit only from a member of the group,
  and keeps the group's protocol (the assignor's name: ``faust`` for the worker, aiokafka's
  ``roundrobin`` for the sink) after its members leave, refusing a member of another. So the
  command joins as a member of that protocol, with an assignor that gives it every partition
  (and a live member of the group a valid empty assignment, Faust's or aiokafka's), commits,
  and leaves.
- **A point the state can be rebuilt at.** An offset inside one of the worker's checkpoints
  would leave that checkpoint's earlier records out of every state: each partition of a topic
  that feeds a table goes back to the newest checkpoint at or before the target
  (:class:`memdiag.streams.store.RebuildPoint`), read from the table's changelog.
- **Offsets by time on a broker that answers them wrong.** Tansu answers ListOffsets by
  timestamp (and latest) wrongly; each answer is checked against the records around it, and
  the partition read when it is wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.structs import OffsetAndMetadata
from rich.markup import escape

from memdiag.cli.common import err, notifier, out, print_json
from memdiag.kafka import KafkaUnavailable, client_options, true_end_offsets, wait_for_kafka
from memdiag.settings import Settings

#: The protocol (assignor name) of each group when the broker does not say: Faust's
#: ``PartitionAssignor`` for the worker, aiokafka's default for the sink
PROTOCOLS = {"worker": "faust", "sink": "roundrobin"}
#: Faust's assignor version (its members' metadata and assignments carry it)
FAUST_VERSION = 4

Say = Callable[[str], None]


class Refused(Exception):
    """The reset is not done; the message says why and what to do."""


@dataclass(frozen=True)
class Target:
    """Where to: the log start, or the first record at or after a time (ms)."""

    earliest: bool
    ms: int | None = None

    def describe(self) -> str:
        if self.earliest:
            return "the earliest offsets"
        assert self.ms is not None  # noqa: S101 - one of the two
        when = datetime.fromtimestamp(self.ms / 1000).astimezone()  # noqa: DTZ006
        return f"the first records at or after {when.isoformat(timespec='seconds')}"


@dataclass
class Partition:
    topic: str
    partition: int
    #: committed before (None: nothing)
    before: int | None
    #: the offset the target names
    target: int
    #: what is (or, in a dry run, would be) committed: the target, or the start of the
    #: checkpoint that covers it
    after: int


@dataclass
class GroupReset:
    group: str
    kind: str
    partitions: list[Partition] = field(default_factory=list)


# -- the group ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Description:
    state: str
    protocol: str
    members: list[str]


async def describe(settings: Settings, group: str) -> Description:
    """DescribeGroups: the group's state, its protocol (the assignor's name) and members."""
    admin = AIOKafkaAdminClient(**client_options(settings))
    await admin.start()
    try:
        responses = await admin.describe_consumer_groups([group])
    finally:
        await admin.close()
    for response in responses:
        for found in response.groups:
            error, group_id, state, _, protocol, members = found[:6]
            if group_id == group:
                if error:
                    raise Refused(f"the broker could not describe group {group} (error {error})")
                ids = [f"{m[0]} ({m[1] or '?'} at {m[2] or '?'})" for m in members]
                return Description(str(state), str(protocol or ""), ids)
    return Description("Dead", "", [])


def _alone(protocol: str, faust: bool, marker: bytes) -> tuple[type[Any], list[str]]:
    """An assignor named ``protocol`` that gives the member whose metadata is ``marker`` (the
    command's) every partition it subscribes, and any other member a valid empty assignment
    (Faust's when ``faust``), noting them: they mean a worker runs."""
    others: list[str] = []
    version = FAUST_VERSION if faust else 0

    def empty_for(metadata: ConsumerProtocolMemberMetadata) -> bytes:
        if not faust:
            return b""
        from faust.assignor.client_assignment import ClientAssignment, ClientMetadata

        try:
            url = ClientMetadata.loads(metadata.user_data).url
        except Exception:  # noqa: BLE001 - not a Faust member: it gets no user data
            return b""
        empty = ClientMetadata(
            assignment=ClientAssignment(actives={}, standbys={}), url=url,
            changelog_distribution={}, external_topic_distribution={}, topic_groups={},
        )  # fmt: skip
        return zlib.compress(empty.dumps())

    class Alone(AbstractPartitionAssignor):
        name = protocol

        @classmethod
        def metadata(cls, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
            return ConsumerProtocolMemberMetadata(version, sorted(topics), marker)

        @classmethod
        def assign(cls, cluster: Any, members: Mapping[str, Any]) -> dict[str, Any]:
            assignments = {}
            for member_id, metadata in members.items():
                if metadata.user_data == marker:
                    tps = [
                        (topic, sorted(cluster.partitions_for_topic(topic) or ()))
                        for topic in sorted(metadata.subscription)
                    ]
                    assignments[member_id] = ConsumerProtocolMemberAssignment(version, tps, b"")
                else:
                    others.append(member_id)
                    assignments[member_id] = ConsumerProtocolMemberAssignment(
                        version, [], empty_for(metadata)
                    )
            return assignments

        @classmethod
        def on_assignment(cls, assignment: Any) -> None:
            pass

    return Alone, others


def _marker(faust: bool) -> bytes:
    """The command's member metadata: a valid Faust client's when the worker's group (a
    Faust leader then gives it a share, never a crash), a plain tag otherwise."""
    url = f"memdiag-reset-offsets://{uuid.uuid4().hex}"
    if not faust:
        return url.encode()
    from faust.assignor.client_assignment import ClientAssignment, ClientMetadata

    client = ClientMetadata(
        assignment=ClientAssignment(actives={}, standbys={}), url=url, changelog_distribution={}
    )
    data: bytes = client.dumps()
    return data


async def join(
    settings: Settings, group: str, protocol: str, topics: list[str], faust: bool
) -> AIOKafkaConsumer:
    """Join ``group`` as a member of ``protocol`` and wait to be given every partition of
    ``topics``; :class:`Refused` (after leaving) when another member is there."""
    assignor, others = _alone(protocol, faust, _marker(faust))
    consumer = AIOKafkaConsumer(
        **client_options(settings),
        group_id=group,
        enable_auto_commit=False,
        partition_assignment_strategy=(assignor,),
        session_timeout_ms=int(settings.session_timeout_seconds * 1000),
        heartbeat_interval_ms=int(settings.heartbeat_interval_seconds * 1000),
    )
    consumer.subscribe(topics)
    await consumer.start()
    try:
        wanted = await _partitions(consumer, topics)
        # a member that left without a word holds the join until its session times out
        deadline = time.monotonic() + max(30.0, 4 * settings.session_timeout_seconds)
        while not consumer.assignment() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        got = set(consumer.assignment())
        if others or got != wanted:
            running = f"{len(others)} other member(s)" if others else (
                f"{len(got)} of its {len(wanted)} partitions (a worker holds the others)"
            )  # fmt: skip
            raise Refused(
                f"group {group} is in use: joining it found {running}. Stop every "
                "worker of the group (or the sink, for its group) first, then run this again"
            )
        consumer.pause(*got)  # it only commits: no need to fetch
    except BaseException:
        await consumer.stop()
        raise
    return consumer


async def _partitions(consumer: AIOKafkaConsumer, topics: list[str]) -> set[TopicPartition]:
    out = set()
    for topic in topics:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(topic) or set()
        out |= {TopicPartition(topic, p) for p in parts}
    return out


# -- the offsets ----------------------------------------------------------------------------


async def targets(
    settings: Settings, tps: list[TopicPartition], target: Target
) -> dict[TopicPartition, int]:
    """The offset of each partition the target names: its log start, or its first record at
    or after the time (its end if none)."""
    options = client_options(settings)
    reader = AIOKafkaConsumer(**options, enable_auto_commit=False, group_id=None)
    await reader.start()
    try:
        starts = await reader.beginning_offsets(tps)
        if target.earliest:
            return {tp: int(starts[tp]) for tp in tps}
        assert target.ms is not None  # noqa: S101 - one of the two
        ends = await true_end_offsets(options, tps, dict(await reader.end_offsets(tps)))
        told = await reader.offsets_for_times({tp: target.ms for tp in tps})
        out = {}
        for tp in tps:
            answer = told.get(tp)
            guess = ends[tp] if answer is None else answer.offset
            if not await _first_at(reader, tp, guess, target.ms, starts[tp], ends[tp]):
                guess = await _scan(reader, tp, target.ms, starts[tp], ends[tp])
            out[tp] = guess
        return out
    finally:
        await reader.stop()


async def _timestamp(reader: AIOKafkaConsumer, tp: TopicPartition, offset: int) -> int | None:
    reader.assign([tp])
    reader.seek(tp, offset)
    got = await reader.getmany(tp, timeout_ms=5000, max_records=1)
    records = got.get(tp) or []
    return int(records[0].timestamp) if records and records[0].offset == offset else None


async def _first_at(
    reader: AIOKafkaConsumer, tp: TopicPartition, offset: int, ms: int, start: int, end: int
) -> bool:
    """Whether ``offset`` is the first record at or after ``ms`` (the record before it is
    older; it is not, or it is the end)."""
    if offset > start:
        before = await _timestamp(reader, tp, offset - 1)
        if before is None or before >= ms:
            return False
    if offset < end:
        at = await _timestamp(reader, tp, offset)
        if at is None or at < ms:
            return False
    return True


async def _scan(reader: AIOKafkaConsumer, tp: TopicPartition, ms: int, start: int, end: int) -> int:
    """The first record at or after ``ms``, read from the log start."""
    reader.assign([tp])
    reader.seek(tp, start)
    position = start
    while position < end:
        got = await reader.getmany(tp, timeout_ms=2000, max_records=5000)
        records = got.get(tp) or []
        if not records:
            break
        for record in records:
            if record.timestamp >= ms:
                return int(record.offset)
            position = record.offset + 1
    return end


async def rebuild_points(
    settings: Settings,
    tables: list[tuple[str, tuple[str, ...]]],
    wanted: Mapping[TopicPartition, int],
) -> dict[TopicPartition, int | None]:
    """For each source partition of ``tables`` ((changelog, sources)) in ``wanted``, the
    offset recovery can rebuild the state at, at or before the wanted one
    (:class:`memdiag.streams.store.RebuildPoint`; None: the log start)."""
    from memdiag.streams.store import RebuildPoint, covers_of

    options = client_options(settings)
    reader = AIOKafkaConsumer(**options, enable_auto_commit=False, group_id=None)
    await reader.start()
    out: dict[TopicPartition, int | None] = {}
    try:
        for changelog, sources in tables:
            parts = sorted({tp.partition for tp in wanted if tp.topic in sources})
            if not parts:
                continue
            known = await _partitions(reader, [changelog])
            logs = [
                TopicPartition(changelog, p) for p in parts if TopicPartition(changelog, p) in known
            ]
            points = {
                p: RebuildPoint({t: wanted[TopicPartition(t, p)] for t in sources
                                 if TopicPartition(t, p) in wanted})
                for p in parts
            }  # fmt: skip
            if logs:
                ends = await true_end_offsets(options, logs, dict(await reader.end_offsets(logs)))
                reader.assign(logs)
                await reader.seek_to_beginning(*logs)
                left = {tp for tp in logs if ends[tp] > 0}
                while left:
                    got = await reader.getmany(*left, timeout_ms=2000)
                    if not any(got.values()):
                        break  # no more to read: what it has read is all there is
                    for tp, records in got.items():
                        for record in records:
                            points[tp.partition].add(covers_of(record.headers))
                        if records and records[-1].offset + 1 >= ends[tp]:
                            left.discard(tp)
            for p, point in points.items():
                for topic in point.targets:
                    out[TopicPartition(topic, p)] = point.position(topic)
    finally:
        await reader.stop()
    return out


def worker_tables(settings: Settings) -> list[tuple[str, tuple[str, ...]]]:
    """The worker's tables: (changelog topic, source topics), as the worker builds them."""
    from memdiag.streams.app import create_app

    wiring = create_app(settings)
    out = []
    for table in (wiring.state, wiring.rollups):
        options: Any = table.options or {}
        out.append((table.changelog_topic.get_topic_name(), tuple(options["memdiag"].sources)))
    return out


def group_topics(settings: Settings, kind: str) -> list[str]:
    from memdiag.runner import sink_inputs, worker_stages

    if kind == "sink":
        return sink_inputs(settings)
    return [topic for stage in worker_stages(settings) for topic in stage]


async def reset_group(
    settings: Settings, kind: str, target: Target, dry_run: bool, wait: float, say: Say
) -> GroupReset:
    group = settings.sink_group if kind == "sink" else settings.app_id
    topics = group_topics(settings, kind)
    described = await describe(settings, group)
    deadline = time.monotonic() + wait
    while described.members and described.protocol and time.monotonic() < deadline:
        say(f"group {group} has {len(described.members)} member(s); waiting for them to leave")
        await asyncio.sleep(1.0)
        described = await describe(settings, group)
    if described.members and described.protocol:  # a broker that says what they run
        raise Refused(
            f"group {group} has {len(described.members)} member(s) ({described.state}: "
            f"{', '.join(described.members)}): a worker runs. Stop every worker of the group "
            "(or the sink, for its group) first, then run this again"
        )
    if described.members:
        say(f"the broker lists {len(described.members)} member(s) of {group} without their "
            "protocol (Tansu lists a member after it left): joining to find out")  # fmt: skip
    protocol = described.protocol or PROTOCOLS[kind]
    # what to commit first, outside the group: a member that does not poll for
    # max.poll.interval.ms (reading a long changelog) would be dropped from it
    tps, starts = await _layout(settings, topics)
    aimed = await targets(settings, tps, target)
    after: dict[TopicPartition, int] = dict(aimed)
    if kind == "worker":
        say("reading the worker's changelogs for the checkpoints' boundaries")
        points = await rebuild_points(settings, worker_tables(settings), aimed)
        for tp, point in points.items():
            after[tp] = starts[tp] if point is None else min(point, aimed[tp])
    say(f"joining group {group} (protocol {protocol})")
    consumer = await join(settings, group, protocol, topics, faust=kind == "worker")
    try:
        if set(consumer.assignment()) != set(tps):
            raise Refused(f"the partitions of group {group}'s topics changed meanwhile: run again")
        found = await consumer._coordinator.fetch_committed_offsets(tps)
        before = {tp: (m.offset if m is not None and m.offset >= 0 else None)
                  for tp, m in ((tp, found.get(tp)) for tp in tps)}  # fmt: skip
        result = GroupReset(group, kind, [
            Partition(tp.topic, tp.partition, before[tp], aimed[tp], after[tp]) for tp in tps
        ])  # fmt: skip
        if not dry_run:
            await consumer.commit({tp: OffsetAndMetadata(after[tp], "") for tp in tps})
        return result
    finally:
        await consumer.stop()  # leaves the group


async def _layout(
    settings: Settings, topics: list[str]
) -> tuple[list[TopicPartition], dict[TopicPartition, int]]:
    """Every partition of ``topics``, and where each starts."""
    reader = AIOKafkaConsumer(**client_options(settings), enable_auto_commit=False)
    await reader.start()
    try:
        tps = sorted(await _partitions(reader, topics))
        starts = {tp: int(o) for tp, o in (await reader.beginning_offsets(tps)).items()}
        return tps, starts
    finally:
        await reader.stop()


async def reset(
    settings: Settings, target: Target, sink: bool, dry_run: bool, wait: float, say: Say
) -> list[GroupReset]:
    await wait_for_kafka(settings, "memdiag reset-offsets", give_up_after=30.0)
    kinds = ["worker", "sink"] if sink else ["worker"]
    return [await reset_group(settings, k, target, dry_run, wait, say) for k in kinds]


# -- the command ------------------------------------------------------------------------------


def _target(args: argparse.Namespace) -> Target:
    if args.to_earliest:
        return Target(earliest=True)
    from memdiag.analytics.queries import parse_since

    try:
        when = parse_since(args.to_datetime)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--to-datetime {args.to_datetime!r}: give a date or date-time (2026-11-21, "
            "2026-11-21T09:30:00Z; UTC if no offset) or a duration back from now (30m, 24h, 7d)"
        ) from None
    assert when is not None  # noqa: S101 - the argument is required
    return Target(earliest=False, ms=int(when.timestamp() * 1000))


def cmd_reset(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    say = notifier(args)
    try:
        target = _target(args)
    except argparse.ArgumentTypeError as exc:
        return _refused(args, str(exc), 2)
    try:
        groups = asyncio.run(reset(settings, target, args.sink, args.dry_run, args.wait, say))
    except Refused as exc:
        return _refused(args, str(exc), 1)
    except KafkaUnavailable as exc:
        return _refused(args, str(exc), 1)
    if args.json:
        print_json({
            "status": "dry-run" if args.dry_run else "reset",
            "target": "earliest" if target.earliest else target.ms,
            "groups": [asdict(g) for g in groups],
        })  # fmt: skip
        return 0
    for g in groups:
        moved = [p for p in g.partitions if p.after != p.before]
        snapped = [p for p in g.partitions if p.after != p.target]
        verb = "would move" if args.dry_run else "moved"
        out.print(f"[bold]{escape(g.group)}[/bold] ({g.kind}): {verb} {len(moved)} of "
                  f"{len(g.partitions)} partitions to {target.describe()}")  # fmt: skip
        for p in g.partitions:
            if p.after == p.before:
                continue
            was = "nothing" if p.before is None else f"{p.before:,}"
            note = f"  (the checkpoint before {p.target:,})" if p in snapped else ""
            out.print(f"  {escape(p.topic)}/{p.partition}: {was} -> {p.after:,}{note}")
    if not args.dry_run:
        err.print(
            "[dim]start the worker (memdiag worker): it rebuilds its state from the "
            "changelog where it is ahead of these offsets, and takes the records again; "
            "DuckDB stays exact, the counters count the replayed records again[/dim]"
        )
    return 0


def _refused(args: argparse.Namespace, reason: str, status: int) -> int:
    if args.json:
        print_json({"status": "refused", "reason": reason})
    else:
        err.print(f"[red]error:[/red] {escape(reason)}", soft_wrap=True)
    return status


def add_reset(add: Any) -> None:
    """The `reset-offsets` command's parser."""
    p = add(
        "reset-offsets",
        "move the worker group's committed offsets back, to replay the history",
        "Commits new offsets for every partition the worker reads (MEMDIAG_APP_ID's group;\n"
        "with --sink, MEMDIAG_SINK_GROUP's too), so that the next `memdiag worker` processes\n"
        "the records again from there. The rules are deterministic and the sink upserts:\n"
        "DuckDB keeps every row once. The counters count the replayed records again.\n\n"
        "It refuses while a worker (or, with --sink, the sink) runs: stop them first. It\n"
        "checks with the broker (DescribeGroups) and by joining the group as a member of its\n"
        "protocol, which Tansu requires for a commit. A topic that feeds the worker's state\n"
        "goes back to the start of the worker's checkpoint that holds the target (read from\n"
        "its changelog), so that the state can be rebuilt exactly there: a few records before\n"
        "the target may be taken again. Exit 0 when done, 1 when refused, 2 on a bad time.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--to-earliest", action="store_true", help="to the start of every partition")
    where.add_argument(
        "--to-datetime",
        metavar="T",
        help="to the first record at or after T: a date or date-time (UTC if no offset) or a "
        "duration back from now (30m, 24h, 7d)",
    )
    p.add_argument("--sink", action="store_true", help="reset the sink's group too")
    p.add_argument(
        "--dry-run", action="store_true", help="say what would be committed; commit nothing"
    )
    p.add_argument(
        "--wait",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="wait this long for the members of a group to leave before refusing (default 15)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_reset)
