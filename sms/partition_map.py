"""A stream's partition map: a DAG of partition entries with hash and validity ranges.

Each entry covers a hash range [lo, hi) of the 128-bit space and is valid for a range of
SN time [valid_from_ms, valid_to_ms). At creation the space splits into equal parts. A
repartition adds entries and closes parents; it never rewrites entries it does not
affect: `split` closes one entry and adds two children covering its range, `merge`
closes two adjacent entries and adds one child covering both, and `next_scale_step`
names the next split or merge toward N even ranges. A closed entry records its ending
SN and the boundary time from which its children govern; every SN's timestamp picks
the entries that governed it (`entries_at`). The map is stored as JSON in the metadata
store and read by every role; `version` is the metadata store's version of that entry.
These functions are pure: the switch protocol that seals parents and commits the new
map lives in the control role.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field, replace
from typing import Any

from sms import limits
from sms.errors import (InvalidSplitPoint, PartitionNotFound, PartitionNotOpen, PartitionsNotAdjacent,
                        TooManyPartitions)
from sms.hashing import HASH_SPACE
from sms.types import PartitionState


@dataclass(frozen=True, slots=True)
class PartitionEntry:
    ordinal: int
    hash_lo: int
    hash_hi: int
    valid_from_ms: int
    valid_to_ms: int | None = None
    parents: tuple[int, ...] = ()
    children: tuple[int, ...] = ()
    state: PartitionState = PartitionState.OPEN
    ending_sn: int | None = None

    def covers(self, hash_key: int) -> bool:
        return self.hash_lo <= hash_key < self.hash_hi

    def to_json(self) -> dict[str, Any]:
        return {
            "ordinal": self.ordinal, "hash_lo": str(self.hash_lo), "hash_hi": str(self.hash_hi),
            "valid_from_ms": self.valid_from_ms, "valid_to_ms": self.valid_to_ms,
            "parents": list(self.parents), "children": list(self.children),
            "state": self.state.value,
            "ending_sn": None if self.ending_sn is None else str(self.ending_sn),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "PartitionEntry":
        return cls(
            ordinal=d["ordinal"], hash_lo=int(d["hash_lo"]), hash_hi=int(d["hash_hi"]),
            valid_from_ms=d["valid_from_ms"], valid_to_ms=d["valid_to_ms"],
            parents=tuple(d["parents"]), children=tuple(d["children"]),
            state=PartitionState(d["state"]),
            ending_sn=None if d["ending_sn"] is None else int(d["ending_sn"]),
        )


# id(map) -> (map, range starts, open entries): the map is frozen and slotted, so its
# lookup index lives here; holding the map keeps its id from being reused
_OPEN_INDEX: dict[int, tuple["PartitionMap", list[int], list[PartitionEntry]]] = {}


@dataclass(frozen=True, slots=True)
class PartitionMap:
    entries: tuple[PartitionEntry, ...]
    version: int = 0
    next_ordinal: int = field(default=0)

    @classmethod
    def even(cls, partitions: int, now_ms: int) -> "PartitionMap":
        """`partitions` open entries splitting the hash space into equal ranges."""
        assert partitions >= 1
        bounds = [i * HASH_SPACE // partitions for i in range(partitions)] + [HASH_SPACE]
        entries = tuple(
            PartitionEntry(ordinal=i, hash_lo=bounds[i], hash_hi=bounds[i + 1], valid_from_ms=now_ms)
            for i in range(partitions))
        return cls(entries=entries, next_ordinal=partitions)

    def open_entries(self) -> list[PartitionEntry]:
        return [e for e in self.entries if e.state is PartitionState.OPEN]

    def entry(self, ordinal: int) -> PartitionEntry:
        for e in self.entries:
            if e.ordinal == ordinal:
                return e
        raise KeyError(ordinal)

    def open_for_hash(self, hash_key: int) -> PartitionEntry:
        """The open entry covering the hash key (KeyError if none): a bisect over the open
        entries sorted by range, built once per map (ingestion looks one up per record)."""
        index = _OPEN_INDEX.get(id(self))
        if index is None or index[0] is not self:
            opened = sorted(self.open_entries(), key=lambda e: e.hash_lo)
            index = (self, [e.hash_lo for e in opened], opened)
            if len(_OPEN_INDEX) >= limits.PARTITION_MAP_INDEXES_CACHED_MAX:
                _OPEN_INDEX.clear()
            _OPEN_INDEX[id(self)] = index
        _map, los, opened = index
        i = bisect.bisect_right(los, hash_key) - 1
        if i >= 0 and opened[i].covers(hash_key):
            return opened[i]
        raise KeyError(hash_key)

    def entries_at(self, ts_ms: int) -> list[PartitionEntry]:
        """The entries that governed SN time `ts_ms` (valid_from <= ts < valid_to)."""
        return [e for e in self.entries
                if e.valid_from_ms <= ts_ms and (e.valid_to_ms is None or ts_ms < e.valid_to_ms)]

    def _open(self, ordinal: int) -> PartitionEntry:
        try:
            e = self.entry(ordinal)
        except KeyError:
            raise PartitionNotFound(f"no partition p{ordinal:04d}") from None
        if e.state is not PartitionState.OPEN:
            raise PartitionNotOpen(f"partition p{ordinal:04d} is {e.state.value}; children "
                                   + ", ".join(f"p{c:04d}" for c in e.children))
        return e

    def _with_changes(self, closed: list[PartitionEntry], added: list[PartitionEntry]) -> "PartitionMap":
        opened = len(self.open_entries()) - len(closed) + len(added)
        if opened > limits.STREAM_PARTITIONS_MAX:
            raise TooManyPartitions(f"{opened} open partitions; at most {limits.STREAM_PARTITIONS_MAX}")
        if len(self.entries) + len(added) > limits.MAP_ENTRIES_MAX:
            raise TooManyPartitions(f"{len(self.entries) + len(added)} map entries; at most "
                                    f"{limits.MAP_ENTRIES_MAX} (closed partitions leave with retention)")
        by_ordinal = {e.ordinal: e for e in closed}
        entries = tuple(by_ordinal.get(e.ordinal, e) for e in self.entries) + tuple(added)
        return replace(self, entries=entries, next_ordinal=self.next_ordinal + len(added))

    def check_split(self, ordinal: int, at_hash: int | None = None) -> int:
        """The split point (the middle by default); a named error if the split is invalid."""
        e = self._open(ordinal)
        at = (e.hash_lo + e.hash_hi) // 2 if at_hash is None else at_hash
        if not e.hash_lo < at < e.hash_hi:
            raise InvalidSplitPoint(f"split at {at}: partition p{ordinal:04d} covers [{e.hash_lo}, {e.hash_hi}); "
                                    "the point must lie strictly inside")
        return at

    def split(self, ordinal: int, at_hash: int | None, boundary_ms: int, ending_sn: int) -> "PartitionMap":
        """Close `ordinal` at `ending_sn`; two children govern [lo, at) and [at, hi) from boundary_ms."""
        at = self.check_split(ordinal, at_hash)
        e = self.entry(ordinal)
        a, b = self.next_ordinal, self.next_ordinal + 1
        children = [PartitionEntry(a, e.hash_lo, at, boundary_ms, parents=(ordinal,)),
                    PartitionEntry(b, at, e.hash_hi, boundary_ms, parents=(ordinal,))]
        closed = replace(e, state=PartitionState.CLOSED, valid_to_ms=boundary_ms, children=(a, b),
                         ending_sn=ending_sn)
        return self._with_changes([closed], children)

    def check_merge(self, ordinal_a: int, ordinal_b: int) -> tuple[PartitionEntry, PartitionEntry]:
        """The two entries, lower range first; a named error if they cannot merge."""
        if ordinal_a == ordinal_b:
            raise PartitionsNotAdjacent(f"merge of p{ordinal_a:04d} with itself")
        a, b = sorted((self._open(ordinal_a), self._open(ordinal_b)), key=lambda e: e.hash_lo)
        if a.hash_hi != b.hash_lo:
            raise PartitionsNotAdjacent(f"p{a.ordinal:04d} [{a.hash_lo}, {a.hash_hi}) and p{b.ordinal:04d} "
                                        f"[{b.hash_lo}, {b.hash_hi}) are not adjacent")
        return a, b

    def merge(self, ordinal_a: int, ordinal_b: int, boundary_ms: int,
              ending_sns: dict[int, int]) -> "PartitionMap":
        """Close two adjacent entries; one child governs their union from boundary_ms."""
        a, b = self.check_merge(ordinal_a, ordinal_b)
        c = self.next_ordinal
        child = PartitionEntry(c, a.hash_lo, b.hash_hi, boundary_ms, parents=(a.ordinal, b.ordinal))
        closed = [replace(e, state=PartitionState.CLOSED, valid_to_ms=boundary_ms, children=(c,),
                          ending_sn=ending_sns[e.ordinal]) for e in (a, b)]
        return self._with_changes(closed, [child])

    def next_scale_step(self, target: int) -> tuple[str, int, int] | None:
        """The next change toward `target` even ranges, or None once the open partitions
        are exactly those ranges. Every step removes a boundary that is not a target one
        (a merge) or adds a target one (a split), so the plan ends; and it never has more
        than STREAM_PARTITIONS_MAX open partitions:
        1. ("merge", a, b) of two neighbours inside one target range;
        2. else, below the limit, ("split", ordinal, at) at the first target boundary
           strictly inside an open partition;
        3. else (at the limit) ("merge", a, b) of neighbours whose shared boundary is not
           a target one, which makes room for the split."""
        if not 1 <= target <= limits.STREAM_PARTITIONS_MAX:
            raise TooManyPartitions(f"scale to {target}; expected 1..{limits.STREAM_PARTITIONS_MAX}")
        bounds = [i * HASH_SPACE // target for i in range(target)] + [HASH_SPACE]
        wanted = set(bounds)
        opened = sorted(self.open_entries(), key=lambda e: e.hash_lo)

        def range_of(hash_key: int) -> int:        # index of the target range holding hash_key
            return bisect.bisect_right(bounds, hash_key) - 1

        wrong = [(a, b) for a, b in zip(opened, opened[1:]) if b.hash_lo not in wanted]
        for a, b in wrong:
            if range_of(a.hash_lo) == range_of(b.hash_hi - 1):
                return ("merge", a.ordinal, b.ordinal)
        if len(opened) < limits.STREAM_PARTITIONS_MAX:
            for e in opened:
                i = bisect.bisect_right(bounds, e.hash_lo)
                if i < len(bounds) and bounds[i] < e.hash_hi:
                    return ("split", e.ordinal, bounds[i])
        else:
            if any(bisect.bisect_right(bounds, e.hash_lo) < len(bounds)
                   and bounds[bisect.bisect_right(bounds, e.hash_lo)] < e.hash_hi for e in opened) and wrong:
                return ("merge", wrong[0][0].ordinal, wrong[0][1].ordinal)
        return None

    def without(self, ordinals: set[int]) -> "PartitionMap":
        """The map without closed entries that retention emptied (their children keep
        naming them as parents: a reader treats a parent that is gone as read)."""
        for o in ordinals:
            if self.entry(o).state is PartitionState.OPEN:
                raise ValueError(f"p{o:04d} is open")
        return replace(self, entries=tuple(e for e in self.entries if e.ordinal not in ordinals))

    def roots(self) -> list[PartitionEntry]:
        """Entries none of whose parents are in the map: where a reader from the start begins."""
        present = {e.ordinal for e in self.entries}
        return [e for e in self.entries if not any(p in present for p in e.parents)]

    def with_version(self, version: int) -> "PartitionMap":
        return replace(self, version=version)

    def to_bytes(self) -> bytes:
        return json.dumps({"entries": [e.to_json() for e in self.entries],
                           "next_ordinal": self.next_ordinal}).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, version: int = 0) -> "PartitionMap":
        d = json.loads(raw)
        return cls(entries=tuple(PartitionEntry.from_json(e) for e in d["entries"]),
                   version=version, next_ordinal=d["next_ordinal"])
