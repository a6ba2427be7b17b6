"""Per-partition de-duplication of producer submissions (DESIGN section 6).

A `DedupTable` is an ingestion node's memory of what each producer session sent to one
partition: per session (producer id), the entries above the producer's ack high-water
mark (HWM) with their signature, state and SN, plus the dedup keys seen within the
stream's dedup window. It is protocol logic only: submissions and write outcomes in,
decisions out; no I/O, no asyncio, the clock passed in as `now_ms`. `ingestion/service.py`
binds it to PutRecords: it calls `submit` per record, writes the records answered WRITE
through its `PartitionWriter`, reports each write's outcome with `committed` / `failed`
and resolves the tickets those return, calls `prune` every `DEDUP_PRUNE_INTERVAL_MS`, and
feeds `rebuild` the dedup window read back from storage (the session fields travel with
every record as wire meta TAG_PRODUCER_ID / TAG_SSSN / TAG_DEDUP_KEY) before it accepts
writes for a partition it starts or takes over.

The session fields of a submission:
- `producer_id`: names the session (one per producer and partition);
- `sssn`: the session-specific sequence number, 0, 1, 2, ... per session;
- `hwm`: cumulative ack high-water mark: the producer holds an ack for this SSSN and for
  every SSSN below it, and will never resend them (`HWM_NONE` = -1: no ack yet);
- `submit_ms`: the producer's clock when it first sent the record; retries carry the
  same value, which is what lets the table forget an entry once the window has passed;
- `signature`: a digest of the record (partition key and data) that the ingestion node
  computes itself, never taken from the wire; a retry must have the same one;
- `dedup_key`: optional, de-duplicates across sessions within the window (like NATS
  `Nats-Msg-Id`): a second record with a key already written is acknowledged with the
  SN of the first and not stored, whatever its data.

Caller contract: every WRITE (a `Decision` or a promoted `Resolution`) is followed by
exactly one `committed()` or `failed()` for the same (producer_id, sssn); every QUEUED
ticket is resolved by a later `Resolution` (DUPLICATE, or WRITE when the write it waited
on failed). An SSSN at or below the session's HWM that the table no longer holds is
answered DUPLICATE with `sn=None`: the record is stored (the producer said so) but its SN
was pruned; it is never stored again.

Policies: only `at_least_once_no_dup` keeps a table. `at_least_once_dup_permitted` and
`best_effort` answer every well-formed submission WRITE (no window, so nothing is stale)
and keep nothing but counters.

One lapse across a rebuild: a record answered DUPLICATE because of its dedup key is not
stored, so a rebuilt table knows it only through the first record's key; a retry of it
that arrives after that key has left the window, yet within its own, is written as a
record of its own (and acked with its own SN).
"""

from __future__ import annotations

import enum
import itertools
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, cast

from sortedcontainers import SortedDict

from sms.errors import SmsError, invariant
from sms.seqno import COUNTER_UNIT
from sms.types import IngestionPolicy

# Limits and errors are defined in sms/; re-exported here for the table's callers.
from sms.limits import (  # noqa: F401
    DEDUP_WINDOW_MS_DEFAULT,
    DEDUP_WINDOW_MS_MIN,
    DEDUP_WINDOW_MS_MAX,
    DEDUP_CLOCK_SKEW_MS_MAX,
    DEDUP_KEY_BYTES_MAX,
    PRODUCER_ID_BYTES_MAX,
    SESSION_KEY_BYTES_MAX,
    DEDUP_SIGNATURE_BYTES_MAX,
    SSSN_MAX,
    DEDUP_SESSIONS_PER_PARTITION_MAX,
    DEDUP_ENTRIES_PER_SESSION_MAX,
    DEDUP_KEYS_PER_PARTITION_MAX,
    DEDUP_WAITERS_PER_ENTRY_MAX,
    DEDUP_MISSING_SSSNS_MAX,
    DEDUP_PRUNE_INTERVAL_MS,
)

HWM_NONE = -1                                  # the producer holds no ack yet


# --- errors (each leaves the table unchanged; the session stays usable) -----------------
from sms.errors import (  # noqa: F401
    StaleSubmission,
    SubmissionInFuture,
    InvalidDedupKey,
    DedupKeyTooLarge,
    InvalidSession,
    InvalidProducerId,
    InvalidSssn,
    InvalidHwm,
    SessionConflict,
    TableFull,
)


# --- decisions --------------------------------------------------------------------------
class DecisionKind(enum.Enum):
    WRITE = "WRITE"            # write the record; report committed() or failed()
    DUPLICATE = "DUPLICATE"    # already stored (under `sn`, None if pruned): do not store
    QUEUED = "QUEUED"          # the same record is being written: wait for `ticket`


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one submission."""

    kind: DecisionKind
    sn: int | None = None              # DUPLICATE: the SN the record was stored under
    ticket: int | None = None          # QUEUED: resolved later by a Resolution
    missing: tuple[int, ...] = ()      # SSSNs in (HWM, sssn) this table holds nothing for


@dataclass(frozen=True, slots=True)
class Resolution:
    """What became of a QUEUED ticket: DUPLICATE (with the SN) or WRITE (write it now)."""

    ticket: int
    kind: DecisionKind
    producer_id: bytes
    sssn: int
    sn: int | None = None


class StoredRecord(NamedTuple):
    """The session fields of one stored record, as `rebuild` reads them back."""

    producer_id: bytes
    sssn: int
    dedup_key: bytes | None
    signature: bytes
    sn: int
    arrival_ms: int


_WRITE_UNTRACKED = Decision(DecisionKind.WRITE)
_WRITE_TRACKED = Decision(DecisionKind.WRITE)


# --- entries ----------------------------------------------------------------------------
class EntryState(enum.Enum):
    PENDING = "PENDING"        # its write is in flight; retries and key twins queue on it
    WAITING = "WAITING"        # its dedup key is being written by another entry
    COMMITTED = "COMMITTED"    # stored under `sn`; retries are duplicates
    FAILED = "FAILED"          # its write failed; gone from every index at once


# None: not yet in the table. COMMITTED leaves only by pruning, FAILED at once.
_TRANSITIONS: dict[EntryState | None, frozenset[EntryState]] = {
    None: frozenset({EntryState.PENDING, EntryState.WAITING, EntryState.COMMITTED}),
    EntryState.PENDING: frozenset({EntryState.COMMITTED, EntryState.FAILED}),
    EntryState.WAITING: frozenset({EntryState.PENDING, EntryState.COMMITTED}),
    EntryState.COMMITTED: frozenset(),
    EntryState.FAILED: frozenset(),
}


@dataclass(slots=True, eq=False)
class _Waiter:
    """A QUEUED submission, with what it takes to write it if it is promoted."""

    ticket: int
    producer_id: bytes
    sssn: int
    signature: bytes
    dedup_key: bytes | None
    expires_ms: int


@dataclass(slots=True, eq=False)
class _Entry:
    producer_id: bytes
    sssn: int
    signature: bytes
    dedup_key: bytes | None
    expires_ms: int                    # a retry is stale after this, so it may be forgotten
    state: EntryState | None = None
    sn: int | None = None
    waiters: deque[_Waiter] | tuple[()] = ()   # only while PENDING (a deque once one queues: most never do)


RUN_SIGNATURE_BYTES = 16               # a run's signatures are this long each (wire.signature)


@dataclass(slots=True, eq=False)
class _Run:
    """Fresh consecutive SSSNs of one session, written together (`submit_fresh`): what
    `submit` would hold as one PENDING entry each, held as columns. COMMITTED once
    `committed_fresh` gives its first SN (record k: sn + k * COUNTER_UNIT). A session's
    runs lie above all its entries; anything but the fast path that looks at the session
    first turns its runs into entries (`_materialize`), so the rest of the table knows
    only entries."""

    first: int                         # SSSN of its first record
    count: int
    signatures: bytes                  # RUN_SIGNATURE_BYTES per record
    submits: bytes                     # each record's submit_ms, <Q
    now_ms: int                        # the clock it was submitted at (its entries' expiry)
    expires_min: int                   # at most every record's expiry (prune looks no closer above it)
    expires_max: int
    sn: int | None = None              # None: PENDING

    @property
    def last(self) -> int:
        return self.first + self.count - 1


@dataclass(slots=True, eq=False)
class _Session:
    producer_id: bytes
    expires_ms: int                    # every retry the session can send is stale after this
    pruned_hwm: int = HWM_NONE         # entries at or below are dropped once committed
    entries: SortedDict = field(default_factory=SortedDict)   # sssn -> _Entry
    runs: list[_Run] = field(default_factory=list)            # above every entry, in SSSN order


def _pid(producer_id: bytes) -> str:
    return producer_id.hex()


def _validate(name: str, producer_id: bytes, sssn: int, hwm: int, submit_ms: int,
              signature: bytes, dedup_key: bytes | None, now_ms: int) -> None:
    """Named errors for session fields that cannot be right, whatever the table holds."""
    if not 0 < len(producer_id) <= SESSION_KEY_BYTES_MAX:
        raise InvalidProducerId(f"{name}: producer id of {len(producer_id)} bytes; "
                                f"expected 1..{SESSION_KEY_BYTES_MAX}")
    who = f"{name}: producer {_pid(producer_id)}"
    if not 0 <= sssn <= SSSN_MAX:
        raise InvalidSssn(f"{who}: sssn {sssn}; expected 0 <= sssn <= {SSSN_MAX}")
    if not HWM_NONE <= hwm <= sssn:
        raise InvalidHwm(f"{who}: hwm {hwm} with sssn {sssn}; expected {HWM_NONE} <= hwm <= sssn")
    if submit_ms > now_ms + DEDUP_CLOCK_SKEW_MS_MAX:
        raise SubmissionInFuture(f"{who}: sssn {sssn} submitted {submit_ms - now_ms} ms ahead of "
                                 f"this node's clock; at most {DEDUP_CLOCK_SKEW_MS_MAX} ms")
    if dedup_key is not None:
        if len(dedup_key) > DEDUP_KEY_BYTES_MAX:
            raise DedupKeyTooLarge(f"{who}: sssn {sssn}: dedup key of {len(dedup_key)} bytes; "
                                   f"at most {DEDUP_KEY_BYTES_MAX}")
        if not dedup_key:
            raise InvalidDedupKey(f"{who}: sssn {sssn}: empty dedup key; omit it instead")
    if not (0 < len(signature) <= DEDUP_SIGNATURE_BYTES_MAX):
        invariant(False, f"{who}: signature of {len(signature)} bytes; expected 1..{DEDUP_SIGNATURE_BYTES_MAX}")


class DedupTable:
    """The de-duplication table of one partition (see the module docstring)."""

    def __init__(self, name: str, window_ms: int = DEDUP_WINDOW_MS_DEFAULT,
                 policy: IngestionPolicy | str = IngestionPolicy.AT_LEAST_ONCE_NO_DUP, *,
                 sessions_max: int = DEDUP_SESSIONS_PER_PARTITION_MAX,
                 entries_per_session_max: int = DEDUP_ENTRIES_PER_SESSION_MAX,
                 keys_max: int = DEDUP_KEYS_PER_PARTITION_MAX,
                 waiters_per_entry_max: int = DEDUP_WAITERS_PER_ENTRY_MAX):
        if not (DEDUP_WINDOW_MS_MIN <= window_ms <= DEDUP_WINDOW_MS_MAX):
            invariant(False, f"{name}: dedup window {window_ms} ms; expected "
                  f"{DEDUP_WINDOW_MS_MIN}..{DEDUP_WINDOW_MS_MAX}")
        if not (min(sessions_max, entries_per_session_max, keys_max, waiters_per_entry_max) >= 1):
            invariant(False, f"{name}: every table bound must be at least 1")
        self.name = name
        self.window_ms = window_ms
        self.policy = IngestionPolicy(policy)
        # Only at_least_once_no_dup keeps a table; the other policies write every submission.
        self.deduplicating = self.policy is IngestionPolicy.AT_LEAST_ONCE_NO_DUP
        self.sessions_max = sessions_max
        self.entries_per_session_max = entries_per_session_max
        self.keys_max = keys_max
        self.waiters_per_entry_max = waiters_per_entry_max
        self._sessions: dict[bytes, _Session] = {}
        self._keys: dict[bytes, _Entry] = {}       # dedup key -> the entry that wrote it
        self._tickets = itertools.count(1)
        self._entries = 0                          # entries in sessions
        self._pending = 0
        self._waiting = 0
        self._queued = 0                           # tickets not yet resolved
        self._writes_total = 0
        self._duplicates_total = 0
        self._queued_total = 0

    # --- submissions --------------------------------------------------------------------
    def submit(self, producer_id: bytes, sssn: int, hwm: int, submit_ms: int, signature: bytes,
               dedup_key: bytes | None, now_ms: int) -> Decision:
        """Decide what to do with one submitted record; a named error changes nothing."""
        _validate(self.name, producer_id, sssn, hwm, submit_ms, signature, dedup_key, now_ms)
        if not self.deduplicating:
            self._writes_total += 1
            return _WRITE_UNTRACKED
        if submit_ms < now_ms - self.window_ms:
            raise StaleSubmission(f"{self.name}: producer {_pid(producer_id)}: sssn {sssn} submitted "
                                  f"{now_ms - submit_ms} ms ago; the dedup window is {self.window_ms} ms")
        session = self._session(producer_id)
        if session is not None:
            hwm = max(hwm, session.pruned_hwm)     # an HWM never goes back (requests reorder)
        entry = session.entries.get(sssn) if session is not None else None
        if entry is not None and (entry.signature != signature or entry.dedup_key != dedup_key):
            raise SessionConflict(f"{self.name}: producer {_pid(producer_id)}: sssn {sssn} sent again "
                                  f"with another {'record' if entry.signature != signature else 'dedup key'}")

        # Decide, changing nothing yet.
        sn: int | None = None
        owner: _Entry | None = None                # the pending write a QUEUED answer waits on
        new_state: EntryState | None = None        # state of the entry this submission adds
        if entry is not None:
            if entry.state is EntryState.COMMITTED:
                kind, sn = DecisionKind.DUPLICATE, entry.sn
            else:
                kind = DecisionKind.QUEUED
                owner = entry if entry.state is EntryState.PENDING else self._keys.get(entry.dedup_key)
        elif sssn <= hwm:
            kind = DecisionKind.DUPLICATE          # stored (the producer holds its ack); SN pruned
        else:
            holder = self._key_holder(dedup_key, now_ms)
            if holder is None:
                kind, new_state = DecisionKind.WRITE, EntryState.PENDING
            elif holder.state is EntryState.COMMITTED:
                kind, sn, new_state = DecisionKind.DUPLICATE, holder.sn, EntryState.COMMITTED
            else:
                kind, owner, new_state = DecisionKind.QUEUED, holder, EntryState.WAITING
        if not ((kind is DecisionKind.QUEUED) == (owner is not None)
                  and (owner is None or owner.state is EntryState.PENDING)):
            invariant(False, f"{self.name}: {_pid(producer_id)}/{sssn} {kind.value} behind {owner and owner.state}")
        prunable = self._prunable(session, hwm)
        adds_key = kind is DecisionKind.WRITE and dedup_key is not None and dedup_key not in self._keys
        self._check_room(session, len(prunable), new_state is not None, adds_key, owner)

        # Apply.
        expires_ms = max(submit_ms, now_ms) + self.window_ms
        if session is None:
            session = self._sessions[producer_id] = _Session(producer_id, expires_ms)
        session.expires_ms = max(session.expires_ms, expires_ms)
        for pruned in prunable:
            self._drop_entry(session, pruned)
        session.pruned_hwm = hwm
        if new_state is not None:
            added = self._add_entry(session, _Entry(producer_id, sssn, signature, dedup_key, expires_ms),
                                    new_state, sn)
            if new_state is EntryState.PENDING and dedup_key is not None:
                self._keys[dedup_key] = added
        ticket = None
        if owner is not None:
            ticket = next(self._tickets)
            if not owner.waiters:
                owner.waiters = deque()
            cast(deque, owner.waiters).append(_Waiter(ticket, producer_id, sssn, signature, dedup_key, expires_ms))
            self._queued += 1
        self._count(kind)
        return Decision(kind, sn, ticket, self._missing(session, hwm, sssn))

    def submit_run(self, producer_id: bytes, hwm: int, now_ms: int,
                   records: list[tuple[int, int, bytes, bytes | None]]) -> list["Decision | SmsError"]:
        """`submit` for each (sssn, submit_ms, signature, dedup_key) of one session with one
        HWM, in order, with the same decisions and the same table afterwards. The common
        run (fresh SSSNs rising above everything the session holds, no dedup keys, room for
        all) is decided once for the run; any other run, or a record that would raise a
        named error, goes through `submit` one record at a time; a record's named error is
        returned in its place (and changed nothing). Only the first decision carries the
        missing SSSNs below the run; a gap inside the run comes with the record after it:
        together, the SSSNs that `submit` would have reported."""
        self._session(producer_id)
        fast = self._fresh_run(producer_id, hwm, now_ms, records)
        if fast is None:
            out: list[Decision | SmsError] = []
            for sssn, submit_ms, signature, dedup_key in records:
                try:
                    out.append(self.submit(producer_id, sssn, hwm, submit_ms, signature, dedup_key, now_ms))
                except SmsError as e:
                    out.append(e)
            return out
        session, hwm, prunable = fast
        expires_ms = max(max(r[1] for r in records), now_ms) + self.window_ms
        if session is None:
            session = self._sessions[producer_id] = _Session(producer_id, expires_ms)
        session.expires_ms = max(session.expires_ms, expires_ms)
        entries = session.entries
        self._drop_pruned(session, hwm, prunable)
        session.pruned_hwm = hwm
        out: list[Decision | SmsError] = [_WRITE_TRACKED] * len(records)
        window_ms = self.window_ms
        pending = EntryState.PENDING
        prev = records[0][0]
        missing = self._missing(session, hwm, prev)
        if missing:
            out[0] = Decision(DecisionKind.WRITE, missing=missing)
        added: dict[int, _Entry] = {}
        for k, (sssn, submit_ms, signature, _key) in enumerate(records):
            if k and sssn != prev + 1:
                out[k] = Decision(DecisionKind.WRITE,
                                  missing=tuple(range(prev + 1, min(sssn, prev + 1 + DEDUP_MISSING_SSSNS_MAX))))
            prev = sssn
            added[sssn] = _Entry(producer_id, sssn, signature, None, max(submit_ms, now_ms) + window_ms, pending)
        entries.update(added)          # (one sorted update: the run's SSSNs are above every entry's)
        self._entries += len(records)
        self._pending += len(records)
        self._writes_total += len(records)
        return out

    def _fresh_run(self, producer_id: bytes, hwm: int, now_ms: int, records):
        """(session, effective HWM, prunable entries) when `submit_run` may decide the run
        at once; None when it must go record by record."""
        if not self.deduplicating or not records or hwm < HWM_NONE:
            return None
        session = self._sessions.get(producer_id)
        if session is not None:
            hwm = max(hwm, session.pruned_hwm)
        first = records[0][0]
        if first <= hwm or (session is not None and session.entries and session.entries.keys()[-1] >= first):
            return None
        last = hwm
        stale_ms = now_ms - self.window_ms
        ahead_ms = now_ms + DEDUP_CLOCK_SKEW_MS_MAX
        for sssn, submit_ms, signature, dedup_key in records:
            if (sssn <= last or sssn > SSSN_MAX or dedup_key is not None or not stale_ms <= submit_ms <= ahead_ms
                    or not 0 < len(signature) <= DEDUP_SIGNATURE_BYTES_MAX):
                return None
            last = sssn
        if not 0 < len(producer_id) <= SESSION_KEY_BYTES_MAX:
            return None
        prunable = self._prunable(session, hwm)
        if session is None:
            if len(self._sessions) >= self.sessions_max or len(records) > self.entries_per_session_max:
                return None
        elif len(session.entries) - len(prunable) + len(records) > self.entries_per_session_max:
            return None
        return session, hwm, prunable

    def committed_run(self, producer_id: bytes, outcomes: list[tuple[int, int]]) -> list[Resolution]:
        """`committed` for each (sssn, sn) of one session, in order: the entries without
        waiters settle here at once; the others go through `committed`."""
        if not self.deduplicating:
            return []
        session = self._session(producer_id)
        if session is None:
            invariant(False, f"{self.name}: outcomes for {_pid(producer_id)}, which has no session")
        out: list[Resolution] = []
        entries = session.entries
        pruned_hwm = session.pruned_hwm
        pending, committed = EntryState.PENDING, EntryState.COMMITTED
        settled = 0
        for sssn, sn in outcomes:
            entry = entries.get(sssn)
            if entry is None or entry.state is not pending or entry.waiters or sn < 0:
                out.extend(self.committed(producer_id, sssn, sn))
                continue
            entry.state = committed
            entry.sn = sn
            settled += 1
            if sssn <= pruned_hwm:
                del entries[sssn]
                self._entries -= 1
        self._pending -= settled
        return out

    # --- fresh runs, decided and settled whole ------------------------------------------
    def submit_fresh(self, producer_id: bytes, hwm: int, now_ms: int, first: int, count: int, submit_min: int,
                     submit_max: int, signatures: bytes, submits: bytes) -> _Run | None:
        """The common submission decided at once, with no object per record: `count`
        consecutive SSSNs from `first` of one session (submit times between submit_min and
        submit_max, `submits` each as <Q, `signatures` RUN_SIGNATURE_BYTES each), no dedup
        keys, fresh (above everything the session holds, and no SSSN missing below it) and
        with room. Every record is then a WRITE, and the table is as `submit` would have
        left it; the returned run is settled by `committed_fresh` or `failed_fresh`. None:
        not such a run, nothing changed; submit its records with `submit_run`, which
        decides each as `submit` does."""
        last = first + count - 1
        if (not self.deduplicating or count < 1 or hwm < HWM_NONE or first < 0 or last > SSSN_MAX
                or not 0 < len(producer_id) <= SESSION_KEY_BYTES_MAX
                or not now_ms - self.window_ms <= submit_min <= submit_max <= now_ms + DEDUP_CLOCK_SKEW_MS_MAX
                or len(signatures) != RUN_SIGNATURE_BYTES * count or len(submits) != 8 * count):
            return None
        session = self._sessions.get(producer_id)
        pruned: list[_Entry] = []
        if session is None:
            if first != hwm + 1 or len(self._sessions) >= self.sessions_max or count > self.entries_per_session_max:
                return None
        else:
            hwm = max(hwm, session.pruned_hwm)
            entries, runs = session.entries, session.runs
            top = runs[-1].last if runs else (entries.keys()[-1] if entries else HWM_NONE)
            if first <= hwm or first <= top:
                return None
            # no SSSN missing in (hwm, first): the session holds every one of them
            held = len(entries) - entries.bisect_right(hwm)
            held += sum(min(r.count, r.last - hwm) for r in runs if r.last > hwm)
            if held != first - hwm - 1:
                return None
            pruned = self._prunable(session, hwm)
            run_pruned = sum(min(r.count, hwm - r.first + 1) for r in runs if r.sn is not None and r.first <= hwm)
            held_all = len(entries) + sum(r.count for r in runs)
            if held_all - len(pruned) - run_pruned + count > self.entries_per_session_max:
                return None
        window_ms = self.window_ms
        run = _Run(first, count, signatures, submits, now_ms, max(submit_min, now_ms) + window_ms,
                   max(submit_max, now_ms) + window_ms)
        if session is None:
            session = self._sessions[producer_id] = _Session(producer_id, run.expires_max)
        else:
            self._drop_pruned(session, hwm, pruned)
            if session.runs:
                self._prune_runs_below(session, hwm)
            session.expires_ms = max(session.expires_ms, run.expires_max)
        session.pruned_hwm = hwm
        session.runs.append(run)
        self._entries += count
        self._pending += count
        self._writes_total += count
        return run

    def committed_fresh(self, producer_id: bytes, run: _Run, sn: int) -> list[Resolution]:
        """A run of `submit_fresh` committed, record k under sn + k * COUNTER_UNIT. A run
        that became entries meanwhile settles record by record (`committed_run`), with the
        resolutions of what queued on them."""
        session = self._sessions.get(producer_id)
        if session is None or not any(r is run for r in session.runs):
            return self.committed_run(producer_id, [(run.first + k, sn + k * COUNTER_UNIT) for k in range(run.count)])
        if not (run.sn is None and sn >= 0):
            invariant(False, f"{self.name}: run {_pid(producer_id)}/{run.first} committed twice, or under sn {sn}")
        run.sn = sn
        self._pending -= run.count
        if run.first <= session.pruned_hwm:        # (as `_settle`: at or below the HWM, gone at once)
            self._prune_runs_below(session, session.pruned_hwm)
        return []

    def failed_fresh(self, producer_id: bytes, run: _Run) -> list[Resolution]:
        """A run of `submit_fresh` was not written: it goes (record by record, with what
        queued on them, if it became entries meanwhile)."""
        session = self._sessions.get(producer_id)
        if session is None or not any(r is run for r in session.runs):
            out: list[Resolution] = []
            for k in range(run.count):
                out.extend(self.failed(producer_id, run.first + k))
            return out
        if not (run.sn is None):
            invariant(False, f"{self.name}: run {_pid(producer_id)}/{run.first} failed after it committed")
        session.runs.remove(run)
        self._entries -= run.count
        self._pending -= run.count
        return []

    def entries_of(self, producer_id: bytes) -> list[_Entry]:
        """The session's entries in SSSN order, its runs as the entries they stand for
        (made for the caller; the table is not changed). For tests and inspection."""
        session = self._sessions.get(producer_id)
        if session is None:
            return []
        return list(session.entries.values()) + [e for run in session.runs for e in self._run_entries(producer_id, run)]

    def _session(self, producer_id: bytes) -> _Session | None:
        """The session with its runs made into entries (what the record-by-record paths see)."""
        session = self._sessions.get(producer_id)
        if session is not None and session.runs:
            self._materialize(session)
        return session

    def _materialize(self, session: _Session) -> None:
        for run in session.runs:
            session.entries.update((e.sssn, e) for e in self._run_entries(session.producer_id, run))
        session.runs = []                          # (the counters already count them)

    def _run_entries(self, producer_id: bytes, run: _Run) -> list[_Entry]:
        window_ms, now_ms, sigs = self.window_ms, run.now_ms, run.signatures
        submits = struct.unpack(f"<{run.count}Q", run.submits)
        state = EntryState.PENDING if run.sn is None else EntryState.COMMITTED
        step = RUN_SIGNATURE_BYTES
        return [_Entry(producer_id, run.first + k, sigs[k * step:(k + 1) * step], None,
                       max(submits[k], now_ms) + window_ms, state,
                       None if run.sn is None else run.sn + k * COUNTER_UNIT)
                for k in range(run.count)]

    def _prune_runs_below(self, session: _Session, hwm: int) -> None:
        """Committed runs' records at or below the HWM go (whole runs, or a run's front)."""
        kept: list[_Run] = []
        for run in session.runs:
            if run.sn is None or run.first > hwm:
                kept.append(run)
            elif run.last <= hwm:
                self._entries -= run.count
            else:
                k = hwm - run.first + 1
                run.first += k
                run.count -= k
                run.signatures = run.signatures[k * RUN_SIGNATURE_BYTES:]
                run.submits = run.submits[8 * k:]
                run.sn += k * COUNTER_UNIT
                self._entries -= k
                kept.append(run)
        session.runs = kept

    def _prune_runs(self, session: _Session, now_ms: int) -> None:
        """`prune` of a session's runs: committed runs whose every record is stale go
        whole; a committed run only partly stale becomes entries (pruned one by one)."""
        kept: list[_Run] = []
        partly = False
        for run in session.runs:
            if run.sn is not None and run.expires_max < now_ms:
                self._entries -= run.count
                continue
            partly = partly or (run.sn is not None and run.expires_min < now_ms)
            kept.append(run)
        session.runs = kept
        if partly:
            self._materialize(session)

    def _key_holder(self, dedup_key: bytes | None, now_ms: int) -> _Entry | None:
        """The entry that wrote (or is writing) this dedup key within the window."""
        if dedup_key is None:
            return None
        holder = self._keys.get(dedup_key)
        if holder is None or (holder.state is EntryState.COMMITTED and holder.expires_ms < now_ms):
            return None
        if not (holder.state in (EntryState.PENDING, EntryState.COMMITTED)):
            invariant(False, f"{self.name}: dedup key held by an entry in state {holder.state}")
        return holder

    def _drop_pruned(self, session: _Session, hwm: int, prunable: list[_Entry]) -> None:
        """Drop `_prunable`'s entries (every entry up to the HWM, when all are committed:
        one slice)."""
        if prunable and session.entries.bisect_right(hwm) == len(prunable):
            del session.entries.keys()[:len(prunable)]
            self._entries -= len(prunable)
        else:
            for pruned in prunable:
                self._drop_entry(session, pruned)

    @staticmethod
    def _prunable(session: _Session | None, hwm: int) -> list[_Entry]:
        """Committed entries at or below the HWM: the producer will not resend them.
        Pending and waiting entries stay until their outcome is known."""
        if session is None:
            return []
        below = session.entries.bisect_right(hwm)
        if not below:
            return []
        committed = EntryState.COMMITTED
        return [e for e in session.entries.values()[:below] if e.state is committed]

    def _check_room(self, session: _Session | None, prunable: int, adds_entry: bool, adds_key: bool,
                    owner: _Entry | None) -> None:
        if session is None and len(self._sessions) >= self.sessions_max:
            raise TableFull(f"{self.name}: {len(self._sessions)} producer sessions; at most {self.sessions_max}")
        if adds_entry and session is not None:
            unpruned = len(session.entries) - prunable
            if unpruned >= self.entries_per_session_max:
                raise TableFull(f"{self.name}: producer {_pid(session.producer_id)} has {unpruned} entries "
                                f"above its HWM {session.pruned_hwm}; at most {self.entries_per_session_max}")
        if adds_key and len(self._keys) >= self.keys_max:
            raise TableFull(f"{self.name}: {len(self._keys)} dedup keys in the window; at most {self.keys_max}")
        if owner is not None and len(owner.waiters) >= self.waiters_per_entry_max:
            raise TableFull(f"{self.name}: {len(owner.waiters)} submissions queued behind producer "
                            f"{_pid(owner.producer_id)} sssn {owner.sssn}; at most {self.waiters_per_entry_max}")

    @staticmethod
    def _missing(session: _Session, hwm: int, sssn: int) -> tuple[int, ...]:
        """SSSNs in (hwm, sssn) with no entry; at most DEDUP_MISSING_SSSNS_MAX of them, and
        at most that many plus the session's entries visited."""
        entries = session.entries
        lo, hi = entries.bisect_right(hwm), entries.bisect_left(sssn)
        if hi - lo == sssn - hwm - 1:
            return ()                    # the common case: no gap (O(log n))
        out: list[int] = []
        expected = hwm + 1
        for present in entries.islice(lo, hi):
            while expected < present and len(out) < DEDUP_MISSING_SSSNS_MAX:
                out.append(expected)
                expected += 1
            if len(out) >= DEDUP_MISSING_SSSNS_MAX:
                return tuple(out)
            expected = present + 1
        while expected < sssn and len(out) < DEDUP_MISSING_SSSNS_MAX:
            out.append(expected)
            expected += 1
        return tuple(out)

    # --- write outcomes -----------------------------------------------------------------
    def committed(self, producer_id: bytes, sssn: int, sn: int) -> list[Resolution]:
        """The write of a PENDING entry committed under `sn`: every submission queued on it
        is a duplicate of that SN (retries and records with the same dedup key)."""
        if not self.deduplicating:
            return []
        if not (sn >= 0):
            invariant(False, f"{self.name}: committed under sn {sn}")
        session, entry = self._pending_entry(producer_id, sssn)
        waiters = self._take_waiters(entry)
        self._transition(entry, EntryState.COMMITTED)
        entry.sn = sn
        self._settle(session, entry)
        out = []
        for w in waiters:
            if w.producer_id != producer_id or w.sssn != sssn:
                twin_session = self._session(w.producer_id)
                assert twin_session is not None
                twin = twin_session.entries[w.sssn]
                if twin.state is EntryState.WAITING:
                    self._transition(twin, EntryState.COMMITTED)
                    twin.sn = sn
                    self._settle(twin_session, twin)
                if not (twin.state is EntryState.COMMITTED and twin.sn == sn):
                    invariant(False, f"{self.name}: key twin {_pid(w.producer_id)}/{w.sssn} is {twin.state} sn {twin.sn}")
            out.append(Resolution(w.ticket, DecisionKind.DUPLICATE, w.producer_id, w.sssn, sn))
        self._duplicates_total += len(out)
        return out

    def failed(self, producer_id: bytes, sssn: int) -> list[Resolution]:
        """The write of a PENDING entry failed: the entry goes; the first submission queued
        on it (if any) must now be written, and the others stay queued behind that one."""
        if not self.deduplicating:
            return []
        session, entry = self._pending_entry(producer_id, sssn)
        waiters = self._take_waiters(entry)
        self._transition(entry, EntryState.FAILED)
        self._drop_entry(session, entry)
        if entry.dedup_key is not None:
            if not (self._keys.get(entry.dedup_key) is entry):
                invariant(False, f"{self.name}: pending {_pid(producer_id)}/{sssn} does not hold its dedup key")
            del self._keys[entry.dedup_key]
        if not waiters:
            return []
        first = waiters.popleft()
        heir_session = self._session(first.producer_id)
        assert heir_session is not None
        heir = heir_session.entries.get(first.sssn)
        if heir is None:                           # a retry of the failed record itself
            if not (first.producer_id == producer_id and first.sssn == sssn):
                invariant(False, f"{self.name}: queued {_pid(first.producer_id)}/{first.sssn} has no entry")
            heir = self._add_entry(session, self._entry_of(first), EntryState.PENDING)
        else:                                      # a record with the same dedup key
            self._transition(heir, EntryState.PENDING)
        if not (heir.dedup_key == entry.dedup_key):
            invariant(False, f"{self.name}: heir of another dedup key")
        if heir.dedup_key is not None:
            self._keys[heir.dedup_key] = heir
        heir.waiters = waiters
        self._queued += len(waiters)
        if (heir.producer_id, heir.sssn) != (producer_id, sssn):
            # Retries of the failed record now wait, like any key twin, on the heir.
            retry = next((w for w in waiters if w.producer_id == producer_id and w.sssn == sssn), None)
            if retry is not None:
                self._add_entry(session, self._entry_of(retry), EntryState.WAITING)
        self._writes_total += 1
        return [Resolution(first.ticket, DecisionKind.WRITE, first.producer_id, first.sssn)]

    def _pending_entry(self, producer_id: bytes, sssn: int) -> tuple[_Session, _Entry]:
        session = self._session(producer_id)
        entry = session.entries.get(sssn) if session is not None else None
        if not (entry is not None and entry.state is EntryState.PENDING):
            invariant(False, f"{self.name}: outcome for {_pid(producer_id)}/{sssn}, which is "
                  f"{entry.state if entry is not None else 'unknown'}; expected PENDING")
        return session, entry

    def _take_waiters(self, entry: _Entry) -> deque[_Waiter]:
        waiters, entry.waiters = entry.waiters, ()
        self._queued -= len(waiters)
        return waiters if isinstance(waiters, deque) else deque()

    @staticmethod
    def _entry_of(w: _Waiter) -> _Entry:
        return _Entry(w.producer_id, w.sssn, w.signature, w.dedup_key, w.expires_ms)

    def _settle(self, session: _Session, entry: _Entry) -> None:
        """A newly committed entry at or below the HWM is pruned at once."""
        if entry.sssn <= session.pruned_hwm:
            self._drop_entry(session, entry)

    # --- forgetting and remembering -----------------------------------------------------
    def prune(self, now_ms: int) -> None:
        """Forget committed entries and dedup keys whose retries are stale by now, and the
        sessions left with nothing to remember. Visits the whole table: call it every
        DEDUP_PRUNE_INTERVAL_MS, not per submission. Pending and waiting entries stay."""
        if not self.deduplicating:
            return
        for key in [k for k, e in self._keys.items()
                    if e.state is EntryState.COMMITTED and e.expires_ms < now_ms]:
            del self._keys[key]
        for producer_id in list(self._sessions):
            session = self._sessions[producer_id]
            if session.runs:
                self._prune_runs(session, now_ms)
            for entry in [e for e in session.entries.values()
                          if e.state is EntryState.COMMITTED and e.expires_ms < now_ms]:
                self._drop_entry(session, entry)
            if session.expires_ms < now_ms and not session.entries and not session.runs:
                del self._sessions[producer_id]    # quiet past the window: its retries are stale

    def rebuild(self, records: Iterable[StoredRecord | tuple], now_ms: int) -> int:
        """Load the session fields of stored records, in SN order (merge several sources,
        e.g. the parents of a child partition, with heapq.merge), into an empty table:
        those within the window become COMMITTED entries and dedup keys; the lowest SN of
        a (producer, SSSN) or dedup key stored twice wins. Returns the records loaded.

        Stored records carry no HWM, so a session with more than entries_per_session_max
        records in the window keeps its highest SSSNs and treats the rest as below its HWM
        (answered DUPLICATE, sn=None): the live table never let a session hold more
        un-acked entries than that, so those were acked. Sessions and dedup keys are not
        dropped: a rebuilt table may start above those bounds, and then refuses new ones
        (TableFull) until pruning brings it back under them."""
        if not self.deduplicating:
            return 0
        if not (not self._sessions and not self._keys):
            invariant(False, f"{self.name}: rebuild of a table in use")
        loaded, last_sn = 0, -1
        for producer_id, sssn, dedup_key, signature, sn, arrival_ms in records:
            if not (sn > last_sn):
                invariant(False, f"{self.name}: stored sn {sn} after {last_sn}; expected SN order")
            last_sn = sn
            # The record arrived at most the skew before its submit_ms (which is not stored).
            expires_ms = arrival_ms + DEDUP_CLOCK_SKEW_MS_MAX + self.window_ms
            if expires_ms < now_ms:
                continue
            if not (0 < len(producer_id) <= SESSION_KEY_BYTES_MAX and 0 <= sssn <= SSSN_MAX
                      and (dedup_key is None or 0 < len(dedup_key) <= DEDUP_KEY_BYTES_MAX)):
                invariant(False, f"{self.name}: stored session fields of sn {sn} out of range")
            session = self._sessions.get(producer_id)
            if session is None:
                session = self._sessions[producer_id] = _Session(producer_id, expires_ms)
            session.expires_ms = max(session.expires_ms, expires_ms)
            entry = session.entries.get(sssn)
            if entry is None:
                entry = self._add_entry(session, _Entry(producer_id, sssn, signature, dedup_key, expires_ms),
                                        EntryState.COMMITTED, sn)
            if dedup_key is not None and dedup_key not in self._keys and entry.dedup_key == dedup_key:
                self._keys[dedup_key] = entry
            loaded += 1
        for session in self._sessions.values():
            excess = len(session.entries) - self.entries_per_session_max
            if excess > 0:
                dropped = list(session.entries.values()[:excess])     # the lowest SSSNs
                for entry in dropped:
                    self._drop_entry(session, entry)
                session.pruned_hwm = dropped[-1].sssn
        return loaded

    # --- entries and their states -------------------------------------------------------
    def _transition(self, entry: _Entry, to: EntryState) -> None:
        if not (to in _TRANSITIONS[entry.state]):
            invariant(False, f"{self.name}: entry {_pid(entry.producer_id)}/{entry.sssn}: "
                  f"{entry.state} -> {to} is not a transition")
        for state, step in ((entry.state, -1), (to, +1)):
            if state is EntryState.PENDING:
                self._pending += step
            elif state is EntryState.WAITING:
                self._waiting += step
        entry.state = to

    def _add_entry(self, session: _Session, entry: _Entry, state: EntryState, sn: int | None = None) -> _Entry:
        if not (entry.sssn not in session.entries):
            invariant(False, f"{self.name}: entry {_pid(entry.producer_id)}/{entry.sssn} added twice")
        session.entries[entry.sssn] = entry
        self._entries += 1
        entry.sn = sn
        self._transition(entry, state)
        return entry

    def _drop_entry(self, session: _Session, entry: _Entry) -> None:
        if not (entry.state in (EntryState.COMMITTED, EntryState.FAILED) and not entry.waiters):
            invariant(False, f"{self.name}: dropping {_pid(entry.producer_id)}/{entry.sssn} in state {entry.state}")
        if not (session.entries.get(entry.sssn) is entry):
            invariant(False, f"{self.name}: entry {_pid(entry.producer_id)}/{entry.sssn} is not in its session")
        del session.entries[entry.sssn]
        self._entries -= 1

    def _count(self, kind: DecisionKind) -> None:
        if kind is DecisionKind.WRITE:
            self._writes_total += 1
        elif kind is DecisionKind.DUPLICATE:
            self._duplicates_total += 1
        else:
            self._queued_total += 1

    # --- statistics ---------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """Current sizes and totals since the table was made. `entries` are held in
        sessions (above their HWMs), `pending` / `waiting` among them; `queued` counts
        unresolved tickets; `dedup_keys` counts keys in the window, some of them held by
        entries already pruned from their session."""
        return {
            "sessions": len(self._sessions),
            "entries": self._entries,
            "pending": self._pending,
            "waiting": self._waiting,
            "queued": self._queued,
            "dedup_keys": len(self._keys),
            "writes_total": self._writes_total,
            "duplicates_total": self._duplicates_total,
            "queued_total": self._queued_total,
        }

    def check_invariants(self) -> None:
        """Recount the table and check how its parts relate (for tests and simulators)."""
        entries = pending = waiting = queued = 0
        for producer_id, session in self._sessions.items():
            invariant(len(session.entries) <= self.entries_per_session_max,
                      f"{self.name}: {_pid(producer_id)} holds {len(session.entries)} entries")
            for sssn, entry in session.entries.items():
                invariant(entry.producer_id == producer_id and entry.sssn == sssn, "entry filed wrongly")
                invariant(entry.state in (EntryState.PENDING, EntryState.WAITING, EntryState.COMMITTED),
                          f"entry in state {entry.state}")
                invariant((entry.sn is not None) == (entry.state is EntryState.COMMITTED), "sn iff committed")
                invariant(not entry.waiters or entry.state is EntryState.PENDING, "waiters on a settled entry")
                invariant(len(entry.waiters) <= self.waiters_per_entry_max, "too many waiters")
                invariant(entry.state is not EntryState.COMMITTED or sssn > session.pruned_hwm,
                          "committed entry at or below the HWM")
                entries += 1
                queued += len(entry.waiters)
                if entry.state is EntryState.PENDING:
                    pending += 1
                    invariant(entry.dedup_key is None or self._keys.get(entry.dedup_key) is entry,
                              "pending entry without its dedup key")
                elif entry.state is EntryState.WAITING:
                    waiting += 1
                    holder = self._keys.get(entry.dedup_key)
                    invariant(holder is not None and holder.state is EntryState.PENDING
                              and any(w.producer_id == producer_id and w.sssn == sssn for w in holder.waiters),
                              "waiting entry not queued on its dedup key's pending write")
            top = session.entries.keys()[-1] if session.entries else -1
            for run in session.runs:
                invariant(run.count >= 1 and run.first > top, "a run not above its session's entries and runs")
                invariant(len(run.signatures) == RUN_SIGNATURE_BYTES * run.count and len(run.submits) == 8 * run.count,
                          "a run's columns do not match its count")
                invariant(run.sn is None or run.first > session.pruned_hwm, "committed run at or below the HWM")
                top = run.last
                entries += run.count
                pending += run.count if run.sn is None else 0
            invariant(len(session.entries) + sum(r.count for r in session.runs) <= self.entries_per_session_max,
                      f"{self.name}: {_pid(producer_id)} holds too many entries")
        for key, holder in self._keys.items():
            invariant(holder.dedup_key == key and holder.state in (EntryState.PENDING, EntryState.COMMITTED),
                      "dedup key held by a settled or foreign entry")
        invariant((entries, pending, waiting, queued) == (self._entries, self._pending, self._waiting, self._queued),
                  f"counters {(self._entries, self._pending, self._waiting, self._queued)} "
                  f"!= recount {(entries, pending, waiting, queued)}")
