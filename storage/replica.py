"""One node's replica of one partition chain: sequencing, persisting, forwarding, commit.

The head assigns sequence numbers (timestamp | counter | ordinal), persists the batch,
and its downstream link ships it to the successor; every node persists then forwards;
the tail's last SN is the commit watermark, which flows back up the chain on the link
acks. Ingestion waits on `wait_committed` before it acknowledges a producer, and readers
never read past `committed_sn`.

The downstream link is a log-shipping cursor: on (re)connect the successor says its last
SN and the link resends everything after it from the local log, so a broken link heals
itself and each node's log stays a prefix of its predecessor's. Every message carries the
chain epoch; a replica answers any other epoch with StaleEpoch. The link protocol itself is
storage/link.py (sans-IO state machines); storage/peerlink.py drives them over one gRPC
stream per pair of nodes, and `Replica.apply` carries out what the machines ask of a
replica.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import logging
import time
from collections.abc import Callable

from kernel import encryption
from sms import wire, limits, seqno
from sms.errors import (HeadMoving, LogDiverged, NotEnoughReplicas, PartitionClosed, PartitionSealed, SmsError,
                        StaleEpoch, WrongOwner, invariant)
from sms.metadata import ChainConfig, chain_name
from storage import link
from storage.log import LogStore, PartitionLog

log = logging.getLogger(__name__)


class ReplicaState(enum.Enum):
    ACTIVE = "active"
    CLOSED = "closed"      # removed from the node; every waiter is released


def _wall_clock() -> float:
    return time.time()


class Replica:
    def __init__(self, node_id: str, config: ChainConfig, store: LogStore, plog: PartitionLog,
                 clock: Callable[[], float] = _wall_clock, keys: "encryption.StreamKeys | None" = None):
        self.node_id = node_id
        self.keys = keys                            # an encrypted stream's data key seals what the head sequences
        self.clock = clock                          # wall-clock seconds: the sequencer's timestamps
        self.config = config
        self.store = store
        self.log = plog
        self.state = ReplicaState.ACTIVE
        self.progress = asyncio.Condition()        # notified on append and on commit
        self.sequence_lock = asyncio.Lock()        # one sequencer at a time (head)
        self.links: dict[str, "ChainSend"] = {}   # successor (and, at the tail, learners): storage/peerlink.py
        # called with the chain id on every `notify`: the drivers of the node-pair streams
        # (storage/peerlink.py) learn which of their chains to look at again
        self.watchers: set[Callable[[str], None]] = set()
        self.recent: collections.deque = collections.deque()      # (first SN, last SN, batch): `_keep_recent`
        self.recent_bytes = 0
        # origin id -> {origin seq: header} of recent batches, so a resent batch is
        # recognised (filled from the log's tail the first time this replica leads)
        self.origins: collections.OrderedDict[int, collections.OrderedDict] | None = None
        # a learner's log is verified once its predecessor found it a prefix of its own
        self.verified = False
        # bumped when the log is wiped: every stream that relied on the old log (an incoming
        # one verified against it, an outgoing link's cursor into it) must start again
        self.generation = 0
        # the tail's learners: node -> its acked SN. A learner that has once caught up with
        # the tail is *gated*: from then on the tail commits only what it has acked, so the
        # learner holds every committed batch when the chain manager promotes it (it only
        # promotes a gated learner) and the handover loses nothing committed.
        self.learner_acked: dict[str, int] = {}
        self.gated: set[str] = set()
        # retention: records below this SN are deleted here (or about to be) and never read
        self.trimmed_before = 0
        self.apply_config(config)

    def apply_config(self, config: ChainConfig) -> None:
        """Adopt a (new) chain config. A tail's whole log is committed by definition (every
        member before it holds it too); the watermark stored on disk may lag it by one
        batch, so a tail takes its last SN -- unless the chain has fewer members than
        min_in_sync: then it commits nothing new until enough members hold its log."""
        was_learner = self.node_id in self.config.learners
        old_tail = self.config.tail
        self.config = config
        for n in list(self.learner_acked):
            if not (self.is_tail and n in config.learners):
                self.learner_acked.pop(n, None)
                self.gated.discard(n)
        if self.is_tail:
            self._commit_as_tail(self.log.last_sn)
        if not self.is_learner:
            self.verified = True
        elif not was_learner:
            # taken back as a learner (it missed the configs that removed it: it was paused):
            # its log must be verified anew, and what it knew as a head is stale
            self.verified = False
            self.origins = None
        elif old_tail != config.tail:
            self.verified = False        # verified against the old tail; the new one checks again

    # --- roles --------------------------------------------------------------------
    @property
    def chain_id(self) -> str:
        return self.config.chain_id

    @property
    def is_head(self) -> bool:
        return self.config.head == self.node_id

    @property
    def is_tail(self) -> bool:
        return self.config.tail == self.node_id

    @property
    def is_learner(self) -> bool:
        return self.node_id in self.config.learners

    @property
    def active(self) -> bool:
        return self.state is ReplicaState.ACTIVE

    @property
    def committed_sn(self) -> int:
        return self.log.committed_sn

    @property
    def last_sn(self) -> int:
        return self.log.last_sn

    def check_epoch(self, epoch: int) -> None:
        if epoch != self.config.epoch:
            raise StaleEpoch(f"{self.chain_id}: epoch {epoch}; this replica is at epoch {self.config.epoch}")

    def check_active(self) -> None:
        if self.state is not ReplicaState.ACTIVE:
            raise PartitionClosed(f"{self.chain_id}: replica closed on {self.node_id}")

    # --- write path ---------------------------------------------------------------
    def _next_first_sn(self) -> int:
        last = self.log.last_sn
        now_ms = int(self.clock() * 1000)
        ts = max(now_ms, seqno.timestamp_ms_of(last), self.config.from_ms)
        counter = seqno.counter_of(last) + 1 if last else 1
        return seqno.make(ts, counter, self.config.ordinal)

    async def append_as_head(self, epoch: int, unsequenced: bytes) -> wire.BatchHeader:
        """Sequence and persist a batch from ingestion; returns its header."""
        self.check_active()
        self.check_epoch(epoch)
        if not self.is_head:
            raise WrongOwner(f"{self.chain_id}: {self.node_id} is not the head")
        # (read before the sequence lock: the data key of an encrypted stream, else None)
        data_key = await self.keys.sealing_key(self.config.stream) if self.keys is not None else None
        # shielded: a caller cancelled mid-append (its stream broke) must not leave the
        # batch stored but missing from `recent` and `origins`
        return await asyncio.shield(self._sequence_and_store(unsequenced, data_key))

    async def _sequence_and_store(self, unsequenced: bytes, data_key: bytes | None = None) -> wire.BatchHeader:
        async with self.sequence_lock:
            incoming = wire.read_header(unsequenced)
            held = self._held(incoming)
            if held is not None:
                return held      # a resend of a batch we already store: not stored twice
            if self.config.sealed:
                # checked under the sequence lock: once a sealed config is applied and the lock
                # is free, last_sn is final (what the repartition driver waits for)
                raise PartitionSealed(f"{self.chain_id}: sealed for a repartition; the batch was not stored")
            if self.config.handoff:
                # the head role moves to another member once every member holds the same
                # log: checked under the sequence lock, as `sealed` (control/chains.py rule 8)
                raise HeadMoving(f"{self.chain_id}: the head moves from {self.node_id} to {self.config.handoff}; "
                                 f"the batch was not stored")
            if self.config.below_min_in_sync:
                # a chain that lost members (their replacements still learners) takes nothing
                # new that fewer than min_in_sync nodes would hold. A batch that passed this
                # check before the short config arrived is held back by the tail's commit
                # rule (`_commit_as_tail`) instead
                raise NotEnoughReplicas(
                    f"{self.chain_id}: the chain has {len(self.config.members)} member(s) "
                    f"({', '.join(self.config.members)}), fewer than the stream's min_in_sync "
                    f"{self.config.min_in_sync}; the batch was not stored")
            last = self.last_header()
            batch = wire.sequence_checked(unsequenced, self._next_first_sn(), last.checksum if last else 0)
            if data_key is not None:
                batch = encryption.seal_batch(batch, data_key)      # stored and replicated sealed
            header = await self.store.append_verified(self.log, wire.read_header(batch), batch)   # (shielded above)
            self._keep_recent(header.first_sn, header.last_sn, batch)
            self._remember(header)
        if self.is_tail:
            self._commit_as_tail(header.last_sn)
        await self.notify()
        return header

    def _held(self, incoming: wire.BatchHeader) -> wire.BatchHeader | None:
        if incoming.origin_id == 0:
            return None
        if self.origins is None:
            self.origins = collections.OrderedDict()
            for stored in self.store.last_batches(self.log, limits.HEAD_ORIGIN_BATCHES_MAX * 4):
                self._remember(wire.read_header(stored))
        return self.origins.get(incoming.origin_id, {}).get(incoming.origin_seq)

    def _remember(self, header: wire.BatchHeader) -> None:
        if header.origin_id == 0 or self.origins is None:
            return
        seen = self.origins.get(header.origin_id)
        if seen is None:
            seen = self.origins[header.origin_id] = collections.OrderedDict()
            while len(self.origins) > limits.HEAD_ORIGINS_MAX:
                self.origins.popitem(last=False)
        self.origins.move_to_end(header.origin_id)
        seen[header.origin_seq] = header
        while len(seen) > limits.HEAD_ORIGIN_BATCHES_MAX:
            seen.popitem(last=False)

    async def append_as_successor(self, batch: bytes, predecessor_committed: int = 0,
                                  generation: int | None = None) -> None:
        """Persist a batch from the predecessor; a batch already held is skipped. A learner
        commits nothing itself: it adopts its predecessor's (the tail's) watermark.
        `generation`: the log generation the stream was verified against at its hello."""
        self.check_active()
        if generation is not None and generation != self.generation:
            raise StaleEpoch(f"{self.chain_id}: the log on {self.node_id} was wiped after this stream began")
        # a clear batch is checked as the head checks it: a predecessor that lets through a
        # batch no reader decodes (an older version, a fault, a stolen identity) stalls its
        # link on a named error here, rather than have every read of the partition fail. A
        # sealed one is ciphertext: the head checked its records before it sealed them
        # (docs/security.md, "Who may append")
        header = wire.verify(batch) if encryption.is_sealed(batch) else wire.check_batch(batch)
        await asyncio.shield(self._store_successor(header, batch, predecessor_committed))   # as append_as_head

    async def _store_successor(self, header: wire.BatchHeader, batch: bytes, predecessor_committed: int) -> None:
        async with self.sequence_lock:     # a resend on a new stream waits for a shielded append in progress
            await self._store_successor_locked(header, batch, predecessor_committed)

    async def _store_successor_locked(self, header: wire.BatchHeader, batch: bytes,
                                      predecessor_committed: int) -> None:
        if header.last_sn <= self.log.last_sn:
            return  # resent after a reconnect: we hold it already
        invariant(header.first_sn > self.log.last_sn,
                  f"{self.chain_id}: batch {header.first_sn}..{header.last_sn} overlaps last {self.log.last_sn}")
        last = self.last_header()
        if last is not None and header.prev_checksum != last.checksum:
            # (the hello found the logs equal up to our last batch: only a bug gets here)
            raise LogDiverged(f"{self.chain_id}: batch {header.first_sn} follows checksum {header.prev_checksum:#x}; "
                              f"the log on {self.node_id} ends with {last.checksum:#x}")
        await self.store.append_verified(self.log, header, batch)       # (verified and shielded above)
        self._keep_recent(header.first_sn, header.last_sn, batch)
        if self.is_tail:
            self._commit_as_tail(header.last_sn)
        elif self.is_learner:
            adopted = min(predecessor_committed, self.log.last_sn)
            if adopted > self.log.committed_sn:
                self.store.set_committed(self.log, adopted)
        await self.notify()

    def _keep_recent(self, first_sn: int, last_sn: int, batch: bytes) -> None:
        """The newest batches, for the successor's link and readers at the tail: at most
        REPLICA_RECENT_BATCHES_MAX of them and REPLICA_RECENT_BYTES_MAX of bytes (the newest
        is always kept: `last_header` reads it). Older ones are read from the log."""
        recent = self.recent
        recent.append((first_sn, last_sn, batch))
        self.recent_bytes += len(batch)
        while len(recent) > 1 and (len(recent) > limits.REPLICA_RECENT_BATCHES_MAX
                                   or self.recent_bytes > limits.REPLICA_RECENT_BYTES_MAX):
            self.recent_bytes -= len(recent.popleft()[2])

    def last_header(self) -> wire.BatchHeader | None:
        """The header of the last stored batch (what a predecessor verifies at hello)."""
        if self.recent:
            return wire.read_header(self.recent[-1][2])
        last = self.store.last_batches(self.log, 1)
        return wire.read_header(last[0]) if last else None

    def holds_batch(self, first_sn: int, last_sn: int, checksum: int) -> bool:
        """True when this log stores exactly that batch (same bounds and checksum). The
        checksums are chained (sms/wire.py), so the log then also holds everything before it."""
        if not first_sn or last_sn > self.log.last_sn:
            return False
        for batch in self.store.read_batches_from(self.log, first_sn, 1):
            header = wire.read_header(batch)
            return header.first_sn == first_sn and header.last_sn == last_sn and header.checksum == checksum
        return False

    async def reset(self) -> None:
        """Wipe this replica's log (it diverged from its predecessor's); it is copied anew."""
        log.warning("%s: log on %s diverges from its predecessor's; wiping it to copy anew",
                    chain_name(self.chain_id), self.node_id)
        async with self.sequence_lock, self.log.append_lock:
            await self.store.drop_log(self.chain_id)
            self.log = self.store.open_log(self.chain_id, self.config.persistence)
        self.recent.clear()
        self.recent_bytes = 0
        self.origins = None
        self.verified = True
        self.generation += 1
        await self.notify()

    def _commit_as_tail(self, sn: int) -> None:
        """A tail commits what it holds, but no more than its gated learners have acked, and
        nothing while its chain has fewer members than min_in_sync: a batch the head
        sequenced before the chain lost its members stays uncommitted (not acknowledged,
        not read) until a learner has copied it and joined (docs/architecture.md)."""
        if self.config.below_min_in_sync:
            return
        for n in self.gated:
            sn = min(sn, self.learner_acked.get(n, 0))
        sn = min(sn, self.log.last_sn)
        if sn > self.log.committed_sn:
            self.store.set_committed(self.log, sn)

    async def on_learner_acked(self, learner: str, acked_sn: int, hello: bool = False) -> None:
        """A learner's link ack (tail only): its progress, and the gate once it caught up.
        `hello`: the learner's answer to a hello; holding less than it had acked, it lost
        its log (a restart) or had it wiped: it is not the learner that caught up, and is
        gated again only once it catches up again (else a learner of a new incarnation
        inherited the gate of its old one, and was promoted without the committed batches)."""
        if not self.is_tail or learner not in self.config.learners:
            return
        if hello and acked_sn < self.learner_acked.get(learner, 0):
            self.gated.discard(learner)
            self.learner_acked[learner] = acked_sn
        self.learner_acked[learner] = max(self.learner_acked.get(learner, 0), acked_sn)
        if learner not in self.gated and self.learner_acked[learner] >= self.log.last_sn:
            self.gated.add(learner)
        self._commit_as_tail(self.log.last_sn)
        await self.notify()

    async def on_successor_committed(self, committed_sn: int) -> None:
        committed_sn = min(committed_sn, self.log.last_sn)
        if committed_sn > self.log.committed_sn:
            self.store.set_committed(self.log, committed_sn)
            await self.notify()

    async def notify(self) -> None:
        for watcher in list(self.watchers):
            watcher(self.config.chain_id)
        async with self.progress:
            self.progress.notify_all()

    async def wait_committed(self, sn: int, timeout_s: float) -> bool:
        """True once committed_sn >= sn; False on timeout or when the replica closes."""
        deadline = time.monotonic() + timeout_s
        async with self.progress:
            while self.log.committed_sn < sn and self.state is ReplicaState.ACTIVE:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                try:
                    # asyncio.timeout, not wait_for: wait_for runs the wait in another task,
                    # and a cancel landing at its timeout (Python 3.11) left that task holding
                    # the condition's lock for ever -- the replica's close() then hung
                    async with asyncio.timeout(remaining):
                        await self.progress.wait()
                except TimeoutError:
                    return self.log.committed_sn >= sn
            return self.log.committed_sn >= sn

    def batches_after(self, after_sn: int, limit: int) -> list[bytes]:
        """Up to `limit` stored batches whose records all follow after_sn."""
        recent = self.recent
        if recent and recent[0][0] <= after_sn + 1 <= recent[-1][1] + 1:
            out = []
            for first, _last, b in reversed(recent):     # (the newest are the ones wanted)
                if first <= after_sn:
                    break
                out.append(b)
            if out:
                out.reverse()
                return out[:limit]
        slices = self.store.read(self.log, after_sn + 1, self.log.last_sn,
                                 max_records=limits.BATCH_RECORDS_MAX * limit,
                                 max_bytes=limits.BATCH_BYTES_MAX * limit)
        out = []
        for s in slices:
            if s.start != 0:
                invariant(False, f"{self.chain_id}: batch boundary {s.first_sn} not at {after_sn}")
            out.append(s.batch)
            if len(out) >= limit:
                break
        return out

    async def apply(self, action: link.Action) -> SmsError | None:
        """Carry out what a link state machine (storage/link.py) asks of this replica; the
        named error a `Store` failed with goes back to the machine (`Receiver.store_failed`)."""
        if isinstance(action, link.Store):
            try:
                await self.append_as_successor(action.batch, action.committed_sn, action.generation)
            except SmsError as e:
                return e
        elif isinstance(action, link.Commit):
            await self.on_successor_committed(action.sn)
        elif isinstance(action, link.LearnerAcked):
            await self.on_learner_acked(action.learner, action.sn, action.hello)
        elif isinstance(action, link.MarkVerified):
            self.verified = True
        elif isinstance(action, link.ResetLog):
            await self.reset()
        else:
            invariant(False, f"{self.chain_id}: {action} is not an action on a replica")
        return None

    async def stop_links(self) -> None:
        links, self.links = self.links, {}
        for link in links.values():
            await link.stop()

    async def close(self) -> None:
        self.state = ReplicaState.CLOSED
        await self.stop_links()
        await self.notify()

    def status(self) -> dict:
        return {"chain_id": self.chain_id, "epoch": self.config.epoch, "role": self.config.role_of(self.node_id),
                "last_sn": self.log.last_sn, "committed_sn": self.log.committed_sn,
                "batches": self.log.batches, "records": self.log.records, "verified": self.verified,
                "gated": sorted(self.gated), "first_sn": self.log.first_sn, "trimmed_before": self.trimmed_before,
                "sealed": self.config.sealed and not self.sequence_lock.locked(),
                "frozen": bool(self.config.sealed or self.config.handoff) and not self.sequence_lock.locked()}
