"""Producer fencing on an ingestion node: which epoch of each named producer is current.

A named producer writes under (producer id, epoch), the epoch taken from the cluster when
it opened (metastore/producers.py). `ProducerEpochs.admit` answers whether a request of
an epoch may be taken: an older epoch than the current one is refused with the
non-retriable `ProducerFenced`, so an earlier instance of the producer (a paused
"zombie") cannot write once its successor has opened.

The node keeps the verdict of each (stream, producer id) it checked for
PRODUCER_EPOCH_VERDICT_S, and re-reads the register after that (in the background from
half that age on, so a steady producer never waits for it). InitProducer of an id that
had an epoch answers only PRODUCER_EPOCH_VERDICT_S after it raised the register, so by
the time a new instance can write, every verdict that let the old epoch in has run out:
a zombie's next request reads the register again and is fenced. (On ZooKeeper, a read
served by a lagging follower can add that follower's lag to the bound.) `still_current`
is the same check without an await, made again right before records go into the
de-duplication table, after the awaits of a PutRecords call.

A request of an epoch higher than the register (it was deleted, or an operator rewrote
it) raises the register: epochs only rise.

The session fields stored with each record name the session by `session_producer_id`:
the id, then NUL and the epoch in 8 bytes. Writers without an epoch (SPS stage outputs
and the Spark sink pin their SSSNs across restarts) keep the bare id.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from metastore import MetaStore, MetaStoreError
from metastore import producers
from metastore.view import bounded
from sms import limits
from sms.errors import InvalidArgument, ProducerFenced, SmsError, Unavailable

log = logging.getLogger(__name__)


def session_producer_id(producer_id: bytes, epoch: int) -> bytes:
    """The name of an epoch's sessions in the de-duplication table and in stored records."""
    return producer_id + b"\x00" + epoch.to_bytes(8, "big") if epoch else producer_id


def split_session_producer_id(session_id: bytes) -> tuple[bytes, int]:
    """(producer id, epoch) of a stored session name: a name with NUL nine bytes from its
    end is read as an epoch's (see the module docstring), any other as the bare id."""
    suffix = limits.PRODUCER_EPOCH_SUFFIX_BYTES
    if len(session_id) > suffix and session_id[-suffix] == 0:
        return session_id[:-suffix], int.from_bytes(session_id[-suffix + 1:], "big")
    return session_id, 0


@dataclass(slots=True)
class _Verdict:
    epoch: int               # the current epoch, as last read (or raised) here
    checked_s: float         # monotonic time the read began


class ProducerEpochs:
    """The verdicts of one ingestion node (see the module docstring)."""

    def __init__(self, store: MetaStore, *, clock: Callable[[], float] = time.monotonic,
                 wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000) -> None:
        self.store = store
        self.clock = clock
        self.wall_ms = wall_ms
        self._verdicts: collections.OrderedDict[tuple[str, bytes], _Verdict] = collections.OrderedDict()
        self._reads: dict[tuple[str, bytes], asyncio.Future[int]] = {}    # one register read per key at a time
        self._tasks: set[asyncio.Task[None]] = set()
        self.fenced = 0          # requests refused, for status and tests

    async def admit(self, stream: str, producer_id: bytes, epoch: int) -> None:
        """Returns if a request of `epoch` may be taken now. ProducerFenced (an older
        epoch), Unavailable (the register could not be read in time), InvalidArgument."""
        if not 0 < epoch <= limits.PRODUCER_EPOCH_MAX:
            raise InvalidArgument(f"producer epoch {epoch}; expected 1..{limits.PRODUCER_EPOCH_MAX}")
        key = (stream, producer_id)
        verdict = self._verdicts.get(key)
        now = self.clock()
        if verdict is not None:
            self._verdicts.move_to_end(key)
            if epoch < verdict.epoch:
                self._refuse(stream, producer_id, epoch, verdict.epoch)
            age = now - verdict.checked_s
            if epoch == verdict.epoch and age < limits.PRODUCER_EPOCH_VERDICT_S:
                if age >= limits.PRODUCER_EPOCH_VERDICT_S / 2:
                    self._refresh_soon(key, epoch)
                return
        current = await self._read(key, epoch)
        if epoch < current:
            self._refuse(stream, producer_id, epoch, current)

    def still_current(self, stream: str, producer_id: bytes, epoch: int) -> bool:
        """admit()'s verdict, without reading: False when it has run out (or was never
        made, or a newer epoch was seen), so the caller answers retriably."""
        verdict = self._verdicts.get((stream, producer_id))
        return (verdict is not None and verdict.epoch == epoch
                and self.clock() - verdict.checked_s < limits.PRODUCER_EPOCH_VERDICT_S)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- internals ------------------------------------------------------------------------
    def _refuse(self, stream: str, producer_id: bytes, epoch: int, current: int) -> None:
        self.fenced += 1
        raise ProducerFenced(f"producer {_shown(producer_id)} of {stream!r}: epoch {epoch} was fenced by epoch "
                             f"{current} (another instance opened since); this instance must stop")

    async def _read(self, key: tuple[str, bytes], epoch: int) -> int:
        """The current epoch after a fresh read of the register (raised to `epoch` when
        that is higher); one read per key at a time, shared by its callers."""
        pending = self._reads.get(key)
        if pending is None:
            pending = self._reads[key] = asyncio.get_running_loop().create_future()
            try:
                current = await self._read_register(key, epoch)
            except BaseException as e:
                pending.set_exception(e if isinstance(e, SmsError) else Unavailable(f"producer epoch: {e}"))
                pending.exception()           # (retrieved: waiters, if any, get it too)
                raise
            finally:
                del self._reads[key]
            pending.set_result(current)
            return current
        current = await asyncio.shield(pending)
        if epoch > current:                  # (the shared read was for a lower epoch)
            return await self._read(key, epoch)
        return current

    async def _read_register(self, key: tuple[str, bytes], epoch: int) -> int:
        stream, producer_id = key
        started = self.clock()
        what = f"the epoch of producer {_shown(producer_id)} of {stream[:64]!r}"
        try:
            current = await bounded(producers.current_epoch(self.store, stream, producer_id), what)
            if epoch > current:
                current = await bounded(producers.raise_epoch(self.store, stream, producer_id, epoch,
                                                              self.wall_ms()), what)
        except MetaStoreError as e:         # (bounded() names most; a store error past it, here)
            raise Unavailable(f"{what} could not be read: {e}") from None
        self._remember(key, _Verdict(current, started))
        return current

    def _remember(self, key: tuple[str, bytes], verdict: _Verdict) -> None:
        old = self._verdicts.get(key)
        if old is not None and old.epoch > verdict.epoch:
            return          # (a read that began before a higher epoch was seen here)
        self._verdicts[key] = verdict
        self._verdicts.move_to_end(key)
        while len(self._verdicts) > limits.PRODUCER_EPOCHS_CACHED_MAX:
            self._verdicts.popitem(last=False)

    def _refresh_soon(self, key: tuple[str, bytes], epoch: int) -> None:
        if key in self._reads:
            return
        task = asyncio.get_running_loop().create_task(self._refresh(key, epoch), name="producer-epoch-refresh")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refresh(self, key: tuple[str, bytes], epoch: int) -> None:
        try:
            await self._read(key, epoch)
        except SmsError as e:
            log.info("refresh of a producer epoch failed (the next request reads it): %s", e.message)


def _shown(producer_id: bytes) -> str:
    """A producer id for a message: as text when it is printable UTF-8, else hex."""
    try:
        text = producer_id.decode("utf-8")
    except UnicodeDecodeError:
        return producer_id.hex()
    return repr(text) if text.isprintable() else producer_id.hex()
