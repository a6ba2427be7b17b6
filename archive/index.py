"""The archive's index in the metadata store: one state entry per partition, with one
child per fragment.

    /streams/<name>/archive/<ordinal>          ArchiveState (JSON)
    /streams/<name>/archive/<ordinal>/<file>   a fragment (archive/fragment.py names it)

A fragment is added in one metadata commit that also moves the state's `archived_sn` to
its last SN, at the state's version read before the fragment was written: two writers
that archive the same run (an old tail that has not seen its replacement yet, and the
new one) both write the file, but only one commits; the other finds the version moved
and starts again from the new `archived_sn`. So no SN range is ever indexed twice, and
fragments follow each other without overlap. A file that no commit named (its writer was
killed, or lost the race) is an orphan: the archive's retention deletes it with the
fragments around it.

`verified_sn`: the fragments up to it were read back from the store and their checksums
held, after they were written. Replicas delete their local copies only up to it, so a
fragment that went bad in the store is rewritten from local data while there is some.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

from metastore import MetaStore, NoNodeError
from metastore.base import Check, Create, Delete, Op, Set
from sms import metadata
from archive.fragment import FragmentRef


@dataclass(frozen=True, slots=True)
class ArchiveState:
    archived_sn: int = 0          # the last SN archived (fragments are contiguous up to it)
    verified_sn: int = 0          # the last SN of fragments read back and found whole
    writer: str = ""              # the node that wrote the last fragment
    written_ms: int = 0           # when

    def to_bytes(self) -> bytes:
        d = asdict(self)
        d["archived_sn"], d["verified_sn"] = str(self.archived_sn), str(self.verified_sn)
        return json.dumps(d).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "ArchiveState":
        if not raw:
            return cls()
        d = json.loads(raw)
        return cls(archived_sn=int(d.get("archived_sn", 0)), verified_sn=int(d.get("verified_sn", 0)),
                   writer=str(d.get("writer", "")), written_ms=int(d.get("written_ms", 0)))


async def read_state(meta: MetaStore, stream: str, ordinal: int) -> tuple[ArchiveState, int] | None:
    """The partition's state and its version, or None if nothing was archived yet."""
    entry = await meta.get(metadata.archive_path(stream, ordinal))
    if entry is None:
        return None
    return ArchiveState.from_bytes(entry.value), entry.version


async def add_fragment(meta: MetaStore, stream: str, ordinal: int, ref: FragmentRef, details: dict,
                       known: tuple[ArchiveState, int] | None, writer: str, now_ms: int) -> ArchiveState:
    """Index one written fragment, at the state version the writer read (`known`; None:
    no state yet). Raises BadVersionError / NodeExistsError when another writer moved
    the state first: nothing is indexed, the caller reads the state again."""
    path = metadata.archive_path(stream, ordinal)
    child = Create(f"{path}/{ref.name}", json.dumps(details).encode())
    if known is None:
        state = ArchiveState(archived_sn=ref.last_sn, writer=writer, written_ms=now_ms)
        ops: list[Op] = [Create(path, state.to_bytes()), child]
        parent = f"{metadata.stream_path(stream)}/archive"
        if await meta.get(parent) is None:
            # made with the first fragment, and only while the stream is there (a create that
            # makes its parents would bring back a deleted stream's entry, empty)
            entry = await meta.get_strict(metadata.stream_path(stream))
            ops = [Check(metadata.stream_path(stream), entry.version), Create(parent)] + ops
        await meta.commit(ops)
        return state
    old, version = known
    state = replace(old, archived_sn=ref.last_sn, writer=writer, written_ms=now_ms)
    await meta.commit([Set(path, state.to_bytes(), expected_version=version), child])
    return state


async def set_verified(meta: MetaStore, stream: str, ordinal: int, known: tuple[ArchiveState, int],
                       verified_sn: int) -> None:
    old, version = known
    await meta.set(metadata.archive_path(stream, ordinal), replace(old, verified_sn=verified_sn).to_bytes(),
                   expected_version=version)


async def fragments(meta: MetaStore, stream: str, ordinal: int) -> list[FragmentRef]:
    """The partition's indexed fragments, oldest first."""
    try:
        names = await meta.children(metadata.archive_path(stream, ordinal))
    except NoNodeError:
        return []
    refs = [r for r in (FragmentRef.parse(n) for n in names) if r is not None]
    refs.sort(key=lambda r: r.first_sn)
    return refs


async def forget(meta: MetaStore, stream: str, ordinal: int, refs: list[FragmentRef]) -> None:
    """Remove fragments from the index (the archive's retention, after their files)."""
    path = metadata.archive_path(stream, ordinal)
    if refs:
        await meta.commit([Delete(f"{path}/{r.name}") for r in refs])
