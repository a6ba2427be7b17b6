"""An SPS worker: one stage's member in a process (a process may run several stages, each
its own Worker sharing one engine), a peer of the stage's other workers.

The stage is a consumer group, named as the stage, of each of its inputs (sms/consumer.py,
kept by the cluster: control/groups.py). Each round (a third of the stage's failover
time, and whenever a partition ends) the worker writes its member heartbeat, makes sure
the lease table has an entry per input partition (from `get_stream_info`: at start, at
the end of a partition, and every SPS_PARTITION_REFRESH_S), and claims, takes, renews
and releases leases (`sms/leases.py`).

The leases it holds are processed together, in micro-batches (`_micro_batches`):

    read each partition's next batch (up to checkpoint_records records or
        checkpoint_interval_s seconds), ahead, while the previous micro-batch is processed
    -> write each lease: checkpoint = its previous batch's end, pending_end = this batch's end
    -> apply the stage's operation to every partition's batch in one engine call (Spark:
       one job, Arrow in and out; each output row is known to come from one partition)
    -> write each partition's outputs (sps/output.py: SSSNs from its batch's input
       position) and wait for them
    -> the next micro-batch (its lease writes checkpoint this one)

A worker that takes a lease over first replays exactly its pending batch, so its outputs
are the same records under the same SSSNs, which ingestion answers as duplicates: each
output lands once (`checkpoint` recovery), whatever the other partitions of the
micro-batch. Every lease write is conditional on the version this worker last saw: when
one fails (a peer took the lease: this worker was paused past the failover time) the
partition leaves the micro-batch at once, before its outputs are written. At a closed
partition's end the lease gets SHARD_END and the children become claimable. `best_effort`
starts at LATEST and writes no progress.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import Counter

from sms import aio, limits
from sms.consumer import Membership
from sms.leases import ExpiryClock, LeaseTable
from sps.engine import Engine, PythonEngine
from sps.graph import StageSpec, resolve
from sps.worker.parts import Owned, Step
from sps.worker.pipeline import MicroBatches, _headers, output_producer_id
from sps.worker.rounds import LeaseRounds
from sps.worker.state import StatefulStage

__all__ = ["Owned", "Step", "Worker", "_headers", "output_producer_id", "run_worker"]


class Worker(LeaseRounds, MicroBatches, StatefulStage):
    """One stage's member in a process: its rounds (rounds.py), its micro-batches
    (pipeline.py) and, for a stateful stage, its keyed state (state.py)."""

    def __init__(self, address: str, stage: StageSpec, worker_id: str | None = None,
                 engine: Engine | None = None, client_options: dict | None = None, *, own_engine: bool = True):
        self.address = address
        self.client_options = client_options or {}
        self.stage = stage
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.engine = engine or PythonEngine()
        self.own_engine = own_engine                 # close it when the worker stops (not when shared)
        self.operation = resolve(stage.operation, f"stage {stage.name!r} operation")
        self.sink = resolve(stage.sink, f"stage {stage.name!r} sink") if stage.sink else None
        self.table: LeaseTable | None = None       # the stage's group on each input (set by run)
        self.membership: Membership | None = None
        self.clock = ExpiryClock(stage.failover_s)
        self.owned: dict[str, Owned] = {}
        self.client: aio.Client | None = None
        self._wake = asyncio.Event()                 # the round: a partition ended or failed
        self._work = asyncio.Event()                 # the micro-batch loop: a lease was claimed
        self._refresh_at = 0.0
        self._protect_at = 0.0
        self._writing: asyncio.Task | None = None    # the last micro-batch's outputs being written
        self.processed = 0
        self.timings: Counter = Counter()            # seconds in each phase of the micro-batches, and counts
        self._report_at = time.monotonic() + limits.SPS_REPORT_S
        self.lost = 0
        self.trimmed_skips = 0                       # reads that found records trimmed before they were processed
        self.dead_letters = 0
        self._backoff: dict[str, tuple[float, float]] = {}   # lease key -> (claim again after, last backoff)


async def run_worker(address: str, stage: StageSpec, worker_id: str | None = None,
                     engine: Engine | None = None, stop: asyncio.Event | None = None) -> Worker:
    worker = Worker(address, stage, worker_id, engine)
    await worker.run(stop or asyncio.Event())
    return worker

