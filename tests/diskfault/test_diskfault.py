"""Disk faults on a cluster on a real ZooKeeper (tests/diskfault/trials.py): one trial of
each kind -- a storage node's disk fills (ENOSPC, StorageFull) and a storage node's disk
fails an fsync (EIO, StorageFailed fence) -- each on a fresh cluster under
de-duplicating producers and a tailing consumer, checked by the fault trials' history
checker. Marked slow and sweep (`make test-full`): DISK_TRIALS (default 5) trials of each
kind and their table (`pytest -s -m slow tests/diskfault`). Everything skips with the reason when it cannot
run here: not root, no ZooKeeper (java and Debian's zookeeper), and for fsync_fails no
FUSE (/dev/fuse, fuse3, mfusepy). The ZooKeeper server is shared by the module's trials;
each cluster has a prefix of its own."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.diskfault import trials
from tests.netfault.trials import Trial

pytestmark = pytest.mark.integration

DISK_TRIALS_DEFAULT = 5


@pytest.fixture(scope="module")
def zk_for(tmp_path_factory) -> Iterator:
    """kind -> the module's ZooKeeper server (started on first use), or a skip with the
    reason trials of that kind cannot run here."""
    from tests.zkserver import ZkServer
    servers: list[ZkServer] = []

    def get(kind: str) -> ZkServer:
        reason = trials.skip_reason(kind)
        if reason:
            pytest.skip(reason)
        if not servers:
            servers.append(ZkServer(tmp_path_factory.mktemp("zk")).start())
        return servers[0]
    try:
        yield get
    finally:
        for server in servers:
            server.stop()


def _assert_passed(trial: Trial) -> None:
    r = trial.result
    assert r.ok, f"{trial.kind} seed {trial.seed} (logs in {trial.directory}): {r.summary()}"
    assert r.lost == 0 and r.duplicates == 0 and r.reader_anomalies == 0, r.summary()
    assert r.recoveries and all(x.resumed for x in r.recoveries), r.summary()
    assert trial.max_gap_s is not None, f"{trial.kind}: a partition of the victim never acked after the heal"


@pytest.mark.parametrize("kind", trials.KINDS)
def test_disk_fault_trial(kind, tmp_path, zk_for):
    zk = zk_for(kind)
    trial = trials.run_trial(kind, str(tmp_path), seed=0, zk=zk)
    print()
    print(trials.tables([trial]))
    print(trials.describe(trial))
    print(trial.result.summary())
    _assert_passed(trial)


@pytest.mark.slow
@pytest.mark.sweep          # (`make test` runs each kind once, above; `make test-full` the table)
def test_disk_fault_table(tmp_path, zk_for):
    """DISK_TRIALS trials of each kind that can run here; the tables."""
    count = int(os.environ.get("DISK_TRIALS", DISK_TRIALS_DEFAULT))
    runnable = [k for k in trials.KINDS if trials.skip_reason(k) is None]
    if not runnable:
        pytest.skip(trials.skip_reason(trials.KINDS[0]))
    zk = zk_for(runnable[0])
    done: list[Trial] = []
    failed: list[str] = []
    for kind in runnable:
        for seed in range(count):
            directory = tmp_path / f"{kind}-{seed}"
            try:
                trial = trials.run_trial(kind, str(directory), seed=seed, zk=zk)
            except Exception as e:          # a trial that could not finish: the others still run
                failed.append(f"{kind} seed {seed}: {e!r} (logs in {directory})")
                continue
            done.append(trial)
            print(f"{kind:<12} #{seed}: {trials.describe(trial)}", flush=True)
            try:
                _assert_passed(trial)
            except AssertionError as e:
                failed.append(str(e))
    print()
    print(trials.tables(done))
    skipped = [f"{k}: {trials.skip_reason(k)}" for k in trials.KINDS if k not in runnable]
    if skipped:
        print("not run here:", "; ".join(skipped))
    assert not failed, "\n".join(failed)
