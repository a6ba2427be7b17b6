"""Fan-out through header filters, and several stages in one worker, with real SPS worker
processes (`python -m node graph run`) on the module's LocalCluster.

A stage output may carry a `filter` on the output record's headers (sps/filters.py); a
result row's `headers` become the output record's headers (sps/worker/pipeline.py `_emit`), and
each output stream gets exactly the records its filter matches. The operations are in
tests/integration/sps_fanout_ops.py; the processes, the lease watch and the waits are
those of tests/integration/test_sps_workers.py.

1. one stage, 4 input partitions, 2 workers, three outputs (a prefix filter on `region`,
   a numeric filter on `amount`, none): each output stream holds exactly the records its
   filter matches (computed here in plain Python, not with sps.filters), each once, with
   its headers as the operation made them (the input's `trace` header kept);
2. `sms graph apply` refuses a bad filter, naming the stage, the output and the header,
   and creates nothing;
3. one worker process with no `--stage` runs both stages of a chain (in -> a -> mid -> b
   -> out): it says it runs both, both lease tables are its own, and the output is exactly
   once end to end.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from sms import errors
from tests.conftest import stream_name, wait_until
from tests.integration import sps_fanout_ops as ops
from tests.integration.test_sps_workers import (DONE_S, FAILOVER_S, ROOT, WORKER_START_S, LeaseWatch, Setup,
                                                Workers, _env, partition_keys, read_all, sms_cli,
                                                wait_processed)

pytestmark = pytest.mark.integration

OPS = "tests.integration.sps_fanout_ops"
RECORDS = 300
CLI_S = 60.0


def stage_doc(inputs: list[str], operation: str, outputs: list[dict]) -> dict:
    return {"inputs": inputs, "operation": f"{OPS}:{operation}", "engine": "python", "outputs": outputs,
            "recovery": "checkpoint", "checkpoint_records": 50, "checkpoint_interval_s": 0.5,
            "failover_s": FAILOVER_S}


def apply_graph(cluster, path: Path, doc: dict) -> dict:
    path.write_text(yaml.safe_dump(doc))
    return json.loads(sms_cli(cluster, "graph", "apply", str(path), "--json"))


def put_numbered(client, stream: str, keys: list[str], count: int) -> list[tuple[str, bytes, dict]]:
    """Records `KEY:N` (N = 0..count-1, keys round-robin), each with a `trace` header."""
    records = [{"partition_key": keys[n % len(keys)], "data": f"{keys[n % len(keys)]}:{n:05d}".encode(),
                "headers": {"trace": f"t{n}".encode()}} for n in range(count)]
    for i in range(0, count, 500):
        result = client.put_records(stream, records[i:i + 500])
        assert result.failed_record_count == 0, [r for r in result.records if not r.ok][:3]
    return [(r["partition_key"], r["data"], r["headers"]) for r in records]


def as_stored(records) -> Counter:
    """(key, data, sorted headers) of records read back, as a multiset."""
    return Counter((r.partition_key, bytes(r.data), tuple(sorted(r.headers.items()))) for r in records)


@pytest.fixture
def stopping(tmp_path):
    """Workers and lease watches made by a test, all stopped at teardown."""
    made: list = []

    def keep(thing):
        made.append(thing)
        return thing
    try:
        yield keep
    finally:
        for thing in reversed(made):
            if isinstance(thing, Workers):
                thing.stop_all()
            else:
                thing.stop()


# --- 1. fan-out by header filters ------------------------------------------------------------

def is_eu(headers: dict[str, bytes]) -> bool:
    return headers.get("region", b"").startswith(b"eu-")


def is_big(headers: dict[str, bytes]) -> bool:
    amount = headers.get("amount")
    if amount is None or not re.fullmatch(rb"[0-9]+(\.[0-9]+)?", amount):
        return False
    return float(amount) >= 100


def test_outputs_get_exactly_what_their_filters_match(cluster, client, tmp_path, stopping):
    stage, source = stream_name("fan"), stream_name("fan-in")
    eu, big, every = stream_name("eu"), stream_name("big"), stream_name("all")
    graph = tmp_path / "fanout.yaml"
    applied = apply_graph(cluster, graph, {
        "streams": {source: {"partitions": 4}, eu: {"partitions": 2}, big: {"partitions": 2},
                    every: {"partitions": 2}},
        "stages": {stage: stage_doc([source], "tag_region", [
            {"stream": eu, "filter": {"region": [{"prefix": "eu-"}]}},
            {"stream": big, "filter": {"amount": [{"numeric": [">=", 100]}]}},
            {"stream": every}])}})
    assert applied["stages_registered"] == [stage]

    sent = put_numbered(client, source, partition_keys(client, source, 2), RECORDS)
    inputs = read_all(client, source)
    assert len(inputs) == RECORDS and {r.partition_ordinal for r in inputs} == {0, 1, 2, 3}

    workers = stopping(Workers(cluster, graph, stage, tmp_path))
    setup = Setup(stage, source, every, graph, workers, stopping(LeaseWatch(cluster.metastore, stage, source).start()))
    for w in ("w1", "w2"):
        workers.start(w)
    wait_processed(client, setup, inputs, DONE_S + WORKER_START_S)

    outputs = []                   # (the output record as stored, its headers)
    for key, data, headers in sent:
        out_headers = {**headers, **{k: v.encode() for k, v in ops.tags_of(ops.number_of(data)).items()}}
        outputs.append(((key, data, tuple(sorted(out_headers.items()))), out_headers))
    want = {every: Counter(r for r, _h in outputs),
            eu: Counter(r for r, h in outputs if is_eu(h)),
            big: Counter(r for r, h in outputs if is_big(h))}
    # (the data covers each filter both ways, and the numeric bound itself)
    assert 0 < sum(want[eu].values()) < RECORDS and 0 < sum(want[big].values()) < RECORDS
    assert any(dict(r[2]).get("amount") == b"100" for r in want[big])
    for stream, expected in want.items():
        got = as_stored(read_all(client, stream))
        missing, extra = expected - got, got - expected
        assert not missing and not extra, (
            f"{stream}: {sum(missing.values())} missing (e.g. {list(missing)[:2]}), {sum(extra.values())} extra or "
            f"duplicated (e.g. {list(extra.items())[:2]})")
    print(f"\n{RECORDS} inputs -> all {sum(want[every].values())}, eu {sum(want[eu].values())}, "
          f"big {sum(want[big].values())}")


# --- 2. a bad filter is refused by name ------------------------------------------------------

@pytest.mark.parametrize("bad_filter, header, says", [
    ({"amount": [{"numeric": [">=", "100"]}]}, "amount", "numeric needs"),
    ({"region": [{"regex": "eu-.*"}]}, "region", "unknown condition 'regex'"),
    ({"kind": []}, "kind", "non-empty list of conditions"),
])
def test_apply_refuses_a_bad_filter_by_name(cluster, client, tmp_path, bad_filter, header, says):
    stage, source, good, bad = stream_name("refused"), stream_name("r-in"), stream_name("r-ok"), stream_name("r-bad")
    graph = tmp_path / "bad-filter.yaml"
    graph.write_text(yaml.safe_dump({
        "streams": {source: {"partitions": 1}, good: {"partitions": 1}, bad: {"partitions": 1}},
        "stages": {stage: stage_doc([source], "tag_region", [{"stream": good}, {"stream": bad, "filter": bad_filter}])}}))
    proc = subprocess.run([sys.executable, "-m", "node", "graph", "apply", str(graph), "--address", cluster.address],
                          cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=CLI_S)
    assert proc.returncode != 0, f"a bad filter was applied:\n{proc.stdout}"
    message = proc.stderr.strip()
    assert message.startswith("error: InvalidGraph: "), message
    for part in (f"stage {stage!r}", f"output 1 ({bad})", f"header {header!r}", says):
        assert part in message, f"{part!r} not in {message!r}"
    for stream in (source, good, bad, f"{stage}-dead-letters"):        # nothing was created
        with pytest.raises(errors.StreamNotFound):
            client.get_stream_info(stream)


# --- 3. one worker runs every stage of a chain -------------------------------------------------

class AllStages(Workers):
    """Workers of every stage of the graph: `graph run` without --stage."""

    def start(self, worker_id: str, env: dict[str, str] | None = None, master: str = "local[1]") -> None:
        with open(self.log_path(worker_id), "wb") as log:
            self.procs[worker_id] = subprocess.Popen(
                [sys.executable, "-m", "node", "graph", "run", str(self.graph), "--worker-id", worker_id,
                 "--address", self.cluster.address],
                cwd=ROOT, env=_env(env), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)


def test_one_worker_runs_both_stages_of_a_chain(cluster, client, tmp_path, stopping):
    a, b = stream_name("a"), stream_name("b")
    source, mid, sink = stream_name("chain-in"), stream_name("chain-mid"), stream_name("chain-out")
    graph = tmp_path / "chain.yaml"
    applied = apply_graph(cluster, graph, {
        "streams": {source: {"partitions": 2}, mid: {"partitions": 3}, sink: {"partitions": 2}},
        "stages": {a: stage_doc([source], "tag_region", [{"stream": mid}]),
                   b: stage_doc([mid], "mark_b", [{"stream": sink}])}})
    assert sorted(applied["stages_registered"]) == sorted([a, b])

    sent = put_numbered(client, source, partition_keys(client, source, 2), RECORDS)
    inputs = read_all(client, source)
    workers = stopping(AllStages(cluster, graph, None, tmp_path))
    watch_a = stopping(LeaseWatch(cluster.metastore, a, source).start())
    watch_b = stopping(LeaseWatch(cluster.metastore, b, mid).start())
    workers.start("w-all")
    wait_until(lambda: all(f"worker w-all runs stage {s} (python)" in workers.log("w-all") for s in (a, b)),
               WORKER_START_S, f"the worker to say it runs stages {a} and {b}")

    snap_a = wait_processed(client, Setup(a, source, mid, graph, workers, watch_a), inputs, DONE_S)
    middle = read_all(client, mid)
    assert len(middle) == RECORDS
    snap_b = wait_processed(client, Setup(b, mid, sink, graph, workers, watch_b), middle, DONE_S)
    assert set(snap_a.owners()) == {"w-all"} and set(snap_b.owners()) == {"w-all"}, (snap_a.owners(),
                                                                                       snap_b.owners())

    want = Counter((key, data + b"|b") for key, data, _headers in sent)
    got = Counter((r.partition_key, bytes(r.data)) for r in read_all(client, sink))
    missing, extra = want - got, got - want
    assert not missing and not extra, (
        f"{sink}: {sum(missing.values())} missing (e.g. {list(missing)[:2]}), {sum(extra.values())} extra or "
        f"duplicated (e.g. {list(extra.items())[:2]})")
    # (stage b's rows have no headers: stage a's do not leak through)
    assert all(not r.headers for r in read_all(client, sink))

    assert workers.stop("w-all") == 0, workers.log("w-all")[-3000:]
    assert f"worker w-all stopped: {2 * RECORDS} records processed" in workers.log("w-all"), \
        workers.log("w-all")[-3000:]
