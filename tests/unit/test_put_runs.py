"""`wire.put_runs`: a PutRecords request in the producer's usual form as runs of columns
(ingestion's fast path). The compiled version must give exactly what the pure-Python
reference gives, None included; and the reference's runs must hold what `parse_put` and
`stored_entries` give for the same records, so the fast path stores the same bytes and
decides on the same fields as the record-by-record path."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sms import wire

REF = wire.reference
COMP = wire.compiled
IMPLS = [REF] + ([COMP] if COMP is not None else [])
PRODUCER = b"producer-0123456789"
SESSION = PRODUCER + (3).to_bytes(8, "big")


def request(records, extra=lambda i: b""):
    """(count, blob, ordinals) of records (key bytes, data, sssn, submit_ms, ordinal)."""
    blob = b"".join(wire.encode_session_entry(k, d, sssn, submit, extra(i))
                    for i, (k, d, sssn, submit, _o) in enumerate(records))
    return len(records), blob, wire.encode_session_ordinals(r[4] for r in records)


keys = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=0x2FFF), min_size=1,
               max_size=20).map(lambda t: t.encode())
record = st.tuples(keys, st.binary(max_size=200), st.integers(0, 40), st.integers(0, 2 ** 64 - 1),
                   st.integers(0, 3))
# runs as producers make them: one partition's records with rising SSSNs, then the next
runs_of = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2 ** 60), st.lists(
    st.tuples(keys, st.binary(max_size=200), st.integers(0, 2 ** 50)), min_size=1, max_size=8),
    st.booleans()), min_size=1, max_size=5)


def flatten(runs):
    out = []
    for ordinal, first, recs, gap in runs:
        for k, (key, data, submit) in enumerate(recs):
            out.append((key, data, first + k + (1 if gap and k == len(recs) // 2 and k else 0), submit, ordinal))
    return out


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.lists(record, min_size=1, max_size=12), runs_of.map(flatten)))
def test_runs_hold_what_parse_put_and_stored_entries_give(records):
    count, blob, ordinals = request(records)
    got = REF.put_runs(count, blob, PRODUCER, SESSION, ordinals)
    assert got is not None
    entries = wire.parse_put(count, blob, PRODUCER)
    assert sum(r.length for r in got) == count and [r.start for r in got] == \
        [sum(r.length for r in got[:i]) for i in range(len(got))]
    for run in got:
        part = entries[run.start:run.start + run.length]
        assert run.ordinal == records[run.start][4]
        assert all(records[run.start + k][4] == run.ordinal for k in range(run.length))
        assert [e.sssn for e in part] == list(range(run.first_sssn, run.first_sssn + run.length))
        assert (run.submit_min, run.submit_max) == (min(e.submit_ms for e in part), max(e.submit_ms for e in part))
        assert (run.hash_min, run.hash_max) == (min(e.hash_key for e in part), max(e.hash_key for e in part))
        assert run.signatures == b"".join(e.signature for e in part)
        assert list(struct.unpack(f"<{run.length}Q", run.submits)) == [e.submit_ms for e in part]
        assert run.size == sum(len(e.key) + len(e.data) for e in part)
        assert run.stored == wire.stored_entries([_Stored(e) for e in part])
    # a run ends only where it must: at a new partition or an SSSN out of sequence
    for a, b in zip(got, got[1:]):
        last = entries[b.start - 1]
        assert a.ordinal != b.ordinal or last.sssn + 1 != b.first_sssn


class _Stored:
    def __init__(self, e):
        self.key, self.data, self.headers = e.key, e.data, b""
        self.producer_id, self.sssn, self.dedup_key, self.session_ordinal = SESSION, e.sssn, None, None


@pytest.mark.skipif(COMP is None, reason="no compiled wire codec (not built, or SMS_PURE_PYTHON=1)")
@settings(max_examples=300, deadline=None)
@given(st.one_of(st.lists(record, min_size=1, max_size=12), runs_of.map(flatten)), st.data())
def test_compiled_runs_match_the_reference(records, data):
    count, blob, ordinals = request(records)
    # and a mutation of the request now and then: whatever it becomes, both agree
    mutation = data.draw(st.sampled_from(["none", "flip", "cut", "extend", "ordinals", "count"]))
    if mutation == "flip" and blob:
        i = data.draw(st.integers(0, len(blob) - 1))
        blob = blob[:i] + bytes([blob[i] ^ data.draw(st.integers(1, 255))]) + blob[i + 1:]
    elif mutation == "cut":
        blob = blob[:data.draw(st.integers(0, len(blob)))]
    elif mutation == "extend":
        blob += data.draw(st.binary(min_size=1, max_size=9))
    elif mutation == "ordinals":
        ordinals = ordinals[:-1]
    elif mutation == "count":
        count += data.draw(st.sampled_from([-1, 1]))
    want = REF.put_runs(count, blob, PRODUCER, SESSION, ordinals)
    got = COMP.put_runs(count, blob, PRODUCER, SESSION, ordinals)
    assert (None if got is None else [tuple(r) for r in got]) == \
        (None if want is None else [tuple(r) for r in want])


def bad_requests():
    good = [(b"k1", b"d", 0, 5, 0), (b"k2", b"e", 1, 5, 0)]
    count, blob, ordinals = request(good)
    yield "no producer", (count, blob, b"", b"", ordinals)
    yield "ordinals short", (count, blob, PRODUCER, SESSION, ordinals[:-4])
    yield "trailing bytes", (count, blob + b"x", PRODUCER, SESSION, ordinals)
    yield "count too large", (count + 1, blob, PRODUCER, SESSION, ordinals + ordinals[:4])
    yield "session id too long", (count, blob, PRODUCER, b"s" * 256, ordinals)
    for name, extra in (("a header", wire.encode_headers({"h": b"v"})),
                        ("a dedup key", bytes((wire.TAG_DEDUP_KEY, 2)) + b"dk"),
                        ("an explicit hash key", bytes((wire.TAG_EXPLICIT_HASH_KEY, 16)) + b"\x01" * 16)):
        yield name, request(good, lambda i, x=extra: x if i == 1 else b"")[:2] + (PRODUCER, SESSION, ordinals)
    yield "a key not UTF-8", request([(b"\xff", b"d", 0, 5, 0)])[:2] + (PRODUCER, SESSION, ordinals[:4])
    yield "an empty key", request([(b"", b"d", 0, 5, 0)])[:2] + (PRODUCER, SESSION, ordinals[:4])


@pytest.mark.parametrize("impl", IMPLS, ids=lambda i: "compiled" if i is COMP else "reference")
@pytest.mark.parametrize("name,args", list(bad_requests()), ids=[n for n, _a in bad_requests()])
def test_anything_but_the_usual_form_is_left_to_parse_put(impl, name, args):
    assert impl.put_runs(*args) is None
