"""Stateful stages with real worker processes (`python -m node graph run`): keyed state
checkpointed through a changelog stream, restored by the worker that takes a partition
over, handed down across a split, and windows closed by a watermark.

The stages run the python engine on the module's LocalCluster, with the operations of
tests/integration/sps_state_ops.py; the processes, the lease watch, the feeder and the
waits are those of tests/integration/test_sps_workers.py. The checks:

1. running totals per key stay exact across a kill -9 (the survivors restore the victim's
   partitions from the changelog), a clean handover (SIGTERM) and a newcomer taking
   partitions over: per key, each output is the total so
   far, every output's count strictly above the previous one (nothing counted twice, no
   total lost), the last equal to the key's inputs;
2. a split of the input while a stage counts: the children start from their parents'
   totals for their keys, so the totals go on across the split, exact;
3. windows by event time with a watermark, `emit: final`, through a kill -9: each window
   closed by the watermark is output exactly once with its exact count; none still open
   is output;
4. result rows the state cannot take (a missing column) go to the dead-letter stream,
   once each, with the error, and the partition goes on: the totals of the others exact.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml

from sms.leases import lease_key
from tests.conftest import wait_until
from tests.integration.sps_state_ops import BAD_EVERY, TS_STEP_MS, seq_of
from tests.integration.test_sps_workers import (BALANCE_S, FAILOVER_S, ROUND_S, STABLE_S, WORKER_START_S, Setup,
                                                balanced, checked_inputs, partition_keys, read_all, sms_cli,
                                                stage_maker, wait_processed)

pytestmark = pytest.mark.integration

OPS = "tests.integration.sps_state_ops"


def write_stateful_graph(path: Path, stage: str, source: str, sink: str, state: dict, operation: str,
                         partitions: int = 4, checkpoint_records: int = 50) -> Path:
    doc = {"streams": {source: {"partitions": partitions}, sink: {"partitions": 2}},
           "stages": {stage: {"inputs": [source], "operation": f"{OPS}:{operation}", "engine": "python",
                              "outputs": [{"stream": sink, "key": "user"}], "recovery": "checkpoint",
                              "checkpoint_records": checkpoint_records, "checkpoint_interval_s": 0.5,
                              "failover_s": FAILOVER_S, "state": state}}}
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def stateful(cluster, tmp_path):
    """make(state, operation, partitions, checkpoint_records) -> Setup of a fresh stateful
    stage (`stage_maker`: `sms graph apply` also creates its changelog), and make.feeder."""
    with stage_maker(cluster, tmp_path, write_stateful_graph, also_created=("changelog",)) as make:
        yield make


def more_inputs(feeder, n: int, after: str) -> None:
    """wait_until the running feeder has written n more records."""
    sent = feeder.count()
    wait_until(lambda: feeder.count() >= sent + n, 60, f"{n} more inputs after {after}")


def all_processed(client, setup: Setup, feeder) -> list:
    """Stop the feeder; the inputs (checked against what it wrote), once all are processed."""
    feeder.stop()
    inputs = checked_inputs(client, setup, feeder)
    wait_processed(client, setup, inputs)
    return inputs


def outputs_by_key(client, setup: Setup) -> dict[str, list[dict]]:
    """The output documents per key, in the order read (per key: SN order, lineage first)."""
    out: dict[str, list[dict]] = defaultdict(list)
    for r in read_all(client, setup.sink):
        out[r.partition_key].append(json.loads(r.data))
    return out


def assert_running_totals(outputs: dict[str, list[dict]], inputs, count_field: str) -> None:
    """Per key: every output's count strictly above the one before (no batch counted twice,
    nothing forgotten and counted again), the last one the key's inputs, and `seq` the
    largest input seq."""
    want = Counter(r.partition_key for r in inputs)
    last_seq: dict[str, int] = {}
    for r in inputs:
        last_seq[r.partition_key] = max(last_seq.get(r.partition_key, -1), seq_of(r.data))
    assert set(outputs) == set(want), (sorted(set(want) - set(outputs))[:3], sorted(set(outputs) - set(want))[:3])
    for key, docs in outputs.items():
        counts = [d[count_field] for d in docs]
        assert all(b > a for a, b in zip(counts, counts[1:])), f"{key}: totals not rising: {counts}"
        assert counts[-1] == want[key], f"{key}: final total {counts[-1]}, inputs {want[key]} (totals {counts})"
        seqs = [d["last"] for d in docs]
        assert seqs[-1] == last_seq[key] and all(b > a for a, b in zip(seqs, seqs[1:])), (key, seqs)


def changelog_positions(setup: Setup) -> dict[str, str]:
    snap = setup.watch.latest()
    return {k: lease.state for k, lease in snap.leases.items()} if snap else {}


# --- 1. running totals across kill -9, a clean handover and a newcomer -----------------------

def test_running_totals_exact_across_kill9_handover_and_newcomer(client, stateful):
    setup = stateful({"key": ["user"], "aggregates": {"count": "count", "total": "sum:n", "last": "max:seq"},
                      "snapshot_every": 4}, "clicks")
    keys = partition_keys(client, setup.source, 3)
    feeder = stateful.feeder(setup.source, keys, per_tick=12).start()
    ids = ["w1", "w2", "w3"]
    for w in ids:
        setup.workers.start(w)
    snap = setup.watch.stable(balanced(4, ids), STABLE_S, BALANCE_S + WORKER_START_S, "3 workers balanced")
    setup.watch.until(lambda s: all(lease.state.isdigit() for lease in s.leases.values()), 60,
                      "every partition to have a snapshot in the changelog")

    victim = max(ids, key=lambda w: (snap.owners()[w], w))
    moved = sorted(k for k, lease in setup.watch.latest().leases.items() if lease.owner == victim)
    setup.workers.kill9(victim)
    survivors = [w for w in ids if w != victim]
    setup.watch.until(lambda s: all(s.leases[k].owner in survivors for k in moved), FAILOVER_S + ROUND_S + 30,
                      f"{victim}'s leases {moved} to move")
    more_inputs(feeder, 300, "the kill")

    # a clean handover: SIGTERM one survivor
    leaving = survivors[0]
    assert setup.workers.stop(leaving) == 0, setup.workers.log(leaving)[-2000:]
    setup.watch.until(lambda s: all(lease.owner == survivors[1] for lease in s.leases.values()), 30,
                      f"{leaving}'s leases to move to {survivors[1]}")
    # a newcomer takes half of them over, restoring their state
    setup.workers.start("w4")
    setup.watch.stable(balanced(4, [survivors[1], "w4"]), STABLE_S, BALANCE_S + WORKER_START_S,
                       "the last survivor and the newcomer balanced")
    more_inputs(feeder, 300, "the newcomer")
    inputs = all_processed(client, setup, feeder)

    outputs = outputs_by_key(client, setup)
    assert_running_totals(outputs, inputs, "count")
    assert all(d["total"] == d["count"] for docs in outputs.values() for d in docs)
    restored = [line for w in (*survivors, "w4") for line in setup.workers.log(w).splitlines() if "restored" in line]
    print(f"\n{len(inputs)} inputs over {len(outputs)} keys, {sum(map(len, outputs.values()))} running totals; "
          f"restores: {len(restored)}, e.g. {restored[:2]}")
    assert restored, "no worker restored state from the changelog"
    assert all(p.isdigit() for p in changelog_positions(setup).values())


# --- 2. a split hands the state down ---------------------------------------------------------

def test_split_hands_state_down_to_the_children(client, stateful):
    setup = stateful({"key": ["user"], "aggregates": {"count": "sum:count", "last": "max:seq"},
                      "snapshot_every": 3}, "batch_counts", partitions=2, checkpoint_records=20)
    keys = partition_keys(client, setup.source, 3, split_halves=True)
    feeder = stateful.feeder(setup.source, keys)
    for w in ("w1", "w2"):
        setup.workers.start(w)
    setup.watch.stable(balanced(2, ["w1", "w2"]), STABLE_S, BALANCE_S + WORKER_START_S, "one lease each")
    feeder.write(240)
    wait_processed(client, setup, checked_inputs(client, setup, feeder))
    info = client.split(setup.source, 0)
    children = sorted(p.ordinal for p in info.partitions if 0 in p.parents)
    feeder.write(360)
    inputs = checked_inputs(client, setup, feeder)
    assert all(any(r.partition_ordinal == c for r in inputs) for c in children)
    wait_processed(client, setup, inputs)

    assert_running_totals(outputs_by_key(client, setup), inputs, "count")
    positions = changelog_positions(setup)
    # (a child's first batch writes what it was handed as a snapshot)
    assert all(positions[lease_key(setup.source, c)].isdigit() for c in children), positions
    assert not setup.watch.order_violations, setup.watch.order_violations[:3]


# --- 3. windows closed by the watermark, output once ------------------------------------------

def test_windows_closed_by_the_watermark_are_output_once_with_exact_counts(client, stateful):
    window_s, watermark_s = 1, 0.5
    setup = stateful({"key": "user", "aggregates": {"clicks": "count", "first": "min:ts"},
                      "window": {"event_time": "ts", "size_s": window_s, "watermark_s": watermark_s},
                      "emit": "final", "snapshot_every": 3}, "timed", partitions=2)
    keys = partition_keys(client, setup.source, 2)
    feeder = stateful.feeder(setup.source, keys, per_tick=10)
    for w in ("w1", "w2"):
        setup.workers.start(w)
    setup.watch.stable(balanced(2, ["w1", "w2"]), STABLE_S, BALANCE_S + WORKER_START_S, "one lease each")
    feeder.start()
    wait_until(lambda: feeder.count() >= 300, 60, "300 inputs")
    setup.workers.kill9("w1")
    setup.watch.until(lambda s: all(lease.owner == "w2" for lease in s.leases.values()), FAILOVER_S + ROUND_S + 30,
                      "w1's lease to move to w2")
    more_inputs(feeder, 300, "the kill")
    inputs = all_processed(client, setup, feeder)

    size, delay = int(window_s * 1000), int(watermark_s * 1000)
    max_ts: dict[int, int] = {}
    windows: Counter = Counter()
    partition_of: dict[tuple, int] = {}
    for r in inputs:
        ts = seq_of(r.data) * TS_STEP_MS
        max_ts[r.partition_ordinal] = max(max_ts.get(r.partition_ordinal, 0), ts)
        windows[(r.partition_key, ts - ts % size)] += 1
        partition_of[(r.partition_key, ts - ts % size)] = r.partition_ordinal
    closed = {w: n for w, n in windows.items() if w[1] + size <= max_ts[partition_of[w]] - delay}
    got = Counter()
    for key, docs in outputs_by_key(client, setup).items():
        for d in docs:
            assert d["window_end"] - d["window_start"] == size and d["first"] >= d["window_start"], d
            got[(key, d["window_start"])] += 1
            assert d["clicks"] == windows[(key, d["window_start"])], (d, windows[(key, d["window_start"])])
    assert set(got) == set(closed), (sorted(set(closed) - set(got))[:3], sorted(set(got) - set(closed))[:3])
    assert set(got.values()) == {1}, [w for w, n in got.items() if n > 1][:3]
    print(f"\n{len(inputs)} inputs, {len(windows)} windows, {len(closed)} closed and output once each, "
          f"{len(windows) - len(closed)} still open")


# --- 4. rows the state cannot take go to the dead letters ---------------------------------------

def test_rows_the_state_cannot_take_are_dead_lettered_and_the_partition_goes_on(cluster, client, stateful):
    setup = stateful({"key": ["user"], "aggregates": {"count": "count", "total": "sum:n", "last": "max:seq"}},
                     "clicks_some_bad", partitions=2)
    keys = partition_keys(client, setup.source, 2)
    feeder = stateful.feeder(setup.source, keys)
    setup.workers.start("w1")
    setup.watch.stable(balanced(2, ["w1"]), STABLE_S, BALANCE_S + WORKER_START_S, "w1 holds both partitions")
    feeder.write(400)
    inputs = checked_inputs(client, setup, feeder)
    wait_processed(client, setup, inputs)

    good = [r for r in inputs if seq_of(r.data) % BAD_EVERY]
    bad = sorted(seq_of(r.data) for r in inputs if not seq_of(r.data) % BAD_EVERY)
    assert_running_totals(outputs_by_key(client, setup), good, "total")
    dead = read_all(client, f"{setup.stage}-dead-letters")
    assert sorted(json.loads(r.data)["seq"] for r in dead) == bad
    assert all(b"no column 'n' for aggregate 'total'" in r.headers["sms-error"] for r in dead), dead[0].headers
    snap = setup.watch.latest()
    assert sum(lease.dead_letters for lease in snap.leases.values()) == len(bad)
    assert "failed; releasing" not in setup.workers.log("w1")     # (the partition was never failed)
    # `sms graph status` names the changelog, each partition's snapshot, and the dead letters
    status = json.loads(sms_cli(cluster, "graph", "status", str(setup.graph), "--json"))
    assert status[0]["changelog"] == f"{setup.stage}-changelog" and status[0]["dead_letters"] == len(bad)
    assert all("state_snapshot" in p for p in status[0]["partitions"]), status[0]["partitions"]
