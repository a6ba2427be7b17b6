"""Token buckets for the per-partition limits (issue 15 item 5; the patent's per-partition
throughput limits, as Kinesis's per-shard ones).

A bucket holds up to `rate * burst_s` tokens and gains `rate` per second. `take(n)`
takes n tokens at once or none: it answers 0.0 when they were taken, else how many
seconds until they would be there (the retry hint of `Throttled`). A batch larger than
the whole bucket is let through once the bucket is full, so a limit never blocks a
batch for good. `charge(n)` takes after the fact and may go into debt (a read whose
size is known only once it is done): the next `take` waits the debt off.

Pure and clock-injected (`now` in seconds): the unit tests drive it without sleeping.
"""

from __future__ import annotations

from sms.errors import Throttled


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

    def take_or_throttle(self, records: int, size: int, now: float, what: str) -> None:
        """Take both, or raise Throttled naming `what` and how long to wait."""
        wait = self.take(records, size, now)
        if wait:
            ms = max(1, round(wait * 1000))
            raise Throttled(f"{what}: over its write limit ({self.records_per_s or '-'} records/s, "
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
