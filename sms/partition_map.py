"""A stream's partition map: a DAG of partition entries with hash and validity ranges.

Each entry covers a hash range [lo, hi) of the 128-bit space and is valid for a range of
SN time [valid_from_ms, valid_to_ms). At creation the space splits into equal parts. A
repartition (a later issue) adds entries and closes parents; it never rewrites entries
it does not affect. The map is stored as JSON in the metadata store and read by every
role; `version` is the metadata store's version of that entry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

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

    def to_json(self) -> dict:
        return {
            "ordinal": self.ordinal, "hash_lo": str(self.hash_lo), "hash_hi": str(self.hash_hi),
            "valid_from_ms": self.valid_from_ms, "valid_to_ms": self.valid_to_ms,
            "parents": list(self.parents), "children": list(self.children),
            "state": self.state.value,
            "ending_sn": None if self.ending_sn is None else str(self.ending_sn),
        }

    @classmethod
    def from_json(cls, d: dict) -> "PartitionEntry":
        return cls(
            ordinal=d["ordinal"], hash_lo=int(d["hash_lo"]), hash_hi=int(d["hash_hi"]),
            valid_from_ms=d["valid_from_ms"], valid_to_ms=d["valid_to_ms"],
            parents=tuple(d["parents"]), children=tuple(d["children"]),
            state=PartitionState(d["state"]),
            ending_sn=None if d["ending_sn"] is None else int(d["ending_sn"]),
        )


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
        for e in self.entries:
            if e.state is PartitionState.OPEN and e.covers(hash_key):
                return e
        raise KeyError(hash_key)

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
