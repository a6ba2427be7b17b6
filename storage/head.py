"""The head's side of the append protocol (ingestion -> chain head), one session at a time.

A session takes batches in order (`append`: the replica sequences and persists each, or
recognises a resend of one it holds by its origin) and gives acks back in the same order
(`acks`), each once the batch is committed (the tail has it), or with the named error that
says it was not stored. The gRPC `Append` stream (storage/service.py) is one binding of it;
an ingestion writer whose chain head lives in its own process is the other: it calls the
session directly, with the same epoch fencing, origin resends and ack semantics, and no
loopback hop (ingestion/writer.py).

Only the partition's ingestion owner appends: the node its chain config names head
(ingestion runs beside the head). A session knows its caller from the Append stream's
node certificate (storage/service.py); a batch from any other node is refused with
PermissionDenied and not looked at. The in-process session has no caller to check: it is
the owner by construction, and so is a plaintext cluster's caller, which has no identity
(docs/security.md, "Who may append").
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from sms.errors import PermissionDenied, SmsError
from sms import limits
from storage.replica import ReplicaState

# refusals of an Append that go to the audit log (storage/service.py): a caller that is not
# the partition's ingestion owner, a batch no reader could decode. (StaleEpoch, WrongOwner
# and HeadMoving follow every restart and chain change: routine, not audited.)
AUDITED_REFUSALS = frozenset({"PermissionDenied", "CorruptBatch"})



@dataclass(frozen=True, slots=True)
class AppendAck:
    """The outcome of one appended batch: its first SN and record count once committed,
    or the name of the error that kept it from being stored (or committed)."""

    batch_id: int
    first_sn: int = 0
    count: int = 0
    error_name: str = ""
    error_message: str = ""


class HeadSession:
    def __init__(self, node, caller: str | None = None,
                 on_refused: Callable[[str, SmsError], None] | None = None):
        self.node = node                     # storage.service.StorageNode: replica(chain_id)
        # the node id the Append stream's certificate names ("" when it names none); None:
        # this process's own ingestion role, or a plaintext cluster's caller (unchecked)
        self.caller = caller
        self.on_refused = on_refused         # (chain id, error) of each AUDITED_REFUSALS refusal
        self.pending: collections.deque = collections.deque()   # (batch_id, replica, header, error)
        self.wake = asyncio.Event()
        self.ended = False

    async def append(self, chain_id: str, epoch: int, batch_id: int, batch: bytes) -> None:
        """Sequence and persist one batch on this node's head replica of the chain (or
        record why not); its ack follows from `acks` in order."""
        try:
            replica = self.node.replica(chain_id)
            self._check_owner(replica)       # (no await before append_as_head checks this node is head)
            header = await replica.append_as_head(epoch, batch)
            self.pending.append((batch_id, replica, header, None))
        except SmsError as e:
            self.pending.append((batch_id, None, None, e))
            if self.on_refused is not None and e.name in AUDITED_REFUSALS:
                self.on_refused(chain_id, e)
        self.wake.set()

    def _check_owner(self, replica) -> None:
        owner = replica.config.head
        if self.caller is not None and self.caller != owner:
            raise PermissionDenied(f"{replica.chain_id}: only its ingestion owner {owner} appends to its head, "
                                   f"not {f'node {self.caller}' if self.caller else 'a caller without a node id'}; "
                                   f"the batch was not stored")

    def end(self) -> None:
        """No more batches: `acks` ends once every pending one is answered."""
        self.ended = True
        self.wake.set()

    async def acks(self) -> AsyncIterator[AppendAck]:
        while not (self.ended and not self.pending):
            if not self.pending:
                await self.wake.wait()
                self.wake.clear()
                continue
            batch_id, replica, header, error = self.pending[0]
            if error is not None:
                self.pending.popleft()
                yield AppendAck(batch_id, error_name=error.name, error_message=error.message)
                continue
            if not await replica.wait_committed(header.last_sn, timeout_s=limits.HEAD_COMMIT_POLL_S):
                if replica.state is not ReplicaState.ACTIVE:
                    self.pending.popleft()
                    yield AppendAck(batch_id, error_name="PartitionClosed",
                                    error_message=f"{replica.chain_id} closed before commit")
                continue
            self.pending.popleft()
            yield AppendAck(batch_id, first_sn=header.first_sn, count=header.count)
