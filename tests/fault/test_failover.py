"""Chain failover under load, one trial per fault kind on each metadata backend (the
fast subset of `python -m tests.fault.trials`, which runs several trials per kind and
prints the table). Each trial is a real cluster of separate processes: 2 control
processes, 4 storage nodes, replication factor 3, de-duplicating producers and tailing
consumers; see tests/fault/trials.py for the kinds and the checks."""

from __future__ import annotations

import pytest

from tests.fault import trials
from tests.fault.history import format_table
from tests.zkserver import skip_reason, zk_available

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CASES = [pytest.param(kind, backend, id=f"{backend}-{kind}", marks=trials.case_marks(kind, backend))
         for backend in trials.BACKENDS for kind in trials.KINDS
         if not (kind in trials.ZK_ONLY and backend != "zk")]


@pytest.mark.parametrize("kind,backend", CASES)
def test_fault_trial(kind, backend, tmp_path):
    if backend == "zk" and not zk_available():
        pytest.skip(skip_reason())
    trial = trials.run_trial(kind, backend, str(tmp_path))
    print(format_table([(f"{kind} ({backend})", trial.result)]))
    print(trial.result.summary())
    trial.result.assert_ok()
    assert trial.result.lost == 0 and trial.result.duplicates == 0
    assert trial.result.recoveries and all(r.resumed for r in trial.result.recoveries), trial.result.summary()
    assert trial.healed_s is not None
