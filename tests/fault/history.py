"""The history of a fault trial and its checker: plain data in, verdict out, no I/O.

A trial's workload (`tests/fault/workload.py`) records into a thread-safe `History`
what producers were told and what consumers saw: every record submitted (a unique
payload id such as "w3-000123" inside its bytes), every ack (partition, SN, duplicate
flag, times), every record that failed for good, every record a tailing consumer read,
and the time of every fault the trial injected. After the run the whole stream is read
back (`final_read`: (partition, SN, partition key, payload id) in read order per
partition) and `check(history, final_read)` proves, and reports separately:

  a. acked records are durable: each is in final_read exactly once, at the SN of its ack
     (a duplicate ack carries the original SN, so it must match too);
  b. nothing extra: no record is stored twice, none that was never submitted;
  c. order: per partition the SNs of final_read strictly increase; per (producer,
     partition key) the order of submission is the order of SNs;
  d. readers never saw what was later lost: every record a consumer saw is in final_read
     at the SN it saw, and each consumer's records of a partition are a gap-free run of
     final_read in SN order (from its first record when it started at TRIM_HORIZON);
  e. writes resume after every fault: the time from the fault to the first ack of a
     record submitted after it; a fault with none is a violation.

Records that failed (or were still unsettled when the run stopped) are indeterminate:
they may be stored once or not at all, never twice. `format_table` renders the results
of many trials, one line per fault kind, as the fault run prints them.

Times are seconds on the History's clock (time.monotonic unless another is injected),
so fault and ack times compare directly.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

# --- violation kinds: one name per way a trial can fail -----------------------------------
LOST = "lost"                          # (a) an acked record is not in final_read
WRONG_SN = "wrong_sn"                  # (a) stored at another SN / partition than acked, or a duplicate ack without SN
CORRUPT = "corrupt"                    # (a) stored under another partition key than submitted
DUPLICATE = "duplicate"                # (b) a record stored more than once
UNEXPECTED = "unexpected"              # (b) a record stored that no producer submitted
REORDERING = "reordering"              # (c) SNs not increasing in a partition, or a producer's key out of order
READER_LOST = "reader_lost"            # (d) a consumer saw a record that final_read does not hold
READER_WRONG_SN = "reader_wrong_sn"    # (d) a consumer saw a record at another SN / partition than final_read
READER_ORDER = "reader_order"          # (d) a consumer saw a partition's SNs go back or repeat
READER_GAP = "reader_gap"              # (d) a consumer skipped records of final_read
NO_RESUME = "no_resume"                # (e) no ack of a record submitted after a fault
SLOW_RESUME = "slow_resume"            # (e) the first such ack came later than allowed

READER_KINDS = frozenset({READER_LOST, READER_WRONG_SN, READER_ORDER, READER_GAP})
VIOLATIONS_KEPT_DEFAULT = 50           # messages kept in a result; every violation is counted
TRIM_HORIZON = "TRIM_HORIZON"


# --- events ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Submit:
    """A record handed to a producer (queued for delivery)."""

    stream: str
    producer: str
    seq: int                    # the producer's submission counter: its order of submission
    partition_key: str
    payload: str
    time_s: float


@dataclass(frozen=True, slots=True)
class Ack:
    """A producer's ack of one record: the SN it was stored under (None only when the
    owner answered a duplicate without one, which is itself a violation)."""

    stream: str
    partition: int
    partition_key: str
    payload: str
    sn: int | None
    duplicate: bool
    time_s: float
    producer: str = ""
    seq: int = -1
    sent_s: float | None = None  # when the record was submitted


@dataclass(frozen=True, slots=True)
class ProducerError:
    """A record that failed for good (payload set), or a send that was refused before a
    record was queued (payload None)."""

    time_s: float
    error: str                  # the error's name: Timeout, ProducerClosed, Unsettled, ...
    payload: str | None = None
    producer: str = ""
    stream: str = ""
    message: str = ""


@dataclass(frozen=True, slots=True)
class Observation:
    """A record a consumer read."""

    consumer: str
    partition: int
    sn: int
    payload: str
    time_s: float
    stream: str = ""


@dataclass(frozen=True, slots=True)
class ConsumerStart:
    """A consumer began tailing a partition at `position` (TRIM_HORIZON, LATEST, ...)."""

    consumer: str
    stream: str
    partition: int
    position: str
    time_s: float


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault the trial injected; `stream`/`partitions` narrow which acks show recovery."""

    kind: str
    time_s: float
    stream: str | None = None
    partitions: tuple[int, ...] | None = None


class ReadRecord(NamedTuple):
    """One record of the final read-back."""

    partition: int
    sn: int
    partition_key: str
    payload: str


# --- the history -----------------------------------------------------------------------------
class History:
    """Thread-safe, append-only record of a trial. Writers call record_*/mark_fault from
    any thread; readers get immutable copies."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._submits: list[Submit] = []
        self._acks: list[Ack] = []
        self._errors: list[ProducerError] = []
        self._observations: list[Observation] = []
        self._starts: list[ConsumerStart] = []
        self._faults: list[Fault] = []
        self._acked: dict[str, set[str]] = defaultdict(set)     # stream -> payloads acked

    def now(self) -> float:
        return self.clock()

    # --- writers -----------------------------------------------------------------------
    def record_submit(self, stream: str, producer: str, seq: int, partition_key: str, payload: str,
                      time_s: float | None = None) -> Submit:
        event = Submit(stream, producer, seq, partition_key, payload, self._t(time_s))
        with self._lock:
            self._submits.append(event)
        return event

    def record_ack(self, stream: str, partition: int, partition_key: str, payload: str, sn: int | None,
                   duplicate: bool = False, time_s: float | None = None, *, producer: str = "", seq: int = -1,
                   sent_s: float | None = None) -> Ack:
        event = Ack(stream, partition, partition_key, payload, sn, duplicate, self._t(time_s), producer, seq, sent_s)
        with self._lock:
            self._acks.append(event)
            self._acked[stream].add(payload)
        return event

    def record_error(self, error: str, payload: str | None = None, time_s: float | None = None, *,
                     producer: str = "", stream: str = "", message: str = "") -> ProducerError:
        event = ProducerError(self._t(time_s), error, payload, producer, stream, message)
        with self._lock:
            self._errors.append(event)
        return event

    def record_observation(self, consumer: str, partition: int, sn: int, payload: str, time_s: float | None = None,
                           *, stream: str = "") -> Observation:
        event = Observation(consumer, partition, sn, payload, self._t(time_s), stream)
        with self._lock:
            self._observations.append(event)
        return event

    def record_observations(self, events: Iterable[Observation]) -> None:
        """Several observations at once (one page of get_next_records)."""
        events = list(events)
        with self._lock:
            self._observations.extend(events)

    def record_consumer_start(self, consumer: str, stream: str, partition: int, position: str = TRIM_HORIZON,
                              time_s: float | None = None) -> ConsumerStart:
        event = ConsumerStart(consumer, stream, partition, position, self._t(time_s))
        with self._lock:
            self._starts.append(event)
        return event

    def mark_fault(self, kind: str, time_s: float | None = None, *, stream: str | None = None,
                   partitions: Iterable[int] | None = None) -> Fault:
        event = Fault(kind, self._t(time_s), stream, None if partitions is None else tuple(partitions))
        with self._lock:
            self._faults.append(event)
        return event

    def _t(self, time_s: float | None) -> float:
        return self.clock() if time_s is None else time_s

    # --- readers -------------------------------------------------------------------------
    def _copy(self, items: list) -> tuple:
        """A snapshot of one of the recorded lists, taken under the lock."""
        with self._lock:
            return tuple(items)

    @property
    def submits(self) -> tuple[Submit, ...]:
        return self._copy(self._submits)

    @property
    def acks(self) -> tuple[Ack, ...]:
        return self._copy(self._acks)

    @property
    def errors(self) -> tuple[ProducerError, ...]:
        return self._copy(self._errors)

    @property
    def observations(self) -> tuple[Observation, ...]:
        return self._copy(self._observations)

    @property
    def consumer_starts(self) -> tuple[ConsumerStart, ...]:
        return self._copy(self._starts)

    @property
    def faults(self) -> tuple[Fault, ...]:
        return self._copy(self._faults)

    def acked_count(self, stream: str | None = None) -> int:
        """Distinct records acked (of one stream, or of all)."""
        with self._lock:
            if stream is not None:
                return len(self._acked.get(stream, ()))
            return sum(len(p) for p in self._acked.values())

    def acked_payloads(self, stream: str) -> frozenset[str]:
        with self._lock:
            return frozenset(self._acked.get(stream, ()))

    def streams(self) -> set[str]:
        with self._lock:
            return ({e.stream for e in self._submits} | {e.stream for e in self._acks}
                    | {e.stream for e in self._starts} | {e.stream for e in self._errors if e.stream})


# --- the verdict -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass(frozen=True, slots=True)
class FaultRecovery:
    """How long writes took to resume after one fault; recovery_s None: they never did."""

    kind: str
    time_s: float
    recovery_s: float | None

    @property
    def resumed(self) -> bool:
        return self.recovery_s is not None


@dataclass
class CheckResult:
    submitted: int = 0
    acked: int = 0                 # distinct records acked
    failed: int = 0                # records that failed or stayed unsettled (indeterminate), not acked
    failed_stored: int = 0         # ... of which final_read holds one copy (allowed)
    stored: int = 0                # records in final_read
    lost: int = 0
    duplicates: int = 0            # extra copies in final_read
    unexpected: int = 0
    wrong_sn: int = 0
    corrupt: int = 0
    reorderings: int = 0
    observations: int = 0
    reader_anomalies: int = 0
    no_resume: int = 0
    recoveries: list[FaultRecovery] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)      # the first `violations_kept`
    by_kind: Counter = field(default_factory=Counter)             # every violation, counted by kind
    violations_kept: int = VIOLATIONS_KEPT_DEFAULT

    @property
    def ok(self) -> bool:
        return not self.by_kind

    @property
    def violation_count(self) -> int:
        return sum(self.by_kind.values())

    def kinds(self) -> set[str]:
        return set(self.by_kind)

    def add(self, kind: str, message: str) -> None:
        self.by_kind[kind] += 1
        if len(self.violations) < self.violations_kept:
            self.violations.append(Violation(kind, message))

    def counts(self) -> dict[str, int]:
        return {"submitted": self.submitted, "acked": self.acked, "failed": self.failed,
                "failed_stored": self.failed_stored, "stored": self.stored, "lost": self.lost,
                "duplicates": self.duplicates, "unexpected": self.unexpected, "wrong_sn": self.wrong_sn,
                "corrupt": self.corrupt, "reorderings": self.reorderings, "observations": self.observations,
                "reader_anomalies": self.reader_anomalies, "no_resume": self.no_resume}

    def summary(self) -> str:
        counts = " ".join(f"{k}={v}" for k, v in self.counts().items())
        faults = ", ".join(f"{r.kind}->{'never' if r.recovery_s is None else f'{r.recovery_s:.2f}s'}"
                           for r in self.recoveries)
        lines = [f"{'OK' if self.ok else 'FAILED'}: {counts}"]
        if faults:
            lines.append(f"fault -> next ack: {faults}")
        if not self.ok:
            lines.append(f"{self.violation_count} violations by kind: {dict(self.by_kind)}; first {len(self.violations)}:")
            lines.extend(f"  {v}" for v in self.violations)
        return "\n".join(lines)

    def assert_ok(self) -> None:
        if not self.ok:
            raise AssertionError(self.summary())


def check(history: History, final_read: Iterable | Mapping[str, Iterable], *,
          resume_within_s: float | None = None, violations_kept: int = VIOLATIONS_KEPT_DEFAULT) -> CheckResult:
    """Check a trial (module docstring, a..e). `final_read` is a list of (partition, SN,
    partition key, payload id) in read order per partition, for the history's one
    stream; or a dict stream -> such list when the history has several streams.
    `resume_within_s`: a fault whose first ack came later is a violation too."""
    result = CheckResult(violations_kept=violations_kept)
    submits, acks, failures = history.submits, history.acks, history.errors
    observations, starts = history.observations, history.consumer_starts
    for stream, rows in _final_by_stream(history, final_read).items():
        _check_stream(result, stream, [ReadRecord(*r) for r in rows],
                      [e for e in submits if e.stream == stream], [e for e in acks if e.stream == stream],
                      [e for e in failures if e.stream == stream and e.payload is not None],
                      [e for e in observations if e.stream == stream], [e for e in starts if e.stream == stream])
    _check_resume(result, history.faults, acks, resume_within_s)
    return result


def _final_by_stream(history: History, final_read) -> dict[str, list]:
    if isinstance(final_read, Mapping):
        return {s: list(rows) for s, rows in final_read.items()}
    streams = history.streams()
    if len(streams) > 1:
        raise ValueError(f"the history has streams {sorted(streams)}: pass final_read as a dict stream -> rows")
    return {next(iter(streams), ""): list(final_read)}


def _check_stream(result: CheckResult, stream: str, final: list[ReadRecord], submits: list[Submit],
                  acks: list[Ack], failures: list[ProducerError], observations: list[Observation],
                  starts: list[ConsumerStart]) -> None:
    prefix = f"{stream}: " if stream else ""
    by_partition: dict[int, list[ReadRecord]] = defaultdict(list)
    copies: dict[str, list[ReadRecord]] = defaultdict(list)
    for r in final:
        by_partition[r.partition].append(r)
        copies[r.payload].append(r)
    result.stored += len(final)
    result.submitted += len({e.payload for e in submits} | {e.payload for e in acks})

    # (c) SNs strictly increase within each partition of the read-back
    for partition, rows in sorted(by_partition.items()):
        for before, after in zip(rows, rows[1:]):
            if after.sn <= before.sn:
                result.reorderings += 1
                result.add(REORDERING, f"{prefix}p{partition}: {after.payload} at SN {after.sn} read after "
                                       f"{before.payload} at SN {before.sn}")

    # (b) no record twice, none never submitted
    submitted_keys = {e.payload: e.partition_key for e in submits}
    submitted_keys.update({e.payload: e.partition_key for e in acks})
    known = set(submitted_keys) | {e.payload for e in failures}
    for payload, rows in copies.items():
        if len(rows) > 1:
            result.duplicates += len(rows) - 1
            where = ", ".join(f"p{r.partition} SN {r.sn}" for r in rows)
            result.add(DUPLICATE, f"{prefix}{payload} stored {len(rows)} times: {where}")
        if payload not in known:
            result.unexpected += len(rows)
            result.add(UNEXPECTED, f"{prefix}{payload} stored at p{rows[0].partition} SN {rows[0].sn} "
                                   f"but never submitted")
        elif payload in submitted_keys and rows[0].partition_key != submitted_keys[payload]:
            result.corrupt += 1
            result.add(CORRUPT, f"{prefix}{payload} stored under partition key {rows[0].partition_key!r}; "
                                f"submitted under {submitted_keys[payload]!r}")

    # (a) every ack is in the read-back once, at its SN
    acks_by_payload: dict[str, list[Ack]] = defaultdict(list)
    for a in acks:
        acks_by_payload[a.payload].append(a)
    result.acked += len(acks_by_payload)
    for payload, its_acks in acks_by_payload.items():
        rows = copies.get(payload)
        first = its_acks[0]
        if not rows:
            result.lost += 1
            result.add(LOST, f"{prefix}{payload} acked at p{first.partition} SN {first.sn} "
                             f"({'duplicate ack, ' if first.duplicate else ''}t={first.time_s:.3f}) "
                             f"is not in the read-back")
            continue
        stored = rows[0]
        for a in its_acks:
            if a.sn is None:
                result.wrong_sn += 1
                result.add(WRONG_SN, f"{prefix}{payload}: {'duplicate ' if a.duplicate else ''}ack without an SN; "
                                     f"stored at p{stored.partition} SN {stored.sn}")
            elif (a.partition, a.sn) != (stored.partition, stored.sn):
                result.wrong_sn += 1
                result.add(WRONG_SN, f"{prefix}{payload}: {'duplicate ' if a.duplicate else ''}ack says "
                                     f"p{a.partition} SN {a.sn}; stored at p{stored.partition} SN {stored.sn}")

    # failed / unsettled records: indeterminate, so stored at most once (duplicates above)
    failed = {e.payload for e in failures} - set(acks_by_payload)
    result.failed += len(failed)
    result.failed_stored += sum(1 for p in failed if p in copies)

    # (c) per (producer, partition key): submission order is SN order
    sessions: dict[tuple[str, str], list[Ack]] = defaultdict(list)
    for payload, its_acks in acks_by_payload.items():
        a = its_acks[0]
        if a.producer and a.seq >= 0 and a.sn is not None:
            sessions[(a.producer, a.partition_key)].append(a)
    for (producer, key), its_acks in sorted(sessions.items()):
        its_acks.sort(key=lambda a: a.seq)
        for before, after in zip(its_acks, its_acks[1:]):
            if after.sn <= before.sn:
                result.reorderings += 1
                result.add(REORDERING, f"{prefix}producer {producer} key {key!r}: {after.payload} (submitted "
                                       f"#{after.seq}) got SN {after.sn}, not above {before.payload} "
                                       f"(#{before.seq}) at SN {before.sn}")

    # (d) consumers
    result.observations += len(observations)
    _check_readers(result, prefix, by_partition, copies, observations, starts)


def _check_readers(result: CheckResult, prefix: str, by_partition: dict[int, list[ReadRecord]],
                   copies: dict[str, list[ReadRecord]], observations: list[Observation],
                   starts: list[ConsumerStart]) -> None:
    index = {p: {r.payload: i for i, r in reversed(list(enumerate(rows)))} for p, rows in by_partition.items()}
    from_horizon = {(s.consumer, s.partition) for s in starts if s.position == TRIM_HORIZON}
    runs: dict[tuple[str, int], list[Observation]] = defaultdict(list)
    for o in observations:
        runs[(o.consumer, o.partition)].append(o)

    def anomaly(kind: str, message: str) -> None:
        result.reader_anomalies += 1
        result.add(kind, message)

    for (consumer, partition), seen in sorted(runs.items()):
        who = f"{prefix}consumer {consumer} p{partition}"
        rows = by_partition.get(partition, [])
        previous_i = -1 if (consumer, partition) in from_horizon else None
        previous_sn: int | None = None
        for o in seen:
            stored = copies.get(o.payload)
            if not stored:
                anomaly(READER_LOST, f"{who}: saw {o.payload} at SN {o.sn} (t={o.time_s:.3f}); "
                                     f"it is not in the read-back")
                continue
            here = stored[0]
            if (here.partition, here.sn) != (partition, o.sn):
                anomaly(READER_WRONG_SN, f"{who}: saw {o.payload} at SN {o.sn}; the read-back has it at "
                                         f"p{here.partition} SN {here.sn}")
                if here.partition == partition:    # the record is where it was seen: go on from it
                    previous_i, previous_sn = index[partition][o.payload], here.sn
                continue
            i = index[partition][o.payload]
            if (previous_sn is not None and o.sn <= previous_sn) or (previous_i is not None and i <= previous_i):
                anomaly(READER_ORDER, f"{who}: saw {o.payload} at SN {o.sn} (read-back #{i}) after SN "
                                      f"{previous_sn} (#{previous_i})")
                continue                           # went back: the run goes on from where it was
            if previous_i is not None and i != previous_i + 1:
                skipped = rows[previous_i + 1:i]
                anomaly(READER_GAP, f"{who}: skipped {len(skipped)} records before {o.payload} at SN {o.sn}, "
                                    f"first {skipped[0].payload} at SN {skipped[0].sn}")
            previous_i, previous_sn = i, o.sn


def _check_resume(result: CheckResult, faults: Iterable[Fault], acks: Iterable[Ack],
                  resume_within_s: float | None) -> None:
    """(e) For each fault: the first ack of a record submitted at or after it (an ack
    without a submit time counts from its own time), within the fault's stream and
    partitions when it names them."""
    acks = sorted(acks, key=lambda a: a.time_s)
    for f in faults:
        first = next((a for a in acks
                      if a.time_s >= f.time_s and (a.sent_s is None or a.sent_s >= f.time_s)
                      and (f.stream is None or a.stream == f.stream)
                      and (f.partitions is None or a.partition in f.partitions)), None)
        recovery = FaultRecovery(f.kind, f.time_s, None if first is None else first.time_s - f.time_s)
        result.recoveries.append(recovery)
        scope = "" if f.partitions is None else f" on partitions {list(f.partitions)}"
        if first is None:
            result.no_resume += 1
            result.add(NO_RESUME, f"fault {f.kind} at t={f.time_s:.3f}: no record submitted after it was "
                                  f"acked{scope}")
        elif resume_within_s is not None and recovery.recovery_s > resume_within_s:
            result.add(SLOW_RESUME, f"fault {f.kind} at t={f.time_s:.3f}: first ack after {recovery.recovery_s:.2f}s"
                                    f"{scope}; allowed {resume_within_s}s")


# --- the table of a fault run -------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TrialRow:
    """One trial of a fault run: what was injected and the checker's result."""

    kind: str
    result: CheckResult


_COLUMNS = ("fault", "trials", "ok", "acked", "lost", "dups", "fault->ack p50 s", "max s")


def format_table(rows: Iterable[TrialRow | tuple[str, CheckResult]]) -> str:
    """One line per fault kind (in order of first appearance): trials, trials that
    passed, acked records, lost, duplicates, and the p50 and max time from a fault to the
    next ack over every fault of those trials ("never" when some fault saw none)."""
    by_kind: dict[str, list[CheckResult]] = {}
    for row in rows:
        kind, result = (row.kind, row.result) if isinstance(row, TrialRow) else row
        by_kind.setdefault(kind, []).append(result)
    lines = [_COLUMNS]
    for kind, results in by_kind.items():
        recoveries = [r.recovery_s for res in results for r in res.recoveries]
        times = [t for t in recoveries if t is not None]
        p50 = f"{statistics.median(times):.2f}" if times else "-"
        worst = "never" if None in recoveries else (f"{max(times):.2f}" if times else "-")
        lines.append((kind, str(len(results)), str(sum(r.ok for r in results)), str(sum(r.acked for r in results)),
                      str(sum(r.lost for r in results)), str(sum(r.duplicates for r in results)), p50, worst))
    widths = [max(len(line[i]) for line in lines) for i in range(len(_COLUMNS))]
    out = []
    for n, line in enumerate(lines):
        cells = [line[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(line[1:], widths[1:])]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)
