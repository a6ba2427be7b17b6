"""The asyncio client's consumer groups (sms/consumer.py) and registered consumers: members,
checkpoints, lag, resets."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from sms import errors, limits, seqno
from sms.consumer import GroupConsumer, GroupLeases
from sms.proto import sms_pb2
from sms.tokens import peek
from sms.types import GroupDescription, GroupMember, GroupPartition, PartitionState, parse_partition_id, partition_id

if TYPE_CHECKING:
    from sms.aio import Client
from sms.aio.writes import Writes


class Groups(Writes):
    """The groups part of `sms.aio.Client` (sms/aio/__init__.py); each part builds on the
    ones before it: transport, admin, reads, writes, groups."""

    # --- consumer groups (sms/consumer.py) ------------------------------------------------
    def consumer(self, stream: str, group: str, *, member_id: str | None = None, start: str = "TRIM_HORIZON",
                 timestamp_ms: int | None = None, auto_checkpoint: bool = True,
                 failover_s: float = limits.CONSUMER_FAILOVER_S_DEFAULT, max_records: int = 1000,
                 wait_ms: int = 1000, skip_trimmed: bool = False) -> GroupConsumer:
        """A member of the consumer group `group` of `stream`: `async with` it and iterate
        for ConsumerBatch-es.

        Args:
            member_id: this member's id in the group (None: host-pid-random).
            start: where the group starts in a partition it has not read yet: TRIM_HORIZON,
                LATEST, or AT_TIMESTAMP with `timestamp_ms`.
            auto_checkpoint: checkpoint each batch once the next one is asked for (True);
                False: call `checkpoint()` yourself.
            failover_s: a member silent this long loses its leases to the others.
            max_records, wait_ms: the most records per batch, and how long a read waits for
                new ones.
            skip_trimmed: go on from the oldest record kept when retention deleted records
                before they were read (False: RecordsTrimmed).

        Raises:
            InvalidArgument: a bad option (the stream is checked when it is opened:
                StreamNotFound)."""
        return GroupConsumer(cast("Client", self), stream, group, member_id=member_id, start=start, timestamp_ms=timestamp_ms,
                             auto_checkpoint=auto_checkpoint, failover_s=failover_s, max_records=max_records,
                             wait_ms=wait_ms, skip_trimmed=skip_trimmed)

    async def list_groups(self, stream: str) -> list[str]:
        """The names of the stream's consumer groups. Raises StreamNotFound."""
        return list((await self._discovery_call("ListGroups", sms_pb2.ListGroupsRequest(stream=stream))).groups)

    async def describe_group(self, stream: str, group: str) -> GroupDescription:
        """The group's members and, per partition of its lease table, the owner, the
        checkpoint, records processed under the lease, and how far the checkpoint is
        behind the partition's last committed record, in records and in ms (0 at its
        end). Fields also read by name (`d["partitions"]`).

        Raises:
            GroupNotFound, StreamNotFound."""
        state = await GroupLeases(cast("Client", self), stream, group).state()
        if not state.leases and not state.members:
            raise errors.GroupNotFound(f"stream {stream!r} has no consumer group {group!r}")
        now_ms = int(time.time() * 1000)
        members = []
        for m in state.members:
            d = json.loads(m.value)
            members.append(GroupMember(m.key, d.get("host", ""), int(d.get("pid", 0)),
                                       max(0, now_ms - int(d.get("heartbeat_ms", 0)))))
        info = await self.get_stream_info(stream)
        by = {p.ordinal: p for p in info.partitions}
        partitions = []
        for e in sorted(state.leases, key=lambda e: int(e.key)):
            d = json.loads(e.value)
            ordinal = int(e.key)
            checkpoint = str(d.get("checkpoint", ""))
            lag: tuple[int, int] | None = None
            if ordinal in by:
                lag = await self.checkpoint_lag(stream, ordinal, checkpoint)
            partitions.append(GroupPartition(
                partition_id(ordinal), ordinal, by[ordinal].state.value if ordinal in by else "DROPPED",
                d.get("owner", ""), checkpoint, int(d.get("records", 0)),
                None if lag is None else lag[0], 0 if lag is None else lag[1]))
        return GroupDescription(stream, group, tuple(members), tuple(partitions))

    async def checkpoint_lag(self, stream: str, ordinal: int, checkpoint: str) -> tuple[int, int] | None:
        """(records, ms) a consumer's checkpoint (an SN, SHARD_END, TRIM_HORIZON) is behind
        partition `ordinal`'s last committed record (seqno.behind); None when the checkpoint
        does not say where it stands (LATEST before a first read, a time). The commit point
        comes from a LATEST iterator; the oldest record kept, when the checkpoint is
        TRIM_HORIZON, by reading one."""
        if checkpoint == "SHARD_END":
            return 0, 0
        committed = peek(await self.get_iterator(stream, ordinal, "LATEST")).position_sn - 1
        first = 0
        if checkpoint == "TRIM_HORIZON" or (checkpoint.isdigit() and seqno.ordinal_of(int(checkpoint)) != ordinal):
            page = await self.get_next_records(await self.get_iterator(stream, ordinal, "TRIM_HORIZON"),
                                               max_records=1, skip_trimmed=True)
            first = page.records[0].sn if page.records else 0
            if not first:
                return 0, 0
        return seqno.behind(checkpoint, ordinal, committed, first)

    async def reset_group(self, stream: str, group: str, *, to: str = "TRIM_HORIZON", timestamp_ms: int = 0,
                          sequence_numbers: dict[str, str] | None = None) -> None:
        """Move the group's checkpoints: to TRIM_HORIZON, LATEST, AT_TIMESTAMP
        (`timestamp_ms`), or per-partition SNs to resume after (`sequence_numbers`,
        partition id -> SN; partitions not named from TRIM_HORIZON). LATEST is the end of
        each partition now, as Kafka's --to-latest: what is written after the reset is
        read. Running members lose their leases at their next write and resume from the
        new checkpoints.

        Raises:
            StreamNotFound, GroupNotFound, InvalidArgument, InvalidSequenceNumber."""
        if to == "LATEST" and not sequence_numbers:
            sequence_numbers = {}
            for p in (await self.get_stream_info(stream)).partitions:
                if p.state is PartitionState.OPEN:
                    last = peek(await self.get_iterator(stream, p.ordinal, "LATEST")).position_sn - 1
                    if last > 0 and seqno.ordinal_of(last) == p.ordinal:
                        sequence_numbers[p.partition_id] = str(last)
        await self._discovery_call("ResetGroup", sms_pb2.ResetGroupRequest(
            stream=stream, group=group, position=to, timestamp_ms=timestamp_ms,
            sequence_numbers={k: str(v) for k, v in (sequence_numbers or {}).items()}))

    async def delete_group(self, stream: str, group: str) -> None:
        """Delete a consumer group: its leases, checkpoints and members. Raises
        GroupNotFound, StreamNotFound."""
        await self._discovery_call("DeleteGroup", sms_pb2.GroupRequest(stream=stream, group=group))

    async def register_consumer(self, stream: str, consumer: str) -> None:
        """Register a consumer: while the stream protects unread records, nothing it has not
        checkpointed past is trimmed. Raises StreamNotFound."""
        await self.checkpoint_consumer(stream, consumer, {})

    async def checkpoint_consumer(self, stream: str, consumer: str,
                                  checkpoints: Mapping[int, int | str] | Mapping[str, int | str]) -> None:
        """Record, per partition (ordinal or id), the SN of the last record processed, or
        "SHARD_END" once a closed partition is read to its end.

        Raises:
            StreamNotFound, PartitionNotFound (a bad partition id), InvalidSequenceNumber."""
        pb = {(p if isinstance(p, int) else parse_partition_id(p)): str(sn) for p, sn in checkpoints.items()}
        await self._admin_call("UpdateConsumer", sms_pb2.UpdateConsumerRequest(
            stream=stream, consumer=consumer, checkpoints=pb))

    async def deregister_consumer(self, stream: str, consumer: str) -> None:
        """Forget a registered consumer: its unread records no longer hold retention back.
        Raises StreamNotFound."""
        await self._admin_call("UpdateConsumer", sms_pb2.UpdateConsumerRequest(
            stream=stream, consumer=consumer, remove=True))
