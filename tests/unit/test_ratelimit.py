"""kernel/ratelimit.py: token buckets on an injected clock."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from kernel.ratelimit import PartitionLimits, TokenBucket


def test_a_bucket_starts_full_and_refills_at_its_rate():
    b = TokenBucket(100, 1.0, now=0.0)
    assert b.take(100, 0.0) == 0.0                  # a burst of one second's worth
    assert b.take(1, 0.0) == pytest.approx(0.01)    # then one token per 10 ms
    assert b.take(50, 0.25) == pytest.approx(0.25)  # 25 there, 50 wanted: 0.25 s more
    assert b.take(50, 0.5) == 0.0


def test_a_batch_bigger_than_the_bucket_passes_once_it_is_full():
    b = TokenBucket(10, 1.0, now=0.0)
    assert b.take(5, 0.0) == 0.0
    assert b.take(25, 0.0) == pytest.approx(0.5)    # waits for a full bucket, not forever
    assert b.take(25, 0.5) == 0.0
    assert b.tokens == pytest.approx(-15.0)         # and leaves the debt to wait off
    assert b.wait(0.5) == pytest.approx(1.5)


def test_charging_after_the_fact_goes_into_debt():
    b = TokenBucket(1000, 1.0, now=0.0)
    b.charge(3000, 0.0)
    assert b.wait(0.0) == pytest.approx(2.0)
    assert b.wait(2.0) == 0.0


def test_a_bucket_refuses_a_nonsense_rate():
    with pytest.raises(ValueError):
        TokenBucket(0, 1.0, 0.0)


def test_partition_limits_take_both_or_neither():
    lim = PartitionLimits(records_per_s=100, bytes_per_s=1000, burst_s=1.0, now=0.0)
    assert lim.take(10, 1000, 0.0) == 0.0           # the byte bucket is now empty
    wait = lim.take(10, 100, 0.0)
    assert wait == pytest.approx(0.1)               # refused for bytes...
    assert lim.take(90, 0, 0.0) == 0.0              # ...and the records were given back


@given(st.lists(st.tuples(st.floats(0, 2.0), st.integers(1, 60)), max_size=200),
       st.integers(10, 500))
def test_a_bucket_never_grants_more_than_its_rate_and_burst(steps, rate):
    """Whatever the arrivals, what is granted by time t is at most rate * (t + burst) plus
    one batch (a batch bigger than the bucket may overdraw it once)."""
    b = TokenBucket(rate, 1.0, now=0.0)
    now, granted, biggest = 0.0, 0, 0
    for dt, n in steps:
        now += dt
        if b.take(n, now) == 0.0:
            granted += n
            biggest = max(biggest, n)
        assert granted <= rate * (now + 1.0) + biggest


# --- admission without debt (issue 29: limits never run into debt by more than one record) ---

def test_admit_takes_the_prefix_that_fits_and_says_when_the_next_would():
    lim = PartitionLimits(records_per_s=50, bytes_per_s=0, burst_s=1.0, now=0.0)
    admitted, wait = lim.admit([10] * 200, 0.0)
    assert admitted == 50 and wait == pytest.approx(1 / 50)      # no debt: the next record in 20 ms
    assert lim.admit([10], 0.0) == (0, pytest.approx(1 / 50))
    assert lim.admit([10] * 5, 0.1)[0] == 5                       # 0.1 s later: 5 more


def test_admit_by_bytes_cuts_where_the_bytes_run_out():
    lim = PartitionLimits(records_per_s=0, bytes_per_s=1000, burst_s=1.0, now=0.0)
    admitted, wait = lim.admit([300, 300, 300, 300], 0.0)
    assert admitted == 3 and wait == pytest.approx(0.2)            # 100 left, 300 needed: 0.2 s
    lim2 = PartitionLimits(records_per_s=100, bytes_per_s=1000, burst_s=1.0, now=0.0)
    assert lim2.admit([100] * 20, 0.0)[0] == 10                   # the tighter of the two
    assert lim2._records.tokens == pytest.approx(90)               # only what was admitted was taken


def test_a_record_bigger_than_the_bucket_passes_alone_once_it_is_full():
    lim = PartitionLimits(records_per_s=0, bytes_per_s=1000, burst_s=1.0, now=0.0)
    assert lim.admit([5000, 10], 0.0) == (1, pytest.approx(4.01))  # alone; its debt is waited off
    assert lim.admit([5000], 1.0)[0] == 0
    assert lim.admit([5000], 5.0)[0] == 1


@given(st.lists(st.tuples(st.floats(0, 2.0), st.lists(st.integers(1, 400), min_size=1, max_size=50)),
                max_size=100),
       st.integers(10, 500), st.integers(500, 5000))
def test_admission_never_grants_more_than_rate_and_burst_plus_one_record(steps, rate, byte_rate):
    lim = PartitionLimits(records_per_s=rate, bytes_per_s=byte_rate, burst_s=1.0, now=0.0)
    now, records, size = 0.0, 0, 0
    for dt, sizes in steps:
        now += dt
        admitted, wait = lim.admit(sizes, now)
        assert 0 <= admitted <= len(sizes) and (wait == 0.0) == (admitted == len(sizes)) and wait >= 0
        records += admitted
        size += sum(sizes[:admitted])
        assert records <= rate * (now + 1.0)
        assert size <= byte_rate * (now + 1.0) + 400


def test_read_budget_is_the_tightest_bucket():
    from kernel.ratelimit import budget
    a, b = TokenBucket(100, 1.0, now=0.0), TokenBucket(1000, 1.0, now=0.0)
    assert budget([a, b], 0.0) == 100 and budget([], 0.0) == float("inf")
    a.charge(150, 0.0)
    assert budget([a, b], 0.0) == pytest.approx(-50)
