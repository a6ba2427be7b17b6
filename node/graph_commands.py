"""`sms graph apply | run | status`: stage graphs from the command line.

- apply: creates the graph's streams that do not exist yet (ephemeral ones on the
  `memory` persistence policy) and each stage's dead-letter stream. A stage is a consumer
  group of each of its inputs (sms/consumer.py), named as the stage: its workers need the
  cluster's API only, and a tenant's stages never meet another's;
- run: a worker of one stage, or of several in one process (one Spark session), until SIGTERM / SIGINT (it releases its leases with a
  final checkpoint, so peers resume at once);
- status: per stage and input partition, the lease owner, checkpoint, records done and
  how far behind the partition's newest record it is.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time

from sms import aio, errors, seqno
from sms.consumer import GroupLeases, StreamsLeases
from sms.leases import SHARD_END, LeaseTable
from sps.graph import Graph, StageSpec
from sps.worker import Worker


async def apply_graph(address: str, graph: Graph) -> dict:
    created, registered = [], []
    async with aio.Client(address) as client:
        existing = set(await client.list_streams())
        for s in graph.streams.values():
            if s.name not in existing:
                await client.create_stream(s.name, s.partitions, s.replication_factor, persistence=s.persistence)
                created.append(s.name)
        for name in graph.order():
            for stream in graph.stages[name].inputs + tuple(o.stream for o in graph.stages[name].outputs):
                if stream not in existing and stream not in created:
                    raise errors.StreamNotFound(f"stage {name!r}: stream {stream!r} exists neither in the cluster "
                                                "nor under the graph's streams")
            dead = graph.stages[name].dead_letter_stream
            if dead not in existing and dead not in created:       # (one partition: failures are few)
                await client.create_stream(dead, 1, min(3, len(await _storage_nodes(client))))
                created.append(dead)
            state = graph.stages[name].state
            if state is not None:
                if state.changelog not in existing and state.changelog not in created:
                    # (one partition: a record per batch per input partition)
                    await client.create_stream(state.changelog, 1, min(3, len(await _storage_nodes(client))))
                    created.append(state.changelog)
                # retention keeps what a restore needs: the stage is the changelog's registered
                # consumer, at its oldest snapshot (sps/worker/state.py _protect_changelog); made
                # so on every apply, also of a changelog that existed before
                await client.update_stream(state.changelog, protect_unread=True)
                await client.register_consumer(state.changelog, name)
    # (a stage is a consumer group of each of its inputs, named as the stage: its workers
    # make it when they first run; nothing is kept of it apart from that)
    registered = list(graph.order())
    return {"streams_created": created, "stages_registered": registered}


async def run_stages(address: str, stages: list[StageSpec], worker_id: str | None, master: str) -> dict:
    """One worker of each stage in this process, sharing one engine per kind (one Spark
    session for all of them), until SIGTERM / SIGINT."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("py4j", "grpc"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    engines: dict = {}
    if any(s.engine == "spark" for s in stages):
        from spark_sps.engine import SparkEngine
        engines["spark"] = SparkEngine(master)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    workers = [Worker(address, s, worker_id, engines.get(s.engine), own_engine=False) for s in stages]
    for w in workers:
        print(f"worker {w.worker_id} runs stage {w.stage.name} ({w.stage.engine})", flush=True)
    try:
        runs = [asyncio.ensure_future(w.run(stop)) for w in workers]
        done, _ = await asyncio.wait(runs, return_when=asyncio.FIRST_EXCEPTION)
        stop.set()                       # (one stage failed: the others stop too, releasing their leases)
        await asyncio.gather(*runs, return_exceptions=True)
        for r in runs:
            r.result()
    finally:
        for engine in engines.values():
            engine.close()
    return {"worker": workers[0].worker_id, "stages": [w.stage.name for w in workers],
            "processed": sum(w.processed for w in workers), "micro_batches": sum(w.timings["micro_batches"] for w in workers),
            "lost": sum(w.lost for w in workers), "dead_letters": sum(w.dead_letters for w in workers)}


async def graph_status(address: str, graph: Graph) -> list[dict]:
    out = []
    async with aio.Client(address) as client:
        for name in graph.order():
            inputs = graph.stages[name].inputs
            table = LeaseTable(StreamsLeases(client, inputs, name), name)
            workers = sorted({e.key for stream in inputs
                              for e in (await GroupLeases(client, stream, name).state()).members})
            rows = []
            for lease in sorted((await table.all()).values(), key=lambda lease: (lease.stream, lease.ordinal)):
                rows.append({"partition": f"{lease.stream}/p{lease.ordinal:04d}", "owner": lease.owner or None,
                             "checkpoint": lease.checkpoint, "records": lease.records,
                             "records_per_s": round(lease.rate, 1),
                             "lag_ms": await _lag_ms(client, lease),
                             "lag_records": await _lag_records(client, lease), "failures": lease.failures,
                             "dead_letters": lease.dead_letters, "last_error": lease.last_error or None,
                             **({"state_snapshot": lease.state or None} if graph.stages[name].state else {})})
            out.append({"stage": name, "workers": workers, "partitions": rows,
                        "dead_letter_stream": graph.stages[name].dead_letter_stream,
                        **({"changelog": graph.stages[name].state.changelog} if graph.stages[name].state else {}),
                        "failures": sum(r["failures"] for r in rows),
                        "dead_letters": sum(r["dead_letters"] for r in rows)})
    return out


async def _storage_nodes(client) -> list:
    return [n for n in (await client.describe_cluster()).nodes if "storage" in n.roles]


async def _lag_records(client, lease) -> int | None:
    """Committed records past the stage's checkpoint of the partition (0: none waiting)."""
    try:
        lag = await client.checkpoint_lag(lease.stream, lease.ordinal, lease.checkpoint)
    except errors.SmsError:
        return None
    return None if lag is None else lag[0]


async def _lag_ms(client, lease) -> int | None:
    """How old the oldest record not yet processed is (0: none waiting)."""
    if lease.checkpoint == SHARD_END:
        return 0
    try:
        if lease.checkpoint.isdigit():
            it = await client.get_iterator(lease.stream, lease.ordinal, "AFTER_SEQUENCE_NUMBER",
                                           sequence_number=lease.checkpoint)
        else:
            it = await client.get_iterator(lease.stream, lease.ordinal, lease.checkpoint)
        page = await client.get_next_records(it, max_records=1)
    except errors.SmsError:
        return None
    if not page.records:
        return 0
    return max(0, int(time.time() * 1000) - seqno.timestamp_ms_of(page.records[0].sn))
