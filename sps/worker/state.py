"""A stateful stage's keyed state in the worker (sps/state.py's `KeyedState`): folded
with each batch, written to the changelog as deltas and snapshots, restored when a lease is
taken over, handed down to a split's or a merge's children, and protected from trimming
while a lease may still need it."""

from __future__ import annotations

import logging
import time

from sms import errors, limits, seqno
from sms.leases import SHARD_END, Lease, lease_key
from sps.state import KeyedState, parse_changelog
from sps.worker.parts import Owned, Step
from sps.worker.pipeline import _row_json

log = logging.getLogger("sps.worker")


class StatefulStage:
    """Keyed state of a `Worker`'s partitions."""

    # --- keyed state (sps/state.py) ------------------------------------------------------
    def _fold(self, s: Step) -> None:
        """A stateful stage: fold the batch's result rows into its partition's state; the
        batch then outputs the state's changed rows (or closed windows) and writes its
        changelog record(s): a snapshot when one is due (every snapshot_every batches, and
        the first batch after a hand-down), else a delta.

        A replayed batch must write the very records its first run wrote (the same SSSNs
        with other contents are refused as a SessionConflict), so everything here follows
        from the changelog and the batch alone: the snapshot schedule counts the batches
        since the last snapshot in the changelog (not, say, whether this worker is about to
        hand the lease over), and rows are folded in a fixed order when an engine's row
        order is not (a float sum depends on it)."""
        o, spec = s.owned, self.stage.state
        rows = s.rows
        if self.engine.name != "python" and any(a.function == "sum" for a in spec.aggregates):
            rows = sorted(rows, key=lambda row: repr(sorted(row.items())))
        changes = o.state.update(rows)
        s.snapshot = o.snapshot_due or o.since_snapshot + 1 >= spec.snapshot_every
        # (counted here, not once written: the next batch is folded while this one is written)
        o.since_snapshot = 0 if s.snapshot else o.since_snapshot + 1
        o.snapshot_due = False
        # result rows the state cannot take (a missing column, a value of the wrong type, the
        # entry limit) go to the dead letters, as JSON, and the others go on
        source = f"p{o.lease.ordinal:04d}/{s.batch.first_sn}-{s.batch.last_sn}"
        rejected = [self._dead_letter(o.lease.key, _row_json(row), error, source) for row, error in changes.rejected]
        if rejected:
            self.dead_letters += len(rejected)
            s.failed += len(rejected)
            s.error = changes.rejected[-1][1]
            s.rejected = len(rejected)
            log.warning("%s: stage %s: %d result row(s) of %s the state cannot take (%s): to %s", self.worker_id,
                        self.stage.name, len(rejected), o.lease.key, s.error, self.stage.dead_letter_stream)
        s.changelog = rejected + [(spec.changelog, o.lease.key, data)
                                  for data in o.state.changelog_records(s.batch.last_sn, changes, s.snapshot)]
        s.rows = o.state.output_rows(changes)
        self.timings["state_changes"] += len(changes.changed) + len(changes.closed)
        if changes.late:
            self.timings["late_rows"] += changes.late

    def _snapshotted(self, s: Step, outcomes: list) -> None:
        """After a batch's writes: where its snapshot starts in the changelog (kept in the
        lease with the checkpoint, by the next lease write)."""
        if not s.snapshot:
            return
        first = outcomes[len(outcomes) - len(s.changelog) + s.rejected] if s.changelog and outcomes else None
        if first is not None and first.sn is not None:
            # (a duplicate is the record the first run stored there: the same contents, or
            # ingestion would have refused it as a SessionConflict)
            s.owned.state_pos = str(first.sn)

    async def _restore(self, owned: Owned) -> None:
        """The partition's state as of its checkpoint, from the changelog (from the latest
        snapshot the lease names); a partition not yet started takes its parents' final
        entries in its hash range (a split or merge hands state down)."""
        spec, lease = self.stage.state, owned.lease
        state = KeyedState(spec, self.stage.name)
        t0 = time.monotonic()
        read = 0
        if lease.checkpoint.isdigit():
            docs = await self._changelog_docs(lease.key, lease.state)
            read = len(docs)
            owned.since_snapshot = state.load(docs, int(lease.checkpoint))
            owned.state_pos = lease.state
        elif lease.parents and lease.checkpoint != SHARD_END:
            leases = await self.table.all()
            info = await self.client.get_stream_info(lease.stream)
            read = await self._hand_down(state, lease.stream, lease.parents, lease.ordinal, leases, info)
            owned.snapshot_due = bool(state.entries)      # (its changelog starts with what it was handed)
        owned.state = state
        self.timings["restore_s"] += time.monotonic() - t0
        if read:
            log.info("%s: stage %s: restored %s's state (%d entries) from %d changelog records in %.2f s",
                     self.worker_id, self.stage.name, lease.key, len(state.entries), read, time.monotonic() - t0)

    async def _hand_down(self, state: KeyedState, stream: str, parents, ordinal: int, leases: dict,
                         info, depth: int = 0) -> int:
        """Into `state`: the final entries of `parents` in partition `ordinal`'s hash range.
        A parent that wrote no changelog record (it ended before it processed a record)
        passes on what it was handed itself, from its own parents. Returns the changelog
        records read."""
        me = next((p for p in info.partitions if p.ordinal == ordinal), None)
        if me is None or depth > limits.SPS_STATE_HAND_DOWN_DEPTH_MAX:
            return 0
        read = 0
        for parent in parents:
            held = leases.get(lease_key(stream, parent))
            docs = await self._changelog_docs(lease_key(stream, parent), held.state if held else "")
            read += len(docs)
            theirs = KeyedState(self.stage.state, self.stage.name)
            if docs:
                theirs.load(docs, None)
            elif held is not None and held.parents:
                read += await self._hand_down(theirs, stream, held.parents, parent, leases, info, depth + 1)
            state.adopt(theirs, me.hash_lo, me.hash_hi)
        return read

    async def _changelog_docs(self, key: str, position: str) -> list[dict]:
        """A partition's changelog documents from `position` (a snapshot's SN), or from the
        start of the changelog."""
        stream = self.stage.state.changelog
        docs = []
        try:
            async for r in self.client.read_stream(stream, **({"sequence_number": position} if position else {})):
                if r.partition_key != key:
                    continue
                try:
                    docs.append(parse_changelog(r.data))
                except errors.InvalidArgument as e:
                    log.warning("%s: stage %s: %s %s in %s is not a changelog record (%s); ignored",
                                self.worker_id, self.stage.name, key, r.sequence_number, stream, e.message)
        except errors.RecordsTrimmed as e:
            raise errors.RecordsTrimmed(f"stage {self.stage.name!r}: the changelog of {key} in {stream!r} was trimmed "
                                        f"below its snapshot ({e.message}); its state cannot be restored. Keep "
                                        f"{stream!r} protecting unread records (as `sms graph apply` makes it)") from None
        return docs

    async def _protect_changelog(self, leases: dict[str, Lease]) -> None:
        """The stage is a registered consumer of its changelog, at the oldest snapshot a
        partition may still be restored from: retention keeps that, and everything after
        it (in its changelog partition and that partition's descendants). A partition
        that started without a snapshot yet is restored from the whole changelog, so then
        nothing is let go. A closed partition's snapshot is let go once every child has a
        snapshot of its own (or ended, its own children having one)."""
        spec = self.stage.state
        children: dict[str, list[Lease]] = {}
        for c in leases.values():
            for p in c.parents:
                children.setdefault(lease_key(c.stream, p), []).append(c)

        def covered(lease: Lease, depth: int = 0) -> bool:
            if lease.state:
                return True
            kids = children.get(lease.key, [])
            return lease.done and bool(kids) and depth < limits.SPS_STATE_HAND_DOWN_DEPTH_MAX \
                and all(covered(k, depth + 1) for k in kids)

        info = await self.client.get_stream_info(spec.changelog)
        oldest: dict[int, int] = {}
        for lease in leases.values():
            kids = children.get(lease.key, [])
            if lease.done and kids and all(covered(k) for k in kids):
                continue
            if lease.state:
                sn = int(lease.state)
            elif lease.checkpoint.isdigit():
                sn = 1                          # (started, with no snapshot: the whole changelog)
            else:
                continue
            for ordinal in _with_descendants(info, seqno.ordinal_of(sn) if sn > 1 else None):
                oldest[ordinal] = min(oldest.get(ordinal, sn), sn)
        await self.client.checkpoint_consumer(spec.changelog, self.stage.name,
                                              {ordinal: sn - 1 for ordinal, sn in oldest.items()})


def _with_descendants(info, ordinal: int | None) -> list[int]:
    """A changelog partition and every partition after it in the lineage (None: all)."""
    if ordinal is None:
        return [p.ordinal for p in info.partitions]
    out, todo = [], [ordinal]
    while todo:
        o = todo.pop()
        if o not in out:
            out.append(o)
            todo += [p.ordinal for p in info.partitions if o in p.parents]
    return out

