"""The producer's side of PutRecords in both implementations: `encode_session_entries`
(each record's entry with its SSSN and submit-time meta) and `decode_put_results` (the
answer's SNs and partition ordinals). The compiled ones must give exactly what the
pure-Python reference gives, and refuse what it refuses."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sms import errors, wire

pytestmark = pytest.mark.skipif(wire.compiled is None,
                                reason="no compiled wire codec (not built, or SMS_PURE_PYTHON=1)")
REF = wire.reference
COMP = wire.compiled


@dataclass
class Rec:
    key: object
    data: object
    sssn: object
    extra: object


# extra meta as a producer adds it: a dedup key TLV, header TLVs, or nothing
extras = st.one_of(st.just(b""),
                   st.binary(min_size=1, max_size=64).map(lambda d: bytes((wire.TAG_DEDUP_KEY, len(d))) + d),
                   st.dictionaries(st.text(min_size=1, max_size=8), st.binary(max_size=40), min_size=1,
                                   max_size=3).map(wire.encode_headers))
records = st.lists(st.builds(Rec, st.binary(max_size=300), st.binary(max_size=2000),
                             st.integers(0, 2 ** 64 - 1), extras), max_size=20)


@settings(max_examples=150, deadline=None)
@given(records, st.integers(0, 2 ** 63))
def test_compiled_entries_match_the_reference(recs, submit_ms):
    got = COMP.encode_session_entries(recs, submit_ms)
    assert got == REF.encode_session_entries(recs, submit_ms)
    for r, entry in zip(recs, got):        # and they parse back as stored entries
        (e,) = wire.iter_entries(entry, 1, 0)
        assert (e.key, e.data) == (r.key, r.data)
        meta = wire.decode_meta(e.meta)
        assert int.from_bytes(meta[wire.TAG_SSSN], "big") == r.sssn
        assert int.from_bytes(meta[wire.TAG_SUBMIT_MS], "big") == submit_ms


@pytest.mark.parametrize("bad", [Rec("text", b"d", 1, b""), Rec(b"k", None, 1, b""), Rec(b"k", b"d", -1, b""),
                                 Rec(b"k", b"d", 2 ** 64, b""), Rec(b"k", b"d", "1", b""), Rec(b"k", b"d", 1, 7),
                                 Rec(b"k" * 70_000, b"d", 1, b"")])
def test_both_refuse_a_record_that_cannot_be_an_entry(bad):
    for impl in (REF, COMP):
        with pytest.raises(Exception):
            impl.encode_session_entries([Rec(b"ok", b"d", 0, b""), bad], 5)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 40), st.data())
def test_compiled_put_results_match_the_reference(count, data):
    right = data.draw(st.booleans(), label="lengths right")
    n_sn = count if right else data.draw(st.integers(0, 45), label="SNs")
    n_ord = count if right else data.draw(st.integers(0, 45), label="ordinals")
    sns = data.draw(st.binary(min_size=16 * n_sn, max_size=16 * n_sn), label="SN bytes")
    ordinals = data.draw(st.binary(min_size=4 * n_ord, max_size=4 * n_ord), label="ordinal bytes")
    outcomes = []
    for impl in (REF, COMP):
        try:
            outcomes.append(("ok", impl.decode_put_results(sns, ordinals, count)))
        except errors.InvalidArgument as e:
            outcomes.append(("InvalidArgument", e.message))
    assert outcomes[0] == outcomes[1]
    if n_sn == n_ord == count:
        assert outcomes[0][0] == "ok"
        got_sns, got_ordinals = outcomes[0][1]
        assert got_sns == [int.from_bytes(sns[i:i + 16], "big") for i in range(0, len(sns), 16)]
        assert wire.encode_put_results(got_sns, got_ordinals) == (sns, ordinals)
