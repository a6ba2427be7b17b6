"""The load of a fault trial: de-duplicating producers and tailing consumers against a
real cluster, recording everything into a `History` (tests/fault/history.py).

`Workload` runs on a private asyncio loop in a daemon thread of the test process, so
the pytest thread stays free to kill, pause and restart nodes meanwhile. It runs:
- N producers, each the real `sms.producer.Producer` (through `sms.aio.Client.producer`)
  with its own producer id, sending unique payloads ("<name><i>-<seq>", padded) under K
  partition keys, paced by an optional rate and by a bound on un-settled records; each
  submission, ack (partition, SN, duplicate flag) and final error goes to the history;
- M consumers, each with its own client, tailing every partition of the stream from
  TRIM_HORIZON with get_next_records and recording every record seen. They follow the
  stream's lineage across repartitions: they start at the roots of the map (partitions
  with no parent left in it), and a partition read to its end (closed: no next
  iterator) starts the tailing of each child it names, once per consumer. They ride out
  node failures: a failed call is retried with the same iterator (the client tries
  other replicas), the client is replaced after repeated failures, and a lost iterator
  (expired, invalid) is replaced by one AFTER_SEQUENCE_NUMBER the last SN seen.

`stop(timeout_s)` stops producing, waits within the deadline for every outstanding
record to be acked or to fail for good (what is still open then is recorded as
"Unsettled", an indeterminate record), gives consumers until the deadline to reach
the last acked SN of each partition, then stops them. `read_back` reads the whole
stream back for `check()`: every partition the map holds, closed ones to their end;
`read_lineage` reads it once more through `client.read_stream` (parents before
children) for a cross-check. Tests use it as a context manager, so a failing test still
stops the load before its cluster goes away.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable

import sms
import sms.aio
from sms import errors, limits
from sms.types import PartitionState, parse_partition_id
from tests.fault.history import TRIM_HORIZON, History, Observation, ReadRecord

log = logging.getLogger(__name__)

PAYLOAD_SEPARATOR = b"|"
START_TIMEOUT_S = 30.0                 # start(): the stream's partitions are known by then
STOP_TIMEOUT_S_DEFAULT = 60.0
STOP_MARGIN_S = 30.0                   # stop(): beyond its deadline, for cancelling and closing
SEND_BACKOFF_S = 0.05                  # after a refused send (no map, no owner yet)
READ_BACKOFF_S = 0.05                  # after a failed read, doubling ...
READ_BACKOFF_S_MAX = 1.0               # ... up to this
READ_FAILURES_BEFORE_RENEW = 3         # consecutive failed reads before a consumer replaces its client
READ_PAGE_RECORDS = 1_000
CONSUMER_WAIT_MS_DEFAULT = 200         # long-poll of a caught-up consumer
CATCH_UP_POLL_S = 0.05
RATE_BURST_S_MAX = 1.0                 # a paced producer that fell behind catches up at most this much
READ_BACK_CALLS_MAX = 10_000           # get_next_records calls per partition in one read-back
READ_BACK_POLL_S = 0.1

assert READ_BACKOFF_S <= READ_BACKOFF_S_MAX
assert READ_PAGE_RECORDS <= limits.GET_RECORDS_COUNT_MAX
assert CONSUMER_WAIT_MS_DEFAULT <= limits.GET_RECORDS_WAIT_MS_MAX


# --- payloads ---------------------------------------------------------------------------------
def encode_payload(payload_id: str, size: int = 0) -> bytes:
    """The record's bytes: its id, the separator, padding up to `size` bytes in all."""
    head = payload_id.encode() + PAYLOAD_SEPARATOR
    return head + b"x" * max(0, size - len(head))


def payload_id_of(data: bytes) -> str:
    """The id inside a record's bytes (all of them, decoded leniently, if not ours)."""
    head, sep, _ = data.partition(PAYLOAD_SEPARATOR)
    return (head if sep else data).decode("utf-8", errors="backslashreplace")


ClientFactory = Callable[[], "sms.aio.Client"]


def _address_factory(addresses: list[str]) -> ClientFactory:
    """New `sms.aio.Client`s, each on the next address in turn."""
    turn = iter(range(1 << 62))

    def make() -> sms.aio.Client:
        return sms.aio.Client(addresses[next(turn) % len(addresses)])
    return make


class WorkloadCrashed(RuntimeError):
    """The workload's own loop failed (a bug in the workload or an unexpected exception
    from the client library); the cause is chained."""


class _Reader:
    """A consumer's client, replaced after repeated failures. Replaced clients are kept
    open until the consumer ends: closing one would cancel sibling reads in flight."""

    def __init__(self, factory: ClientFactory):
        self._factory = factory
        self.client: sms.aio.Client = factory()
        self.generation = 0
        self._retired: list[sms.aio.Client] = []

    def renew(self, generation: int) -> bool:
        """Replace the client unless another read already replaced it since `generation`."""
        if generation != self.generation:
            return False
        self._retired.append(self.client)
        self.client = self._factory()
        self.generation += 1
        return True

    async def close(self) -> None:
        for client in [*self._retired, self.client]:
            try:
                await client.close()
            except Exception:                      # closing is best effort at shutdown
                log.debug("closing a consumer client failed", exc_info=True)


class Workload:
    """Producers and tailing consumers on one stream (module docstring).

    target: a node address ("HOST:PORT"), a list of addresses (clients take them in
    turn), or a factory returning a new `sms.aio.Client` (called on the workload's loop).
    records: total records to submit (None: until stop()); rate_per_s: total submissions
    per second (None: as fast as max_outstanding un-settled records per producer allow).
    max_outstanding bounds a producer's un-settled records over all partitions, so a
    partition that stops acking stalls that producer's other partitions once the bound is
    reached; scope a fault to its partitions (mark_fault) to time its recovery alone.
    """

    def __init__(self, target: str | Iterable[str] | ClientFactory, stream: str, *, producers: int = 4,
                 keys: int = 16, consumers: int = 1, records: int | None = None, rate_per_s: float | None = None,
                 max_outstanding: int = 500, payload_bytes: int = 48, delivery_timeout_s: float = 60.0,
                 linger_ms: float = 5, consumer_wait_ms: int = CONSUMER_WAIT_MS_DEFAULT,
                 history: History | None = None, name: str = "w", seed: int = 0):
        if not (producers >= 1 and keys >= 1 and consumers >= 0 and max_outstanding >= 1):
            raise ValueError(f"producers={producers} keys={keys} consumers={consumers} "
                             f"max_outstanding={max_outstanding}; expected >= 1 (consumers >= 0)")
        if records is not None and records < 0 or rate_per_s is not None and rate_per_s <= 0:
            raise ValueError(f"records={records} rate_per_s={rate_per_s}; expected records >= 0, rate > 0")
        if callable(target):
            self._new_client: ClientFactory = target
        else:
            addresses = [target] if isinstance(target, str) else list(target)
            if not addresses:
                raise ValueError("no address to connect to")
            self._new_client = _address_factory(addresses)
        self.stream = stream
        self.producers = producers
        self.keys = keys
        self.consumers = consumers
        self.records = records
        self.rate_per_s = rate_per_s
        self.max_outstanding = max_outstanding
        self.payload_bytes = payload_bytes
        self.delivery_timeout_s = delivery_timeout_s
        self.linger_ms = linger_ms
        self.consumer_wait_ms = consumer_wait_ms
        self.history = history or History()
        self.name = name
        self.seed = seed
        self._run_tag = uuid.uuid4().hex[:8]       # producer ids differ between workloads and runs
        self.partitions: list[int] = []           # the map's ordinals at start()
        self.roots: list[int] = []                # ... of which consumers start at these
        self.followed: dict[str, set[int]] = {}   # consumer -> partitions it tails (or tailed)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._stopped = False
        self._crash: BaseException | None = None
        self._stats_lock = threading.Lock()
        self._read_errors: Counter = Counter()
        self._renewals = 0
        self._iterator_renewals = 0
        self._positions: dict[tuple[str, int], int] = {}      # (consumer, partition) -> last SN seen
        self._outstanding: dict[str, dict[asyncio.Future, tuple]] = {}
        self._producer_stats: dict[str, dict] = {}

    # --- the pytest thread's side ----------------------------------------------------------
    def start(self) -> "Workload":
        errors.invariant(self._thread is None, "a Workload starts once")
        self._thread = threading.Thread(target=self._thread_main, name=f"workload-{self.stream}", daemon=True)
        self._thread.start()
        if not self._started.wait(START_TIMEOUT_S + 5):
            raise TimeoutError(f"workload on {self.stream!r} did not start within {START_TIMEOUT_S}s")
        self._raise_if_crashed()
        return self

    def stop(self, timeout_s: float = STOP_TIMEOUT_S_DEFAULT) -> dict:
        """Stop producing; wait up to timeout_s for outstanding acks (or their final
        errors) and for consumers to reach the last acked SNs; stop. Idempotent. Returns
        statistics(); raises WorkloadCrashed if the workload's loop failed."""
        if self._thread is not None and not self._stopped:
            self._stopped = True
            loop = self._loop
            if loop is not None and self._thread.is_alive() and not loop.is_closed():
                try:
                    asyncio.run_coroutine_threadsafe(self._stop(timeout_s), loop).result(timeout_s + STOP_MARGIN_S)
                except RuntimeError:               # the loop ended meanwhile (it crashed)
                    pass
            self._thread.join(STOP_MARGIN_S)
            errors.invariant(not self._thread.is_alive(), f"workload on {self.stream!r} did not stop")
        self._raise_if_crashed()
        return self.statistics()

    def __enter__(self) -> "Workload":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.stop(10.0 if exc_type else STOP_TIMEOUT_S_DEFAULT)
        except WorkloadCrashed:
            if exc_type is None:
                raise

    def acked_count(self) -> int:
        return self.history.acked_count(self.stream)

    def submitted_count(self) -> int:
        return sum(1 for e in self.history.submits if e.stream == self.stream)

    def wait_acks(self, n: int, timeout_s: float) -> int:
        """Poll until at least n distinct records are acked; AssertionError with the
        statistics if the deadline passes first. Returns the count."""
        deadline = time.monotonic() + timeout_s
        while True:
            self._raise_if_crashed()
            count = self.acked_count()
            if count >= n:
                return count
            if time.monotonic() > deadline:
                raise AssertionError(f"{count} of {n} records acked after {timeout_s}s; {self.statistics()}")
            time.sleep(0.02)

    def mark_fault(self, kind: str, partitions: Iterable[int] | None = None):
        """Record that a fault of this kind happens now (call it right before injecting
        it); `partitions`: only acks of these partitions show that writes resumed."""
        return self.history.mark_fault(kind, stream=self.stream, partitions=partitions)

    def statistics(self) -> dict:
        errs = Counter(e.error for e in self.history.errors if e.stream == self.stream)
        with self._stats_lock:
            return {"submitted": self.submitted_count(), "acked": self.acked_count(), "errors": dict(errs),
                    "observations": sum(1 for o in self.history.observations if o.stream == self.stream),
                    "read_errors": dict(self._read_errors), "client_renewals": self._renewals,
                    "iterator_renewals": self._iterator_renewals, "producers": dict(self._producer_stats),
                    "crashed": repr(self._crash) if self._crash else None}

    def _raise_if_crashed(self) -> None:
        if self._crash is not None:
            raise WorkloadCrashed(f"workload on {self.stream!r} failed: {self._crash!r}") from self._crash

    # --- the loop thread --------------------------------------------------------------------
    def _thread_main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        finally:
            self._started.set()
            try:
                _cancel_leftovers(loop)
            finally:
                loop.close()

    async def _main(self) -> None:
        self._stopping = asyncio.Event()           # stop submitting
        self._finish = asyncio.Event()             # _stop() is done: end the task group
        self._deadline_s = float("inf")            # loop time by which stop() gives up waiting
        self._producer_tasks: list[asyncio.Task] = []
        self._consumer_tasks: list[asyncio.Task] = []
        client = self._new_client()
        try:
            infos = await self._partition_infos(client)
            present = {p.ordinal for p in infos}
            self.partitions = sorted(present)
            self.roots = sorted(p.ordinal for p in infos if not any(q in present for q in p.parents))
            async with asyncio.TaskGroup() as tasks:
                self._producer_tasks = [tasks.create_task(self._produce(i, client), name=f"producer-{i}")
                                        for i in range(self.producers)]
                self._consumer_tasks = [tasks.create_task(self._consume(c), name=f"consumer-{c}")
                                        for c in range(self.consumers)]
                self._started.set()
                await self._finish.wait()
        except BaseException as e:                 # reported by stop() / wait_acks()
            self._crash = e
            log.exception("workload on %r failed", self.stream)
        finally:
            self._started.set()
            await client.close()

    async def _partition_infos(self, client) -> list:
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        while True:
            try:
                return list(await client.partitions(self.stream))
            except errors.SmsError as e:
                if not e.retriable or asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(READ_BACKOFF_S)

    async def _stop(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        self._deadline_s = loop.time() + timeout_s
        self._stopping.set()
        if self._producer_tasks:
            await asyncio.wait(self._producer_tasks, timeout=max(0.0, self._deadline_s - loop.time()))
        for task in self._producer_tasks:
            task.cancel()
        await asyncio.gather(*self._producer_tasks, return_exceptions=True)
        for label, outstanding in self._outstanding.items():
            for meta in list(outstanding.values()):
                self.history.record_error("Unsettled", meta[3], producer=label, stream=self.stream,
                                          message=f"neither acked nor failed {timeout_s}s after stop()")
            outstanding.clear()
        while loop.time() < self._deadline_s and not self._consumers_caught_up():
            await asyncio.sleep(CATCH_UP_POLL_S)
        for task in self._consumer_tasks:
            task.cancel()
        await asyncio.gather(*self._consumer_tasks, return_exceptions=True)
        self._finish.set()

    def _consumers_caught_up(self) -> bool:
        target: dict[int, int] = {}
        for a in self.history.acks:
            if a.stream == self.stream and a.sn is not None:
                target[a.partition] = max(a.sn, target.get(a.partition, 0))
        done = {t.get_name() for t in self._consumer_tasks if t.done()}
        return all(self._positions.get((self._consumer_name(c), p), -1) >= sn
                   for c in range(self.consumers) if f"consumer-{c}" not in done
                   for p, sn in target.items())

    # --- producers ----------------------------------------------------------------------------
    def _quota(self, index: int) -> int | None:
        if self.records is None:
            return None
        return self.records // self.producers + (1 if index < self.records % self.producers else 0)

    async def _produce(self, index: int, client) -> None:
        label = f"{self.name}{index}"
        producer = client.producer(self.stream, producer_id=f"{label}-{self._run_tag}", linger_ms=self.linger_ms,
                                   delivery_timeout_s=self.delivery_timeout_s)
        outstanding: dict[asyncio.Future, tuple] = {}
        self._outstanding[label] = outstanding
        space = asyncio.Semaphore(self.max_outstanding)
        rng = random.Random(f"{self.seed}/{label}")
        loop = asyncio.get_running_loop()
        quota = self._quota(index)
        interval_s = self.producers / self.rate_per_s if self.rate_per_s else 0.0
        next_s = loop.time()
        seq = 0
        while not self._stopping.is_set() and (quota is None or seq < quota):
            if interval_s:
                next_s = max(next_s + interval_s, loop.time() - RATE_BURST_S_MAX)
                if await self._stopping_within(next_s - loop.time()):
                    break
            await space.acquire()
            if self._stopping.is_set():
                space.release()
                break
            key = f"k{rng.randrange(self.keys)}"
            payload = f"{label}-{seq:06d}"
            meta = (label, seq, key, payload)
            seq += 1
            try:
                future = await producer.send(encode_payload(payload, self.payload_bytes), key)
            except errors.SmsError as e:
                space.release()
                self.history.record_error(e.name, None, producer=label, stream=self.stream, message=e.message)
                if not e.retriable:
                    log.error("producer %s: send refused for good: %s: %s", label, e.name, e.message)
                    break
                await self._stopping_within(SEND_BACKOFF_S)
                continue
            sent_s = self.history.now()
            self.history.record_submit(self.stream, label, meta[1], key, payload, sent_s)
            outstanding[future] = meta
            future.add_done_callback(functools.partial(self._settled, meta, sent_s, space, outstanding))
        await self._stopping.wait()
        await self._settle(producer, outstanding)
        with self._stats_lock:
            self._producer_stats[label] = producer.statistics()

    async def _stopping_within(self, delay_s: float) -> bool:
        """Wait delay_s unless stop() begins first; True if it did."""
        if delay_s > 0:
            try:
                await asyncio.wait_for(self._stopping.wait(), delay_s)
            except TimeoutError:
                pass
        return self._stopping.is_set()

    def _settled(self, meta: tuple, sent_s: float, space: asyncio.Semaphore,
                 outstanding: dict[asyncio.Future, tuple], future: asyncio.Future) -> None:
        label, seq, key, payload = meta
        space.release()
        if outstanding.pop(future, None) is None:
            return                                  # recorded as Unsettled already
        if future.cancelled():
            self.history.record_error("Cancelled", payload, producer=label, stream=self.stream)
        elif future.exception() is not None:
            e = future.exception()
            self.history.record_error(getattr(e, "name", type(e).__name__), payload, producer=label,
                                      stream=self.stream, message=str(e))
        else:
            r = future.result()
            self.history.record_ack(self.stream, r.partition_ordinal, key, payload, r.sn, r.duplicate,
                                    producer=label, seq=seq, sent_s=sent_s)

    async def _settle(self, producer, outstanding: dict[asyncio.Future, tuple]) -> None:
        """Wait until the deadline for every outstanding record, then close the producer
        (which fails what is left unsent)."""
        loop = asyncio.get_running_loop()
        if outstanding and self._deadline_s > loop.time():
            await asyncio.wait(list(outstanding), timeout=self._deadline_s - loop.time())
        try:
            async with asyncio.timeout_at(self._deadline_s):
                await producer.close()
        except TimeoutError:
            pass                                    # _stop() records what is still open

    # --- consumers ----------------------------------------------------------------------------
    def _consumer_name(self, index: int) -> str:
        return f"{self.name}-c{index}"

    async def _consume(self, index: int) -> None:
        reader = _Reader(self._new_client)
        consumer = self._consumer_name(index)
        followed = self.followed.setdefault(consumer, set())
        try:
            async with asyncio.TaskGroup() as tails:
                def follow(partition: int) -> None:
                    if partition not in followed:
                        followed.add(partition)
                        tails.create_task(self._tail(consumer, reader, partition, follow),
                                          name=f"{consumer}-p{partition}")
                for partition in self.roots:
                    follow(partition)
        finally:
            await reader.close()

    async def _tail(self, consumer: str, reader: _Reader, partition: int,
                    follow: Callable[[int], None] | None = None) -> None:
        """Read one partition from TRIM_HORIZON for ever (until cancelled), or to its end
        if it is closed; then `follow` each child it names."""
        self.history.record_consumer_start(consumer, self.stream, partition, TRIM_HORIZON)
        iterator: str | None = None
        last_sn: int | None = None
        failures = 0
        while True:
            client, generation = reader.client, reader.generation
            try:
                if iterator is None:
                    iterator = await (client.get_iterator(self.stream, partition, TRIM_HORIZON) if last_sn is None
                                      else client.get_iterator(self.stream, partition, "AFTER_SEQUENCE_NUMBER",
                                                               sequence_number=last_sn))
                page = await client.get_next_records(iterator, max_records=READ_PAGE_RECORDS,
                                                     wait_ms=self.consumer_wait_ms)
            except (errors.ExpiredIterator, errors.InvalidIterator) as e:
                with self._stats_lock:
                    self._iterator_renewals += 1
                    self._read_errors[e.name] += 1
                iterator = None
                continue
            except Exception as e:                 # a consumer outlives any failure of a read
                if isinstance(e, errors.InvariantViolation):
                    raise
                failures += 1
                name = getattr(e, "name", type(e).__name__)
                with self._stats_lock:
                    self._read_errors[name] += 1
                    if failures % READ_FAILURES_BEFORE_RENEW == 0 and reader.renew(generation):
                        self._renewals += 1
                if not getattr(e, "retriable", False):
                    iterator = None                 # re-position AFTER the last SN seen
                await asyncio.sleep(min(READ_BACKOFF_S * 2 ** min(failures - 1, 10), READ_BACKOFF_S_MAX))
                continue
            failures = 0
            if page.records:
                now = self.history.now()
                self.history.record_observations(
                    Observation(consumer, partition, r.sn, payload_id_of(r.data), now, self.stream)
                    for r in page.records)
                last_sn = page.records[-1].sn
                self._positions[(consumer, partition)] = last_sn
            if page.next_iterator is None:          # a closed partition, read to its end
                if follow is not None:
                    for child in page.child_partitions:
                        follow(parse_partition_id(child))
                return
            iterator = page.next_iterator
            if not page.records:                    # caught up (or a closed partition's replica lags)
                await asyncio.sleep(CATCH_UP_POLL_S)


def _cancel_leftovers(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel tasks the workload does not own (producers' senders after a cut-short
    close) and let them end, so the loop closes clean."""
    leftovers = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in leftovers:
        task.cancel()
    if leftovers:
        loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))


# --- the read-back ------------------------------------------------------------------------------
def read_back(client: sms.Client, stream: str, *, history: History | None = None,
              timeout_s: float = 30.0) -> list[ReadRecord]:
    """Every record of every partition the map of `stream` holds, open or closed, from
    TRIM_HORIZON, as (partition, SN, partition key, payload id) in read order: an open
    partition until a read comes back empty, a closed one to its end (no next iterator:
    a replica that is still behind the ending SN answers short pages meanwhile).
    Retriable errors are retried until the deadline. With `history`, the whole stream is
    read again (until the deadline) until it holds every record the history says was
    acked, since a replica may serve reads a moment behind the tail's commit; what is
    missing then is for the checker to report."""
    deadline = time.monotonic() + timeout_s
    expected = history.acked_payloads(stream) if history is not None else frozenset()
    while True:
        infos = _retry(lambda: list(client.partitions(stream)), deadline)
        rows = [r for p in sorted(infos, key=lambda p: p.ordinal)
                for r in _read_partition(client, stream, p.ordinal, deadline,
                                         closed=p.state is PartitionState.CLOSED)]
        if expected <= {r.payload for r in rows} or time.monotonic() > deadline:
            return rows
        time.sleep(READ_BACK_POLL_S)


def read_lineage(client: sms.Client, stream: str, *, timeout_s: float = 30.0) -> list[ReadRecord]:
    """The whole stream once through `read_stream` (which walks the lineage: a
    partition's records only after all of its parents'), in the order it yields them. A
    retriable failure starts the read again, until the deadline. (It iterates the
    asyncio client's read_stream in one call on the sync client's loop, as SyncProducer
    does: the sync client's generator costs a loop round trip per record.)"""
    async def read_once() -> list[ReadRecord]:
        return [ReadRecord(r.partition_ordinal, r.sn, r.partition_key, payload_id_of(r.data))
                async for r in client._aio.read_stream(stream, max_records=limits.GET_RECORDS_COUNT_MAX, wait_ms=0)]

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return client._run(asyncio.wait_for(read_once(), max(1.0, deadline - time.monotonic())))
        except errors.SmsError as e:
            if not e.retriable or time.monotonic() > deadline:
                raise
            time.sleep(READ_BACK_POLL_S)


def _retry(call: Callable, deadline: float):
    while True:
        try:
            return call()
        except errors.SmsError as e:
            if not e.retriable or time.monotonic() > deadline:
                raise
            time.sleep(READ_BACKOFF_S)


def _read_partition(client: sms.Client, stream: str, ordinal: int, deadline: float, *,
                    closed: bool = False) -> list[ReadRecord]:
    """One partition from TRIM_HORIZON: an open one until a read comes back empty, a
    closed one until the read with no next iterator (or the deadline: then what was read)."""
    rows: list[ReadRecord] = []
    iterator: str | None = None
    for _ in range(READ_BACK_CALLS_MAX):
        if iterator is None:
            last = rows[-1].sn if rows else None
            iterator = _retry(lambda: client.get_iterator(stream, ordinal, TRIM_HORIZON) if last is None else
                              client.get_iterator(stream, ordinal, "AFTER_SEQUENCE_NUMBER", sequence_number=last),
                              deadline)
        try:
            page = _retry(lambda: client.get_next_records(iterator, max_records=limits.GET_RECORDS_COUNT_MAX),
                          deadline)
        except (errors.ExpiredIterator, errors.InvalidIterator):
            iterator = None
            continue
        rows.extend(ReadRecord(ordinal, r.sn, r.partition_key, payload_id_of(r.data)) for r in page.records)
        if page.next_iterator is None:
            return rows                             # closed, read to its end
        if not page.records:
            if not closed or time.monotonic() > deadline:
                return rows
            time.sleep(READ_BACK_POLL_S)            # a replica of a closed partition still catching up
        iterator = page.next_iterator
    raise AssertionError(f"{stream} p{ordinal}: not caught up after {READ_BACK_CALLS_MAX} reads")
