"""De-duplication under lost requests, lost acks, resends and head restarts (kill -9 too).

A hypothesis state machine drives producer sessions on the wire (`RawSession`) against
one dedicated cluster, a fresh stream per example. Producers send their next SSSNs, lose
requests (never sent), lose acks (the answer is dropped, or never awaited: a deadline
of a few milliseconds abandons the call while the node goes on with it), resend what is
unacked in any order and with repeats, advance their HWM from the acks they hold, and
now and then the head (and ingestion owner) of a partition restarts, cleanly or after
SIGKILL. The model is the history checker: it keeps every answer and, for each record,
the first request that carried it and the first that acknowledged it.

After each step (cheap, no I/O): no record was ever named under two SNs, no SN under two
records, an SN 0 only on a duplicate, and the SSSNs reported missing were never acked
while the ones never sent are reported. At the end of each example every unacked record
is resent until acked, then, read back from storage: each submitted (producer, SSSN) is
stored exactly once and nothing else is; every SN any answer named is the stored SN;
and each session's storage order agrees with the order it was sent in. Strict SSSN order
cannot hold here (a lost request is stored after the later SSSNs that overtook it, by
design: the node reports it missing and does not hold the others back), so the check is
the one the history allows: if record r is stored before record s of the same session,
r was sent no later than s was first acknowledged. Strict SSSN order, with retries and
kill -9 but no lost requests, is checked in tests/integration/test_dedup.py.

Shrinking is off: each replay runs against real processes; a failure prints its whole
step sequence, and the run is derandomized (tests/conftest.py), so it replays as is.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

import sms
from sms import errors
from node.launcher import LocalCluster
from tests.conftest import read_partition, stream_name
from tests.integration.session_wire import (Answer, Channels, RawSession, Submit, cumulative_hwm, key_for_ordinal,
                                            now_ms, stored_session_records)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PRODUCERS = (b"producer-a", b"producer-b", b"producer-c")
PARTITIONS = 2
SESSIONS = tuple((pid, o) for pid in PRODUCERS for o in range(PARTITIONS))
RESTARTS_PER_EXAMPLE_MAX = 2
SETTLE_TIMEOUT_S = 60.0          # teardown: an unacked record is acked by then
ABANDON_TIMEOUT_S = 0.005        # a call given up on this early loses its ack in flight
RETRIABLE_ON_THE_WIRE = {"Unavailable", "Timeout", "WrongOwner", "PartitionClosed", "StaleEpoch"}


@dataclass
class SessionModel:
    """What one producer session (producer, partition) did and was told."""

    records: dict[int, Submit] = field(default_factory=dict)        # sssn -> the record as first made
    next_sssn: int = 0
    hwm: int = -1                                                    # the HWM it sends
    acked: dict[int, int] = field(default_factory=dict)              # sssn -> SN (0: pruned duplicate)
    first_sent: dict[int, int] = field(default_factory=dict)         # sssn -> first attempt carrying it
    first_acked: dict[int, int] = field(default_factory=dict)        # sssn -> first attempt acking it
    named: dict[int, set[int]] = field(default_factory=lambda: collections.defaultdict(set))

    @property
    def unacked(self) -> list[int]:
        return sorted(s for s in self.records if s not in self.acked)

    def resendable(self) -> list[int]:
        """Unacked records, and acked ones above the HWM (a producer may resend those)."""
        return sorted(s for s in self.records if s not in self.acked or s > self.hwm)


class DedupRestartMachine(RuleBasedStateMachine):
    cluster: LocalCluster | None = None       # set by the test function
    client: sms.Client | None = None
    totals: collections.Counter = collections.Counter()    # what the examples did, over the run

    def __init__(self) -> None:
        super().__init__()
        self.stream = stream_name("dedup-fault")
        self.client.create_stream(self.stream, partitions=PARTITIONS, replication_factor=3)
        self.channels = Channels()
        self.wire = {pid: RawSession(self.client, self.stream, pid, channels=self.channels) for pid in PRODUCERS}
        info = self.wire[PRODUCERS[0]].info
        self.keys = {(pid, o): key_for_ordinal(info, o, pid.decode()) for pid, o in SESSIONS}
        self.model = {sess: SessionModel() for sess in SESSIONS}
        self.attempts = 0
        self.restarts = 0
        self.sn_owner: dict[int, tuple[bytes, int, int]] = {}        # SN -> (producer, partition, sssn)

    # --- sending -------------------------------------------------------------------------
    def _new_records(self, sess, n: int) -> list[Submit]:
        m = self.model[sess]
        out = []
        for _ in range(n):
            s = m.next_sssn
            m.next_sssn += 1
            m.records[s] = Submit(s, self.keys[sess], f"{sess[0].decode()}/{sess[1]}/{s}".encode(), now_ms())
            out.append(m.records[s])
        return out

    def _send(self, sess, sssns: list[int], *, keep_answer: bool = True, timeout_s: float | None = None) -> None:
        """One attempt: a PutRecords of these SSSNs of one session with its current HWM."""
        pid, ordinal = sess
        m = self.model[sess]
        self.attempts += 1
        attempt = self.attempts
        for s in sssns:
            m.first_sent.setdefault(s, attempt)
        batch = [m.records[s] for s in sssns]
        hwm = m.hwm
        acked_before = set(m.acked)
        never_sent_before = {s for s in m.records if s not in m.first_sent or m.first_sent[s] == attempt}
        try:
            answer = self.wire[pid].put(batch, {ordinal: hwm},
                                        **({"timeout_s": timeout_s} if timeout_s is not None else {}))
        except errors.SmsError as e:
            # the request or its answer was lost on the way; a bad request would not be retriable
            assert e.retriable, f"{sess}: request of SSSNs {sssns} rejected whole: {e.name}: {e.message}"
            self.wire[pid].refresh()
            return
        self._check_answer(sess, batch, answer, hwm, acked_before, never_sent_before - set(sssns))
        if keep_answer:
            for r, a in zip(batch, answer.acks):
                if a.ok and r.sssn not in m.acked:
                    m.acked[r.sssn] = a.sn
                    m.first_acked[r.sssn] = attempt
                elif a.ok and a.sn and not m.acked[r.sssn]:
                    m.acked[r.sssn] = a.sn                # an SN for a record acked as pruned before

    def _check_answer(self, sess, batch: list[Submit], answer: Answer, hwm: int, acked_before: set[int],
                      never_sent: set[int]) -> None:
        """Every answer, kept or dropped by the producer, is checked against the history."""
        pid, ordinal = sess
        m = self.model[sess]
        for r, a in zip(batch, answer.acks):
            assert a.ordinal == ordinal, f"{sess} SSSN {r.sssn} routed to p{a.ordinal}"
            if not a.ok:
                assert a.error_name in RETRIABLE_ON_THE_WIRE, \
                    f"{sess} SSSN {r.sssn}: {a.error_name}: {a.error_message}"
                continue
            assert a.sn or a.duplicate, f"{sess} SSSN {r.sssn}: acked with SN 0 yet not a duplicate"
            assert a.sn or r.sssn <= hwm, f"{sess} SSSN {r.sssn}: SN 0 above the HWM {hwm}"
            if a.sn:
                m.named[r.sssn].add(a.sn)
                owner = self.sn_owner.setdefault(a.sn, (pid, ordinal, r.sssn))
                assert owner == (pid, ordinal, r.sssn), f"SN {a.sn} named for {owner} and for {sess} {r.sssn}"
        missing = set(answer.missing.get(ordinal, ()))
        assert set(answer.missing) <= {ordinal}, f"{sess}: missing SSSNs of other partitions {answer.missing}"
        assert not missing & acked_before, f"{sess}: acked SSSNs {sorted(missing & acked_before)} reported missing"
        top = max(r.sssn for r in batch)
        expected = {s for s in never_sent if hwm < s < top}
        if any(a.ok for a in answer.acks):
            # (a batch refused whole before the dedup table saw it -- WrongOwner from a node
            # that just lost the partition, a table still rebuilding -- reports nothing missing)
            assert expected <= missing, f"{sess}: SSSNs never sent {sorted(expected - missing)} not reported missing"

    # --- rules ------------------------------------------------------------------------------
    @rule(sess=st.sampled_from(SESSIONS), n=st.integers(1, 4))
    def send_next(self, sess, n):
        self.totals["send_next"] += 1
        self._send(sess, [r.sssn for r in self._new_records(sess, n)])

    @rule(sess=st.sampled_from(SESSIONS), n=st.integers(1, 3))
    def lose_request(self, sess, n):
        self.totals["lose_request"] += 1
        self._new_records(sess, n)                     # made, never sent: unacked

    @rule(sess=st.sampled_from(SESSIONS), n=st.integers(1, 3), abandon=st.booleans())
    def lose_ack(self, sess, n, abandon):
        self.totals["lose_ack_abandoned" if abandon else "lose_ack_dropped"] += 1
        self._send(sess, [r.sssn for r in self._new_records(sess, n)], keep_answer=False,
                   timeout_s=ABANDON_TIMEOUT_S if abandon else None)

    @precondition(lambda self: any(m.resendable() for m in self.model.values()))
    @rule(data=st.data())
    def resend(self, data):
        self.totals["resend"] += 1
        sess = data.draw(st.sampled_from([s for s in SESSIONS if self.model[s].resendable()]), label="session")
        pool = self.model[sess].resendable()
        sssns = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=6), label="sssns")  # any order, repeats
        self._send(sess, sssns)

    @rule(sess=st.sampled_from(SESSIONS))
    def advance_hwm(self, sess):
        self.totals["advance_hwm"] += 1
        m = self.model[sess]
        m.hwm = cumulative_hwm(m.acked, m.hwm)

    @precondition(lambda self: self.restarts < RESTARTS_PER_EXAMPLE_MAX)
    @rule(ordinal=st.integers(0, PARTITIONS - 1), kill=st.booleans())
    def restart_head(self, ordinal, kill):
        self.restarts += 1
        self.totals["kill_9_and_restart" if kill else "restart"] += 1
        head = self.client.get_stream_info(self.stream).partition(ordinal).ingestion_owner
        assert head is not None, f"p{ordinal} has no ingestion owner"
        if kill:
            self.cluster.kill(head.node_id)
        self.cluster.restart(head.node_id)
        for wire in self.wire.values():
            wire.refresh()

    # --- invariants -------------------------------------------------------------------------
    @invariant()
    def answers_agree(self):
        for sess, m in self.model.items():
            twice = {s: sns for s, sns in m.named.items() if len(sns) > 1}
            assert not twice, f"{sess}: SSSNs acked under several SNs: {twice}"
            assert m.hwm == -1 or all(s in m.acked for s in range(m.hwm + 1)), f"{sess}: HWM {m.hwm} above its acks"

    def teardown(self):
        try:
            self._settle_and_check()
        finally:
            for wire in self.wire.values():
                wire.close()
            self.channels.close()

    def _settle_and_check(self) -> None:
        self.totals["examples"] += 1
        self.totals["records"] += sum(len(m.records) for m in self.model.values())
        self.totals["unacked_at_teardown"] += sum(len(m.unacked) for m in self.model.values())
        for sess, m in self.model.items():
            pid, ordinal = sess
            if not m.unacked:
                continue
            self.attempts += 1
            batch = [m.records[s] for s in m.unacked]
            for r in batch:
                m.first_sent.setdefault(r.sssn, self.attempts)
            settled = self.wire[pid].put_until_settled(batch, {ordinal: m.hwm}, timeout_s=SETTLE_TIMEOUT_S)
            for answer in settled.answers:
                self._check_answer(sess, batch, answer, m.hwm, set(m.acked), set())
            for r, a in zip(batch, settled.answer.acks):
                assert a.ok, f"{sess} SSSN {r.sssn}: {a.error_name}: {a.error_message}"
                m.acked[r.sssn] = a.sn
                m.first_acked[r.sssn] = self.attempts
        self.answers_agree()

        stored = {o: stored_session_records(read_partition(self.client, self.stream, o)) for o in range(PARTITIONS)}
        for o, rows in stored.items():
            counts = collections.Counter((r.producer_id, r.sssn) for r in rows)
            twice = sorted(k for k, n in counts.items() if n > 1)
            assert not twice, f"p{o}: stored more than once: {twice[:10]}"
            for r in rows:
                m = self.model.get((r.producer_id, o))
                assert m is not None and r.sssn in m.records, f"p{o}: stored {r.producer_id!r} {r.sssn} never sent"
                assert (r.key, r.data) == (m.records[r.sssn].key, m.records[r.sssn].data), f"p{o} {r}: other bytes"
        for sess, m in self.model.items():
            pid, ordinal = sess
            rows = [r for r in stored[ordinal] if r.producer_id == pid]
            stored_sn = {r.sssn: r.sn for r in rows}
            assert stored_sn.keys() == m.records.keys(), \
                f"{sess}: SSSNs submitted but not stored: {sorted(m.records.keys() - stored_sn.keys())}"
            wrong = {s: (sns, stored_sn[s]) for s, sns in m.named.items() if sns != {stored_sn[s]}}
            assert not wrong, f"{sess}: answers named other SNs than the stored ones (named, stored): {wrong}"
            # storage order agrees with the history: r stored before s => r sent no later than s acked
            latest_sent, latest_sssn = 0, None
            for r in rows:
                assert latest_sent <= m.first_acked[r.sssn], (
                    f"{sess}: SSSN {r.sssn} (acked at attempt {m.first_acked[r.sssn]}) stored after SSSN "
                    f"{latest_sssn}, first sent at attempt {latest_sent}; storage order {[x.sssn for x in rows]}")
                if m.first_sent[r.sssn] > latest_sent:
                    latest_sent, latest_sssn = m.first_sent[r.sssn], r.sssn


def test_dedup_holds_across_lost_requests_lost_acks_resends_and_head_restarts(make_cluster):
    local = make_cluster()
    with sms.Client(local.address) as client:
        DedupRestartMachine.cluster, DedupRestartMachine.client = local, client
        DedupRestartMachine.totals.clear()
        try:
            run_state_machine_as_test(DedupRestartMachine, settings=settings(
                max_examples=8, stateful_step_count=25, deadline=None,
                phases=(Phase.explicit, Phase.reuse, Phase.generate),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
        finally:
            DedupRestartMachine.cluster = DedupRestartMachine.client = None
    totals = DedupRestartMachine.totals
    print(f"dedup fault run: {dict(totals)}")
    # the run is derandomized: make sure it exercised every fault it claims to
    for what in ("restart", "kill_9_and_restart", "lose_request", "lose_ack_dropped", "lose_ack_abandoned",
                 "resend", "advance_hwm"):
        assert totals[what] >= 1, f"no example ran {what}: {dict(totals)}"
    assert totals["unacked_at_teardown"] >= 1, "no example left records to resend at teardown"
