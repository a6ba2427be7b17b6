"""Consumer groups on the server: each group's lease table, kept in the metadata store
below its stream and read and written by the group's members through the cluster's API
(GroupState / GroupWrite; the members are sms/consumer.py's GroupConsumer and the SPS
workers). Any node answers: every change is one conditional write on the version the
member last saw, so the node adds no state of its own.

    /streams/<stream>/groups/<group>/leases/<ordinal>   sms/leases.py Lease, as JSON
    /streams/<stream>/groups/<group>/members/<member>   {"counter": n, "heartbeat_ms": t, ...}

A group is a registered consumer of its stream (control/admin.py record_consumer): each
checkpoint written to a lease is copied into the consumer's entry, so a stream that
protects unread records keeps what the group has not processed. The copy follows the
lease write; a member that dies between the two leaves the consumer's entry behind the
lease, which keeps more, never less.

The stream names here are stored names (a tenant's prefix in front, control/auth.py), so
two tenants' groups of the same name never meet. Deleting a stream deletes its groups.
"""

from __future__ import annotations

import dataclasses
import json
import re

from control.admin import record_consumer
from metastore import BadVersionError, Create, MetaStore, NodeExistsError, NoNodeError, Set
from metastore import reads
from metastore.view import ClusterView, bounded
from sms import limits, metadata, seqno
from sms.errors import GroupNotFound, InvalidArgument, LeaseLost, LimitExceeded, StreamNotFound, Unavailable
from sms.leases import LATEST, SHARD_END, TRIM_HORIZON, Lease
from sms.metadata import ConsumerRecord
from sms.types import PartitionState, StartPosition, StreamStatus, parse_partition_id

_GROUP = re.compile(r"[A-Za-z0-9_.-]{1,%d}" % limits.STREAM_NAME_CHARS_MAX)
_MEMBER = re.compile(r"[A-Za-z0-9_.:@-]{1,%d}" % limits.GROUP_MEMBER_CHARS_MAX)


def groups_path(stream: str) -> str:
    return f"{metadata.stream_path(stream)}/groups"


def group_path(stream: str, group: str) -> str:
    return f"{groups_path(stream)}/{group}"


def _dir(stream: str, group: str, member: bool) -> str:
    return f"{group_path(stream, group)}/{'members' if member else 'leases'}"


def validate_group(group: str) -> str:
    if not isinstance(group, str) or not _GROUP.fullmatch(group) or group in (".", ".."):
        raise InvalidArgument(f"group name {str(group)[:80]!r}; expected [A-Za-z0-9_.-]{{1,"
                              f"{limits.STREAM_NAME_CHARS_MAX}}}")
    return group


def checkpoint_sn(checkpoint: str) -> int | None:
    """The SN a lease's checkpoint says was processed last, for the consumer's entry
    (None: nothing processed yet)."""
    position = StartPosition.parse(checkpoint)
    return ConsumerRecord.SHARD_END_SN if position.ended else position.after_sn


def _validate_entry(member: bool, key: str, value: bytes, delete: bool) -> Lease | None:
    if len(value) > limits.GROUP_ENTRY_BYTES_MAX:
        raise InvalidArgument(f"a group entry of {len(value)} bytes; at most {limits.GROUP_ENTRY_BYTES_MAX}")
    if member:
        if not _MEMBER.fullmatch(key):
            raise InvalidArgument(f"member id {key[:80]!r}; expected [A-Za-z0-9_.:@-]{{1,"
                                  f"{limits.GROUP_MEMBER_CHARS_MAX}}}")
        if not delete:
            try:
                if not isinstance(json.loads(value), dict):
                    raise ValueError("not an object")
            except (ValueError, RecursionError) as e:      # (RecursionError: nested deeper than the parser goes)
                raise InvalidArgument(f"member {key!r}: its entry is not a JSON object ({e})") from None
        return None
    if not key.isdigit() or len(key) > 6:
        raise InvalidArgument(f"lease key {key[:40]!r}; expected a partition's ordinal")
    if delete:
        return None
    try:
        lease = Lease.from_bytes(value, -1)
        kinds = ((lease.stream, str), (lease.owner, str), (lease.checkpoint, str), (lease.pending_end, str),
                 (lease.ordinal, int), (lease.counter, int), (lease.heartbeat_ms, int), (lease.records, int),
                 (lease.rate, (int, float)), (lease.failures, int), (lease.dead_letters, int), (lease.last_error, str),
                 (lease.state, str))
        if not all(isinstance(v, t) and not isinstance(v, bool) for v, t in kinds) \
                or not all(isinstance(p, int) and not isinstance(p, bool) for p in lease.parents):
            raise TypeError("a field of the wrong type")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise InvalidArgument(f"lease {key}: not a lease ({type(e).__name__}: {e})") from None
    if lease.ordinal != int(key):
        raise InvalidArgument(f"lease {key} names partition {lease.ordinal}")
    try:
        StartPosition.parse(lease.checkpoint, ordinal=lease.ordinal)
    except InvalidArgument as e:
        raise InvalidArgument(f"lease {key}: checkpoint: {e.message}") from None
    if lease.state and (not lease.state.isdigit() or len(lease.state) > seqno.SN_DIGITS_MAX):
        raise InvalidArgument(f"lease {key}: state {lease.state[:60]!r}; expected a changelog SN or nothing")
    return lease


class Groups:
    def __init__(self, store: MetaStore, view: ClusterView):
        self.store = store
        self.view = view

    async def _stream(self, stream: str):
        view = await bounded(self.view.stream(stream), f"consumer group of {stream[:64]!r}")
        if view.config.status is StreamStatus.DELETING:
            raise StreamNotFound(f"stream {stream!r} is being deleted")
        return view

    async def _create(self, path: str, value: bytes = b"", exist_ok: bool = False) -> None:
        """Create an entry whose parent must exist (a commit's Create makes none): a stream
        deleted meanwhile is not brought back by a group write."""
        try:
            await self.store.commit([Create(path, value)])
        except NodeExistsError:
            if not exist_ok:
                raise
        except NoNodeError:
            raise StreamNotFound(f"no such stream or group any more ({path.rsplit('/', 2)[0][:80]})") from None

    async def _ensure_dirs(self, stream: str, group: str) -> None:
        if await self.store.get(group_path(stream, group)) is None:
            await self._create(groups_path(stream), exist_ok=True)
            if len(await self.store.children(groups_path(stream))) >= limits.GROUPS_PER_STREAM_MAX:
                raise LimitExceeded(f"stream {stream!r} has {limits.GROUPS_PER_STREAM_MAX} consumer groups; "
                                    "delete one first")
            # the group is a registered consumer from its first entry: nothing it has not
            # checkpointed is trimmed while the stream protects unread records
            await record_consumer(self.store, stream, group, {})
            self.view.invalidate()
        for path in (group_path(stream, group), _dir(stream, group, False), _dir(stream, group, True)):
            await self._create(path, exist_ok=True)

    async def state(self, stream: str, group: str) -> tuple[list, list]:
        """(leases, members) of the group, each (key, value, version); none if it has none."""
        validate_group(group)
        await self._stream(stream)
        return (await reads.entries(self.store, _dir(stream, group, False)),
                await reads.entries(self.store, _dir(stream, group, True)))

    async def write(self, stream: str, group: str, member: bool, key: str, value: bytes, version: int,
                    delete: bool = False) -> int:
        """One conditional write: create (version -1), replace or delete the entry; the
        new version (0 for a delete). LeaseLost when the entry is not at `version`."""
        validate_group(group)
        lease = _validate_entry(member, key, value, delete)
        view = await self._stream(stream)
        path = f"{_dir(stream, group, member)}/{key}"
        if delete:
            try:
                await self.store.delete(path, version)
            except (BadVersionError, NoNodeError):
                raise LeaseLost(f"group {group!r}: {key} changed or is gone") from None
            return 0
        if version < 0:
            if lease is not None and not any(e.ordinal == lease.ordinal for e in view.map.entries):
                raise InvalidArgument(f"stream {stream!r} has no partition {lease.ordinal}")
            await self._ensure_dirs(stream, group)
            if member and len(await self.store.children(_dir(stream, group, True))) >= limits.GROUP_MEMBERS_MAX:
                raise LimitExceeded(f"group {group!r} has {limits.GROUP_MEMBERS_MAX} members")
            try:
                await self._create(path, value)
            except NodeExistsError:
                raise LeaseLost(f"group {group!r}: {key} exists") from None
            new_version, old = 0, None
        else:
            sn = checkpoint_sn(lease.checkpoint) if lease is not None else None
            entry = await self.store.get(path) if sn is not None else None      # (to see the checkpoint move)
            old = Lease.from_bytes(entry.value, entry.version) if entry is not None else None
            if old is not None and old.checkpoint != lease.checkpoint:
                # the lease and the group's consumer entry in one commit: a reset between
                # them cannot leave the entry ahead of the lease (retention would trim what
                # the reset asked to read again)
                return await self._checkpoint(stream, group, path, value, version, lease.ordinal, sn)
            try:
                new_version = await self.store.set(path, value, version)
            except (BadVersionError, NoNodeError):
                raise LeaseLost(f"group {group!r}: {key} changed under the writer") from None
        if lease is not None and old is None:
            sn = checkpoint_sn(lease.checkpoint)
            if sn is not None:
                await record_consumer(self.store, stream, group, {lease.ordinal: sn})
        return new_version

    async def _checkpoint(self, stream: str, group: str, path: str, value: bytes, version: int, ordinal: int,
                          sn: int) -> int:
        consumer = metadata.consumer_path(stream, group)
        for _ in range(limits.CLIENT_REDIRECT_RETRIES_MAX):
            entry = await self.store.get(consumer)
            if entry is None:                 # (registered by hand and removed: register it again)
                await record_consumer(self.store, stream, group, {})
                continue
            record = ConsumerRecord.from_bytes(entry.value)
            merged = dict(record.checkpoints)
            merged[ordinal] = sn
            try:
                versions = await self.store.commit([
                    Set(path, value, version),
                    Set(consumer, ConsumerRecord(group, tuple(sorted(merged.items()))).to_bytes(), entry.version)])
                return versions[0]
            except (BadVersionError, NoNodeError):
                lease = await self.store.get(path)
                if lease is None or lease.version != version:
                    raise LeaseLost(f"group {group!r}: lease {ordinal} changed under the writer") from None
                continue                      # (the consumer entry changed: merge again)
        raise Unavailable(f"group {group!r}: its consumer entry changes too often; retry")

    async def list(self, stream: str) -> list[str]:
        await self._stream(stream)
        try:
            return sorted(await self.store.children(groups_path(stream)))
        except NoNodeError:
            return []

    async def reset(self, stream: str, group: str, position: str, timestamp_ms: int = 0,
                    sequence_numbers: dict[str, str] | None = None) -> None:
        """Move every lease of the group (one per partition of the stream's map) to a new
        position, free: a member holding one loses it at its next write (LeaseLost) and
        claims it again from there. `position`: TRIM_HORIZON, LATEST (a closed partition
        at its end; an open one after the SN the client names for it, from its start if
        it names none: it was empty) or AT_TIMESTAMP; per-partition
        SNs (`sequence_numbers`, partition id -> the SN to resume after) override it for
        the partitions they name (with no position, the others start at TRIM_HORIZON)."""
        validate_group(group)
        view = await self._stream(stream)
        by_partition = {}
        for pid, sn in (sequence_numbers or {}).items():
            ordinal = parse_partition_id(pid)
            number = seqno.parse(sn)
            if seqno.ordinal_of(number) != ordinal:
                raise InvalidArgument(f"sequence number {sn} is not of partition {pid}")
            by_partition[ordinal] = str(number)
        if position in (TRIM_HORIZON, LATEST) or (not position and sequence_numbers):
            start = position or TRIM_HORIZON
        elif position == "AT_TIMESTAMP":
            start = StartPosition.of(position, timestamp_ms=timestamp_ms).encode()
        else:
            raise InvalidArgument(f"reset position {position[:40]!r}; expected TRIM_HORIZON, LATEST, AT_TIMESTAMP "
                                  "or sequence numbers")
        await self._ensure_dirs(stream, group)
        consumer: dict[int, int] = {}
        for e in view.map.entries:
            checkpoint = by_partition.get(e.ordinal, start)
            if checkpoint == LATEST and e.state is not PartitionState.OPEN:
                checkpoint = SHARD_END           # (nothing after its end: its children go on)
            elif checkpoint == LATEST:
                # (sms/aio/admin.py reset_group names each open partition's last SN: one it did
                # not name was empty then, and everything written since is to be read)
                checkpoint = TRIM_HORIZON
            if position == "AT_TIMESTAMP" and checkpoint == start and e.state is not PartitionState.OPEN \
                    and (e.valid_to_ms or 0) <= timestamp_ms:
                checkpoint = SHARD_END
            # every partition named: 0 (nothing read) keeps all of it, where a checkpoint in a
            # child alone would let retention take its parents before the group reads them
            consumer[e.ordinal] = checkpoint_sn(checkpoint) or 0
            await self._reset_one(stream, group, Lease("", e.ordinal, checkpoint=checkpoint, parents=e.parents))
        await record_consumer(self.store, stream, group, consumer, replace_all=True)

    async def _reset_one(self, stream: str, group: str, target: Lease) -> None:
        path = f"{_dir(stream, group, False)}/{target.ordinal}"
        for _ in range(limits.CLIENT_REDIRECT_RETRIES_MAX):
            entry = await self.store.get(path)
            if entry is None:
                try:
                    await self._create(path, target.to_bytes())
                    return
                except NodeExistsError:
                    continue
            held = Lease.from_bytes(entry.value, entry.version)
            moved = dataclasses.replace(held, owner="", counter=held.counter + 1, checkpoint=target.checkpoint,
                                        pending_end="", records=0, state="")
            try:
                await self.store.set(path, moved.to_bytes(), entry.version)
                return
            except BadVersionError:
                continue
        raise Unavailable(f"group {group!r}: lease {target.ordinal} changes too often to reset; retry")

    async def delete(self, stream: str, group: str) -> None:
        validate_group(group)
        await self._stream(stream)
        try:
            await self.store.delete(group_path(stream, group), recursive=True)
        except NoNodeError:
            raise GroupNotFound(f"stream {stream!r} has no consumer group {group!r}") from None
        await record_consumer(self.store, stream, group, {}, remove=True)
        self.view.invalidate()
