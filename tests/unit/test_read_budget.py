"""retrieval/service.py cut_to_budget: a page cut to what its read limits hold, at least
one record (issue 29: a read never runs a limit into debt by more than one record)."""

from __future__ import annotations

from retrieval.service import _slice_bytes, cut_to_budget
from sms import wire
from storage.log import ReadSlice


def batch(count: int, data_bytes: int = 100) -> bytes:
    return wire.build_batch([wire.encode_entry(b"k", b"x" * data_bytes) for _ in range(count)], first_sn=1 << 40)


def test_a_page_is_cut_inside_a_batch_where_the_budget_runs_out():
    b = batch(400)
    per_record = len(b) / 400
    s = ReadSlice(b, 0, 400, 1 << 40)
    cut = cut_to_budget([s], 2000)
    assert len(cut) == 1 and cut[0].start == 0 and cut[0].end == int(2000 // per_record)
    assert sum(_slice_bytes(c) for c in cut) <= 2000


def test_at_least_one_record_whatever_the_budget():
    s = ReadSlice(batch(10), 3, 10, 1 << 40)
    for budget in (0, -5000, 1):
        assert [(c.start, c.end) for c in cut_to_budget([s], budget)] == [(3, 4)]


def test_whole_slices_while_they_fit_then_a_cut_one():
    a, b = ReadSlice(batch(10), 0, 10, 1 << 40), ReadSlice(batch(10), 0, 10, 2 << 40)
    budget = _slice_bytes(a) + _slice_bytes(b) / 2
    cut = cut_to_budget([a, b], budget)
    assert [(c.start, c.end) for c in cut] == [(0, 10), (0, 5)]
    assert cut_to_budget([a, b], float("inf")) == [a, b]
