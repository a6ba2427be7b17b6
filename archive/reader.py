"""Reads of archived records: what the retrieval role serves below a replica's local
trim point, from the fragments of the stream's archive (archive/fragment.py).

Answers are the stored batches as they were (the same bytes, SNs and checksums as a
local read), so a reader cannot tell the tiers apart: iterators, read_stream, groups
and the Spark source need nothing of their own.

Each retrieval node keeps
- each partition's fragment list, read from the index (archive/index.py) when a read
  goes past what it knows, at most every ARCHIVE_INDEX_REFRESH_S per partition;
- decoded fragments, least recently used first out, within ARCHIVE_CACHE_BYTES_MAX;
- a prefetch: a read that uses fragment k starts fetching the next
  ARCHIVE_PREFETCH_FRAGMENTS, so a reader catching up reads on while they arrive.
Fetches and decoding run on ARCHIVE_READ_THREADS threads; a fragment fetched once is
shared by every reader waiting for it.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from archive import fragment, index
from archive.fragment import Decoded, FragmentRef
from sms.objectstore import open_store
from metastore import MetaStore
from sms import limits, seqno, wire
from kernel import metrics
from sms.errors import ArchiveUnavailable, FragmentMissing, SmsError
from sms.metadata import StreamConfig


@dataclass(slots=True)
class ArchiveSlice:
    """Records [start, end) of one archived batch (the shape of a local read's slice)."""
    batch: bytes
    start: int
    end: int
    first_sn: int

    def sn_at(self, i: int) -> int:
        return self.first_sn + i * seqno.COUNTER_UNIT


@dataclass(slots=True)
class _Index:
    refs: list[FragmentRef] = field(default_factory=list)
    lasts: list[int] = field(default_factory=list)
    loaded_at: float = -1e9


class ArchiveReader:
    def __init__(self, meta: MetaStore):
        self.meta = meta
        self._indexes: dict[tuple[str, int], _Index] = {}
        self._cache: OrderedDict[str, Decoded] = OrderedDict()
        self._cache_bytes = 0
        self._loading: dict[str, asyncio.Task[Decoded]] = {}
        self._prefetching: set[asyncio.Task[None]] = set()
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=limits.ARCHIVE_READ_THREADS,
                                                              thread_name_prefix="archive-read")

    def close(self) -> None:
        for task in [*self._prefetching, *self._loading.values()]:
            task.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def _refs(self, stream: str, ordinal: int, from_sn: int, fresh: bool = False) -> list[FragmentRef]:
        key = (stream, ordinal)
        ix = self._indexes.get(key)
        now = time.monotonic()
        stale = ix is None or not ix.lasts or ix.lasts[-1] < from_sn
        if stale and (fresh or ix is None or now - ix.loaded_at >= limits.ARCHIVE_INDEX_REFRESH_S):
            refs = await index.fragments(self.meta, stream, ordinal)
            if len(self._indexes) >= limits.ARCHIVE_INDEXES_MAX:
                self._indexes.clear()
            ix = self._indexes[key] = _Index(refs, [r.last_sn for r in refs], now)
        return ix.refs if ix is not None else []

    def forget(self, stream: str, ordinal: int) -> None:
        """Read the partition's index again next time (a fragment was missing)."""
        self._indexes.pop((stream, ordinal), None)

    async def fragment(self, config: StreamConfig, ordinal: int, ref: FragmentRef) -> Decoded:
        key = fragment.partition_prefix(config.name, config.created_ms, ordinal) + ref.name
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            metrics.ARCHIVE_CACHE.labels("hit").inc()
            return hit
        pending = self._loading.get(key)
        if pending is not None:
            metrics.ARCHIVE_CACHE.labels("shared").inc()
            return await asyncio.shield(pending)
        metrics.ARCHIVE_CACHE.labels("miss").inc()
        # the fetch is a task of its own: a reader cancelled while it runs (its deadline)
        # never fails the others waiting for the same fragment
        task = asyncio.get_running_loop().create_task(self._load(config, key, ref))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())    # (retrieved: no warning)
        self._loading[key] = task
        return await asyncio.shield(task)

    async def _load(self, config: StreamConfig, key: str, ref: FragmentRef) -> Decoded:
        loop = asyncio.get_running_loop()
        try:
            decoded = await asyncio.wait_for(loop.run_in_executor(self.executor, _fetch, config.archive, key, ref),
                                             limits.ARCHIVE_STORE_CALL_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise ArchiveUnavailable(f"the archive store did not answer within "
                                     f"{limits.ARCHIVE_STORE_CALL_TIMEOUT_S:.0f} s") from None
        finally:
            self._loading.pop(key, None)
        self._cache[key] = decoded
        self._cache_bytes += decoded.size
        while self._cache_bytes > limits.ARCHIVE_CACHE_BYTES_MAX and len(self._cache) > 1:
            _k, old = self._cache.popitem(last=False)
            self._cache_bytes -= old.size
        return decoded

    def _prefetch(self, config: StreamConfig, ordinal: int, refs: list[FragmentRef]) -> None:
        for ref in refs:
            if len(self._prefetching) >= limits.ARCHIVE_PREFETCH_TASKS_MAX:
                return
            key = fragment.partition_prefix(config.name, config.created_ms, ordinal) + ref.name
            if key in self._cache or key in self._loading:
                continue
            task = asyncio.get_running_loop().create_task(self._prefetch_one(config, ordinal, ref))
            self._prefetching.add(task)
            task.add_done_callback(self._prefetching.discard)

    async def _prefetch_one(self, config: StreamConfig, ordinal: int, ref: FragmentRef) -> None:
        try:
            await self.fragment(config, ordinal, ref)
        except SmsError:        # (the read that needs it fetches again and sees the error)
            pass

    async def read(self, config: StreamConfig, ordinal: int, from_sn: int, upto_sn: int, max_records: int,
                   max_bytes: int, fresh: bool = False) -> list[ArchiveSlice]:
        """Archived batches holding records with from_sn <= SN <= upto_sn, as a local read
        gives them; [] when the archive holds none there. FragmentCorrupt or
        FragmentMissing for a fragment that cannot be read; ArchiveUnavailable (retriable)
        when the store cannot be reached."""
        if upto_sn < from_sn:
            return []
        try:
            return await self._read(config, ordinal, from_sn, upto_sn, max_records, max_bytes, fresh)
        except FragmentMissing:
            # the archive's retention may have deleted it since this node read the index
            self.forget(config.name, ordinal)
            return await self._read(config, ordinal, from_sn, upto_sn, max_records, max_bytes)

    async def _read(self, config: StreamConfig, ordinal: int, from_sn: int, upto_sn: int, max_records: int,
                    max_bytes: int, fresh: bool = False) -> list[ArchiveSlice]:
        refs = await self._refs(config.name, ordinal, from_sn, fresh)
        ix = self._indexes.get((config.name, ordinal))
        i = bisect.bisect_left(ix.lasts, from_sn) if ix is not None else len(refs)
        out: list[ArchiveSlice] = []
        records = size = 0
        position = from_sn
        while i < len(refs) and refs[i].first_sn <= upto_sn:
            try:
                frag = await self.fragment(config, ordinal, refs[i])
            except Exception:
                if out:
                    break        # what was read so far is served; the next read meets the error
                raise
            self._prefetch(config, ordinal, refs[i + 1:i + 1 + limits.ARCHIVE_PREFETCH_FRAGMENTS])
            for batch in frag.batches[frag.index_of(position):]:
                header = wire.read_header(batch)
                if header.first_sn > upto_sn:
                    break
                start = wire.index_at_or_after(header, position)
                end = min(wire.index_at_or_after(header, upto_sn + 1), start + (max_records - records))
                if end > start:
                    out.append(ArchiveSlice(batch, start, end, header.first_sn))
                    records += end - start
                    size += len(batch)
                if records >= max_records or size >= max_bytes or len(out) >= limits.STORAGE_READ_BATCHES_MAX:
                    break
            else:
                position = refs[i].last_sn + 1
                i += 1
                continue
            break
        if out:
            metrics.ARCHIVE_READ_RECORDS.labels(config.name).inc(records)
            metrics.ARCHIVE_READ_BYTES.labels(config.name).inc(size)
        return out


def _fetch(url: str, key: str, ref: FragmentRef) -> Decoded:
    """(a read thread) One fragment from the store, decoded and verified."""
    t0 = time.perf_counter()
    data = open_store(url).get(key)
    decoded = fragment.decode(ref, data)
    metrics.ARCHIVE_FETCH_SECONDS.observe(time.perf_counter() - t0)
    return decoded
