"""The epochs of named producers: one entry per (stream, producer id) in the metadata store.

A producer that opens with a `producer_id` asks the cluster for a new epoch (Kafka's
InitProducerId). Its sessions are then (id, epoch): a restarted producer never collides
with its earlier self, and the ingestion owners refuse writes of older epochs
(`ProducerFenced`, ingestion/fencing.py). The entry at
`/streams/<stream>/producers/<id hex>` is a register that only rises: `open_epoch` sets it
to max(current + 1, the wall clock in ms), and an ingestion node that meets a higher epoch
than the register holds raises it (`raise_epoch`). Epochs drawn from the clock keep
rising even if an entry is lost (deleted with its stream, or by an operator): an instance
opened later always has the higher epoch, unless the clock went back further than the
time between the two opens.

The module owns the entry's format and the three operations; the control service's
InitProducer calls `open_epoch`, `ingestion/fencing.py` calls `current_epoch` and
`raise_epoch`. Values are JSON: {"epoch": int, "opened_ms": int}.
"""

from __future__ import annotations

import json

from metastore import BadVersionError, Check, Create, MetaStore, NodeExistsError, NoNodeError, Set
from sms import limits, metadata
from sms.errors import StreamNotActive, StreamNotFound
from sms.metadata import StreamConfig
from sms.types import StreamStatus


def _encode(epoch: int, opened_ms: int) -> bytes:
    return json.dumps({"epoch": epoch, "opened_ms": opened_ms}, separators=(",", ":")).encode()


def _decode(raw: bytes) -> int:
    try:
        epoch = json.loads(raw)["epoch"]
    except (ValueError, KeyError, TypeError):
        return 0          # a damaged entry fences nothing; the next open or write rewrites it
    return epoch if isinstance(epoch, int) and 0 < epoch <= limits.PRODUCER_EPOCH_MAX else 0


async def _ensure_dir(store: MetaStore, stream: str) -> None:
    """The stream's producers entry, made only while the stream is active (a create under
    a deleted stream would bring its path back)."""
    directory = metadata.producers_path(stream)
    for _attempt in range(limits.METASTORE_CAS_ATTEMPTS_MAX):
        if await store.get(directory) is not None:
            return
        entry = await store.get(metadata.stream_path(stream))
        if entry is None:
            raise StreamNotFound(f"stream {stream!r} does not exist")
        if StreamConfig.from_bytes(entry.value).status is not StreamStatus.ACTIVE:
            raise StreamNotActive(f"stream {stream!r} is not active")
        try:
            await store.commit([Check(metadata.stream_path(stream), entry.version), Create(directory)])
            return
        except NodeExistsError:
            return
        except (BadVersionError, NoNodeError):
            continue      # the stream changed meanwhile: look again
    raise StreamNotActive(f"stream {stream!r} kept changing; retry")


async def current_epoch(store: MetaStore, stream: str, producer_id: bytes) -> int:
    """The id's current epoch, 0 if it has none."""
    entry = await store.get(metadata.producer_path(stream, producer_id))
    return 0 if entry is None else _decode(entry.value)


async def open_epoch(store: MetaStore, stream: str, producer_id: bytes, now_ms: int) -> tuple[int, int]:
    """A new epoch for the id, above every earlier one: (new epoch, the one it replaces,
    0 if none). StreamNotFound, StreamNotActive."""
    await _ensure_dir(store, stream)
    path = metadata.producer_path(stream, producer_id)
    for _attempt in range(limits.METASTORE_CAS_ATTEMPTS_MAX):
        entry = await store.get(path)
        previous = 0 if entry is None else _decode(entry.value)
        epoch = max(previous + 1, now_ms)
        try:
            if entry is None:
                await store.commit([Create(path, _encode(epoch, now_ms))])
            else:
                await store.set(path, _encode(epoch, now_ms), entry.version)
            return epoch, previous
        except (NodeExistsError, BadVersionError):
            continue      # another open (or a write of a higher epoch) meanwhile
        except NoNodeError:
            await _ensure_dir(store, stream)     # (raises if the stream went)
    raise StreamNotActive(f"the epoch of a producer of {stream!r} kept changing; retry")


async def raise_epoch(store: MetaStore, stream: str, producer_id: bytes, epoch: int, now_ms: int) -> int:
    """Make `epoch` the id's current one unless a higher one is there already; returns
    the current epoch after the call (>= `epoch` means it is current)."""
    path = metadata.producer_path(stream, producer_id)
    for _attempt in range(limits.METASTORE_CAS_ATTEMPTS_MAX):
        entry = await store.get(path)
        current = 0 if entry is None else _decode(entry.value)
        if current >= epoch:
            return current
        try:
            if entry is None:
                await _ensure_dir(store, stream)
                await store.commit([Create(path, _encode(epoch, now_ms))])
            else:
                await store.set(path, _encode(epoch, now_ms), entry.version)
            return epoch
        except (NodeExistsError, BadVersionError):
            continue
        except NoNodeError:
            raise StreamNotFound(f"stream {stream!r} does not exist") from None
    raise StreamNotActive(f"the epoch of a producer of {stream!r} kept changing; retry")
