"""What a worker keeps per lease it holds (`Owned`) and per partition of a micro-batch (`Step`)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from sms.leases import Lease
from sps.engine import InputBatch
from sps.output import OutputWriter
from sps.state import KeyedState


@dataclass(eq=False)
class Owned:
    """A lease this worker holds, and how far its processing is."""
    lease: Lease
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_write: float = field(default_factory=time.monotonic)
    stopping: bool = False            # release at the next batch boundary
    records: int = 0
    rate_since: float = field(default_factory=time.monotonic)
    done: str = ""                    # the checkpoint: the last batch whose outputs are acknowledged
    opened: bool = False              # the iterator is open (and a pending batch is being replayed)
    iterator: str | None = None
    replay_end: int | None = None     # the first batch replays exactly the pending one
    read: asyncio.Task | None = None  # the next batch, read ahead while the current one is processed
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    ended: bool = False               # its last batch read reached the partition's end
    writer: OutputWriter | None = None
    unrecorded: int = 0               # records done since the last lease write counted them
    unfailed: int = 0                 # ... failed, and dead-lettered
    undead: int = 0
    last_error: str = ""
    state: KeyedState | None = None   # a stateful stage: the partition's keyed state, as of `done`
    state_pos: str = ""               # ... the changelog SN of its latest snapshot (kept in the lease)
    since_snapshot: int = 0           # ... batches written to the changelog since that snapshot
    snapshot_due: bool = False        # ... the next batch writes a snapshot (state handed down)


@dataclass(eq=False)
class Step:
    """One partition's part of a micro-batch."""
    owned: Owned
    batch: InputBatch
    ended: bool
    rows: list = field(default_factory=list)
    dead: list = field(default_factory=list)
    failed: int = 0
    error: str = ""
    changelog: list = field(default_factory=list)   # a stateful stage: rejected rows' dead letters, then the
    rejected: int = 0                               # ... batch's changelog records (after `rejected` of those)
    snapshot: bool = False                          # ... a snapshot (not a delta)

