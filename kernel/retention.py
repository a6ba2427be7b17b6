"""Which records of a partition may be deleted: retention, trim requests, unread records.

Pure functions, no I/O; storage nodes call `trim_point` to delete old batches of every
replica they hold, and the control leader calls `droppable` to remove closed partitions
(their map entries and chains) once nothing they hold is left to read.

A partition's trim point is an SN: no reader gets a record below it, and every record
below it is deleted -- but a de-duplicating stream deletes nothing within its dedup
window (`dedup_floor`): a retry of a younger record must still be recognised, and a new
ingestion owner (after a failover, or a child after a split) recognises it only by
reading it back. The trim point is the highest of
- the retention cut: the lowest SN of time now - retention;
- the stream's trim_stream(before_time) cut;
- the partition's own trim_stream(before_sn) cut;
and, when the stream protects unread records, no higher than any registered consumer
allows: a consumer with a checkpoint in the partition allows up to just after it; one
with a checkpoint in a descendant has read the partition to its end (readers go parents
before children) and allows everything; one without either allows nothing. A stream of a
tenant with a retention cap holds unread records at most `unread_hold_max_s`
(control/quotas.py): older ones go although a consumer has not read them.
"""

from __future__ import annotations

from collections.abc import Iterable

from sms import limits, seqno
from sms.metadata import ConsumerRecord, StreamConfig
from sms.partition_map import PartitionEntry, PartitionMap
from sms.types import IngestionPolicy, PartitionState


def descendants(pmap: PartitionMap, ordinal: int) -> set[int]:
    by_ordinal = {e.ordinal: e for e in pmap.entries}
    out: set[int] = set()
    todo = list(by_ordinal[ordinal].children) if ordinal in by_ordinal else []
    while todo:
        o = todo.pop()
        if o in out:
            continue
        out.add(o)
        if o in by_ordinal:
            todo.extend(by_ordinal[o].children)
    return out


def requested_cut(config: StreamConfig, ordinal: int, now_ms: int) -> int:
    """The SN below which retention and trim requests delete, before consumer protection."""
    cut_ms = max(now_ms - config.retention_ms, config.trim_before_ms)
    cut = seqno.lower_bound_for_time(max(0, cut_ms))
    return max(cut, dict(config.trim_before_sns).get(ordinal, 0))


def dedup_floor(config: StreamConfig, now_ms: int) -> int:
    """The lowest SN a de-duplicating stream must keep stored (hidden from readers once
    below the trim point): a retry of any younger record may still arrive."""
    if config.ingestion_policy is not IngestionPolicy.AT_LEAST_ONCE_NO_DUP:
        return seqno.SN_MAX
    return seqno.lower_bound_for_time(max(0, now_ms - config.dedup_window_ms - limits.DEDUP_CLOCK_SKEW_MS_MAX))


def trim_point(config: StreamConfig, pmap: PartitionMap, ordinal: int, consumers: Iterable[ConsumerRecord],
               now_ms: int) -> int:
    point = requested_cut(config, ordinal, now_ms)
    if not config.protect_unread:
        return point
    for consumer in consumers:
        checkpoints = dict(consumer.checkpoints)
        if ordinal in checkpoints:
            allowed = min(checkpoints[ordinal], ConsumerRecord.SHARD_END_SN - 1) + 1
        elif descendants(pmap, ordinal) & checkpoints.keys():
            continue
        else:
            allowed = 0
        point = min(point, allowed)
    if config.unread_hold_max_s:
        held_since = seqno.lower_bound_for_time(max(0, now_ms - config.unread_hold_max_s * 1000))
        point = max(point, min(requested_cut(config, ordinal, now_ms), held_since))
    return point


def ending_of(entry: PartitionEntry) -> int:
    """The last SN a closed partition may hold (its boundary time when it held nothing)."""
    if entry.ending_sn:
        return entry.ending_sn
    return seqno.lower_bound_for_time(max(0, (entry.valid_to_ms or 0) - 1))


def droppable(config: StreamConfig, pmap: PartitionMap, consumers: list[ConsumerRecord], now_ms: int) -> list[int]:
    """Closed partitions whose every record is past the trim point and the dedup floor, oldest first; a
    partition goes only after its parents (readers walk the lineage from the roots)."""
    present = {e.ordinal for e in pmap.entries}
    out: list[int] = []
    for e in sorted(pmap.entries, key=lambda e: e.valid_from_ms):
        if e.state is not PartitionState.CLOSED:
            continue
        if any(p in present and p not in out for p in e.parents):
            continue
        if min(trim_point(config, pmap, e.ordinal, consumers, now_ms), dedup_floor(config, now_ms)) > ending_of(e):
            out.append(e.ordinal)
    return out
