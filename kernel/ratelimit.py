"""Token buckets for the per-partition limits (issue 15 item 5; the patent's per-partition
throughput limits, as Kinesis's per-shard ones).

A bucket holds up to `rate * burst_s` tokens and gains `rate` per second. Limits never
run into debt by more than one record:

- writes: `PartitionLimits.admit(sizes)` takes the records of a request that fit now, a
  prefix in request order, and says how long until the next one would; the caller fails
  the rest with `Throttled` per record (as Kinesis answers
  ProvisionedThroughputExceededException per record). A record larger than a whole bucket
  passes alone once that bucket is full, so a limit never blocks a record for good.
- reads: `budget(buckets)` is the bytes a page may hold now; the reader cuts its page
  there (`cut_to_budget`, at least one record) and `charge`s what it served.

`take(n)` (all or nothing, a batch larger than the bucket once it is full) remains for
callers that need it.

Pure and clock-injected (`now` in seconds): the unit tests drive it without sleeping.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

from sms.errors import Throttled


def budget(buckets: Sequence["TokenBucket"], now: float) -> float:
    """The bytes a read may serve now under all of `buckets` (<= 0: one record only)."""
    return min(b.available(now) for b in buckets) if buckets else float("inf")


class TokenBucket:
    __slots__ = ("rate", "capacity", "tokens", "stamp")

    def __init__(self, rate: float, burst_s: float, now: float):
        if rate <= 0 or burst_s <= 0:
            raise ValueError("a bucket needs a positive rate and burst")
        self.rate = float(rate)
        self.capacity = self.rate * burst_s
        self.tokens = self.capacity
        self.stamp = now

    def _fill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def take(self, n: float, now: float) -> float:
        """Take n tokens: 0.0 if taken, else the seconds until they would be there."""
        self._fill(now)
        need = min(n, self.capacity)            # a batch bigger than the bucket waits for a full one
        if self.tokens >= need:
            self.tokens -= n
            return 0.0
        return (need - self.tokens) / self.rate

    def available(self, now: float) -> float:
        """The tokens there now (negative while in debt)."""
        self._fill(now)
        return self.tokens

    def charge(self, n: float, now: float) -> None:
        """Take n tokens after the fact, into debt if need be."""
        self._fill(now)
        self.tokens -= n

    def wait(self, now: float) -> float:
        """Seconds until the bucket is out of debt (0.0: it is)."""
        self._fill(now)
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


class PartitionLimits:
    """One partition's write limits (records/s, bytes/s; 0: none), rebuilt when the
    stream's limits change."""

    __slots__ = ("records_per_s", "bytes_per_s", "_records", "_bytes")

    def __init__(self, records_per_s: int, bytes_per_s: int, burst_s: float, now: float):
        self.records_per_s = records_per_s
        self.bytes_per_s = bytes_per_s
        self._records = TokenBucket(records_per_s, burst_s, now) if records_per_s else None
        self._bytes = TokenBucket(bytes_per_s, burst_s, now) if bytes_per_s else None

    @classmethod
    def kept(cls, held: "PartitionLimits | None", records_per_s: int, bytes_per_s: int, burst_s: float,
             now: float) -> "PartitionLimits":
        """`held` while its limits are these; a new, full one once they change."""
        if held is not None and (held.records_per_s, held.bytes_per_s) == (records_per_s, bytes_per_s):
            return held
        return cls(records_per_s, bytes_per_s, burst_s, now)

    def admit(self, sizes: Sequence[int], now: float) -> tuple[int, float]:
        """How many of the records of these sizes (key + data bytes) fit now, a prefix in
        order, taken from both buckets; and, when not all fit, the seconds until the next
        would (0.0 when all fit). A record larger than the byte bucket passes alone once
        that bucket is full."""
        n = len(sizes)
        records, byte_bucket = self._records, self._bytes
        if records is not None:
            n = min(n, max(0, int(records.available(now))))
        total = 0
        if byte_bucket is not None and n:
            room = byte_bucket.available(now)
            prefix = list(itertools.accumulate(sizes[:n]))
            fits = bisect.bisect_right(prefix, room)
            if fits == 0 and room >= byte_bucket.capacity:
                fits = 1                               # bigger than the whole bucket: alone, once it is full
            n = fits
            total = prefix[n - 1] if n else 0
        if n:
            if records is not None:
                records.tokens -= n
            if byte_bucket is not None:
                byte_bucket.tokens -= total
        if n == len(sizes):
            return n, 0.0
        wait = 0.0
        if records is not None:
            wait = max(wait, (1 - records.available(now)) / records.rate)
        if byte_bucket is not None:
            need = min(sizes[n], byte_bucket.capacity)
            wait = max(wait, (need - byte_bucket.available(now)) / byte_bucket.rate)
        return n, max(wait, 0.0)

    def throttled(self, wait_s: float, what: str) -> Throttled:
        """The error of the records `admit` left out: `what` is over its limit; retry in."""
        ms = max(1, round(wait_s * 1000))
        return Throttled(f"{what}: over its write limit ({self.records_per_s or '-'} records/s, "
                         f"{self.bytes_per_s or '-'} bytes/s); retry in {ms} ms", retry_after_ms=ms)

    def take(self, records: int, size: int, now: float) -> float:
        """Both or neither: 0.0 when taken, else the seconds to wait."""
        wait_records = self._records.take(records, now) if self._records is not None else 0.0
        if wait_records:
            return wait_records
        wait_bytes = self._bytes.take(size, now) if self._bytes is not None else 0.0
        if wait_bytes and self._records is not None:
            self._records.tokens += records      # (give back what the records bucket gave)
        return wait_bytes
