"""Pure parts of the SPS worker: output producer ids and result-row headers."""

from __future__ import annotations

import pytest

from sms import errors, limits
from sps.worker import _headers, output_producer_id


def test_a_short_producer_id_is_the_plain_name():
    assert output_producer_id("parse", "clicks:3") == b"sps:parse:clicks:3"


def test_long_names_never_share_a_producer_id():
    stage, stream = "s" * 40, "t" * 40
    ids = {output_producer_id(stage, f"{stream}:{i}") for i in range(100)}
    assert len(ids) == 100
    assert all(len(i) <= limits.PRODUCER_ID_BYTES_MAX for i in ids)
    assert output_producer_id(stage, f"{stream}:7") == output_producer_id(stage, f"{stream}:7")   # stable


def test_headers_take_bytes_text_and_numbers_and_leave_out_nulls():
    assert _headers({"a": b"x", "b": "y", "n": 150, "f": 2.5, "z": None}, "s") == {
        "a": b"x", "b": b"y", "n": b"150", "f": b"2.5"}
    assert _headers([("a", b"x")], "s") == {"a": b"x"}        # Spark's map as pairs
    assert _headers(None, "s") is None and _headers({}, "s") is None and _headers({"z": None}, "s") is None


@pytest.mark.parametrize("bad", [{"a": True}, {"a": [1]}, {"a": object()}])
def test_other_header_values_are_refused_by_name(bad):
    with pytest.raises(errors.InvalidArgument, match="stage 'st': a result row's headers"):
        _headers(bad, "st")
