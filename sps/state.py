"""Keyed state of a stateful stage: aggregates per key, and per event-time window, kept in
memory per input partition and checkpointed through a changelog stream.

    count:
      inputs: [clicks_by_user]
      operation: examples.clickstream.ops:clicks_per_minute  # result rows: key, event time, values
      state:
        key: [user]                       # group by these result columns
        aggregates: {clicks: sum:count}   # NAME: count | sum:COLUMN | min:COLUMN | max:COLUMN
        window: {event_time: ts, size_s: 60, watermark_s: 120}   # tumbling, by event time (optional)
        emit: updates                     # each batch's changed totals; `final`: a window once it closes
        changelog: count-changelog        # default <stage>-changelog
        snapshot_every: 100               # batches between full snapshots in the changelog
      outputs: [{stream: user_minutes, key: user}]

The operation's result rows are folded into the state of the input partition they came
from; the stage's outputs are the state's rows: the key columns, `window_start` and
`window_end` (ms) when windowed, the aggregates, and `data` (all of those as JSON). So a
reader sees running totals, not partial sums. An operation may pre-aggregate a batch
(Spark's partial aggregation): `sum:count` over its per-batch counts gives exact totals.

Windows: a row goes to the window [start, start + size) holding its event time (ms).
The watermark of a partition is the largest event time it has seen, less watermark_s,
moved at the end of each batch (as Spark's): a row for a window that ended at or
before the watermark is late, and dropped (counted); a window that ends at or before it
is closed: its entry leaves the state (with `emit: final`, it is output then).

The changelog is an ordinary stream, written with the stage's outputs, exactly once (the
same SSSNs on a replay). Each batch of a partition writes one record (or several parts
of one, each at most SPS_STATE_CHANGELOG_RECORD_BYTES), keyed by the lease: the entries
the batch changed and removed, or, every `snapshot_every` batches, every entry (a
snapshot). A record carries the SN the batch ends at, so
the state at a checkpoint is the latest complete snapshot at or before it and the
deltas after that up to it (`restore`); the lease keeps the changelog SN of its latest
snapshot so that a worker taking it over reads from there, not from the start.

Hand-down on a split or merge: a child partition starts with its parents' final entries
whose first key column, taken as a partition key, hashes into the child's range. So the
first key column should be the input's partition key (as a Kafka Streams aggregation
needs its input keyed by the grouping key): the clickstream keys `clicks_by_user` by
user, and groups by user.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from sms import errors, limits
from sms.errors import StateError
from sms.hashing import hash_key_of

FUNCTIONS = ("count", "sum", "min", "max")
EMIT = ("updates", "final")
CHANGELOG_VERSION = 1


@dataclass(frozen=True, slots=True)
class Aggregate:
    name: str
    function: str                  # count | sum | min | max
    column: str = ""               # the result column summed, ... ("" for count)

    def to_doc(self) -> str:
        return self.function if self.function == "count" else f"{self.function}:{self.column}"


@dataclass(frozen=True, slots=True)
class Window:
    event_time: str                # result column: ms since the epoch (or a timestamp)
    size_ms: int
    watermark_ms: int


@dataclass(frozen=True, slots=True)
class StateSpec:
    key: tuple[str, ...]
    aggregates: tuple[Aggregate, ...]
    changelog: str
    window: Window | None = None
    emit: str = "updates"
    snapshot_every: int = limits.SPS_STATE_SNAPSHOT_EVERY_DEFAULT

    def to_doc(self) -> dict:
        d: dict = {"key": list(self.key), "aggregates": {a.name: a.to_doc() for a in self.aggregates},
                   "changelog": self.changelog, "emit": self.emit, "snapshot_every": self.snapshot_every}
        if self.window is not None:
            d["window"] = {"event_time": self.window.event_time, "size_s": self.window.size_ms / 1000,
                           "watermark_s": self.window.watermark_ms / 1000}
        return d

    @property
    def output_columns(self) -> tuple[str, ...]:
        windowed = ("window_start", "window_end") if self.window is not None else ()
        return self.key + windowed + tuple(a.name for a in self.aggregates)


def _column(value, where: str) -> str:
    if not isinstance(value, str) or not value or len(value) > limits.SPS_STATE_COLUMN_CHARS_MAX:
        raise StateError(f"{where}: {value!r}; expected a column name of 1..{limits.SPS_STATE_COLUMN_CHARS_MAX} "
                         "characters")
    return value


def parse_state(d, stage: str, where: str) -> StateSpec:
    """A stage's `state:` mapping, checked strictly (StateError names the field)."""
    where = f"{where}: state"
    if not isinstance(d, dict):
        raise StateError(f"{where}: expected a mapping with key, aggregates and optionally window, emit, "
                         "changelog, snapshot_every")
    unknown = set(d) - {"key", "aggregates", "window", "emit", "changelog", "snapshot_every"}
    if unknown:
        raise StateError(f"{where}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    key = d.get("key")
    if isinstance(key, str):
        key = [key]
    if not isinstance(key, list) or not key or len(key) > limits.SPS_STATE_KEY_COLUMNS_MAX:
        raise StateError(f"{where}: key must name 1..{limits.SPS_STATE_KEY_COLUMNS_MAX} result columns")
    key = tuple(_column(k, f"{where}: key") for k in key)
    if len(set(key)) != len(key):
        raise StateError(f"{where}: key names a column twice")
    raw = d.get("aggregates")
    if not isinstance(raw, dict) or not raw or len(raw) > limits.SPS_STATE_AGGREGATES_MAX:
        raise StateError(f"{where}: aggregates must map 1..{limits.SPS_STATE_AGGREGATES_MAX} names to count, "
                         "sum:COLUMN, min:COLUMN or max:COLUMN")
    aggregates = []
    for name, fn in raw.items():
        name = _column(name, f"{where}: aggregate name")
        if not isinstance(fn, str):
            raise StateError(f"{where}: aggregate {name!r}: {fn!r}; expected count, sum:COLUMN, min:COLUMN or "
                             "max:COLUMN")
        function, _, column = fn.partition(":")
        if function not in FUNCTIONS or (function == "count") != (column == ""):
            raise StateError(f"{where}: aggregate {name!r}: {fn!r}; expected count, sum:COLUMN, min:COLUMN or "
                             "max:COLUMN")
        aggregates.append(Aggregate(name, function, _column(column, f"{where}: aggregate {name!r}")
                                    if column else ""))
    window = None
    if d.get("window") is not None:
        w = d["window"]
        if not isinstance(w, dict) or set(w) - {"event_time", "size_s", "watermark_s"} or "event_time" not in w \
                or "size_s" not in w:
            raise StateError(f"{where}: window: expected {{event_time: COLUMN, size_s: S, watermark_s: S}}")
        bounds = {"size_s": (0.001, limits.SPS_STATE_WINDOW_S_MAX), "watermark_s": (0, limits.SPS_STATE_WINDOW_S_MAX)}
        values = {}
        for f, (lo, hi) in bounds.items():
            v = w.get(f, 0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise StateError(f"{where}: window: {f} {v!r}; expected {lo}..{hi} seconds")
            values[f] = int(round(v * 1000))
        window = Window(_column(w["event_time"], f"{where}: window: event_time"), values["size_s"],
                        values["watermark_s"])
    names = set(key) | {a.name for a in aggregates} | ({"window_start", "window_end"} if window else set())
    if len(names) != len(key) + len(aggregates) + (2 if window else 0) or "data" in names:
        raise StateError(f"{where}: the key columns, aggregate names and window_start/window_end must differ, "
                         "and none may be `data`")
    emit = d.get("emit", "updates")
    if emit not in EMIT:
        raise StateError(f"{where}: emit {emit!r}; expected one of {', '.join(EMIT)}")
    if emit == "final" and window is None:
        raise StateError(f"{where}: emit: final needs a window (only a window is ever final)")
    changelog = d.get("changelog") or f"{stage}-changelog"
    if not isinstance(changelog, str) or not changelog or len(changelog) > limits.STREAM_NAME_CHARS_MAX:
        raise StateError(f"{where}: changelog {changelog!r}; expected a stream name (with a stage name this long, "
                         "name it: its default is <stage>-changelog)")
    every = d.get("snapshot_every", limits.SPS_STATE_SNAPSHOT_EVERY_DEFAULT)
    if isinstance(every, bool) or not isinstance(every, int) or not 1 <= every <= limits.SPS_STATE_SNAPSHOT_EVERY_MAX:
        raise StateError(f"{where}: snapshot_every {every!r}; expected 1..{limits.SPS_STATE_SNAPSHOT_EVERY_MAX} "
                         "batches")
    return StateSpec(key, tuple(aggregates), changelog, window, emit, every)


def spec_from_doc(d: dict | None, stage: str) -> StateSpec | None:
    return None if d is None else parse_state(d, stage, f"stage {stage!r}")


# --- the state ------------------------------------------------------------------------

def _scalar(value, what: str, stage: str):
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            pass
    raise StateError(f"stage {stage!r}: {what} is a {type(value).__name__}; state keys are text, numbers, "
                     "booleans or null")


def _number(value, what: str, stage: str):
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    raise StateError(f"stage {stage!r}: {what} is a {type(value).__name__}; expected a number")


def _event_ms(value, what: str, stage: str) -> int:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return int(value.timestamp() * 1000)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    raise StateError(f"stage {stage!r}: {what} is {value!r}; expected ms since the epoch or a timestamp")


def _combine(function: str, a, b):
    if a is None:
        return b
    if b is None:
        return a
    if function in ("count", "sum"):
        return a + b
    return min(a, b) if function == "min" else max(a, b)


@dataclass
class Changes:
    """What one batch did to a partition's state."""
    changed: set = field(default_factory=set)           # keys this batch updated (still in the state)
    closed: list = field(default_factory=list)          # (key, values) of windows closed by the watermark
    closed_changed: list = field(default_factory=list)  # ... those of them this batch updated first
    late: int = 0                                       # rows dropped: their window had closed
    rejected: list = field(default_factory=list)        # (row, error) of rows the state cannot take


class KeyedState:
    """One input partition's entries: key tuple (with the window start last, when
    windowed) -> aggregate values, in the spec's order; and the watermark."""

    def __init__(self, spec: StateSpec, stage: str = ""):
        self.spec = spec
        self.stage = stage
        self.entries: dict[tuple, list] = {}
        self.max_event_ms: int | None = None

    @property
    def watermark_ms(self) -> int | None:
        if self.spec.window is None or self.max_event_ms is None:
            return None
        return self.max_event_ms - self.spec.window.watermark_ms

    def _empty(self) -> list:
        return [0 if a.function == "count" else None for a in self.spec.aggregates]

    def update(self, rows: Iterable[dict]) -> Changes:
        """Fold result rows in: the keys changed, the windows closed, the late rows, and the
        rows it cannot take (rejected, with why: the worker dead-letters them)."""
        changes = Changes()
        watermark = self.watermark_ms
        batch_max = None
        for row in rows:
            try:
                key, t, values = self._take(row, watermark)
            except (StateError, errors.LimitExceeded) as e:
                changes.rejected.append((row, e.message))
                continue
            if key is None:
                changes.late += 1
                continue
            if t is not None:
                batch_max = t if batch_max is None or t > batch_max else batch_max
            entry = self.entries.get(key)
            if entry is None:
                entry = self.entries[key] = self._empty()
            for i, (function, v) in enumerate(values):
                entry[i] = entry[i] + 1 if function == "count" else _combine(function, entry[i], v)
            changes.changed.add(key)
        if batch_max is not None and (self.max_event_ms is None or batch_max > self.max_event_ms):
            self.max_event_ms = batch_max
        changes.closed = self.close_windows()
        for k, values in changes.closed:
            if k in changes.changed:          # (updated by this batch, then closed: its last update)
                changes.changed.discard(k)
                changes.closed_changed.append((k, values))
        return changes

    def _take(self, row: dict, watermark: int | None) -> tuple[tuple | None, int | None, list]:
        """A row checked before it changes anything: (its entry's key, or None when late;
        its event time; (function, value) per aggregate). StateError or LimitExceeded when
        the state cannot take it."""
        spec, stage, window = self.spec, self.stage, self.spec.window
        try:
            key = tuple(_scalar(row[k], f"key column {k!r}", stage) for k in spec.key)
        except KeyError as e:
            raise StateError(f"stage {stage!r}: a result row has no key column {e.args[0]!r}; it has "
                             f"{sorted(row)}") from None
        t = None
        if window is not None:
            if row.get(window.event_time) is None:
                raise StateError(f"stage {stage!r}: a result row has no event time {window.event_time!r}; it "
                                 f"has {sorted(row)}")
            t = _event_ms(row[window.event_time], f"event time {window.event_time!r}", stage)
            start = t - t % window.size_ms
            if watermark is not None and start + window.size_ms <= watermark:
                return None, None, []
            key = key + (start,)
        values = []
        for a in spec.aggregates:
            if a.function == "count":
                values.append(("count", 1))
                continue
            if a.column not in row:
                raise StateError(f"stage {stage!r}: a result row has no column {a.column!r} for aggregate "
                                 f"{a.name!r}; it has {sorted(row)}")
            values.append((a.function, _number(row[a.column], f"column {a.column!r}", stage)))
        if key not in self.entries and len(self.entries) >= limits.SPS_STATE_ENTRIES_MAX:
            raise errors.LimitExceeded(f"stage {stage!r}: a partition's state holds {len(self.entries)} entries; "
                                       f"at most {limits.SPS_STATE_ENTRIES_MAX} (a window with a watermark bounds it)")
        return key, t, values

    def close_windows(self) -> list[tuple[tuple, list]]:
        """Remove the windows that end at or before the watermark: (key, values) of each."""
        watermark = self.watermark_ms
        if watermark is None:
            return []
        size = self.spec.window.size_ms
        closed = sorted(((k, v) for k, v in self.entries.items() if k[-1] + size <= watermark),
                        key=lambda kv: _sort_key(kv[0]))
        for k, _ in closed:
            del self.entries[k]
        return closed

    def row(self, key: tuple, values: list) -> dict:
        """An output row: key columns, window bounds, aggregates, and all of them as JSON `data`."""
        spec = self.spec
        out: dict = dict(zip(spec.key, key))
        if spec.window is not None:
            out["window_start"] = key[-1]
            out["window_end"] = key[-1] + spec.window.size_ms
        for a, v in zip(spec.aggregates, values):
            out[a.name] = v
        out["data"] = json.dumps(out, separators=(",", ":"), sort_keys=False)
        return out

    def output_rows(self, changes: Changes) -> list[dict]:
        """What a batch outputs: its changed entries (emit: updates), or the windows it closed
        (emit: final); in key order, the same on a replay."""
        if self.spec.emit == "final":
            return [self.row(k, v) for k, v in changes.closed]
        updated = [(k, self.entries[k]) for k in changes.changed] + changes.closed_changed
        return [self.row(k, v) for k, v in sorted(updated, key=lambda kv: _sort_key(kv[0]))]

    # --- the changelog ------------------------------------------------------------------
    def changelog_records(self, end_sn: int, changes: Changes | None, snapshot: bool) -> list[bytes]:
        """The changelog record(s) of a batch ending at `end_sn`: a delta of `changes`, or a
        snapshot of every entry; in parts of at most SPS_STATE_CHANGELOG_RECORD_BYTES."""
        if snapshot or changes is None:
            puts = [_entry(k, v) for k, v in sorted(self.entries.items(), key=lambda kv: _sort_key(kv[0]))]
            dels: list[str] = []
        else:
            puts = [_entry(k, self.entries[k]) for k in sorted(changes.changed, key=_sort_key)]
            dels = [json.dumps(list(k), separators=(",", ":")) for k, _ in changes.closed]
        kind = "snapshot" if snapshot or changes is None else "delta"
        head = {"v": CHANGELOG_VERSION, "kind": kind, "end": str(end_sn), "max_event_ms": self.max_event_ms}
        budget = limits.SPS_STATE_CHANGELOG_RECORD_BYTES - 200
        parts: list[tuple[list[str], list[str]]] = [([], [])]
        size = 0
        for which, items in ((0, puts), (1, dels)):
            for item in items:
                if len(item) > budget:
                    raise errors.LimitExceeded(f"stage {self.stage!r}: a state entry of {len(item)} bytes; at most "
                                               f"{budget}")
                if size + len(item) + 1 > budget and (parts[-1][0] or parts[-1][1]):
                    parts.append(([], []))
                    size = 0
                parts[-1][which].append(item)
                size += len(item) + 1
        out = []
        for i, (p, d) in enumerate(parts):
            doc = json.dumps({**head, "part": i, "parts": len(parts)}, separators=(",", ":"))
            out.append((doc[:-1] + ',"put":[' + ",".join(p) + '],"del":[' + ",".join(d) + "]}").encode())
        return out

    def load(self, docs: list[dict], upto_sn: int | None) -> int:
        """This state as of the checkpoint `upto_sn` (None: everything; the final state of a
        partition read to its end) from one partition's changelog documents: the latest
        complete snapshot at or before it, then the deltas after that snapshot up to it.
        Returns how many batches' deltas came after the snapshot."""
        kept = [d for d in docs if upto_sn is None or int(d["end"]) <= upto_sn]
        parts: dict[int, set[int]] = {}
        for d in kept:
            if d["kind"] == "snapshot":
                parts.setdefault(int(d["end"]), set()).add(d["part"])
        wanted = {end for end, got in parts.items()
                  if all(len(got) == d["parts"] for d in kept if d["kind"] == "snapshot" and int(d["end"]) == end)}
        base = max(wanted, default=None)
        self.entries = {}
        self.max_event_ms = None
        for d in sorted(kept, key=lambda d: (int(d["end"]), d["part"])):
            end = int(d["end"])
            if base is not None and (end < base or (end == base and d["kind"] != "snapshot")):
                continue
            if d["kind"] == "snapshot" and end not in wanted:
                continue        # (parts of a snapshot that never completed: a replay wrote a delta there)
            for key, values in d["put"]:
                self.entries[tuple(key)] = list(values)
            for key in d["del"]:
                self.entries.pop(tuple(key), None)
            if d.get("max_event_ms") is not None:
                self.max_event_ms = d["max_event_ms"]
        return len({int(d["end"]) for d in kept if base is None or int(d["end"]) > base})

    def adopt(self, parent: "KeyedState", hash_lo: int, hash_hi: int) -> None:
        """Take a parent partition's entries whose first key column hashes into
        [hash_lo, hash_hi) (a split or merge hands state down); two parents' entries of one
        key are combined."""
        for key, values in parent.entries.items():
            if not hash_lo <= hash_key_of(str(key[0])) < hash_hi:
                continue
            mine = self.entries.get(key)
            if mine is None:
                self.entries[key] = list(values)
            else:
                self.entries[key] = [_combine(a.function, x, y) for a, x, y in zip(self.spec.aggregates, mine, values)]
        if parent.max_event_ms is not None and (self.max_event_ms is None or parent.max_event_ms > self.max_event_ms):
            self.max_event_ms = parent.max_event_ms


def _entry(key: tuple, values: list) -> str:
    return json.dumps([list(key), values], separators=(",", ":"))


def _sort_key(key: tuple) -> tuple:
    # (keys may mix types, e.g. a null among text: order by type name, then value)
    return tuple((type(v).__name__, v) if v is not None else ("", 0) for v in key)


def parse_changelog(data: bytes) -> dict:
    """A changelog record's document; StateError if it is not one this version reads."""
    try:
        d = json.loads(data)
        if d.get("v") != CHANGELOG_VERSION or d["kind"] not in ("delta", "snapshot"):
            raise ValueError(f"version {d.get('v')!r}, kind {d.get('kind')!r}")
        int(d["end"])
        if not isinstance(d["put"], list) or not isinstance(d["del"], list) or not 0 <= d["part"] < d["parts"]:
            raise ValueError("put, del or part")
        if not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], list) and isinstance(p[1], list)
                   for p in d["put"]) or not all(isinstance(k, list) for k in d["del"]):
            raise ValueError("an entry is not [key, values]")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise StateError(f"not a changelog record of version {CHANGELOG_VERSION}: {e}") from None
    return d
